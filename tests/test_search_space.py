"""The wider search space (issue 38): mixed expert-TP x EP layouts and their labels, disaggregated
worker counts up to the GPU budget, concurrency resolved by bisection where meeting the targets
flips, counts of what was evaluated and refused, and the array evaluation of disaggregated
deployments against the scalar one."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import synthpack as sp

from infercast.report.artifacts import _layout_kw
from infercast.search import DisaggCandidate, Layout, layouts, search_agg, search_disagg
from infercast.search import run as search_run


def test_layout_label_names_mixed_expert_tp_and_parses_back(real_pack_available):
    from infercast.api import Estimator

    moe = Estimator("Qwen/Qwen3-235B-A22B-FP8", "h200_sxm", "trtllm", tp=4, moe_tp=1, moe_ep=4).spec
    ok, _ = layouts(moe, 16, 8)
    labels = [lay.label for lay in ok]
    assert len(labels) == len(set(labels))  # every layout has its own label
    # the reference's MoE winner (attention DP 8, expert TP 2 x EP 4) and cross-node DEP
    assert "tp1-dp8-etp2-ep4" in labels and "tp1-dp16-ep16" in labels and "tp4-dp2-etp2-ep4" in labels
    assert "tp16" not in labels  # tensor parallelism stays within the NVLink domain
    for lay in ok:
        kw = _layout_kw(lay.label)
        back = Layout(kw.get("tp", 1), kw.get("pp", 1), kw.get("attention_dp", 1), kw.get("moe_tp"), kw.get("moe_ep"))
        assert back.parallel.etp == lay.parallel.etp and back.parallel.ep == lay.parallel.ep and back.gpus == lay.gpus
        assert (back.tp, back.pp, back.attention_dp) == (lay.tp, lay.pp, lay.attention_dp)
    assert Layout(tp=1, attention_dp=8, moe_tp=2, moe_ep=4).label == "tp1-dp8-etp2-ep4"
    assert Layout(tp=8, moe_tp=1, moe_ep=8).label == "tp8-ep8"  # expert TP 1 is the width rule's default


def _by_layout(candidates):
    out: dict = {}
    for c in candidates:
        out.setdefault(c.layout, []).append(c)
    return out


def test_agg_concurrency_bisected_to_the_flip(synth):
    """With a TPOT target between the fastest and slowest candidates, each layout whose grid flips
    from meeting to missing it is resolved to two adjacent concurrencies."""
    base = search_agg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, systems_path=synth.systems_dir, max_gpus=2)
    tight = float(np.median([c.tpot_ms for c in base.candidates]))
    r = search_agg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, systems_path=synth.systems_dir, max_gpus=2, tpot_max_ms=tight)
    grid = set(r.concurrencies)
    flipped = 0
    for layout, cands in _by_layout(r.candidates).items():
        ok = sorted(c.concurrency for c in cands if c.meets_targets)
        bad = sorted(c.concurrency for c in cands if not c.meets_targets)
        if ok and bad and bad[-1] > ok[-1]:
            above = min(b for b in bad if b > ok[-1])
            assert above == ok[-1] + 1, layout
            flipped += 1
            assert {c.concurrency for c in cands} - grid  # off-grid concurrencies were evaluated
    assert flipped
    assert r.evaluated["agg candidate"] == len(r.candidates) + sum(v for k, v in r.refused.items() if k.startswith("agg candidate"))
    # a given list is evaluated as given
    given = search_agg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, systems_path=synth.systems_dir, max_gpus=2,
                       tpot_max_ms=tight, concurrencies=[1, 4, 16])
    assert {c.concurrency for c in given.candidates} <= {1, 4, 16}


def test_disagg_workers_up_to_the_budget_and_refusals_counted(synth):
    r = search_disagg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, systems_path=synth.systems_dir, concurrencies=[2, 16],
                      max_gpus=12)
    assert max(c.decode_workers for c in r.candidates) == 11  # one 1-GPU prefill worker and 11 decode workers
    assert all(c.gpus <= 12 for c in r.candidates if isinstance(c, DisaggCandidate))
    assert sum(r.refused.values()) == len(r.skipped)
    assert r.evaluated["disagg candidate"] >= len(r.candidates)
    capped = search_disagg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, systems_path=synth.systems_dir, concurrencies=[2, 16],
                           max_gpus=12, max_workers=3)
    assert max(c.decode_workers for c in capped.candidates) == 3


@pytest.mark.parametrize("refine", [False, True])
def test_vectorised_disagg_equals_scalar(synth, monkeypatch, refine):
    """The array evaluation of disaggregated deployments gives the scalar solver's results: the
    same candidates in the same order, the same numbers (to rounding), frontier and best."""
    kw = {"systems_path": synth.systems_dir, "max_gpus": 8, "tpot_max_ms": None, "refine": refine}
    fast = search_disagg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, **kw)
    # a TPOT target that splits the candidates, so bisection has flips to resolve
    kw["tpot_max_ms"] = float(np.median([c.tpot_ms for c in fast.candidates]))
    fast = search_disagg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, **kw)
    monkeypatch.setattr(search_run, "evaluate_disagg", functools.partial(search_run.evaluate_disagg, vectorised=False))
    slow = search_disagg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, **kw)
    assert len(fast.candidates) == len(slow.candidates) > 50
    for a, b in zip(fast.candidates, slow.candidates):
        assert (a.layout, a.concurrency, a.gpus, a.meets_targets) == (b.layout, b.concurrency, b.gpus, b.meets_targets)
        for f in ("ttft_ms", "tpot_ms", "ttft_p90_ms", "tpot_p90_ms", "request_latency_ms", "tokens_per_s_per_gpu",
                  "prefill_utilisation"):
            assert getattr(a, f) == pytest.approx(getattr(b, f), rel=1e-9, abs=1e-12), f
    assert fast.frontier == slow.frontier and fast.best == slow.best and fast.skipped.keys() == slow.skipped.keys()
    if refine:  # every deployment whose grid flips is resolved to adjacent concurrencies
        assert {c.concurrency for c in fast.candidates} - set(fast.concurrencies)
        flipped = 0
        for layout, cands in _by_layout(fast.candidates).items():
            ok = [c.concurrency for c in cands if c.meets_targets]
            bad = [c.concurrency for c in cands if not c.meets_targets and ok and c.concurrency > max(ok)]
            if ok and bad:
                assert min(bad) == max(ok) + 1, layout
                flipped += 1
        assert flipped


def test_search_cli_counts_pareto_and_save_dir(synth, capsys, tmp_path):
    from infercast.cli.main import main

    argv = ["search", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm", "--systems-path",
            str(synth.systems_dir), "--isl", "128", "--osl", "8", "--mode", "both", "--max-gpus", "4"]
    assert main([*argv, "--save-dir", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "agg: evaluated " in out and "disagg: evaluated " in out and "disagg candidates" in out
    assert "Pareto frontier" in out and f"saved: {tmp_path / 'out'}" in out
    for name in ("results.csv", "results.json", "pareto.csv", "report.html"):
        assert (tmp_path / "out" / name).is_file()
    assert main([*argv, "--json"]) == 0
    import json

    d = json.loads(capsys.readouterr().out)
    for m in ("agg", "disagg"):
        assert d[m]["evaluated"] and sum(d[m]["refused"].values()) == len(d[m]["skipped"])


def test_decode_on_another_system_moves_kv_over_the_slower_link(synth, tmp_path):
    """Decode workers on a second system (the same data, a 1000x slower node-to-node link): the
    KV transfer takes the slower link, so every deployment's TPOT grows, and nothing else changes."""
    import shutil

    systems = tmp_path / "systems"
    shutil.copytree(synth.systems_dir, systems, symlinks=True)
    shutil.copytree(synth.systems_dir.parent / "model_configs", tmp_path / "model_configs")
    text = (systems / f"{sp.SYSTEM}.yaml").read_text()
    slow = text.replace(f"inter_node_bw: {sp.SYSTEM_NODE['inter_node_bw']}", f"inter_node_bw: {sp.SYSTEM_NODE['inter_node_bw'] // 1000}")
    assert slow != text
    (systems / "synth_slow.yaml").write_text(slow)
    kw = {"systems_path": systems, "concurrencies": [2, 8], "max_gpus": 4, "max_workers": 2}
    same = search_disagg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, **kw)
    cross = search_disagg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, decode_system="synth_slow", **kw)
    assert cross.decode_system == "synth_slow" and same.decode_system is None
    a = {(c.layout, c.concurrency): c for c in same.candidates}
    b = {(c.layout, c.concurrency): c for c in cross.candidates}
    assert a.keys() == b.keys() and a
    assert all(b[k].tpot_ms > a[k].tpot_ms for k in a)
    # the other way round (prefill on the slow system) is the same link
    back = search_disagg(sp.MODEL_ID, "synth_slow", "trtllm", 128, 8, decode_system=sp.SYSTEM, **kw)
    assert all(c.tpot_ms == pytest.approx(b[c.layout, c.concurrency].tpot_ms, rel=1e-12) for c in back.candidates)


def test_every_backend_ranked_together(synth):
    from infercast.search import search_backends

    merged, per = search_backends(search_agg, sp.MODEL_ID, sp.SYSTEM, ["trtllm", "vllm"], 128, 8,
                                  systems_path=synth.systems_dir, concurrencies=[1, 4], max_gpus=2)
    assert set(per) <= {"trtllm", "vllm"} and per
    assert len(merged.candidates) == sum(len(r.candidates) for r in per.values())
    assert {c.backend for c in merged.candidates} == set(per)
    best = merged.candidates[merged.best]
    assert best.tokens_per_s_per_gpu == max(r.candidates[r.best].tokens_per_s_per_gpu for r in per.values() if r.best is not None)
    assert best.description.startswith(f"{best.backend}: ")
    assert merged.evaluated["backend"] == 2
    # disaggregated candidates (kept as rows) come through the same: each as it was, its
    # description naming its backend
    from dataclasses import replace

    from infercast.search import search_disagg

    merged, per = search_backends(search_disagg, sp.MODEL_ID, sp.SYSTEM, ["trtllm", "vllm"], 128, 8,
                                  systems_path=synth.systems_dir, concurrencies=[1, 4], max_gpus=4)
    want = [replace(c, description=f"{b}: {c.description}") for b, r in per.items() for c in r.candidates]
    assert want and list(merged.candidates) == want


def test_reference_winners_worker_counts_are_in_the_space():
    """The reference's disaggregated winners on 32 GPUs (Qwen3-32B-FP8, h200_sxm): 20 one-GPU
    prefill workers with 3 four-GPU decode workers (TensorRT-LLM), 6 one-GPU prefill workers with
    13 two-GPU decode workers (vLLM) -- beyond the old cap of 8 workers per role."""
    from infercast.search.run import _worker_counts, disagg_worker

    assert (20, 3) in _worker_counts(1, 4, 32, None) and (6, 13) in _worker_counts(1, 2, 32, None)
    assert all(p * 1 + d * 2 <= 32 for p, d in _worker_counts(1, 2, 32, None))
    assert len(_worker_counts(1, 2, 32, None)) == sum((32 - p) // 2 for p in range(1, 31))
    assert (6, 13) not in _worker_counts(1, 2, 32, 8)
    # multi-node workers: attention DP x EP spans nodes; pipeline stages only when a stage fills the NVLink domain
    assert disagg_worker(Layout(tp=1, attention_dp=16, moe_tp=1, moe_ep=16), 8, 32)
    assert disagg_worker(Layout(tp=8, pp=2), 8, 32) and not disagg_worker(Layout(tp=4, pp=2), 8, 32)
    assert not disagg_worker(Layout(tp=8, pp=4), 8, 32)  # all 32 GPUs: no room for the other role
