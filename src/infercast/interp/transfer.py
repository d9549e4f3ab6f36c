"""Off-site transfer through utilisation.

A *site* is the fixed part of an op's shape (GEMM ``(n, k)``; attention ``(heads, kv_heads)``);
along a site's *curve* (``m``; ``batch x length``) the tables hold measured latencies. For a query
site that was not collected:

1. coordinates are compared in log2 space;
2. if the query lies inside the collected lattice and every bracketing corner (2^d sites) was
   collected, the corners are blended **multilinearly in log2 coordinates**;
3. otherwise the nearest collected sites (at most ``k``) within ``gate`` log2 units are blended
   by inverse squared distance; ties are broken by coordinates, ascending, so the answer is
   deterministic;
4. a query outside the lattice's hull is clamped to it first; the clamp distance must stay within
   ``beyond_gate`` (utilisation is then held from the hull, which is sound only where throughput is
   saturated — GEMM n/k beyond 65536 and the like);
5. what is blended is utilisation ``u = SOL / measured`` at the same curve position, and the answer
   is ``SOL(query) / u``. Outside the gates there is no answer: SILICON mode raises.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import combinations, product

import numpy as np

from .grid import Grid, median_rows
from .provenance import Prov

DEFAULT_GATE = 1.5  # log2 units (a factor of ~2.8 along one axis)
DEFAULT_BEYOND_GATE = 2.0  # clamp distance allowed outside the lattice hull
DEFAULT_K = 4


@dataclass(frozen=True)
class SiteChoice:
    indices: tuple[int, ...]
    weights: tuple[float, ...]
    how: str  # "exact" | "multilinear" | "idw"
    clamp_distance: float


def choose_sites(
    query: Sequence[float],
    sites: np.ndarray,
    gate: float = DEFAULT_GATE,
    beyond_gate: float = DEFAULT_BEYOND_GATE,
    k: int = DEFAULT_K,
    weights: Sequence[float] | None = None,
) -> SiteChoice | None:
    """``weights`` scale each coordinate's log2 distance (a larger weight makes donors that
    differ along that coordinate look further away)."""
    q = np.asarray(query, dtype=float)
    if len(sites) == 0:
        return None
    dist_w = 1.0 if weights is None else np.asarray(weights, dtype=float)
    sites = np.asarray(sites, dtype=float).reshape(len(sites), -1)
    if np.any(q <= 0) or np.any(sites <= 0):
        return None
    hit = np.flatnonzero(np.all(sites == q, axis=1))
    if len(hit):
        return SiteChoice((int(hit[0]),), (1.0,), "exact", 0.0)
    lq, ls = np.log2(q), np.log2(sites)
    lqc = np.clip(lq, ls.min(axis=0), ls.max(axis=0))
    clamp = float(np.linalg.norm((lq - lqc) * dist_w))
    if clamp > beyond_gate:
        return None
    # multilinear over bracketing corners
    index = {tuple(row): i for i, row in enumerate(ls.tolist())}
    per_dim = []
    for d in range(ls.shape[1]):
        vals = np.unique(ls[:, d])
        if lqc[d] in vals:
            per_dim.append(((float(lqc[d]), 1.0),))
            continue
        j = np.searchsorted(vals, lqc[d]) - 1
        lo, hi = vals[j], vals[j + 1]
        t = (lqc[d] - lo) / (hi - lo)
        per_dim.append(((float(lo), 1.0 - t), (float(hi), t)))
    corners, cweights, ok = [], [], True
    for combo in product(*per_dim):
        key = tuple(c for c, _ in combo)
        w = float(np.prod([wt for _, wt in combo]))
        if w == 0.0:
            continue
        if key not in index:
            ok = False
            break
        corners.append(index[key])
        cweights.append(w)
    if ok and corners:
        how = "multilinear" if clamp == 0.0 else "multilinear-held"
        return SiteChoice(tuple(corners), tuple(cweights), how, clamp)
    dist = np.linalg.norm((ls - lqc) * dist_w, axis=1)
    order = np.lexsort(tuple(ls[:, d] for d in reversed(range(ls.shape[1]))) + (dist,))
    chosen = [int(i) for i in order[:k] if dist[i] <= gate]
    if not chosen:
        return None
    w = np.array([1.0 / dist[i] ** 2 for i in chosen])
    w /= w.sum()
    return SiteChoice(tuple(chosen), tuple(float(x) for x in w), "idw", clamp)


def transfer_grid(
    choice: SiteChoice,
    site_grid: Callable[[int], Grid],
    query_sol: Callable[..., np.ndarray],
    site_labels: Sequence[str] = (),
) -> Grid:
    """Build the query site's grid from donor sites' grids through utilisation."""
    grids = [site_grid(i) for i in choice.indices]
    if choice.how == "exact":
        return grids[0]
    # evaluate on the union of the donors' axes (sorted, unique)
    naxes = len(grids[0].axes)
    axes = tuple(np.unique(np.concatenate([g.axes[a] for g in grids])) for a in range(naxes))
    mesh = np.meshgrid(*axes, indexing="ij")
    util = np.zeros(mesh[0].shape)
    prov = np.full(mesh[0].shape, int(Prov.TRANSFERRED), dtype=np.int8)
    for g, w in zip(grids, choice.weights):
        # a donor's curve may stop short of the union axes: there it is held (marked held) rather
        # than refused, since the other donors cover the point
        v, p = g(*mesh)
        util += w * (g.sol(*mesh) / v)
        prov = np.maximum(prov, p)
    values = query_sol(*mesh) / util
    if choice.how.endswith("held"):
        prov = np.maximum(prov, int(Prov.HELD)).astype(np.int8)
    return Grid(axes, values, prov, query_sol, tuple(site_labels), scales=grids[0].scales)


def consistent_subset(choice: SiteChoice, grids: Sequence, factor: float) -> SiteChoice:
    """Keep only donors that agree on utilisation (used by ops that opt in; others never call it).

    ``grids[j]`` is donor ``choice.indices[j]``'s grid as it would be blended (``axes``, ``sol``,
    ``__call__``). Two donors agree when the median of ``log(u_a / u_b)`` (``u = SOL / latency``)
    over the union of their axes is within ``log(factor)``. Of the subsets whose donors agree
    pairwise, the one with the largest total weight is kept (on a tie the larger subset, then the
    first in the choice's order) with its weights renormalised; ``how`` is kept. The choice is
    returned unchanged when ``factor <= 1``, it has one donor, or all its donors agree."""
    n = len(choice.indices)
    if factor <= 1.0 or choice.how == "exact" or n < 2:
        return choice
    axes = tuple(np.unique(np.concatenate([g.axes[a] for g in grids])) for a in range(len(grids[0].axes)))
    mesh = np.meshgrid(*axes, indexing="ij")
    logu = [np.log(np.asarray(g.sol(*mesh), dtype=float) / np.asarray(g(*mesh)[0], dtype=float)).ravel() for g in grids]
    limit = np.log(factor)
    agree = [[abs(float(median_rows(logu[a] - logu[b]))) <= limit for b in range(n)] for a in range(n)]
    if all(all(row) for row in agree):
        return choice
    w = np.asarray(choice.weights, dtype=float)
    best, best_w = (0,), -1.0
    for size in range(n, 0, -1):
        for sub in combinations(range(n), size):
            if all(agree[a][b] for a in sub for b in sub) and w[list(sub)].sum() > best_w + 1e-12:
                best, best_w = sub, float(w[list(sub)].sum())
    return replace(choice, indices=tuple(choice.indices[i] for i in best),
                   weights=tuple(float(w[i] / best_w) for i in best))


# ---- a curve's range extended by its sibling sites' trend ---------------------------------------
#: the nearest sibling sites (log2 site distance) whose trend a curve borrows beyond its edge
SIBLING_K = 8
#: the curve's own points nearest an edge (beyond it), or on each side of a hole (inside it), that
#: the siblings' trend is carried from (one estimate each, median of them): one point is as noisy
#: as the point itself, and a few more keep one disturbed run from moving the answer. Eight chosen by
#: leave-one-out (see docs/modelling-log.md, 'Sibling trend: own points and blend weight').
SIBLING_OWN_POINTS = 8
#: the weight of the siblings' estimate against the curve's own answer (log space) where both are
#: blended: in a hole (:func:`fill_holes_from_siblings`) and below the low edge where the two agree
#: within :data:`SIBLING_LOW_GATE` (:func:`extend_below_from_siblings`). Each misses by its own
#: noise; the siblings', carried from eight own points, is the better one. 0.6 chosen by
#: leave-one-out (see docs/modelling-log.md, 'Sibling trend: own points and blend weight').
SIBLING_WEIGHT = 0.6


def log_blend(own, siblings, weight: float = SIBLING_WEIGHT):
    """The weighted geometric mean ``own ** (1 - weight) * siblings ** weight`` (log-space blend)."""
    return np.exp((1.0 - weight) * np.log(own) + weight * np.log(siblings))


def siblings_by_distance(site: Sequence[float], sites: np.ndarray, exclude: int | None = None) -> np.ndarray:
    """Indices of ``sites`` (minus ``exclude``) ordered by log2 distance from ``site``, nearest first;
    ties in the order of ``sites`` (stable), so the order is deterministic."""
    ls = np.log2(np.asarray(sites, dtype=float).reshape(len(sites), -1))
    d = np.linalg.norm(ls - np.log2(np.asarray(site, dtype=float)), axis=1)
    order = np.argsort(d, kind="stable")
    return order[order != exclude] if exclude is not None else order


class Replayable:
    """An iterable over a lazy sequence that can be walked more than once: what was drawn from the
    source is kept and replayed (the sibling walks below each take only as far as they need)."""

    def __init__(self, source):
        self._it = iter(source)
        self._seen: list = []

    def __iter__(self):
        i = 0
        while True:
            if i < len(self._seen):
                yield self._seen[i]
            else:
                nxt = next(self._it, None)
                if nxt is None:
                    return
                self._seen.append(nxt)
                yield nxt
            i += 1


def _positions(sx, t: float) -> int | None:
    i = int(np.searchsorted(sx, t))
    return i if i < len(sx) and sx[i] == t else None


def fill_holes_from_siblings(
    x: np.ndarray,
    v: np.ndarray,
    sol: Callable,
    siblings,
    scales: tuple = (),
    k: int = SIBLING_K,
    own_points: int = SIBLING_OWN_POINTS,
    weight: float = SIBLING_WEIGHT,
) -> tuple[np.ndarray, np.ndarray]:
    """Values for the holes inside a measured 1-D curve: positions between its first and last
    points that most of its ``k`` nearest siblings measured and it did not (a lattice point its
    collection lost, or the point leave-one-out removes). Returns ``(positions, latencies)``,
    empty when there is none.

    Each hole gets two estimates: the curve's own, the grid of its measured points at that position
    (with the axis rules of ``scales``: :mod:`infercast.interp.grid`, e.g. the tile-step pair rule);
    and the siblings', the utilisation each of the curve's own points ``r`` nearest the hole (up to
    ``own_points`` on each side) carries there by the median ratio ``u_j(t) / u_j(r)`` of the ``k``
    nearest siblings that measured both, the median of those estimates (one disturbed own point
    does not move it). The answer is their weighted geometric mean (``weight`` on the siblings'):
    the own curve knows its level, the siblings know where a tile step falls at that position for
    shapes like it, and each estimate misses by its own noise (the held-out point's neighbours, one
    sibling's disturbed run).
    ``siblings`` as in :func:`extend_from_siblings` (nearest first, consumed lazily)."""
    x = np.asarray(x, dtype=float)
    v = np.asarray(v, dtype=float)
    empty = (np.zeros(0), np.zeros(0))
    if len(x) < 2:
        return empty
    sib = []
    for sx, sv, ssol in siblings:
        sx, sv = np.asarray(sx, dtype=float), np.asarray(sv, dtype=float)
        ok = ~np.isnan(sv) & (sv > 0)
        sib.append((sx[ok], sv[ok], ssol))
        if len(sib) >= k:
            break
    if not sib:
        return empty
    own = set(x.tolist())
    votes: dict[float, int] = {}
    for sx, _, _ in sib:
        for t in sx[(sx > x[0]) & (sx < x[-1])].tolist():
            if t not in own:
                votes[t] = votes.get(t, 0) + 1
    holes = np.array(sorted(t for t, c in votes.items() if 2 * c > len(sib)))
    if not len(holes):
        return empty
    grid = Grid((x,), v, np.zeros(len(x), np.int8), sol, scales=scales)
    own_v = np.asarray(grid(holes)[0], dtype=float)
    u_own = np.asarray(sol(x), dtype=float).reshape(-1) / v
    out_v = []
    for t, vo in zip(holes.tolist(), own_v.tolist()):
        j = int(np.searchsorted(x, t))
        logs = []
        near = slice(max(j - own_points, 0), j + own_points)
        for r, ur in zip(x[near].tolist(), u_own[near].tolist()):
            ratios = []
            for sx, sv, ssol in sib:
                it_, ir = _positions(sx, t), _positions(sx, r)
                if it_ is not None and ir is not None:
                    su = np.asarray(ssol(np.array([t, r])), dtype=float).reshape(-1) / np.array([sv[it_], sv[ir]])
                    ratios.append(np.log(su[0] / su[1]))
            if ratios:
                logs.append(np.log(ur) + float(median_rows(ratios)))
        if not logs:
            out_v.append(vo)
            continue
        sol_t = float(np.asarray(sol(np.array([t])), dtype=float).reshape(-1)[0])
        out_v.append(float(log_blend(vo, sol_t / np.exp(median_rows(logs)), weight)))
    return holes, np.asarray(out_v)


def extend_from_siblings(
    x: np.ndarray,
    v: np.ndarray,
    sol: Callable,
    siblings,
    k: int = SIBLING_K,
    own_points: int = SIBLING_OWN_POINTS,
    reach: float | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Extend a measured 1-D curve beyond its high edge with the trend of its sibling sites.

    ``x``/``v``: the curve's measured points (ascending); ``sol``: its speed of light;
    ``siblings``: an iterable of ``(x_j, v_j, sol_j)``, nearest first (see
    :func:`siblings_by_distance`; consumed lazily, only as far as needed). For each curve position
    ``t`` beyond ``x[-1]`` that a sibling measured, and each of the curve's last ``own_points``
    points ``r``, the utilisation ratio ``u_j(t) / u_j(r)`` of the ``k`` nearest siblings that
    measured both ``t`` and ``r`` gives the estimate ``u(r) * median(ratio)``; the median of those
    estimates is ``u(t)``, and the latency ``SOL(t) / u(t)`` is added with provenance
    :attr:`Prov.HELD`. ``reach`` (optional): the furthest position any sibling measured; a curve
    that reaches it is returned at once, without walking the siblings. Returns ``(x, v, prov)`` of the measured points (exact) and the added ones;
    unchanged when no sibling reaches beyond the edge.

    Why: a collected curve that stops short of its neighbours' range (TensorRT-LLM's GEMM tables
    end at m = 16384 for 42 of 483 shapes, at 32768 for the rest) otherwise holds or extrapolates
    its own last octave, which at the top of the m axis is two noisy points. The siblings measured
    how utilisation moves there, and the median over eight of them is steadier than any one
    curve's edge (``benchmarks.interp_loo``, GEMM hold-high; :mod:`infercast.interp.grid`).
    """
    x = np.asarray(x, dtype=float)
    v = np.asarray(v, dtype=float)
    prov = np.zeros(len(x), np.int8)
    if len(x) == 0 or (reach is not None and x[-1] >= reach):
        return x, v, prov
    add_x, add_v = _sibling_trend(x, v, sol, siblings, k, own_points, low=False)
    if not add_x:
        return x, v, prov
    return (np.concatenate([x, add_x]), np.concatenate([v, add_v]),
            np.concatenate([prov, np.full(len(add_x), int(Prov.HELD), np.int8)]))


#: Below a curve's low edge its siblings' trend (:func:`extend_below_from_siblings`) is taken only
#: where it departs from the curve's own edge rule by more than this (absolute natural log of the
#: ratio of the two latencies, 0.3: a factor of 1.35). Inside the gate the two are blended
#: (:data:`SIBLING_WEIGHT`) rather than the own rule kept. The own rule cannot see a regime such as
#: vLLM's fp8 batch-1 path (below). Gate and blend chosen by leave-one-out (see
#: docs/modelling-log.md, 'Sibling trend below the low edge').
SIBLING_LOW_GATE = 0.3


def extend_below_from_siblings(
    x: np.ndarray,
    v: np.ndarray,
    sol: Callable,
    siblings,
    own: Callable,
    floor: float | None = None,
    k: int = SIBLING_K,
    own_points: int = SIBLING_OWN_POINTS,
    gate: float | None = None,
    weight: float = SIBLING_WEIGHT,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Extend a measured 1-D curve below its low edge where its siblings measured a regime that its
    own points cannot show.

    ``x``/``v``/``sol``/``siblings`` as in :func:`extend_from_siblings`; ``own(t)``: the curve's
    own answer at ``t`` (its grid's low-edge rule, :mod:`infercast.interp.grid`); ``floor``: the
    lowest position any sibling measured (a curve that starts there is returned at once). Each
    position below ``x[0]`` that the ``k`` nearest siblings reaching there measured gets the
    siblings' estimate (their median utilisation ratio carried from the curve's first
    ``own_points`` points, as :func:`extend_from_siblings` does above the high edge). Where it
    departs from ``own(t)`` by more than ``gate`` (:data:`SIBLING_LOW_GATE`, in absolute log ratio)
    it is taken; where it does not, the two are blended as in a hole (``weight`` on the siblings',
    :data:`SIBLING_WEIGHT`). Either is added with provenance :attr:`Prov.HELD`. Returns
    ``(x, v, prov)``, the added points first.

    Why: the own rule extrapolates the first octave, which is right while the low end of the axis
    is one regime. Some kernels change regime at its very start: vLLM's fp8 GEMM on b200 runs a
    batch-1 path at ``m = 1`` that takes ~13.5 us more than at ``m = 2`` (median over its 483
    shapes, 2-3x at small shapes), which no point at ``m >= 2`` shows and every sibling measured.
    Where the siblings agree with the own rule, each is an estimate with its own noise, and their
    blend beats either."""
    x = np.asarray(x, dtype=float)
    v = np.asarray(v, dtype=float)
    prov = np.zeros(len(x), np.int8)
    if len(x) == 0 or (floor is not None and x[0] <= floor):
        return x, v, prov
    gate = SIBLING_LOW_GATE if gate is None else gate
    add_x, add_v = _sibling_trend(x, v, sol, siblings, k, own_points, low=True)
    if not add_x:
        return x, v, prov
    tx = np.asarray(add_x, dtype=float)
    sib_v = np.asarray(add_v, dtype=float)
    own_v = np.array([float(own(t)) for t in add_x])
    departs = np.abs(np.log(sib_v / own_v)) > gate
    tv = np.where(departs, sib_v, log_blend(own_v, sib_v, weight))
    return (np.concatenate([tx, x]), np.concatenate([tv, v]),
            np.concatenate([np.full(len(tx), int(Prov.HELD), np.int8), prov]))


def _sibling_trend(x, v, sol, siblings, k: int, own_points: int, low: bool) -> tuple[list, list]:
    """Positions beyond one edge of the measured curve ``(x, v)`` (below ``x[0]`` if ``low``, else
    above ``x[-1]``) that its ``k`` nearest siblings reaching there measured, with the latencies the
    siblings' utilisation ratios carry out from the curve's ``own_points`` points nearest that edge
    (:func:`extend_from_siblings`)."""
    n_ref = min(own_points, len(x))
    refs = x[:n_ref] if low else x[-n_ref:]
    u_ref = np.asarray(sol(refs), dtype=float).reshape(-1) / (v[:n_ref] if low else v[-n_ref:])
    edge = x[0] if low else x[-1]
    sib: list[tuple[np.ndarray, np.ndarray, Callable]] = []  # siblings reached so far (measured points)
    util: dict[int, np.ndarray] = {}  # their utilisation, computed when first needed
    it = iter(siblings)

    def sibling(i: int):
        while len(sib) <= i:
            nxt = next(it, None)
            if nxt is None:
                return None
            sx, sv, ssol = nxt
            sx = np.asarray(sx, dtype=float)
            sv = np.asarray(sv, dtype=float)
            ok = ~np.isnan(sv) & (sv > 0)
            sib.append((sx[ok], sv[ok], ssol))
        return sib[i]

    def utilisation(i: int) -> np.ndarray:
        if i not in util:
            sx, sv, ssol = sib[i]
            util[i] = np.asarray(ssol(sx), dtype=float).reshape(-1) / sv
        return util[i]

    # positions beyond the edge that the k nearest siblings reaching beyond it measured
    targets: set[float] = set()
    reaching, i = 0, 0
    while reaching < k:
        s = sibling(i)
        if s is None:
            break
        beyond = s[0] < edge if low else s[0] > edge
        if beyond.any():
            targets.update(s[0][beyond].tolist())
            reaching += 1
        i += 1
    add_x, add_v = [], []
    for t in sorted(targets):
        estimates = []
        for r, ur in zip(refs, u_ref):
            ratios, i = [], 0
            while len(ratios) < k:
                s = sibling(i)
                if s is None:
                    break
                sx = s[0]
                it_, ir = np.searchsorted(sx, t), np.searchsorted(sx, r)
                if it_ < len(sx) and sx[it_] == t and ir < len(sx) and sx[ir] == r:
                    su = utilisation(i)
                    ratios.append(su[it_] / su[ir])
                i += 1
            if ratios:
                estimates.append(ur * float(median_rows(ratios)))
        if estimates:
            u_t = float(median_rows(estimates))
            if u_t > 0:
                add_x.append(t)
                add_v.append(float(np.asarray(sol(np.array([t])), dtype=float).reshape(-1)[0]) / u_t)
    return add_x, add_v
