"""One (system, backend, version) view of the pack: the tables that answer its queries.

**Sibling consistency of composite tables.** A composite table (``*_module``: a whole attention
block timed as one, projections, kernel and the glue between them) depends on how the collector
ran the block (graph capture or eager launches), not only on the GPU. When such a table on a
system is far slower than the same file (backend, version) on a sibling system of the same GPU
generation whose GPU it out-specs or equals (same or newer SM variant, memory bandwidth and
bf16 / fp8 tensor FLOPs all >=), the table contradicts its hardware: a median slowdown over the shared grid points above
:data:`SIBLING_SLOWDOWN` serves the sibling's table instead (the faster GPU is then predicted no
faster than the weaker one, a conservative answer), and provenance says so (``how`` =
``sibling:<system>``). In the 0.12.0 pack this catches vLLM 0.24.0's MLA module tables on
b300_sxm and gb200 (median 1.64-1.71x b200's, while every kernel-level table of the same version
is 0.88-1.00x); see docs/modelling-log.md, 'Composite tables from a sibling system'.

**Peer-backend consistency.** The sibling rule needs a dominated system whose table is sound; on
Hopper both vLLM 0.24.0 MLA module tables (h100, h200) carry the same slowdown, so it cannot
fire. There another backend's copy of the same composite table is the witness: when this
backend's table is more than :data:`SIBLING_SLOWDOWN` slower (median over shared shapes, kernels
merged) than a peer backend's on the same system, *and* on some other system the two backends'
tables agree within :data:`PEER_AGREEMENT` (so the two implementations do not differ by that
much where both were collected soundly), the slowdown belongs to the collection, and the peer's
table is served (``how`` = ``peer:<backend> ...``). Without an agreeing system the backends are
taken to differ for real and nothing changes: in the 0.12.0 pack the DSA and MSA modules differ
by backend on every system (0.4-0.6x, 5-60x) and stay. It fires for vLLM 0.24.0's MLA
generation module on h100 / h200 (1.6x TensorRT-LLM 1.3.0rc20's; the two agree within 3% on
b200 and gb300 0.27.0) and rtx_pro_6000 (1.3x); the slowdown is largest for the smallest shapes
(1.8x at 1-16 heads, a fixed ~30 us per call), the signature of launch overhead, not of a kernel.
See docs/modelling-log.md, 'Composite tables from a peer backend'.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import InfercastError, InvalidInputError, NotAvailableError
from .pack import Pack, find_pack
from .system import SystemSpec, list_systems, load_system
from .tables import Table, cached_table
from .versions import (
    SERVING_BACKENDS,
    TableLocation,
    VersionInfo,
    find_in_version,
    locate_table,
    version_info,
    version_key,
)

#: a composite table this much slower (median over shared grid points) than a dominated
#: sibling's is served by the sibling (see the module docstring)
SIBLING_SLOWDOWN = 1.3
#: fewest shared grid points for the comparison
SIBLING_MIN_SHARED = 20
#: tensor-FLOP dtypes the dominance check compares
SIBLING_FLOP_DTYPES = ("bfloat16", "fp8")
#: two backends' composite tables "agree" on a system when their median latency ratio is within
#: this factor either way (see the module docstring)
PEER_AGREEMENT = 1.10
#: key columns that name an implementation, not a shape: ignored when two backends are compared
PEER_IGNORED_KEYS = ("kernel_source", "op_name")
#: composite tables the peer rule may serve across backends: the MLA modules share one schema and
#: their readers (``ops.mla``) key the collector conventions on the table's own backend. The DSA
#: modules are left out: SGLang's carry eager-run rows that ``ops.dsa`` treats per backend, and
#: no silicon row could check a TensorRT-LLM DSA swap on Hopper.
PEER_STEMS = ("mla_context_module", "mla_generation_module")


#: (table path, system) -> the sibling that serves it instead, or None (per process)
_SIBLING_VERDICTS: dict[tuple[str, str], tuple[TableLocation, Table] | None] = {}


def is_composite(stem: str) -> bool:
    return stem.endswith("_module")


def _dominates(a: SystemSpec, b: SystemSpec) -> bool:
    """GPU of ``a`` is of the same generation as ``b``'s, no older a variant, and no weaker on any
    compared axis."""
    ga, gb = a.gpu, b.gpu
    if ga.sm_version is None or gb.sm_version is None or ga.sm_version // 10 != gb.sm_version // 10:
        return False
    if ga.sm_version < gb.sm_version:  # a newer variant (sm103 vs sm100) may add units (attention)
        return False
    if ga.mem_bw < gb.mem_bw:
        return False
    for dt in SIBLING_FLOP_DTYPES:
        fa, fb = ga.flops(dt), gb.flops(dt)
        if fa is None or fb is None or fa < fb:
            return False
    return True


def median_slowdown(mine: Table, theirs: Table, ignore: tuple[str, ...] = ()) -> tuple[float, int]:
    """Median latency ratio ``mine / theirs`` over the grid points both tables hold (same key
    columns, same values), and how many there are. Columns in ``ignore`` are left out of the
    match; a shape held by several of their values (kernels) counts at its fastest."""
    own = set(mine.keys) - set(ignore)
    cols = sorted(own & set(theirs.keys))
    if not cols or set(cols) != own or "latency" not in mine.values or "latency" not in theirs.values:
        return float("nan"), 0

    def index(t: Table) -> dict:
        out: dict = {}
        for k, v in zip(zip(*(t.keys[c].tolist() for c in cols)), t.values["latency"].tolist()):
            out[k] = min(v, out.get(k, float("inf")))
        return out

    a, b = index(mine), index(theirs)
    shared = [k for k in a if k in b and a[k] > 0 and b[k] > 0]
    if not shared:
        return float("nan"), 0
    return float(np.median([a[k] / b[k] for k in shared])), len(shared)


#: the open records of table reads (innermost last; :func:`recording_reads`)
_READ_RECORDS: list[list] = []


@contextmanager
def recording_reads():
    """Within the block, every table a :class:`PerfData` serves is noted in the list the block
    yields, as ``(system, backend, version, stem, location, path, measured columns)``: what a
    compile read, so that :mod:`infercast.engine.compile_cache` can replay a kept compile's side
    effects (:attr:`PerfData.served`, the provenance an estimate reports, and
    :data:`~infercast.data.tables.COLUMNS_READ`). Blocks nest: an inner block's reads are noted in
    the outer ones too."""
    record: list = []
    _READ_RECORDS.append(record)
    try:
        yield record
    finally:
        _READ_RECORDS.remove(record)


def _note_read(data: PerfData, stem: str, loc: TableLocation, table: Table) -> None:
    if _READ_RECORDS:
        entry = (data.system.name, data.backend, data.version, stem, loc, str(table.path), frozenset(table.values))
        for record in _READ_RECORDS:
            record.append(entry)


@dataclass
class PerfData:
    """Tables for one system, serving backend and data version (lazily loaded, cached per process)."""

    pack: Pack
    system: SystemSpec
    backend: str
    versions: VersionInfo
    version: str
    served: dict[str, TableLocation] = field(default_factory=dict)

    @classmethod
    def open(
        cls,
        system: str,
        backend: str,
        version: str | None = None,
        systems_path: str | Path | None = None,
    ) -> PerfData:
        for what, v in (("system", system), ("backend", backend)):
            if not (isinstance(v, str) and v.strip()):
                raise InvalidInputError(f"{what} must be a non-empty name", f"got {v!r}")
        pack = find_pack(str(systems_path) if systems_path is not None else None)
        spec = load_system(pack, system)
        info = version_info(pack, spec, backend)
        return cls(pack, spec, backend, info, info.resolve(version))

    def for_backend(self, backend: str) -> PerfData:
        """This pack and system's data for another serving backend, at that backend's current
        version (raises :class:`~infercast.errors.UnknownBackendError` when it has none here)."""
        info = version_info(self.pack, self.system, backend)
        return PerfData(self.pack, self.system, backend, info, info.resolve(None))

    def older_versions(self) -> list[PerfData]:
        """This system and backend's data at each collected version older than :attr:`version`,
        newest first (the backfill rule: never a newer version)."""
        older = [v for v in self.versions.collected if version_key(v) < version_key(self.version)]
        return [PerfData(self.pack, self.system, self.backend, self.versions, v) for v in reversed(older)]

    def locate(self, stem: str) -> TableLocation | None:
        loc = locate_table(self.system.data_dir, self.backend, self.version, self.versions.collected, stem)
        return loc

    def has_table(self, stem: str) -> bool:
        return self.locate(stem) is not None

    def available_tables(self) -> list[str]:
        stems: set[str] = set()
        d = self.system.data_dir
        if d.is_dir():
            for v in self.versions.collected:
                for f in d.glob(f"*/{self.backend}/{v}/*_perf.parquet"):
                    stems.add(f.name.removesuffix("_perf.parquet"))
        return sorted(stems)

    def table(self, stem: str) -> Table:
        loc = self.locate(stem)
        if loc is None:
            raise NotAvailableError(
                f"no {stem} table for {self.backend} {self.version} on {self.system.name}",
                "neither this version, a declared reuse, nor an older version has it",
                self.available_tables(),
            )
        table = cached_table(loc.path, stem)
        if is_composite(stem):
            sib = self._consistent_sibling(stem, loc, table)
            if sib is not None:
                loc, table = sib
        self.served[stem] = loc
        _note_read(self, stem, loc, table)
        return table

    def _consistent_sibling(self, stem: str, loc: TableLocation, table: Table) -> tuple[TableLocation, Table] | None:
        """The dominated sibling system's copy of ``stem`` when this system's contradicts it."""
        key = (str(loc.path), self.system.name)
        if key not in _SIBLING_VERDICTS:
            _SIBLING_VERDICTS[key] = self._find_sibling(stem, loc, table)
        return _SIBLING_VERDICTS[key]

    def _find_sibling(self, stem: str, loc: TableLocation, table: Table) -> tuple[TableLocation, Table] | None:
        return self._sibling_system(stem, loc, table) or self._peer_backend(stem, loc, table)

    def table_backend(self, stem: str) -> str:
        """The backend whose collector measured the table served for ``stem`` (differs from
        :attr:`backend` when a peer backend's table serves it; see the module docstring)."""
        loc = self.served.get(stem) or self.locate(stem)
        return self.backend if loc is None else loc.path.parent.parent.name

    def _peer_table(self, system: SystemSpec, backend: str, stem: str, version: str | None = None):
        """(file, version, table) of ``stem`` for ``backend`` on ``system`` at ``version`` (default
        that backend's current version there), or None."""
        if not system.data_dir.is_dir():
            return None
        try:
            info = version_info(self.pack, system, backend)
            ver = version or info.resolve(None)
        except InfercastError:
            return None
        f = find_in_version(system.data_dir, backend, ver, stem)
        return None if f is None else (f, ver, cached_table(f, stem))

    def _peer_backend(self, stem: str, loc: TableLocation, table: Table) -> tuple[TableLocation, Table] | None:
        """Another backend's copy of ``stem`` on this system when ours contradicts it and the two
        agree elsewhere (module docstring)."""
        if stem not in PEER_STEMS:
            return None
        for peer in SERVING_BACKENDS:
            if peer == self.backend:
                continue
            here = self._peer_table(self.system, peer, stem)
            if here is None:
                continue
            f, ver, theirs = here
            ratio, n = median_slowdown(table, theirs, PEER_IGNORED_KEYS)
            if n < SIBLING_MIN_SHARED or not ratio > SIBLING_SLOWDOWN:
                continue
            for name, other in self._other_systems():
                mine_there = self._peer_table(other, self.backend, stem, loc.served_by)
                theirs_there = self._peer_table(other, peer, stem)
                if mine_there is None or theirs_there is None:
                    continue
                r, m = median_slowdown(mine_there[2], theirs_there[2], PEER_IGNORED_KEYS)
                if m >= SIBLING_MIN_SHARED and 1.0 / PEER_AGREEMENT <= r <= PEER_AGREEMENT:
                    how = (f"peer:{peer} {ver} ({ratio:.2f}x faster here; {self.backend} {mine_there[1]} and "
                           f"{peer} {theirs_there[1]} agree within {abs(r - 1) * 100:.0f}% on {name})")
                    return TableLocation(stem, f, ver, how), theirs
        return None

    def _other_systems(self):
        """(name, spec) of every other system of the pack whose spec loads."""
        for name in list_systems(self.pack):
            if name == self.system.name:
                continue
            try:
                yield name, load_system(self.pack, name)
            except InfercastError:
                continue

    def _sibling_system(self, stem: str, loc: TableLocation, table: Table) -> tuple[TableLocation, Table] | None:
        best = None
        for name, other in self._other_systems():
            if not _dominates(self.system, other):
                continue
            f = find_in_version(other.data_dir, self.backend, loc.served_by, stem) if other.data_dir.is_dir() else None
            if f is None:
                continue
            theirs = cached_table(f, stem)
            ratio, n = median_slowdown(table, theirs)
            if n >= SIBLING_MIN_SHARED and ratio > SIBLING_SLOWDOWN and (best is None or ratio > best[0]):
                best = (ratio, TableLocation(stem, f, loc.served_by, f"sibling:{name} ({ratio:.2f}x faster there)"), theirs)
        return None if best is None else (best[1], best[2])

    def comm_library_table(self) -> Table:
        """The NCCL (or oneCCL) table selected by the system spec's ``misc.*_version``."""
        for lib, ver in (("nccl", self.system.nccl_version), ("oneccl", self.system.oneccl_version)):
            if ver is None:
                continue
            path = self.system.data_dir / "comm" / lib / ver / f"{lib}_perf.parquet"
            if path.exists():
                loc = self.served[lib] = TableLocation(lib, path, ver, "system-spec")
                table = cached_table(path, lib)
                _note_read(self, lib, loc, table)
                return table
        raise NotAvailableError(
            f"no NCCL/oneCCL table for {self.system.name}",
            f"misc.nccl_version={self.system.nccl_version!r} has no comm/nccl/<version>/ directory",
        )

    def provenance(self) -> dict[str, str]:
        return {stem: f"{loc.served_by} ({loc.how})" for stem, loc in sorted(self.served.items())}
