"""Sibling consistency of composite (``*_module``) tables (data/database.py): a table far slower
than the same file on a sibling system whose GPU it out-specs is served by the sibling."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import synthpack as sp
from infercast.data.database import SIBLING_SLOWDOWN, PerfData, median_slowdown
from infercast.data.pack import find_pack

STEM = "mla_generation_module"


def _module_table(path, scale: float) -> None:
    batch = [1, 2, 4, 8, 16] * 6
    step = [s for s in (64, 128, 256, 512, 1024, 2048) for _ in range(5)]
    lat = [scale * (0.01 + 1e-4 * b + 1e-6 * s) for b, s in zip(batch, step)]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({
        "framework": ["VLLM"] * len(batch), "version": [sp.VLLM_CURRENT] * len(batch), "device": ["x"] * len(batch),
        "op_name": ["mla_generation_module"] * len(batch), "kernel_source": ["K"] * len(batch),
        "num_heads": [16] * len(batch), "batch_size": batch, "step": step, "latency": lat,
    }), path)


def _pack(tmp_path, big_scale: float, big_bw_factor: float = 2.0):
    """The synthetic pack plus a second system ``synth_big`` (the same GPU with ``big_bw_factor``
    times the memory bandwidth), each with a module table; synth_big's is ``big_scale`` times
    synth_gpu's."""
    root = tmp_path / "pack"
    sp.make_pack(root)
    systems = root / "systems"
    y = (systems / f"{sp.SYSTEM}.yaml").read_text()
    y = y.replace(f"data/{sp.SYSTEM}", "data/synth_big").replace(
        f"mem_bw: {sp.SYSTEM_GPU['mem_bw']}", f"mem_bw: {int(sp.SYSTEM_GPU['mem_bw'] * big_bw_factor)}")
    (systems / "synth_big.yaml").write_text(y)
    shutil.copytree(systems / "data" / sp.SYSTEM, systems / "data" / "synth_big")
    rel = f"mla/vllm/{sp.VLLM_CURRENT}/{STEM}_perf.parquet"
    _module_table(systems / "data" / sp.SYSTEM / rel, 1.0)
    _module_table(systems / "data" / "synth_big" / rel, big_scale)
    return find_pack(str(systems))


def test_contradicting_table_is_served_by_the_weaker_sibling(tmp_path):
    pack = _pack(tmp_path, big_scale=2.0)
    big = PerfData.open("synth_big", "vllm", None, pack.systems_dir)
    t = big.table(STEM)
    small = PerfData.open(sp.SYSTEM, "vllm", None, pack.systems_dir).table(STEM)
    assert t.latency.tolist() == small.latency.tolist()
    assert big.served[STEM].how.startswith(f"sibling:{sp.SYSTEM}")
    assert f"data/{sp.SYSTEM}/" in big.served[STEM].path.as_posix()


def test_small_gaps_and_the_weaker_system_keep_their_own_tables(tmp_path):
    pack = _pack(tmp_path, big_scale=SIBLING_SLOWDOWN * 0.95)
    big = PerfData.open("synth_big", "vllm", None, pack.systems_dir)
    big.table(STEM)
    assert big.served[STEM].how == "direct"
    # the weaker system slower than the stronger one is what hardware predicts: kept
    pack = _pack(tmp_path / "b", big_scale=0.4)
    small = PerfData.open(sp.SYSTEM, "vllm", None, pack.systems_dir)
    small.table(STEM)
    assert small.served[STEM].how == "direct"


def test_a_sibling_with_more_bandwidth_is_not_a_reference(tmp_path):
    # synth_big has *less* bandwidth here: it does not dominate synth_gpu, and synth_gpu does not
    # dominate it either when its own table is slower -> each keeps its table
    pack = _pack(tmp_path, big_scale=2.0, big_bw_factor=0.5)
    big = PerfData.open("synth_big", "vllm", None, pack.systems_dir)
    big.table(STEM)
    assert big.served[STEM].how == "direct"


def test_median_slowdown_exact(tmp_path):
    from infercast.data.tables import read_table

    a, b = tmp_path / "a" / f"{STEM}_perf.parquet", tmp_path / "b" / f"{STEM}_perf.parquet"
    _module_table(a, 3.0)
    _module_table(b, 1.5)
    ratio, n = median_slowdown(read_table(a, STEM), read_table(b, STEM))
    assert n == 30 and ratio == pytest.approx(2.0, rel=1e-12)
