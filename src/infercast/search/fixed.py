"""Every deployment of exactly ``gpus`` GPUs at each benchmark concurrency, and the best of them.

The question "what do N GPUs do for C clients?" when nobody says how the GPUs are split: ``r``
replicas of an aggregated layout of ``N / r`` GPUs (the clients spread over the replicas, the
busiest holding ``ceil(C / r)``; its latencies stand for every client, as
:func:`infercast.api.serve_agg_replica` does for attention-DP ranks), or ``p`` prefill workers and
``d`` decode workers of any two layouts (within the NVLink domain, without pipeline stages) with
``p x prefill GPUs + d x decode GPUs = N``. With the GPUs and the clients fixed, a closed-loop
benchmark's throughput is ``C`` over the mean request latency, so the best deployment -- the
highest throughput per GPU, :func:`.pareto.recommend` -- is also the one each client waits least
for.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from ..errors import InfercastError
from ..report.layout import plural
from .parallel import check_jobs, run_parts
from .run import (
    Candidate,
    SearchResult,
    _count,
    _estimators,
    _fields,
    _finish,
    _fit_concurrencies,
    _positive,
    _roles,
    _start,
    decode_holders,
    disagg_worker,
    evaluate_disagg,
    rank_capacity,
    refine_concurrency,
    refuse,
    stop_at_saturation,
    with_energy,
)
from .space import Layout, layouts


def search_fixed(
    model: str,
    system: str,
    backend: str,
    isl: int,
    osl: int,
    *,
    gpus: int,
    concurrencies: list[int] | None = None,
    ttft_max_ms: float | None = None,
    tpot_max_ms: float | None = None,
    backend_version: str | None = None,
    systems_path=None,
    max_workers: int | None = None,
    params=None,
    scheduler: dict | None = None,
    make_estimator: Callable[[Layout], object] | None = None,
    cap_concurrency: bool = False,
    refine: bool | None = None,
    prefix: int = 0,
    jobs: int | None = 1,
    progress=None,
    **estimator_kw,
) -> SearchResult:
    """Aggregated replicas and disaggregated worker splits that use exactly ``gpus`` GPUs, each at
    every concurrency (clients of the whole deployment; default 1, 2, 4, ..., 1024); ``best`` is the
    highest throughput per GPU among those meeting the targets (at one concurrency: the lowest mean
    request latency). At most ``max_workers`` workers of each role (None: as many as fit). ``params``: the backend's
    scheduler (default: its own, with ``scheduler``'s {SchedulerParams field: value} applied). ``make_estimator(layout)`` builds each layout's estimator
    (default: an :class:`~infercast.Estimator` with ``estimator_kw``), so a caller that asks many
    times can reuse them. ``cap_concurrency``, ``refine``, ``prefix``, ``jobs``, ``progress`` (one part
    per aggregated layout, then one per decode layout): as :func:`~infercast.search.run.search_agg`'s."""
    from ..api import serve_agg_replica
    from ..serving.backends import scheduler_params

    n = int(_positive("gpus", gpus, int))
    jobs = check_jobs(jobs)
    max_workers = None if max_workers is None else int(_positive("max_workers", max_workers, int))
    conc, base, res = _start(model, system, backend, isl, osl, concurrencies, ttft_max_ms, tpot_max_ms, backend_version,
                             systems_path, estimator_kw, make_estimator, prefix=prefix)
    res.max_gpus = n
    node = base.data.system.node
    space = layouts(base.spec, n, node.nvlink_gpus)

    def worker(lay: Layout) -> bool:  # a disaggregated worker (run.disagg_worker)
        return disagg_worker(lay, node.nvlink_gpus, n)

    ests = _estimators(res, base, model, space, backend_version, systems_path, estimator_kw,
                       keep=lambda lay: n % lay.gpus == 0 or worker(lay), make=make_estimator)
    if params is None and scheduler:
        from dataclasses import replace

        res.scheduler = {role: dict(scheduler) for role in ("agg", "prefill", "decode")}

        params = replace(scheduler_params(backend, base.data.system, base.spec), **scheduler)
    agg_params = params or scheduler_params(backend, base.data.system, base.spec)
    roles = _roles(res, {lay: e for lay, e in ests.items() if worker(lay)})
    holders = [(f"{n // lay.gpus}x{lay.label}", n // lay.gpus * est.plan.parallel.attention_dp
                * rank_capacity(est, res.isl, res.osl, agg_params, res.prefix)) for lay, est in ests.items() if n % lay.gpus == 0]
    holders += decode_holders(res, roles, n, max_workers, agg_params)
    conc = res.concurrencies = _fit_concurrencies(res, conc, concurrencies is not None, cap_concurrency, holders)
    refine = concurrencies is None if refine is None else refine
    stop = cap_concurrency and concurrencies is None  # no default concurrency after a layout saturates

    def agg_part(lay: Layout, est, res: SearchResult) -> None:
        """``n / lay.gpus`` replicas of ``lay`` at each concurrency (with ``refine``, then the probes)."""
        replicas = n // lay.gpus
        label = lay.label if replicas == 1 else f"{replicas}x{lay.label}"
        words = est.layout_words if replicas == 1 else f"{plural(n, 'GPU')}: {replicas} replicas x ({est.layout_words})"

        bound = [None]  # the bound of the last serving result

        def one(c: int) -> bool | None:
            _count(res, "agg candidate")
            per_replica = -(-c // replicas)
            bound[0] = None
            try:
                r, _ = serve_agg_replica(est, per_replica, res.isl, res.osl, agg_params, prefix=res.prefix)
            except InfercastError as exc:
                refuse(res, f"{label}@c{c}", "agg candidate", str(exc), exc)
                return None
            bound[0] = r.bound
            r.tokens_per_s_per_gpu *= c / (per_replica * replicas)  # idle clients' share: replicas hold fewer
            cand = with_energy(Candidate(*_fields(res, label, est, n, c, r, r.bound, words)), est, r, res.osl)
            res.candidates.append(cand)
            return cand.meets_targets

        ok: dict[int, bool | None] = {}
        for j, c in enumerate(conc):
            ok[c] = one(c)
            if stop and stop_at_saturation(res, bound[0], j, conc):  # as search_agg's layouts
                break
        if refine:
            refine_concurrency(one, list(ok), ok.get)

    prefills = list(roles["prefill"].items())

    def worker_counts(de) -> list[list[tuple[int, int]]]:
        """Per prefill layout, the (prefill, decode) worker counts with decode layout ``de`` that
        use exactly ``n`` GPUs."""
        counts = []
        for _, pe in prefills:
            counts.append([])
            for pw in range(1, (n - de.gpus) // pe.gpus + 1):
                rest = n - pw * pe.gpus
                if rest % de.gpus == 0 and (max_workers is None or max(pw, rest // de.gpus) <= max_workers):
                    counts[-1].append((pw, rest // de.gpus))
        return counts

    def disagg_part(dl: Layout, de, counts: list[list[tuple[int, int]]], res: SearchResult) -> None:
        """Every split of the ``n`` GPUs between the prefill layouts and decode layout ``dl``
        (``counts``: :func:`worker_counts`)."""
        for _ in prefills:
            _count(res, "disagg layout pair")
        evaluate_disagg(res, prefills, dl, de, counts, conc, params, refine)

    # one part per aggregated layout and per decode layout, in this order (infercast.search.parallel)
    aggs = [(lay, est) for lay, est in ests.items() if n % lay.gpus == 0]
    decodes = [(dl, de, worker_counts(de)) for dl, de in roles["decode"].items()]
    parts = [partial(agg_part, lay, est) for lay, est in aggs] + [partial(disagg_part, *d) for d in decodes]
    cost = [len(conc)] * len(aggs) + [len(conc) * sum(map(len, cs)) for _, _, cs in decodes]
    run_parts(res, parts, jobs, cost=cost, on_done=progress)
    return _finish(res)
