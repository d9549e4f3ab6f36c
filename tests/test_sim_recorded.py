"""A benchmark whose clients send one request each is *recorded* (``serving.sim``'s module
docstring): the scheduler plays it counting steps, and the engine prices the steps at once
(``CompiledEngine.mixed_steps_ms``). Its numbers are the clock-stepping run's, to rounding, across
schedulers, KV and batch limits, the wrappers (prefix, phase scales), and both pricing paths (the
scalar twins for a few steps, the array path for many)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import synthpack as sp
from infercast.api import Estimator
from infercast.engine.compiled import SCALAR_STEPS
from infercast.serving.backends import scheduler_params
from infercast.serving.prefix import prefixed
from infercast.serving.scaled import PhaseScaledEngine
from infercast.serving.sim import FirstTokens, simulate


class ClockStepping:
    """An engine seen without ``mixed_steps_ms``: ``simulate`` then steps its clock along."""

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name):
        if name == "mixed_steps_ms":
            raise AttributeError(name)
        return getattr(self._engine, name)


@pytest.fixture(scope="module")
def est(synth):
    return Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)


def _params(est, **kw):
    base = dataclasses.replace(scheduler_params("trtllm", est.data.system, est.spec), max_num_tokens=1024,
                               min_prefill_chunk=64, arrival_delay_ms=1.7)
    return dataclasses.replace(base, **kw)


def _same(a, b, rel=1e-12):
    assert type(a) is type(b)
    assert a.ttft_ms == pytest.approx(b.ttft_ms, rel=rel)
    assert a.ttft_parts == pytest.approx(b.ttft_parts, rel=rel, abs=1e-9)
    assert np.allclose(a.ttft_dist.values, b.ttft_dist.values, rtol=rel, atol=0.0)
    assert np.array_equal(a.ttft_dist.weights, b.ttft_dist.weights)
    if not isinstance(a, FirstTokens):
        for f in ("tpot_ms", "request_latency_ms", "tokens_per_s_per_gpu", "mean_decode_batch"):
            assert getattr(a, f) == pytest.approx(getattr(b, f), rel=rel), f
        assert a.steps == b.steps


@pytest.mark.parametrize("kw,kv", [
    ({}, 1e9),
    ({}, 6000.0),  # KV-bound: later prompts wait for completions (decode runs between them)
    ({"max_batch_size": 5}, 1e9),
    ({"mixed": False}, 1e9),
    ({"chunked": False}, 1e9),
    ({"max_num_tokens": 300, "kv_reserve_full": False}, 2600.0),
])
@pytest.mark.parametrize("first_only", [True, False])
def test_recorded_run_is_the_clock_stepping_runs(est, kw, kv, first_only):
    p = _params(est, **kw)
    eng = est.engine
    for c in (1, 3, 12, 40, 150):
        got = simulate(eng, c, 250, 24, p, kv, 1, requests_per_client=1, first_tokens_only=first_only)
        ref = simulate(ClockStepping(eng), c, 250, 24, p, kv, 1, requests_per_client=1, first_tokens_only=first_only)
        _same(got, ref)


def test_runs_with_later_requests_step_the_clock(est):
    """A client that sends again after its first request makes arrivals depend on the step times:
    such a run is not recorded (the engine's pricing of recorded steps is never asked)."""
    calls = []

    class Watch(ClockStepping):
        @property
        def mixed_steps_ms(self):
            calls.append(1)
            return self._engine.mixed_steps_ms

    p = _params(est)
    simulate(Watch(est.engine), 8, 250, 24, p, 1e9, 1, requests_per_client=3)
    assert calls == []
    simulate(Watch(est.engine), 8, 250, 24, p, 1e9, 1, requests_per_client=1)
    assert calls == [1]


@pytest.mark.parametrize("wrap", [
    lambda e: prefixed(e, 96),
    lambda e: PhaseScaledEngine(e, 1.3, 0.7),
    lambda e: PhaseScaledEngine(prefixed(e, 40), 0.9, 1.2),
])
def test_wrapped_engines_price_recorded_steps_as_they_price_each_step(est, wrap):
    p = _params(est)
    w = wrap(est.engine)
    assert callable(getattr(w, "mixed_steps_ms", None))
    for c, kv in ((4, 1e9), (60, 1e9), (90, 5000.0)):
        got = simulate(w, c, 250, 24, p, kv, 1, requests_per_client=1)
        ref = simulate(ClockStepping(w), c, 250, 24, p, kv, 1, requests_per_client=1)
        _same(got, ref, rel=1e-11)


def test_a_wrapper_over_an_engine_without_the_pricing_has_none(est):
    assert getattr(prefixed(ClockStepping(est.engine), 10), "mixed_steps_ms", None) is None
    assert getattr(PhaseScaledEngine(ClockStepping(est.engine), 1.1, 1.0), "mixed_steps_ms", None) is None


def test_steps_priced_at_once_are_each_steps_price(est):
    """Both paths of ``mixed_steps_ms`` against the scalar twins, step by step: steps with several
    prefill groups (with and without prefix), decode-only steps with CUDA-graph padding, prefill-only
    steps, a step of nothing."""
    eng = est.engine
    rng = np.random.default_rng(7)
    for n in (SCALAR_STEPS, 5 * SCALAR_STEPS):
        dec = rng.integers(0, 40, n).astype(float)
        kv = rng.uniform(10.0, 600.0, n)
        groups, steps, pad = [], [], np.zeros(n)
        for s in range(n):
            k = int(rng.integers(0, 4))
            if k == 0:
                pad[s] = float(rng.integers(0, 3)) if dec[s] > 0 else 0.0
            for _ in range(k):
                groups.append((float(rng.integers(1, 3)), float(rng.integers(1, 300)), float(rng.choice([0.0, 128.0]))))
                steps.append(s)
        g = np.asarray(groups).reshape(-1, 3)
        got = eng.mixed_steps_ms(np.asarray(steps), g[:, 0], g[:, 1], g[:, 2], dec, kv, pad)
        want = []
        for s in range(n):
            gs = tuple(gr for gr, st in zip(groups, steps) if st == s)
            if gs:
                want.append(eng.mixed_groups_ms(gs, float(dec[s]), float(kv[s])))
            else:
                want.append(eng.decode_scalar(float(dec[s]), float(kv[s]), float(pad[s])) if dec[s] > 0 else 0.0)
        assert np.allclose(got, want, rtol=1e-12, atol=0.0)
        if n <= SCALAR_STEPS:  # the scalar twins themselves: the same numbers
            assert got.tolist() == want
        assert eng.steps_path(n) == ("scalar" if n <= SCALAR_STEPS else "array")
        other = "array" if n <= SCALAR_STEPS else "scalar"  # the other path, asked for: each step's price
        forced = eng.mixed_steps_ms(np.asarray(steps), g[:, 0], g[:, 1], g[:, 2], dec, kv, pad, path=other)
        assert np.allclose(forced, want, rtol=1e-12, atol=0.0)
        # priced in two pieces by one path: each step's price depends on that step alone
        cut = n // 2
        first = np.asarray(steps) < cut
        halves = [eng.mixed_steps_ms(np.asarray(steps)[sel] - lo, g[sel, 0], g[sel, 1], g[sel, 2], dec[lo:hi], kv[lo:hi],
                                     pad[lo:hi], path=other) for sel, lo, hi in ((first, 0, cut), (~first, cut, n))]
        assert np.concatenate(halves).tolist() == forced.tolist()
    with pytest.raises(ValueError, match="path"):
        eng.mixed_steps_ms(np.zeros(0, dtype=np.int64), [], [], [], [1.0], [10.0], [0.0], path="vector")


class Priced:
    """A synthetic engine that prices recorded steps from their shapes (irregular floats, so that
    any difference in the steps would show) and has MTP-like step widths when asked."""

    def __init__(self, tau: float = 1.0, width: float = 1.0):
        self.tokens_per_step, self.decode_width = tau, width

    def mixed_steps_ms(self, group_step, ctx_batch, ctx_isl, ctx_prefix, dec_batch, dec_kv, dec_pad):
        n = len(dec_batch)
        tok = np.bincount(group_step, np.asarray(ctx_batch) * np.asarray(ctx_isl), minlength=n)
        pre = np.bincount(group_step, np.asarray(ctx_batch) * np.asarray(ctx_prefix), minlength=n)
        d = np.asarray(dec_batch)
        return 0.731 + 0.00113 * tok + 1.7e-7 * tok * pre + 0.0137 * (d + np.asarray(dec_pad)) + 1.3e-4 * d * np.asarray(dec_kv)


def _random_wave_settings(rng, draws: int):
    """(isl, osl, scheduler, KV capacity, a :class:`Priced` engine) of each of ``draws`` random
    draws but those a scheduler refuses (a whole prompt beyond the token budget, unchunked)."""
    for _ in range(draws):
        setting = _random_wave_setting(rng)
        if setting is not None:
            yield setting


def _random_wave_setting(rng):
    from infercast.serving.backends import SchedulerParams

    isl, osl = int(rng.integers(1, 900)), int(rng.integers(1, 120))
    p = SchedulerParams(mixed=bool(rng.random() < 0.7), chunked=bool(rng.random() < 0.7),
                        max_num_tokens=int(rng.integers(64, 3000)), max_batch_size=int(rng.integers(1, 80)),
                        step_overhead_ms=0.1, arrival_delay_ms=float(rng.uniform(0, 3)), requests_per_client=1.0,
                        kv_reserve_full=bool(rng.random() < 0.5), min_prefill_chunk=int(rng.integers(1, 200)),
                        graph_batch_sizes=(1, 2, 4, 8, 16, 32) if rng.random() < 0.5 else ())
    if not p.chunked and isl > p.max_num_tokens:
        return None
    kv = float(rng.choice([1e12, (isl + osl) * rng.uniform(1.0, 40.0)]))
    return isl, osl, p, kv, Priced(*((1.6, 2.0) if rng.random() < 0.3 else (1.0, 1.0)))


def test_first_wave_player_is_the_general_loop(monkeypatch):
    """The first-wave player (a search's hot path) decides every step as simulate's general loop
    does: the same TTFTs, bit for bit, over random schedulers, KV caches, batch limits and MTP."""
    from infercast.serving import sim

    rng = np.random.default_rng(11)
    checked = 0
    for isl, osl, p, kv, eng in _random_wave_settings(rng, 300):
        c = int(rng.integers(1, 200))
        fast = simulate(eng, c, isl, osl, p, kv, 1, requests_per_client=1, first_tokens_only=True)
        monkeypatch.setattr(sim, "FIRST_WAVE_PLAYER", False)
        loop = simulate(eng, c, isl, osl, p, kv, 1, requests_per_client=1, first_tokens_only=True)
        monkeypatch.setattr(sim, "FIRST_WAVE_PLAYER", True)
        assert fast.ttft_ms == loop.ttft_ms and fast.ttft_parts == loop.ttft_parts
        assert np.array_equal(fast.ttft_dist.values, loop.ttft_dist.values)
        assert np.array_equal(fast.ttft_dist.weights, loop.ttft_dist.weights)
        checked += 1
    assert checked > 200


def test_a_first_wave_taken_over_from_a_smaller_one_is_the_same():
    """A first wave that takes over from a smaller wave played before on the same settings
    (``first_waves``, a search's layout playing its concurrencies in turn) gives the TTFTs of the
    wave played from its first step, bit for bit, over random schedulers, KV caches, batch
    limits, MTP and orders of concurrencies (the grid, then bisection probes between them)."""
    rng = np.random.default_rng(5)
    taken_over = 0
    for isl, osl, p, kv, eng in _random_wave_settings(rng, 150):
        grid = [c for c in (1, 2, 4, 8, 16, 32, 64, 128, 256) if c <= int(rng.integers(4, 257))]
        order = grid + [int(c) for c in rng.integers(1, grid[-1] + 1, size=4)]
        waves: dict = {}
        for c in order:
            played_smaller = any(w for table in waves.values() for w in table if w < c)
            kept = simulate(eng, c, isl, osl, p, kv, 1, requests_per_client=1, first_tokens_only=True, first_waves=waves)
            alone = simulate(eng, c, isl, osl, p, kv, 1, requests_per_client=1, first_tokens_only=True)
            assert kept.ttft_ms == alone.ttft_ms and kept.ttft_parts == alone.ttft_parts
            assert np.array_equal(kept.ttft_dist.values, alone.ttft_dist.values)
            assert np.array_equal(kept.ttft_dist.weights, alone.ttft_dist.weights)
            taken_over += played_smaller
        # the states left are mid-wave ones (a larger wave takes over after some steps)
        assert any(w.t > 0 for table in waves.values() for w in table.values()) or grid[-1] <= 2
    assert taken_over > 500
