"""Kimi Delta Attention (ops/kda.py): conv + scan summed per cell from a synthetic ``kda_perf``,
the default decode kernel chosen by row count, the fixed-size state, and exact cells of the real
pack's table."""

from __future__ import annotations

import glob
import importlib.metadata

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from synthpack import SYSTEM, TRTLLM_CURRENT, make_pack

from infercast.data.database import PerfData
from infercast.errors import NotAvailableError
from infercast.ops.base import OpDB
from infercast.ops.kda import kda_state_bytes, resolve_kda

D, HD = 256, 128


def _rows():
    rows = {k: [] for k in ("op_name", "kernel_source", "phase", "batch_size", "seq_len", "num_tokens", "d_model",
                            "d_conv", "num_k_heads", "head_k_dim", "num_v_heads", "head_v_dim", "latency")}

    def add(kernel, phase, b, s, h, lat):
        for k, v in zip(rows, ("kda", kernel, phase, b, s, b * s, D, 4, h, HD, h, HD, lat)):
            rows[k].append(v)

    for h in (8, 16):
        for b in (1, 4):
            for s in (16, 256):
                add("causal_conv1d_fn_qkv3", "context", b, s, h, 0.001 * b * s)
                add("chunk_kda", "context", b, s, h, 0.01 * b * s * h / 8)
            add("causal_conv1d_update", "generation", b, 1, h, 0.002 * b)
            add("decode_a", "generation", b, 1, h, 0.05 * b * h / 8)
            add("verify_kernel", "verify", b, 2, h, 99.0)
        add("decode_b", "generation", 1, 1, h, 123.0)  # fewer rows: not the default
    return rows


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    pack = make_pack(tmp_path_factory.mktemp("kdapack"))
    d = pack.data_dir / "kda" / "trtllm" / TRTLLM_CURRENT
    d.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(_rows()), d / "kda_perf.parquet")
    return OpDB(PerfData.open(SYSTEM, "trtllm", TRTLLM_CURRENT, systems_path=pack.systems_dir))


def test_conv_plus_scan_by_cell(db):
    r = resolve_kda(db, "context", d_model=D, num_heads=16, head_dim=HD)
    assert r.source == "kda" and r.how == "exact" and r.kernel == "causal_conv1d_fn_qkv3+chunk_kda"
    assert r.grid.scalar(4, 256)[0] == pytest.approx(0.001 * 4 * 256 + 0.01 * 4 * 256 * 2)
    assert r.grid.scalar(1, 16)[0] == pytest.approx(0.016 + 0.16 * 2)


def test_generation_default_kernel_and_step_independence(db):
    r = resolve_kda(db, "generation", d_model=D, num_heads=8, head_dim=HD)
    assert r.kernel == "causal_conv1d_update+decode_a"
    assert r.grid.scalar(4, 10)[0] == pytest.approx(0.008 + 0.2)
    assert r.grid.scalar(4, 100_000)[0] == pytest.approx(0.008 + 0.2)  # verify rows never read


def test_missing_table_is_refused(tmp_path):
    pack = make_pack(tmp_path)
    db = OpDB(PerfData.open(SYSTEM, "trtllm", TRTLLM_CURRENT, systems_path=pack.systems_dir))
    with pytest.raises(NotAvailableError, match="kda_perf"):
        resolve_kda(db, "context", d_model=D, num_heads=8, head_dim=HD)


def test_state_bytes_by_hand():
    # 2 heads of 4: state 2*4*4 fp32 = 128 B; conv (4-1) x (q, k, v: 3*2*4 channels) bf16 = 144 B
    assert kda_state_bytes(2, 4, 4) == 2 * 4 * 4 * 4 + 3 * 24 * 2


@pytest.mark.real_pack
def test_real_pack_exact_cell():
    root = importlib.metadata.distribution("aiconfigurator-core").locate_file("aiconfigurator_core/systems/data")
    path = glob.glob(f"{root}/b200_sxm/kda/sglang/0.5.16/kda_perf.parquet")[0]
    t = pq.read_table(path).to_pylist()

    def lat(kernel):
        v = [r["latency"] for r in t if r["kernel_source"] == kernel and r["phase"] == "context" and r["num_k_heads"] == 48
             and r["batch_size"] == 2 and r["seq_len"] == 1024]
        assert len(v) == 1
        return v[0]

    db = OpDB(PerfData.open("b200_sxm", "sglang", "0.5.16"))
    r = resolve_kda(db, "context", d_model=7168, num_heads=48, head_dim=128)
    assert r.grid.scalar(2, 1024)[0] == pytest.approx(lat("causal_conv1d_fn_qkv3") + lat("chunk_kda"), rel=1e-6)
