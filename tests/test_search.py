"""Deployment search: the layout space, the Pareto frontier and recommendation (hand-computed),
an end-to-end search on the synthetic pack, and the command line."""

from __future__ import annotations

import json

import numpy as np
import pytest

import synthpack as sp
from infercast.cli.main import main
from infercast.errors import InvalidInputError
from infercast.search import Layout, layouts, meets, pareto_front, recommend, search_agg


def test_pareto_front_by_hand():
    # (per_user, per_gpu): c is dominated by b, e by d; a duplicate of b is kept once
    pts = {"a": (10, 100), "b": (20, 80), "c": (15, 70), "d": (40, 50), "e": (30, 40), "b2": (20, 80), "f": (5, 100)}
    names = list(pts)
    front = pareto_front([pts[n][0] for n in names], [pts[n][1] for n in names])
    assert [names[i] for i in front] == ["a", "b", "d"]  # by per_user ascending; f is dominated by a
    assert pareto_front([], []).tolist() == []
    with pytest.raises(ValueError):
        pareto_front([1, 2], [1])


def test_pareto_front_and_recommend_match_their_definitions():
    """On random points with ties (and a NaN now and then): the frontier is every point no other
    beats on both axes and that equals no earlier point on both; the recommendation is the
    lowest (-per GPU, GPUs, TTFT, index) among the points that meet the targets."""
    rng = np.random.default_rng(5)
    for trial in range(400):
        n = int(rng.integers(1, 40))
        u, g = rng.integers(0, 6, n).astype(float), rng.integers(0, 6, n).astype(float)
        front = pareto_front(u, g).tolist()
        want = [i for i in range(n)
                if not any((u[j] >= u[i] and g[j] >= g[i] and (u[j] > u[i] or g[j] > g[i])) or (j < i and u[j] == u[i] and g[j] == g[i])
                           for j in range(n))]
        assert sorted(front) == want and front == sorted(want, key=lambda i: (u[i], -g[i]))
        ok = rng.random(n) < 0.5
        gpus, ttft = rng.integers(1, 4, n), rng.integers(0, 3, n).astype(float)
        cands = [i for i in range(n) if ok[i]]
        best = min(cands, key=lambda i: (-g[i], gpus[i], ttft[i], i)) if cands else None
        assert recommend(g.tolist(), gpus.tolist(), ttft.tolist(), ok.tolist()) == best
    g = np.array([3.0, np.nan, 5.0, 1.0])  # a NaN is never on the frontier nor a best so far
    assert pareto_front([4.0, 3.0, 2.0, 1.0], g).tolist() == [2, 0]


def test_pareto_front_with_gpus_matches_its_definition():
    """On random points with ties, NaNs on either axis and GPU counts: the frontier is the points
    that, ordered by (per_user descending, per_gpu descending, GPUs, index), have more per_gpu
    than every point before them (what the pre-filter of the search's tens of thousands of points
    must not change)."""
    rng = np.random.default_rng(9)
    for trial in range(2000):
        m = int(rng.integers(1, 60))
        u, g, n = (rng.integers(0, 6, m).astype(float) for _ in range(3))
        if trial % 7 == 0:
            g[rng.integers(0, m)] = np.nan
        if trial % 11 == 0:
            u[rng.integers(0, m)] = np.nan
        order = np.lexsort((np.arange(m), n, -g, -u))
        gs = g[order]
        keep = order[gs > np.fmax.accumulate(np.concatenate(([-np.inf], gs[:-1])))].tolist()
        assert pareto_front(u, g, n).tolist() == sorted(keep, key=lambda i: (u[i], -g[i]))


def test_pareto_front_and_recommend_ignore_rounding_between_scaled_copies():
    """A deployment and its scaled copy (twice the workers at twice the clients) have the same
    metrics up to rounding: which one stands for them (on the frontier, as the recommendation) is
    the one with fewer GPUs, whichever way the rounding falls and in whichever order they come."""
    u, g = 37.123456789012, 912.34567890123
    for du, dg in ((1, 1), (-1, 1), (1, -1), (-1, -1), (0, 0)):
        u2, g2 = u, g
        for _ in range(abs(du)):
            u2 = np.nextafter(u2, np.inf if du > 0 else -np.inf)
        for _ in range(abs(dg)):
            g2 = np.nextafter(g2, np.inf if dg > 0 else -np.inf)
        for order in ((0, 1), (1, 0)):
            pts = [((u, g), 8), ((u2, g2), 4)]
            pts = [pts[i] for i in order]
            front = pareto_front([p[0][0] for p in pts], [p[0][1] for p in pts], [p[1] for p in pts]).tolist()
            assert [pts[i][1] for i in front] == [4]
            best = recommend([p[0][1] for p in pts], [p[1] for p in pts], [500.0, 500.0 * (1 + 1e-15)], [True, True])
            assert pts[best][1] == 4
    # points a little more apart than rounding are different points
    assert pareto_front([1.0, 1.0 + 1e-6], [5.0, 5.0], [4, 8]).tolist() == [1]
    with pytest.raises(ValueError):
        pareto_front([1.0, 2.0], [1.0, 2.0], [1])


def test_meets_and_recommend_by_hand():
    assert meets(100, 10, 200, 20) and meets(100, 10, None, None)
    assert not meets(300, 10, 200, None) and not meets(100, 30, None, 20) and not meets(None, 10, 200, None)
    per_gpu, gpus, ttft = [500, 900, 900, 900, 1000], [2, 4, 2, 2, 8], [50, 40, 60, 30, 10]
    ok = [True, True, True, True, False]
    # 1000 misses the targets; among the 900s fewer GPUs win, then the lower TTFT
    assert recommend(per_gpu, gpus, ttft, ok) == 3
    assert recommend(per_gpu, gpus, ttft, [False] * 5) is None


def test_layout_space_dense_and_moe(synth, real_pack_available):
    from infercast.api import Estimator

    dense = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir).spec  # 8 heads, 2 KV heads, 2 layers
    ok, skipped = layouts(dense, 8, 8)
    assert [lay.label for lay in ok] == ["tp1", "tp1-pp2", "tp2", "tp2-pp2", "tp4", "tp4-pp2", "tp8"]
    assert set(skipped) == {"tp1-pp4", "tp1-pp8", "tp2-pp4"} and "exceeds the 2 layers" in skipped["tp1-pp4"]
    assert all(lay.gpus <= 8 for lay in ok)
    assert [lay.label for lay in layouts(dense, 16, 8)[0] if lay.gpus == 16] == ["tp8-pp2"]  # TP stays in a node
    moe = Estimator("deepseek-ai/DeepSeek-V3", "h200_sxm", "trtllm", tp=8).spec
    labels = [lay.label for lay in layouts(moe, 8, 8)[0]]
    for want in ("tp8", "tp8-ep8", "tp1-dp8-ep8", "tp4-pp2", "tp1-dp2-ep2"):
        assert want in labels
    assert Layout(tp=1, attention_dp=8, moe_tp=1, moe_ep=8).gpus == 8
    # tensor parallelism stays within the NVLink domain: a node, or the rack of an NVL72 system
    assert "tp16" not in [lay.label for lay in layouts(moe, 16, 8)[0]]
    assert {"tp16", "tp16-ep16", "tp1-dp16-ep16"} <= {lay.label for lay in layouts(moe, 16, 72)[0]}
    from infercast.data.pack import find_pack
    from infercast.data.system import load_system

    assert load_system(find_pack(), "gb200").node.nvlink_gpus == 72
    assert load_system(find_pack(), "h200_sxm").node.nvlink_gpus == 8
    with pytest.raises(InvalidInputError):
        layouts(dense, 0, 8)


def test_search_on_the_synthetic_pack(synth):
    conc = [1, 4, 16]
    r = search_agg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, systems_path=synth.systems_dir, concurrencies=conc)
    assert {c.layout for c in r.candidates} == {"tp1", "tp1-pp2", "tp2", "tp2-pp2", "tp4", "tp4-pp2", "tp8"}
    assert len(r.candidates) == 7 * len(conc) and all(c.meets_targets for c in r.candidates)
    u = np.array([c.tokens_per_s_per_user for c in r.candidates])
    g = np.array([c.tokens_per_s_per_gpu for c in r.candidates])
    for i in r.frontier:  # nothing beats a frontier point on both
        assert not np.any((u >= u[i]) & (g >= g[i]) & ((u > u[i]) | (g > g[i])))
    for j in set(range(len(u))) - set(r.frontier):  # everything else is beaten (or ties) by a frontier point
        assert any(u[i] >= u[j] and g[i] >= g[j] for i in r.frontier)
    assert r.best == int(np.argmax(g)) or g[r.best] == g.max()
    # a TPOT target between the fastest and slowest candidates leaves only those under it
    tight = float(np.median([c.tpot_ms for c in r.candidates]))
    r2 = search_agg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, systems_path=synth.systems_dir, concurrencies=conc, tpot_max_ms=tight)
    assert all(c.meets_targets == (c.tpot_ms <= tight) for c in r2.candidates)
    assert r2.candidates[r2.best].tpot_ms <= tight
    r3 = search_agg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, systems_path=synth.systems_dir, concurrencies=conc, ttft_max_ms=1e-6)
    assert r3.best is None and r3.to_dict()["best"] is None
    with pytest.raises(InvalidInputError, match="tpot target must be a positive number"):
        search_agg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, systems_path=synth.systems_dir, tpot_max_ms=-1)


def test_search_stops_each_layout_at_its_saturation(synth):
    """With ``cap_concurrency`` (the command line's setting) and the default grid, a layout's
    concurrencies (in an aggregated search, and in a fixed-GPU search's aggregated part) stop at
    the first whose steady state is held by a cap of the engine: the points
    after it are left out and counted as refused; each of them is saturated too (the run without
    the stop shows it), their throughput creeping towards the plateau by a few percent at most while
    the TTFT grows with every client."""
    from infercast.search.run import SATURATED
    from infercast.serving.agg import SATURATED_BOUNDS

    kw = dict(systems_path=synth.systems_dir, max_gpus=4, refine=False)
    r = search_agg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 8192, 64, cap_concurrency=True, **kw)
    full = search_agg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 8192, 64, concurrencies=r.concurrencies, **kw)
    dropped = 0
    for lay in {c.layout for c in full.candidates}:
        got = [c for c in r.candidates if c.layout == lay]
        every = [c for c in full.candidates if c.layout == lay]
        assert [c.bound in SATURATED_BOUNDS for c in got] == [False] * (len(got) - 1) + [True]
        assert every[:len(got)] == got  # the same numbers up to the stop
        assert all(c.bound in SATURATED_BOUNDS for c in every[len(got):])
        assert all(c.tokens_per_s_per_gpu <= got[-1].tokens_per_s_per_gpu * 1.05 for c in every[len(got):])
        assert all(c.ttft_ms > 2 * got[-1].ttft_ms for c in every[len(got):])
        dropped += len(every) - len(got)
    assert dropped > 0 and r.refused[f"agg candidate: {SATURATED}"] == dropped
    # the aggregated layouts of a fixed-GPU search stop the same way
    from infercast.search.fixed import search_fixed

    kw = dict(systems_path=synth.systems_dir, gpus=4, refine=False)
    r = search_fixed(sp.MODEL_ID, sp.SYSTEM, "trtllm", 8192, 64, cap_concurrency=True, **kw)
    full = search_fixed(sp.MODEL_ID, sp.SYSTEM, "trtllm", 8192, 64, concurrencies=r.concurrencies, **kw)
    agg = [c for c in r.candidates if not getattr(c, "prefill_layout", "")]
    agg_full = [c for c in full.candidates if not getattr(c, "prefill_layout", "")]
    dropped = 0
    for lay in {c.layout for c in agg_full}:
        got, every = [c for c in agg if c.layout == lay], [c for c in agg_full if c.layout == lay]
        assert [c.bound in SATURATED_BOUNDS for c in got] == [False] * (len(got) - 1) + [True] and every[:len(got)] == got
        dropped += len(every) - len(got)
    assert dropped > 0 and r.refused[f"agg candidate: {SATURATED}"] == dropped


@pytest.mark.parametrize("kw,needle", [
    ({"concurrencies": "1,4"}, "concurrencies must be a list of positive integers: got '1,4'"),
    ({"concurrencies": 8}, "concurrencies must be a list of positive integers: got 8"),
    ({"concurrencies": []}, "concurrencies is empty"),
    ({"concurrencies": [1, None]}, "concurrency must be a positive integer, got None"),
    ({"concurrencies": [1.5]}, "concurrency must be a positive integer, got 1.5"),
    ({"max_gpus": 2.5}, "max_gpus must be a positive integer, got 2.5"),
    ({"isl": None}, "isl must be a positive integer, got None"),
    ({"osl": None}, "osl must be a positive integer, got None"),
])
def test_search_api_bad_arguments(synth, kw, needle):
    """Search arguments are refused with a typed error rather than truncated (2.5 GPUs searched as
    2, 1.5 clients as 1), iterated character by character ("1,4") or failing with a TypeError."""
    kw = dict(kw)
    lengths = {"isl": kw.pop("isl", 128), "osl": kw.pop("osl", 8)}
    with pytest.raises(InvalidInputError) as ei:
        search_agg(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir, **lengths, **kw)
    assert needle in str(ei.value)
    # integral floats are integers
    r = search_agg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128.0, 8, systems_path=synth.systems_dir, max_gpus=2.0, concurrencies=[4.0, 1])
    assert sorted({c.concurrency for c in r.candidates}) == [1, 4]


def _search_argv(synth, *extra):
    return ["search", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm", "--systems-path",
            str(synth.systems_dir), "--isl", "128", "--osl", "8", "--concurrency", "1,4", *extra]


def test_search_cli(synth, capsys):
    assert main(_search_argv(synth, "--json", "--top", "3")) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"frontier", "best", "top", "skipped"} <= set(d) and "candidates" not in d and len(d["top"]) == 3
    assert d["top"][0]["tokens_per_s_per_gpu"] == d["best"]["tokens_per_s_per_gpu"]
    assert main(_search_argv(synth, "--json", "--all")) == 0
    assert len(json.loads(capsys.readouterr().out)["candidates"]) == 14
    assert main(_search_argv(synth, "--tpot-ms", "1e-9")) == 0
    assert "no recommendation: none of the 14 deployments evaluated meets the targets" in capsys.readouterr().out


@pytest.mark.parametrize("extra,needle", [
    (("--max-gpus", "0"), "max_gpus must be a positive number"),
    (("--ttft-ms", "-5"), "--ttft-ms must be a positive number of milliseconds, or inf for no target; got -5"),
    (("--concurrency", "1,x"), "--concurrency must be comma-separated integers"),
    (("--top", "0"), "--top must be >= 1"),
])
def test_search_cli_bad_input(synth, capsys, extra, needle):
    rc = main(_search_argv(synth, *extra))  # a repeated --concurrency: argparse keeps the last
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("infercast: error: ") and needle in err and "Traceback" not in err


def test_disagg_search_on_the_synthetic_pack(synth):
    from infercast.search import DisaggCandidate, search_disagg

    r = search_disagg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, systems_path=synth.systems_dir, concurrencies=[2, 8],
                      max_gpus=4, max_workers=3)
    assert r.candidates and all(isinstance(c, DisaggCandidate) for c in r.candidates)
    for c in r.candidates:  # worker counts and layouts add up to the GPUs, within the budget
        g = {"tp1": 1, "tp2": 2, "tp4": 4}
        assert c.gpus == c.prefill_workers * g[c.prefill_layout] + c.decode_workers * g[c.decode_layout] <= 4
        assert 1 <= c.prefill_workers <= 3 and 1 <= c.decode_workers <= 3
        assert c.layout == f"P{c.prefill_workers}x{c.prefill_layout} D{c.decode_workers}x{c.decode_layout}"
    combos = {(c.prefill_layout, c.prefill_workers, c.decode_layout, c.decode_workers) for c in r.candidates}
    assert ("tp1", 2, "tp2", 1) in combos and ("tp2", 1, "tp2", 1) in combos and ("tp4", 1, "tp1", 1) not in combos
    assert r.best is not None and r.candidates[r.best].tokens_per_s_per_gpu == max(c.tokens_per_s_per_gpu for c in r.candidates)


def test_disagg_decode_batch_held_at_the_scheduler_cap(synth):
    """Before: a disaggregated deployment whose decode ranks would each run more requests than the
    decode scheduler's max_batch_size was refused (the model did not queue the rest). Now the decode
    batch is held at the cap and the others wait for a decode slot: the search keeps such
    deployments, each equal to serve-disagg's answer, with the wait in TPOT."""
    from infercast.api import Estimator, serve_disagg
    from infercast.search import search_disagg
    from infercast.serving.backends import scheduler_params
    from dataclasses import replace

    roles = {"prefill": {}, "decode": {"max_batch_size": 4}}
    r = search_disagg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 64, systems_path=synth.systems_dir, concurrencies=[2, 256],
                      max_gpus=2, max_workers=1, scheduler_roles=roles)
    assert not any("max running requests" in why for why in r.refused)
    capped = [c for c in r.candidates if c.concurrency == 256]
    assert capped
    e = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)
    p = scheduler_params("trtllm", e.data.system, e.spec)
    for c in capped:
        one = serve_disagg(e, e, concurrency=256, isl=128, osl=64, prefill_workers=1, decode_workers=1,
                           params_prefill=p, params_decode=replace(p, max_batch_size=4))
        assert c.tpot_ms == pytest.approx(one.tpot_ms, rel=1e-9) and c.ttft_ms == pytest.approx(one.ttft_ms, rel=1e-9)
        free = serve_disagg(e, e, concurrency=256, isl=128, osl=64, prefill_workers=1, decode_workers=1)
        assert one.decode_batch == pytest.approx(4.0) and free.decode_batch > 4.0
        assert one.decode_slot_wait_ms > 0 and one.tpot_ms > free.tpot_ms
        assert any("max_batch_size 4" in n for n in one.notes)


def test_slot_wait_closes_the_cycle():
    """The decode pool at its cap completes cap / busy requests per ms and rank: a client's cycle
    (TTFT + transfer + slot wait + decoding) is c_rank x busy / cap; below the cap no wait."""
    from infercast.serving.disagg import slot_wait_ms

    assert slot_wait_ms(64.0, 100.0, 4.0, 30.0, 5.0) == pytest.approx(64 * 100 / 4 - (30 + 100 + 5))
    assert slot_wait_ms(2.0, 100.0, 4.0, 30.0, 5.0) == 0.0
    import numpy as np

    assert np.allclose(slot_wait_ms(np.array([64.0, 2.0]), 100.0, 4.0, np.array([30.0, 30.0]), 5.0), [1465.0, 0.0])


def test_search_cli_both_modes(synth, capsys):
    assert main(_search_argv(synth, "--json", "--mode", "both", "--max-gpus", "4")) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["agg"]["mode"] == "agg" and d["disagg"]["mode"] == "disagg"
    assert d["best_mode"] in ("agg", "disagg")
    best = d[d["best_mode"]]["best"]["tokens_per_s_per_gpu"]
    assert best == max(d[m]["best"]["tokens_per_s_per_gpu"] for m in ("agg", "disagg"))
    assert main(_search_argv(synth, "--mode", "both", "--max-gpus", "4")) == 0
    assert "best overall:" in capsys.readouterr().out


def test_fixed_gpu_search_on_the_synthetic_pack(synth):
    """Every deployment of exactly 6 GPUs at 5 clients: 6 x tp1 and 3 x tp2 replicas (tp4 and tp8 do
    not divide 6; the pipeline layouts of 2 GPUs do), and every prefill/decode split that adds up.
    A replica count's latencies are one replica's at ceil(5 / replicas) clients."""
    from infercast.api import Estimator, serve_agg_replica
    from infercast.search import DisaggCandidate, search_fixed

    r = search_fixed(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, gpus=6, concurrencies=[5], systems_path=synth.systems_dir)
    assert r.max_gpus == 6 and all(c.gpus == 6 and c.concurrency == 5 for c in r.candidates)
    agg = {c.layout: c for c in r.candidates if not isinstance(c, DisaggCandidate)}
    assert set(agg) == {"6xtp1", "3xtp2", "3xtp1-pp2"}
    g = {"tp1": 1, "tp2": 2, "tp4": 4}
    splits = {(c.prefill_layout, c.prefill_workers, c.decode_layout, c.decode_workers)
              for c in r.candidates if isinstance(c, DisaggCandidate)}
    want = {(pl, pw, dl, (6 - pw * g[pl]) // g[dl]) for pl in g for dl in g for pw in range(1, 6)
            if 6 - pw * g[pl] >= g[dl] and (6 - pw * g[pl]) % g[dl] == 0}
    assert splits == want and ("tp4", 1, "tp2", 1) in splits and ("tp2", 1, "tp4", 1) in splits
    est = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", tp=2, systems_path=synth.systems_dir)
    one, _ = serve_agg_replica(est, 2, 128, 8)  # 3 replicas, 5 clients: the busiest holds 2
    assert agg["3xtp2"].ttft_ms == one.ttft_ms and agg["3xtp2"].tpot_ms == one.tpot_ms
    assert agg["3xtp2"].tokens_per_s_per_gpu == pytest.approx(one.tokens_per_s_per_gpu * 5 / 6)
    assert r.candidates[r.best].tokens_per_s_per_gpu == max(c.tokens_per_s_per_gpu for c in r.candidates)
    one_gpu = search_fixed(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, gpus=1, concurrencies=[5], systems_path=synth.systems_dir)
    assert [c.layout for c in one_gpu.candidates] == ["tp1"]  # one GPU cannot split into two pools
    with pytest.raises(InvalidInputError, match="gpus must be a positive number"):
        search_fixed(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, gpus=0, concurrencies=[5], systems_path=synth.systems_dir)


def test_search_cli_fixed_gpus(synth, capsys):
    assert main(_search_argv(synth, "--gpus", "6", "--json", "--all")) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["mode"] == "fixed" and d["max_gpus"] == 6 and d["best"] is not None
    assert d["candidates"] and all(c["gpus"] == 6 for c in d["candidates"]) and {1, 4} == {c["concurrency"] for c in d["candidates"]}
    assert main(_search_argv(synth, "--gpus", "6")) == 0
    assert "exactly 6 GPUs" in capsys.readouterr().out


@pytest.mark.parametrize("extra,needle", [
    (("--mode", "fixed"), "--mode fixed needs --gpus N"),
    (("--gpus", "6", "--mode", "disagg"), "--gpus fixes the GPU count, which --mode disagg does not"),
    (("--gpus", "6", "--max-gpus", "8"), "--mode fixed uses exactly --gpus GPUs"),
    (("--gpus", "0"), "gpus must be a positive number"),
])
def test_search_cli_fixed_gpus_bad_input(synth, capsys, extra, needle):
    rc = main(_search_argv(synth, *extra))
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("infercast: error: ") and needle in err and "Traceback" not in err


def test_serve_agg_replica_memo_answers_what_a_fresh_run_does(real_pack_available):
    """With attention DP, replica concurrencies that put as many clients on the busiest rank share
    one kept serving run: each answer equals a fresh one, and changing an answer leaves the kept
    run alone."""
    from infercast.api import Estimator, serve_agg_replica

    est = Estimator("Qwen/Qwen3-235B-A22B-FP8", "h200_sxm", "trtllm", tp=1, attention_dp=4, moe_ep=4)
    memo: dict = {}
    for c in (5, 6, 8, 5, 9):
        fresh, per_rank = serve_agg_replica(est, c, 1000, 100)
        kept, kept_rank = serve_agg_replica(est, c, 1000, 100, memo=memo)
        assert kept_rank == per_rank
        assert kept.to_dict() == fresh.to_dict()
        kept.tokens_per_s_per_gpu = -1.0
        kept.notes.append("changed by the caller")
        kept.ttft_parts["wait"] = -1.0
    assert sorted(memo) == [2, 3]


#: modules a warm ``search`` of a dense model does not need: importing them would only lengthen
#: its start-up (numpy.ma: np.median's first call; the rest: what only writing a cache, warning,
#: saving artifacts, reading an engine's configuration or an intervals table through
#: importlib.resources, or an MoE model needs)
SEARCH_NEEDS_NOT = ("numpy.ma", "yaml", "logging", "tempfile", "importlib.resources", "csv", "infercast.report.launch",
                    "infercast.report.artifacts", "infercast.serving.engine_args", "infercast.ops.moe",
                    "multiprocessing", "concurrent.futures", "pandas", "pyarrow")


def test_a_warm_search_imports_only_what_it_needs(synth, tmp_path):
    """A search whose tables and compiled ops are cached (the second run) imports none of
    :data:`SEARCH_NEEDS_NOT`: each is start-up time a search would pay for nothing."""
    import os
    import subprocess
    import sys

    # (what the interpreter's start-up imported, a site hook's modules, is not the command's doing)
    code = ("import sys, atexit; watch = set(sys.argv[1].split(',')) - set(sys.modules); atexit.register(lambda: "
            "print(' '.join(sorted(m for m in watch if m in sys.modules)), file=sys.stderr)); "
            "sys.argv = ['infercast', *sys.argv[2:]]; from infercast.cli.main import run; run()")
    argv = [sys.executable, "-c", code, ",".join(SEARCH_NEEDS_NOT), *_search_argv(synth, "--json", "--mode", "both")]
    env = {**os.environ, "INFERCAST_CACHE_DIR": str(tmp_path / "cache")}
    first = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    assert "yaml" in first.stderr.split()  # (the first run parses the pack's YAML: the check sees imports)
    second = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    assert second.stderr.split() == []
    assert json.loads(second.stdout) == json.loads(first.stdout)


def test_estimators_share_perf_data_and_model_config_within_a_search(synth, monkeypatch):
    """Inside ``sharing_data`` (a search's ``sharing_estimators``) estimators of different layouts
    open the system's perf data and resolve the model once; outside, each does; the numbers are
    the same."""
    import infercast.api as api
    from infercast.search.run import sharing_estimators

    opened, resolved = [], []
    real_open, real_resolve = api.PerfData.open, api.resolve_model
    monkeypatch.setattr(api.PerfData, "open", lambda *a, **k: opened.append(1) or real_open(*a, **k))
    monkeypatch.setattr(api, "resolve_model", lambda *a: resolved.append(1) or real_resolve(*a))

    def two():
        return [api.Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", tp=tp, systems_path=synth.systems_dir) for tp in (1, 2)]

    alone = two()
    assert (len(opened), len(resolved)) == (2, 2)
    with api.sharing_data():
        shared = two() + two()
    assert (len(opened), len(resolved)) == (3, 3)
    for a, b in zip(alone, shared):
        assert a.spec == b.spec and a.static(4, 128, 8).ttft_ms == b.static(4, 128, 8).ttft_ms
    with sharing_estimators():
        two()
    assert (len(opened), len(resolved)) == (4, 4)
