"""How far per-group corrections could take the TTFT error: ``python -m benchmarks.fidelity_bounds [--results CSV]``.

A bound, not a model. For each grouping of the rows (backend; backend and system; backend and
model; ...) it finds, group by group, the one TTFT scale factor -- and separately the one
additive shift in ms -- that brings the most of the group's rows within 15% of their measured
TTFT, fitted on those very rows. No per-group constant of that kind can do better on them, so
the printed counts are an upper bound on what any such calibration could reach; a mechanism that
moves TTFT the same way for every row of a group cannot beat it either. Compare the counts with
the goal (962 of the 1,924 dev fully specified rows within 15%, i.e. a median APE of 15%).

It also prints how well the measurements agree with themselves: rows that the model cannot tell
apart (same mode, engine, system, model, lengths and concurrency, and a bit-identical
prediction, so the same configuration) but that carry different measured TTFTs are re-runs of one
configuration; the share of their ordered pairs in which one measurement is within 15% of the
other is about what a model that matched one run of each configuration exactly would score on the
other runs: a noise floor.

``--results`` reads the per-row CSV that ``infercast validate --out DIR`` writes
(``DIR/results.csv``); without it the dev fully specified rows are predicted first (~30 s).
Only dev ids are read.
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from .fidelity import FIDELITY

#: the band a row must fall in to count (|predicted / measured - 1| <= WITHIN)
WITHIN = 0.15
#: the candidate corrections: scale factors e^-0.7 .. e^0.7 (0.50x .. 2.01x), shifts -500 .. +1000 ms
SCALES = np.exp(np.linspace(-0.7, 0.7, 281))
SHIFTS_MS = np.linspace(-500.0, 1000.0, 301)
#: groupings, coarse to fine (row attributes of the results CSV)
GROUPINGS = (
    (),
    ("backend",),
    ("backend", "system"),
    ("backend", "model"),
    ("backend", "system", "model"),
    ("backend", "system", "model", "backend_version"),
)


@dataclass(frozen=True)
class Bound:
    grouping: tuple[str, ...]
    groups: int
    rows: int
    within_none: int   # rows within the band as predicted
    within_scale: int  # with the best scale per group
    within_shift: int  # with the best shift per group
    median_ape_scale: float
    median_ape_shift: float


def load_results(path: Path) -> list[dict]:
    """The rows of a ``validate --out`` results CSV that have a measured and a predicted TTFT."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if rows and not {"measured_ttft_ms", "predicted_ttft_ms"} <= rows[0].keys():
        raise SystemExit(f"{path}: not a validate results CSV (no measured_ttft_ms / predicted_ttft_ms columns)")
    out = []
    for r in rows:
        try:
            m, p = float(r["measured_ttft_ms"]), float(r["predicted_ttft_ms"])
        except (TypeError, ValueError):
            continue
        if np.isfinite(m) and np.isfinite(p) and m > 0 and p > 0:
            out.append(r)
    return out


def best_correction(measured: np.ndarray, predicted: np.ndarray, shift: bool) -> tuple[int, float, np.ndarray]:
    """(rows within the band, the correction, the corrected predictions) for the one scale factor
    (``shift`` False) or additive shift in ms (True) that puts the most rows within
    :data:`WITHIN`; ties go to the smaller median APE, then to the smaller correction."""
    grid = SHIFTS_MS if shift else SCALES
    cand = predicted[None, :] + grid[:, None] if shift else predicted[None, :] * grid[:, None]
    ape = np.abs(cand / measured[None, :] - 1.0)
    ok = (ape <= WITHIN).sum(axis=1)
    med = np.median(ape, axis=1)
    size = np.abs(grid) if shift else np.abs(np.log(grid))
    best = np.lexsort((size, med, -ok))[0]
    return int(ok[best]), float(grid[best]), cand[best]


def bounds(rows: list[dict], groupings=GROUPINGS) -> list[Bound]:
    measured = np.array([float(r["measured_ttft_ms"]) for r in rows])
    predicted = np.array([float(r["predicted_ttft_ms"]) for r in rows])
    base = int((np.abs(predicted / measured - 1.0) <= WITHIN).sum())
    out = []
    for grouping in groupings:
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(rows):
            groups.setdefault(tuple(r.get(k, "") for k in grouping), []).append(i)
        within, median_ape = [], []
        for shift in (False, True):
            corrected = predicted.copy()
            n_within = 0
            for members in groups.values():
                idx = np.array(members)
                n, _, corrected[idx] = best_correction(measured[idx], predicted[idx], shift=shift)
                n_within += n
            within.append(n_within)
            median_ape.append(float(np.median(np.abs(corrected / measured - 1.0))))
        out.append(Bound(grouping, len(groups), len(rows), base, within[0], within[1], median_ape[0], median_ape[1]))
    return out


#: what makes two rows one configuration as far as the model knows (with a bit-identical prediction)
SAME_CONFIGURATION = ("mode", "backend", "system", "model", "isl", "osl", "concurrency", "predicted_ttft_ms")


@dataclass(frozen=True)
class Agreement:
    configurations: int  # configurations measured more than once with different TTFTs
    pairs: int           # ordered pairs of their distinct measurements
    within: int          # pairs whose first is within WITHIN of the second
    median_ape: float    # median |a / b - 1| over the pairs


#: measurements closer than this (relative) are one measurement exported twice (files that re-export
#: a run round it), not two runs
SAME_MEASUREMENT = 0.001


def _distinct(values: list[float]) -> list[float]:
    """The distinct measurements among ``values``: each within :data:`SAME_MEASUREMENT` of the last
    one kept (in ascending order) is a copy of it."""
    out: list[float] = []
    for v in sorted(values):
        if not out or v > out[-1] * (1.0 + SAME_MEASUREMENT):
            out.append(v)
    return out


def remeasurement_agreement(rows: list[dict]) -> Agreement:
    """How close re-runs of one configuration (:data:`SAME_CONFIGURATION`) come to each other:
    over every ordered pair (a, b) of a configuration's distinct measured TTFTs (:func:`_distinct`),
    ``|a / b - 1|``."""
    raw: dict[tuple, list[float]] = {}
    for r in rows:
        raw.setdefault(tuple(r.get(k, "") for k in SAME_CONFIGURATION), []).append(float(r["measured_ttft_ms"]))
    groups = [_distinct(v) for v in raw.values()]
    apes = [abs(a / b - 1.0) for vals in groups if len(vals) > 1
            for i, a in enumerate(vals) for j, b in enumerate(vals) if i != j]
    n = sum(1 for vals in groups if len(vals) > 1)
    return Agreement(n, len(apes), sum(1 for x in apes if x <= WITHIN), float(np.median(apes)) if apes else float("nan"))


def table(result: list[Bound]) -> Table:
    t = Table(title=f"TTFT rows within {WITHIN:.0%}: as predicted, and the best one correction per group "
                    "(fitted on the scored rows: an upper bound)", header_style="bold")
    for c in ("grouping", "groups", "rows", "as predicted", "best scale", "median APE", "best shift", "median APE"):
        t.add_column(c, justify="left" if c == "grouping" else "right")
    for b in result:
        t.add_row(" + ".join(b.grouping) or "(all rows)", str(b.groups), str(b.rows), str(b.within_none),
                  str(b.within_scale), f"{100 * b.median_ape_scale:.2f}%", str(b.within_shift),
                  f"{100 * b.median_ape_shift:.2f}%")
    return t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, help="results.csv of `infercast validate --out DIR`")
    ap.add_argument("--ids", type=Path, default=FIDELITY / "dev_fullspec_ids.txt",
                    help="row ids to predict when --results is not given (default: the dev fully specified rows)")
    a = ap.parse_args(argv)
    if a.results is not None:
        if not a.results.is_file():
            print(f"error: no such results CSV: {a.results}", file=sys.stderr)
            return 2
        rows = load_results(a.results)
    else:
        import tempfile

        from infercast.validate.cli import default_silicon_csv, make_predictor
        from infercast.validate.report import run_validation, write_csv
        from infercast.validate.silicon import load_ids, load_rows

        results = run_validation(load_rows(default_silicon_csv(), load_ids(a.ids)), make_predictor("serving"))
        with tempfile.TemporaryDirectory() as d:
            rows = load_results(write_csv(results, Path(d) / "results.csv"))
    if not rows:
        print("error: no row with a measured and a predicted TTFT", file=sys.stderr)
        return 2
    console = Console(width=150)
    console.print(table(bounds(rows)))
    agree = remeasurement_agreement(rows)
    if agree.pairs:
        console.print(f"Re-runs: {agree.configurations} configurations measured more than once with different TTFTs; "
                      f"in {agree.within} of their {agree.pairs} ordered pairs one measurement is within {WITHIN:.0%} "
                      f"of the other ({agree.within / agree.pairs:.1%}; median {100 * agree.median_ape:.1f}% apart).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
