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
from dataclasses import asdict, dataclass, field

from ..errors import InvalidConfigError, InvalidInputError
from .spec import ModelSpec

PLAN_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class ParallelConfig:
    tp: int = 1
    pp: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    def check(self, spec: ModelSpec, gpus_per_node: int | None = None) -> None:
        for name, v in (("tp", self.tp), ("pp", self.pp)):
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
        if self.tp > spec.num_kv_heads and self.tp % spec.num_kv_heads:
            raise InvalidConfigError(
                f"TP {self.tp} is not a multiple of the {spec.num_kv_heads} KV heads",
                "KV heads are replicated only in whole groups",
            )
        if spec.intermediate % self.tp:
            raise InvalidConfigError(f"TP {self.tp} does not divide the FFN width {spec.intermediate}")
        if self.pp > spec.num_layers:
            raise InvalidConfigError(f"PP {self.pp} exceeds the {spec.num_layers} layers")


@dataclass(frozen=True)
class PlanOp:
    name: str
    kind: str  # gemm | attention | allreduce | allgather | elementwise | p2p
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

    def to_json(self) -> str:
        return json.dumps(
            {
                "schema_version": self.schema_version,
                "model": self.model.to_dict(),
                "parallel": asdict(self.parallel),
                "ops": [asdict(o) for o in self.ops],
            },
            indent=1,
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> Plan:
        d = json.loads(text)
        if d.get("schema_version") != PLAN_SCHEMA_VERSION:
            raise InvalidInputError(
                f"plan schema version {d.get('schema_version')} is not supported",
                f"this infercast reads schema {PLAN_SCHEMA_VERSION}; recompile the plan",
            )
        return cls(
            ModelSpec.from_dict(d["model"]),
            ParallelConfig(**d["parallel"]),
            tuple(PlanOp(**o) for o in d["ops"]),
        )


def kv_heads_per_gpu(spec: ModelSpec, tp: int) -> int:
    return max(1, spec.num_kv_heads // tp)


def dense_plan(spec: ModelSpec, par: ParallelConfig) -> Plan:
    par.check(spec)
    tp, L = par.tp, spec.num_layers
    h, hd = spec.hidden, spec.head_dim
    heads = spec.num_heads // tp
    kvh = kv_heads_per_gpu(spec, tp)
    inter = spec.intermediate // tp
    q = spec.quant
    act = 2  # bf16 activations
    ops = [
        PlanOp("embedding", "elementwise", 1, params={"bytes_per_token": h * act * 2}),
        PlanOp("input_norm", "elementwise", L, params={"bytes_per_token": h * act * 3}),
        PlanOp("qkv_gemm", "gemm", L, params={"n": (heads + 2 * kvh) * hd, "k": h, "quant": q.gemm}),
        PlanOp("rope", "elementwise", L, params={"bytes_per_token": (heads + kvh) * hd * act * 2}),
        PlanOp(
            "attention", "attention", L,
            params={"heads": heads, "kv_heads": kvh, "head_dim": hd, "window": spec.sliding_window or 0,
                    "kv_quant": q.kv_cache, "attn_quant": q.attention},
        ),
        PlanOp("o_gemm", "gemm", L, params={"n": h, "k": heads * hd, "quant": q.gemm}),
        PlanOp("post_attn_norm", "elementwise", L, params={"bytes_per_token": h * act * 4}),
        PlanOp("gate_up_gemm", "gemm", L, params={"n": 2 * inter, "k": h, "quant": q.gemm}),
        PlanOp("activation", "elementwise", L, params={"bytes_per_token": inter * act * 3}),
        PlanOp("down_gemm", "gemm", L, params={"n": h, "k": inter, "quant": q.gemm}),
        PlanOp("final_norm", "elementwise", 1, params={"bytes_per_token": h * act * 3}),
        PlanOp("lm_head", "gemm", 1, tokens="last", params={"n": spec.vocab // tp, "k": h, "quant": "bfloat16"}),
    ]
    if tp > 1:
        ops += [
            PlanOp("embedding_allreduce", "allreduce", 1, params={"elements_per_token": h, "group": tp}),
            PlanOp("attn_allreduce", "allreduce", L, params={"elements_per_token": h, "group": tp}),
            PlanOp("ffn_allreduce", "allreduce", L, params={"elements_per_token": h, "group": tp}),
            PlanOp("logits_allgather", "allgather", 1, tokens="last", params={"elements_per_token": spec.vocab, "group": tp}),
        ]
    if par.pp > 1:
        ops.append(PlanOp("pp_p2p", "p2p", par.pp - 1, params={"bytes_per_token": h * act}))
    return Plan(spec, par, tuple(ops))


def build_plan(spec: ModelSpec, par: ParallelConfig) -> Plan:
    if spec.family == "dense":
        return dense_plan(spec, par)
    raise InvalidConfigError(f"no op plan for family {spec.family!r}")
