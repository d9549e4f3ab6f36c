"""How much `infercast calibrate` helps on rows it did not see (dev rows only).

    python -m benchmarks.calibration [--gpu auto|on|off] [--min-rows 6] [--groups N] [--json OUT]

For each (model, system, backend, version, source) group of the dev fully specified rows
(../shared/fidelity/dev_fullspec_ids.txt; the source is the silicon_data_source's first field:
the file or dump the rows came from) with at least ``--min-rows`` predictable rows, calibrate on
3 rows (the lowest, middle and highest concurrency, ties by id) and score the others: TTFT and
TPOT median APE before (the validate harness's prediction) and after (the calibrated values
applied). Rows are predicted as ``infercast validate`` predicts them, through its public
functions (EstimatorCache, recipe_scheduler, ...); agg rows whose TP column counts GPUs (the
validate harness searches their deployment) are left out. Held-out rows are never read.
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
from infercast.validate.recipes import postprocess_workers, recipe_scheduler
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
    p = recipe_scheduler(row, scheduler_params(row.backend, est.data.system, est.spec, postprocess_workers(row)), per_rank)

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


def ape(pred, meas) -> np.ndarray:
    return np.abs(np.asarray(pred, float) - np.asarray(meas, float)) / np.asarray(meas, float)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="auto", choices=["auto", "on", "off"], help="GPU-time scales (default auto)")
    ap.add_argument("--ridge", type=float, default=None, help="the fit's prior weight (default: the fit's)")
    ap.add_argument("--stride", type=int, default=1, help="every Nth group only (a quick look)")
    ap.add_argument("--min-rows", type=int, default=6)
    ap.add_argument("--groups", type=int, default=None, help="first N groups only (a quick look)")
    ap.add_argument("--json", default=None, help="write per-group results here")
    a = ap.parse_args(argv)
    rows = load_rows(default_silicon_csv(), load_ids(DEV_IDS))
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
                   "tpot_ape_before": ape(b_p, m_p).tolist(), "tpot_ape_after": ape(a_p, m_p).tolist()}
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
    _table(out, skipped)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return 0


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
    if skipped:
        print("rows left out:", ", ".join(f"{k} {v}" for k, v in sorted(skipped.items())))


if __name__ == "__main__":
    raise SystemExit(main())
