"""Nemotron-H hybrids (``NemotronHForCausalLM``): Mamba2, attention, MLP and MoE blocks in the
order the config's ``hybrid_override_pattern`` gives (``M`` Mamba2, ``*`` attention, ``-`` MLP,
``E`` MoE; or the same as ``layers_block_type`` names), each block one pre-norm mixer with a
residual. This module builds the family's spec part (:class:`MambaSpec`), its op plan and its
weight bytes.

Blocks, per GPU under tensor parallelism ``tp`` (heads, groups and FFN widths split over TP):

* ``M``: ``in_proj`` GEMM to ``z, x, B, C, dt`` (``2*H*P + 2*G*N + H`` outputs for ``H`` heads of
  ``P`` channels, ``G`` groups, state size ``N``), the causal conv1d
  (:func:`infercast.ops.mamba.resolve_mamba_conv`), the SSM scan / state update
  (:func:`infercast.ops.mamba.resolve_mamba_ssm`, a roofline), the gated group RMSNorm
  (elementwise) and ``out_proj``. Groups are replicated when TP exceeds them (as KV heads).
* ``*``: QKV GEMM, attention (GQA, no positional embedding: Nemotron-H's attention applies no
  RoPE), O GEMM.
* ``-``: the non-gated MLP (``up``, the relu^2 activation, ``down``).
* ``E``: router GEMM (bf16), the routed experts (non-gated, from the MoE tables), the shared
  expert (a non-gated MLP of ``moe_shared_expert_intermediate_size`` per shared expert). With
  ``moe_latent_size`` (LatentMoE: Nemotron-3 Super / Ultra) the routed experts run at the latent
  width: a ``fc1_latent_proj`` GEMM (hidden -> latent) before them and ``fc2_latent_proj``
  (latent -> hidden) after, both unsplit (every TP rank runs them on its tokens).

Each block ends in a TP all-reduce (``tp > 1``); attention-DP moves the MoE blocks' tokens as
:func:`infercast.models.plan.moe_plan` does. MTP (``num_nextn_predict_layers``) drafts run the
blocks of ``mtp_hybrid_override_pattern`` (``*E``: one attention and one MoE block) plus the LM
head, once per draft token.

Quantised exports: ModelOpt's exclusion list keeps some blocks' projections in BF16 (the Nano
NVFP4 export: every attention block and 6 of the 23 Mamba blocks); a ``MIXED_PRECISION``
export's ``quantized_layers`` gives each module's algorithm (the 3.5 Lightning export: Mamba
projections FP8, experts and shared experts weight-only NVFP4, costed with the nvfp4 tables:
the tables collect no weight-only NVFP4 kernel, which the quant source says). An explicit
``--gemm-quant`` other than the checkpoint's replaces these exceptions, as for other families.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import asdict, dataclass, replace

from ..data.model_configs import ModelConfig
from ..data.quant import WEIGHT_BYTES
from ..errors import InvalidConfigError, InvalidInputError
from .plan import (Fusions, ParallelConfig, Plan, PlanOp, SpecDecode, _applied, _ends, _fused_input,
                   _moe_experts_op, _moe_gather_ops, _moe_scatter_ops, kv_heads_per_gpu, require_mtp_layers)
from .spec import ModelSpec, MoESpec, QuantSpec, _int_field, infer_quant, vision_params

FAMILY = "nemotron_h"
BLOCKS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
_BLOCK_NAMES = {v: k for k, v in BLOCKS.items()}


@dataclass(frozen=True)
class MambaSpec:
    """A Nemotron-H hybrid's block layout and Mamba2 mixer shape (whole model, before TP)."""

    pattern: str  # one character per block: M * - E
    num_heads: int  # mamba_num_heads
    head_dim: int  # mamba_head_dim
    state_size: int  # ssm_state_size
    n_groups: int
    conv_kernel: int = 4
    chunk_size: int = 128
    ssm_state_bytes: float = 4.0  # mamba_ssm_cache_dtype (float32)
    moe_latent: int = 0  # LatentMoE width of the routed experts (0: they run at the hidden width)
    mtp_pattern: str = ""  # blocks of one MTP layer
    #: quant exceptions of the export, valid while the dense GEMMs keep ``export_gemm``
    export_gemm: str = "bfloat16"
    mamba_gemm: str | None = None  # quant mode of the Mamba projections when the export says one
    bf16_mamba_layers: int = 0  # Mamba blocks whose projections the export keeps in BF16
    bf16_attention_layers: int = 0  # attention blocks whose projections the export keeps in BF16

    def count(self, kind: str) -> int:
        return self.pattern.count(_BLOCK_NAMES[kind])

    @property
    def mamba_layers(self) -> int:
        return self.count("mamba")

    @property
    def attention_layers(self) -> int:
        return self.count("attention")

    def to_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------------------------------------
# spec
# ------------------------------------------------------------------------------------------------

_LAYER = re.compile(r"layers\.(\d+)\.")
_MAMBA_PROJ = re.compile(r"mixer\.(?:in_proj|out_proj)\b")
_ATTN_PROJ = re.compile(r"mixer\.[qkvo]_proj\b")
_EXPERT = re.compile(r"mixer\.experts\.")
_SHARED = re.compile(r"mixer\.shared_experts?\.")
#: ModelOpt per-module algorithms -> the tables' quant modes (weight-only NVFP4 has no kernel of
#: its own in the tables: its weights are the same bytes as nvfp4's)
_ALGO_MODE = {"FP8": "fp8", "NVFP4": "nvfp4", "W4A16_NVFP4": "nvfp4", "FP8_BLOCK": "fp8_block", "W4A8_NVFP4_FP8": "nvfp4"}


def _pattern(cfg: dict, key_pattern: str, key_types: str, where: str) -> str:
    p = cfg.get(key_pattern)
    if p is None and cfg.get(key_types) is not None:
        names = cfg[key_types]
        bad = sorted({n for n in names if n not in _BLOCK_NAMES}) if isinstance(names, list) else [repr(names)]
        if bad:
            raise InvalidInputError(f"model config {where} is malformed",
                                    f"{key_types} holds unknown block types {bad}; known: {sorted(_BLOCK_NAMES)}")
        p = "".join(_BLOCK_NAMES[n] for n in names)
    if p is None:
        return ""
    if not isinstance(p, str) or set(p) - set(BLOCKS):
        raise InvalidInputError(f"model config {where} is malformed",
                                f"{key_pattern} must be a string of {' '.join(BLOCKS)} (Mamba2, attention, MLP, MoE), got {p!r}")
    return p


def _layers_of(patterns, pattern: str, kind: str, proj: re.Pattern) -> int:
    """How many blocks of ``kind`` an exclusion list names (a pattern without a layer index
    names them all)."""
    layers: set[int] = set()
    for p in patterns or ():
        if not isinstance(p, str) or not proj.search(p):
            continue
        m = _LAYER.search(p)
        if m is None:
            return pattern.count(_BLOCK_NAMES[kind])
        i = int(m.group(1))
        if i < len(pattern) and BLOCKS[pattern[i]] == kind:
            layers.add(i)
    return len(layers)


def _mode_of(quantized: dict, which: re.Pattern) -> str | None:
    """The most common table quant mode among ``quantized_layers`` entries matching ``which``."""
    modes = Counter()
    for name, q in quantized.items():
        if which.search(name) and isinstance(q, dict):
            algo = str(q.get("quant_algo", "")).upper()
            if algo not in _ALGO_MODE:
                raise InvalidConfigError(f"quantized_layers gives {name} the algorithm {algo!r}, which infercast does not map",
                                         available=sorted(_ALGO_MODE))
            modes[_ALGO_MODE[algo]] += 1
    return modes.most_common(1)[0][0] if modes else None


def _export_quant(mc: ModelConfig, pattern: str, quant: QuantSpec) -> tuple[QuantSpec, dict]:
    """The export's per-kind quant exceptions: (QuantSpec with attention / shared / MoE modes set,
    MambaSpec fields)."""
    extra = {"export_gemm": quant.gemm}
    if quant.gemm == "bfloat16":
        return quant, extra
    hq = ((mc.hf_quant or {}).get("quantization") or {}) if mc.hf_quant else {}
    qc = mc.config.get("quantization_config") or {}
    excluded = hq.get("exclude_modules") or qc.get("ignore") or qc.get("exclude_modules") or ()
    quantized = hq.get("quantized_layers") or {}
    notes = []
    mamba_mode = _mode_of(quantized, _MAMBA_PROJ)
    expert_mode, shared_mode = _mode_of(quantized, _EXPERT), _mode_of(quantized, _SHARED)
    if quantized:
        attn_mode = _mode_of(quantized, _ATTN_PROJ)
        if attn_mode:
            notes.append(f"attention projections {attn_mode}")
        if mamba_mode:
            extra["mamba_gemm"] = mamba_mode
            notes.append(f"Mamba projections {mamba_mode}")
        if expert_mode:
            quant = replace(quant, moe=expert_mode)
            notes.append(f"experts {expert_mode}")
        if shared_mode:
            quant = replace(quant, shared_gemm=shared_mode)
        if any(str(q.get("quant_algo", "")).upper() == "W4A16_NVFP4" for q in quantized.values() if isinstance(q, dict)):
            notes.append("weight-only NVFP4 modules costed with the nvfp4 tables (no W4A16 NVFP4 kernel collected)")
    n_attn, n_mamba = pattern.count("*"), pattern.count("M")
    bf16_attn = _layers_of(excluded, pattern, "attention", _ATTN_PROJ)
    bf16_mamba = _layers_of(excluded, pattern, "mamba", _MAMBA_PROJ)
    if bf16_attn and bf16_attn == n_attn:
        quant = replace(quant, attn_gemm="bfloat16")
    elif bf16_attn:
        extra["bf16_attention_layers"] = bf16_attn
    if bf16_mamba:
        extra["bf16_mamba_layers"] = bf16_mamba
    if bf16_attn or bf16_mamba:
        notes.append(f"excluded (bf16): {bf16_attn} of {n_attn} attention and {bf16_mamba} of {n_mamba} Mamba blocks' projections")
    if notes:
        quant = replace(quant, source=quant.source + "; " + "; ".join(notes))
    return quant, extra


def build_nemotron_h_spec(mc: ModelConfig, arch: str) -> ModelSpec:
    """ModelSpec (family ``nemotron_h``, with :class:`MambaSpec`) of a Nemotron-H config."""
    cfg = mc.config
    where = mc.resolved_id
    pattern = _pattern(cfg, "hybrid_override_pattern", "layers_block_type", where)
    if not pattern:
        raise InvalidInputError(f"model config {where} is malformed",
                                "a Nemotron-H config needs hybrid_override_pattern or layers_block_type (its block order)")
    layers = _int_field(cfg, "num_hidden_layers", where=where, default=len(pattern), default_note="the pattern's length")
    if layers != len(pattern):
        raise InvalidInputError(f"model config {where} is malformed",
                                f"num_hidden_layers={layers} but the block pattern has {len(pattern)} blocks")
    hidden = _int_field(cfg, "hidden_size", where=where)
    heads = _int_field(cfg, "num_attention_heads", where=where)
    kv = _int_field(cfg, "num_key_value_heads", where=where, default=heads, default_note="num_attention_heads")
    if heads % kv:
        raise InvalidInputError(f"model config {where} is malformed",
                                f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv}")
    head_dim = _int_field(cfg, "head_dim", "attention_head_dim", where=where, default=hidden // heads,
                          default_note=f"hidden_size // num_attention_heads = {hidden} // {heads}")
    inter = _int_field(cfg, "intermediate_size", where=where, default=0, minimum=0)
    n_mlp = pattern.count("-")
    if n_mlp and inter < 1:
        raise InvalidInputError(f"model config {where} is malformed", f"{n_mlp} MLP blocks need intermediate_size > 0")
    moe = None
    if "E" in pattern:
        experts = _int_field(cfg, "n_routed_experts", "num_experts", where=where)
        topk = _int_field(cfg, "num_experts_per_tok", where=where)
        if topk > experts:
            raise InvalidInputError(f"model config {where} is malformed",
                                    f"{topk} experts per token (num_experts_per_tok) exceed the {experts} experts")
        expert_inter = _int_field(cfg, "moe_intermediate_size", where=where, default=inter or None)
        n_shared = _int_field(cfg, "n_shared_experts", where=where, default=0, minimum=0)
        shared_each = _int_field(cfg, "moe_shared_expert_intermediate_size", where=where, default=expert_inter,
                                 default_note="moe_intermediate_size")
        moe = MoESpec(experts, topk, expert_inter, n_shared * shared_each, n_mlp, inter if n_mlp else 0, gated=False)
    mtp_layers = _int_field(cfg, "num_nextn_predict_layers", where=where, default=0, minimum=0)
    mtp_pattern = _pattern(cfg, "mtp_hybrid_override_pattern", "mtp_layers_block_type", where) if mtp_layers else ""
    if mtp_layers and not mtp_pattern:
        mtp_pattern = "*E" if moe else "*-"
    if "E" in mtp_pattern and moe is None or "-" in mtp_pattern and inter < 1:
        raise InvalidInputError(f"model config {where} is malformed", f"MTP blocks {mtp_pattern!r} name a block the model lacks")
    quant = infer_quant(mc, cfg, layers)
    quant, extra = _export_quant(mc, pattern, quant)
    dtype = str(cfg.get("mamba_ssm_cache_dtype") or "float32")
    state_bytes = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}.get(dtype)
    if state_bytes is None:
        raise InvalidInputError(f"model config {where} is malformed",
                                f"mamba_ssm_cache_dtype {dtype!r} is not one of float32, bfloat16, float16")
    mamba = MambaSpec(
        pattern=pattern,
        num_heads=_int_field(cfg, "mamba_num_heads", where=where),
        head_dim=_int_field(cfg, "mamba_head_dim", where=where),
        state_size=_int_field(cfg, "ssm_state_size", where=where),
        n_groups=_int_field(cfg, "n_groups", where=where, default=1),
        conv_kernel=_int_field(cfg, "conv_kernel", where=where, default=4),
        chunk_size=_int_field(cfg, "chunk_size", where=where, default=128),
        ssm_state_bytes=state_bytes,
        moe_latent=_int_field(cfg, "moe_latent_size", where=where, default=0, minimum=0),
        mtp_pattern=mtp_pattern,
        **extra,
    )
    max_pos = _int_field(cfg, "max_position_embeddings", where=where, default=None, minimum=0)
    return ModelSpec(
        model_id=mc.model_id, resolved_id=mc.resolved_id, architecture=arch, family=FAMILY, num_layers=layers,
        hidden=hidden, num_heads=heads, num_kv_heads=kv, head_dim=head_dim, intermediate=inter,
        vocab=_int_field(cfg, "vocab_size", where=where), tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        sliding_window=None, max_position=max_pos or None, quant=quant, alias_note=mc.alias_note, moe=moe,
        mtp_layers=mtp_layers, mamba=mamba, vision_params=vision_params(cfg, hidden, where),
    )


# ------------------------------------------------------------------------------------------------
# plan
# ------------------------------------------------------------------------------------------------


def _groups_per_gpu(m: MambaSpec, tp: int) -> int:
    """B/C groups on one GPU: split over TP, replicated when TP exceeds them."""
    return max(1, m.n_groups // tp)


def check_parallel(spec: ModelSpec, par: ParallelConfig) -> None:
    """The layouts a Nemotron-H model can take, beyond :meth:`ParallelConfig.check`: whole Mamba
    heads per GPU and B/C groups split or replicated whole."""
    par.check(spec)
    m, tp = spec.mamba, par.tp
    if m.num_heads % tp:
        raise InvalidConfigError(f"TP {tp} does not divide the {m.num_heads} Mamba heads of {spec.resolved_id}",
                                 "each GPU must hold whole Mamba heads",
                                 [f"tp={d}" for d in (1, 2, 4, 8, 16, 32, 64) if m.num_heads % d == 0 and spec.num_heads % d == 0])
    if m.n_groups % tp and tp % m.n_groups:
        raise InvalidConfigError(f"TP {tp} neither divides nor is a multiple of the {m.n_groups} Mamba groups",
                                 "B/C groups are split over TP or replicated whole")
    if spec.intermediate and spec.mamba.count("mlp") and spec.intermediate % tp:
        raise InvalidConfigError(f"TP {tp} does not divide the MLP width {spec.intermediate}")


def _gemm(name: str, count: int, n: int, k: int, quant: str, fused: bool = False) -> PlanOp:
    return PlanOp(name, "gemm", count, params={"n": n, "k": k, "quant": quant, **_fused_input(fused)})


def _split(name: str, count: int, bf16: int, n: int, k: int, quant: str, fused: bool = False) -> list[PlanOp]:
    """A projection over ``count`` blocks, ``bf16`` of which the export keeps in BF16."""
    if quant == "bfloat16" or bf16 <= 0:
        return [_gemm(name, count, n, k, quant, fused)]
    if bf16 >= count:
        return [_gemm(name, count, n, k, "bfloat16", fused)]
    return [_gemm(name, count - bf16, n, k, quant, fused), _gemm(f"{name}_bf16", bf16, n, k, "bfloat16", fused)]


def _block_ops(kind: str, count: int, spec: ModelSpec, par: ParallelConfig, fusions: Fusions, exceptions: bool = True) -> list[PlanOp]:
    """The mixer ops of ``count`` blocks of ``kind`` on one GPU (no norm, no all-reduce)."""
    tp, h, q, m = par.tp, spec.hidden, spec.quant, spec.mamba
    live = exceptions and q.gemm == m.export_gemm  # an explicit --gemm-quant replaces the export's exceptions
    if kind == "mamba":
        H, P, N = m.num_heads // tp, m.head_dim, m.state_size
        G = _groups_per_gpu(m, tp)
        mq = (m.mamba_gemm if live and m.mamba_gemm else q.gemm)
        bf16 = m.bf16_mamba_layers if live else 0
        return [
            *_split("mamba_in_proj", count, bf16, 2 * H * P + 2 * G * N + H, h, mq, fusions.norm_quant),
            PlanOp("mamba_conv", "mamba_conv", count,
                   params={"d_model": h, "nheads": H, "head_dim": P, "n_groups": G, "d_state": N,
                           "conv_kernel": m.conv_kernel, "model_name": spec.resolved_id}),
            PlanOp("mamba_ssm", "mamba_ssm", count,
                   params={"nheads": H, "head_dim": P, "d_state": N, "n_groups": G, "chunk": m.chunk_size,
                           "state_bytes": m.ssm_state_bytes}),
            # gated group RMSNorm: y and the gate z read, the normed output written (bf16)
            PlanOp("mamba_gated_norm", "elementwise", count, params={"bytes_per_token": H * P * 2 * 3}),
            *_split("mamba_out_proj", count, bf16, h, H * P, mq),
        ]
    if kind == "attention":
        heads, kvh, hd = spec.num_heads // tp, kv_heads_per_gpu(spec, tp), spec.head_dim
        bf16 = m.bf16_attention_layers if live else 0
        return [
            *_split("qkv_gemm", count, bf16, (heads + 2 * kvh) * hd, h, q.attention_gemm, fusions.norm_quant),
            PlanOp("attention", "attention", count,
                   params={"heads": heads, "kv_heads": kvh, "head_dim": hd, "window": 0,
                           "kv_quant": q.kv_cache, "attn_quant": q.attention}),
            *_split("o_gemm", count, bf16, h, heads * hd, q.attention_gemm),
        ]
    if kind == "mlp":
        return _relu2_mlp("mlp_", count, h, spec.intermediate // tp, q.gemm, fusions)
    if kind == "moe":
        e = spec.moe
        width = m.moe_latent or h
        ops = [_gemm("router_gemm", count, e.experts, h, "bfloat16")]
        adp = par.attention_dp
        if m.moe_latent:
            ops.append(_gemm("moe_latent_down", count, width, h, q.gemm))
        ops += _moe_gather_ops(count, width, e, par, q.moe or q.gemm)
        ops.append(_moe_experts_op(count, width, e, par, q.moe or q.gemm, False, float(adp)))
        ops += _moe_scatter_ops(count, width, par)
        if m.moe_latent:
            ops.append(_gemm("moe_latent_up", count, h, width, q.gemm))
        if e.shared_inter:
            ops += _relu2_mlp("shared_", count, h, e.shared_inter // tp, q.shared_expert_gemm, fusions)
        return ops
    raise InvalidConfigError(f"unknown Nemotron-H block kind {kind!r}", available=sorted(_BLOCK_NAMES))


def _relu2_mlp(name: str, count: int, hidden: int, inter_per_gpu: int, quant: str, fusions: Fusions) -> list[PlanOp]:
    """A non-gated MLP: up projection, relu^2 (read and write the intermediate), down projection."""
    return [
        _gemm(f"{name}up_gemm", count, inter_per_gpu, hidden, quant, fusions.norm_quant),
        PlanOp(f"{name}activation", "elementwise", count, params={"bytes_per_token": inter_per_gpu * 2 * 2}),
        _gemm(f"{name}down_gemm", count, hidden, inter_per_gpu, quant, fusions.act_quant),
    ]


def _stack_ops(pattern: str, spec: ModelSpec, par: ParallelConfig, fusions: Fusions, prefix: str = "",
               times: int = 1, phase: str = "both", exceptions: bool = True) -> list[PlanOp]:
    """Every block of ``pattern`` (``times`` over): its norm, mixer and TP all-reduce."""
    tp, h = par.tp, spec.hidden
    n = len(pattern) * times
    ops = [PlanOp("input_norm", "elementwise", 1 if fusions.allreduce_norm and not prefix else n,
                  params={"bytes_per_token": h * 2 * 3})]
    for kind in ("mamba", "attention", "mlp", "moe"):
        c = pattern.count(_BLOCK_NAMES[kind]) * times
        if not c:
            continue
        ops += _block_ops(kind, c, spec, par, fusions, exceptions)
        moved = kind == "moe" and par.attention_dp > 1  # gathered / dispatched instead of all-reduced
        if tp > 1 and not moved:
            ops.append(PlanOp(f"{kind}_allreduce", "allreduce", c, params={"elements_per_token": h, "group": tp}))
    if prefix:
        ops = [replace(o, name=f"{prefix}{o.name}", phase=phase) for o in ops]
    return ops


def nemotron_h_plan(spec: ModelSpec, par: ParallelConfig, spec_decode: SpecDecode | None = None,
                    fusions: Fusions | None = None) -> Plan:
    """The op plan of a Nemotron-H model (see the module docstring), with MTP drafts when
    ``spec_decode.nextn`` > 0."""
    check_parallel(spec, par)
    fusions = _applied(fusions, spec, par)
    fusions = replace(fusions, shared_experts=False, rope_in_attention=False)  # no RoPE; shared expert is its own MLP
    ops = _stack_ops(spec.mamba.pattern, spec, par, fusions) + _ends(spec, par)
    sd = spec_decode or SpecDecode()
    sd.check()
    if sd.mtp_steps:
        require_mtp_layers(spec)
        ops += _stack_ops(spec.mamba.mtp_pattern, spec, par, fusions, prefix="mtp_", times=sd.nextn, phase="decode",
                          exceptions=False)
        head = next(o for o in ops if o.name == "lm_head")
        ops.append(replace(head, name="mtp_lm_head", count=sd.nextn, phase="decode"))
    return Plan(spec, par, tuple(ops), spec_decode=sd, fusions=fusions)


# ------------------------------------------------------------------------------------------------
# memory
# ------------------------------------------------------------------------------------------------


def _block_weight_bytes(kind: str, spec: ModelSpec, par: ParallelConfig, exceptions_share: float = 1.0) -> float:
    """Weight bytes of one block of ``kind`` on one GPU (its norm included); projections the
    export keeps in BF16 are averaged in by their share of the kind's blocks."""
    tp, h, q, m = par.tp, spec.hidden, spec.quant, spec.mamba
    live = q.gemm == m.export_gemm
    norm = h * 2.0
    if kind == "mamba":
        H, P, N, G = m.num_heads // tp, m.head_dim, m.state_size, _groups_per_gpu(m, tp)
        wb = WEIGHT_BYTES[m.mamba_gemm if live and m.mamba_gemm else q.gemm]
        share = m.bf16_mamba_layers / max(1, m.mamba_layers) if live else 0.0
        wb = (1.0 - share) * wb + share * WEIGHT_BYTES["bfloat16"]
        proj = h * (2 * H * P + 2 * G * N + H) + H * P * h
        conv = (H * P + 2 * G * N) * (m.conv_kernel + 1) * 2.0  # taps + bias, bf16
        return proj * wb + conv + 3 * H * 4.0 + H * P * 2.0 + norm  # A, D, dt bias (fp32); gated-norm weight
    if kind == "attention":
        heads, kvh, hd = spec.num_heads // tp, kv_heads_per_gpu(spec, tp), spec.head_dim
        wb = WEIGHT_BYTES[q.attention_gemm]
        share = m.bf16_attention_layers / max(1, m.attention_layers) if live else 0.0
        wb = (1.0 - share) * wb + share * WEIGHT_BYTES["bfloat16"]
        return (h * (heads + 2 * kvh) * hd + heads * hd * h) * wb + norm
    if kind == "mlp":
        return 2 * h * (spec.intermediate // tp) * WEIGHT_BYTES[q.gemm] + norm
    e = spec.moe
    width = m.moe_latent or h
    experts = e.experts * 2 * width * e.inter * WEIGHT_BYTES[q.moe or q.gemm] / (par.etp * par.ep)
    shared = 2 * h * (e.shared_inter // tp) * WEIGHT_BYTES[q.shared_expert_gemm]
    latent = 2 * h * m.moe_latent * WEIGHT_BYTES[q.gemm] if m.moe_latent else 0.0
    return experts + shared + latent + h * e.experts * 2.0 + norm


def layer_weight_bytes(spec: ModelSpec, par: ParallelConfig, extra_layers: int = 0) -> float:
    """Weight bytes of the blocks on the most loaded GPU (a pipeline stage holds
    ``ceil(blocks / pp)`` of them, the average block mix) plus ``extra_layers`` MTP layers of
    ``mtp_pattern`` blocks (on the last stage)."""
    m = spec.mamba
    per_kind = {k: _block_weight_bytes(k, spec, par) for k in _BLOCK_NAMES if m.count(k)}
    total = sum(per_kind[k] * m.count(k) for k in per_kind)
    stage = math.ceil(spec.num_layers / par.pp) / spec.num_layers
    mtp = sum(_block_weight_bytes(BLOCKS[c], spec, par) for c in m.mtp_pattern) * extra_layers
    return total * stage + mtp


def state_bytes_per_request(spec: ModelSpec, par: ParallelConfig) -> float:
    """SSM + conv state one request holds on one GPU over the Mamba blocks of a pipeline stage."""
    from ..ops.mamba import mamba_state_bytes

    m, tp = spec.mamba, par.tp
    per_layer = mamba_state_bytes(m.num_heads // tp, m.head_dim, m.state_size, _groups_per_gpu(m, tp), m.conv_kernel,
                                  m.ssm_state_bytes)
    return math.ceil(m.mamba_layers / par.pp) * per_layer
