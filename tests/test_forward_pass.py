"""ForwardPassModel: kinds, slowest rank, online correction (bounds, readiness, determinism),
regression fallback (NNLS on synthetic linear data), JSON form. Engine-backed cases use the
synthetic pack; their expected values are the engine's own op-by-op numbers."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import synthpack as sp
from infercast import CorrectionOptions, Estimator, ForwardPassModel, Iteration, RankLoad
from infercast.engine.forward_pass import nnls
from infercast.errors import InvalidInputError


@pytest.fixture(scope="module")
def est(synth):
    return Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)


@pytest.fixture()
def model(est):
    return ForwardPassModel.from_estimator(est)


P = RankLoad(prefill_requests=2, prefill_tokens=1000, prefill_cached_tokens=200)
D = RankLoad(decode_requests=8, decode_kv_tokens=8 * 500)
M = RankLoad(prefill_requests=1, prefill_tokens=256, decode_requests=4, decode_kv_tokens=4 * 300)


def test_kind_follows_from_the_fields():
    assert P.kind == "prefill" and D.kind == "decode" and M.kind == "mixed"
    assert RankLoad().kind == "empty"
    assert RankLoad(queued_prefill_requests=5, queued_decode_requests=3).kind == "empty"  # queued: ignored
    assert Iteration((P, D)).kind == "mixed"  # prompt work on one rank, decodes on another
    assert Iteration((D, RankLoad())).kind == "decode"


def test_single_rank_times_equal_the_engine(model, est):
    e = est.engine
    assert model.estimate_ms(P) == pytest.approx(e.prefill_scalar(2, 500, 100), rel=1e-3)
    assert model.estimate_ms(D) == pytest.approx(e.decode_scalar(8, 500), rel=1e-3)
    assert model.estimate_ms(M) == pytest.approx(e.mixed_step_ms([1], [256], [0], 4, 300), rel=1e-3)
    assert model.estimate_ms(RankLoad()) == 0.0


def test_time_is_the_slowest_ranks(model):
    small = RankLoad(decode_requests=1, decode_kv_tokens=10)
    est = model.estimate(Iteration((small, D, small)))
    assert est.ms == model.estimate_ms(D) and est.slowest_rank == 1 and est.kind == "decode"
    assert est.source == "engine" and est.factor == 1.0


def test_queued_fields_change_nothing(model):
    q = RankLoad(decode_requests=8, decode_kv_tokens=4000, queued_prefill_requests=40, queued_decode_requests=9)
    assert model.estimate_ms(q) == model.estimate_ms(D)


def test_json_round_trip_and_forms():
    it = Iteration((P, M))
    d = it.to_dict()
    assert Iteration.from_dict(json.loads(json.dumps(d))) == it
    assert Iteration.of([P.to_dict(), M.to_dict()]) == it
    assert Iteration.of(P.to_dict()) == Iteration((P,))
    assert Iteration.of({**P.to_dict(), "wall_time": 3.0}) == Iteration((P,))  # a measured time rides along, ignored


@pytest.mark.parametrize("bad", [{"prefill_tokens": -1, "prefill_requests": 1}, {"prefill_tokens": 5},
                                 {"decode_requests": 4, "decode_kv_tokens": 2}, {"nonsense": 1},
                                 {"decode_requests": float("nan")}])
def test_bad_rank_load_is_a_typed_error(bad):
    with pytest.raises(InvalidInputError):
        RankLoad.from_dict(bad)


def test_correction_waits_for_min_samples_then_applies(est):
    m = ForwardPassModel.from_estimator(est, CorrectionOptions(min_samples=3, alpha=0.5))
    raw = m.engine_ms(D)[0]
    m.observe(D, 1.5 * raw)
    m.observe(D, 1.5 * raw)
    assert m.estimate(D).source == "engine" and m.diagnostics()["ready"]["decode"] is False
    m.observe(D, 1.5 * raw)
    e = m.estimate(D)
    assert e.source == "corrected" and e.factor == pytest.approx(1.5) and e.ms == pytest.approx(1.5 * raw)
    d = m.diagnostics()
    assert d["source"] == "corrected" and d["ready"] == {"prefill": False, "decode": True, "mixed": False}
    assert d["samples"]["decode"] == 3
    assert d["error_before"] == pytest.approx(1.0 / 3.0)  # |raw / 1.5raw - 1| each time
    assert d["error_after"] == pytest.approx(0.0, abs=1e-12)
    # prefill is not touched by decode observations
    assert m.estimate(P).source == "engine"


def test_moving_average_in_log_space(est):
    m = ForwardPassModel.from_estimator(est, CorrectionOptions(min_samples=1, alpha=0.5))
    raw = m.engine_ms(D)[0]
    m.observe(D, 2.0 * raw)  # log 2 (first sample sets it)
    m.observe(D, 0.5 * raw)  # log 2 + 0.5 (log 0.5 - log 2) = 0
    assert m.estimate(D).factor == pytest.approx(1.0)
    m.observe(D, 4.0 * raw)  # 0 + 0.5 log 4 = log 2
    assert m.estimate(D).factor == pytest.approx(2.0)


def test_factor_bounds_default_and_unbounded(est):
    m = ForwardPassModel.from_estimator(est, CorrectionOptions(min_samples=1))
    raw = m.engine_ms(P)[0]
    m.observe(P, 10.0 * raw)
    assert m.estimate(P).factor == 2.0  # at most 2x slower by default
    m2 = ForwardPassModel.from_estimator(est, CorrectionOptions(min_samples=1))
    m2.observe(P, 0.1 * raw)
    assert m2.estimate(P).factor == 0.5
    m3 = ForwardPassModel.from_estimator(est, CorrectionOptions(min_samples=1, max_factor=None, min_factor=None))
    m3.observe(P, 10.0 * raw)
    assert m3.estimate(P).factor == pytest.approx(10.0)
    m4 = ForwardPassModel.from_estimator(est, CorrectionOptions(min_samples=1, max_factor=None, min_factor=0.8))
    m4.observe(P, 0.1 * raw)
    assert m4.estimate(P).factor == 0.8


def test_cells_learn_separately_and_fall_back_to_the_kind(est):
    m = ForwardPassModel.from_estimator(est, CorrectionOptions(min_samples=2, alpha=1.0))
    small = RankLoad(prefill_requests=1, prefill_tokens=100)   # cell 2**6..2**7
    big = RankLoad(prefill_requests=1, prefill_tokens=3000)    # cell 2**11..2**12
    other = RankLoad(prefill_requests=1, prefill_tokens=20)    # no observation in its cell
    for _ in range(2):
        m.observe(small, 1.2 * m.engine_ms(small)[0])
        m.observe(big, 1.6 * m.engine_ms(big)[0])
    assert m.estimate(small).factor == pytest.approx(1.2)
    assert m.estimate(big).factor == pytest.approx(1.6)
    assert m.estimate(other).factor == pytest.approx(1.6)  # the kind's average, alpha 1: the last sample


def test_empty_and_nonpositive_times_are_never_learned(model):
    assert model.observe(RankLoad(), 5.0) == 0
    assert model.observe(D, 0.0) == 0
    assert model.observe(D, -1.0) == 0
    assert model.observe(D, float("nan")) == 0
    assert model.diagnostics()["samples"] == {"prefill": 0, "decode": 0, "mixed": 0}


def test_determinism(est):
    rng = np.random.default_rng(7)
    its = [RankLoad(decode_requests=int(b), decode_kv_tokens=int(b * k)) for b, k in zip(rng.integers(1, 64, 200), rng.integers(2, 3000, 200))]
    times = rng.uniform(1.0, 30.0, 200).tolist()
    a = ForwardPassModel.from_estimator(est)
    b = ForwardPassModel.from_estimator(est)
    a.observe(its, times)
    b.observe(its, times)
    assert a.diagnostics() == b.diagnostics()
    assert [a.estimate_ms(i) for i in its[:20]] == [b.estimate_ms(i) for i in its[:20]]


def test_vectorised_estimates_match_single(est):
    m = ForwardPassModel.from_estimator(est, CorrectionOptions(min_samples=1))
    m.observe(D, 1.3 * m.engine_ms(D)[0])
    cols = {"prefill_requests": [[2, 0], [0, 0], [1, 0], [0, 0]], "prefill_tokens": [[1000, 0], [0, 0], [256, 0], [0, 0]],
            "prefill_cached_tokens": [[200, 0], [0, 0], [0, 0], [0, 0]], "decode_requests": [[0, 0], [8, 1], [4, 0], [0, 0]],
            "decode_kv_tokens": [[0, 0], [4000, 10], [1200, 0], [0, 0]]}
    got = m.estimate_many(cols)
    want = [m.estimate_ms(P), m.estimate_ms(Iteration((D, RankLoad(decode_requests=1, decode_kv_tokens=10)))), m.estimate_ms(M), 0.0]
    np.testing.assert_allclose(got, want, rtol=1e-12)


# ---- regression ----------------------------------------------------------------------------
def test_nnls_recovers_nonnegative_coefficients_and_clips_negative_ones():
    X = np.column_stack([np.ones(6), np.arange(6.0), np.arange(6.0) ** 2])
    y = X @ np.array([1.0, 2.0, 0.5])
    np.testing.assert_allclose(nnls(X, y), [1.0, 2.0, 0.5], atol=1e-9)
    y2 = 3.0 - 1.0 * np.arange(6.0)  # falling: the slope may not be negative
    c = nnls(X[:, :2], y2)
    assert np.all(c >= 0) and c[1] == 0.0 and c[0] == pytest.approx(np.mean(y2))


def test_regression_answers_none_until_ready_then_fits_linear_data():
    m = ForwardPassModel.regression(CorrectionOptions(min_regression_samples=4))
    # decode time = 0.5 + 0.1 * requests + 0.002 * kv tokens
    its = [RankLoad(decode_requests=b, decode_kv_tokens=k) for b, k in [(1, 100), (4, 1000), (8, 900), (16, 5000), (2, 3000)]]
    t = [0.5 + 0.1 * r.decode_requests + 0.002 * r.decode_kv_tokens for r in its]
    for i in range(3):
        m.observe(its[i], t[i])
    assert m.estimate_ms(its[0]) is None and m.diagnostics()["ready"]["decode"] is False
    m.observe(its[3:], t[3:])
    q = RankLoad(decode_requests=32, decode_kv_tokens=10000)
    assert m.estimate_ms(q) == pytest.approx(0.5 + 3.2 + 20.0)
    co = m.regression_coefficients("decode")
    assert co == pytest.approx({"const": 0.5, "decode_requests": 0.1, "decode_kv_tokens": 0.002})
    d = m.diagnostics()
    assert d["source"] == "regression" and d["ready"]["decode"] and d["error_after"] == pytest.approx(0.0, abs=1e-9)
    assert m.estimate_ms(P) is None  # no prefill observations
    assert m.estimate(q).source == "regression"


def test_best_available_falls_back_with_the_reason(synth):
    m = ForwardPassModel.best_available({"model": "no-such/model", "system": sp.SYSTEM, "backend": "trtllm",
                                         "systems_path": synth.systems_dir})
    d = m.diagnostics()
    assert d["source"] == "regression" and "no-such/model" in d["reason"]
    ok = ForwardPassModel.best_available({"model": sp.MODEL_ID, "system": sp.SYSTEM, "backend": "trtllm",
                                          "systems_path": synth.systems_dir})
    assert ok.diagnostics()["source"] == "engine" and ok.diagnostics()["reason"] is None
    assert ok.diagnostics()["identity"]["model"] == sp.MODEL_ID


def test_observations_are_retained(est):
    m = ForwardPassModel.from_estimator(est)
    m.observe([P, D], [10.0, 2.0])
    rows = m.observations()
    assert [r["kind"] for r in rows] == ["prefill", "decode"]
    assert rows[0]["measured_ms"] == 10.0 and rows[0]["prefill_tokens"] == 1000
    assert rows[0]["attention_pairs"] == pytest.approx(1000 * (200 + 500) / 2)
    assert math.isclose(rows[1]["engine_ms"], m.engine_ms(D)[0])
