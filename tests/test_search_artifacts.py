"""A search's saved files on the synthetic pack: the CSV / JSON hold every candidate, the
launch files state the recommended deployment's layout, the PNG is an image, and the HTML report
loads in a real headless browser (Chromium) and draws the plot."""

from __future__ import annotations

import csv
import json

import pytest
import synthpack as sp
from browser import needs_browser, rendered_dom

from infercast.report.artifacts import ranked, text_pareto, write_search_artifacts
from infercast.search import search_agg, search_disagg


@pytest.fixture(scope="module")
def saved(synth, tmp_path_factory):
    kw = {"systems_path": synth.systems_dir}
    agg = search_agg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, concurrencies=[1, 4, 16], **kw)
    dis = search_disagg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, concurrencies=[2, 8], max_gpus=4, **kw)
    out = tmp_path_factory.mktemp("save") / "run"
    (out.parent / "keep.txt").write_text("a user's file beside the directory")
    written = write_search_artifacts(out, {"agg": agg, "disagg": dis}, kw, top=2)
    return out, {"agg": agg, "disagg": dis}, written


def test_tables_hold_every_candidate(saved):
    out, results, written = saved
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == sum(len(r.candidates) for r in results.values())
    assert {r["mode"] for r in rows} == {"agg", "disagg"}
    pareto = list(csv.DictReader((out / "pareto.csv").open()))
    assert len(pareto) == sum(len(r.frontier) for r in results.values())
    doc = json.loads((out / "results.json").read_text())
    assert doc["agg"]["best"]["layout"] == results["agg"].candidates[results["agg"].best].layout
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # every candidate carries its prediction intervals: CSV columns per end, JSON objects
    for r in rows + pareto:
        for f in ("ttft_ms", "tpot_ms", "tokens_per_s_per_gpu", "tokens_per_s_per_user"):
            lo80, hi80 = float(r[f"{f}_p80_lo"]), float(r[f"{f}_p80_hi"])
            assert float(r[f"{f}_p95_lo"]) <= lo80 < hi80 <= float(r[f"{f}_p95_hi"])
    best = doc["agg"]["best"]["intervals"]
    assert set(best) >= {"ttft_ms", "tpot_ms", "tokens_per_s_per_gpu"} and best["ttft_ms"]["n"] >= 30
    assert (out.parent / "keep.txt").exists() and all(p.exists() for p in written)


def test_launch_files_state_the_top_deployments(saved):
    out, results, _ = saved
    for mode, res in results.items():
        top = ranked(res.candidates, 2)
        assert top, mode
        for rank, c in enumerate(top, start=1):
            meta = json.loads((out / "top" / f"{mode}-{rank}" / "deployment.json").read_text())
            assert meta["concurrency"] == c.concurrency and meta["gpus"] == c.gpus
            if mode == "agg":
                (w,) = meta["workers"]
                assert (w["tp"], w["pp"]) == (c.tp, c.pp)
            else:
                by_role = {w["role"]: w for w in meta["workers"]}
                assert by_role["prefill"]["workers"] == c.prefill_workers
                assert by_role["decode"]["workers"] == c.decode_workers


def test_text_pareto_draws_each_mode(saved):
    _, results, _ = saved
    text = text_pareto(results)
    assert "agg" in text and "disagg" in text and "tokens/s per GPU" in text


@needs_browser
def test_report_html_renders_in_headless_chromium(saved, tmp_path):
    out, results, _ = saved
    html = out / "report.html"
    assert "<script" in html.read_text()[:5_000_000]  # plotly.js is inlined: one self-contained file
    dom = rendered_dom(html, tmp_path / "profile")
    # plotly drew its SVG: one main-svg per figure layer, and a scatter trace per mode
    assert dom.count('class="main-svg"') >= 1
    assert dom.count('class="trace scatter') >= 2 * len(results)
    # the frontier's 80% prediction intervals: an error bar in x and in y per frontier point
    n_front = sum(len(r.frontier) for r in results.values())
    assert dom.count('class="yerror"') >= n_front and dom.count('class="xerror"') >= n_front
