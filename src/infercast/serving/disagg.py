"""Disaggregated serving: prefill workers and decode workers, each with its own parallelism,
under the same closed-loop benchmark as :mod:`.agg`.

A request queues for a prefill worker, is prefilled there (its first token comes back from the
prefill worker), its KV cache moves to a decode worker, and it decodes ``osl - 1`` tokens in the
decode worker's continuous batch (decode-only steps). Solved for the steady state:

* decode pool: each decode worker (per attention-DP rank) carries ``D`` running requests; a
  client's request spends ``osl - 1`` decode steps there and the rest of its cycle (prefill
  queue + prefill + KV transfer) elsewhere, so ``D = C_rank (osl-1) / (osl-1 + outside / step)``;
  TPOT = decode step at ``D`` and the mean KV length, plus the KV transfer spread over the
  output. A decode rank runs at most its scheduler's ``max_batch_size`` requests: when the
  closed loop would put more there, ``D`` is that cap, the pool completes at most ``D / (osl-1)``
  requests per step and rank, the cycle stretches to ``C_rank (osl-1) step / D``, and the rest
  of it is each request's wait for a decode slot after its KV arrives (:func:`slot_wait_ms`);
  the first token came from the prefill worker, so the wait falls between the first and second
  tokens, in TPOT;
* prefill pool: requests arrive at ``lam = C / cycle`` (Little's law); each attention-DP rank of
  a prefill worker runs batches of at least ``prefill_batch`` prompts (chunked by its token
  budget) and, under load, of the prompts that arrived while the previous batch ran:
  ``k = ceil(lam x T(k) / ranks)``, a fixed point, up to its token budget (``budget // isl``; see
  docs/modelling-log.md, 'Disaggregated prefill batches grow with the queue');
  utilisation ``rho = lam x service / (workers x dp)``. The queueing wait is the closed loop's,
  not an open queue's: ``C`` clients cycle between the prefill pool and everything else (decode,
  KV transfer, front end: their "think time"), so the queue can never hold more than ``C`` prompts
  and it stops growing when the pool saturates, where an open M/D/1 queue's
  ``rho / (2 (1 - rho))`` diverges. Schweitzer's approximate mean value analysis of that closed
  network (the pool as one queue of per-prompt service ``batch / (k x ranks)``, the rest of a
  prompt's own batch as a pure delay) gives it, with deterministic service halving the queue a
  prompt finds (:data:`DETERMINISTIC_QUEUE_FACTOR`) below saturation, and the bottleneck bound
  (throughput at most the pool's) at it. Known limit: deployments whose prefill workers were
  configured beyond the backend defaults the model assumes (token budget, batch; the rows do not
  record them) prefill faster than modelled where the pool saturates. See docs/modelling-log.md,
  'Disaggregated prefill queue as a closed loop';
* the first wave (all clients at once) queues ``C / workers`` prompts per prefill worker; mean
  TTFT mixes it in with weight ``1 / requests_per_client`` as in aggregated serving.

Percentiles (:mod:`.result`): a steady-state request waits 0 with probability ``1 - rho`` (a free
prefill rank) and otherwise an exponential tail with the closed loop's mean wait above (the usual
heavy-traffic shape of a queueing wait); a first-wave request is in batch ``j`` of its worker's
``ceil(C / workers / k)`` batches with equal probability; every request decodes through the same
decode-only steps, so TPOT has no spread in this model (its percentiles equal the mean).

A variant tried and rejected (the first token as the decode worker streams it): see
docs/modelling-log.md, 'Disaggregated first token from the decode worker'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .backends import SchedulerParams
from .decode_curve import DecodeCurve, decode_gpu_ms, graph_pad
from .result import (
    PERCENTILES,
    QUANTILE_POINTS,
    Distribution,
    ServingMetrics,
    _unit_exponential,
    blend_parts,
    exponential_tail,
    mixture,
    ttft_parts,
)
from .sim import check_prompt_fits_budget

#: benchmark length (requests per client) of the disaggregated benchmarks: the first wave's weight
#: in mean TTFT. A fit to the development disaggregated silicon rows, whose harness differs from the
#: aggregated rows' (see docs/modelling-log.md, 'Disaggregated benchmark length').
DISAGG_REQUESTS_PER_CLIENT = 4.0
#: prefill ranks grow their batches with the queue (module docstring); False keeps them at the
#: configured batch (the model before that rule, kept switchable for comparison)
ADAPTIVE_PREFILL_BATCH = True


@dataclass
class DisaggResult(ServingMetrics):
    decode_batch: float
    prefill_utilisation: float
    kv_transfer_ms: float
    prefill_batch: int = 1  # prompts per prefill step in the steady state
    arrival_rate_per_s: float = 0.0  # requests per second reaching the prefill pool (steady state)
    decode_kv_capacity: float | None = None  # requests of isl+osl one decode rank's KV cache holds (if known)
    decode_slot_wait_ms: float = 0.0  # mean wait for a decode slot when the decode ranks run max_batch_size (in TPOT)
    prefill_kv_capacity: float | None = None  # prompts of isl tokens one prefill rank's KV cache holds (if known)


def kv_transfer_ms(kv_bytes_per_token_per_gpu: float, isl: int, prefill_gpus: int, bandwidth: float, latency_s: float,
                   state_bytes_per_gpu: float = 0.0) -> float:
    """Moving one request's KV cache: every prefill GPU sends its share in parallel; a hybrid
    model's fixed-size recurrent state (``state_bytes_per_gpu``: Gated DeltaNet, Mamba2 SSM + conv)
    moves with it."""
    per_gpu = kv_bytes_per_token_per_gpu * isl + state_bytes_per_gpu
    return per_gpu / bandwidth * 1e3 + latency_s * 1e3


#: The steady state of a disaggregated deployment is the fixed point of (TTFT, decode batch) ->
#: (the TTFT and decode batch they imply). Each element steps the whole way to the map's answer
#: while the steps shrink, and from the first step that does not, this fraction of the way
#: (damped: near a prefill batch size's integer step the map can have no fixed point, and full
#: steps would jump between its two sides for ever); it stops when a step is under 1e-6 of the
#: values, or after ``iterations``. See docs/modelling-log.md, 'Disaggregated fixed point: full
#: steps while they shrink'.
FIXED_POINT_DAMPING = 0.5

#: share of the queue ahead that a new prompt waits for, relative to exponential service: prefill
#: batches take a fixed time, and deterministic service halves the mean wait (the M/D/1 to M/M/1
#: ratio, (1 + cv^2) / 2 with cv = 0). See docs/modelling-log.md, 'Disaggregated prefill queue as a
#: closed loop'.
DETERMINISTIC_QUEUE_FACTOR = 0.5


def _closed_loop_wait(clients: float, s: float, delay: float, think: float,
                      det: float = DETERMINISTIC_QUEUE_FACTOR) -> float:
    """Mean queueing wait at the prefill pool of a closed loop of ``clients``: Schweitzer's
    approximate mean value analysis of one queue (per-prompt service ``s`` of the whole pool), a
    pure delay ``delay`` (the rest of a prompt's own batch) and the clients' think time ``think``
    (decode, transfer, front end); ``det`` scales the queue a prompt finds
    (:data:`DETERMINISTIC_QUEUE_FACTOR`), and the answer respects the bottleneck bound (throughput
    at most ``1 / s``).

    The analysis is a fixed point: response ``r = s (1 + a Q)`` with ``a = det (C - 1) / C``,
    throughput ``X = C / (r + D)`` with ``D = delay + think``, queue ``Q = X r``. Eliminating ``r``
    and ``X`` leaves ``a s Q^2 + (s + D - C a s) Q - C s = 0``, whose positive root is the fixed
    point (``Q = C s / (s + D)`` when ``a = 0``)."""
    C, D = float(clients), delay + think
    a = det * (C - 1.0) / C
    if a > 0.0 and s > 0.0:
        b = s + D - C * a * s
        q = (-b + math.sqrt(b * b + 4.0 * a * s * C * s)) / (2.0 * a * s)
    else:
        q = C * s / (s + D) if s + D > 0.0 else 0.0
    r = s * (1.0 + a * q)
    # the bottleneck bound: the pool serves at most 1/s prompts per ms, so a cycle lasts at least
    # clients x s (the deterministic factor alone would let throughput exceed it near saturation)
    r = max(r, C * s - delay - think)
    return max(r - s, 0.0)


def _decode_step(engine, params: SchedulerParams, d: float, kv: float) -> float:
    """Wall time of one decode-only step of ``d`` sequences (CUDA-graph padding included)."""
    return params.step_ms(engine.decode_scalar(d, kv, params.graph_pad(d)), d)


class _PrefillService:
    """What the prefill side of :func:`solve_disagg` needs, independent of the worker counts and
    the clients: the scheduler (with the router's front end), prompts per step and the batch cap,
    and each batch size's wall time (memoised)."""

    def __init__(self, prefill_engine, isl: int, prefill_batch: int, params_prefill: SchedulerParams):
        # a disaggregated deployment is fronted by its router (e.g. Dynamo's), not the engine's API
        # server, whose per-stream work and prompt tokenisation ``front_end_per_stream_ms`` and
        # ``front_end_per_prompt_token_ms`` stand for: the base time only
        self.params = params = params_prefill.for_streams(0)
        self.engine, self.isl = prefill_engine, isl
        pb = max(1, int(prefill_batch))
        budget = params.max_num_tokens
        check_prompt_fits_budget(isl, params)
        self.cost: dict[int, float] = {}  # prompts in a prefill batch -> its wall time (ms)
        if isl <= budget:
            self.per_step = max(1, min(pb, budget // isl))
            # under load a prefill rank batches the prompts waiting for it, up to its token budget
            self.cap = max(self.per_step, budget // isl) if ADAPTIVE_PREFILL_BATCH else self.per_step
        else:  # one prompt, chunked over several steps
            chunks = math.ceil(isl / budget)
            chunk = isl / chunks
            self.per_step = self.cap = 1
            self.cost[1] = sum(
                params.step_ms(prefill_engine.mixed_step_ms([1], [chunk], [i * chunk], 0.0, 1.0), 1) for i in range(chunks)
            )

    def batch_ms(self, k: int) -> float:
        if k not in self.cost:
            self.cost[k] = self.params.step_ms(self.engine.mixed_step_ms([k], [self.isl], [0.0], 0.0, 1.0), k)
        return self.cost[k]

    def batch_ms_many(self, k: np.ndarray) -> np.ndarray:
        """:meth:`batch_ms` of each of an integer array."""
        u, inv = np.unique(k, return_inverse=True)
        return np.array([self.batch_ms(int(x)) for x in u])[inv].reshape(k.shape)


def _out_steps(decode_engine, osl: int, transfer_ms: float) -> tuple[float, float]:
    """(decode steps per request, KV transfer ms): none and 0 with one output token (the prefill
    worker's first token completes the request; no KV moves)."""
    tau = float(getattr(decode_engine, "tokens_per_step", 1.0))  # output tokens per decode step (MTP)
    if osl <= 1:
        return 0.0, 0.0
    return max((osl - 1) / tau, 1.0), transfer_ms


def slot_wait_ms(c_rank, busy, cap, ttft, transfer):
    """Mean wait for a decode slot (ms; scalar or array): with at most ``cap`` requests running
    per decode rank, each busy ``busy`` ms (its decode steps), ``c_rank`` clients per rank cycle
    in at least ``c_rank x busy / cap`` ms; what that leaves beyond the request's TTFT, KV
    transfer and decoding is spent waiting for a slot (0 while the cap does not bind)."""
    return np.maximum(c_rank * busy / cap - (ttft + busy + transfer), 0.0) if np.ndim(c_rank) or np.ndim(ttft) \
        else max(c_rank * busy / cap - (ttft + busy + transfer), 0.0)


def solve_disagg(
    prefill_engine,
    decode_engine,
    concurrency: float,
    isl: int,
    osl: int,
    prefill_workers: int,
    decode_workers: int,
    decode_dp: int,
    prefill_batch: int,
    params_prefill: SchedulerParams,
    params_decode: SchedulerParams,
    transfer_ms: float,
    gpus: int,
    iterations: int = 30,
    prefill_dp: int = 1,
    prefill_service: _PrefillService | None = None,
) -> DisaggResult:
    """The steady state and first wave of one deployment (module docstring);
    :func:`solve_disagg_many` solves many worker counts and client counts at once.
    ``prefill_service``: a :class:`_PrefillService` of the same prefill engine, ``isl``,
    ``prefill_batch`` and scheduler, to reuse its memoised batch times."""
    C = float(concurrency)
    ps = prefill_service or _PrefillService(prefill_engine, isl, prefill_batch, params_prefill)
    params_prefill = ps.params
    # each attention-DP rank of a prefill worker prefills its own requests
    servers = max(prefill_workers * max(prefill_dp, 1), 1)
    out_steps, transfer_ms = _out_steps(decode_engine, osl, transfer_ms)
    ranks = max(decode_workers * decode_dp, 1)
    c_rank = C / ranks
    kv = isl + osl / 2.0
    per_step, batch_cap, batch_ms = ps.per_step, ps.cap, ps.batch_ms

    service_batch = batch_ms(per_step)
    d = c_rank * out_steps / (out_steps + 2.0)
    ttft = service_batch
    rho = 0.0
    k_steady = per_step
    lam = 0.0
    cap = float(params_decode.max_batch_size)
    weight, last = 1.0, math.inf  # full steps while they shrink, then half steps (FIXED_POINT_DAMPING)
    for _ in range(iterations):
        step = _decode_step(decode_engine, params_decode, max(d, 1.0), kv)
        # at most ``cap`` requests decode per rank: the cycle is at least c_rank x busy / cap
        slot = slot_wait_ms(c_rank, out_steps * step, cap, ttft, transfer_ms)
        cycle = ttft + out_steps * step + transfer_ms + slot
        lam = C / cycle  # requests per ms
        # a batch holds the prompts that arrived while the previous one ran (fixed point)
        k = per_step
        for _ in range(8):
            k_new = min(batch_cap, max(per_step, math.ceil(lam * batch_ms(k) / servers - 1e-9)))
            if k_new == k:
                break
            k = k_new
        service_batch, service, k_steady = batch_ms(k), batch_ms(k) / k, k
        rho = min(lam * service / servers, 0.999)
        # the closed loop's queue at the prefill pool (module docstring)
        wait = _closed_loop_wait(C, service / servers, service_batch - service / servers,
                                 out_steps * step + transfer_ms + slot + params_prefill.arrival_delay_ms)
        ttft_new = wait + service_batch + params_prefill.arrival_delay_ms
        outside = ttft_new + transfer_ms
        d_new = min(c_rank * out_steps / (out_steps + outside / step), cap)
        if abs(ttft_new - ttft) < 1e-6 * ttft and abs(d_new - d) < 1e-6 * max(d, 1.0):
            ttft, d = ttft_new, d_new
            break
        size = max(abs(ttft_new - ttft) / ttft, abs(d_new - d) / max(d, 1.0))
        if size >= last:
            weight = FIXED_POINT_DAMPING
        last = size
        ttft, d = ttft + weight * (ttft_new - ttft), d + weight * (d_new - d)
    step = _decode_step(decode_engine, params_decode, max(d, 1.0), kv)
    slot = slot_wait_ms(c_rank, out_steps * step, cap, ttft, transfer_ms)
    return _disagg_result(ps, C, osl, servers, out_steps, transfer_ms, gpus, ttft, d, step, rho, k_steady, lam, slot)


def _ttft_percentiles_many(first_batch, front, n_batches, wait_mean, p_zero, shift, k: float,
                           qs: tuple = PERCENTILES) -> np.ndarray:
    """The TTFT percentiles ``qs`` (default :data:`~infercast.serving.result.PERCENTILES`, one row each) of
    :func:`_disagg_result`'s per-request mixture for arrays of deployments, without building the
    mixture: the same values as :meth:`~infercast.serving.result.Distribution.percentiles` of it
    (the smallest value with at least ``q`` % of the weight at or below it; the cumulative weights
    summed in another order differ by rounding only, far inside that method's 1e-12 guard).

    The mixture has two sorted parts: the first wave, ``j x first_batch + front`` for ``j = 1 ..
    n_batches`` with weight ``1 / (k n_batches)`` each, and the steady state, a point at ``shift``
    (weight ``p_zero``) and the :data:`~infercast.serving.result.QUANTILE_POINTS` midpoints of an
    exponential tail above it, together weighing ``(k - 1) / k``. The answer is found by bisection
    over the steady points (the first whose cumulative weight, first-wave points below it included,
    reaches the target), then the first-wave point, if any, between that steady point and the one
    before it that reaches the target first."""
    fb, front, shift = (np.asarray(x, dtype=float) for x in (first_batch, front, shift))
    nb = np.asarray(n_batches, dtype=np.int64)
    wm = np.asarray(wait_mean, dtype=float)
    p0 = np.clip(np.asarray(p_zero, dtype=float), 0.0, 1.0)
    x, x_mean = _unit_exponential(QUANTILE_POINTS)
    tail = (wm > 0) & (p0 < 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(tail, wm / (1.0 - p0) / x_mean, 0.0)
    steady_share = (k - 1.0) / k
    # the steady points: m < z is the point at ``shift``, m >= z the tail's (m - z)-th midpoint
    z = np.where(tail & (p0 <= 0.0), 0, 1)
    n_steady = np.where(tail, QUANTILE_POINTS + z, 1)
    w0 = np.where(tail, p0 * steady_share, steady_share) * z
    wt = np.where(tail, (1.0 - p0) / QUANTILE_POINTS * steady_share, 0.0)
    wf = (1.0 / nb) * (1.0 / k)

    def value(m):
        i = np.clip(m - z, 0, QUANTILE_POINTS - 1)
        return np.where(m < z, shift, x[i] * scale + shift)

    def below(v):  # first-wave points at or below v
        with np.errstate(divide="ignore", invalid="ignore"):
            j = np.where(fb > 0, np.floor((v - front) / np.where(fb > 0, fb, 1.0)), np.where(v >= front, nb, 0))
        j = np.clip(np.nan_to_num(j, nan=0.0, posinf=nb, neginf=0.0), 0, nb).astype(np.int64)
        j = np.where((j < nb) & ((j + 1) * fb + front <= v), j + 1, j)
        return np.where((j > 0) & (j * fb + front > v), j - 1, j)

    total = 1.0 / k + steady_share
    # every percentile at once: a row per percentile, each element bisected on its own (the same
    # elementwise operations as one percentile at a time, a third of the numpy calls)
    target = np.array([[q / 100.0 * total * (1.0 - 1e-12)] for q in qs])
    lo = np.zeros((len(qs), fb.size), dtype=n_steady.dtype)
    hi = np.broadcast_to(n_steady, lo.shape).copy()
    while True:
        live = lo < hi
        if not live.any():
            break
        mid = (lo + hi) // 2
        reached = w0 + (mid + 1 - z) * wt + wf * below(value(mid)) >= target
        hi = np.where(live & reached, mid, hi)
        lo = np.where(live & ~reached, mid + 1, lo)
    m = lo  # n_steady: no steady point reaches the target
    at = np.where(m < n_steady, value(m), np.inf)
    first = m == 0
    prev = np.where(first, -np.inf, value(m - 1))
    s_prev = np.where(first, 0.0, w0 + (m - z) * wt)
    j_lo = np.where(first, 1, below(prev) + 1)
    need = target - s_prev
    j0 = np.maximum(np.ceil(need / wf), 1).astype(np.int64)
    j0 = np.where((j0 > 1) & ((j0 - 1) * wf >= need), j0 - 1, j0)
    j0 = np.where(j0 * wf < need, j0 + 1, j0)
    j = np.maximum(j0, j_lo)
    fv = np.minimum(j, nb) * fb + front
    return np.where(((j <= nb) & (fv < at)) | np.isinf(at), fv, at)


def _disagg_result(ps: _PrefillService, C: float, osl: int, servers: int, out_steps: float, transfer_ms: float,
                   gpus: int, ttft: float, d: float, step: float, rho: float, k_steady: int, lam: float,
                   slot: float = 0.0) -> DisaggResult:
    """The :class:`DisaggResult` of a solved steady state: TPOT, the first wave, the means and
    their spread (module docstring), with the per-request distributions behind the percentiles
    (:func:`_disagg_results_many` does the same for arrays, without them). ``slot``: the wait for
    a decode slot (:func:`slot_wait_ms`), in TPOT."""
    batch_cap, per_step, batch_ms = ps.cap, ps.per_step, ps.batch_ms
    service_batch = batch_ms(k_steady)
    tpot = (out_steps * step + transfer_ms + slot) / max(osl - 1, 1)  # 0 with one output token (all 0 above)
    # first wave: C prompts at once over the prefill workers
    per_worker = C / servers
    kf = min(batch_cap, max(per_step, math.ceil(per_worker)))
    n_batches = math.ceil(per_worker / kf)
    front = ps.params.arrival_delay_ms
    first_batch = batch_ms(kf)
    first = (n_batches + 1) / 2.0 * first_batch + front
    k = DISAGG_REQUESTS_PER_CLIENT
    ttft_mean = (first + (k - 1.0) * ttft) / k
    latency = ttft_mean + max(osl - 1, 1) * tpot
    wait_mean = max(ttft - service_batch - front, 0.0)
    res = DisaggResult(
        concurrency=C,
        ttft_ms=ttft_mean,
        tpot_ms=tpot,
        request_latency_ms=latency,
        tokens_per_s_per_gpu=C / latency * osl * 1e3 / gpus,
        tokens_per_s_per_user=1e3 / tpot if tpot > 0 else 0.0,
        decode_batch=d,
        prefill_utilisation=rho,
        kv_transfer_ms=transfer_ms,
        prefill_batch=int(k_steady),
        arrival_rate_per_s=lam * 1e3,
        decode_slot_wait_ms=slot,
        # a first-wave prompt waits for the batches ahead of it on its worker: (n - 1) / 2 on average
        ttft_parts=blend_parts(
            (ttft_parts(front, (n_batches - 1) / 2.0 * first_batch, first_batch), 1.0),
            (ttft_parts(front, wait_mean, ttft - front - wait_mean), k - 1.0)),
    )
    # per-request spread (module docstring)
    first_dist = Distribution(np.arange(1, n_batches + 1) * first_batch + front, np.ones(n_batches))
    steady_dist = exponential_tail(wait_mean, 1.0 - rho).shifted(ttft - wait_mean)
    res.set_percentiles(mixture((first_dist, 1.0 / k), (steady_dist, (k - 1.0) / k)), Distribution.point(tpot))
    return res


#: the values of :func:`_disagg_results_many`'s ``columns`` answer, in order: the
#: :class:`DisaggResult` fields, ``ttft_front_end`` / ``ttft_wait`` / ``ttft_prefill`` its
#: ``ttft_parts``, ``ttft_p50_ms`` .. ``ttft_p99_ms`` its TTFT percentiles (TPOT's are ``tpot_ms``)
DISAGG_COLUMNS = ("concurrency", "ttft_ms", "tpot_ms", "request_latency_ms", "tokens_per_s_per_gpu",
                  "tokens_per_s_per_user", "decode_batch", "prefill_utilisation", "kv_transfer_ms", "prefill_batch",
                  "arrival_rate_per_s", "ttft_front_end", "ttft_wait", "ttft_prefill", "ttft_p50_ms", "ttft_p90_ms",
                  "ttft_p99_ms", "decode_slot_wait_ms")


def _disagg_results_many(C: np.ndarray, osl: int, servers: np.ndarray, out_steps: float, transfer: np.ndarray,
                         gpus: np.ndarray, ttft: np.ndarray, d: np.ndarray, step: np.ndarray, rho: np.ndarray,
                         k_steady: np.ndarray, lam: np.ndarray, front: np.ndarray, per_step: np.ndarray,
                         batch_cap: np.ndarray, batch_ms, slot: np.ndarray | float = 0.0,
                         columns: bool | tuple = False) -> list[DisaggResult] | dict[str, list | np.ndarray]:
    """:func:`_disagg_result` for arrays of solved steady states (each element's prefill service
    given by its ``front`` (arrival delay), ``per_step``, ``batch_cap`` and ``batch_ms(k)``, the
    wall time of a batch of ``k`` prompts on each element's prefill engine): the same operations
    element by element, so the same numbers, and the same percentiles
    (:func:`_ttft_percentiles_many`); the results keep no per-request distributions.
    ``columns``: instead of the results, {name in :data:`DISAGG_COLUMNS`: the list of their values}
    (for callers that read a few fields of very many results); a tuple of names: those columns
    alone, as arrays (the TTFT percentiles among them the only ones worked out)."""
    service_batch = batch_ms(k_steady)
    tpot = (out_steps * step + transfer + slot) / max(osl - 1, 1)
    per_worker = C / servers
    kf = np.minimum(batch_cap, np.maximum(per_step, np.ceil(per_worker))).astype(np.int64)
    n_batches = np.ceil(per_worker / kf).astype(np.int64)
    first_batch = batch_ms(kf)
    first = (n_batches + 1) / 2.0 * first_batch + front
    k = DISAGG_REQUESTS_PER_CLIENT
    ttft_mean = (first + (k - 1.0) * ttft) / k
    latency = ttft_mean + max(osl - 1, 1) * tpot
    wait_mean = np.maximum(ttft - service_batch - front, 0.0)
    with np.errstate(divide="ignore"):
        per_user = np.where(tpot > 0, 1e3 / np.where(tpot > 0, tpot, 1.0), 0.0)
    # the mean TTFT's parts: the first wave's (weight 1) and the steady state's (weight k - 1), as blend_parts
    parts = [(p1 * 1.0 + p2 * (k - 1.0)) / (1.0 + (k - 1.0)) for p1, p2 in zip(
        (front, (n_batches - 1) / 2.0 * first_batch, first_batch), (front, wait_mean, ttft - front - wait_mean))]
    named = isinstance(columns, tuple)
    qs = tuple(q for q in PERCENTILES if not named or f"ttft_p{q}_ms" in columns)
    pct = dict(zip(qs, _ttft_percentiles_many(first_batch, front, n_batches, wait_mean, 1.0 - rho, ttft - wait_mean, k, qs)
                   if qs else ()))
    arrays = (C, ttft_mean, tpot, latency, C / latency * osl * 1e3 / gpus, per_user, d, rho, transfer, k_steady, lam * 1e3,
              *parts, *(pct.get(q) for q in PERCENTILES), np.broadcast_to(slot, C.shape))
    if named:
        return {name: x for name, x in zip(DISAGG_COLUMNS, arrays) if name in columns}
    cols = [x.tolist() for x in arrays]
    if columns:
        return dict(zip(DISAGG_COLUMNS, cols))
    assert PERCENTILES == (50, 90, 99)  # the keywords below
    # positional fields (concurrency .. tokens_per_s_per_user, decode_batch .. arrival_rate_per_s)
    # and every keyword in one call: about half the cost of keywords and setattr
    return [DisaggResult(c, tm, tp, lat, tg, tu, db, r, tr, int(ks), ar,
                         ttft_parts={"front_end": f, "wait": w, "prefill": p},
                         ttft_p50_ms=p50, ttft_p90_ms=p90, ttft_p99_ms=p99,
                         tpot_p50_ms=tp, tpot_p90_ms=tp, tpot_p99_ms=tp, decode_slot_wait_ms=sw)
            for (c, tm, tp, lat, tg, tu, db, r, tr, ks, ar, f, w, p, p50, p90, p99, sw) in zip(*cols)]


def _decode_step_many(engine, params: SchedulerParams, d: np.ndarray, kv: float) -> np.ndarray:
    """:func:`_decode_step` of each of an array of decode batches, through the engine's array
    path (equal to the scalar path to rounding)."""
    return params.step_ms(decode_gpu_ms(engine, d, kv, graph_pad(params, d)), d)


def _closed_loop_wait_many(clients: np.ndarray, s: np.ndarray, delay: np.ndarray, think: np.ndarray,
                           det: float = DETERMINISTIC_QUEUE_FACTOR) -> np.ndarray:
    """:func:`_closed_loop_wait` elementwise over arrays (the same operations, so the same
    values)."""
    C, D = clients.astype(float), delay + think
    a = det * (C - 1.0) / C
    quad = (a > 0.0) & (s > 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        b = s + D - C * a * s
        q_quad = (-b + np.sqrt(b * b + 4.0 * a * s * C * s)) / (2.0 * a * s)
        q_lin = np.where(s + D > 0.0, C * s / (s + D), 0.0)
    q = np.where(quad, q_quad, q_lin)
    r = s * (1.0 + a * q)
    r = np.maximum(r, C * s - delay - think)
    return np.maximum(r - s, 0.0)


def solve_disagg_many(
    prefills,
    decode_engine,
    concurrency,
    isl: int,
    osl: int,
    prefill_workers,
    decode_workers,
    decode_dp: int,
    prefill_batch: int,
    params_decode: SchedulerParams,
    gpus,
    which=0,
    iterations: int = 30,
    lean: bool = True,
    columns: bool | tuple = False,
    decode_curve: DecodeCurve | None = None,
    decode_which=None,
) -> list[DisaggResult] | dict[str, list]:
    """:func:`solve_disagg` for arrays of clients, prefill and decode worker counts and GPUs
    (broadcast together) of one decode layout and one or more prefill layouts: ``prefills`` is a
    sequence of (prefill engine, its scheduler, its attention-DP ranks, the KV transfer ms) and
    ``which`` the index into it of each element. The fixed point runs over all elements at once
    (each stops iterating where the scalar solver would), then each result is assembled as the
    scalar solver does. The same results as one :func:`solve_disagg` call per element, to rounding
    (the engine's array path and its scalar twins agree to rounding). ``lean`` (default): the
    results keep their percentiles but not the per-request distributions behind them.
    ``columns`` (with ``lean``): the same numbers as lists, by field (:data:`DISAGG_COLUMNS`),
    instead of one result object per element; a tuple of names: those fields alone, as arrays. ``decode_curve``: the decode engine's step times
    by batch at this KV length (:class:`~infercast.serving.decode_curve.DecodeCurve`, the same
    numbers to rounding, for a caller that solves many arrays with one decode layout); default:
    each step priced by the engine. ``decode_which`` (ascending): several decode layouts at once,
    ``decode_engine``, ``decode_dp`` and ``decode_curve`` then being sequences and this the index
    into them of each element (their decode steps must yield the same tokens per step): each
    element the same numbers as solved with its own decode layout, the iterations' fixed costs
    paid once for all."""
    C, pw, dw, g, w = (np.asarray(x).ravel() for x in np.broadcast_arrays(
        np.asarray(concurrency, dtype=float), np.asarray(prefill_workers), np.asarray(decode_workers), np.asarray(gpus),
        np.asarray(which)))
    n = C.size
    if n == 0:
        if columns and lean:
            return {name: ([] if columns is True else np.zeros(0)) for name in DISAGG_COLUMNS
                    if columns is True or name in columns}
        return []
    services = [_PrefillService(eng, isl, prefill_batch, params) for eng, params, _, _ in prefills]
    pick = np.array  # per-element values of a per-prefill list
    arrival = pick([ps.params.arrival_delay_ms for ps in services])[w]
    per_step = pick([ps.per_step for ps in services], dtype=np.int64)[w]
    batch_cap = pick([ps.cap for ps in services], dtype=np.int64)[w]
    if decode_which is None:  # one decode layout
        engines, dps, curves, dwh = [decode_engine], [decode_dp], [decode_curve], np.zeros(n, dtype=np.int64)
    else:
        engines, dps, curves = list(decode_engine), list(decode_dp), list(decode_curve or [None] * len(decode_engine))
        dwh = np.broadcast_to(np.asarray(decode_which, dtype=np.int64), C.shape)
        if np.any(dwh[1:] < dwh[:-1]):
            raise ValueError("decode_which must be ascending (each decode layout's elements together)")
    steps_transfer = [_out_steps(engines[0], osl, t) for _, _, _, t in prefills]
    out_steps = steps_transfer[0][0]
    if any(_out_steps(e, osl, 0.0)[0] != out_steps for e in engines[1:]):
        raise ValueError("decode layouts solved together must yield the same tokens per decode step")
    transfer = pick([t for _, t in steps_transfer])[w]
    servers = np.maximum(pw * np.maximum(pick([dp for _, _, dp, _ in prefills])[w], 1), 1).astype(float)
    ranks = np.maximum(dw * pick(dps)[dwh], 1).astype(float)
    c_rank = C / ranks
    kv = isl + osl / 2.0
    cap = float(params_decode.max_batch_size)
    for eng, curve in zip(engines, curves):
        if curve is not None and (curve.engine is not eng or curve.params != params_decode or curve.kv != kv):
            raise ValueError("decode_curve was made for another decode engine, scheduler or KV length")
    steppers = [curve.step_ms if curve is not None else
                (lambda batch, eng=eng: _decode_step_many(eng, params_decode, batch, kv)) for eng, curve in zip(engines, curves)]

    def decode_step(batch: np.ndarray, idx: np.ndarray) -> np.ndarray:
        """Decode step times of ``batch``, the decode batches of elements ``idx`` (ascending)."""
        if len(steppers) == 1:
            return steppers[0](batch)
        out = np.empty(batch.shape)
        bounds = np.searchsorted(dwh[idx], np.arange(len(steppers) + 1)).tolist()
        for j, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
            if b > a:
                out[a:b] = steppers[j](batch[a:b])
        return out

    # each prefill layout's batch times by prompts per batch (NaN: not asked yet), filled as the
    # fixed point asks for them (in ascending (layout, prompts) order, as each _PrefillService memoises them)
    table = np.full((len(services), int(batch_cap.max()) + 1), np.nan)

    def batch_ms(k: np.ndarray, idx: np.ndarray) -> np.ndarray:
        ww = w[idx]
        v = table[ww, k]
        missing = np.isnan(v)
        if missing.any():
            for s, kk in sorted(set(zip(ww[missing].tolist(), k[missing].tolist()))):
                table[s, kk] = services[s].batch_ms(kk)
            v = table[ww, k]
        return v

    everyone = np.arange(n)
    d = c_rank * out_steps / (out_steps + 2.0)
    ttft = batch_ms(per_step, everyone)
    rho = np.zeros(n)
    k_steady = per_step.copy()
    lam = np.zeros(n)
    live = np.ones(n, dtype=bool)  # still iterating
    weight, last = np.ones(n), np.full(n, np.inf)  # full steps while they shrink (solve_disagg)
    for _ in range(iterations):
        if not live.any():
            break
        idx = np.flatnonzero(live)
        dl, tl, Cl, sl, tr, ar = d[idx], ttft[idx], C[idx], servers[idx], transfer[idx], arrival[idx]
        ps_l, cap_l = per_step[idx], batch_cap[idx]
        step = decode_step(np.maximum(dl, 1.0), idx)
        slot = slot_wait_ms(c_rank[idx], out_steps * step, cap, tl, tr)
        cycle = tl + out_steps * step + tr + slot
        lam_l = Cl / cycle
        k = ps_l.copy()
        settled = np.zeros(idx.size, dtype=bool)
        for _ in range(8):
            k_new = np.minimum(cap_l, np.maximum(ps_l, np.ceil(lam_l * batch_ms(k, idx) / sl - 1e-9))).astype(np.int64)
            settled |= k_new == k
            k = np.where(settled, k, k_new)
            if settled.all():
                break
        sb = batch_ms(k, idx)
        service = sb / k
        rho_l = np.minimum(lam_l * service / sl, 0.999)
        wait = _closed_loop_wait_many(Cl, service / sl, sb - service / sl, out_steps * step + tr + slot + ar)
        ttft_new = wait + sb + ar
        outside = ttft_new + tr
        d_new = np.minimum(c_rank[idx] * out_steps / (out_steps + outside / step), cap)
        done = (np.abs(ttft_new - tl) < 1e-6 * tl) & (np.abs(d_new - dl) < 1e-6 * np.maximum(dl, 1.0))
        size = np.maximum(np.abs(ttft_new - tl) / tl, np.abs(d_new - dl) / np.maximum(dl, 1.0))
        frac = np.where(size >= last[idx], FIXED_POINT_DAMPING, weight[idx])
        weight[idx], last[idx] = frac, size
        ttft[idx] = np.where(done, ttft_new, tl + frac * (ttft_new - tl))
        d[idx] = np.where(done, d_new, dl + frac * (d_new - dl))
        lam[idx], rho[idx], k_steady[idx] = lam_l, rho_l, k
        live[idx[done]] = False
    step = decode_step(np.maximum(d, 1.0), everyone)
    slot = slot_wait_ms(c_rank, out_steps * step, cap, ttft, transfer)
    if lean:
        return _disagg_results_many(C, osl, servers, out_steps, transfer, g, ttft, d, step, rho, k_steady, lam, arrival,
                                    per_step, batch_cap, lambda k: batch_ms(k, everyone), slot, columns=columns)
    return [_disagg_result(services[w[i]], float(C[i]), osl, int(servers[i]), out_steps, float(transfer[i]), int(g[i]),
                           float(ttft[i]), float(d[i]), float(step[i]), float(rho[i]), int(k_steady[i]), float(lam[i]),
                           float(slot[i]))
            for i in range(n)]
