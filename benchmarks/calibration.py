"""How much `infercast calibrate` helps on rows it did not see (dev rows only).

    python -m benchmarks.calibration [--gpu auto|on|off] [--min-rows 6] [--groups N] [--half even|odd] [--json OUT]
    python -m benchmarks.calibration --prior-spread [--half even]   # the fit's prior widths
    python -m benchmarks.calibration --noise-floor                  # repeated measurements' scatter

For each (model, system, backend, version, source) group of the dev fully specified rows
(../shared/fidelity/dev_fullspec_ids.txt; the source is the silicon_data_source's first field:
the file or dump the rows came from) with at least ``--min-rows`` predictable rows, calibrate on
3 rows (the lowest, middle and highest concurrency, ties by id) and score the others: TTFT and
TPOT median APE before (the validate harness's prediction) and after (the calibrated values
applied). Rows are predicted as ``infercast validate`` predicts them, through its public
functions (EstimatorCache and its recipe settings, ...); agg rows whose TP column counts GPUs (the
validate harness searches their deployment) are left out. Held-out rows are never read.

``--prior-spread`` fits every calibrated field to all rows of each group instead (a ceiling of
the model, and the spread of deployments' fitted values that sets the fit's prior widths,
:data:`infercast.calibrate.fit.HOST`); ``--noise-floor`` prints how far repeated measurements of
one configuration differ (:func:`noise_floor`). See docs/modelling-log.md, 'Calibration to a
user's runs'.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

from infercast.api import serve_agg, serve_disagg
from infercast.calibrate.formats import MeasuredRun
from infercast.calibrate.run import calibrate_runs
from infercast.errors import InfercastError
from infercast.serving.backends import scheduler_params
from infercast.validate.cli import default_silicon_csv
from infercast.validate.predict import (
    EstimatorCache,
    benchmark_concurrency,
    clients_per_rank,
    gpu_count,
)
from infercast.validate.silicon import load_ids, load_rows

#: the first ``shared/fidelity/dev_fullspec_ids.txt`` above this file (the checkout's sibling)
DEV_IDS = next((p / "shared" / "fidelity" / "dev_fullspec_ids.txt" for p in Path(__file__).resolve().parents
                if (p / "shared" / "fidelity" / "dev_fullspec_ids.txt").is_file()),
               Path(__file__).resolve().parents[2] / "shared" / "fidelity" / "dev_fullspec_ids.txt")
CALIBRATION_ROWS = 3


def source_of(row) -> str:
    return (row.source or "").split(";")[0].strip()


def group_key(row) -> tuple:
    return (row.model, row.system, row.backend, row.backend_version or "", source_of(row))


def row_model(cache: EstimatorCache, row):
    """(f(values) -> (TTFT, TPOT) with the SchedulerParams fields ``values`` applied, the row's
    own scheduler parameters) -- the validate harness's prediction at ``values == {}``."""
    if row.mode == "disagg":
        c = benchmark_concurrency(row)
        pe, de = cache.get(row, row.prefill), cache.get(row, row.decode)
        pp = scheduler_params(row.backend, pe.data.system, pe.spec)
        pd = scheduler_params(row.backend, de.data.system, de.spec)

        def f(values):
            r = serve_disagg(pe, de, concurrency=c, isl=row.isl, osl=row.osl, prefill_workers=row.prefill_workers,
                             decode_workers=row.decode_workers, prefill_batch=row.prefill.batch_size or 1,
                             params_prefill=replace(pp, **values), params_decode=replace(pd, **values))
            return r.ttft_ms, r.tpot_ms

        return f, pd
    if gpu_count(row, cache.ships_moe(cache.checkpoint(row)[0])) is not None:
        return None
    benchmark_concurrency(row)
    est = cache.get(row, row.worker)
    per_rank = clients_per_rank(row, est)
    par = est.plan.parallel
    rs = cache.settings(row, par.tp, par.attention_dp, per_rank)
    p = scheduler_params(row.backend, est.data.system, est.spec)
    if rs.scheduler:
        p = replace(p, **rs.scheduler)

    def f(values):
        r = serve_agg(est, per_rank, row.isl, row.osl, replace(p, **values))
        return r.ttft_ms, r.tpot_ms

    return f, p


def predictor(models):
    """``predict_subset`` (:func:`infercast.calibrate.fit.fit_runs`) over the row models."""

    def predict_subset(idx):
        def predict(values):
            t, q = [], []
            for i in idx:
                try:
                    a, b = models[i](values)
                except InfercastError:
                    a = b = math.nan
                t.append(a)
                q.append(b)
            return np.array(t, float), np.array(q, float)

        return predict

    return predict_subset


def pick(concurrencies: list[int], k: int = CALIBRATION_ROWS) -> list[int]:
    """Indices of ``k`` rows spread over concurrency: lowest, middle, highest (input sorted)."""
    n = len(concurrencies)
    return sorted({0, n // 2, n - 1}) if k == 3 else [round(i * (n - 1) / (k - 1)) for i in range(k)]


def _describe(row) -> dict:
    """A dev row's configuration for the per-group JSON (the residuals' analysis)."""
    w = row.worker if row.mode == "agg" else row.decode
    return {"id": row.id, "mode": row.mode, "concurrency": int(row.concurrency), "isl": int(row.isl), "osl": int(row.osl),
            "tp": getattr(w, "tp", None), "attention_dp": getattr(w, "attention_dp", None),
            "batch_size": getattr(w, "batch_size", None)}


def ape(pred, meas) -> np.ndarray:
    return np.abs(np.asarray(pred, float) - np.asarray(meas, float)) / np.asarray(meas, float)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="auto", choices=["auto", "on", "off"], help="GPU-time scales (default auto)")
    ap.add_argument("--ridge", type=float, default=None, help="the fit's prior weight (default: the fit's)")
    ap.add_argument("--stride", type=int, default=1, help="every Nth group only (a quick look)")
    ap.add_argument("--min-rows", type=int, default=6)
    ap.add_argument("--groups", type=int, default=None, help="first N groups only (a quick look)")
    ap.add_argument("--half", default=None, choices=["even", "odd"],
                    help="the even- or odd-numbered groups only (numbered in the order they are run, from 0)")
    ap.add_argument("--prior-spread", action="store_true",
                    help="instead of scoring: fit every calibrated field to all rows of each group and print the "
                         "spread of (fitted - default) per field (the fit's prior widths, fit.PARAMS)")
    ap.add_argument("--json", default=None, help="write per-group results here")
    ap.add_argument("--noise-floor", action="store_true",
                    help="instead of scoring: how far repeated measurements of one configuration differ")
    a = ap.parse_args(argv)
    rows = load_rows(default_silicon_csv(), load_ids(DEV_IDS))
    if a.noise_floor:
        _print_noise_floor([r for r in rows if r.measured and r.concurrency and r.isl and r.osl])
        return 0
    groups = defaultdict(list)
    for r in rows:
        if r.measured and r.concurrency and r.isl and r.osl:
            groups[group_key(r)].append(r)
    keys = sorted(k for k, v in groups.items() if len(v) >= a.min_rows)
    keys = keys[::a.stride]
    if a.groups:
        keys = keys[:a.groups]
    cache = EstimatorCache()
    out, skipped = [], defaultdict(int)
    t0 = time.time()
    by_system = defaultdict(list)
    number, spreads = -1, []
    for k in keys:
        by_system[(k[1], k[2])].append(k)
    for sys_key in sorted(by_system):
        for k in by_system[sys_key]:
            members = sorted(groups[k], key=lambda r: (r.concurrency, r.id))
            ready = []
            for r in members:
                try:
                    m = row_model(cache, r)
                    if m is None:
                        skipped["tp column counts GPUs (searched deployment)"] += 1
                        continue
                    before = m[0]({})
                except InfercastError as exc:
                    skipped[type(exc).__name__] += 1
                    continue
                if not all(math.isfinite(x) and x > 0 for x in before):
                    skipped["no prediction"] += 1
                    continue
                ready.append((r, m, before))
            if len(ready) < a.min_rows:
                continue
            number += 1
            if a.half is not None and number % 2 != ("even", "odd").index(a.half):
                continue
            if a.prior_spread:
                spreads.append(_in_sample_fit(k, ready))
                continue
            cal = pick([r.concurrency for r, _, _ in ready])
            rest = [i for i in range(len(ready)) if i not in cal]
            runs = [MeasuredRun(r.id, int(r.concurrency), int(r.isl), int(r.osl), float(r.measured_ttft_ms),
                                r.measured_tpot_ms if r.tpot_defined else None, r.model, r.mode) for r, _, _ in ready]
            cal_runs = [runs[i] for i in cal]
            models = [ready[i][1][0] for i in cal]
            prof = calibrate_runs(cal_runs, predictor(models), ready[cal[0]][1][1],
                                  {"model": k[0], "system": k[1], "backend": k[2]}, gpu=a.gpu, ridge=a.ridge)
            vals = prof.overrides()
            m_t = np.array([runs[i].ttft_ms for i in rest])
            m_p = np.array([math.nan if runs[i].tpot_ms is None else runs[i].tpot_ms for i in rest])
            b_t = np.array([ready[i][2][0] for i in rest])
            b_p = np.array([ready[i][2][1] for i in rest])
            after = [predictor([ready[i][1][0]])([0])(vals) for i in rest]
            a_t = np.array([x[0][0] for x in after])
            a_p = np.array([x[1][0] for x in after])
            lo, hi = prof.concurrency_range
            outside = sum(1 for i in rest if not lo <= runs[i].concurrency <= hi)
            res = {"group": list(k), "rows": len(ready), "scored": len(rest), "outside_range": outside,
                   "values": vals, "gpu": prof.evidence,
                   "ttft_ape_before": ape(b_t, m_t).tolist(), "ttft_ape_after": ape(a_t, m_t).tolist(),
                   "tpot_ape_before": ape(b_p, m_p).tolist(), "tpot_ape_after": ape(a_p, m_p).tolist(),
                   "calibration_rows": [{**_describe(ready[i][0]), **run} for i, run in zip(cal, prof.runs)],
                   "scored_rows": [{**_describe(ready[i][0]), "ttft_ms": float(m_t[j]), "tpot_ms": float(m_p[j]),
                                    "ttft_before": float(b_t[j]), "tpot_before": float(b_p[j]),
                                    "ttft_after": float(a_t[j]), "tpot_after": float(a_p[j])}
                                   for j, i in enumerate(rest)]}
            out.append(res)
            def md(x):
                x = np.asarray(x, float)
                x = x[np.isfinite(x)]
                return float(np.median(x)) * 100 if x.size else math.nan

            print(f"[{time.time() - t0:6.0f}s] {k[2]:6s} {k[1]:9s} {k[0].split('/')[-1][:24]:24s} {k[4][-40:]:40s} "
                  f"n={len(rest):3d} TTFT {md(res['ttft_ape_before']):5.1f}->{md(res['ttft_ape_after']):5.1f}% "
                  f"TPOT {md(res['tpot_ape_before']):5.1f}->{md(res['tpot_ape_after']):5.1f}% "
                  f"{'gpu' if 'prefill_scale' in vals else ''}", flush=True)
        cache.release()
    if a.prior_spread:
        _spread_table(spreads)
        return 0
    _table(out, skipped)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


def configuration(row) -> tuple:
    """Everything a dev row states about what was measured, its source file and id excepted."""
    return (row.model, row.system, row.backend, row.backend_version, row.mode, row.isl, row.osl, row.concurrency,
            row.gemm_quant, row.moe_quant, row.worker, row.prefill, row.decode, row.prefill_workers, row.decode_workers)


def noise_floor(rows) -> dict:
    """How far repeated measurements of one configuration (:func:`configuration`) differ: the
    pairwise APE ``|a - b| / b`` over ordered pairs of a configuration's distinct measured values
    (a run exported twice with the same figures counts once), for every configuration with
    different values (``"all"``) and for those whose values differ by more than 1% (``"over_1pct"``,
    rather than one run exported twice with its figures rounded differently). Per set: its
    ``configurations``, ``pairs`` and the ``ttft`` / ``tpot`` APEs (arrays)."""
    import itertools

    by_cfg = defaultdict(list)
    for r in rows:
        by_cfg[configuration(r)].append(r)
    repeated = [v for v in by_cfg.values() if len(v) > 1]
    distinct = []
    for v in repeated:
        vals = sorted({(round(r.measured_ttft_ms, 6), round(r.measured_tpot_ms or math.nan, 6)) for r in v})
        if len(vals) > 1:
            distinct.append((v, vals))
    out = {"rows": len(rows), "configurations": len(by_cfg), "repeated": len(repeated), "different": len(distinct),
           "same_source": sum(1 for v, _ in distinct if len({source_of(r) for r in v}) < len(v))}
    for label, min_spread in (("all", 0.0), ("over_1pct", 0.01)):
        pt, pp, n = [], [], 0
        for _, vals in distinct:
            t = [x[0] for x in vals]
            q = [x[1] for x in vals if math.isfinite(x[1])]
            spread = max(max(t) / min(t), max(q) / min(q) if q else 1.0) - 1.0
            if spread <= min_spread:
                continue
            n += 1
            for (t1, q1), (t2, q2) in itertools.permutations(vals, 2):
                pt.append(abs(t1 - t2) / t2)
                if math.isfinite(q1) and math.isfinite(q2):
                    pp.append(abs(q1 - q2) / q2)
        out[label] = {"configurations": n, "pairs": len(pt), "ttft": np.array(pt, float), "tpot": np.array(pp, float)}
    return out


def _print_noise_floor(rows) -> None:
    nf = noise_floor(rows)
    print(f"{nf['rows']} dev fully specified rows with measurements, {nf['configurations']} configurations; "
          f"{nf['repeated']} measured more than once, {nf['different']} of them with different values")

    def q(x, p):
        return np.percentile(x, p) * 100 if x.size else math.nan

    for key, label in (("all", "all with different values"), ("over_1pct", "values differing by > 1%")):
        s = nf[key]
        print(f"  {label}: {s['configurations']} configurations, {s['pairs']} ordered pairs: TTFT pairwise median APE "
              f"{q(s['ttft'], 50):.1f}% (75th pct {q(s['ttft'], 75):.1f}%), TPOT {q(s['tpot'], 50):.1f}% "
              f"(75th pct {q(s['tpot'], 75):.1f}%)")
    print(f"  of these, configurations with more than one row in one source file (one benchmark group): {nf['same_source']}")


#: the in-sample fit's prior weight: small, so the rows and not the prior set the values
IN_SAMPLE_RIDGE = 1e-4


def _in_sample_fit(k, ready) -> dict:
    """Every field of :data:`infercast.calibrate.fit.PARAMS` fitted to all rows of the group:
    field -> fitted - default."""
    from infercast.calibrate.fit import PARAMS, fit

    rows = [r for r, _, _ in ready]
    m_t = np.array([r.measured_ttft_ms for r in rows], float)
    m_p = np.array([r.measured_tpot_ms if r.tpot_defined and r.measured_tpot_ms else math.nan for r in rows], float)
    base = {n: float(getattr(ready[0][1][1], n)) for n in PARAMS}
    f = fit(predictor([m[0] for _, m, _ in ready])(list(range(len(rows)))), m_t, m_p, base, tuple(PARAMS),
            ridge=IN_SAMPLE_RIDGE)
    print(f"{k[2]:6s} {k[1]:9s} {k[0].split('/')[-1][:24]:24s} {k[4][-40:]:40s} n={len(rows):3d} "
          + " ".join(f"{n}={v:.4g}" for n, v in f.values.items()), flush=True)
    return {"dev": {n: f.values[n] - base[n] for n in PARAMS}, "ttft_ape": ape(f.ttft_ms, m_t), "tpot_ape": ape(f.tpot_ms, m_p)}


def _spread_table(spreads) -> None:
    from infercast.calibrate.fit import PARAMS

    print()
    print("| field | groups | fitted - default: 10% | 25% | 50% | 75% | 90% | spread (IQR / 1.35) | prior width now |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, prm in PARAMS.items():
        d = np.array([s["dev"][n] for s in spreads], float)
        q = np.percentile(d, [10, 25, 50, 75, 90])
        print(f"| {n} | {d.size} | " + " | ".join(f"{x:.4g}" for x in q) + f" | {(q[3] - q[1]) / 1.35:.4g} | {prm.scale:.4g} |")

    def md(key):
        x = np.concatenate([s[key] for s in spreads])
        x = x[np.isfinite(x)]
        return float(np.median(x)) * 100 if x.size else math.nan

    print(f"fitted to every row and scored on the same rows (the model's ceiling): TTFT median APE {md('ttft_ape'):.1f}%, "
          f"TPOT {md('tpot_ape'):.1f}%")


def _table(out, skipped) -> None:
    def med(key, sel=lambda r: True):
        x = np.array([v for r in out if sel(r) for v in r[key]], float)
        x = x[np.isfinite(x)]
        return float(np.median(x)) * 100 if x.size else math.nan

    print()
    print("| backend | groups | rows scored | TTFT median APE before | after | TPOT median APE before | after | groups with GPU scales |")
    print("|---|---|---|---|---|---|---|---|")
    for b in ("all", "trtllm", "vllm", "sglang"):
        sel = (lambda r: True) if b == "all" else (lambda r, b=b: r["group"][2] == b)
        g = [r for r in out if sel(r)]
        if not g:
            continue
        print(f"| {b} | {len(g)} | {sum(r['scored'] for r in g)} | {med('ttft_ape_before', sel):.1f}% | "
              f"{med('ttft_ape_after', sel):.1f}% | {med('tpot_ape_before', sel):.1f}% | {med('tpot_ape_after', sel):.1f}% | "
              f"{sum(1 for r in g if 'prefill_scale' in r['values'])} |")
    def moved(key):
        b = [np.nanmedian(r[f"{key}_ape_before"]) for r in out]
        a = [np.nanmedian(r[f"{key}_ape_after"]) for r in out]
        return sum(1 for x, y in zip(b, a) if y < 0.9 * x), sum(1 for x, y in zip(b, a) if y > 1.1 * x)

    kept = sum(1 for r in out if not r["values"])
    print(f"groups better / worse by more than 10% (group median APE): TTFT {'/'.join(map(str, moved('ttft')))}, "
          f"TPOT {'/'.join(map(str, moved('tpot')))}; defaults kept in {kept}")
    if skipped:
        print("rows left out:", ", ".join(f"{k} {v}" for k, v in sorted(skipped.items())))


if __name__ == "__main__":
    raise SystemExit(main())
