"""Build ``src/infercast/data/intervals.json``: the prediction-interval table
(:mod:`infercast.serving.intervals`) from the measured serving benchmarks of the pack's
``silicon_sample.csv`` that the project may tune on (``/work/shared/fidelity/dev_ids.txt``).

Every listed row is predicted as ``infercast validate`` scores ``defaults_only`` (the serving
model, no benchmark recipe: only model, system, backend, layout and the checkpoint's own
quantisation); with each row the script keeps what the interval's condition needs at run time
(backend, agg / disagg, concurrency, the share of the prediction answered beyond measured table
points). Predictions go to a cache file (``--cache``, JSON) so that rebuilding, or the coverage
check in ``benchmarks/intervals.py``, need not predict again.

Residuals: ``log(measured / predicted)`` of TTFT, TPOT and the request latency
``TTFT + (osl - 1) TPOT``; quantiles per cell (:func:`infercast.serving.intervals.quantile_cells`)
with at least ``--min-rows`` rows per cell. Rows that repeat one measurement (the same deployment
and measured numbers exported in several source files) count once.

    PYTHONPATH=src python scripts/build_intervals.py --cache /tmp/intervals_preds.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEV_IDS = Path("/work/shared/fidelity/dev_ids.txt")
OUT = ROOT / "src" / "infercast" / "data" / "intervals.json"
#: fewest rows a cell needs for its own quantiles (else its rows count in the coarser cells only)
MIN_ROWS = 30


def _share_of(cache, row, decode_batch: float) -> list[list[float]]:
    """The provenance shares (:func:`infercast.serving.intervals.step_shares`) of a predicted
    row's prefill and decode steps, as lists."""
    from infercast.serving.intervals import step_shares

    if row.mode == "disagg":
        pe, de = cache.get(row, row.prefill), cache.get(row, row.decode)
    else:
        pe = de = cache.get(row, row.worker)
    pre, dec = step_shares(pe.engine, de.engine, isl=row.isl, osl=row.osl, decode_batch=decode_batch)
    return [pre.tolist(), dec.tolist()]


def predict_rows(ids_path: Path, kind: str = "serving", progress: bool = True) -> list[dict]:
    """Predict the rows listed in ``ids_path`` defaults-only with the ``kind`` model
    (``serving``: as ``infercast validate``; ``static``: as ``infercast validate --static``, the
    single batch of ``infercast estimate`` at the clients of one attention-DP rank): one record
    per predicted row."""
    import re

    from infercast.validate.cli import default_silicon_csv, select_rows
    from infercast.validate.predict import (
        EstimatorCache,
        clients_per_rank,
        gpu_count,
        static_predictor,
    )
    from infercast.validate.recipes import RecipeBook
    from infercast.validate.runner import run_grouped
    from infercast.validate.serving_predict import serving_predictor

    rows, _missing = select_rows(default_silicon_csv(), str(ids_path))
    cache = EstimatorCache(None, "SILICON", recipes=RecipeBook.empty())
    inner = serving_predictor(cache) if kind == "serving" else static_predictor(cache)
    shares: dict[str, list | None] = {}

    def predictor(row):
        ttft, tpot, note = inner(row)
        share = None
        if kind == "static":
            share = _share_of(cache, row, clients_per_rank(row, cache.get(row, row.worker)))
        else:
            m = re.search(r"decode batch ([\d.]+)", note or "")
            searched = row.mode == "agg" and gpu_count(row, cache.ships_moe(cache.checkpoint(row)[0])) is not None
            if m and not searched:
                share = _share_of(cache, row, float(m[1]))
        shares[row.id] = share
        return ttft, tpot, note

    t0 = time.time()

    def step(done, total, label):
        if progress and (done % 50 == 0 or done == total):
            print(f"  {done}/{total} {label} ({time.time() - t0:.0f} s)", file=sys.stderr)

    results = run_grouped(rows, predictor, release=cache.release, progress=step)
    out = []
    for r in results:
        if not r.predicted:
            continue
        row = r.row
        gpus = None
        if row.mode == "agg" and row.worker is not None:
            w = cache.layout(row, row.worker)
            gpus = w.tp * w.pp * w.attention_dp
        out.append({
            "id": row.id, "model": row.model, "system": row.system, "backend": row.backend, "mode": row.mode,
            "concurrency": row.concurrency, "isl": row.isl, "osl": row.osl, "gpus": gpus,
            "measured_ttft_ms": row.measured_ttft_ms, "measured_tpot_ms": row.measured_tpot_ms,
            "ttft_ms": r.ttft_ms, "tpot_ms": r.scored_tpot_ms, "shares": shares.get(row.id),
        })
    return out


def load_or_predict(cache_path: Path | None, ids_path: Path = DEV_IDS, kind: str = "serving") -> list[dict]:
    """The cached ``kind`` predictions at ``cache_path`` when the file exists, else predict and
    write it."""
    if cache_path is not None and cache_path.exists():
        return json.loads(cache_path.read_text())
    recs = predict_rows(ids_path, kind)
    if cache_path is not None:
        cache_path.write_text(json.dumps(recs))
    return recs


def measurement_key(rec: dict) -> tuple:
    """What identifies one measurement: rows that repeat it in several source files share it."""
    return (rec["model"], rec["system"], rec["backend"], rec["mode"], rec["concurrency"], rec["isl"], rec["osl"],
            rec["measured_ttft_ms"], rec["measured_tpot_ms"])


def dedupe(recs: list[dict]) -> list[dict]:
    """One record per :func:`measurement_key` (the first; their predictions can differ only where
    the repeated rows state the deployment differently)."""
    seen, out = set(), []
    for r in recs:
        k = measurement_key(r)
        if k not in seen:
            seen.add(k)
            out.append(r)
    return out


def _log_ratio(meas, pred) -> float:
    if meas is None or pred is None or not (meas > 0 and pred > 0):
        return math.nan
    return math.log(meas / pred)


def residuals(recs: list[dict]) -> tuple[dict[str, np.ndarray], list[dict[str, str]]]:
    """Per metric the log ratios of ``recs`` (NaN where a side is missing), and each record's
    condition (:func:`infercast.serving.intervals.condition`)."""
    from infercast.serving.intervals import condition, share_of

    out = {"ttft": [], "tpot": [], "latency": []}
    conds = []
    for r in recs:
        out["ttft"].append(_log_ratio(r["measured_ttft_ms"], r["ttft_ms"]))
        out["tpot"].append(_log_ratio(r["measured_tpot_ms"], r["tpot_ms"]))
        if r["osl"] > 1 and None not in (r["measured_tpot_ms"], r["tpot_ms"], r["measured_ttft_ms"]):
            lat_m = r["measured_ttft_ms"] + (r["osl"] - 1) * r["measured_tpot_ms"]
            lat_p = r["ttft_ms"] + (r["osl"] - 1) * r["tpot_ms"]
            out["latency"].append(_log_ratio(lat_m, lat_p))
        else:
            out["latency"].append(_log_ratio(r["measured_ttft_ms"], r["ttft_ms"]))
        share = None if r["shares"] is None else share_of(*r["shares"])
        conds.append(condition(r["backend"], r["mode"], r["concurrency"], share))
    return {k: np.array(v, dtype=float) for k, v in out.items()}, conds


def model_cells(recs: list[dict], min_rows: int = MIN_ROWS) -> dict:
    """One model's block of the table: its measurements (``recs`` deduplicated) and cells."""
    from infercast.serving.intervals import METRICS, quantile_cells

    recs = dedupe(recs)
    res, conds = residuals(recs)
    return {"rows": len(recs), "cells": {m: quantile_cells(res[m], conds, min_rows) for m in METRICS}}


def build_table(recs_by_model: dict[str, list[dict]], min_rows: int = MIN_ROWS) -> dict:
    """The ``intervals.json`` document of each model's records."""
    from infercast.serving.intervals import (
        BANDS,
        EXTRAPOLATED_SHARE,
        FORMAT_VERSION,
        HIERARCHY,
        LEVELS,
    )

    return {
        "format_version": FORMAT_VERSION,
        "built_by": "scripts/build_intervals.py",
        "source": "silicon_sample.csv of aiconfigurator-core 0.12.0, tuning split (dev_ids.txt), defaults-only predictions",
        "residual": "log(measured / predicted)",
        "levels": list(LEVELS),
        "min_rows": min_rows,
        "hierarchy": [list(k) for k in HIERARCHY],
        "bands": [[None if math.isinf(e) else e, lab] for e, lab in BANDS],
        "extrapolated_share": EXTRAPOLATED_SHARE,
        "models": {kind: model_cells(recs, min_rows) for kind, recs in recs_by_model.items()},
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", default="/tmp/intervals_preds_{kind}.json",
                    help="predictions cache per model ({kind}: serving / static; JSON; read when it exists, else written)")
    ap.add_argument("--ids", type=Path, default=DEV_IDS, help="row ids to build from (default: the tuning split)")
    ap.add_argument("--min-rows", type=int, default=MIN_ROWS)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    from infercast.serving.intervals import MODELS

    recs = {kind: load_or_predict(Path(a.cache.format(kind=kind)), a.ids, kind) for kind in MODELS}
    doc = build_table(recs, a.min_rows)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    for kind, block in doc["models"].items():
        n = {m: len(c) for m, c in block["cells"].items()}
        print(f"{a.out}: {kind}: {block['rows']} measurements, cells per metric {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
