"""Speed-of-light (roofline) times, in milliseconds, from the system spec. Vectorised over shapes.

Every function returns ``(total, math, mem)``; ``total = max(math, mem) + constant latency``.
Math time = FLOPs / tensor-core peak of the compute dtype; memory time = bytes moved /
(HBM bandwidth x empirical efficiency). Comm times use the per-GPU link bandwidth of the group's
tier (intra-node / intra-rack / inter-rack) and the system's P2P latency; a group that spans
several NVLink domains runs the hierarchical schedule (:func:`hierarchical_collective`).
"""

from __future__ import annotations

import numpy as np

from ..data.system import SystemSpec
from ..errors import InvalidConfigError

ACT_BYTES = {"bfloat16": 2.0, "fp8": 1.0, "fp4": 0.5, "int8": 1.0, "float32": 4.0}


def _flops(system: SystemSpec, compute_dtype: str) -> float:
    f = system.gpu.flops(compute_dtype)
    if f is None:
        hint = ""
        if compute_dtype == "fp4":
            hint = "no FP4 tensor cores before Blackwell"
        elif compute_dtype == "fp8":
            hint = "no FP8 tensor cores before Hopper/Ada"
        raise InvalidConfigError(
            f"{system.name} (sm{system.gpu.sm_version}) has no {compute_dtype} tensor cores",
            hint,
            system.gpu.tc_flops,
        )
    return f


def _finish(system: SystemSpec, flops, nbytes, compute_dtype: str):
    if isinstance(flops, float) and isinstance(nbytes, float):  # one shape: plain floats, no numpy
        m = flops / _flops(system, compute_dtype) * 1e3
        b = nbytes / system.gpu.effective_mem_bw * 1e3
        return max(m, b) + system.gpu.mem_latency_s * 1e3, m, b
    math = np.asarray(flops, dtype=float) / _flops(system, compute_dtype) * 1e3
    mem = np.asarray(nbytes, dtype=float) / system.gpu.effective_mem_bw * 1e3
    total = np.maximum(math, mem) + system.gpu.mem_latency_s * 1e3
    return total, math, mem


def gemm(system: SystemSpec, compute_dtype: str, weight_bytes: float, m, n, k):
    if all(isinstance(a, (int, float)) for a in (m, n, k)):  # one shape (a grid's scalar path)
        m, n, k = float(m), float(n), float(k)
    else:
        m, n, k = (np.asarray(a, dtype=float) for a in (m, n, k))
    act = ACT_BYTES.get(compute_dtype, 2.0)
    nbytes = m * k * act + n * k * weight_bytes + m * n * 2.0
    return _finish(system, 2.0 * m * n * k, nbytes, compute_dtype)


def _attended(new, prefix, window):
    """Sum over new tokens of keys attended (causal, optional sliding window)."""
    new = np.asarray(new, dtype=float)
    prefix = np.asarray(prefix, dtype=float)
    full = new * prefix + new * (new + 1.0) / 2.0
    if window:
        w = float(window)
        capped = new * w
        return np.minimum(full, capped)
    return full


def context_attention(system, batch, isl, prefix, heads, kv_heads, head_dim, kv_bytes, window=0, compute_dtype="bfloat16"):
    batch, isl, prefix = (np.asarray(a, dtype=float) for a in (batch, isl, prefix))
    pairs = _attended(isl, prefix, window)
    flops = 4.0 * batch * heads * head_dim * pairs
    kv_len = isl + prefix if not window else np.minimum(isl + prefix, float(window) + isl)
    nbytes = batch * (2.0 * isl * heads * head_dim * 2.0 + 2.0 * kv_len * kv_heads * head_dim * kv_bytes)
    return _finish(system, flops, nbytes, compute_dtype)


def generation_attention(system, batch, kv_len, heads, kv_heads, head_dim, kv_bytes, window=0, compute_dtype="bfloat16"):
    batch, kv_len = np.asarray(batch, dtype=float), np.asarray(kv_len, dtype=float)
    eff = np.minimum(kv_len, float(window)) if window else kv_len
    flops = 4.0 * batch * heads * head_dim * eff
    nbytes = batch * (2.0 * eff * kv_heads * head_dim * kv_bytes + 2.0 * heads * head_dim * 2.0)
    return _finish(system, flops, nbytes, compute_dtype)


def elementwise(system, nbytes):
    nbytes = np.asarray(nbytes, dtype=float)
    mem = nbytes / system.gpu.effective_mem_bw * 1e3
    total = mem + system.gpu.mem_latency_s * 1e3
    return total, np.zeros_like(mem), mem


#: bytes each GPU sends per byte of message, by collective (ring algorithms)
_COMM_FACTOR = {
    "all_reduce": lambda g: 2.0 * (g - 1) / g,
    "all_gather": lambda g: (g - 1) / g,
    "reduce_scatter": lambda g: (g - 1) / g,
    "alltoall": lambda g: (g - 1) / g,
}


def _ring(op: str, message_bytes, group: int, bw: float, lat: float):
    """One ring collective over ``group`` GPUs on links of ``bw`` bytes/s per GPU: ``(total, mem)``
    in ms, one link latency (the ring's steps pipeline behind it)."""
    mem = message_bytes * _COMM_FACTOR[op](group) / bw * 1e3
    return mem + lat * 1e3, mem


def spans_nodes(system: SystemSpec, group: int) -> bool:
    """Whether a collective over ``group`` GPUs leaves the NVLink domain (the node; the rack on
    rack-scale systems, :attr:`~infercast.data.system.NodeSpec.nvlink_gpus`)."""
    return group > system.node.nvlink_gpus


def node_split(system: SystemSpec, group: int) -> tuple[int, int] | None:
    """``(gpus per node, nodes)`` of a group that spans nodes in whole NVLink domains; None when
    the group fits in one domain or does not divide into whole domains."""
    d = system.node.nvlink_gpus
    if group <= d or group % d:
        return None
    return d, group // d


def inter_node_link(system: SystemSpec) -> tuple[float, float, str]:
    """``(bytes/s per GPU, latency s, tier)`` of the link between NVLink domains: the rack-to-rack
    network on rack-scale systems (``inter_rack_bw``, else ``inter_node_bw``; plus
    ``inter_rack_latency``), the node-to-node network (``inter_node_bw``) elsewhere."""
    n = system.node
    if n.gpus_per_rack:
        return (n.inter_rack_bw or n.inter_node_bw), n.p2p_latency_s + (n.inter_rack_latency_s or 0.0), "inter-rack"
    return n.inter_node_bw, n.p2p_latency_s, "inter-node"


def inter_node_stage(system: SystemSpec, op: str, message_bytes, group: int):
    """The inter-node stage of :func:`hierarchical_collective` for a message of ``message_bytes``
    (full size) over ``group`` GPUs split into ``N`` nodes of ``d``: ``(total, mem)`` in ms.

    * all_reduce / all_gather / reduce_scatter: ``d`` concurrent rings over the ``N`` nodes, one
      per local rank, each on its own GPU's share of the network (``inter_node_bw`` is per GPU);
      each ring carries ``1/d`` of the message: ``factor(N) * message / d / bw + latency`` with the
      ring factors of :data:`_COMM_FACTOR`.
    * alltoall: every rank's buffer is split evenly over the ``N * d`` ranks; the share bound for
      the other nodes, ``(N - 1) / N * message``, leaves through the rank's own network link:
      ``(N - 1) / N * message / bw + latency``.
    """
    split = node_split(system, group)
    if split is None:
        raise InvalidConfigError(f"a collective over {group} GPUs does not split into whole nodes of "
                                 f"{system.node.nvlink_gpus} GPUs on {system.name}")
    d, nodes = split
    bw, lat, _ = inter_node_link(system)
    if op == "alltoall":
        mem = message_bytes * (nodes - 1) / nodes / bw * 1e3
        return mem + lat * 1e3, mem
    return _ring(op, message_bytes / d, nodes, bw, lat)


def hierarchical_collective(system: SystemSpec, op: str, message_bytes, group: int):
    """Speed of light of a collective over ``group`` GPUs that spans ``N`` NVLink domains of ``d``
    GPUs (``group = N * d``), as the hierarchical schedule runs it: ``(total, math, mem)`` in ms.

    Stages (the two-level decomposition of Thakur, Rabenseifner & Gropp, "Optimization of
    collective communication operations in MPICH", IJHPCA 2005: all-reduce = reduce-scatter +
    all-gather, each level a ring; NCCL's hierarchical / tree algorithms follow the same split
    between NVLink and the network):

    * all_reduce: intra-node reduce-scatter of the message over ``d`` GPUs, inter-node all-reduce
      of the ``1/d`` each GPU holds over the ``N`` nodes (:func:`inter_node_stage`), intra-node
      all-gather of the message;
    * all_gather: inter-node all-gather (each GPU ends with ``1/d`` of the message), then
      intra-node all-gather of the message;
    * reduce_scatter: intra-node reduce-scatter of the message, then inter-node reduce-scatter
      of the ``1/d`` share;
    * alltoall: the intra-node part (an all-to-all over ``d`` GPUs of the ``1/N`` of the buffer
      that stays in the node) and the inter-node part run at once on separate links (NVLink and
      the network): the slower of the two.

    Intra-node stages use ``intra_node_bw`` (the rack's NVLink, ``inter_node_bw``, when the domain
    is a rack); each stage pays one link latency. A group that does not split into whole domains
    raises :class:`~infercast.errors.InvalidConfigError`.
    """
    one = isinstance(message_bytes, float)
    mb = message_bytes if one else np.asarray(message_bytes, dtype=float)
    split = node_split(system, group)
    if split is None:
        raise InvalidConfigError(f"a collective over {group} GPUs does not split into whole nodes of "
                                 f"{system.node.nvlink_gpus} GPUs on {system.name}")
    d, nodes = split
    n = system.node
    intra_bw = n.intra_node_bw if d <= n.gpus_per_node else n.inter_node_bw
    lat = n.p2p_latency_s
    inter_t, inter_m = inter_node_stage(system, op, mb, group)
    if d == 1:
        intra = [(0.0, 0.0)]
    elif op == "all_reduce":
        intra = [_ring("reduce_scatter", mb, d, intra_bw, lat), _ring("all_gather", mb, d, intra_bw, lat)]
    elif op == "all_gather":
        intra = [_ring("all_gather", mb, d, intra_bw, lat)]
    elif op == "reduce_scatter":
        intra = [_ring("reduce_scatter", mb, d, intra_bw, lat)]
    else:
        intra = [_ring("alltoall", mb / nodes, d, intra_bw, lat)]
    if op == "alltoall":
        total = np.maximum(inter_t, intra[0][0]) if not one else max(inter_t, intra[0][0])
        mem = np.maximum(inter_m, intra[0][1]) if not one else max(inter_m, intra[0][1])
    else:
        total = inter_t + sum(t for t, _ in intra)
        mem = inter_m + sum(m for _, m in intra)
    return total, 0.0 if one else np.zeros_like(mem), mem


def collective(system: SystemSpec, op: str, message_bytes, group: int):
    """Collective time over ``group`` GPUs for a message of ``message_bytes`` (full size): a ring
    over the group's bandwidth tier, or, for a group that spans several NVLink domains in whole
    domains, the hierarchical schedule (:func:`hierarchical_collective`). A group that spans
    domains unevenly is a ring over the slowest link (the inter-node network)."""
    one = isinstance(message_bytes, float)  # one message (a grid's scalar path): plain floats
    message_bytes = message_bytes if one else np.asarray(message_bytes, dtype=float)
    if group <= 1:
        z = 0.0 if one else np.zeros_like(message_bytes)
        return z, z, z
    if op not in _COMM_FACTOR:
        raise InvalidConfigError(f"unknown collective {op!r}", available=_COMM_FACTOR)
    if node_split(system, group) is not None:
        return hierarchical_collective(system, op, message_bytes, group)
    bw, tier = system.node.bandwidth_for_group(group)
    lat = system.node.p2p_latency_s
    if tier == "inter-rack" and system.node.inter_rack_latency_s:
        lat += system.node.inter_rack_latency_s
    total, mem = _ring(op, message_bytes, group, bw, lat)
    return total, 0.0 if one else np.zeros_like(mem), mem


def p2p(system: SystemSpec, message_bytes, inter_node: bool = False):
    message_bytes = np.asarray(message_bytes, dtype=float)
    bw = system.node.inter_node_bw if inter_node else system.node.intra_node_bw
    mem = message_bytes / bw * 1e3
    return mem + system.node.p2p_latency_s * 1e3, np.zeros_like(mem), mem


# --------------------------------------------------------------------------------------------
# Mixture of experts
# --------------------------------------------------------------------------------------------


def moe_touched_experts(num_tokens, topk: int, experts: int, moe_ep: int):
    """Expected number of this rank's experts that receive at least one token.

    Under uniform routing a token picks ``topk`` distinct experts out of ``experts``, so a given
    expert is missed by one token with probability ``1 - topk/experts`` and by all ``T`` tokens
    with probability ``(1 - topk/experts)^T``; the rank holds ``experts/moe_ep`` experts. (This is
    the without-replacement form of ``1 - (1 - 1/E)^(T*topk)``: one token touches exactly
    ``topk`` experts, not slightly fewer.)
    """
    t = np.asarray(num_tokens, dtype=float)
    e = float(experts)
    e_local = e / float(moe_ep)
    p_hit = min(float(topk) / e, 1.0)
    if p_hit >= 1.0:
        return np.full(t.shape, e_local)
    return e_local * -np.expm1(t * np.log1p(-p_hit))


def moe(
    system: SystemSpec,
    compute_dtype: str,
    weight_bytes: float,
    num_tokens,
    hidden: int,
    inter: int,
    topk: int,
    experts: int,
    moe_tp: int,
    moe_ep: int,
    gated: bool = True,
):
    """Routed-expert block (gate/up + activation + down) on one rank of a ``moe_tp x moe_ep`` group.

    ``num_tokens`` = tokens entering the MoE block (before dispatch). Under balanced routing each
    EP rank computes ``rows = num_tokens * topk / moe_ep`` expert rows, each through a per-expert
    FFN of width ``inter / moe_tp``:

    * math = ``2 * rows * hidden * inter_local * (3 if gated else 2)`` FLOPs (gate+up+down, or
      up+down for a non-gated e.g. relu^2 expert);
    * memory = weights of the experts actually touched on this rank
      (:func:`moe_touched_experts` x ``hidden * inter_local * (3|2) * weight_bytes``) plus
      activations: the input rows at the compute dtype's width, the output rows in bf16, and the
      intermediate ``rows x inter_local`` written and read once in bf16.
    """
    t = np.asarray(num_tokens, dtype=float)
    mats = 3.0 if gated else 2.0
    inter_local = float(inter) / float(moe_tp)
    rows = t * float(topk) / float(moe_ep)
    flops = 2.0 * rows * hidden * inter_local * mats
    touched = moe_touched_experts(t, topk, experts, moe_ep)
    act = ACT_BYTES.get(compute_dtype, 2.0)
    weights = touched * hidden * inter_local * mats * weight_bytes
    acts = rows * (hidden * act + hidden * 2.0 + 2.0 * inter_local * 2.0)
    return _finish(system, flops, weights + acts, compute_dtype)


def moe_a2a(system: SystemSpec, num_tokens, hidden: int, topk: int, ep: int, dispatch_bytes: float = 2.0, combine_bytes: float = 2.0):
    """Expert-parallel all-to-all, dispatch + combine, for ``num_tokens`` tokens on one rank.

    Dispatch sends each token's hidden vector to the ranks of its ``topk`` experts
    (``num_tokens * topk * hidden`` elements at ``dispatch_bytes``, of which ``(ep-1)/ep`` leave
    the rank); combine returns the expert outputs (same count at ``combine_bytes``, bf16). Each
    direction is one ring all-to-all (:func:`collective`), so each pays one link latency.
    """
    t = np.asarray(num_tokens, dtype=float)
    elems = t * float(topk) * float(hidden)
    d_total, _, d_mem = collective(system, "alltoall", elems * dispatch_bytes, ep)
    c_total, _, c_mem = collective(system, "alltoall", elems * combine_bytes, ep)
    return d_total + c_total, np.zeros_like(d_mem), d_mem + c_mem


# --- DeepSeek-style multi-head latent attention (MLA) -------------------------------------------


def _mla_time(system: SystemSpec, gemm_flops, gemm_compute: str, attn_flops, attn_compute: str, nbytes):
    """Roofline with two compute dtypes: projection GEMMs at the weight quant's compute dtype,
    the attention core at its own (bf16 in every engine the pack measures)."""
    gemm_flops = np.asarray(gemm_flops, dtype=float)
    attn_flops = np.asarray(attn_flops, dtype=float)
    math = attn_flops / _flops(system, attn_compute) * 1e3
    if np.any(gemm_flops):
        math = math + gemm_flops / _flops(system, gemm_compute) * 1e3
    mem = np.asarray(nbytes, dtype=float) / system.gpu.effective_mem_bw * 1e3
    total = np.maximum(math, mem) + system.gpu.mem_latency_s * 1e3
    return total, math, mem


def _mla_projection_weights(heads, hidden, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim) -> float:
    """Weight elements of the projections every new token goes through on one GPU: the query path
    (q_a + q_b, or q_proj without a q LoRA), kv_a (hidden -> latent + rope key) and o_proj.
    ``heads`` is the per-GPU head count (q_b / o_proj are split by heads, q_a / kv_a replicated)."""
    qk = float(qk_nope_head_dim + qk_rope_head_dim)
    if q_lora_rank:
        w_q = float(hidden) * q_lora_rank + float(q_lora_rank) * heads * qk
    else:
        w_q = float(hidden) * heads * qk
    return w_q + float(hidden) * (kv_lora_rank + qk_rope_head_dim) + float(heads) * v_head_dim * hidden


def mla_context(
    system: SystemSpec, batch, isl, prefix, heads: int, hidden: int, q_lora_rank: int | None,
    kv_lora_rank: int, qk_nope_head_dim: int, qk_rope_head_dim: int, v_head_dim: int,
    weight_bytes: float, kv_bytes: float, gemm_compute_dtype: str = "bfloat16",
    attn_compute_dtype: str = "bfloat16", projections: bool = True,
):
    """MLA prefill of ``isl`` new tokens per request after ``prefix`` cached ones (one layer, one GPU).

    Standard (non-absorbed) form, as every engine runs prefill:

    * projections (``projections=True``): q path + kv_a + o_proj on the ``batch*isl`` new tokens,
      and the kv_b up-projection (latent -> per-head nope key and value) on every key token
      (``batch*(isl+prefix)``: a cached prefix is stored as latent and must be expanded again);
    * attention: causal pairs x heads x ``2*(qk_nope+qk_rope) + 2*v_head`` FLOPs (QK^T and PV);
    * memory: projection weights at ``weight_bytes``, the hidden states in and out (bf16), the
      expanded q/k/v and the attention output (bf16), the latent cache written for the new tokens
      and read for the prefix (``kv_lora_rank + qk_rope_head_dim`` per token at ``kv_bytes``).

    ``projections=False`` gives the attention core alone (what ``context_mla_perf`` times).
    """
    batch, isl, prefix = (np.asarray(a, dtype=float) for a in (batch, isl, prefix))
    qk = float(qk_nope_head_dim + qk_rope_head_dim)
    latent = float(kv_lora_rank + qk_rope_head_dim)
    new = batch * isl
    keys = batch * (isl + prefix)
    pairs = batch * _attended(isl, prefix, 0)
    attn_flops = 2.0 * pairs * heads * (qk + v_head_dim)
    nbytes = 2.0 * (new * heads * qk + keys * heads * (qk + v_head_dim) + new * heads * v_head_dim)
    nbytes = nbytes + new * latent * kv_bytes + batch * prefix * latent * kv_bytes
    gemm_flops = np.zeros_like(attn_flops)
    if projections:
        w_tok = _mla_projection_weights(heads, hidden, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim)
        w_kvb = float(kv_lora_rank) * heads * (qk_nope_head_dim + v_head_dim)
        gemm_flops = 2.0 * new * w_tok + 2.0 * keys * w_kvb
        nbytes = nbytes + (w_tok + w_kvb) * weight_bytes + 2.0 * 2.0 * new * hidden
    return _mla_time(system, gemm_flops, gemm_compute_dtype, attn_flops, attn_compute_dtype, nbytes)


def mla_generation(
    system: SystemSpec, batch, kv_len, heads: int, hidden: int, q_lora_rank: int | None,
    kv_lora_rank: int, qk_nope_head_dim: int, qk_rope_head_dim: int, v_head_dim: int,
    weight_bytes: float, kv_bytes: float, gemm_compute_dtype: str = "bfloat16",
    attn_compute_dtype: str = "bfloat16", projections: bool = True,
):
    """MLA decode of one token per request attending ``kv_len`` keys (one layer, one GPU).

    Absorbed form, as every engine runs decode: the per-head nope query is multiplied into the
    latent space (``q_nope @ W_UK``, the ``mla_gen_pre`` BMM), attention runs over the latent cache
    directly (per head and key: ``2*(kv_lora_rank+qk_rope)`` FLOPs for QK^T, ``2*kv_lora_rank``
    for PV) and the latent output is projected to ``v_head_dim`` (``@ W_UV``, ``mla_gen_post``).

    * projections (``projections=True``): q path + kv_a + o_proj + the two absorbed BMMs;
    * memory: those weights at ``weight_bytes``, the latent cache read (``batch*kv_len*
      (kv_lora_rank+qk_rope)*kv_bytes`` — one latent vector per token shared by all heads),
      the absorbed query and latent output (bf16), the hidden states in and out (bf16).

    ``projections=False`` gives the attention core alone (what ``generation_mla_perf`` times).
    """
    batch, kv_len = np.asarray(batch, dtype=float), np.asarray(kv_len, dtype=float)
    latent = float(kv_lora_rank + qk_rope_head_dim)
    attn_flops = 2.0 * batch * heads * kv_len * (2.0 * kv_lora_rank + qk_rope_head_dim)
    nbytes = batch * kv_len * latent * kv_bytes + 2.0 * batch * heads * (latent + kv_lora_rank)
    gemm_flops = np.zeros_like(attn_flops)
    if projections:
        w_tok = _mla_projection_weights(heads, hidden, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim)
        w_bmm = float(heads) * kv_lora_rank * (qk_nope_head_dim + v_head_dim)
        gemm_flops = 2.0 * batch * (w_tok + w_bmm)
        nbytes = nbytes + (w_tok + w_bmm) * weight_bytes + 2.0 * 2.0 * batch * hidden
    return _mla_time(system, gemm_flops, gemm_compute_dtype, attn_flops, attn_compute_dtype, nbytes)


def mla_bmm(system: SystemSpec, compute_dtype: str, weight_bytes: float, num_tokens, heads: int, k: int, n: int):
    """One absorbed MLA BMM: ``heads`` independent ``(num_tokens x k) @ (k x n)`` products
    (``mla_gen_pre``: k = qk_nope_head_dim, n = kv_lora_rank; ``mla_gen_post``: k = kv_lora_rank,
    n = v_head_dim). Activations in and out are bf16, weights at ``weight_bytes``."""
    t = np.asarray(num_tokens, dtype=float)
    flops = 2.0 * t * heads * k * n
    nbytes = float(heads) * k * n * weight_bytes + 2.0 * t * heads * (k + n)
    return _finish(system, flops, nbytes, compute_dtype)


# --- Gated DeltaNet (GDN) linear attention (Qwen3-Next / Qwen3.5) --------------------------------

#: chunk length of the chunked gated-delta-rule prefill kernels (FLA's ``chunk_gated_delta_rule``
#: and FlashInfer's port both use 64-token chunks)
GDN_CHUNK = 64
GDN_PHASES = ("context", "generation")


def gdn(
    system: SystemSpec, phase: str, batch, seq_len, num_k_heads: int, head_k_dim: int,
    num_v_heads: int, head_v_dim: int, conv_kernel: int = 4, chunk: int = GDN_CHUNK,
    state_bytes: float = 4.0, compute_dtype: str = "bfloat16",
):
    """GDN core of one layer on one GPU: the short causal conv over the mixed q/k/v channels plus
    the gated delta-rule scan (what the ``gdn_perf`` rows time). The in/out projections, the
    gating projections and the output norm are not included (they are GEMMs / elementwise ops).

    Head counts are per GPU; ``hk``/``hv`` query-key / value heads of ``dk``/``dv`` dims, the
    conv runs over ``conv_dim = 2*hk*dk + hv*dv`` channels; ``tokens = batch * seq_len``.

    ``"context"`` (chunked delta rule, chunks of ``C = chunk`` tokens, per token and value head):

    * FLOPs ``6*dk*dv`` for the inter-chunk state terms (``q @ S``, ``w @ S``, the state update
      ``k^T @ u``) plus ``C*(6*dk + 4*dv)`` for the intra-chunk products (``k k^T``, ``q k^T``,
      ``A @ (k*beta)``, ``A @ (v*beta)``, ``attn @ u``) — linear in tokens, ~11 x dk x dv at
      dk = dv = 128; plus ``2*K*conv_dim`` per token for the conv;
    * bytes: conv input read and output written (bf16), q/k/v read (bf16), gate and beta
      (fp32 + bf16 per value head), output written (bf16), the per-chunk states materialised
      and re-read (bf16, ``hv*dk*dv`` per chunk) and the recurrent state read and written once
      per request (``state_bytes``, fp32).

    ``"generation"`` (recurrent, ``seq_len`` tokens per request, normally 1):

    * FLOPs ``7*dk*dv`` per token and value head (decay, ``k^T S``, the delta outer-product
      update, ``q^T S``) plus the conv;
    * bytes: the fixed-size recurrent state read and written once per request
      (``2*hv*dk*dv*state_bytes``: the term that dominates), the conv state read and written
      (``(K-1)*conv_dim`` bf16), q/k/v/gate/beta in and the output out per token.

    Neither phase depends on the tokens already cached: the state is fixed-size. Math time uses
    the tensor-core peak of ``compute_dtype`` (the recurrent decode runs on CUDA cores, but it is
    memory-bound by a wide margin, so the roofline stays the memory term).
    """
    if phase not in GDN_PHASES:
        raise InvalidConfigError(f"unknown GDN phase {phase!r}", available=GDN_PHASES)
    batch, seq_len = np.asarray(batch, dtype=float), np.asarray(seq_len, dtype=float)
    hk, dk, hv, dv = float(num_k_heads), float(head_k_dim), float(num_v_heads), float(head_v_dim)
    K = float(conv_kernel)
    tokens = batch * seq_len
    conv_dim = 2.0 * hk * dk + hv * dv
    state = hv * dk * dv
    conv_flops = tokens * 2.0 * K * conv_dim
    # per token: conv in + out (bf16), q/k/v re-read by the scan, gate (fp32) + beta, output
    io_per_token = 2.0 * conv_dim * 2.0 + conv_dim * 2.0 + hv * (4.0 + 2.0) + hv * dv * 2.0
    conv_weights = conv_dim * K * 2.0
    if phase == "context":
        c = float(chunk)
        flops = tokens * hv * (6.0 * dk * dv + c * (6.0 * dk + 4.0 * dv)) + conv_flops
        chunks = batch * np.ceil(seq_len / c)
        nbytes = (tokens * io_per_token + chunks * state * 2.0 * 2.0
                  + batch * 2.0 * state * state_bytes + conv_weights)
    else:
        flops = tokens * hv * 7.0 * dk * dv + conv_flops
        nbytes = (tokens * io_per_token + batch * 2.0 * state * state_bytes
                  + batch * 2.0 * (K - 1.0) * conv_dim * 2.0 + conv_weights)
    return _finish(system, flops, nbytes, compute_dtype)



# --- Mamba2 (Nemotron-H) -------------------------------------------------------------------------

MAMBA2_PHASES = ("context", "generation")


def _mamba2_phase(phase: str) -> None:
    if phase not in MAMBA2_PHASES:
        raise InvalidConfigError(f"unknown Mamba2 phase {phase!r}", available=MAMBA2_PHASES)


def mamba2_conv_channels(nheads, head_dim, n_groups, d_state):
    """Channels of a Mamba2 layer's causal conv on one GPU: the SSM input ``x``
    (``nheads x head_dim``) and the ``B`` and ``C`` projections (``n_groups x d_state`` each).
    Numbers or arrays (a float for numbers)."""
    c = np.asarray(nheads, dtype=float) * head_dim + 2.0 * np.asarray(n_groups, dtype=float) * d_state
    return float(c) if c.ndim == 0 else c


def mamba2_conv(system: SystemSpec, phase: str, batch, seq_len, channels: float, conv_kernel: int = 4,
                act_bytes: float = 2.0, compute_dtype: str = "bfloat16"):
    """Depthwise causal conv1d of one Mamba2 layer on one GPU (what ``mamba2_perf`` times:
    ``causal_conv1d_fn`` in context, ``causal_conv1d_update`` in generation), over ``channels``
    (:func:`mamba2_conv_channels`) and ``tokens = batch * seq_len``:

    * FLOPs ``2 * K * channels`` per token (``K = conv_kernel`` taps);
    * bytes: every token's inputs read and outputs written (``act_bytes``, bf16), the
      ``channels x K`` weights (bf16) once, and in generation the conv state (the last ``K - 1``
      inputs of every channel) read and written per request."""
    _mamba2_phase(phase)
    batch, seq_len = np.asarray(batch, dtype=float), np.asarray(seq_len, dtype=float)
    C, K = float(channels), float(conv_kernel)
    tokens = batch * seq_len
    flops = tokens * 2.0 * K * C
    nbytes = tokens * 2.0 * C * act_bytes + C * K * 2.0
    if phase == "generation":
        nbytes = nbytes + batch * 2.0 * (K - 1.0) * C * act_bytes
    return _finish(system, flops, nbytes, compute_dtype)


def mamba2_ssm(system: SystemSpec, phase: str, batch, seq_len, nheads: int, head_dim: int, d_state: int,
               n_groups: int, chunk: int = 128, state_bytes: float = 4.0, compute_dtype: str = "bfloat16"):
    """The selective-state-space core of one Mamba2 layer on one GPU (not in ``mamba2_perf``):
    ``H = nheads`` heads of ``P = head_dim`` channels, each with a ``P x N`` state
    (``N = d_state``), ``G = n_groups`` groups sharing ``B`` and ``C``; ``tokens = batch * seq_len``.

    ``"context"``: the chunked state-space-dual scan (chunks of ``Q = chunk`` tokens). FLOPs per
    token: ``2*G*Q*N`` for the intra-chunk ``C B^T`` scores, ``2*H*Q*P`` to apply them to ``x``,
    ``2*H*N*P`` for the chunk states (``B^T x``) and ``2*H*N*P`` for their output (``C S``).
    Bytes: per token ``x`` read and ``y`` written (bf16), ``B`` and ``C`` read (bf16), ``dt`` read
    (fp32); per chunk the ``H x P x N`` chunk state written and read back (``state_bytes``); per
    request the final state written (``state_bytes``, fp32 by default: ``mamba_ssm_cache_dtype``).

    ``"generation"``: the recurrent state update (``selective_state_update``), ``seq_len`` tokens
    per request (normally 1): per token ``6*H*P*N`` FLOPs (decay, ``dt B x`` outer product and
    add, ``C S``); bytes: the fixed-size state read and written once per request
    (``2*H*P*N*state_bytes``: the dominant term), ``x`` / ``z`` / ``B`` / ``C`` / ``dt`` in and
    ``y`` out per token.

    Neither phase depends on tokens cached before the new ones: the state is fixed-size. Math time
    uses the tensor-core peak of ``compute_dtype`` (the update runs on CUDA cores, but the
    system files give no CUDA-core peak; it is memory-bound by a wide margin either way)."""
    _mamba2_phase(phase)
    batch, seq_len = np.asarray(batch, dtype=float), np.asarray(seq_len, dtype=float)
    H, P, N, G = float(nheads), float(head_dim), float(d_state), float(n_groups)
    tokens = batch * seq_len
    state = H * P * N
    io_per_token = 2.0 * H * P * 2.0 + 2.0 * G * N * 2.0 + H * 4.0
    if phase == "context":
        Q = float(chunk)
        flops = tokens * (2.0 * G * Q * N + 2.0 * H * Q * P + 4.0 * H * N * P)
        chunks = batch * np.ceil(seq_len / Q)
        nbytes = tokens * io_per_token + chunks * 2.0 * state * state_bytes + batch * state * state_bytes
    else:
        flops = tokens * 6.0 * state
        nbytes = tokens * (io_per_token + H * P * 2.0) + batch * 2.0 * state * state_bytes
    return _finish(system, flops, nbytes, compute_dtype)
