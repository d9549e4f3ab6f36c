"""Running experiments: every (system, backend) of each experiment, either served at its fixed
layout and concurrencies or searched, into one flat list of outcome rows.

An outcome row holds the experiment's name, system, backend and data version, the mode, the
deployment (layout, GPUs, clients), its TTFT / TPOT / throughput, whether it meets the targets,
its 80% / 95% prediction intervals (``intervals``: a served row's from
:func:`~infercast.serving.intervals.agg_intervals` / :func:`~infercast.serving.intervals.disagg_intervals`
as ``serve`` / ``serve-disagg`` give them, a searched row's from
:func:`~infercast.search.run.candidate_intervals` as ``search`` gives them), and ``error`` (the
typed error's message) when that combination could not be answered -- one combination's failure
does not stop the others. Searches keep their full
:class:`~infercast.search.SearchResult` for saved reports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ..errors import InfercastError
from .schema import Experiment


@dataclass
class Outcome:
    """The answer for one experiment on one (system, backend)."""

    experiment: str
    system: str
    backend: str
    kind: str  # "serve" | "serve-disagg" | a search mode
    rows: list[dict] = field(default_factory=list)  # one per concurrency (serve) or the best (search)
    searches: dict = field(default_factory=dict)  # mode -> SearchResult
    error: str | None = None
    estimator_kw: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"experiment": self.experiment, "system": self.system, "backend": self.backend, "kind": self.kind,
                "rows": self.rows, "error": self.error}


def _serve(exp: Experiment, system: str, backend: str, kw: dict) -> list[dict]:
    from ..api import Estimator, serve_agg_replica, serve_disagg
    from ..search.pareto import meets
    from ..serving.backends import scheduler_params
    from ..serving.intervals import agg_intervals, disagg_intervals, intervals_dict

    overrides = exp.scheduler.overrides()
    t = exp.targets
    rows = []
    if exp.layout is not None:
        lay = exp.layout
        est = Estimator(exp.model, system, backend, exp.backend_version, lay.tp, lay.pp, attention_dp=lay.attention_dp,
                        moe_tp=lay.moe_tp, moe_ep=lay.moe_ep, cp=lay.cp, **kw)
        params = replace(scheduler_params(backend, est.data.system, est.spec), **overrides)
        for c in exp.concurrency:
            r, _ = serve_agg_replica(est, c, exp.isl, exp.osl, params, prefix=exp.prefix)
            rows.append({"layout": _label(lay), "gpus": est.gpus, "concurrency": c, "backend_version": est.version,
                         **_metrics(r), "meets_targets": meets(r.ttft_ms, r.tpot_ms, t.ttft_ms, t.tpot_ms),
                         "intervals": intervals_dict(agg_intervals(est, r, concurrency=c, isl=exp.isl, osl=exp.osl))})
        return rows
    d = exp.disagg
    ests = {role: Estimator(exp.model, system, backend, exp.backend_version, s.tp, s.pp, attention_dp=s.attention_dp,
                            moe_tp=s.moe_tp, moe_ep=s.moe_ep, cp=s.cp, **kw) for role, s in (("prefill", d.prefill), ("decode", d.decode))}
    own = exp.role_overrides()
    params = {role: replace(scheduler_params(backend, e.data.system, e.spec), **{**overrides, **own[role]})
              for role, e in ests.items()}
    gpus = d.prefill_workers * ests["prefill"].gpus + d.decode_workers * ests["decode"].gpus
    for c in exp.concurrency:
        r = serve_disagg(ests["prefill"], ests["decode"], concurrency=c, isl=exp.isl, osl=exp.osl,
                         prefill_workers=d.prefill_workers, decode_workers=d.decode_workers,
                         params_prefill=params["prefill"], params_decode=params["decode"], prefix=exp.prefix)
        rows.append({"layout": f"P{d.prefill_workers}x{_label(d.prefill)} D{d.decode_workers}x{_label(d.decode)}",
                     "gpus": gpus, "concurrency": c, "backend_version": ests["prefill"].version, **_metrics(r),
                     "meets_targets": meets(r.ttft_ms, r.tpot_ms, t.ttft_ms, t.tpot_ms),
                     "intervals": intervals_dict(disagg_intervals(ests["prefill"], ests["decode"], r, concurrency=c,
                                                                  isl=exp.isl, osl=exp.osl))})
    return rows


def _label(lay) -> str:
    """The search's label of a :class:`~.schema.LayoutSpec` (``tp2-dp4-ep4``)."""
    from ..search.space import Layout

    return Layout(lay.tp, lay.pp, lay.attention_dp, lay.moe_tp, lay.moe_ep, lay.cp).label


def _metrics(r) -> dict:
    return {"ttft_ms": r.ttft_ms, "tpot_ms": r.tpot_ms, "request_latency_ms": r.request_latency_ms,
            "tokens_per_s_per_gpu": r.tokens_per_s_per_gpu, "tokens_per_s_per_user": r.tokens_per_s_per_user}


def _search(exp: Experiment, system: str, backend: str, kw: dict, jobs: int | None = 1) -> dict:
    """The experiment's searches; ``jobs``: their worker processes (:mod:`infercast.search.parallel`).
    Both modes share each layout's estimator (:func:`~infercast.search.run.sharing_estimators`)."""
    from ..search import search_agg, search_disagg, search_fixed
    from ..search.run import search_both, sharing_estimators

    common = dict(concurrencies=exp.concurrency, ttft_max_ms=exp.targets.ttft_ms, tpot_max_ms=exp.targets.tpot_ms,
                  backend_version=exp.backend_version, prefix=exp.prefix, jobs=jobs, **kw)
    overrides = exp.scheduler.overrides()
    out = {}
    if exp.mode == "fixed":
        params = None
        if overrides:
            from ..api import Estimator
            from ..serving.backends import scheduler_params

            base = Estimator(exp.model, system, backend, exp.backend_version, **kw)
            params = replace(scheduler_params(backend, base.data.system, base.spec), **overrides)
        out["fixed"] = search_fixed(exp.model, system, backend, exp.isl, exp.osl, gpus=exp.gpus, params=params, **common)
        return out
    mode_kw = dict(max_gpus=exp.max_gpus, scheduler=overrides or None, **({"cps": exp.cp_list} if exp.cp_list else {}),
                   **common)
    with sharing_estimators():
        if exp.mode == "both":  # both searches' parts on one set of workers
            return search_both(exp.model, system, backend, exp.isl, exp.osl,
                               disagg_kw={"scheduler_roles": exp.role_overrides()}, **mode_kw)
        for mode, fn in (("agg", search_agg), ("disagg", search_disagg)):
            if exp.mode == mode:
                roles = {"scheduler_roles": exp.role_overrides()} if mode == "disagg" else {}
                out[mode] = fn(exp.model, system, backend, exp.isl, exp.osl, **roles, **mode_kw)
    return out


def run_one(item: tuple[Experiment, str, str, object, int | None]) -> Outcome:
    """The outcome of one (experiment, system, backend, systems_path, search jobs): a typed error
    becomes the outcome's ``error``. A module-level function of plain data, so that local
    processes and Ray tasks can run it (:mod:`infercast.search.executor`)."""
    from ..search.run import candidate_dict

    exp, system, backend, systems_path, search_jobs = item
    kw = {**exp.estimator_kw(), "systems_path": systems_path}
    kind = ("serve" if exp.layout is not None else "serve-disagg") if exp.concurrency and (
        exp.layout is not None or exp.disagg is not None) else exp.mode
    o = Outcome(exp.name, system, backend, kind, estimator_kw=kw)
    try:
        if kind.startswith("serve"):
            o.rows = _serve(exp, system, backend, kw)
        else:
            o.searches = _search(exp, system, backend, kw, search_jobs)
            for mode, res in o.searches.items():
                if res.best is not None:  # the candidate's fields and its intervals, as search's JSON
                    o.rows.append({"mode": mode, "backend_version": res.backend_version,
                                   **candidate_dict(res.candidates[res.best], res)})
            if not o.rows:
                o.error = "no deployment meets the targets" if any(r.candidates for r in o.searches.values()) \
                    else "no deployment could be evaluated"
    except InfercastError as exc:
        o.error = str(exc)
    return o


def work_items(exps: list[Experiment], systems_path=None, search_jobs: int | None = 1) -> list[tuple]:
    """Every (experiment, system, backend, systems_path, search_jobs) of ``exps``, in the file's order."""
    return [(e, system, backend, systems_path, search_jobs) for e in exps for system in e.system_list
            for backend in e.backend_list]


def run_experiments(exps: list[Experiment], systems_path=None, *, jobs: int | None = None, ray: str | None = None,
                    on_done: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Every (system, backend) of every experiment, in the file's order, run in this process, over
    ``jobs`` local processes or as Ray tasks (``ray``; :func:`infercast.search.executor.executor`):
    the same outcomes either way. ``on_done`` is called as each finishes (progress). Run in this
    process, each search forks its own workers (``search --jobs``' default,
    :mod:`infercast.search.parallel`; not when this process runs other threads); run over
    processes or Ray tasks, each search stays in its process."""
    from ..search.executor import run_all

    serial = ray is None and (jobs is None or jobs <= 1)
    return run_all(run_one, work_items(exps, systems_path, None if serial else 1), jobs=jobs, ray=ray,
                   on_done=None if on_done is None else (lambda _i, o: on_done(o)))


def run_experiment(exp: Experiment, systems_path=None, on_done: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Every (system, backend) of ``exp`` in this process; ``on_done`` is called after each (progress)."""
    return run_experiments([exp], systems_path, on_done=on_done)
