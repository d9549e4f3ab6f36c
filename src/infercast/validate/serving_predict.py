"""Serving-model predictor for silicon rows: :mod:`infercast.serving.agg` for aggregated rows,
:mod:`infercast.serving.disagg` for disaggregated rows that carry worker counts, and the best
deployment of the row's GPUs (:func:`infercast.search.fixed.search_fixed`) for agg rows whose TP
column counts GPUs (:func:`.predict.gpu_count`).

The benchmark recipes that apply to a row (:mod:`.recipes`, through the cache's
:meth:`~.predict.EstimatorCache.settings`) give its Estimator keywords and scheduler overrides.
For every agg and disagg row the predictor records the ``infercast serve`` / ``serve-disagg``
command line that gives the same prediction (:attr:`commands`, by row id; :mod:`.commands`)."""

from __future__ import annotations

import re
from dataclasses import replace

from ..api import serve_agg, serve_disagg
from ..errors import NotAvailableError, UnsupportedModelError
from ..serving.backends import scheduler_params
from .commands import disagg_command, serve_command
from .predict import EstimatorCache, benchmark_concurrency, clients_per_rank, gpu_count
from .silicon import SiliconRow


#: the most prefill or decode workers a GPU-count row's deployment is searched with: the row's
#: harness ran a handful of workers per role (the fully specified GB200 disagg rows of the same
#: model run 1-10 prefill and 1-2 decode workers), and the search's own default (as many as fit)
#: multiplies the splits of a 72-GPU rack several-fold for no deployment a harness runs
GPU_COUNT_MAX_WORKERS = 16


def serving_predictor(cache: EstimatorCache, params=None):
    commands: dict[str, str] = {}

    def settings(row: SiliconRow, tp, attention_dp, per_rank=None):
        return cache.settings(row, tp, attention_dp, per_rank)

    def p_for(backend, system=None, spec=None, row: SiliconRow | None = None, rs=None):
        if (params or {}).get(backend):
            return params[backend]
        base = scheduler_params(backend, system, spec)
        if row is None or not rs.scheduler:
            return base
        return replace(base, **rs.scheduler)

    def predict(row: SiliconRow):
        if row.mode == "disagg":
            return _disagg(row)
        gpus = gpu_count(row, cache.ships_moe(cache.checkpoint(row)[0]))
        if gpus is not None:
            return _fixed(row, gpus)
        benchmark_concurrency(row)
        w = row.worker
        est = cache.get(row, w)
        per_rank = clients_per_rank(row, est)
        par = est.plan.parallel
        rs = settings(row, par.tp, par.attention_dp, per_rank)
        p = p_for(row.backend, est.data.system, est.spec, row, rs)
        res = serve_agg(est, per_rank, row.isl, row.osl, p)
        if not (params or {}).get(row.backend):
            commands[row.id] = serve_command(est, per_rank, row, p, rs)
        return res.ttft_ms, res.tpot_ms, f"data {est.version}; decode batch {res.decode_batch:.0f} ({res.bound}){_parts(res)}"

    def _fixed(row: SiliconRow, gpus: int):
        from ..search.fixed import search_fixed

        concurrency = benchmark_concurrency(row)
        base = cache.for_layout(row)
        res = search_fixed(
            base.spec.model_id, row.system, row.backend, row.isl, row.osl, gpus=gpus, concurrencies=[concurrency],
            params=p_for(row.backend, base.data.system, base.spec, row,
                         settings(row, row.worker.tp if row.worker else None, row.worker.attention_dp if row.worker else None)),
            make_estimator=lambda lay: cache.for_layout(row, lay.tp, lay.pp, lay.attention_dp, lay.moe_tp, lay.moe_ep),
            max_workers=GPU_COUNT_MAX_WORKERS,
        )
        if res.best is None:
            raise NotAvailableError(f"tp {gpus} counts GPUs, and no deployment of {gpus} GPUs serves this row",
                                    f"{len(res.skipped)} layouts / splits skipped")
        b = res.candidates[res.best]
        return b.ttft_ms, b.tpot_ms, (f"data {base.version}; tp {gpus} is no TP degree: the best of {len(res.candidates)} "
                                      f"deployments of {gpus} GPUs at c{concurrency}, {b.layout}")

    def _disagg(row: SiliconRow):
        if not (row.prefill_workers and row.decode_workers and row.prefill and row.decode):
            raise UnsupportedModelError("disaggregated row without prefill/decode worker counts", "the configuration is not fully specified")
        concurrency = benchmark_concurrency(row)
        pe = cache.get(row, row.prefill)
        de = cache.get(row, row.decode)
        res = serve_disagg(
            pe, de, concurrency=concurrency, isl=row.isl, osl=row.osl, prefill_workers=row.prefill_workers,
            decode_workers=row.decode_workers, prefill_batch=row.prefill.batch_size or 1,
            params_prefill=p_for(row.backend, pe.data.system, pe.spec), params_decode=p_for(row.backend, de.data.system, de.spec),
        )
        if not (params or {}).get(row.backend):
            commands[row.id] = disagg_command(pe, de, row, concurrency)
        return res.ttft_ms, res.tpot_ms, (f"data {pe.version}; decode batch {res.decode_batch:.0f}; "
                                          f"prefill util {res.prefill_utilisation:.2f}{_parts(res)}")

    predict.commands = commands
    return predict


def _parts(res) -> str:
    """``res``'s mean TTFT parts (:data:`infercast.serving.result.TTFT_PARTS`) for a row's note
    (read back by :func:`note_ttft_parts`)."""
    p = res.ttft_parts
    if not p:
        return ""
    return f"; TTFT = front end {p['front_end']:.0f} + wait {p['wait']:.0f} + prefill {p['prefill']:.0f} ms"


_NOTE_PARTS = re.compile(r"TTFT = front end ([\d.]+) \+ wait ([\d.]+) \+ prefill ([\d.]+) ms")


def note_ttft_parts(note: str | None) -> tuple[float, float, float] | None:
    """(front end, wait, prefill) in ms as a row's note states them (:func:`_parts`), or None."""
    m = _NOTE_PARTS.search(note or "")
    return None if m is None else (float(m[1]), float(m[2]), float(m[3]))
