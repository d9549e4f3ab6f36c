"""Memory per GPU: weights, KV cache, activations, runtime reserves; KV capacity per worker.

Weights: linear layers at the GEMM quant's bytes per weight (scales included), embeddings, LM head
and norms in bf16; vocab-parallel embedding / LM head split over TP; each pipeline stage holds
``layers / pp`` layers, the first also the embedding and the last the LM head (the larger stage
is what must fit). KV bytes per token per GPU = 2 (K and V) x layers per stage x KV heads per GPU
x head_dim x KV dtype bytes. Reserves: the system's ``misc.other_mem`` (runtime, CUDA graphs)
plus ``misc.nccl_mem`` for the TP group. Activations: the peak of one step at the backend's
token budget (hidden states, QKV, FFN intermediate) plus logits for the largest batch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..data.quant import KV_BYTES, WEIGHT_BYTES
from ..data.system import SystemSpec
from ..models.plan import ParallelConfig, kv_heads_per_gpu
from ..models.spec import ModelSpec
from .backends import BackendDefaults

GB = 1e9


@dataclass(frozen=True)
class MemoryBreakdown:
    weights: float
    activations: float
    reserves: float
    kv_per_token: float  # bytes per token per GPU
    capacity: float
    kv_budget: float  # bytes available to the KV cache
    kv_capacity_tokens: int
    kv_capacity_blocks: int
    tokens_per_block: int

    def kv_bytes(self, tokens: float) -> float:
        return tokens * self.kv_per_token

    def to_dict(self) -> dict:
        return asdict(self)


def weight_bytes_per_gpu(spec: ModelSpec, par: ParallelConfig) -> float:
    tp, pp = par.tp, par.pp
    h, hd = spec.hidden, spec.head_dim
    heads = spec.num_heads // tp
    kvh = kv_heads_per_gpu(spec, tp)
    wb = WEIGHT_BYTES[spec.quant.gemm]
    per_layer = (
        h * (heads + 2 * kvh) * hd * wb  # qkv
        + heads * hd * h * wb  # o
        + 3 * h * (spec.intermediate // tp) * wb  # gate, up, down
        + 2 * h * 2.0  # norms
    )
    layers = math.ceil(spec.num_layers / pp)
    embed = spec.vocab * h * 2.0 / tp
    head = 0.0 if (spec.tie_embeddings and pp == 1) else spec.vocab * h * 2.0 / tp
    ends = embed + head if pp == 1 else max(embed, head + h * 2.0)
    return layers * per_layer + ends


def kv_bytes_per_token(spec: ModelSpec, par: ParallelConfig) -> float:
    layers = math.ceil(spec.num_layers / par.pp)
    return 2.0 * layers * kv_heads_per_gpu(spec, par.tp) * spec.head_dim * KV_BYTES[spec.quant.kv_cache]


def activation_bytes(spec: ModelSpec, par: ParallelConfig, be: BackendDefaults) -> float:
    t = be.max_num_tokens
    tp = par.tp
    qkv = (spec.num_heads // tp + 2 * kv_heads_per_gpu(spec, tp)) * spec.head_dim
    per_token = (4 * spec.hidden + 2 * (spec.intermediate // tp) + qkv) * 2.0
    logits = be.max_batch_size * (spec.vocab / tp) * 4.0
    return t * per_token + logits


def memory_breakdown(spec: ModelSpec, par: ParallelConfig, system: SystemSpec, be: BackendDefaults) -> MemoryBreakdown:
    weights = weight_bytes_per_gpu(spec, par)
    acts = activation_bytes(spec, par, be)
    reserves = float(system.other_mem + system.nccl_mem_for(par.tp))
    cap = float(system.gpu.mem_capacity)
    if be.fraction_of == "free":
        budget = be.kv_memory_fraction * (cap - weights - acts - reserves)
    else:
        budget = be.kv_memory_fraction * cap - weights - acts - reserves
    budget = max(budget, 0.0)
    per_tok = kv_bytes_per_token(spec, par)
    blocks = int(budget // (per_tok * be.tokens_per_block)) if per_tok > 0 else 0
    return MemoryBreakdown(
        weights=weights,
        activations=acts,
        reserves=reserves,
        kv_per_token=per_tok,
        capacity=cap,
        kv_budget=budget,
        kv_capacity_tokens=blocks * be.tokens_per_block,
        kv_capacity_blocks=blocks,
        tokens_per_block=be.tokens_per_block,
    )


def blocks_needed(tokens_per_seq: float, seqs: float, block: int) -> float:
    return seqs * math.ceil(tokens_per_seq / block)
