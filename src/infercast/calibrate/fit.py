"""Fit named scheduler parameters to measured runs: bounded, regularised Gauss-Newton in numpy.

The parameters are :class:`~infercast.serving.backends.SchedulerParams` fields (:data:`HOST`,
:data:`GPU`). The residuals are ``log(predicted / measured)`` of every run's TTFT and (where
measured) TPOT, so a run's error counts by its ratio, not its milliseconds. Each parameter is
moved in units of its :attr:`Param.scale` from the deployment's default, and a small ridge term
(:data:`RIDGE`) keeps a parameter the runs cannot see (e.g. the per-prompt-token time when every
run has the same prompt length) at its default. The Jacobian is by forward differences of the
serving model itself (:data:`STEP`), each step is clipped to the parameter's bounds and halved
until the objective falls. Deterministic: no random starts.

GPU-time scales (:data:`GPU`) are fitted only when the runs support them (:func:`fit_runs`):
at least :data:`GPU_MIN_RUNS` runs, and a leave-one-out comparison in which fitting them lowers
the held-out error by at least :data:`GPU_GAIN`.
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


#: host-side parameters: front end per request, per open stream, per prompt token; per step
HOST = (
    Param("arrival_delay_ms", 20.0, 0.0, 10_000.0),
    Param("front_end_per_stream_ms", 0.5, 0.0, 100.0),
    Param("front_end_per_prompt_token_ms", 0.003, 0.0, 1.0),
    Param("step_overhead_ms", 0.5, 0.0, 100.0),
)
#: GPU-time scales per phase, bounded to 0.7-1.5x of the perf tables' times
GPU = (
    Param("prefill_scale", 0.1, 0.7, 1.5),
    Param("decode_scale", 0.1, 0.7, 1.5),
)
PARAMS = {p.name: p for p in HOST + GPU}

RIDGE = 1e-6
STEP = 0.01
MAX_ITERATIONS = 12
GPU_MIN_RUNS = 3
GPU_GAIN = 0.8

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


def fit(predict: Predict, m_ttft, m_tpot, base: dict, names: Sequence[str]) -> Fit:
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
        return r, float(r @ r + RIDGE * z @ z), t, p

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
        a = jac.T @ jac + RIDGE * np.eye(z.size)
        g = jac.T @ r + RIDGE * z
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


def fit_runs(predict_subset: Callable[[Sequence[int]], Predict], m_ttft, m_tpot, base: dict,
             host: Sequence[str] = tuple(p.name for p in HOST), gpu: str = "auto") -> Fit:
    """The calibration fit: ``host`` fields always; the :data:`GPU` scales with ``gpu="auto"``
    when the runs support them (see the module docstring), ``"on"`` always, ``"off"`` never.
    ``predict_subset(indices)`` is the :data:`Predict` of those runs."""
    m_ttft = np.asarray(m_ttft, float)
    m_tpot = np.asarray(m_tpot, float)
    n = m_ttft.size
    every = list(range(n))
    gpu_names = tuple(p.name for p in GPU)
    host = tuple(host)
    evidence: dict = {"gpu_scales": gpu}
    use_gpu = gpu == "on"
    if gpu == "auto":
        if n < GPU_MIN_RUNS:
            evidence["reason"] = f"{n} runs: GPU-time scales need at least {GPU_MIN_RUNS}"
        else:
            errs = {False: [], True: []}
            for i in range(n):
                rest = [k for k in every if k != i]
                for with_gpu in (False, True):
                    fi = fit(predict_subset(rest), m_ttft[rest], m_tpot[rest], base,
                             host + (gpu_names if with_gpu else ()))
                    t, p = predict_subset([i])({**base, **fi.values})
                    errs[with_gpu].append(float(np.mean(np.abs(residuals(t, p, m_ttft[[i]], m_tpot[[i]])))))
            without, with_ = float(np.mean(errs[False])), float(np.mean(errs[True]))
            use_gpu = with_ < GPU_GAIN * without
            evidence.update(held_out_log_error_host_only=round(without, 5), held_out_log_error_with_gpu=round(with_, 5))
            evidence["reason"] = (f"leave-one-out: fitting the GPU-time scales {'lowers' if use_gpu else 'does not lower'} "
                                  f"the held-out error by more than {1 - GPU_GAIN:.0%} ({without:.4f} -> {with_:.4f})")
    out = fit(predict_subset(every), m_ttft, m_tpot, base, host + (gpu_names if use_gpu else ()))
    out.evidence = evidence
    return out
