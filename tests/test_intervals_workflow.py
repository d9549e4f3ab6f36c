"""Prediction intervals on the workflow commands: ``recommend`` (its options' figures and request
rates) and ``exp`` (served and searched rows, console and ``--save-dir``'s ``outcome.json``), by
hand on a made-up interval and end to end on the real pack, where a served row's ranges must be
``serve``'s / ``serve-disagg``'s for the same deployment."""

from __future__ import annotations

import json

import pytest
from cli_helpers import run_cli

from infercast.serving.intervals import Interval

BASE = ["--model", "Qwen/Qwen3-32B", "--system", "h200_sxm", "--backend", "vllm", "--isl", "1000", "--osl", "200"]
UNIT_FIELDS = ("ttft_ms", "tpot_ms", "request_latency_ms", "tokens_per_s_per_gpu", "tokens_per_s_per_user")


def test_inverse_turns_the_ratio_range_over():
    # a latency of 100 predicted, its 80% range 80-150: a rate of 10 (= 1000 / 100) ranges 1000/150 - 1000/80
    lat = Interval({0.80: (80.0, 150.0), 0.95: (50.0, 200.0)}, {"band": "c1-4"}, 42)
    rate = lat.inverse(10.0, 100.0)
    assert rate.ranges[0.80] == pytest.approx((1000 / 150, 1000 / 80))
    assert rate.ranges[0.95] == pytest.approx((5.0, 20.0))
    assert (rate.cell, rate.n) == ({"band": "c1-4"}, 42)


def _within(value: float, iv: dict) -> None:
    (lo80, hi80), (lo95, hi95) = iv["p80"], iv["p95"]
    assert 0 < lo95 <= lo80 <= value <= hi80 <= hi95, (value, iv)
    assert iv["n"] >= 40 and iv["cell"]


def test_recommend_options_carry_intervals_synthetic(synth):
    import synthpack as sp

    from infercast.search import search_agg
    from infercast.search.sizing import recommend_deployment

    res = search_agg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, max_gpus=2, ttft_max_ms=None, tpot_max_ms=None,
                     systems_path=synth.systems_dir)
    recs = recommend_deployment({"agg": res}, rate=20.0, top=3)
    assert recs
    for r in recs:
        iv = r.intervals
        assert set(iv) == {*UNIT_FIELDS, "requests_per_s_per_copy", "capacity_requests_per_s"}
        lat, of = iv["request_latency_ms"], r.unit["request_latency_ms"]
        for lv in ("p80", "p95"):
            # the rates' ranges are the request latency's turned over: rate x predicted / measured latency
            assert iv["capacity_requests_per_s"][lv] == pytest.approx(
                [r.capacity_requests_per_s * of / lat[lv][1], r.capacity_requests_per_s * of / lat[lv][0]], rel=1e-3)
            assert iv["requests_per_s_per_copy"][lv][0] * r.copies == pytest.approx(iv["capacity_requests_per_s"][lv][0],
                                                                                   rel=1e-3)
        assert iv["capacity_requests_per_s"]["cell"] == lat["cell"]


@pytest.mark.real_pack
def test_recommend_json_and_console_carry_intervals(capsys):
    args = ["recommend", *BASE, "--rate", "5", "--max-gpus", "2", "--mode", "agg", "--quiet", "--top", "3"]
    rc, out, err = run_cli(capsys, [*args, "--json"])
    assert rc == 0, err
    recs = json.loads(out)["recommendations"]
    assert len(recs) == 3
    for r in recs:
        for f in UNIT_FIELDS:
            _within(r["unit"][f], r["intervals"][f])
        for f in ("requests_per_s_per_copy", "capacity_requests_per_s"):
            _within(r[f], r["intervals"][f])
        assert r["intervals"]["ttft_ms"]["cell"].startswith("backend=vllm, mode=agg, band=")
    rc, out, err = run_cli(capsys, args)
    assert rc == 0, err
    assert "prediction intervals" in out and "req/s capacity" in out and "95%" in out


EXP = """\
defaults:
  model: Qwen/Qwen3-32B
  system: h200_sxm
  backend: vllm
  isl: 1000
  osl: 200
experiments:
  - name: served
    layout: {tp: 2}
    concurrency: [4, 32]
  - name: split
    disagg:
      prefill: {tp: 2}
      decode: {tp: 2}
      prefill_workers: 1
      decode_workers: 1
    concurrency: [16]
  - name: searched
    max_gpus: 2
    concurrency: [8, 32]
"""


@pytest.mark.real_pack
def test_exp_json_console_and_saved_outcomes_carry_intervals(capsys, tmp_path):
    f = tmp_path / "e.yaml"
    f.write_text(EXP)
    rc, out, err = run_cli(capsys, ["exp", str(f), "--json", "--quiet", "--save-dir", str(tmp_path / "out")])
    assert rc == 0, err
    res = {o["experiment"]: o for o in json.loads(out)["results"]}
    assert all(o["error"] is None for o in res.values()), res
    for o in res.values():
        for row in o["rows"]:
            for fld in UNIT_FIELDS:
                _within(row[fld], row["intervals"][fld])
    # a served row's ranges are serve's / serve-disagg's for the same deployment
    for row in res["served"]["rows"]:
        rc, sout, err = run_cli(capsys, ["serve", *BASE, "--tp", "2", "--concurrency", str(row["concurrency"]), "--json"])
        assert rc == 0, err
        assert row["intervals"] == json.loads(sout)["intervals"]
    rc, sout, err = run_cli(capsys, ["serve-disagg", *BASE, "--prefill-tp", "2", "--decode-tp", "2", "--prefill-workers", "1",
                                     "--decode-workers", "1", "--concurrency", "16", "--json"])
    assert rc == 0, err
    assert res["split"]["rows"][0]["intervals"] == json.loads(sout)["intervals"]
    # a searched row's are search's for its best candidate
    rc, sout, err = run_cli(capsys, ["search", *BASE, "--max-gpus", "2", "--concurrency", "8,32", "--json",
                                     "--ttft-ms", "inf", "--tpot-ms", "inf"])
    assert rc == 0, err
    best = json.loads(sout)["best"]
    assert res["searched"]["rows"][0]["layout"] == best["layout"]
    assert res["searched"]["rows"][0]["intervals"] == best["intervals"]
    saved = json.loads((tmp_path / "out" / "served" / "h200_sxm-vllm" / "outcome.json").read_text())
    assert saved["rows"][1]["intervals"] == res["served"]["rows"][1]["intervals"]
    rc, out, err = run_cli(capsys, ["exp", str(f), "--quiet"])
    assert rc == 0, err
    assert "TTFT 80%" in out and "tok/s/GPU 80%" in out
    lo, hi = res["served"]["rows"][1]["intervals"]["ttft_ms"]["p80"]
    assert f"{lo:.0f}-{hi:.0f}" in out
