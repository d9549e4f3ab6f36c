"""Energy per request and per output token, where the perf tables measured power.

The energy of a step is its ops' ``power x latency`` (:mod:`infercast.engine.energy`); an op
without measured power contributes none. What is reported (:func:`energy_report`), per request
and per output token:

* ``measured_j_per_request`` / ``measured_j_per_token``: the measured ops' energy, summed over
  the steps a request takes part in (its share of each: one of the requests a step serves) and
  over the GPUs that run them. It is the *measured part* only: ops without measured power, host
  time between kernels and idle GPUs add energy it does not hold;
* ``coverage``: the share of the predicted GPU (kernel) time whose power was measured;
* ``upper_bound_j_per_request`` / ``..._per_token``: the measured part plus every other
  GPU-second of the deployment per request (``gpus / throughput``: unmeasured ops, host time,
  idle GPUs) at the board TDP (``gpu.power`` in the system YAML) -- a bound, not an estimate;
* with no measured op (coverage 0) every number is None: energy is *not available*, never 0.

Which steps a request takes part in:

* ``serve``: the steady state's average step (:attr:`~infercast.serving.agg.ServingResult.step_mix`:
  decode-only steps and steps carrying prefill, in the proportions the steady state runs them),
  which completes ``requests`` requests; the first wave is not included. A result played out step
  by step (lock-step waves, one output token) has no energy here;
* ``serve-disagg``: a prompt's share of its prefill batch (or its prefill chunks) on a prefill
  worker, and its share of each of its decode steps on a decode worker;
* ``estimate``: the batch's prefill step and the mean decode step over the output, shared by the
  batch's requests.

A step's ops run on the GPUs of one pipeline stage at a time (the plan's stages run one after the
other), so a step's energy is one GPU's times ``gpus / pp`` of the rank.
"""

from __future__ import annotations

import math

import numpy as np

from ..engine.energy import EnergyModel, StepEnergy


def active_gpus(est) -> float:
    """GPUs of one attention-DP rank of ``est`` that run a step's ops at once (one pipeline stage)."""
    par = est.plan.parallel
    return est.gpus_per_rank / par.pp


def energy_report(model: EnergyModel | list[EnergyModel], per_request: StepEnergy, osl: int, gpu_s_per_request: float,
                  tdp_w: float, basis: str) -> dict:
    """The reported energy (module docstring) of ``per_request``: one request's measured energy
    (mJ) and its covered and total GPU time (GPU-ms, summed over the GPUs that ran them);
    ``gpu_s_per_request``: GPU-seconds of the deployment per request (every GPU, idle or not);
    ``basis``: which steps were summed, in words."""
    models = model if isinstance(model, list) else [model]
    measured = sorted({name for m in models for name in m.measured})
    cov = per_request.coverage
    out = {"available": cov > 0, "coverage": cov, "measured_j_per_request": None, "measured_j_per_token": None,
           "upper_bound_j_per_request": None, "upper_bound_j_per_token": None, "tdp_w": tdp_w or None,
           "measured_ops": measured, "basis": basis}
    if not cov > 0:
        out["note"] = "not available: no op of this deployment has measured power in its perf table"
        return out
    j = per_request.energy_mj / 1e3
    out["measured_j_per_request"] = j
    out["measured_j_per_token"] = j / osl
    if tdp_w and math.isfinite(gpu_s_per_request):
        rest = max(gpu_s_per_request - per_request.covered_ms / 1e3, 0.0)
        bound = j + rest * tdp_w
        out["upper_bound_j_per_request"] = bound
        out["upper_bound_j_per_token"] = bound / osl
    out["note"] = (f"measured part: {cov:.0%} of the GPU time ({', '.join(measured)}) at measured power; the upper bound "
                   f"puts every other GPU-second at the {tdp_w:g} W TDP")
    return out


def with_scales_note(energy: dict | None, *params) -> dict | None:
    """``energy`` with a note when a scheduler of ``params`` scales the GPU time (a calibration's
    ``prefill_scale`` / ``decode_scale``): the energy stays at the tables' kernel times."""
    scaled = [p for p in params if p is not None and (p.prefill_scale != 1.0 or p.decode_scale != 1.0)]
    if energy is not None and energy.get("available") and scaled:
        energy["note"] += ("; the calibration's GPU-time scales are not applied to energy (the tables' kernel times "
                           "and measured power are)")
    return energy


def _not_modelled(why: str) -> dict:
    return {"available": False, "coverage": None, "measured_j_per_request": None, "measured_j_per_token": None,
            "upper_bound_j_per_request": None, "upper_bound_j_per_token": None, "note": f"not available: {why}"}


def agg_energy(est, res, osl: int) -> dict:
    """``serve``'s energy of a :class:`~infercast.serving.agg.ServingResult` of ``est``'s layout
    (one attention-DP rank's steady state)."""
    mix = getattr(res, "step_mix", None)
    if mix is None or not mix["requests"] > 0:
        return _not_modelled("the result is played out step by step (lock-step waves or one output token), "
                             "not as a steady state of steps")
    model = EnergyModel.of(est.engine)
    step = StepEnergy()
    for w, shape in mix["steps"]:
        if w > 0:
            step = step + model.step(**shape).scaled(w)
    per_request = step.scaled(active_gpus(est) / mix["requests"])
    tps = res.tokens_per_s_per_gpu
    return energy_report(model, per_request, osl, osl / tps if tps > 0 else math.inf, est.data.system.gpu.power_w,
                         "steady state: the average step's energy over the requests it completes")


def disagg_energy(pe, de, res, isl: int, osl: int, params_prefill, params_decode, prefix: int = 0) -> dict:
    """``serve-disagg``'s energy of a :class:`~infercast.serving.disagg.DisaggResult`: a prompt's
    share of its prefill batch (or chunks) on ``pe``'s layout and of its decode steps on ``de``'s
    (``prefix``: cached prompt tokens before the ``isl`` new ones, :mod:`.prefix`)."""
    pm, dm = EnergyModel.of(pe.engine), EnergyModel.of(de.engine)
    budget = params_prefill.max_num_tokens
    k = max(int(res.prefill_batch), 1)
    if isl <= budget:
        pre = pm.step(ctx_batch=float(k), ctx_isl=float(isl), ctx_prefix=float(prefix)).scaled(1.0 / k)
    else:  # one prompt in chunks, each after the ones before it (serving.disagg._PrefillService)
        chunks = math.ceil(isl / budget)
        chunk = isl / chunks
        pre = pm.step(ctx_batch=1.0, ctx_isl=chunk, ctx_prefix=np.arange(chunks) * chunk + prefix)
    per_request = pre.scaled(active_gpus(pe))
    d = float(res.decode_batch)
    out_steps = max((osl - 1) / float(getattr(de.engine, "tokens_per_step", 1.0)), 1.0) if osl > 1 else 0.0
    if out_steps > 0 and d > 0:
        dd = max(d, 1.0)
        dec = dm.step(dec_batch=dd, dec_kv=prefix + isl + osl / 2.0, dec_pad=params_decode.graph_pad(dd))
        per_request = per_request + dec.scaled(active_gpus(de) * out_steps / dd)
    tps = res.tokens_per_s_per_gpu
    return energy_report([pm, dm], per_request, osl, osl / tps if tps > 0 else math.inf, pe.data.system.gpu.power_w,
                         "steady state: a prompt's share of its prefill batch and of its decode steps")


def static_energy(est, batch: int, isl: int, osl: int, prefix: int, tokens_per_s_per_gpu: float | None,
                  decode_kv=None, decode_weights=None, decode_steps: float = 0.0) -> dict:
    """``estimate``'s energy: the batch's prefill step and its ``decode_steps`` decode steps (their
    mean over the KV lengths ``decode_kv`` with ``decode_weights``, as
    :meth:`~infercast.Estimator.decode_ms` averages), shared by the batch's requests."""
    model = EnergyModel.of(est.engine)
    b = float(batch)
    total = model.step(ctx_batch=b, ctx_isl=float(isl), ctx_prefix=float(prefix), phase="prefill")
    if decode_steps > 0:
        kv, w = np.asarray(decode_kv, dtype=float), np.asarray(decode_weights, dtype=float)
        dec = model.step(weights=w / w.sum(), dec_batch=np.full(kv.shape, b), dec_kv=kv, phase="decode")
        total = total + dec.scaled(decode_steps)
    per_request = total.scaled(active_gpus(est) / b)
    tps = tokens_per_s_per_gpu or 0.0
    return energy_report(model, per_request, osl, osl / tps if tps > 0 else math.inf, est.data.system.gpu.power_w,
                         "the batch's prefill step and decode steps, over its requests")
