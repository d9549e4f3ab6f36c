"""``recommend``: the fewest GPUs that carry a load, computed by hand over hand-made candidates,
and end to end on the synthetic pack (the answer is the cheapest option among the search's)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

import synthpack as sp
from infercast.errors import InvalidInputError
from infercast.search import search_agg
from infercast.search.sizing import options, recommend_deployment, requests_per_s


@dataclass
class C:  # the fields of a search candidate that recommend reads
    layout: str
    gpus: int
    concurrency: int
    request_latency_ms: float
    ttft_ms: float
    meets_targets: bool = True


CANDS = [
    C("tp1", 1, 8, 2000.0, 100.0),    # 4 req/s per copy
    C("tp1", 1, 16, 4000.0, 300.0),   # 4 req/s, 16 clients
    C("tp2", 2, 32, 2000.0, 80.0),    # 16 req/s per copy
    C("tp4", 4, 64, 1000.0, 50.0, meets_targets=False),  # 64 req/s but misses the targets
]


def test_requests_per_s_is_littles_law():
    assert requests_per_s(8, 2000.0) == 4.0


def test_rate_by_hand():
    # 20 req/s: tp1 at c8 needs ceil(20/4) = 5 GPUs; tp1 at c16 5 GPUs too; tp2 needs ceil(20/16) = 2 copies = 4 GPUs
    best = options(CANDS, "agg", rate=20.0)
    assert [(r.unit["layout"], r.copies, r.gpus) for r in best] == [("tp2", 2, 4), ("tp1", 5, 5), ("tp1", 5, 5)]
    assert best[0].capacity_requests_per_s == 32.0
    # 16 req/s exactly: one tp2 copy (2 GPUs) is enough; no copy count is rounded up past the need
    assert (options(CANDS, "agg", rate=16.0)[0].copies, options(CANDS, "agg", rate=16.0)[0].gpus) == (1, 2)


def test_clients_by_hand():
    # 40 clients: tp1@c16 -> 3 copies (3 GPUs, room for 48); tp1@c8 -> 5 (5); tp2@c32 -> 2 copies (4)
    best = options(CANDS, "agg", clients=40)
    assert [(r.unit["layout"], r.unit["concurrency"], r.gpus) for r in best] == [("tp1", 16, 3), ("tp2", 32, 4), ("tp1", 8, 5)]
    assert best[0].capacity_clients == 48


def test_bad_loads_are_refused():
    for kw in ({}, {"rate": 1.0, "clients": 2}, {"rate": -1.0}, {"rate": math.nan}, {"clients": 0}):
        with pytest.raises(InvalidInputError):
            options(CANDS, "agg", **kw)
    assert options([c for c in CANDS if not c.meets_targets], "agg", rate=1.0) == []


def test_recommend_on_the_synthetic_pack(synth):
    res = search_agg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, systems_path=synth.systems_dir, concurrencies=[1, 4, 16])
    rate = 50.0
    recs = recommend_deployment({"agg": res}, rate=rate, top=3)
    assert recs
    # the cheapest option by brute force over the search's candidates
    want = min(math.ceil(rate / requests_per_s(c.concurrency, c.request_latency_ms) - 1e-12) * c.gpus
               for c in res.candidates if c.meets_targets)
    assert recs[0].gpus == want
    assert recs[0].capacity_requests_per_s >= rate
    assert [r.gpus for r in recs] == sorted(r.gpus for r in recs)


@pytest.mark.parametrize("load", [{"rate": 50.0}, {"clients": 37}])
def test_recommend_deployment_ranks_every_option_of_both_modes(synth, load):
    """recommend_deployment picks its top options from the candidates' columns: the same
    recommendations, in the same order, as building every option (``options``) of each mode and
    sorting them all by (GPUs, most headroom, lowest TTFT), earlier first on a tie."""
    from infercast.search import search_disagg

    kw = dict(systems_path=synth.systems_dir, concurrencies=[1, 4, 16, 64])
    results = {"agg": search_agg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, **kw),
               "disagg": search_disagg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, max_gpus=4, **kw)}
    every = [r for mode, res in results.items() for r in options(list(res.candidates), mode, **load)]
    head = "clients" in load
    every.sort(key=lambda r: (r.gpus, -(r.capacity_clients if head else r.capacity_requests_per_s), r.unit["ttft_ms"]))
    got = recommend_deployment(results, top=7, **load)
    assert len(got) == min(7, len(every)) >= 3
    assert [{**r.to_dict(), "intervals": None} for r in got] == [{**r.to_dict(), "intervals": None} for r in every[:7]]
    assert all(r.intervals for r in got)
