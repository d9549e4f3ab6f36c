"""DecodeCurve: a decode worker's step time by batch, answered by straight lines between the ops'
knots where the engine is linear, by the engine elsewhere -- the engine's numbers to rounding
either way, with and without CUDA-graph padding, on knots, between them and beyond them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import synthpack as sp
from infercast.api import Estimator
from infercast.serving.backends import CUDA_GRAPH_SIZES, scheduler_params
from infercast.serving.decode_curve import DecodeCurve
from infercast.serving.disagg import _decode_step_many


@pytest.fixture(scope="module")
def est(synth):
    return Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)


def _batches(curve, top, rng):
    knots = curve.x if curve.x is not None else np.zeros(0)
    return np.concatenate([
        rng.uniform(1.0, top, 3000),  # between knots
        knots,  # on them (a tile grid's measured point)
        np.nextafter(knots, np.inf), np.nextafter(knots, -np.inf),
        np.arange(1.0, top + 1.0),  # whole batches, graph sizes among them
        [0.5, top * 1.5, top + 1e-9],  # outside the curve's range
    ])


@pytest.mark.parametrize("sizes", [(), CUDA_GRAPH_SIZES["vllm"], (1, 2, 4, 8, 16, 24, 32, 48, 64)])
def test_curve_is_the_engines_step(est, sizes):
    p = dataclasses.replace(scheduler_params("trtllm", est.data.system, est.spec), graph_batch_sizes=tuple(sizes),
                            seq_overhead_ms=0.013)
    top = 700.0
    curve = DecodeCurve(est.engine, p, 900.0, top)
    assert curve.x is not None and curve.ok.mean() >= 0.5  # most synthetic grids are linear between points
    d = _batches(curve, top, np.random.default_rng(3))
    d = d[d > 0]
    want = _decode_step_many(est.engine, p, d, 900.0)
    got = curve.step_ms(d)
    assert np.allclose(got, want, rtol=1e-12, atol=0.0)


def test_curve_falls_back_where_the_step_is_not_a_line(est):
    """An engine whose step bends between the knots (here: squared) fails the line checks in
    every interval, and every batch is priced by the engine."""

    class Bent:
        def __init__(self, e):
            self.e = e

        def decode_batch_knots(self):
            return self.e.decode_batch_knots()

        def decode_steps_ms(self, b, kv, pad=0.0):
            return self.e.decode_steps_ms(b, kv, pad) ** 2

    p = scheduler_params("trtllm", est.data.system, est.spec)
    bent = Bent(est.engine)
    curve = DecodeCurve(bent, p, 900.0, 300.0)
    assert not curve.ok.any()
    d = np.random.default_rng(4).uniform(1.0, 300.0, 500)
    assert np.array_equal(curve.step_ms(d), _decode_step_many(bent, p, d, 900.0))


def test_curve_without_knots_asks_the_engine(est):
    class NoKnots:
        def __init__(self, e):
            self.e = e

        def decode_steps_ms(self, b, kv, pad=0.0):
            return self.e.decode_steps_ms(b, kv, pad)

    p = scheduler_params("trtllm", est.data.system, est.spec)
    curve = DecodeCurve(NoKnots(est.engine), p, 900.0, 300.0)
    assert curve.x is None
    d = np.linspace(1.0, 300.0, 77)
    assert np.array_equal(curve.step_ms(d), _decode_step_many(est.engine, p, d, 900.0))


def test_solve_with_the_curve_is_the_solve_without(est):
    """The disaggregated fixed point with the curve: the same solutions to rounding."""
    from infercast.serving.disagg import solve_disagg_many

    p = scheduler_params("trtllm", est.data.system, est.spec)
    prefills = [(est.engine, p, 1, 0.4)]
    c = np.array([1, 4, 16, 64, 200, 512], dtype=float)
    kw = dict(prefill_workers=2, decode_workers=1, decode_dp=1, prefill_batch=1, params_decode=p, gpus=3, columns=True)
    plain = solve_disagg_many(prefills, est.engine, c, 300, 64, **kw)
    curve = DecodeCurve(est.engine, p, 300 + 64 / 2.0, p.max_batch_size)
    fast = solve_disagg_many(prefills, est.engine, c, 300, 64, decode_curve=curve, **kw)
    for name in ("ttft_ms", "tpot_ms", "decode_batch", "tokens_per_s_per_gpu"):
        assert np.allclose(fast[name], plain[name], rtol=1e-9, atol=0.0), name
    with pytest.raises(ValueError):
        solve_disagg_many(prefills, est.engine, c, 300, 80, decode_curve=curve, **kw)  # another KV length
