"""DeepSeek-V4 (``DeepseekV4ForCausalLM``): its spec part (:class:`DeepSeekV4Spec`), op plan,
weight bytes and KV-cache bytes.

Layout, from the checkpoints' ``config.json`` (field names are the config's):

* **attention**: every layer one latent-MQA attention module (``head_dim`` latent, one KV head;
  q through ``q_lora_rank``; output through ``o_groups`` grouped LoRAs of ``o_lora_rank``), of the
  kind its ``compress_ratios`` entry gives (:mod:`infercast.ops.dsv4`): ratio 0 a sliding window
  of ``sliding_window`` tokens only, a ratio in :data:`CSA_RATIOS` (4) compressed sparse attention
  (an indexer of ``index_n_heads`` x ``index_head_dim`` keeps ``index_topk`` compressed entries),
  any other ratio (128) heavily compressed attention over every compressed entry. The list holds
  ``num_hidden_layers`` entries and then one per MTP layer (``num_nextn_predict_layers``); a list
  of exactly ``num_hidden_layers`` entries gives the MTP layers ratio 0. Megatron-Core's DSv4
  layer symbols read the same list the same way (``W`` 0, ``C`` 4, ``H`` 128).
* **mHC**: ``hc_mult`` residual streams; each layer runs the mHC pre and post kernels
  (:mod:`infercast.ops.mhc`, ``hc_sinkhorn_iters`` Sinkhorn iterations).
* **MoE** on every layer: ``n_routed_experts`` experts of ``moe_intermediate_size`` (top
  ``num_experts_per_tok``; SwiGLU), ``n_shared_experts`` shared experts of the same width. The first
  ``num_hash_layers`` layers route by a token-id hash table (``tid2eid``) instead of a learned
  gate: no router GEMM there.
* **MTP**: ``num_nextn_predict_layers`` layers, each one decoder layer of its compress ratio plus
  the projection of ``[embedding; hidden]`` (``2 x hidden -> hidden``).

Quant (:func:`dsv4_quant`): the dense GEMMs take the checkpoint's ``quantization_config`` (FP8 with
128 x 128 blocks in every released checkpoint: ``fp8_block``); the routed experts are NVFP4 where a
ModelOpt ``hf_quant_config`` lists the experts as NVFP4 (NVIDIA's exports, which keep attention,
shared experts and MTP at the base quant), else ``expert_dtype`` ``fp4`` -> the MoE tables' MXFP4
forms (``mxfp4``: W4A8 on GPUs with FP4 tensor cores, W4A16 before), else the dense quant. The KV
cache defaults to FP8 (the engines store the latent's non-RoPE channels in FP8 for this
architecture; every collected DeepSeek-V4 attention row is FP8-KV); ``--kv-cache-quant`` overrides.

Per GPU under tensor parallelism ``tp``: query heads and output groups split over TP (at least one
group per GPU), the latent KV head and the indexer are replicated; experts split over
``moe_tp x moe_ep``; attention-DP moves the MoE tokens as :func:`infercast.models.plan.moe_plan`
does.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from ..data.model_configs import ModelConfig
from ..data.quant import KV_BYTES, WEIGHT_BYTES
from ..errors import InvalidConfigError, InvalidInputError
from .plan import (Fusions, ParallelConfig, Plan, PlanOp, SpecDecode, _applied, _ends,
                   _moe_block_ops, require_mtp_layers)
from .spec import ModelSpec, MoESpec, QuantSpec, _int_field, vision_params

FAMILY = "deepseek_v4"
#: compress ratios whose layers carry the lightning indexer (CSA); other nonzero ratios are HCA
CSA_RATIOS = (4,)
#: the module tables that serve each kind: window-only layers (ratio 0) have none and run on HCA's
TABLE_KIND = {"csa": "csa", "hca": "hca", "window": "hca"}
#: the HCA ratio whose rows serve window-only layers
WINDOW_AS_RATIO = 128


def kind_of(ratio: int) -> str:
    return "window" if ratio == 0 else "csa" if ratio in CSA_RATIOS else "hca"


@dataclass(frozen=True)
class DeepSeekV4Spec:
    """The DeepSeek-V4 part of a spec (whole model, before TP)."""

    compress_ratios: tuple[int, ...]  # one per decoder layer
    mtp_ratios: tuple[int, ...]  # one per MTP layer
    q_lora_rank: int
    o_lora_rank: int
    o_groups: int
    qk_rope_head_dim: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    window: int
    hc_mult: int
    hc_sinkhorn_iters: int
    hash_layers: int = 0

    def count(self, kind: str, ratios=None) -> int:
        return sum(1 for r in (self.compress_ratios if ratios is None else ratios) if kind_of(r) == kind)

    def groups(self, ratios=None) -> list[tuple[str, int, int]]:
        """[(kind, ratio, layers)] of ``ratios`` (the decoder's by default), one per distinct ratio."""
        rs = self.compress_ratios if ratios is None else ratios
        return [(kind_of(r), r, sum(1 for x in rs if x == r)) for r in sorted(set(rs))]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> DeepSeekV4Spec:
        d = dict(d)
        d["compress_ratios"] = tuple(int(x) for x in d["compress_ratios"])
        d["mtp_ratios"] = tuple(int(x) for x in d["mtp_ratios"])
        return cls(**d)


# ------------------------------------------------------------------------------------------------
# spec
# ------------------------------------------------------------------------------------------------


def _bad(where: str, why: str) -> InvalidInputError:
    return InvalidInputError(f"model config {where} is malformed", why)


def dsv4_quant(mc: ModelConfig, cfg: dict) -> QuantSpec:
    """Quant modes of a DeepSeek-V4 checkpoint (see the module docstring)."""
    qc = cfg.get("quantization_config") or {}
    hq = ((mc.hf_quant or {}).get("quantization") or {}) if mc.hf_quant else {}
    method = str(qc.get("quant_method") or "").lower()
    gemm, src = "bfloat16", "default (bf16)"
    if method == "fp8":
        gemm, src = ("fp8_block", "quantization_config fp8 + weight_block_size") if qc.get("weight_block_size") \
            else ("fp8", "quantization_config fp8 (per-tensor)")
    quantized = hq.get("quantized_layers") or qc.get("quantized_layers") or {}
    expert_algos = {str((q or {}).get("quant_algo", "")).upper() for name, q in quantized.items()
                    if ".ffn.experts" in name and isinstance(q, dict)}
    expert_dtype = str(cfg.get("expert_dtype") or "").lower()
    if expert_algos == {"NVFP4"}:
        moe, msrc = "nvfp4", "experts NVFP4 (hf_quant_config quantized_layers)"
    elif expert_algos:
        raise InvalidConfigError(f"{mc.resolved_id}: experts quantised as {sorted(expert_algos)}, which infercast does not map",
                                 available=["NVFP4"])
    elif expert_dtype == "fp4":
        moe, msrc = "mxfp4", "experts expert_dtype=fp4 (MXFP4: W4A8 on GPUs with FP4, W4A16 before)"
    elif expert_dtype in ("", "bf16", "bfloat16", "fp8"):
        moe, msrc = gemm, "experts at the dense quant"
    else:
        raise InvalidConfigError(f"{mc.resolved_id}: expert_dtype {expert_dtype!r} is not modelled", available=["fp4", "fp8"])
    return QuantSpec(gemm=gemm, kv_cache="fp8", attention="bfloat16", moe=moe,
                     source=f"{src}; {msrc}; KV fp8 (DeepSeek-V4 caches its latent in FP8)")


def build_dsv4_spec(mc: ModelConfig, arch: str) -> ModelSpec:
    """ModelSpec (family ``deepseek_v4``, with :class:`DeepSeekV4Spec`) of a DeepSeek-V4 config."""
    cfg = mc.config
    where = mc.resolved_id
    hidden = _int_field(cfg, "hidden_size", where=where)
    heads = _int_field(cfg, "num_attention_heads", where=where)
    layers = _int_field(cfg, "num_hidden_layers", where=where)
    kv = _int_field(cfg, "num_key_value_heads", where=where, default=1)
    if kv != 1:
        raise _bad(where, f"num_key_value_heads={kv}: DeepSeek-V4 attention is latent MQA with one KV head")
    head_dim = _int_field(cfg, "head_dim", where=where)
    rope = _int_field(cfg, "qk_rope_head_dim", where=where, minimum=0)
    if rope >= head_dim:
        raise _bad(where, f"qk_rope_head_dim={rope} must be below head_dim={head_dim}")
    mtp = _int_field(cfg, "num_nextn_predict_layers", where=where, default=0, minimum=0)
    ratios = cfg.get("compress_ratios")
    if not isinstance(ratios, list) or len(ratios) not in (layers, layers + mtp):
        n = len(ratios) if isinstance(ratios, list) else "no"
        raise _bad(where, f"compress_ratios has {n} entries; expected num_hidden_layers ({layers}) "
                          f"or num_hidden_layers + num_nextn_predict_layers ({layers + mtp})")
    ratios = [_int_field({"compress_ratios": r}, "compress_ratios", where=where, minimum=0) for r in ratios]
    o_groups = _int_field(cfg, "o_groups", where=where)
    if heads % o_groups:
        raise _bad(where, f"o_groups={o_groups} does not divide the {heads} attention heads")
    experts = _int_field(cfg, "n_routed_experts", where=where)
    topk = _int_field(cfg, "num_experts_per_tok", where=where)
    if topk > experts:
        raise _bad(where, f"{topk} experts per token (num_experts_per_tok) exceed the {experts} experts")
    inter = _int_field(cfg, "moe_intermediate_size", where=where)
    shared = _int_field(cfg, "n_shared_experts", where=where, default=0, minimum=0)
    hash_layers = _int_field(cfg, "num_hash_layers", where=where, default=0, minimum=0)
    if hash_layers > layers:
        raise _bad(where, f"num_hash_layers={hash_layers} exceeds the {layers} layers")
    d = DeepSeekV4Spec(
        compress_ratios=tuple(ratios[:layers]),
        mtp_ratios=tuple(ratios[layers:]) if len(ratios) > layers else (0,) * mtp,
        q_lora_rank=_int_field(cfg, "q_lora_rank", where=where),
        o_lora_rank=_int_field(cfg, "o_lora_rank", where=where),
        o_groups=o_groups,
        qk_rope_head_dim=rope,
        index_n_heads=_int_field(cfg, "index_n_heads", where=where),
        index_head_dim=_int_field(cfg, "index_head_dim", where=where),
        index_topk=_int_field(cfg, "index_topk", where=where),
        window=_int_field(cfg, "sliding_window", where=where),
        hc_mult=_int_field(cfg, "hc_mult", where=where, default=1),
        hc_sinkhorn_iters=_int_field(cfg, "hc_sinkhorn_iters", where=where, default=0, minimum=0),
        hash_layers=hash_layers,
    )
    max_pos = _int_field(cfg, "max_position_embeddings", where=where, default=None, minimum=0)
    return ModelSpec(
        model_id=mc.model_id, resolved_id=mc.resolved_id, architecture=arch, family=FAMILY, num_layers=layers,
        hidden=hidden, num_heads=heads, num_kv_heads=1, head_dim=head_dim, intermediate=0,
        vocab=_int_field(cfg, "vocab_size", where=where), tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        sliding_window=None, max_position=max_pos or None, quant=dsv4_quant(mc, cfg), alias_note=mc.alias_note,
        moe=MoESpec(experts, topk, inter, shared * inter, 0, 0, True), mtp_layers=mtp,
        vision_params=vision_params(cfg, hidden, where), dsv4=d,
    )


# ------------------------------------------------------------------------------------------------
# plan
# ------------------------------------------------------------------------------------------------


def local_o_groups(spec: ModelSpec, tp: int) -> int:
    return max(1, spec.dsv4.o_groups // tp)


def _attention_op(name: str, kind: str, ratio: int, count: int, spec: ModelSpec, par: ParallelConfig) -> PlanOp:
    d, q = spec.dsv4, spec.quant
    return PlanOp(name, "dsv4_attention", count, params={
        "kind": TABLE_KIND[kind], "ratio": WINDOW_AS_RATIO if kind == "window" else ratio,
        "hidden": spec.hidden, "q_lora_rank": d.q_lora_rank, "o_lora_rank": d.o_lora_rank, "head_dim": spec.head_dim,
        "qk_rope_head_dim": d.qk_rope_head_dim, "index_n_heads": d.index_n_heads, "index_head_dim": d.index_head_dim,
        "index_topk": d.index_topk, "window": d.window, "heads": spec.num_heads // par.tp,
        "o_groups": local_o_groups(spec, par.tp), "gemm_quant": q.attention_gemm, "kv_quant": q.kv_cache,
        "tp": par.tp, "model_id": spec.resolved_id})


def _layer_ops(spec: ModelSpec, par: ParallelConfig, fusions: Fusions, ratios, router_layers: int) -> list[PlanOp]:
    """One pass over layers of ``ratios``: mHC, norms, attention per ratio, MoE block, all-reduces."""
    d, q, m = spec.dsv4, spec.quant, spec.moe
    tp, h, n = par.tp, spec.hidden, len(ratios)
    mhc = {"hidden": h, "hc_mult": d.hc_mult, "sinkhorn_iters": d.hc_sinkhorn_iters}
    ops = [PlanOp("mhc_pre", "mhc", n, params={"which": "pre", **mhc}),
           PlanOp("attn_norm", "elementwise", n, params={"bytes_per_token": h * 2 * 3})]
    for kind, ratio, count in d.groups(ratios):
        ops.append(_attention_op(f"attention_{kind}" if kind == "window" else f"attention_{kind}{ratio}",
                                 kind, ratio, count, spec, par))
    if tp > 1:
        ops.append(PlanOp("attn_allreduce", "allreduce", n, params={"elements_per_token": h, "group": tp}))
    ops += [PlanOp("mhc_post", "mhc", n, params={"which": "post", **mhc}),
            PlanOp("ffn_norm", "elementwise", n, params={"bytes_per_token": h * 2 * 3})]
    if router_layers:
        ops.append(PlanOp("router_gemm", "gemm", router_layers, params={"n": m.experts, "k": h, "quant": "bfloat16"}))
    ops += _moe_block_ops(n, h, m, par, q, fusions, True)
    return ops


def check_parallel(spec: ModelSpec, par: ParallelConfig) -> None:
    par.check(spec)
    if spec.num_heads // par.tp < 1:
        raise InvalidConfigError(f"TP {par.tp} exceeds the {spec.num_heads} attention heads")


def dsv4_plan(spec: ModelSpec, par: ParallelConfig, spec_decode: SpecDecode | None = None,
              fusions: Fusions | None = None) -> Plan:
    """The op plan of a DeepSeek-V4 model (see the module docstring), with MTP drafts when
    ``spec_decode.nextn`` > 0: each draft runs the MTP layer (its ``[embedding; hidden]``
    projection and one decoder layer of its compress ratio) and the LM head on one token per
    sequence."""
    check_parallel(spec, par)
    fusions = replace(_applied(fusions, spec, par), allreduce_norm=False, rope_in_attention=False)
    d = spec.dsv4
    ops = _layer_ops(spec, par, fusions, d.compress_ratios, spec.num_layers - d.hash_layers) + _ends(spec, par)
    sd = spec_decode or SpecDecode()
    sd.check()
    if sd.nextn:
        require_mtp_layers(spec)
        ratios = (d.mtp_ratios[0],) * sd.nextn  # the engines reuse the first MTP layer for every draft
        draft = [PlanOp("proj", "gemm", sd.nextn, params={"n": spec.hidden, "k": 2 * spec.hidden, "quant": spec.quant.gemm})]
        draft += _layer_ops(spec, par, fusions, ratios, sd.nextn)
        head = next(o for o in ops if o.name == "lm_head")
        draft.append(replace(head, count=sd.nextn))
        ops += [replace(o, name=f"mtp_{o.name}", phase="decode") for o in draft]
    return Plan(spec, par, tuple(ops), spec_decode=sd, fusions=fusions)


def plan_notes(spec: ModelSpec) -> list[str]:
    """What the plan approximates, for a result's notes."""
    n = spec.dsv4.count("window")
    if not n:
        return []
    return [(f"{n} window-only attention layers (compress ratio 0) costed with the HCA module (ratio {WINDOW_AS_RATIO}): "
             f"no table times them alone; an upper bound by the 1/{WINDOW_AS_RATIO} compressed entries HCA adds")]


# ------------------------------------------------------------------------------------------------
# memory
# ------------------------------------------------------------------------------------------------


def _attention_weights(spec: ModelSpec, par: ParallelConfig, ratio: int) -> float:
    """Attention weights of one layer of ``ratio`` on one GPU (bytes)."""
    d, h, hd = spec.dsv4, spec.hidden, spec.head_dim
    wb = WEIGHT_BYTES[spec.quant.attention_gemm]
    heads = spec.num_heads // par.tp
    proj = (h * d.q_lora_rank + d.q_lora_rank * heads * hd + h * hd + heads * hd * d.o_lora_rank
            + local_o_groups(spec, par.tp) * d.o_lora_rank * h)
    kind = kind_of(ratio)
    streams = 0 if kind == "window" else 2 if kind == "csa" else 1
    proj += streams * h * 2 * hd
    if kind == "csa":
        proj += d.q_lora_rank * d.index_n_heads * d.index_head_dim + h * d.index_n_heads + 2 * h * 2 * d.index_head_dim
    norms = (d.q_lora_rank + hd + 2 * h) * 2.0
    return proj * wb + norms


def _layer_weights(spec: ModelSpec, par: ParallelConfig, ratio: int, hashed: bool) -> float:
    d, m, h, q = spec.dsv4, spec.moe, spec.hidden, spec.quant
    experts = m.experts * 3 * h * m.inter * WEIGHT_BYTES[q.moe or q.gemm] / (par.etp * par.ep)
    shared = 3 * h * (m.shared_inter // par.tp) * WEIGHT_BYTES[q.shared_expert_gemm]
    # a learned gate (bf16), or the hash layers' token -> experts table (int32)
    router = spec.vocab * m.topk * 4.0 if hashed else h * m.experts * 2.0
    mhc = 2 * d.hc_mult * h * d.hc_mult * (2 + d.hc_mult) * 4.0  # pre mixing projections at both sites, fp32
    return _attention_weights(spec, par, ratio) + experts + shared + router + mhc


def layer_weight_bytes(spec: ModelSpec, par: ParallelConfig, extra_layers: int = 0) -> float:
    """Weight bytes of the decoder layers on the most loaded GPU (a stage holds ``ceil(L / pp)`` of
    them, at the average layer) plus ``extra_layers`` MTP layers (their projection included)."""
    d, L = spec.dsv4, spec.num_layers
    total = sum(_layer_weights(spec, par, r, i < d.hash_layers) for i, r in enumerate(d.compress_ratios))
    stage = math.ceil(L / par.pp) / L
    mtp = 0.0
    if extra_layers:
        r = d.mtp_ratios[0] if d.mtp_ratios else 0
        mtp = extra_layers * (_layer_weights(spec, par, r, False) + 2 * spec.hidden * spec.hidden * WEIGHT_BYTES[spec.quant.gemm])
    return total * stage + mtp


def _entry_bytes(spec: ModelSpec) -> float:
    return (spec.head_dim - spec.dsv4.qk_rope_head_dim) * KV_BYTES[spec.quant.kv_cache] + spec.dsv4.qk_rope_head_dim * 2.0


#: bytes of one FP8 indexer key entry beyond its channels (one fp32 scale)
INDEXER_SCALE_BYTES = 4.0


def _per_token(spec: ModelSpec, ratio: int) -> float:
    """Cache bytes one layer of ``ratio`` adds per context token (compressed entries; CSA's indexer
    keys at FP8 plus a scale)."""
    if ratio == 0:
        return 0.0
    b = _entry_bytes(spec) / ratio
    if kind_of(ratio) == "csa":
        b += (spec.dsv4.index_head_dim + INDEXER_SCALE_BYTES) / ratio
    return b


def kv_bytes_per_token(spec: ModelSpec, par: ParallelConfig, extra_layers: int = 0) -> float:
    """Per-token cache bytes on one GPU: the compressed latent entries of the compressed layers (the
    one latent head is replicated on every TP rank) and CSA's indexer keys, for the layers of one
    pipeline stage (``ceil(L / pp)`` of them at the average layer), plus ``extra_layers`` MTP
    layers."""
    d, L = spec.dsv4, spec.num_layers
    total = sum(_per_token(spec, r) for r in d.compress_ratios)
    mtp = extra_layers * _per_token(spec, d.mtp_ratios[0]) if extra_layers and d.mtp_ratios else 0.0
    return total * math.ceil(L / par.pp) / L + mtp


def _per_request(spec: ModelSpec, ratio: int) -> float:
    """Fixed cache one request holds in one layer: its sliding window of uncompressed entries and,
    on a compressed layer, the compressor's running state (fp32 value and score per channel for the
    ``ratio`` tokens being folded, two overlapping streams on CSA, plus CSA's indexer compressor)."""
    d, hd = spec.dsv4, spec.head_dim
    b = d.window * _entry_bytes(spec)
    if ratio:
        streams = 2 if kind_of(ratio) == "csa" else 1
        b += 2 * ratio * streams * hd * 4.0
        if kind_of(ratio) == "csa":
            b += 2 * ratio * 2 * d.index_head_dim * 4.0
    return b


def state_bytes_per_request(spec: ModelSpec, par: ParallelConfig) -> float:
    """Per-request fixed cache on one GPU over the layers of one pipeline stage (:func:`_per_request`)."""
    d, L = spec.dsv4, spec.num_layers
    return sum(_per_request(spec, r) for r in d.compress_ratios) * math.ceil(L / par.pp) / L
