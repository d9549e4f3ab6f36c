"""Memory per GPU: weights, KV cache, activations, runtime reserves; KV capacity per worker.

Weights: linear layers at the GEMM quant's bytes per weight (scales included), embeddings, LM head
and norms in bf16; vocab-parallel embedding / LM head split over TP; each pipeline stage holds
``layers / pp`` layers, the first also the embedding (and a vision-language checkpoint's vision
tower, bf16, split over TP) and the last the LM head (the larger stage is what must fit). KV bytes
per token per GPU = 2 (K and V) x layers per stage x KV heads per GPU x head_dim x KV dtype bytes
(MLA: the compressed latent per layer; layers with a small sliding window hold only their window
and are left out, see :data:`WINDOW_KV_COUNTED_FROM`). MoE: routed experts split over moe_tp x
moe_ep at the MoE quant, shared experts and dense layers over TP. Each attention-DP rank has its own KV pool.
Reserves: the system's ``misc.other_mem`` (runtime, CUDA graphs)
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
    state_per_request: float = 0.0  # bytes of fixed-size (linear-attention) state per request

    def capacity_for(self, requests: float) -> float:
        """KV tokens left when ``requests`` requests also hold their fixed-size state."""
        if self.state_per_request <= 0 or self.kv_per_token <= 0:
            return float(self.kv_capacity_tokens)
        return max(0.0, self.kv_capacity_tokens - requests * self.state_per_request / self.kv_per_token)

    def kv_bytes(self, tokens: float) -> float:
        return tokens * self.kv_per_token

    def to_dict(self) -> dict:
        return asdict(self)


def _group_attention_weights(spec: ModelSpec, tp: int, wb: float) -> float:
    """Attention weights of a spec with ``attention_groups``, averaged per layer (layers without
    attention count 0): q / k / v (none with ``k_eq_v``) and output projections per GQA group,
    one ``hidden x hidden / tp`` matrix per linear group."""
    h, total = spec.hidden, 0.0
    for g in spec.attention_groups:
        if g.kind == "linear":
            total += g.count * h * (h // tp) * wb
            continue
        heads, kvh = g.heads // tp, max(1, g.kv_heads // tp)
        qkv = heads * g.head_dim + kvh * g.head_dim + (0 if g.k_eq_v else kvh * g.v_head_dim)
        total += g.count * (h * qkv + heads * g.v_head_dim * h) * wb
    return total / spec.num_layers


def _attention_weights(spec: ModelSpec, tp: int, wb: float) -> float:
    h = spec.hidden
    if spec.attention_groups is not None:
        return _group_attention_weights(spec, tp, wb)
    if spec.mla is not None:
        m = spec.mla
        heads = spec.num_heads // tp
        q = (h * m.q_lora_rank + m.q_lora_rank * heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)) if m.q_lora_rank \
            else h * heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)
        kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
        o = heads * m.v_head_dim * h
        return (q + kv + o) * wb
    heads = spec.num_heads // tp
    kvh = kv_heads_per_gpu(spec, tp)
    qn = heads * (2 if spec.attn_output_gate else 1)
    full = (h * (qn + 2 * kvh) * spec.head_dim + heads * spec.head_dim * h) * wb
    if spec.gdn is None:
        return full
    g = spec.gdn
    hk, hv = max(1, g.num_k_heads // tp), max(1, g.num_v_heads // tp)
    linear = (h * (2 * hk * g.head_k_dim + 2 * hv * g.head_v_dim + 2 * hv) + hv * g.head_v_dim * h) * wb
    share = g.linear_layers / spec.num_layers  # this function is per layer: average the two kinds
    return (1 - share) * full + share * linear


#: bytes per vision-tower weight: quantised exports keep the tower in bf16 (their quantisation
#: configs ignore ``model.visual*`` / ``vision_tower*``), and the engines shard it over the TP group as
#: they do the language model (vLLM's default ``mm_encoder_tp_mode``, SGLang's vision blocks)
VISION_WEIGHT_BYTES = 2.0


def weight_bytes_per_gpu(spec: ModelSpec, par: ParallelConfig, extra_layers: int = 0) -> float:
    """Weight bytes on the most loaded GPU (a pipeline stage holds ``ceil(layers / pp)`` layers)."""
    tp, pp = par.tp, par.pp
    h = spec.hidden
    wb = WEIGHT_BYTES[spec.quant.gemm]
    L = spec.num_layers
    stage = math.ceil(L / pp) / L  # share of the layers on one stage
    if spec.mamba is not None:  # Nemotron-H: per block kind (models.nemotron_h)
        from ..models.nemotron_h import layer_weight_bytes

        return layer_weight_bytes(spec, par, extra_layers) + _ends_weight_bytes(spec, tp, pp)
    if spec.dsv4 is not None:  # DeepSeek-V4: per layer kind (models.deepseek_v4)
        from ..models.deepseek_v4 import layer_weight_bytes as dsv4_weights

        return dsv4_weights(spec, par, extra_layers) + _ends_weight_bytes(spec, tp, pp)
    if spec.kimi is not None:  # Kimi-K3: KDA / MLA layers, latent MoE (models.kimi_k3)
        from ..models.kimi_k3 import layer_weight_bytes as kimi_weights

        return kimi_weights(spec, par) + _ends_weight_bytes(spec, tp, pp)
    attn = _attention_weights(spec, tp, WEIGHT_BYTES[spec.quant.attention_gemm]) + 2 * h * 2.0  # + norms
    m = spec.moe
    if m is None and spec.ffn_groups is not None:
        ffn_total = sum(g.count * (3 * h * (g.inter // tp) if g.kind == "gated" else h * (h // tp)) * wb
                        for g in spec.ffn_groups)
    elif m is None:
        ffn_total = L * 3 * h * (spec.intermediate // tp) * wb
    else:
        mb = WEIGHT_BYTES[spec.quant.moe or spec.quant.gemm]
        moe_layers = L - m.first_dense_layers
        experts = m.experts * 3 * h * m.inter * mb / (par.etp * par.ep) if m.gated else m.experts * 2 * h * m.inter * mb / (par.etp * par.ep)
        shared = 3 * h * (m.shared_inter // tp) * WEIGHT_BYTES[spec.quant.shared_expert_gemm]
        router = h * m.experts * 2.0
        dense = m.first_dense_layers * 3 * h * (m.dense_inter // tp) * wb
        ffn_total = moe_layers * (experts + shared + router) + dense
    layers = (L * attn + ffn_total) * stage
    if extra_layers:  # MTP draft layers: one more decoder layer each, on the last stage
        per_layer = attn + (ffn_total / L if m is None else (experts + shared + router))
        layers += extra_layers * per_layer
    return layers + _ends_weight_bytes(spec, tp, pp)


def _ends_weight_bytes(spec: ModelSpec, tp: int, pp: int) -> float:
    """Embedding (with a vision tower) and LM head bytes on the most loaded stage's GPU."""
    h = spec.hidden
    embed = spec.vocab * h * 2.0 / tp + spec.vision_params * VISION_WEIGHT_BYTES / tp
    head = 0.0 if (spec.tie_embeddings and pp == 1) else spec.vocab * h * 2.0 / tp
    return embed + head if pp == 1 else max(embed, head + h * 2.0)


#: A sliding-window (or chunked) attention layer keeps at most its window of a request's tokens.
#: Small windows (gpt-oss's 128) hold a sliver of a request, which the engines keep in a bounded
#: pool of their own: left out of the KV per token. From this window on (Llama 4's 8192-token
#: chunks) a layer holds the whole of most requests (all of one shorter than the window): counted in
#: full, exact below the window and an over-count beyond it.
WINDOW_KV_COUNTED_FROM = 4096


def kv_bytes_per_token(spec: ModelSpec, par: ParallelConfig, extra_layers: int = 0) -> float:
    """KV-cache bytes per token on one GPU: K and V per KV head for GQA, the compressed latent
    (``kv_lora_rank + qk_rope_head_dim``, replicated on every TP rank) for MLA; with context
    parallelism each of the ``cp`` ranks holds ``1 / cp`` of every sequence's tokens."""
    per = _kv_bytes_per_token_unsplit(spec, par, extra_layers)
    return per / par.cp if par.cp > 1 else per


def _kv_bytes_per_token_unsplit(spec: ModelSpec, par: ParallelConfig, extra_layers: int = 0) -> float:
    kvb = KV_BYTES[spec.quant.kv_cache]
    if spec.dsv4 is not None:  # DeepSeek-V4: compressed entries per layer kind (models.deepseek_v4)
        from ..models.deepseek_v4 import kv_bytes_per_token as dsv4_kv

        return dsv4_kv(spec, par, extra_layers)
    if spec.attention_groups is not None:
        return _group_kv_bytes(spec, par, kvb, windowed=False)
    if spec.kimi is not None:  # Kimi-K3: only the MLA layers keep per-token KV
        from ..models.kimi_k3 import kv_bytes_per_token as kimi_kv

        return kimi_kv(spec, par, kvb)
    layers = math.ceil(spec.num_layers / par.pp) + extra_layers
    if spec.mla is not None:
        # latent cache; DSA models also keep one indexer key per token and layer
        return layers * (spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim + spec.index_head_dim) * kvb
    windows = spec.layer_windows
    if spec.gdn is not None:  # only the full-attention layers keep per-token KV
        layers = math.ceil((spec.num_layers - spec.gdn.linear_layers) / par.pp)
    if spec.mamba is not None:  # Nemotron-H: the attention blocks (and an MTP layer's) keep per-token KV
        layers = math.ceil(spec.mamba.attention_layers / par.pp) + extra_layers * spec.mamba.mtp_pattern.count("*")
    return 2.0 * layers * kv_heads_per_gpu(spec, par.tp) * spec.head_dim * kvb if not windows else \
        2.0 * kv_heads_per_gpu(spec, par.tp) * spec.head_dim * kvb * math.ceil(
            sum(1 for w in windows if w == 0 or w >= WINDOW_KV_COUNTED_FROM) / par.pp)


def _group_kv_bytes(spec: ModelSpec, par: ParallelConfig, kvb: float, windowed: bool) -> float:
    """Per-token KV bytes on one GPU of the GQA groups whose window is below
    :data:`WINDOW_KV_COUNTED_FROM` (``windowed``) or not: K at ``head_dim`` and V at
    ``v_head_dim`` per KV head per GPU, for the share of the layers on one pipeline stage
    (``ceil(n / pp)`` of the ``n`` layers so counted)."""
    per, n = 0.0, 0
    for g in spec.attention_groups:
        small = 0 < g.window < WINDOW_KV_COUNTED_FROM
        if g.kind != "gqa" or small != windowed:
            continue
        per += g.count * max(1, g.kv_heads // par.tp) * (g.head_dim + g.v_head_dim) * kvb
        n += g.count
    return per * math.ceil(n / par.pp) / n if n else 0.0


def _group_window_state(spec: ModelSpec, par: ParallelConfig) -> float:
    """Sliding-window KV of a spec with ``attention_groups`` held per request: each layer with a
    window below :data:`WINDOW_KV_COUNTED_FROM` keeps up to its window of a request's tokens,
    counted as a fixed ``window`` tokens per request (an upper bound for shorter requests)."""
    kvb = KV_BYTES[spec.quant.kv_cache]
    total, n = 0.0, 0
    for g in spec.attention_groups:
        if g.kind == "gqa" and 0 < g.window < WINDOW_KV_COUNTED_FROM:
            total += g.count * g.window * max(1, g.kv_heads // par.tp) * (g.head_dim + g.v_head_dim) * kvb
            n += g.count
    return total * math.ceil(n / par.pp) / n if n else 0.0


def state_bytes_per_request(spec: ModelSpec, par: ParallelConfig) -> float:
    """Fixed-size per-request cache on one GPU: linear-attention / Mamba2 state, and the
    sliding-window KV of layer groups (:func:`_group_window_state`)."""
    if spec.mamba is not None:
        from ..models.nemotron_h import state_bytes_per_request as mamba_state

        return mamba_state(spec, par)
    if spec.dsv4 is not None:  # DeepSeek-V4: sliding windows and compressor states
        from ..models.deepseek_v4 import state_bytes_per_request as dsv4_state

        return dsv4_state(spec, par)
    if spec.kimi is not None:
        from ..models.kimi_k3 import state_bytes_per_request as kda_state

        return kda_state(spec, par)
    if spec.attention_groups is not None:
        return _group_window_state(spec, par)
    if spec.gdn is None:
        return 0.0
    from ..ops.gdn import gdn_state_bytes

    g = spec.gdn
    per_layer = gdn_state_bytes(max(1, g.num_v_heads // par.tp), g.head_k_dim, g.head_v_dim, g.conv_kernel, max(1, g.num_k_heads // par.tp))
    return math.ceil(g.linear_layers / par.pp) * per_layer


def activation_bytes(spec: ModelSpec, par: ParallelConfig, be: BackendDefaults) -> float:
    t = be.max_num_tokens
    tp = par.tp
    qkv = (spec.num_heads // tp + 2 * kv_heads_per_gpu(spec, tp)) * spec.head_dim
    if spec.mamba is not None:  # a Mamba2 block's in_proj output (z, x, B, C, dt) is wider than QKV
        m = spec.mamba
        qkv = max(qkv, (2 * m.num_heads * m.head_dim + m.num_heads) // tp + 2 * max(1, m.n_groups // tp) * m.state_size)
    ffn = spec.intermediate // tp if spec.moe is None else max(spec.moe.dense_inter // tp, spec.moe.inter * spec.moe.topk // max(par.etp, 1))
    per_token = (4 * spec.hidden + 2 * ffn + qkv) * 2.0
    logits = be.max_batch_size * (spec.vocab / tp) * 4.0
    return t * per_token + logits


def memory_breakdown(spec: ModelSpec, par: ParallelConfig, system: SystemSpec, be: BackendDefaults, mtp_layers: int = 0,
                     draft: tuple[float, float] = (0.0, 0.0)) -> MemoryBreakdown:
    """``draft``: the speculative draft network's (weight bytes per GPU, KV bytes per token per
    GPU) (:func:`infercast.serving.speculative.draft_memory`), added to the target's."""
    weights = weight_bytes_per_gpu(spec, par, mtp_layers) + draft[0]
    acts = activation_bytes(spec, par, be)
    reserves = float(system.other_mem + system.nccl_mem_for(par.width))
    cap = float(system.gpu.mem_capacity)
    if be.fraction_of == "free":
        budget = be.kv_memory_fraction * (cap - weights - acts - reserves)
    elif be.fraction_of == "static":
        budget = be.kv_memory_fraction * cap - weights
    else:
        budget = be.kv_memory_fraction * cap - weights - acts - reserves
    budget = max(budget, 0.0)
    per_tok = kv_bytes_per_token(spec, par, mtp_layers) + draft[1]
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
        state_per_request=state_bytes_per_request(spec, par),
    )


def blocks_needed(tokens_per_seq: float, seqs: float, block: int) -> float:
    return seqs * math.ceil(tokens_per_seq / block)
