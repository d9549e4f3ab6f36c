"""Per-rank attention of a context-parallel step (the plan side: :mod:`infercast.models.context_parallel`).

**Prefill, zigzag split.** ``isl`` new tokens after ``prefix`` cached ones are cut into ``2 cp``
chunks of ``c = isl / (2 cp)`` tokens; CP rank ``r`` holds chunks ``r`` and ``2 cp - 1 - r``.
Chunk ``j``'s queries attend causally to everything before them: the cached prefix and chunks
``0 .. j-1`` (``prefix + j c`` tokens) and themselves. That is exactly a context-attention query
of ``q_len = c`` new tokens on a cached prefix of ``prefix + j c`` tokens, i.e. ``kv_len = prefix
+ (j + 1) c``, which the context tables answer by the engine's prefix rule
(:func:`infercast.ops.attention.prefixed_context`: the causal attention over ``kv_len`` tokens
times the share of query-key pairs the ``c`` new tokens own, never below the ``c`` tokens alone).
A rank's attention is its two chunks' sum (two kernel calls: the fixed cost of one short call is
counted twice); the step waits for the slowest rank, the maximum over ``r``. The zigzag pairs
balance the query-key pairs exactly (``c (2 prefix + (2cp - 1) c) + c (c + 1)`` per rank);
the measured curves need not, hence the maximum. With ``cp = 1`` the two chunks are the two
halves of the prompt, which is not the unsplit prompt's cost: callers take this path only for
``cp > 1``.

A sliding-window layer (window ``w``) sees at most ``w`` tokens before a chunk: its chunk is
read with a cached prefix of ``min(prefix + j c, w)``.

**Decode.** Each rank holds ``1 / cp`` of every sequence's KV: a decode at KV length ``kv``
(the new token included) reads ``(kv - 1) / cp`` cached tokens per rank (at least 1), looked up
in the generation table at that length.
"""

from __future__ import annotations

import numpy as np


def zigzag_chunks(isl: float, prefix: float, cp: int) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    """Per CP rank, its two chunks as ``(q_len, cached tokens before the chunk)``."""
    c = isl / (2.0 * cp)
    return [((c, prefix + r * c), (c, prefix + (2 * cp - 1 - r) * c)) for r in range(cp)]


def zigzag_context(attend, batch, isl, prefix, cp: int):
    """``(latency, provenance)`` arrays of the slowest rank's context attention; ``attend(batch,
    q_len, cached)`` answers one chunk (arrays in, ``(latency, provenance)`` out)."""
    isl = np.asarray(isl, dtype=float)
    prefix = np.asarray(prefix, dtype=float)
    c = isl / (2.0 * cp)
    worst, prov = None, None
    for r in range(cp):
        va, pa = attend(batch, c, prefix + r * c)
        vb, pb = attend(batch, c, prefix + (2 * cp - 1 - r) * c)
        v = va + vb
        p = np.maximum(pa, pb)
        worst = v if worst is None else np.maximum(worst, v)
        prov = p if prov is None else np.maximum(prov, p)
    return worst, prov


def zigzag_context_scalar(attend, batch: float, isl: float, prefix: float, cp: int) -> float:
    """:func:`zigzag_context` of one shape, ``attend(batch, q_len, cached) -> ms``."""
    return max(attend(batch, a[0], a[1]) + attend(batch, b[0], b[1]) for a, b in zigzag_chunks(isl, prefix, cp))


def sharded_cached(kv_len, cp: int):
    """Cached tokens a decode reads on one CP rank at KV length ``kv_len`` (the new token included)."""
    return np.maximum((np.asarray(kv_len, dtype=float) - 1.0) / cp, 1.0)


def sharded_cached_scalar(kv_len: float, cp: int) -> float:
    return max((kv_len - 1.0) / cp, 1.0)
