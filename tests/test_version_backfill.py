"""A table a version holds but whose rows lack a shape is completed from older versions, op by op.

The synthetic pack's trtllm versions are 0.9 (GEMM at x1.5 the formula), 1.0 (current) and 1.1
(next, GEMM borrowed from 1.0 through reuse.yaml). Here 1.0's GEMM table loses its fp8_block rows
(a partial re-collection): the fp8 model's fp8 GEMMs must then be answered by 0.9's fp8_block
rows, exactly (formula x 1.5), with provenance naming 0.9 and why; its bf16 GEMM (the LM head)
still comes from 1.0; and never from 1.0's bf16 rows (another quant).
"""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from synthpack import SYSTEM, gemm_ms, make_pack

from infercast.api import Estimator
from infercast.errors import NotAvailableError

FP8_ID = "synth/tiny-llama-fp8"


def _drop_fp8_gemm(pack, version: str) -> None:
    f = pack.table_path("gemm", "trtllm", version, "gemm_perf")
    t = pq.read_table(f)
    pq.write_table(t.filter(pc.not_equal(t["gemm_dtype"], "fp8_block")), f)


@pytest.fixture(scope="module")
def partial(tmp_path_factory):
    p = make_pack(tmp_path_factory.mktemp("partialpack"))
    _drop_fp8_gemm(p, "1.0")
    return p


@pytest.fixture(scope="module")
def nowhere(tmp_path_factory):
    p = make_pack(tmp_path_factory.mktemp("nofp8pack"))
    _drop_fp8_gemm(p, "1.0")
    _drop_fp8_gemm(p, "0.9")
    return p


def _gemms(est):
    return [c for c in est.engine.ops if c.op.kind == "gemm"]


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_missing_quant_rows_come_from_the_older_version(partial, version):
    est = Estimator(FP8_ID, SYSTEM, "trtllm", version, systems_path=partial.systems_dir)
    fp8 = [c for c in _gemms(est) if c.op.params["quant"] == "fp8_block"]
    assert fp8, "the fp8 checkpoint has fp8 GEMMs"
    for c in fp8:
        r = c.resolved[0]
        assert r.version.startswith("0.9")
        assert any("answered by the older collected version 0.9" in n for n in r.notes), r.notes
        if r.how == "exact":  # a collected (n, k): 0.9's value, formula x 1.5, not a bf16 row
            n, k = int(c.op.params["n"]), int(c.op.params["k"])
            got = float(r.grid(np.array([64.0]), refuse=True)[0][0])
            assert got == pytest.approx(gemm_ms("fp8_block", 64, n, k) * 1.5, rel=1e-9)
            assert got != pytest.approx(gemm_ms("bfloat16", 64, n, k), rel=1e-3)
    assert any(c.resolved[0].how == "exact" for c in fp8)
    bf16 = [c for c in _gemms(est) if c.op.params["quant"] == "bfloat16"]
    for c in bf16:  # the version's own rows still answer what they hold
        assert not any("older collected version" in n for n in c.resolved[0].notes)
        assert not c.resolved[0].version.startswith("0.9")


def test_no_older_version_has_it_the_chosen_versions_error_stands(nowhere):
    with pytest.raises(NotAvailableError, match="no fp8_block GEMM data for trtllm"):
        Estimator(FP8_ID, SYSTEM, "trtllm", "1.0", systems_path=nowhere.systems_dir)


def test_hybrid_mode_does_not_backfill(partial):
    est = Estimator(FP8_ID, SYSTEM, "trtllm", "1.0", database_mode="HYBRID", systems_path=partial.systems_dir)
    for c in _gemms(est):
        assert not any("older collected version" in n for n in c.resolved[0].notes)


def test_a_complete_version_is_untouched(synth):
    est = Estimator(FP8_ID, SYSTEM, "trtllm", "1.0", systems_path=synth.systems_dir)
    for c in est.engine.ops:
        for r in c.resolved:
            assert not any("older collected version" in n for n in r.notes)
