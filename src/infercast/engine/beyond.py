"""Which ops a step answers beyond their measured tables, and the notes that say so.

An op's compiled grid (:class:`~infercast.interp.grid.Grid`) answers a query outside its axes'
range by holding the edge's utilisation (provenance ``held``), and a query inside the range on a
cell the table did not measure (a truncated ``batch x length`` corner, a curve extended from its
siblings) from the nearest measured cell, also ``held``. Either way the number is not a
measurement at that shape. :func:`find` lists, for one step shape, every op so answered with the
axis, the query and the grid's range on that axis (the measured range the compiled table
covers); :func:`op_times` gives an op's time in a step or its mean over steps; :func:`notes`
turns both into one line per op for a result's ``notes``.

Axis names follow what the engine queries (:mod:`infercast.engine.compiled`): token-wise ops
(GEMM, MoE, MoE dispatch) at ``tokens``, collectives at ``message elements``, context attention
at ``(batch, tokens per sequence)`` (new plus cached tokens), generation attention at
``(batch, cached tokens)``. Ops answered from the roofline or a learned utilisation (SOL /
EMPIRICAL modes, HYBRID fallbacks) are not listed: they have no table to be beyond.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..interp.provenance import Prov

COLLECTIVE_KINDS = ("allreduce", "allgather", "reduce_scatter", "alltoall")
#: resolutions with no measured table behind them
UNMEASURED_HOW = ("sol", "empirical")


@dataclass(frozen=True)
class Excursion:
    """One op answered outside what its table measured, in one phase."""

    op: str
    phase: str  # "prefill" | "decode"
    axis: str  # the curve axis's name; for an unmeasured cell inside the range, "axis value x axis value"
    value: float  # the query on that axis (nan for a cell inside the range)
    lo: float  # the measured range on that axis (cells with provenance below held)
    hi: float
    how: str = ""  # for a cell inside the range: how the op's grid was built (resolution, donor sites)

    @property
    def inside(self) -> bool:
        return not np.isfinite(self.value)

    @property
    def above(self) -> bool:
        return bool(self.value > self.hi)

    def text(self) -> str:
        if self.inside:
            return f"{self.axis}, a point the table did not measure ({self.how})"
        if self.above:
            return f"{self.axis} {number(self.value)}, measured up to {number(self.hi)}"
        return f"{self.axis} {number(self.value)}, measured from {number(self.lo)}"


def number(x: float) -> str:
    """A query or a bound as the user reads it: whole numbers with thousands separators."""
    x = float(x)
    return f"{int(round(x)):,}" if abs(x - round(x)) < 1e-9 * max(1.0, abs(x)) else f"{x:,.4g}"


def axis_names(kind: str, part: int) -> tuple[str, ...]:
    """The names of the curve axes an op of ``kind`` is queried on (``part`` 0: context / the
    token-wise grid, 1: generation)."""
    from .compiled import ATTENTION_KINDS

    if kind in ATTENTION_KINDS:
        return ("batch", "tokens per sequence") if part == 0 else ("batch", "cached tokens")
    if kind in COLLECTIVE_KINDS:
        return ("message elements",)
    return ("tokens",)


def _measured_extent(g, a: int, coords: tuple[float, ...]) -> tuple[float, float] | None:
    """The range of axis ``a`` over which ``g`` holds measured cells (provenance below ``held``):
    on a 2-D grid, along the grid lines of the other axis that bracket the query (a truncated
    ``batch x length`` table measures fewer batches at long lengths); None when no cell there is
    measured (a grid transferred whole from held donors)."""
    measured = np.asarray(g.prov) < int(Prov.HELD)
    if measured.ndim == 2:
        b = 1 - a
        ax_b = g.axes[b]
        j = int(np.clip(np.searchsorted(ax_b, coords[b], side="right") - 1, 0, len(ax_b) - 1))
        lines = sorted({j, min(j + 1, len(ax_b) - 1)})
        m = np.moveaxis(measured, b, 0)[lines].any(axis=0)
    else:
        m = measured
    if not m.any():
        return None
    xs = g.axes[a][m]
    return float(xs[0]), float(xs[-1])


def _check(resolved, coords: tuple[float, ...], names: tuple[str, ...], op: str, phase: str) -> list[Excursion]:
    g = resolved.grid
    if g is None or resolved.how in UNMEASURED_HOW:
        return []
    out = []
    for a, q in enumerate(coords):
        ext = _measured_extent(g, a, coords)
        if ext is not None and (q > ext[1] or q < ext[0]):
            out.append(Excursion(op, phase, names[a], float(q), *ext))
    if not out and int(g.scalar(*coords)[1]) == int(Prov.HELD):
        where = " x ".join(f"{n} {number(q)}" for n, q in zip(names, coords))
        how = f"{resolved.source} {resolved.how}" + (f" from {', '.join(str(d) for d in resolved.donors)}" if resolved.donors else "")
        out.append(Excursion(op, phase, where, float("nan"), float("nan"), float("nan"), how))
    return out


def find(engine, *, ctx_batch: float = 0.0, ctx_isl: float = 1.0, ctx_prefix: float = 0.0, dec_batch: float = 0.0,
         dec_kv: float = 1.0, dec_pad: float = 0.0, phase: str) -> list[Excursion]:
    """Every op of ``engine`` (a :class:`~infercast.engine.compiled.CompiledEngine`) that one step
    of this shape answers beyond its table, with the same per-op queries as
    :meth:`~infercast.engine.compiled.CompiledEngine.components`; ``phase`` ("prefill" /
    "decode") selects the ops as there and labels the excursions."""
    from .compiled import ANALYTIC_KINDS, ATTENTION_KINDS, STATEFUL_KINDS

    rows = dec_batch + dec_pad
    tokens = ctx_batch * ctx_isl + rows * engine.decode_width
    seqs = ctx_batch + rows
    out: list[Excursion] = []
    for c in engine.ops:
        if c.op.phase not in ("both", phase) or c.op.kind in ANALYTIC_KINDS:
            continue
        draft = c.op.phase == "decode"
        if c.op.kind in ATTENTION_KINDS:
            if ctx_batch > 0 and not draft:
                length = ctx_isl if c.op.kind in STATEFUL_KINDS else ctx_isl + ctx_prefix
                out += _check(c.resolved[0], (ctx_batch, length), axis_names(c.op.kind, 0), c.name, phase)
            if dec_batch > 0:
                step = max(dec_kv - 1.0, 1.0)
                out += _check(c.resolved[1], (dec_batch, step), axis_names(c.op.kind, 1), c.name, phase)
            continue
        n = (rows if draft else tokens) if c.op.tokens == "all" else (rows if draft else seqs)
        if n <= 0:
            continue
        context = ctx_batch > 0 and not draft
        r = c.resolved[1] if c.phase_split and not context else c.resolved[0]
        out += _check(r, (n * c.x_per_token,), axis_names(c.op.kind, 0), c.name, phase)
    return out


def farthest(excursions: list[Excursion]) -> list[Excursion]:
    """One excursion per (op, phase, axis, side): the farthest from the table (queries over
    several step shapes, e.g. the first and last decode step)."""
    best: dict[tuple, Excursion] = {}
    for e in excursions:
        key = (e.op, e.phase, "inside" if e.inside else e.axis, e.above)
        old = best.get(key)
        if old is None or (not e.inside and (e.value > old.value if e.above else e.value < old.value)):
            best[key] = e
    return list(best.values())


def op_times(engine, names, weights=None, **shape) -> dict[str, float]:
    """The time (ms, over the op's count) of each op in ``names`` at the step(s) ``shape``
    describes (the arguments of :meth:`~infercast.engine.compiled.CompiledEngine.components`;
    arrays are several steps, averaged with ``weights``)."""
    comps = engine.components(**shape, only=set(names))
    out = {}
    for name, (v, _) in comps.items():
        v = np.atleast_1d(np.asarray(v, dtype=float))
        out[name] = float(np.average(v, weights=weights)) if weights is not None else float(v.mean())
    return out


def notes(records: list[tuple[list[Excursion], dict[str, float], float, str]], order: list[str], approx: bool = False) -> list[str]:
    """One note per op answered beyond its table. ``records``: per phase, its excursions, the
    ops' shares of that phase's step(s), a factor that turns a step share into a share of the
    latency (1 for a static estimate) and the latency's name ("TTFT" / "TPOT"); ``order``: the ops'
    order in the plan. ``approx``: the shares are of representative steps (serving models)."""
    by_op: dict[str, list[str]] = {}
    for excursions, shares, factor, latency in records:
        per_op: dict[str, list[Excursion]] = {}
        for e in farthest(excursions):
            per_op.setdefault(e.op, []).append(e)
        for op, es in per_op.items():
            share = min(max(shares.get(op, 0.0) * factor, 0.0), 1.0)
            phase = es[0].phase
            pct = "<0.1%" if 0.0 < share < 0.001 else ("~" if approx else "") + f"{share:.1%}"
            by_op.setdefault(op, []).append(f"{phase} {'; '.join(e.text() for e in es)} ({pct} of {latency})")
    return [f"{op} answered outside its measured table (held: the nearest measured point's utilisation carried over): "
            + "; ".join(by_op[op]) for op in order if op in by_op]
