"""HF config -> typed model spec, with quantisation inferred from the checkpoint's metadata."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from ..data.model_configs import ModelConfig
from ..errors import InvalidConfigError, InvalidInputError, UnsupportedModelError

from ..data.quant import COMPUTE_DTYPE, GEMM_QUANTS, KV_BYTES, KV_QUANTS, WEIGHT_BYTES  # noqa: F401


@dataclass(frozen=True)
class QuantSpec:
    gemm: str = "bfloat16"
    kv_cache: str = "bfloat16"
    attention: str = "bfloat16"  # fmha compute dtype
    moe: str | None = None
    source: str = "default (bf16)"

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
        )


def infer_quant(mc: ModelConfig, text_cfg: dict) -> QuantSpec:
    """Quantisation from hf_quant_config.json, quantization_config, or the alias."""
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
        bits = {((g.get("weights") or {}).get("num_bits")) for g in groups.values()}
        if 4 in bits:
            moe, src = "int4_wo", "compressed-tensors int4 weights (experts)"
    kv_algo = (hq.get("kv_cache_quant_algo") or qc.get("kv_cache_quant_algo") or "")
    kv_scheme = qc.get("kv_cache_scheme") or {}
    if str(kv_algo).lower() in ("fp8", "e4m3", "e5m2") or (
        kv_scheme and kv_scheme.get("type") == "float" and (kv_scheme.get("num_bits") or 16) <= 8
    ):
        kv = "fp8"
    if mc.quant_from_alias and gemm == "bfloat16":
        gemm, src = mc.quant_from_alias, f"alias {mc.model_id}"
    return QuantSpec(gemm=gemm, kv_cache=kv, moe=moe or gemm, source=src)


@dataclass(frozen=True)
class MoESpec:
    experts: int
    topk: int
    inter: int  # per-expert FFN width
    shared_inter: int = 0  # total width of the shared expert(s), 0 if none
    first_dense_layers: int = 0  # leading layers with a dense FFN instead of MoE
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
}


def supported_architectures() -> list[str]:
    return sorted(FAMILIES)


def _first(d: dict, *keys, default=None):
    for k in keys:
        if d.get(k) is not None:
            return d[k]
    return default


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
    hidden = int(text["hidden_size"])
    heads = int(text["num_attention_heads"])
    if hidden <= 0 or heads <= 0:
        raise InvalidInputError(f"model config {mc.resolved_id} is malformed", "hidden_size and num_attention_heads must be > 0")
    kv = int(_first(text, "num_key_value_heads", default=heads))
    head_dim = int(_first(text, "head_dim", default=hidden // heads))
    sw = text.get("sliding_window") if text.get("use_sliding_window", True) else None
    max_pos = _first(text, "max_position_embeddings")
    if sw is not None and max_pos is not None and int(sw) >= int(max_pos):
        sw = None
    moe = mla = None
    windows = None
    inter = _first(text, "intermediate_size", default=0)
    if family in ("moe", "mla_moe"):
        experts = int(_first(text, "n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts"))
        topk = int(_first(text, "num_experts_per_tok", "moe_top_k", "top_k_experts"))
        expert_inter = int(_first(text, "moe_intermediate_size", default=inter))
        n_shared = int(_first(text, "n_shared_experts", "num_shared_experts", default=0) or 0)
        shared_inter = int(_first(text, "shared_expert_intermediate_size", "shared_intermediate_size", default=n_shared * expert_inter) or 0)
        first_dense = int(_first(text, "first_k_dense_replace", default=0) or 0)
        moe = MoESpec(experts, topk, expert_inter, shared_inter, first_dense, int(inter) if first_dense else 0, True)
    if family == "mla_moe":
        mla = MLASpec(
            q_lora_rank=int(text["q_lora_rank"]) if text.get("q_lora_rank") else None,
            kv_lora_rank=int(text["kv_lora_rank"]),
            qk_nope_head_dim=int(text["qk_nope_head_dim"]),
            qk_rope_head_dim=int(text["qk_rope_head_dim"]),
            v_head_dim=int(text["v_head_dim"]),
        )
        kv = heads
        head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    lt = text.get("layer_types")
    gdn = None
    if lt and "linear_attention" in lt:
        gdn = GDNSpec(
            linear_layers=sum(1 for t in lt if t == "linear_attention"),
            num_k_heads=int(text["linear_num_key_heads"]),
            head_k_dim=int(text["linear_key_head_dim"]),
            num_v_heads=int(text["linear_num_value_heads"]),
            head_v_dim=int(text["linear_value_head_dim"]),
            conv_kernel=int(_first(text, "linear_conv_kernel_dim", default=4)),
        )
    if lt and text.get("sliding_window"):
        w = int(text["sliding_window"])
        windows = tuple(w if t == "sliding_attention" else 0 for t in lt)
        sw = None
    return ModelSpec(
        model_id=mc.model_id,
        resolved_id=mc.resolved_id,
        architecture=arch,
        family=family,
        num_layers=int(text["num_hidden_layers"]),
        hidden=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        intermediate=int(inter),
        vocab=int(_first(text, "vocab_size", default=cfg.get("vocab_size", 32000))),
        tie_embeddings=bool(_first(text, "tie_word_embeddings", default=False)),
        sliding_window=int(sw) if sw else None,
        max_position=int(max_pos) if max_pos else None,
        quant=infer_quant(mc, text),
        alias_note=mc.alias_note,
        moe=moe,
        mla=mla,
        layer_windows=windows,
        mtp_layers=int(_first(text, "num_nextn_predict_layers", "mtp_num_hidden_layers", default=0) or 0),
        gdn=gdn,
        sparse_attention=bool(text.get("index_topk")) and family == "mla_moe",
        index_head_dim=int(text.get("index_head_dim") or 0),
        attn_output_gate=bool(text.get("attn_output_gate", False)),
        qk_norm=_qk_norm(arch, text),
    )


def _qk_norm(arch: str, text: dict) -> str:
    """The checkpoint's q/k normalisation: configs that say ``use_qk_norm`` give the type
    (``qk_norm_type``, per head unless told); the Qwen3 family has per-head q/k norms without
    a flag."""
    if text.get("use_qk_norm"):
        return str(text.get("qk_norm_type") or "per_head")
    if arch.startswith("Qwen3"):
        return "per_head"
    return ""
