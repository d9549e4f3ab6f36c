"""The request-level simulator on synthetic step timers whose answers are known by hand, and its
trace parsers on files the tests write."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from infercast.errors import DataFileError, InvalidConfigError, InvalidInputError
from infercast.serving.simulate import (
    LinearStepTimer,
    UnitConfig,
    Workload,
    arrival_times,
    read_trace,
    simulate,
    uniform_lengths,
    write_out,
)
from infercast.serving.simulate.prefix_cache import PrefixCache


def cfg(**kw) -> UnitConfig:
    base = {"max_num_tokens": 8192, "max_batch_size": 1024, "chunked": True, "mixed": True, "kv_capacity_tokens": 1e7,
            "kv_reserve_full": True}
    base.update(kw)
    return UnitConfig(**base)


def run(timer, w, c=None, **kw):
    kw.setdefault("warmup", 0.0)
    kw.setdefault("cooldown", 0.0)
    return simulate(timer, c or cfg(), w, **kw)


# ---- hand-computable queues ----------------------------------------------------------------------
def test_md1_mean_wait_matches_pollaczek_khinchine():
    """Poisson arrivals, one request served at a time, each in one step of D ms (output of one
    token, so it completes with its prefill): an M/D/1 queue, mean wait rho D / (2 (1 - rho))."""
    D, rate = 10.0, 60.0  # rho = 0.6
    n = 40_000
    rng = np.random.default_rng(1)
    w = Workload(np.full(n, 64), np.ones(n, dtype=int), sent_ms=arrival_times(n, rate, 1.0, rng))
    res = run(LinearStepTimer(D), w, cfg(max_batch_size=1))
    rho = rate * D / 1e3
    expect = rho * D / (2 * (1 - rho))  # 7.5 ms
    assert res.latency["queue_ms"]["mean"] == pytest.approx(expect, rel=0.06)
    assert res.latency["ttft_ms"]["mean"] == pytest.approx(expect + D, rel=0.03)
    assert res.latency["ttft_ms"]["p50"] >= D


def test_gamma_arrivals_rate_and_burstiness():
    rng = np.random.default_rng(3)
    t = arrival_times(50_001, 5.0, 0.25, rng)
    gaps = np.diff(t)
    assert gaps.mean() == pytest.approx(200.0, rel=0.03)
    assert gaps.var() / gaps.mean() ** 2 == pytest.approx(4.0, rel=0.08)  # CV^2 = 1 / burstiness


def test_one_client_closed_loop_ttft_and_tpot_exact():
    """One client: each request runs alone. Prefill step = 5 + 0.01 x isl; decode step j (KV
    isl + 1 + j tokens) = 5 + 0.002 x KV."""
    isl, osl = 300, 41
    timer = LinearStepTimer(5.0, per_prefill_token_ms=0.01, per_kv_token_ms=0.002)
    w = Workload(np.full(6, isl), np.full(6, osl), clients=1)
    res = run(timer, w)
    ttft = 5.0 + 0.01 * isl
    tpot = np.mean([5.0 + 0.002 * (isl + 1 + j) for j in range(osl - 1)])
    for q in ("mean", "p50", "p99"):
        assert res.latency["ttft_ms"][q] == pytest.approx(ttft, rel=1e-12)
        assert res.latency["tpot_ms"][q] == pytest.approx(tpot, rel=1e-12)
    assert res.latency["queue_ms"]["mean"] == 0.0
    assert res.duration_ms == pytest.approx(6 * (ttft + tpot * (osl - 1)), rel=1e-12)
    assert res.steps == 6 * osl


def test_closed_loop_front_end_delay_and_wave():
    """Four clients, a constant 10 ms step, a 3 ms front end: the first wave is prefilled in one
    step (4 x 100 tokens fit the budget), so every request of a wave sees TTFT 3 + 10 ms and
    TPOT 10 ms, and the waves stay together."""
    w = Workload(np.full(12, 100), np.full(12, 5), clients=4)
    res = run(LinearStepTimer(10.0), w, front_end=lambda streams, tokens: 3.0)
    assert res.latency["ttft_ms"]["mean"] == pytest.approx(13.0)
    assert res.latency["tpot_ms"]["p99"] == pytest.approx(10.0)
    assert res.steps == 3 * 5


def test_chunked_prefill_splits_a_long_prompt():
    """A 1000-token prompt at a 256-token budget: four chunk steps, the last one carrying the
    first token; TTFT = 4 steps."""
    w = Workload([1000], [3], clients=1)
    res = run(LinearStepTimer(10.0), w, cfg(max_num_tokens=256, min_prefill_chunk=16))
    assert res.latency["ttft_ms"]["mean"] == pytest.approx(40.0)
    with pytest.raises(InvalidConfigError, match="does not fit the step budget"):
        run(LinearStepTimer(10.0), w, cfg(max_num_tokens=256, chunked=False))


def test_prefill_first_engine_pauses_decodes():
    """Not mixed: a request arriving during another's decode gets its own prefill step, and the
    decoding request's output waits for it (one of its gaps is two steps)."""
    w = Workload([100, 100], [11, 2], sent_ms=np.array([0.0, 25.0]))
    res = run(LinearStepTimer(10.0), w, cfg(mixed=False))
    per = res.per_request
    assert per["ttft_ms"][1] == pytest.approx(15.0)  # waits for the step in progress (20-30), prefills 30-40
    assert per["finish_ms"][0] == pytest.approx(10.0 * 12)  # 1 prefill + 10 decode steps + 1 paused step


def test_kv_admission_reserve_full_queues_requests():
    """Room for one request's whole KV: the second waits until the first completes."""
    w = Workload([100, 100], [10, 10], sent_ms=np.array([0.0, 0.0]))
    res = run(LinearStepTimer(10.0), w, cfg(kv_capacity_tokens=150))
    per = res.per_request
    assert per["queue_ms"][1] == pytest.approx(100.0)
    assert per["ttft_ms"][1] == pytest.approx(110.0)


def test_on_demand_kv_preempts_and_recomputes():
    """KV allocated as tokens are generated: three requests outgrow the cache, the latest admitted
    is preempted and recomputed; every request still produces its whole output."""
    n = 3
    w = Workload(np.full(n, 100), np.full(n, 60), sent_ms=np.zeros(n))
    res = run(LinearStepTimer(10.0), w, cfg(kv_capacity_tokens=400, kv_reserve_full=False))
    assert res.preemptions >= 1
    per = res.per_request
    assert (per["finish_ms"] > 0).all()
    assert per["preemptions"].sum() == res.preemptions
    # the run cannot be shorter than serving the tokens without preemption in one batch
    assert res.duration_ms >= 10.0 * 60


# ---- prefix caching --------------------------------------------------------------------------
def _shared_trace(n=10, shared=4, bt=16):
    hashes = [tuple(range(shared)) + (1000 + i,) for i in range(n)]
    isl = np.full(n, (shared + 1) * bt)
    return Workload(isl, np.full(n, 2), sent_ms=np.arange(n) * 1000.0, hashes=hashes, block_tokens=bt)


def test_prefix_cache_hits_on_shared_prefixes():
    """Ten prompts of 5 blocks of 16 tokens sharing their first 4: the first misses, the other
    nine find 64 tokens; prefill time drops to the 16 new tokens."""
    w = _shared_trace()
    timer = LinearStepTimer(1.0, per_prefill_token_ms=0.1)
    res = run(timer, w)
    assert res.prefix_hit_rate == pytest.approx(9 * 64 / (10 * 80))
    cached = res.per_request["cached_tokens"]
    assert cached[0] == 0 and (cached[1:] == 64).all()
    ttft = res.per_request["ttft_ms"]
    assert ttft[0] == pytest.approx(1.0 + 0.1 * 80)
    assert np.allclose(ttft[1:], 1.0 + 0.1 * 16)
    off = run(timer, w, prefix_cache=False)
    assert off.prefix_hit_rate is None
    assert np.allclose(off.per_request["ttft_ms"], 1.0 + 0.1 * 80)


def test_prefix_cache_evicts_least_recently_used():
    c = PrefixCache(10)
    c.acquire(("a", "b"), 0)
    c.release(("a", "b"))
    c.acquire(("c",), 0)
    c.release(("c",))
    assert c.match(("a", "b")) == 2
    c.acquire(("a",), 1)  # a is pinned again: b and c are the cached ones, b older
    assert c.evict_to(10) == 1
    assert c.match(("a", "b")) == 1 and c.match(("c",)) == 1
    c.release(("a",))
    assert c.cached_tokens == 20 and c.pinned_tokens == 0


def test_prefix_cache_limited_by_kv_left_by_running_requests():
    """Capacity of 100 tokens, prompts of 5 blocks of 16: a cached prefix survives only while
    the next unrelated request leaves room for it."""
    bt = 16
    hashes = [(1, 2, 3, 4, 100), (9, 8, 7, 6, 101), (1, 2, 3, 4, 102)]
    w = Workload([80, 80, 80], [2, 2, 2], sent_ms=np.array([0.0, 100.0, 200.0]), hashes=hashes, block_tokens=bt)
    res = run(LinearStepTimer(1.0), w, cfg(kv_capacity_tokens=100))
    assert res.per_request["cached_tokens"].tolist() == [0, 0, 0]
    res = run(LinearStepTimer(1.0), w, cfg(kv_capacity_tokens=1000))
    assert res.per_request["cached_tokens"].tolist() == [0, 0, 64]


def test_routing_policies():
    n = 8
    hashes = [(i % 2, 100 + i) for i in range(n)]  # two prefix families
    w = Workload(np.full(n, 32), np.full(n, 2), sent_ms=np.arange(n) * 100.0, hashes=hashes, block_tokens=16)
    rr = run(LinearStepTimer(1.0), w, units=2, router="round-robin")
    assert rr.per_request["replica"].tolist() == [0, 1] * 4
    pa = run(LinearStepTimer(1.0), w, units=3, router="prefix-aware")
    rep = pa.per_request["replica"]
    assert len(set(rep[0::2])) == 1 and len(set(rep[1::2])) == 1  # each family stays on one replica
    assert pa.prefix_hit_rate == pytest.approx(6 * 16 / (8 * 32))
    lo = run(LinearStepTimer(1.0), Workload(np.full(4, 32), np.full(4, 50), sent_ms=np.zeros(4)), units=2,
             router="least-outstanding")
    assert sorted(lo.per_request["replica"].tolist()) == [0, 0, 1, 1]
    with pytest.raises(InvalidInputError, match="unknown router"):
        run(LinearStepTimer(1.0), w, units=2, router="random")


# ---- statistics --------------------------------------------------------------------------------
def test_goodput_and_window():
    n = 100
    w = Workload(np.full(n, 10), np.full(n, 2), sent_ms=np.arange(n) * 100.0)
    res = run(LinearStepTimer(5.0), w, warmup=0.1, cooldown=0.1, ttft_ms=6.0, tpot_ms=4.0)
    assert res.latency["ttft_ms"]["mean"] == pytest.approx(5.0)
    assert res.goodput_rps == 0.0  # TPOT 5 ms misses 4 ms
    res = run(LinearStepTimer(5.0), w, warmup=0.1, cooldown=0.1, ttft_ms=6.0)
    assert res.goodput_rps == pytest.approx(res.throughput_rps)
    assert res.throughput_rps == pytest.approx(10.0, rel=0.02)
    assert any("warm-up" in x for x in res.notes)
    with pytest.raises(InvalidInputError, match="leave nothing to measure"):
        run(LinearStepTimer(5.0), w, warmup=0.6, cooldown=0.5)


def test_out_files_round_trip_as_a_trace(tmp_path):
    w = _shared_trace()
    res = run(LinearStepTimer(1.0), w)
    write_out(res, tmp_path / "r.csv")
    back = read_trace(tmp_path / "r.csv", block_tokens=16)
    assert back.isl.tolist() == w.isl.tolist()
    assert back.sent_ms.tolist() == pytest.approx(w.sent_ms.tolist())
    assert [tuple(map(int, h)) for h in back.hashes] == w.hashes
    write_out(res, tmp_path / "r.json")
    d = json.loads((tmp_path / "r.json").read_text())
    assert len(d["requests_table"]) == 10 and d["prefix_hit_rate"] == pytest.approx(0.72)
    with pytest.raises(InvalidInputError, match="unknown file type"):
        write_out(res, tmp_path / "r.txt")


def test_balance_hold_gathers_prefills_until_every_rank_has_one():
    """Two attention-DP ranks stepping together, 2 ms per step, 1 decode each running a long
    request; a prompt reaching rank 0 alone is held until the timeout (T = 3 steps), then runs;
    one reaching both ranks runs at once."""
    from infercast.serving.simulate.lockstep import Lockstep
    from infercast.serving.simulate.scheduler import Request, Unit, UnitConfig

    class Const:
        tokens_per_step, decode_width = 1.0, 1.0

        def step_ms(self, chunks, n_dec, kv):
            return 2.0

    def group(timeout):
        cfg = UnitConfig(max_num_tokens=10_000, max_batch_size=64, chunked=True, mixed=True,
                         kv_capacity_tokens=1e9, kv_reserve_full=False)
        ranks = [Unit(i, cfg, Const(), 16, prefix_cache=False) for i in range(2)]
        g = Lockstep(ranks, balance_timeout_steps=timeout)
        for i, r in enumerate(ranks):  # a long decode on each rank: admitted and prefilled in step 1
            r.enqueue(Request(i, 0.0, 10, 1000))
        g.plan(), g.commit()
        return g, ranks

    g, ranks = group(3)
    ranks[0].enqueue(Request(9, 2.0, 10, 5))
    ends = []
    for _ in range(3):
        ends.append(g.plan())
        g.commit()
        if ranks[0].prefilling or any(r.idx == 9 for r in ranks[0].decoding):
            break
    new = next(r for r in ranks[0].decoding if r.idx == 9)
    # held 3 steps (a run of 3 decode steps ending at 2 + 3 x 2 = 8 ms), prefilled in the next step
    assert ends[0] == pytest.approx(8.0) and new.first == pytest.approx(10.0)

    g, ranks = group(3)
    ranks[0].enqueue(Request(9, 2.0, 10, 5))
    ranks[1].enqueue(Request(10, 2.0, 10, 5))
    g.plan(), g.commit()  # every rank has a prompt: no hold
    assert {r.idx for r in ranks[0].decoding} == {0, 9} and {r.idx for r in ranks[1].decoding} == {1, 10}

    g, ranks = group(0)  # no hold configured: admitted at the next step
    ranks[0].enqueue(Request(9, 2.0, 10, 5))
    g.plan(), g.commit()
    assert any(r.idx == 9 for r in ranks[0].decoding)


# ---- loads and traces --------------------------------------------------------------------------
def test_uniform_lengths_range():
    x = uniform_lengths(1000, 0.8, 20_000, np.random.default_rng(0))
    assert x.min() == 800 and x.max() == 1000
    assert x.mean() == pytest.approx(900, abs=3)
    assert (uniform_lengths(7, 1.0, 5) == 7).all()


def test_mooncake_trace(tmp_path):
    p = tmp_path / "m.jsonl"
    rows = [{"timestamp": 1000, "input_length": 700, "output_length": 20, "hash_ids": [1, 2]},
            {"timestamp": 1500, "input_length": 300, "output_length": 5, "hash_ids": [1]}]
    p.write_text("\n".join(json.dumps(r) for r in rows[::-1]) + "\n")
    w = read_trace(p, time_scale=2.0)
    assert w.sent_ms.tolist() == [0.0, 1000.0]
    assert w.isl.tolist() == [700, 300] and w.osl.tolist() == [20, 5]
    assert w.hashes == [(1, 2), (1,)] and w.block_tokens == 512
    assert "mooncake" in w.description


def test_azure_trace(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.1805900,396,109\n")
    w = read_trace(p)
    assert w.sent_ms.tolist() == pytest.approx([0.0, 3500.0])
    assert w.isl.tolist() == [374, 396] and w.osl.tolist() == [44, 109] and w.hashes is None


def test_own_formats(tmp_path):
    c = tmp_path / "t.csv"
    c.write_text("arrival_ms,isl,osl\n0,10,2\n50,20,3\n")
    assert read_trace(c).isl.tolist() == [10, 20]
    j = tmp_path / "t.jsonl"
    j.write_text('{"arrival_ms": 5, "isl": 10, "osl": 2, "hash_ids": ["x"]}\n')
    assert read_trace(j).hashes == [("x",)]


@pytest.mark.parametrize("text,needle", [
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,3,4\n", "line 2: TIMESTAMP is neither"),
    ("arrival_ms,isl,osl\n0,0,2\n", "line 2: isl must be a whole number >= 1"),
    ("a,b\n1,2\n", "unrecognised header"),
    ('{"timestamp": 1, "input_length": 5}\n', "output_length is not a number"),
    ('{"timestamp": 1,\n', "not a JSON object"),
    ("", "has no requests"),
])
def test_bad_traces(tmp_path, text, needle):
    p = tmp_path / ("t.jsonl" if text.startswith("{") else "t.csv")
    p.write_text(text)
    with pytest.raises(DataFileError, match=needle):
        read_trace(p)


def test_missing_trace(tmp_path):
    with pytest.raises(DataFileError, match="cannot read trace"):
        read_trace(tmp_path / "nope.jsonl")


class _ConstEngine:
    """A compiled-engine stand-in for :func:`infercast.serving.sim.simulate`: every step ``t`` ms."""

    tokens_per_step = 1.0
    decode_width = 1.0

    def __init__(self, t):
        self.t = t

    def mixed_step_ms(self, *args):
        return self.t

    def step_ms(self, **shape):
        return np.full(np.shape(shape.get("dec_kv", 1.0)), self.t)


@pytest.mark.parametrize("clients,isl,osl,budget", [(8, 3000, 20, 8192), (5, 700, 9, 2048), (16, 100, 50, 8192)])
def test_closed_loop_agrees_with_the_cohort_simulation(clients, isl, osl, budget):
    """The closed-loop benchmark played by :func:`infercast.serving.sim.simulate` (cohorts, the
    first wave of ``serve``) and by this simulator, on the same constant-step engine and
    scheduler: the same mean TTFT, TPOT and duration."""
    from dataclasses import replace

    from infercast.serving.backends import SCHEDULERS
    from infercast.serving.sim import simulate as cohort_sim

    # serve's first wave composes each step between steps: the same scheduler here, not one step ahead
    params = replace(SCHEDULERS["trtllm"], max_num_tokens=budget, arrival_delay_ms=7.0, front_end_per_stream_ms=0.0,
                     adp_balance_timeout_steps=0, schedule_ahead=False)
    ref = cohort_sim(_ConstEngine(10.0), clients, isl, osl, params, 1e9, 1, requests_per_client=3)
    w = Workload(np.full(3 * clients, isl), np.full(3 * clients, osl), clients=clients)
    res = run(LinearStepTimer(10.0), w, UnitConfig.from_params(params, 1e9), front_end=lambda s, t: 7.0)
    assert res.latency["ttft_ms"]["mean"] == pytest.approx(ref.ttft_ms, rel=1e-9)
    assert res.latency["tpot_ms"]["mean"] == pytest.approx(ref.tpot_ms, rel=1e-9)
    assert res.steps == ref.steps


def test_disaggregated_one_client_exact():
    """One client, prefill worker steps of 20 ms, decode steps of 5 ms, a 3 ms KV transfer: TTFT
    is the prefill step; the output's osl - 1 tokens take the transfer, then one decode step each
    (the decode worker picks the request up at once: it is idle)."""
    from infercast.serving.simulate import simulate_disagg

    isl, osl = 200, 11
    w = Workload(np.full(4, isl), np.full(4, osl), clients=1)
    res = simulate_disagg(LinearStepTimer(20.0), cfg(), LinearStepTimer(5.0), cfg(), w, prefill_units=2, decode_units=1,
                          transfer_ms=lambda r: 3.0, warmup=0.0, cooldown=0.0)
    assert res.latency["ttft_ms"]["p99"] == pytest.approx(20.0)
    assert res.latency["tpot_ms"]["mean"] == pytest.approx((3.0 + 5.0 * (osl - 1)) / (osl - 1))
    assert res.latency["e2e_ms"]["mean"] == pytest.approx(20.0 + 3.0 + 5.0 * (osl - 1))


def test_disaggregated_prefill_pool_queues_and_decode_batches():
    """Four requests at once on one prefill worker that takes one prompt per step (a budget of
    one prompt, no chunking): TTFTs are 1, 2, 3, 4 prefill steps; each then decodes its five
    tokens in five 2 ms steps (the previous one finishes as the next arrives)."""
    from infercast.serving.simulate import simulate_disagg

    w = Workload(np.full(4, 100), np.full(4, 6), sent_ms=np.zeros(4))
    res = simulate_disagg(LinearStepTimer(10.0), cfg(max_num_tokens=100, chunked=False), LinearStepTimer(2.0), cfg(), w,
                          prefill_units=1, decode_units=1, transfer_ms=lambda r: 0.0, warmup=0.0, cooldown=0.0)
    assert sorted(res.per_request["ttft_ms"].tolist()) == pytest.approx([10.0, 20.0, 30.0, 40.0])
    assert res.per_request["finish_ms"].tolist() == pytest.approx([20.0, 30.0, 40.0, 50.0])


def test_rate_schedule():
    from infercast.serving.simulate.load import (
        parse_rate_schedule,
        scheduled_arrival_times,
    )

    sched = parse_rate_schedule("0:5,100:0,200:20")
    t = scheduled_arrival_times(sched, 300.0, 1.0, np.random.default_rng(2)) / 1e3
    assert np.all(np.diff(t) >= 0) and t[-1] < 300.0
    assert ((t >= 100) & (t < 200)).sum() == 0
    assert (t < 100).sum() == pytest.approx(500, rel=0.12)
    assert (t >= 200).sum() == pytest.approx(2000, rel=0.06)
    for bad in ("5", "10:5", "0:5,0:6", "0:-1", "0:0"):
        with pytest.raises(InvalidInputError, match="--rate-schedule"):
            parse_rate_schedule(bad)


def test_recv_interval_polls_every_few_decode_steps():
    """A queue polled every 4 decode steps: a request arriving during the 2nd step of another's
    decode waits for the poll after the 4th step (not the end of the 2nd), then prefills."""
    w = Workload([100, 100], [30, 2], sent_ms=np.array([0.0, 25.0]))
    res = run(LinearStepTimer(10.0), w, cfg(recv_interval=4))
    # prefill 0-10, decode steps end at 20, 30, 40, 50 (the 4th since the poll after the prefill)
    assert res.per_request["start_ms"][1] == pytest.approx(50.0)
    assert res.per_request["ttft_ms"][1] == pytest.approx(60.0 - 25.0)
    res1 = run(LinearStepTimer(10.0), w, cfg())
    assert res1.per_request["start_ms"][1] == pytest.approx(30.0)


def test_recv_interval_poll_phase_survives_long_runs():
    """Polls every 4 steps also pass while the inbox is empty: after a 6-step run (steps since
    the last poll: 2), an arrival waits for the poll 2 steps later."""
    w = Workload([100, 100, 100], [7, 30, 2], sent_ms=np.array([0.0, 0.0, 85.0]))
    res = run(LinearStepTimer(10.0), w, cfg(recv_interval=4))
    # both prefill 0-10; the first finishes after 6 decode steps (70); polls at 50, 90; the third
    # arrives at 85, in the step 80-90, and is polled at 90
    assert res.per_request["start_ms"][2] == pytest.approx(90.0)


def test_context_batching_delay():
    """A prompt arriving while another decodes is held 3 steps (the delay's limit: its tokens stay
    below 90% of the budget), then prefilled; an idle engine takes a prompt at once."""
    w = Workload([100, 100], [30, 2], sent_ms=np.array([0.0, 15.0]))
    res = run(LinearStepTimer(10.0), w, cfg(batch_wait_iters=3, batch_wait_ratio=0.9))
    assert res.per_request["start_ms"][0] == 0.0
    # decode steps end at 20 (the arrival's step), 30, 40, 50: held for the three after it
    assert res.per_request["start_ms"][1] == pytest.approx(50.0)
    # enough waiting tokens end the delay at once
    res = run(LinearStepTimer(10.0), Workload([100, 8000], [30, 2], sent_ms=np.array([0.0, 15.0])),
              cfg(batch_wait_iters=3, batch_wait_ratio=0.9))
    assert res.per_request["start_ms"][1] == pytest.approx(20.0)


def test_kv_never_overflows_under_overload_with_shared_prefixes():
    """Overload with shared prefixes and on-demand KV: preemptions happen, every request still
    completes, and the KV in use (pinned prefix blocks included) never exceeds the capacity."""
    rng = np.random.default_rng(5)
    n = 1500
    w = Workload(uniform_lengths(800, 0.2, n, rng), uniform_lengths(400, 0.1, n, rng),
                 sent_ms=arrival_times(n, 150, 0.5, rng),
                 hashes=[(i % 7, (i % 7) * 100 + i % 3, 10**6 + i) for i in range(n)], block_tokens=64)
    for full in (False, True):
        res = run(LinearStepTimer(5.0, 0.002, 0.05, 1e-5), w, cfg(max_num_tokens=4096, max_batch_size=256,
                                                                   kv_capacity_tokens=12000, kv_reserve_full=full),
                  units=3, router="prefix-aware")
        assert (res.per_request["finish_ms"] > 0).all()
        assert res.kv_use["max"] <= 1.0 + 1e-12
        assert (res.preemptions > 0) == (not full)


# ---- attention-DP ranks stepping together ------------------------------------------------------------
def test_attention_dp_ranks_step_at_the_slowest_ranks_pace():
    """Two ranks of one replica, round-robin: rank 0 gets requests 0 and 2 (prompts of 10 tokens),
    rank 1 request 1 (50 tokens); every output is 5 tokens. A step costs 1 ms + 0.1 ms per prefill
    token + 1 ms per decode. Together: the prefill step is rank 1's (1 + 5 = 6 ms, against rank 0's
    1 + 2 = 3 ms), then 4 decode steps at rank 0's pace (1 + 2 = 3 ms, against rank 1's 2 ms): every
    request has TTFT 6 ms and finishes at 6 + 4 x 3 = 18 ms. Independent ranks would give rank 0
    TTFT 3 and finish 15, rank 1 TTFT 6 and finish 14."""
    timer = LinearStepTimer(1.0, per_prefill_token_ms=0.1, per_decode_ms=1.0)
    w = Workload([10, 50, 10], [5, 5, 5], sent_ms=np.zeros(3))
    res = run(timer, w, units=2, replica_of=[0, 0], lockstep=2)
    pr = res.per_request
    assert pr["replica"].tolist() == [0, 1, 0]
    assert pr["ttft_ms"].tolist() == pytest.approx([6.0, 6.0, 6.0])
    assert pr["e2e_ms"].tolist() == pytest.approx([18.0, 18.0, 18.0])
    assert pr["tpot_ms"].tolist() == pytest.approx([3.0, 3.0, 3.0])
    apart = run(timer, w, units=2, replica_of=[0, 0]).per_request
    assert apart["ttft_ms"].tolist() == pytest.approx([3.0, 6.0, 3.0])
    assert apart["e2e_ms"].tolist() == pytest.approx([15.0, 14.0, 15.0])


def test_attention_dp_idle_rank_joins_at_the_groups_step_boundary():
    """Rank 0 decodes one request (1 ms + 1 ms per decode: 2 ms steps from t = 1); a request
    reaching idle rank 1 at t = 4.5 waits for the group's step in progress to end (t = 5), then
    its prefill step runs together with rank 0's decode step: max(1, 2) = 2 ms, first token at 7.
    Rank 0's request (10 output tokens: 9 decode steps, one of them in the mixed step at 5-7) ends
    at 1 + 9 x 2 = 19 (every group step lasts 2 ms), rank 1's (3 output tokens: 2 decode steps) at
    7 + 2 x 2 = 11."""
    timer = LinearStepTimer(1.0, per_decode_ms=1.0)
    w = Workload([8, 8], [10, 3], sent_ms=np.array([0.0, 4.5]))
    res = run(timer, w, units=2, replica_of=[0, 0], lockstep=2)
    pr = res.per_request
    assert pr["replica"].tolist() == [0, 1]
    assert pr["start_ms"].tolist() == pytest.approx([0.0, 5.0])
    assert pr["first_token_ms"].tolist() == pytest.approx([1.0, 7.0])
    assert pr["finish_ms"].tolist() == pytest.approx([19.0, 11.0])


def test_attention_dp_idle_rank_composes_one_step_ahead_with_the_group():
    """As test_attention_dp_idle_rank_joins_at_the_groups_step_boundary, on schedulers that
    compose steps one ahead: the request reaching idle rank 1 at t = 4.5 (group step 3-5) misses
    the step 5-7, composed at 3, and prefills in 7-9 beside rank 0's decode (first token at 9);
    rank 0 still decodes every 2 ms (ends at 19), rank 1's two decode steps end at 13."""
    timer = LinearStepTimer(1.0, per_decode_ms=1.0)
    w = Workload([8, 8], [10, 3], sent_ms=np.array([0.0, 4.5]))
    res = run(timer, w, cfg(schedule_ahead=True), units=2, replica_of=[0, 0], lockstep=2)
    pr = res.per_request
    assert pr["start_ms"].tolist() == pytest.approx([0.0, 7.0])
    assert pr["first_token_ms"].tolist() == pytest.approx([1.0, 9.0])
    assert pr["finish_ms"].tolist() == pytest.approx([19.0, 13.0])


def test_lockstep_needs_whole_replicas():
    with pytest.raises(InvalidInputError, match="attention-DP ranks"):
        run(LinearStepTimer(1.0), Workload([8], [2], sent_ms=np.zeros(1)), units=3, lockstep=2)


# ---- scheduling one step ahead, closed-loop start -----------------------------------------------
def test_schedule_ahead_joins_the_step_after_next():
    """A scheduler that composes step n+1 while step n runs: a request arriving at 25 ms, during
    another's decode step 20-30, misses the step 30-40 (composed at 20) and prefills in 40-50,
    one step later than a scheduler that composes between steps. The first request reaches an
    idle engine and starts at once either way."""
    w = Workload([100, 100], [30, 2], sent_ms=np.array([0.0, 25.0]))
    ahead = run(LinearStepTimer(10.0), w, cfg(schedule_ahead=True)).per_request
    between = run(LinearStepTimer(10.0), w, cfg()).per_request
    assert between["start_ms"][1] == pytest.approx(30.0) and between["ttft_ms"][1] == pytest.approx(15.0)
    assert ahead["start_ms"][1] == pytest.approx(40.0) and ahead["ttft_ms"][1] == pytest.approx(25.0)
    assert ahead["ttft_ms"][0] == pytest.approx(10.0) == between["ttft_ms"][0]
    # the decoding request is not delayed: one decode step per token, one mixed step among them
    assert ahead["finish_ms"][0] == pytest.approx(between["finish_ms"][0]) == pytest.approx(300.0)


def test_schedule_ahead_after_an_empty_step_takes_the_request_at_once():
    """The step composed ahead would be empty (the only running request finishes with the step
    in progress, 20-30): the engine idles, and its next pass takes the request that arrived at
    25 at once, as a scheduler composing between steps does (prefill 30-40, TTFT 15)."""
    w = Workload([100, 100], [3, 2], sent_ms=np.array([0.0, 25.0]))
    res = run(LinearStepTimer(10.0), w, cfg(schedule_ahead=True)).per_request
    assert res["finish_ms"][0] == pytest.approx(30.0)
    assert res["start_ms"][1] == pytest.approx(30.0) and res["ttft_ms"][1] == pytest.approx(15.0)


def test_schedule_ahead_with_queue_polls():
    """Polls every 4 decode steps and one step ahead: the request arriving at 25 is taken in by
    the poll at 50 (as in test_recv_interval_polls_every_few_decode_steps) and joins the step
    after the one composed then: prefill 60-70."""
    w = Workload([100, 100], [30, 2], sent_ms=np.array([0.0, 25.0]))
    res = run(LinearStepTimer(10.0), w, cfg(recv_interval=4, schedule_ahead=True))
    assert res.per_request["start_ms"][1] == pytest.approx(60.0)
    assert res.per_request["ttft_ms"][1] == pytest.approx(70.0 - 25.0)


def test_schedule_ahead_backend_settings():
    """TensorRT-LLM (overlap scheduler) and vLLM (async scheduling) set schedule_ahead; SGLang's
    overlap scheduler implies it and a hybrid model without it does not; vLLM builds before 0.14
    compose between steps."""
    from dataclasses import replace

    from infercast.serving.backends import SCHEDULERS, vllm_async_scheduling

    for name in ("trtllm", "vllm", "sglang"):
        assert UnitConfig.from_params(SCHEDULERS[name], 1e6).schedule_ahead
    assert not UnitConfig.from_params(replace(SCHEDULERS["sglang"], overlap=False), 1e6).schedule_ahead
    assert not UnitConfig.from_params(SCHEDULERS["trtllm"], 1e6, ahead=False).schedule_ahead
    assert [vllm_async_scheduling(v) for v in ("0.11.2", "0.12.0", "0.13.0", "0.14.0", "0.19.0", None, "nightly-5b8c")] \
        == [False, False, False, True, True, True, True]


def test_closed_loop_ramp_up_spreads_first_requests():
    """Two clients staggered over a 50 ms ramp-up: the second sends its first request at 25 ms;
    each request (one output token) is one 10 ms prefill step on an idle engine."""
    w = Workload(np.full(2, 100), np.ones(2, dtype=int), clients=2, client_start="staggered", ramp_up_ms=50.0)
    res = run(LinearStepTimer(10.0), w)
    assert res.per_request["sent_ms"].tolist() == pytest.approx([0.0, 25.0])
    assert res.per_request["finish_ms"].tolist() == pytest.approx([10.0, 35.0])
    assert any("a ramp-up of 50 ms" in n for n in res.notes)
    with pytest.raises(InvalidInputError, match="ramp-up"):
        Workload([1], [1], clients=1, ramp_up_ms=-1.0)
    with pytest.raises(InvalidInputError, match="client start"):
        Workload([1], [1], clients=1, client_start="sometimes")


def test_wave_then_staggered_keeps_the_first_wave():
    """Two clients, one-token requests of one 10 ms step, a 40 ms ramp-up: both first requests
    go at 0 and share the first step; after it client 0 sends at once (10) and client 1 waits
    half the ramp-up (30)."""
    w = Workload(np.full(4, 100), np.ones(4, dtype=int), clients=2, client_start="wave-then-staggered",
                 ramp_up_ms=40.0)
    res = run(LinearStepTimer(10.0), w)
    assert res.per_request["sent_ms"].tolist() == pytest.approx([0.0, 0.0, 10.0, 30.0])
    assert res.per_request["ttft_ms"].tolist() == pytest.approx([10.0] * 4)


def test_auto_client_start():
    """``auto``: requests of one length on an engine that mixes prefill into decode steps start
    together and are then spread (wave-then-staggered); drawn lengths, or an engine that pauses
    decodes for prefill (whose waves persist in real runs too), start together."""
    timer = LinearStepTimer(10.0)
    fixed = Workload(np.full(8, 100), np.full(8, 11), clients=4, client_start="auto")
    res = run(timer, fixed)
    assert any("auto: requests of one length" in n for n in res.notes)
    assert sorted(res.per_request["sent_ms"].tolist())[:4] == pytest.approx([0.0] * 4)
    assert res.per_request["sent_ms"].max() > 110.0  # a second request held back by the spread
    for w, c in ((Workload(np.array([100, 90, 100, 80, 100, 95, 99, 100]), np.full(8, 11), clients=4,
                           client_start="auto"), cfg()),
                 (fixed, cfg(mixed=False))):
        together = run(timer, replace(w, client_start="together"), c)
        auto = run(timer, w, c)
        assert auto.per_request["sent_ms"].tolist() == together.per_request["sent_ms"].tolist()
        assert not any("closed loop:" in n for n in auto.notes)


def test_staggered_start_over_one_expected_cycle():
    """``ramp_up_ms=None``: one expected request cycle from the step timer. Four clients on one
    scheduler, isl 100, osl 11, steps of 10 ms + 0.01 ms per prefill token, a 2 ms front end:
    2 + 10 decode steps x 10 + the four prompts' prefill (400 tokens in one step) = 4 ms more on
    an engine that mixes, a whole 14 ms step on one that does not (106 / 116 ms); the clients'
    first requests go out at 0, 1/4, 2/4, 3/4 of it."""
    from infercast.serving.simulate.deploy import expected_cycle_ms

    timer = LinearStepTimer(10.0, per_prefill_token_ms=0.01)
    w = Workload(np.full(8, 100), np.full(8, 11), clients=4, client_start="staggered")
    fe = lambda streams, tokens: 2.0  # noqa: E731
    assert expected_cycle_ms(w, timer, cfg(), units=1, replicas=1, front_end=fe) == pytest.approx(106.0)
    assert expected_cycle_ms(w, timer, cfg(mixed=False), units=1, replicas=1, front_end=fe) == pytest.approx(116.0)
    res = run(timer, w, front_end=fe)
    first = sorted(res.per_request["sent_ms"].tolist())[:4]
    assert first == pytest.approx([0.0, 26.5, 53.0, 79.5])
    assert any("one expected request cycle, 106 ms" in n for n in res.notes)
