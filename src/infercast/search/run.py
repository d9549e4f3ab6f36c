"""Search deployments: every layout (:mod:`.space`) at every benchmark concurrency, through the
serving model (:func:`infercast.serving.agg.serve_agg`: what a closed-loop benchmark with that many
clients would measure; :func:`search_disagg`: prefill and decode layouts with any worker counts
that fit the GPU budget, through the disaggregated model of :mod:`infercast.serving.disagg`, the
deployments of one decode layout solved together as arrays), filtered by latency targets and
reduced to the Pareto frontier and one recommendation (:mod:`.pareto`); :func:`search_backends`
runs a search on several backends and ranks them together.

Concurrency is the number of clients of one replica (over its attention-DP ranks); by default the
powers of two from 1 to ``DEFAULT_MAX_CONCURRENCY``, and with ``cap_concurrency`` none beyond the
most requests a searched deployment runs at once (its KV cache, the backend's max batch size).
On the default grid, where a layout or deployment goes from meeting the targets to missing them
between two grid points, the concurrencies between are searched for the largest that meets them
(``refine``). A layout whose weights do not fit, or whose model / data cannot be served (no table
for a quant mode, a shape out of the data's reach), is skipped with the reason, never guessed;
:attr:`SearchResult.evaluated` and :attr:`SearchResult.refused` count what was evaluated and
refused, by kind and reason.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from functools import partial
from itertools import pairwise

import numpy as np

from ..errors import InfercastError, InvalidConfigError, InvalidInputError, WorkerError
from ..report.layout import plural
from .candidates import Candidates, field_names
from .parallel import check_jobs, run_groups, run_parts
from .pareto import meets, pareto_front, recommend
from .space import Layout, layouts, powers_of_two

DEFAULT_MAX_CONCURRENCY = 1024
#: the command line's latency targets when none is given: mean TTFT 2 s and mean TPOT 30 ms, the
#: defaults deployment tools in the field search under (the Python API's default is no target)
DEFAULT_TTFT_MS = 2000.0
DEFAULT_TPOT_MS = 30.0


@dataclass
class Candidate:
    """One layout at one concurrency, as the serving model predicts it."""

    layout: str
    tp: int
    pp: int
    attention_dp: int
    moe_tp: int
    moe_ep: int
    gpus: int
    concurrency: int
    ttft_ms: float
    tpot_ms: float
    ttft_p90_ms: float | None
    tpot_p90_ms: float | None
    request_latency_ms: float
    tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float
    bound: str
    meets_targets: bool = True
    description: str = ""  # the deployment's GPUs and layout in words
    backend: str = ""  # the serving backend (several in a search of every backend: search_backends)
    #: aggregated deployments whose tables measured power (infercast.serving.energy): the measured
    #: part of the energy per output token (J) and its coverage of the GPU time; None: not available
    energy_j_per_token: float | None = None
    energy_coverage: float | None = None
    #: context-parallel ranks of the layout (the parallel fields' layout: a disaggregated
    #: candidate's decode layout; its prefill layout's are ``prefill_cp``)
    cp: int = 1


@dataclass
class SearchResult:
    model: str
    system: str
    backend: str
    backend_version: str | None
    isl: int
    osl: int
    max_gpus: int
    ttft_max_ms: float | None
    tpot_max_ms: float | None
    #: every candidate evaluated, in order (:class:`~infercast.search.candidates.Candidates`: a
    #: sequence of :class:`Candidate` objects, kept as rows until one is looked at)
    candidates: Candidates = field(default_factory=Candidates)
    frontier: list[int] = field(default_factory=list)  # indices into candidates
    best: int | None = None
    skipped: dict[str, str] = field(default_factory=dict)  # layout (or layout@concurrency) -> why
    concurrencies: list[int] = field(default_factory=list)  # the concurrencies evaluated
    max_concurrency: int | None = None  # the most requests a deployment searched runs at once
    reason: str | None = None  # why there is no recommendation (best is None)
    decode_system: str | None = None  # disagg: the decode workers' system when not ``system``
    decode_backend_version: str | None = None  # disagg: the decode workers' data version on ``decode_system``
    evaluated: dict[str, int] = field(default_factory=dict)  # kind of candidate -> how many were evaluated
    refused: dict[str, int] = field(default_factory=dict)  # "kind: reason" -> how many were refused
    #: the SchedulerParams overrides the search ran each worker kind with ("agg", "prefill",
    #: "decode" -> {field: value}; empty: the backend's defaults), for its launch files
    scheduler: dict[str, dict] = field(default_factory=dict)
    #: cached prompt tokens every request starts with, before the ``isl`` new ones (serving.prefix)
    prefix: int = 0

    def to_dict(self, candidates: bool = True, candidate_dicts: list[dict] | None = None) -> dict:
        """The result as plain data (what :func:`dataclasses.asdict` gives, built field by field:
        a search holds tens of thousands of flat candidates); ``frontier`` and ``best`` as the
        candidates themselves. ``candidates=False`` leaves the full list out; ``candidate_dicts``
        (a list, or a :class:`~infercast.report.json_text.Records` made as it is written):
        the candidates' :func:`candidate_dict` already worked out, in order."""
        d: dict = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "candidates":
                if candidates:
                    d[f.name] = candidate_dicts if candidate_dicts is not None else candidate_records(self)
            else:
                d[f.name] = dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v
        d["frontier"] = [candidate_dict(self.candidates[i], self) for i in self.frontier]
        d["best"] = candidate_dict(self.candidates[self.best], self) if self.best is not None else None
        return d

    def part_summary(self) -> tuple | None:
        """What a search part's worker sends back beside its candidates (:mod:`.parallel`): the
        frontier and the recommendation of this result's candidates alone (:func:`front_of`)."""
        return front_of(self.candidates)

    def add_part_summary(self, start: int, summary: tuple | None) -> None:
        """Keep a part's :meth:`part_summary`, its candidates added from position ``start`` on
        (read by :func:`_finish`)."""
        self.__dict__.setdefault("_part_fronts", []).append((start, summary))


def candidate_dict(c: Candidate, res: SearchResult | None = None) -> dict:
    """A candidate's fields as a dict (they are all scalars: the same as ``asdict``, faster);
    with the search result ``res`` it was found in, also its prediction intervals
    (``"intervals"``, :func:`candidate_intervals`)."""
    d = {name: getattr(c, name) for name in _field_names(type(c))}
    if res is not None:
        from ..serving.intervals import intervals_dict

        d["intervals"] = intervals_dict(candidate_intervals(c, res))
    return d


def iter_candidate_records(res: SearchResult) -> Iterator[dict]:
    """``candidate_dict(c, res)`` of each candidate in turn: the same dicts, built from the
    candidates' rows (:meth:`~infercast.search.candidates.Candidates.runs`) with each interval
    cell's factors, its words and its row count looked up once per (backend, mode, concurrency
    band) rather than per candidate and figure (a search's ``--all`` and ``--save-dir`` write tens
    of thousands to a million of them). The same numbers: each end is the predicted value times
    the cell's factor, rounded as :class:`~infercast.serving.intervals.Interval` rounds it."""
    from ..serving.intervals import FIGURES, band_of, cell_words, condition, default_intervals, level_key, round_end

    table = default_intervals()
    templates: dict = {}  # (backend, mode, band) -> [(field, its position, ((level key, a, b), ...), cell, n)]
    for cls, rows in res.candidates.runs():
        names = field_names(cls)
        at = {name: k for k, name in enumerate(names)}
        disagg_at = at.get("prefill_layout")
        k_conc, k_gpus, k_tp, k_pp, k_adp, k_backend = (at[n] for n in ("concurrency", "gpus", "tp", "pp", "attention_dp",
                                                                           "backend"))
        for row in rows:
            disagg = disagg_at is not None and bool(row[disagg_at])
            conc = _interval_clients(disagg, row[k_conc], row[k_gpus], row[k_tp] * row[k_pp] * row[k_adp])
            backend, mode = row[k_backend] or res.backend, "disagg" if disagg else "agg"
            key = (backend, mode, band_of(conc), id(cls))
            tmpl = templates.get(key)
            if tmpl is None:
                cond = condition(backend, mode, conc, None)
                tmpl = templates[key] = []
                for field_name, metric, invert in FIGURES:
                    if (metric == "tpot" and res.osl <= 1) or field_name not in at:
                        continue
                    factors, used, n = table.factors("serving", metric, cond, invert)
                    tmpl.append((field_name, at[field_name],
                                 tuple((level_key(lv), a, b) for lv, (a, b) in sorted(factors.items())),
                                 cell_words(used), n))
            d = dict(zip(names, row))
            ints = {}
            for field_name, k, levels, cell, n in tmpl:
                v = row[k]
                if v is None or isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                    continue
                v = float(v)
                one = {lk: [round_end(v * a), round_end(v * b)] for lk, a, b in levels}
                one["cell"], one["n"] = cell, n
                ints[field_name] = one
            d["intervals"] = ints
            yield d


def candidate_records(res: SearchResult) -> list[dict]:
    """``[candidate_dict(c, res) for c in res.candidates]``, built by :func:`iter_candidate_records`."""
    return list(iter_candidate_records(res))


def _interval_clients(disagg: bool, concurrency: int, gpus: int, replica_gpus: int) -> float:
    """The clients an interval cell is looked up by: a disaggregated deployment's, or one
    replica's of an aggregated candidate of ``gpus`` GPUs in replicas of ``replica_gpus``."""
    if disagg:
        return float(concurrency)
    replicas = max(1, gpus // max(1, replica_gpus))
    return float(-(-concurrency // replicas))


def candidate_intervals(c: Candidate, res: SearchResult) -> dict:
    """The 80% / 95% ranges of a candidate's figures (:func:`infercast.serving.intervals.serving_intervals`):
    its backend, agg or disagg, and the clients of one replica (an agg candidate of several
    replicas: the concurrency divided over them). The search does not compute the share of a
    candidate answered beyond measured table points; its ranges come from the cells pooled over
    that condition."""
    from ..serving.intervals import default_intervals, serving_intervals

    disagg = bool(getattr(c, "prefill_layout", ""))
    conc = _interval_clients(disagg, c.concurrency, c.gpus, c.tp * c.pp * c.attention_dp)
    return serving_intervals(default_intervals(), c, backend=c.backend or res.backend, mode="disagg" if disagg else "agg",
                             concurrency=conc, osl=res.osl, share=None)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    if cls not in _FIELD_NAMES:
        _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return _FIELD_NAMES[cls]


def _positive(name: str, v, kind=float, required: bool = False):
    """``v`` as a positive ``kind`` (None stays None: "not given", unless ``required``); ``kind=int``
    also refuses a fractional value rather than truncating it (2.5 GPUs are not 2)."""
    if v is None:
        if required:
            raise InvalidInputError(f"{name} must be a positive {'integer' if kind is int else 'number'}, got None")
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{name} must be a positive number, got {v!r}") from None
    if not (x > 0 and math.isfinite(x)):
        raise InvalidInputError(f"{name} must be a positive number, got {v!r}")
    if kind is int:
        if not x.is_integer():
            raise InvalidInputError(f"{name} must be a positive integer, got {v!r}")
        return int(x)
    return kind(x)


def _concurrencies(values) -> list[int]:
    """The benchmark concurrencies to search: positive integers, each once, ascending."""
    if values is None:
        return powers_of_two(DEFAULT_MAX_CONCURRENCY)
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise InvalidInputError("concurrencies must be a list of positive integers", f"got {values!r}")
    out = sorted({_positive("concurrency", c, int, required=True) for c in values})
    if not out:
        raise InvalidInputError("concurrencies is empty", "give at least one, or None for 1, 2, 4, ...")
    return out


def search_agg(
    model: str,
    system: str,
    backend: str,
    isl: int,
    osl: int,
    *,
    max_gpus: int | None = None,
    concurrencies: list[int] | None = None,
    ttft_max_ms: float | None = None,
    tpot_max_ms: float | None = None,
    backend_version: str | None = None,
    systems_path=None,
    scheduler: dict | None = None,
    cap_concurrency: bool = False,
    refine: bool | None = None,
    cps=None,
    prefix: int = 0,
    jobs: int | None = 1,
    progress=None,
    _defer: list | None = None,
    **estimator_kw,
) -> SearchResult:
    """Evaluate every layout of at most ``max_gpus`` GPUs (default: one node) at each concurrency.
    ``prefix``: cached prompt tokens every request starts with (:mod:`infercast.serving.prefix`).
    ``jobs``: worker processes for the layouts (:func:`~infercast.search.parallel.run_parts`; 1:
    this process, None: the usable CPUs); the result is the same with any. ``progress(done, total)``:
    called as each layout's evaluation finishes.
    ``cps``: the context-parallel degrees to search (default: 1 only; :func:`~infercast.search.space.layouts`).

    ``estimator_kw`` goes to every :class:`~infercast.Estimator` (quant overrides, ``nextn``,
    ``database_mode``); ``scheduler``: {SchedulerParams field: value} overriding the backend's
    scheduler defaults. Targets are on the mean TTFT and mean TPOT, as benchmarks report them;
    None or ``math.inf``: no target (``infercast search`` defaults to :data:`DEFAULT_TTFT_MS` and
    :data:`DEFAULT_TPOT_MS`). ``cap_concurrency``: evaluate no concurrency beyond the most
    requests a searched layout runs at once (refuse a given one; :func:`_fit_concurrencies`), and
    of the default grid, per layout, none after its first saturated one (:func:`_evaluate`).
    ``refine`` (default: when ``concurrencies`` is not given): per layout, bisect between the grid
    points where meeting the targets flips, for the largest concurrency that meets them
    (:func:`refine_concurrency`)."""
    from dataclasses import replace

    from ..serving.backends import scheduler_params

    jobs = check_jobs(jobs)
    conc, base, res = _start(model, system, backend, isl, osl, concurrencies, ttft_max_ms, tpot_max_ms, backend_version,
                             systems_path, estimator_kw, prefix=prefix)
    node = base.data.system.node
    res.max_gpus = node.gpus_per_node if max_gpus is None else _positive("max_gpus", max_gpus, int)
    params = replace(scheduler_params(backend, base.data.system, base.spec), **(scheduler or {}))
    res.scheduler = {"agg": dict(scheduler)} if scheduler else {}
    ests = _estimators(res, base, model, layouts(base.spec, res.max_gpus, node.nvlink_gpus, cps=context_parallel_degrees(cps)),
                       backend_version, systems_path, estimator_kw)
    conc = res.concurrencies = _fit_concurrencies(res, conc, concurrencies is not None, cap_concurrency, (
        (lay.label, est.plan.parallel.attention_dp * rank_capacity(est, res.isl, res.osl, params, res.prefix))
        for lay, est in ests.items()))
    refine = concurrencies is None if refine is None else refine
    stop = cap_concurrency and concurrencies is None
    return _run_or_defer(res, [partial(_evaluate_part, est, lay, conc, params, refine, stop) for lay, est in ests.items()],
                         [len(conc)] * len(ests), jobs, progress, _defer)


def _run_or_defer(res: SearchResult, parts: list, cost: list, jobs, progress, defer: list | None) -> SearchResult:
    """Run a search's parts and finish it (its frontier and best), or, with ``defer`` (a list,
    :func:`search_both`), leave them there as ``(res, parts, cost)`` and answer the unfinished result."""
    if defer is not None:
        defer.append((res, parts, cost))
        return res
    _import_part_modules()
    run_parts(res, parts, jobs, cost=cost, on_done=progress)
    return _finish(res)


def _import_part_modules() -> None:
    """Import the serving models the parts run before the workers are forked: each process would
    otherwise import them at its first part (~12 ms, in the forked worker as well)."""
    from ..serving import agg, decode_curve, disagg, energy, scaled, sim  # noqa: F401


def search_both(model: str, system: str, backend: str, isl: int, osl: int, *, jobs: int | None = 1, progress=None,
                disagg_kw: dict | None = None, **kw) -> dict[str, SearchResult]:
    """{"agg": :func:`search_agg`, "disagg": :func:`search_disagg`} with the same arguments
    (``disagg_kw``: more for the disaggregated search alone), their parts run together on one set of
    worker processes (:func:`~infercast.search.parallel.run_groups`): the longest parts of either
    search start first, and no worker waits for the other search to begin. The same results as the
    two calls one after the other; ``progress(done, total)`` counts both searches' parts."""
    jobs = check_jobs(jobs)
    groups: list = []
    agg = search_agg(model, system, backend, isl, osl, _defer=groups, **kw)
    dis = search_disagg(model, system, backend, isl, osl, _defer=groups, **kw, **(disagg_kw or {}))
    _import_part_modules()
    run_groups(groups, jobs, on_done=progress)
    return {"agg": _finish(agg), "disagg": _finish(dis)}


def search_backends(search, model: str, system: str, backends: list[str], isl: int, osl: int, **kw) -> tuple[SearchResult, dict]:
    """``search`` (:func:`search_agg`, :func:`search_disagg` or
    :func:`~infercast.search.fixed.search_fixed`) on each of ``backends`` with the same
    arguments, ranked together: (one result whose candidates are all backends' -- each naming its
    ``backend`` -- with its own frontier and best, {backend: its own result}). A backend whose
    search cannot start (no data for the model's quant, ...) is refused with the reason; when
    every backend is, the first one's error is raised."""
    if not backends:
        raise InvalidInputError(f"no serving backend has data for {system}")
    per: dict[str, SearchResult] = {}
    errors: dict[str, InfercastError] = {}
    for b in backends:
        try:
            per[b] = search(model, system, b, isl, osl, **kw)
        except (InvalidInputError, WorkerError):
            raise  # the same bad input for every backend; a worker process that died
        except InfercastError as exc:
            errors[b] = exc
    if not per:
        raise next(iter(errors.values()))
    first = next(iter(per.values()))
    merged = SearchResult(first.model, system, "+".join(per), "/".join(str(r.backend_version) for r in per.values()),
                          first.isl, first.osl, first.max_gpus, first.ttft_max_ms, first.tpot_max_ms,
                          concurrencies=list(first.concurrencies), scheduler=dict(first.scheduler), prefix=first.prefix)
    for b, exc in errors.items():
        refuse(merged, b, "backend", str(exc), exc)
    for b, r in per.items():
        for cls, rows in r.candidates.runs():  # each candidate as it is, its description naming the backend
            k = field_names(cls).index("description")
            merged.candidates.add_rows(cls, [(*row[:k], f"{b}: {row[k]}", *row[k + 1:]) for row in rows])
        merged.skipped.update({f"{b} {k}": v for k, v in r.skipped.items()})
        for kind, n in r.evaluated.items():
            _count(merged, kind, n)
        for why, n in r.refused.items():
            merged.refused[why] = merged.refused.get(why, 0) + n
        if r.max_concurrency is not None:
            merged.max_concurrency = max(merged.max_concurrency or 0, r.max_concurrency)
    merged.concurrencies = sorted({c for r in per.values() for c in r.concurrencies})
    _count(merged, "backend", len(backends))
    return _finish(merged), per


def _start(model, system, backend, isl, osl, concurrencies, ttft_max_ms, tpot_max_ms, backend_version, systems_path,
           estimator_kw, make=None, prefix: int = 0):
    """Checked inputs: (concurrency grid, the TP1 estimator (``make(Layout())`` if given), an
    empty result carrying ``prefix``)."""
    isl, osl = _positive("isl", isl, int, required=True), _positive("osl", osl, int, required=True)
    prefix = 0 if not prefix else _positive("prefix", prefix, int)
    # an infinite target is no target
    ttft_max_ms = None if _is_inf(ttft_max_ms) else _positive("ttft target", ttft_max_ms)
    tpot_max_ms = None if _is_inf(tpot_max_ms) else _positive("tpot target", tpot_max_ms)
    conc = _concurrencies(concurrencies)
    base = make(Layout()) if make is not None else tp1_estimator(model, system, backend, backend_version, systems_path,
                                                                 estimator_kw)
    return conc, base, SearchResult(base.spec.model_id, system, backend, base.version, isl, osl, 0, ttft_max_ms, tpot_max_ms,
                                    prefix=prefix)


def tp1_estimator(model, system, backend, backend_version, systems_path, estimator_kw):
    """The one-GPU estimator a search reads the model, system and data from. A ``draft_tp`` of
    the speculative settings that one GPU cannot run (a draft split over more GPUs than the layout
    has, MTP at another TP) refuses the TP1 layout, not the search: the estimator is then built
    without it and marked ``layout_candidate = False``, so the TP1 layout is built (and refused,
    with the reason) like any other."""
    from ..api import Estimator

    kw = dict(estimator_kw or {})
    try:
        return estimator(model, system, backend, backend_version, Layout(), systems_path, kw)
    except (InvalidConfigError, InvalidInputError):
        sp = dict(kw.get("speculative") or {})
        if sp.get("draft_tp") is None:
            raise
    base = Estimator(model, system, backend, backend_version, systems_path=systems_path,
                     **{**kw, "speculative": {**sp, "draft_tp": None}})
    base.layout_candidate = False
    return base


def _is_inf(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == math.inf


def _count(res: SearchResult, kind: str, n: int = 1) -> None:
    res.evaluated[kind] = res.evaluated.get(kind, 0) + n


def refuse(res: SearchResult, key: str, kind: str, why: str, reason: str | BaseException | None = None) -> None:
    """Record that ``key`` (a layout, a deployment, a deployment at a concurrency) of ``kind`` was
    refused: ``why`` under ``res.skipped``, and one more under ``res.refused["kind: reason"]``,
    the reason being the error's class name when ``reason`` is an exception."""
    res.skipped[key] = why
    if isinstance(reason, BaseException):
        reason = _reason_name(reason)
    k = f"{kind}: {reason or why}"
    res.refused[k] = res.refused.get(k, 0) + 1


def _reason_name(exc: BaseException) -> str:
    """A short reason for a refusal: the error class in words (``DoesNotFitError`` -> "does not fit")."""
    import re

    name = type(exc).__name__.removesuffix("Error")
    return re.sub(r"(?<!^)(?=[A-Z])", " ", name).lower() or "error"


def refine_concurrency(evaluate, grid: list[int], ok_at) -> None:
    """Resolve the largest concurrency that meets the targets more finely than ``grid``: where
    ``ok_at(c)`` (True / False: meets the targets at ``c``; None: not evaluated or refused) flips
    from True at one grid point to False at the next, bisect the integers between them, calling
    ``evaluate(c)`` (which returns the same as ``ok_at``) for each probe. Assumes meeting the
    targets is monotone in the clients between the two points (more clients never lower TTFT
    or TPOT in the serving models)."""
    seen = [(c, ok_at(c)) for c in grid]
    seen = [(c, ok) for c, ok in seen if ok is not None]
    for (lo, ok_lo), (hi, ok_hi) in pairwise(seen):
        if ok_lo and not ok_hi:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                ok = evaluate(mid)
                if ok is None:
                    break
                lo, hi = (mid, hi) if ok else (lo, mid)
            return


def rank_capacity(est, isl: int, osl: int, params, prefix: int = 0) -> int:
    """Requests one attention-DP rank of ``est``'s layout can run at once: at most the scheduler's
    ``max_batch_size``, and at most what its KV cache holds of requests of ``isl + osl`` tokens
    (:mod:`infercast.serving.memory`, with each request's fixed-size state) beside a shared cached
    ``prefix`` (:func:`infercast.serving.prefix.shared_prefix_capacity`)."""
    from ..serving.prefix import shared_prefix_capacity

    mem = est.memory
    tokens = (isl + osl) * getattr(params, "kv_length_ratio", 1.0)
    if mem.state_per_request > 0 and mem.kv_per_token > 0:
        tokens += mem.state_per_request / mem.kv_per_token
    room = shared_prefix_capacity(mem.kv_capacity_tokens, prefix, mem.tokens_per_block)
    kv = int(room // tokens) if room > 0 and tokens > 0 else 0
    return max(0, min(int(params.max_batch_size), kv))


def _fit_concurrencies(res: SearchResult, conc: list[int], given: bool, cap: bool, holders) -> list[int]:
    """The concurrencies to evaluate. ``holders``: (deployment label, requests it runs at once)
    pairs; their most is ``res.max_concurrency``. With ``cap``, nothing beyond that bound (a closed
    loop of more clients only queues them: every deployment's TTFT grows without end): a
    concurrency the caller gave is refused (:class:`InvalidInputError`, before any serving run),
    one of the default grid left out. Without ``cap`` (the Python API's default: a validation
    row measured beyond the memory model's bound is still predicted), ``conc`` as it is. When no
    deployment holds even one request, ``conc`` is kept: each layout is then skipped with its
    reason."""
    holders = [(label, n) for label, n in holders if n > 0]
    if not holders:
        return conc
    label, bound = max(holders, key=lambda h: h[1])
    res.max_concurrency = bound
    if not cap:
        return conc
    over = [c for c in conc if c > bound]
    if over and given:
        raise InvalidInputError(
            f"concurrency {over[-1]} is more clients than any deployment searched can run at once",
            f"the largest, {label}, runs {plural(bound, 'request')} of {res.isl}+{res.osl} tokens (its KV cache and the "
            f"backend's max batch size); more clients would only queue: give at most {bound}")
    return [c for c in conc if c <= bound]


#: the estimator caches of the open :func:`sharing_estimators` blocks (innermost last)
_SHARED: list[dict] = []


@contextmanager
def sharing_estimators():
    """Within this block, the searches reuse one :class:`~infercast.Estimator` per model, system,
    backend, data version, layout and estimator options (:func:`estimator`): a search of both modes
    compiles each layout once for the aggregated search and the disaggregated roles together. An
    estimator is not changed by the searches (its memos only hold what it computes), so sharing it
    gives the same numbers; outside the block every search builds its own. The estimators of
    different layouts share their perf data and model config too (:func:`infercast.api.sharing_data`)."""
    from ..api import sharing_data

    _SHARED.append({})
    try:
        with sharing_data():
            yield
    finally:
        _SHARED.pop()


def estimator(model, system: str, backend: str, backend_version, lay: Layout, systems_path, estimator_kw: dict):
    """The :class:`~infercast.Estimator` of ``lay``: the one the innermost :func:`sharing_estimators`
    block already built for the same arguments, else a new one (kept there if a block is open)."""
    from ..api import Estimator

    cache = _SHARED[-1] if _SHARED else None
    key = None
    if cache is not None:
        try:
            key = (model, system, backend, backend_version, lay, str(systems_path), tuple(sorted(estimator_kw.items())))
            hash(key)
        except TypeError:  # an option that cannot be a key: not shared
            key = None
        if key is not None and key in cache:
            return cache[key]
    e = Estimator(model, system, backend, backend_version, lay.tp, lay.pp, attention_dp=lay.attention_dp,
                  moe_tp=lay.moe_tp, moe_ep=lay.moe_ep, systems_path=systems_path,
                  **({"cp": lay.cp} if lay.cp > 1 else {}), **estimator_kw)
    if key is not None:
        cache[key] = e
    return e


def _estimators(res: SearchResult, base, model, space, backend_version, systems_path, estimator_kw,
                keep=lambda lay: True, make=None) -> dict:
    """An estimator per layout of ``space`` (= :func:`layouts`'s answer) that ``keep`` accepts,
    built by ``make(layout)`` if given; the rest and those that cannot be built go to
    ``res.skipped``."""
    lays, skipped = space
    for label, why in skipped.items():
        refuse(res, label, "layout", why, "does not shard the model")
    out = {}
    for lay in filter(keep, lays):
        _count(res, "layout")
        try:
            out[lay] = make(lay) if make is not None else base if lay == Layout() and getattr(
                base, "layout_candidate", True) else estimator(
                model, res.system, res.backend, backend_version, lay, systems_path, estimator_kw)
        except InfercastError as exc:
            refuse(res, lay.label, "layout", str(exc), exc)
    return out


def context_parallel_degrees(cps) -> tuple[int, ...]:
    """The context-parallel degrees a search takes: ``cps`` (positive powers of two) checked, or (1,)."""
    if cps is None:
        return (1,)
    if isinstance(cps, (str, bytes)) or not hasattr(cps, "__iter__"):
        raise InvalidInputError("the context-parallel degrees must be a list of positive integers", f"got {cps!r}")
    out = tuple(sorted({_positive("cp", c, int, required=True) for c in cps}))
    bad = [c for c in out if c & (c - 1)]
    if not out or bad:
        raise InvalidInputError(f"context-parallel degrees must be powers of two, got {list(cps)!r}",
                                "serving backends shard by powers of two")
    return out


#: the candidate fields the frontier and the recommendation read
FRONT_FIELDS = ("tokens_per_s_per_user", "tokens_per_s_per_gpu", "gpus", "ttft_ms", "meets_targets")


def front_of(candidates: Candidates) -> tuple | None:
    """(how many candidates, the positions of their frontier, the position of the best or None)
    of ``candidates`` (:func:`~.pareto.pareto_front`, :func:`~.pareto.recommend`); None when a
    metric the two compare is NaN (their orders are then Python's, and a part's front no longer
    stands for it: :func:`_finish` orders every candidate)."""
    u, g, n, t, ok = _front_columns(candidates)
    if np.isnan(u).any() or np.isnan(g).any() or np.isnan(t[ok]).any():
        return None
    return len(u), pareto_front(u, g, n), recommend(g, n, t, ok)


def _finish(res: SearchResult) -> SearchResult:
    """The result's frontier, its recommendation (or why there is none). When the candidates came
    from parts that each sent their own frontier and best (:meth:`SearchResult.part_summary`,
    covering every candidate in order), only those are ordered: a point no point beats is one no
    point of its own part beats, and the orders are total (ties: fewer GPUs, then the earlier
    candidate), so the frontier of the parts' frontiers and the best of their bests are the
    frontier and the best of all (the same indices; tested). Else every candidate is ordered."""
    parts = res.__dict__.pop("_part_fronts", None)
    front = _front_of_parts(res.candidates, parts) if parts else None
    res.frontier, res.best = front if front is not None else _front_all(res.candidates)
    if res.best is None:
        res.reason = _no_best_reason(res)
    return res


def _front_columns(candidates: Candidates) -> tuple[np.ndarray, ...]:
    """:data:`FRONT_FIELDS` of every candidate, each column read once, as an array (a search
    holds tens of thousands of candidates)."""
    col = candidates.column
    return (*(np.asarray(col(name), dtype=float) for name in FRONT_FIELDS[:4]),
            np.asarray(col("meets_targets"), dtype=bool))


def _front_all(candidates: Candidates) -> tuple[list[int], int | None]:
    """(frontier, best) ordering every candidate."""
    u, g, n, t, ok = _front_columns(candidates)
    return pareto_front(u, g, n).tolist(), recommend(g, n, t, ok)


def _front_of_parts(candidates: Candidates, parts: list) -> tuple[list[int], int | None] | None:
    """(frontier, best) of ``candidates`` from its parts' ``(start, front_of(part))`` when they
    cover every candidate in order (None otherwise, or when a part's summary is None)."""
    at, fronts, bests = 0, [], []
    for start, summary in parts:
        if summary is None or start != at:
            return None
        n, front, best = summary
        fronts.append(np.asarray(front, dtype=np.int64) + start)
        if best is not None:
            bests.append(start + best)
        at = start + n
    if at != len(candidates):
        return None
    idx = np.sort(np.concatenate([*fronts, np.asarray(bests, dtype=np.int64)]))
    idx = idx[np.concatenate(([True], idx[1:] != idx[:-1]))] if idx.size else idx
    u, g, n, t = (np.asarray(v, dtype=float) for v in candidates.values_at(idx.tolist(), FRONT_FIELDS[:4]))
    frontier = idx[pareto_front(u, g, n)].tolist()
    if not bests:
        return frontier, None
    at_best = np.searchsorted(idx, bests)  # (bests ascending: the earlier candidate first on a tie)
    k = recommend(g[at_best], n[at_best], t[at_best], np.ones(len(bests), dtype=bool))
    return frontier, int(bests[k])


def targets_text(ttft_max_ms: float | None, tpot_max_ms: float | None) -> str:
    """E.g. "TTFT <= 2000 ms, TPOT <= 30 ms" ("no latency target" when there is none)."""
    parts = [f"{name} <= {v:g} ms" for name, v in (("TTFT", ttft_max_ms), ("TPOT", tpot_max_ms)) if v is not None]
    return ", ".join(parts) or "no latency target"


def _no_best_reason(res: SearchResult) -> str:
    if not res.candidates:
        return f"no deployment could serve this workload: every one was skipped ({plural(len(res.skipped), 'reason')} under 'skipped')"
    ttft = min(res.candidates.column("ttft_ms"))
    tpot = min(res.candidates.column("tpot_ms"))
    return (f"none of the {len(res.candidates)} deployments evaluated meets the targets "
            f"({targets_text(res.ttft_max_ms, res.tpot_max_ms)}); the lowest TTFT was {ttft:.1f} ms and the "
            f"lowest TPOT {tpot:.2f} ms: relax the targets (--ttft-ms, --tpot-ms; inf for none) or allow more GPUs")


def _fields(res: SearchResult, label: str, est, gpus: int, c: int, r, bound: str, description: str | None = None) -> tuple:
    """:class:`Candidate`'s fields, in order, for serving result ``r`` of ``est``'s layout
    (``description``: the deployment in words, default ``est``'s layout)."""
    p = est.plan.parallel
    return (label, p.tp, p.pp, p.attention_dp, p.etp, p.ep, gpus, c, r.ttft_ms, r.tpot_ms, r.ttft_p90_ms, r.tpot_p90_ms,
            r.request_latency_ms, r.tokens_per_s_per_gpu, r.tokens_per_s_per_user, bound,
            meets(r.ttft_ms, r.tpot_ms, res.ttft_max_ms, res.tpot_max_ms),
            est.layout_words if description is None else description, est.data.backend)


def with_energy(cand: Candidate, est, r, osl: int) -> Candidate:
    """``cand`` with the energy of serving result ``r`` of ``est``'s layout, where its tables
    measured power (:func:`infercast.serving.energy.agg_energy`)."""
    from ..engine.energy import EnergyModel
    from ..serving.energy import agg_energy

    if not EnergyModel.of(est.engine).available:  # no op with measured power: agg_energy is not available
        return cand
    e = agg_energy(est, r, osl)
    if e.get("available"):
        cand.energy_j_per_token, cand.energy_coverage = e["measured_j_per_token"], e["coverage"]
    return cand


def _evaluate_part(est, lay: Layout, conc: list[int], params, refine: bool, stop_saturated: bool,
                   res: SearchResult) -> None:
    """:func:`_evaluate` as a part of :func:`~infercast.search.parallel.run_parts` (the result last)."""
    _evaluate(res, est, lay, conc, params, refine, stop_saturated)


#: the reason counted under :attr:`SearchResult.refused` for the concurrencies an aggregated
#: layout is not evaluated at beyond its first saturated one (:func:`_evaluate`)
SATURATED = "beyond the layout's saturation (more clients only queue)"


def stop_at_saturation(res: SearchResult, bound: str | None, j: int, conc: list[int]) -> bool:
    """Whether an aggregated layout's grid ``conc`` stops after its ``j``-th concurrency, whose
    serving result is held by ``bound`` (:data:`~infercast.serving.agg.SATURATED_BOUNDS`: the
    engine's caps); if so, the concurrencies left are counted as refused (:data:`SATURATED`)."""
    from ..serving.agg import SATURATED_BOUNDS

    if bound not in SATURATED_BOUNDS or j + 1 >= len(conc):
        return False
    why = f"agg candidate: {SATURATED}"
    res.refused[why] = res.refused.get(why, 0) + len(conc) - j - 1
    return True


def _evaluate(res: SearchResult, est, lay: Layout, conc: list[int], params, refine: bool = False,
              stop_saturated: bool = False) -> None:
    """Add ``lay`` (estimator ``est``) at each concurrency of ``conc`` to ``res`` (with ``refine``,
    then at the concurrencies :func:`refine_concurrency` probes). ``stop_saturated``: the
    concurrencies after the first whose steady state is held by a cap of the engine (its KV
    cache, its max batch, its token budget: :data:`~infercast.serving.agg.SATURATED_BOUNDS`) are
    not evaluated -- there more clients only queue: the decode batch stays at its cap, the TTFT
    grows with every client and the throughput creeps towards its plateau (docs/modelling-log.md,
    "Fifth round": how little the points left out add) -- and are counted as refused
    (:data:`SATURATED`), as a disaggregated deployment's concurrencies stop at the first whose
    decode batch overflows its KV cache."""
    from ..api import serve_agg_replica

    ok: dict[int, bool | None] = {}
    # one serving run per clients-per-rank count (with attention DP several concurrencies share one)
    by_rank: dict = {}
    waves: dict = {}  # what each concurrency's first wave leaves for the larger ones (serving.sim)
    bound = [None]  # the bound of the last serving result

    def one(c: int) -> bool | None:
        _count(res, "agg candidate")
        bound[0] = None
        try:
            # a candidate keeps no per-op notes: not computed
            r, _ = serve_agg_replica(est, c, res.isl, res.osl, params, memo=by_rank, prefix=res.prefix, notes=False,
                                     first_waves=waves)
        except InfercastError as exc:
            refuse(res, f"{lay.label}@c{c}", "agg candidate", str(exc), exc)
            return None
        bound[0] = r.bound
        cand = with_energy(Candidate(*_fields(res, lay.label, est, est.gpus, c, r, r.bound), cp=int(lay.cp)), est, r,
                           res.osl)
        res.candidates.append(cand)
        return cand.meets_targets

    for j, c in enumerate(conc):
        ok[c] = one(c)
        if ok[c] is None and c == conc[0]:
            return  # not even the fewest clients fit: the layout does not serve this workload
        if stop_saturated and stop_at_saturation(res, bound[0], j, conc):
            break
    if refine:
        refine_concurrency(one, list(ok), ok.get)


# ---- disaggregated ------------------------------------------------------------------------------


@dataclass
class DisaggCandidate(Candidate):
    """A disaggregated deployment: ``prefill_workers`` x the prefill layout and ``decode_workers``
    x the decode layout (the parallel fields of :class:`Candidate` are the decode layout's)."""

    prefill_layout: str = ""
    prefill_workers: int = 0
    decode_layout: str = ""
    decode_workers: int = 0
    prefill_utilisation: float = 0.0
    prefill_cp: int = 1


#: :class:`DisaggCandidate`'s fields in the order of the rows :meth:`DisaggGroup.add_blocks` adds
#: (checked here: a field added or moved must be added or moved there too)
_DISAGG_FIELDS = ("layout", "tp", "pp", "attention_dp", "moe_tp", "moe_ep", "gpus", "concurrency", "ttft_ms", "tpot_ms",
                  "ttft_p90_ms", "tpot_p90_ms", "request_latency_ms", "tokens_per_s_per_gpu", "tokens_per_s_per_user",
                  "bound", "meets_targets", "description", "backend", "energy_j_per_token", "energy_coverage", "cp",
                  "prefill_layout", "prefill_workers", "decode_layout", "decode_workers", "prefill_utilisation",
                  "prefill_cp")
assert tuple(f.name for f in fields(DisaggCandidate)) == _DISAGG_FIELDS, "DisaggGroup.add_blocks adds candidates as rows"

#: concurrencies probed inside each bracket per refinement round of a disaggregated search
#: (:func:`evaluate_disagg`): a bracket of 512 clients resolves in three rounds
REFINE_PROBES = 8


def _worker_counts(gp: int, gd: int, max_gpus: int, max_workers: int | None) -> list[tuple[int, int]]:
    """(prefill workers, decode workers) of ``gp`` and ``gd`` GPUs each that fit in ``max_gpus``
    (each count at most ``max_workers``; None: as many as fit)."""
    cap_p = max_gpus // gp if max_workers is None else min(max_workers, max_gpus // gp)
    return [(p, d) for p in range(1, cap_p + 1)
            for d in range(1, ((max_gpus - p * gp) // gd if max_workers is None else min(max_workers, (max_gpus - p * gp) // gd)) + 1)]


def disagg_worker(lay: Layout, nvlink_gpus: int, total: int) -> bool:
    """Whether ``lay`` is a disaggregated worker the search considers: fewer GPUs than ``total``
    (one worker of the other role needs at least one; with one GPU in all, the one-GPU layout, so
    that the search says why nothing fits), and pipeline stages only to span nodes (each stage
    fills the NVLink domain); attention-DP x EP may span nodes."""
    return (lay.gpus < total or lay.gpus == 1) and (lay.pp == 1 or lay.tp * lay.attention_dp >= nvlink_gpus)


def search_disagg(
    model: str,
    system: str,
    backend: str,
    isl: int,
    osl: int,
    *,
    max_gpus: int | None = None,
    max_workers: int | None = None,
    concurrencies: list[int] | None = None,
    ttft_max_ms: float | None = None,
    tpot_max_ms: float | None = None,
    backend_version: str | None = None,
    systems_path=None,
    scheduler: dict | None = None,
    cap_concurrency: bool = False,
    refine: bool | None = None,
    decode_system: str | None = None,
    cps=None,
    scheduler_roles: dict | None = None,
    prefix: int = 0,
    jobs: int | None = 1,
    progress=None,
    _defer: list | None = None,
    **estimator_kw,
) -> SearchResult:
    """Disaggregated deployments of at most ``max_gpus`` GPUs in all (default: two nodes): a
    prefill layout and a decode layout (:func:`disagg_worker`: TP within the NVLink domain,
    attention-DP x EP or pipeline stages across nodes) times as many workers of each as fit (at
    most ``max_workers`` each if given), at each concurrency (clients of the whole deployment),
    through the disaggregated serving model (:mod:`infercast.serving.disagg`). A deployment
    whose decode ranks would run more requests than their KV cache holds
    (:mod:`infercast.serving.memory`) is skipped. ``scheduler``: {SchedulerParams field: value}
    overriding the backend's defaults in both roles, ``scheduler_roles`` ({"prefill": {...},
    "decode": {...}}) in one role, over ``scheduler``. ``cap_concurrency``: as
    :func:`search_agg`'s, the bound being the most decode workers' requests; ``refine``: as
    :func:`search_agg`'s, per deployment (layouts and worker counts). ``decode_system``: the
    decode workers run on this system (prefill on ``system``; the same model, backend and data
    version), the KV cache moving over the slower of the two systems' node-to-node links. The deployments of one decode layout are solved together, as arrays
    (:func:`evaluate_disagg`). ``cps``: the context-parallel degrees of the prefill workers
    (default: 1 only); decode workers are searched without context parallelism. ``prefix``,
    ``jobs``, ``progress`` (one part per decode layout): as :func:`search_agg`'s."""
    from dataclasses import replace

    from ..serving.backends import scheduler_params

    max_workers = None if max_workers is None else _positive("max_workers", max_workers, int, required=True)
    jobs = check_jobs(jobs)
    conc, base, res = _start(model, system, backend, isl, osl, concurrencies, ttft_max_ms, tpot_max_ms, backend_version,
                             systems_path, estimator_kw, prefix=prefix)
    node = base.data.system.node
    total = res.max_gpus = 2 * node.gpus_per_node if max_gpus is None else _positive("max_gpus", max_gpus, int)
    dbase, dnode = base, node
    if decode_system is not None and decode_system != system:
        res.decode_system = decode_system
        dbase = tp1_estimator(model, decode_system, backend, backend_version, systems_path, estimator_kw)
        res.decode_backend_version = dbase.version
        dnode = dbase.data.system.node
    cps = context_parallel_degrees(cps)
    pre = _estimators(res, base, model, layouts(base.spec, total, node.nvlink_gpus, cps=cps + (1,)), backend_version,
                      systems_path, estimator_kw, keep=lambda lay: disagg_worker(lay, node.nvlink_gpus, total))
    roles = _roles(res, {lay: e for lay, e in pre.items() if lay.cp in cps}, ("prefill",))
    if dbase is base:
        roles.update(_roles(res, {lay: e for lay, e in pre.items() if lay.cp == 1}, ("decode",)))
    else:
        def make(lay: Layout):
            return dbase if lay == Layout() and getattr(dbase, "layout_candidate", True) else estimator(
                model, decode_system, backend, backend_version, lay, systems_path, estimator_kw)

        dec = _estimators(res, dbase, model, layouts(dbase.spec, total, dnode.nvlink_gpus), backend_version, systems_path,
                          estimator_kw, keep=lambda lay: disagg_worker(lay, dnode.nvlink_gpus, total), make=make)
        roles.update(_roles(res, dec, ("decode",)))
    own = scheduler_roles or {}
    pre_over, dec_over = ({**(scheduler or {}), **own.get(role, {})} for role in ("prefill", "decode"))
    res.scheduler = {role: dict(o) for role, o in (("prefill", pre_over), ("decode", dec_over)) if o}
    params = replace(scheduler_params(backend, base.data.system, base.spec), **pre_over) if pre_over else None
    params_d = replace(scheduler_params(backend, dbase.data.system, dbase.spec), **dec_over) if dec_over else None
    conc = res.concurrencies = _fit_concurrencies(res, conc, concurrencies is not None, cap_concurrency, decode_holders(
        res, roles, total, max_workers, params_d or scheduler_params(backend, dbase.data.system, dbase.spec)))
    refine = concurrencies is None if refine is None else refine
    prefills = list(roles["prefill"].items())
    decodes = list(roles["decode"].items())
    # per decode layout, the worker counts with each prefill layout; a part's work grows with its
    # deployments x concurrencies
    counts = [[_worker_counts(pe.gpus, de.gpus, total, max_workers) for _, pe in prefills] for _, de in decodes]
    costs = [len(conc) * sum(map(len, cs)) for cs in counts]
    chunks = decode_chunks(costs)
    return _run_or_defer(res, [partial(_decode_layouts_part, prefills, [(*decodes[j], counts[j]) for j in chunk], total,
                                       conc, params, refine, params_d) for chunk in chunks],
                         [sum(costs[j] for j in chunk) for chunk in chunks], jobs, progress, _defer)


#: a disaggregated search's part holds consecutive decode layouts whose deployments x
#: concurrencies add up to at most the largest one's or this share of all of them, whichever is
#: more (:func:`decode_chunks`): small layouts share their array solves, large searches still
#: spread over many parts
DECODE_CHUNK_SHARE = 1 / 16


def decode_chunks(costs: list[float]) -> list[list[int]]:
    """The decode layouts of a disaggregated search grouped into parts, in order: consecutive ones
    while their costs add up to at most ``max(largest cost, DECODE_CHUNK_SHARE x total)``. The
    layouts of one part are solved together (:func:`evaluate_disagg_together`), each array solve
    costing about the same whatever its size."""
    if not costs:
        return []
    cap = max(max(costs), DECODE_CHUNK_SHARE * sum(costs))
    chunks, load = [[]], 0.0
    for j, c in enumerate(costs):
        if chunks[-1] and load + c > cap:
            chunks.append([])
            load = 0.0
        chunks[-1].append(j)
        load += c
    return chunks


def _decode_layouts_part(prefills: list, decodes: list[tuple], total: int, conc: list[int], params, refine: bool,
                         params_decode, res: SearchResult) -> None:
    """Every deployment of each decode layout of ``decodes`` ((layout, estimator, worker counts):
    one list of (prefill, decode) worker counts per prefill layout of ``prefills``, within
    ``total`` GPUs) added to ``res``, decode layout by decode layout, their solves made together
    (:func:`evaluate_disagg_together`): one part of :func:`~infercast.search.parallel.run_parts`."""

    def pairs(j: int) -> None:  # a decode layout's pairs counted (and refused) before its deployments
        dl, de, counts = decodes[j]
        for (pl, pe), cs in zip(prefills, counts):
            _count(res, "disagg layout pair")
            if not cs:
                refuse(res, f"P {pl.label} D {dl.label}", "disagg layout pair",
                       f"one prefill worker ({plural(pe.gpus, 'GPU')}) and one decode worker ({de.gpus}) exceed "
                       f"{plural(total, 'GPU')}", "exceeds the GPU budget")

    evaluate_disagg_together(res, prefills, decodes, conc, params, refine, params_decode=params_decode, before=pairs)


def decode_holders(res: SearchResult, roles: dict, gpus: int, max_workers: int, params) -> list[tuple[str, int]]:
    """(label, requests at once) of the most decode workers of each decode layout that fit in
    ``gpus`` beside the smallest prefill worker (at most ``max_workers``): the clients a
    disaggregated deployment can hold."""
    prefill_gpus = min((pe.gpus for pe in roles["prefill"].values()), default=None)
    if prefill_gpus is None:
        return []
    out = []
    for dl, de in roles["decode"].items():
        w = (gpus - prefill_gpus) // de.gpus
        if max_workers is not None:
            w = min(max_workers, w)
        if w < 1:
            continue
        out.append((f"{plural(w, 'decode worker')} of {dl.label}",
                    w * de.plan.parallel.attention_dp * rank_capacity(de, res.isl, res.osl, params, res.prefix)))
    return out


def _roles(res: SearchResult, ests: dict, only: tuple[str, ...] = ("prefill", "decode")) -> dict[str, dict]:
    """{"prefill" | "decode": {layout: estimator}}: the layouts one request fits on in that role
    (a prompt of ``isl`` tokens; ``isl + osl`` for decode); the others go to ``res.skipped``.
    ``only``: the roles to fill."""
    from ..api import one_request_misfit

    roles: dict[str, dict] = {}
    for role, tokens in (("prefill", res.isl + res.prefix), ("decode", res.isl + res.osl + res.prefix)):
        if role not in only:
            continue
        roles[role] = {}
        for lay, e in ests.items():
            why = one_request_misfit(e, tokens)
            if why:
                refuse(res, f"{role} {lay.label}", f"{role} layout", f"does not fit: {why}", "does not fit")
            else:
                roles[role][lay] = e
    return roles


class DisaggGroup:
    """One decode layout and the prefill layouts paired with it in a disaggregated search: what
    every deployment of them shares (schedulers, the KV transfer per prefill layout), and
    :meth:`solve` for many deployments and client counts at once. The same model as
    :func:`infercast.api.serve_disagg` (whose per-deployment checks the search has already made:
    :func:`_roles`), without its per-op notes."""

    def __init__(self, res: SearchResult, prefills: list, dl: Layout, de, params=None, params_decode=None):
        from ..serving.backends import scheduler_params
        from ..serving.disagg import kv_transfer_ms
        from ..serving.prefix import prefixed
        from ..serving.scaled import phase_scaled

        self.res, self.prefills, self.dl, self.de = res, prefills, dl, de
        self.pd = params_decode or params or scheduler_params(de.data.backend, de.data.system, de.spec)
        self.solvers = []
        self._deployments: dict = {}  # (prefill layout, pw, dw) -> _deployment's answer
        self._words: dict = {}  # the layouts in words (Estimator.layout_words), by prefill index and "decode"
        p = de.plan.parallel
        self._decode_fields = (p.tp, p.pp, p.attention_dp, p.etp, p.ep, de.data.backend, dl.label)
        self._prefill_labels = [pl.label for pl, _ in prefills]
        self._prefill_cps = [int(pl.cp) for pl, _ in prefills]
        self._decode_cp = int(dl.cp)
        dnode = de.data.system.node
        for _, pe in prefills:
            node = pe.data.system.node
            # the KV cache leaves the prefill system's nodes and enters the decode system's: the
            # slower link and the longer latency of the two (the same node on one system)
            bw, lat = min(node.inter_node_bw, dnode.inter_node_bw), max(node.p2p_latency_s, dnode.p2p_latency_s)
            pp = params or scheduler_params(pe.data.backend, pe.data.system, pe.spec)
            # a calibration's GPU-time scales apply to the worker's steps (serving.scaled), as in serve-disagg
            # a shared cached prefix: both workers attend to it, only the new tokens' KV moves (serving.prefix)
            self.solvers.append((prefixed(phase_scaled(pe.engine, pp), res.prefix), pp, pe.plan.parallel.attention_dp,
                                 kv_transfer_ms(pe.memory.kv_per_token, res.isl, pe.gpus, bw, lat)))
        self.decode_engine = prefixed(phase_scaled(de.engine, self.pd), res.prefix)
        self._curve = None  # the decode step by batch (DecodeCurve), made on the first solve

    #: the values of each deployment :meth:`solve` answers, in order (what a candidate reads)
    ROW = ("ttft_ms", "tpot_ms", "ttft_p90_ms", "tpot_p90_ms", "request_latency_ms", "tokens_per_s_per_gpu",
           "tokens_per_s_per_user", "prefill_utilisation", "decode_batch", "decode_kv_capacity")
    #: the columns of :func:`~infercast.serving.disagg.solve_disagg_many` those are made of
    SOLVED = tuple(name for name in ROW if name not in ("tpot_p90_ms", "decode_kv_capacity"))

    def solve(self, which, pw, dw, c, vectorised: bool = True) -> dict[str, list]:
        """For each element of the equal-length sequences ``which`` (index of the prefill layout),
        ``pw`` (prefill workers), ``dw`` (decode workers), ``c`` (clients), the values of
        :attr:`ROW` of its :class:`~infercast.serving.disagg.DisaggResult` (``decode_kv_capacity``:
        the requests of ``isl + osl`` tokens one decode rank's KV cache holds beside its batch's
        fixed-size state and the shared prefix), as {name: list}. ``vectorised``: one array solve for all
        (:func:`~infercast.serving.disagg.solve_disagg_many`, its answer as columns rather than
        result objects); ``False``: one scalar solve each (the reference the array path is tested
        against)."""
        from ..serving.disagg import solve_disagg, solve_disagg_many

        res, de = self.res, self.de
        which, pw, dw, c = (np.asarray(x, dtype=np.int64) for x in (which, pw, dw, c))
        gp = np.array([pe.gpus for _, pe in self.prefills], dtype=np.int64)
        gpus = pw * gp[which] + dw * de.gpus
        ddp = de.plan.parallel.attention_dp
        if vectorised:
            got = solve_disagg_many(self.solvers, self.decode_engine, c.astype(float), res.isl, res.osl, pw, dw, ddp, 1,
                                    self.pd, gpus, which, columns=self.SOLVED, decode_curve=self.curve())
            return self._row_columns(got, slice(None))
        else:
            out = []
            for i, ci, p, d, g in zip(which, c, pw, dw, gpus):
                eng, pp, pdp, transfer = self.solvers[i]
                out.append(solve_disagg(eng, self.decode_engine, float(ci), res.isl, res.osl, int(p), int(d), ddp, 1, pp, self.pd,
                                        transfer, int(g), prefill_dp=pdp))
            cols = {name: [getattr(r, name) for r in out] for name in self.ROW[:-1]}
        cols["decode_kv_capacity"] = self._kv_capacity(cols["decode_batch"])
        return cols

    def _row_columns(self, got: dict, part: slice) -> dict[str, list]:
        """:meth:`solve`'s answer from ``part`` of an array solve's :data:`SOLVED` columns."""
        cols = {name: got[name][part].tolist() for name in self.SOLVED}
        cols["tpot_p90_ms"] = cols["tpot_ms"]  # a lean result's TPOT percentiles are its mean
        cols["decode_kv_capacity"] = self._kv_capacity(cols["decode_batch"])
        return cols

    def curve(self):
        """The decode step by batch of this group (:class:`~infercast.serving.decode_curve.DecodeCurve`,
        made on first use: every solve of the group asks the same decode steps)."""
        if self._curve is None:
            from ..serving.decode_curve import DecodeCurve

            self._curve = DecodeCurve(self.decode_engine, self.pd, self.res.isl + self.res.osl / 2.0, self.pd.max_batch_size)
        return self._curve

    @staticmethod
    def solve_together(groups: list, asks: list[tuple], vectorised: bool = True) -> list[dict]:
        """:meth:`solve` of each group's ``asks`` (``(which, pw, dw, c)``), as one array solve when
        the groups share their search, decode scheduler and tokens per step (their prefill layouts
        mapped onto one list: a prefill layout's solver is the same for every decode layout of a
        search), else one solve each. Each group's answer as its own :meth:`solve` would give it,
        element for element."""
        from ..serving.disagg import solve_disagg_many

        first = groups[0]
        if len(groups) == 1 or not vectorised or any(
                g.res is not first.res or g.pd != first.pd
                or getattr(g.decode_engine, "tokens_per_step", 1.0) != getattr(first.decode_engine, "tokens_per_step", 1.0)
                for g in groups[1:]):
            return [g.solve(*ask, vectorised=vectorised) for g, ask in zip(groups, asks)]
        res = first.res
        solvers, at = [], {}  # the prefill layouts of every group, each once, and where each is
        parts = {name: [] for name in ("which", "pw", "dw", "c", "gpus", "dwhich")}
        for j, (g, (which, pw, dw, c)) in enumerate(zip(groups, asks)):
            local = []
            for (pl, _), solver in zip(g.prefills, g.solvers):
                if pl not in at:
                    at[pl] = len(solvers)
                    solvers.append(solver)
                local.append(at[pl])
            which, pw, dw, c = (np.asarray(x, dtype=np.int64) for x in (which, pw, dw, c))
            gp = np.array([pe.gpus for _, pe in g.prefills], dtype=np.int64)
            for name, v in (("which", np.asarray(local, dtype=np.int64)[which]), ("pw", pw), ("dw", dw), ("c", c),
                            ("gpus", pw * gp[which] + dw * g.de.gpus), ("dwhich", np.full(c.size, j, dtype=np.int64))):
                parts[name].append(v)
        cat = {name: np.concatenate(v) for name, v in parts.items()}
        got = solve_disagg_many(solvers, [g.decode_engine for g in groups], cat["c"].astype(float), res.isl, res.osl,
                                cat["pw"], cat["dw"], [g.de.plan.parallel.attention_dp for g in groups], 1, first.pd,
                                cat["gpus"], cat["which"], columns=DisaggGroup.SOLVED,
                                decode_curve=[g.curve() for g in groups], decode_which=cat["dwhich"])
        out, a = [], 0
        for g, (_, _, _, c) in zip(groups, asks):
            b = a + len(c)
            out.append(g._row_columns(got, slice(a, b)))
            a = b
        return out

    def _kv_capacity(self, batch: list) -> list:
        """Requests of ``isl + osl`` tokens one decode rank's KV cache holds beside a batch of
        ``batch`` requests' fixed-size state and the shared prefix, per element: the operations of
        :meth:`~infercast.serving.memory.MemoryBreakdown.capacity_for` and
        :func:`~infercast.serving.prefix.shared_prefix_capacity` on arrays, so the same values."""
        from ..serving.prefix import prefix_tokens_held, shared_prefix_capacity

        mem, res = self.de.memory, self.res
        tokens = res.isl + res.osl
        if mem.state_per_request <= 0 or mem.kv_per_token <= 0:  # the same capacity for every batch
            return [shared_prefix_capacity(float(mem.kv_capacity_tokens), res.prefix, mem.tokens_per_block) / tokens] * len(batch)
        room = np.maximum(0.0, mem.kv_capacity_tokens - np.asarray(batch, dtype=float) * mem.state_per_request / mem.kv_per_token)
        if res.prefix:
            room = np.maximum(room - prefix_tokens_held(res.prefix, mem.tokens_per_block), 0.0)
        return (room / tokens).tolist()

    def _deployment(self, i: int, pw: int, dw: int) -> tuple[str, int, str]:
        """(label, GPUs, the deployment in words) of prefill layout ``i`` x ``pw`` and the decode
        layout x ``dw`` (kept: a deployment is added at many concurrencies)."""
        key = (i, pw, dw)
        hit = self._deployments.get(key)
        if hit is None:
            pl, pe = self.prefills[i]
            if i not in self._words:
                self._words[i] = pe.layout_words
            if "decode" not in self._words:
                self._words["decode"] = self.de.layout_words
            gpus = pw * pe.gpus + dw * self.de.gpus
            words = (f"{plural(gpus, 'GPU')}: {plural(pw, 'prefill worker')} x ({self._words[i]}) + "
                     f"{plural(dw, 'decode worker')} x ({self._words['decode']})")
            hit = self._deployments[key] = (f"P{pw}x{pl.label} D{dw}x{self.dl.label}", gpus, words)
        return hit

    def verdicts(self, cols: dict) -> tuple[np.ndarray, np.ndarray]:
        """Per element of :meth:`solve`'s answer: (its decode batch overflows the decode
        ranks' KV cache, it meets the targets as :func:`~infercast.search.pareto.meets` says)."""
        res = self.res
        over = np.asarray(cols["decode_batch"], dtype=float) > np.asarray(cols["decode_kv_capacity"], dtype=float)
        ok = np.ones(over.shape, dtype=bool)  # a value above a target fails it (NaN does not, as in meets)
        if res.ttft_max_ms is not None:
            ok &= ~(np.asarray(cols["ttft_ms"], dtype=float) > res.ttft_max_ms)
        if res.tpot_max_ms is not None:
            ok &= ~(np.asarray(cols["tpot_ms"], dtype=float) > res.tpot_max_ms)
        return over, ok

    def add_blocks(self, deployments: list[tuple[int, int, int]], counts: list[int], c: list[int], cols: dict,
                   verdicts: tuple[np.ndarray, np.ndarray] | None = None) -> list:
        """Add deployments to the search result, in order: ``deployments`` (prefill layout, pw,
        dw) each standing for the next ``counts`` elements, ``c`` the clients and ``cols``
        (:meth:`solve`, one value per element) the solved values of each. An element whose
        decode batch overflows the decode ranks' KV cache is refused (more clients would not fit
        either); a decode batch held at the scheduler's ``max_batch_size`` is modelled (requests
        wait for a slot: :func:`infercast.serving.disagg.slot_wait_ms`), not refused. Every other
        element becomes a :class:`DisaggCandidate`, added as a row (rows built by ``zip``, the
        fields every element shares repeated). Answers, per element, whether it meets the targets
        (None: refused). ``verdicts``: :meth:`verdicts` of ``cols`` if already worked out."""
        from itertools import repeat

        res = self.res
        n = len(c)
        if n == 0:
            return []
        ev = res.evaluated
        ev["disagg candidate"] = ev.get("disagg candidate", 0) + n
        batch, kv_cap = cols["decode_batch"], cols["decode_kv_capacity"]
        over, ok = verdicts if verdicts is not None else self.verdicts(cols)
        dep = np.repeat(np.arange(len(deployments)), counts)
        words = [self._deployment(*d) for d in deployments]
        for k in np.flatnonzero(over).tolist():  # refused (few: the first overflow of a deployment at most)
            label = words[dep[k]][0]
            refuse(res, f"{label}@c{c[k]}", "disagg candidate",
                   f"a decode rank would run {batch[k]:.0f} requests; its KV cache holds "
                   f"{kv_cap[k]:.0f} of {res.isl}+{res.osl} tokens", "decode KV cache overflows")
        status = [None if o else bool(m) for o, m in zip(over.tolist(), ok.tolist())]
        keep = None if not over.any() else np.flatnonzero(~over)
        pick = partial(_take, keep=keep)

        per_dep = np.asarray([(w[0], w[1], w[2], self._prefill_labels[d[0]], d[1], d[2], self._prefill_cps[d[0]])
                              for d, w in zip(deployments, words)], dtype=object)[dep if keep is None else dep[keep]]
        labels, gpus, desc, plabels, pws, dws, pcps = (per_dep[:, j].tolist() for j in range(7))
        util = pick(cols["prefill_utilisation"])
        tp, pp, adp, etp, ep, backend, dlabel = self._decode_fields
        m = len(labels)
        # rows in :data:`_DISAGG_FIELDS`' order, built by zip (the fields every element shares repeated)
        res.candidates.add_rows(DisaggCandidate, list(zip(
            labels, repeat(tp, m), repeat(pp, m), repeat(adp, m), repeat(etp, m), repeat(ep, m), gpus, pick(c),
            pick(cols["ttft_ms"]), pick(cols["tpot_ms"]), pick(cols["ttft_p90_ms"]), pick(cols["tpot_p90_ms"]),
            pick(cols["request_latency_ms"]), pick(cols["tokens_per_s_per_gpu"]), pick(cols["tokens_per_s_per_user"]),
            [f"prefill util {u:.2f}" for u in util], pick(ok.tolist()),
            desc, repeat(backend, m), repeat(None, m), repeat(None, m), repeat(self._decode_cp, m),
            plabels, pws, repeat(dlabel, m), dws, util, pcps)))
        return status


def _take(values: list, keep: np.ndarray | None) -> list:
    """The elements of list ``values`` at the positions ``keep`` (None: all of them, as they are)."""
    return values if keep is None else np.asarray(values, dtype=object)[keep].tolist()


def evaluate_disagg(res: SearchResult, prefills: list, dl: Layout, de, counts: list[list[tuple[int, int]]],
                    conc: list[int], params=None, refine: bool = False, vectorised: bool = True,
                    params_decode=None) -> None:
    """Add, for each (prefill layout, estimator) of ``prefills`` with decode layout ``dl``
    (estimator ``de``), every (prefill workers, decode workers) of its list in ``counts`` at each
    concurrency of ``conc`` to ``res``, in that order; a deployment's concurrencies stop at the
    first whose decode batch overflows the KV cache. With ``refine``, then where a deployment's
    grid flips from meeting the targets to missing them, the largest concurrency that meets them
    is resolved to the client: rounds of :data:`REFINE_PROBES` evenly spaced probes inside each
    bracket (assuming, as :func:`refine_concurrency` does, that meeting the targets is monotone
    in the clients), all deployments' probes solved together. ``vectorised``: solve them all as arrays
    (:func:`~infercast.serving.disagg.solve_disagg_many`), else one by one. ``params`` /
    ``params_decode``: the prefill / decode schedulers (default: each backend's; decode defaults
    to ``params``)."""
    evaluate_disagg_together(res, prefills, [(dl, de, counts)], conc, params, refine, vectorised, params_decode)


def evaluate_disagg_together(res: SearchResult, prefills: list, decodes: list[tuple], conc: list[int], params=None,
                             refine: bool = False, vectorised: bool = True, params_decode=None,
                             before=None) -> None:
    """:func:`evaluate_disagg` of several decode layouts, ``decodes`` being (layout, estimator,
    worker counts) each: each one's deployments added to ``res`` in its turn, as one call each
    would add them, but their array solves made together, round by round (one solve per round
    for all of them: a solve's iterations cost the same whatever their size, :mod:`infercast.serving.disagg`),
    when their decode schedulers and tokens per step agree (else each its own). ``before(j)``:
    called before the ``j``-th decode layout's deployments are added (its own bookkeeping first)."""
    plans = []
    for dl, de, counts in decodes:
        keep = [j for j, cs in enumerate(counts) if cs]
        if not keep or not conc:
            plans.append(None)
            continue
        pf, cts = [prefills[j] for j in keep], [counts[j] for j in keep]
        group = DisaggGroup(res, pf, dl, de, params, params_decode)
        plans.append((group, pf, cts, _disagg_plan(group, [(i, pw, dw) for i, cs in enumerate(cts) for pw, dw in cs],
                                                 conc, refine)))
    adds: list[list] = [[] for _ in plans]
    try:
        _drive_plans([(pl[0], pl[3], got) for pl, got in zip(plans, adds) if pl is not None], vectorised)
    except InfercastError as exc:
        if len(plans) > 1:  # each decode layout on its own (its prefill layouts one by one if need be)
            for j, (dl, de, counts) in enumerate(decodes):
                if before is not None:
                    before(j)
                evaluate_disagg_together(res, prefills, [(dl, de, counts)], conc, params, refine, vectorised, params_decode)
            return
        # one prefill layout's prompt does not fit its token budget: solve them one by one
        group, pf, cts, _ = plans[0]
        if before is not None:
            before(0)
        if len(pf) > 1:
            for pair in zip(pf, cts):
                evaluate_disagg(res, [pair[0]], group.dl, group.de, [pair[1]], conc, params, refine, vectorised, params_decode)
            return
        _count(res, "disagg candidate", len(conc) * sum(map(len, cts)))
        refuse(res, f"P {pf[0][0].label} D {group.dl.label}", "disagg layout pair", str(exc), exc)
        return
    for j, (pl, got) in enumerate(zip(plans, adds)):
        if before is not None:
            before(j)
        for args in got:
            pl[0].add_blocks(*args)


def _drive_plans(plans: list[tuple], vectorised: bool) -> None:
    """Run :func:`_disagg_plan` generators ``(group, plan, adds)`` to their end: each round, every
    plan's asked solve made (together when the groups can be: :meth:`DisaggGroup.solve_together`),
    and what each asks to add kept, in order, in its ``adds``."""
    asks = {}
    for j, (_, plan, adds) in enumerate(plans):
        got = next(plan, None)
        while got is not None and got[0] == "add":
            adds.append(got[1])
            got = next(plan, None)
        if got is not None:
            asks[j] = got[1]
    while asks:
        order = sorted(asks)
        answers = DisaggGroup.solve_together([plans[j][0] for j in order], [asks[j] for j in order], vectorised)
        asks = {}
        for j, cols in zip(order, answers):
            _, plan, adds = plans[j]
            try:
                got = plan.send(cols)
            except StopIteration:
                got = None
            while got is not None and got[0] == "add":
                adds.append(got[1])
                got = next(plan, None)
            if got is not None:
                asks[j] = got[1]


def _disagg_plan(group: DisaggGroup, deployments: list[tuple[int, int, int]], conc: list[int], refine: bool):
    """What :func:`evaluate_disagg` does for one decode layout, as a generator: it yields
    ``("solve", (which, pws, dws, clients))`` and is sent that solve's columns
    (:meth:`DisaggGroup.solve`), and yields ``("add", args)`` for each
    :meth:`DisaggGroup.add_blocks` call to make (in order; a block's verdicts are worked out here,
    so the bracketing does not wait for the adding). A deployment's concurrencies are added up to
    the first whose decode batch overflows the KV cache; with ``refine``, the brackets where its
    answers flip from meeting the targets to missing them are probed, rounds of
    :data:`REFINE_PROBES` evenly spaced concurrencies, all deployments at once."""
    L = len(conc)
    which = np.repeat(np.array([d[0] for d in deployments], dtype=np.int64), L)
    pws = np.repeat(np.array([d[1] for d in deployments], dtype=np.int64), L)
    dws = np.repeat(np.array([d[2] for d in deployments], dtype=np.int64), L)
    cs_all = np.tile(np.asarray(conc, dtype=np.int64), len(deployments))
    cols = yield ("solve", (which, pws, dws, cs_all))
    # a deployment's concurrencies are added up to the first whose decode batch overflows the KV
    # cache (refused: more clients only grow the decode batch), the rest left out
    over_all, ok_all = group.verdicts(cols)
    over = over_all.reshape(-1, L)
    first = np.where(over.any(axis=1), over.argmax(axis=1), L)  # the first overflow (L: none)
    added = np.arange(L)[None, :] <= first[:, None]
    counts_added = np.minimum(first + 1, L)
    keep = None if added.all() else np.flatnonzero(added.ravel())
    verdicts = (over_all, ok_all) if keep is None else (over_all[keep], ok_all[keep])
    yield ("add", (deployments, counts_added.tolist(), _take(cs_all.tolist(), keep),
                   {name: _take(v, keep) for name, v in cols.items()}, verdicts))
    if not refine:
        return
    status = _statuses(*verdicts)
    # where a deployment's answers flip from meeting the targets to missing them between two
    # neighbouring concurrencies (both added, neither refused), the first such pair is its bracket
    ok = np.zeros((len(deployments), L), dtype=bool)
    ok[added] = [s_ is True for s_ in status]
    valid = np.arange(L)[None, :] < first[:, None]  # added and not refused
    flip = ok[:, :-1] & ~ok[:, 1:] & valid[:, 1:]
    brackets = {}
    conc_arr = np.asarray(conc)
    for r in np.flatnonzero(flip.any(axis=1)).tolist():
        j = int(flip[r].argmax())
        lo, hi = int(conc_arr[j]), int(conc_arr[j + 1])
        if hi - lo > 1:
            brackets[deployments[r]] = (lo, hi)
    while brackets:
        # each round probes REFINE_PROBES evenly spaced concurrencies inside every bracket, all
        # deployments at once (one array solve per round: its cost is mostly per call, not per probe)
        probes = {key: sorted({lo + (hi - lo) * j // (REFINE_PROBES + 1) for j in range(1, REFINE_PROBES + 1)} - {lo, hi})
                  for key, (lo, hi) in brackets.items()}
        keys = list(probes)
        flat_c = [c for key in keys for c in probes[key]]
        reps = [len(probes[key]) for key in keys]
        cols = yield ("solve", (*(np.repeat(np.asarray([key[f] for key in keys], dtype=np.int64), reps) for f in range(3)),
                                np.asarray(flat_c, dtype=np.int64)))
        # each deployment's probes ascending, up to the first that misses the targets or overflows
        # the KV cache (that one included): the rest are not added
        over, ok = group.verdicts(cols)
        stop = (over | ~ok).tolist()
        take, start = [], 0
        for n in reps:
            try:
                take.append(stop.index(True, start, start + n) - start + 1)
            except ValueError:
                take.append(n)
            start += n
        keep = np.concatenate([np.arange(b, b + t) for b, t in zip(np.cumsum([0] + reps[:-1]).tolist(), take)])
        verdicts = (over[keep], ok[keep])
        yield ("add", (keys, take, _take(flat_c, keep), {name: _take(v, keep) for name, v in cols.items()}, verdicts))
        status = _statuses(*verdicts)
        pos = 0
        for key, t in zip(keys, take):
            lo, hi = brackets.pop(key)
            for c, got in zip(probes[key][:t], status[pos:pos + t]):
                if got is None:
                    hi = lo  # no further refinement of this deployment
                elif not got:
                    hi = c
                else:
                    lo = c
            pos += t
            if hi - lo > 1:
                brackets[key] = (lo, hi)


def _statuses(over: np.ndarray, ok: np.ndarray) -> list:
    """Per element of a block: None (refused: its decode batch overflows the KV cache), else
    whether it meets the targets (what :meth:`DisaggGroup.add_blocks` answers)."""
    return [None if o else bool(m) for o, m in zip(over.tolist(), ok.tolist())]
