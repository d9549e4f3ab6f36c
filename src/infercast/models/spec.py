"""HF config -> typed model spec, with quantisation inferred from the checkpoint's metadata."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING

from ..data.model_configs import ModelConfig
from ..data.quant import COMPUTE_DTYPE, GEMM_QUANTS, KV_BYTES, KV_QUANTS, WEIGHT_BYTES  # noqa: F401
from ..errors import InvalidConfigError, InvalidInputError, UnsupportedModelError
from .groups import AttentionGroup, FFNGroup

if TYPE_CHECKING:
    from .deepseek_v4 import DeepSeekV4Spec
    from .kimi_k3 import KimiLinearSpec
    from .nemotron_h import MambaSpec


@dataclass(frozen=True)
class QuantSpec:
    """Quant modes of a checkpoint's weights and caches. ``gemm`` is the dense GEMMs' mode;
    ``attn_gemm`` / ``shared_gemm``, when set, that of the attention projections (QKV / O, MLA's,
    Gated DeltaNet's) / of the shared experts, which a quantised export can keep unquantised
    (:func:`excluded_quant`)."""

    gemm: str = "bfloat16"
    kv_cache: str = "bfloat16"
    attention: str = "bfloat16"  # fmha compute dtype
    moe: str | None = None
    source: str = "default (bf16)"
    attn_gemm: str | None = None
    shared_gemm: str | None = None

    @property
    def attention_gemm(self) -> str:
        """Quant mode of the attention projections."""
        return self.attn_gemm or self.gemm

    @property
    def shared_expert_gemm(self) -> str:
        """Quant mode of the shared experts' GEMMs."""
        return self.shared_gemm or self.gemm

    def with_overrides(self, gemm=None, kv_cache=None, attention=None, moe=None) -> QuantSpec:
        for val, allowed, flag in (
            (gemm, GEMM_QUANTS, "--gemm-quant"),
            (moe, GEMM_QUANTS, "--moe-quant"),
            (kv_cache, KV_QUANTS, "--kv-cache-quant"),
            (attention, KV_QUANTS, "--attention-quant"),
        ):
            if val is not None and val not in allowed:
                raise InvalidConfigError(f"{flag} {val!r} is not a known quant mode", available=allowed)
        if not any((gemm, kv_cache, attention, moe)):
            return self
        return replace(
            self,
            gemm=gemm or self.gemm,
            kv_cache=kv_cache or self.kv_cache,
            attention=attention or self.attention,
            moe=moe or self.moe,
            source=self.source + " + flags",
            # another GEMM mode than the checkpoint's is every dense GEMM's, its exclusions included
            attn_gemm=None if gemm and gemm != self.gemm else self.attn_gemm,
            shared_gemm=None if gemm and gemm != self.gemm else self.shared_gemm,
        )


#: Architectures whose NVIDIA NVFP4 exports keep the attention projections unquantised, for an
#: ``nvidia/<name>-NVFP4`` alias whose own exclusion list the pack does not hold: DeepSeek-V3's
#: (MLA): the pack's nvidia/DeepSeek-V3.1-NVFP4 and -V3.2-NVFP4 exclude every layer's q_a / q_b /
#: kv_a / kv_b projections, and the nvidia/DeepSeek-R1-0528-FP4 model card says its v2 "additionally
#: quantizes the wo module in attention layers" (v1 none of them). See docs/modelling-log.md,
#: 'NVFP4 DeepSeek exports keep attention in BF16'.
NVFP4_EXPORT_BF16_ATTENTION_ARCHS = ("DeepseekV3ForCausalLM",)

#: an excluded module that is a whole attention block (``...self_attn*``, ``*.attn.*``,
#: ``re:.*self_attn.*``), or one of its projections (``self_attn.q_a_proj``, ``...o_proj``; not
#: its norms or a sparse-attention indexer); a whole shared-expert block
_ATTENTION_BLOCK = re.compile(r"(?:self_attn|linear_attn|\battn)$")
_ATTENTION_PROJECTION = re.compile(r"(?:self_attn|linear_attn|\battn)\.(?!indexer)\w*proj\w*$")
_SHARED_EXPERT_BLOCK = re.compile(r"shared_experts?$")
_LAYER_INDEX = re.compile(r"layers\.(\d+)\.")


def _is_excluded_kind(pattern: str, kind: str) -> bool:
    stem = pattern.rstrip("*.")
    if kind == "attn":
        return bool(_ATTENTION_BLOCK.search(stem) or _ATTENTION_PROJECTION.search(stem))
    return bool(_SHARED_EXPERT_BLOCK.search(stem))


def excluded_quant(patterns, num_layers: int) -> tuple[bool, bool]:
    """:func:`_excluded_quant`, kept by its arguments (a search builds the same model's spec for
    every layout; the lists run to thousands of module names)."""
    try:
        return _excluded_quant_kept(tuple(patterns or ()), int(num_layers))
    except TypeError:  # an unhashable entry: worked out afresh
        return _excluded_quant(patterns, num_layers)


@lru_cache(maxsize=64)
def _excluded_quant_kept(patterns: tuple, num_layers: int) -> tuple[bool, bool]:
    return _excluded_quant(patterns, num_layers)


def _excluded_quant(patterns, num_layers: int) -> tuple[bool, bool]:
    """(attention projections, shared experts) that a quantised export keeps unquantised, from
    its exclusion list (ModelOpt's ``exclude_modules`` / the ``ignore`` list of its
    ``quantization_config``: module names or globs, per layer or for every layer). A kind counts
    as excluded when the patterns name it for most layers (more than half) or without a layer
    index; NVIDIA's NVFP4 exports keep the attention projections in BF16 (DeepSeek-V3.1, GLM-5,
    Kimi-K2.5, MiniMax-M2.5, Qwen3.5) and Qwen3.5's shared experts too."""
    found = {"attn": set(), "shared": set()}
    every = {"attn": False, "shared": False}
    for p in patterns or ():
        if not isinstance(p, str):
            continue
        for kind in ("attn", "shared"):
            if _is_excluded_kind(p, kind):
                m = _LAYER_INDEX.search(p)
                if m:
                    found[kind].add(int(m.group(1)))
                else:
                    every[kind] = True
    half = max(1, num_layers) / 2
    return tuple(every[k] or len(found[k]) > half for k in ("attn", "shared"))


def infer_quant(mc: ModelConfig, text_cfg: dict, num_layers: int) -> QuantSpec:
    """Quantisation from hf_quant_config.json, quantization_config, or the alias; ``num_layers``
    (the decoder's) sizes the exclusion lists' per-layer majority (:func:`excluded_quant`)."""
    gemm, kv, moe, src = "bfloat16", "bfloat16", None, "default (bf16)"
    qc = text_cfg.get("quantization_config") or mc.config.get("quantization_config") or {}
    hq = ((mc.hf_quant or {}).get("quantization") or {}) if mc.hf_quant else {}
    algo = (hq.get("quant_algo") or qc.get("quant_algo") or "").lower()
    method = (qc.get("quant_method") or "").lower()
    if algo in ("nvfp4", "mixed_precision"):
        gemm, src = "nvfp4", f"{'hf_quant_config' if hq else 'quantization_config'} quant_algo={algo.upper()}"
    elif algo == "fp8":
        gemm, src = "fp8", "quant_algo=FP8 (per-tensor)"
    elif method == "fp8":
        if qc.get("weight_block_size"):
            gemm, src = "fp8_block", "quantization_config fp8 + weight_block_size"
        else:
            gemm, src = "fp8", "quantization_config fp8 (per-tensor)"
    elif method == "mxfp4":
        moe, src = "mxfp4", "quantization_config mxfp4 (experts; w4a8 on GPUs with FP4, w4a16 before)"
    elif method == "compressed-tensors":
        groups = qc.get("config_groups") or {}
        weights = [g.get("weights") or {} for g in groups.values()]
        if any(w.get("num_bits") == 4 and w.get("type") == "float" and w.get("group_size") == 32 for w in weights):
            # 4-bit float weights in groups of 32: MXFP4 (Kimi-K3's "mxfp4-pack-quantized")
            moe, src = "mxfp4", "compressed-tensors mxfp4 weights (experts; w4a8 on GPUs with FP4, w4a16 before)"
        elif any(w.get("num_bits") == 4 for w in weights):
            moe, src = "int4_wo", "compressed-tensors int4 weights (experts)"
    kv_algo = (hq.get("kv_cache_quant_algo") or qc.get("kv_cache_quant_algo") or "")
    kv_scheme = qc.get("kv_cache_scheme") or {}
    if str(kv_algo).lower() in ("fp8", "e4m3", "e5m2") or (
        kv_scheme and kv_scheme.get("type") == "float" and (kv_scheme.get("num_bits") or 16) <= 8
    ):
        kv = "fp8"
    attn_gemm = shared_gemm = None
    if gemm != "bfloat16":
        excluded = hq.get("exclude_modules") or qc.get("ignore") or qc.get("exclude_modules") or qc.get("modules_to_not_convert")
        attn_x, shared_x = excluded_quant(excluded, num_layers)
        attn_gemm = "bfloat16" if attn_x else None
        shared_gemm = "bfloat16" if shared_x else None
        if attn_x or shared_x:
            kept = " and ".join(n for n, x in (("attention projections", attn_x), ("shared experts", shared_x)) if x)
            src += f"; {kept} excluded (bf16)"
    alias = mc.quant_from_alias
    # the alias names the quantised export, which replaces the base checkpoint's weights: an -NVFP4
    # alias of an fp8 checkpoint (nvidia/DeepSeek-R1-NVFP4 -> deepseek-ai/DeepSeek-R1) is nvfp4 in
    # its GEMMs and experts alike; an -FP8 alias of a checkpoint already in fp8 keeps its scaling
    if alias and gemm != alias and not (alias == "fp8" and gemm in ("fp8", "fp8_block")):
        base = "" if gemm == "bfloat16" and moe is None else f" (replaces the base's {src})"
        gemm, moe, src = alias, None, f"alias {mc.model_id}{base}"
        attn_gemm = shared_gemm = None
        arch = (text_cfg.get("architectures") or mc.config.get("architectures") or [""])[0]
        if alias == "nvfp4" and arch in NVFP4_EXPORT_BF16_ATTENTION_ARCHS:
            attn_gemm = "bfloat16"
            src += "; attention projections bf16 (NVIDIA's NVFP4 exports of this architecture)"
    return QuantSpec(gemm=gemm, kv_cache=kv, moe=moe or gemm, source=src, attn_gemm=attn_gemm, shared_gemm=shared_gemm)


@dataclass(frozen=True)
class MoESpec:
    experts: int
    topk: int
    inter: int  # per-expert FFN width
    shared_inter: int = 0  # total width of the shared expert(s), 0 if none
    #: layers with a dense FFN instead of MoE: DeepSeek's leading ones, or Llama-4 Maverick's every
    #: other layer (the plan and the memory count layers, so where they sit does not matter)
    first_dense_layers: int = 0
    dense_inter: int = 0  # width of those dense FFNs
    gated: bool = True  # SwiGLU experts (gate+up); False for relu^2 experts


@dataclass(frozen=True)
class MLASpec:
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class GDNSpec:
    """Hybrid linear attention (Qwen3.5 / Qwen3-Next): Gated DeltaNet layers between full
    (gated, GQA) attention layers."""

    linear_layers: int
    num_k_heads: int
    head_k_dim: int
    num_v_heads: int
    head_v_dim: int
    conv_kernel: int = 4


@dataclass(frozen=True)
class ModelSpec:
    model_id: str
    resolved_id: str
    architecture: str
    family: str
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tie_embeddings: bool
    sliding_window: int | None
    max_position: int | None
    quant: QuantSpec
    alias_note: str | None = None
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    layer_windows: tuple[int, ...] | None = None  # per-layer sliding window (0 = full attention)
    mtp_layers: int = 0  # MTP (next-n prediction) layers shipped with the checkpoint
    gdn: GDNSpec | None = None
    sparse_attention: bool = False  # DeepSeek-V3.2 / GLM-5 DSA: an indexer picks index_topk keys
    index_head_dim: int = 0
    attn_output_gate: bool = False  # full-attention q projection also emits a gate (Qwen3.5)
    #: RMSNorm on q and k before RoPE: "" (none), "per_head" (Qwen3 family, GLM: each head alone) or
    #: "per_layer" (MiniMax-M2: over all heads of the layer, so under TP each rank's partial sum of
    #: squares is all-reduced)
    qk_norm: str = ""
    #: parameters of the checkpoint's vision tower (vision-language models; 0 for text-only ones):
    #: loaded with the language model, so they take memory, but a request is text tokens and never
    #: runs them (:func:`vision_params`)
    vision_params: int = 0
    #: heterogeneous layers (:mod:`infercast.models.groups`): when set, these replace the uniform
    #: attention shape above (``num_kv_heads`` / ``head_dim`` then hold the groups' largest, for
    #: activation sizing) and / or the uniform dense FFN of ``intermediate``
    attention_groups: tuple[AttentionGroup, ...] | None = None
    ffn_groups: tuple[FFNGroup, ...] | None = None
    #: Gemma's extra RMSNorms after the attention and after the FFN (besides the pre-norms)
    sandwich_norms: bool = False
    #: Nemotron-H hybrids: block pattern and Mamba2 shape (:mod:`infercast.models.nemotron_h`)
    mamba: MambaSpec | None = None
    #: MiniMax sparse attention (MiniMax-M3): this many of the GQA layers run the MSA module, whose
    #: indexer keeps at most ``msa_topk_tokens`` keys per query (top blocks x block size)
    msa_layers: int = 0
    msa_topk_tokens: int = 0
    #: DeepSeek-V4: per-layer attention kinds, mHC, hash routing (:mod:`infercast.models.deepseek_v4`)
    dsv4: DeepSeekV4Spec | None = None
    #: Kimi-K3 (Kimi-Linear): KDA / MLA layer pattern, latent MoE, attention residuals
    #: (:mod:`infercast.models.kimi_k3`)
    kimi: KimiLinearSpec | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelSpec:
        d = dict(d)
        d["quant"] = QuantSpec(**d["quant"])
        if d.get("moe"):
            d["moe"] = MoESpec(**d["moe"])
        if d.get("mla"):
            d["mla"] = MLASpec(**d["mla"])
        if d.get("layer_windows") is not None:
            d["layer_windows"] = tuple(d["layer_windows"])
        if d.get("gdn"):
            d["gdn"] = GDNSpec(**d["gdn"])
        if d.get("attention_groups") is not None:
            d["attention_groups"] = tuple(AttentionGroup(**g) for g in d["attention_groups"])
        if d.get("ffn_groups") is not None:
            d["ffn_groups"] = tuple(FFNGroup(**g) for g in d["ffn_groups"])
        if d.get("mamba"):
            from .nemotron_h import MambaSpec

            d["mamba"] = MambaSpec(**d["mamba"])
        if d.get("dsv4"):
            from .deepseek_v4 import DeepSeekV4Spec

            d["dsv4"] = DeepSeekV4Spec.from_dict(d["dsv4"])
        if d.get("kimi"):
            from .kimi_k3 import KimiLinearSpec

            d["kimi"] = KimiLinearSpec(**d["kimi"])
        return cls(**d)


#: architecture -> family. Dense GQA decoders share one op plan.
FAMILIES = {
    "LlamaForCausalLM": "dense",
    "MistralForCausalLM": "dense",
    "Qwen2ForCausalLM": "dense",
    "Qwen3ForCausalLM": "dense",
    "MiMoForCausalLM": "dense",
    "Qwen3MoeForCausalLM": "moe",
    "Qwen2MoeForCausalLM": "moe",
    "MixtralForCausalLM": "moe",
    "GptOssForCausalLM": "moe",
    "MiniMaxM2ForCausalLM": "moe",
    "DeepseekV3ForCausalLM": "mla_moe",
    "KimiK25ForConditionalGeneration": "mla_moe",
    "DeepseekV32ForCausalLM": "mla_moe",
    "GlmMoeDsaForCausalLM": "mla_moe",
    "Qwen3_5MoeForConditionalGeneration": "moe",
    "Qwen3_5ForConditionalGeneration": "dense",
    # vision-language checkpoints whose language model is one of the above: served text-only (a
    # request is its tokens); the vision tower's weights count in memory (:func:`vision_params`)
    "Qwen3VLForConditionalGeneration": "dense",
    "Qwen3VLMoeForConditionalGeneration": "moe",
    # Llama 4: MoE with a shared expert, dense FFNs between MoE layers (Maverick), chunked local
    # attention on three layers in four (:func:`_llama4`)
    "Llama4ForConditionalGeneration": "moe",
    "Llama4ForCausalLM": "moe",
    # heterogeneous layers (:mod:`infercast.models.families`): Gemma-4 (sliding / global attention
    # of different shapes; "moe" when its config enables the MoE block), MiMo-V2-Flash (sliding /
    # full attention of different shapes, MoE), DeciLM / Llama-Nemotron NAS (per-layer attention
    # and FFN widths)
    "Gemma4ForConditionalGeneration": "dense",
    "MiMoV2FlashForCausalLM": "moe",
    "DeciLMForCausalLM": "dense",
    # Mamba2 / attention / MLP / MoE blocks in a pattern (:mod:`infercast.models.nemotron_h`)
    "NemotronHForCausalLM": "nemotron_h",
    # MiniMax-M3: GQA with MiniMax sparse attention on most layers, MoE with a shared expert and
    # leading dense layers (:func:`infercast.models.families.minimax_m3`)
    "MiniMaxM3ForCausalLM": "moe",
    "MiniMaxM3SparseForCausalLM": "moe",
    "MiniMaxM3SparseForConditionalGeneration": "moe",
    # DeepSeek-V4: CSA / HCA / window attention per layer, mHC, MoE (:mod:`infercast.models.deepseek_v4`)
    "DeepseekV4ForCausalLM": "deepseek_v4",
    # Step-3.7-Flash: sliding-window / full GQA layers, MoE with a shared expert after dense
    # layers, MTP (:mod:`infercast.models.step3`)
    "Step3p7FlashForCausalLM": "moe",
    # Kimi-K3: KDA linear attention / gated MLA layers, latent MoE (:mod:`infercast.models.kimi_k3`)
    "KimiK3ForConditionalGeneration": "kimi_k3",
    "KimiLinearForCausalLM": "kimi_k3",
}


def supported_architectures() -> list[str]:
    return sorted(FAMILIES)


def _first(d: dict, *keys, default=None):
    for k in keys:
        if d.get(k) is not None:
            return d[k]
    return default


_REQUIRED = object()


def _as_int(v) -> int | None:
    """``v`` as an int if it is a whole number (an int, an integral float, or such a string)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            try:
                v = float(v.strip())
            except ValueError:
                return None
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():
        return int(v)
    return None


def _int_field(d: dict, *keys: str, where: str, default=_REQUIRED, minimum: int | None = 1,
               default_note: str = "") -> int | None:
    """The first of ``keys`` that ``d`` sets (not null), as an int >= ``minimum``; ``default`` if
    none is set (None passes through). Errors name the config, the field and the value."""
    for key in keys:
        if d.get(key) is not None:
            v, shown = d[key], key
            break
    else:
        if default is _REQUIRED:
            raise InvalidInputError(f"model config {where} is malformed", f"missing field {' / '.join(keys)}")
        if default is None:
            return None
        v, shown = default, f"{keys[0]} (not set; {default_note or 'default'})"
    n = _as_int(v)
    if n is None:
        raise InvalidInputError(f"model config {where} is malformed", f"{shown} must be a whole number, got {v!r}")
    if minimum is not None and n < minimum:
        must = "positive" if minimum == 1 else f">= {minimum}"
        raise InvalidInputError(f"model config {where} is malformed", f"{shown} must be {must}, got {v!r}")
    return n


def build_spec(mc: ModelConfig) -> ModelSpec:
    if not isinstance(mc.config, dict):
        raise InvalidInputError(f"model config {mc.resolved_id} is not a JSON object")
    try:
        return _build_spec(mc)
    except (KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError) as exc:
        if isinstance(exc, InvalidInputError):
            raise
        what = f"missing field {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
        raise InvalidInputError(f"model config {mc.resolved_id} is malformed", what) from None


def _build_spec(mc: ModelConfig) -> ModelSpec:
    cfg = mc.config
    text = cfg.get("text_config") or cfg
    archs = cfg.get("architectures") or text.get("architectures") or ["?"]
    arch = archs[0]
    if arch not in FAMILIES and (text.get("architectures") or [None])[0] in FAMILIES:
        arch = text["architectures"][0]
    family = FAMILIES.get(arch)
    if family is None:
        raise UnsupportedModelError(
            f"model family {arch} ({mc.resolved_id}) is not modelled yet",
            "supported: dense GQA decoders, GQA + MoE, and DeepSeek-style MLA + MoE",
            supported_architectures(),
        )
    if family == "nemotron_h":
        from .nemotron_h import build_nemotron_h_spec

        return build_nemotron_h_spec(mc, arch)
    if family == "deepseek_v4":
        from .deepseek_v4 import build_dsv4_spec

        return build_dsv4_spec(mc, arch)
    if family == "kimi_k3":
        from .kimi_k3 import build_kimi_k3_spec

        return build_kimi_k3_spec(mc, arch)
    where = mc.resolved_id
    from .families import READERS  # the readers use this module's helpers

    if arch in READERS:
        return READERS[arch](mc, cfg, text, arch, family)
    hidden = _int_field(text, "hidden_size", where=where)
    heads = _int_field(text, "num_attention_heads", where=where)
    layers = _int_field(text, "num_hidden_layers", where=where)
    vocab = _int_field(text, "vocab_size", where=where, default=_first(cfg, "vocab_size", default=32000))
    sw = _int_field(text, "sliding_window", where=where, default=None, minimum=0) if text.get("use_sliding_window", True) else None
    max_pos = _int_field(text, "max_position_embeddings", where=where, default=None, minimum=0)
    if sw is not None and max_pos and sw >= max_pos:
        sw = None
    moe = mla = None
    windows = None
    inter = _int_field(text, "intermediate_size", where=where, default=0, minimum=1 if family == "dense" else 0,
                       default_note="needed for the dense FFN")
    if family in ("moe", "mla_moe"):
        experts = _int_field(text, "n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts", where=where)
        topk = _int_field(text, "num_experts_per_tok", "moe_top_k", "top_k_experts", where=where)
        if topk > experts:
            raise InvalidInputError(f"model config {where} is malformed",
                                    f"{topk} experts per token (num_experts_per_tok) exceed the {experts} experts")
        expert_inter = _int_field(text, "moe_intermediate_size", where=where, default=inter,
                                  default_note="intermediate_size")
        n_shared = _int_field(text, "n_shared_experts", "num_shared_experts", where=where, default=0, minimum=0)
        shared_inter = _int_field(text, "shared_expert_intermediate_size", "shared_intermediate_size", where=where,
                                  default=n_shared * expert_inter, minimum=0, default_note="n_shared_experts x moe_intermediate_size")
        first_dense = _int_field(text, "first_k_dense_replace", where=where, default=0, minimum=0)
        if first_dense and inter < 1:
            raise InvalidInputError(f"model config {where} is malformed",
                                    f"first_k_dense_replace={first_dense} dense layers need intermediate_size > 0, got {inter}")
        moe = MoESpec(experts, topk, expert_inter, shared_inter, first_dense, inter if first_dense else 0, True)
    if family == "mla_moe":
        mla = MLASpec(
            q_lora_rank=_int_field(text, "q_lora_rank", where=where) if text.get("q_lora_rank") else None,
            kv_lora_rank=_int_field(text, "kv_lora_rank", where=where),
            qk_nope_head_dim=_int_field(text, "qk_nope_head_dim", where=where, minimum=0),
            qk_rope_head_dim=_int_field(text, "qk_rope_head_dim", where=where, minimum=0),
            v_head_dim=_int_field(text, "v_head_dim", where=where),
        )
        kv = heads  # MLA: every query head has its own (latent-projected) K and V
        head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        if head_dim < 1:
            raise InvalidInputError(f"model config {where} is malformed",
                                    "qk_nope_head_dim + qk_rope_head_dim must be positive, got 0")
    else:
        kv = _int_field(text, "num_key_value_heads", where=where, default=heads,
                        default_note="num_attention_heads")
        head_dim = _int_field(text, "head_dim", where=where, default=hidden // heads,
                              default_note=f"hidden_size // num_attention_heads = {hidden} // {heads}")
        if heads % kv:
            raise InvalidInputError(
                f"model config {where} is malformed",
                f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv} "
                "(grouped-query attention shares each KV head among a whole group of query heads)",
            )
    lt = text.get("layer_types")
    gdn = None
    if lt and "linear_attention" in lt:
        gdn = GDNSpec(
            linear_layers=sum(1 for t in lt if t == "linear_attention"),
            num_k_heads=_int_field(text, "linear_num_key_heads", where=where),
            head_k_dim=_int_field(text, "linear_key_head_dim", where=where),
            num_v_heads=_int_field(text, "linear_num_value_heads", where=where),
            head_v_dim=_int_field(text, "linear_value_head_dim", where=where),
            conv_kernel=_int_field(text, "linear_conv_kernel_dim", where=where, default=4),
        )
    if lt and text.get("sliding_window"):
        w = _int_field(text, "sliding_window", where=where, minimum=0)
        windows = tuple(w if t == "sliding_attention" else 0 for t in lt)
        sw = None
    if arch.startswith("Llama4"):
        moe, windows = _llama4(text, layers, inter, moe, where)
    return ModelSpec(
        model_id=mc.model_id,
        resolved_id=mc.resolved_id,
        architecture=arch,
        family=family,
        num_layers=layers,
        hidden=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        intermediate=inter,
        vocab=vocab,
        tie_embeddings=bool(_first(text, "tie_word_embeddings", default=False)),
        sliding_window=sw or None,
        max_position=max_pos or None,
        quant=infer_quant(mc, text, layers),
        alias_note=mc.alias_note,
        moe=moe,
        mla=mla,
        layer_windows=windows,
        mtp_layers=_int_field(text, "num_nextn_predict_layers", "mtp_num_hidden_layers", where=where, default=0, minimum=0),
        gdn=gdn,
        sparse_attention=bool(text.get("index_topk")) and family == "mla_moe",
        index_head_dim=_int_field(text, "index_head_dim", where=where, default=0, minimum=0),
        attn_output_gate=bool(text.get("attn_output_gate", False)),
        qk_norm=_qk_norm(arch, text),
        vision_params=vision_params(cfg, hidden, where),
    )


def _llama4(text: dict, layers: int, inter: int, moe: MoESpec, where: str) -> tuple[MoESpec, tuple[int, ...] | None]:
    """Llama 4's MoE layout and attention windows, from its text config (the defaults are
    ``transformers``' ``Llama4TextConfig``'s):

    * MoE layers: ``moe_layers``, else every ``interleave_moe_layer_step``-th layer (Scout 1:
      all 48; Maverick 2: 24); the others run a dense FFN of ``intermediate_size_mlp``. Every MoE
      layer has one shared expert of ``intermediate_size`` beside its routed experts (of the same
      width).
    * Attention: the layers with RoPE (``no_rope_layers`` 1; by default all but every fourth)
      attend within chunks of ``attention_chunk_size`` tokens; the others (NoPE) attend to the whole
      context. A chunked layer is costed as a sliding window of the chunk size, which the attention
      tables collect (window 8192): exact while a request fits in one chunk, and beyond it an upper
      bound (a token then sees the ``p mod chunk`` tokens of its own chunk, ``chunk / 2`` on average,
      where a window would give it ``chunk``)."""
    step = _int_field(text, "interleave_moe_layer_step", where=where, default=1)
    moe_layers = text.get("moe_layers") or list(range(step - 1, layers, step))
    dense = layers - len(moe_layers)
    dense_inter = _int_field(text, "intermediate_size_mlp", where=where, default=inter) if dense else 0
    moe = replace(moe, shared_inter=inter, first_dense_layers=dense, dense_inter=dense_inter)
    chunk = _int_field(text, "attention_chunk_size", where=where, default=None, minimum=0)
    if not chunk:
        return moe, None
    rope = text.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(layers)]
    if len(rope) != layers:
        raise InvalidInputError(f"model config {where} is malformed",
                                f"no_rope_layers has {len(rope)} entries for {layers} layers")
    return moe, tuple(chunk if r else 0 for r in rope)


def vision_params(cfg: dict, text_hidden: int, where: str = "") -> int:
    """Parameters of a vision-language checkpoint's vision tower, from its ``vision_config``
    (0 without one): a ViT of ``depth`` (``vt_num_hidden_layers``) blocks of width ``hidden_size``
    (``vt_hidden_size``), each with q/k/v and output projections, a two-matrix MLP of
    ``intermediate_size`` (``vt_intermediate_size``) and two norms, all with biases; the patch
    embedding (``in_channels x temporal_patch_size x patch_size^2`` per output channel), the learned
    position table (``num_position_embeddings``, or ``init_pos_emb_height x init_pos_emb_width``)
    and the patch mergers that fold ``spatial_merge_size^2`` (``merge_kernel_size``) patches into
    one text-width token (a norm and two matrices, ``hidden x m^2`` wide then ``out_hidden_size`` /
    ``text_hidden_size`` out), and one more merger per ``deepstack_visual_indexes`` entry
    (Qwen3-VL). The layouts of Qwen3-VL / Qwen3.5 and Kimi-K2.5's MoonViT: 0.41-0.58 B parameters
    for the pack's checkpoints, a few percent of a large model's weights, a fifth of Qwen3-VL-2B's.
    A tower that pools patches (``pooling_kernel_size``, Gemma-4) has no merger but one projection
    ``hidden_size x`` text width, and its position table is ``position_embedding_size`` entries
    (one table counted; its MLP counted as two matrices like the others')."""
    v = cfg.get("vision_config")
    if not isinstance(v, dict) or not v:
        return 0
    name = f"{where} vision_config"
    layers = _int_field(v, "depth", "vt_num_hidden_layers", "num_hidden_layers", where=name)
    h = _int_field(v, "hidden_size", "vt_hidden_size", where=name)
    inter = _int_field(v, "intermediate_size", "vt_intermediate_size", where=name)
    block = 4 * h * h + 4 * h + 2 * h * inter + inter + h + 4 * h
    patch = _int_field(v, "patch_size", where=name, default=14)
    frames = _int_field(v, "temporal_patch_size", where=name, default=1)
    channels = _int_field(v, "in_channels", where=name, default=3)
    embed = channels * frames * patch * patch * h + h
    positions = _int_field(v, "num_position_embeddings", "position_embedding_size", where=name, default=0, minimum=0)
    if not positions and v.get("init_pos_emb_height") is not None:
        positions = (_int_field(v, "init_pos_emb_height", where=name)
                     * _int_field(v, "init_pos_emb_width", where=name, default=1))
    kernel = v.get("merge_kernel_size")
    out = _int_field(v, "out_hidden_size", "text_hidden_size", where=name, default=text_hidden)
    if v.get("pooling_kernel_size") is not None and v.get("spatial_merge_size") is None and not kernel:
        # Gemma-4: patches average-pooled (no weights), then one projection to the text width
        return layers * block + embed + positions * h + h * out
    if isinstance(kernel, list) and kernel:
        merge = math.prod(_int_field({"merge_kernel_size": k}, "merge_kernel_size", where=name) for k in kernel)
    else:
        merge = _int_field(v, "spatial_merge_size", where=name, default=2) ** 2
    wide = h * merge
    merger = 2 * wide + wide * wide + wide + wide * out + out
    mergers = 1 + len(v.get("deepstack_visual_indexes") or ())
    return layers * block + embed + positions * h + mergers * merger


def _qk_norm(arch: str, text: dict) -> str:
    """The checkpoint's q/k normalisation: configs that say ``use_qk_norm`` give the type
    (``qk_norm_type``, per head unless told); the Qwen3 family has per-head q/k norms without
    a flag."""
    if text.get("use_qk_norm"):
        return str(text.get("qk_norm_type") or "per_head")
    if arch.startswith("Qwen3"):
        return "per_head"
    return ""
