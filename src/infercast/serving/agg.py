"""Aggregated serving: a closed-loop benchmark against a continuously batching engine.

Two regimes make up what a benchmark client measures:

1. the *first wave*: all clients start together, so their first requests queue for prefill
   behind each other. :func:`infercast.serving.sim.simulate` plays that wave exactly (cohorts,
   token budget, chunking, KV admission);
2. the *steady state*: afterwards, jitter in the clients and the front end spreads requests over
   the cycle (measured TTFT at low concurrency is one step of wait plus one mixed prefill step,
   not a whole batch's prefill), which :func:`solve_steady` solves analytically (below).

Mean TTFT = (first wave + (k - 1) x steady) / k for ``k = requests_per_client``; TPOT and
throughput are the steady state's. The mean TTFT's parts (front end, wait, own prefill:
:data:`infercast.serving.result.TTFT_PARTS`) mix the same way.

The steady state, solved analytically (milliseconds per configuration, no event loop):

The benchmark: ``C`` clients per engine replica, each sending its next request (``isl`` new
tokens, ``osl`` output tokens) the moment the previous one completes. The engine runs one step
after another; a step carries every running decode (one token each) and, within a token budget,
prefill tokens of waiting requests (chunked when a prompt exceeds the budget left by the decodes).
An engine without chunked prefill (``SchedulerParams.chunked`` off) runs each prompt whole: it
takes one step, and the running decodes are capped so that one prompt fits beside them
(``D x draft width <= budget - isl``); when not even one decode does, prefill steps run alone, as on an engine
that does not mix.

Steady state, per step (a *fluid* model: averages, not individual requests):

* ``D`` requests decode each step; each spends ``osl - 1`` steps decoding, so completions per step
  ``lam = D / (osl - 1)`` and prefill tokens per step ``lam * isl``;
* the other ``W = C - D`` requests are between arrival and first token. A new request arrives
  while a step is running (its predecessor finished at the end of the previous one) and waits
  for it (``WAIT_STEPS``), then takes ``n_chunks`` steps to prefill, so by Little's law
  ``W = lam * (1 + n_chunks)``
  when prefill capacity is not binding: ``D = C (osl-1) / (osl-1 + 1 + n_chunks)``;
* the step carrying a request's first chunk is not the average prefill step: arrivals are
  random (clients drift apart after the first wave), so besides its own chunk it carries the
  chunks that arrived in the same step, ``chunk_load`` more on average for Poisson arrivals
  (``1 + chunk_load`` in all, as many as the token budget left by the decodes holds). TPOT is the
  average step and does not change (see docs/modelling-log.md, 'Same-step arrivals in the first
  chunk's step');
* with attention data parallelism and a backend that holds prefills until every rank has one
  (TensorRT-LLM's balance rule, :attr:`SchedulerParams.adp_balance_timeout_steps`), a new request
  also waits :func:`adp_balance_wait_steps` steps: in TTFT and, as for the wait above, among the
  ``W`` requests not decoding (see docs/modelling-log.md, 'TensorRT-LLM attention-DP balance
  hold');
* a scheduler that takes new requests off its queue only every ``I`` decode steps
  (:attr:`SchedulerParams.recv_interval`, SGLang's ``--scheduler-recv-interval``) makes a new
  request wait ``I / 2`` steps on average instead of one (:func:`recv_poll_steps`; in TTFT and in
  ``W``), and prefills the ``lam I`` requests that arrived since the last poll together, so a
  request's own prefill is its place in that batch (:func:`recv_poll`; prefill-first engines);
* the decode set is capped by the token budget (prefill + decode tokens per step <= budget), the
  KV-cache capacity (tokens of running requests) and the backend's max running requests; above a
  cap the excess clients queue, and TTFT grows by their wait (Little's law again).

Step times come from the compiled engine (:meth:`CompiledEngine.step_ms`): a mixed step of ``D``
decodes at the mean KV length ``isl + osl/2`` plus one prefill chunk (with its prefix), or a
decode-only step. Backends that do not mix prefill and decode in one step (SGLang's default)
run separate prefill steps that pause decodes. Per-step host overhead and the request's
front-end overhead (HTTP, tokenisation, detokenisation) are named parameters in
:mod:`.backends`.

Reported: mean TTFT, mean TPOT (= mean step time seen by a decoding request), request latency,
throughput per GPU and per user, and the p50 / p90 / p99 of TTFT and TPOT over the requests
(:mod:`.result`). Their spread in the steady state follows from the same assumptions as the
means: a request's wait for its first step is uniform on ``[0, 2 x WAIT_STEPS]`` steps (mean
``WAIT_STEPS``), the queue wait of a capacity-bound engine is the same for every request (FIFO
behind a full queue), and each of the ``osl - 1`` steps a request decodes through carries prefill
work independently with the probability the fluid model gives (a binomial count of slow steps);
the first wave contributes its simulated requests with weight ``1 / requests_per_client``, as in
the mean. TPOT percentiles are the steady state's, as the mean is.

vLLM's per-prompt-token front end
(:data:`infercast.serving.backends.VLLM_FRONT_END_PER_PROMPT_TOKEN_MS`) is folded into the front end
with the open streams' time (:meth:`~infercast.serving.backends.SchedulerParams.for_streams`).
Variants tried and rejected (not modelled): see docs/modelling-log.md, 'Length-biased step wait and
per-input-token front end', 'Chunk count over random prompt lengths' and 'Prefill slower than the
kernel tables'.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import InvalidConfigError
from .backends import SchedulerParams
from .result import (
    QUANTILE_POINTS,
    Distribution,
    ServingMetrics,
    binomial_share,
    blend_parts,
    mixture,
    ttft_parts,
    uniform,
)
from .prefix import prefixed, shared_prefix_capacity, with_prefix
from .sim import check_prompt_fits_budget

#: steps a new request waits before its first prefill chunk: it arrives while a step runs
WAIT_STEPS = 1.0


def _hold_shape(ranks: int, lam: float, timeout: float):
    """(period ``P`` in steps, ``a = min(timeout / P, 1)``, ``M = ranks - 1``) of the balance hold,
    or None when nothing is held."""
    if ranks <= 1 or timeout <= 0 or lam <= 0:
        return None
    period = 1.0 / lam
    return period, min(timeout / period, 1.0), ranks - 1


def adp_balance_wait_steps(ranks: int, lam: float, timeout: float) -> float:
    """Mean steps a new request's prefill is held by an attention-DP balance rule
    (:attr:`SchedulerParams.adp_balance_timeout_steps`): prefills wait until every one of
    ``ranks`` ranks has one, or ``timeout`` steps after the hold began; then all waiting ones run.

    Arrivals: in the closed loop a new request goes to the rank whose request just finished (the
    least loaded), so each rank receives one request every ``P = 1 / lam`` steps (``lam`` =
    completions per step per rank), at a phase independent of the other ranks'. A hold starts at
    an arrival on one rank (the opener); the other ``M = ranks - 1`` ranks' next arrivals ``u_j``
    are uniform on ``[0, P]``; it ends at ``L = min(timeout, max u_j)`` and holds the opener and
    the ranks with ``u_j <= L`` (joiners). With ``a = min(timeout / P, 1)``, in units of ``P``:
    requests per hold ``1 + M a``; the sum of their waits ``L + sum_j (L - u_j)^+`` has mean
    ``a + M a^2 / 2 - a^(M+1)``; the mean wait is the ratio (renewal-reward). ``timeout >= P``
    gives ``(ranks - 1) / (2 ranks) P``; a timeout much shorter than ``P`` gives ``timeout`` (each
    hold holds one request). :func:`adp_balance_wait` gives the spread."""
    shape = _hold_shape(ranks, lam, timeout)
    if shape is None:
        return 0.0
    period, a, m = shape
    return period * (a + m * a * a / 2.0 - a ** (m + 1)) / (1.0 + m * a)


def adp_balance_wait(ranks: int, lam: float, timeout: float) -> Distribution:
    """Per-request wait (steps) of the balance hold of :func:`adp_balance_wait_steps`, as
    quantile midpoints. In units of ``P``, for ``0 <= x < a``: the opener waits ``L``,
    ``P(L <= x) = x^M`` (the rest, ``1 - a^M``, at the timeout ``a``); a joiner arriving at ``u``
    waits ``min(a - u, (max of the other M - 1) - u)^+``, so over ``u`` uniform on ``[0, a]``
    ``P(w <= x) = (x + (a^M - x^M) / M) / a``; requests mix the two ``1 : M a``. The mean is
    :func:`adp_balance_wait_steps`'s."""
    shape = _hold_shape(ranks, lam, timeout)
    if shape is None:
        return Distribution.point(0.0)
    period, a, m = shape
    x = np.linspace(0.0, a, 2049)
    opener = np.where(x < a, x ** m, 1.0)
    joiner = (x + (a ** m - x ** m) / m) / a
    cdf = (opener + m * a * joiner) / (1.0 + m * a)
    q = (np.arange(QUANTILE_POINTS) + 0.5) / QUANTILE_POINTS
    # the inverse CDF; quantiles above the CDF's value just below ``a`` fall in the atom at ``a``
    waits = np.interp(q, cdf[:-1], x[:-1], right=a)
    waits = np.where(q > cdf[-2], a, waits) * period
    mean = adp_balance_wait_steps(ranks, lam, timeout)
    return Distribution(waits + (mean - waits.mean()), np.ones(QUANTILE_POINTS))


def batch_wait_steps(lam: float, isl: float, decode_tokens: float, params: SchedulerParams) -> float:
    """Mean steps a new request waits under TensorRT-LLM's context batching delay
    (:attr:`SchedulerParams.batch_wait_iters`, ``batch_wait_max_tokens_ratio``): a delay opens when
    a prompt arrives to an empty queue and ends after ``L`` steps, when the step's tokens (the
    ``decode_tokens`` running plus the waiting prompts) reach the ratio of the budget, at the
    latest after ``batch_wait_iters``. Prompts arrive at ``lam`` per step, so
    ``L = min(iters, (ratio x budget - decode_tokens - isl) / (lam x isl))``; the opener waits
    ``L``, the ``lam L`` prompts that join it wait ``L / 2`` on average (renewal-reward):
    ``(L + lam L^2 / 2) / (1 + lam L)``."""
    iters = float(params.batch_wait_iters)
    if iters <= 0:
        return 0.0
    need = params.batch_wait_max_tokens_ratio * params.max_num_tokens - decode_tokens - isl
    if need <= 0:
        return 0.0
    L = iters if lam <= 0 else min(iters, need / (lam * isl))
    return (L + lam * L * L / 2.0) / (1.0 + lam * L)


def recv_poll_steps(params: SchedulerParams) -> float:
    """Mean steps a new request waits for the scheduler's next poll of its queue beyond the
    step in progress (:data:`WAIT_STEPS`), with :attr:`SchedulerParams.recv_interval` > 1: the
    scheduler polls once every ``interval`` decode steps, so a request arriving at a random
    point waits ``interval / 2`` steps on average (uniform on ``[0, interval]``)."""
    interval = float(params.recv_interval)
    return max(0.0, interval / 2.0 - WAIT_STEPS) if interval > 1 else 0.0


def recv_poll(engine, params: SchedulerParams, lam: float, isl: int, n_chunks: int, chunk: float, prefix: float) -> float:
    """Mean ms from a request's poll to its first token when the scheduler takes new requests
    in polls (:attr:`SchedulerParams.recv_interval`) and prefills them before decoding: the
    ``k = max(1, lam x interval)`` requests that arrived since the last poll (``lam`` per step)
    are prefilled together, as many whole prompts per step as the token budget holds (or one
    prompt in ``n_chunks`` chunks when it does not fit), and a request's first token comes with
    the step that finishes its prompt: on average half-way through the batch."""
    k = max(1.0, lam * float(params.recv_interval))
    budget = float(params.max_num_tokens)
    if n_chunks <= 1:
        per_step = max(1.0, math.floor(budget / max(isl, 1)))
        r = min(k, per_step)
        steps = k / r
        t = params.step_ms(float(engine.step_ms(ctx_batch=r, ctx_isl=isl)), r)
        return (steps + 1.0) / 2.0 * t
    t = params.step_ms(float(engine.step_ms(ctx_batch=1.0, ctx_isl=chunk, ctx_prefix=prefix)), 1.0)
    return (k + 1.0) / 2.0 * n_chunks * t


#: the :attr:`ServingResult.bound` of a steady state whose decoding set is held by a cap of the
#: engine rather than by its clients: there, more clients only wait longer in the queue (the same
#: steps, a longer TTFT, the throughput creeping towards its plateau as the queue absorbs the
#: fixed per-request times)
SATURATED_BOUNDS = frozenset({"kv cache", "max requests", "token budget"})


@dataclass
class ServingResult(ServingMetrics):
    decode_batch: float  # mean running decodes per step
    queued: float  # clients waiting for a slot (capacity-bound)
    prefill_chunks: int
    step_ms: float
    bound: str  # what limits the decode batch: clients / token budget / kv cache / max requests
    balance_hold_ms: float = 0.0  # steady-state prefill hold of the attention-DP balance rule
    #: the steady state's average step as a mix of step shapes, for quantities summed over steps
    #: (energy, :mod:`.energy`): ``steps`` [(steps of this shape per average step, the shape's
    #: ``CompiledEngine.step_ms`` keywords)], ``requests`` completed per average step; None for
    #: a result played out step by step (lock-step waves, one output token)
    step_mix: dict | None = field(default=None, kw_only=True, repr=False, metadata={"report": False})


def _steps(engine, d, isl, osl, chunk, chunk_prefix, n_prefill_in_step, mixed: bool, pad: float = 0.0):
    """(decode-only step, step carrying prefill, prefill-only step) in ms; ``pad``: CUDA-graph
    padding rows of the decode-only step (:meth:`SchedulerParams.graph_pad`)."""
    kv = isl + osl / 2.0
    dec = float(engine.step_ms(dec_batch=d, dec_kv=kv, dec_pad=pad)) if d > 0 else 0.0
    if mixed:
        mix = float(engine.step_ms(ctx_batch=n_prefill_in_step, ctx_isl=chunk, ctx_prefix=chunk_prefix, dec_batch=d, dec_kv=kv))
        pre = mix
    else:
        pre = float(engine.step_ms(ctx_batch=n_prefill_in_step, ctx_isl=chunk, ctx_prefix=chunk_prefix))
        mix = pre
    return dec, mix, pre


def solve_steady(
    engine,
    concurrency: float,
    isl: int,
    osl: int,
    params: SchedulerParams,
    kv_capacity_tokens: float,
    gpus: int,
    iterations: int = 6,
    ranks: int = 1,
    percentiles: bool = True,
) -> ServingResult:
    """The steady state of ``concurrency`` clients on one rank (module docstring); ``ranks``: the
    attention-DP ranks of the replica, for the balance hold
    (:attr:`SchedulerParams.adp_balance_timeout_steps`, :func:`adp_balance_wait_steps`).
    ``percentiles=False``: the per-request distributions are kept but their percentiles are left
    unset (a caller that mixes them with others sets them)."""
    C = float(concurrency)
    tau = float(getattr(engine, "tokens_per_step", 1.0))  # output tokens per decode step (MTP)
    width = float(getattr(engine, "decode_width", 1.0))  # budget tokens per decoding sequence (MTP drafts)
    out_steps = max((osl - 1) / tau, 1.0)
    budget = float(params.max_num_tokens)
    # caps on the decoding set
    footprint = float(isl + osl) if params.kv_reserve_full else float(isl + osl / 2.0)
    kv_cap = kv_capacity_tokens / footprint if kv_capacity_tokens > 0 else 0.0
    caps = {"kv cache": kv_cap, "max requests": float(params.max_batch_size)}
    check_prompt_fits_budget(isl, params)
    if params.mixed and not params.chunked and budget - isl < width:
        # not one decode fits beside a whole prompt: prefill steps run alone, as on an engine that
        # does not mix prefill into decode steps
        params = replace(params, mixed=False)
    if params.mixed:
        # D decodes + lam*isl prefill tokens per step must fit the budget
        caps["token budget"] = budget * out_steps / (out_steps * width + isl)
        if not params.chunked:
            # a whole prompt must fit beside the running decodes (module docstring of .sim)
            caps["token budget"] = min(caps["token budget"], (budget - isl) / width)
    d = C * out_steps / (out_steps + 2.0)
    n_chunks = 1
    hold = 0.0  # balance-hold steps (attention DP)
    # the hold applies only while every rank has decodes running: with one client per rank, the
    # rank a request arrives at has none, and TensorRT-LLM then releases the prefill at once
    hold_ranks = ranks if C > 1 else 1
    for _ in range(iterations):
        if params.chunked:
            room = budget - (d * width if params.mixed else 0.0)
            room = max(room, params.min_prefill_chunk)
            n_chunks = max(1, math.ceil(isl / room))
        hold = adp_balance_wait_steps(hold_ranks, d / out_steps, params.adp_balance_timeout_steps)
        hold += batch_wait_steps(d / out_steps, isl, d * width, params) + recv_poll_steps(params)
        d_free = C * out_steps / (out_steps + WAIT_STEPS + hold + n_chunks)
        d = min([d_free, *caps.values()])
    cap_name, cap_val = min(caps.items(), key=lambda kv: kv[1])
    d_free = C * out_steps / (out_steps + WAIT_STEPS + hold + n_chunks)
    bound = cap_name if cap_val < d_free else "clients"
    d = max(d, 0.0)
    lam = d / out_steps  # completions (= new prefills) per step
    chunk = isl / n_chunks
    prefix = (isl - chunk) / 2.0  # mean prefix of a chunk of a chunked prompt
    # prefill chunks per step: one, unless arrivals outpace single-chunk steps
    chunk_load = lam * n_chunks  # prefill chunks needed per step
    per_step = max(1.0, chunk_load)
    frac = min(1.0, chunk_load)  # share of steps carrying prefill work
    dec, mix, pre = _steps(engine, d, isl, osl, chunk, prefix, per_step, params.mixed, params.graph_pad(d))
    kv = isl + osl / 2.0
    prefill_shape = dict(ctx_batch=per_step, ctx_isl=chunk, ctx_prefix=prefix)
    dec_shape = dict(dec_batch=d, dec_kv=kv, dec_pad=params.graph_pad(d))
    if params.mixed:  # a decode-only step, or one carrying prefill chunks beside the decodes
        step_mix = [(1.0 - frac, dec_shape), (frac, {**prefill_shape, "dec_batch": d, "dec_kv": kv})]
    else:  # every decode step, and the prefill steps between them
        step_mix = [(1.0, dec_shape), (chunk_load / per_step, prefill_shape)]
    if params.mixed:
        t_avg = (1.0 - frac) * params.step_ms(dec, d) + frac * params.step_ms(mix, d + per_step)
        # the step that carries a request's own prefill also carries the prompts that arrived
        # with it (module docstring): 1 + chunk_load chunks, as many as the budget holds
        fits = max(1.0, (budget - d * width) / max(chunk, 1.0))
        tagged = max(per_step, min(1.0 + chunk_load, fits))
        mix_own = mix if tagged == per_step else float(
            engine.step_ms(ctx_batch=tagged, ctx_isl=chunk, ctx_prefix=prefix, dec_batch=d, dec_kv=isl + osl / 2.0))
        t_prefill_step = params.step_ms(mix_own, d + tagged)
        tpot = t_avg
        t_fast, t_slow = params.step_ms(dec, d), params.step_ms(mix, d + per_step)
        p_slow = frac
    else:
        # prefill steps pause decoding: a decode token waits for the decode step and, on average,
        # for the prefill steps scheduled in between
        t_dec = params.step_ms(dec, d)
        t_pre = params.step_ms(pre, per_step)
        t_avg = t_dec + chunk_load * t_pre / per_step
        t_prefill_step = t_pre
        tpot = t_avg
        # a decode step is followed by prefill steps with probability min(1, chunk_load)
        t_fast, t_slow = t_dec, t_dec + t_pre * max(1.0, chunk_load) / per_step
        p_slow = min(1.0, chunk_load)
    balance = adp_balance_wait_steps(hold_ranks, lam, params.adp_balance_timeout_steps)
    poll = recv_poll_steps(params)
    hold = balance + batch_wait_steps(lam, isl, d * width, params) + poll
    queued = max(0.0, C - d - lam * (WAIT_STEPS + hold + n_chunks))
    wait_ms = (WAIT_STEPS + hold) * t_avg + (queued / lam * t_avg if lam > 0 else 0.0)
    own_prefill = n_chunks * t_prefill_step
    if params.recv_interval > 1 and not params.mixed:
        own_prefill = recv_poll(engine, params, lam, isl, n_chunks, chunk, prefix)
    ttft = wait_ms + own_prefill + params.arrival_delay_ms
    per_token = out_steps / max(osl - 1, 1)  # MTP yields tau tokens per step
    tpot = tpot * out_steps / max(osl - 1, 1)
    latency = ttft + tpot * max(osl - 1, 1)
    tput_gpu = (C / latency) * osl * 1e3 / gpus if latency > 0 else 0.0
    # per-request spread (module docstring): the wait for the first step, slow steps while decoding
    first_wait = (WAIT_STEPS + poll) * t_avg
    ttft_dist = uniform(0.0, 2.0 * first_wait, shift=ttft - first_wait)
    if balance > 0:  # plus the balance hold's own spread (its mean is already in ``ttft``)
        held = adp_balance_wait(hold_ranks, lam, params.adp_balance_timeout_steps).scaled(t_avg)
        ttft_dist = ttft_dist.plus(held.shifted(-held.mean()))
    # binomial_share(...).scaled(t_slow - t_fast).shifted(t_fast).scaled(per_token), in one step
    share = binomial_share(out_steps, p_slow)
    tpot_dist = Distribution._made((share.values * float(t_slow - t_fast) + float(t_fast)) * float(per_token), share.weights)
    res = ServingResult(
        concurrency=C,
        ttft_ms=ttft,
        tpot_ms=tpot,
        request_latency_ms=latency,
        tokens_per_s_per_gpu=tput_gpu,
        tokens_per_s_per_user=1e3 / tpot if tpot > 0 else 0.0,
        decode_batch=d,
        queued=queued,
        prefill_chunks=n_chunks,
        step_ms=t_avg,
        bound=bound,
        balance_hold_ms=balance * t_avg,
        ttft_parts=ttft_parts(params.arrival_delay_ms, wait_ms, own_prefill),
        step_mix={"steps": step_mix, "requests": lam},
    )
    if percentiles:
        res.set_percentiles(ttft_dist, tpot_dist)
    else:
        res.ttft_dist, res.tpot_dist = ttft_dist, tpot_dist
    return res



def serve_agg(engine, concurrency, isl, osl, params: SchedulerParams, kv_capacity_tokens, gpus, ranks: int = 1,
              prefix: int = 0, tokens_per_block: int = 1, first_waves: dict | None = None) -> ServingResult:
    """Mean TTFT/TPOT a closed-loop benchmark client reports (first wave + steady state).

    ``concurrency`` is the clients of one attention-DP rank (of the replica for pure TP), with
    that rank's KV capacity; ``gpus`` the GPUs behind them (``Estimator.gpus_per_rank``), so
    throughput per GPU comes out right for attention-DP layouts too; ``ranks`` the replica's
    attention-DP ranks (the balance hold of the steady state; the first wave starts every rank
    together, so it holds nothing). ``prefix``: cached prompt tokens every request starts with
    (:mod:`.prefix`: attention over them in prefill and decode, held once per rank in KV blocks
    of ``tokens_per_block``, tokenised by the front end); ``isl`` counts the new tokens.
    ``first_waves``: a dict the caller keeps across calls for one engine, where the first waves
    played leave what a larger one takes over from (:func:`~infercast.serving.sim.simulate`; the
    same answers, faster)."""
    from .sim import DoesNotFitError, simulate

    # the replica's front end serves every rank's clients and tokenises each (whole) prompt
    params = params.for_streams(concurrency * ranks, isl + prefix)
    if prefix:
        engine = prefixed(engine, prefix)
        kv_capacity_tokens = shared_prefix_capacity(kv_capacity_tokens, prefix, tokens_per_block)
    if kv_capacity_tokens < isl + osl:
        held = f" beside the shared {prefix}-token prefix" if prefix else ""
        raise DoesNotFitError(
            f"one request of {isl}+{osl} tokens needs more KV cache than a rank has{held} ({int(kv_capacity_tokens)} tokens)",
            "weights and reserves leave too little memory; use more GPUs or a smaller quant",
        )
    if not 0.0 < params.kv_length_ratio <= 1.0:
        raise InvalidConfigError(f"kv_length_ratio is a benchmark's mean request length over its nominal one, in (0, 1]; "
                                 f"got {params.kv_length_ratio}")
    # a benchmark of random lengths holds fewer tokens per running request than nominal ones
    # (SchedulerParams.kv_length_ratio); the check above stays at the nominal, longest request
    kv_capacity_tokens = kv_capacity_tokens / params.kv_length_ratio
    if params.lockstep or osl <= 1:
        # one output token: a request completes with its prefill, so there is no decode phase for
        # the steady-state model to solve; every client finishes with the step that carries its
        # prompt, and the closed loop is played out as it runs
        res = simulate(engine, int(round(concurrency)), isl, osl, params, kv_capacity_tokens, gpus)
        out = ServingResult(
            concurrency=float(concurrency), ttft_ms=res.ttft_ms, tpot_ms=res.tpot_ms,
            request_latency_ms=res.request_latency_ms, tokens_per_s_per_gpu=res.tokens_per_s_per_gpu,
            tokens_per_s_per_user=res.tokens_per_s_per_user, decode_batch=res.mean_decode_batch, queued=0.0,
            prefill_chunks=0, step_ms=0.0,
            bound="lock-step simulation" if params.lockstep else "prefill only (osl 1)", ttft_parts=res.ttft_parts,
        )
        out.set_percentiles(res.ttft_dist, res.tpot_dist)
        return out
    # (the steady state's percentiles are set below, of its mixture with the first wave's)
    steady = solve_steady(engine, concurrency, isl, osl, params, kv_capacity_tokens, gpus, ranks=ranks, percentiles=False)
    if prefix and steady.step_mix:  # the shapes as the GPU runs them (energy reads them)
        steady.step_mix = {**steady.step_mix, "steps": [(w, with_prefix(sh, prefix)) for w, sh in steady.step_mix["steps"]]}
    k = max(params.requests_per_client, 1.0)
    # the first wave's TTFT side only (TPOT and throughput are the steady state's)
    first = simulate(engine, int(round(concurrency)), isl, osl, params, kv_capacity_tokens, gpus, requests_per_client=1,
                     first_tokens_only=True, first_waves=first_waves)
    steady.ttft_ms = (first.ttft_ms + (k - 1.0) * steady.ttft_ms) / k
    steady.ttft_parts = blend_parts((first.ttft_parts, 1.0), (steady.ttft_parts, k - 1.0))
    steady.request_latency_ms = steady.ttft_ms + steady.tpot_ms * max(osl - 1, 1)
    steady.set_percentiles(mixture((first.ttft_dist, 1.0 / k), (steady.ttft_dist, (k - 1.0) / k)), steady.tpot_dist)
    return steady
