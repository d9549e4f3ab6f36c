"""A deployment to simulate: schedulers, their step timer, router and front end, wired together.

:func:`simulate` takes any step timer (:mod:`.timer`); :func:`simulate_estimator` builds one
from an :class:`infercast.api.Estimator` (the compiled engine, its KV capacity, the backend's
:class:`~infercast.serving.backends.SchedulerParams`) for ``replicas`` copies of its layout. With
attention data parallelism each replica holds ``attention_dp`` schedulers (one per rank, each
with a rank's KV cache) behind the replica's one front end; the router spreads requests over
all of them. The ranks of a replica step together (:class:`.lockstep.Lockstep`: a step as slow as
the slowest rank's, held by the experts' collectives), in the aggregated simulation; a
disaggregated deployment's workers' ranks are still simulated as independent schedulers.
"""

from __future__ import annotations

import math
from dataclasses import replace

from .load import Workload
from .lockstep import Lockstep
from .loop import run
from .router import Router
from .scheduler import Unit, UnitConfig
from .stats import SimResult, summarise
from .timer import EngineStepTimer


def simulate(timer, cfg: UnitConfig, workload: Workload, *, units: int = 1, replica_of=None, router: str = "round-robin",
             prefix_cache: bool = True, front_end=None, warmup: float = 0.1, cooldown: float = 0.1,
             ttft_ms: float | None = None, tpot_ms: float | None = None, progress: bool = False, notes=(),
             front_end_spread: float = 0.0, seed: int = 0, lockstep: int = 1,
             balance_timeout_steps: int = 0) -> SimResult:
    """Simulate ``workload`` on ``units`` identical schedulers of ``cfg`` timed by ``timer``;
    ``front_end(open streams, prompt tokens)`` -> ms before a request reaches its scheduler
    (default none), spread by ``front_end_spread`` (:func:`.loop.run`). ``lockstep`` ``n`` > 1:
    every ``n`` consecutive schedulers are the attention-DP ranks of one replica and step
    together (:class:`.lockstep.Lockstep`, with its balance hold of ``balance_timeout_steps``
    steps); ``units`` must be a multiple of it."""
    us = [Unit(i, cfg, timer, workload.block_tokens, prefix_cache) for i in range(units)]
    if lockstep > 1:
        if units % lockstep:
            from ...errors import InvalidInputError

            raise InvalidInputError(f"{units} schedulers do not split into replicas of {lockstep} attention-DP ranks")
        for i in range(0, units, lockstep):
            Lockstep(us[i:i + lockstep], balance_timeout_steps)
    rt = Router(router, us)
    fe = front_end or (lambda streams, tokens: 0.0)
    n_rep = (max(replica_of) + 1) if replica_of is not None else units
    workload, start_note = _resolve_start(workload, lambda w: expected_cycle_ms(
        w, timer, cfg, units=units, replicas=n_rep, front_end=fe), cfg.mixed)
    reqs = run(us, rt, workload, fe, replica_of, progress, front_end_spread, seed)
    return summarise(reqs, us, warmup=warmup, cooldown=cooldown, ttft_ms=ttft_ms, tpot_ms=tpot_ms,
                     notes=list(workload.notes) + list(notes) + start_note)


def expected_cycle_ms(workload: Workload, timer, cfg: UnitConfig, *, units: int, replicas: int, front_end,
                      decode_timer=None, decode_cfg: UnitConfig | None = None, decode_units: int = 0) -> float:
    """A closed-loop client's expected request cycle (send to completion, ms) once every client
    runs, for ``--client-start staggered``: the clients' mean request (``isl``, ``osl``), spread
    evenly over the schedulers (``D = min(C / units, max_batch_size)`` each), takes

    * the front end at ``C / replicas`` open streams;
    * ``ceil((osl - 1) / tokens_per_step)`` decode steps of ``D`` decodes at the mean KV length
      ``isl + osl / 2``;
    * the prefill of the ``D`` prompts each scheduler takes in per cycle, ``D x isl`` tokens in
      steps of up to ``max_num_tokens``: on an engine that mixes, each such step's extra time over
      the decode-only step; otherwise the whole prefill step (decodes pause).

    Disaggregated (``decode_timer`` given): ``timer`` / ``cfg`` / ``units`` are the prefill
    workers' (prefill steps alone), the decode steps are the decode workers'. An estimate from
    mean shapes, used only to place the clients' first requests; what the simulation then plays
    is not shaped by it."""
    clients = max(1, min(workload.clients, len(workload)))
    isl, osl = float(workload.isl.mean()), float(workload.osl.mean())
    dt, dcfg, du = (decode_timer, decode_cfg, decode_units) if decode_timer is not None else (timer, cfg, units)
    d = max(1.0, min(clients / max(du, 1), float(dcfg.max_batch_size)))
    kv = d * (isl + osl / 2.0)
    t_dec = dt.step_ms((), int(round(d)), kv)
    decode = math.ceil(max(osl - 1.0, 0.0) / dt.tokens_per_step) * t_dec
    prompts = max(1.0, min(clients / max(units, 1), float(cfg.max_batch_size)))
    tokens = prompts * isl
    chunk = min(tokens, float(cfg.max_num_tokens))
    if decode_timer is None and cfg.mixed:
        extra = timer.step_ms(((chunk, 0.0),), int(round(d)), kv) - t_dec
    else:
        extra = timer.step_ms(((chunk, 0.0),), 0, 0.0)
    return float(front_end(clients / max(replicas, 1), isl)) + decode + tokens / chunk * max(extra, 0.0)


def _resolve_start(workload: Workload, cycle, mixed: bool) -> tuple[Workload, list[str]]:
    """``workload`` with its closed loop's start resolved (``auto``: ``wave-then-staggered`` when
    every request has the same lengths and the engine mixes prefill into decode steps, else
    ``together``; a ramp-up of None: one expected request cycle, ``cycle(workload)``), and a note
    saying how the clients started."""
    if workload.sent_ms is not None:
        return workload, []
    start, ramp = workload.client_start, workload.ramp_up_ms
    how = ""
    if start == "auto":
        same = bool((workload.isl == workload.isl[0]).all() and (workload.osl == workload.osl[0]).all())
        start = "wave-then-staggered" if same and mixed else "together"
        how = (" (auto: requests of one length on an engine that mixes prefill into decode steps, whose "
               "real runs de-phase)" if start != "together" else "")
    if start == "together":
        return replace(workload, client_start=start, ramp_up_ms=0.0), []
    what = "a ramp-up of"
    if ramp is None:
        ramp = cycle(workload)
        what = "one expected request cycle,"
    workload = replace(workload, client_start=start, ramp_up_ms=ramp)
    if start == "staggered":
        return workload, [f"closed loop: clients' first requests spread evenly over {what} {ramp:.0f} ms{how}"]
    return workload, [f"closed loop: clients start together; after its first request each waits once, so that "
                      f"their second requests spread evenly over {what} {ramp:.0f} ms{how}"]


def simulate_estimator(est, params, workload: Workload, *, replicas: int = 1, router: str = "round-robin",
                       prefix_cache: bool = True, warmup: float = 0.1, cooldown: float = 0.1,
                       ttft_ms: float | None = None, tpot_ms: float | None = None, progress: bool = False,
                       quantum: int = 1, expected_running: float = 1.0, front_end_spread: float = 0.0,
                       seed: int = 0, schedule_ahead: bool | None = None) -> tuple[SimResult, EngineStepTimer]:
    """:func:`simulate` of ``replicas`` copies of ``est``'s layout under ``params``. Each rank's
    KV capacity is :meth:`MemoryBreakdown.capacity_for` ``expected_running`` requests (it differs
    from the whole KV budget only for models with a per-request state, such as linear attention,
    whose states are not tracked request by request)."""
    dp = est.plan.parallel.attention_dp
    timer = EngineStepTimer(est.engine, params, quantum)
    cap = est.memory.capacity_for(expected_running)
    cfg = UnitConfig.from_params(params, cap, schedule_ahead)
    units = replicas * dp
    notes = []
    hold = int(params.adp_balance_timeout_steps) if dp > 1 else 0
    if dp > 1:
        notes.append(f"{dp} attention-DP ranks per replica: one scheduler each behind one front end, stepping "
                     "together (each step as long as the slowest rank's)"
                     + (f"; new prompts held until every rank has one, up to {hold} steps" if hold > 0 else ""))
    res = simulate(timer, cfg, workload, units=units, replica_of=[i // dp for i in range(units)], router=router,
                   prefix_cache=prefix_cache, front_end=params.front_end_ms, warmup=warmup, cooldown=cooldown,
                   ttft_ms=ttft_ms, tpot_ms=tpot_ms, progress=progress, notes=notes,
                   front_end_spread=front_end_spread, seed=seed, lockstep=dp, balance_timeout_steps=hold)
    return res, timer


def simulate_disagg(prefill_timer, prefill_cfg: UnitConfig, decode_timer, decode_cfg: UnitConfig, workload: Workload, *,
                    prefill_units: int, decode_units: int, transfer_ms, router: str = "least-outstanding",
                    prefix_cache: bool = True, front_end=None, warmup: float = 0.1, cooldown: float = 0.1,
                    ttft_ms: float | None = None, tpot_ms: float | None = None, progress: bool = False, notes=(),
                    front_end_spread: float = 0.0, seed: int = 0) -> SimResult:
    """Disaggregated serving: ``prefill_units`` prefill schedulers (prefill-only, with the prefix
    caches; ``router`` picks one) and ``decode_units`` decode schedulers (least outstanding);
    ``transfer_ms(request)``: its KV cache's move from prefill to decode worker. TTFT is the
    prefill worker's first token; the transfer and the wait for a decode slot fall in TPOT."""
    pre = [Unit(i, prefill_cfg, prefill_timer, workload.block_tokens, prefix_cache, prefill_only=True)
           for i in range(prefill_units)]
    dec = [Unit(i, decode_cfg, decode_timer, workload.block_tokens, False) for i in range(decode_units)]
    fe = front_end or (lambda streams, tokens: 0.0)
    workload, start_note = _resolve_start(workload, lambda w: expected_cycle_ms(
        w, prefill_timer, prefill_cfg, units=prefill_units, replicas=1, front_end=fe, decode_timer=decode_timer,
        decode_cfg=decode_cfg, decode_units=decode_units), False)
    reqs = run(pre, Router(router, pre), workload, fe, None, progress, front_end_spread, seed,
               decode_units=dec, decode_router=Router("least-outstanding", dec), transfer_ms=transfer_ms)
    return summarise(reqs, pre + dec, warmup=warmup, cooldown=cooldown, ttft_ms=ttft_ms, tpot_ms=tpot_ms,
                     notes=list(workload.notes) + list(notes) + start_note, kv_units=dec)


def simulate_estimator_disagg(prefill, decode, params_prefill, params_decode, workload: Workload, *,
                              prefill_workers: int, decode_workers: int, router: str = "least-outstanding",
                              prefix_cache: bool = True, warmup: float = 0.1, cooldown: float = 0.1,
                              ttft_ms: float | None = None, tpot_ms: float | None = None, progress: bool = False,
                              quantum: int = 1, expected_running: float = 1.0, front_end_spread: float = 0.0,
                              seed: int = 0) -> SimResult:
    """:func:`simulate_disagg` of ``prefill_workers`` copies of the ``prefill`` estimator's
    layout and ``decode_workers`` of ``decode``'s (one scheduler per attention-DP rank). The KV
    cache moves from every prefill GPU in parallel over the node-to-node network
    (:func:`infercast.serving.disagg.kv_transfer_ms`, the system's ``inter_node_bw`` and
    ``p2p_latency``); the front end is the backend's base time only (a disaggregated deployment
    sits behind its router, as :func:`infercast.api.serve_disagg` assumes)."""
    from ..disagg import kv_transfer_ms

    node = prefill.data.system.node
    per_token, gpus = prefill.memory.kv_per_token, prefill.gpus

    def transfer(r):
        return kv_transfer_ms(per_token, r.isl, gpus, node.inter_node_bw, node.p2p_latency_s)

    pdp, ddp = prefill.plan.parallel.attention_dp, decode.plan.parallel.attention_dp
    pcfg = UnitConfig.from_params(params_prefill, prefill.memory.capacity_for(1.0))
    dcfg = UnitConfig.from_params(params_decode, decode.memory.capacity_for(expected_running))
    # the balance hold of attention-DP workers does not act here: a prefill worker runs no decodes
    # and a decode worker no prompts, so neither ever holds (its ranks are independent schedulers)
    notes = []
    base = params_prefill.arrival_delay_ms
    return simulate_disagg(EngineStepTimer(prefill.engine, params_prefill, quantum), pcfg,
                           EngineStepTimer(decode.engine, params_decode, quantum), dcfg, workload,
                           prefill_units=prefill_workers * pdp, decode_units=decode_workers * ddp, transfer_ms=transfer,
                           router=router, prefix_cache=prefix_cache, front_end=lambda streams, tokens: base,
                           warmup=warmup, cooldown=cooldown, ttft_ms=ttft_ms, tpot_ms=tpot_ms, progress=progress,
                           notes=notes, front_end_spread=front_end_spread, seed=seed)
