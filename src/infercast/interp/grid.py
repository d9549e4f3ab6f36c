"""Resolved lookup grids: the per-op form the engine evaluates on its hot path.

A :class:`Grid` holds one op's latency on a rectilinear grid of 1 or 2 curve axes (e.g. GEMM:
``m``; attention: ``batch x length``), already filled (missing cells held, off-site shapes
transferred) at compile time, plus a provenance code per cell.

Between grid points each axis is interpolated in its own space, chosen by leave-one-out (LOO) on
the real tables (``python -m benchmarks.interp_loo``; the LOO figures behind every rule below are in
docs/modelling-log.md, 'Interpolation and edge rules'):

* ``linear`` (position and value linear): attention ``batch``, generation ``step``, MoE tokens,
  collective message size (and GEMM ``m`` until the ``tile`` scale). Latency along these axes is a
  fixed cost plus a linear term, which a linear blend reproduces and a log-log blend over-predicts
  (see 'Interpolation space per axis');
* ``log`` (piecewise power law, linear in log x and log y): context-attention length, where
  cost grows quadratically;
* ``batch`` (attention batch): linear, plus a floor beyond the high edge (see the edge rule);
* ``tile`` (GEMM ``m``): linear, plus two rules for the tile steps and the noise of the m axis
  (below).

At a grid point the weights are exactly 0/1, so an exact hit returns the stored value bit for bit.

**Tile axes.** GEMM tables are collected at ``m = 1..16`` and in ``(a, a + 1)`` pairs: ``a`` a
multiple of 16 up to 256, then of 256, i.e. at the end of a group of whole row tiles and one row
into the next tile, where latency steps up. The rows are noisy: 6-7% of the interior points are
more than 15% above or below *both* their neighbours (a disturbed run, or a kernel heuristic's odd
choice at that one ``m``).

1. *Robust knots.* Between two grid points the blend uses each point's median over itself and
   ``ROBUST_HALF_WINDOW`` (2) points either side, not its raw value, so one or two outlying points
   do not bend their neighbouring intervals (an exact hit still returns the stored value; a
   monotone curve is unchanged). See 'GEMM tile axis: robust knots and pair holes'.
2. *Pair holes.* A point whose pair partner is missing (``a`` without ``a + 1`` or the reverse) is
   a hole in the collection lattice; the missing member is filled (provenance interpolated)
   without blending across the tile step it sits next to. Row tiles are 16 to 256 rows (powers of
   two), so: a group of at most ``TILE_MIN_ROWS`` (32) rows lies inside one tile, and the hole
   takes the value of its group's other end; a group of at least ``TILE_MAX_ROWS`` (256) rows is a
   whole number of tiles, so latency is linear in ``m`` along the pairs' ``a`` members (and along
   their ``a + 1`` members), and the hole is interpolated between the same members of the
   neighbouring pairs (clipped to its two neighbours). Groups in between are left linear. On a
   complete table no point is filled and no answer changes; a table that lacks a point of its
   lattice (what in-curve LOO removes) no longer interpolates across the step. The 32-row groups
   (rows ``a + 1 .. a + 32`` for the pairs at 128, 160, 192 and 224) count as inside one tile:
   they are, unless the kernel uses 16-row tiles, and in LOO the other end's value beats a
   straight line across the 32 rows.
2b. *Holes the siblings measured.* A site that lacks a lattice point inside its range which most
   of its eight nearest sibling sites measured gets that point filled before these rules run
   (:func:`infercast.ops.gemm.build_site_grid`,
   :func:`infercast.interp.transfer.fill_holes_from_siblings`, provenance interpolated): a
   geometric blend of the site's own answer there (the rules above) and the siblings' (the site's
   utilisation carried by the siblings' median ratio to that position). The siblings see where a
   tile step falls for shapes like it; the own curve knows its level. The siblings' estimate is
   carried from up to eight of the site's own points on each side of the hole (median of the
   estimates, :data:`infercast.interp.transfer.SIBLING_OWN_POINTS`), not from its two neighbours
   alone, whose noise it otherwise inherits, and weighs 0.6 against the own answer's 0.4
   (:data:`~infercast.interp.transfer.SIBLING_WEIGHT`; weights and counts chosen by LOO, see 'GEMM
   lattice holes from siblings'). The pack's GEMM tables have no such hole (h100 / h200 / b200,
   every backend and quant mode): served answers are unchanged; the rule is for a collection that
   lost points, the case in-curve LOO measures. A position no site measured (``m`` between lattice
   points) is interpolated by the rules above alone.
3. *High edge.* The falling high-edge rule below does not apply: a tile axis's high edge holds or
   climbs (the last octave, ``m`` 8192 -> 16384, is two noisy points). Before that rule applies, a
   GEMM site whose curve stops short of its siblings' range is extended to the positions they
   measured (:func:`infercast.ops.gemm.build_site_grid`,
   :func:`infercast.interp.transfer.extend_from_siblings`): from each of its last eight points
   (:data:`infercast.interp.transfer.SIBLING_OWN_POINTS`), the median utilisation ratio (beyond / at
   that point) of the eight nearest sibling sites that measured both carries its own utilisation
   out; the median of the estimates is used (provenance held). TensorRT-LLM's tables stop at m =
   16384 for 42 of 483 shapes and at 32768 for the rest. Below the low edge the siblings' trend is
   used only where their answer departs from the curve's own low-edge rule (rule 4) by more than a
   factor of 1.35 (:data:`infercast.interp.transfer.SIBLING_LOW_GATE`,
   :func:`infercast.interp.transfer.extend_below_from_siblings`); inside that factor the siblings'
   answer is blended with the own rule's (weight 0.6). The pack's GEMM sites all start at the
   lattice's first m, so no served answer changes below the edge. See 'GEMM edges from siblings'.
4. *Low edge.* Below the first point the edge value is first lowered to what the median
   utilisation over the edge octave (the points up to twice the edge, as for the low-edge
   exponent below) gives at the edge, ``SOL(edge) / median(u)``, when that is lower; it is never
   raised. The first points of the m axis are dense (1, 2, 3, ...) and share one regime, and timing
   noise is one-sided (a disturbed run only adds time), so an edge above its octave is a disturbed
   run. Queries at or above the edge are unchanged. vLLM's fp8 kernel on b200 is slower at ``m = 1``
   than at ``m = 2`` (a batch-1 path that no point at ``m >= 2`` shows), which the siblings' gated
   trend (rule 3) carries. See 'GEMM tile-axis low edge'.
5. Variants of these rules tried and rejected: 'GEMM tile-axis variants'.

Outside the grid the query is clamped to the boundary and scaled by the speed-of-light ratio
``SOL(query) / SOL(boundary)`` -- the boundary's utilisation ``u = SOL / latency`` is held -- but
only where the boundary is *saturated*. The edge rule, per axis and per curve (a 2-D grid blends its
curves' parameters along the other axis):

* the utilisation growth exponent of a curve at an edge is ``g = dlog(u) / dlog(x)`` over the
  octave in from the edge, clipped to ``[-beta, beta]`` with ``beta = dlog(SOL) / dlog(x)``
  (utilisation cannot grow faster than the roofline, or latency would fall as the shape grows);
* **high edge, falling** (``g < -SATURATION_TOL``; not on a tile axis: latency grows faster than the roofline, e.g.
  generation attention at short KV lengths, where a per-sequence cost outgrows the KV traffic
  as the batch grows): ``u`` keeps falling at ``EDGE_DAMPING x g`` for ``FALL_OCTAVES``
  doubling, then holds (see 'Falling high edge');
* **high edge, saturated** (``g <= SATURATION_TOL``): hold ``u``;
* **high edge, still climbing**: ``u`` keeps growing at ``EDGE_DAMPING x g`` beyond the edge, but
  never past the plateau borrowed from the neighbouring curves -- the highest utilisation
  measured anywhere on a 2-D grid. A 1-D curve has no neighbours
  here: the climb cannot be bounded by data, so within ``UNSATURATED_HOLD_OCTAVES`` doublings
  beyond the edge ``u`` is held (an upper bound on latency) and the cell is marked held; further
  out a user query is refused (:class:`BeyondRangeError`), which SILICON reports as "not
  available";
* **high edge of a ``batch`` axis**: whatever the rule above gives, latency grows at least along
  the straight line through the edge interval (the octave in from the edge): ``v_edge * (1 +
  lin * (x / x_edge - 1))`` with ``lin = (1 - v_inner / v_edge) * x_edge / (x_edge - x_inner)``
  (0 when latency falls over that interval). The marginal cost of one more sequence does not
  shrink as the batch grows -- a per-sequence cost stays, and past a full wave of CTAs it grows
  -- while the roofline's fixed latency makes the SOL ratio (and so the held or falling rule)
  grow more slowly than that at short lengths (vLLM decode on h200, length 1, batch 1024 ->
  2048: latency x 1.76 in the table, x 1.26 by the falling rule). ``lin`` is the steeper of that
  slope and the one over the two octaves in from the edge (``x_inner = x_edge / 4``): decode
  latency along the batch rises in waves (vLLM on h200, length 1: x 1.66, 1.89, 1.59, 1.95 per
  doubling from batch 128 to 2048), and an edge octave that sits on a flat stretch understates
  the per-sequence cost the next doubling pays. The floor is not applied on the generation
  ``step`` axis. See 'Batch-axis high-edge floor';
* **low edge**: below the first point utilisation falls at the edge's rate: latency scales as
  ``(SOL(query) / SOL(edge)) ** (1 - g / beta)`` (``beta`` the roofline's exponent over the same
  octave), between holding utilisation (saturated) and the edge's value (launch-bound, flat
  latency); it never rises as the shape shrinks. The fall stops ``LOW_OCTAVES`` (1) halvings
  below the edge; further down latency holds. The rate is the first octave's, where the work
  still hides fixed per-sequence and per-tile costs; context attention's length axis jumps four
  octaves below its edge (16 -> 1), where the compounded fall predicts a batch-256 prefill of one
  token at a quarter of its table latency. On a tile axis the edge value this scales is first
  lowered to its octave's median utilisation (rule 4 of the tile axes above). Known limit: some
  kernels run one-token prefills at a quarter of the 16-token latency, others at the same latency,
  and the 16 -> 32 octave does not tell which. See 'Low edge' (an affine low edge was tried and
  rejected there).

Known limitation: in 2-D, two curves extrapolated with different rates may cross beyond the edge
(a larger batch coming out faster at a length far beyond the table).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import NotAvailableError
from .provenance import Prov

try:  # the ufunc behind np.clip, called without np.clip's Python wrapper (the same values)
    from numpy._core.umath import clip as _clip
except ImportError:  # numpy < 2
    from numpy.core.umath import clip as _clip

LINEAR, LOG, TILE, BATCH = "linear", "log", "tile", "batch"
SCALE_NAMES = (LINEAR, LOG, TILE, BATCH)

#: An edge whose utilisation grows by less than this exponent (``u ~ x**g``; 0.05 is +3.5% per
#: doubling) counts as saturated. Chosen with ``python -m benchmarks.interp_loo`` (hold paths).
SATURATION_TOL = 0.05
#: Beyond a high edge, the measured growth exponent is damped by this factor: growth decelerates
#: towards saturation, so the full last-octave rate overshoots. Low edges are not damped. Chosen by
#: LOO (see docs/modelling-log.md, 'Edge damping').
EDGE_DAMPING = 0.5
#: The edge interval spans one octave in from the edge (a factor of 2 in the axis coordinate), so
#: that an (m, m+1) tile-step pair at the edge does not set the rate.
EDGE_SPAN = 2.0
#: A climbing high edge with nothing to borrow is held for at most this many doublings beyond it;
#: further out the grid refuses.
UNSATURATED_HOLD_OCTAVES = 4.0
#: A falling high edge keeps falling for at most this many doublings, then holds: the fall is a
#: regime of the last measured octave, not a trend to compound far beyond the table.
FALL_OCTAVES = 1.0
#: Below a low edge utilisation falls at the edge's rate for at most this many halvings, then
#: latency holds: the rate is that of the first measured octave, and the fixed costs it does not
#: see dominate further down (see the module docstring).
LOW_OCTAVES = 1.0
#: ``tile`` axes: between two knots the blend uses each knot's median over itself and this many
#: knots on either side (a symmetric window, shrinking at the ends; the end knots are kept). Chosen
#: by LOO (see docs/modelling-log.md, 'GEMM tile axis: robust knots and pair holes').
ROBUST_HALF_WINDOW = 2
#: ``tile`` axes: the row tiles of GEMM kernels are 16 .. 256 rows (powers of two); a group of at
#: most ``TILE_MIN_ROWS`` rows is treated as inside one tile (exact for 16 rows, for 32 rows unless
#: the kernel uses 16-row tiles) and a group of at least ``TILE_MAX_ROWS`` rows is a whole number of
#: tiles (see the module docstring).
TILE_MIN_ROWS, TILE_MAX_ROWS = 32.0, 256.0


def robust_knots(values: np.ndarray, half: int = ROBUST_HALF_WINDOW) -> np.ndarray:
    """Median over a symmetric window of ``2 * half + 1`` knots along the first axis (shrinking
    at the ends; the end knots are their own). A non-decreasing (or non-increasing) sequence is
    returned unchanged; a knot above or below both neighbours is replaced by one of theirs."""
    v = np.asarray(values, dtype=float)
    n = len(v)
    out = v.copy()
    for r in range(1, half + 1):
        # knots with at least r neighbours on both sides use the full window when r == min(..)
        lo, hi = r, n - r
        if hi <= lo:
            break
        idx = np.arange(lo, hi)
        width = np.minimum(np.minimum(idx, n - 1 - idx), half)
        sel = idx[width == r]
        if len(sel):
            win = np.stack([v[sel + d] for d in range(-r, r + 1)])
            out[sel] = median_rows(win)
    return out


def fill_pair_holes(x: np.ndarray, v: np.ndarray, prov: np.ndarray):
    """Fill the missing member of a broken ``(a, a + 1)`` pair on a ``tile`` axis (module
    docstring). Returns ``(x, v, prov)`` with the filled points inserted (provenance
    interpolated); unchanged when nothing is missing."""
    x = np.asarray(x, dtype=float)
    n = len(x)
    if n < 4:
        return x, v, prov
    on = set(x.tolist())
    pair = np.flatnonzero(np.diff(x) == 1.0)  # index of a in each complete (a, a + 1) pair
    if not len(pair):
        return x, v, prov
    k = robust_knots(v)
    lone = np.array([(xi - 1.0 not in on) and (xi + 1.0 not in on) for xi in x.tolist()])
    add_x, add_v = [], []
    for i in range(n - 1):
        x0, x1 = x[i], x[i + 1]
        if x1 - x0 <= 2.0 or lone[i] == lone[i + 1]:
            continue
        if lone[i + 1]:  # x1 = a + 1 of a pair whose a is missing: the group (x0, x1 - 1] ends at the hole
            missing, rows, near, members = x1 - 1.0, x1 - x0, k[i], pair
        else:  # x0 = a of a pair whose a + 1 is missing: the group [x0 + 1, x1] starts at the hole
            missing, rows, near, members = x0 + 1.0, x1 - x0, k[i + 1], pair + 1
        if rows <= TILE_MIN_ROWS:  # inside one tile with the group's other end
            val = near
        elif rows >= TILE_MAX_ROWS:  # whole tiles: blend the same member of the neighbouring pairs
            lo, hi = members[x[members] < missing], members[x[members] > missing]
            if not len(lo) or not len(hi):
                continue
            a, b = lo[-1], hi[0]
            km = robust_knots(v[members])
            ka, kb = km[len(lo) - 1], km[len(lo)]
            t = (missing - x[a]) / (x[b] - x[a])
            val = min(max(ka * (1.0 - t) + kb * t, min(k[i], k[i + 1])), max(k[i], k[i + 1]))
        else:
            continue
        add_x.append(missing)
        add_v.append(val)
    if not add_x:
        return x, v, prov
    xs = np.concatenate([x, add_x])
    order = np.argsort(xs, kind="stable")
    vs = np.concatenate([v, add_v])[order]
    ps = np.concatenate([prov, np.full(len(add_x), int(Prov.INTERPOLATED), np.int8)])[order]
    return xs[order], vs, ps.astype(np.int8)


class BeyondRangeError(NotAvailableError):
    """A query too far beyond a grid edge whose utilisation is still climbing."""


def _edge_exponents(axes, values, sol, borrow: bool, scales: tuple = ()) -> tuple:
    """Per axis: ``(e_low, g_high, log_cap_high, lin_high, base_low)``, arrays over the curves that
    reach the axis's edges (one entry for a 1-D grid); see the module docstring.

    ``e_low`` is the exponent applied to the SOL ratio below the first point (in ``[0, 1]``);
    ``base_low`` (last) the factor (<= 1) that lowers the first point's value to its octave's
    median utilisation before that, on a ``tile`` axis (1 elsewhere);
    ``g_high`` the damped utilisation growth exponent beyond the last point; ``log_cap_high`` the
    log of the plateau ratio ``u_plateau / u_edge`` (>= 0) a climbing high edge may reach (0:
    nothing to borrow); ``lin_high`` the relative latency slope on a ``batch`` axis,
    ``(1 - v_inner / v_edge) * x_edge / (x_edge - x_inner)``, the steeper of ``x_inner`` one and two
    octaves in from the edge (>= 0; 0 on other axes): beyond
    the edge latency is at least ``v_edge * (1 + lin_high * (x / x_edge - 1))``."""
    mesh = np.meshgrid(*axes, indexing="ij")
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        S = np.asarray(sol(*mesh), dtype=float) * np.ones(values.shape)
        U = np.where((values > 0) & (S > 0), S / values, np.nan)
    plateau = np.nanmax(U) if borrow and np.isfinite(U).any() else np.nan
    out = []
    for a, x in enumerate(axes):
        n = len(x)
        other = values.size // n  # curves that reach this axis's edges
        if n < 2 or x[0] <= 0:
            out.append((np.ones(other), np.zeros(other), np.zeros(other), np.zeros(other), np.ones(other)))
            continue
        Ua = np.moveaxis(U, a, 0).reshape(n, other)
        Sa = np.moveaxis(S, a, 0).reshape(n, other)
        # the edge interval reaches one octave in from the edge (or the far end of a short axis)
        bh = min(max(int(np.searchsorted(x, x[-1] / EDGE_SPAN, side="right")) - 1, 0), n - 2)
        bl = max(min(int(np.searchsorted(x, x[0] * EDGE_SPAN, side="left")), n - 1), 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            g_hi = np.log(Ua[-1] / Ua[bh]) / math.log(x[-1] / x[bh])
            b_hi = np.log(Sa[-1] / Sa[bh]) / math.log(x[-1] / x[bh])
            g_lo = np.log(Ua[bl] / Ua[0]) / math.log(x[bl] / x[0])
            b_lo = np.log(Sa[bl] / Sa[0]) / math.log(x[bl] / x[0])
            cap = np.log(plateau / Ua[-1])
        b_hi = np.maximum(np.nan_to_num(b_hi, nan=0.0, posinf=0.0, neginf=0.0), 0.0)
        b_lo = np.maximum(np.nan_to_num(b_lo, nan=0.0, posinf=0.0, neginf=0.0), 0.0)
        g_hi = np.clip(np.nan_to_num(g_hi, nan=0.0, posinf=0.0, neginf=0.0), -b_hi, b_hi)
        g_lo = np.clip(np.nan_to_num(g_lo, nan=0.0, posinf=0.0, neginf=0.0), 0.0, b_lo)
        g_hi = np.where(np.abs(g_hi) > SATURATION_TOL, g_hi * EDGE_DAMPING, 0.0)
        if a < len(scales) and scales[a] == TILE:  # a tile axis's high edge never falls (docstring)
            g_hi = np.maximum(g_hi, 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            rho = np.where(b_lo > 0, g_lo / b_lo, 0.0)  # 0: utilisation held .. 1: latency flat
        rho = np.where(g_lo > SATURATION_TOL, rho, 0.0)
        log_cap = np.maximum(np.where(np.isfinite(cap), cap, 0.0), 0.0)
        lin = np.zeros(other)
        if a < len(scales) and scales[a] == BATCH:  # the latency slope of the edge interval (docstring)
            Va = np.moveaxis(values, a, 0).reshape(n, other)
            b2 = min(max(int(np.searchsorted(x, x[-1] / EDGE_SPAN**2, side="right")) - 1, 0), n - 2)
            with np.errstate(divide="ignore", invalid="ignore"):
                # the steeper of the slopes over one and two octaves in from the edge (docstring)
                lin = (1.0 - Va[bh] / Va[-1]) * (x[-1] / (x[-1] - x[bh]))
                lin = np.fmax(lin, (1.0 - Va[b2] / Va[-1]) * (x[-1] / (x[-1] - x[b2])))
            lin = np.maximum(np.nan_to_num(lin, nan=0.0, posinf=0.0, neginf=0.0), 0.0)
        base_lo = np.ones(other)
        if a < len(scales) and scales[a] == TILE:  # a noisy low edge is lowered, never raised (docstring)
            Va = np.moveaxis(values, a, 0).reshape(n, other)
            with np.errstate(divide="ignore", invalid="ignore"):
                base_lo = (Sa[0] / median_rows(Ua[: bl + 1])) / Va[0]
            base_lo = np.where(np.isfinite(base_lo) & (base_lo > 0), np.minimum(base_lo, 1.0), 1.0)
        out.append((1.0 - rho, g_hi, log_cap, lin, base_lo))
    return tuple(out)


def _locate(axis: np.ndarray, q: np.ndarray, scale: str):
    """Index of the left neighbour and the weight of the right one (q clamped). The axis is sorted
    and its last two points differ (:class:`Grid` checks it), so the neighbours found (the last
    of equal points on the left, the last interval at the top end) differ and the clamped query
    lies in ``[x0, x1]``: the weight is exactly 0 on ``x0`` and exactly 1 on ``x1`` (``(x - x0) /
    (x1 - x0)`` and its log twin), without a division by zero (a log axis is positive)."""
    qc = _clip(q, axis[0], axis[-1])
    if len(axis) == 1:
        return np.zeros(q.shape, dtype=np.intp), np.zeros(q.shape), qc
    i = _clip(axis.searchsorted(qc, side="right") - 1, 0, len(axis) - 2)
    x0, x1 = axis[i], axis[i + 1]
    if scale == LOG:
        with np.errstate(divide="ignore", invalid="ignore"):
            return i, np.log(qc / x0) / np.log(x1 / x0), qc
    return i, (qc - x0) / (x1 - x0), qc


def _blend(v0, v1, t, scale: str):
    if scale == LOG:
        pos = (v0 > 0) & (v1 > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            geo = np.power(v0, 1.0 - t) * np.power(v1, t)
        return np.where(pos, geo, v0 * (1.0 - t) + v1 * t)
    return v0 * (1.0 - t) + v1 * t


def _locate1(axis: list, q: float, scale: str):
    if q <= axis[0]:
        return 0, 0.0, axis[0]
    if q >= axis[-1]:
        return max(len(axis) - 2, 0), (1.0 if len(axis) > 1 else 0.0), axis[-1]
    i = bisect_right(axis, q) - 1
    x0, x1 = axis[i], axis[i + 1]
    if q == x0:
        return i, 0.0, q
    t = math.log(q / x0) / math.log(x1 / x0) if scale == LOG else (q - x0) / (x1 - x0)
    return i, t, q


def _blend1(v0: float, v1: float, t: float, scale: str) -> float:
    if t == 0.0:
        return v0
    if t == 1.0:
        return v1
    if scale == LOG and v0 > 0 and v1 > 0:
        return v0 ** (1.0 - t) * v1**t
    return v0 * (1.0 - t) + v1 * t


def sorted_unique(a) -> np.ndarray:
    """The distinct values of float array ``a``, ascending (``np.unique`` of an array without NaN:
    the same answer, through a sort; ``np.unique`` imports ``numpy.ma`` on its first call, ~10 ms
    of a command's start-up)."""
    a = np.sort(np.asarray(a, dtype=float).ravel())
    return a[np.concatenate(([True], a[1:] != a[:-1]))] if a.size else a


def median_rows(a):
    """``np.median(a, axis=0)`` of a float array (1-D: a scalar; 2-D: per column), the
    same values -- the middle of the sorted values, or the mean of the two middle ones, added then
    halved as ``np.mean`` does; NaN where a NaN is -- without ``np.median``'s check for masked
    arrays, which imports ``numpy.ma`` on its first call (~7 ms of a command's start-up)."""
    s = np.sort(np.asarray(a, dtype=float), axis=0)
    if s.shape[0] == 0:  # (np.median: NaN, with a warning)
        return np.full(s.shape[1:], np.nan)[()]
    h = s.shape[0] // 2
    mid = s[h] if s.shape[0] % 2 else (s[h - 1] + s[h]) / 2.0
    out = np.where(np.isnan(s[-1]), np.nan, mid)
    return out[()] if out.ndim == 0 else out


def stack_rows(grids) -> tuple | None:
    """The 1-D ``grids`` (each a :class:`Grid`, all on one axis of one linear or tile scale) as
    one stack for :func:`latency_rows`: (axis, scale, values, knots), a row per grid; None when
    they do not share an axis and scale (or one is of a log scale, whose ``np.power`` is left to
    each grid's own call)."""
    grids = list(grids)
    if not grids or any(type(g) is not Grid or len(g.axes) != 1 for g in grids):
        return None
    axis, scale = grids[0].axes[0], grids[0].scales[0]
    if scale not in (LINEAR, TILE, BATCH) or any(g.scales[0] != scale or not np.array_equal(g.axes[0], axis) for g in grids):
        return None
    return axis, scale, np.stack([g.values for g in grids]), np.stack([g._knots for g in grids])


def latency_rows(stack: tuple, q: np.ndarray) -> np.ndarray | None:
    """:meth:`Grid.latency` of each grid of ``stack`` (:func:`stack_rows`) at the array ``q``, a
    row each: the 1-D path of :meth:`Grid._evaluate` with the neighbours located once for all
    of them (the same elementwise operations, so the same numbers). None when a query lies
    outside the axis: held beyond the grid, each grid answers for itself (and refuses in its
    turn)."""
    axis, scale, V, K = stack
    i, t, qc = _locate(axis, q, scale)
    if (q != qc).any():
        return None
    i1 = i + 1 if len(axis) > 1 else i  # (_locate keeps i below the last point)
    if scale == TILE:
        return np.where(t == 0.0, V[:, i], np.where(t == 1.0, V[:, i1], _blend(K[:, i], K[:, i1], t, scale)))
    return _blend(V[:, i], V[:, i1], t, scale)


_INTERPOLATED = int(Prov.INTERPOLATED)
SolFn = Callable[..., np.ndarray]
#: answers a 1-D grid keeps for :meth:`Grid.scalar` (about 100 bytes each)
SCALAR_MEMO_LIMIT = 50_000


@dataclass
class Grid:
    axes: tuple[np.ndarray, ...]  # 1 or 2 sorted float arrays
    values: np.ndarray  # shape = tuple(len(a) for a in axes)
    prov: np.ndarray  # int8 Prov codes, same shape
    sol: SolFn | None = None  # sol(*coords) -> ms, for holding utilisation beyond the grid
    sites: tuple = ()  # transfer donors (for --explain)
    scales: tuple[str, ...] = ()  # per axis: "linear" or "log" (default linear)
    _py: tuple = field(default=(), repr=False)
    _edges: tuple = field(default=(), repr=False)
    _edges_py: tuple = field(default=(), repr=False)
    _knots: np.ndarray | None = field(default=None, repr=False)
    #: :meth:`scalar`'s answers on a 1-D grid, by query (a simulator asks the same token counts
    #: again and again); emptied when it holds :data:`SCALAR_MEMO_LIMIT`
    _scalar_memo: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        self.axes = tuple(np.asarray(a, dtype=float) for a in self.axes)
        self.values = np.asarray(self.values, dtype=float)
        self.prov = np.asarray(self.prov, dtype=np.int8)
        if not self.scales:
            self.scales = (LINEAR,) * len(self.axes)
        if len(self.scales) != len(self.axes) or any(s not in SCALE_NAMES for s in self.scales):
            raise ValueError(f"scales must be one of linear/log/tile per axis, got {self.scales}")
        self._knots = self.values
        if TILE in self.scales:
            if len(self.axes) != 1:
                raise ValueError("a tile axis is only supported on a 1-D grid")
            x, self.values, self.prov = fill_pair_holes(self.axes[0], self.values, self.prov)
            self.axes = (x,)
            self._knots = robust_knots(self.values)
        for a in self.axes:  # what _locate relies on
            if a.ndim != 1 or (a.size > 1 and not ((a[1:] >= a[:-1]).all() and a[-1] > a[-2])):
                raise ValueError(f"a grid axis must be a sorted 1-D array whose last two points differ, got {a!r}")
        self._py = self._plain()

    def _plain(self) -> tuple:
        """The axes, values, provenance and knots as plain lists (the scalar path's twins)."""
        return (tuple(a.tolist() for a in self.axes), self.values.tolist(), self.prov.tolist(), self._knots.tolist())

    def __getstate__(self) -> dict:
        """Pickled without what is derived from the arrays (the plain-list twins, the scalar
        answers memoised so far): :meth:`__setstate__` makes them again."""
        state = dict(self.__dict__)
        state.update(_py=(), _edges_py=(), _scalar_memo={})
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._py = self._plain()
        if self._edges:
            self._edges_py = tuple(tuple(e.tolist() for e in axis_edges) for axis_edges in self._edges)

    def __call__(self, *coords, refuse: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Latency (ms) and provenance codes for arrays of coordinates (broadcast together).

        ``refuse=True`` (what the engine and :class:`~infercast.PerfDB` pass for a user's query)
        raises :class:`BeyondRangeError` too far beyond a climbing edge; the default holds, for
        compile-time composition (transfer donors, module sums) whose cells are held and marked
        so, and re-checked at query time by the composed grid's own edges."""
        return self._evaluate(coords, refuse, True)

    def latency(self, *coords, refuse: bool = False) -> np.ndarray:
        """The latencies of :meth:`__call__` alone (the same values), without the provenance."""
        return self._evaluate(coords, refuse, False)[0]

    def _evaluate(self, coords: tuple, refuse: bool, with_prov: bool) -> tuple[np.ndarray, np.ndarray | None]:
        p = None
        coords = tuple(np.asarray(c, dtype=float) for c in coords)
        if len(coords) > 1 and any(c.shape != coords[0].shape for c in coords[1:]):  # (equal shapes: as they are)
            coords = np.broadcast_arrays(*coords)
        if len(coords) != len(self.axes):
            raise ValueError(f"grid has {len(self.axes)} axes, got {len(coords)} coordinates")
        if len(self.axes) == 1:
            sc = self.scales[0]
            n = len(self.axes[0])
            i, t, qc = _locate(self.axes[0], coords[0], sc)
            i1 = i + 1 if n > 1 else i  # (_locate keeps i below the last point)
            if sc == TILE:  # robust knots between grid points, the stored value on them
                v = np.where(t == 0.0, self.values[i], np.where(t == 1.0, self.values[i1], _blend(self._knots[i], self._knots[i1], t, sc)))
            else:
                v = _blend(self.values[i], self.values[i1], t, sc)
            if with_prov:
                on = (t == 0.0) | (t == 1.0)
                p = np.where(t == 0.0, self.prov[i], np.where(t == 1.0, self.prov[i1], np.maximum(self.prov[i], self.prov[i1])))
            clamped = (qc,)
        else:
            sa, sb = self.scales
            (i, ti, qa), (j, tj, qb) = _locate(self.axes[0], coords[0], sa), _locate(self.axes[1], coords[1], sb)
            ni, nj = len(self.axes[0]), len(self.axes[1])
            i1, j1 = (i + 1 if ni > 1 else i), (j + 1 if nj > 1 else j)  # (_locate keeps them below the last points)
            V = self.values
            top = _blend(V[i, j], V[i1, j], ti, sa)
            bot = _blend(V[i, j1], V[i1, j1], ti, sa)
            v = _blend(top, bot, tj, sb)
            if with_prov:
                on = ((ti == 0.0) | (ti == 1.0)) & ((tj == 0.0) | (tj == 1.0))
                P = self.prov
                # an exact hit only depends on its own cell
                ci = np.where(ti == 1.0, i1, i)
                cj = np.where(tj == 1.0, j1, j)
                p = np.where(on, P[ci, cj], np.maximum.reduce([P[i, j], P[i1, j], P[i, j1], P[i1, j1]]))
            clamped = (qa, qb)
        if with_prov:
            p = np.where(on, p, np.maximum(p, Prov.INTERPOLATED))
        outside = coords[0] != clamped[0]
        for c, qc in zip(coords[1:], clamped[1:]):
            outside = outside | (c != qc)
        if outside.any():
            if self.sol is None:
                raise ValueError("query outside the grid and no SOL function to hold utilisation")
            # one axis at a time, from the clamped point out to the query (the SOL ratios
            # telescope to SOL(query) / SOL(clamped) when every edge holds)
            edges = self.edges()
            here = list(clamped)
            s_here = np.asarray(self.sol(*here), dtype=float)
            ratio = np.ones(np.shape(v))
            LN2 = math.log(2.0)
            for a, (q, qc) in enumerate(zip(coords, clamped)):
                out_a = q != qc
                if not out_a.any():
                    continue
                e_lo, g_hi, log_cap, lin, base_lo = edges[a]
                if len(self.axes) == 2:  # blend the curves' parameters along the other axis
                    jj, tt = (j, tj) if a == 0 else (i, ti)
                    jj1 = np.minimum(jj + 1, len(e_lo) - 1)
                    e_lo, g_hi, log_cap, lin, base_lo = (e[jj] * (1.0 - tt) + e[jj1] * tt for e in (e_lo, g_hi, log_cap, lin, base_lo))
                else:
                    e_lo, g_hi, log_cap, lin, base_lo = e_lo[0], g_hi[0], log_cap[0], lin[0], base_lo[0]
                nxt = list(here)
                nxt[a] = q
                s_next = np.asarray(self.sol(*nxt), dtype=float)
                low = list(here)  # the fall below a low edge stops LOW_OCTAVES below it
                low[a] = np.maximum(q, qc * 2.0**-LOW_OCTAVES)
                s_low = np.asarray(self.sol(*low), dtype=float)
                with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                    sr = s_next / s_here
                    lr = np.log(np.where(out_a, q / qc, 1.0))
                    climb = np.where(g_hi >= 0, np.minimum(g_hi * lr, log_cap), np.maximum(g_hi * lr, g_hi * LN2 * FALL_OCTAVES))
                    f = np.where(lr > 0, np.maximum(sr / np.exp(climb), 1.0 + lin * (q / qc - 1.0)), base_lo * np.power(s_low / s_here, e_lo))
                stuck = (lr > UNSATURATED_HOLD_OCTAVES * LN2) & (g_hi > 0) & (log_cap <= 0)
                if refuse and np.any(stuck):
                    self._refuse(a, float(np.max(np.where(stuck, q, -np.inf))))
                ratio = ratio * np.where(out_a & np.isfinite(f), f, 1.0)
                here, s_here = nxt, s_next
            v = np.where(outside, v * ratio, v)
            if with_prov:
                p = np.where(outside, np.maximum(p, Prov.HELD), p)
        return v, (p.astype(np.int8) if with_prov else None)

    def _refuse(self, a: int, q: float):
        edge = float(self.axes[a][-1])
        raise BeyondRangeError(
            f"query {q:g} on curve axis {a} is {math.log2(q / edge):.1f} doublings beyond the last "
            f"measured point {edge:g}",
            f"utilisation is still climbing at that edge and no neighbouring curve shows its plateau, "
            f"so it may be held for at most {UNSATURATED_HOLD_OCTAVES:g} doublings",
        )

    def edges(self) -> tuple:
        """Edge exponents and plateau caps (computed once, on the first query beyond the grid)."""
        if not self._edges:
            self._edges = _edge_exponents(self.axes, self.values, self.sol, borrow=len(self.axes) == 2, scales=self.scales)
            # plain-list twin for the scalar path (no numpy indexing per call)
            self._edges_py = tuple(tuple(e.tolist() for e in axis_edges) for axis_edges in self._edges)
        return self._edges

    def scalar(self, *coords: float, refuse: bool = False) -> tuple[float, int]:
        """Same as calling with scalars, in plain Python (no numpy overhead): the hot path of a
        simulator asking one shape at a time. Agrees with :meth:`__call__` to rounding."""
        if len(coords) == 1:
            key = (coords[0], refuse)
            hit = self._scalar_memo.get(key)
            if hit is None:
                if len(self._scalar_memo) >= SCALAR_MEMO_LIMIT:
                    self._scalar_memo.clear()
                hit = self._scalar_memo[key] = self._scalar(coords, refuse)
            return hit
        if len(coords) == 2:  # inside a 2-D grid: _scalar's steps written out (the same values)
            (xa, xb), V = self._py[0], self._py[1]
            qa, qb = float(coords[0]), float(coords[1])
            # on a first grid point too (one sequence is a context grid's first batch): there
            # _locate1 answers (0, 0.0, the point), as bisect_right does here
            if xa[0] <= qa < xa[-1] and xb[0] <= qb < xb[-1]:
                sa, sb = self.scales
                i = bisect_right(xa, qa) - 1
                x0 = xa[i]
                ti = 0.0 if qa == x0 else (math.log(qa / x0) / math.log(xa[i + 1] / x0) if sa == LOG else (qa - x0) / (xa[i + 1] - x0))
                j = bisect_right(xb, qb) - 1
                x0 = xb[j]
                tj = 0.0 if qb == x0 else (math.log(qb / x0) / math.log(xb[j + 1] / x0) if sb == LOG else (qb - x0) / (xb[j + 1] - x0))
                Vi, Vi1 = V[i], V[i + 1]
                top = _blend1(Vi[j], Vi1[j], ti, sa)
                bot = _blend1(Vi[j + 1], Vi1[j + 1], ti, sa)
                v = _blend1(top, bot, tj, sb)
                P = self._py[2]
                if (ti == 0.0 or ti == 1.0) and (tj == 0.0 or tj == 1.0):
                    p = P[i + 1 if ti == 1.0 else i][j + 1 if tj == 1.0 else j]
                else:
                    p = max(P[i][j], P[i + 1][j], P[i][j + 1], P[i + 1][j + 1], _INTERPOLATED)
                return v, p
        return self._scalar(coords, refuse)

    def _scalar(self, coords: tuple, refuse: bool) -> tuple[float, int]:
        axes, V, P, K = self._py
        if len(axes) == 1:
            sc = self.scales[0]
            q = float(coords[0])
            i, t, qc = _locate1(axes[0], q, sc)
            i1 = min(i + 1, len(axes[0]) - 1)
            v = _blend1(K[i], K[i1], t, sc) if sc == TILE and 0.0 < t < 1.0 else _blend1(V[i], V[i1], t, sc)
            p = P[i] if t == 0.0 else P[i1] if t == 1.0 else max(P[i], P[i1], int(Prov.INTERPOLATED))
            clamped = (qc,)
            q_all = (q,)
        else:
            sa, sb = self.scales
            qa_, qb_ = float(coords[0]), float(coords[1])
            i, ti, qa = _locate1(axes[0], qa_, sa)
            j, tj, qb = _locate1(axes[1], qb_, sb)
            i1, j1 = min(i + 1, len(axes[0]) - 1), min(j + 1, len(axes[1]) - 1)
            top = _blend1(V[i][j], V[i1][j], ti, sa)
            bot = _blend1(V[i][j1], V[i1][j1], ti, sa)
            v = _blend1(top, bot, tj, sb)
            if ti in (0.0, 1.0) and tj in (0.0, 1.0):
                p = P[i1 if ti == 1.0 else i][j1 if tj == 1.0 else j]
            else:
                p = max(P[i][j], P[i1][j], P[i][j1], P[i1][j1], int(Prov.INTERPOLATED))
            clamped = (qa, qb)
            q_all = (qa_, qb_)
        if q_all != clamped:
            if self.sol is None:
                raise ValueError("query outside the grid and no SOL function to hold utilisation")
            self.edges()
            edges = self._edges_py
            here = list(clamped)
            s_here = float(self.sol(*here))
            for a, (q, qc) in enumerate(zip(q_all, clamped)):
                if q == qc:
                    continue
                e_lo, g_hi, log_cap, lin, base_lo = edges[a]
                if len(q_all) == 2:
                    jj, tt = (j, tj) if a == 0 else (i, ti)
                    jj1 = min(jj + 1, len(e_lo) - 1)
                    e_lo, g_hi, log_cap, lin, base_lo = (e[jj] * (1.0 - tt) + e[jj1] * tt for e in (e_lo, g_hi, log_cap, lin, base_lo))
                else:
                    e_lo, g_hi, log_cap, lin, base_lo = e_lo[0], g_hi[0], log_cap[0], lin[0], base_lo[0]
                nxt = list(here)
                nxt[a] = q
                s_next = float(self.sol(*nxt))
                sr = s_next / s_here if s_here != 0 else 1.0
                lr = math.log(q / qc)
                if lr > 0:
                    if refuse and g_hi > 0 and log_cap <= 0 and lr > UNSATURATED_HOLD_OCTAVES * math.log(2.0):
                        self._refuse(a, q)
                    climb = min(g_hi * lr, log_cap) if g_hi >= 0 else max(g_hi * lr, g_hi * math.log(2.0) * FALL_OCTAVES)
                    f = max(sr / math.exp(climb), 1.0 + lin * (q / qc - 1.0))
                else:
                    s_low = float(self.sol(*(here[:a] + [max(q, qc * 2.0**-LOW_OCTAVES)] + here[a + 1:])))
                    sl = s_low / s_here if s_here != 0 else 1.0
                    f = base_lo * sl**e_lo if sl > 0 else sl
                if math.isfinite(f):
                    v = v * f
                here, s_here = nxt, s_next
            p = max(p, int(Prov.HELD))
        return v, p
