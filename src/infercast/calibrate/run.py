"""Calibrate a deployment's scheduler parameters to measured runs and build the profile.

:func:`agg_predictor` predicts runs of one aggregated deployment (an
:class:`~infercast.Estimator`) through :func:`infercast.api.serve_agg_replica`;
:func:`calibrate_runs` fits (:func:`infercast.calibrate.fit.fit_runs`) with any such predictor and
returns the :class:`~infercast.calibrate.profile.CalibrationProfile` with residuals before and
after.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, replace

import numpy as np

from ..errors import InfercastError
from .fit import GPU, HOST, fit_runs
from .formats import MeasuredRun
from .profile import CalibrationProfile


def agg_predictor(est, base_params, runs: Sequence[MeasuredRun]):
    """``predict_subset(indices)`` for :func:`fit_runs`: the runs' mean TTFT and TPOT served by
    ``est``'s replica with ``base_params`` and the candidate values (NaN where the deployment
    cannot serve a run)."""
    from ..api import serve_agg_replica

    def predict_subset(idx):
        def predict(values: dict):
            p = replace(base_params, **values)
            t, q = [], []
            for i in idx:
                r = runs[i]
                try:
                    res, _ = serve_agg_replica(est, r.concurrency, r.isl, r.osl, p)
                    t.append(res.ttft_ms)
                    q.append(res.tpot_ms)
                except InfercastError:
                    t.append(math.nan)
                    q.append(math.nan)
            return np.array(t, float), np.array(q, float)

        return predict

    return predict_subset


def _ape(pred, meas) -> np.ndarray:
    pred, meas = np.asarray(pred, float), np.asarray(meas, float)
    return np.abs(pred - meas) / meas


def _median(x) -> float | None:
    x = np.asarray(x, float)
    x = x[np.isfinite(x)]
    return None if x.size == 0 else float(np.median(x))


def calibrate_runs(runs: Sequence[MeasuredRun], predict_subset, base_params, deployment: dict,
                   gpu: str = "auto", ridge: float | None = None) -> CalibrationProfile:
    """Fit the host-side fields (and the GPU-time scales per ``gpu``) of ``base_params`` to ``runs``."""
    m_ttft = np.array([r.ttft_ms for r in runs], float)
    m_tpot = np.array([math.nan if r.tpot_ms is None else r.tpot_ms for r in runs], float)
    base = asdict(base_params)
    start = {p.name: float(base[p.name]) for p in HOST + GPU}
    every = list(range(len(runs)))
    before_t, before_p = predict_subset(every)({})
    result = fit_runs(predict_subset, m_ttft, m_tpot, start, gpu=gpu, **({} if ridge is None else {"ridge": ridge}))
    after_t, after_p = result.ttft_ms, result.tpot_ms
    rows = []
    for i, r in enumerate(runs):
        rows.append({"source": r.source, "concurrency": r.concurrency, "isl": r.isl, "osl": r.osl,
                     "measured_ttft_ms": r.ttft_ms, "measured_tpot_ms": r.tpot_ms,
                     "before_ttft_ms": float(before_t[i]), "before_tpot_ms": float(before_p[i]),
                     "after_ttft_ms": float(after_t[i]), "after_tpot_ms": float(after_p[i])})
    summary = {
        "ttft_median_ape_before": _median(_ape(before_t, m_ttft)), "ttft_median_ape_after": _median(_ape(after_t, m_ttft)),
        "tpot_median_ape_before": _median(_ape(before_p, m_tpot)), "tpot_median_ape_after": _median(_ape(after_p, m_tpot)),
        "runs": len(runs), "iterations": result.iterations,
    }
    conc = [r.concurrency for r in runs]
    return CalibrationProfile(
        values={k: float(v) for k, v in result.values.items()},
        defaults={k: float(start[k]) for k in result.values}, deployment=deployment,
        concurrency_range=(int(min(conc)), int(max(conc))), runs=rows, summary=summary, evidence=result.evidence,
    )
