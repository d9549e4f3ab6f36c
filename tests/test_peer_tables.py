"""Peer-backend consistency of composite tables (data/database.py): a backend's MLA module table
far slower than another backend's on the same system is served by the peer's, but only when the
two backends' tables agree on some other system."""

from __future__ import annotations

import shutil

import pyarrow as pa
import pyarrow.parquet as pq

import synthpack as sp
from infercast.data.database import SIBLING_SLOWDOWN, PerfData, median_slowdown
from infercast.data.pack import find_pack

STEM = "mla_generation_module"
TWIN = "synth_twin"


def _module_table(path, scale: float, kernel: str, stem: str = STEM) -> None:
    batch = [1, 2, 4, 8, 16] * 6
    step = [s for s in (64, 128, 256, 512, 1024, 2048) for _ in range(5)]
    lat = [scale * (0.01 + 1e-4 * b + 1e-6 * s) for b, s in zip(batch, step)]
    n = len(batch)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({
        "framework": ["X"] * n, "version": ["v"] * n, "device": ["x"] * n,
        "op_name": [stem] * n, "kernel_source": [kernel] * n,
        "num_heads": [16] * n, "batch_size": batch, "step": step, "latency": lat,
    }), path)


def _pack(tmp_path, vllm_here: float, vllm_twin: float, stem: str = STEM):
    """synth_gpu plus ``synth_twin`` (twice the bandwidth, so neither is the other's sibling
    reference), each with a TensorRT-LLM and a vLLM copy of ``stem``: TensorRT-LLM's at scale 1,
    vLLM's at ``vllm_here`` on synth_gpu and ``vllm_twin`` on the twin."""
    root = tmp_path / "pack"
    sp.make_pack(root)
    systems = root / "systems"
    y = (systems / f"{sp.SYSTEM}.yaml").read_text()
    y = y.replace(f"data/{sp.SYSTEM}", f"data/{TWIN}").replace(
        f"mem_bw: {sp.SYSTEM_GPU['mem_bw']}", f"mem_bw: {int(sp.SYSTEM_GPU['mem_bw'] * 2)}")
    (systems / f"{TWIN}.yaml").write_text(y)
    shutil.copytree(systems / "data" / sp.SYSTEM, systems / "data" / TWIN)
    for system, scale in ((sp.SYSTEM, vllm_here), (TWIN, vllm_twin)):
        d = systems / "data" / system / "mla"
        _module_table(d / "trtllm" / sp.TRTLLM_CURRENT / f"{stem}_perf.parquet", 1.0, "TRT", stem)
        _module_table(d / "vllm" / sp.VLLM_CURRENT / f"{stem}_perf.parquet", scale, "FLASH", stem)
    return find_pack(str(systems))


def test_a_table_the_peer_contradicts_is_served_by_the_peer(tmp_path):
    pack = _pack(tmp_path, vllm_here=2.0, vllm_twin=1.02)
    data = PerfData.open(sp.SYSTEM, "vllm", None, pack.systems_dir)
    t = data.table(STEM)
    trt = PerfData.open(sp.SYSTEM, "trtllm", None, pack.systems_dir)
    assert t.latency.tolist() == trt.table(STEM).latency.tolist()
    assert data.served[STEM].how.startswith("peer:trtllm")
    assert TWIN in data.served[STEM].how
    assert data.table_backend(STEM) == "trtllm"
    # the faster backend keeps its own table
    assert trt.served[STEM].how == "direct" and trt.table_backend(STEM) == "trtllm"


def test_no_agreeing_system_or_a_small_gap_keeps_the_table(tmp_path):
    # the backends differ by the same factor on the twin: a real difference, kept
    pack = _pack(tmp_path, vllm_here=2.0, vllm_twin=2.0)
    data = PerfData.open(sp.SYSTEM, "vllm", None, pack.systems_dir)
    data.table(STEM)
    assert data.served[STEM].how == "direct" and data.table_backend(STEM) == "vllm"
    pack = _pack(tmp_path / "b", vllm_here=SIBLING_SLOWDOWN * 0.95, vllm_twin=1.0)
    data = PerfData.open(sp.SYSTEM, "vllm", None, pack.systems_dir)
    data.table(STEM)
    assert data.served[STEM].how == "direct"


def test_tables_outside_the_peer_list_are_never_swapped(tmp_path):
    stem = "dsa_generation_module"
    pack = _pack(tmp_path, vllm_here=3.0, vllm_twin=1.0, stem=stem)
    data = PerfData.open(sp.SYSTEM, "vllm", None, pack.systems_dir)
    data.table(stem)
    assert data.served[stem].how == "direct"


def test_peer_comparison_ignores_kernel_names_and_takes_the_fastest_kernel(tmp_path):
    from infercast.data.tables import read_table

    a, b, slow, fast = (tmp_path / x / f"{STEM}_perf.parquet" for x in ("a", "b", "slow", "fast"))
    _module_table(a, 3.0, "A")
    _module_table(b, 1.5, "B")
    ta, tb = read_table(a, STEM), read_table(b, STEM)
    assert median_slowdown(ta, tb)[1] == 0  # kernel names differ: no shared point unless ignored
    ratio, n = median_slowdown(ta, tb, ("kernel_source",))
    assert n == 30 and abs(ratio - 2.0) < 1e-12
    # one table holding two kernels per shape counts each shape at its faster kernel
    _module_table(slow, 3.0, "S")
    _module_table(fast, 1.5, "F")
    two = pa.concat_tables([pq.read_table(slow), pq.read_table(fast)])
    both = tmp_path / "both" / f"{STEM}_perf.parquet"
    both.parent.mkdir()
    pq.write_table(two, both)
    ratio, n = median_slowdown(read_table(both, STEM), tb, ("kernel_source",))
    assert n == 30 and abs(ratio - 1.0) < 1e-12
