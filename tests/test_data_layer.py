"""Data layer on the synthetic pack: system specs, version slots, reuse/backfill, tables, models.

Every expected number comes from :mod:`synthpack` (its YAML constants and latency formulas).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import synthpack as sp
from infercast.data.database import PerfData
from infercast.data.model_configs import pack_model_ids, resolve_model
from infercast.data.pack import Pack as InfPack
from infercast.data.pack import find_pack
from infercast.data.quant import WEIGHT_BYTES
from infercast.data.system import list_systems, load_system
from infercast.data.tables import read_table
from infercast.data.versions import VersionInfo, version_info
from infercast.errors import (
    DataFileError,
    DataPackNotFoundError,
    NotAvailableError,
    UnknownBackendError,
    UnknownModelError,
    UnknownSystemError,
    UnknownVersionError,
)
from infercast.models.spec import build_spec


@pytest.fixture(scope="module")
def pack(synth):
    return find_pack(str(synth.systems_dir))


@pytest.fixture(scope="module")
def system(pack):
    return load_system(pack, sp.SYSTEM)


def _open(synth, backend="trtllm", version=None) -> PerfData:
    return PerfData.open(sp.SYSTEM, backend, version, synth.systems_dir)


# ---------------------------------------------------------------------------------------------
# pack location
# ---------------------------------------------------------------------------------------------
def test_find_pack_explicit_path(synth, pack):
    assert pack.systems_dir == synth.systems_dir.resolve()
    assert pack.model_configs_dir == synth.model_configs_dir.resolve()
    assert pack.origin == "--systems-path"
    assert pack.data_root == pack.systems_dir / "data"


def test_find_pack_errors(tmp_path):
    with pytest.raises(DataPackNotFoundError, match="not a directory"):
        find_pack(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataPackNotFoundError, match="no system YAML"):
        find_pack(str(tmp_path / "empty"))


def test_env_var_does_not_leak():
    import os

    assert "INFERCAST_SYSTEMS_PATH" not in os.environ


# ---------------------------------------------------------------------------------------------
# system spec
# ---------------------------------------------------------------------------------------------
def test_list_systems_skips_control_files(pack):
    assert list_systems(pack) == [sp.SYSTEM]  # query_versions.yaml is not a system


def test_system_spec_fields(system, synth):
    g, n = sp.SYSTEM_GPU, sp.SYSTEM_NODE
    assert system.name == sp.SYSTEM
    assert system.data_dir == synth.systems_dir.resolve() / "data" / sp.SYSTEM
    assert system.gpu.mem_bw == g["mem_bw"]
    assert system.gpu.mem_bw_efficiency == g["mem_bw_empirical_scaling_factor"]
    assert system.gpu.effective_mem_bw == g["mem_bw"] * g["mem_bw_empirical_scaling_factor"] == 5e11
    assert system.gpu.mem_latency_s == 1e-6
    assert system.gpu.mem_capacity == g["mem_capacity"]
    assert system.gpu.power_w == 500 and system.gpu.sm_version == 90
    assert system.gpu.tc_flops == {"bfloat16": 1e14, "int8": 2e14, "fp8": 2e14}
    assert system.gpu.flops("bfloat16") == 1e14 and system.gpu.flops("fp8") == 2e14
    assert system.gpu.flops("fp4") is None  # no fp4_tc_flops key: no FP4 tensor cores
    assert system.node.gpus_per_node == n["num_gpus_per_node"]
    assert system.node.gpus_per_rack is None
    assert system.node.intra_node_bw == n["intra_node_bw"] and system.node.inter_node_bw == n["inter_node_bw"]
    assert system.node.pcie_bw == n["pcie_bw"] and system.node.p2p_latency_s == 1e-5
    assert system.other_mem == sp.SYSTEM_OTHER_MEM
    assert system.nccl_version == sp.NCCL_VERSION and system.oneccl_version is None
    assert system.nccl_mem == dict(sp.SYSTEM_NCCL_MEM)


def test_nccl_mem_lookup_and_bandwidth_tiers(system):
    assert system.nccl_mem_for(1) == 0
    assert system.nccl_mem_for(2) == 100_000_000
    assert system.nccl_mem_for(64) == 100_000_000  # beyond the largest key: the largest key's value
    assert system.node.bandwidth_for_group(2) == (2e11, "intra-node")
    assert system.node.bandwidth_for_group(8) == (2e11, "intra-node")
    assert system.node.bandwidth_for_group(16) == (5e10, "inter-node")


@pytest.mark.parametrize("m", [1, 7.5, 4096.0, 3e6])
@pytest.mark.parametrize("group", [1, 2, 16])
def test_sol_scalar_path_equals_array_path(system, m, group):
    """One shape takes plain floats through the rooflines (a grid's scalar lookups); the numbers
    are the array path's, bit for bit, and the formulas' (the synthetic system's spec)."""
    from infercast.interp import sol

    one = sol.gemm(system, "bfloat16", 2.0, m, 256, 512)
    arr = sol.gemm(system, "bfloat16", 2.0, np.array([m]), 256, 512)
    assert all(isinstance(x, float) for x in one)
    assert [float(x) for x in one] == [float(x[0]) for x in arr]
    math_ms = 2.0 * m * 256 * 512 / system.gpu.flops("bfloat16") * 1e3
    assert one[1] == pytest.approx(math_ms, rel=1e-15)
    c_one = sol.collective(system, "all_reduce", m * 2.0, group)
    c_arr = sol.collective(system, "all_reduce", np.array([m * 2.0]), group)
    assert [float(x) for x in c_one] == [float(np.ravel(x)[0]) for x in c_arr]


def _write_system(tmp_path: Path, name: str, body: str) -> InfPack:
    sysdir = tmp_path / "systems"
    sysdir.mkdir(exist_ok=True)
    (sysdir / f"{name}.yaml").write_text(body)
    return InfPack(sysdir, None, "test")


def test_nccl_mem_picks_smallest_key_not_below_group_and_rack_tiers(tmp_path):
    body = (
        "gpu: {mem_bw: 1.0e12, mem_capacity: 1000, bfloat16_tc_flops: 1.0e14}\n"
        "node: {num_gpus_per_node: 4, num_gpus_per_rack: 16, intra_node_bw: 300, inter_node_bw: 100,"
        " inter_rack_bw: 10, inter_rack_latency: 0.001}\n"
        "misc: {nccl_mem: {1: 0, 2: 11, 4: 22, 8: 33}, other_mem: 5}\n"
    )
    spec = load_system(_write_system(tmp_path, "racky", body), "racky")
    assert [spec.nccl_mem_for(g) for g in (1, 2, 3, 4, 5, 8, 9)] == [0, 11, 22, 22, 33, 33, 33]
    assert spec.node.bandwidth_for_group(4) == (300.0, "intra-node")
    assert spec.node.bandwidth_for_group(8) == (100.0, "intra-rack")
    assert spec.node.bandwidth_for_group(32) == (10.0, "inter-rack")
    # defaults for absent keys
    assert spec.gpu.mem_bw_efficiency == 1.0 and spec.gpu.mem_latency_s == 0.0
    assert spec.node.p2p_latency_s == 1e-5


def test_system_spec_missing_key_is_data_file_error(tmp_path):
    pack = _write_system(tmp_path, "broken", "gpu: {mem_capacity: 1}\nnode: {num_gpus_per_node: 8, intra_node_bw: 1}\n")
    with pytest.raises(DataFileError, match=r"missing gpu\.mem_bw"):
        load_system(pack, "broken")


def test_unknown_system_lists_what_exists(pack):
    with pytest.raises(UnknownSystemError) as ei:
        load_system(pack, "h9000")
    assert ei.value.available == [sp.SYSTEM]
    assert "h9000" in str(ei.value) and sp.SYSTEM in str(ei.value)


# ---------------------------------------------------------------------------------------------
# version slots
# ---------------------------------------------------------------------------------------------
def test_version_slots_trtllm(pack, system):
    info = version_info(pack, system, "trtllm")
    assert info.collected == ("0.9", "1.0", "1.1")  # 1.1 holds only reuse.yaml but is a version dir
    assert (info.current, info.previous, info.next) == ("1.0", "0.9", "1.1")
    assert info.slots() == {"current": "1.0", "previous": "0.9", "next": "1.1"}


def test_version_slots_vllm(pack, system):
    info = version_info(pack, system, "vllm")
    assert info.collected == ("1.5", "2.0")
    assert (info.current, info.previous, info.next) == ("2.0", None, None)
    assert info.slots() == {"current": "2.0"}


def test_unknown_backend_lists_backends(pack, system):
    for backend in ("sglang", "tensorflow"):
        with pytest.raises(UnknownBackendError) as ei:
            version_info(pack, system, backend)
        assert ei.value.available == ["trtllm", "vllm"]


def test_system_without_any_tables_names_the_systems_that_have_them(synth, tmp_path):
    """A system whose spec ships without a single table (the real pack has a few) is refused with
    that reason and the systems holding the backend's data, not an empty list of backends."""
    systems = tmp_path / "systems"
    shutil.copytree(synth.systems_dir, systems)
    yaml_text = (systems / f"{sp.SYSTEM}.yaml").read_text().replace(f"data_dir: data/{sp.SYSTEM}", "data_dir: data/bare")
    (systems / "bare.yaml").write_text(yaml_text)
    (systems / "data" / "bare").mkdir()
    p2 = find_pack(str(systems))
    bare = load_system(p2, "bare")
    with pytest.raises(UnknownBackendError) as ei:
        version_info(p2, bare, "vllm")
    assert "no measured perf tables for it at all" in str(ei.value)
    assert ei.value.available == [sp.SYSTEM]
    with pytest.raises(UnknownBackendError) as ei:  # an unknown backend keeps the plain reason
        version_info(p2, bare, "tensorflow")
    assert "no version directory" in str(ei.value) and ei.value.available == []


def test_version_resolve_aliases_and_dirs(pack, system):
    info = version_info(pack, system, "trtllm")
    assert info.resolve(None) == "1.0"
    assert info.resolve("current") == "1.0"
    assert info.resolve("previous") == "0.9"
    assert info.resolve("next") == "1.1"
    assert info.resolve("0.9") == "0.9"
    assert info.resolve("1.1") == "1.1"


def test_version_resolve_errors_list_what_exists(pack, system):
    trt = version_info(pack, system, "trtllm")
    with pytest.raises(UnknownVersionError) as ei:
        trt.resolve("7.7")
    assert ei.value.available == sorted(["current=1.0", "previous=0.9", "next=1.1", "0.9", "1.0", "1.1"])
    assert "7.7" in str(ei.value)
    # the relabelled parquet `version` column is not a version: the directory is authoritative
    with pytest.raises(UnknownVersionError):
        trt.resolve(sp.RELABELLED_VERSION)
    vllm = version_info(pack, system, "vllm")
    with pytest.raises(UnknownVersionError) as ei:
        vllm.resolve("previous")
    assert "previous" in str(ei.value)
    assert ei.value.available == ["1.5", "2.0", "current"]
    with pytest.raises(UnknownVersionError):
        vllm.resolve("next")


def test_version_info_resolve_constructed():
    info = VersionInfo("s", "b", ("1", "2", "3"), "2", None, "3")
    assert info.resolve("next") == "3" and info.resolve("1") == "1"
    with pytest.raises(UnknownVersionError) as ei:
        info.resolve("previous")
    assert ei.value.available == ["1", "2", "3", "current", "next"]


# ---------------------------------------------------------------------------------------------
# table location: direct, reuse, backfill (older only)
# ---------------------------------------------------------------------------------------------
def test_perfdata_open_end_to_end(synth):
    d = _open(synth)
    assert d.system.name == sp.SYSTEM and d.backend == "trtllm" and d.version == "1.0"
    assert d.versions.slots() == {"current": "1.0", "previous": "0.9", "next": "1.1"}
    assert d.available_tables() == ["context_attention", "custom_allreduce", "gemm", "generation_attention"]
    t = d.table("context_attention")
    loc = d.served["context_attention"]
    assert (loc.served_by, loc.how) == ("1.0", "direct")
    assert loc.path == synth.table_path("attention", "trtllm", "1.0", "context_attention_perf").resolve()
    m = t.mask(num_heads=8, num_key_value_heads=2, head_dim=32, kv_cache_dtype="bfloat16", batch_size=4, isl=512)
    assert m.sum() == 1
    assert t.latency[m][0] == sp.ctx_ms(4, 512, 8, 32)
    assert d.provenance() == {"context_attention": "1.0 (direct)"}


def test_previous_version_serves_its_own_data(synth):
    d = _open(synth, "trtllm", "previous")
    assert d.version == "0.9"
    t = d.table("gemm")
    m = t.mask(gemm_dtype="bfloat16", m=128, n=512, k=1024)
    assert m.sum() == 1
    assert t.latency[m][0] == sp.gemm_ms("bfloat16", 128, 512, 1024) * 1.5
    assert d.served["gemm"].how == "direct"


def test_next_version_gemm_is_served_by_1_0_data(synth):
    d = _open(synth, "trtllm", "next")
    assert d.version == "1.1"
    t = d.table("gemm")
    loc = d.served["gemm"]
    assert loc.served_by == "1.0"
    assert loc.path == synth.table_path("gemm", "trtllm", "1.0", "gemm_perf").resolve()
    m = t.mask(kernel_source="torch_flow", gemm_dtype="fp8_block", m=16, n=2048, k=64)
    assert t.latency[m][0] == sp.gemm_ms("fp8_block", 16, 2048, 64)


def test_reuse_yaml_is_honoured(synth):
    d = _open(synth, "trtllm", "1.1")
    d.table("gemm")
    loc = d.served["gemm"]
    assert (loc.served_by, loc.how) == ("1.0", "reuse")
    assert d.provenance()["gemm"] == "1.0 (reuse)"


def test_missing_table_in_next_is_backfilled_from_older(synth):
    d = _open(synth, "trtllm", "1.1")
    t = d.table("context_attention")
    loc = d.served["context_attention"]
    assert (loc.served_by, loc.how) == ("1.0", "backfill")  # the newest older version that has it
    m = t.mask(num_heads=4, num_key_value_heads=1, head_dim=32, kv_cache_dtype="fp8", batch_size=2, isl=64)
    assert t.latency[m][0] == sp.ctx_ms(2, 64, 4, 32, "fp8")  # 1.0 data (x1), not 0.9 (x2)


def test_backfill_from_older_version(synth):
    d = _open(synth, "vllm")
    assert d.version == "2.0"
    t = d.table("generation_attention")
    loc = d.served["generation_attention"]
    assert (loc.served_by, loc.how) == ("1.5", "backfill")
    assert d.provenance() == {"generation_attention": "1.5 (backfill)"}
    m = t.mask(num_heads=8, num_key_value_heads=2, head_dim=32, kv_cache_dtype="bfloat16", batch_size=8, step=63)
    assert t.latency[m][0] == sp.gen_ms(8, 63, 2, 32) * 1.1


def test_never_backfilled_forward(synth):
    # gemm exists for vllm only in 2.0; the older 1.5 must not borrow it from the future
    d = _open(synth, "vllm", "1.5")
    with pytest.raises(NotAvailableError):
        d.table("gemm")
    # generation attention exists for trtllm only in 1.0; 0.9 must not borrow it
    d = _open(synth, "trtllm", "0.9")
    with pytest.raises(NotAvailableError) as ei:
        d.table("generation_attention")
    assert "generation_attention" in str(ei.value)
    assert d.has_table("generation_attention") is False
    assert d.has_table("gemm") is True


def test_missing_table_lists_available(synth):
    d = _open(synth, "vllm")
    with pytest.raises(NotAvailableError) as ei:
        d.table("context_attention")
    assert ei.value.available == ["gemm", "generation_attention"]
    msg = str(ei.value)
    assert "context_attention" in msg and "vllm 2.0" in msg and "gemm" in msg


# ---------------------------------------------------------------------------------------------
# table normalisation
# ---------------------------------------------------------------------------------------------
def test_duplicate_key_aggregated_by_median(synth):
    t = _open(synth).table("gemm")
    assert t.raw_rows == synth.tables["data/synth_gpu/gemm/trtllm/1.0/gemm_perf.parquet"] == 1404
    assert len(t) == 1402 and t.duplicate_keys == 1
    dt, m, n, k = sp.GEMM_DUP_KEY
    sel = t.mask(kernel_source=sp.GEMM_DEFAULT_KERNEL, gemm_dtype=dt, m=m, n=n, k=k)
    assert sel.sum() == 1
    assert t.latency[sel][0] == sp.gemm_ms(dt, m, n, k)  # the median, exactly; the mean is 1.0667x
    # the dropped key stays dropped for both kernels
    dt, m, n, k = sp.GEMM_DROPPED
    assert t.mask(gemm_dtype=dt, m=m, n=n, k=k).sum() == 0


def test_every_gemm_row_matches_formula(synth):
    t = _open(synth).table("gemm")
    expect = np.asarray(sp.gemm_ms(t.keys["gemm_dtype"], t.keys["m"], t.keys["n"], t.keys["k"]))
    expect = np.where(t.keys["kernel_source"] == sp.GEMM_ALT_KERNEL, expect * sp.GEMM_ALT_FACTOR, expect)
    np.testing.assert_array_equal(t.latency, expect)


def test_relabelled_version_column_is_irrelevant(synth):
    d = _open(synth, "trtllm", "1.0")
    t = d.table("gemm")
    assert "version" not in t.keys and "framework" not in t.keys and "device" not in t.keys
    assert d.served["gemm"].served_by == "1.0"
    assert list(t.keys) == ["op_name", "kernel_source", "gemm_dtype", "m", "n", "k"]


def test_large_string_normalised_and_repeats_collapsed(synth):
    nt = _open(synth).comm_library_table()
    assert _open(synth).system.nccl_version == "2.0"
    assert nt.keys["op_name"].dtype.kind == "U" and nt.keys["nccl_dtype"].dtype.kind == "U"
    assert nt.raw_rows == 456 and len(nt) == 228 and nt.duplicate_keys == 228
    assert nt.unique("op_name") == sorted(sp.NCCL_OPS)
    sel = nt.mask(op_name="all_gather", num_gpus=4)
    assert sel.sum() == len(sp.NCCL_MESSAGE_SIZES)
    np.testing.assert_array_equal(nt.latency[sel], sp.nccl_ms("all_gather", nt.keys["message_size"][sel], 4))
    assert nt.keys["message_size"].dtype == np.int64


def test_column_order_irrelevant(synth):
    t = _open(synth, "vllm").table("generation_attention")
    assert t.has("window_size") and set(t.unique("window_size")) == {0}
    sel = t.mask(num_heads=16, num_key_value_heads=4, head_dim=32, kv_cache_dtype="fp8", batch_size=2, step=1023)
    assert t.latency[sel][0] == sp.gen_ms(2, 1023, 4, 32, "fp8") * 1.1


def test_unknown_column_in_mask_is_not_available(synth):
    t = _open(synth).table("gemm")
    with pytest.raises(NotAvailableError, match="no column 'batch_size'"):
        t.mask(batch_size=1)


def _write(path: Path, table: pa.Table) -> Path:
    pq.write_table(table, path)
    return path


def test_read_table_even_repeats_median_and_units(tmp_path):
    p = _write(
        tmp_path / "moe_a2a_perf.parquet",
        pa.table(
            {
                "framework": ["x"] * 5,
                "version": ["v"] * 5,
                "op_name": pa.array(["a2a"] * 5, pa.large_string()),
                "tokens": [8, 8, 8, 8, 16],
                "latency": [1000.0, 2000.0, 10000.0, 100000.0, 3000.0],  # microseconds in moe_a2a
                "dispatch_transmit_us": [10.0, 20.0, 30.0, 40.0, 50.0],
            }
        ),
    )
    t = read_table(p)
    assert t.stem == "moe_a2a" and t.raw_rows == 5 and len(t) == 2 and t.duplicate_keys == 1
    order = np.argsort(t.keys["tokens"])
    assert t.keys["tokens"][order].tolist() == [8, 16]
    # four repeats: median = mean of the two middle values (2000 and 10000 us -> 6 ms)
    assert t.latency[order].tolist() == [6.0, 3.0]
    assert "dispatch_transmit_us" not in t.values
    assert t.values["dispatch_transmit_ms"][order].tolist() == [0.025, 0.05]


def test_read_table_string_keys_merge_in_sorted_order(tmp_path):
    """String keys are grouped through pyarrow's dictionary (first-seen order: zeta, alpha, beta)
    but merged rows come out sorted by value, each with its own medians."""
    p = _write(
        tmp_path / "k_perf.parquet",
        pa.table({
            "kernel_source": ["zeta", "alpha", "zeta", "beta", "alpha"],
            "n": [1, 1, 1, 2, 1],
            "latency": [1.0, 2.0, 3.0, 4.0, 6.0],
        }),
    )
    t = read_table(p)
    assert t.keys["kernel_source"].tolist() == ["alpha", "beta", "zeta"]
    assert t.keys["n"].tolist() == [1, 2, 1]
    assert t.latency.tolist() == [4.0, 4.0, 2.0]
    assert t.duplicate_keys == 2 and t.raw_rows == 5


def test_read_table_avg_ms_becomes_latency(tmp_path):
    p = _write(tmp_path / "x_perf.parquet", pa.table({"n": [1, 2], "avg_ms": [0.5, 0.25]}))
    t = read_table(p)
    assert t.stem == "x" and t.latency.tolist() == [0.5, 0.25] and "avg_ms" not in t.values


def test_read_table_missing_file(tmp_path):
    with pytest.raises(DataFileError, match="does not exist"):
        read_table(tmp_path / "nope_perf.parquet")


# ---------------------------------------------------------------------------------------------
# damaged packs
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def lfs_pack(tmp_path_factory):
    return sp.make_pack(tmp_path_factory.mktemp("lfs"), lfs_pointer_table="gemm_perf", corrupt_table="nccl_perf")


@pytest.fixture(scope="module")
def corrupt_pack(tmp_path_factory):
    return sp.make_pack(tmp_path_factory.mktemp("corrupt"), corrupt_table="context_attention_perf", lfs_pointer_table="nccl_perf")


def test_lfs_pointer_is_data_file_error_naming_file(lfs_pack):
    d = _open(lfs_pack)
    with pytest.raises(DataFileError) as ei:
        d.table("gemm")
    msg = str(ei.value)
    assert str(lfs_pack.table_path("gemm", "trtllm", "1.0", "gemm_perf").resolve()) in msg
    assert "LFS" in msg
    assert "\n" not in msg


def test_corrupt_file_is_data_file_error_naming_file(corrupt_pack):
    d = _open(corrupt_pack)
    with pytest.raises(DataFileError) as ei:
        d.table("context_attention")
    msg = str(ei.value)
    assert str(corrupt_pack.table_path("attention", "trtllm", "1.0", "context_attention_perf").resolve()) in msg
    assert "unreadable" in msg
    # the other tables of the same version are unaffected
    assert len(d.table("generation_attention")) == 1050


def test_damaged_nccl_tables(lfs_pack, corrupt_pack):
    with pytest.raises(DataFileError, match="unreadable") as ei:
        _open(lfs_pack).comm_library_table()
    assert "nccl_perf.parquet" in str(ei.value)
    with pytest.raises(DataFileError, match="LFS") as ei:
        _open(corrupt_pack).comm_library_table()
    assert "nccl_perf.parquet" in str(ei.value)


# ---------------------------------------------------------------------------------------------
# model configs
# ---------------------------------------------------------------------------------------------
def test_pack_model_ids(pack, synth):
    ids = pack_model_ids(pack)
    assert sorted(ids) == [sp.MODEL_ID, sp.MODEL_ID_FP8]
    assert ids[sp.MODEL_ID] == synth.model_configs_dir.resolve() / "synth--tiny-llama_config.json"


def test_resolve_exact_id(pack):
    mc = resolve_model(pack, sp.MODEL_ID)
    assert mc.model_id == mc.resolved_id == sp.MODEL_ID
    assert mc.alias_note is None and mc.quant_from_alias is None and mc.hf_quant is None
    spec = build_spec(mc)
    assert (spec.hidden, spec.num_heads, spec.num_kv_heads, spec.head_dim) == (256, 8, 2, 32)
    assert (spec.intermediate, spec.num_layers, spec.vocab) == (512, 2, 1000)
    assert spec.family == "dense" and spec.architecture == "LlamaForCausalLM"
    assert spec.max_position == 4096 and spec.sliding_window is None and spec.tie_embeddings is False
    assert spec.quant.gemm == "bfloat16" and spec.quant.kv_cache == "bfloat16"


def test_quant_inferred_from_checkpoint(pack):
    spec = build_spec(resolve_model(pack, sp.MODEL_ID_FP8))
    assert spec.quant.gemm == "fp8_block"  # quant_method fp8 + weight_block_size
    assert spec.quant.kv_cache == "bfloat16"
    assert "weight_block_size" in spec.quant.source
    assert WEIGHT_BYTES[spec.quant.gemm] == 1.0 + 4.0 / (128 * 128)


def test_resolve_local_directory_and_file(pack, synth, tmp_path):
    src = synth.model_configs_dir / "synth--tiny-llama-fp8_config.json"
    d = tmp_path / "my-model"
    d.mkdir()
    shutil.copy(src, d / "config.json")
    by_dir = resolve_model(pack, str(d))
    assert by_dir.resolved_id == str(d / "config.json") and by_dir.model_id == str(d)
    assert build_spec(by_dir).quant.gemm == "fp8_block"
    by_file = resolve_model(pack, str(src))
    assert by_file.config == json.loads(src.read_text())
    # an hf_quant_config.json next to the config is read (ModelOpt per-tensor FP8)
    cfg = json.loads((synth.model_configs_dir / "synth--tiny-llama_config.json").read_text())
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}))
    spec = build_spec(resolve_model(pack, str(d)))
    assert (spec.quant.gemm, spec.quant.kv_cache) == ("fp8", "fp8")


def test_local_directory_without_config(pack, tmp_path):
    with pytest.raises(UnknownModelError, match="no config.json"):
        resolve_model(pack, str(tmp_path))


def test_local_config_invalid_json(pack, tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(DataFileError, match="not valid JSON"):
        resolve_model(pack, str(bad))


def test_aliases_on_synthetic_pack(pack):
    # case-insensitive id
    mc = resolve_model(pack, "SYNTH/Tiny-Llama")
    assert mc.resolved_id == sp.MODEL_ID and "resolved to" in mc.alias_note
    # another organisation's re-export with a quant suffix -> base config + that quant
    mc = resolve_model(pack, "nvidia/tiny-llama-NVFP4")
    assert mc.resolved_id == sp.MODEL_ID and mc.quant_from_alias == "nvfp4"
    assert "nvfp4" in mc.alias_note
    assert build_spec(mc).quant.gemm == "nvfp4"
    # -Instruct is dropped
    assert resolve_model(pack, "synth/tiny-llama-Instruct").resolved_id == sp.MODEL_ID


def test_unknown_model_lists_pack_ids(pack):
    with pytest.raises(UnknownModelError) as ei:
        resolve_model(pack, "nope/not-a-model")
    assert ei.value.available == [sp.MODEL_ID, sp.MODEL_ID_FP8]
    assert "nope/not-a-model" in str(ei.value)


@pytest.mark.parametrize(
    ("extra", "arch", "want"),
    [
        ({}, None, ""),
        ({"use_qk_norm": True}, None, "per_head"),
        ({"use_qk_norm": True, "qk_norm_type": "per_layer"}, None, "per_layer"),
        ({}, "Qwen3ForCausalLM", "per_head"),
    ],
)
def test_qk_norm_ops_in_plan(pack, synth, tmp_path, extra, arch, want):
    """q/k RMSNorm: an elementwise op per attention layer; a layer-wide (per_layer) norm under TP
    also all-reduces one fp32 sum of squares per token for q and for k (2 calls per layer)."""
    from infercast.models.plan import ParallelConfig, build_plan

    cfg = json.loads((synth.model_configs_dir / "synth--tiny-llama_config.json").read_text())
    cfg.update(extra)
    if arch:
        cfg["architectures"] = [arch]
    d = tmp_path / "qk"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    spec = build_spec(resolve_model(pack, str(d)))
    assert spec.qk_norm == want
    for tp in (1, 2):
        ops = {o.name: o for o in build_plan(spec, ParallelConfig(tp=tp)).ops}
        if not want:
            assert "qk_norm" not in ops and "qk_norm_allreduce" not in ops
            continue
        heads, kvh, hd = spec.num_heads // tp, max(1, spec.num_kv_heads // tp), spec.head_dim
        assert ops["qk_norm"].count == spec.num_layers
        assert ops["qk_norm"].params["bytes_per_token"] == (heads + kvh) * hd * 2 * 2
        if want == "per_layer" and tp > 1:
            ar = ops["qk_norm_allreduce"]
            assert (ar.kind, ar.count, ar.params["elements_per_token"], ar.params["group"]) == ("allreduce", 2 * spec.num_layers, 2, tp)
        else:
            assert "qk_norm_allreduce" not in ops


def test_pack_model_ids_listed_once_and_again_when_the_directory_changes(synth, tmp_path):
    import os
    import shutil

    from infercast.data.model_configs import pack_model_ids
    from infercast.data.pack import find_pack

    root = tmp_path / "pack"
    shutil.copytree(synth.root, root)
    pack = find_pack(root / "systems")
    first = pack_model_ids(pack)
    first["x/y"] = None  # a caller's copy: changing it changes nothing kept
    assert "x/y" not in pack_model_ids(pack)
    src = next(iter(pack_model_ids(pack).values()))
    shutil.copy(src, pack.model_configs_dir / "acme--new-model_config.json")
    st = pack.model_configs_dir.stat()
    os.utime(pack.model_configs_dir, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a new listing time, surely
    assert "acme/new-model" in pack_model_ids(pack)


def test_installed_pack_found_on_the_import_path_only_beside_its_dist_info(tmp_path, monkeypatch):
    """The quick look for the installed pack (no importlib.metadata) takes a package directory on
    the import path only when its distribution's .dist-info sits beside it; never imports it."""
    import importlib
    import sys

    from infercast.data import pack as pack_mod

    fake = tmp_path / "site" / pack_mod.PACK_PACKAGE_DIR
    (fake / "systems").mkdir(parents=True)
    (fake / "__init__.py").write_text("raise RuntimeError('the pack package must never be imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    assert pack_mod._found_package_systems_dir() is None  # a same-named folder, not an installed wheel
    (tmp_path / "site" / f"{pack_mod.PACK_PACKAGE_DIR}-0.12.0.dist-info").mkdir()
    assert pack_mod._found_package_systems_dir() == fake / "systems"
    assert pack_mod.PACK_PACKAGE_DIR not in sys.modules
