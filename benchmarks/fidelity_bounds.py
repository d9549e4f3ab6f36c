"""How far per-group corrections could take the TTFT error: ``python -m benchmarks.fidelity_bounds [--results CSV]``.

A bound, not a model. For each grouping of the rows (backend; backend and system; backend and
model; ...) it finds, group by group, the one TTFT scale factor -- and separately the one
additive shift in ms -- that brings the most of the group's rows within 15% of their measured
TTFT, fitted on those very rows. No per-group constant of that kind can do better on them, so
the printed counts are an upper bound on what any such calibration could reach; a mechanism that
moves TTFT the same way for every row of a group cannot beat it either. Compare the counts with
the goal (962 of the 1,924 dev fully specified rows within 15%, i.e. a median APE of 15%).

A second bound re-weights the parts the serving model builds TTFT from: each row's prediction
states them (``TTFT = front end X + wait Y + prefill Z ms`` in its note), and one scale per part
(:data:`PART_SCALES`), fitted per grouping (all rows; each engine) on the scored rows, shows how
far a different balance of front end, queueing and prefill could go.

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

from infercast.validate.serving_predict import note_ttft_parts

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


#: the scales tried for each part of the predicted TTFT (front end, wait, prefill)
PART_SCALES = np.round(np.arange(0.70, 2.0001, 0.05), 2)
#: groupings for the part scales
PART_GROUPINGS = ((), ("backend",))


def ttft_parts(row: dict) -> tuple[float, float, float] | None:
    """(front end, wait, prefill) in ms as the row's note states them, or None."""
    return note_ttft_parts(row.get("note"))


@dataclass(frozen=True)
class PartBound:
    group: tuple[str, ...]              # the group's values of the grouping
    rows: int                           # its rows whose note states the parts
    within_none: int                    # within the band with the parts as stated
    within_best: int                    # with the best scales
    scales: tuple[float, float, float]  # (front end, wait, prefill)


def best_part_scales(measured: np.ndarray, parts: np.ndarray, grid=PART_SCALES) -> tuple[int, tuple[float, float, float]]:
    """(rows within the band, scales) for the (front end, wait, prefill) scales from ``grid`` that
    put the most rows within :data:`WITHIN`; ties go to the smaller median APE, then to the scales
    nearest 1. ``parts``: shape (rows, 3)."""
    best: tuple = ()
    prefill = grid[:, None] * parts[None, :, 2]
    for f in grid:
        for w in grid:
            predicted = (f * parts[:, 0] + w * parts[:, 1])[None, :] + prefill
            ape = np.abs(predicted / measured[None, :] - 1.0)
            ok = (ape <= WITHIN).sum(axis=1)
            med = np.median(ape, axis=1)
            size = np.abs(np.log(f)) + np.abs(np.log(w)) + np.abs(np.log(grid))
            i = np.lexsort((size, med, -ok))[0]
            key = (-int(ok[i]), float(med[i]), float(size[i]))
            if not best or key < best[0]:
                best = (key, (float(f), float(w), float(grid[i])))
    return -best[0][0], best[1]


def part_bounds(rows: list[dict], grouping: tuple[str, ...]) -> list[PartBound]:
    """One :class:`PartBound` per group of ``grouping`` over the rows whose note states the parts."""
    groups: dict[tuple, list[tuple[float, tuple[float, float, float]]]] = {}
    for r in rows:
        parts = ttft_parts(r)
        if parts is not None:
            groups.setdefault(tuple(r.get(k, "") for k in grouping), []).append((float(r["measured_ttft_ms"]), parts))
    out = []
    for key in sorted(groups):
        measured = np.array([m for m, _ in groups[key]])
        parts = np.array([p for _, p in groups[key]])
        none = int((np.abs(parts.sum(axis=1) / measured - 1.0) <= WITHIN).sum())
        n, scales = best_part_scales(measured, parts)
        out.append(PartBound(key, len(measured), none, n, scales))
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


def part_table(rows: list[dict]) -> Table:
    t = Table(title=f"TTFT rows within {WITHIN:.0%} with its parts re-weighted: one scale each for front end, wait "
                    "and prefill, per group (fitted on the scored rows: an upper bound)", header_style="bold")
    for c in ("grouping", "group", "rows", "as stated", "best", "front end", "wait", "prefill"):
        t.add_column(c, justify="left" if c in ("grouping", "group") else "right")
    for grouping in PART_GROUPINGS:
        result = part_bounds(rows, grouping)
        for b in result:
            t.add_row(" + ".join(grouping) or "(all rows)", " / ".join(b.group) or "-", str(b.rows), str(b.within_none),
                      str(b.within_best), *(f"x{x:.2f}" for x in b.scales))
        if len(result) > 1:
            t.add_row(" + ".join(grouping), "(sum)", str(sum(b.rows for b in result)),
                      str(sum(b.within_none for b in result)), str(sum(b.within_best for b in result)), "", "", "")
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
    if any(ttft_parts(r) is not None for r in rows):
        console.print(part_table(rows))
    agree = remeasurement_agreement(rows)
    if agree.pairs:
        console.print(f"Re-runs: {agree.configurations} configurations measured more than once with different TTFTs; "
                      f"in {agree.within} of their {agree.pairs} ordered pairs one measurement is within {WITHIN:.0%} "
                      f"of the other ({agree.within / agree.pairs:.1%}; median {100 * agree.median_ape:.1f}% apart).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
