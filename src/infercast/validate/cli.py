"""``infercast validate``: predict measured rows and report the error."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..data.pack import find_pack
from ..errors import DataFileError
from ..ops.base import DatabaseMode
from .metrics import DEFAULT_GROUPS, check_groupings, summarize
from .predict import EstimatorCache, static_predictor
from .report import prepare_out_dir, render_console, run_validation, write_all
from .silicon import load_ids, load_rows

#: the console width the summary table needs for its numbers to print whole
CONSOLE_MIN_WIDTH = 150


def default_silicon_csv(systems_path=None) -> Path:
    pack = find_pack(systems_path)
    path = pack.systems_dir / "silicon_sample.csv"
    if not path.exists():
        raise DataFileError(f"no silicon_sample.csv in {pack.systems_dir}", "pass --silicon CSV")
    return path


def make_predictor(kind: str, systems_path=None, database_mode="SILICON"):
    cache = EstimatorCache(systems_path, database_mode)
    if kind == "static":
        return static_predictor(cache)
    from .serving_predict import serving_predictor

    return serving_predictor(cache)


def run_validate(a) -> int:
    # Flags first, as the other commands check them: an unknown --database-mode or a
    # --systems-path without a pack would otherwise fail every row one by one (each reported as
    # not predictable) and the run would end "0/N rows predicted" with exit code 0.
    database_mode = DatabaseMode.parse(a.database_mode)
    asked = tuple(getattr(a, "by", None) or ())
    by = asked or DEFAULT_GROUPS
    check_groupings(by)
    find_pack(a.systems_path)
    csv_path = Path(a.silicon) if a.silicon else default_silicon_csv(a.systems_path)
    ids = load_ids(a.ids) if a.ids else None
    rows = load_rows(csv_path, ids)
    if a.out:
        prepare_out_dir(a.out)  # a bad --out fails now, not after every row was predicted
    predictor = make_predictor("static" if a.static else "serving", a.systems_path, database_mode)
    t0 = time.perf_counter()
    results = run_validation(rows, predictor)
    elapsed = time.perf_counter() - t0
    summary = summarize(results, by)
    summary["seconds"] = round(elapsed, 2)
    summary["model"] = "static" if a.static else "serving"
    if a.out:
        write_all(results, a.out, summary=summary, meta={"csv": str(csv_path), "ids": a.ids, "model": summary["model"]})
    if a.json:
        print(json.dumps(summary, indent=1))
    else:
        from ..report.console import new_console

        # eleven columns: at a pipe's or a narrow terminal's default 80 columns rich cuts the
        # numbers short ("192…" for 1924 rows); as `search` does, print wider instead
        new_console(CONSOLE_MIN_WIDTH).print(render_console(summary, asked or ("mode", "backend")))
        print(f"{summary['predicted']}/{summary['rows']} rows predicted in {elapsed:.1f} s")
    return 0
