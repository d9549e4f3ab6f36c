"""Config readers for the families with heterogeneous layers: Gemma-4, MiMo-V2-Flash, DeciLM
(Llama-Nemotron NAS) and MiniMax-M3. Each reads its HF config into a :class:`ModelSpec` whose
``attention_groups`` / ``ffn_groups`` (:mod:`infercast.models.groups`) count the layers of each
shape; the field names are those of the checkpoints' ``config.json`` (``text_config`` for
Gemma-4)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import replace

from ..data.model_configs import ModelConfig
from ..errors import InvalidInputError, UnsupportedModelError
from .groups import AttentionGroup, FFNGroup
from .spec import ModelSpec, MoESpec, _first, _int_field, infer_quant, vision_params


def _bad(where: str, why: str) -> InvalidInputError:
    return InvalidInputError(f"model config {where} is malformed", why)


def _common(text: dict, cfg: dict, where: str) -> dict:
    hidden = _int_field(text, "hidden_size", where=where)
    return {
        "hidden": hidden,
        "num_heads": _int_field(text, "num_attention_heads", where=where),
        "num_layers": _int_field(text, "num_hidden_layers", where=where),
        "vocab": _int_field(text, "vocab_size", where=where, default=_first(cfg, "vocab_size", default=32000)),
        "max_position": _int_field(text, "max_position_embeddings", where=where, default=None, minimum=0) or None,
        "tie_embeddings": bool(_first(text, "tie_word_embeddings", default=_first(cfg, "tie_word_embeddings", default=False))),
    }


def _check_groups(groups: list[AttentionGroup], where: str) -> None:
    for g in groups:
        if g.kind == "gqa" and g.heads % g.kv_heads:
            raise _bad(where, f"{g.heads} attention heads are not a multiple of {g.kv_heads} KV heads "
                              "(grouped-query attention shares each KV head among a whole group of query heads)")


def _pattern(text: dict, key: str, layers: int, allowed: set, where: str) -> list:
    p = text.get(key)
    if not isinstance(p, list) or len(p) != layers:
        n = len(p) if isinstance(p, list) else "no"
        raise _bad(where, f"{key} has {n} entries for {layers} layers")
    bad = sorted({repr(x) for x in p if x not in allowed})
    if bad:
        raise _bad(where, f"{key} holds {', '.join(bad)}; expected {sorted(allowed, key=str)}")
    return p


def _exclusions(mc: ModelConfig, text: dict) -> list:
    hq = ((mc.hf_quant or {}).get("quantization") or {}) if mc.hf_quant else {}
    qc = text.get("quantization_config") or mc.config.get("quantization_config") or {}
    return list(hq.get("exclude_modules") or qc.get("ignore") or qc.get("exclude_modules") or [])


_GEMMA_MLP = re.compile(r"layers\.(\d+)\.mlp\*?$")


def gemma4(mc: ModelConfig, cfg: dict, text: dict, arch: str, family: str) -> ModelSpec:
    """Gemma-4 (``gemma4_text``). ``layer_types`` names each layer ``sliding_attention`` (window
    ``sliding_window``, ``num_key_value_heads`` x ``head_dim``) or ``full_attention`` (heads of
    ``global_head_dim``, the whole context; with ``attention_k_eq_v`` the layer has
    ``num_global_key_value_heads`` KV heads and no V projection: V is K's projection output, the
    cache still holds K and V; without it ``num_key_value_heads``, as ``transformers``' Gemma-4
    attention reads the config). Query heads are ``num_attention_heads`` on both. Every layer runs a gated (GELU) MLP of
    ``intermediate_size``; with ``enable_moe_block`` also, beside it, ``num_experts`` routed
    experts of ``moe_intermediate_size`` (top ``top_k_experts``), whose outputs are summed: the
    dense MLP is then costed as the MoE block's shared expert. Per-head q/k RMSNorms, and
    Gemma's post-attention and post-FFN norms besides the pre-norms. A quantised export that
    excludes the layers' ``mlp`` modules keeps that dense MLP in bf16."""
    where = mc.resolved_id
    c = _common(text, cfg, where)
    layers, heads, hidden = c["num_layers"], c["num_heads"], c["hidden"]
    lt = _pattern(text, "layer_types", layers, {"sliding_attention", "full_attention"}, where)
    kv = _int_field(text, "num_key_value_heads", where=where, default=heads, default_note="num_attention_heads")
    hd = _int_field(text, "head_dim", where=where, default=hidden // heads, default_note="hidden_size // num_attention_heads")
    k_eq_v = bool(text.get("attention_k_eq_v"))
    gkv = _int_field(text, "num_global_key_value_heads", where=where, default=kv,
                     default_note="num_key_value_heads") if k_eq_v else kv
    ghd = _int_field(text, "global_head_dim", where=where, default=hd, default_note="head_dim")
    n_local = lt.count("sliding_attention")
    groups = []
    if n_local:
        window = _int_field(text, "sliding_window", where=where)
        groups.append(AttentionGroup(n_local, "gqa", heads, kv, hd, hd, window))
    if layers - n_local:
        groups.append(AttentionGroup(layers - n_local, "gqa", heads, gkv, ghd, ghd, 0, k_eq_v))
    _check_groups(groups, where)
    inter = _int_field(text, "intermediate_size", where=where)
    quant = infer_quant(mc, text, layers)
    moe = None
    if text.get("enable_moe_block"):
        family = "moe"
        experts = _int_field(text, "num_experts", where=where)
        topk = _int_field(text, "top_k_experts", "num_experts_per_tok", where=where)
        if topk > experts:
            raise _bad(where, f"{topk} experts per token (top_k_experts) exceed the {experts} experts")
        einter = _int_field(text, "moe_intermediate_size", "expert_intermediate_size", where=where)
        moe = MoESpec(experts, topk, einter, shared_inter=inter)
        mlp_layers = {int(m.group(1)) for p in _exclusions(mc, text) if isinstance(p, str)
                      for m in [_GEMMA_MLP.search(p)] if m}
        if quant.gemm != "bfloat16" and len(mlp_layers) > layers / 2:
            quant = replace(quant, shared_gemm="bfloat16", source=quant.source + "; dense MLP excluded (bf16)")
    return ModelSpec(
        model_id=mc.model_id, resolved_id=mc.resolved_id, architecture=arch, family=family,
        num_kv_heads=max(g.kv_heads for g in groups), head_dim=max(g.head_dim for g in groups),
        intermediate=inter, sliding_window=None, quant=quant, alias_note=mc.alias_note, moe=moe,
        qk_norm="per_head", vision_params=vision_params(cfg, hidden, where),
        attention_groups=tuple(groups), sandwich_norms=True, **c,
    )


def mimo_v2(mc: ModelConfig, cfg: dict, text: dict, arch: str, family: str) -> ModelSpec:
    """MiMo-V2-Flash. ``hybrid_layer_pattern`` marks each layer sliding-window (1: window
    ``sliding_window_size``, ``swa_num_attention_heads`` x ``swa_num_key_value_heads`` heads of
    ``swa_head_dim`` / ``swa_v_head_dim``) or full attention (0: ``num_attention_heads`` x
    ``num_key_value_heads`` of ``head_dim`` / ``v_head_dim``); 1 = sliding is the reading that
    the serving engines' MiMo-V2 model code takes (vLLM, SGLang), and the model's published
    layout (blocks of five sliding-window layers and one global layer: 39 sliding, 9 full of 48).
    ``moe_layer_freq`` marks the MoE layers (``n_routed_experts`` of ``moe_intermediate_size``, top
    ``num_experts_per_tok``); the others run a dense MLP of ``intermediate_size``. The attention-sink biases are not
    costed (one scalar per head)."""
    where = mc.resolved_id
    c = _common(text, cfg, where)
    layers, heads, hidden = c["num_layers"], c["num_heads"], c["hidden"]
    pat = _pattern(text, "hybrid_layer_pattern", layers, {0, 1}, where)
    freq = text.get("moe_layer_freq", 1)
    moe_flags = [freq] * layers if isinstance(freq, int) and not isinstance(freq, bool) else freq
    moe_flags = _pattern({"moe_layer_freq": moe_flags}, "moe_layer_freq", layers, {0, 1}, where)
    kv = _int_field(text, "num_key_value_heads", where=where, default=heads, default_note="num_attention_heads")
    hd = _int_field(text, "head_dim", where=where, default=hidden // heads, default_note="hidden_size // num_attention_heads")
    vhd = _int_field(text, "v_head_dim", where=where, default=hd, default_note="head_dim")
    groups = []
    n_local = sum(pat)
    if n_local:
        window = _int_field(text, "sliding_window_size", "sliding_window", where=where)
        groups.append(AttentionGroup(
            n_local, "gqa",
            _int_field(text, "swa_num_attention_heads", where=where, default=heads, default_note="num_attention_heads"),
            _int_field(text, "swa_num_key_value_heads", where=where, default=kv, default_note="num_key_value_heads"),
            _int_field(text, "swa_head_dim", where=where, default=hd, default_note="head_dim"),
            _int_field(text, "swa_v_head_dim", where=where, default=vhd, default_note="v_head_dim"),
            window))
    if layers - n_local:
        groups.append(AttentionGroup(layers - n_local, "gqa", heads, kv, hd, vhd, 0))
    _check_groups(groups, where)
    inter = _int_field(text, "intermediate_size", where=where, default=0, minimum=0)
    experts = _int_field(text, "n_routed_experts", "num_experts", where=where)
    topk = _int_field(text, "num_experts_per_tok", where=where)
    if topk > experts:
        raise _bad(where, f"{topk} experts per token (num_experts_per_tok) exceed the {experts} experts")
    einter = _int_field(text, "moe_intermediate_size", where=where)
    n_shared = _int_field(text, "n_shared_experts", where=where, default=0, minimum=0)
    dense = layers - sum(moe_flags)
    if dense and inter < 1:
        raise _bad(where, f"{dense} dense layers (moe_layer_freq 0) need intermediate_size > 0, got {inter}")
    moe = MoESpec(experts, topk, einter, n_shared * einter, dense, inter if dense else 0)
    return ModelSpec(
        model_id=mc.model_id, resolved_id=mc.resolved_id, architecture=arch, family=family,
        num_kv_heads=max(g.kv_heads for g in groups), head_dim=max(g.head_dim for g in groups),
        intermediate=inter, sliding_window=None, quant=infer_quant(mc, text, layers), alias_note=mc.alias_note,
        moe=moe, attention_groups=tuple(groups), **c,
    )


def decilm_ffn_width(ffn_mult: float, hidden: int) -> int:
    """DeciLM's FFN width for ``ffn_mult``: ``2/3 x ffn_mult x hidden``, truncated, rounded up to
    a multiple of 256 (the rule of its modelling code, ``_ffn_mult_to_intermediate_size``)."""
    width = int(2 * ffn_mult * hidden / 3)
    return -(-width // 256) * 256


def decilm(mc: ModelConfig, cfg: dict, text: dict, arch: str, family: str) -> ModelSpec:
    """DeciLM / Llama-Nemotron NAS: ``block_configs`` gives each layer its attention (``no_op``:
    none; ``replace_with_linear``: one ``hidden x hidden`` linear; else GQA with
    ``num_attention_heads / n_heads_in_group`` KV heads, over ``window_length`` tokens when set)
    and its FFN (``no_op``, ``replace_with_linear``, else a SwiGLU MLP of
    :func:`decilm_ffn_width` (``ffn_mult``)). Layers of one shape are counted together."""
    where = mc.resolved_id
    c = _common(text, cfg, where)
    layers, heads, hidden = c["num_layers"], c["num_heads"], c["hidden"]
    blocks = text.get("block_configs")
    if not isinstance(blocks, list) or len(blocks) != layers:
        raise _bad(where, f"block_configs has {len(blocks) if isinstance(blocks, list) else 'no'} entries for {layers} layers")
    hd = _int_field(text, "head_dim", where=where, default=hidden // heads, default_note="hidden_size // num_attention_heads")
    attn, ffn = Counter(), Counter()
    for i, b in enumerate(blocks):
        a, f = (b or {}).get("attention") or {}, (b or {}).get("ffn") or {}
        for part, d in (("attention", a), ("ffn", f)):
            if d.get("sparsify") or d.get("num_sink_tokens"):
                raise UnsupportedModelError(f"{where} layer {i}: sparsified / sink-token {part} is not modelled",
                                            "block_configs with sparsify or num_sink_tokens")
        if a.get("no_op"):
            pass
        elif a.get("replace_with_linear"):
            attn[("linear", 0, 0)] += 1
        else:
            group = _int_field(a, "n_heads_in_group", where=f"{where} block_configs[{i}].attention")
            if heads % group:
                raise _bad(where, f"layer {i}: n_heads_in_group {group} does not divide the {heads} attention heads")
            window = _int_field(a, "window_length", where=where, default=0, minimum=0)
            attn[("gqa", heads // group, window)] += 1
        if f.get("no_op"):
            pass
        elif f.get("replace_with_linear"):
            ffn[("linear", 0)] += 1
        else:
            mult = f.get("ffn_mult")
            if isinstance(mult, bool) or not isinstance(mult, (int, float)) or mult <= 0:
                raise _bad(where, f"layer {i}: ffn_mult must be a positive number, got {mult!r}")
            ffn[("gated", decilm_ffn_width(mult, hidden))] += 1
    groups = tuple(AttentionGroup(n, kind, heads if kind == "gqa" else 0, kv, hd if kind == "gqa" else 0,
                                  hd if kind == "gqa" else 0, window)
                   for (kind, kv, window), n in sorted(attn.items(), key=lambda x: (x[0][0], -x[0][1], x[0][2])))
    ffns = tuple(FFNGroup(n, inter, kind) for (kind, inter), n in sorted(ffn.items(), key=lambda x: (x[0][0], -x[0][1])))
    gqa = [g for g in groups if g.kind == "gqa"]
    return ModelSpec(
        model_id=mc.model_id, resolved_id=mc.resolved_id, architecture=arch, family=family,
        num_kv_heads=max((g.kv_heads for g in gqa), default=1), head_dim=hd,
        intermediate=max((g.inter for g in ffns), default=0), sliding_window=None,
        quant=infer_quant(mc, text, layers), alias_note=mc.alias_note,
        attention_groups=groups, ffn_groups=ffns, **c,
    )


def _flags(text: dict, key: str, layers: int, where: str, default: int) -> list:
    """A per-layer 0/1 list (``moe_layer_freq``-style); an int sets every layer; absent: ``default``."""
    v = text.get(key, default)
    flags = [v] * layers if isinstance(v, int) and not isinstance(v, bool) else v
    return _pattern({key: flags}, key, layers, {0, 1}, where)


def minimax_m3(mc: ModelConfig, cfg: dict, text: dict, arch: str, family: str) -> ModelSpec:
    """MiniMax-M3. Every layer is GQA (``num_attention_heads`` x ``num_key_value_heads`` of
    ``head_dim``; per-head q/k norms; partial RoPE, whose share does not change the cost). With
    ``sparse_attention_config.use_sparse_attention``, the layers its ``sparse_attention_freq``
    marks 1 run MiniMax sparse attention: an indexer keeps the top ``sparse_topk_blocks`` blocks
    of ``sparse_block_size`` tokens (:mod:`infercast.ops.msa`); the others attend to the whole
    context. ``moe_layer_freq`` marks the MoE layers (``num_local_experts`` experts of
    ``moe_intermediate_size``, top ``num_experts_per_tok``, a shared expert of
    ``shared_intermediate_size``, or ``n_shared_experts x moe_intermediate_size``); the others
    run a dense MLP of ``dense_intermediate_size`` (else ``intermediate_size``).
    ``attention_output_gate`` (a gate emitted by the q projection) is read as Qwen3.5's
    ``attn_output_gate``. MTP: ``num_nextn_predict_layers`` layers (the MTP count engines run).
    The vision-language export (``MiniMaxM3SparseForConditionalGeneration``, ``text_config``) is
    served text-only; its vision tower's weights count in memory (:func:`vision_params`)."""
    where = mc.resolved_id
    c = _common(text, cfg, where)
    layers, heads, hidden = c["num_layers"], c["num_heads"], c["hidden"]
    kv = _int_field(text, "num_key_value_heads", where=where, default=heads, default_note="num_attention_heads")
    hd = _int_field(text, "head_dim", where=where, default=hidden // heads, default_note="hidden_size // num_attention_heads")
    if heads % kv:
        raise _bad(where, f"{heads} attention heads are not a multiple of {kv} KV heads "
                          "(grouped-query attention shares each KV head among a whole group of query heads)")
    sac = text.get("sparse_attention_config") or {}
    if not isinstance(sac, dict):
        raise _bad(where, f"sparse_attention_config must be an object, got {type(sac).__name__}")
    msa_layers = topk_tokens = 0
    if sac.get("use_sparse_attention"):
        sparse = _flags(sac, "sparse_attention_freq", layers, where, 1)
        msa_layers = sum(sparse)
        topk_tokens = (_int_field(sac, "sparse_topk_blocks", where=where)
                       * _int_field(sac, "sparse_block_size", where=where))
    experts = _int_field(text, "num_local_experts", "n_routed_experts", "num_experts", where=where)
    topk = _int_field(text, "num_experts_per_tok", where=where)
    if topk > experts:
        raise _bad(where, f"{topk} experts per token (num_experts_per_tok) exceed the {experts} experts")
    einter = _int_field(text, "moe_intermediate_size", "intermediate_size", where=where)
    n_shared = _int_field(text, "n_shared_experts", where=where, default=0, minimum=0)
    shared = _int_field(text, "shared_intermediate_size", where=where, default=n_shared * einter, minimum=0,
                        default_note="n_shared_experts x moe_intermediate_size") if n_shared else 0
    moe_flags = _flags(text, "moe_layer_freq", layers, where, 1)
    dense = layers - sum(moe_flags)
    dense_inter = _int_field(text, "dense_intermediate_size", "intermediate_size", where=where) if dense else 0
    return ModelSpec(
        model_id=mc.model_id, resolved_id=mc.resolved_id, architecture=arch, family=family,
        num_kv_heads=kv, head_dim=hd, intermediate=dense_inter, sliding_window=None,
        quant=infer_quant(mc, text, layers), alias_note=mc.alias_note,
        moe=MoESpec(experts, topk, einter, shared, dense, dense_inter),
        mtp_layers=_int_field(text, "num_nextn_predict_layers", where=where, default=0, minimum=0),
        attn_output_gate=bool(text.get("attention_output_gate", False)),
        qk_norm="per_head" if text.get("use_qk_norm") else "",
        msa_layers=msa_layers, msa_topk_tokens=topk_tokens, vision_params=vision_params(cfg, hidden, where), **c,
    )


def _step3p7(mc: ModelConfig, cfg: dict, text: dict, arch: str, family: str) -> ModelSpec:
    from .step3 import step3p7  # its own module (models/step3.py), which uses this one's helpers

    return step3p7(mc, cfg, text, arch, family)


#: architecture -> reader
READERS = {
    "Gemma4ForConditionalGeneration": gemma4,
    "MiMoV2FlashForCausalLM": mimo_v2,
    "DeciLMForCausalLM": decilm,
    "MiniMaxM3ForCausalLM": minimax_m3,
    "MiniMaxM3SparseForCausalLM": minimax_m3,
    "MiniMaxM3SparseForConditionalGeneration": minimax_m3,
    "Step3p7FlashForCausalLM": _step3p7,
}
