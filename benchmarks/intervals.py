"""Coverage of the prediction intervals (:mod:`infercast.serving.intervals`) on rows the table
was not built from.

The tuning split's measurements (``dev_ids.txt``, repeated measurements counted once) are cut in
``--folds`` parts by a hash of the measurement (model, system, backend, mode, concurrency, isl,
osl and the measured numbers: every copy of one measurement lands in the same part); for each
part the table is built from the other parts (``scripts/build_intervals.py``'s
:func:`build_table`, same minimum cell size) and every row of the part is checked: does its
measured value fall in its predicted 80% / 95% range? ``--split model`` holds out one model at a
time instead (stricter: a model the table never saw). The held-out acceptance rows are not used.

Prints, per model (serving / static) and metric, the coverage overall and per condition value
(backend, mode, concurrency band, measured / extrapolated tables), nominal against achieved.
The throughputs' ranges are the request latency's inverted, so their coverage is the latency's.

    PYTHONPATH=src python -m benchmarks.intervals                # predictions cached in /tmp
    PYTHONPATH=src python -m benchmarks.intervals --split model
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import build_intervals as bi

from infercast.serving.intervals import (
    KEYS,
    LEVELS,
    METRICS,
    MODELS,
    IntervalTable,
    _check_table,
)


def fold_of(rec: dict, folds: int) -> int:
    """The part a measurement falls in: a stable hash of :func:`build_intervals.measurement_key`."""
    h = hashlib.sha256(repr(bi.measurement_key(rec)).encode()).digest()
    return int.from_bytes(h[:8], "big") % folds


def held_out_checks(recs_by_model: dict[str, list[dict]], split: str, folds: int, min_rows: int) -> dict:
    """Per model: (log ratios, conditions, low/high ends per metric and level) of every
    measurement, each checked against the table built without its part."""
    out = {}
    for kind, recs in recs_by_model.items():
        recs = bi.dedupe(recs)
        parts = [r["model"] for r in recs] if split == "model" else [fold_of(r, folds) for r in recs]
        res, conds = bi.residuals(recs)
        lo = {(m, lv): np.full(len(recs), np.nan) for m in METRICS for lv in LEVELS}
        hi = {(m, lv): np.full(len(recs), np.nan) for m in METRICS for lv in LEVELS}
        for part in sorted(set(parts), key=str):
            build = [r for r, p in zip(recs, parts) if p != part]
            doc = bi.build_table({k: (build if k == kind else recs_by_model[k]) for k in MODELS}, min_rows)
            table: IntervalTable = _check_table(doc, f"<fold {part}>")
            for i in (i for i, p in enumerate(parts) if p == part):
                for m in METRICS:
                    entry, _ = table.lookup(kind, m, conds[i])
                    for lv in LEVELS:
                        lo[m, lv][i], hi[m, lv][i] = entry[f"p{round(100 * lv)}"]
        out[kind] = (res, conds, lo, hi)
    return out


def coverage_rows(res, conds, lo, hi) -> list[tuple]:
    """(metric, group, n, achieved 80%, achieved 95%) overall and per condition value."""
    rows = []
    for m in METRICS:
        ok = np.isfinite(res[m])
        groups = [("all", ok)]
        for key in KEYS:
            for value in sorted({c.get(key, "(unknown)") for c in conds}):
                sel = ok & np.array([c.get(key, "(unknown)") == value for c in conds])
                groups.append((f"{key}={value}", sel))
        for label, sel in groups:
            n = int(sel.sum())
            if n == 0:
                continue
            cov = [float(np.mean((res[m][sel] >= lo[m, lv][sel]) & (res[m][sel] <= hi[m, lv][sel]))) for lv in LEVELS]
            rows.append((m, label, n, *cov))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", default="/tmp/intervals_preds_{kind}.json", help="predictions cache per model")
    ap.add_argument("--split", choices=("hash", "model"), default="hash")
    ap.add_argument("--folds", type=int, default=2)
    ap.add_argument("--min-rows", type=int, default=bi.MIN_ROWS)
    a = ap.parse_args(argv)
    recs = {kind: bi.load_or_predict(Path(a.cache.format(kind=kind)), bi.DEV_IDS, kind) for kind in MODELS}
    checks = held_out_checks(recs, a.split, a.folds, a.min_rows)
    how = "one model held out at a time" if a.split == "model" else f"{a.folds}-fold by measurement hash"
    print(f"prediction-interval coverage on measurements the table was not built from ({how}); "
          f"nominal {', '.join(f'{round(100 * lv)}%' for lv in LEVELS)}")
    for kind, (res, conds, lo, hi) in checks.items():
        print(f"\n{kind} model")
        print(f"{'metric':8} {'group':26} {'n':>5} {'80%':>7} {'95%':>7}")
        for m, label, n, c80, c95 in coverage_rows(res, conds, lo, hi):
            flag = "" if label != "all" or (abs(c80 - 0.80) <= 0.03 and abs(c95 - 0.95) <= 0.03) else "  <- outside +-3 points"
            print(f"{m:8} {label:26} {n:5d} {100 * c80:6.1f}% {100 * c95:6.1f}%{flag}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
