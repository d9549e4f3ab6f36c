"""A deployment to simulate: schedulers, their step timer, router and front end, wired together.

:func:`simulate` takes any step timer (:mod:`.timer`); :func:`simulate_estimator` builds one
from an :class:`infercast.api.Estimator` (the compiled engine, its KV capacity, the backend's
:class:`~infercast.serving.backends.SchedulerParams`) for ``replicas`` copies of its layout. With
attention data parallelism each replica holds ``attention_dp`` schedulers (one per rank, each
with a rank's KV cache) behind the replica's one front end; the router spreads requests over
all of them. Ranks are simulated independently: the lock-step of their MoE collectives (a step
as slow as the slowest rank's) is not modelled, as in :func:`infercast.api.serve_agg_replica`.
"""

from __future__ import annotations

from .load import Workload
from .loop import run
from .router import Router
from .scheduler import Unit, UnitConfig, not_modelled
from .stats import SimResult, summarise
from .timer import EngineStepTimer


def simulate(timer, cfg: UnitConfig, workload: Workload, *, units: int = 1, replica_of=None, router: str = "round-robin",
             prefix_cache: bool = True, front_end=None, warmup: float = 0.1, cooldown: float = 0.1,
             ttft_ms: float | None = None, tpot_ms: float | None = None, progress: bool = False, notes=(),
             front_end_spread: float = 0.0, seed: int = 0) -> SimResult:
    """Simulate ``workload`` on ``units`` identical schedulers of ``cfg`` timed by ``timer``;
    ``front_end(open streams, prompt tokens)`` -> ms before a request reaches its scheduler
    (default none), spread by ``front_end_spread`` (:func:`.loop.run`)."""
    us = [Unit(i, cfg, timer, workload.block_tokens, prefix_cache) for i in range(units)]
    rt = Router(router, us)
    fe = front_end or (lambda streams, tokens: 0.0)
    reqs = run(us, rt, workload, fe, replica_of, progress, front_end_spread, seed)
    return summarise(reqs, us, warmup=warmup, cooldown=cooldown, ttft_ms=ttft_ms, tpot_ms=tpot_ms,
                     notes=list(workload.notes) + list(notes))


def simulate_estimator(est, params, workload: Workload, *, replicas: int = 1, router: str = "round-robin",
                       prefix_cache: bool = True, warmup: float = 0.1, cooldown: float = 0.1,
                       ttft_ms: float | None = None, tpot_ms: float | None = None, progress: bool = False,
                       quantum: int = 1, expected_running: float = 1.0, front_end_spread: float = 0.0,
                       seed: int = 0) -> tuple[SimResult, EngineStepTimer]:
    """:func:`simulate` of ``replicas`` copies of ``est``'s layout under ``params``. Each rank's
    KV capacity is :meth:`MemoryBreakdown.capacity_for` ``expected_running`` requests (it differs
    from the whole KV budget only for models with a per-request state, such as linear attention,
    whose states are not tracked request by request)."""
    dp = est.plan.parallel.attention_dp
    timer = EngineStepTimer(est.engine, params, quantum)
    cap = est.memory.capacity_for(expected_running)
    cfg = UnitConfig.from_params(params, cap)
    units = replicas * dp
    notes = [f"not modelled, run as if off: {x}" for x in not_modelled(params)]
    if dp > 1:
        notes.append(f"{dp} attention-DP ranks per replica simulated as independent schedulers behind one front end")
    res = simulate(timer, cfg, workload, units=units, replica_of=[i // dp for i in range(units)], router=router,
                   prefix_cache=prefix_cache, front_end=params.front_end_ms, warmup=warmup, cooldown=cooldown,
                   ttft_ms=ttft_ms, tpot_ms=tpot_ms, progress=progress, notes=notes,
                   front_end_spread=front_end_spread, seed=seed)
    return res, timer
