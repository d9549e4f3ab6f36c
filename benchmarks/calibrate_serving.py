"""Calibrate the serving model's named parameters on the DEV silicon rows only.

    python -m benchmarks.calibrate_serving [--backend B] [--rpc ..] [--delay ..] [--per-stream ..] [--overhead ..]
                                           [--seq-overhead ..] [--stride N]

Loads the dev fully specified rows, builds each row's estimator once, then evaluates the
serving model under candidate scheduler parameters and prints median APE per backend. Only
ids from ../shared/fidelity/dev_fullspec_ids.txt are read; held-out rows are never touched.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import time
from pathlib import Path

import numpy as np

from infercast.errors import InfercastError
from infercast.serving.backends import scheduler_params
from infercast.api import serve_agg
from infercast.validate.cli import default_silicon_csv
from infercast.validate.predict import EstimatorCache, clients_per_rank
from infercast.validate.silicon import load_ids, load_rows

DEV_IDS = Path(__file__).resolve().parents[2] / "shared" / "fidelity" / "dev_fullspec_ids.txt"


def prepare(stride: int = 1):
    rows = [r for r in load_rows(default_silicon_csv(), load_ids(DEV_IDS)) if r.mode == "agg"][::stride]
    cache = EstimatorCache()
    ready = []
    for r in rows:
        try:
            est = cache.get(r, r.worker)
        except InfercastError:
            continue
        if r.measured_ttft_ms and r.measured_tpot_ms:
            ready.append((r, est))
    return ready


def evaluate(ready, overrides: dict):
    """Per-backend (TTFT ratio, TPOT ratio) lists under scheduler parameter overrides
    (``{backend or "*": {field: value}}``)."""
    out = {}
    for r, est in ready:
        p = dataclasses.replace(scheduler_params(r.backend, est.data.system, est.spec), **overrides.get(r.backend, overrides.get("*", {})))
        per_rank = clients_per_rank(r, est)
        try:
            res = serve_agg(est, per_rank, r.isl, r.osl, p)
        except InfercastError:
            continue
        out.setdefault(r.backend, []).append((res.ttft_ms / r.measured_ttft_ms, res.tpot_ms / r.measured_tpot_ms))
    table = {}
    for be, v in sorted(out.items()):
        a = np.array(v)
        table[be] = (len(a), float(np.median(np.abs(a[:, 0] - 1))), float(np.median(np.abs(a[:, 1] - 1))),
                     float(np.exp(np.mean(np.log(a[:, 0])))), float(np.exp(np.mean(np.log(a[:, 1])))))
    allv = np.array([x for v in out.values() for x in v])
    table["all"] = (len(allv), float(np.median(np.abs(allv[:, 0] - 1))), float(np.median(np.abs(allv[:, 1] - 1))),
                    float(np.exp(np.mean(np.log(allv[:, 0])))), float(np.exp(np.mean(np.log(allv[:, 1])))))
    return table


def show(label, table):
    for be, (n, t, p, gt, gp) in table.items():
        print(f"{label:40s} {be:7s} n={n:4d} TTFT medAPE {t:6.1%} GMR {gt:5.2f} | TPOT medAPE {p:6.1%} GMR {gp:5.2f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stride", type=int, default=1)
    ap.add_argument("--rpc", default=None, help="requests_per_client values (default: the backend's)")
    ap.add_argument("--delay", default=None, help="arrival_delay_ms values (default: the backend's)")
    ap.add_argument("--per-stream", default=None, help="front_end_per_stream_ms values (default: the backend's)")
    ap.add_argument("--overhead", default=None, help="step_overhead_ms values (default: the backend's)")
    ap.add_argument("--seq-overhead", default=None, help="seq_overhead_ms values (default: the backend's)")
    ap.add_argument("--backend", default=None, help="only rows of this backend")
    ap.add_argument("--lockstep", default=None, choices=["yes", "no"], help="override the backend's lockstep choice")
    a = ap.parse_args()
    t0 = time.time()
    ready = [(r, e) for r, e in prepare(a.stride) if a.backend in (None, r.backend)]
    print(f"{len(ready)} rows ready in {time.time() - t0:.1f}s")
    grid = [x.split(",") if x is not None else [None] for x in (a.rpc, a.delay, a.per_stream, a.overhead, a.seq_overhead)]
    for rpc, delay, stream, ovh, seq in itertools.product(*grid):
        t0 = time.time()
        ov = {}
        if rpc is not None:
            ov["requests_per_client"] = float(rpc)
        if delay is not None:
            ov["arrival_delay_ms"] = float(delay)
        if stream is not None:
            ov["front_end_per_stream_ms"] = float(stream)
        if ovh is not None:
            ov["step_overhead_ms"] = float(ovh)
        if seq is not None:
            ov["seq_overhead_ms"] = float(seq)
        if a.lockstep:
            ov["lockstep"] = a.lockstep == "yes"
        tab = evaluate(ready, {"*": ov})
        show(f"rpc={rpc} delay={delay} stream={stream} ovh={ovh} seq={seq} ({time.time() - t0:.0f}s)", tab)


if __name__ == "__main__":
    main()
