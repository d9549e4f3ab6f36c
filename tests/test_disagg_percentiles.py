"""The array path of the disaggregated TTFT percentiles gives exactly what the per-request
mixture's :meth:`Distribution.percentiles` gives, over random deployments and the edge cases
(no queueing wait, a saturated pool, a first-wave value equal to the steady state's floor)."""

import numpy as np
import pytest
import synthpack as sp

from infercast.api import Estimator
from infercast.serving.disagg import DISAGG_REQUESTS_PER_CLIENT as K
from infercast.serving.disagg import _ttft_percentiles_many
from infercast.serving.result import PERCENTILES, Distribution, exponential_tail, mixture


def _reference(fb, front, nb, wm, p0, shift):
    first = Distribution(np.arange(1, nb + 1) * fb + front, np.ones(nb))
    steady = exponential_tail(wm, p0).shifted(shift)
    return mixture((first, 1.0 / K), (steady, (K - 1.0) / K)).percentiles(PERCENTILES)


def test_array_percentiles_equal_the_mixture():
    rng = np.random.default_rng(7)
    n = 3000
    fb = rng.uniform(1.0, 500.0, n)
    front = rng.uniform(0.0, 5.0, n)
    nb = rng.integers(1, 300, n)
    wm = rng.uniform(0.0, 2000.0, n) * (rng.random(n) > 0.2)  # a fifth without a wait
    rho = np.minimum(rng.uniform(0.0, 1.2, n), 0.999) * (rng.random(n) > 0.1)  # some idle pools (p0 = 1)
    shift = rng.uniform(0.0, 3000.0, n)
    shift[:200] = (np.arange(200) % 5 + 1) * fb[:200] + front[:200]  # ties with first-wave values
    nb[200:260] = 1
    got = _ttft_percentiles_many(fb, front, nb, wm, 1.0 - rho, shift, K)
    assert got.shape == (len(PERCENTILES), n)
    for i in range(n):
        assert list(got[:, i]) == _reference(fb[i], front[i], int(nb[i]), wm[i], 1.0 - rho[i], shift[i]), i


def test_one_steady_point_and_one_batch():
    # no wait: the steady state is one point (weight 3/4) above a single first-wave point (1/4)
    got = _ttft_percentiles_many([10.0], [1.0], [1], [0.0], [0.5], [50.0], K)
    assert got[:, 0].tolist() == [50.0, 50.0, 50.0]
    # the first wave above the steady point: p50 is the steady point, p90 / p99 the first wave's
    got = _ttft_percentiles_many([100.0], [1.0], [1], [0.0], [0.5], [50.0], K)
    assert got[:, 0].tolist() == [50.0, 101.0, 101.0]


@pytest.mark.parametrize("cp", [1, 2])
def test_decode_steps_equal_the_step_model(synth, cp):
    """CompiledEngine.decode_steps_ms (the disaggregated solver's decode steps) gives exactly
    step_ms's decode-phase numbers, padded rows included, with context parallelism too (its
    sharded KV reads and the partial outputs' combine)."""
    e = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir, cp=cp)
    d = np.concatenate([np.linspace(1.0, 60.0, 97), np.arange(1.0, 40.0)])
    pad = np.where(d < 32, np.ceil(d / 8) * 8 - d, 0.0)  # rows padded to multiples of 8, as a CUDA graph would
    want = e.engine.step_ms(dec_batch=d, dec_kv=90.0, dec_pad=pad, phase="decode")
    got = e.engine.decode_steps_ms(d, 90.0, pad)
    assert got.tolist() == want.tolist()


def test_decode_steps_stacked_grids_held_and_idle(synth):
    """decode_steps_ms's stacked token-wise grids (one locate for the ops that share a token
    axis) give step_ms's numbers inside the axes, beyond them (each grid holds its own edge) and
    with idle elements (no decodes)."""
    e = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir, tp=2)
    kinds = [unit[0] for unit, _ in e.engine._decode_rows()]
    assert "stack" in kinds and "analytic" in kinds and "attention" in kinds
    inside = np.linspace(1.0, 60.0, 41)
    for d in (inside, np.concatenate([inside, [0.0, 0.0, 3.0]]), np.concatenate([inside, [3000.0, 20000.0]])):
        want = e.engine.step_ms(dec_batch=d, dec_kv=90.0, phase="decode")
        got = e.engine.decode_steps_ms(d, 90.0)
        assert got.tolist() == want.tolist()
