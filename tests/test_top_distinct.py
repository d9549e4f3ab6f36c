"""The search's top deployments are distinct layouts, each at its best concurrency: the top table
(``search``'s ``top``) and the launch files (``top/<mode>-<rank>/``) never list one layout twice;
``results.csv`` keeps every candidate."""

from __future__ import annotations

import csv
import json

import synthpack as sp
from cli_helpers import run_cli

from infercast.search.pareto import ranked
from infercast.search.run import Candidate


def _cand(layout: str, conc: int, tps: float, ok: bool = True, backend: str = "") -> Candidate:
    return Candidate(layout, 1, 1, 1, 1, 1, 1, conc, 10.0, 1.0, None, None, 100.0, tps, 50.0, "memory", ok,
                     backend=backend)


def test_ranked_is_the_plain_sort_however_far_it_must_look():
    """ranked orders only as many candidates as it needs (the best few hundred, more when they
    hold fewer distinct deployments than asked): the same answer as sorting every candidate,
    with ties, many candidates of one layout ahead of the others, and a Candidates store."""
    import numpy as np

    from infercast.search.candidates import Candidates

    def plain(cands, top):
        out, seen = [], set()
        for c in sorted((c for c in cands if c.meets_targets), key=lambda c: -c.tokens_per_s_per_gpu):
            if (c.backend, c.layout) not in seen:
                seen.add((c.backend, c.layout))
                out.append(c)
                if len(out) == top:
                    break
        return out

    rng = np.random.default_rng(4)
    for trial in range(60):
        n = int(rng.integers(1, 3000))
        layouts = int(rng.integers(1, 40))
        tps = rng.integers(0, 50, n).astype(float) if trial % 2 else rng.uniform(0, 1000, n)
        lay = rng.integers(0, layouts, n)
        if trial % 3 == 0:  # one layout's many concurrencies ahead of every other
            tps[lay == 0] += 2000.0
        cands = [_cand(f"tp{int(x)}", j, float(t), ok=bool(rng.random() < 0.7)) for j, (x, t) in enumerate(zip(lay, tps))]
        for top in (1, 3, 10):
            want = [(c.layout, c.concurrency) for c in plain(cands, top)]
            assert [(c.layout, c.concurrency) for c in ranked(cands, top)] == want
            assert [(c.layout, c.concurrency) for c in ranked(Candidates(cands), top)] == want


def test_ranked_keeps_each_layout_once_at_its_best_concurrency():
    cands = [_cand("tp1", 1, 100.0), _cand("tp1", 8, 300.0), _cand("tp1", 16, 350.0, ok=False),
             _cand("tp2", 4, 250.0), _cand("tp2", 8, 280.0), _cand("tp4", 8, 120.0), _cand("tp1", 4, 200.0),
             _cand("tp2", 2, 280.0)]
    got = [(c.layout, c.concurrency) for c in ranked(cands, 3)]
    # tp1's best that meets the targets is c8 (c16 misses them); tp2 ties at 280: the earlier (c8) wins
    assert got == [("tp1", 8), ("tp2", 8), ("tp4", 8)]
    assert [(c.layout, c.concurrency) for c in ranked(cands, 2)] == [("tp1", 8), ("tp2", 8)]
    assert ranked([_cand("tp1", 1, 1.0, ok=False)], 3) == []


def test_ranked_tells_backends_apart():
    cands = [_cand("tp1", 1, 100.0, backend="trtllm"), _cand("tp1", 2, 90.0, backend="vllm"),
             _cand("tp1", 4, 95.0, backend="trtllm")]
    assert [(c.backend, c.concurrency) for c in ranked(cands, 3)] == [("trtllm", 1), ("vllm", 2)]


def test_search_top_table_and_launch_files_are_distinct_layouts(synth, tmp_path, capsys):
    out = tmp_path / "out"
    rc, stdout, err = run_cli(capsys, [
        "search", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm", "--isl", "128", "--osl", "8",
        "--concurrency", "16,32,48,64", "--max-gpus", "2", "--ttft-ms", "inf", "--tpot-ms", "inf", "--systems-path", str(synth.systems_dir),
        "--save-dir", str(out), "--json", "--all"])
    assert rc == 0, err
    d = json.loads(stdout)
    ok = sorted((c for c in d["candidates"] if c["meets_targets"]), key=lambda c: -c["tokens_per_s_per_gpu"])
    # the plain ranking's top 3 is one layout (tp1, twice the others' tokens/s per GPU) at three
    # concurrencies: what this test guards against
    assert len({c["layout"] for c in ok[:3]}) == 1
    layouts = [c["layout"] for c in d["top"]]
    assert sorted(layouts) == sorted({c["layout"] for c in ok}) == ["tp1", "tp1-pp2", "tp2"]
    for t in d["top"]:  # each at its best concurrency
        assert t["tokens_per_s_per_gpu"] == max(c["tokens_per_s_per_gpu"] for c in ok if c["layout"] == t["layout"])
    saved = []
    for rank in (1, 2, 3):
        meta = json.loads((out / "top" / f"agg-{rank}" / "deployment.json").read_text())
        (w,) = meta["workers"]
        saved.append((f"tp{w['tp']}" + (f"-pp{w['pp']}" if w["pp"] > 1 else ""), meta["concurrency"]))
    assert saved == [(t["layout"], t["concurrency"]) for t in d["top"][:3]]
    assert not (out / "top" / "agg-4").exists()
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == len(d["candidates"])  # every candidate, repeated layouts included
