"""MLA attention module (ops/mla.py): real-pack exactness and composition, synthetic exactness.

Real-pack tests (skipped without aiconfigurator-core) use DeepSeek-V3 dimensions and compare
against parquet rows read here with pyarrow, independently of infercast's table reader.
"""

from __future__ import annotations

import shutil
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from infercast.data.database import PerfData
from infercast.errors import InvalidInputError, NotAvailableError
from infercast.interp.provenance import Prov
from infercast.ops.base import DatabaseMode, OpDB
from infercast.ops.gemm import resolve_gemm
from infercast.ops.mla import MODULE_STEP_OFFSET, mla_kv_bytes_per_token, resolve_mla

from synthpack import make_pack

DSV3 = dict(hidden=7168, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)
DSV3_ID = "deepseek-ai/DeepSeek-V3"
#: DeepSeek-V2-Lite-like dims: no module-table model has them
LITE = dict(hidden=2048, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)


def _db(system, backend, mode=DatabaseMode.SILICON, systems_path=None):
    return OpDB(PerfData.open(system, backend, systems_path=systems_path), mode)


def _rows(path, curve, **eq):
    """{(num_heads, batch, curve value): latency} from a parquet file, filtered by ``eq``;
    duplicate keys (repeat runs) must agree with the reader's median, so collect them all."""
    t = pq.read_table(path)
    cols = {c: t.column(c).to_pylist() for c in t.column_names}
    out = defaultdict(list)
    for i in range(t.num_rows):
        if all(cols[c][i] == v for c, v in eq.items()):
            out[(cols["num_heads"][i], cols["batch_size"][i], cols[curve][i])].append(cols["latency"][i])
    return {k: float(np.median(v)) for k, v in out.items()}


# ------------------------------------------------------------------------------------------------
# real pack
# ------------------------------------------------------------------------------------------------


@pytest.mark.real_pack
@pytest.mark.parametrize("backend", ["trtllm", "vllm"])
@pytest.mark.parametrize("tp", [1, 8])
@pytest.mark.parametrize("phase", ["context", "generation"])
def test_module_tables_exact_h200(real_pack_available, backend, tp, phase):
    db = _db("h200_sxm", backend)
    heads = 128 // tp
    r = resolve_mla(db, phase, heads=heads, gemm_quant="fp8_block", kv_quant="bfloat16", model_id=DSV3_ID, **DSV3)
    stem = "mla_context_module" if phase == "context" else "mla_generation_module"
    assert r.source == stem and r.how == "exact"
    curve = "isl" if phase == "context" else "step"
    # vLLM 0.24.0's generation module on h200 is 1.6x TensorRT-LLM's while the two agree on b200:
    # TensorRT-LLM's table serves it (data.database, peer-backend consistency)
    origin = db.data.table_backend(stem)
    assert origin == ("trtllm" if (backend, phase) == ("vllm", "generation") else backend)
    rows = _rows(db.data.served[stem].path, curve, model=DSV3_ID, gemm_type="fp8_block", kv_cache_dtype="bfloat16", mla_dtype="bfloat16", num_heads=heads)
    assert len(rows) > 50
    keys = np.array(list(rows))
    want = np.array(list(rows.values()))
    x = keys[:, 2].astype(float)
    if phase == "generation":
        x = x - MODULE_STEP_OFFSET[origin]  # the caller's step = tokens already cached
    got, prov = r.grid(keys[:, 1].astype(float), x)
    np.testing.assert_array_equal(got, want)
    assert (prov == Prov.EXACT).all()


@pytest.mark.real_pack
def test_module_step_convention(real_pack_available):
    """vLLM's module step counts the decoded token, TRT-LLM's does not (AIC collectors)."""
    assert MODULE_STEP_OFFSET == {"trtllm": 0, "vllm": 1}
    r = resolve_mla(_db("b200_sxm", "vllm"), "generation", heads=16, gemm_quant="fp8_block", kv_quant="bfloat16", **DSV3)
    assert 1.0 in r.grid.axes[1] and 4095.0 in r.grid.axes[1]  # 2^k - 1, like the attention tables
    # a vLLM query served by TensorRT-LLM's table (h200, peer rule) takes TensorRT-LLM's convention
    r = resolve_mla(_db("h200_sxm", "vllm"), "generation", heads=16, gemm_quant="fp8_block", kv_quant="bfloat16", **DSV3)
    assert 2.0 in r.grid.axes[1] and 4096.0 in r.grid.axes[1]
    r = resolve_mla(_db("h200_sxm", "trtllm"), "generation", heads=16, gemm_quant="fp8_block", kv_quant="bfloat16", **DSV3)
    assert 2.0 in r.grid.axes[1] and 4096.0 in r.grid.axes[1]


@pytest.mark.real_pack
@pytest.mark.parametrize("backend", ["trtllm", "vllm"])
@pytest.mark.parametrize("phase", ["context", "generation"])
def test_b200_nvfp4_fp8_kv_exact(real_pack_available, backend, phase):
    db = _db("b200_sxm", backend)
    r = resolve_mla(db, phase, heads=16, gemm_quant="nvfp4", kv_quant="fp8", model_id=DSV3_ID, **DSV3)
    stem = "mla_context_module" if phase == "context" else "mla_generation_module"
    curve = "isl" if phase == "context" else "step"
    rows = _rows(db.data.locate(stem).path, curve, model=DSV3_ID, gemm_type="nvfp4", kv_cache_dtype="fp8", mla_dtype="bfloat16", num_heads=16)
    keys = np.array(list(rows))
    x = keys[:, 2].astype(float) - (MODULE_STEP_OFFSET[backend] if phase == "generation" else 0)
    got, prov = r.grid(keys[:, 1].astype(float), x)
    np.testing.assert_array_equal(got, np.array(list(rows.values())))
    assert (prov == Prov.EXACT).all()
    # fp8 KV: a different measurement from the bf16-KV rows
    r16 = resolve_mla(db, phase, heads=16, gemm_quant="nvfp4", kv_quant="bfloat16", model_id=DSV3_ID, **DSV3)
    assert not np.array_equal(r16.grid.values, r.grid.values)


@pytest.mark.real_pack
def test_b200_vllm_prefers_bf16_prefill_rows(real_pack_available):
    """b200 vLLM context has mla_dtype fp8 rows (opt-in FP8 prefill, TRTLLM_RAGGED) next to the
    default bf16 ones (FLASH_ATTN); the default is used."""
    r = resolve_mla(_db("b200_sxm", "vllm"), "context", heads=128, gemm_quant="fp8_block", kv_quant="fp8", **DSV3)
    assert "TRTLLM_RAGGED" not in (r.kernel or "") and "FLASH_ATTN" in r.kernel


@pytest.mark.real_pack
@pytest.mark.parametrize("phase", ["context", "generation"])
def test_sglang_kernel_path(real_pack_available, phase):
    db = _db("h200_sxm", "sglang")
    heads = 16
    r = resolve_mla(db, phase, heads=heads, gemm_quant="fp8_block", kv_quant="bfloat16", model_id=DSV3_ID, **DSV3)
    assert r.how == "summed" and r.source.startswith("context_mla" if phase == "context" else "generation_mla")
    assert any(n.startswith("summed:") for n in r.notes)
    v = r.grid.values
    assert np.all(np.isfinite(v)) and np.all(v > 0)
    # roughly monotone along both axes (raw kernel timings carry ~10% noise at tiny sizes)
    assert np.all(v[1:, :] >= 0.85 * v[:-1, :]) and np.all(v[:, 1:] >= 0.85 * v[:, :-1])
    assert v[-1, -1] > 20 * v[0, 0]
    # larger than the attention kernel alone, and exactly core + BMMs + GEMMs at collected cells
    stem = "context_mla" if phase == "context" else "generation_mla"
    curve = "isl" if phase == "context" else "step"
    core = _rows(db.data.locate(stem).path, curve, kv_cache_dtype="bfloat16", mla_dtype="bfloat16", num_heads=heads)
    keys = np.array(list(core))
    b, x = keys[:, 1].astype(float), keys[:, 2].astype(float)
    want_core = np.array(list(core.values()))
    got, _ = r.grid(b, x)
    assert np.all(got > want_core)
    m = b * x if phase == "context" else b
    extra = np.zeros_like(got)
    gemms = [(2112, 7168), (heads * 192, 1536), (7168, heads * 128)]
    if phase == "context":
        gemms.append((heads * 256, 512))
    for n, k in gemms:
        extra += resolve_gemm(db, "fp8_block", n, k).grid(m)[0]
    if phase == "generation":
        bmm_path = db.data.locate("mla_bmm").path
        for op in ("mla_gen_pre", "mla_gen_post"):
            t = pq.read_table(bmm_path).to_pylist()
            lat = {row["num_tokens"]: row["latency"] for row in t if row["op_name"] == op and row["bmm_dtype"] == "fp8" and row["num_heads"] == heads}
            extra += np.array([lat[int(bb)] for bb in b])
    np.testing.assert_allclose(got, want_core + extra, rtol=1e-9)


@pytest.mark.real_pack
def test_example_numbers_generation_tp8(real_pack_available):
    """DeepSeek-V3 decode MLA per layer, batch 64, KV length 4096 (step 4095), heads 128/8."""
    out = {}
    for backend in ("trtllm", "vllm", "sglang"):
        r = resolve_mla(_db("h200_sxm", backend), "generation", heads=16, gemm_quant="fp8_block", kv_quant="bfloat16", **DSV3)
        out[backend] = float(r.grid(64, 4095)[0])
    assert all(0.05 < v < 1.0 for v in out.values()), out


@pytest.mark.real_pack
@pytest.mark.parametrize("backend", ["trtllm", "vllm", "sglang"])
def test_uncollected_heads_transfer(real_pack_available, backend):
    db = _db("h200_sxm", backend)
    kw = dict(gemm_quant="fp8_block", kv_quant="bfloat16", **DSV3)
    r24 = resolve_mla(db, "generation", heads=24, **kw)
    r16 = resolve_mla(db, "generation", heads=16, **kw)
    r32 = resolve_mla(db, "generation", heads=32, **kw)
    b, s = np.array([1.0, 64.0, 256.0]), np.array([1023.0, 4095.0, 1023.0])
    v24, p24 = r24.grid(b, s)
    assert (p24 == Prov.TRANSFERRED).all()
    lo, hi = r16.grid(b, s)[0], r32.grid(b, s)[0]
    assert np.all(v24 >= 0.95 * lo) and np.all(v24 <= 1.05 * hi)
    assert r24.donors  # the donor sites are named


@pytest.mark.real_pack
def test_model_fallback_same_dims(real_pack_available):
    r = resolve_mla(_db("h200_sxm", "trtllm"), "generation", heads=8, gemm_quant="fp8_block", kv_quant="bfloat16", model_id="moonshotai/Kimi-K2.5", **DSV3)
    assert r.source == "mla_generation_module"
    assert any("deepseek-ai/DeepSeek-V3" in n and "Kimi-K2.5" in n for n in r.notes)


@pytest.mark.real_pack
def test_fp8_gemm_falls_to_kernel_path_or_substitute(real_pack_available):
    # trtllm has kernel tables: per-tensor fp8 GEMMs are composed from them
    r = resolve_mla(_db("h200_sxm", "trtllm"), "generation", heads=16, gemm_quant="fp8", kv_quant="bfloat16", **DSV3)
    assert r.how == "summed"
    # vllm has only module tables: fp8_block rows stand in, and the note says so
    r = resolve_mla(_db("h200_sxm", "vllm"), "generation", heads=16, gemm_quant="fp8", kv_quant="bfloat16", **DSV3)
    assert r.source == "mla_generation_module" and any("gemm_type=fp8_block" in n for n in r.notes)


@pytest.mark.real_pack
def test_missing_tables_silicon_raises_hybrid_empirical(real_pack_available):
    # vLLM has module tables for DeepSeek-V3 dims only and no kernel tables
    with pytest.raises(NotAvailableError) as ei:
        resolve_mla(_db("h200_sxm", "vllm"), "generation", heads=16, gemm_quant="bfloat16", kv_quant="bfloat16", **LITE)
    assert "generation_mla" in str(ei.value) and "mla_generation_module" in str(ei.value)
    r = resolve_mla(_db("h200_sxm", "vllm", DatabaseMode.HYBRID), "generation", heads=16, gemm_quant="bfloat16", kv_quant="bfloat16", **LITE)
    assert r.how == "empirical" and (r.grid.prov == Prov.EMPIRICAL).all()
    assert "learned" in r.notes[0]
    # the kernel path handles other dims (core transferred by SOL)
    r = resolve_mla(_db("h200_sxm", "sglang"), "generation", heads=16, gemm_quant="bfloat16", kv_quant="bfloat16", **LITE)
    assert r.how == "summed" and (r.grid.prov >= Prov.TRANSFERRED).all()


@pytest.mark.real_pack
def test_sol_mode_and_hopper_fp4(real_pack_available):
    r = resolve_mla(_db("h200_sxm", "trtllm", DatabaseMode.SOL), "context", heads=16, gemm_quant="fp8_block", kv_quant="fp8", **DSV3)
    assert r.how == "sol" and (r.grid.prov == Prov.SOL).all()
    meas = resolve_mla(_db("h200_sxm", "trtllm"), "context", heads=16, gemm_quant="fp8_block", kv_quant="fp8", **DSV3)
    assert np.all(meas.grid(r.grid.axes[0][:, None], r.grid.axes[1][None, :])[0] > r.grid.values)  # SOL is a lower bound
    with pytest.raises(Exception, match="fp4"):
        resolve_mla(_db("h200_sxm", "trtllm"), "generation", heads=16, gemm_quant="nvfp4", kv_quant="fp8", **DSV3)


# ------------------------------------------------------------------------------------------------
# no pack needed
# ------------------------------------------------------------------------------------------------


def test_kv_bytes_per_token():
    assert mla_kv_bytes_per_token(512, 64, "bfloat16") == 1152.0
    assert mla_kv_bytes_per_token(512, 64, "fp8") == 576.0
    with pytest.raises(InvalidInputError):
        mla_kv_bytes_per_token(512, 64, "int3")


# synthetic module tables, shaped like the grid's interpolation spaces (batch and cached length
# linear, prefill length a power law) so that interpolation between grid points is exact:
#   context    A * batch * isl^1.5 * heads^0.75
#   generation A * batch * (1 + step/64) * heads^0.75
SYN_MODEL = "synth/tiny-mla"
SYN_DIMS = dict(hidden=1024, q_lora_rank=256, kv_lora_rank=128, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32)
SYN_HEADS = (2, 4, 8)
SYN_BATCH = (1, 2, 4, 8, 16)
SYN_ISL = (16, 64, 256, 1024)
SYN_STEP = (2, 8, 32, 128, 512)


def _syn_ms(batch, x, heads, gemm_type, phase):
    a = 1e-3 if gemm_type == "bfloat16" else 6e-4
    x = np.asarray(x, float)
    f = x**1.5 if phase == "context" else 1.0 + x / 64.0
    return a * np.asarray(batch, float) * f * np.asarray(heads, float) ** 0.75


def _write_module_table(path, phase, backend):
    rows = []
    for gt in ("bfloat16", "fp8_block"):
        for h in SYN_HEADS:
            for b in SYN_BATCH:
                for x in (SYN_ISL if phase == "context" else SYN_STEP):
                    if phase == "context" and b * x > 8192:
                        continue  # a truncated corner, as in the real tables
                    rows.append((gt, h, b, x))
    n = len(rows)
    gt, h, b, x = (list(c) for c in zip(*rows))
    lat = [float(_syn_ms(bb, xx, hh, g, phase)) for g, hh, bb, xx in rows]
    cols = {
        "framework": ["TRTLLM" if backend == "trtllm" else "VLLM"] * n,
        "version": ["x"] * n,
        "device": ["Synth GPU"] * n,
        "op_name": [f"mla_{phase}_module"] * n,
        "kernel_source": ["default" if backend == "trtllm" else "SYNTH_MLA"] * n,
        "model": [SYN_MODEL] * n,
        "architecture": ["SynthMLAForCausalLM"] * n,
        "mla_dtype": ["bfloat16"] * n,
        "kv_cache_dtype": ["bfloat16"] * n,
        "gemm_type": gt,
        "num_heads": h,
        "batch_size": b,
        "isl": x if phase == "context" else [1] * n,
        "tp_size": [1] * n,
        "step": [0] * n if phase == "context" else x,
        "latency": lat,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols), path)


@pytest.fixture(scope="module")
def mla_synth(tmp_path_factory):
    pack = make_pack(tmp_path_factory.mktemp("mla_synth"))
    for backend, version in (("trtllm", "1.0"), ("vllm", "2.0")):
        for phase in ("context", "generation"):
            _write_module_table(pack.data_dir / "mla" / backend / version / f"mla_{phase}_module_perf.parquet", phase, backend)
    yield pack
    shutil.rmtree(pack.root, ignore_errors=True)


@pytest.mark.parametrize("backend", ["trtllm", "vllm"])
@pytest.mark.parametrize("phase", ["context", "generation"])
@pytest.mark.parametrize("gemm", ["bfloat16", "fp8_block"])
def test_synthetic_exact_and_interpolated(mla_synth, backend, phase, gemm):
    db = _db("synth_gpu", backend, systems_path=mla_synth.systems_dir)
    off = MODULE_STEP_OFFSET[backend] if phase == "generation" else 0
    xs = SYN_ISL if phase == "context" else SYN_STEP
    for h in SYN_HEADS:
        r = resolve_mla(db, phase, heads=h, gemm_quant=gemm, kv_quant="bfloat16", model_id=SYN_MODEL, **SYN_DIMS)
        assert r.how == "exact"
        bb, xx = np.meshgrid(np.array(SYN_BATCH, float), np.array(xs, float), indexing="ij")
        keep = ~((bb * xx > 8192) & (phase == "context"))
        got, prov = r.grid(bb[keep], xx[keep] - off)
        np.testing.assert_array_equal(got, _syn_ms(bb[keep], xx[keep], h, gemm, phase))
        assert (prov == Prov.EXACT).all()
        # between grid points: exact up to rounding, provenance interpolated
        bq, xq = np.array([3.0, 6.0, 1.5]), np.array([xs[1] * 1.7, xs[2] * 1.3, xs[0] * 3.0])
        got, prov = r.grid(bq, xq - off)
        np.testing.assert_allclose(got, _syn_ms(bq, xq, h, gemm, phase), rtol=1e-9)
        assert (prov == Prov.INTERPOLATED).all()
    # an uncollected head count: transferred from its neighbours, bracketed by them
    r = resolve_mla(db, phase, heads=6, gemm_quant=gemm, kv_quant="bfloat16", model_id=SYN_MODEL, **SYN_DIMS)
    v, p = r.grid(np.array([2.0]), np.array([xs[1] - off], float))
    assert (p == Prov.TRANSFERRED).all() and r.how == "multilinear"
    lo, hi = _syn_ms(2, xs[1], 4, gemm, phase), _syn_ms(2, xs[1], 8, gemm, phase)
    assert lo < v[0] < hi


def test_synthetic_truncated_corner_is_held(mla_synth):
    db = _db("synth_gpu", "trtllm", systems_path=mla_synth.systems_dir)
    r = resolve_mla(db, "context", heads=4, gemm_quant="bfloat16", kv_quant="bfloat16", model_id=SYN_MODEL, **SYN_DIMS)
    v, p = r.grid(16.0, 1024.0)  # batch*isl = 16384 > 8192: not collected
    assert p == Prov.HELD and v > r.grid(8.0, 1024.0)[0]


def test_synthetic_missing_tables(mla_synth):
    """Model/dims not in the module table and no kernel tables: SILICON raises with the tables
    looked for; HYBRID answers empirically (utilisation learned from no matching rows -> default)."""
    kw = dict(heads=4, gemm_quant="bfloat16", kv_quant="bfloat16", **LITE)
    db = _db("synth_gpu", "trtllm", systems_path=mla_synth.systems_dir)
    with pytest.raises(NotAvailableError, match="context_mla"):
        resolve_mla(db, "context", **kw)
    with pytest.raises(NotAvailableError, match="fp8"):
        resolve_mla(db, "generation", heads=4, gemm_quant="bfloat16", kv_quant="fp8", model_id=SYN_MODEL, **SYN_DIMS)
    r = resolve_mla(_db("synth_gpu", "trtllm", DatabaseMode.HYBRID, mla_synth.systems_dir), "generation", **kw)
    assert r.how == "empirical" and np.all(r.grid.values > 0)


def test_synthetic_pack_without_mla(synth):
    with pytest.raises(NotAvailableError):
        resolve_mla(_db("synth_gpu", "trtllm", systems_path=synth.systems_dir), "generation", model_id=SYN_MODEL, heads=4, gemm_quant="bfloat16", kv_quant="bfloat16", **SYN_DIMS)
    r = resolve_mla(_db("synth_gpu", "trtllm", DatabaseMode.HYBRID, synth.systems_dir), "generation", heads=4, gemm_quant="bfloat16", kv_quant="bfloat16", **SYN_DIMS)
    assert r.how == "empirical" and "default utilisation" in r.notes[0]


def test_bad_input(synth):
    db = _db("synth_gpu", "trtllm", systems_path=synth.systems_dir)
    with pytest.raises(InvalidInputError):
        resolve_mla(db, "decode", heads=4, gemm_quant="bfloat16", kv_quant="bfloat16", **SYN_DIMS)
    with pytest.raises(InvalidInputError):
        resolve_mla(db, "context", heads=0, gemm_quant="bfloat16", kv_quant="bfloat16", **SYN_DIMS)
    with pytest.raises(InvalidInputError):
        resolve_mla(db, "context", heads=4, gemm_quant="int3", kv_quant="bfloat16", **SYN_DIMS)
