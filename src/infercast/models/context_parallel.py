"""Context parallelism (CP): which models and layouts take it, and the ops it adds to a plan.

A context-parallel replica is ``cp`` copies of one ``tp x attention_dp x pp`` layout (weights
replicated on every copy), ``gpus = tp x attention_dp x pp x cp``. What each copy (a *CP rank*)
does, and what this module adds to the op plan for it:

* **Prefill** (a sequence split, as vLLM's prefill context parallelism ``-pcp``, SGLang's
  ``--attn-cp-size`` and TensorRT-LLM's ``context_parallel_size``): a prompt's new tokens are split
  over the CP ranks in ``2 x cp`` equal chunks, rank ``r`` holding chunks ``r`` and
  ``2cp - 1 - r`` (the zigzag layout that balances causal attention). Token-wise ops (GEMMs,
  MoE, norms, TP collectives) run on ``isl / cp`` tokens per rank; attention per rank is costed
  by :mod:`infercast.engine.context_parallel`. Before a layer's attention, each rank gathers the
  K/V (GQA: ``2 x kv_heads x head_dim`` per token per GPU; MLA: the ``kv_lora_rank +
  qk_rope_head_dim`` latent) of the whole sequence from the other ranks: one all-gather over the
  ``cp`` GPUs that hold the same heads, per attention layer (op ``cp_kv_exchange_<attention op>``,
  kind ``cp_exchange``, costed from the pack's NCCL ``all_gather`` table at a message of
  ``(isl + prefix) x elements`` per sequence). Whether it overlaps with attention is
  ``ParallelConfig.cp_overlap`` (default: not; the exchange precedes the attention it feeds, as
  an all-gather of the KV does).
* **Decode** (the KV cache stays sharded, as vLLM's decode context parallelism and TensorRT-LLM's
  Helix): every CP rank runs the step's token-wise ops on the whole decode batch (the ranks are
  copies), attention reads the ``1 / cp`` of each sequence's KV it holds, and the partial
  outputs and their log-sum-exp are combined over the CP ranks by one all-gather per attention
  layer (op ``cp_combine_<attention op>``, kind ``cp_combine``: ``cp x (heads x head_dim +
  2 x heads)`` 16-bit elements per decoding token, the LSE in fp32). Helix's re-use of the CP
  GPUs as tensor-parallel ranks of the FFN is not modelled: the FFN runs replicated.

Not modelled (a typed error says so): sparse attention (DSA, MiniMax MSA), linear-attention and
state-space layers (Gated DeltaNet, Mamba) whose per-request state a sequence split would have to
pass along, context parallelism beside attention data parallelism, and CP groups that span
NVLink domains (checked where the system is known, :mod:`infercast.engine.context_parallel`).
"""

from __future__ import annotations

from dataclasses import replace

from ..data.quant import KV_BYTES
from ..errors import InvalidConfigError, UnsupportedModelError
from .spec import ModelSpec


def check_context_parallel(spec: ModelSpec, par, gpus_per_node: int | None = None) -> None:
    """Refuse a context-parallel layout infercast does not model (see the module docstring)."""
    if par.cp <= 1:
        return
    why = None
    if spec.sparse_attention:
        why = "DSA sparse attention (its indexer's top-k over a split sequence)"
    elif getattr(spec, "dsv4", None) is not None:
        why = "DeepSeek-V4's compressed sparse attention (its compressors and top-k over a split sequence)"
    elif spec.msa_layers:
        why = "MiniMax sparse attention layers"
    elif getattr(spec, "kimi", None) is not None:
        why = "Kimi Delta Attention linear-attention layers (a per-request state a sequence split must pass along)"
    elif spec.gdn is not None:
        why = "Gated-DeltaNet linear-attention layers (a per-request state a sequence split must pass along)"
    elif spec.mamba is not None or spec.family == "nemotron_h":
        why = "Mamba state-space layers (a per-request state a sequence split must pass along)"
    if why:
        raise UnsupportedModelError(f"context parallelism (--cp {par.cp}) is not modelled for {spec.resolved_id}: {why}",
                                    "run it with --cp 1")
    if par.attention_dp > 1:
        raise InvalidConfigError(f"context parallelism (--cp {par.cp}) beside attention data parallelism "
                                 f"(--attention-dp {par.attention_dp}) is not modelled", "use one of the two")
    if gpus_per_node and par.tp * par.cp > gpus_per_node:
        raise InvalidConfigError(f"the context-parallel group (tp {par.tp} x cp {par.cp} GPUs) spans more than one "
                                 f"NVLink domain of {gpus_per_node} GPUs", "a CP exchange across nodes is not modelled")


def _exchange_elements(op) -> float:
    """16-bit elements of K/V one token brings to one GPU in the prefill exchange."""
    p = op.params
    kv = KV_BYTES[p["kv_quant"]] / 2.0  # the comm tables count 16-bit elements; an fp8 cache moves its bytes
    if op.kind == "mla":
        return (int(p["kv_lora_rank"]) + int(p["qk_rope_head_dim"])) * kv
    return 2.0 * int(p["kv_heads"]) * int(p["head_dim"]) * kv


def _combine_elements(op, cp: int) -> float:
    """16-bit elements one decoding token's partial attention outputs and LSE make after the
    all-gather over ``cp`` ranks (each rank's heads x head size, plus an fp32 LSE per head)."""
    p = op.params
    heads = int(p["heads"])
    width = int(p["v_head_dim"]) if op.kind == "mla" else int(p["head_dim"])
    return cp * (heads * width + 2.0 * heads)


def with_context_parallel(plan):
    """``plan`` (built for one CP rank, ``plan.parallel.cp`` set) with the CP exchange and combine
    ops added after each attention op: ``cp_kv_exchange_<name>`` (prefill K/V all-gather) for the
    main model's attention ops, ``cp_combine_<name>`` (decode partial-output all-gather) for
    every attention op, MTP drafts included (their phase kept)."""
    from .plan import PlanOp

    cp = plan.parallel.cp
    ops = []
    for o in plan.ops:
        ops.append(o)
        if o.kind not in ("attention", "mla"):
            continue
        if o.phase != "decode":
            ops.append(PlanOp(f"cp_kv_exchange_{o.name}", "cp_exchange", o.count, phase="both",
                              params={"elements_per_token": _exchange_elements(o), "group": cp,
                                      "overlap": bool(plan.parallel.cp_overlap), "attention": o.name}))
        ops.append(PlanOp(f"cp_combine_{o.name}", "cp_combine", o.count, phase=o.phase,
                          params={"elements_per_token": _combine_elements(o, cp), "group": cp, "attention": o.name}))
    return replace(plan, ops=tuple(ops))
