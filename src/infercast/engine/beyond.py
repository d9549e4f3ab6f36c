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

from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from ..interp.provenance import Prov
from .compiled import ANALYTIC_KINDS, ATTENTION_KINDS, CP_KINDS, STATEFUL_KINDS

COLLECTIVE_KINDS = ("allreduce", "allgather", "reduce_scatter", "alltoall") + CP_KINDS
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
    if kind in ATTENTION_KINDS:
        return ("batch", "tokens per sequence") if part == 0 else ("batch", "cached tokens")
    if kind in COLLECTIVE_KINDS:
        return ("message elements",)
    return ("tokens",)


def _extents(g) -> dict:
    """Per grid, computed once (kept on the grid object): whether any cell is held, and the
    measured range of each axis (cells with provenance below ``held``, or ``analytic``): one range for a 1-D grid;
    on a 2-D grid one per pair of neighbouring grid lines of the other axis (a truncated
    ``batch x length`` table measures fewer batches at long lengths)."""
    cache = g.__dict__.get("_beyond_extents")
    if cache is not None:
        return cache
    prov = np.asarray(g.prov)
    # analytic cells are a composition of measured stages (a collective across nodes,
    # ops.comm._cross_node) at the stages' measured sizes: inside what was measured
    measured = (prov < int(Prov.HELD)) | (prov == int(Prov.ANALYTIC))

    def rng(axis, m):
        return (float(axis[m][0]), float(axis[m][-1])) if m.any() else None

    if measured.ndim == 1:
        per_axis = [[rng(g.axes[0], measured)]]
    else:
        per_axis = []
        for a in (0, 1):
            lines = np.moveaxis(measured, 1 - a, 0)  # lines of the other axis
            n = len(lines)
            per_axis.append([rng(g.axes[a], lines[j] | lines[min(j + 1, n - 1)]) for j in range(n)])
    cache = {"held": bool((~measured).any()), "ranges": per_axis, "axes": [a.tolist() for a in g.axes]}
    g.__dict__["_beyond_extents"] = cache
    return cache


def _measured_extent(ext: dict, a: int, coords: tuple[float, ...]) -> tuple[float, float] | None:
    """The measured range of axis ``a`` at the query (:func:`_extents`); None when no cell there
    is measured (a grid transferred whole from held donors)."""
    ranges = ext["ranges"][a]
    if len(ranges) == 1:
        return ranges[0]
    other = ext["axes"][1 - a]
    j = min(max(bisect_right(other, coords[1 - a]) - 1, 0), len(other) - 1)
    return ranges[j]


def _check(resolved, coords: tuple[float, ...], names: tuple[str, ...], op: str, phase: str) -> list[Excursion]:
    g = resolved.grid
    if g is None or resolved.how in UNMEASURED_HOW:
        return []
    out = []
    ext = _extents(g)
    for a, q in enumerate(coords):
        rng = _measured_extent(ext, a, coords)
        if rng is not None and (q > rng[1] or q < rng[0]):
            out.append(Excursion(op, phase, names[a], float(q), *rng))
    if not out and ext["held"] and int(g.scalar(*coords)[1]) == int(Prov.HELD):
        where = " x ".join(f"{n} {number(q)}" for n, q in zip(names, coords))
        how = f"{resolved.source} {resolved.how}" + (f" from {', '.join(str(d) for d in resolved.donors)}" if resolved.donors else "")
        out.append(Excursion(op, phase, where, float("nan"), float("nan"), float("nan"), how))
    return out


def _tokenwise_query(engine, c, ctx_batch: float, ctx_isl: float, dec_batch: float, dec_pad: float):
    """(resolved grid, coordinate) a step asks a token-wise op, or None when the op does not run
    in it: the same choice of tokens / sequences, draft rows and phase-split grid as
    :meth:`~infercast.engine.compiled.CompiledEngine.components`."""
    rows = dec_batch + dec_pad
    draft = c.op.phase == "decode"
    if c.op.tokens == "all":
        n = rows if draft else ctx_batch * ctx_isl / getattr(engine, "cp", 1) + rows * engine.decode_width
    else:
        n = rows if draft else ctx_batch + rows
    if n <= 0:
        return None
    context = ctx_batch > 0 and not draft
    return (c.resolved[1] if c.phase_split and not context else c.resolved[0]), n * c.x_per_token


def find(engine, *, ctx_batch: float = 0.0, ctx_isl: float = 1.0, ctx_prefix: float = 0.0, dec_batch: float = 0.0,
         dec_kv: float = 1.0, dec_pad: float = 0.0, phase: str) -> list[Excursion]:
    """Every op of ``engine`` (a :class:`~infercast.engine.compiled.CompiledEngine`) that one step
    of this shape answers beyond its table, with the same per-op queries as
    :meth:`~infercast.engine.compiled.CompiledEngine.components`; ``phase`` ("prefill" /
    "decode") selects the ops as there and labels the excursions."""
    out: list[Excursion] = []
    for c in engine.ops:
        if c.op.phase not in ("both", phase) or c.op.kind in ANALYTIC_KINDS:
            continue
        if c.op.kind == "cp_exchange":  # context parallelism: the K/V all-gather of the prompts
            if ctx_batch > 0:
                out += _check(c.resolved[0], (ctx_batch * (ctx_isl + ctx_prefix) * c.x_per_token,), axis_names(c.op.kind, 0), c.name, phase)
            continue
        if c.op.kind == "cp_combine":  # and the decodes' partial outputs
            if dec_batch > 0:
                width = 1.0 if c.op.phase == "decode" else engine.decode_width
                out += _check(c.resolved[0], (dec_batch * width * c.x_per_token,), axis_names(c.op.kind, 0), c.name, phase)
            continue
        if c.op.kind in ATTENTION_KINDS:
            if ctx_batch > 0 and c.op.phase != "decode":
                length = ctx_isl if c.op.kind in STATEFUL_KINDS else ctx_isl + ctx_prefix
                out += _check(c.resolved[0], (ctx_batch, length), axis_names(c.op.kind, 0), c.name, phase)
            if dec_batch > 0:
                cp = getattr(engine, "cp", 1)
                step = max(dec_kv - 1.0, 1.0) if cp == 1 else max((dec_kv - 1.0) / cp, 1.0)
                out += _check(c.resolved[1], (dec_batch, step), axis_names(c.op.kind, 1), c.name, phase)
            continue
        q = _tokenwise_query(engine, c, ctx_batch, ctx_isl, dec_batch, dec_pad)
        if q is not None:
            out += _check(q[0], (q[1],), axis_names(c.op.kind, 0), c.name, phase)
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
    ``dec_kv`` may be an array of several decode steps, averaged with ``weights``). Token-wise ops
    do not depend on the KV length: one scalar lookup each (as
    :meth:`~infercast.engine.compiled.CompiledEngine.tokenwise_scalar` sums them); attention ops
    through ``components``."""
    names = set(names)
    out = {}
    attention = set()
    for c in engine.ops:
        if c.name not in names:
            continue
        if c.op.kind in ATTENTION_KINDS + CP_KINDS:
            attention.add(c.name)
            continue
        q = _tokenwise_query(engine, c, float(shape.get("ctx_batch", 0.0)), float(shape.get("ctx_isl", 1.0)),
                             float(shape.get("dec_batch", 0.0)), float(shape.get("dec_pad", 0.0)))
        out[c.name] = q[0].grid.scalar(q[1], refuse=True)[0] * c.op.count if q is not None else 0.0
    if attention:
        for name, (v, _) in engine.components(**shape, only=attention).items():
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
