"""The serving models on tiny synthetic engines whose step times are known, so the answers can
be computed by hand."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from infercast.errors import InvalidConfigError
from infercast.serving.agg import adp_balance_wait_steps, serve_agg, solve_steady
from infercast.serving.backends import SchedulerParams
from infercast.serving.disagg import solve_disagg
from infercast.serving.sim import DoesNotFitError, simulate


class ConstEngine:
    """Every step costs ``t`` ms, whatever it carries (``tokens_per_step`` output tokens per
    decode step, as with MTP)."""

    def __init__(self, t: float, tokens_per_step: float = 1.0):
        self.t = t
        self.tokens_per_step = tokens_per_step
        self.calls = []

    def step_ms(self, **shape):
        kv = np.asarray(shape.get("dec_kv", 1.0), dtype=float)
        return np.full(kv.shape, self.t)

    def mixed_step_ms(self, ctx_batch, ctx_isl, ctx_prefix, dec_batch, dec_kv):
        self.calls.append((list(np.atleast_1d(ctx_batch)), list(np.atleast_1d(ctx_isl)), dec_batch))
        return self.t

    def decode_scalar(self, batch, kv, pad=0.0):
        return self.t


class TokenEngine(ConstEngine):
    """Step time = a + b x (tokens in the step): prefill tokens and one per decode."""

    def __init__(self, a: float, b: float):
        super().__init__(a)
        self.a, self.b = a, b

    def step_ms(self, **shape):
        kv = np.asarray(shape.get("dec_kv", 1.0), dtype=float)
        return np.full(kv.shape, self.a + self.b * float(shape.get("dec_batch", 0.0)))

    def mixed_step_ms(self, ctx_batch, ctx_isl, ctx_prefix, dec_batch, dec_kv):
        toks = float(np.sum(np.asarray(ctx_batch) * np.asarray(ctx_isl))) + dec_batch
        self.calls.append(toks)
        return self.a + self.b * toks


def params(**kw) -> SchedulerParams:
    base = SchedulerParams(mixed=True, chunked=True, max_num_tokens=8192, max_batch_size=1024, step_overhead_ms=0.0,
                           arrival_delay_ms=0.0, requests_per_client=1.0, kv_reserve_full=True)
    return dataclasses.replace(base, **kw)


def test_one_client_constant_step_exact():
    # one request: a prefill step (first token), then osl-1 decode steps
    eng = ConstEngine(10.0)
    r = simulate(eng, 1, 100, 8, params(), kv_capacity_tokens=1e9, gpus=1, requests_per_client=3)
    assert r.ttft_ms == pytest.approx(10.0)
    assert r.tpot_ms == pytest.approx(10.0)
    assert r.request_latency_ms == pytest.approx(10.0 * 8)
    assert r.steps == 3 * 8
    # tokens/s/GPU: 3 requests x 8 tokens in 3 x 80 ms
    assert r.tokens_per_s_per_gpu == pytest.approx(3 * 8 / 0.240)


def test_arrival_delay_counts_in_ttft_and_delays_the_next_request():
    eng = ConstEngine(10.0)
    r = simulate(eng, 1, 100, 4, params(arrival_delay_ms=3.0), 1e9, 1, requests_per_client=2)
    # every request: 3 ms to reach the engine, then one prefill step
    assert r.ttft_ms == pytest.approx(13.0)
    assert r.request_latency_ms == pytest.approx(13.0 + 3 * 10.0)


def test_token_budget_forces_chunking():
    # a 1000-token prompt with a 256-token budget: 4 chunks (256, 256, 256, 232)
    eng = ConstEngine(5.0)
    r = simulate(eng, 1, 1000, 2, params(max_num_tokens=256), 1e9, 1, requests_per_client=1)
    assert r.ttft_ms == pytest.approx(4 * 5.0)
    chunks = [c[1][0] for c in eng.calls]
    assert chunks == [256.0, 256.0, 256.0, 232.0]


def test_synchronised_start_queues_prefills_behind_the_budget():
    # 4 clients start together, prompts of 100 tokens, budget 200: two prefill steps of 2 prompts
    # (non-mixed engine, so decodes wait). First tokens at 1 and 2 steps: mean TTFT 1.5 steps.
    eng = ConstEngine(10.0)
    r = simulate(eng, 4, 100, 2, params(mixed=False, max_num_tokens=200, min_prefill_chunk=1), 1e9, 1, requests_per_client=1)
    assert r.ttft_ms == pytest.approx(15.0)


def test_step_time_grows_with_tokens():
    eng = TokenEngine(1.0, 0.01)
    r = simulate(eng, 1, 300, 2, params(), 1e9, 1, requests_per_client=1)
    assert r.ttft_ms == pytest.approx(1.0 + 0.01 * 300)  # the prefill step carries 300 tokens
    assert r.tpot_ms == pytest.approx(1.0 + 0.01 * 1)  # one decode token


def test_mtp_tokens_per_step_divides_tpot():
    eng = ConstEngine(10.0, tokens_per_step=2.0)
    r = simulate(eng, 1, 100, 9, params(), 1e9, 1, requests_per_client=1)
    # 8 output tokens after the first, 2 per step: 4 decode steps of 10 ms
    assert r.request_latency_ms == pytest.approx(10.0 + 4 * 10.0)
    assert r.tpot_ms == pytest.approx(40.0 / 8)


def test_kv_capacity_limits_admission():
    # room for exactly 2 requests of 100+10 tokens: 4 clients run in two waves
    eng = ConstEngine(1.0)
    full = simulate(eng, 4, 100, 10, params(), kv_capacity_tokens=220, gpus=1, requests_per_client=1)
    free = simulate(eng, 4, 100, 10, params(), kv_capacity_tokens=1e9, gpus=1, requests_per_client=1)
    assert full.ttft_ms > free.ttft_ms
    with pytest.raises(DoesNotFitError):
        simulate(eng, 1, 100, 10, params(), kv_capacity_tokens=50, gpus=1)


def test_kv_length_ratio_scales_the_capacity_in_requests():
    # room for 4 requests of 100+11 tokens among 8 clients; lengths averaging half the nominal ones
    # hold as many requests as twice the capacity would at nominal lengths: exactly the same answer
    eng = TokenEngine(1.0, 0.01)
    p = params(requests_per_client=3.0)
    half = serve_agg(eng, 8, 100, 11, dataclasses.replace(p, kv_length_ratio=0.5), 444, 1)
    double = serve_agg(eng, 8, 100, 11, p, 888, 1)
    nominal = serve_agg(eng, 8, 100, 11, p, 444, 1)
    assert (half.ttft_ms, half.tpot_ms, half.decode_batch) == (double.ttft_ms, double.tpot_ms, double.decode_batch)
    assert nominal.bound == "kv cache" and half.bound == "clients"
    assert nominal.ttft_ms > half.ttft_ms
    # the longest request is still the nominal one: it must fit on its own
    with pytest.raises(DoesNotFitError):
        serve_agg(eng, 1, 100, 11, dataclasses.replace(p, kv_length_ratio=0.5), 110, 1)
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(InvalidConfigError):
            serve_agg(eng, 1, 100, 11, dataclasses.replace(p, kv_length_ratio=bad), 1e9, 1)


def test_steady_state_one_client_constant_step():
    # fluid model, one client: one step of wait + one prefill step; TPOT = step
    eng = ConstEngine(10.0)
    r = solve_steady(eng, 1, 100, 101, params(), 1e9, 1)
    assert r.tpot_ms == pytest.approx(10.0)
    assert r.ttft_ms == pytest.approx(2 * 10.0)
    assert r.decode_batch == pytest.approx(100 / 102)


def test_serve_agg_mixes_first_wave_and_steady_state():
    eng = ConstEngine(10.0)
    p = params(requests_per_client=4.0)
    steady = solve_steady(eng, 1, 100, 101, p, 1e9, 1).ttft_ms
    first = simulate(eng, 1, 100, 101, p, 1e9, 1, requests_per_client=1).ttft_ms
    r = serve_agg(eng, 1, 100, 101, p, 1e9, 1)
    assert r.ttft_ms == pytest.approx((first + 3 * steady) / 4)
    with pytest.raises(DoesNotFitError):
        serve_agg(eng, 1, 100, 101, p, 100, 1)


def test_disagg_one_client_constant_steps():
    # prefill 10 ms (one prompt per step), decode 2 ms, no transfer: with one client the prefill
    # worker is never busy when it arrives, so TTFT = the prefill (no queue), TPOT = decode step
    pe, de = ConstEngine(10.0), ConstEngine(2.0)
    r = solve_disagg(pe, de, 1, 100, 11, 1, 1, 1, 1, params(), params(), 0.0, 2)
    assert r.tpot_ms == pytest.approx(2.0)
    assert r.ttft_ms == pytest.approx(10.0 + params().arrival_delay_ms)
    assert 0.0 < r.prefill_utilisation < 0.5
    # two clients on one prefill worker: now one can wait behind the other
    r2 = solve_disagg(pe, de, 2, 100, 11, 1, 1, 1, 1, params(), params(), 0.0, 2)
    assert r2.ttft_ms > r.ttft_ms


def test_per_sequence_host_overhead_exact():
    # 10 ms steps, 0.5 ms per step plus 0.25 ms per sequence in the step
    p = params(step_overhead_ms=0.5, seq_overhead_ms=0.25)
    assert p.host_ms(4) == pytest.approx(1.5)
    eng = ConstEngine(10.0)
    # one client: the prefill step carries 1 sequence, each decode step 1 sequence
    r = simulate(eng, 1, 100, 8, p, kv_capacity_tokens=1e9, gpus=1, requests_per_client=1)
    assert r.ttft_ms == pytest.approx(10.75) and r.tpot_ms == pytest.approx(10.75)
    # four synchronised clients, one mixed-free prefill step for all, then 4 decodes per step
    r4 = simulate(eng, 4, 100, 8, p, kv_capacity_tokens=1e9, gpus=1, requests_per_client=1)
    assert r4.ttft_ms == pytest.approx(10.0 + 0.5 + 4 * 0.25) and r4.tpot_ms == pytest.approx(10.0 + 0.5 + 4 * 0.25)
    # steady state, one client: the fluid decode set is d = 100/102 of a sequence, and a share
    # d/100 of the steps also carries the next prompt: host = 0.5 + 0.25 x (d + d/100)
    s = solve_steady(eng, 1, 100, 101, p, 1e9, 1)
    d = 100 / 102
    assert s.tpot_ms == pytest.approx(10.0 + 0.5 + 0.25 * (d + d / 100))
    # disagg decode pool: one client decodes alone
    d = solve_disagg(eng, ConstEngine(2.0), 1, 100, 11, 1, 1, 1, 1, p, p, 0.0, 2)
    assert d.tpot_ms == pytest.approx(2.0 + 0.75)


def test_overlapped_host_time_exact():
    # the host prepares the next step while the GPU runs this one: wall = max(GPU, host) + residual
    p = params(step_overhead_ms=2.0, overlap=True, overlap_residual_ms=0.5)
    assert p.step_ms(10.0, 4) == pytest.approx(10.5)  # GPU-bound: the host time hides
    assert p.step_ms(1.0, 4) == pytest.approx(2.5)  # host-bound
    np.testing.assert_allclose(p.step_ms(np.array([1.0, 3.0]), 1), [2.5, 3.5])
    eng = ConstEngine(10.0)
    r = simulate(eng, 1, 100, 8, p, kv_capacity_tokens=1e9, gpus=1, requests_per_client=1)
    assert r.ttft_ms == pytest.approx(10.5) and r.tpot_ms == pytest.approx(10.5)
    fast = simulate(ConstEngine(1.0), 1, 100, 8, p, kv_capacity_tokens=1e9, gpus=1, requests_per_client=1)
    assert fast.tpot_ms == pytest.approx(2.5)
    s = solve_steady(eng, 1, 100, 101, p, 1e9, 1)
    assert s.tpot_ms == pytest.approx(10.5)
    # without overlap the same host time adds up
    assert params(step_overhead_ms=2.0).step_ms(10.0, 4) == pytest.approx(12.0)


def test_sglang_overlap_off_for_hybrid_linear_attention():
    from types import SimpleNamespace

    from infercast.serving.backends import scheduler_params

    assert scheduler_params("sglang").overlap
    assert scheduler_params("sglang", spec=SimpleNamespace(gdn=None)).overlap
    assert not scheduler_params("sglang", spec=SimpleNamespace(gdn=object())).overlap
    assert not scheduler_params("vllm", spec=SimpleNamespace(gdn=None)).overlap
    assert not scheduler_params("trtllm").overlap


class BatchPrefillEngine(ConstEngine):
    """Prefill steps cost a + b x (prompts in the step); decode steps cost ``t``."""

    def __init__(self, a: float, b: float, t: float = 5.0):
        super().__init__(t)
        self.a, self.b = a, b

    def mixed_step_ms(self, ctx_batch, ctx_isl, ctx_prefix, dec_batch, dec_kv):
        return self.a + self.b * float(np.sum(ctx_batch))


def test_disagg_prefill_batches_what_arrived_under_load():
    pe, de = BatchPrefillEngine(a=40.0, b=10.0), ConstEngine(5.0)
    p = params(max_num_tokens=8192)
    # one client: never more than its own prompt waiting -> batches of one
    one = solve_disagg(pe, de, 1, 1024, 101, 1, 1, 1, 1, p, p, 0.0, 2)
    assert one.prefill_batch == 1
    # 400 clients on one prefill rank: single prompts (50 ms each) cannot keep up; the batch is
    # the prompts that arrive while it runs, k = ceil(lam x (40 + 10 k)), within the budget (8)
    r = solve_disagg(pe, de, 400, 1024, 101, 1, 1, 1, 1, p, p, 0.0, 2)
    k = r.prefill_batch
    assert 1 < k <= 8192 // 1024
    lam = r.arrival_rate_per_s / 1e3  # per ms
    assert abs(k - min(8, math.ceil(lam * (40.0 + 10.0 * k)))) <= 1
    assert r.prefill_utilisation == pytest.approx(lam * (40.0 + 10.0 * k) / k, rel=0.05)
    assert r.prefill_utilisation < 1.0
    # without batching (one prompt per step) the same load queues far longer
    import infercast.serving.disagg as D

    try:
        D.ADAPTIVE_PREFILL_BATCH = False
        single = solve_disagg(pe, de, 400, 1024, 101, 1, 1, 1, 1, p, p, 0.0, 2)
    finally:
        D.ADAPTIVE_PREFILL_BATCH = True
    assert single.prefill_batch == 1 and single.ttft_ms > 2 * r.ttft_ms


class GroupEngine(TokenEngine):
    """Step time = a + b x tokens + g per prefill group in the step (one attention call each), so
    how simultaneously sent requests are grouped shows in the time."""

    def __init__(self, a: float, b: float, g: float):
        super().__init__(a, b)
        self.g = g

    def mixed_step_ms(self, ctx_batch, ctx_isl, ctx_prefix, dec_batch, dec_kv):
        return super().mixed_step_ms(ctx_batch, ctx_isl, ctx_prefix, dec_batch, dec_kv) + self.g * len(np.atleast_1d(ctx_batch))


def test_lockstep_waves_repeat_exactly():
    """Lock-step (prefill-first, no mixing): a wave that the token budget splits over several
    prefill steps completes at one instant; its successors, sent together, are one batch again,
    so every wave costs what the first did: the benchmark's time, steps and per-request metrics
    are the first wave's times the number of waves. Also when prompts are chunked across steps
    (150-token prompts, 200-token budget: each step fills the budget with the next prompt's chunk)."""
    for isl in (100, 150):
        p = params(mixed=False, lockstep=True, max_num_tokens=200, min_prefill_chunk=1)
        one = simulate(GroupEngine(1.0, 0.01, 0.5), 6, isl, 5, p, 1e9, 1, requests_per_client=1)
        four = simulate(GroupEngine(1.0, 0.01, 0.5), 6, isl, 5, p, 1e9, 1, requests_per_client=4)
        assert four.steps == 4 * one.steps
        assert four.ttft_ms == pytest.approx(one.ttft_ms, rel=1e-12)
        assert four.tpot_ms == pytest.approx(one.tpot_ms, rel=1e-12)
        assert four.tokens_per_s_per_gpu == pytest.approx(one.tokens_per_s_per_gpu, rel=1e-12)
    # hand check, 100-token prompts: 3 prefill steps of 2 requests (200 tokens, one group each),
    # then 4 decode steps of 6; first tokens at 1, 2, 3 prefill steps (mean 2); a request's TPOT
    # window holds the prefill steps after its own (2, 1, 0) and the 4 decode steps
    p = params(mixed=False, lockstep=True, max_num_tokens=200, min_prefill_chunk=1)
    one = simulate(GroupEngine(1.0, 0.01, 0.5), 6, 100, 5, p, 1e9, 1, requests_per_client=1)
    pre = 1.0 + 0.01 * 200 + 0.5
    dec = 1.0 + 0.01 * 6
    assert one.ttft_ms == pytest.approx(2 * pre)
    assert one.tpot_ms == pytest.approx((pre * (2 + 1 + 0) / 3 + 4 * dec) / 4)


def test_chunked_prefill_fills_the_budget_with_the_next_prompt():
    """A step that takes whole prompts fills the rest of its token budget with a chunk of the next
    prompt (chunked prefill), also when that prompt is from the same batch of arrivals."""
    eng = TokenEngine(1.0, 0.0)
    simulate(eng, 3, 150, 2, params(max_num_tokens=200, min_prefill_chunk=1), 1e9, 1, requests_per_client=1)
    # step 1: prompt 1 whole (150) + 50 of prompt 2; step 2: one decode (prompt 1), prompt 2's
    # last 100 and 99 of prompt 3; step 3: prompt 3's last 51 + prompt 2's decode
    assert eng.calls == [200.0, 200.0, 52.0]


def test_mtp_draft_tokens_count_against_the_token_budget():
    """With MTP each decoding sequence puts 1 + nextn tokens into a step, so the token budget
    caps the decode batch at budget x out_steps / (out_steps x width + isl)."""
    eng = ConstEngine(10.0)
    eng.decode_width = 2.0
    p = params(max_num_tokens=1000, max_batch_size=10_000, kv_reserve_full=False)
    r = solve_steady(eng, 5000, 100, 101, p, kv_capacity_tokens=1e12, gpus=1)
    assert r.bound == "token budget"
    assert r.decode_batch == pytest.approx(1000 * 100 / (100 * 2.0 + 100))
    eng.decode_width = 1.0
    assert solve_steady(eng, 5000, 100, 101, p, 1e12, 1).decode_batch == pytest.approx(1000 * 100 / (100 + 100))


class CtxEngine(ConstEngine):
    """Step time = a + b x (prefill tokens + decodes), from ``step_ms``'s shape arguments."""

    def __init__(self, a: float, b: float):
        super().__init__(a)
        self.a, self.b = a, b

    def step_ms(self, **shape):
        toks = float(shape.get("ctx_batch", 0.0)) * float(shape.get("ctx_isl", 0.0)) + float(shape.get("dec_batch", 0.0))
        kv = np.asarray(shape.get("dec_kv", 1.0), dtype=float)
        return np.full(kv.shape, self.a + self.b * toks)


def test_steady_state_prefill_step_carries_the_prompts_that_arrived_with_it():
    # C clients, one-chunk prompts (budget 8192 >> isl): fluid decode set d = C*out/(out + 2),
    # lam = d/out prompts per step; the average step carries lam prompt tokens x isl, the step
    # of a request's own prefill 1 + lam prompts (Poisson arrivals), so
    # TTFT = one average step of wait + a + b*((1 + lam)*isl + d)
    a, b, isl, osl, C = 2.0, 0.001, 1000, 101, 20
    eng = CtxEngine(a, b)
    r = solve_steady(eng, C, isl, osl, params(), 1e9, 1)
    out = osl - 1
    d = C * out / (out + 2)
    lam = d / out
    t_avg = (1 - lam) * (a + b * d) + lam * (a + b * (isl + d))
    assert r.tpot_ms == pytest.approx(t_avg)
    assert r.ttft_ms == pytest.approx(t_avg + a + b * ((1 + lam) * isl + d))
    # a budget that leaves room for little more than the request's own prompt caps the step
    budget = int(isl + d) + 1
    fits = (budget - d) / isl
    assert 1.0 < fits < 1.0 + lam
    r1 = solve_steady(eng, C, isl, osl, params(max_num_tokens=budget), 1e9, 1)
    assert r1.ttft_ms == pytest.approx(r1.tpot_ms + a + b * (fits * isl + d), rel=1e-12)


def test_steady_state_poll_interval_by_hand():
    """A scheduler that polls its queue every I decode steps (SGLang --scheduler-recv-interval,
    prefill-first): a request waits I/2 steps on average, and the k = lam x I requests that arrived
    since the last poll are prefilled together, as many per step as the budget holds; the request's
    first token comes half-way through that batch: (k/r + 1)/2 steps of r prompts."""
    from infercast.serving.agg import recv_poll_steps

    assert recv_poll_steps(params()) == 0.0 and recv_poll_steps(params(recv_interval=10)) == 4.0
    a, b, isl, osl, C, interval = 2.0, 0.001, 1000, 101, 64, 30
    eng = CtxEngine(a, b)
    p = params(mixed=False, recv_interval=interval)
    r = solve_steady(eng, C, isl, osl, p, 1e9, 1)
    out = osl - 1
    d = C * out / (out + interval / 2 + 1)  # Little: I/2 steps of wait + one of prefill
    lam = d / out
    t_avg = (a + b * d) + lam * (a + b * isl)  # decode step + the prefill steps between them
    k = lam * interval
    per_step = 8192 // isl
    assert k > per_step  # the gathered prompts need more than one step
    own = (k / per_step + 1) / 2 * (a + b * per_step * isl)
    assert r.decode_batch == pytest.approx(d)
    assert r.tpot_ms == pytest.approx(t_avg)
    assert r.ttft_ms == pytest.approx(interval / 2 * t_avg + own)
    # polling every step is the plain steady state: one step of wait, the request's own prefill
    r1 = solve_steady(eng, C, isl, osl, params(mixed=False), 1e9, 1)
    d1 = C * out / (out + 2)
    lam1 = d1 / out
    t1 = (a + b * d1) + lam1 * (a + b * isl)
    assert r1.ttft_ms == pytest.approx(t1 + a + b * isl)
    assert r1.ttft_ms < r.ttft_ms
    # a rare arrival is prefilled alone: k = max(1, lam x I)
    r2 = solve_steady(eng, 1, isl, 1001, p, 1e9, 1)
    d2 = 1000 / (1000 + interval / 2 + 1)
    t2 = (a + b * d2) + d2 / 1000 * (a + b * isl)
    assert r2.ttft_ms == pytest.approx(interval / 2 * t2 + a + b * isl)
    assert r2.ttft_dist.mean() == pytest.approx(r2.ttft_ms)


# ----------------------------------------------------------------------------------------------
# percentiles (p50 / p90 / p99) from per-request distributions
# ----------------------------------------------------------------------------------------------


def test_distribution_helpers_exact():
    from infercast.serving.result import (
        Distribution,
        binomial_share,
        exponential_tail,
        mixture,
        uniform,
    )

    d = Distribution(np.array([3.0, 1.0, 2.0]), np.array([1.0, 1.0, 2.0]))
    assert d.mean() == pytest.approx((3 + 1 + 4) / 4)
    assert d.percentile(25) == 1.0 and d.percentile(50) == 2.0 and d.percentile(75) == 2.0 and d.percentile(99) == 3.0
    b = binomial_share(2, 0.5)  # 0, 1/2, 1 with probabilities 1/4, 1/2, 1/4
    np.testing.assert_allclose(b.values, [0.0, 0.5, 1.0])
    np.testing.assert_allclose(b.weights / b.weights.sum(), [0.25, 0.5, 0.25])
    assert binomial_share(50, 0.3).mean() == pytest.approx(0.3)
    assert binomial_share(10, 0.0).values.tolist() == [0.0] and binomial_share(10, 1.0).values.tolist() == [1.0]
    u = uniform(10.0, 20.0, n=4)  # quantile midpoints
    np.testing.assert_allclose(u.values, [11.25, 13.75, 16.25, 18.75])
    e = exponential_tail(6.0, 0.5)
    assert e.mean() == pytest.approx(6.0) and e.percentile(40) == 0.0 and e.percentile(90) > 6.0
    m = mixture((Distribution.point(1.0), 0.25), (Distribution.point(5.0), 0.75))
    assert m.mean() == pytest.approx(4.0) and m.percentile(20) == 1.0 and m.percentile(30) == 5.0
    with pytest.raises(ValueError):
        Distribution(np.array([1.0]), np.array([-1.0]))


def test_steady_state_percentiles_follow_its_assumptions():
    # constant 10 ms steps, one client: TTFT = a uniform wait in [0, 2 steps] + one prefill step
    # (mean 2 steps); every step costs the same, so TPOT has no spread
    r = solve_steady(ConstEngine(10.0), 1, 100, 101, params(), 1e9, 1)
    assert r.tpot_p50_ms == r.tpot_p90_ms == r.tpot_p99_ms == pytest.approx(10.0)
    assert r.ttft_dist.mean() == pytest.approx(r.ttft_ms)
    assert r.ttft_p50_ms == pytest.approx(20.0, abs=0.1)
    assert r.ttft_p90_ms == pytest.approx(10.0 + 0.9 * 20.0, abs=0.1)
    assert r.ttft_p99_ms == pytest.approx(10.0 + 0.99 * 20.0, abs=0.1)


def test_steady_state_tpot_spread_is_the_binomial_count_of_prefill_steps():
    # step = 1 + 0.01 x tokens: decode-only steps are fast, steps with a 300-token prefill slow;
    # a request's TPOT is the mean over its osl-1 steps, so it spreads around the mean
    eng = CtxEngine(1.0, 0.01)
    r = solve_steady(eng, 8, 300, 41, params(), 1e9, 1)
    assert r.tpot_dist.mean() == pytest.approx(r.tpot_ms, rel=1e-9)
    assert r.tpot_p50_ms <= r.tpot_p90_ms < r.tpot_p99_ms
    fast = 1.0 + 0.01 * r.decode_batch  # a decode-only step; a prefill step adds 300 tokens
    assert fast < r.tpot_p50_ms and r.tpot_p99_ms < fast + 0.01 * 300


class TokenCtxEngine(CtxEngine):
    """Step time = a + b x tokens in the step, the same through ``step_ms`` (steady state) and
    ``mixed_step_ms`` (simulation)."""

    def mixed_step_ms(self, ctx_batch, ctx_isl, ctx_prefix, dec_batch, dec_kv):
        return self.a + self.b * (float(np.sum(np.asarray(ctx_batch) * np.asarray(ctx_isl))) + float(np.sum(dec_batch)))


def test_serve_agg_percentiles_mix_the_first_wave_like_the_mean():
    # 16 clients, 500-token prompts, a 1000-token budget: the first wave's prompts queue two per
    # step; it is a quarter of the requests (4 per client)
    eng = TokenCtxEngine(1.0, 0.01)
    p = params(requests_per_client=4.0, max_num_tokens=1000)
    r = serve_agg(eng, 16, 500, 50, p, 1e9, 1)
    assert r.ttft_dist.mean() == pytest.approx(r.ttft_ms, rel=1e-9)
    assert r.tpot_dist.mean() == pytest.approx(r.tpot_ms, rel=1e-9)
    first = simulate(eng, 16, 500, 50, p, 1e9, 1, requests_per_client=1)
    assert len(set(first.ttft_dist.values.tolist())) > 1
    # the slowest 1% of requests are the first wave's last prompts; the median is a steady one
    assert r.ttft_p99_ms == pytest.approx(first.ttft_dist.values.max())
    assert r.ttft_p50_ms < first.ttft_ms
    assert r.ttft_p50_ms <= r.ttft_p90_ms <= r.ttft_p99_ms
    lock = serve_agg(eng, 16, 500, 50, dataclasses.replace(p, lockstep=True, mixed=False), 1e9, 1)
    assert lock.ttft_dist.mean() == pytest.approx(lock.ttft_ms, rel=1e-9)
    d = lock.to_dict()
    assert "ttft_p99_ms" in d and "ttft_dist" not in d and "tpot_dist" not in d


def test_disagg_percentiles():
    pe, de = ConstEngine(10.0), ConstEngine(2.0)
    r = solve_disagg(pe, de, 8, 100, 11, 1, 1, 1, 1, params(), params(), 0.0, 2)
    assert r.tpot_p50_ms == r.tpot_p99_ms == pytest.approx(r.tpot_ms)
    assert r.ttft_dist.mean() == pytest.approx(r.ttft_ms, rel=1e-6)
    assert r.ttft_p50_ms <= r.ttft_p90_ms <= r.ttft_p99_ms
    # a steady-state request never finishes its prefill faster than one batch
    assert r.ttft_dist.values.min() >= 10.0 - 1e-9


# ----------------------------------------------------------------------------------------------
# CUDA-graph padding of decode batches
# ----------------------------------------------------------------------------------------------


def test_graph_pad_to_the_next_captured_size():
    p = params(graph_batch_sizes=(1, 2, 4, 8))
    assert p.graph_pad(3) == 1.0 and p.graph_pad(2.5) == 1.5 and p.graph_pad(8) == 0.0
    assert p.graph_pad(9) == 0.0 and p.graph_pad(0) == 0.0  # beyond the largest graph: eager, unpadded
    assert params().graph_pad(3) == 0.0  # no captured sizes, no padding


def test_backend_graph_sizes_and_their_sources():
    from infercast.serving.backends import CUDA_GRAPH_SIZES, scheduler_params

    v = CUDA_GRAPH_SIZES["vllm"]
    assert v[:5] == (1, 2, 4, 8, 16) and 248 in v and 256 in v and 264 not in v and 272 in v and v[-1] == 512
    s = CUDA_GRAPH_SIZES["sglang"]
    assert s[:5] == (1, 2, 4, 8, 16) and s[-1] == 160 and 12 not in s
    assert CUDA_GRAPH_SIZES["trtllm"] == ()  # enable_padding is off by default

    class Gpu:
        def __init__(self, gb):
            self.mem_capacity = gb * 2**30

    class Sys:
        def __init__(self, gb, name="gpu"):
            self.gpu = Gpu(gb)
            self.name = name

    assert scheduler_params("sglang", Sys(80)).graph_batch_sizes[-1] == 160
    assert scheduler_params("sglang", Sys(141)).graph_batch_sizes[-1] == 256
    assert scheduler_params("trtllm", Sys(141)).graph_pad(3) == 0.0


def test_token_budgets_follow_each_engines_memory_rule():
    from infercast.serving.backends import scheduler_params

    class Sys:
        def __init__(self, gib, name="gpu"):
            self.gpu = type("Gpu", (), {"mem_capacity": gib * 2**30})()
            self.name = name

    # SGLang chunked_prefill_size: 2048 below 35 GiB, 8192 below 160 GiB, 16384 above
    assert [scheduler_params("sglang", Sys(g)).max_num_tokens for g in (24, 80, 141, 180)] == [2048, 8192, 8192, 16384]
    # vLLM: 8192 tokens / 1024 sequences on >= 70 GiB parts that are not A100s, else 2048 / 256
    big = scheduler_params("vllm", Sys(80, "h100_sxm"))
    assert (big.max_num_tokens, big.max_batch_size) == (8192, 1024)
    for small in (Sys(80, "a100_sxm"), Sys(48, "l40s")):
        p = scheduler_params("vllm", small)
        assert (p.max_num_tokens, p.max_batch_size) == (2048, 256)
    assert scheduler_params("trtllm", Sys(24)).max_num_tokens == 8192  # TensorRT-LLM: one default


class PadEngine(ConstEngine):
    """Decode step = a + b x rows (padded) + c x real sequences (their attention)."""

    def __init__(self, a: float, b: float, c: float):
        super().__init__(a)
        self.a, self.b, self.c = a, b, c

    def step_ms(self, **shape):
        kv = np.asarray(shape.get("dec_kv", 1.0), dtype=float)
        d = float(shape.get("dec_batch", 0.0))
        return np.full(kv.shape, self.a + self.b * (d + float(shape.get("dec_pad", 0.0))) + self.c * d)

    def decode_scalar(self, batch, kv, pad=0.0):
        return self.a + self.b * (batch + pad) + self.c * batch


def test_decode_steps_run_padded_in_every_serving_model():
    eng = PadEngine(1.0, 0.1, 0.01)
    p = params(graph_batch_sizes=(1, 2, 4, 8), mixed=False, lockstep=True)
    # lock-step simulation: 3 clients decode together in the graph of 4
    r = simulate(eng, 3, 100, 11, p, 1e9, 1, requests_per_client=1)
    assert r.tpot_ms == pytest.approx(1.0 + 0.1 * 4 + 0.01 * 3)
    # disaggregated decode pool: 3 clients on one decode rank (constant prefill, no transfer)
    pe = ConstEngine(0.001)
    pd = params(graph_batch_sizes=(1, 2, 4, 8))
    rd = solve_disagg(pe, eng, 3, 100, 1001, 1, 1, 1, 1, params(), pd, 0.0, 2)
    d = rd.decode_batch
    assert rd.tpot_ms == pytest.approx(1.0 + 0.1 * (d + pd.graph_pad(d)) + 0.01 * d)
    assert pd.graph_pad(d) > 0
    # steady state: the decode-only steps (a share 1 - lam of them, lam = d / 1000 prompts per
    # step) run padded to the next graph; steps that carry a prefill chunk are not padded
    rs = solve_steady(eng, 3, 100, 1001, pd, 1e9, 1)
    r0 = solve_steady(eng, 3, 100, 1001, params(), 1e9, 1)
    d = rs.decode_batch
    assert d == pytest.approx(r0.decode_batch)
    assert rs.tpot_ms - r0.tpot_ms == pytest.approx((1.0 - d / 1000) * 0.1 * pd.graph_pad(d))


# ----------------------------------------------------------------------------------------------
# properties of the per-request distributions (hypothesis)
# ----------------------------------------------------------------------------------------------
from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_vals = st.lists(st.floats(0.0, 1e6, allow_nan=False), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(_vals, st.data())
def test_percentiles_are_monotone_and_bounded(values, data):
    from infercast.serving.result import Distribution

    w = data.draw(st.lists(st.floats(0.01, 100.0), min_size=len(values), max_size=len(values)))
    d = Distribution(np.array(values), np.array(w))
    qs = [d.percentile(q) for q in (1, 25, 50, 75, 90, 99, 100)]
    assert qs == sorted(qs) and min(values) <= qs[0] and qs[-1] == max(values)
    # the definition, by brute force: the smallest value with at least q % of the weight at or
    # below it; percentiles() (one sort for several q) gives the same
    total = sum(w)
    for q, got in zip((1, 25, 50, 75, 90, 99, 100), d.percentiles((1, 25, 50, 75, 90, 99, 100))):
        assert got in values
        at_or_below = sum(wi for x, wi in zip(values, w) if x <= got)
        below = sum(wi for x, wi in zip(values, w) if x < got)
        assert at_or_below >= q / 100 * total * (1 - 1e-9)  # got qualifies ...
        assert below < q / 100 * total * (1 + 1e-9)  # ... and no smaller value does
    assert min(values) - 1e-6 <= d.mean() <= max(values) + 1e-6


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5000), st.floats(0.0, 1.0), st.floats(0.0, 1e3), st.floats(0.0, 0.99))
@example(4, 0.001, 0.0, 0.0)  # found by hypothesis: a 12-sigma window of 4 trials dropped 3e-9 of the mean
def test_spread_helpers_keep_their_means(n, p, mean, p_zero):
    from infercast.serving.result import (
        binomial_share,
        exponential_tail,
        mixture,
        uniform,
    )

    assert binomial_share(n, p).mean() == pytest.approx(p, abs=1e-9)
    assert exponential_tail(mean, p_zero).mean() == pytest.approx(mean, rel=1e-9, abs=1e-12)
    u = uniform(mean, 2 * mean + 1)
    assert u.mean() == pytest.approx(1.5 * mean + 0.5, rel=1e-9)
    m = mixture((u, 0.3), (binomial_share(n, p), 0.7))
    assert m.mean() == pytest.approx(0.3 * u.mean() + 0.7 * p, rel=1e-9, abs=1e-9)


def test_closed_loop_wait_at_the_prefill_pool():
    """Schweitzer's mean value analysis of the closed loop: a lone client never waits; with no
    think time every client is in the queue, so a prompt waits for the other C - 1 (the bottleneck
    bound, whatever the service's variability); in between, deterministic service halves the
    queue a prompt finds; with a long think time the wait vanishes."""
    from infercast.serving.disagg import _closed_loop_wait

    assert _closed_loop_wait(1, 10.0, 0.0, 100.0) == 0.0
    for det in (1.0, 0.5):
        assert _closed_loop_wait(16, 2.0, 0.0, 0.0, det=det) == pytest.approx(15 * 2.0, rel=1e-6)
    # 16 clients, 2 ms per prompt, 40 ms of think time: below saturation (16 x 2 < 40 + 2)
    exp_, det_ = _closed_loop_wait(16, 2.0, 0.0, 40.0, det=1.0), _closed_loop_wait(16, 2.0, 0.0, 40.0, det=0.5)
    assert 0.0 < det_ < exp_ < 15 * 2.0
    # Schweitzer's fixed point r = s (1 + det Q (C-1)/C), Q = C r / (r + delay + Z), solved exactly
    for det, w, delay in ((1.0, exp_, 0.0), (0.5, det_, 0.0), (0.5, _closed_loop_wait(16, 2.0, 3.0, 40.0), 3.0)):
        r = w + 2.0
        q = 16 * r / (r + delay + 40.0)
        assert r == pytest.approx(2.0 * (1 + det * q * 15 / 16), rel=1e-12)
    assert _closed_loop_wait(16, 2.0, 0.0, 1e7) < 1e-3
    # more clients, more wait; never more than the whole population ahead
    waits = [_closed_loop_wait(c, 2.0, 1.0, 50.0) for c in (2, 8, 32, 128)]
    assert waits == sorted(waits) and waits[-1] <= 127 * 2.0


# ---- attention-DP balance hold ------------------------------------------------------------------


def _hold_monte_carlo(ranks: int, period: float, timeout: float, n: int = 200_000, seed: int = 1) -> float:
    """The hold of adp_balance_wait_steps, played: the other ranks' next arrivals uniform on
    [0, period]; the hold ends when all have one or at the timeout; mean wait per request."""
    rng = np.random.default_rng(seed)
    u = rng.random((n, ranks - 1)) * period
    end = np.minimum(timeout, u.max(axis=1))
    waits = end + np.clip(end[:, None] - u, 0.0, None).sum(axis=1)
    held = 1 + (u <= end[:, None]).sum(axis=1)
    return float(waits.sum() / held.sum())


@pytest.mark.parametrize("ranks,period,timeout", [(2, 50.0, 60.0), (8, 40.0, 60.0), (8, 150.0, 60.0), (4, 100.0, 30.0),
                                                  (16, 80.0, 60.0)])
def test_adp_hold_matches_its_model_played_out(ranks, period, timeout):
    exact = adp_balance_wait_steps(ranks, 1.0 / period, timeout)
    assert exact == pytest.approx(_hold_monte_carlo(ranks, period, timeout), rel=0.01)


def test_adp_hold_limits():
    assert adp_balance_wait_steps(1, 0.1, 60) == 0.0  # one rank: nothing to wait for
    assert adp_balance_wait_steps(8, 0.1, 0) == 0.0  # hold off
    assert adp_balance_wait_steps(8, 0.0, 60) == 0.0  # no arrivals
    # timeout beyond the arrival period: the hold always ends when the last rank receives one
    assert adp_balance_wait_steps(8, 1 / 40, 60) == pytest.approx(40 * 7 / 16)
    # a timeout far below the period: a hold holds one request, for the whole timeout
    assert adp_balance_wait_steps(8, 1e-6, 60) == pytest.approx(60, rel=1e-3)


def test_adp_hold_adds_its_steps_to_ttft_only():
    eng = ConstEngine(10.0)
    p = params(adp_balance_timeout_steps=60)
    one = solve_steady(eng, 16, 100, 1001, p, 1e9, 1, ranks=1)
    eight = solve_steady(eng, 16, 100, 1001, p, 1e9, 1, ranks=8)
    assert one.ttft_ms == pytest.approx(solve_steady(eng, 16, 100, 1001, params(), 1e9, 1).ttft_ms)
    lam = eight.decode_batch / 1000
    assert eight.ttft_ms - one.ttft_ms == pytest.approx(10.0 * adp_balance_wait_steps(8, lam, 60), rel=1e-3)
    assert eight.tpot_ms == pytest.approx(one.tpot_ms)
    assert eight.ttft_dist.mean() == pytest.approx(eight.ttft_ms)  # the hold's spread keeps the mean
    assert eight.ttft_p99_ms > one.ttft_p99_ms
    assert eight.balance_hold_ms == pytest.approx(eight.ttft_ms - one.ttft_ms)
    # one client per rank: the rank a request arrives at has no decodes, so nothing is held
    assert solve_steady(eng, 1, 100, 1001, p, 1e9, 1, ranks=8).balance_hold_ms == 0.0
    # held requests are not decoding (Little's law): fewer decodes than without the hold
    assert eight.decode_batch < one.decode_batch
    # serve_agg passes the ranks through to the steady state; the first wave starts every rank
    # together and holds nothing
    p4 = dataclasses.replace(p, requests_per_client=4.0)
    gap = serve_agg(eng, 16, 100, 1001, p4, 1e9, 1, ranks=8).ttft_ms - serve_agg(eng, 16, 100, 1001, p4, 1e9, 1).ttft_ms
    assert gap == pytest.approx(3 / 4 * (eight.ttft_ms - one.ttft_ms))


@pytest.mark.parametrize("ranks,period,timeout", [(8, 40.0, 60.0), (8, 150.0, 60.0), (2, 50.0, 20.0)])
def test_adp_hold_spread_matches_its_model_played_out(ranks, period, timeout):
    from infercast.serving.agg import adp_balance_wait

    d = adp_balance_wait(ranks, 1.0 / period, timeout)
    assert d.mean() == pytest.approx(adp_balance_wait_steps(ranks, 1.0 / period, timeout))
    rng = np.random.default_rng(2)
    u = rng.random((100_000, ranks - 1)) * period
    end = np.minimum(timeout, u.max(axis=1))
    held = u <= end[:, None]
    waits = np.concatenate([end, np.broadcast_to(end[:, None], u.shape)[held] - u[held]])
    for q in (50, 90, 99):
        assert d.percentile(q) == pytest.approx(np.percentile(waits, q), rel=0.03, abs=0.02 * min(period, timeout))


def test_distribution_plus_adds_independent_draws():
    from infercast.serving.result import Distribution, uniform

    s = uniform(0.0, 1.0).plus(uniform(0.0, 1.0))  # triangular on [0, 2]
    assert s.mean() == pytest.approx(1.0)
    assert s.percentile(50) == pytest.approx(1.0, abs=0.01)
    assert s.percentile(90) == pytest.approx(2.0 - math.sqrt(0.2), abs=0.01)
    assert Distribution.point(3.0).plus(Distribution.point(4.0)).percentile(99) == pytest.approx(7.0)


def test_unchunked_prompt_waits_until_the_decodes_leave_room():
    # 2 clients, 100-token prompts, budget 100, 10 ms steps. The first prompt fills step 1. With
    # chunked prefill the second runs 99 + 1 tokens beside the first's decodes (first token at
    # 30 ms); without, it waits for the first request's 2 decode steps to finish (30 ms) and takes
    # step 4 (first token at 40 ms).
    eng = ConstEngine(10.0)
    kw = {"max_num_tokens": 100, "min_prefill_chunk": 1}
    chunked = simulate(eng, 2, 100, 3, params(**kw), 1e9, 1, requests_per_client=1)
    whole = simulate(eng, 2, 100, 3, params(chunked=False, **kw), 1e9, 1, requests_per_client=1)
    assert chunked.ttft_ms == pytest.approx((10.0 + 30.0) / 2)
    assert whole.ttft_ms == pytest.approx((10.0 + 40.0) / 2)
    assert whole.tpot_ms == pytest.approx(10.0)
    # the chunking floor does not let a whole prompt overflow the budget
    floored = simulate(eng, 2, 100, 3, params(chunked=False, max_num_tokens=100, min_prefill_chunk=256), 1e9, 1,
                       requests_per_client=1)
    assert floored.ttft_ms == pytest.approx(whole.ttft_ms)


def test_unchunked_prompt_longer_than_the_budget_is_refused():
    eng = ConstEngine(10.0)
    p = params(chunked=False, max_num_tokens=512)
    for call in (lambda: simulate(eng, 4, 1000, 10, p, 1e9, 1),
                 lambda: solve_steady(eng, 4, 1000, 10, p, 1e9, 1),
                 lambda: serve_agg(eng, 4, 1000, 10, p, 1e9, 1),
                 lambda: solve_disagg(eng, eng, 4, 1000, 10, 1, 1, 1, 1, p, params(), 0.0, 2)):
        with pytest.raises(InvalidConfigError, match="chunked prefill"):
            call()
    # chunked, the same prompt is served
    assert serve_agg(eng, 4, 1000, 10, params(max_num_tokens=512), 1e9, 1).ttft_ms > 0


def test_steady_state_unchunked_caps_the_decodes_beside_a_whole_prompt():
    # budget 1050, prompts of 1000: chunked, ~95 decodes share steps with chunks of the next
    # prompts (2 chunks each); whole prompts fit only beside at most 50 decodes
    eng = ConstEngine(10.0)
    chunked = solve_steady(eng, 100, 1000, 101, params(max_num_tokens=1050), 1e9, 1)
    whole = solve_steady(eng, 100, 1000, 101, params(max_num_tokens=1050, chunked=False), 1e9, 1)
    assert chunked.prefill_chunks == 2
    assert chunked.decode_batch == pytest.approx(1050 * 100 / (100 + 1000))
    assert whole.prefill_chunks == 1
    assert whole.decode_batch == pytest.approx(50.0)
    assert whole.bound == "token budget"


def test_steady_state_unchunked_prompt_filling_the_budget_runs_alone():
    # a prompt as long as the budget leaves no room for a decode beside it: the engine can only
    # run it in a step of its own, which is the non-mixed model
    eng = TokenEngine(2.0, 0.01)
    p = params(max_num_tokens=100, chunked=False)
    got = solve_steady(eng, 4, 100, 11, p, 1e9, 1)
    want = solve_steady(eng, 4, 100, 11, dataclasses.replace(p, mixed=False), 1e9, 1)
    assert got.tpot_ms == pytest.approx(want.tpot_ms)
    assert got.ttft_ms == pytest.approx(want.ttft_ms)
    assert got.decode_batch > 0


def test_simulation_that_runs_out_of_events_raises_instead_of_reporting_a_part():
    eng = ConstEngine(10.0)
    # 4 clients x 3 requests in waves of one (budget 100, prompts of 100): far more than 5 events
    p = params(max_num_tokens=100, chunked=False, requests_per_client=3.0)
    with pytest.raises(InvalidConfigError, match="did not finish"):
        simulate(eng, 4, 100, 3, p, 1e9, 1, max_events=5)
    assert simulate(eng, 4, 100, 3, p, 1e9, 1).ttft_ms > 0


def test_one_output_token_has_no_decode_phase():
    # osl 1: the prefill step's token completes the request. Clients of one wave share the step
    # (budget 8192 holds both prompts), every wave alike: TTFT = one 10 ms step, TPOT 0.
    eng = ConstEngine(10.0)
    r = serve_agg(eng, 2, 100, 1, params(requests_per_client=3.0), 1e9, 1)
    assert r.ttft_ms == pytest.approx(10.0)
    assert r.tpot_ms == 0.0
    assert r.request_latency_ms == pytest.approx(10.0)
    assert r.decode_batch == 0.0
    assert r.tokens_per_s_per_gpu == pytest.approx(2 / 0.010)
    # disaggregated: the prefill worker's token completes it; nothing moves to the decode pool
    pe, de = ConstEngine(10.0), ConstEngine(2.0)
    d = solve_disagg(pe, de, 1, 100, 1, 1, 1, 1, 1, params(), params(), 5.0, 2)
    assert d.tpot_ms == 0.0 and d.kv_transfer_ms == 0.0 and d.decode_batch == 0.0
    assert d.request_latency_ms == pytest.approx(d.ttft_ms)
    assert d.ttft_ms == pytest.approx(10.0)
    two = solve_disagg(pe, de, 1, 100, 2, 1, 1, 1, 1, params(), params(), 5.0, 2)
    assert two.tpot_ms == pytest.approx(2.0 + 5.0)  # one decode step behind the transfer


def test_front_end_time_grows_with_the_open_streams():
    # 3 ms per request + 0.5 ms per open stream: 4 clients on a replica of 2 attention-DP ranks
    # (8 streams) see 3 + 0.5 x 8 = 7 ms, exactly as a flat 7 ms front end
    eng = ConstEngine(10.0)
    p = params(arrival_delay_ms=3.0, front_end_per_stream_ms=0.5, requests_per_client=4.0)
    assert p.front_end_ms(8) == 7.0 and p.for_streams(8) == params(arrival_delay_ms=7.0, requests_per_client=4.0)
    flat = params(arrival_delay_ms=7.0, requests_per_client=4.0)
    got, want = serve_agg(eng, 4, 100, 11, p, 1e9, 1, ranks=2), serve_agg(eng, 4, 100, 11, flat, 1e9, 1, ranks=2)
    assert got.ttft_ms == pytest.approx(want.ttft_ms) and got.tpot_ms == pytest.approx(want.tpot_ms)
    assert got.ttft_ms > serve_agg(eng, 4, 100, 11, params(arrival_delay_ms=3.0, requests_per_client=4.0), 1e9, 1,
                                   ranks=2).ttft_ms
    # disaggregated: the router, not the engine's API server, fronts the deployment: the base only
    pe, de = ConstEngine(10.0), ConstEngine(2.0)
    a = solve_disagg(pe, de, 6, 100, 11, 1, 1, 1, 1, params(arrival_delay_ms=1.0, front_end_per_stream_ms=1.0), params(), 0.0, 2)
    b = solve_disagg(pe, de, 6, 100, 11, 1, 1, 1, 1, params(arrival_delay_ms=1.0), params(), 0.0, 2)
    assert a.ttft_ms == pytest.approx(b.ttft_ms)


def test_front_end_time_grows_with_the_prompt():
    # 3 ms per request + 0.5 ms per open stream + 0.02 ms per prompt token: 4 clients of 100-token
    # prompts on 2 attention-DP ranks (8 streams) see 3 + 4 + 2 = 9 ms, exactly as a flat 9 ms front
    # end; the prompt's part is folded with the streams' and then gone from the parameters
    eng = ConstEngine(10.0)
    p = params(arrival_delay_ms=3.0, front_end_per_stream_ms=0.5, front_end_per_prompt_token_ms=0.02,
               requests_per_client=4.0)
    assert p.front_end_ms(8) == 7.0 and p.front_end_ms(8, 100) == pytest.approx(9.0)
    assert p.for_streams(8, 100) == params(arrival_delay_ms=p.front_end_ms(8, 100), requests_per_client=4.0)
    only_tokens = params(arrival_delay_ms=3.0, front_end_per_prompt_token_ms=0.02)
    assert only_tokens.for_streams(8, 100).arrival_delay_ms == pytest.approx(5.0)  # no per-stream term: still folded
    flat = params(arrival_delay_ms=p.front_end_ms(8, 100), requests_per_client=4.0)
    got, want = serve_agg(eng, 4, 100, 11, p, 1e9, 1, ranks=2), serve_agg(eng, 4, 100, 11, flat, 1e9, 1, ranks=2)
    assert got.ttft_ms == pytest.approx(want.ttft_ms) and got.tpot_ms == pytest.approx(want.tpot_ms)
    assert got.ttft_parts["front_end"] == pytest.approx(9.0)
    # a longer prompt costs more front end, one per-token share per token
    longer = serve_agg(eng, 4, 200, 11, p, 1e9, 1, ranks=2)
    assert longer.ttft_parts["front_end"] == pytest.approx(11.0)
    # disaggregated: the router tokenises; the engine's per-token term does not apply
    pe, de = ConstEngine(10.0), ConstEngine(2.0)
    a = solve_disagg(pe, de, 6, 100, 11, 1, 1, 1, 1, params(arrival_delay_ms=1.0, front_end_per_prompt_token_ms=1.0),
                     params(), 0.0, 2)
    b = solve_disagg(pe, de, 6, 100, 11, 1, 1, 1, 1, params(arrival_delay_ms=1.0), params(), 0.0, 2)
    assert a.ttft_ms == pytest.approx(b.ttft_ms)


def test_vllm_front_end_defaults():
    from infercast.serving.backends import (
        TRTLLM_FRONT_END_PER_STREAM_MS,
        TRTLLM_POSTPROCESS_FRONT_END_MS,
        VLLM_FRONT_END_MS,
        VLLM_FRONT_END_PER_PROMPT_TOKEN_MS,
        VLLM_FRONT_END_PER_STREAM_MS,
        scheduler_params,
    )

    v = scheduler_params("vllm")
    assert (v.arrival_delay_ms, v.front_end_per_stream_ms) == (VLLM_FRONT_END_MS, VLLM_FRONT_END_PER_STREAM_MS) == (10.0, 0.7)
    assert v.front_end_per_prompt_token_ms == VLLM_FRONT_END_PER_PROMPT_TOKEN_MS == 0.003
    assert v.front_end_ms(100) == pytest.approx(80.0)
    assert v.front_end_ms(100, 8192) == pytest.approx(80.0 + 24.576)  # 10 + 0.7 x 100 + 0.003 x 8192
    # TensorRT-LLM: 0.6 ms per open stream from the API server's own loop; none when post-processing
    # workers take that work (and the base drops to their 25 ms)
    t = scheduler_params("trtllm")
    assert (t.arrival_delay_ms, t.front_end_per_stream_ms) == (100.0, TRTLLM_FRONT_END_PER_STREAM_MS) == (100.0, 0.6)
    assert t.front_end_ms(50) == pytest.approx(130.0)
    w = scheduler_params("trtllm", postprocess_workers=2)
    assert (w.arrival_delay_ms, w.front_end_per_stream_ms) == (TRTLLM_POSTPROCESS_FRONT_END_MS, 0.0) == (25.0, 0.0)
    from infercast.serving.backends import SGLANG_FRONT_END_MS, SGLANG_FRONT_END_PER_STREAM_MS

    sg = scheduler_params("sglang")
    assert (sg.arrival_delay_ms, sg.front_end_per_stream_ms) == (SGLANG_FRONT_END_MS, SGLANG_FRONT_END_PER_STREAM_MS) == (120.0, 1.5)
    assert sg.front_end_ms(64) == pytest.approx(216.0)


def test_batch_wait_steps_by_hand():
    """TensorRT-LLM's context batching delay (serving.agg.batch_wait_steps): the opener waits L =
    min(iters, steps until the tokens reach the ratio), the lam L joiners L / 2 on average."""
    from dataclasses import replace

    from infercast.serving.agg import batch_wait_steps
    from infercast.serving.backends import scheduler_params

    p = replace(scheduler_params("trtllm"), max_num_tokens=16384, batch_wait_iters=20, batch_wait_max_tokens_ratio=0.9)
    assert batch_wait_steps(0.01, 1024, 100, replace(p, batch_wait_iters=0)) == 0.0  # off
    # rare arrivals: the timeout ends the delay; L = 20, lam L = 0.2 joiners
    assert batch_wait_steps(0.01, 1024, 100, p) == pytest.approx((20 + 0.01 * 400 / 2) / (1 + 0.01 * 20))
    # frequent arrivals: the tokens end it first; L = (0.9 * 16384 - 100 - 1024) / (2 * 1024)
    lam = 2.0
    L = (0.9 * 16384 - 100 - 1024) / (lam * 1024)
    assert L < 20 and batch_wait_steps(lam, 1024, 100, p) == pytest.approx((L + lam * L * L / 2) / (1 + lam * L))
    # the running decodes already fill the ratio: no delay
    assert batch_wait_steps(0.01, 1024, 15000, p) == 0.0
    assert batch_wait_steps(0.0, 1024, 100, p) == 20.0  # no arrivals at all: the whole timeout


def test_batch_wait_adds_its_steps_to_ttft_exactly():
    """One client on a constant 10 ms engine: TTFT = (WAIT_STEPS + delay steps + 1 prefill step)
    x 10 ms, the delay at the steady state's own arrival rate; TPOT stays one step."""
    from infercast.serving.agg import batch_wait_steps

    eng = ConstEngine(10.0)
    p = params(batch_wait_iters=20, batch_wait_max_tokens_ratio=0.9)
    r0 = solve_steady(eng, 1, 100, 101, params(), 1e9, 1)
    r = solve_steady(eng, 1, 100, 101, p, 1e9, 1)
    delay = batch_wait_steps(r.decode_batch / 100, 100, r.decode_batch, p)
    assert 15 < delay <= 20
    assert r.ttft_ms == pytest.approx((1 + delay + 1) * 10.0, rel=1e-9)
    assert r.ttft_ms > r0.ttft_ms and r.tpot_ms == pytest.approx(10.0)
    assert r.decode_batch == pytest.approx(100 / (100 + 2 + delay), rel=1e-6)  # the waiting client does not decode
    assert r.balance_hold_ms == 0.0  # the attention-DP hold is another thing


@pytest.mark.parametrize(("version", "keeps"), [
    ("0.5.9", False), ("0.5.10", True), ("0.5.10.post1", True), ("0.5.14", True), ("1.0.0", True),
    ("nightly-dev-20260216-d3bae71e", False), ("nightly-dev-20260223", True),
    ("nightly-dev-20260402-d7256eb6", True),
    ("nightly-dev", False), ("glm5-hopper", False), ("", False), (None, False),   # undated: the older builds
])
def test_sglang_hybrid_overlap_by_build(version, keeps):
    from infercast.serving.backends import sglang_hybrid_overlap

    assert sglang_hybrid_overlap(version) is keeps


# ---------------------------------------------------------------------------------------------
# where the time to first token goes (ServingMetrics.ttft_parts)
# ---------------------------------------------------------------------------------------------
def _parts_sum(r):
    return sum(r.ttft_parts.values())


def test_ttft_parts_one_client_exact():
    # 3 ms of front end, then the prefill step starts at once (the engine is idle): (3, 0, 10)
    r = simulate(ConstEngine(10.0), 1, 100, 4, params(arrival_delay_ms=3.0), 1e9, 1, requests_per_client=2)
    assert r.ttft_parts == pytest.approx({"front_end": 3.0, "wait": 0.0, "prefill": 10.0})
    assert list(r.ttft_parts) == ["front_end", "wait", "prefill"]


def test_ttft_parts_of_a_synchronised_start_and_a_chunked_prompt():
    # four prompts of 100 tokens, budget 200, no mixing: two start at once, two a step later
    r = simulate(ConstEngine(10.0), 4, 100, 2, params(mixed=False, max_num_tokens=200, min_prefill_chunk=1), 1e9, 1,
                 requests_per_client=1)
    assert r.ttft_parts == pytest.approx({"front_end": 0.0, "wait": 5.0, "prefill": 10.0})
    # a prompt in 4 chunks: its prefill spans the four steps, from its first chunk on
    r = simulate(ConstEngine(5.0), 1, 1000, 2, params(max_num_tokens=256), 1e9, 1, requests_per_client=1)
    assert r.ttft_parts == pytest.approx({"front_end": 0.0, "wait": 0.0, "prefill": 20.0})
    # the lock-step copies of the first wave keep the parts (three identical waves)
    r3 = simulate(ConstEngine(10.0), 4, 100, 2, params(mixed=False, max_num_tokens=200, min_prefill_chunk=1), 1e9, 1,
                  requests_per_client=3)
    assert r3.ttft_parts == pytest.approx({"front_end": 0.0, "wait": 5.0, "prefill": 10.0})


def test_ttft_parts_of_the_steady_state_and_their_mix_with_the_first_wave():
    # steady state, one client, 10 ms steps: the front end, one step of wait, one prefill step
    p = params(arrival_delay_ms=4.0, requests_per_client=5.0)
    s = solve_steady(ConstEngine(10.0), 1, 100, 101, p, 1e9, 1)
    assert s.ttft_parts == pytest.approx({"front_end": 4.0, "wait": 10.0, "prefill": 10.0})
    assert _parts_sum(s) == pytest.approx(s.ttft_ms)
    # serve_agg: each part mixes the first wave (1 / k) with the steady state ((k - 1) / k)
    eng = TokenEngine(1.0, 0.01)
    r = serve_agg(eng, 8, 300, 50, p, 1e9, 1)
    first = simulate(eng, 8, 300, 50, p, 1e9, 1, requests_per_client=1)
    steady = solve_steady(eng, 8, 300, 50, p, 1e9, 1)
    for name in ("front_end", "wait", "prefill"):
        assert r.ttft_parts[name] == pytest.approx((first.ttft_parts[name] + 4.0 * steady.ttft_parts[name]) / 5.0)
    assert _parts_sum(r) == pytest.approx(r.ttft_ms)
    # lock-step serving reports the simulation's parts
    lock = serve_agg(ConstEngine(10.0), 4, 100, 2, params(mixed=False, max_num_tokens=200, min_prefill_chunk=1,
                                                          lockstep=True), 1e9, 1)
    assert lock.ttft_parts == pytest.approx({"front_end": 0.0, "wait": 5.0, "prefill": 10.0})


def test_ttft_parts_of_disaggregated_serving():
    # one client: no queue, so the parts are the front end and one prefill
    p = params(arrival_delay_ms=2.0)
    r = solve_disagg(ConstEngine(10.0), ConstEngine(2.0), 1, 100, 11, 1, 1, 1, 1, p, p, 0.0, 2)
    assert r.ttft_parts == pytest.approx({"front_end": 2.0, "wait": 0.0, "prefill": 10.0})
    # eight clients on one prefill worker of one prompt per step: the first wave waits 3.5 batches
    # on average, the steady state behind the closed loop's queue; the parts still sum to the mean
    p1 = params(arrival_delay_ms=2.0, max_num_tokens=100)
    r8 = solve_disagg(ConstEngine(10.0), ConstEngine(2.0), 8, 100, 11, 1, 1, 1, 1, p1, p1, 0.0, 2)
    assert r8.ttft_parts["front_end"] == pytest.approx(2.0) and r8.ttft_parts["prefill"] == pytest.approx(10.0)
    assert r8.ttft_parts["wait"] > 3.5 * 10.0 / 4.0  # at least the first wave's share (k = 4)
    assert _parts_sum(r8) == pytest.approx(r8.ttft_ms)


def test_disagg_fixed_point_answer_does_not_depend_on_the_iteration_cap():
    """Full steps while they shrink reach the fixed point in a few iterations: a deployment whose
    map has a fixed point answers the same (to the stopping tolerance) with 8 iterations as with
    400 (the damped steps of every iteration needed ~20); and the array solver agrees."""
    from infercast.serving.disagg import solve_disagg_many

    pe, de = BatchPrefillEngine(a=40.0, b=10.0, t=5.0), BatchPrefillEngine(a=2.0, b=0.0, t=5.0)
    p = params(max_num_tokens=8192)
    for clients in (4, 64, 256):
        few = solve_disagg(pe, de, clients, 1024, 101, 2, 1, 1, 1, p, p, 1.5, 3, iterations=8)
        many = solve_disagg(pe, de, clients, 1024, 101, 2, 1, 1, 1, p, p, 1.5, 3, iterations=400)
        assert few.ttft_ms == pytest.approx(many.ttft_ms, rel=2e-6) and few.tpot_ms == pytest.approx(many.tpot_ms, rel=2e-6)
        (arr,) = solve_disagg_many([(pe, p, 1, 1.5)], de, [clients], 1024, 101, 2, 1, 1, 1, p, 3, iterations=8)
        assert arr.ttft_ms == pytest.approx(few.ttft_ms, rel=1e-9) and arr.tpot_ms == pytest.approx(few.tpot_ms, rel=1e-9)
