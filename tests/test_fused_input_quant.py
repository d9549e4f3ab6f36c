"""A GEMM whose input arrives quantised (ops.gemm ``fused_input_quant``) does not pay the
activation-quantisation kernel its table includes: exact answers on a synthetic pack whose
``scale_matrix`` table follows a known formula."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import synthpack as sp

from infercast.data.database import PerfData
from infercast.ops import gemm as gemm_ops
from infercast.ops.base import DatabaseMode, OpDB

QUANT_M = (1, 16, 256, 4096)
QUANT_K = (64, 512, 2048)


def quant_ms(m, k):
    """The synthetic activation-quantisation kernel: 2 us + 1 ns per thousand elements."""
    return 0.002 + np.asarray(m, float) * np.asarray(k, float) * 1e-9


@pytest.fixture()
def pack(tmp_path, monkeypatch):
    p = sp.make_pack(tmp_path)
    rows = [(m, k) for m in QUANT_M for k in QUANT_K]
    m, k = (list(c) for c in zip(*rows))
    table = pa.table({
        "framework": ["TRTLLM"] * len(rows), "version": [sp.TRTLLM_CURRENT] * len(rows),
        "op_name": ["scale_matrix"] * len(rows), "kernel_source": ["torch_ops"] * len(rows),
        "m": pa.array(m, pa.int64()), "k": pa.array(k, pa.int64()),
        "quant_dtype": ["fp8_block"] * len(rows), "latency": quant_ms(m, k),
    })
    path = p.table_path("quantize", "trtllm", sp.TRTLLM_CURRENT, "scale_matrix_perf")
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    # the synthetic pack's quantised GEMM mode is fp8_block: let it stand for the fusable one
    monkeypatch.setattr(gemm_ops, "FUSABLE_INPUT_QUANT", {"fp8_block": "scale_matrix"})
    return p


def _db(pack, mode=DatabaseMode.SILICON, backend="trtllm"):
    return OpDB(PerfData.open(sp.SYSTEM, backend, None, pack.systems_dir), mode)


@pytest.mark.parametrize(("n", "k"), [(2048, 2048), (512, 512), (1024, 64)])
def test_fused_input_drops_the_quant_kernel_exactly(pack, n, k):
    db = _db(pack)
    m = np.array([1.0, 16.0, 256.0, 4096.0])
    plain = gemm_ops.resolve_gemm(db, "fp8_block", n, k).grid(m)[0]
    fused_r = gemm_ops.resolve_gemm(db, "fp8_block", n, k, fused_input_quant=True)
    fused = fused_r.grid(m)[0]
    np.testing.assert_allclose(plain, sp.gemm_ms("fp8_block", m, n, k), rtol=1e-12)
    sol = gemm_ops.gemm_sol_fn(db, "fp8_block", n, k)(m)
    np.testing.assert_allclose(fused, np.maximum(plain - quant_ms(m, k), sol), rtol=1e-12)
    assert (fused < plain).all()
    assert any("activation quantisation" in note for note in fused_r.notes)


def test_off_grid_k_and_m_interpolate_in_log_space(pack):
    db = _db(pack)
    cost = gemm_ops.input_quant_cost(db, "fp8_block", 1024)  # between k = 512 and 2048
    # halfway in log2 k; m on the grid
    np.testing.assert_allclose(cost(np.array([16.0])), 0.5 * (quant_ms(16, 512) + quant_ms(16, 2048)), rtol=1e-12)
    # beyond the collected m the nearest measured size holds
    np.testing.assert_allclose(cost(np.array([1e6])), 0.5 * (quant_ms(4096, 512) + quant_ms(4096, 2048)), rtol=1e-12)
    # beyond the collected k the nearest measured k holds
    np.testing.assert_allclose(gemm_ops.input_quant_cost(db, "fp8_block", 8192)(np.array([16.0])), quant_ms(16, 2048), rtol=1e-12)


def test_no_table_or_other_modes_leave_the_gemm_as_measured(pack):
    m = np.array([1.0, 64.0, 1024.0])
    # bfloat16 has no quantisation kernel to drop
    db = _db(pack)
    np.testing.assert_array_equal(gemm_ops.resolve_gemm(db, "bfloat16", 512, 512, fused_input_quant=True).grid(m)[0],
                                  gemm_ops.resolve_gemm(db, "bfloat16", 512, 512).grid(m)[0])
    # vLLM's synthetic data has no quantize table
    dbv = _db(pack, backend="vllm")
    np.testing.assert_array_equal(gemm_ops.resolve_gemm(dbv, "fp8_block", 512, 512, fused_input_quant=True).grid(m)[0],
                                  gemm_ops.resolve_gemm(dbv, "fp8_block", 512, 512).grid(m)[0])
    # the speed of light has no quantisation kernel in it
    dbs = _db(pack, DatabaseMode.SOL)
    np.testing.assert_array_equal(gemm_ops.resolve_gemm(dbs, "fp8_block", 512, 512, fused_input_quant=True).grid(m)[0],
                                  gemm_ops.resolve_gemm(dbs, "fp8_block", 512, 512).grid(m)[0])
