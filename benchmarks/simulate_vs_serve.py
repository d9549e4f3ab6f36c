"""Closed-loop simulation against ``serve``'s analytic model on the dev silicon rows:
``python -m benchmarks.simulate_vs_serve [--mode agg|disagg] [--max-concurrency C] [--every K] [--lengths benchmark|nominal|all:R] [--rows all|random|fixed] [--front-end-spread S] [--client-start auto|together|staggered|wave-then-staggered [--ramp-up-s S]] [--schedule-ahead default|none|BACKENDS] [--adp-only] [--out CSV]``.

``--mode disagg``: the fully specified disaggregated dev rows instead, each served by
``serve-disagg`` and by :func:`infercast.serving.simulate.simulate_estimator_disagg` with the row's
worker counts and layouts, the backends' default schedulers (as ``validate`` serves these rows)
and nominal lengths.

For each fully specified *agg* dev row (../shared/fidelity/dev_fullspec_ids.txt; dev ids only)
both models see the same deployment, built by the validation harness
(:mod:`infercast.validate.serving_predict`, :mod:`infercast.validate.recipes`: the row's
estimator, clients per attention-DP rank, the recipe's scheduler parameters):

* ``serve``: :func:`infercast.api.serve_agg` (first wave simulated, steady state analytic);
* ``simulate``: :func:`infercast.serving.simulate.simulate_estimator` playing the benchmark
  itself: ``clients per rank x attention-DP ranks`` closed-loop clients on one replica (one
  scheduler per rank, least-outstanding routing: a client's next request goes where its last
  finished), each sending ``requests_per_client`` requests (the benchmark length serve assumes),
  every request counted (no warm-up cut: the benchmark client's mean). ``--lengths benchmark``
  (default) draws the lengths as the row's client did (uniform on [0.8 L, L] for the InferenceX rows,
  the recipes' client ``random_range_ratio``; the others at their ``isl`` / ``osl``);
  ``nominal`` sends every request at the row's ``isl`` / ``osl``; ``all:R`` draws every row's uniformly on
  [R L, L] (an experiment: does a small spread de-phase fixed-length clients?). ``--rows``:
  only the random-length or the fixed-length rows. ``--client-start``: how the closed-loop
  clients start (:class:`infercast.serving.simulate.Workload`; default ``auto``, as ``infercast
  simulate``). Each row's scheduler composes steps one ahead as its engine does
  (``SchedulerParams.schedule_ahead`` / ``overlap``; vLLM by the benchmarked build,
  :func:`infercast.serving.backends.vllm_async_scheduling`); ``--schedule-ahead none`` (or a list
  of backends) overrides it.

Rows whose TP column counts GPUs (serve searches deployments for them) and disagg rows are left
out. Prints, on the rows both models predict: TTFT and TPOT median APE against the measurement
and the share within 20%, overall and by backend, and the median |simulate / serve - 1|.

It also prints the coverage of the prediction intervals (:mod:`infercast.serving.intervals`, the
serving model's residual table) placed around each model's mean: the share of rows whose
measured TTFT / TPOT falls in the row's 80% / 95% range (the row's cell: backend, agg / disagg,
the benchmark's concurrency band, measured / extrapolated tables as ``serve`` computes them)
scaled to ``serve``'s prediction and to the simulation's. ``--defaults-only`` serves the agg rows
without the benchmark recipes (the engines' defaults, nominal lengths), as the table's residuals
were taken; the disaggregated rows are served so either way.
"""

from __future__ import annotations

import argparse
import csv
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from infercast.api import serve_agg, serve_disagg
from infercast.errors import InfercastError, UnsupportedModelError
from infercast.serving.backends import scheduler_params, vllm_async_scheduling
from infercast.serving.intervals import (
    LEVELS,
    condition,
    default_intervals,
    extrapolated_share,
)
from infercast.serving.simulate import (
    Workload,
    simulate_estimator,
    simulate_estimator_disagg,
    uniform_lengths,
)
from infercast.validate.cli import default_silicon_csv
from infercast.validate.predict import (
    EstimatorCache,
    benchmark_concurrency,
    clients_per_rank,
    gpu_count,
)
from infercast.validate.recipes import RecipeBook
from infercast.validate.silicon import load_ids, load_rows

#: the fidelity rows' folder: ``shared/fidelity`` beside the checkout (or beside its worktrees' parent)
FIDELITY = next((p / "shared" / "fidelity" for p in Path(__file__).resolve().parents
                 if (p / "shared" / "fidelity").is_dir()), Path("shared") / "fidelity")


def setup(cache: EstimatorCache, row):
    """(estimator, clients per rank, scheduler parameters) of an agg row, as serve's predictor
    builds them."""
    if gpu_count(row, cache.ships_moe(cache.checkpoint(row)[0])) is not None:
        raise UnsupportedModelError("tp counts GPUs: serve searches deployments for this row", "left out")
    benchmark_concurrency(row)
    est = cache.get(row, row.worker)
    per_rank = clients_per_rank(row, est)
    par = est.plan.parallel
    rs = cache.settings(row, par.tp, par.attention_dp, per_rank)
    base = scheduler_params(row.backend, est.data.system, est.spec)
    if row.backend == "vllm":  # async scheduling by the benchmarked build (serve does not read it)
        base = replace(base, schedule_ahead=vllm_async_scheduling(row.backend_version))
    return est, per_rank, replace(base, **rs.scheduler), rs.random_range_ratio


def run_serve(est, per_rank, params, row):
    r = serve_agg(est, per_rank, row.isl, row.osl, params)
    return r.ttft_ms, r.tpot_ms, r.decode_batch


def run_simulate(est, per_rank, params, row, lengths: str, spread: float = 0.0, seed: int = 0,
                 range_ratio: float | None = None, client_start: str = "auto", ramp_up_ms: float | None = None,
                 ahead: bool | None = None):
    dp = est.plan.parallel.attention_dp
    clients = per_rank * dp
    n = round(params.requests_per_client * clients)
    ratio = None
    if lengths == "benchmark" and range_ratio is not None:
        ratio = range_ratio
    elif lengths.startswith("all:"):
        ratio = float(lengths[4:])
    if ratio is not None:
        rng = np.random.default_rng(seed)
        isl, osl = uniform_lengths(row.isl, ratio, n, rng), uniform_lengths(row.osl, ratio, n, rng)
    else:
        isl, osl = np.full(n, row.isl), np.full(n, row.osl)
    w = Workload(isl, osl, clients=clients, client_start=client_start, ramp_up_ms=ramp_up_ms)
    res, _ = simulate_estimator(est, params, w, replicas=1, router="least-outstanding", warmup=0.0, cooldown=0.0,
                                expected_running=per_rank, front_end_spread=spread, seed=seed,
                                schedule_ahead=ahead)
    return res.latency["ttft_ms"]["mean"], res.latency["tpot_ms"]["mean"], res.steps


def run_disagg(cache: EstimatorCache, row, client_start: str = "auto", ramp_up_ms: float | None = None):
    """(serve TTFT, serve TPOT, simulate TTFT, simulate TPOT, engine steps, serve CPU s, simulate
    CPU s) of a disaggregated row, as ``validate`` serves it: the backend's default scheduler for
    each role (no recipe reaches disaggregated rows), the row's worker counts and layouts, the
    benchmark's concurrency over the whole deployment, nominal lengths."""
    if not (row.prefill_workers and row.decode_workers and row.prefill and row.decode):
        raise UnsupportedModelError("disaggregated row without prefill/decode worker counts", "left out")
    concurrency = benchmark_concurrency(row)
    pe, de = cache.get(row, row.prefill), cache.get(row, row.decode)
    pp = scheduler_params(row.backend, pe.data.system, pe.spec)
    pd = scheduler_params(row.backend, de.data.system, de.spec)
    if row.backend == "vllm":
        ahead = vllm_async_scheduling(row.backend_version)
        pp, pd = replace(pp, schedule_ahead=ahead), replace(pd, schedule_ahead=ahead)
    c0 = time.process_time()
    r = serve_disagg(pe, de, concurrency=concurrency, isl=row.isl, osl=row.osl, prefill_workers=row.prefill_workers,
                     decode_workers=row.decode_workers, prefill_batch=row.prefill.batch_size or 1,
                     params_prefill=pp, params_decode=pd)
    c1 = time.process_time()
    n = round(pd.requests_per_client * concurrency)
    w = Workload(np.full(n, row.isl), np.full(n, row.osl), clients=concurrency, client_start=client_start,
                 ramp_up_ms=ramp_up_ms)
    ranks = row.decode_workers * de.plan.parallel.attention_dp
    res = simulate_estimator_disagg(pe, de, pp, pd, w, prefill_workers=row.prefill_workers,
                                    decode_workers=row.decode_workers, warmup=0.0, cooldown=0.0,
                                    expected_running=concurrency / ranks)
    c2 = time.process_time()
    share = extrapolated_share(pe.engine, de.engine, isl=row.isl, osl=row.osl, decode_batch=r.decode_batch)
    return (r.ttft_ms, r.tpot_ms, res.latency["ttft_ms"]["mean"], res.latency["tpot_ms"]["mean"], res.steps,
            c1 - c0, c2 - c1, share)


def in_range(measured, predicted, cond: dict, metric: str, level: float) -> bool | None:
    """Whether ``measured`` falls in the ``level`` prediction interval of ``metric`` around
    ``predicted`` in the cell of ``cond`` (None when either is missing)."""
    if not measured or not predicted:
        return None
    factors, _, _ = default_intervals().factors("serving", metric, cond)
    lo, hi = factors[level]
    return predicted * lo <= measured <= predicted * hi


def coverage(out: list[dict], label: str = "all") -> None:
    """Print the share of rows inside their ranges, per metric and level, around serve's and the
    simulation's means."""
    print(f"prediction-interval coverage, {label} (measured inside the serving table's range around each model's mean):")
    for metric in ("ttft", "tpot"):
        for lv in LEVELS:
            tag = f"{metric}_{round(100 * lv)}"
            cells = []
            for who in ("serve", "sim"):
                v = [r[f"{who}_{tag}"] for r in out if r[f"{who}_{tag}"] is not None]
                cells.append(f"{who} {100 * np.mean(v):.1f}% of {len(v)}" if v else f"{who} -")
            print(f"  {metric.upper()} {round(100 * lv)}%: " + ", ".join(cells))


def _ape(p, m):
    return abs(p - m) / m


def _block(rs):
    def med(k):
        v = [r[k] for r in rs if r[k] is not None]
        return float(np.median(v)) if v else float("nan")

    def within(k):
        v = [r[k] for r in rs if r[k] is not None]
        return float(np.mean(np.asarray(v) <= 0.2)) if v else float("nan")

    return {"rows": len(rs), "serve_ttft": med("serve_ttft_ape"), "sim_ttft": med("sim_ttft_ape"),
            "serve_tpot": med("serve_tpot_ape"), "sim_tpot": med("sim_tpot_ape"),
            "serve_ttft_w20": within("serve_ttft_ape"), "sim_ttft_w20": within("sim_ttft_ape"),
            "serve_tpot_w20": within("serve_tpot_ape"), "sim_tpot_w20": within("sim_tpot_ape"),
            "ttft_sim_vs_serve": med("ttft_gap"), "tpot_sim_vs_serve": med("tpot_gap")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-concurrency", type=int, default=None, help="only rows of at most this many clients")
    ap.add_argument("--every", type=int, default=1, help="every K-th row (a documented subset)")
    ap.add_argument("--lengths", default="benchmark",
                    help="benchmark (default: drawn as the row's client drew them), nominal (every request at the "
                         "row's lengths), or all:R (every row's lengths uniform on [R L, L]: an experiment)")
    ap.add_argument("--rows", choices=("all", "random", "fixed"), default="all",
                    help="only the rows whose benchmark drew random lengths, or only the fixed-length ones")
    ap.add_argument("--front-end-spread", type=float, default=0.0,
                    help="each request's front-end time uniform on [(1-s) m, (1+s) m] (default 0: fixed)")
    ap.add_argument("--client-start", choices=("auto", "together", "staggered", "wave-then-staggered"), default="auto",
                    help="how the closed-loop clients start (infercast simulate --client-start; default auto)")
    ap.add_argument("--ramp-up-s", type=float, default=None,
                    help="with --client-start staggered / wave-then-staggered: the spread (s; default one expected cycle)")
    ap.add_argument("--schedule-ahead", default="default",
                    help="default (each row's engine: SchedulerParams.schedule_ahead or overlap, vLLM by its build), "
                         "none, or a comma-separated list of backends to simulate with it on (the others off)")
    ap.add_argument("--adp-only", action="store_true", help="only the rows deployed with attention data parallelism")
    ap.add_argument("--out", default=None, help="per-row CSV (dev rows only)")
    ap.add_argument("--mode", choices=("agg", "disagg"), default="agg",
                    help="the aggregated rows (default) or the disaggregated ones with worker counts")
    ap.add_argument("--defaults-only", action="store_true",
                    help="agg rows without the benchmark recipes (the engines' defaults), as the interval table's "
                         "residuals were taken")
    a = ap.parse_args()
    ramp = None if a.ramp_up_s is None else 1e3 * a.ramp_up_s
    rows = [r for r in load_rows(default_silicon_csv(), load_ids(FIDELITY / "dev_fullspec_ids.txt")) if r.mode == a.mode]
    if a.max_concurrency:
        rows = [r for r in rows if (r.concurrency or 0) <= a.max_concurrency]
    rows = rows[::max(1, a.every)]
    cache = EstimatorCache(recipes=RecipeBook.empty()) if a.defaults_only else EstimatorCache()
    out, skipped = [], {}
    t_serve = t_sim = 0.0
    steps = 0
    t0 = time.perf_counter()
    for i, row in enumerate(rows, 1):
        try:
            ratio = None
            if a.mode == "disagg":
                s_ttft, s_tpot, m_ttft, m_tpot, k, cs, cm, share = run_disagg(cache, row, a.client_start, ramp)
            else:
                est, per_rank, params, ratio = setup(cache, row)
                if a.rows != "all" and (ratio is not None) != (a.rows == "random"):
                    skipped[f"not {a.rows}-length"] = skipped.get(f"not {a.rows}-length", 0) + 1
                    continue
                if a.adp_only and est.plan.parallel.attention_dp == 1:
                    skipped["not attention-DP"] = skipped.get("not attention-DP", 0) + 1
                    continue
                c0 = time.process_time()
                s_ttft, s_tpot, batch = run_serve(est, per_rank, params, row)
                c1 = time.process_time()
                m_ttft, m_tpot, k = run_simulate(est, per_rank, params, row, a.lengths, a.front_end_spread,
                                               range_ratio=ratio, client_start=a.client_start, ramp_up_ms=ramp,
                                               ahead=None if a.schedule_ahead == "default"
                                               else row.backend in a.schedule_ahead.split(","))
                cs, cm = c1 - c0, time.process_time() - c1
                share = extrapolated_share(est.engine, est.engine, isl=row.isl, osl=row.osl, decode_batch=batch)
        except InfercastError as exc:
            skipped[type(exc).__name__] = skipped.get(type(exc).__name__, 0) + 1
            continue
        t_serve += cs
        t_sim += cm
        steps += k
        mt, mp = row.measured_ttft_ms, row.measured_tpot_ms if row.tpot_defined else None
        out.append({"id": row.id, "backend": row.backend, "model": row.model, "system": row.system,
                    "lengths": "random" if ratio is not None else "fixed",
                    "concurrency": row.concurrency, "isl": row.isl, "osl": row.osl,
                    "measured_ttft": mt, "serve_ttft": s_ttft, "sim_ttft": m_ttft,
                    "measured_tpot": mp, "serve_tpot": s_tpot, "sim_tpot": m_tpot,
                    "serve_ttft_ape": _ape(s_ttft, mt) if mt else None, "sim_ttft_ape": _ape(m_ttft, mt) if mt else None,
                    "serve_tpot_ape": _ape(s_tpot, mp) if mp else None, "sim_tpot_ape": _ape(m_tpot, mp) if mp else None,
                    "ttft_gap": abs(m_ttft / s_ttft - 1), "tpot_gap": abs(m_tpot / s_tpot - 1) if mp else None,
                    "ttft_ratio": m_ttft / s_ttft, "tpot_ratio": m_tpot / s_tpot if s_tpot else None})
        cond = condition(row.backend, row.mode, row.concurrency, share)
        for lv in LEVELS:
            for metric, meas, pair in (("ttft", mt, (s_ttft, m_ttft)), ("tpot", mp, (s_tpot, m_tpot))):
                for who, pred in zip(("serve", "sim"), pair):
                    out[-1][f"{who}_{metric}_{round(100 * lv)}"] = in_range(meas, pred, cond, metric, lv)
        if i % 100 == 0:
            print(f"  {i}/{len(rows)} rows, {time.perf_counter() - t0:.0f} s", flush=True)
    if a.out:
        with open(a.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(out[0]))
            w.writeheader()
            w.writerows(out)
    print(f"{a.mode} dev fullspec rows: {len(rows)} asked, {len(out)} predicted by both; left out: {skipped}")
    print(f"lengths: {a.lengths}; front-end spread {a.front_end_spread:g}; client start {a.client_start}; schedule-ahead {a.schedule_ahead}"
          + (f" over {a.ramp_up_s:g} s" if a.ramp_up_s is not None else "") + f"; CPU s: serve {t_serve:.1f}, simulate {t_sim:.1f} ({steps} engine steps simulated)")
    head = f"{'scope':<14}{'rows':>6}  {'TTFT medAPE serve/sim':>22}  {'TPOT medAPE serve/sim':>22}  " \
           f"{'TTFT<=20%':>14}  {'TPOT<=20%':>14}  {'|sim/serve-1| TTFT/TPOT':>24}"
    print(head)

    def line(label, rs):
        b = _block(rs)
        print(f"{label:<14}{b['rows']:>6}  {100 * b['serve_ttft']:>10.1f}/{100 * b['sim_ttft']:<11.1f}"
              f"  {100 * b['serve_tpot']:>10.1f}/{100 * b['sim_tpot']:<11.1f}"
              f"  {100 * b['serve_ttft_w20']:>6.1f}/{100 * b['sim_ttft_w20']:<7.1f}"
              f"  {100 * b['serve_tpot_w20']:>6.1f}/{100 * b['sim_tpot_w20']:<7.1f}"
              f"  {100 * b['ttft_sim_vs_serve']:>11.1f}/{100 * b['tpot_sim_vs_serve']:<11.1f}")

    line("all", out)
    for be in sorted({r["backend"] for r in out}):
        line(be, [r for r in out if r["backend"] == be])
    coverage(out)
    if a.mode == "agg":
        for lengths in ("random", "fixed"):
            coverage([r for r in out if r["lengths"] == lengths], f"{lengths} lengths simulated")


if __name__ == "__main__":
    main()
