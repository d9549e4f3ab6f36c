"""Self-checks: the synthetic pack is well-formed and matches its formulas."""

from __future__ import annotations

import json
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml

import synthpack as sp

EXPECTED_ROWS = {
    "data/synth_gpu/gemm/trtllm/1.0/gemm_perf.parquet": 1404,
    "data/synth_gpu/gemm/trtllm/0.9/gemm_perf.parquet": 936,
    "data/synth_gpu/gemm/vllm/2.0/gemm_perf.parquet": 936,
    "data/synth_gpu/attention/trtllm/1.0/context_attention_perf.parquet": 370,
    "data/synth_gpu/attention/trtllm/1.0/generation_attention_perf.parquet": 1050,
    "data/synth_gpu/attention/trtllm/0.9/context_attention_perf.parquet": 370,
    "data/synth_gpu/attention/vllm/1.5/generation_attention_perf.parquet": 1050,
    "data/synth_gpu/comm/trtllm/1.0/custom_allreduce_perf.parquet": 54,
    "data/synth_gpu/comm/nccl/2.0/nccl_perf.parquet": 456,
}


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return sp.make_pack(tmp_path_factory.mktemp("synth"))


def _rows(pack, rel):
    return pq.read_table(pack.systems_dir / rel).to_pylist()


def test_files_and_row_counts(pack):
    assert dict(pack.tables) == EXPECTED_ROWS
    for rel, n in EXPECTED_ROWS.items():
        path = pack.systems_dir / rel
        md = pq.ParquetFile(path).metadata
        assert md.num_rows == n
        assert md.row_group(0).column(0).compression == "ZSTD"
    found = {p.relative_to(pack.systems_dir).as_posix() for p in pack.systems_dir.rglob("*.parquet")}
    assert found == set(EXPECTED_ROWS)
    assert not list(pack.data_dir.glob("attention/vllm/2.0/*"))
    assert not list(pack.data_dir.rglob("context_attention_perf.parquet.*"))
    next_dir = pack.data_dir / "gemm/trtllm/1.1"
    assert sorted(p.name for p in next_dir.iterdir()) == ["reuse.yaml"]


def test_yaml_and_configs(pack):
    qv = yaml.safe_load((pack.systems_dir / "query_versions.yaml").read_text())
    assert qv == {
        "schema_version": 1,
        "defaults": {"trtllm": {"current": "1.0", "previous": "0.9"}, "vllm": {"current": "2.0", "previous": None}},
        "overrides": {},
    }
    sysy = yaml.safe_load((pack.systems_dir / "synth_gpu.yaml").read_text())
    assert sysy["data_dir"] == "data/synth_gpu"
    assert sysy["gpu"] == dict(sp.SYSTEM_GPU)
    assert sysy["node"] == dict(sp.SYSTEM_NODE)
    assert sysy["misc"] == {"nccl_mem": dict(sp.SYSTEM_NCCL_MEM), "other_mem": 1_000_000_000, "nccl_version": "2.0"}
    reuse = yaml.safe_load((pack.data_dir / "gemm/trtllm/1.1/reuse.yaml").read_text())
    assert reuse["reuse"] == [{"table": "gemm_perf", "from_version": "1.0", "reason": "test", "approved_by": "test"}]
    for meta_path in pack.data_dir.rglob("collection_meta.yaml"):
        meta = yaml.safe_load(meta_path.read_text())
        backend, version = meta_path.parent.parts[-2:]
        assert meta["runtime"] == {"framework": backend, "version": version}
        assert set(meta["tables"]) == {p.stem for p in meta_path.parent.glob("*.parquet")}
    cfg = json.loads((pack.model_configs_dir / "synth--tiny-llama_config.json").read_text())
    fp8 = json.loads((pack.model_configs_dir / "synth--tiny-llama-fp8_config.json").read_text())
    assert cfg["hidden_size"] == 256 and cfg["num_key_value_heads"] == 2 and "quantization_config" not in cfg
    assert fp8["quantization_config"]["weight_block_size"] == [128, 128]
    assert {k: v for k, v in fp8.items() if k != "quantization_config"} == cfg


def test_latencies_match_formulas(pack):
    f = pack.version_factor
    for row in _rows(pack, "data/synth_gpu/gemm/vllm/2.0/gemm_perf.parquet"):
        assert row["latency"] == pack.gemm_ms(row["gemm_dtype"], row["m"], row["n"], row["k"]) * f[("gemm_perf", "vllm", "2.0")]
    for row in _rows(pack, "data/synth_gpu/attention/trtllm/0.9/context_attention_perf.parquet"):
        exp = pack.ctx_ms(row["batch_size"], row["isl"], row["num_heads"], row["head_dim"], row["kv_cache_dtype"]) * 2.0
        assert row["latency"] == exp and row["batch_size"] * row["isl"] <= 8192
    for row in _rows(pack, "data/synth_gpu/attention/vllm/1.5/generation_attention_perf.parquet"):
        exp = pack.gen_ms(row["batch_size"], row["step"], row["num_key_value_heads"], row["head_dim"], row["kv_cache_dtype"])
        assert row["latency"] == exp * 1.1 and row["kernel_source"] == "vllm_flash_attn_fa3"
    for row in _rows(pack, "data/synth_gpu/comm/trtllm/1.0/custom_allreduce_perf.parquet"):
        assert row["latency"] == pack.ar_ms(row["message_size"], row["num_gpus"])
    # vectorised form agrees with the scalar form
    t = pq.read_table(pack.systems_dir / "data/synth_gpu/comm/nccl/2.0/nccl_perf.parquet")
    vec = pack.nccl_ms(np.asarray(t["op_name"].to_pylist()), t["message_size"].to_numpy(), t["num_gpus"].to_numpy())
    np.testing.assert_array_equal(vec, t["latency"].to_numpy())
    # spot values
    assert pack.gemm_ms("bfloat16", 1, 64, 64) == pytest.approx(0.005 + 2 * 64 * 64 / 5e13 * 1e3 + (64 + 4096 + 64) * 2 / 5e11 * 1e3)
    assert pack.nccl_ms("all_reduce", 256, 2) == pytest.approx(0.01 + 256 * 2 * 2 * 0.5 / 1.5e11 * 1e3)


def test_quirks(pack):
    t = pq.read_table(pack.systems_dir / "data/synth_gpu/gemm/trtllm/1.0/gemm_perf.parquet")
    assert set(t["version"].to_pylist()) == {"1.0.0-relabel"}
    rows = t.to_pylist()
    dup = [r["latency"] for r in rows if (r["gemm_dtype"], r["m"], r["n"], r["k"]) == sp.GEMM_DUP_KEY and r["kernel_source"] == "torch_flow"]
    base = sp.gemm_ms(*sp.GEMM_DUP_KEY)
    assert sorted(dup) == sorted(base * f for f in sp.GEMM_DUP_FACTORS)
    assert float(np.median(dup)) == base and float(np.mean(dup)) != base
    assert not [r for r in rows if (r["gemm_dtype"], r["m"], r["n"], r["k"]) == sp.GEMM_DROPPED]
    alt = [r for r in rows if r["kernel_source"] == "alt_kernel"]
    assert len(alt) == 467 and all(r["gemm_dtype"] == "bfloat16" for r in alt)
    assert all(r["latency"] == sp.gemm_ms("bfloat16", r["m"], r["n"], r["k"]) * 1.1 for r in alt)
    nccl = pq.read_table(pack.systems_dir / "data/synth_gpu/comm/nccl/2.0/nccl_perf.parquet")
    assert nccl.schema.field("op_name").type == pa.large_string()
    assert ctx_string_types(pack) == {pa.string()}
    assert nccl.group_by(["op_name", "num_gpus", "message_size"]).aggregate([("latency", "count")])["latency_count"].to_pylist() == [2] * 228
    vgen = pq.read_table(pack.systems_dir / "data/synth_gpu/attention/vllm/1.5/generation_attention_perf.parquet")
    assert vgen.column_names[-2:] == ["window_size", "latency"]
    gen = pq.read_table(pack.systems_dir / "data/synth_gpu/attention/trtllm/1.0/generation_attention_perf.parquet")
    assert pc.max(pc.multiply(gen["batch_size"], gen["step"])).as_py() <= 262144


def ctx_string_types(pack):
    t = pq.read_table(pack.systems_dir / "data/synth_gpu/attention/trtllm/1.0/context_attention_perf.parquet")
    return {f.type for f in t.schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)}


def test_damage_options(tmp_path):
    p = sp.make_pack(tmp_path / "lfs", lfs_pointer_table="gemm_perf", corrupt_table="context_attention_perf")
    gemm = p.table_path("gemm", "trtllm", "1.0", "gemm_perf")
    text = gemm.read_text()
    assert text.startswith("version https://git-lfs.github.com/spec/v1\noid sha256:")
    assert len(text.splitlines()) == 3 and text.splitlines()[2].startswith("size ")
    with pytest.raises(Exception):
        pq.read_table(gemm)
    with pytest.raises(Exception):
        pq.read_table(p.table_path("attention", "trtllm", "1.0", "context_attention_perf"))
    assert pq.read_table(p.table_path("gemm", "trtllm", "0.9", "gemm_perf")).num_rows == 936
    with pytest.raises(ValueError):
        sp.make_pack(tmp_path / "bad", corrupt_table="no_such_perf")


def test_fast_and_deterministic(tmp_path):
    t0 = time.perf_counter()
    a = sp.make_pack(tmp_path / "a")
    assert time.perf_counter() - t0 < 1.0
    b = sp.make_pack(tmp_path / "b")
    files_a = sorted(p.relative_to(a.root) for p in a.root.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b.root) for p in b.root.rglob("*") if p.is_file())
    assert files_a == files_b
    for rel in files_a:
        assert (a.root / rel).read_bytes() == (b.root / rel).read_bytes(), rel
