"""Kimi-K3 (``KimiK3ForConditionalGeneration``; its language model is ``KimiLinearForCausalLM``,
``text_config``): a hybrid of Kimi Delta Attention (KDA, linear attention with a fixed-size state)
and gated MLA layers, latent MoE, and block attention residuals. This module builds the family's
spec part (:class:`KimiLinearSpec`), its op plan and its memory (weights, per-token KV, per-request
state).

Layers (``linear_attn_config``; its ``kda_layers`` / ``full_attn_layers`` lists are 1-based
layer numbers, together covering every layer once: Kimi-K3 has 69 KDA and 24 MLA layers of 93).
Per GPU under tensor parallelism ``tp`` (heads and FFN widths split over TP), ``H`` KDA heads of
``d = head_dim`` (``P = H x d``) and hidden size ``h``:

* **KDA** (Kimi-Linear's ``KimiDeltaAttention``): the q, k and v projections (three GEMMs ``h ->
  P``), the low-rank decay-gate projections ``f_a`` (``h -> d``, replicated) and ``f_b`` (``d ->
  P``), the ``beta`` projection (``h -> H``), the output gate (``g_proj``, ``h -> P``, with
  ``use_full_rank_gate``; else the low-rank ``g_a`` / ``g_b`` pair like ``f``), the short conv +
  gated delta-rule scan (:func:`infercast.ops.kda.resolve_kda`, the ``kda_perf`` tables: conv and
  scan kernels; the decay-gate activation with its ``gate_lower_bound`` runs inside the scan
  kernel), the gated output RMSNorm (reads the output and the gate, writes the normed output) and
  ``o_proj`` (``P -> h``). The recurrent state is fixed per request (:func:`state_bytes_per_request`).
* **MLA** (DeepSeek-style latent attention, :mod:`infercast.ops.mla`: projections, attention
  core and ``o_proj`` as one op); with ``mla_use_output_gate`` a sigmoid output gate: a ``g_proj``
  GEMM (``h -> heads x v_head_dim`` per GPU) and the gating (read the attention output and the
  gate, write the product). ``mla_use_nope`` (no rotary embedding) leaves the shapes, and so the
  cost, unchanged. The MLA module tables time vLLM's / TensorRT-LLM's DeepSeek MLA module, which
  has no output gate (gb300 vLLM 0.27.0's rows for Kimi-K3 itself too: its collection_meta says
  the collector builds ``DeepseekV2MLAAttention``), so the gate is costed beside it. Only these layers keep per-token KV (the
  ``kv_lora_rank + qk_rope_head_dim`` latent).
* **FFN**: the first ``first_k_dense_replace`` layers run a gated MLP of ``intermediate_size``
  (SiTU activation, costed as SwiGLU's); the others a latent MoE (``latent_moe``,
  Nemotron-3's LatentMoE shape): a bf16 router GEMM on the hidden state, the
  ``routed_expert_down_proj`` GEMM ``h -> routed_expert_hidden_size`` (``L``; with
  ``latent_moe_use_norm`` an RMSNorm after it), the ``num_experts`` routed experts (top
  ``num_experts_per_token``, width ``moe_intermediate_size``) at width ``L`` from the MoE tables
  (which collect Kimi-K3's ``(3584, 3072, 16, 896)``), the ``routed_expert_up_proj`` GEMM ``L -> h``
  (both latent projections unsplit: every TP rank runs them on its tokens), and
  ``num_shared_experts`` shared experts at the hidden width (a gated MLP of ``num_shared_experts x
  moe_intermediate_size`` split over TP). Attention-DP moves the experts' tokens at the latent
  width (gather / reduce-scatter, or all-to-all dispatch).
* **Attention residuals** (``attn_res_block_size`` ``B``; Kimi-K3's block AttnRes): the residual
  stream is replaced by an attention over depth. The layers are grouped into blocks of ``B``; the
  candidates of layer ``i`` (0-based) are the embedding, the ``i // B`` completed block sums and,
  inside a block, its running partial sum; each of the layer's two sublayers (attention, FFN)
  forms its input as a softmax-weighted sum of the RMS-normed candidates with its own learned
  pseudo-query, and the layer's output is added to the running block sum; the final norm reads a
  last such sum over all blocks. Costed as memory-bound elementwise work per token: each sublayer
  reads its candidates and writes one hidden vector, each layer reads and writes the block sum
  (:func:`attn_res_bytes_per_token`, bf16). Kimi-K3 (93 layers, ``B`` = 12): 2 to 9 candidates.

Quantisation: Kimi-K3's export is compressed-tensors MXFP4 (``float`` 4-bit weights in groups of
32) for every linear layer except those its ``ignore`` list names (attention, shared experts,
dense MLP, LM head, vision): the routed experts run from the MoE tables' MXFP4 forms (``mxfp4``:
:mod:`infercast.ops.moe`), and the latent projections, also MXFP4 in the checkpoint, are weighed
at MXFP4 bytes in memory but costed with the bf16 GEMM tables (the tables collect no MXFP4 GEMM;
an upper bound where weight reads dominate). The result's notes say so.

Serving engines: vLLM's and SGLang's ``KimiLinear`` model code (``kimi_linear.py``) run the KDA
layers with their hybrid linear-attention cache, as for Qwen3.5's Gated DeltaNet.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from ..data.model_configs import ModelConfig
from ..data.quant import WEIGHT_BYTES
from ..errors import InvalidConfigError, InvalidInputError, UnsupportedModelError
from .plan import (Fusions, ParallelConfig, Plan, PlanOp, SpecDecode, _applied, _dense_ffn_ops, _ends,
                   _fused_input, _moe_experts_op, _moe_gather_ops, _moe_scatter_ops, _with_mtp)
from .spec import MLASpec, ModelSpec, MoESpec, _first, _int_field, infer_quant, vision_params

FAMILY = "kimi_k3"
KDA, MLA = "K", "A"


@dataclass(frozen=True)
class KimiLinearSpec:
    """Kimi-K3's layer layout and the shapes beyond :class:`ModelSpec`'s MLA / MoE parts (whole
    model, before TP)."""

    pattern: str  # one character per layer: K (KDA) or A (MLA)
    kda_heads: int
    kda_head_dim: int
    conv_kernel: int = 4
    full_rank_gate: bool = True  # KDA output gate as one h -> P projection (else g_a / g_b)
    mla_output_gate: bool = False
    moe_latent: int = 0  # routed_expert_hidden_size (0: the experts run at the hidden width)
    latent_norm: bool = False  # RMSNorm after the latent down projection
    attn_res_block: int = 0  # attn_res_block_size (0: plain residuals)
    state_bytes: float = 4.0  # KDA recurrent state dtype (fp32)

    @property
    def kda_layers(self) -> int:
        return self.pattern.count(KDA)

    @property
    def mla_layers(self) -> int:
        return self.pattern.count(MLA)

    def to_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------------------------------------
# spec
# ------------------------------------------------------------------------------------------------


def _bad(where: str, why: str) -> InvalidInputError:
    return InvalidInputError(f"model config {where} is malformed", why)


def _layer_list(lac: dict, key: str, layers: int, where: str) -> set[int]:
    v = lac.get(key)
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise _bad(where, f"linear_attn_config.{key} must be a list of layer numbers, got {v!r}")
    bad = sorted(x for x in v if not 1 <= x <= layers)
    if bad:
        raise _bad(where, f"linear_attn_config.{key} holds {bad}: layer numbers are 1..{layers} (1-based)")
    if len(set(v)) != len(v):
        raise _bad(where, f"linear_attn_config.{key} names a layer twice")
    return set(v)


def build_kimi_k3_spec(mc: ModelConfig, arch: str) -> ModelSpec:
    """ModelSpec (family ``kimi_k3``, with :class:`KimiLinearSpec`) of a Kimi-K3 config (see
    the module docstring)."""
    cfg = mc.config
    text = cfg.get("text_config") or cfg
    where = mc.resolved_id
    hidden = _int_field(text, "hidden_size", where=where)
    heads = _int_field(text, "num_attention_heads", where=where)
    layers = _int_field(text, "num_hidden_layers", where=where)
    lac = text.get("linear_attn_config")
    if not isinstance(lac, dict):
        raise _bad(where, "a Kimi-Linear config needs linear_attn_config (its KDA layers and shape)")
    kda = _layer_list(lac, "kda_layers", layers, where)
    full = _layer_list(lac, "full_attn_layers", layers, where)
    if kda & full or len(kda | full) != layers:
        both, none = sorted(kda & full), sorted(set(range(1, layers + 1)) - kda - full)
        raise _bad(where, f"kda_layers and full_attn_layers must name each of the {layers} layers once "
                          f"(both: {both[:5]}, neither: {none[:5]})")
    pattern = "".join(KDA if i in kda else MLA for i in range(1, layers + 1))
    lw = f"{where} linear_attn_config"
    if text.get("q_lora_rank") is None:
        raise UnsupportedModelError(f"{where}: MLA without a q LoRA is not modelled for Kimi-Linear layers",
                                    "q_lora_rank is not set")
    mla = MLASpec(
        q_lora_rank=_int_field(text, "q_lora_rank", where=where),
        kv_lora_rank=_int_field(text, "kv_lora_rank", where=where),
        qk_nope_head_dim=_int_field(text, "qk_nope_head_dim", where=where, minimum=0),
        qk_rope_head_dim=_int_field(text, "qk_rope_head_dim", where=where, minimum=0),
        v_head_dim=_int_field(text, "v_head_dim", where=where),
    )
    if mla.qk_nope_head_dim + mla.qk_rope_head_dim < 1:
        raise _bad(where, "qk_nope_head_dim + qk_rope_head_dim must be positive, got 0")
    experts = _int_field(text, "num_experts", "n_routed_experts", where=where)
    topk = _int_field(text, "num_experts_per_token", "num_experts_per_tok", where=where)
    if topk > experts:
        raise _bad(where, f"{topk} experts per token (num_experts_per_token) exceed the {experts} experts")
    einter = _int_field(text, "moe_intermediate_size", where=where)
    n_shared = _int_field(text, "num_shared_experts", "n_shared_experts", where=where, default=0, minimum=0)
    dense = _int_field(text, "first_k_dense_replace", where=where, default=0, minimum=0)
    if dense > layers:
        raise _bad(where, f"first_k_dense_replace={dense} exceeds the {layers} layers")
    inter = _int_field(text, "intermediate_size", where=where, default=0, minimum=0)
    if dense and inter < 1:
        raise _bad(where, f"{dense} dense layers (first_k_dense_replace) need intermediate_size > 0, got {inter}")
    freq = text.get("moe_layer_freq", 1)
    if freq != 1:
        raise UnsupportedModelError(f"{where}: moe_layer_freq {freq!r} is not modelled", "every layer after the dense ones is MoE")
    latent = _int_field(text, "routed_expert_hidden_size", where=where, default=0, minimum=0)
    if latent == hidden:
        latent = 0
    kimi = KimiLinearSpec(
        pattern=pattern,
        kda_heads=_int_field(lac, "num_heads", where=lw),
        kda_head_dim=_int_field(lac, "head_dim", where=lw),
        conv_kernel=_int_field(lac, "short_conv_kernel_size", where=lw, default=4),
        full_rank_gate=bool(lac.get("use_full_rank_gate", False)),
        mla_output_gate=bool(text.get("mla_use_output_gate", False)),
        moe_latent=latent,
        latent_norm=bool(latent and text.get("latent_moe_use_norm", False)),
        attn_res_block=_int_field(text, "attn_res_block_size", where=where, default=0, minimum=0),
    )
    max_pos = _int_field(text, "max_position_embeddings", where=where, default=None, minimum=0)
    return ModelSpec(
        model_id=mc.model_id, resolved_id=mc.resolved_id, architecture=arch, family=FAMILY, num_layers=layers,
        hidden=hidden, num_heads=heads, num_kv_heads=heads, head_dim=mla.qk_nope_head_dim + mla.qk_rope_head_dim,
        intermediate=inter, vocab=_int_field(text, "vocab_size", where=where, default=_first(cfg, "vocab_size", default=32000)),
        tie_embeddings=bool(_first(text, "tie_word_embeddings", default=cfg.get("tie_word_embeddings", False))),
        sliding_window=None, max_position=max_pos or None, quant=infer_quant(mc, text, layers), alias_note=mc.alias_note,
        moe=MoESpec(experts, topk, einter, n_shared * einter, dense, inter if dense else 0),
        mla=mla, mtp_layers=_int_field(text, "num_nextn_predict_layers", where=where, default=0, minimum=0),
        vision_params=vision_params(cfg, hidden, where), kimi=kimi,
    )


# ------------------------------------------------------------------------------------------------
# plan
# ------------------------------------------------------------------------------------------------


def check_parallel(spec: ModelSpec, par: ParallelConfig) -> None:
    """The layouts a Kimi-K3 model can take, beyond :meth:`ParallelConfig.check`: whole KDA heads
    per GPU."""
    par.check(spec)
    k = spec.kimi
    if k.kda_heads % par.tp:
        raise InvalidConfigError(f"TP {par.tp} does not divide the {k.kda_heads} KDA heads of {spec.resolved_id}",
                                 "each GPU must hold whole heads",
                                 [f"tp={d}" for d in (1, 2, 4, 8, 16, 32, 64) if k.kda_heads % d == 0 and spec.num_heads % d == 0])


def _gemm(name: str, count: int, n: int, k: int, quant: str, fused: bool = False) -> PlanOp:
    return PlanOp(name, "gemm", count, params={"n": n, "k": k, "quant": quant, **_fused_input(fused)})


def attn_res_bytes_per_token(layers: int, block: int, hidden: int) -> float:
    """Bytes per token the block attention residuals move over ``layers`` layers (bf16): layer
    ``i`` has ``1 + i // block + (1 if i % block else 0)`` candidates (the embedding, the completed
    block sums, the running one); each of its two sublayers reads them and writes its input (``c +
    1`` vectors), and the layer reads and writes the running block sum (2 vectors); the final norm's
    input is one more such sum over the embedding and every block."""
    total = 0.0
    for i in range(layers):
        c = 1 + i // block + (1 if i % block else 0)
        total += (2 * (c + 1) + 2) * hidden * 2.0
    total += (1 + math.ceil(layers / block) + 1) * hidden * 2.0
    return total


#: narrowest output the ``beta`` projection (one output per KDA head on the GPU: 6 at TP 16) is
#: costed at: the GEMM tables collect no such narrow GEMM at the hidden size (their narrowest
#: at k = 7168 is n = 32), and the time of so narrow a GEMM is its input and weight reads, which
#: 32 outputs barely change; an upper bound
BETA_MIN_N = 32


def _kda_ops(spec: ModelSpec, par: ParallelConfig, fusions: Fusions) -> list[PlanOp]:
    k, h, q = spec.kimi, spec.hidden, spec.quant
    n, H, d = k.kda_layers, k.kda_heads // par.tp, k.kda_head_dim
    P, wq = H * d, q.attention_gemm
    ops = [
        _gemm("kda_qkv_gemm", 3 * n, P, h, wq, fusions.norm_quant),
        _gemm("kda_f_a_gemm", n, d, h, wq, fusions.norm_quant),
        _gemm("kda_f_b_gemm", n, P, d, wq),
        _gemm("kda_beta_gemm", n, max(H, BETA_MIN_N), h, wq, fusions.norm_quant),
    ]
    if k.full_rank_gate:
        ops.append(_gemm("kda_g_gemm", n, P, h, wq, fusions.norm_quant))
    else:
        ops += [_gemm("kda_g_a_gemm", n, d, h, wq, fusions.norm_quant), _gemm("kda_g_b_gemm", n, P, d, wq)]
    ops += [
        PlanOp("kda", "kda", n, params={"d_model": h, "num_heads": H, "head_dim": d, "conv_kernel": k.conv_kernel,
                                        "model_name": spec.resolved_id}),
        PlanOp("kda_gated_norm", "elementwise", n, params={"bytes_per_token": P * 2 * 3}),
        _gemm("kda_o_gemm", n, h, P, wq),
    ]
    return ops


def _mla_ops(spec: ModelSpec, par: ParallelConfig) -> list[PlanOp]:
    k, h, q, m = spec.kimi, spec.hidden, spec.quant, spec.mla
    n, heads = k.mla_layers, spec.num_heads // par.tp
    ops = [PlanOp("mla", "mla", n,
                  params={"hidden": h, "heads": heads, "tp": par.tp, "q_lora_rank": m.q_lora_rank,
                          "kv_lora_rank": m.kv_lora_rank, "qk_nope_head_dim": m.qk_nope_head_dim,
                          "qk_rope_head_dim": m.qk_rope_head_dim, "v_head_dim": m.v_head_dim,
                          "gemm_quant": q.attention_gemm, "kv_quant": q.kv_cache, "model_id": spec.resolved_id})]
    if k.mla_output_gate:
        ops += [_gemm("mla_gate_gemm", n, heads * m.v_head_dim, h, q.attention_gemm),
                PlanOp("mla_output_gate", "elementwise", n, params={"bytes_per_token": heads * m.v_head_dim * 2 * 3})]
    return ops


def _moe_ops(spec: ModelSpec, par: ParallelConfig, fusions: Fusions) -> list[PlanOp]:
    """Router, latent projections, routed experts, shared experts and their communication over the
    MoE layers (see the module docstring)."""
    k, e, h, q = spec.kimi, spec.moe, spec.hidden, spec.quant
    n, tp = spec.num_layers - e.first_dense_layers, par.tp
    width = k.moe_latent or h
    adp = par.attention_dp
    ops = [_gemm("router_gemm", n, e.experts, h, "bfloat16")]
    if k.moe_latent:
        ops.append(_gemm("moe_latent_down", n, width, h, LATENT_GEMM_QUANT))
        if k.latent_norm:
            ops.append(PlanOp("moe_latent_norm", "elementwise", n, params={"bytes_per_token": width * 2 * 3}))
    ops += _moe_gather_ops(n, width, e, par, q.moe or q.gemm)
    ops.append(_moe_experts_op(n, width, e, par, q.moe or q.gemm, True, float(adp)))
    scatter = _moe_scatter_ops(n, width, par)
    ops += scatter
    if k.moe_latent:
        ops.append(_gemm("moe_latent_up", n, h, width, LATENT_GEMM_QUANT))
    if e.shared_inter:
        ops += _dense_ffn_ops("shared_", n, h, e.shared_inter // tp, q.shared_expert_gemm, fusions)
    if tp > 1 and not scatter:
        # the shared expert's (and, without a reduce-scatter, the block's) partial sums over the
        # attention TP ranks, as the MoE plan's block (models.plan._moe_block_ops): also with
        # attention DP when the experts' outputs come back by all-to-all
        ops.append(PlanOp("moe_allreduce", "allreduce", n, params={"elements_per_token": h, "group": tp}))
    return ops


#: GEMM quant the latent projections are costed with: the checkpoint stores them MXFP4, which the
#: GEMM tables do not collect (see the module docstring)
LATENT_GEMM_QUANT = "bfloat16"


def kimi_k3_plan(spec: ModelSpec, par: ParallelConfig, spec_decode: SpecDecode | None = None,
                 fusions: Fusions | None = None) -> Plan:
    """The op plan of a Kimi-K3 model (see the module docstring). The checkpoint ships no MTP
    layers: ``--nextn`` is refused as for any such model."""
    check_parallel(spec, par)
    fusions = replace(_applied(fusions, spec, par), shared_experts=False, rope_in_attention=False)
    k, e, h, L, tp = spec.kimi, spec.moe, spec.hidden, spec.num_layers, par.tp
    ops = [PlanOp("input_norm", "elementwise", 1 if fusions.allreduce_norm else L, params={"bytes_per_token": h * 2 * 3})]
    if k.kda_layers:
        ops += _kda_ops(spec, par, fusions)
    if k.mla_layers:
        ops += _mla_ops(spec, par)
    if tp > 1:
        ops.append(PlanOp("attn_allreduce", "allreduce", L, params={"elements_per_token": h, "group": tp}))
    if not fusions.allreduce_norm:
        ops.append(PlanOp("post_attn_norm", "elementwise", L, params={"bytes_per_token": h * 2 * 4}))
    if k.attn_res_block:
        ops.append(PlanOp("attn_res", "elementwise", L,
                          params={"bytes_per_token": attn_res_bytes_per_token(L, k.attn_res_block, h) / L}))
    if e.first_dense_layers:
        ops += _dense_ffn_ops("dense_", e.first_dense_layers, h, e.dense_inter // tp, spec.quant.gemm, fusions)
        if tp > 1:
            ops.append(PlanOp("dense_ffn_allreduce", "allreduce", e.first_dense_layers, params={"elements_per_token": h, "group": tp}))
    if L > e.first_dense_layers:
        ops += _moe_ops(spec, par, fusions)
    plan = Plan(spec, par, tuple(ops + _ends(spec, par)), fusions=fusions)
    return _with_mtp(plan, spec_decode or SpecDecode())


def plan_notes(spec: ModelSpec) -> list[str]:
    """What a Kimi-K3 estimate approximates, for a result's notes."""
    k, notes = spec.kimi, []
    if k.moe_latent and spec.quant.moe not in (None, "bfloat16", LATENT_GEMM_QUANT):
        notes.append(f"latent MoE projections ({spec.hidden} <-> {k.moe_latent}) costed with the {LATENT_GEMM_QUANT} GEMM tables "
                     f"(the checkpoint stores them {spec.quant.moe}; no such GEMM table): an upper bound at decode sizes")
    if k.mla_output_gate:
        notes.append("MLA output gate costed beside the MLA module tables (they time DeepSeek's MLA module, which has none)")
    return notes


# ------------------------------------------------------------------------------------------------
# memory
# ------------------------------------------------------------------------------------------------


def _kda_weight_bytes(spec: ModelSpec, tp: int) -> float:
    k, h = spec.kimi, spec.hidden
    H, d = k.kda_heads // tp, k.kda_head_dim
    P = H * d
    gate = h * P if k.full_rank_gate else h * d + d * P
    proj = 3 * h * P + h * d + d * P + h * H + gate + P * h
    conv = 3 * P * k.conv_kernel * 2.0
    return proj * WEIGHT_BYTES[spec.quant.attention_gemm] + conv + (P + H) * 4.0 + d * 2.0  # dt bias, A_log; o_norm


def _mla_weight_bytes(spec: ModelSpec, tp: int) -> float:
    m, h, heads = spec.mla, spec.hidden, spec.num_heads // tp
    q = h * m.q_lora_rank + m.q_lora_rank * heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)
    kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
    o = heads * m.v_head_dim * h
    gate = h * heads * m.v_head_dim if spec.kimi.mla_output_gate else 0
    return (q + kv + o + gate) * WEIGHT_BYTES[spec.quant.attention_gemm] + (m.q_lora_rank + m.kv_lora_rank) * 2.0


def _moe_weight_bytes(spec: ModelSpec, par: ParallelConfig) -> float:
    k, e, h, q = spec.kimi, spec.moe, spec.hidden, spec.quant
    width = k.moe_latent or h
    mb = WEIGHT_BYTES[q.moe or q.gemm]
    experts = e.experts * 3 * width * e.inter * mb / (par.etp * par.ep)
    latent = 2 * h * k.moe_latent * mb + (k.moe_latent * 2.0 if k.latent_norm else 0.0) if k.moe_latent else 0.0
    shared = 3 * h * (e.shared_inter // par.tp) * WEIGHT_BYTES[q.shared_expert_gemm]
    return experts + latent + shared + h * e.experts * 2.0


def layer_weight_bytes(spec: ModelSpec, par: ParallelConfig) -> float:
    """Weight bytes of the decoder layers on the most loaded GPU: every layer's attention (KDA or
    MLA), FFN (dense or MoE), norms and attention-residual pseudo-queries (4 vectors), averaged per
    layer and times the ``ceil(layers / pp)`` layers of a stage."""
    k, e, h, L = spec.kimi, spec.moe, spec.hidden, spec.num_layers
    attn = k.kda_layers * _kda_weight_bytes(spec, par.tp) + k.mla_layers * _mla_weight_bytes(spec, par.tp)
    dense = e.first_dense_layers * 3 * h * (e.dense_inter // par.tp) * WEIGHT_BYTES[spec.quant.gemm]
    moe = (L - e.first_dense_layers) * _moe_weight_bytes(spec, par)
    per_layer_vectors = (2 + (4 if k.attn_res_block else 0)) * h * 2.0
    return (attn + dense + moe + L * per_layer_vectors) * math.ceil(L / par.pp) / L


def kv_bytes_per_token(spec: ModelSpec, par: ParallelConfig, kv_bytes: float) -> float:
    """Per-token KV on one GPU: the MLA layers' latent (replicated over TP), for a stage's share."""
    m = spec.mla
    return math.ceil(spec.kimi.mla_layers / par.pp) * (m.kv_lora_rank + m.qk_rope_head_dim) * kv_bytes


def state_bytes_per_request(spec: ModelSpec, par: ParallelConfig) -> float:
    """KDA recurrent + conv state one request holds on one GPU over a stage's KDA layers."""
    from ..ops.kda import kda_state_bytes

    k = spec.kimi
    per_layer = kda_state_bytes(k.kda_heads // par.tp, k.kda_head_dim, k.conv_kernel, k.state_bytes)
    return math.ceil(k.kda_layers / par.pp) * per_layer
