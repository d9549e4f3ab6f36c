"""The first wave's TTFT side (``simulate(..., first_tokens_only=True)``, what ``serve_agg`` takes
from the simulator) is the full run's, bit for bit, across schedulers, KV and batch limits."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from infercast.serving.backends import SchedulerParams
from infercast.serving.sim import FirstTokens, simulate


class KvEngine:
    """Step time grows with the step's tokens and the decodes' mean KV length (irregular floats,
    so that any change in the order of operations would show)."""

    def step_ms(self, **shape):
        b = np.asarray(shape.get("dec_batch", 0.0), dtype=float)
        kv = np.asarray(shape.get("dec_kv", 1.0), dtype=float)
        return 0.731 + 0.0137 * b + 1.3e-4 * b * kv + 0.0 * kv

    def mixed_step_ms(self, ctx_batch, ctx_isl, ctx_prefix, dec_batch, dec_kv):
        toks = sum(float(b) * float(i) for b, i in zip(ctx_batch, ctx_isl))
        pre = sum(float(b) * float(p) for b, p in zip(ctx_batch, ctx_prefix))
        return 0.731 + 0.00113 * toks + 1.7e-7 * toks * pre + 0.0137 * dec_batch + 1.3e-4 * dec_batch * dec_kv


def _params(**kw) -> SchedulerParams:
    base = SchedulerParams(mixed=True, chunked=True, max_num_tokens=1024, max_batch_size=1024, step_overhead_ms=0.0,
                           arrival_delay_ms=1.9, requests_per_client=1.0, kv_reserve_full=True)
    return dataclasses.replace(base, **kw)


@pytest.mark.parametrize("kw,kv", [
    ({}, 1e9),
    ({}, 5000.0),  # KV-bound: later prompts wait for completions
    ({"max_batch_size": 5}, 1e9),
    ({"mixed": False}, 1e9),
    ({"chunked": False}, 1e9),
    ({"min_prefill_chunk": 64}, 3000.0),
    ({"max_num_tokens": 300, "kv_reserve_full": False}, 2600.0),
])
def test_first_tokens_only_is_the_full_runs_ttft(kw, kv):
    p = _params(**kw)
    for c in (1, 2, 3, 7, 16, 33):
        full = simulate(KvEngine(), c, 250, 40, p, kv, 1, requests_per_client=1)
        part = simulate(KvEngine(), c, 250, 40, p, kv, 1, requests_per_client=1, first_tokens_only=True)
        assert isinstance(part, FirstTokens)
        assert part.ttft_ms == full.ttft_ms
        assert part.ttft_parts == full.ttft_parts
        assert np.array_equal(part.ttft_dist.values, full.ttft_dist.values)
        assert np.array_equal(part.ttft_dist.weights, full.ttft_dist.weights)


def test_plus_of_equal_weights_is_the_general_paths():
    """``Distribution.plus`` sorts only the values when every weight is equal; the answer is the
    general path's (one weight nudged by one ulp takes that path), ties among the sums included."""
    from infercast.serving.result import Distribution, uniform

    rng = np.random.default_rng(3)
    for a, b in ((uniform(0.0, 1.0), uniform(0.0, 3.0)),
                 (Distribution(rng.random(50).round(1), np.ones(50)), Distribution(rng.random(70).round(1), np.ones(70)))):
        fast = a.plus(b)
        w = b.weights.copy()
        w[0] = np.nextafter(w[0], 2.0)  # not all equal: the general (argsort) path
        slow = a.plus(Distribution(b.values, w))
        # the one-ulp weight moves the cumulative weights by rounding only: the same quantiles here
        assert np.array_equal(fast.values, slow.values)


def test_serve_agg_without_notes_has_the_same_numbers(synth):
    """``notes=False`` (a search's serving runs) leaves only the per-op notes out."""
    import synthpack as sp

    from infercast.api import Estimator, serve_agg, serve_agg_replica

    e = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)
    for c in (1, 8, 64):
        full = serve_agg(e, c, 300, 20)
        lean = serve_agg(e, c, 300, 20, notes=False)
        assert lean.notes == []
        a, b = dataclasses.asdict(full), dataclasses.asdict(lean)
        a.pop("notes"), b.pop("notes")
        assert repr(a) == repr(b)
        assert serve_agg_replica(e, c, 300, 20, notes=False)[0].ttft_ms == full.ttft_ms


@pytest.mark.parametrize("isl,osl,budget,chunked", [(300, 20, 1024, True), (700, 40, 1024, True), (300, 30, 1024, False)])
def test_waves_that_take_over_reuse_the_shared_steps_prices(synth, monkeypatch, isl, osl, budget, chunked):
    """On a compiled engine, a first wave that takes over from a smaller one (``first_waves``) prices
    only the steps after those it shares, reusing the smaller wave's GPU times where both are
    priced the same way (the scalar twins, or the array path): every serving result equals the
    one computed alone, bit for bit, over a layout's grid and bisection probes."""
    import synthpack as sp

    from infercast.api import Estimator, serve_agg
    from infercast.engine.compiled import CompiledEngine
    from infercast.serving.backends import scheduler_params

    e = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)
    p = dataclasses.replace(scheduler_params("trtllm", e.data.system, e.spec), max_num_tokens=budget, chunked=chunked)
    priced = []  # (steps, path) of each pricing call
    real = CompiledEngine.mixed_steps_ms

    def spy(self, *a, path=None):
        priced.append((len(a[4]), path))
        return real(self, *a, path=path)

    monkeypatch.setattr(CompiledEngine, "mixed_steps_ms", spy)
    waves: dict = {}
    for c in (1, 2, 4, 8, 16, 32, 64, 128, 256, 24, 20, 22, 21, 200):
        kept = serve_agg(e, c, isl, osl, p, notes=False, first_waves=waves)
        alone = serve_agg(e, c, isl, osl, p, notes=False)
        assert repr(dataclasses.asdict(kept)) == repr(dataclasses.asdict(alone))
    reused = [n for n, path in priced if path is not None]
    assert {path for _, path in priced if path is not None} == {"scalar", "array"}  # both ways reused
    assert sum(reused) < 0.7 * sum(n for n, path in priced if path is None)  # and fewer steps priced
