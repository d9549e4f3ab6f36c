"""The parsed-table cache between processes: a table read once is read back from the cache with the
same arrays; a changed file is read again; ``INFERCAST_CACHE_DIR=off`` turns the cache off."""

from __future__ import annotations

import os
import shutil

import numpy as np

from infercast.data import tables


def _gemm(synth):
    return next(p for p in sorted(synth.root.rglob("gemm_perf.parquet")))


def test_table_cache_round_trip_and_invalidation(synth, tmp_path, monkeypatch):
    monkeypatch.setenv("INFERCAST_CACHE_DIR", str(tmp_path / "cache"))
    src = tmp_path / "gemm_perf.parquet"
    shutil.copy(_gemm(synth), src)
    tables.cached_table.cache_clear()
    fresh = tables.read_table(src, "gemm")
    first = tables.cached_table(src, "gemm")
    files = [p for p in (tmp_path / "cache" / "tables").glob("gemm-*") if p.is_dir()]
    assert len(files) == 1 and (files[0] / "meta.json").is_file()
    tables.cached_table.cache_clear()
    again = tables.cached_table(src, "gemm")  # from the cache file
    for t in (first, again):
        assert t.keys.keys() == fresh.keys.keys() and t.values.keys() == fresh.values.keys()
        for k in fresh.keys:
            assert np.array_equal(t.keys[k], fresh.keys[k]) and t.keys[k].dtype.kind == fresh.keys[k].dtype.kind
        for k in fresh.values:
            assert np.array_equal(t.values[k], fresh.values[k])
        assert (t.raw_rows, t.duplicate_keys) == (fresh.raw_rows, fresh.duplicate_keys)
        assert all(t.unique(k) == fresh.unique(k) for k in fresh.keys)
    # the distinct values of each key column come with the entry (not worked out again)
    assert {k for kind, k in again._index_cache if kind == "unique"} == set(fresh.keys)
    # the pack changes: another file under the same path is read, not the stale entry
    other = next(p for p in sorted(synth.root.rglob("gemm_perf.parquet")) if p.stat().st_size != src.stat().st_size)
    shutil.copy(other, src)
    os.utime(src, ns=(src.stat().st_atime_ns, src.stat().st_mtime_ns + 10**9))
    tables.cached_table.cache_clear()
    changed = tables.cached_table(src, "gemm")
    assert changed.raw_rows == tables.read_table(src, "gemm").raw_rows != fresh.raw_rows
    assert len([p for p in (tmp_path / "cache" / "tables").glob("gemm-*") if p.is_dir()]) == 2
    # off: nothing written
    monkeypatch.setenv("INFERCAST_CACHE_DIR", "off")
    tables.cached_table.cache_clear()
    assert tables.table_cache_dir() is None
    tables.cached_table(src, "gemm")
    assert len([p for p in (tmp_path / "cache" / "tables").iterdir() if p.name != ".pruned"]) == 2
    tables.cached_table.cache_clear()


def test_a_damaged_cache_file_is_read_around(synth, tmp_path, monkeypatch):
    monkeypatch.setenv("INFERCAST_CACHE_DIR", str(tmp_path / "cache"))
    src = _gemm(synth)
    tables.cached_table.cache_clear()
    tables.cached_table(src, "gemm")
    (entry,) = (tmp_path / "cache" / "tables").glob("gemm-*")
    col = sorted(entry.glob("v*.npy"))[0]
    col.write_bytes(b"not an array")  # a damaged column
    tables.cached_table.cache_clear()
    t = tables.cached_table(src, "gemm")
    fresh = tables.read_table(src, "gemm")
    assert t.raw_rows == fresh.raw_rows and np.array_equal(t.latency, fresh.latency)
    # the damaged entry was written anew: its column reads again, and the next reader takes it
    assert len(np.load(col)) == len(fresh)
    tables.cached_table.cache_clear()
    monkeypatch.setattr(tables, "read_table", lambda *a: (_ for _ in ()).throw(AssertionError("parsed again")))
    again = tables.cached_table(src, "gemm")
    assert np.array_equal(again.latency, fresh.latency)
    monkeypatch.undo()
    monkeypatch.setenv("INFERCAST_CACHE_DIR", str(tmp_path / "cache"))
    (entry / "meta.json").unlink()  # a partial entry
    tables.cached_table.cache_clear()
    assert np.array_equal(tables.cached_table(src, "gemm").latency, fresh.latency)
    tables.cached_table.cache_clear()


def test_cached_columns_are_private_copies(synth, tmp_path, monkeypatch):
    """A column read from the cache can be written to (copy-on-write): the write reaches neither
    the cache entry nor the next reader."""
    monkeypatch.setenv("INFERCAST_CACHE_DIR", str(tmp_path / "cache"))
    src = _gemm(synth)
    tables.cached_table.cache_clear()
    tables.cached_table(src, "gemm")
    tables.cached_table.cache_clear()
    t = tables.cached_table(src, "gemm")
    keep = t.latency.copy()
    t.latency[:] = -1.0
    tables.cached_table.cache_clear()
    assert np.array_equal(tables.cached_table(src, "gemm").latency, keep)
    tables.cached_table.cache_clear()


def test_stale_entries_are_pruned(synth, tmp_path, monkeypatch):
    """Entries of a table file that is gone or has changed, of an older format (a file, or an
    entry without its source) and temporary directories of a dead writer go; live entries stay;
    a process looks at most once, and at most once a day unless forced."""
    import json
    import time

    root = tmp_path / "cache"
    monkeypatch.setenv("INFERCAST_CACHE_DIR", str(root))
    monkeypatch.setattr(tables, "_PRUNED", set())
    live, gone = tmp_path / "live_perf.parquet", tmp_path / "gone_perf.parquet"
    shutil.copy(_gemm(synth), live)
    shutil.copy(_gemm(synth), gone)
    tables.cached_table.cache_clear()
    tables.cached_table(live, "gemm")
    tables.cached_table(gone, "gemm")
    entries = lambda: sorted(p.name for p in (root / "tables").iterdir() if p.name != ".pruned")  # noqa: E731
    assert len(entries()) == 2
    gone.unlink()
    (root / "tables" / "moe-0123.npz").write_bytes(b"an older format's entry")
    old_entry = root / "tables" / "gemm-olderformat"
    old_entry.mkdir()
    (old_entry / "meta.json").write_text(json.dumps({"raw_rows": 1}))
    dead = root / "tables" / "abc.tmp"
    dead.mkdir()
    os.utime(dead, (time.time() - 2 * tables.STALE_TMP_S,) * 2)
    fresh_tmp = root / "tables" / "def.tmp"
    fresh_tmp.mkdir()
    assert tables.prune_table_cache(root / "tables") == 0  # looked at already today
    assert tables.prune_table_cache(root / "tables", force=True) == 4
    (kept,) = [e for e in entries() if not e.endswith(".tmp")]
    assert "def.tmp" in entries()
    tables.cached_table.cache_clear()
    monkeypatch.setattr(tables, "read_table", lambda *a: (_ for _ in ()).throw(AssertionError("parsed again")))
    tables.cached_table(live, "gemm")  # the live entry still answers
    tables.cached_table.cache_clear()


def test_pack_yaml_kept_between_processes(tmp_path, monkeypatch):
    """A pack YAML document is parsed once and answered from the cache while the file is
    unchanged (without importing PyYAML: a warm command does not pay for it); a changed file is
    parsed again; a file that does not parse is not kept; the entry is pruned with the tables'."""
    import subprocess
    import sys
    import textwrap
    import time

    import pytest

    from infercast.data.yaml_cache import PackYamlError, read_pack_yaml

    cache = tmp_path / "cache"
    monkeypatch.setenv("INFERCAST_CACHE_DIR", str(cache))
    src = tmp_path / "spec.yaml"
    src.write_text("gpu:\n  mem_bw: 4.8e+12\n  1: [a, b]\nnode: {num_gpus_per_node: 8}\n")
    want = {"gpu": {"mem_bw": 4.8e12, 1: ["a", "b"]}, "node": {"num_gpus_per_node": 8}}
    assert read_pack_yaml(src) == want
    entries = list((cache / "tables").glob("yaml-*"))
    assert len(entries) == 1 and (entries[0] / "meta.json").is_file()
    code = textwrap.dedent(f"""
        import sys
        from infercast.data.yaml_cache import read_pack_yaml
        doc = read_pack_yaml({str(src)!r})
        print(doc == {want!r}, "yaml" in sys.modules)
    """)
    env = {**os.environ, "INFERCAST_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout.split()
    assert out == ["True", "False"]  # the same document, PyYAML not imported
    time.sleep(0.01)
    src.write_text("gpu: {mem_bw: 1.0}\n")  # changed: parsed again
    assert read_pack_yaml(src) == {"gpu": {"mem_bw": 1.0}}
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpu: [unclosed\n")
    for _ in range(2):
        with pytest.raises(PackYamlError):
            read_pack_yaml(bad)
    assert len(list((cache / "tables").glob("yaml-*"))) == 2  # the bad file kept nothing
    assert tables.prune_table_cache(cache / "tables", force=True) == 1  # the first version's entry
    assert read_pack_yaml(src) == {"gpu": {"mem_bw": 1.0}}
    monkeypatch.setenv("INFERCAST_CACHE_DIR", "off")
    assert read_pack_yaml(src) == {"gpu": {"mem_bw": 1.0}}
