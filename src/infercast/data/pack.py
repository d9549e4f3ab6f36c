"""Locate the perf-data pack: a ``systems/`` directory and its sibling ``model_configs/``.

Search order (first hit wins):

1. an explicit ``systems_path`` argument (the CLI's ``--systems-path``);
2. the ``INFERCAST_SYSTEMS_PATH`` environment variable;
3. the installed ``aiconfigurator-core`` distribution, located through
   :mod:`importlib.metadata` (its files are read, the package is never imported);
4. the user cache filled by ``infercast data fetch`` (for platforms where that wheel
   does not install).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
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
    try:
        dist = metadata.distribution(PACK_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
    # locate_file gives the site-packages path of a file of the distribution; never import it.
    candidate = Path(str(dist.locate_file(f"{PACK_PACKAGE_DIR}/systems")))
    return candidate if candidate.is_dir() else None


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


def fetch_pack(dest: Path | None = None) -> Path:
    """Download the pack wheel with pip (any platform) and extract only its data files.

    Returns the extracted ``systems`` directory. Only ``systems/`` and ``model_configs/`` are
    extracted; the wheel's code is not.
    """
    dest = dest or cache_dir()
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--platform", "manylinux_2_28_x86_64", "--python-version", "3.11",
            "-d", tmp, f"{PACK_DISTRIBUTION}=={PACK_VERSION}",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise DataPackNotFoundError(
                f"could not download {PACK_DISTRIBUTION}=={PACK_VERSION}",
                (proc.stderr.strip().splitlines() or ["pip gave no wheel"])[-1],
            )
        staging = dest.with_name(dest.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        prefixes = (f"{PACK_PACKAGE_DIR}/systems/", f"{PACK_PACKAGE_DIR}/model_configs/")
        with zipfile.ZipFile(wheels[0]) as zf:
            for name in zf.namelist():
                if name.startswith(prefixes) and not name.endswith("/"):
                    zf.extract(name, staging)
        shutil.rmtree(dest, ignore_errors=True)
        staging.rename(dest)
    find_pack.cache_clear()
    return dest / PACK_PACKAGE_DIR / "systems"
