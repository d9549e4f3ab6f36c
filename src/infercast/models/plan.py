"""Model spec + parallel configuration -> a serializable op plan.

The plan is the contract between the model layer and the engine: a flat list of ops, each with
its kind, how many times it runs per forward pass (over all pipeline stages), and the fixed part
of its shape. It is JSON with a schema version; the engine never walks the model again.

Sharding follows the serving backends: Q heads and FFN width split over TP; KV heads split over TP
and replicated when TP exceeds them (each GPU keeps at least one KV head); vocab-parallel
embedding and LM head; an all-reduce after attention and after the FFN when TP > 1; an all-gather
of the logits; a P2P activation send at each of the pp-1 stage boundaries.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace

from ..errors import InvalidConfigError, InvalidInputError
from .spec import ModelSpec

PLAN_SCHEMA_VERSION = 1

MOE_COMMS = ("gather", "alltoall")

#: Routing skew assumed for the MoE expert op (a ``moe_perf`` ``distribution`` value). Served
#: traffic does not spread tokens evenly over experts; the tables collect ``balanced`` and power-law
#: popularity (exponent 1.01 and 1.2). At decode sizes a skewed batch touches fewer experts (less
#: weight traffic: gpt-oss-120b on b200 at 16 tokens 142-156 us vs 204 us balanced), at prefill
#: sizes the hot expert's extra tokens cost more. The mild power law is a fit: the dev silicon rows'
#: TPOT and TTFT chose it over the other two (see docs/modelling-log.md, 'MoE routing skew').
MOE_DISTRIBUTION = "power_law_1.01"


@dataclass(frozen=True)
class ParallelConfig:
    """Parallelism of one engine replica.

    ``tp`` x ``attention_dp`` GPUs run attention (each attention-DP rank serves its own requests);
    the MoE block runs over ``moe_tp`` x ``moe_ep`` GPUs, which must be the same GPUs
    (``tp x attention_dp == moe_tp x moe_ep``); ``pp`` stages multiply the GPU count.
    ``moe_tp``/``moe_ep`` default to pure TP for the experts. ``moe_comm`` is how attention-DP
    tokens reach the experts: ``"gather"`` (all-gather before, reduce-scatter after) or
    ``"alltoall"`` (each token is dispatched to the ranks holding its top-k experts and combined
    back, DeepEP-style; needs EP > 1).

    ``cp`` context-parallel ranks, each a copy of the ``tp x attention_dp x pp`` layout (weights
    replicated), multiply the GPU count: a prompt's tokens are split over them and each holds
    ``1 / cp`` of every sequence's KV cache (:mod:`infercast.models.context_parallel`).
    ``cp_overlap``: the per-layer K/V exchange of a context-parallel prefill runs concurrently
    with the attention kernels (a layer takes the longer of the two) instead of before them.
    """

    tp: int = 1
    pp: int = 1
    attention_dp: int = 1
    moe_tp: int | None = None
    moe_ep: int | None = None
    moe_comm: str = "gather"
    cp: int = 1
    cp_overlap: bool = False

    @property
    def gpus(self) -> int:
        return self.tp * self.attention_dp * self.pp * self.cp

    @property
    def width(self) -> int:
        return self.tp * self.attention_dp

    @property
    def ep(self) -> int:
        return self.moe_ep or 1

    @property
    def etp(self) -> int:
        return self.moe_tp or self.width // self.ep

    def check(self, spec: ModelSpec, gpus_per_node: int | None = None) -> None:
        if self.moe_comm not in MOE_COMMS:
            raise InvalidInputError(f"unknown MoE communication {self.moe_comm!r}", available=list(MOE_COMMS))
        for name, v in (("tp", self.tp), ("pp", self.pp), ("attention-dp", self.attention_dp),
                        ("moe-tp", self.moe_tp or 1), ("moe-ep", self.moe_ep or 1), ("cp", self.cp)):
            if not isinstance(v, int) or v < 1:
                raise InvalidInputError(f"--{name} must be a positive integer, got {v!r}")
            if v & (v - 1):
                raise InvalidConfigError(f"--{name} {v} is not a power of two", "serving backends shard by powers of two")
        if spec.num_heads % self.tp:
            divs = [d for d in (1, 2, 4, 8, 16, 32, 64) if spec.num_heads % d == 0]
            raise InvalidConfigError(
                f"TP {self.tp} does not divide the {spec.num_heads} attention heads of {spec.resolved_id}",
                "each GPU must hold whole heads",
                [f"tp={d}" for d in divs],
            )
        for g in spec.attention_groups or ():
            if g.kind == "gqa" and g.heads % self.tp:
                raise InvalidConfigError(f"TP {self.tp} does not divide the {g.heads} attention heads of "
                                         f"{spec.resolved_id}'s {g.label} layers", "each GPU must hold whole heads")
            if g.kind == "gqa" and self.tp > g.kv_heads and self.tp % g.kv_heads:
                raise InvalidConfigError(f"TP {self.tp} is not a multiple of the {g.kv_heads} KV heads of the {g.label} layers",
                                         "KV heads are replicated only in whole groups")
            if g.kind == "linear" and spec.hidden % self.tp:
                raise InvalidConfigError(f"TP {self.tp} does not divide the hidden size {spec.hidden}")
        for g in spec.ffn_groups or ():
            if (g.inter if g.kind == "gated" else spec.hidden) % self.tp:
                raise InvalidConfigError(f"TP {self.tp} does not divide the FFN width of the {g.label} layers")
        if spec.mla is None and spec.attention_groups is None and self.tp > spec.num_kv_heads and self.tp % spec.num_kv_heads:
            raise InvalidConfigError(
                f"TP {self.tp} is not a multiple of the {spec.num_kv_heads} KV heads",
                "KV heads are replicated only in whole groups",
            )
        if self.pp > spec.num_layers:
            raise InvalidConfigError(f"PP {self.pp} exceeds the {spec.num_layers} layers")
        if self.cp > 1:
            from .context_parallel import check_context_parallel

            check_context_parallel(spec, self, gpus_per_node)
        if spec.moe is None:
            if self.attention_dp > 1 or (self.moe_ep or 1) > 1 or (self.moe_tp not in (None, self.tp)):
                raise InvalidConfigError(
                    f"{spec.resolved_id} is a dense model: attention-DP and MoE parallelism do not apply",
                    "run more replicas instead of attention-DP",
                )
            if spec.intermediate % self.tp:
                raise InvalidConfigError(f"TP {self.tp} does not divide the FFN width {spec.intermediate}")
            return
        if not self.moe_tp and self.width % self.ep:
            raise InvalidConfigError(
                f"moe-ep {self.ep} does not divide the {self.width} GPUs of the attention layout tp x dp = "
                f"{self.tp} x {self.attention_dp}",
                "the experts are spread over the same GPUs that run attention; moe-tp defaults to the rest",
                [f"moe-ep={d}" for d in (1, 2, 4, 8, 16, 32, 64) if d <= self.width and self.width % d == 0],
            )
        if self.etp * self.ep != self.width:
            raise InvalidConfigError(
                f"MoE width moe_tp x moe_ep = {self.etp} x {self.ep} does not equal attention tp x dp = {self.tp} x {self.attention_dp}",
                "the experts are spread over the same GPUs that run attention",
            )
        m = spec.moe
        if m.experts % self.ep:
            raise InvalidConfigError(f"moe-ep {self.ep} does not divide the {m.experts} experts")
        if m.inter % self.etp:
            raise InvalidConfigError(f"moe-tp {self.etp} does not divide the expert width {m.inter}")
        if m.shared_inter % self.tp or (m.dense_inter and m.dense_inter % self.tp):
            raise InvalidConfigError(f"TP {self.tp} does not divide the shared-expert / dense FFN width")


#: speculative decoding methods, in vLLM's ``speculative_config.method`` names: ``mtp`` the
#: checkpoint's next-n prediction layers, ``eagle`` / ``eagle3`` an EAGLE draft head, ``ngram``
#: prompt lookup (no draft network), ``draft_model`` a separate smaller model
SPEC_METHODS = ("mtp", "eagle", "eagle3", "ngram", "draft_model")
#: most draft tokens per step infercast accepts
MAX_DRAFT_TOKENS = 8


@dataclass(frozen=True)
class SpecDecode:
    """Speculative decoding: ``nextn`` draft tokens per step (vLLM's ``num_speculative_tokens``)
    proposed by ``method`` (:data:`SPEC_METHODS`) and verified by the target model.

    Acceptance: ``acceptance`` is the probability that a draft token is accepted given the one
    before it was (DeepSeek-V3 reports 85-90% for its first MTP token; 0.8 is the default here), so
    position ``i`` (1-based) is accepted with probability ``acceptance**i``.
    ``acceptance_per_position``, when given, replaces that: one probability per draft position
    that the position is accepted (all before it too), as vLLM's spec-decode metrics report it
    ("per-position acceptance rate"); it cannot grow along the positions. A step then yields on
    average ``1 + sum(p_i)`` tokens (the bonus / corrected token plus the expected accepted
    drafts): ``1 + acceptance + ... + acceptance**nextn`` with the rate.

    A decode step verifies ``1 + nextn`` tokens per sequence in the main model (token-wise ops on
    all of them; attention reads each sequence's KV once, so it is costed per sequence, as the
    memory-bound generation kernels are) and runs the method's draft passes
    (:mod:`infercast.models.speculative`). ``draft`` / ``draft_tp`` name the draft network (a
    draft model or an EAGLE head: a pack id or a config path) and its TP size (None: the
    target's); ``prompt_lookup_min`` / ``prompt_lookup_max`` are the n-gram matcher's window (they
    change what is accepted, which ``acceptance`` states, not the cost)."""

    nextn: int = 0
    acceptance: float = 0.8
    method: str = "mtp"
    acceptance_per_position: tuple[float, ...] = ()
    draft: str | None = None
    draft_tp: int | None = None
    draft_quant: str | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None

    def __post_init__(self):
        # a plan read back from JSON holds a list
        object.__setattr__(self, "acceptance_per_position", tuple(float(p) for p in self.acceptance_per_position))

    @property
    def position_acceptance(self) -> tuple[float, ...]:
        """Probability that each draft position is accepted (with all before it)."""
        if self.acceptance_per_position:
            return self.acceptance_per_position
        return tuple(self.acceptance ** i for i in range(1, self.nextn + 1))

    @property
    def tokens_per_step(self) -> float:
        """Output tokens a decoding sequence gains per step: ``1 + sum(position_acceptance)``."""
        return 1.0 + sum(self.position_acceptance)

    @property
    def mtp_steps(self) -> int:
        """Draft passes of the checkpoint's MTP layers (0 unless ``method`` is ``mtp``)."""
        return self.nextn if self.method == "mtp" else 0

    def check(self) -> None:
        if self.method not in SPEC_METHODS:
            raise InvalidInputError(f"unknown --speculative-method {self.method!r}", available=list(SPEC_METHODS))
        if not isinstance(self.nextn, int) or self.nextn < 0 or self.nextn > MAX_DRAFT_TOKENS:
            raise InvalidInputError(f"--num-speculative-tokens (--nextn) must be an integer in 0..{MAX_DRAFT_TOKENS}, "
                                    f"got {self.nextn!r}")
        if not (0.0 <= float(self.acceptance) <= 1.0):
            raise InvalidInputError(f"--acceptance-rate (--mtp-acceptance) must be in [0, 1], got {self.acceptance!r}")
        p = self.acceptance_per_position
        if p:
            if len(p) != self.nextn:
                raise InvalidInputError(f"--acceptance-per-position gives {len(p)} values for {self.nextn} draft tokens",
                                        "give one acceptance probability per draft position")
            if any(not 0.0 <= x <= 1.0 for x in p):
                raise InvalidInputError(f"--acceptance-per-position values must be in [0, 1], got {list(p)}")
            if any(b > a + 1e-12 for a, b in zip(p, p[1:])):
                raise InvalidInputError(f"--acceptance-per-position must not grow along the positions, got {list(p)}",
                                        "position i is accepted only when every earlier one is")
        if self.method != "mtp" and self.nextn == 0:
            raise InvalidInputError(f"--speculative-method {self.method} needs --num-speculative-tokens >= 1")
        if self.method == "draft_model" and not self.draft:
            raise InvalidInputError("--speculative-method draft_model needs --draft-model",
                                    "a model id of the pack or a config path of the draft model")
        if self.draft and self.method not in ("eagle", "eagle3", "draft_model"):
            raise InvalidInputError(f"--draft-model is given, but --speculative-method {self.method} runs no draft network",
                                    "draft networks: eagle, eagle3 (the head's config), draft_model")
        if self.draft_tp is not None and (not isinstance(self.draft_tp, int) or self.draft_tp < 1):
            raise InvalidInputError(f"--draft-tp must be a positive integer, got {self.draft_tp!r}")
        if self.draft_quant is not None and self.method not in ("eagle", "eagle3", "draft_model"):
            raise InvalidInputError(f"--draft-quant sets a draft network's GEMMs, but --speculative-method {self.method} "
                                    "runs none of its own", "draft networks: eagle, eagle3, draft_model")
        if self.draft_tp is not None and self.method == "ngram":
            raise InvalidInputError("--draft-tp is given, but --speculative-method ngram runs no draft network on the "
                                    "GPUs", "draft networks: eagle, eagle3, draft_model")
        for name, v in (("--prompt-lookup-min", self.prompt_lookup_min), ("--prompt-lookup-max", self.prompt_lookup_max)):
            if v is not None and (not isinstance(v, int) or v < 1):
                raise InvalidInputError(f"{name} must be a positive integer, got {v!r}")
        if (self.prompt_lookup_min or self.prompt_lookup_max) and self.method != "ngram":
            raise InvalidInputError(f"--prompt-lookup-min/max set the n-gram matcher, not --speculative-method {self.method}")
        if self.prompt_lookup_min and self.prompt_lookup_max and self.prompt_lookup_min > self.prompt_lookup_max:
            raise InvalidInputError(f"--prompt-lookup-min {self.prompt_lookup_min} exceeds --prompt-lookup-max "
                                    f"{self.prompt_lookup_max}")


@dataclass(frozen=True)
class Fusions:
    """Kernel fusions the serving engine applies to this model (the rules that decide them per
    backend live in :mod:`infercast.models.fusions`).

    * ``shared_experts``: the shared expert runs inside the routed-expert kernel as one more expert
      every token selects (SGLang's shared-experts fusion): no separate shared MLP, and the expert
      kernel sees ``(topk + 1) / topk`` times the token-expert pairs.
    * ``rope_in_attention``: rotary embedding is applied inside the attention op (TensorRT-LLM's
      fused attention): no separate RoPE kernel.
    * ``allreduce_norm``: the TP all-reduce kernel also adds the residual and applies the next
      RMSNorm (SGLang's FlashInfer all-reduce fusion): the norms after the attention and FFN
      all-reduces drop out (the first layer's input norm stays).
    * ``norm_quant``: the RMSNorm before the QKV (and Gated-DeltaNet input) and gate/up
      projections writes its output already quantised for the GEMM that reads it, so those GEMMs
      do not pay the activation-quantisation kernel their tables include
      (:data:`infercast.ops.gemm.FUSABLE_INPUT_QUANT`);
    * ``act_quant``: the same for the SwiGLU activation before the down projection.
      The attention output before the O projection is never covered: its quantisation stays a
      kernel of its own."""

    shared_experts: bool = False
    rope_in_attention: bool = False
    allreduce_norm: bool = False
    norm_quant: bool = False
    act_quant: bool = False


#: The op kinds a plan may hold (what :mod:`infercast.engine.compiled` knows how to cost).
OP_KINDS = ("gemm", "attention", "mla", "dsa", "msa", "dsv4_attention", "mhc", "gdn", "kda", "mamba_conv", "mamba_ssm", "moe",
            "moe_dispatch", "allreduce", "allgather", "cp_exchange", "cp_combine",
            "reduce_scatter", "alltoall", "elementwise", "p2p")


@dataclass(frozen=True)
class PlanOp:
    name: str
    kind: str  # one of OP_KINDS
    count: int  # executions per forward pass, all stages
    phase: str = "both"  # both | prefill | decode
    tokens: str = "all"  # all: every token of the step; last: one per sequence (LM head)
    params: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    model: ModelSpec
    parallel: ParallelConfig
    ops: tuple[PlanOp, ...]
    schema_version: int = PLAN_SCHEMA_VERSION
    spec_decode: SpecDecode = field(default_factory=lambda: SpecDecode())
    fusions: Fusions = field(default_factory=lambda: Fusions())
    #: the draft network of EAGLE / draft-model speculation (an EAGLE head as a one-layer dense
    #: spec, or the draft model's spec) and its layout; None for MTP, n-gram and no speculation
    draft: ModelSpec | None = None
    draft_parallel: ParallelConfig | None = None

    def to_json(self) -> str:
        d = {
            "schema_version": self.schema_version,
            "model": self.model.to_dict(),
            "parallel": asdict(self.parallel),
            "ops": [asdict(o) for o in self.ops],
            "spec_decode": asdict(self.spec_decode),
            "fusions": asdict(self.fusions),
        }
        if self.draft is not None:
            d.update(draft=self.draft.to_dict(), draft_parallel=asdict(self.draft_parallel or ParallelConfig()))
        return json.dumps(d, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidInputError("the plan is not JSON", str(exc)) from None
        if not isinstance(d, dict):
            raise InvalidInputError("the plan is not a JSON object", f"got a {type(d).__name__}")
        if d.get("schema_version") != PLAN_SCHEMA_VERSION:
            raise InvalidInputError(
                f"plan schema version {d.get('schema_version')} is not supported",
                f"this infercast reads schema {PLAN_SCHEMA_VERSION}; recompile the plan",
            )
        try:
            plan = cls(
                ModelSpec.from_dict(d["model"]),
                ParallelConfig(**d["parallel"]),
                tuple(PlanOp(**o) for o in d["ops"]),
                spec_decode=SpecDecode(**d.get("spec_decode", {})),
                fusions=Fusions(**d.get("fusions", {})),
                draft=ModelSpec.from_dict(d["draft"]) if d.get("draft") else None,
                draft_parallel=ParallelConfig(**d["draft_parallel"]) if d.get("draft_parallel") else None,
            )
        except KeyError as exc:
            raise InvalidInputError(f"the plan lacks its {exc.args[0]!r} entry", "recompile the plan") from None
        except (TypeError, ValueError, AttributeError) as exc:
            raise InvalidInputError("the plan's entries do not have the schema's fields", str(exc)) from None
        unknown = sorted({o.kind for o in plan.ops} - set(OP_KINDS))
        if unknown:
            raise InvalidInputError(f"the plan has ops of unknown kind {', '.join(map(repr, unknown))}",
                                    available=list(OP_KINDS))
        return plan


def kv_heads_per_gpu(spec: ModelSpec, tp: int) -> int:
    return max(1, spec.num_kv_heads // tp)


def _applied(fusions: Fusions | None, spec: ModelSpec, par: ParallelConfig) -> Fusions:
    """The requested fusions this model and layout can take: a shared-expert fusion needs shared
    experts, an all-reduce + norm fusion needs TP all-reduces."""
    f = fusions or Fusions()
    return replace(f, shared_experts=bool(f.shared_experts and spec.moe is not None and spec.moe.shared_inter),
                   allreduce_norm=bool(f.allreduce_norm and par.tp > 1))


def _attention_ops(spec: ModelSpec, par: ParallelConfig, fusions: Fusions) -> list[PlanOp]:
    """Norm, QKV, RoPE, attention, output projection (+ TP all-reduce) for every layer; without
    the RoPE kernel when the attention op applies it, and with only layer 0's input norm and no
    post-attention norm when the all-reduces apply the norms."""
    if spec.attention_groups is not None:
        return _grouped_attention_ops(spec, par, fusions)
    tp, L, h = par.tp, spec.num_layers, spec.hidden
    q, act = spec.quant, 2
    heads = spec.num_heads // tp
    ops = [PlanOp("input_norm", "elementwise", 1 if fusions.allreduce_norm else L, params={"bytes_per_token": h * act * 3})]
    if spec.mla is not None:
        m = spec.mla
        kind = "dsa" if spec.sparse_attention else "mla"
        ops.append(PlanOp(
            kind, kind, L,
            params={"hidden": h, "heads": heads, "tp": tp, "q_lora_rank": m.q_lora_rank, "kv_lora_rank": m.kv_lora_rank,
                    "qk_nope_head_dim": m.qk_nope_head_dim, "qk_rope_head_dim": m.qk_rope_head_dim,
                    "v_head_dim": m.v_head_dim, "gemm_quant": q.attention_gemm, "kv_quant": q.kv_cache,
                    "model_id": spec.resolved_id},
        ))
    else:
        hd = spec.head_dim
        kvh = kv_heads_per_gpu(spec, tp)
        # layers with dense full attention: not Gated DeltaNet, not MiniMax sparse attention
        Lf = L - (spec.gdn.linear_layers if spec.gdn else 0) - spec.msa_layers
        qn = heads * (2 if spec.attn_output_gate else 1)  # Qwen3.5's q projection also emits a gate
        ops.append(PlanOp("qkv_gemm", "gemm", Lf, params={"n": (qn + 2 * kvh) * hd, "k": h, "quant": q.attention_gemm,
                                                           **_fused_input(fusions.norm_quant)}))
        if spec.qk_norm:
            # read and write this rank's q and k
            ops.append(PlanOp("qk_norm", "elementwise", Lf, params={"bytes_per_token": (heads + kvh) * hd * act * 2}))
            if spec.qk_norm == "per_layer" and tp > 1:
                # the layer-wide norms of q and of k each all-reduce one fp32 sum of squares per token
                ops.append(PlanOp("qk_norm_allreduce", "allreduce", 2 * Lf, params={"elements_per_token": 2, "group": tp}))
        if not fusions.rope_in_attention:
            ops.append(PlanOp("rope", "elementwise", Lf, params={"bytes_per_token": (heads + kvh) * hd * act * 2}))
        windows = spec.layer_windows or (spec.sliding_window or 0,) * Lf
        for w in sorted(set(windows)):
            n = sum(1 for x in windows if x == w)
            name = "attention" if len(set(windows)) == 1 else ("attention_full" if w == 0 else f"attention_window{w}")
            ops.append(PlanOp(
                name, "attention", n,
                params={"heads": heads, "kv_heads": kvh, "head_dim": hd, "window": w,
                        "kv_quant": q.kv_cache, "attn_quant": q.attention},
            ))
        ops.append(PlanOp("o_gemm", "gemm", Lf, params={"n": h, "k": heads * hd, "quant": q.attention_gemm}))
        if spec.msa_layers:
            # the MSA module covers its layers' projections, norms, indexer and attention
            ops.append(PlanOp("msa", "msa", spec.msa_layers,
                              params={"hidden": h, "heads": heads, "kv_heads": kvh, "head_dim": hd,
                                      "topk_tokens": spec.msa_topk_tokens, "gemm_quant": q.attention_gemm,
                                      "kv_quant": q.kv_cache, "tp": tp}))
        ops = [o for o in ops if o.count > 0]
        if spec.gdn is not None:
            g = spec.gdn
            hk, hv = max(1, g.num_k_heads // tp), max(1, g.num_v_heads // tp)
            ops += [
                PlanOp("gdn_in_proj", "gemm", g.linear_layers,
                       params={"n": 2 * hk * g.head_k_dim + 2 * hv * g.head_v_dim + 2 * hv, "k": h, "quant": q.attention_gemm,
                               **_fused_input(fusions.norm_quant)}),
                PlanOp("gdn", "gdn", g.linear_layers,
                       params={"d_model": h, "num_k_heads": hk, "head_k_dim": g.head_k_dim, "num_v_heads": hv,
                               "head_v_dim": g.head_v_dim, "conv_kernel": g.conv_kernel, "model_name": spec.resolved_id}),
                PlanOp("gdn_norm", "elementwise", g.linear_layers, params={"bytes_per_token": hv * g.head_v_dim * act * 3}),
                PlanOp("gdn_out_proj", "gemm", g.linear_layers, params={"n": h, "k": hv * g.head_v_dim, "quant": q.attention_gemm}),
            ]
    if tp > 1:
        ops.append(PlanOp("attn_allreduce", "allreduce", L, params={"elements_per_token": h, "group": tp}))
    if not fusions.allreduce_norm:
        ops.append(PlanOp("post_attn_norm", "elementwise", L, params={"bytes_per_token": h * act * 4}))
    return ops


def _grouped_attention_ops(spec: ModelSpec, par: ParallelConfig, fusions: Fusions) -> list[PlanOp]:
    """Attention blocks of a spec with ``attention_groups`` (:mod:`infercast.models.groups`), each
    group's ops once with its layer count: a GQA group's QKV projection (q at ``head_dim``, k at
    ``head_dim``, v at ``v_head_dim``, no v with ``k_eq_v``), q/k norms, RoPE, attention over its
    window and output projection (from ``v_head_dim`` heads); a ``linear`` group one ``hidden x
    hidden`` GEMM split over TP by rows. Attention runs at the q/k ``head_dim`` (the tables'
    one head size), so a smaller ``v_head_dim`` is costed at the larger size. Layers of no group
    have no attention block: no norm and no all-reduce. The input norms and post-attention norms
    follow :func:`_attention_ops`; with ``sandwich_norms`` every layer also normalises the
    attention and FFN outputs (two more norms per layer)."""
    tp, L, h = par.tp, spec.num_layers, spec.hidden
    q, act = spec.quant, 2
    n_attn = sum(g.count for g in spec.attention_groups)
    ops = []
    if n_attn:
        ops.append(PlanOp("input_norm", "elementwise", 1 if fusions.allreduce_norm else n_attn,
                          params={"bytes_per_token": h * act * 3}))
    for g in spec.attention_groups:
        if g.kind == "linear":
            ops.append(PlanOp(f"{g.label}_gemm", "gemm", g.count, params={"n": h, "k": h // tp, "quant": q.attention_gemm}))
            continue
        heads, kvh, hd = g.heads // tp, max(1, g.kv_heads // tp), g.head_dim
        n_qkv = heads * hd + kvh * hd + (0 if g.k_eq_v else kvh * g.v_head_dim)
        ops.append(PlanOp(f"qkv_gemm_{g.label}", "gemm", g.count,
                          params={"n": n_qkv, "k": h, "quant": q.attention_gemm, **_fused_input(fusions.norm_quant)}))
        if spec.qk_norm:
            ops.append(PlanOp(f"qk_norm_{g.label}", "elementwise", g.count,
                              params={"bytes_per_token": (heads + kvh) * hd * act * 2}))
        if not fusions.rope_in_attention:
            ops.append(PlanOp(f"rope_{g.label}", "elementwise", g.count,
                              params={"bytes_per_token": (heads + kvh) * hd * act * 2}))
        ops.append(PlanOp(f"attention_{g.label}", "attention", g.count,
                          params={"heads": heads, "kv_heads": kvh, "head_dim": hd, "window": g.window,
                                  "kv_quant": q.kv_cache, "attn_quant": q.attention}))
        ops.append(PlanOp(f"o_gemm_{g.label}", "gemm", g.count,
                          params={"n": h, "k": heads * g.v_head_dim, "quant": q.attention_gemm}))
    if tp > 1 and n_attn:
        ops.append(PlanOp("attn_allreduce", "allreduce", n_attn, params={"elements_per_token": h, "group": tp}))
    n_ffn = L if spec.ffn_groups is None else sum(g.count for g in spec.ffn_groups)
    if not fusions.allreduce_norm and n_ffn:
        ops.append(PlanOp("post_attn_norm", "elementwise", n_ffn, params={"bytes_per_token": h * act * 4}))
    if spec.sandwich_norms:
        ops.append(PlanOp("sandwich_norms", "elementwise", 2 * L, params={"bytes_per_token": h * act * 2}))
    return ops


def _grouped_ffn_ops(spec: ModelSpec, par: ParallelConfig, fusions: Fusions) -> list[PlanOp]:
    """Dense FFNs of a spec with ``ffn_groups``: each gated group's MLP split over TP, each
    ``linear`` group one ``hidden x hidden`` GEMM split by rows; one TP all-reduce per layer that
    has an FFN."""
    tp, h = par.tp, spec.hidden
    ops = []
    for g in spec.ffn_groups:
        if g.kind == "linear":
            ops.append(PlanOp(f"{g.label}_gemm", "gemm", g.count, params={"n": h, "k": h // tp, "quant": spec.quant.gemm}))
        else:
            ops += _dense_ffn_ops(f"{g.label}_", g.count, h, g.inter // tp, spec.quant.gemm, fusions)
    n_ffn = sum(g.count for g in spec.ffn_groups)
    if tp > 1 and n_ffn:
        ops.append(PlanOp("ffn_allreduce", "allreduce", n_ffn, params={"elements_per_token": h, "group": tp}))
    return ops


def _fused_input(fused: bool) -> dict:
    """A GEMM's params marking its input as quantised by the op before it (``Fusions.norm_quant``
    / ``act_quant``)."""
    return {"input_quant": "fused"} if fused else {}


def _dense_ffn_ops(name: str, count: int, hidden: int, inter_per_gpu: int, quant: str,
                   fusions: Fusions | None = None) -> list[PlanOp]:
    f = fusions or Fusions()
    return [
        PlanOp(f"{name}gate_up_gemm", "gemm", count,
               params={"n": 2 * inter_per_gpu, "k": hidden, "quant": quant, **_fused_input(f.norm_quant)}),
        PlanOp(f"{name}activation", "elementwise", count, params={"bytes_per_token": inter_per_gpu * 2 * 3}),
        PlanOp(f"{name}down_gemm", "gemm", count,
               params={"n": hidden, "k": inter_per_gpu, "quant": quant, **_fused_input(f.act_quant)}),
    ]


def _moe_alltoall(par: ParallelConfig) -> bool:
    """True when the MoE block moves tokens by all-to-all dispatch (attention-DP > 1, EP > 1 and
    ``moe_comm == "alltoall"``) rather than an all-gather / reduce-scatter over the replica."""
    return par.attention_dp > 1 and par.ep > 1 and par.moe_comm == "alltoall"


def _moe_gather_ops(count: int, width: int, moe, par: ParallelConfig, quant: str) -> list[PlanOp]:
    """The communication before the experts: all-to-all dispatch of ``width``-wide tokens, or the
    all-gather of the replica's attention-DP ranks' tokens, or nothing under pure TP attention."""
    adp = par.attention_dp
    if _moe_alltoall(par):
        return [PlanOp("moe_dispatch", "moe_dispatch", count,
                       params={"hidden": width, "topk": moe.topk, "experts": moe.experts, "ep": par.ep, "quant": quant})]
    if adp > 1:
        return [PlanOp("moe_allgather", "allgather", count, params={"elements_per_token": width * adp, "group": par.width})]
    return []


def _moe_experts_op(count: int, width: int, moe, par: ParallelConfig, quant: str, gated: bool,
                    tokens_multiplier: float) -> PlanOp:
    """The routed experts of ``count`` layers: ``width``-wide tokens into ``moe.inter``-wide experts
    split by the expert TP / EP, over ``tokens_multiplier`` times this rank's tokens, routed with
    :data:`MOE_DISTRIBUTION`."""
    return PlanOp("moe_experts", "moe", count,
                  params={"quant": quant, "hidden": width, "inter": moe.inter, "topk": moe.topk, "experts": moe.experts,
                          "moe_tp": par.etp, "moe_ep": par.ep, "gated": gated, "tokens_multiplier": tokens_multiplier,
                          "distribution": MOE_DISTRIBUTION})


def _moe_scatter_ops(count: int, width: int, par: ParallelConfig) -> list[PlanOp]:
    """The reduce-scatter back to the attention-DP ranks after the experts when they were
    all-gathered (:func:`_moe_gather_ops`); nothing otherwise (the all-to-all's combine is in the
    dispatch op; the TP all-reduce is the caller's)."""
    adp = par.attention_dp
    if adp > 1 and not _moe_alltoall(par):
        return [PlanOp("moe_reduce_scatter", "reduce_scatter", count, params={"elements_per_token": width * adp, "group": par.width})]
    return []


def _moe_block_ops(count: int, hidden: int, moe, par: ParallelConfig, quant, fusions: Fusions, gated: bool) -> list[PlanOp]:
    """The MoE block of ``count`` layers after the router, on ``hidden``-wide tokens: the gather
    (:func:`_moe_gather_ops`), the routed experts (over ``attention_dp`` times this rank's tokens,
    plus one expert's share per token when ``fusions.shared_experts`` folds the shared expert into
    the expert kernel), the shared expert as a dense MLP split over attention TP when not folded,
    then the reduce-scatter (:func:`_moe_scatter_ops`) or, without one, the TP all-reduce.
    ``quant`` is the model's :class:`~infercast.models.spec.QuantSpec`."""
    tp, adp, fuse = par.tp, par.attention_dp, fusions.shared_experts
    moe_quant = quant.moe or quant.gemm
    ops = _moe_gather_ops(count, hidden, moe, par, moe_quant)
    ops.append(_moe_experts_op(count, hidden, moe, par, moe_quant, gated,
                               adp * ((moe.topk + 1) / moe.topk if fuse else 1.0)))
    if moe.shared_inter and not fuse:
        ops += _dense_ffn_ops("shared_", count, hidden, moe.shared_inter // tp, quant.shared_expert_gemm, fusions)
    scatter = _moe_scatter_ops(count, hidden, par)
    ops += scatter
    if not scatter and tp > 1:
        ops.append(PlanOp("moe_allreduce", "allreduce", count, params={"elements_per_token": hidden, "group": tp}))
    return ops


def require_mtp_layers(spec: ModelSpec) -> None:
    """Refuse MTP speculative decoding for a checkpoint without next-n prediction layers."""
    if spec.mtp_layers <= 0:
        raise InvalidConfigError(
            f"{spec.resolved_id} ships no MTP layers (num_nextn_predict_layers is 0)",
            "MTP speculative decoding needs the checkpoint's next-n prediction layers",
        )


def _ends(spec: ModelSpec, par: ParallelConfig) -> list[PlanOp]:
    tp, h = par.tp, spec.hidden
    ops = [
        PlanOp("embedding", "elementwise", 1, params={"bytes_per_token": h * 2 * 2}),
        PlanOp("final_norm", "elementwise", 1, params={"bytes_per_token": h * 2 * 3}),
        PlanOp("lm_head", "gemm", 1, tokens="last", params={"n": spec.vocab // tp, "k": h, "quant": "bfloat16"}),
    ]
    if tp > 1:
        ops += [
            PlanOp("embedding_allreduce", "allreduce", 1, params={"elements_per_token": h, "group": tp}),
            PlanOp("logits_allgather", "allgather", 1, tokens="last", params={"elements_per_token": spec.vocab, "group": tp}),
        ]
    if par.pp > 1:
        ops.append(PlanOp("pp_p2p", "p2p", par.pp - 1, params={"bytes_per_token": h * 2}))
    return ops


def dense_plan(spec: ModelSpec, par: ParallelConfig, fusions: Fusions | None = None) -> Plan:
    par.check(spec)
    fusions = _applied(fusions, spec, par)
    tp, L = par.tp, spec.num_layers
    ops = _attention_ops(spec, par, fusions)
    if spec.ffn_groups is not None:
        return Plan(spec, par, tuple(ops + _grouped_ffn_ops(spec, par, fusions) + _ends(spec, par)), fusions=fusions)
    ops += _dense_ffn_ops("", L, spec.hidden, spec.intermediate // tp, spec.quant.gemm, fusions)
    if tp > 1:
        ops.append(PlanOp("ffn_allreduce", "allreduce", L, params={"elements_per_token": spec.hidden, "group": tp}))
    return Plan(spec, par, tuple(ops + _ends(spec, par)), fusions=fusions)


def moe_plan(spec: ModelSpec, par: ParallelConfig, fusions: Fusions | None = None) -> Plan:
    """GQA or MLA attention + MoE FFN (DeepSeek/Kimi: first layers dense, shared experts).

    MoE block per layer: router GEMM on this rank's tokens; with attention-DP the ranks' tokens
    are all-gathered over the replica before the experts and reduce-scattered after (the experts
    see ``tokens x attention_dp``); with pure TP attention the block ends in the TP all-reduce.
    Shared experts are a dense MLP split over attention TP, on this rank's tokens, unless
    ``fusions.shared_experts`` folds them into the expert kernel.
    """
    par.check(spec)
    fusions = _applied(fusions, spec, par)
    m = spec.moe
    tp, L, h = par.tp, spec.num_layers, spec.hidden
    q = spec.quant
    moe_layers = L - m.first_dense_layers
    ops = _attention_ops(spec, par, fusions)
    if m.first_dense_layers:
        ops += _dense_ffn_ops("dense_", m.first_dense_layers, h, m.dense_inter // tp, q.gemm, fusions)
        if tp > 1:
            ops.append(PlanOp("dense_ffn_allreduce", "allreduce", m.first_dense_layers, params={"elements_per_token": h, "group": tp}))
    ops.append(PlanOp("router_gemm", "gemm", moe_layers, params={"n": m.experts, "k": h, "quant": "bfloat16"}))
    ops += _moe_block_ops(moe_layers, h, m, par, q, fusions, m.gated)
    return Plan(spec, par, tuple(ops + _ends(spec, par)), fusions=fusions)


def with_moe_kernel(plan: Plan, kernel: str | None) -> Plan:
    """``plan`` with its expert ops (MTP drafts included) run by the MoE kernel family ``kernel``
    (the engine's MoE backend, e.g. TensorRT-LLM's ``moe_config.backend``); None leaves the plan
    as it is: the tables' own kernels."""
    if kernel is None:
        return plan
    if not isinstance(kernel, str) or not kernel:
        raise InvalidInputError(f"--moe-kernel must be a kernel family name, got {kernel!r}")
    if not any(o.kind == "moe" for o in plan.ops):
        raise InvalidInputError(f"--moe-kernel {kernel} needs an MoE model", f"{plan.model.resolved_id} has no experts")
    ops = tuple(replace(o, params={**o.params, "kernel": kernel.lower()}) if o.kind == "moe" else o for o in plan.ops)
    return replace(plan, ops=ops)


def _mtp_attention_group(spec: ModelSpec):
    """The attention group whose ops an MTP draft layer runs, for a spec with
    ``attention_groups``: the full-attention GQA group (else the first GQA group); None for
    other specs."""
    gqa = [g for g in spec.attention_groups or () if g.kind == "gqa"]
    full = [g for g in gqa if g.window == 0]
    return (full or gqa or [None])[0]


def _with_mtp(plan: Plan, sd: SpecDecode) -> Plan:
    """Append the MTP draft passes: ``nextn`` executions of one layer's ops and the LM head,
    on one token per sequence, in decode steps only. The MTP layer is a full-attention decoder
    layer, also in hybrid models whose other layers are mostly linear attention (Qwen3.5's
    ``mtp`` block: self-attention + MoE): their full-attention ops join the draft, their
    Gated-DeltaNet ops do not; in a spec with layer groups, the full-attention group's ops
    (:func:`_mtp_attention_group`)."""
    sd.check()
    if sd.mtp_steps == 0:
        return replace(plan, spec_decode=sd)
    require_mtp_layers(plan.model)
    L = plan.model.num_layers
    moe_layers = L - (plan.model.moe.first_dense_layers if plan.model.moe else 0)
    gdn = plan.model.gdn
    full_attention = L - gdn.linear_layers if gdn else L
    mtp_group = _mtp_attention_group(plan.model)
    draft = []
    for o in plan.ops:
        per_layer = o.count in (L, moe_layers) and not o.name.startswith("dense_")
        attention_layer = gdn is not None and o.count == full_attention and not o.name.startswith("gdn")
        # layer groups: the MTP layer's attention is the full-attention group's, no other group's
        group = next((g for g in plan.model.attention_groups or () if o.name.endswith("_" + g.label)), None)
        if group is not None:
            per_layer, attention_layer = False, group == mtp_group
        # MiniMax sparse attention: the MTP layer's attention is costed as a sparse layer's
        if per_layer or attention_layer or o.kind == "msa":
            draft.append(replace(o, name=f"mtp_{o.name}", count=sd.nextn, phase="decode"))
        elif o.name == "lm_head":
            draft.append(replace(o, name="mtp_lm_head", count=sd.nextn, phase="decode"))
    return replace(plan, ops=plan.ops + tuple(draft), spec_decode=sd)


def build_plan(spec: ModelSpec, par: ParallelConfig, spec_decode: SpecDecode | None = None,
               fusions: Fusions | None = None) -> Plan:
    if par.cp > 1:
        from .context_parallel import with_context_parallel

        par.check(spec)
        plan = build_plan(spec, replace(par, cp=1, cp_overlap=False), spec_decode, fusions)
        return with_context_parallel(replace(plan, parallel=par))
    if spec.family == "dense":
        plan = dense_plan(spec, par, fusions)
    elif spec.family in ("moe", "mla_moe"):
        plan = moe_plan(spec, par, fusions)
    elif spec.family == "nemotron_h":
        from .nemotron_h import nemotron_h_plan

        return nemotron_h_plan(spec, par, spec_decode, fusions)
    elif spec.family == "deepseek_v4":
        from .deepseek_v4 import dsv4_plan

        return dsv4_plan(spec, par, spec_decode, fusions)
    elif spec.family == "kimi_k3":
        from .kimi_k3 import kimi_k3_plan

        return kimi_k3_plan(spec, par, spec_decode, fusions)
    else:
        raise InvalidConfigError(f"no op plan for family {spec.family!r}")
    return _with_mtp(plan, spec_decode or SpecDecode())
