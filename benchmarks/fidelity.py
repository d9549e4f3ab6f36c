"""Fidelity on the dev silicon rows: ``python -m benchmarks.fidelity [--static] [--all-dev] [--json] [--by G ...]``.

Runs ``infercast validate`` on ../shared/fidelity/dev_fullspec_ids.txt (agg rows and disagg rows
with worker counts; ``--all-dev`` for every dev row) and prints coverage, median APE and share
within 20% for TTFT and TPOT, overall and by mode / backend / model (``--by``: other row
attributes, or combinations such as ``backend+backend_version+system``, listed worst TTFT first).
Only dev ids are read.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from infercast.errors import InvalidInputError
from infercast.validate.cli import default_silicon_csv, make_predictor
from infercast.validate.metrics import check_groupings, summarize
from infercast.validate.report import run_validation
from infercast.validate.silicon import load_ids, load_rows

FIDELITY = Path(__file__).resolve().parents[2] / "shared" / "fidelity"
REFERENCE = {"coverage": 0.929, "ttft_median_ape": 0.455, "ttft_within20": 0.203, "tpot_median_ape": 0.192, "tpot_within20": 0.510}


GROUPS = ("mode", "backend", "model")


def run(kind: str, ids_file: Path, by=GROUPS):
    rows = load_rows(default_silicon_csv(), load_ids(ids_file))
    t0 = time.perf_counter()
    results = run_validation(rows, make_predictor(kind))
    summary = summarize(results, by)
    summary["seconds"] = time.perf_counter() - t0
    return summary, results


def _pct(x):
    return "-" if x is None else f"{100 * x:.1f}%"


def table(summary, title, by=GROUPS):
    t = Table(title=title, header_style="bold")
    for c in ("scope", "rows", "coverage", "TTFT medAPE", "TTFT <=20%", "TPOT medAPE", "TPOT <=20%"):
        t.add_column(c, justify="right" if c != "scope" else "left")

    def add(label, b):
        t.add_row(label, str(b["rows"]), _pct(b["coverage"]), _pct(b["ttft_median_ape"]), _pct(b["ttft_within20"]),
                  _pct(b["tpot_median_ape"]), _pct(b["tpot_within20"]))

    add("all", summary)
    for group in by:
        blocks = summary["by"][group].items()
        if by is not GROUPS:  # an asked-for breakdown: worst TTFT first
            blocks = sorted(blocks, key=lambda kv: -(kv[1]["ttft_median_ape"] or 0.0))
        for k, b in blocks:
            add(f"{group}={k}", b)
    r = REFERENCE
    t.add_row("aiconfigurator 0.12.0 (README)", "", _pct(r["coverage"]), _pct(r["ttft_median_ape"]), _pct(r["ttft_within20"]),
              _pct(r["tpot_median_ape"]), _pct(r["tpot_within20"]))
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--static", action="store_true", help="the single-batch static model instead of the serving model")
    ap.add_argument("--all-dev", action="store_true", help="every dev row, not only the fully specified ones")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--by", nargs="+", metavar="G",
                    help="breakdowns instead of mode / backend / model: row attributes or combinations (a+b)")
    a = ap.parse_args()
    ids = FIDELITY / ("dev_ids.txt" if a.all_dev else "dev_fullspec_ids.txt")
    kind = "static" if a.static else "serving"
    by = tuple(a.by) if a.by else GROUPS
    try:
        check_groupings(by)
    except InvalidInputError as e:
        ap.error(str(e))
    summary, _ = run(kind, ids, by)
    if a.json:
        print(json.dumps(summary, indent=1))
        return
    Console(width=160).print(table(summary, f"fidelity on {ids.name} ({kind} model, {summary['seconds']:.0f} s)", by))


if __name__ == "__main__":
    main()
