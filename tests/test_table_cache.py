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
    files = list((tmp_path / "cache" / "tables").glob("gemm-*.npz"))
    assert len(files) == 1
    tables.cached_table.cache_clear()
    again = tables.cached_table(src, "gemm")  # from the cache file
    for t in (first, again):
        assert t.keys.keys() == fresh.keys.keys() and t.values.keys() == fresh.values.keys()
        for k in fresh.keys:
            assert np.array_equal(t.keys[k], fresh.keys[k]) and t.keys[k].dtype.kind == fresh.keys[k].dtype.kind
        for k in fresh.values:
            assert np.array_equal(t.values[k], fresh.values[k])
        assert (t.raw_rows, t.duplicate_keys) == (fresh.raw_rows, fresh.duplicate_keys)
    # the pack changes: another file under the same path is read, not the stale entry
    other = next(p for p in sorted(synth.root.rglob("gemm_perf.parquet")) if p.stat().st_size != src.stat().st_size)
    shutil.copy(other, src)
    os.utime(src, ns=(src.stat().st_atime_ns, src.stat().st_mtime_ns + 10**9))
    tables.cached_table.cache_clear()
    changed = tables.cached_table(src, "gemm")
    assert changed.raw_rows == tables.read_table(src, "gemm").raw_rows != fresh.raw_rows
    assert len(list((tmp_path / "cache" / "tables").glob("gemm-*.npz"))) == 2
    # off: nothing written
    monkeypatch.setenv("INFERCAST_CACHE_DIR", "off")
    tables.cached_table.cache_clear()
    assert tables.table_cache_dir() is None
    tables.cached_table(src, "gemm")
    assert len(list((tmp_path / "cache" / "tables").glob("*.npz"))) == 2
    tables.cached_table.cache_clear()


def test_a_damaged_cache_file_is_read_around(synth, tmp_path, monkeypatch):
    monkeypatch.setenv("INFERCAST_CACHE_DIR", str(tmp_path / "cache"))
    src = _gemm(synth)
    tables.cached_table.cache_clear()
    tables.cached_table(src, "gemm")
    (f,) = (tmp_path / "cache" / "tables").glob("gemm-*.npz")
    f.write_bytes(b"not a zip file")
    tables.cached_table.cache_clear()
    t = tables.cached_table(src, "gemm")
    assert t.raw_rows == tables.read_table(src, "gemm").raw_rows
    tables.cached_table.cache_clear()
