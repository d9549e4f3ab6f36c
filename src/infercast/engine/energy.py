"""Energy of a step, from the perf tables that measured the GPU's power beside the latency.

A few tables carry a ``power`` column (watts, the GPU's mean board power while the kernel ran;
in the pack: b200_sxm vLLM 0.22.0 context and generation attention and MoE, see
/work/shared/docs/perf-data-format.md). For an op answered from such a table, its energy per
call is power x latency. Where it comes from:

* every measured row's energy, ``power x latency`` (W x ms = mJ), becomes the value of a copy of
  the table (:func:`energy_view`), and the op is resolved against those copies by the same
  resolvers (:mod:`infercast.ops`) and grids (:mod:`infercast.interp`) as its latency: the same
  sites, curves, axes, blends, transfers and edges. Along a curve the energy is interpolated as
  latency is; where latency is transferred or extended through utilisation (SOL / measured), the
  energy scales with it, i.e. the power of the measured donor points is carried over;
* an op counts as *measured* only when its energy lookup resolved exactly as its latency lookup
  did (the same table, version, kernel, method, donor sites and notes: ``Resolved.describe``), so
  an energy never comes from another path than the time it multiplies. An op whose table has no
  power column, an analytic op (norms, element-wise, P2P), a SOL answer, or one that resolved
  differently is *not measured*: it has no energy here, and its time is reported as not covered.

A step's :class:`StepEnergy` sums, per GPU, the measured ops' energy and time and every op's
time; ``covered_ms / gpu_ms`` is the share of the predicted GPU time whose power was measured.
The energy lookups run in SILICON mode whatever the latency's mode (an empirical or roofline
answer has no measured power).
"""

from __future__ import annotations

import weakref
from copy import copy
from dataclasses import dataclass, fields

import numpy as np

from ..data.database import PerfData
from ..data.tables import Table, column_was_read
from ..errors import InfercastError, NotAvailableError
from ..ops.base import DatabaseMode, OpDB
from .compiled import ANALYTIC_KINDS, CompiledEngine

#: the measured column that makes a table's ops' energy known
POWER = "power"

_VIEWS: dict[int, tuple[Table, Table]] = {}
#: :meth:`EnergyModel.of`'s models, per engine
_MODELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def energy_view(table: Table) -> Table:
    """``table`` with each row's ``latency`` replaced by its energy, ``power x latency`` (mJ when
    latency is in ms and power in W); the same keys. Raises :class:`NotAvailableError` for a
    table without a power column. One view per loaded table (kept while the table is)."""
    if POWER not in table.values or "latency" not in table.values:
        raise NotAvailableError(f"table {table.stem} has no measured power", str(table.path))
    hit = _VIEWS.get(id(table))
    if hit is not None and hit[0] is table:
        return hit[1]
    view = Table(table.stem, table.path, table.keys, {"latency": table.values["latency"] * table.values[POWER]},
                 table.raw_rows, table.duplicate_keys)
    _VIEWS[id(table)] = (table, view)
    return view


@dataclass
class EnergyData(PerfData):
    """A :class:`PerfData` whose tables are their :func:`energy_view`: the same tables served by
    the same rules (versions, backfill, siblings, peers), each read as energy; a table without
    measured power is not available. The databases it hands out for other versions and backends
    are energy data too."""

    @classmethod
    def of(cls, data: PerfData) -> EnergyData:
        return cls(**{f.name: getattr(data, f.name) for f in fields(PerfData) if f.name != "served"})

    def table(self, stem: str) -> Table:
        return energy_view(super().table(stem))

    def comm_library_table(self) -> Table:
        return energy_view(super().comm_library_table())

    def for_backend(self, backend: str) -> PerfData:
        return EnergyData.of(super().for_backend(backend))

    def older_versions(self) -> list[PerfData]:
        return [EnergyData.of(d) for d in super().older_versions()]


@dataclass(frozen=True)
class StepEnergy:
    """One GPU's share of a step (or a weighted sum of steps): ``energy_mj`` of the measured ops
    (W x ms), ``covered_ms`` their time, ``gpu_ms`` every op's time."""

    energy_mj: float = 0.0
    covered_ms: float = 0.0
    gpu_ms: float = 0.0

    def __add__(self, other: StepEnergy) -> StepEnergy:
        return StepEnergy(self.energy_mj + other.energy_mj, self.covered_ms + other.covered_ms, self.gpu_ms + other.gpu_ms)

    def scaled(self, w: float) -> StepEnergy:
        return StepEnergy(self.energy_mj * w, self.covered_ms * w, self.gpu_ms * w)

    @property
    def coverage(self) -> float:
        """Share of the GPU time whose power was measured (0 when there is no GPU time)."""
        return self.covered_ms / self.gpu_ms if self.gpu_ms > 0 else 0.0


def power_was_read() -> bool:
    """Whether any perf table this process has read carries a power column
    (:func:`infercast.data.tables.column_was_read`). An op's energy counts only when it resolves
    to the very table its latency came from (:func:`_same_path`), and an engine has read every
    table its ops resolved to by the time its :class:`EnergyModel` is built; so when no table read
    has power, no op can have measured energy and the model skips resolving its ops again, at no
    I/O."""
    return column_was_read(POWER)


def _same_path(a, b) -> bool:
    return len(a.resolved) == len(b.resolved) and all(
        x.describe() == y.describe() for x, y in zip(a.resolved, b.resolved))


class EnergyModel:
    """Per-step energy of a :class:`CompiledEngine` (module docstring). ``measured`` names the
    ops whose energy is known."""

    def __init__(self, engine: CompiledEngine, weak: bool = False):
        # ``weak`` (:meth:`of`, one model per live engine): the model must not keep its engine alive
        self._engine = weakref.ref(engine) if weak else (lambda: engine)
        self.measured: tuple[str, ...] = ()
        self.unmeasured: tuple[str, ...] = tuple(c.name for c in engine.ops)
        self._energy = self._covered = None
        if engine.db.mode is DatabaseMode.SOL or not power_was_read():
            return
        probe = copy(engine)  # the same plan and compiler, reading energy tables
        probe.db = OpDB.shared(EnergyData.of(engine.db.data), DatabaseMode.SILICON)
        energy_ops, time_ops = [], []
        for c in engine.ops:
            if c.op.kind in ANALYTIC_KINDS:
                continue  # no table, no power
            try:
                e = probe._compile_backfilled(c.op)
            except (InfercastError, KeyError):
                continue
            if _same_path(c, e):
                energy_ops.append(e)
                time_ops.append(c)
        if not energy_ops:
            return
        self.measured = tuple(c.name for c in time_ops)
        self.unmeasured = tuple(c.name for c in engine.ops if c.name not in set(self.measured))
        self._energy = self._subset(energy_ops)
        self._covered = self._subset(time_ops)

    @property
    def engine(self) -> CompiledEngine:
        return self._engine()

    @classmethod
    def of(cls, engine: CompiledEngine) -> EnergyModel:
        """The engine's energy model, built once per engine (kept while the engine is)."""
        model = _MODELS.get(engine)
        if model is None:
            model = _MODELS[engine] = cls(engine, weak=True)
        return model

    def _subset(self, ops) -> CompiledEngine:
        e = copy(self.engine)
        e.ops = list(ops)
        e._index_ops()
        return e

    @property
    def available(self) -> bool:
        """Whether any op's power was measured."""
        return bool(self.measured)

    def step(self, weights=None, **shape) -> StepEnergy:
        """The :class:`StepEnergy` of one GPU for the step ``shape`` (the keywords of
        :meth:`CompiledEngine.step_ms`); with array shapes and ``weights``, the weighted sum over
        them."""
        gpu = np.asarray(self.engine.step_ms(**shape), dtype=float)
        if self._energy is None:
            mj = cov = np.zeros_like(gpu)
        else:
            mj = np.asarray(self._energy.step_ms(**shape), dtype=float)
            cov = np.asarray(self._covered.step_ms(**shape), dtype=float)
        w = np.ones_like(gpu) if weights is None else np.broadcast_to(np.asarray(weights, dtype=float), gpu.shape)
        return StepEnergy(float(np.sum(w * mj)), float(np.sum(w * cov)), float(np.sum(w * gpu)))
