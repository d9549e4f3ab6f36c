"""The public per-op API (infercast.PerfDB) on the synthetic pack: exact values from the
formulas, vectorisation over shapes and sites, provenance labels, bad input."""

from __future__ import annotations

import numpy as np
import pytest

import synthpack as sp
from infercast import PerfDB
from infercast.errors import InvalidInputError, NotAvailableError


@pytest.fixture(scope="module")
def db(synth):
    return PerfDB(sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)


def test_gemm_exact_hits_vectorised_over_m_and_sites(db):
    m = np.array([1, 64, 1024, 2])
    n = np.array([256, 512, 256, 512])
    r = db.gemm("fp8_block", m, n, 512)
    np.testing.assert_array_equal(r.ms, sp.gemm_ms("fp8_block", m, n, 512))
    assert list(r.provenance) == ["exact"] * 4
    assert len(r.sources) == 2 and {s["n"] for s in r.sources} == {256, 512}


def test_gemm_off_grid_m_is_interpolated_and_between_neighbours(db):
    r = db.gemm("fp8_block", [100.0], 256, 512)
    lo, hi = sp.gemm_ms("fp8_block", 64, 256, 512), sp.gemm_ms("fp8_block", 128, 256, 512)
    assert lo < r.ms[0] < hi and r.provenance[0] == "interpolated"


def test_gemm_off_lattice_site_is_transferred(db):
    r = db.gemm("fp8_block", [64, 512], 384, 512)
    assert set(r.provenance) == {"transferred"}
    assert r.sources[0]["how"] in ("multilinear", "idw")


def test_attention_exact_and_generation_step_convention(db):
    c = db.context_attention([1, 4], [128, 256], heads=8, kv_heads=2, head_dim=32)
    np.testing.assert_allclose(c.ms, sp.ctx_ms(np.array([1, 4]), np.array([128, 256]), 8, 32), rtol=1e-12)
    g = db.generation_attention([1, 16], [8, 128], heads=8, kv_heads=2, head_dim=32)
    # a decode at KV length L reads the table at step L - 1 (tokens already cached)
    np.testing.assert_allclose(g.ms, sp.gen_ms(np.array([1, 16]), np.array([7, 127]), 2, 32), rtol=1e-12)
    assert list(g.provenance) == ["exact", "exact"]


def test_collective_exact(db):
    r = db.collective("all_reduce", [2.0**10, 2.0**20], 4)
    np.testing.assert_allclose(r.ms, sp.ar_ms(np.array([2.0**10, 2.0**20]), 4), rtol=1e-12)


def test_bad_input_is_typed(db):
    with pytest.raises(InvalidInputError):
        db.gemm("fp8_block", [0, 4], 256, 512)
    with pytest.raises(InvalidInputError):
        db.context_attention([float("nan")], [128], heads=8, kv_heads=2, head_dim=32)
    with pytest.raises(NotAvailableError):
        db.gemm("int8_wo", [4], 256, 512)
