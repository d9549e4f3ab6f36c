"""MLA module rows of a KV dtype collected at one head count: the other dtype's rows shifted.

A synthetic vLLM ``mla_generation_module`` table holds bf16-KV rows at heads 1-32 and fp8-KV rows
at heads=1 only (as vLLM 0.24.0's rows on one real system); heads up to 4 are within reach of the
heads=1 site (utilisation held, the existing transfer), beyond that the shift answers.
Latencies follow

    bf16(b, s, h) = A * b * (1 + s/64) * h^0.75
    fp8(b, s, h)  = bf16(b, s, h) - D * b * s/64     (the cache read saving: no head dependence)

which is exactly the assumption of ``ops.mla._resolve_kv_shift``, so the shifted fp8 answer at
heads 8 and 32 must equal the formula at every grid point; where the other dtype's rows fall with
heads, the answer is floored at fp8's own heads=1 latency.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from synthpack import make_pack

from infercast.data.database import PerfData
from infercast.errors import NotAvailableError
from infercast.interp.provenance import Prov
from infercast.ops.base import DatabaseMode, OpDB
from infercast.ops.mla import MODULE_STEP_OFFSET, resolve_mla

MODEL = "synth/tiny-mla"
DIMS = dict(hidden=1024, q_lora_rank=256, kv_lora_rank=128, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32)
HEADS = (1, 2, 4, 8, 16, 32)
BATCH = (1, 2, 4, 8, 16)
STEP = (2, 8, 32, 128, 512)
A, D = 1e-3, 4e-4
OFF = MODULE_STEP_OFFSET["vllm"]


def bf16_ms(b, s, h):
    return A * np.asarray(b, float) * (1 + np.asarray(s, float) / 64) * np.asarray(h, float) ** 0.75


def fp8_ms(b, s, h):
    return bf16_ms(b, s, h) - D * np.asarray(b, float) * np.asarray(s, float) / 64


def _write(path, fp8_heads=(1,), bf16=bf16_ms):
    rows = [("bfloat16", h, b, s, float(bf16(b, s, h))) for h in HEADS for b in BATCH for s in STEP]
    rows += [("fp8", h, b, s, float(fp8_ms(b, s, h))) for h in fp8_heads for b in BATCH for s in STEP]
    kv, h, b, s, lat = (list(c) for c in zip(*rows))
    n = len(rows)
    cols = {
        "framework": ["VLLM"] * n, "version": ["x"] * n, "device": ["Synth GPU"] * n,
        "op_name": ["mla_generation_module"] * n, "kernel_source": ["SYNTH_MLA"] * n, "model": [MODEL] * n,
        "architecture": ["SynthMLAForCausalLM"] * n, "mla_dtype": ["bfloat16"] * n, "kv_cache_dtype": kv,
        "gemm_type": ["bfloat16"] * n, "num_heads": h, "batch_size": b, "isl": [1] * n, "tp_size": [1] * n,
        "step": s, "latency": lat,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols), path)


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    p = make_pack(tmp_path_factory.mktemp("mla_kv_shift"))
    _write(p.data_dir / "mla" / "vllm" / "2.0" / "mla_generation_module_perf.parquet")
    return p


def _db(pack, mode=DatabaseMode.SILICON):
    return OpDB(PerfData.open("synth_gpu", "vllm", systems_path=pack.systems_dir), mode)


def _resolve(db, heads, kv="fp8"):
    return resolve_mla(db, "generation", heads=heads, gemm_quant="bfloat16", kv_quant=kv, model_id=MODEL, **DIMS)


def test_collected_head_count_is_exact(pack):
    r = _resolve(_db(pack), 1)
    assert r.how == "exact"
    assert _resolve(_db(pack), 4).how != "kv-shift"  # within the heads=1 site's reach


@pytest.mark.parametrize("heads", [8, 32])
def test_shift_reproduces_a_head_independent_saving(pack, heads):
    r = _resolve(_db(pack), heads)
    assert r.how == "kv-shift"
    assert any("fp8 - bfloat16 difference at heads=1" in n for n in r.notes)
    bb, ss = np.meshgrid(np.array(BATCH, float), np.array(STEP, float), indexing="ij")
    got, prov = r.grid(bb.ravel(), ss.ravel() - OFF)
    np.testing.assert_allclose(got, fp8_ms(bb.ravel(), ss.ravel(), heads), rtol=1e-12)
    assert (prov == Prov.TRANSFERRED).all()
    # and it is not simply the bf16 rows
    assert (got < bf16_ms(bb.ravel(), ss.ravel(), heads)).all()


def test_floor_at_the_dtypes_own_latency(tmp_path):
    """Rows where the other dtype gets faster with more heads (noise, a kernel switch) would make
    the shifted dtype faster at 32 heads than at 1: held at its own heads=1 latency instead."""
    p = make_pack(tmp_path / "p")

    def shrinking(b, s, h):  # bf16 latency falling with heads, steeply
        return bf16_ms(b, s, 1) * np.asarray(h, float) ** -0.5

    _write(p.data_dir / "mla" / "vllm" / "2.0" / "mla_generation_module_perf.parquet", bf16=shrinking)
    db = _db(p)
    b, s = np.array(BATCH, float), np.full(len(BATCH), 128.0 - OFF)
    own = fp8_ms(b, 128.0, 1)
    unfloored = shrinking(b, 128.0, 32) + own - shrinking(b, 128.0, 1)
    assert (unfloored < own).all()  # the case the floor is for
    got = _resolve(db, 32).grid(b, s)[0]
    np.testing.assert_allclose(got, own, rtol=1e-12)


def test_no_other_dtype_still_raises(tmp_path):
    p = make_pack(tmp_path / "q")
    path = p.data_dir / "mla" / "vllm" / "2.0" / "mla_generation_module_perf.parquet"
    _write(path)
    t = pq.read_table(path)
    pq.write_table(t.filter(pc.equal(t["kv_cache_dtype"], "fp8")), path)  # fp8 rows alone, heads=1
    with pytest.raises(NotAvailableError, match="no other kv_cache_dtype"):
        _resolve(_db(p), 32)
