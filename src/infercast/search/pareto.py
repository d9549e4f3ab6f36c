"""Pareto frontier and recommendation over evaluated deployments.

A deployment trades speed for one user (tokens/s/user, i.e. 1000 / TPOT) against cost (tokens/s
per GPU). The frontier keeps every point no other point beats on both (to :data:`TIE_DIGITS`
significant digits; of equal points, the one with the fewest GPUs); the recommendation is the
most tokens/s per GPU among the points that meet the latency targets (ties: fewer GPUs, then the
lower TTFT); :func:`ranked` lists the best few distinct deployments that meet them (a search's top
table and the deployments its launch files are written for).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


#: significant digits to which :func:`pareto_front` compares the two metrics: deployments that
#: are scaled copies of each other (twice the workers at twice the clients) have the same metrics
#: up to rounding, and which of them stands on the frontier must not depend on that rounding
TIE_DIGITS = 10


def _snapped(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to :data:`TIE_DIGITS` significant digits (0, infinities and NaN as they are)."""
    out = x.copy()
    fine = np.isfinite(x) & (x != 0)
    e = np.floor(np.log10(np.abs(x[fine])))
    scale = 10.0 ** (TIE_DIGITS - 1 - e)
    out[fine] = np.round(x[fine] * scale) / scale
    return out


def pareto_front(per_user: Sequence[float], per_gpu: Sequence[float], gpus: Sequence[int] | None = None) -> np.ndarray:
    """Indices of the points not dominated in (per_user, per_gpu), both to maximise, compared to
    :data:`TIE_DIGITS` significant digits, sorted by per_user ascending. Of points equal on both
    (to those digits) one is kept: the one with the fewest ``gpus`` (when given), then the first."""
    u = _snapped(np.asarray(per_user, float))
    g = _snapped(np.asarray(per_gpu, float))
    if u.shape != g.shape:
        raise ValueError("per_user and per_gpu must have the same length")
    n = np.zeros(u.shape) if gpus is None else np.asarray(gpus, float)
    if n.shape != u.shape:
        raise ValueError("gpus must have one value per point")
    # only a point with at least the per_gpu of every point of more per_user can stand on the
    # frontier: those few are ordered below (a search has tens of thousands of points)
    pts = _not_beaten(u, g)
    u, g, n = u[pts], g[pts], n[pts]
    # per_user descending, then per_gpu descending, then fewer GPUs, then the first
    order = np.lexsort((pts, n, -g, -u))
    # in that order, a point is kept when it has more per_gpu than every point before it (a NaN
    # is never kept, nor does it count as a best so far)
    gs = g[order]
    best_before = np.fmax.accumulate(np.concatenate(([-np.inf], gs[:-1]))) if gs.size else gs
    keep = order[gs > best_before].tolist()
    return pts[np.array(sorted(keep, key=lambda i: (u[i], -g[i])), dtype=int)]


def _not_beaten(u: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Positions, ascending, of the points whose ``g`` is at least that of every point of
    strictly greater ``u`` (NaN ``g``: never; NaN ``u`` comes last, as in a sort): a superset of
    the frontier, whichever way ties of equal ``u`` are broken."""
    order = np.argsort(-u)  # (the order within a run of equal u does not matter)
    us, gs = u[order], g[order]
    if not us.size:
        return order
    before = np.fmax.accumulate(np.concatenate(([-np.inf], gs[:-1])))  # the most g before each, in decreasing u
    starts = np.concatenate(([True], ~(us[1:] == us[:-1])))  # where each run of equal u starts
    own_run = np.maximum.accumulate(np.where(starts, np.arange(us.size), 0))
    return np.sort(order[gs >= before[own_run]])


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
    GPUs, then lower TTFT (the two metrics compared to :data:`TIE_DIGITS` significant digits, as
    on the frontier), then the first; None when none meets the targets."""
    idx = np.flatnonzero(np.asarray(ok, dtype=bool))
    if not idx.size:
        return None
    g, n, t = (np.asarray(v, dtype=float)[idx] for v in (per_gpu, gpus, ttft))
    if np.isnan(g).any() or np.isnan(t).any():  # Python's ordering of NaN in tuples, as it stands
        return int(min(idx.tolist(), key=lambda i: (-per_gpu[i], gpus[i], ttft[i], i)))
    g = _snapped(g)
    top = g == g.max()  # the most tokens/s per GPU; among those, fewer GPUs, lower TTFT, the first
    idx, t, n = idx[top], t[top], n[top]
    return int(idx[np.lexsort((idx, _snapped(t), n))[0]])


def ranked(candidates: list, top: int) -> list:
    """The ``top`` best *distinct deployments* that meet the targets, most tokens/s per GPU first:
    each layout (an aggregated replica's layout, or a disaggregated deployment's prefill and
    decode layouts with their worker counts; per backend when a search ranked several) appears
    once, at its concurrency with the most tokens/s per GPU (the earliest evaluated on a tie), so
    the top rows are different deployments rather than one layout at several client counts.
    ``candidates``: a list, or a search's :class:`~infercast.search.candidates.Candidates` (read
    by column: only the candidates looked at are made into objects)."""
    from .candidates import column_reader

    column = column_reader(candidates)
    meets, per_gpu = column("meets_targets"), column("tokens_per_s_per_gpu")
    idx = np.flatnonzero(np.asarray(meets, dtype=bool))
    g = np.asarray(per_gpu, dtype=float)[idx]
    if np.isnan(g).any():  # Python's ordering of NaN keys, as it stands
        return _distinct(candidates, sorted((i for i, m in enumerate(meets) if m), key=lambda i: -per_gpu[i]), top)[0]
    # the order of sorted() by -per_gpu (stable: ties in the candidates' order), made only as far as
    # needed: the best k, every point tied with the k-th included, are the order's first ones
    k = max(64, 32 * top)
    while True:
        if k < idx.size:
            sel = np.flatnonzero(-g <= np.partition(-g, k - 1)[k - 1])
        else:
            sel = np.arange(idx.size)
        out, complete = _distinct(candidates, idx[sel[np.argsort(-g[sel], kind="stable")]].tolist(), top)
        if complete or sel.size == idx.size:
            return out
        k *= 8


def _distinct(candidates, order: list, top: int) -> tuple[list, bool]:
    """(the first ``top`` candidates of ``order`` that are distinct deployments (:func:`ranked`),
    whether ``top`` of them were found)."""
    out: list = []
    seen: set = set()
    for i in order:
        c = candidates[i]
        key = (c.backend, c.layout)
        if key in seen:
            continue
        seen.add(key)
        out.append(c)
        if len(out) == top:
            return out, True
    return out, False
