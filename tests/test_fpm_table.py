"""Whole-forward (fpm) tables on synthetic rows with known answers: exact identity, multilinear
interpolation, the domain gate, transfer from the nearest layout through a roofline ratio, the
file forms, and a table built from observed iterations answering first in ForwardPassModel."""

from __future__ import annotations

import pytest

import synthpack as sp
from infercast import CorrectionOptions, Estimator, ForwardPassModel, RankLoad
from infercast.engine.fpm_table import FpmTable, cell_centre
from infercast.errors import DataFileError, InvalidInputError

BASE = {"model": "m", "system": "g", "backend": "b", "backend_version": "1", "tp": 2, "pp": 1, "attention_dp": 1,
        "moe_tp": 1, "moe_ep": 1}


def _rows(identity, scale=1.0):
    """decode time = scale * (1 + 0.5 * requests + 0.001 * kv tokens) on a 3 x 3 grid; prefill
    time = scale * (2 + 0.01 * tokens) at 4 points."""
    out = []
    for n in (1, 4, 16):
        for k in (1000, 4000, 16000):
            out.append({**identity, "kind": "decode", "decode_requests": n, "decode_kv_tokens": k,
                        "measured_ms": scale * (1 + 0.5 * n + 0.001 * k)})
    for t in (128, 512, 2048, 8192):
        out.append({**identity, "kind": "prefill", "prefill_tokens": t, "measured_ms": scale * (2 + 0.01 * t)})
    return out


@pytest.fixture()
def table():
    return FpmTable(_rows(BASE))


def test_exact_row(table):
    a = table.lookup(BASE, "decode", {"decode_requests": 4, "decode_kv_tokens": 4000})
    assert a.how == "exact" and a.ms == 1 + 2 + 4


def test_bilinear_between_rows_is_exact_for_linear_data(table):
    a = table.lookup(BASE, "decode", {"decode_requests": 10, "decode_kv_tokens": 7000})
    assert a.how == "interpolated" and a.ms == pytest.approx(1 + 5 + 7)
    p = table.lookup(BASE, "prefill", {"prefill_tokens": 1000})
    assert p.ms == pytest.approx(2 + 10)


def test_domain_gate_refuses_outside_the_measured_range(table):
    a = table.lookup(BASE, "decode", {"decode_requests": 32, "decode_kv_tokens": 4000})
    assert a.ms is None and "outside the measured" in a.reason
    assert table.lookup(BASE, "mixed", {"prefill_tokens": 10, "decode_kv_tokens": 10}).ms is None


def test_missing_corner_refuses():
    rows = [r for r in _rows(BASE) if not (r["kind"] == "decode" and r["decode_requests"] == 16 and r["decode_kv_tokens"] == 16000)]
    a = FpmTable(rows).lookup(BASE, "decode", {"decode_requests": 10, "decode_kv_tokens": 10000})
    assert a.ms is None and "missing" in a.reason


def test_transfer_through_the_roofline_ratio(table):
    target = {**BASE, "tp": 4}

    def roofline(identity, kind, point):  # a layout of twice the TP is twice as fast at the roofline
        return 8.0 / identity["tp"]

    a = table.lookup(target, "decode", {"decode_requests": 4, "decode_kv_tokens": 4000}, roofline)
    assert a.how == "transferred" and a.ms == pytest.approx(7.0 / 2.0) and a.donor[4] == 2
    assert table.lookup(target, "decode", {"decode_requests": 4, "decode_kv_tokens": 4000}).ms is None  # no roofline
    far = {**BASE, "tp": 8}  # two doublings: beyond the default gate of one
    g = table.lookup(far, "decode", {"decode_requests": 4, "decode_kv_tokens": 4000}, roofline)
    assert g.ms is None and "doublings" in g.reason
    other_model = {**BASE, "model": "x"}
    assert table.lookup(other_model, "decode", {"decode_requests": 4, "decode_kv_tokens": 4000}, roofline).ms is None


def test_nearest_layout_wins():
    t = FpmTable(_rows(BASE) + _rows({**BASE, "tp": 4, "moe_ep": 2}, scale=3.0))
    target = {**BASE, "tp": 4}  # 1 doubling from BASE, 1 from (tp 4, ep 2): tie -> sort order (ep 1 first)
    a = t.lookup(target, "prefill", {"prefill_tokens": 128}, lambda i, k, p: 1.0)
    assert a.donor[4:] == (2, 1, 1, 1, 1) and a.ms == pytest.approx(2 + 1.28)
    near = {**BASE, "tp": 4, "moe_ep": 4}  # 1 doubling from (4, ep 2), 3 from BASE
    b = t.lookup(near, "prefill", {"prefill_tokens": 128}, lambda i, k, p: 1.0)
    assert b.donor[8] == 2 and b.ms == pytest.approx(3 * (2 + 1.28))


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_file_round_trip(table, tmp_path, suffix):
    p = table.write(tmp_path / f"fpm{suffix}")
    back = FpmTable.read(p)
    assert back.rows() == table.rows()
    assert back.lookup(BASE, "decode", {"decode_requests": 10, "decode_kv_tokens": 7000}).ms == pytest.approx(13.0)


def test_bad_rows_and_files(tmp_path):
    with pytest.raises(InvalidInputError):
        FpmTable([{**BASE, "kind": "sideways", "measured_ms": 1.0}])
    with pytest.raises(InvalidInputError):
        FpmTable([{**BASE, "kind": "prefill", "prefill_tokens": 1, "measured_ms": -1.0}])
    (tmp_path / "x.arrow").write_bytes(b"not arrow")
    with pytest.raises(DataFileError):
        FpmTable.read(tmp_path / "x.arrow")


def test_model_answers_from_the_table_first_then_the_engine(synth):
    est = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)
    ident = est.identity()
    rows = _rows({k: ident[k] for k in BASE})
    m = ForwardPassModel.from_estimator(est).use_table(FpmTable(rows))
    hit = m.estimate(RankLoad(decode_requests=4, decode_kv_tokens=4000))
    assert hit.source == "fpm_table" and hit.ms == 7.0
    miss = m.estimate(RankLoad(decode_requests=64, decode_kv_tokens=64 * 100))  # outside the table: the engine
    assert miss.source == "engine" and miss.ms == pytest.approx(est.engine.decode_scalar(64, 100), rel=1e-3)


def test_export_observations_builds_a_table_the_model_answers_from(synth):
    est = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)
    reg = ForwardPassModel.regression(CorrectionOptions())
    ident = {k: v for k, v in est.identity().items() if k in BASE}
    # regression-only model (nothing carried): one cell per power of two, the median time
    for t, ms in [(100, 5.0), (110, 7.0), (120, 6.0), (300, 9.0)]:
        reg.observe(RankLoad(prefill_requests=1, prefill_tokens=t), ms)
    table = reg.export_observations(ident)
    rows = sorted(table.rows(), key=lambda r: r["prefill_tokens"])
    assert [r["prefill_tokens"] for r in rows] == [cell_centre(7), cell_centre(9)]
    assert [r["measured_ms"] for r in rows] == [6.0, 9.0]
    reg.use_table(table, ident)
    mid = (cell_centre(7) + cell_centre(9)) / 2
    got = reg.estimate(RankLoad(prefill_requests=1, prefill_tokens=mid))
    assert got.source == "fpm_table" and got.ms == pytest.approx(7.5)
    # engine-backed: a cell's times are carried to its centre by the engine's shape
    m = ForwardPassModel.from_estimator(est)
    for b in (5, 6, 7):
        m.observe(RankLoad(decode_requests=b, decode_kv_tokens=b * 250), 2.0 * m.engine_ms(RankLoad(decode_requests=b, decode_kv_tokens=b * 250))[0])
    (row,) = m.export_observations().rows()
    c = (cell_centre(3), cell_centre(11))
    assert row["decode_requests"] == c[0] and row["decode_kv_tokens"] == c[1]
    assert row["measured_ms"] == pytest.approx(2.0 * m.surface.decode_step_ms(c[0], c[1] / c[0]), rel=1e-9)


def test_sol_roofline_is_the_sol_mode_engine(synth):
    from infercast.engine.forward_pass import sol_roofline

    est = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)
    sol = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir, database_mode="SOL")
    r = sol_roofline(systems_path=synth.systems_dir)
    ident = est.identity()
    assert r(ident, "decode", {"decode_requests": 4, "decode_kv_tokens": 4000}) == sol.engine.decode_scalar(4.0, 1000.0)
    assert r(ident, "prefill", {"prefill_tokens": 1000}) == sol.engine.prefill_scalar(1.0, 1000.0, 0.0)
    tp2 = r({**ident, "tp": 2}, "prefill", {"prefill_tokens": 1000})  # another layout of a dense model
    sol2 = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", tp=2, systems_path=synth.systems_dir, database_mode="SOL")
    assert tp2 == sol2.engine.prefill_scalar(1.0, 1000.0, 0.0)
