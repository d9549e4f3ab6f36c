"""GQA attention shapes the tables lack, answered from what they hold: a sliding window they did
not collect (ops/window.py: generation read from the full-attention curve at ``min(step, window -
1)``, context scaled by the windowed roofline beyond the window, exact below it), and a KV-cache
dtype collected only in another dtype at that head size (ops/attention.py: the other dtype's rows
at their utilisation); on the synthetic pack, whose attention tables hold full attention only
(closed-form latencies in tests/synthpack.py)."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import synthpack as sp

from infercast.data.database import PerfData
from infercast.interp import sol
from infercast.interp.provenance import Prov
from infercast.ops.attention import resolve_context_attention, resolve_generation_attention
from infercast.ops.base import OpDB
from infercast.ops.window import window_collected

W = 64


@pytest.fixture(scope="module")
def db(synth):
    return OpDB(PerfData.open(sp.SYSTEM, "trtllm", sp.TRTLLM_CURRENT, synth.systems_dir))


def test_the_synthetic_tables_hold_full_attention_only(db):
    assert window_collected(db, "generation_attention", 32, 0)
    assert not window_collected(db, "generation_attention", 32, W)


def test_generation_reads_the_full_curve_at_the_window(db):
    r = resolve_generation_attention(db, 8, 2, 32, window=W)
    # a collected site (8 heads, 2 KV heads): below the window the full-attention cell itself
    v, p = r.grid(np.array([4.0]), np.array([31.0]), refuse=True)
    assert float(v[0]) == pytest.approx(float(sp.gen_ms(4, 31, 2, 32, "bfloat16")), rel=1e-9)
    assert int(p[0]) == Prov.EXACT
    # from the window on: the full-attention decode at step = window - 1, whatever the cache holds
    want = float(sp.gen_ms(4, W - 1, 2, 32, "bfloat16"))
    v, p = r.grid(np.array([4.0, 4.0, 4.0]), np.array([127.0, 4095.0, 1e6]), refuse=True)
    assert v.tolist() == pytest.approx([want] * 3, rel=1e-9)
    # on the grid transferred; beyond its last step the flat value is held
    assert p.tolist() == [int(Prov.TRANSFERRED), int(Prov.TRANSFERRED), int(Prov.HELD)]
    assert any("window 64 not collected" in n for n in r.notes)


def test_context_scales_by_the_windowed_roofline(db):
    r = resolve_context_attention(db, 8, 2, 32, window=W)
    v, p = r.grid(np.array([2.0]), np.array([32.0]), refuse=True)  # within the window: full attention
    assert float(v[0]) == pytest.approx(float(sp.ctx_ms(2, 32, 8, 32)), rel=1e-9)
    assert int(p[0]) == Prov.EXACT
    v, p = r.grid(np.array([2.0]), np.array([512.0]), refuse=True)
    s_w = float(sol.context_attention(db.system, 2, 512, 0.0, 8, 2, 32, 2.0, W)[0])
    s_0 = float(sol.context_attention(db.system, 2, 512, 0.0, 8, 2, 32, 2.0, 0)[0])
    assert s_w < s_0
    assert float(v[0]) == pytest.approx(float(sp.ctx_ms(2, 512, 8, 32)) * s_w / s_0, rel=1e-9)
    assert int(p[0]) == Prov.TRANSFERRED


def test_full_attention_is_unchanged(db):
    a = resolve_generation_attention(db, 8, 2, 32, window=0)
    assert a.grid(np.array([4.0]), np.array([127.0]))[0][0] == pytest.approx(float(sp.gen_ms(4, 127, 2, 32, "bfloat16")), rel=1e-9)
    assert not any("not collected" in n for n in a.notes)


# ------------------------------------------------------------------------------------------------
# a KV dtype collected only in the other dtype
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fp8_only_db(tmp_path_factory):
    pack = sp.make_pack(tmp_path_factory.mktemp("fp8kv"))
    for stem in ("generation_attention_perf", "context_attention_perf"):
        path = pack.data_dir / "attention" / "trtllm" / sp.TRTLLM_CURRENT / f"{stem}.parquet"
        t = pq.read_table(path)
        keep = np.asarray(t.column("kv_cache_dtype").to_pylist()) == "fp8"
        pq.write_table(t.filter(keep), path)
    return OpDB(PerfData.open(sp.SYSTEM, "trtllm", sp.TRTLLM_CURRENT, pack.systems_dir))


def test_bf16_kv_from_fp8_rows_at_their_utilisation(fp8_only_db):
    db = fp8_only_db
    r = resolve_generation_attention(db, 8, 2, 32, kv_quant="bfloat16")
    v, p = r.grid(np.array([4.0]), np.array([127.0]), refuse=True)
    s_bf16 = float(sol.generation_attention(db.system, 4, 128.0, 8, 2, 32, 2.0)[0])
    s_fp8 = float(sol.generation_attention(db.system, 4, 128.0, 8, 2, 32, 1.0)[0])
    assert s_bf16 > s_fp8
    assert float(v[0]) == pytest.approx(float(sp.gen_ms(4, 127, 2, 32, "fp8")) * s_bf16 / s_fp8, rel=1e-9)
    assert int(p[0]) == Prov.TRANSFERRED
    assert any("no kv=bfloat16 rows at head_dim=32" in n for n in r.notes)
    # the collected dtype is read as it is
    f = resolve_generation_attention(db, 8, 2, 32, kv_quant="fp8")
    assert f.grid(np.array([4.0]), np.array([127.0]))[0][0] == pytest.approx(float(sp.gen_ms(4, 127, 2, 32, "fp8")), rel=1e-9)
    c = resolve_context_attention(db, 8, 2, 32, kv_quant="bfloat16")
    assert int(c.grid(np.array([2.0]), np.array([256.0]))[1][0]) == Prov.TRANSFERRED
