"""Prediction intervals (:mod:`infercast.serving.intervals`): quantiles and coverage on synthetic
residuals of known distributions, the cell fallback, the table loader's typed errors, and the
intervals attached to estimate / serve / serve-disagg / search output on the real pack."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from cli_helpers import run_cli

from infercast.errors import DataFileError
from infercast.serving.intervals import (
    HIERARCHY,
    LEVELS,
    METRICS,
    MODELS,
    IntervalTable,
    _check_table,
    _quantile_pair,
    band_of,
    condition,
    default_intervals,
    flat_intervals,
    load_intervals,
    quantile_cells,
    serving_intervals,
)

Z = {0.80: 1.2815515655446004, 0.95: 1.959963984540054}


def _conds(n, **cell):
    return [dict(cell) for _ in range(n)]


# ---- quantiles and coverage on synthetic residuals ------------------------------------------


def test_quantile_pair_is_the_conformal_rank():
    # n = 19, level 0.8: rank ceil(20 x 0.9) = 18 from each end -> the 2nd and 18th smallest
    v = np.arange(1.0, 20.0)
    assert _quantile_pair(np.random.default_rng(0).permutation(v), 0.80) == (2.0, 18.0)
    # level 0.95: rank ceil(20 x 0.975) = 20 > n: the extremes
    assert _quantile_pair(v, 0.95) == (1.0, 19.0)


def test_normal_residuals_recover_their_quantiles_and_cover_new_draws():
    rng = np.random.default_rng(1)
    spec = {"trtllm": (0.10, 0.30), "vllm": (-0.20, 0.60)}
    r, conds = [], []
    for backend, (mu, sd) in spec.items():
        r.append(rng.normal(mu, sd, 20_000))
        conds += _conds(20_000, backend=backend, mode="agg", band="c1-4", tables="measured")
    cells = quantile_cells(np.concatenate(r), conds, min_rows=40)
    table = IntervalTable({"serving": {m: cells for m in METRICS}, "static": {m: cells for m in METRICS}})
    for backend, (mu, sd) in spec.items():
        entry = cells[f"backend={backend}|mode=agg|band=c1-4|tables=measured"]
        assert entry["n"] == 20_000
        for lv in LEVELS:
            lo, hi = entry[f"p{round(100 * lv)}"]
            assert lo == pytest.approx(mu - Z[lv] * sd, abs=0.02)
            assert hi == pytest.approx(mu + Z[lv] * sd, abs=0.02)
        # coverage of fresh draws: predicted 1.0, measured exp(residual)
        fresh = np.exp(rng.normal(mu, sd, 20_000))
        cond = {"backend": backend, "mode": "agg", "band": "c1-4", "tables": "measured"}
        iv = table.interval("serving", "ttft", 1.0, cond)
        for lv in LEVELS:
            lo, hi = iv.ranges[lv]
            assert np.mean((fresh >= lo) & (fresh <= hi)) == pytest.approx(lv, abs=0.01)
    # the pooled cell mixes both backends: its 95% range is wider than either's 80%
    assert cells["all"]["n"] == 40_000


def test_small_cells_fall_back_to_coarser_ones():
    rng = np.random.default_rng(2)
    r = np.concatenate([rng.normal(0, 0.1, 100), rng.normal(1.0, 0.1, 10)])
    conds = (_conds(100, backend="vllm", mode="agg", band="c1-4", tables="measured")
             + _conds(10, backend="vllm", mode="agg", band="c5-32", tables="measured"))
    cells = quantile_cells(r, conds, min_rows=40)
    assert "backend=vllm|mode=agg|band=c5-32|tables=measured" not in cells  # 10 rows < 40
    assert "backend=vllm|mode=agg|band=c1-4|tables=measured" in cells
    table = IntervalTable({k: {m: cells for m in METRICS} for k in MODELS})
    small = {"backend": "vllm", "mode": "agg", "band": "c5-32", "tables": "measured"}
    entry, used = table.lookup("serving", "ttft", small)
    # the band is kept to the end: with 10 rows in c5-32, the cell of 'tables' alone
    assert used == {"tables": "measured"} and entry["n"] == 110
    # an unknown backend with a known band: the band's cells without the backend
    known = {"backend": "sglang", "mode": "agg", "band": "c1-4", "tables": "measured"}
    assert table.lookup("serving", "tpot", known)[1] == {"mode": "agg", "band": "c1-4", "tables": "measured"}
    # a condition without 'tables' (a search candidate) takes the cells without it
    no_tables = {"backend": "vllm", "mode": "agg", "band": "c1-4"}
    assert table.lookup("serving", "tpot", no_tables)[1] == no_tables
    assert table.lookup("serving", "tpot", {"backend": "sglang", "mode": "disagg", "band": "c5-32"})[1] == {}
    assert HIERARCHY[-1] == ()


def test_throughput_ranges_invert_the_latency_range():
    cells = {"all": {"n": 50, "p80": [-0.1, 0.2], "p95": [-0.3, 0.4]}}
    table = IntervalTable({k: {m: cells for m in METRICS} for k in MODELS})

    class Result:
        ttft_ms, tpot_ms, request_latency_ms = 100.0, 10.0, 1000.0
        tokens_per_s_per_gpu, tokens_per_s_per_user = 500.0, 100.0

    iv = serving_intervals(table, Result(), backend="trtllm", mode="agg", concurrency=8, osl=100, share=0.0)
    assert iv["ttft_ms"].ranges[0.80] == pytest.approx((100 * math.exp(-0.1), 100 * math.exp(0.2)))
    assert iv["tokens_per_s_per_gpu"].ranges[0.95] == pytest.approx((500 * math.exp(-0.4), 500 * math.exp(0.3)))
    assert iv["tokens_per_s_per_user"].ranges[0.80] == pytest.approx((100 * math.exp(-0.2), 100 * math.exp(0.1)))
    flat = flat_intervals(iv)
    assert flat["ttft_ms_p80_lo"] == pytest.approx(100 * math.exp(-0.1), rel=1e-3)
    # a one-token output has no TPOT: no TPOT ranges
    one = serving_intervals(table, Result(), backend="trtllm", mode="agg", concurrency=8, osl=1, share=0.0)
    assert "tpot_ms" not in one and "tokens_per_s_per_user" not in one


def test_condition_bands():
    assert [band_of(c) for c in (1, 4, 5, 32, 33, 128, 129, 10_000)] == [
        "c1-4", "c1-4", "c5-32", "c5-32", "c33-128", "c33-128", "c129+", "c129+"]
    assert condition("vllm", "disagg", 64, 0.5)["tables"] == "extrapolated"
    assert condition("vllm", "disagg", 64, 0.0)["tables"] == "measured"
    assert "tables" not in condition("vllm", "disagg", 64, None)


# ---- the data file ---------------------------------------------------------------------------


def _doc():
    entry = {"n": 50, "p80": [-0.1, 0.2], "p95": [-0.3, 0.4]}
    return {"format_version": 1, "models": {k: {"cells": {m: {"all": dict(entry)} for m in METRICS}} for k in MODELS}}


def test_loader_reads_a_good_file(tmp_path):
    p = tmp_path / "iv.json"
    p.write_text(json.dumps(_doc()))
    t = load_intervals(p)
    assert t.lookup("static", "latency", {"backend": "x"})[0]["n"] == 50


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.update(format_version=99), "format_version 99"),
    (lambda d: d.pop("models"), "'models'"),
    (lambda d: d["models"]["serving"]["cells"].pop("tpot"), "exactly ttft, tpot, latency"),
    (lambda d: d["models"]["static"]["cells"]["ttft"].pop("all"), "no pooled 'all' cell"),
    (lambda d: d["models"]["serving"]["cells"]["ttft"]["all"].update(p80=[0.3, 0.1]), "p80 is not a [low, high]"),
    (lambda d: d["models"]["serving"]["cells"]["ttft"]["all"].update(p95=[0.1, float("nan")]), "p95 is not"),
    (lambda d: d["models"]["serving"]["cells"]["ttft"]["all"].update(n=0), "row count"),
])
def test_loader_refuses_a_malformed_table(tmp_path, mutate, needle):
    d = _doc()
    mutate(d)
    p = tmp_path / "iv.json"
    p.write_text(json.dumps(d))
    with pytest.raises(DataFileError, match="prediction-interval table") as exc:
        load_intervals(p)
    assert needle in str(exc.value)


def test_loader_refuses_missing_and_unparsable_files(tmp_path):
    with pytest.raises(DataFileError, match="cannot read"):
        load_intervals(tmp_path / "absent.json")
    p = tmp_path / "bad.json"
    p.write_text("{not json")
    with pytest.raises(DataFileError, match="is not JSON"):
        load_intervals(p)
    with pytest.raises(DataFileError, match="not a JSON object"):
        _check_table([1, 2], "x")


def test_shipped_table_holds_every_model_and_metric():
    t = default_intervals()
    for model in MODELS:
        for m in METRICS:
            entry, used = t.lookup(model, m, {})
            assert used == {} and entry["n"] >= 100
            assert entry["p95"][0] <= entry["p80"][0] <= entry["p80"][1] <= entry["p95"][1]
    assert "dev_ids" in t.meta["source"] or "tuning split" in t.meta["source"]


# ---- attached to the commands' output (real pack) ----------------------------------------------

BASE = ["--model", "Qwen/Qwen3-32B", "--system", "h200_sxm", "--backend", "vllm", "--isl", "1000", "--osl", "200"]


def _check_ranges(d: dict, fields=("ttft_ms", "tpot_ms", "tokens_per_s_per_gpu", "tokens_per_s_per_user")):
    iv = d["intervals"]
    for f in fields:
        (lo80, hi80), (lo95, hi95) = iv[f]["p80"], iv[f]["p95"]
        assert 0 < lo95 <= lo80 < hi80 <= hi95, (f, iv[f])
        assert iv[f]["n"] >= 40 and iv[f]["cell"]
        # the range is the prediction scaled by the cell's log-ratio quantiles: the ratios of its
        # ends to the prediction are the same for every figure of one metric
        assert lo80 / d[f] < hi80 / d[f]
    return iv


@pytest.mark.real_pack
def test_serve_json_and_console_carry_intervals(capsys):
    rc, out, err = run_cli(capsys, ["serve", *BASE, "--tp", "2", "--concurrency", "16", "--json"])
    assert rc == 0, err
    d = json.loads(out)
    iv = _check_ranges(d, ("ttft_ms", "tpot_ms", "request_latency_ms", "tokens_per_s_per_gpu", "tokens_per_s_per_user"))
    assert iv["ttft_ms"]["cell"].startswith("backend=vllm, mode=agg, band=c5-32")
    entry, _ = default_intervals().lookup("serving", "ttft", dict(kv.split("=") for kv in iv["ttft_ms"]["cell"].split(", ")))
    assert iv["ttft_ms"]["p80"][1] == pytest.approx(d["ttft_ms"] * math.exp(entry["p80"][1]), rel=1e-3)
    # throughput per GPU: the request latency's range inverted
    lat = iv["request_latency_ms"]["p80"]
    tput = iv["tokens_per_s_per_gpu"]["p80"]
    assert tput[0] / d["tokens_per_s_per_gpu"] == pytest.approx(d["request_latency_ms"] / lat[1], rel=1e-3)
    rc, out, err = run_cli(capsys, ["serve", *BASE, "--tp", "2", "--concurrency", "16"])
    assert rc == 0 and "prediction intervals" in out and "80%" in out and "95%" in out


@pytest.mark.real_pack
def test_estimate_and_disagg_json_carry_intervals(capsys):
    rc, out, err = run_cli(capsys, ["estimate", *BASE, "--tp", "2", "--batch", "8", "--json"])
    assert rc == 0, err
    d = json.loads(out)
    _check_ranges(d)
    rc, out, err = run_cli(capsys, ["estimate", *BASE, "--tp", "2", "--batch", "8"])
    assert rc == 0 and "prediction intervals" in out
    rc, out, err = run_cli(capsys, ["serve-disagg", *BASE, "--prefill-tp", "2", "--decode-tp", "2", "--prefill-workers", "1",
                                    "--decode-workers", "1", "--concurrency", "32", "--json"])
    assert rc == 0, err
    d = json.loads(out)
    iv = _check_ranges(d)
    cell = dict(kv.split("=") for kv in iv["ttft_ms"]["cell"].split(", "))
    assert cell.get("backend", "vllm") == "vllm" and cell.get("mode", "disagg") == "disagg" and cell["band"] == "c5-32"


@pytest.mark.real_pack
def test_search_json_carries_intervals(capsys):
    rc, out, err = run_cli(capsys, ["search", *BASE, "--max-gpus", "2", "--concurrency", "8,32", "--json",
                                    "--ttft-ms", "inf", "--tpot-ms", "inf"])
    assert rc == 0, err
    d = json.loads(out)
    _check_ranges(d["best"])
    assert all("intervals" in c for c in d["frontier"] + d["top"])
    assert "tables=" not in d["best"]["intervals"]["ttft_ms"]["cell"]  # the search does not compute the share


# ---- the extrapolated share and the build script (synthetic) -----------------------------------


def test_extrapolated_share_grows_beyond_the_tables(synth):
    import synthpack as sp

    from infercast.api import Estimator
    from infercast.interp.provenance import Prov
    from infercast.serving.intervals import (
        EXTRAPOLATED_CODES,
        extrapolated_share,
        provenance_shares,
    )

    est = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)
    inside = provenance_shares(est.engine, ctx_batch=1.0, ctx_isl=256.0)
    assert inside.sum() == pytest.approx(1.0) and len(inside) == len(Prov)
    # a prompt 4x the longest collected context length: attention and the token-wise ops held
    beyond = provenance_shares(est.engine, ctx_batch=1.0, ctx_isl=4.0 * max(sp.CTX_ISL))
    idx = [int(c) for c in EXTRAPOLATED_CODES]
    assert beyond[idx].sum() > inside[idx].sum()
    share = extrapolated_share(est.engine, est.engine, isl=4 * max(sp.CTX_ISL), osl=1, decode_batch=1)
    assert share == pytest.approx(beyond[idx].sum())


def test_build_table_dedupes_and_takes_the_request_latency():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import build_intervals as bi

    def rec(i, meas_ttft, pred_ttft, meas_tpot, pred_tpot, conc=8):
        return {"id": f"r{i}", "model": "m", "system": "s", "backend": "vllm", "mode": "agg", "concurrency": conc,
                "isl": 100, "osl": 11, "gpus": 1, "measured_ttft_ms": meas_ttft, "measured_tpot_ms": meas_tpot,
                "ttft_ms": pred_ttft, "tpot_ms": pred_tpot, "shares": None}

    recs = [rec(i, 100.0 + i, 100.0, 10.0, 10.0 * (1 + i / 100)) for i in range(40)]
    recs.append(dict(recs[0], id="copy"))  # the same measurement exported twice counts once
    assert len(bi.dedupe(recs)) == 40
    res, conds = bi.residuals(bi.dedupe(recs))
    i = 7
    assert res["ttft"][i] == pytest.approx(math.log(107.0 / 100.0))
    assert res["latency"][i] == pytest.approx(math.log((107.0 + 10 * 10.0) / (100.0 + 10 * 10.0 * 1.07)))
    assert conds[i] == {"backend": "vllm", "mode": "agg", "band": "c5-32"}
    doc = bi.build_table({"serving": recs, "static": recs}, min_rows=30)
    t = _check_table(doc, "<built>")
    entry, used = t.lookup("serving", "ttft", conds[0])
    assert used == conds[0] and entry["n"] == 40
    # 80%: rank ceil(41 x 0.9) = 37 of 40 from each end: the 4th and 37th smallest ratio
    assert entry["p80"] == pytest.approx([math.log(103.0 / 100.0), math.log(136.0 / 100.0)])


# ---- a broken table reaches the user as one line -----------------------------------------------


@pytest.mark.parametrize("command", [["serve", "--concurrency", "4"], ["estimate", "--batch", "4"]])
def test_cli_reports_a_broken_table_in_one_line(synth, capsys, monkeypatch, tmp_path, command):
    import synthpack as sp
    from cli_helpers import assert_one_line_error

    import infercast.serving.intervals as iv

    bad = tmp_path / "intervals.json"
    bad.write_text(json.dumps({"format_version": 1, "models": {}}))
    monkeypatch.setattr(iv, "default_intervals", lambda: load_intervals(bad))
    argv = [command[0], "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm",
            "--systems-path", str(synth.systems_dir), "--isl", "128", "--osl", "8", *command[1:]]
    rc, out, err = run_cli(capsys, argv)
    assert_one_line_error(rc, out, err, "prediction-interval table", "rebuild it with scripts/build_intervals.py")


def test_flat_columns_from_the_json_form_are_the_same():
    from infercast.serving.intervals import Interval, flat_from_dict, flat_intervals, intervals_dict

    ivs = {"ttft_ms": Interval({0.8: (101.23456, 230.98765), 0.95: (88.888888, 412.34567)}, {"backend": "vllm"}, 42),
           "tpot_ms": Interval({0.95: (1e-7, 3.3333333), 0.8: (2.0000004, 2.9999996)}, {}, 7)}
    assert flat_from_dict(intervals_dict(ivs)) == flat_intervals(ivs)
    assert list(flat_from_dict(intervals_dict(ivs))) == list(flat_intervals(ivs))  # the same column order
