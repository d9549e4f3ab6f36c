"""Fit named scheduler parameters to measured runs: bounded, regularised Gauss-Newton in numpy.

The parameters are :class:`~infercast.serving.backends.SchedulerParams` fields (:data:`HOST`,
:data:`GPU`). The residuals are ``log(predicted / measured)`` of every run's TTFT and (where
measured) TPOT, so a run's error counts by its ratio, not its milliseconds. Each parameter is
moved in units of its :attr:`Param.scale` from the deployment's default, and a ridge term
(:data:`RIDGE`, a prior centred on the defaults) keeps a parameter the runs cannot see (e.g. the
per-prompt-token time when every run has the same prompt length) at its default and limits how
far a few noisy runs move the others. The Jacobian is by forward differences of the
serving model itself (:data:`STEP`), each step is clipped to the parameter's bounds and halved
until the objective falls. Deterministic: no random starts.

Which fields are freed -- none, some host-side ones, or also the GPU-time scales (:data:`GPU`)
-- is chosen by leave-one-out over the runs (:func:`fit_runs`): a field is fitted only when the
runs support it, i.e. freeing it predicts runs left out of the fit better.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Param:
    """A fitted field: its unit step ``scale`` and bounds."""

    name: str
    scale: float
    lo: float
    hi: float


#: host-side parameters: front end per request, per open stream, per prompt token; per step.
#: Each field's unit step (:attr:`Param.scale`, the prior's width) is how far deployments' fitted
#: values spread from the defaults: the spread (interquartile range / 1.35) of ``fitted - default``
#: over the even-numbered groups of ``python -m benchmarks.calibration --prior-spread --half even``
#: (every field fitted to all of a group's rows), rounded; a fit, named as such. See
#: docs/modelling-log.md, 'Calibration to a user's runs'.
HOST = (
    Param("arrival_delay_ms", 40.0, 0.0, 2000.0),
    Param("front_end_per_stream_ms", 1.0, 0.0, 10.0),
    Param("front_end_per_prompt_token_ms", 0.006, 0.0, 0.05),
    Param("step_overhead_ms", 0.9, 0.0, 10.0),
)
#: GPU-time scales per phase, bounded to 0.7-1.5x of the perf tables' times (unit steps: as
#: :data:`HOST`'s)
GPU = (
    Param("prefill_scale", 0.35, 0.7, 1.5),
    Param("decode_scale", 0.17, 0.7, 1.5),
)
PARAMS = {p.name: p for p in HOST + GPU}

#: the pull toward the defaults: a field's unit step (:attr:`Param.scale`, the spread of fitted
#: values across deployments) costs as much as a 10% error (log 0.1) of one run, i.e. the runs are
#: taken to scatter by ~10% around the model
RIDGE = 0.01
STEP = 0.01
MAX_ITERATIONS = 12
MIN_RUNS_TO_SELECT = 3
SELECT_TOLERANCE = 0.1

#: predict(values) -> (TTFT ms, TPOT ms) arrays over the runs, NaN where the model has no answer
Predict = Callable[[dict], tuple[np.ndarray, np.ndarray]]


@dataclass
class Fit:
    """A fit's values (every fitted field, absolute), its objective and the predictions."""

    values: dict
    names: tuple[str, ...]
    objective: float
    ttft_ms: np.ndarray
    tpot_ms: np.ndarray
    iterations: int = 0
    evidence: dict = field(default_factory=dict)


def residuals(ttft, tpot, m_ttft, m_tpot) -> np.ndarray:
    """``log(predicted / measured)`` of TTFT and of the measured TPOTs; an unpredicted run: 10
    (a large, finite penalty)."""
    r = [np.log(np.asarray(ttft, float) / m_ttft)]
    has = np.isfinite(m_tpot)
    if has.any():
        r.append(np.log(np.asarray(tpot, float)[has] / m_tpot[has]))
    r = np.concatenate(r)
    return np.where(np.isfinite(r), r, 10.0)


def fit(predict: Predict, m_ttft, m_tpot, base: dict, names: Sequence[str], ridge: float = RIDGE) -> Fit:
    """Fit the fields ``names`` (starting from ``base``, every fitted field's default) to the
    measured ``m_ttft`` / ``m_tpot`` (ms; NaN TPOT: not measured)."""
    m_ttft = np.asarray(m_ttft, float)
    m_tpot = np.asarray(m_tpot, float)
    ps = [PARAMS[n] for n in names]
    scale = np.array([p.scale for p in ps])
    lo = np.array([p.lo for p in ps])
    hi = np.array([p.hi for p in ps])
    x0 = np.array([float(base[n]) for n in names])
    zlo, zhi = (lo - x0) / scale, (hi - x0) / scale

    def values(z):
        return {**base, **{n: float(v) for n, v in zip(names, x0 + z * scale)}}

    def evaluate(z):
        t, p = predict(values(z))
        r = residuals(t, p, m_ttft, m_tpot)
        return r, float(r @ r + ridge * z @ z), t, p

    z = np.zeros(len(names))
    r, f, t, p = evaluate(z)
    it = 0
    for it in range(1, MAX_ITERATIONS + 1):
        if not names:
            break
        jac = np.empty((r.size, z.size))
        for j in range(z.size):
            h = STEP if z[j] + STEP <= zhi[j] else -STEP
            zj = z.copy()
            zj[j] += h
            jac[:, j] = (evaluate(zj)[0] - r) / h
        a = jac.T @ jac + ridge * np.eye(z.size)
        g = jac.T @ r + ridge * z
        try:
            dz = -np.linalg.solve(a, g)
        except np.linalg.LinAlgError:
            dz = -np.linalg.lstsq(a, g, rcond=None)[0]
        improved = False
        step = 1.0
        for _ in range(8):
            zn = np.clip(z + step * dz, zlo, zhi)
            rn, fn, tn, pn = evaluate(zn)
            if fn < f:
                improved = True
                break
            step /= 2.0
        if not improved:
            break
        gain = f - fn
        z, r, f, t, p = zn, rn, fn, tn, pn
        if gain < 1e-10 * max(f, 1e-12) or gain < 1e-14:
            break
    return Fit({n: values(z)[n] for n in names}, tuple(names), f, np.asarray(t, float), np.asarray(p, float), it)


#: the parameter sets :func:`fit_runs` chooses among, simplest first: each frees these fields and
#: keeps the rest at the deployment's defaults
HOST_SETS = (
    (),
    ("arrival_delay_ms",),
    ("arrival_delay_ms", "front_end_per_stream_ms", "step_overhead_ms"),
    tuple(p.name for p in HOST),
)
GPU_SETS = (
    ("prefill_scale", "decode_scale"),
    ("arrival_delay_ms", "decode_scale"),
    ("arrival_delay_ms", "front_end_per_stream_ms", "step_overhead_ms", "prefill_scale", "decode_scale"),
    tuple(p.name for p in HOST + GPU),
)


def held_out_error(predict_subset: Callable[[Sequence[int]], Predict], m_ttft, m_tpot, base: dict, names, ridge: float) -> float:
    """Leave-one-out error of fitting ``names``: for each run, fit on the others and take the
    mean ``|log(predicted / measured)|`` of the run left out; the mean over the runs."""
    n = m_ttft.size
    errs = []
    for i in range(n):
        rest = [k for k in range(n) if k != i]
        fi = fit(predict_subset(rest), m_ttft[rest], m_tpot[rest], base, names, ridge)
        t, p = predict_subset([i])({**base, **fi.values})
        errs.append(float(np.mean(np.abs(residuals(t, p, m_ttft[[i]], m_tpot[[i]])))))
    return float(np.mean(errs))


def fit_runs(predict_subset: Callable[[Sequence[int]], Predict], m_ttft, m_tpot, base: dict, gpu: str = "auto",
             ridge: float = RIDGE, sets: Sequence[Sequence[str]] | None = None) -> Fit:
    """The calibration fit. Which fields are freed is chosen by leave-one-out: of the candidate
    sets (:data:`HOST_SETS`; with ``gpu="auto"`` also :data:`GPU_SETS`, with ``"on"`` only those,
    with ``"off"`` none of them), the simplest whose held-out error is within
    :data:`SELECT_TOLERANCE` of the best; then that set is fitted on every run. Fewer than
    :data:`MIN_RUNS_TO_SELECT` runs: the host-side fields, no GPU-time scales (nothing to hold
    out). ``predict_subset(indices)`` is the :data:`Predict` of those runs; the fit's
    ``evidence`` records every candidate's held-out error."""
    m_ttft = np.asarray(m_ttft, float)
    m_tpot = np.asarray(m_tpot, float)
    n = m_ttft.size
    if sets is None:
        sets = {"auto": HOST_SETS + GPU_SETS, "off": HOST_SETS, "on": GPU_SETS}[gpu]
    evidence: dict = {"gpu_scales": gpu}
    if n < MIN_RUNS_TO_SELECT:
        chosen = tuple(p.name for p in HOST)
        evidence["reason"] = f"{n} runs: too few to hold one out; the host-side fields fitted, no GPU-time scales"
    else:
        errs = [held_out_error(predict_subset, m_ttft, m_tpot, base, tuple(s), ridge) for s in sets]
        best = min(errs)
        pick = next(i for i, e in enumerate(errs) if e <= best * (1.0 + SELECT_TOLERANCE) + 1e-12)
        chosen = tuple(sets[pick])
        evidence["held_out_log_error"] = {(",".join(s) or "defaults"): round(e, 5) for s, e in zip(sets, errs)}
        evidence["reason"] = (f"leave-one-out over {n} runs: the simplest set within {SELECT_TOLERANCE:.0%} of the "
                              f"best held-out error ({best:.4f}) frees {', '.join(chosen) or 'nothing (defaults kept)'}")
    out = fit(predict_subset(list(range(n))), m_ttft, m_tpot, base, chosen, ridge)
    out.evidence = evidence
    return out
