"""Per-phase latency surfaces: a compiled engine tabulated over its workload axes.

:class:`CompiledEngine` sums every op of the plan per call. A :class:`Surface` sums them once, at
build time, on the union of the ops' table knots, so a call is a few bisections and one
interpolation per surface. The surfaces (all in ms, every op's count included):

* ``tok_ctx(T)`` / ``seq_ctx(S)``: the token-wise ops of a step that carries prompt tokens, over
  its ``T`` tokens (ops on every token) and its ``S`` sequences (ops on one token per sequence,
  e.g. the LM head);
* ``draft(r)``: the MTP draft passes' token-wise ops over ``r`` decoding sequences;
* ``dec(b)``: every token-wise op of a decode-only step of ``b`` sequences (the main model's
  at ``b x decode_width`` tokens, the draft passes' at ``b``);
* ``actx(b, L)``: context attention of ``b`` sequences of ``L`` new tokens and no prefix, summed
  over the attention ops; ``actx_<k>(b, L)``: attention op ``k`` alone (the prefix rule takes a
  maximum per op, below); ``state(b, L)``: the linear-attention ops (no prefix dependence);
* ``gen(b, s)``: generation attention of ``b`` sequences at ``s = max(kv_len - 1, 1)`` cached
  tokens, main and draft ops.

A step then reads (``w`` = ``decode_width``; ``frac`` the share of query-key pairs the new tokens
own, :func:`infercast.ops.attention.prefix_fraction`)::

    prefill(b, isl, 0)      = tok_ctx(b*isl) + seq_ctx(b) + actx(b, isl)
    prefill(b, isl, p > 0)  = tok_ctx(b*isl) + seq_ctx(b) + state(b, isl)
                              + sum_k max(actx_k(b, isl+p) * frac, actx_k(b, isl))
    decode_step(b, kv)      = dec(b) + gen(b, max(kv - 1, 1))
    mixed (prefill + n_d decodes) = tok_ctx(T + n_d*w) + seq_ctx(b + n_d) + draft(n_d)
                              + context attention as above + gen(n_d, max(kv - 1, 1))

How the surfaces are built and why they agree with the op-by-op path:

* 1-D surfaces (``Curve``) are piecewise linear between knots with the exact value *at* each knot
  stored apart from the two one-sided limits of each interval: a GEMM's ``tile`` axis returns
  its stored (noisy) point on a knot and blends robust knots between
  (:mod:`infercast.interp.grid`), a jump a single value per knot cannot hold.
* 2-D surfaces (``Sheet``) interpolate like :class:`~infercast.interp.grid.Grid`: first along
  the first axis, then along the second, each in its own scale (``linear``, or ``log``: power
  law between knots, used for context-attention length).
* The knots start as every op's table axis mapped onto the surface's axis (a token-wise op at
  ``x_per_token`` elements per token has its knot ``k`` at ``k / x_per_token`` tokens), plus
  powers of two outside the tables' range, where the SOL-ratio edge rules make latency
  nonlinear. Then every interval is checked at its quarter points against the op-by-op path and
  split at its middle while the relative error exceeds ``tol`` (default 2.5e-4; 2-D: edge
  quarter points and cell centres, a split applied to the whole axis of a tile). A 2-D surface
  is cut into tiles at the tables' edges (:class:`Tiled`) so refining an extrapolated region
  adds no knots inside the tables' range; a tile needing more than :data:`MAX_TILE_CELLS` cells
  is left out and its region answered op by op. The batch axis has whole-number knots and is
  checked at whole numbers (a fractional batch goes op by op); the generation surface keeps
  whole-number step knots too, so a decode's mean over its KV lengths is a closed-form sum
  (:meth:`Surface.decode_ms`).
* The domain of each axis starts at 1 and ends at a configured maximum, lowered (halved) until
  the op-by-op path answers at the boundary without refusing (a climbing edge refuses a query
  too far beyond it, :class:`~infercast.interp.grid.BeyondRangeError`). A query outside the
  domain is answered by the op-by-op path (so it refuses where that path does); a surface read
  from a file has no engine and raises :class:`~infercast.errors.NotAvailableError` there.

The surface answers latency only: per-op provenance and the breakdown stay with the op-by-op
path (``Estimator.breakdown``, ``infercast estimate --explain``).
"""

from __future__ import annotations

import json
import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InfercastError, NotAvailableError

LINEAR, LOG = "linear", "log"
#: the file format written by :meth:`Surface.write` (docs/surface-format.md)
FORMAT_NAME = "infercast-surface"
FORMAT_VERSION = 1
METADATA_KEY = b"infercast.surface"
#: relative error allowed between a surface and the op-by-op path at the refinement's test points
DEFAULT_TOL = 2.5e-4
#: the positions inside an interval where refinement checks the surface
_TEST_T = (0.25, 0.5, 0.75)
_MAX_ROUNDS = 40
#: where a one-sided limit of an interval is read, as a fraction of its width from the knot
_EPS = 1e-9
#: the most cells one tile of a 2-D surface may hold; a tile that needs more to meet the tolerance
#: is left out and its region answered op by op
MAX_TILE_CELLS = 20000
#: default upper ends of the axes (halved where the op-by-op path refuses at the boundary)
DEFAULT_DOMAIN = {"tokens": 2.0**23, "seqs": 2.0**16, "batch": 2.0**12, "length": 2.0**17, "step": 2.0**18}


class OutsideSurfaceError(NotAvailableError):
    """A query outside the domain a surface was compiled for (and no engine to fall back on)."""


# ---- 1-D ---------------------------------------------------------------------------------------
@dataclass
class Curve:
    """Piecewise-linear latency over one axis: ``at[i]`` on knot ``x[i]``, and between ``x[i]``
    and ``x[i+1]`` the straight line from ``left[i]`` to ``right[i]`` (the one-sided limits)."""

    x: list
    at: list
    left: list
    right: list
    _np: tuple = field(default=(), repr=False)

    def __post_init__(self):
        self.x = [float(v) for v in self.x]
        self.at = [float(v) for v in self.at]
        self.left = [float(v) for v in self.left]
        self.right = [float(v) for v in self.right]
        if len(self.x) < 2 or len(self.left) != len(self.x) - 1 or len(self.right) != len(self.x) - 1 or len(self.at) != len(self.x):
            raise ValueError("a curve needs >= 2 knots, a value per knot and two limits per interval")
        xs = np.asarray(self.x)
        slope = (np.asarray(self.right) - np.asarray(self.left)) / np.diff(xs)
        self._np = (xs, np.asarray(self.at), np.asarray(self.left), slope)
        self._ar = np.arange(len(xs), dtype=float)
        self._c = np.asarray(self.left) - slope * xs[:-1]
        lines_at = np.concatenate([self.left[:1], self.right])  # each knot's value from the line ending there
        lines_from = np.concatenate([self.left, self.right[-1:]])  # ... and from the line starting there
        at = np.asarray(self.at)
        self._jumps = bool(np.any((np.abs(lines_at - at) > 1e-12 * np.abs(at)) | (np.abs(lines_from - at) > 1e-12 * np.abs(at))))
        self._slope = slope.tolist()
        self._py = (self.x, self.at, self.left, self._slope)

    @property
    def lo(self) -> float:
        return self.x[0]

    @property
    def hi(self) -> float:
        return self.x[-1]

    def __call__(self, q: float) -> float:
        x, at, left, slope = self._py
        i = bisect_right(x, q) - 1
        if x[i] == q:
            return at[i]
        return left[i] + slope[i] * (q - x[i])

    def eval(self, q: np.ndarray) -> np.ndarray:
        """Vectorised form: the knot index from ``np.interp`` (a fractional position), then the
        interval's line ``c + slope * q``; the stored value on a knot where it differs from the
        lines through it (a jump)."""
        xs, at, _, slope = self._np
        q = np.asarray(q, dtype=float)
        pos = np.interp(q, xs, self._ar)
        k = pos.astype(np.intp)
        ii = np.minimum(k, len(xs) - 2)
        v = self._c[ii] + slope[ii] * q
        if self._jumps:
            v = np.where(pos == k, at[k], v)
        return v


def _interp_curve(x, at, left, right, q):
    """Curve evaluation from raw arrays (the refinement's check)."""
    i = np.clip(np.searchsorted(x, q, side="right") - 1, 0, len(x) - 2)
    t = (q - x[i]) / (x[i + 1] - x[i])
    return np.where(x[i] == q, at[i], left[i] + (right[i] - left[i]) * t)


def build_curve(fn, knots, hi: float, tol: float = DEFAULT_TOL) -> Curve:
    """Tabulate ``fn`` (vectorised, ms) on ``[1, hi]`` from the seed ``knots``, refined until
    the curve matches ``fn`` within ``tol`` (relative) at every interval's quarter points."""
    x = _seed(knots, 1.0, hi, integer=False)
    for _ in range(_MAX_ROUNDS):
        at, left, right = _curve_values(fn, x)
        w = np.diff(x)
        tq = np.asarray(_TEST_T)
        q = (x[:-1, None] + w[:, None] * tq[None, :]).ravel()
        exact = fn(q)
        approx = (left[:, None] + (right - left)[:, None] * tq[None, :]).ravel()
        bad = _rel_err(approx, exact).reshape(len(w), len(tq)).max(axis=1) > tol
        bad &= w > 1e-6 * x[:-1]
        if not bad.any():
            break
        x = np.union1d(x, x[:-1][bad] + w[bad] / 2.0)
    at, left, right = _curve_values(fn, x)
    return Curve(x.tolist(), at.tolist(), left.tolist(), right.tolist())


def _curve_values(fn, x):
    w = np.diff(x)
    at = fn(x)
    left = fn(x[:-1] + _EPS * w)
    right = fn(x[1:] - _EPS * w)
    # the limits themselves, extrapolated from points _EPS inside the interval
    slope = (right - left) / (w * (1.0 - 2.0 * _EPS))
    return at, left - slope * _EPS * w, right + slope * _EPS * w


# ---- 2-D ---------------------------------------------------------------------------------------
@dataclass
class Sheet:
    """Latency on a rectilinear grid ``x`` by ``y`` (``v[i][j]`` at ``(x[i], y[j])``), blended
    along ``x`` then along ``y``, each axis in its own scale (``linear`` or ``log``: power law
    in the coordinate and the value; linear where a value is not positive)."""

    x: list
    y: list
    v: list  # len(x) rows of len(y)
    sx: str = LINEAR
    sy: str = LINEAR
    _np: tuple = field(default=(), repr=False)

    def __post_init__(self):
        self.x = [float(a) for a in self.x]
        self.y = [float(a) for a in self.y]
        V = np.asarray(self.v, dtype=float).reshape(len(self.x), len(self.y))
        self.v = V.tolist()
        if len(self.x) < 2 or len(self.y) < 2:
            raise ValueError("a sheet needs >= 2 knots per axis")
        if self.sx not in (LINEAR, LOG) or self.sy not in (LINEAR, LOG):
            raise ValueError(f"scales must be linear or log, got {self.sx}, {self.sy}")
        self._lx = [math.log(a) for a in self.x] if self.sx == LOG else None
        self._ly = [math.log(a) for a in self.y] if self.sy == LOG else None
        self._nx2, self._ny2 = len(self.x) - 2, len(self.y) - 2
        cx = self._lx or self.x
        cy = self._ly or self.y
        self._wx = [1.0 / (b - a) for a, b in zip(cx, cx[1:])]
        self._wy = [1.0 / (b - a) for a, b in zip(cy, cy[1:])]
        self._np = (np.asarray(self.x), np.asarray(self.y), V)
        self._flat = V.ravel()
        self._py = (self.x, self.y, self.v, self._nx2, self._ny2, self._lx, self._wx, self._ly, self._wy)
        self._cx, self._cy = np.asarray(cx), np.asarray(cy)

    @property
    def hi(self) -> tuple[float, float]:
        return self.x[-1], self.y[-1]

    def locate_x(self, q: float):
        x = self.x
        i = min(bisect_right(x, q) - 1, len(x) - 2)
        if self._lx is None:
            return i, (q - x[i]) / (x[i + 1] - x[i])
        lx = self._lx
        return i, (math.log(q) - lx[i]) / (lx[i + 1] - lx[i])

    def locate_y(self, q: float):
        y = self.y
        j = min(bisect_right(y, q) - 1, len(y) - 2)
        if self._ly is None:
            return j, (q - y[j]) / (y[j + 1] - y[j])
        ly = self._ly
        return j, (math.log(q) - ly[j]) / (ly[j + 1] - ly[j])

    def __call__(self, qx: float, qy: float) -> float:
        x, y, V, nx2, ny2, lx, wx, ly, wy = self._py
        i = bisect_right(x, qx) - 1
        if i > nx2:
            i = nx2
        j = bisect_right(y, qy) - 1
        if j > ny2:
            j = ny2
        ti = (qx - x[i]) * wx[i] if lx is None else (math.log(qx) - lx[i]) * wx[i]
        tj = (qy - y[j]) * wy[j] if ly is None else (math.log(qy) - ly[j]) * wy[j]
        r0, r1 = V[i], V[i + 1]
        if lx is None:
            a = r0[j] + (r1[j] - r0[j]) * ti
            b = r0[j + 1] + (r1[j + 1] - r0[j + 1]) * ti
        else:
            a = _geo(r0[j], r1[j], ti)
            b = _geo(r0[j + 1], r1[j + 1], ti)
        if ly is None or tj == 0.0 or a <= 0.0 or b <= 0.0:
            return a + (b - a) * tj
        return a * (b / a) ** tj

    def prefix_sums(self) -> None:
        """Running sums along ``y`` (whole-number knots, linear) per x knot: ``P[i][k]`` is the sum
        of row ``i``'s piecewise-linear curve over the integers ``y[0] .. y[k] - 1``."""
        _, ys, V = self._np
        d = np.diff(ys)
        piece = d[None, :] * V[:, :-1] + (V[:, 1:] - V[:, :-1]) * (d[None, :] - 1.0) / 2.0
        P = np.concatenate([np.zeros((V.shape[0], 1)), np.cumsum(piece, axis=1)], axis=1)
        S = np.concatenate([(V[:, 1:] - V[:, :-1]) / d[None, :], np.zeros((V.shape[0], 1))], axis=1)
        self._P, self._S, self._Pn, self._Sn = P.tolist(), S.tolist(), P, S

    def cum(self, i: int, s: float) -> float:
        """Sum of row ``i`` over the integers ``y[0] .. s`` (0 below ``y[0]``)."""
        y = self.y
        if s < y[0]:
            return 0.0
        k = bisect_right(y, s) - 1
        m = s - y[k] + 1.0
        return self._P[i][k] + m * self.v[i][k] + self._S[i][k] * m * (m - 1.0) / 2.0

    def cum_many(self, i: np.ndarray, s: np.ndarray) -> np.ndarray:
        _, ys, V = self._np
        k = np.clip(np.searchsorted(ys, s, side="right") - 1, 0, len(ys) - 1)
        m = s - ys[k] + 1.0
        c = self._Pn[i, k] + m * V[i, k] + self._Sn[i, k] * m * (m - 1.0) / 2.0
        return np.where(s < ys[0], 0.0, c)

    def eval(self, qx: np.ndarray, qy: np.ndarray) -> np.ndarray:
        """Vectorised form (fractional knot positions from ``np.interp``, in each axis's scale)."""
        qx, qy = np.asarray(qx, float), np.asarray(qy, float)
        nx, ny = len(self.x), len(self.y)
        px = np.interp(qx if self._lx is None else np.log(qx), self._cx, np.arange(nx, dtype=float))
        py = np.interp(qy if self._ly is None else np.log(qy), self._cy, np.arange(ny, dtype=float))
        i = np.minimum(px.astype(np.intp), nx - 2)
        j = np.minimum(py.astype(np.intp), ny - 2)
        ti, tj = px - i, py - j
        F = self._flat
        k = i * ny + j
        v00, v10, v01, v11 = F[k], F[k + ny], F[k + 1], F[k + ny + 1]
        sx = LOG if self._lx is not None else LINEAR
        a = _blend(v00, v10, ti, sx)
        b = _blend(v01, v11, ti, sx)
        return _blend(a, b, tj, LOG if self._ly is not None else LINEAR)


def _geo(a: float, b: float, t: float) -> float:
    if t == 0.0:
        return a
    if a > 0.0 and b > 0.0:
        return a * (b / a) ** t
    return a + (b - a) * t


def _axis_t(axis, q, scale):
    i = np.clip(np.searchsorted(axis, q, side="right") - 1, 0, len(axis) - 2)
    if scale == LOG:
        t = np.log(q / axis[i]) / np.log(axis[i + 1] / axis[i])
    else:
        t = (q - axis[i]) / (axis[i + 1] - axis[i])
    return i, t


def _blend(a, b, t, scale):
    if scale == LOG:
        pos = (a > 0) & (b > 0)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            g = a * np.power(b / a, t)
        return g if pos.all() else np.where(pos, g, a + (b - a) * t)
    return a + (b - a) * t


def _interp_sheet(xs, ys, V, sx, sy, qx, qy):
    i, ti = _axis_t(xs, qx, sx)
    j, tj = _axis_t(ys, qy, sy)
    a = _blend(V[i, j], V[i + 1, j], ti, sx)
    b = _blend(V[i, j + 1], V[i + 1, j + 1], ti, sx)
    return _blend(a, b, tj, sy)


def build_sheet(fn, xk, yk, hx: float, hy: float, sx: str, sy: str, y_integer: bool = False,
                tol: float = DEFAULT_TOL, lx: float = 1.0, ly: float = 1.0, max_cells: int = 0,
                x_integer: bool = False) -> Sheet | None:
    """Tabulate ``fn(x, y)`` (vectorised, ms) on ``[lx, hx] x [ly, hy]`` from seed knots, refined
    until edge quarter points and cell centres match within ``tol``. ``x_integer`` /
    ``y_integer``: the axis's knots are whole numbers and it is checked at whole numbers only (a
    batch of sequences; between two whole numbers the surface is not checked). None when that
    needs more than ``max_cells`` cells or :data:`_MAX_ROUNDS` rounds (the caller then evaluates
    that region op by op)."""
    max_cells = max_cells or MAX_TILE_CELLS
    x = _seed(xk, lx, hx, integer=x_integer)
    y = _seed(yk, ly, hy, integer=y_integer)
    for _ in range(_MAX_ROUNDS):
        V = fn(x[:, None], y[None, :])
        bad_x = np.zeros(len(x) - 1, bool)
        bad_y = np.zeros(len(y) - 1, bool)
        for t in _TEST_T:
            mx = _test_points(x, t, sx, x_integer)
            my = _test_points(y, t, sy, False)
            # along x at every y knot
            ex = fn(mx[:, None], y[None, :])
            ax = _interp_sheet(x, y, V, sx, sy, np.broadcast_to(mx[:, None], ex.shape), np.broadcast_to(y[None, :], ex.shape))
            bad_x |= (_rel_err(ax, ex) > tol).any(axis=1)
            # along y at every x knot
            ey = fn(x[:, None], my[None, :])
            ay = _interp_sheet(x, y, V, sx, sy, np.broadcast_to(x[:, None], ey.shape), np.broadcast_to(my[None, :], ey.shape))
            bad_y |= (_rel_err(ay, ey) > tol).any(axis=0)
        # cell centres: split both axes of a cell that misses
        mx, my = _test_points(x, 0.5, sx, x_integer), _test_points(y, 0.5, sy, False)
        ec = fn(mx[:, None], my[None, :])
        ac = _interp_sheet(x, y, V, sx, sy, np.broadcast_to(mx[:, None], ec.shape), np.broadcast_to(my[None, :], ec.shape))
        cell = _rel_err(ac, ec) > tol
        bad_x |= cell.any(axis=1)
        bad_y |= cell.any(axis=0)
        bad_x &= np.diff(x) > (1.0 if x_integer else 1e-6 * x[:-1])
        bad_y &= np.diff(y) > (1.0 if y_integer else 1e-6 * y[:-1])
        if not bad_x.any() and not bad_y.any():
            break
        if (len(x) + bad_x.sum()) * (len(y) + bad_y.sum()) > max_cells:
            return None
        nx = _mid(x, 0.5, sx)[bad_x]
        x = np.union1d(x, np.round(nx) if x_integer else nx)
        ny = _mid(y, 0.5, sy)[bad_y]
        y = np.union1d(y, np.round(ny) if y_integer else ny)
    else:
        return None
    return Sheet(x.tolist(), y.tolist(), fn(x[:, None], y[None, :]).tolist(), sx, sy)


@dataclass
class Tiled:
    """A 2-D surface cut into rectangular tiles, each a :class:`Sheet` refined on its own (the
    tables' edges are the cuts: beyond them the SOL-ratio rules bend the surface, and refining
    there must not add knots inside the tables' range). ``bx`` / ``by``: the inner cuts; the tile
    of a query is the number of cuts strictly below it on each axis (a query on a cut belongs to
    the lower tile); ``tiles[i][j]`` covers x-segment ``i`` by y-segment ``j``."""

    bx: list
    by: list
    tiles: list  # of rows of Sheet | None
    ends: tuple = ((1.0,), (1.0,))  # the domain's ends on each axis: (1, *bx, hx), (1, *by, hy)

    def __post_init__(self):
        self.bx = [float(v) for v in self.bx]
        self.by = [float(v) for v in self.by]
        self.hi = self.ends[0][-1], self.ends[1][-1]

    def tile(self, qx: float, qy: float) -> Sheet | None:
        """The tile holding ``(qx, qy)``; None where the region was left to the op-by-op path."""
        return self.tiles[bisect_left(self.bx, qx)][bisect_left(self.by, qy)]

    def __call__(self, qx: float, qy: float) -> float | None:
        t = self.tiles[bisect_left(self.bx, qx) if self.bx else 0][bisect_left(self.by, qy) if self.by else 0]
        return None if t is None else t(qx, qy)

    def covered(self, qx, qy) -> np.ndarray:
        """Which queries fall in a tabulated tile."""
        ix = np.searchsorted(np.asarray(self.bx), qx, side="left")
        iy = np.searchsorted(np.asarray(self.by), qy, side="left")
        have = np.asarray([[t is not None for t in row] for row in self.tiles])
        return have[ix, iy]

    def eval(self, qx, qy) -> np.ndarray:
        """Vectorised form; NaN where the region was left to the op-by-op path."""
        qx, qy = np.broadcast_arrays(np.asarray(qx, float), np.asarray(qy, float))
        if qx.size:  # all queries in one tile (the common case): no masks
            i0, i1 = bisect_left(self.bx, float(qx.min())), bisect_left(self.bx, float(qx.max()))
            j0, j1 = bisect_left(self.by, float(qy.min())), bisect_left(self.by, float(qy.max()))
            if i0 == i1 and j0 == j1:
                t = self.tiles[i0][j0]
                return np.full(qx.shape, np.nan) if t is None else t.eval(qx, qy)
        ix = sum((qx > c).astype(np.intp) for c in self.bx) if self.bx else np.zeros(qx.shape, np.intp)
        iy = sum((qy > c).astype(np.intp) for c in self.by) if self.by else np.zeros(qy.shape, np.intp)
        code = ix * (len(self.by) + 1) + iy
        out = None
        for i, row in enumerate(self.tiles):
            for j, t in enumerate(row):
                m = code == i * (len(self.by) + 1) + j
                if t is None or not m.any():
                    continue
                if out is None and m.all():
                    return t.eval(qx, qy)
                if out is None:
                    out = np.full(qx.shape, np.nan)
                out[m] = t.eval(qx[m], qy[m])
        return np.full(qx.shape, np.nan) if out is None else out

    def size(self) -> int:
        return sum(len(t.x) * len(t.y) for row in self.tiles for t in row if t is not None)


def build_tiled(fn, xk, yk, hx: float, hy: float, sx: str, sy: str, y_integer: bool = False,
                tol: float = DEFAULT_TOL, x_integer: bool = False) -> Tiled:
    """:func:`build_sheet` per tile, the cuts at the seed knots' range (the tables' edges)."""
    def cuts(k, hi):
        k = [v for v in k if np.isfinite(v)]
        if not k:
            return []
        return sorted({c for c in (min(k), max(k)) if 1.0 < c < hi})

    bx, by = cuts(xk, hx), cuts(yk, hy)
    ex, ey = [1.0, *bx, hx], [1.0, *by, hy]
    tiles = []
    for i in range(len(ex) - 1):
        row = []
        for j in range(len(ey) - 1):
            kx = [v for v in xk if ex[i] <= v <= ex[i + 1]]
            ky = [v for v in yk if ey[j] <= v <= ey[j + 1]]
            row.append(build_sheet(fn, kx, ky, ex[i + 1], ey[j + 1], sx, sy, y_integer, tol, ex[i], ey[j],
                                   x_integer=x_integer))
        tiles.append(row)
    return Tiled(bx, by, tiles, (tuple(ex), tuple(ey)))


def _test_points(a: np.ndarray, t: float, scale: str, integer: bool) -> np.ndarray:
    """Where each interval of ``a`` is checked: at ``t`` of the way (in its scale), or for a
    whole-number axis the nearest whole number strictly inside (the left knot, where the check
    is trivially met, when there is none)."""
    m = _mid(a, t, scale)
    if not integer:
        return m
    r = np.round(m)
    return np.where((r > a[:-1]) & (r < a[1:]), r, a[:-1])


def _mid(a: np.ndarray, t: float, scale: str) -> np.ndarray:
    if scale == LOG:
        return a[:-1] * (a[1:] / a[:-1]) ** t
    return a[:-1] + (a[1:] - a[:-1]) * t


def _rel_err(approx, exact):
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.abs(approx - exact) / np.maximum(np.abs(exact), 1e-300)
    return np.where(np.isfinite(e), e, np.inf)


def _seed(knots, lo: float, hi: float, integer: bool) -> np.ndarray:
    """The seed knots inside ``[lo, hi]``, the ends, and powers of two outside the knots' range."""
    k = np.asarray([v for v in knots if np.isfinite(v)], dtype=float)
    if integer:
        k = np.round(k)
    k = k[(k > lo) & (k < hi)]
    p2 = 2.0 ** np.arange(0, math.ceil(math.log2(hi)) + 1)
    if len(k):
        p2 = p2[(p2 < k.min()) | (p2 > k.max())]
    p2 = p2[(p2 > lo) & (p2 < hi)]
    return np.union1d(np.union1d(k, p2), [lo, hi])


# ---- the surface set ---------------------------------------------------------------------------
def prefix_frac(isl: float, prefix: float) -> float:
    """Share of the causal query-key pairs over ``isl + prefix`` tokens owned by the ``isl`` new
    ones (the scalar form of :func:`infercast.ops.attention.prefix_fraction`)."""
    tot = isl + prefix
    return (isl * prefix + isl * (isl + 1.0) / 2.0) / (tot * (tot + 1.0) / 2.0)


@dataclass
class Surface:
    """The compiled latency surfaces of one configuration (module docstring).

    Built from an engine (:meth:`build`, or ``Estimator.surface()``) it answers queries outside
    its domain through the engine's op-by-op path; read from a file (:meth:`read`) it raises
    :class:`OutsideSurfaceError` there. ``identity`` names the configuration, ``provenance``
    where the numbers come from."""

    curves: dict
    sheets: dict
    decode_width: float
    attention_ops: list  # names of the per-op context sheets (actx_<k>); empty: no prefix support needed
    identity: dict
    provenance: dict
    tol: float = DEFAULT_TOL
    engine: object = field(default=None, repr=False)

    def __post_init__(self):
        c, s = self.curves, self.sheets
        self._tok = c["tok_ctx"]
        self._seq = c.get("seq_ctx")
        self._draft = c.get("draft")
        self._dec = c["dec"]
        self._actx = s["actx"]
        self._gen = s["gen"]
        self._state = s.get("state")
        self._per_op = [s[n] for n in self.attention_ops]
        self._prefix_sums()

    # ---- building ----------------------------------------------------------------------------
    @classmethod
    def build(cls, engine, identity: dict | None = None, provenance: dict | None = None,
              tol: float = DEFAULT_TOL, domain: dict | None = None) -> Surface:
        """Tabulate ``engine`` (a :class:`~infercast.engine.compiled.CompiledEngine`). A
        context-parallel engine is refused: the surfaces tabulate one rank's unsplit ops."""
        from .compiled import ANALYTIC_KINDS, ATTENTION_KINDS, GRID_KINDS, STATEFUL_KINDS

        if getattr(engine, "cp", 1) > 1:
            from ..errors import InvalidConfigError

            raise InvalidConfigError(f"the compiled latency surfaces do not model context parallelism (cp {engine.cp})",
                                     "compile and the forward-pass model need --cp 1; estimate, serve, simulate and search take it")

        dom = {**DEFAULT_DOMAIN, **(domain or {})}
        w = float(engine.decode_width)
        main = [c for c in engine.ops if c.op.phase != "decode"]
        draft = [c for c in engine.ops if c.op.phase == "decode"]
        tw = [c for c in main if c.op.kind in GRID_KINDS + ANALYTIC_KINDS]
        tw_draft = [c for c in draft if c.op.kind in GRID_KINDS + ANALYTIC_KINDS]
        att = [c for c in main if c.op.kind in ATTENTION_KINDS]
        att_draft = [c for c in draft if c.op.kind in ATTENTION_KINDS]
        tok_ops = [c for c in tw if c.op.tokens == "all"]
        seq_ops = [c for c in tw if c.op.tokens != "all"]

        def tokenwise(ops, scale, context):
            def fn(n):
                n = np.asarray(n, float)
                total = np.zeros(n.shape)
                for c in ops:
                    total = total + engine._tokenwise(c, n * scale, n * scale, context)[0]
                return total
            return fn

        def knots1(ops, per_unit):
            out = []
            for c in ops:
                for r in c.resolved:
                    axes = getattr(r.grid, "axes", None)
                    if axes is not None and len(axes) == 1 and c.x_per_token > 0:
                        out.extend((np.asarray(axes[0]) / (c.x_per_token * per_unit)).tolist())
            return out

        def curve(fn, ops, per_unit, hi):
            hi = _safe_hi(lambda q: fn(np.asarray([q])), hi)
            return build_curve(fn, knots1(ops, per_unit), hi, tol)

        tok_fn = tokenwise(tok_ops, 1.0, True)
        curves = {"tok_ctx": curve(tok_fn, tok_ops, 1.0, dom["tokens"])}
        if seq_ops:
            curves["seq_ctx"] = curve(tokenwise(seq_ops, 1.0, True), seq_ops, 1.0, dom["seqs"])
        draft_fn = tokenwise(tw_draft, 1.0, False)
        if tw_draft:
            curves["draft"] = curve(draft_fn, tw_draft, 1.0, dom["seqs"])
        tok_gen, seq_gen = tokenwise(tok_ops, w, False), tokenwise(seq_ops, 1.0, False)

        def dec_fn(b):
            return tok_gen(b) + seq_gen(b) + draft_fn(b)

        hi = _safe_hi(lambda q: dec_fn(np.asarray([q])), dom["seqs"])
        curves["dec"] = build_curve(dec_fn, knots1(tok_ops, w) + knots1(seq_ops + tw_draft, 1.0), hi, tol)

        def ctx_fn(ops):
            def fn(b, L):
                b, L = np.broadcast_arrays(np.asarray(b, float), np.asarray(L, float))
                total = np.zeros(b.shape)
                for c in ops:
                    total = total + c.resolved[0].grid(b, L, refuse=True)[0] * c.op.count
                return total
            return fn

        def gen_fn(b, s):
            b, s = np.broadcast_arrays(np.asarray(b, float), np.asarray(s, float))
            total = np.zeros(b.shape)
            for c in att + att_draft:
                total = total + c.resolved[1].grid(b, s, refuse=True)[0] * c.op.count
            return total

        def knots2(ops, phase, axis):
            out = []
            for c in ops:
                axes = getattr(c.resolved[phase].grid, "axes", None)
                if axes is not None and len(axes) == 2:
                    out.extend(np.asarray(axes[axis]).tolist())
            return out

        def scale(ops, phase, axis):
            sc = {getattr(c.resolved[phase].grid, "scales", (LINEAR, LINEAR))[axis] for c in ops}
            return LOG if sc == {LOG} else LINEAR

        def sheet(fn, ops, phase, hx, hy, y_integer=False, sy=None):
            sy = sy or scale(ops, phase, 1)
            while True:  # the batch axis is linear for every attention grid (interp.grid)
                try:
                    return build_tiled(fn, knots2(ops, phase, 0), knots2(ops, phase, 1), hx, hy, LINEAR, sy,
                                       y_integer=y_integer, tol=tol, x_integer=True)
                except InfercastError:
                    hx, hy = _shrink2(fn, hx, hy)

        if not att:
            raise NotAvailableError("no attention op in the plan", "a surface needs context and generation attention")
        sheets = {"actx": sheet(ctx_fn(att), att, 0, dom["batch"], dom["length"])}
        stateful = [c for c in att if c.op.kind in STATEFUL_KINDS]
        plain = [c for c in att if c.op.kind not in STATEFUL_KINDS]
        if stateful:
            sheets["state"] = sheet(ctx_fn(stateful), stateful, 0, dom["batch"], dom["length"])
        names = []
        for k, c in enumerate(plain):
            if not stateful and len(plain) == 1:  # actx is that op alone
                names.append("actx")
                break
            name = f"actx_{k}"
            sheets[name] = sheet(ctx_fn([c]), [c], 0, dom["batch"], dom["length"])
            names.append(name)
        sheets["gen"] = sheet(gen_fn, att + att_draft, 1, dom["batch"], dom["step"], y_integer=True, sy=LINEAR)
        prov = {"tolerance": tol, **(provenance or {})}
        return cls(curves, sheets, w, names, dict(identity or {}), prov, tol, engine)

    # ---- closed-form decode ------------------------------------------------------------------
    def _prefix_sums(self):
        """Per tile of ``gen`` and batch knot: running sums of the step curve over the integers,
        for :meth:`decode_ms` (only when every tile's step knots are whole numbers, linear)."""
        g = self._gen
        self._gx, self._gy = g.hi
        self._ax, self._ay = self._actx.hi
        self._tok_hi = self._tok.x[-1]
        self._dec_hi = min(self._dec.x[-1], self._gx)
        live = [t for row in g.tiles for t in row if t is not None]
        self._closed = all(t.sy == LINEAR and all(float(v).is_integer() for v in t.y) for t in live)
        if self._closed:
            for t in live:
                t.prefix_sums()

    def _gen_sum(self, b: float, s0: float, s1: float) -> float | None:
        """Sum of ``gen(b, s)`` over the integers ``s0 .. s1`` (closed form, tile by tile: a tile
        owns the integers above its lower cut up to its upper end; within a tile the surface is
        bilinear, so the sum is the x-blend of the two batch rows' sums)."""
        g = self._gen
        ey = g.ends[1]
        total = 0.0
        for j, t in enumerate(g.tiles[bisect_left(g.bx, b)]):
            a = s0 if j == 0 or s0 > ey[j] else ey[j] + 1.0
            c = s1 if s1 < ey[j + 1] else ey[j + 1]
            if a > c:
                continue
            if t is None:
                return None
            i, ti = t.locate_x(b)
            y, P, S, V = t.y, t._P, t._S, t.v
            k = bisect_right(y, c) - 1
            m = c - y[k] + 1.0
            h = m * (m - 1.0) / 2.0
            lo = P[i][k] + m * V[i][k] + S[i][k] * h
            hi = P[i + 1][k] + m * V[i + 1][k] + S[i + 1][k] * h
            a -= 1.0
            if a >= y[0]:
                k = bisect_right(y, a) - 1
                m = a - y[k] + 1.0
                h = m * (m - 1.0) / 2.0
                lo -= P[i][k] + m * V[i][k] + S[i][k] * h
                hi -= P[i + 1][k] + m * V[i + 1][k] + S[i + 1][k] * h
            total += lo + (hi - lo) * ti
        return total

    # ---- scalar hot path ---------------------------------------------------------------------
    def prefill_ms(self, batch: float, isl: float, prefix: float = 0.0) -> float:
        """One prefill step: ``batch`` sequences of ``isl`` new tokens after ``prefix`` cached."""
        t = batch * isl
        if 1.0 <= batch <= self._ax and not batch % 1.0 and 1.0 <= isl and t <= self._tok_hi:
            seq = self._seq
            if seq is None or batch <= seq.x[-1]:
                if prefix <= 0.0:
                    A = self._actx
                    a = None
                    if isl <= self._ay:
                        tile = A.tiles[bisect_left(A.bx, batch)][bisect_left(A.by, isl)]
                        if tile is not None:
                            a = tile(batch, isl)
                    if a is not None:
                        v = self._tok(t) + a
                        return v if seq is None else v + seq(batch)
                else:
                    a = self._ctx_att(batch, isl, prefix)
                    if a is not None:
                        v = self._tok(t) + a
                        return v if seq is None else v + seq(batch)
        return self._fallback("prefill_scalar", batch, isl, prefix)

    def _ctx_att(self, b: float, isl: float, prefix: float):
        """Context attention with a cached prefix, per op (or None outside the domain)."""
        if b > self._ax:
            return None
        if prefix <= 0.0:
            return self._actx(b, isl) if isl <= self._ay else None
        if isl + prefix > self._ay:
            return None
        f = prefix_frac(isl, prefix)
        total = 0.0
        for s in self._per_op:
            full, alone = s(b, isl + prefix), s(b, isl)
            if full is None or alone is None:
                return None
            full *= f
            total += full if full > alone else alone
        if self._state is not None:
            st = self._state(b, isl)
            if st is None:
                return None
            total += st
        return total

    def decode_step_ms(self, batch: float, kv_len: float) -> float:
        """One decode step of ``batch`` sequences at KV length ``kv_len`` (the new token included)."""
        s = kv_len - 1.0 if kv_len > 2.0 else 1.0
        if 1.0 <= batch <= self._dec_hi and s <= self._gy and not batch % 1.0:
            g = self._gen(batch, s)
            if g is not None:
                return self._dec(batch) + g
        return self._fallback("decode_scalar", batch, kv_len)

    def decode_ms(self, batch: float, isl: float, osl: float) -> float:
        """Mean decode step over an output of ``osl`` tokens after ``isl`` (the steps' KV lengths
        ``isl + 1 .. isl + n``, ``n = max(osl - 1, 1)``), summed in closed form: the generation
        surface is piecewise linear between integer steps, so each piece's sum over the integers
        is an arithmetic series."""
        n = osl - 1.0 if osl > 2.0 else 1.0
        s1 = isl + n - 1.0
        if (self._closed and 1.0 <= batch <= self._dec_hi and isl >= 1.0 and s1 <= self._gy
                and not batch % 1.0 and not isl % 1.0 and not n % 1.0):
            g = self._gen_sum(batch, isl, s1)
            if g is not None:
                return self._dec(batch) + g / n
        if self.engine is None:
            raise OutsideSurfaceError(f"decode_ms({batch}, {isl}, {osl}) is outside the compiled surface",
                                      f"batch 1..{self._dec_hi:g}, whole isl >= 1 and osl, isl+osl-2 <= {self._gy:g}")
        kv = isl + 1.0 + np.arange(int(math.ceil(n)))
        return float(np.mean(self.engine.decode_ms(float(batch), kv)))

    def mixed_ms(self, p_batch: float, p_isl: float, p_prefix: float, d_batch: float, d_kv: float) -> float:
        """One step of ``p_batch`` prefill sequences (``p_isl`` new tokens after ``p_prefix`` each)
        and ``d_batch`` decodes at KV length ``d_kv``: token-wise ops once over all tokens,
        attention per part (:meth:`CompiledEngine.mixed_step_ms`)."""
        if p_batch <= 0.0 or p_isl <= 0.0:
            return self.decode_step_ms(d_batch, d_kv) if d_batch > 0.0 else 0.0
        if d_batch <= 0.0:
            return self.prefill_ms(p_batch, p_isl, p_prefix)
        t = p_batch * p_isl + d_batch * self.decode_width
        seqs = p_batch + d_batch
        s = d_kv - 1.0 if d_kv > 2.0 else 1.0
        if (1.0 <= p_batch and 1.0 <= p_isl and 1.0 <= d_batch <= self._gx and t <= self._tok_hi and s <= self._gy
                and not p_batch % 1.0 and not d_batch % 1.0
                and (self._seq is None or seqs <= self._seq.x[-1])
                and (self._draft is None or d_batch <= self._draft.x[-1])):
            a = self._ctx_att(p_batch, p_isl, p_prefix)
            g = self._gen(d_batch, s)
            if a is not None and g is not None:
                v = self._tok(t) + a + g
                if self._seq is not None:
                    v += self._seq(seqs)
                if self._draft is not None:
                    v += self._draft(d_batch)
                return v
        if self.engine is None:
            raise OutsideSurfaceError("mixed step outside the compiled surface",
                                      f"tokens <= {self._tok_hi:g}, batch <= {self._gx:g}, KV <= {self._gy + 1:g}")
        return float(self.engine.mixed_step_ms([p_batch], [p_isl], [p_prefix], d_batch, d_kv))

    def _domain_text(self) -> str:
        return (f"its domain: tokens 1..{self._tok_hi:g}, batch 1..{self._ax:g}, context length 1..{self._ay:g}, "
                f"decode batch 1..{self._dec_hi:g}, KV 2..{self._gy + 1:g}; use an Estimator for the rest")

    def _fallback(self, method: str, *args) -> float:
        if self.engine is None:
            raise OutsideSurfaceError(f"{method.replace('_scalar', '')}{tuple(args)} is outside the compiled surface",
                                      self._domain_text())
        return float(getattr(self.engine, method)(*(float(a) for a in args)))

    # ---- vectorised --------------------------------------------------------------------------
    def prefill_many(self, batch, isl, prefix=0.0) -> np.ndarray:
        """:meth:`prefill_ms` over arrays (broadcast together)."""
        b, i, p = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in (batch, isl, prefix)))
        t = b * i
        ok = (b >= 1.0) & (i >= 1.0) & (t <= self._tok_hi) & (b <= self._ax) & (i + p <= self._ay) & (b == np.round(b))
        if self._seq is not None:
            ok &= b <= self._seq.x[-1]
        if ok.all():
            out = self._prefill_vec(b, i, p, t)
        else:
            out = np.full(b.shape, np.nan)
            out[ok] = self._prefill_vec(b[ok], i[ok], p[ok], t[ok])
        bad = np.isnan(out)  # outside the domain, or in a region left to the op-by-op path
        if bad.any():
            out[bad] = self._fallback_vec("prefill_ms", b[bad], i[bad], p[bad])
        return out

    def _prefill_vec(self, b, i, p, t):
        v = self._tok.eval(t)
        if self._seq is not None:
            v = v + self._seq.eval(b)
        has_prefix = p > 0
        if not has_prefix.any():
            return v + self._actx.eval(b, i)
        att = np.zeros(b.shape)
        tot = i + p
        frac = (i * p + i * (i + 1.0) / 2.0) / (tot * (tot + 1.0) / 2.0)
        for s in self._per_op:
            alone = s.eval(b, i)
            att = att + np.where(has_prefix, np.maximum(s.eval(b, tot) * frac, alone), alone)
        if self._state is not None:
            att = att + self._state.eval(b, i)
        return v + att

    def mixed_many(self, p_batch, p_isl, p_prefix, d_batch, d_kv) -> np.ndarray:
        """:meth:`mixed_ms` over arrays (broadcast together)."""
        pb, pi, pp, db, dk = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in (p_batch, p_isl, p_prefix, d_batch, d_kv)))
        out = np.full(pb.shape, np.nan)
        pre, dec = (pb > 0) & (pi > 0), db > 0
        m = pre & ~dec
        if m.any():
            out[m] = self.prefill_many(pb[m], pi[m], pp[m])
        m = dec & ~pre
        if m.any():
            out[m] = self.decode_step_many(db[m], dk[m])
        out[~pre & ~dec] = 0.0
        m = pre & dec
        if m.any():
            b, i, p, n, kv = pb[m], pi[m], pp[m], db[m], dk[m]
            t = b * i + n * self.decode_width
            s = np.maximum(kv - 1.0, 1.0)
            ok = ((b >= 1.0) & (i >= 1.0) & (n >= 1.0) & (n <= self._gx) & (t <= self._tok_hi) & (s <= self._gy)
                  & (b <= self._ax) & (i + p <= self._ay) & (b == np.round(b)) & (n == np.round(n)))
            if self._seq is not None:
                ok &= b + n <= self._seq.x[-1]
            if self._draft is not None:
                ok &= n <= self._draft.x[-1]
            v = np.full(b.shape, np.nan)
            if ok.any():
                bo, io, po, no = b[ok], i[ok], p[ok], n[ok]
                w = self._prefill_vec(bo, io, po, t[ok]) + self._gen.eval(no, s[ok])
                if self._seq is not None:  # _prefill_vec counted seq_ctx(b); the step's sequences are b + n
                    w = w - self._seq.eval(bo) + self._seq.eval(bo + no)
                if self._draft is not None:
                    w = w + self._draft.eval(no)
                v[ok] = w
            bad = np.isnan(v)
            if bad.any():
                v[bad] = [self.mixed_ms(*x) for x in zip(b[bad], i[bad], p[bad], n[bad], kv[bad])]
            out[m] = v
        return out

    def decode_step_many(self, batch, kv_len) -> np.ndarray:
        """:meth:`decode_step_ms` over arrays (broadcast together)."""
        b, kv = np.broadcast_arrays(np.asarray(batch, float), np.asarray(kv_len, float))
        s = np.maximum(kv - 1.0, 1.0)
        ok = (b >= 1.0) & (b <= self._dec_hi) & (s <= self._gy) & (b == np.round(b))
        if ok.all():
            out = self._dec.eval(b) + self._gen.eval(b, s)
        else:
            out = np.full(b.shape, np.nan)
            out[ok] = self._dec.eval(b[ok]) + self._gen.eval(b[ok], s[ok])
        bad = np.isnan(out)
        if bad.any():
            out[bad] = self._fallback_vec("decode_ms", b[bad], kv[bad])
        return out

    def decode_many(self, batch, isl, osl) -> np.ndarray:
        """:meth:`decode_ms` over arrays (broadcast together; closed form where isl and osl are
        whole numbers inside the domain)."""
        b, i, o = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in (batch, isl, osl)))
        n = np.maximum(o - 1.0, 1.0)
        s0, s1 = i, i + n - 1.0
        ok = ((b >= 1.0) & (b <= self._dec_hi) & (s0 >= 1.0) & (s1 <= self._gy) & (i == np.round(i)) & (n == np.round(n))
              & (b == np.round(b)))
        ok &= self._gen.covered(b, s1) & self._gen.covered(b, s0)
        if not self._closed or any(t is None for row in self._gen.tiles for t in row):
            ok = np.zeros(b.shape, bool)
        out = np.empty(b.shape)
        if ok.any():
            bb, a0, a1, nn = b[ok], s0[ok], s1[ok], n[ok]
            g = self._gen
            seg = np.searchsorted(np.asarray(g.bx), bb, side="left")
            total = np.zeros(bb.shape)
            for xi, row in enumerate(g.tiles):
                mx = seg == xi
                if not mx.any():
                    continue
                for j, t in enumerate(row):
                    lo_s = np.maximum(a0[mx], t.y[0] + (1.0 if j else 0.0))
                    hi_s = np.minimum(a1[mx], t.y[-1])
                    use = lo_s <= hi_s
                    ix, tx = _axis_t(np.asarray(t.x), bb[mx], LINEAR)
                    lo = t.cum_many(ix, hi_s) - t.cum_many(ix, lo_s - 1.0)
                    hi = t.cum_many(ix + 1, hi_s) - t.cum_many(ix + 1, lo_s - 1.0)
                    part = np.where(use, lo + (hi - lo) * tx, 0.0)
                    total[mx] += part
            out[ok] = self._dec.eval(bb) + total / nn
        if (~ok).any():
            if self.engine is None:
                raise OutsideSurfaceError("decode_many: some shapes are outside the compiled surface", self._domain_text())
            out[~ok] = [self.decode_ms(float(x), float(y), float(z)) for x, y, z in zip(b[~ok], i[~ok], o[~ok])]
        return out

    def _fallback_vec(self, method: str, *args) -> np.ndarray:
        if self.engine is None:
            raise OutsideSurfaceError(f"{method}: some shapes are outside the compiled surface", self._domain_text())
        return np.asarray(getattr(self.engine, method)(*args), dtype=float)

    # ---- file form ---------------------------------------------------------------------------
    def metadata(self) -> dict:
        return {
            "format": FORMAT_NAME, "version": FORMAT_VERSION, "identity": self.identity, "provenance": self.provenance,
            "decode_width": self.decode_width, "attention_ops": list(self.attention_ops), "tolerance": self.tol,
            "curves": list(self.curves), "sheets": list(self.sheets),
            "tiles": {name: [list(t.ends[0]), list(t.ends[1])] for name, t in self.sheets.items()},
        }

    def to_table(self):
        import pyarrow as pa

        rows = []
        for name, c in self.curves.items():
            rows.append({"name": name, "dims": 1, "tile_x": 0, "tile_y": 0, "x": c.x, "y": [], "x_scale": LINEAR,
                         "y_scale": "", "values": c.at, "left": c.left, "right": c.right})
        for name, tiled in self.sheets.items():
            for i, row in enumerate(tiled.tiles):
                for j, s in enumerate(row):
                    if s is None:
                        continue
                    rows.append({"name": name, "dims": 2, "tile_x": i, "tile_y": j, "x": s.x, "y": s.y, "x_scale": s.sx,
                                 "y_scale": s.sy, "values": [v for r in s.v for v in r], "left": [], "right": []})
        schema = pa.schema([
            ("name", pa.string()), ("dims", pa.int8()), ("tile_x", pa.int16()), ("tile_y", pa.int16()),
            ("x", pa.list_(pa.float64())), ("y", pa.list_(pa.float64())),
            ("x_scale", pa.string()), ("y_scale", pa.string()), ("values", pa.list_(pa.float64())),
            ("left", pa.list_(pa.float64())), ("right", pa.list_(pa.float64())),
        ], metadata={METADATA_KEY: json.dumps(self.metadata(), sort_keys=True).encode()})
        return pa.Table.from_pylist(rows, schema=schema)

    def write(self, path) -> Path:
        """Write the surfaces as an Arrow IPC file (docs/surface-format.md)."""
        import pyarrow as pa

        path = Path(path)
        table = self.to_table()
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
        return path

    @classmethod
    def read(cls, path) -> Surface:
        """A surface written by :meth:`write` (no engine: queries outside its domain raise)."""
        import pyarrow as pa

        from ..errors import DataFileError

        try:
            with pa.memory_map(str(path), "r") as src:
                table = pa.ipc.open_file(src).read_all()
        except (OSError, pa.ArrowInvalid) as exc:
            raise DataFileError(f"cannot read surface file {path}", str(exc)) from None
        raw = (table.schema.metadata or {}).get(METADATA_KEY)
        if raw is None:
            raise DataFileError(f"{path} is not an infercast surface", f"its schema has no {METADATA_KEY.decode()} metadata")
        meta = json.loads(raw)
        if meta.get("format") != FORMAT_NAME or meta.get("version") != FORMAT_VERSION:
            raise DataFileError(f"{path}: unsupported surface format {meta.get('format')!r} version {meta.get('version')!r}",
                                f"this infercast reads {FORMAT_NAME} version {FORMAT_VERSION}")
        curves, parts = {}, {}
        for r in table.to_pylist():
            if r["dims"] == 1:
                curves[r["name"]] = Curve(r["x"], r["values"], r["left"], r["right"])
            else:
                sheet = Sheet(r["x"], r["y"], np.reshape(r["values"], (len(r["x"]), len(r["y"]))), r["x_scale"], r["y_scale"])
                parts.setdefault(r["name"], {})[(r["tile_x"], r["tile_y"])] = sheet
        sheets = {}
        for name, (ex, ey) in meta["tiles"].items():
            tiles = parts.get(name, {})
            grid = [[tiles.get((i, j)) for j in range(len(ey) - 1)] for i in range(len(ex) - 1)]
            sheets[name] = Tiled(ex[1:-1], ey[1:-1], grid, (tuple(ex), tuple(ey)))
        return cls(curves, sheets, float(meta["decode_width"]), list(meta["attention_ops"]), meta["identity"],
                   meta["provenance"], float(meta["tolerance"]))

    def size(self) -> int:
        """Stored numbers in all the surfaces."""
        return sum(3 * len(c.x) for c in self.curves.values()) + sum(t.size() for t in self.sheets.values())


def _safe_hi(fn1, hi: float, floor: float = 2.0) -> float:
    """The largest ``hi / 2**k`` (>= ``floor``) at which ``fn1`` answers without an error."""
    while True:
        try:
            fn1(hi)
            return hi
        except InfercastError:
            if hi / 2.0 < floor:
                raise
            hi /= 2.0


def _shrink2(fn, hx: float, hy: float) -> tuple[float, float]:
    """Halve the axis whose far edge the op-by-op path refuses (the batch axis first)."""
    ys = np.unique(np.round(2.0 ** np.linspace(0.0, math.log2(hy), 64), 6))
    try:
        fn(np.full(len(ys), hx), ys)
        x_fails = False
    except InfercastError:
        x_fails = True
    if x_fails and hx > 2.0:
        return hx / 2.0, hy
    if hy > 2.0:
        return hx, hy / 2.0
    raise NotAvailableError("cannot tabulate an attention surface", "the op-by-op path refuses even its smallest shapes")
