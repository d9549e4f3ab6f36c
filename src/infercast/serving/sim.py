"""Aggregated serving: an iteration-level model of continuous batching under a closed-loop load.

The benchmark: ``C`` clients per engine replica start together and each sends its next request
(``isl`` new tokens, ``osl`` output tokens) as soon as the previous one completes, until
``requests_per_client`` requests each have been sent. Mean TTFT / TPOT are over all requests, as
a benchmark client reports them.

The engine runs steps back to back. Each step carries every running decode (one token each) and,
within the token budget (``max_num_tokens``), prefill work of waiting requests, first come first
served; a prompt that does not fit the room left is chunked (``min_prefill_chunk`` at least), or,
on an engine without chunked prefill (``chunked`` off), waits until the running decodes leave room
for the whole prompt (a prompt longer than the budget is refused: such an engine rejects it).
Backends that do not mix prefill and decode (SGLang's default) run a prefill step that pauses
decoding whenever requests wait. A request is admitted only if the KV cache can hold its whole
``isl + osl`` and the running set is below ``max_batch_size``. A request that arrives while a step
runs is scheduled at the next step boundary (plus ``arrival_delay_ms`` of front-end time).

Requests that arrive together and are scheduled together stay together: the simulation tracks
*cohorts* (n identical requests in the same state), not requests, and jumps over runs of
decode-only steps in one vectorised engine call, so one configuration costs milliseconds. Every
decoding cohort gains the same tokens per step, so the decoding set is kept in the order its
cohorts started decoding (the first to start is the first to finish) with one shared count of
decode steps: a step costs the same however many cohorts decode.

A benchmark whose clients send no request after their first (``requests_per_client`` 1, the first
wave a search plays) has a schedule that does not depend on the step times: every request arrives
at once, and which step carries which prompt chunks and decodes follows from token counts, the
KV cache and the batch limit alone. Such a run is *recorded*: the scheduler plays it counting
steps instead of milliseconds, noting each step's shape, and the engine then prices every step
in one array call (:meth:`~infercast.engine.compiled.CompiledEngine.mixed_steps_ms`, for an
engine that has it), the clock being their running sum. The same numbers as stepping the clock
along, to rounding (the engine's array path and its scalar twins agree to rounding), at a
fraction of the cost of a long wave (a thousand clients: hundreds of steps). A search plays one
layout's first waves at many concurrencies; a larger wave takes over from a smaller one where the
two made the same decisions, with those steps' prices (:func:`_first_wave`, ``first_waves``).
"""

from __future__ import annotations

import math
from collections import deque
from itertools import chain
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidConfigError
from .backends import SchedulerParams
from .result import Distribution, ServingMetrics, ttft_parts


class DoesNotFitError(InvalidConfigError):
    """The configuration cannot hold even one request."""


def check_prompt_fits_budget(isl: int, params: SchedulerParams) -> None:
    """An engine without chunked prefill runs a prompt in one step, so ``isl`` must fit its token
    budget (TensorRT-LLM, vLLM and SGLang reject a longer prompt unless chunked prefill is on)."""
    if not params.chunked and isl > params.max_num_tokens:
        raise InvalidConfigError(
            f"a prompt of {isl} tokens does not fit the step budget of {params.max_num_tokens} tokens, "
            "and the scheduler runs without chunked prefill",
            "raise max_num_tokens to at least the input length, or enable chunked prefill",
        )


@dataclass(slots=True)
class _Cohort:
    n: int
    arrival: float  # ms, when the engine's scheduler sees the requests
    remaining: float  # prefill tokens left per request
    done_prefill: float = 0.0  # prefill tokens already processed per request (prefix of the next chunk)
    first_token: float = -1.0
    sent: float = 0.0  # ms, when the clients sent them (TTFT is measured from here)
    start: float = -1.0  # ms, when the step carrying their first prefill chunk began
    # output tokens when decoding, with ``done`` the shared count of decode tokens so far:
    # 1 + done - entry (fractional with MTP: tau per step)
    entry: float = 0.0


@dataclass
class SimResult(ServingMetrics):
    mean_decode_batch: float
    steps: int


@dataclass
class FirstTokens:
    """The time-to-first-token side of a simulated benchmark (:func:`simulate` with
    ``first_tokens_only``): the mean TTFT, its :data:`~.result.TTFT_PARTS` and the per-request
    distribution, as the :class:`SimResult` of the same run reports them."""

    ttft_ms: float
    ttft_parts: dict
    ttft_dist: Distribution


def simulate(
    engine,
    concurrency: int,
    isl: int,
    osl: int,
    params: SchedulerParams,
    kv_capacity_tokens: float,
    gpus: int,
    requests_per_client: float | None = None,
    max_events: int = 200_000,
    first_tokens_only: bool = False,
    first_waves: dict | None = None,
) -> SimResult | FirstTokens:
    """Play the closed-loop benchmark out (module docstring). With ``first_tokens_only``, stop as
    soon as every request has been sent and has its first token, and answer a
    :class:`FirstTokens`: what follows (decode steps to the completions) moves no request's TTFT,
    and the requests still decoding are recorded in the order they would complete (the order
    they started decoding, as :func:`finish_decodes` pops them), so the TTFT numbers are the
    full run's, bit for bit. ``first_waves``: a dict kept across such first waves of one engine's
    concurrencies, where each leaves the state a wave of more requests takes over from
    (:func:`_first_wave`; the same answers)."""
    C = int(concurrency)
    osl = int(osl)
    isl = int(isl)
    rpc = params.requests_per_client if requests_per_client is None else requests_per_client
    total_requests = max(C, int(round(rpc * C)))
    budget = float(params.max_num_tokens)
    per_req_kv = float(isl + osl) if params.kv_reserve_full else float(isl + osl / 2.0)
    kv_slots = math.inf if kv_capacity_tokens <= 0 else kv_capacity_tokens
    tau = float(getattr(engine, "tokens_per_step", 1.0))  # output tokens per decode step (MTP)
    width = float(getattr(engine, "decode_width", 1.0))  # budget tokens per decoding sequence (MTP drafts)
    check_prompt_fits_budget(isl, params)
    if isl + osl > kv_slots:
        raise DoesNotFitError(
            f"one request of {isl}+{osl} tokens needs more KV cache than the worker has ({int(kv_capacity_tokens)} tokens)"
        )

    # a run whose requests are all sent at the start is recorded (module docstring): ``t`` then
    # counts steps from the requests' arrival, and the engine prices the noted steps at the end
    steps_at_once = getattr(engine, "mixed_steps_ms", None) if total_requests == C else None
    recorded = steps_at_once is not None
    rec = _Record() if recorded else None
    if recorded and first_tokens_only and FIRST_WAVE_PLAYER:
        start_v, first_v, w_v, _, took_from, left = _first_wave(rec, C, isl, osl, params, kv_slots, per_req_kv, tau,
                                                                width, max_events, first_waves)
        return _first_tokens(rec, engine, params, start_v, first_v, w_v, took_from, left)
    waiting: list[_Cohort] = [_Cohort(C, 0.0 if recorded else params.arrival_delay_ms, float(isl), sent=0.0)]
    # decoding cohorts in the order they started decoding: all gain ``tau`` tokens per step, so the
    # first one holds the most tokens and finishes first. ``done``: decode tokens every running
    # cohort has gained since the simulation began; a cohort's output so far is 1 + done - entry
    running: deque[_Cohort] = deque()
    n_running = 0  # requests in ``running`` (kept as cohorts enter and leave it)
    entry_sum = 0.0  # sum of n x entry over ``running``: their mean KV length in O(1)
    done = 0.0
    # a run of decode-only steps: CompiledEngine sums its token-wise ops once per run; any other
    # engine (tests' synthetic ones) answers through step_ms
    # a run of one step (the most common: to the next completion) as one float, without numpy
    decode_one = getattr(engine, "decode_one_ms", None)
    # a step's prefill groups as one tuple of float triples (CompiledEngine; else three lists)
    mixed_groups = getattr(engine, "mixed_groups_ms", None)
    decode_run = getattr(engine, "decode_run_ms", None) or (
        lambda b, kv, pad=0.0: engine.step_ms(dec_batch=b, dec_kv=kv, dec_pad=pad))
    mixed, chunked, max_batch = params.mixed, params.chunked, params.max_batch_size
    min_chunk = float(params.min_prefill_chunk)
    issued = C
    t = 0.0
    # per completed cohort: when it was sent, reached the scheduler, had its first chunk's step
    # begin, had its first token, completed (ms; step counts when recorded), and its requests
    sent_v, arrival_v, start_v, first_v, end_v, w_v = [], [], [], [], [], []
    dec_batch_time = 0.0
    steps = 0
    events = 0

    def generated(c: _Cohort) -> float:
        return 1.0 + done - c.entry

    def finish_decodes(now: float):
        """Complete the cohorts that have generated all ``osl`` tokens (the oldest first)."""
        nonlocal n_running, entry_sum
        while running and 1.0 + done - running[0].entry >= osl - 1e-9:  # generated(running[0])
            c = running.popleft()
            n_running -= c.n
            entry_sum -= c.n * c.entry
            complete(c, now)

    def complete(c: _Cohort, now: float):
        nonlocal issued
        sent_v.append(c.sent)
        arrival_v.append(c.arrival)
        start_v.append(c.start)
        first_v.append(c.first_token)
        end_v.append(now)
        w_v.append(c.n)
        new = min(c.n, total_requests - issued)
        if new > 0:
            issued += new
            last = waiting[-1] if waiting else None
            if last is not None and last.sent == now and last.done_prefill == 0 and last.remaining == float(isl):
                last.n += new  # sent at the same instant: one cohort, not one per predecessor cohort
            else:
                waiting.append(_Cohort(new, now + params.arrival_delay_ms, float(isl), sent=now))

    while (waiting or running) and events < max_events:
        if first_tokens_only and not waiting and issued >= total_requests:
            # the rest complete in the order they would (their decode times are not needed), and
            # none of them sends another request
            sent_v.extend([c.sent for c in running])
            arrival_v.extend([c.arrival for c in running])
            start_v.extend([c.start for c in running])
            first_v.extend([c.first_token for c in running])
            end_v.extend([t] * len(running))
            w_v.extend([c.n for c in running])
            running.clear()
            break
        # The benchmark repeats itself: once the whole first wave has completed at one instant and
        # its C successors are all that waits, the state is the start state shifted by ``t``, so
        # each further full wave is an exact copy of the first: its requests' metrics and its
        # duration are copied instead of simulated (lock-step backends run every wave this way).
        if (not running and t > 0 and len(waiting) == 1 and waiting[0].n == C and waiting[0].sent == t
                and waiting[0].done_prefill == 0 and sum(w_v) == C and total_requests % C == 0):
            copies = total_requests // C - 1
            # each copy's times are the first wave's shifted by a whole wave's duration: the
            # first wave's times stand for them (every metric is a difference of two of them)
            for v in (sent_v, arrival_v, start_v, first_v, end_v, w_v):
                v *= copies + 1
            t *= copies + 1
            steps *= copies + 1
            dec_batch_time *= copies + 1
            waiting.clear()
            break
        events += 1
        in_flight = n_running
        kv_used = in_flight * per_req_kv
        # --- admit prefill work (FCFS) among requests that have arrived by now. ``waiting`` is
        # ordered by arrival (cohorts are appended at completion + a fixed delay as time advances,
        # a split-off rest right after its cohort), so the arrived ones are a prefix of it.
        groups = []  # (n, chunk tokens, prefix)
        if waiting and waiting[0].arrival <= t + 1e-9:
            room = budget - (in_flight * width if mixed else 0.0)
            if chunked:  # the least prefill work a step takes when decodes fill the budget
                room = max(room, min_chunk)
            admitted = 0  # sequences newly admitted in this step
            i = 0
            while i < len(waiting):  # live: a rest split off below is next, and may take a chunk
                c = waiting[i]
                i += 1
                if c.arrival > t + 1e-9 or room <= 0:
                    break
                started = c.done_prefill > 0
                # requests not yet holding KV must be admissible (free KV slots and sequences)
                can = c.n if started else int(min(c.n, (kv_slots - kv_used) // per_req_kv, max_batch - in_flight - admitted))
                if can <= 0:
                    break
                whole = int(min(can, room // c.remaining))
                if whole >= 1:
                    take, chunk = whole, c.remaining
                elif chunked:
                    take, chunk = 1, room
                else:
                    break
                if take < c.n:
                    rest = _Cohort(c.n - take, c.arrival, c.remaining, c.done_prefill, sent=c.sent, start=c.start)
                    waiting.insert(i, rest)
                    c.n = take
                groups.append((c, take, chunk))
                room -= take * chunk
                if not started:
                    c.start = t
                    kv_used += take * per_req_kv
                    admitted += take
        # --- run the step
        if groups:
            # plain floats: the step's few groups cost less as Python floats than as numpy arrays
            gs = tuple([(float(take), float(chunk), float(c.done_prefill)) for c, take, chunk in groups])
            if mixed and running:
                kv_mean = (in_flight * (isl + 1.0 + done) - entry_sum) / in_flight
                dec_n = in_flight
            else:
                kv_mean = 1.0
                dec_n = 0
            seqs = dec_n + sum([g[0] for g in gs])
            if recorded:
                rec.step(gs, float(dec_n), kv_mean, 0.0, seqs)
                dt = 1.0
            else:
                gpu = mixed_groups(gs, float(dec_n), kv_mean) if mixed_groups is not None else engine.mixed_step_ms(
                    [g[0] for g in gs], [g[1] for g in gs], [g[2] for g in gs], float(dec_n), kv_mean)
                dt = params.step_ms(gpu, seqs)
                dec_batch_time += dec_n * dt
            t += dt
            steps += 1
            if dec_n:
                done += tau
                finish_decodes(t)
            for c, take, chunk in groups:
                c.remaining -= chunk
                c.done_prefill += chunk
                if c.remaining <= 1e-9:
                    waiting.remove(c)
                    c.first_token = t
                    c.entry = done  # one token with its prefill
                    if osl <= 1:
                        complete(c, t)
                    else:
                        running.append(c)
                        n_running += c.n
                        entry_sum += c.n * c.entry
            continue
        if not running:
            # nothing runnable: jump to the next arrival
            t = max(t, min(c.arrival for c in waiting))
            continue
        # --- a run of decode-only steps until the next completion or arrival
        k = max(1, math.ceil((osl - generated(running[0])) / tau - 1e-9))
        base_kv = (in_flight * (isl + 1.0 + done) - entry_sum) / in_flight
        if recorded:  # every request has arrived: the run ends at the next completion
            rec.run(k, float(in_flight), base_kv, params.graph_pad(in_flight))
            t += k
            steps += k
            done += k * tau
            finish_decodes(t)
            continue
        if k == 1 and decode_one is not None:  # the same numbers as the array path below
            dt = float(params.step_ms(decode_one(float(in_flight), base_kv, params.graph_pad(in_flight)), in_flight))
            t += dt
            steps += 1
            dec_batch_time += in_flight * dt
            done += tau
            finish_decodes(t)
            continue
        j = np.arange(k, dtype=float)
        run = decode_run(float(in_flight), base_kv + j, params.graph_pad(in_flight))
        dts = params.step_ms(np.asarray(run, float), in_flight)
        if waiting and waiting[0].arrival > t:  # none waiting has arrived (none blocked): the next does
            ends = t + np.cumsum(dts)
            # stop after the step during which the next request arrives
            idx = int(np.searchsorted(ends, waiting[0].arrival, side="left"))
            k = min(k, idx + 1)
            dts = dts[:k]
        t += float(dts.sum())
        steps += k
        dec_batch_time += in_flight * float(dts.sum())
        done += k * tau
        finish_decodes(t)

    if waiting or running:
        raise InvalidConfigError(
            f"the benchmark of {C} clients x {total_requests // max(C, 1)} requests did not finish in {max_events} "
            "scheduler events",
            "the benchmark is too long to play out step by step (or makes no progress); run fewer clients or "
            "fewer requests per client (--concurrency, --requests-per-client)",
        )
    if recorded:
        dts, dec_n, clock = rec.clock(steps_at_once, params)
        at = lambda v: clock[np.asarray(v, dtype=np.int64)]  # noqa: E731  (step counts -> ms)
        sent, arrival = np.asarray(sent_v, float), np.full(len(w_v), params.arrival_delay_ms)
        start, first, end = at(start_v), at(first_v), at(end_v)
        t = float(clock[-1])
        dec_batch_time = float(np.dot(dec_n, dts))
    else:
        sent, arrival, start, first, end = (np.asarray(v, float) for v in (sent_v, arrival_v, start_v, first_v, end_v))
    w = np.asarray(w_v, float)
    parts, ttft_d = _first_token_side(params, sent, arrival, start, first, w)
    if first_tokens_only:
        return FirstTokens(ttft_d.mean(), parts, ttft_d)
    tpot_d = Distribution((end - first) / max(osl - 1, 1), w)
    ttft, tpot = ttft_d.mean(), tpot_d.mean()
    lat = float(np.dot(end - sent, w) / w.sum())
    tput = total_requests * osl / (t / 1e3) / gpus if t > 0 else 0.0
    res = SimResult(
        concurrency=C, ttft_ms=ttft, tpot_ms=tpot, request_latency_ms=lat,
        tokens_per_s_per_gpu=tput, tokens_per_s_per_user=1e3 / tpot if tpot > 0 else 0.0,
        mean_decode_batch=dec_batch_time / t if t > 0 else 0.0, steps=steps, ttft_parts=parts,
    )
    res.set_percentiles(ttft_d, tpot_d)
    return res


#: a recorded first wave whose TTFTs alone are asked (what a search asks) is played by
#: :func:`_first_wave` rather than by :func:`simulate`'s general loop (tests turn it off to compare)
FIRST_WAVE_PLAYER = True


class _WaveStart:
    """A recorded first wave of ``C`` requests as it stood at the start of the step in which it
    started its last requests (:func:`_first_wave`). Up to that step the scheduler's decisions
    never depended on how many requests were left to start (each step took fewer than were left),
    so a wave of more requests, played on the same settings, makes the same decisions up to there
    and can take over from this state with more requests left; the wave's own lists hold the
    state's prefix (``n_*`` entries of each) and are never changed within it. Once the wave is
    priced (:func:`_first_tokens`), ``gpu`` holds its steps' GPU times as ``engine`` priced them
    by ``path`` (:meth:`~infercast.engine.compiled.CompiledEngine.steps_path`), for a wave that
    takes over to reuse (None: not priced, or by an engine that does not say how)."""

    __slots__ = ("admitted", "part", "running", "head", "n_running", "entry_sum", "done", "t", "events",
                 "rec", "n_steps", "n_groups", "n_runs", "cohorts", "n_cohorts", "n_queue", "gpu", "path", "engine")

    def __init__(self, admitted, part, running, head, n_running, entry_sum, done, t, events, rec, cohorts):
        self.admitted, self.part, self.running, self.head = admitted, part, running, head
        self.n_queue = len(running)
        self.n_running, self.entry_sum, self.done, self.t, self.events = n_running, entry_sum, done, t, events
        self.rec, self.n_steps, self.n_groups, self.n_runs = rec, len(rec.dec), len(rec.group_step), len(rec.runs)
        self.cohorts, self.n_cohorts = cohorts, len(cohorts[0])
        self.gpu, self.path, self.engine = None, None, None


def _wave_key(params: SchedulerParams, isl: int, osl: int, kv_slots: float, per_req_kv: float, tau: float,
              width: float, max_events: int) -> tuple:
    """What :func:`_first_wave`'s decisions read besides the number of requests: waves of the
    same key can take over from each other's :class:`_WaveStart`."""
    return (isl, osl, kv_slots, per_req_kv, tau, width, max_events, params.max_num_tokens, params.mixed,
            params.chunked, params.max_batch_size, params.min_prefill_chunk, params.graph_batch_sizes)


def _first_wave(rec: _Record, C: int, isl: int, osl: int, params: SchedulerParams, kv_slots: float, per_req_kv: float,
                tau: float, width: float, max_events: int, waves: dict | None = None) -> tuple:
    """:func:`simulate`'s loop for a recorded first wave played until every request has its first
    token: the same decisions in the same arithmetic, so the same steps (noted in ``rec``) and the
    same TTFTs, on the state such a wave has. Every request arrives at once and none is sent
    later, so what waits is at most one request part-way through its prompt (chunked, it is
    always the one request the last step ran out of room for) and the requests not yet started,
    all alike: two numbers and a count instead of a queue of cohorts; a cohort is made only when
    its requests get their first token. Answers (the step each cohort's first chunk began, the
    step it got its first token, its requests) in the order the general loop records them (the
    order of first tokens, which is the order of completions), the steps played, the
    :class:`_WaveStart` it took over from (None: played from the first step) and its own.

    ``waves``: a dict the caller keeps across waves (of one layout's concurrencies). Each wave
    played leaves there its :class:`_WaveStart` (under :func:`_wave_key`), and a wave of more
    requests than one left there takes over from the largest such (its record, cohorts and state
    copied, its requests not started raised to this wave's): the same decisions, steps and TTFTs
    as played from the first step (tested), without playing the steps the two waves share (about
    half of a wave twice the size of one played before; :func:`_first_tokens` reuses the shared
    steps' prices too)."""
    budget = float(params.max_num_tokens)
    mixed, chunked, max_batch = params.mixed, params.chunked, params.max_batch_size
    min_chunk = float(params.min_prefill_chunk)
    fisl = float(isl)
    fresh = C  # requests not started
    part = None  # [prefill tokens left, tokens done, start step] of the request part-way through its prompt
    running: list = []  # (requests, entry) of the decoding cohorts, oldest first, from running[head] on
    head = 0
    n_running, entry_sum, done = 0, 0.0, 0.0
    start_v, first_v, w_v = [], [], []
    t, events = 0.0, 0
    table = took_from = None
    if waves is not None:
        table = waves.setdefault(_wave_key(params, isl, osl, kv_slots, per_req_kv, tau, width, max_events), {})
        smaller = [c for c in table if c < C]
        if smaller:  # take over from the largest wave played before
            w = took_from = table[max(smaller)]
            fresh, part, running = C - w.admitted, w.part, w.running[w.head:w.n_queue]
            n_running, entry_sum, done, t, events = w.n_running, w.entry_sum, w.done, w.t, w.events
            rec.extend_from(w.rec, w.n_steps, w.n_groups, w.n_runs)
            start_v, first_v, w_v = (list(v[:w.n_cohorts]) for v in w.cohorts)
    took_last = None  # this wave's _WaveStart
    run_note = rec.run
    # rec.step's appends, bound once (a wave is hundreds of steps)
    note_group_steps, note_groups = rec.group_step.extend, rec.groups.extend
    note_dec, note_kv, note_pad, note_seqs = rec.dec.append, rec.kv.append, rec.pad.append, rec.seqs.append
    while fresh or part is not None:
        if events >= max_events:
            raise InvalidConfigError(
                f"the benchmark of {C} clients x 1 requests did not finish in {max_events} scheduler events",
                "the benchmark is too long to play out step by step (or makes no progress); run fewer clients or "
                "fewer requests per client (--concurrency, --requests-per-client)")
        fresh0, part0 = fresh, part  # (the step's starting state, for a _WaveStart)
        events += 1
        in_flight = n_running
        kv_used = in_flight * per_req_kv
        room = budget - (in_flight * width if mixed else 0.0)
        if chunked:
            room = max(room, min_chunk)
        gs = []  # the step's groups (sequences, chunk, prefix), as simulate's loop notes them
        seqs = 0  # the sequences they carry
        finishing = []  # (requests, start step) of the groups whose prompt this step completes
        new_part = None
        if room > 0 and part is not None:  # the request part-way through its prompt holds its KV already
            rem, pdone, pstart = part
            chunk = rem if int(min(1, room // rem)) >= 1 else room if chunked else None
            if chunk is not None:
                gs.append((1.0, float(chunk), float(pdone)))
                seqs = 1
                room -= 1 * chunk
                part = [rem - chunk, pdone + chunk, pstart]
                if part[0] <= 1e-9:
                    finishing.append((1, pstart))
                    part = None
        admitted = 0
        while fresh and room > 0:  # the requests not started: whole prompts, then a chunk of the next
            can = int(min(fresh, (kv_slots - kv_used) // per_req_kv, max_batch - in_flight - admitted))
            if can <= 0:
                break
            whole = int(min(can, room // fisl))
            if whole >= 1:
                take, chunk = whole, fisl
            elif chunked:
                take, chunk = 1, room
            else:
                break
            gs.append((float(take), float(chunk), 0.0))
            seqs += take
            room -= take * chunk
            kv_used += take * per_req_kv
            admitted += take
            fresh -= take
            if fisl - chunk <= 1e-9:
                finishing.append((take, t))
            else:
                new_part = [fisl - chunk, 0.0 + chunk, t]
        if not fresh and took_last is None:  # this step starts the last requests: the state before it
            took_last = _WaveStart(C - fresh0, part0, running, head, n_running, entry_sum, done, t, events - 1, rec,
                                   (start_v, first_v, w_v))
        if gs:
            if mixed and head < len(running):
                kv_mean = (in_flight * (isl + 1.0 + done) - entry_sum) / in_flight
                dec_n = in_flight
            else:
                kv_mean, dec_n = 1.0, 0
            # rec.step: the groups with their step, its decodes, KV length, padding, sequences (the
            # general loop's dec_n + sum of the groups' sequences: whole numbers, the same value)
            note_group_steps([int(t)] * len(gs))
            note_groups(gs)
            note_dec(float(dec_n))
            note_kv(kv_mean)
            note_pad(0.0)
            note_seqs(dec_n + float(seqs))
            t += 1.0
            if dec_n:
                done += tau
                while head < len(running) and 1.0 + done - running[head][1] >= osl - 1e-9:
                    n, entry = running[head]
                    head += 1
                    n_running -= n
                    entry_sum -= n * entry
            for n, started in finishing:  # their first token comes with this step
                start_v.append(started)
                first_v.append(t)
                w_v.append(n)
                if osl > 1:
                    running.append((n, done))
                    n_running += n
                    entry_sum += n * done
            if new_part is not None:
                part = new_part
            continue
        # nothing admissible (the KV cache or the batch is full): decode to the next completion
        if head == len(running):  # (simulate's loop would wait for an arrival that never comes)
            events = max_events
            continue
        k = max(1, math.ceil((osl - (1.0 + done - running[head][1])) / tau - 1e-9))
        base_kv = (in_flight * (isl + 1.0 + done) - entry_sum) / in_flight
        run_note(k, float(in_flight), base_kv, params.graph_pad(in_flight))
        t += k
        done += k * tau
        while head < len(running) and 1.0 + done - running[head][1] >= osl - 1e-9:
            n, entry = running[head]
            head += 1
            n_running -= n
            entry_sum -= n * entry
    if table is not None and took_last is not None:
        table.setdefault(C, took_last)
    return start_v, first_v, w_v, int(t), took_from, took_last


def _first_tokens(rec: _Record, engine, params: SchedulerParams, start_v: list, first_v: list, w_v: list,
                  took_from: _WaveStart | None = None, left: _WaveStart | None = None) -> FirstTokens:
    """The :class:`FirstTokens` of a recorded first wave (:func:`_first_wave`): the steps priced at
    once by ``engine``'s ``mixed_steps_ms``, the clock starting when the requests reach the
    scheduler (all sent at 0). A wave that took over from ``took_from`` reuses the GPU times of
    the steps the two share when ``took_from`` was priced by this engine (the same object) the
    way the whole wave would be (:meth:`~infercast.engine.compiled.CompiledEngine.steps_path`: each
    step's time depends on that step alone, so the same numbers), pricing only the steps after
    them; ``left`` (the wave's own :class:`_WaveStart`) keeps the wave's GPU times for the next."""
    dec, kv, pad, seqs, gs, g = rec.arrays()
    # (the class's: an engine wrapper answers an unknown attribute with the wrapped engine's)
    how = getattr(type(engine), "steps_path", None)
    path = how(engine, dec.size) if how is not None else None
    w = took_from
    if path is not None and w is not None and w.engine is engine and w.path == path and w.gpu is not None:
        s0, g0 = w.n_steps, w.n_groups
        tail = engine.mixed_steps_ms(gs[g0:] - s0, g[g0:, 0], g[g0:, 1], g[g0:, 2], dec[s0:], kv[s0:], pad[s0:],
                                     path=path)
        gpu = np.concatenate((w.gpu[:s0], np.asarray(tail, dtype=float)))
    else:
        gpu = np.asarray(engine.mixed_steps_ms(gs, g[:, 0], g[:, 1], g[:, 2], dec, kv, pad), dtype=float)
    if left is not None and path is not None:
        left.gpu, left.path, left.engine = gpu, path, engine
    clock = _clock(params, np.asarray(params.step_ms(gpu, seqs), dtype=float))
    start, first = clock[np.asarray(start_v, dtype=np.int64)], clock[np.asarray(first_v, dtype=np.int64)]
    parts, ttft_d = _first_token_side(params, np.zeros(len(w_v)), np.full(len(w_v), params.arrival_delay_ms), start,
                                      first, np.asarray(w_v, float))
    return FirstTokens(ttft_d.mean(), parts, ttft_d)


def _first_token_side(params: SchedulerParams, sent, arrival, start, first, w) -> tuple[dict, Distribution]:
    """(the mean TTFT's parts, the TTFT distribution) of cohorts of ``w`` requests sent, reaching
    the scheduler, starting their first chunk and getting their first token at those times (ms)."""
    wait, prefill = start - arrival, first - start
    parts = ttft_parts(params.arrival_delay_ms, float(np.dot(wait, w) / w.sum()), float(np.dot(prefill, w) / w.sum()))
    return parts, Distribution(first - sent, w)


def _clock(params: SchedulerParams, dts: np.ndarray) -> np.ndarray:
    """ms at the start of each step of wall times ``dts`` and after the last, from when the
    requests reach the scheduler (``arrival_delay_ms`` after they are sent at 0)."""
    return np.cumsum(np.concatenate(([params.arrival_delay_ms], dts)))


class _Record:
    """The steps of a recorded run (module docstring), in order: per step its decodes, their mean
    KV length, CUDA-graph padding rows and the sequences it carries (host time), and its prefill
    groups (sequences, new tokens, prefix each) flattened with the step each belongs to. A run of
    ``k`` decode-only steps is noted as one block and spread into steps when priced."""

    def __init__(self):
        self.dec, self.kv, self.pad, self.seqs = [], [], [], []
        self.group_step, self.groups = [], []
        self.runs = []  # (first step, k, KV length of the first step)

    def step(self, groups: tuple, dec: float, kv: float, pad: float, seqs: float) -> None:
        s = len(self.dec)
        self.group_step.extend([s] * len(groups))
        self.groups.extend(groups)
        self.dec.append(dec)
        self.kv.append(kv)
        self.pad.append(pad)
        self.seqs.append(seqs)

    def run(self, k: int, dec: float, kv: float, pad: float) -> None:
        self.runs.append((len(self.dec), k, kv))
        self.dec.extend([dec] * k)
        self.kv.extend([kv] * k)
        self.pad.extend([pad] * k)
        self.seqs.extend([dec] * k)

    def clock(self, steps_at_once, params: SchedulerParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(:meth:`priced`'s two arrays, the clock: ms at the start of each step and after the last,
        from when the requests reach the scheduler)."""
        dts, dec = self.priced(steps_at_once, params)
        return dts, dec, _clock(params, dts)

    def extend_from(self, src: _Record, n_steps: int, n_groups: int, n_runs: int) -> None:
        """Add ``src``'s first ``n_steps`` steps (its first ``n_groups`` prefill groups and
        ``n_runs`` decode runs: those of the steps) to this empty record."""
        for mine, theirs, n in ((self.dec, src.dec, n_steps), (self.kv, src.kv, n_steps), (self.pad, src.pad, n_steps),
                                (self.seqs, src.seqs, n_steps), (self.group_step, src.group_step, n_groups),
                                (self.groups, src.groups, n_groups), (self.runs, src.runs, n_runs)):
            mine.extend(theirs[:n])

    def arrays(self) -> tuple[np.ndarray, ...]:
        """The steps as arrays: (decodes, KV length, padding, sequences) per step, each prefill
        group's step, and the groups (sequences, new tokens, prefix) as rows."""
        dec, kv, pad, seqs = (np.asarray(v, dtype=float) for v in (self.dec, self.kv, self.pad, self.seqs))
        for s, k, kv0 in self.runs:  # a decode run's KV length grows by one token per step
            kv[s:s + k] = kv0 + np.arange(k, dtype=float)
        g = np.fromiter(chain.from_iterable(self.groups), dtype=float, count=3 * len(self.groups)).reshape(-1, 3)
        return dec, kv, pad, seqs, np.asarray(self.group_step, dtype=np.int64), g

    def priced(self, steps_at_once, params: SchedulerParams) -> tuple[np.ndarray, np.ndarray]:
        """(each step's wall time in ms, its decodes): the engine's ``steps_at_once`` prices the
        steps' GPU time, ``params`` adds the host's."""
        dec, kv, pad, seqs, gs, g = self.arrays()
        gpu = steps_at_once(gs, g[:, 0], g[:, 1], g[:, 2], dec, kv, pad)
        return np.asarray(params.step_ms(gpu, seqs), dtype=float), dec
