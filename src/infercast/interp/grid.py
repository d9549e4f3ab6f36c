"""Resolved lookup grids: the per-op form the engine evaluates on its hot path.

A :class:`Grid` holds one op's latency on a rectilinear grid of 1 or 2 curve axes (e.g. GEMM:
``m``; attention: ``batch x length``), already filled (missing cells held, off-site shapes
transferred) at compile time, plus a provenance code per cell.

Between grid points values are interpolated **piecewise power-law** (linear in log(x), log(y)):
latency curves are power laws over wide ranges (flat when memory-latency bound, linear in m or
batch when throughput bound, quadratic in context length), and a power law between neighbours
reproduces each of those regimes exactly where a linear blend would bend. At a grid point the
weights are exactly 0/1, so an exact hit returns the stored value bit for bit
(``v0**1 * v1**0 == v0``).

Outside the grid the query is clamped to the boundary and scaled by the speed-of-light ratio
``SOL(query) / SOL(boundary)``: the boundary's utilisation is held (see :mod:`.transfer` for
when that is allowed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .provenance import Prov


def _locate(axis: np.ndarray, q: np.ndarray):
    """Index of the left neighbour and the log-space weight of the right one (q clamped)."""
    qc = np.clip(q, axis[0], axis[-1])
    if len(axis) == 1:
        return np.zeros(q.shape, dtype=np.intp), np.zeros(q.shape), qc
    i = np.searchsorted(axis, qc, side="right") - 1
    i = np.clip(i, 0, len(axis) - 2)
    x0, x1 = axis[i], axis[i + 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(qc <= x0, 0.0, np.where(qc >= x1, 1.0, np.log(qc / x0) / np.log(x1 / x0)))
    return i, t, qc


def _blend(v0, v1, t):
    pos = (v0 > 0) & (v1 > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        geo = np.power(v0, 1.0 - t) * np.power(v1, t)
    return np.where(pos, geo, v0 * (1.0 - t) + v1 * t)


SolFn = Callable[..., np.ndarray]


@dataclass
class Grid:
    axes: tuple[np.ndarray, ...]  # 1 or 2 sorted float arrays
    values: np.ndarray  # shape = tuple(len(a) for a in axes)
    prov: np.ndarray  # int8 Prov codes, same shape
    sol: SolFn | None = None  # sol(*coords) -> ms, for holding utilisation beyond the grid
    sites: tuple = ()  # transfer donors (for --explain)

    def __post_init__(self):
        self.axes = tuple(np.asarray(a, dtype=float) for a in self.axes)
        self.values = np.asarray(self.values, dtype=float)

    def __call__(self, *coords) -> tuple[np.ndarray, np.ndarray]:
        """Latency (ms) and provenance codes for arrays of coordinates (broadcast together)."""
        coords = np.broadcast_arrays(*(np.asarray(c, dtype=float) for c in coords))
        if len(coords) != len(self.axes):
            raise ValueError(f"grid has {len(self.axes)} axes, got {len(coords)} coordinates")
        if len(self.axes) == 1:
            n = len(self.axes[0])
            i, t, qc = _locate(self.axes[0], coords[0])
            i1 = np.minimum(i + 1, n - 1)
            v = _blend(self.values[i], self.values[i1], t)
            on = (t == 0.0) | (t == 1.0)
            p = np.where(t == 0.0, self.prov[i], np.where(t == 1.0, self.prov[i1], np.maximum(self.prov[i], self.prov[i1])))
            clamped = (qc,)
        else:
            (i, ti, qa), (j, tj, qb) = _locate(self.axes[0], coords[0]), _locate(self.axes[1], coords[1])
            ni, nj = len(self.axes[0]), len(self.axes[1])
            i1, j1 = np.minimum(i + 1, ni - 1), np.minimum(j + 1, nj - 1)
            V = self.values
            top = _blend(V[i, j], V[i1, j], ti)
            bot = _blend(V[i, j1], V[i1, j1], ti)
            v = _blend(top, bot, tj)
            on = ((ti == 0.0) | (ti == 1.0)) & ((tj == 0.0) | (tj == 1.0))
            P = self.prov
            # an exact hit only depends on its own cell
            ci = np.where(ti == 1.0, i1, i)
            cj = np.where(tj == 1.0, j1, j)
            p = np.where(on, P[ci, cj], np.maximum.reduce([P[i, j], P[i1, j], P[i, j1], P[i1, j1]]))
            clamped = (qa, qb)
        p = np.where(on, p, np.maximum(p, Prov.INTERPOLATED))
        outside = coords[0] != clamped[0]
        for c, qc in zip(coords[1:], clamped[1:]):
            outside = outside | (c != qc)
        if outside.any():
            if self.sol is None:
                raise ValueError("query outside the grid and no SOL function to hold utilisation")
            ratio = self.sol(*coords) / self.sol(*clamped)
            v = np.where(outside, v * ratio, v)
            p = np.where(outside, np.maximum(p, Prov.HELD), p)
        return v, p.astype(np.int8)
