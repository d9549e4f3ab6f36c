"""Which data version answers a query, per (system, backend).

Rules (from ``query_versions.yaml`` and the pack's layout):

* slots: ``current`` and ``previous`` come from the file (defaults, then per-system overrides);
  ``next`` is derived: the highest collected version newer than ``current`` (not derived for
  systems with an override, as the file's comments require).
* a requested version may be a slot alias (``current``/``previous``/``next``) or any collected
  version directory; anything else is an error that lists what exists.
* a table missing from the chosen version is served by ``reuse.yaml`` (declared borrowing, may
  point to any version), else backfilled from the newest *older* collected version that has it —
  never from a newer one. Every table records the version that actually served it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from packaging.version import InvalidVersion, Version

from ..errors import DataFileError, UnknownBackendError, UnknownVersionError
from .pack import Pack, damaged_file_fix
from .system import SystemSpec, scan_systems
from .yaml_cache import PackYamlError, read_pack_yaml

SERVING_BACKENDS = ("trtllm", "vllm", "sglang")
COMM_LIBRARIES = ("nccl", "oneccl")
SLOTS = ("current", "previous", "next")


def version_key(v: str):
    try:
        return (0, Version(v))
    except InvalidVersion:
        return (1, v)


@dataclass(frozen=True)
class VersionInfo:
    system: str
    backend: str
    collected: tuple[str, ...]  # oldest -> newest
    current: str | None
    previous: str | None
    next: str | None

    def slots(self) -> dict[str, str]:
        return {k: v for k, v in (("current", self.current), ("previous", self.previous), ("next", self.next)) if v}

    def resolve(self, requested: str | None) -> str:
        """Map a requested version (None = current slot) to a collected version directory."""
        req = requested or "current"
        slots = self.slots()
        if req in SLOTS:
            if req not in slots:
                raise UnknownVersionError(
                    f"{self.backend} on {self.system} has no {req!r} version slot",
                    "query_versions.yaml and the collected data define no such slot",
                    [*slots, *self.collected],
                )
            return slots[req]
        if req in self.collected:
            return req
        raise UnknownVersionError(
            f"no {self.backend} data version {req!r} for {self.system}",
            "the version is neither a slot nor a collected data directory",
            [*(f"{k}={v}" for k, v in slots.items()), *self.collected],
        )


def _read_yaml_mapping(path: Path) -> dict:
    """A pack YAML file that must hold a mapping (empty file: ``{}``). Any failure is one
    :class:`DataFileError` line naming the file, the cause and the fix."""
    try:
        doc = read_pack_yaml(path)
    except UnicodeDecodeError as exc:
        cause = f"not UTF-8 text ({exc.reason} at byte {exc.start})"
    except OSError as exc:
        cause = exc.strerror or str(exc)
    except PackYamlError as exc:
        cause = " ".join(str(exc).split())
    else:
        if doc is None:
            return {}
        if isinstance(doc, dict):
            return doc
        cause = f"holds a {type(doc).__name__}, not a mapping"
    raise DataFileError(f"cannot read pack file {path}", f"{cause}; {damaged_file_fix()}")


@lru_cache(maxsize=8)
def _query_versions(systems_dir: Path) -> dict:
    path = systems_dir / "query_versions.yaml"
    if not path.exists():
        return {}
    return _read_yaml_mapping(path)


@lru_cache(maxsize=256)
def _collected(data_dir: Path, backend: str) -> tuple[str, ...]:
    vers: set[str] = set()
    if data_dir.is_dir():
        for fam in data_dir.iterdir():
            d = fam / backend
            if fam.is_dir() and d.is_dir():
                vers.update(p.name for p in d.iterdir() if p.is_dir())
    return tuple(sorted(vers, key=version_key))


def backends_for(system: SystemSpec) -> list[str]:
    return [b for b in SERVING_BACKENDS if _collected(system.data_dir, b)]


def systems_with_data(pack: Pack, backend: str) -> list[str]:
    """The pack's systems that hold measured perf data for ``backend``."""
    return [name for name, spec, _ in scan_systems(pack) if spec is not None and _collected(spec.data_dir, backend)]


def version_info(pack: Pack, system: SystemSpec, backend: str) -> VersionInfo:
    collected = _collected(system.data_dir, backend)
    if backend not in SERVING_BACKENDS or not collected:
        others = backends_for(system)
        if backend in SERVING_BACKENDS and not others:
            # a system spec without any tables (the pack ships a few): say so, and where the
            # backend's data is, rather than "available: none"
            raise UnknownBackendError(
                f"no {backend!r} data for system {system.name}",
                f"the pack has {system.name}'s spec but no measured perf tables for it at all; "
                f"systems with {backend} data",
                systems_with_data(pack, backend),
            )
        raise UnknownBackendError(
            f"no {backend!r} data for system {system.name}",
            "the backend has no version directory under the system's data",
            others,
        )
    qv = _query_versions(pack.systems_dir)
    overrides = (qv.get("overrides") or {}).get(system.name) or {}
    slot = overrides.get(backend) or (qv.get("defaults") or {}).get(backend) or {}
    current = slot.get("current")
    current = str(current) if current is not None else None
    previous = slot.get("previous")
    previous = str(previous) if previous is not None else None
    if current is not None and current not in collected:
        current = None  # a slot with no data behind it is not queryable
    if previous is not None and previous not in collected:
        previous = None
    if current is None:
        current = collected[-1]
    nxt = None
    if backend not in overrides:
        newer = [v for v in collected if version_key(v) > version_key(current)]
        nxt = newer[-1] if newer else None
    return VersionInfo(system.name, backend, collected, current, previous, nxt)


@dataclass(frozen=True)
class TableLocation:
    stem: str
    path: Path
    served_by: str  # version dir that holds the file
    how: str  # "direct" | "reuse" | "backfill"


def find_in_version(data_dir: Path, backend: str, version: str, stem: str) -> Path | None:
    """``<stem>_perf.parquet`` of exactly ``backend/version`` under any op-family folder of ``data_dir``."""
    fname = f"{stem}_perf.parquet"
    for fam in sorted(p for p in data_dir.iterdir() if p.is_dir()):
        f = fam / backend / version / fname
        if f.exists():
            return f
    return None


def _reuse_target(data_dir: Path, backend: str, version: str, stem: str) -> str | None:
    for fam in sorted(p for p in data_dir.iterdir() if p.is_dir()):
        ry = fam / backend / version / "reuse.yaml"
        if ry.exists():
            doc = _read_yaml_mapping(ry)
            for entry in doc.get("reuse") or []:
                if isinstance(entry, dict) and entry.get("table") in (stem, f"{stem}_perf") and entry.get("from_version") is not None:
                    return str(entry["from_version"])
    return None


@lru_cache(maxsize=4096)
def locate_table(data_dir: Path, backend: str, version: str, collected: tuple[str, ...], stem: str) -> TableLocation | None:
    """Find ``<stem>_perf.parquet`` for ``backend/version``, honouring reuse then backfill."""
    if not data_dir.is_dir():
        return None
    f = find_in_version(data_dir, backend, version, stem)
    if f is not None:
        return TableLocation(stem, f, version, "direct")
    donor = _reuse_target(data_dir, backend, version, stem)
    if donor is not None:
        f = find_in_version(data_dir, backend, donor, stem)
        if f is not None:
            return TableLocation(stem, f, donor, "reuse")
    older = [v for v in collected if version_key(v) < version_key(version)]
    for v in reversed(older):
        f = find_in_version(data_dir, backend, v, stem)
        if f is not None:
            return TableLocation(stem, f, v, "backfill")
    return None
