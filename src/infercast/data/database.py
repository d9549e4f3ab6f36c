"""One (system, backend, version) view of the pack: the tables that answer its queries."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import NotAvailableError
from .pack import Pack, find_pack
from .system import SystemSpec, load_system
from .tables import Table, cached_table
from .versions import TableLocation, VersionInfo, locate_table, version_info


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
        pack = find_pack(str(systems_path) if systems_path is not None else None)
        spec = load_system(pack, system)
        info = version_info(pack, spec, backend)
        return cls(pack, spec, backend, info, info.resolve(version))

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
        self.served[stem] = loc
        return cached_table(loc.path, stem)

    def comm_library_table(self) -> Table:
        """The NCCL (or oneCCL) table selected by the system spec's ``misc.*_version``."""
        for lib, ver in (("nccl", self.system.nccl_version), ("oneccl", self.system.oneccl_version)):
            if ver is None:
                continue
            path = self.system.data_dir / "comm" / lib / ver / f"{lib}_perf.parquet"
            if path.exists():
                self.served[lib] = TableLocation(lib, path, ver, "system-spec")
                return cached_table(path, lib)
        raise NotAvailableError(
            f"no NCCL/oneCCL table for {self.system.name}",
            f"misc.nccl_version={self.system.nccl_version!r} has no comm/nccl/<version>/ directory",
        )

    def provenance(self) -> dict[str, str]:
        return {stem: f"{loc.served_by} ({loc.how})" for stem, loc in sorted(self.served.items())}
