"""A decode worker's step time as a function of its batch, for solvers that ask it very often.

The disaggregated fixed point (:func:`~infercast.serving.disagg.solve_disagg_many`) asks the
wall time of a decode-only step at one KV length for thousands of decode batches, some thirty
times over. Each ask through the engine walks every op (a grid lookup each); yet along the batch
the step is piecewise linear: every op is interpolated linearly between its grid points (linear
and tile axes), so between two consecutive *knots* (:meth:`CompiledEngine.decode_batch_knots
<infercast.engine.compiled.CompiledEngine.decode_batch_knots>`: the batches where some op meets a
grid point) the sum of the ops is one straight line. A CUDA-graph-padded step runs its token-wise
ops on the captured size above the batch (:func:`graph_pad`), a constant within each span of
batches padded to the same size, so the edges of those spans are knots too, where the step jumps.

:class:`DecodeCurve` prices the step at two points inside every interval between knots (the GPU
time, from the engine itself, with the interval's own padding) and answers a batch inside an
interval by the straight line through them: the same numbers as the engine to rounding. Inside,
not at the ends: on a tile axis (GEMM ``m``) a grid point answers its measured value while the
blend beside it runs between smoothed knots (:mod:`infercast.interp.grid`), so the line meets
the step only strictly inside; a batch exactly on a knot is priced by the engine. The line is
not taken on trust: two more points of every interval (near either end) are priced by the
engine too, and an interval whose line misses either by more than :data:`LINE_TOLERANCE` (a
log-scale axis, a grid's edge rule beyond its last point, an engine whose knots are not all
known) is answered by the engine for the batches that fall in it, as is any batch outside the
knots' range. Host time is added per batch (:meth:`SchedulerParams.step_ms`), as for one step.
"""

from __future__ import annotations

import numpy as np

from ..interp.grid import sorted_unique
from .backends import SchedulerParams

#: the largest relative miss of an interval's straight line at its check points for the interval
#: to be answered by the line (the engine's own array and scalar paths agree to ~1e-15)
LINE_TOLERANCE = 1e-11
#: where inside an interval (as fractions of it) its line is drawn through, and where it is checked
LINE_FRACTIONS = (0.381966011250105, 0.7071067811865476)
CHECK_FRACTIONS = (0.05, 0.95)


def graph_pad(params: SchedulerParams, d: np.ndarray) -> np.ndarray:
    """:meth:`SchedulerParams.graph_pad` of each of an array of decode batches (the same rule:
    a batch up to the largest captured size runs padded to the next captured size)."""
    sizes = np.asarray(params.graph_batch_sizes or (), dtype=float)
    pad = np.zeros_like(d)
    if sizes.size:
        held = (d > 0) & (d <= sizes[-1])
        i = np.searchsorted(sizes, d[held] - 1e-9)
        pad[held] = sizes[i] - d[held]
    return pad


def decode_gpu_ms(engine, d: np.ndarray, kv: float, pad: np.ndarray) -> np.ndarray:
    """GPU time of decode-only steps of ``d`` sequences (``pad`` padding rows each) at KV length
    ``kv``: the engine's array path (:meth:`CompiledEngine.decode_steps_ms`), else its ``step_ms``."""
    fast = getattr(engine, "decode_steps_ms", None)
    if fast is not None:
        return fast(d, kv, pad)
    return engine.step_ms(dec_batch=d, dec_kv=kv, dec_pad=pad, phase="decode")


class DecodeCurve:
    """Decode-only step wall time (ms) of ``engine`` under ``params`` at KV length ``kv``, for
    batches in ``[1, top]`` (module docstring)."""

    def __init__(self, engine, params: SchedulerParams, kv: float, top: float):
        self.engine, self.params, self.kv = engine, params, float(kv)
        self.x = None  # the knots (None: every batch is priced by the engine)
        knots = getattr(engine, "decode_batch_knots", None)
        knots = knots() if knots is not None else None
        top = max(float(top), 1.0)
        if knots is None or top <= 1.0:
            return
        sizes = np.asarray(params.graph_batch_sizes or (), dtype=float)
        # the spans padded to one captured size end just above each size (graph_pad's 1e-9)
        edges = np.concatenate([sizes[:-1] + 1e-9, sizes[-1:]]) if sizes.size else sizes
        x = sorted_unique(np.concatenate([[1.0, top], knots, edges]))
        x = x[(x >= 1.0) & (x <= top)]
        # each interval's padding: that of a batch inside it (constant across the interval)
        mid = (x[:-1] + x[1:]) / 2.0
        rows = mid + graph_pad(params, mid)
        padded = graph_pad(params, mid) != 0.0

        def pad_at(at):  # padding rows of a batch ``at`` priced as a member of each interval
            return np.where(padded, rows - at, 0.0)

        width = x[1:] - x[:-1]
        (f1, f2), at = LINE_FRACTIONS, lambda f: x[:-1] + f * width  # noqa: E731
        p1, p2 = at(f1), at(f2)
        v1, v2 = (decode_gpu_ms(engine, q, self.kv, pad_at(q)) for q in (p1, p2))
        slope = (v2 - v1) / (p2 - p1)
        ok = np.ones(mid.size, dtype=bool)
        for f in CHECK_FRACTIONS:
            q = at(f)
            exact = decode_gpu_ms(engine, q, self.kv, graph_pad(params, q))
            ok &= np.abs(v1 + (q - p1) * slope - exact) <= LINE_TOLERANCE * np.abs(exact)
        self.x, self.p1, self.v1, self.slope, self.ok = x, p1, v1, slope, ok

    def gpu_ms(self, d: np.ndarray) -> np.ndarray:
        """GPU time of a decode-only step of each batch of ``d`` (>= 1)."""
        d = np.asarray(d, dtype=float)
        if self.x is None:
            return decode_gpu_ms(self.engine, d, self.kv, graph_pad(self.params, d))
        x = self.x
        j = np.clip(np.searchsorted(x, d, side="left") - 1, 0, x.size - 2)
        out = self.v1[j] + (d - self.p1[j]) * self.slope[j]
        # outside the knots, on a knot (a tile grid's measured point), or in an interval off its line
        off = ~self.ok[j] | (d <= x[j]) | (d >= x[j + 1])
        if off.any():
            q = d[off]
            out[off] = decode_gpu_ms(self.engine, q, self.kv, graph_pad(self.params, q))
        return out

    def step_ms(self, d: np.ndarray) -> np.ndarray:
        """Wall time of a decode-only step of each batch of ``d`` (>= 1): GPU time and the host's."""
        return self.params.step_ms(self.gpu_ms(d), d)
