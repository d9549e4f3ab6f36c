"""Memory of a speculative draft network (:mod:`infercast.models.speculative`) on one GPU.

* ``draft_model``: the draft model's weights and KV cache per token as :mod:`infercast.serving.memory`
  counts a model's, at the draft's own quant and TP size. Its KV blocks come from the same pool as
  the target's (vLLM and SGLang allocate the draft's layers beside the target's), so the bytes per
  token add up.
* ``eagle`` / ``eagle3``: the head's decoder layer(s) (its weights at the head's GEMM quant, split
  over the draft TP), its ``fc`` (``2`` or ``3 x hidden x hidden``, bf16, counted whole on every
  GPU), for EAGLE-3 the wider QKV input rows (``2 x hidden``) and its own LM head over its draft
  vocabulary (bf16, vocab-parallel); the embedding (and EAGLE-1's LM head) are the target's, shared.
  KV: the head's layer(s) per token.
* ``mtp`` (counted by :func:`infercast.serving.memory.memory_breakdown`'s ``mtp_layers``) and
  ``ngram`` (no network): nothing here.
"""

from __future__ import annotations

from dataclasses import replace

from ..data.quant import WEIGHT_BYTES
from ..models.plan import Plan, kv_heads_per_gpu
from .memory import kv_bytes_per_token, weight_bytes_per_gpu


def draft_memory(plan: Plan) -> tuple[float, float]:
    """(weight bytes per GPU, KV bytes per token per GPU) of ``plan``'s draft network."""
    d, dpar, sd = plan.draft, plan.draft_parallel, plan.spec_decode
    if d is None or sd.nextn == 0 or sd.method in ("mtp", "ngram"):
        return 0.0, 0.0
    kv = kv_bytes_per_token(d, dpar)
    if sd.method == "draft_model":
        return weight_bytes_per_gpu(d, dpar), kv
    h, tp = d.hidden, dpar.tp
    layers = weight_bytes_per_gpu(replace(d, vocab=0, vision_params=0), dpar)  # no embedding / LM head
    fc = (3 if sd.method == "eagle3" else 2) * h * h * 2.0
    extra = 0.0
    if sd.method == "eagle3":
        qkv_cols = (d.num_heads // tp + 2 * kv_heads_per_gpu(d, tp)) * d.head_dim
        extra = d.num_layers * h * qkv_cols * WEIGHT_BYTES[d.quant.attention_gemm] + d.vocab * h * 2.0 / tp
    return layers + fc + extra, kv
