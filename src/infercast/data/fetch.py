"""``infercast data fetch``: put the pack's data files into a directory, never losing a user's files.

The pack is the ``aiconfigurator-core`` wheel's ``aiconfigurator_core/systems/`` and
``aiconfigurator_core/model_configs/`` folders; the wheel's code is never extracted. The wheel
comes from ``pip download`` (any platform) or from a local file (``wheel=``, the CLI's
``--wheel``; for machines behind a proxy or offline).

What happens to the destination ``dest``:

* a file, or a non-empty directory that is not a pack infercast wrote: refused before anything
  is downloaded (:class:`InvalidInputError`); nothing is touched;
* missing or empty: the pack is moved there;
* an earlier infercast pack (it holds :data:`MARKER`, which lists every file infercast wrote;
  or the bare ``aiconfigurator_core/{systems,model_configs}`` tree earlier infercast versions
  wrote without a marker): replaced, but only once the new pack is complete, and refused if it
  holds a file infercast did not write.

The wheel is downloaded and extracted into a fresh temporary directory beside ``dest`` (same
file system, so the final step is a rename), checked (``systems/`` with system YAMLs,
``model_configs/`` with configs), marked, then renamed into place. Whatever fails or is
interrupted, the temporary directory is removed, parent directories this call created are
removed again, and an earlier pack at ``dest`` is left as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataFileError, DataPackNotFoundError, InvalidInputError
from .pack import PACK_DISTRIBUTION, PACK_PACKAGE_DIR, PACK_VERSION, cache_dir, find_pack

#: file at the top of a pack infercast wrote: source wheel, version and the list of its files
MARKER = ".infercast-pack.json"
MARKER_KIND = "infercast data pack"
DATA_DIRS = ("systems", "model_configs")


@dataclass(frozen=True)
class FetchResult:
    """Where the pack went, from which wheel, and whether an earlier pack was replaced."""

    dest: Path
    systems_dir: Path
    wheel: str
    files: int
    replaced: bool


def _pack_files(root: Path) -> list[str]:
    """Every file and symlink under ``root``, as sorted POSIX paths relative to it."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        base = Path(dirpath)
        # a symlink to a directory is an entry of its own (os.walk does not descend into it)
        names = filenames + [d for d in dirnames if (base / d).is_symlink()]
        out.extend((base / n).relative_to(root).as_posix() for n in names)
    return sorted(out)


def _is_legacy_pack(dest: Path) -> bool:
    """The tree earlier infercast versions extracted, without a marker: only
    ``aiconfigurator_core/`` holding only ``systems/`` and/or ``model_configs/`` directories."""
    top = list(dest.iterdir())
    if [p.name for p in top] != [PACK_PACKAGE_DIR] or not top[0].is_dir() or top[0].is_symlink():
        return False
    inner = list(top[0].iterdir())
    return bool(inner) and all(p.name in DATA_DIRS and p.is_dir() and not p.is_symlink() for p in inner)


def _earlier_pack_problem(dest: Path) -> str | None:
    """None if ``dest`` is a pack infercast wrote and holds nothing else; otherwise why not."""
    marker = dest / MARKER
    if not marker.is_file():
        if _is_legacy_pack(dest):
            return None
        names = sorted(p.name for p in dest.iterdir())
        shown = ", ".join(names[:3]) + (f", ... ({len(names)} entries)" if len(names) > 3 else "")
        return f"it is not empty ({shown}) and is not a pack infercast fetched (no {MARKER})"
    try:
        info = json.loads(marker.read_text(encoding="utf-8"))
        written = set(info["files"]) if info.get("kind") == MARKER_KIND else None
    except (OSError, ValueError, KeyError, TypeError):
        written = None
    if written is None:
        return f"its {MARKER} is not one infercast wrote"
    extra = [f for f in _pack_files(dest) if f != MARKER and f not in written]
    if extra:
        return f"it holds {len(extra)} file(s) infercast did not write (e.g. {extra[0]})"
    return None


def check_destination(dest: Path) -> bool:
    """Refuse a destination that must not be written; True if it holds an earlier pack to replace.

    Runs before any download. Raises :class:`InvalidInputError` naming the problem.
    """
    try:
        return _check_destination(dest)
    except OSError as exc:
        raise InvalidInputError(f"cannot inspect data fetch destination {dest}", exc.strerror or str(exc)) from None


def _check_destination(dest: Path) -> bool:
    if dest.exists() and not dest.is_dir():
        raise InvalidInputError(
            f"data fetch destination {dest} is a file, not a directory",
            "pass --dest a new or empty directory, or an earlier pack `infercast data fetch` wrote",
        )
    if not dest.exists():
        for parent in dest.parents:
            if parent.exists():
                if not parent.is_dir():
                    raise InvalidInputError(
                        f"data fetch destination {dest} cannot be created", f"{parent} is a file, not a directory"
                    )
                break
        return False
    nonempty = any(dest.iterdir())
    if nonempty:
        problem = _earlier_pack_problem(dest)
        if problem is not None:
            raise InvalidInputError(
                f"data fetch destination {dest} was left untouched",
                f"{problem}; infercast never deletes files it did not write: pass --dest a new or empty directory",
            )
    cwd = Path.cwd().resolve()
    if cwd == dest or dest in cwd.parents:
        raise InvalidInputError(
            f"data fetch destination {dest} holds the current directory",
            "the pack is moved into place as a whole, which would pull the directory away from under "
            "this shell; run the command from another directory",
        )
    return nonempty


def _download_wheel(into: Path) -> Path:
    """``pip download`` the pack's wheel (for Linux x86-64, which every platform can unpack)."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--platform", "manylinux_2_28_x86_64", "--python-version", "3.11",
        "-d", str(into), f"{PACK_DISTRIBUTION}=={PACK_VERSION}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(into.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (proc.stderr.strip().splitlines() or ["pip gave no wheel"])[-1]
        raise DataPackNotFoundError(
            f"could not download {PACK_DISTRIBUTION}=={PACK_VERSION} with pip",
            f"{last}; behind a proxy, download the wheel another way and pass it with --wheel FILE",
        )
    return wheels[0]


def _wheel_metadata(zf: zipfile.ZipFile) -> tuple[str | None, str | None]:
    """(Name, Version) from the wheel's ``*.dist-info/METADATA``, or (None, None) without one."""
    for name in zf.namelist():
        if name.count("/") == 1 and name.endswith(".dist-info/METADATA"):
            text = zf.read(name).decode("utf-8", errors="replace")
            fields = {}
            for line in text.splitlines():
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields.setdefault(key.strip().lower(), value.strip())
            return fields.get("name"), fields.get("version")
    return None, None


def _data_members(wheel: Path) -> list[str]:
    """The wheel's data files (systems/ and model_configs/), after checking it is the pack's wheel."""
    if not zipfile.is_zipfile(wheel):
        raise DataFileError(f"wheel {wheel} is not a wheel", "the file is not a zip archive")
    with zipfile.ZipFile(wheel) as zf:
        name, version = _wheel_metadata(zf)
        if name is not None and (name.lower().replace("_", "-") != PACK_DISTRIBUTION or version != PACK_VERSION):
            raise DataFileError(
                f"wheel {wheel} is {name} {version}",
                f"infercast reads the data of {PACK_DISTRIBUTION}=={PACK_VERSION}",
            )
        prefixes = tuple(f"{PACK_PACKAGE_DIR}/{d}/" for d in DATA_DIRS)
        members = [m for m in zf.namelist() if m.startswith(prefixes) and not m.endswith("/")]
    for d in DATA_DIRS:
        if not any(m.startswith(f"{PACK_PACKAGE_DIR}/{d}/") for m in members):
            raise DataFileError(
                f"wheel {wheel} holds no {PACK_PACKAGE_DIR}/{d}/ files",
                f"expected the {PACK_DISTRIBUTION}=={PACK_VERSION} wheel",
            )
    return members


def _check_extracted(root: Path, wheel: Path) -> Path:
    """The extracted pack's systems/ directory, after checking the reader will accept it."""
    systems = root / PACK_PACKAGE_DIR / "systems"
    models = root / PACK_PACKAGE_DIR / "model_configs"
    if not any(systems.glob("*.yaml")):
        raise DataFileError(f"wheel {wheel} has no system YAML files in {PACK_PACKAGE_DIR}/systems/",
                            "it is not a perf-data pack")
    if not any(models.glob("*_config.json")):
        raise DataFileError(f"wheel {wheel} has no *_config.json in {PACK_PACKAGE_DIR}/model_configs/",
                            "it is not a perf-data pack")
    return systems


def _write_marker(root: Path, wheel: Path, version: str | None) -> int:
    files = _pack_files(root)
    info = {
        "kind": MARKER_KIND,
        "distribution": PACK_DISTRIBUTION,
        "version": version or PACK_VERSION,
        "wheel": wheel.name,
        "files": files,
    }
    (root / MARKER).write_text(json.dumps(info, indent=0) + "\n", encoding="utf-8")
    return len(files)


def _make_parents(dest: Path) -> list[Path]:
    """Create ``dest``'s missing parent directories; return them, innermost first."""
    made = []
    for parent in dest.parents:
        if parent.exists():
            break
        made.append(parent)
    for parent in reversed(made):
        parent.mkdir()
    return made


def fetch_pack(dest: Path | None = None, wheel: Path | None = None) -> FetchResult:
    """Put the pack's data files into ``dest`` (default: the user cache) from ``wheel`` or pip.

    See the module docstring for what happens to ``dest``. Raises :class:`InvalidInputError` for
    a destination or wheel path that cannot be used (before any download),
    :class:`DataPackNotFoundError` when pip fails, :class:`DataFileError` for a wheel that is not
    the pack's or a write that fails.
    """
    dest = Path(dest if dest is not None else cache_dir()).expanduser().resolve()
    if wheel is not None:
        wheel = Path(wheel).expanduser().resolve()
        if not wheel.is_file():
            raise InvalidInputError(f"wheel {wheel} does not exist or is not a file",
                                    f"pass --wheel the {PACK_DISTRIBUTION}=={PACK_VERSION} .whl file")
    replacing = check_destination(dest)
    made_parents: list[Path] = []
    staging: Path | None = None
    done = False
    try:
        try:
            made_parents = _make_parents(dest)
            staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".infercast-fetch", dir=dest.parent))
        except OSError as exc:
            raise DataFileError(f"cannot write under {dest.parent}", exc.strerror or str(exc)) from None
        if wheel is None:
            (staging / "download").mkdir()
            wheel = _download_wheel(staging / "download")
        new = staging / "pack"
        try:
            members = _data_members(wheel)
            with zipfile.ZipFile(wheel) as zf:
                _, version = _wheel_metadata(zf)
                for member in members:
                    zf.extract(member, new)
            systems = _check_extracted(new, wheel)
            files = _write_marker(new, wheel, version)
            _move_into_place(new, dest, staging / "earlier", replacing)
        except OSError as exc:
            raise DataFileError(f"could not write the pack to {dest}", exc.strerror or str(exc)) from None
        except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
            raise DataFileError(f"wheel {wheel} is damaged", str(exc)) from None
        done = True
    finally:
        if staging is not None:
            earlier = staging / "earlier"
            if earlier.exists() and not dest.exists():  # interrupted between the two renames
                earlier.rename(dest)
            shutil.rmtree(staging, ignore_errors=True)
        if not done:
            for parent in made_parents:  # innermost first; only while still empty
                try:
                    parent.rmdir()
                except OSError:
                    break
    find_pack.cache_clear()
    return FetchResult(dest, dest / systems.relative_to(new), wheel.name, files, replacing)


def _move_into_place(new: Path, dest: Path, earlier: Path, replacing: bool) -> None:
    """Rename the complete pack ``new`` to ``dest``; an earlier pack there goes to ``earlier``
    first (same file system) and comes back if the second rename fails. The earlier pack is
    checked again here: extraction takes a while, and a file written into it meanwhile is kept."""
    if replacing:
        problem = _earlier_pack_problem(dest)
        if problem is not None:
            raise InvalidInputError(f"data fetch destination {dest} was left untouched",
                                    f"{problem} (it changed during the fetch); the new pack was discarded")
        dest.rename(earlier)
        try:
            new.rename(dest)
        except BaseException:
            earlier.rename(dest)
            raise
        return
    if dest.exists():
        dest.rmdir()  # checked empty; rmdir refuses if something appeared since
    new.rename(dest)
