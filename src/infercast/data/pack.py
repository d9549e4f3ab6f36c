"""Locate the perf-data pack: a ``systems/`` directory and its sibling ``model_configs/``.

Search order (first hit wins):

1. an explicit ``systems_path`` argument (the CLI's ``--systems-path``);
2. the ``INFERCAST_SYSTEMS_PATH`` environment variable;
3. the installed ``aiconfigurator-core`` distribution: its package directory found on the import
   path (``importlib.util.find_spec``, which finds a top-level package without importing it)
   beside the distribution's ``.dist-info``, else through :mod:`importlib.metadata` (its files are
   read, the package is never imported);
4. the user cache filled by ``infercast data fetch`` (for platforms where that wheel
   does not install; see :mod:`infercast.data.fetch`).

``model_configs/`` is looked for beside the ``systems/`` directory found; without it only local
config paths can be estimated (:func:`infercast.data.model_configs.pack_model_ids` says where it
looked).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..errors import DataPackNotFoundError

PACK_DISTRIBUTION = "aiconfigurator-core"
PACK_VERSION = "0.12.0"
PACK_PACKAGE_DIR = "aiconfigurator_core"
ENV_VAR = "INFERCAST_SYSTEMS_PATH"


@dataclass(frozen=True)
class Pack:
    """Where the pack's files are. ``origin`` says how it was found."""

    systems_dir: Path
    model_configs_dir: Path | None
    origin: str

    @property
    def data_root(self) -> Path:
        return self.systems_dir / "data"

    @property
    def model_configs_expected(self) -> Path:
        """Where the pack's ``model_configs/`` belongs: beside ``systems/``."""
        return self.systems_dir.parent / "model_configs"


def damaged_file_fix() -> str:
    """What a user can do about a damaged or missing pack file (one line, no trailing stop)."""
    return (
        f"reinstall the data pack (pip install --force-reinstall {PACK_DISTRIBUTION}=={PACK_VERSION}, "
        "or `infercast data fetch`), or point --systems-path / "
        f"${ENV_VAR} at an intact pack's systems/ directory"
    )


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "infercast" / f"{PACK_DISTRIBUTION}-{PACK_VERSION}"


def _from_systems_dir(systems: Path, origin: str) -> Pack:
    systems = systems.expanduser().resolve()
    if not systems.is_dir():
        raise DataPackNotFoundError(
            f"systems path {systems} is not a directory",
            f"it came from {origin}; pass the pack's systems/ directory",
        )
    if not any(systems.glob("*.yaml")):
        raise DataPackNotFoundError(
            f"systems path {systems} holds no system YAML files",
            "a pack's systems/ directory has <system>.yaml files and a data/ folder",
        )
    mc = systems.parent / "model_configs"
    return Pack(systems, mc if mc.is_dir() else None, origin)


def _installed_systems_dir() -> Path | None:
    found = _found_package_systems_dir()
    if found is not None:
        return found
    from importlib import metadata  # (~15 ms of imports: only when the quick look finds nothing)

    try:
        dist = metadata.distribution(PACK_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
    # locate_file gives the site-packages path of a file of the distribution; never import it.
    candidate = Path(str(dist.locate_file(f"{PACK_PACKAGE_DIR}/systems")))
    return candidate if candidate.is_dir() else None


def _found_package_systems_dir() -> Path | None:
    """``aiconfigurator_core/systems`` of the package directory on the import path, when the
    directory holding it also holds the distribution's ``.dist-info`` (an installed wheel, not a
    same-named folder elsewhere on the path); None otherwise. The package is not imported."""
    from importlib.util import find_spec

    try:
        spec = find_spec(PACK_PACKAGE_DIR)
    except (ImportError, ValueError):
        return None
    for loc in (spec.submodule_search_locations or []) if spec is not None else []:
        pkg = Path(loc)
        systems = pkg / "systems"
        if systems.is_dir() and any(pkg.parent.glob(f"{PACK_PACKAGE_DIR}-*.dist-info")):
            return systems
    return None


@lru_cache(maxsize=16)
def find_pack(systems_path: str | os.PathLike[str] | None = None) -> Pack:
    """Return the pack to read, following the documented search order."""
    if systems_path is not None:
        return _from_systems_dir(Path(systems_path), "--systems-path")
    env = os.environ.get(ENV_VAR)
    if env:
        return _from_systems_dir(Path(env), f"${ENV_VAR}")
    installed = _installed_systems_dir()
    if installed is not None:
        return _from_systems_dir(installed, f"installed {PACK_DISTRIBUTION}")
    cached = cache_dir() / PACK_PACKAGE_DIR / "systems"
    if cached.is_dir():
        return _from_systems_dir(cached, "user cache")
    raise DataPackNotFoundError(
        "no perf-data pack found",
        f"pass --systems-path DIR, set ${ENV_VAR}, install {PACK_DISTRIBUTION}=={PACK_VERSION} "
        "(Linux x86-64), or run `infercast data fetch` to download its data into the user cache",
    )


def parse_pack_yaml(text: str):
    """A pack YAML document (system spec, version list) parsed as ``yaml.safe_load`` parses it,
    through libyaml's safe loader when PyYAML was built with it (it builds the same documents as
    the pure-Python loader for the pack's files, faster; see docs/modelling-log.md, "Fifth round");
    raises ``yaml.YAMLError`` as ``safe_load`` does."""
    import yaml

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
