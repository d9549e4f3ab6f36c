"""Pareto frontier and recommendation over evaluated deployments.

A deployment trades speed for one user (tokens/s/user, i.e. 1000 / TPOT) against cost (tokens/s
per GPU). The frontier keeps every point no other point beats on both; the recommendation is the
most tokens/s per GPU among the points that meet the latency targets (ties: fewer GPUs, then the
lower TTFT).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def pareto_front(per_user: Sequence[float], per_gpu: Sequence[float]) -> np.ndarray:
    """Indices of the points not dominated in (per_user, per_gpu), both to maximise, sorted by
    per_user ascending. A point equal to another on both is kept once (the first)."""
    u = np.asarray(per_user, float)
    g = np.asarray(per_gpu, float)
    if u.shape != g.shape:
        raise ValueError("per_user and per_gpu must have the same length")
    order = np.lexsort((-g, -u))  # per_user descending, then per_gpu descending
    # in that order, a point is kept when it has more per_gpu than every point before it (a NaN
    # is never kept, nor does it count as a best so far)
    gs = g[order]
    best_before = np.fmax.accumulate(np.concatenate(([-np.inf], gs[:-1]))) if gs.size else gs
    keep = order[gs > best_before].tolist()
    return np.array(sorted(keep, key=lambda i: (u[i], -g[i])), dtype=int)


def meets(ttft_ms: float | None, tpot_ms: float | None, ttft_max: float | None, tpot_max: float | None) -> bool:
    """Whether a result meets the targets (a missing target is no constraint; a missing value
    fails any target)."""
    if ttft_max is not None and (ttft_ms is None or ttft_ms > ttft_max):
        return False
    if tpot_max is not None and (tpot_ms is None or tpot_ms > tpot_max):
        return False
    return True


def recommend(per_gpu: Sequence[float], gpus: Sequence[int], ttft: Sequence[float], ok: Sequence[bool]) -> int | None:
    """Index of the best deployment among those with ``ok``: most tokens/s per GPU, then fewer
    GPUs, then lower TTFT; None when none meets the targets."""
    idx = np.flatnonzero(np.asarray(ok, dtype=bool))
    if not idx.size:
        return None
    g, n, t = (np.asarray(v, dtype=float)[idx] for v in (per_gpu, gpus, ttft))
    if np.isnan(g).any() or np.isnan(t).any():  # Python's ordering of NaN in tuples, as it stands
        return int(min(idx.tolist(), key=lambda i: (-per_gpu[i], gpus[i], ttft[i], i)))
    return int(idx[np.lexsort((idx, t, n, -g))[0]])
