"""``infercast validate``: predict measured rows and report the error, twice: with the benchmark
recipes (:mod:`.recipes`: what the public scripts behind the rows set, as data files) and
defaults-only (model, system, backend, version, layout and the checkpoint's own quantisation and
KV dtype, nothing else: what a user who states only those gets). The summary is the recipes'
score; ``defaults_only`` holds the other, with the same keys."""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..data.pack import find_pack
from ..errors import DataFileError, InvalidInputError
from ..ops.base import DatabaseMode
from .metrics import DEFAULT_GROUPS, check_groupings, summarize
from .predict import EstimatorCache, static_predictor
from ..report.progress import RowProgress
from .recipes import RecipeBook
from .report import WORST_CONSOLE_N, prepare_out_dir, render_console, write_all
from .runner import run_grouped
from .silicon import load_ids, load_rows

#: the console width the summary table needs for its numbers to print whole
CONSOLE_MIN_WIDTH = 150
#: unscorable rows' reasons named in the one-line error of a run that scored no row
REASONS_IN_ERROR = 3


def default_silicon_csv(systems_path=None) -> Path:
    pack = find_pack(systems_path)
    path = pack.systems_dir / "silicon_sample.csv"
    if not path.exists():
        raise DataFileError(f"no silicon_sample.csv in {pack.systems_dir}", "pass --silicon CSV")
    return path


def make_predictor(kind: str, systems_path=None, database_mode="SILICON", cache: EstimatorCache | None = None):
    cache = cache if cache is not None else EstimatorCache(systems_path, database_mode)
    if kind == "static":
        return static_predictor(cache)
    from .serving_predict import serving_predictor

    return serving_predictor(cache)


def select_rows(csv_path: Path, ids_path: str | None):
    """The CSV's rows (those listed in ``ids_path`` when given) and how many listed ids the CSV
    lacks. Raises :class:`InvalidInputError` when there is nothing to validate: a CSV without data
    rows, an id list without ids, or ids none of which is in the CSV."""
    ids = load_ids(ids_path) if ids_path else None
    if ids is not None and not ids:
        raise InvalidInputError(f"--ids {ids_path} lists no row id", "expected one id per line ('#' starts a comment)")
    rows = load_rows(csv_path, ids)
    if not rows:
        if ids is None:
            raise InvalidInputError(f"silicon CSV {csv_path} has no data rows", "it holds a header only")
        example = sorted(ids)[0]
        raise InvalidInputError(f"none of the {len(ids)} ids in --ids {ids_path} is a row of {csv_path}",
                                f"e.g. {example!r} is not in its id column")
    missing = 0 if ids is None else len(ids - {r.id for r in rows})
    return rows, missing


def _nothing_scored(summary: dict, csv_path: Path) -> InvalidInputError:
    """The error of a run in which no row has both a prediction and a measurement."""
    un = summary["unpredicted"]
    reasons = list(un["by_reason"].items())
    shown = "; ".join(f"{n} x {un['example'][reason]}" for reason, n in reasons[:REASONS_IN_ERROR])
    if len(reasons) > REASONS_IN_ERROR:
        shown += f"; {len(reasons) - REASONS_IN_ERROR} more reasons (see --out)"
    if not reasons:
        shown = "no predicted row has a usable measured latency"
    return InvalidInputError(f"no row of {csv_path} could be scored ({summary['predicted']} of {summary['rows']} predicted)",
                             shown)


def headline(label: str, summary: dict) -> str:
    """One line: a score's median and mean TTFT / TPOT APE over its scored rows."""

    def pct(x):
        return "n/a" if x is None else f"{100 * x:.1f}%"

    return (f"{label}: TTFT median APE {pct(summary.get('ttft_median_ape'))} (mean {pct(summary.get('ttft_mape'))}, "
            f"{summary.get('ttft_n', 0)} rows); TPOT median APE {pct(summary.get('tpot_median_ape'))} "
            f"(mean {pct(summary.get('tpot_mape'))}, {summary.get('tpot_n', 0)} rows)")


def run_validate(a) -> int:
    # Flags first, as the other commands check them: an unknown --database-mode or a
    # --systems-path without a pack would otherwise fail every row one by one (each reported as
    # not predictable) and the run would end "0/N rows predicted" with exit code 0.
    database_mode = DatabaseMode.parse(a.database_mode)
    by = tuple(getattr(a, "by", None) or ()) or DEFAULT_GROUPS
    check_groupings(by)
    worst = getattr(a, "worst", WORST_CONSOLE_N)
    if worst is None or worst < 0:
        raise InvalidInputError(f"--worst must be 0 or more, got {worst}", "0 leaves the worst rows out")
    find_pack(a.systems_path)
    csv_path = Path(a.silicon) if a.silicon else default_silicon_csv(a.systems_path)
    rows, ids_missing = select_rows(csv_path, a.ids)
    if a.out:
        prepare_out_dir(a.out)  # a bad --out fails now, not after every row was predicted
    model = "static" if a.static else "serving"
    t0 = time.perf_counter()
    runs = {}
    with RowProgress(getattr(a, "progress", None) or "auto") as bar:
        for mode, book in (("recipes", None), ("defaults_only", RecipeBook.empty())):
            cache = EstimatorCache(a.systems_path, database_mode, recipes=book)
            predictor = make_predictor(model, cache=cache)

            def step(done, total, label, mode=mode):
                # each pass counts the rows anew, its label saying which score it is
                bar.update(done, total, f"{mode.replace('_', ' ')}: {label}")

            results = run_grouped(rows, predictor, release=cache.release, progress=step)
            runs[mode] = (results, cache, getattr(predictor, "commands", {}))
    elapsed = time.perf_counter() - t0
    results, cache, commands = runs["recipes"]
    defaults = runs["defaults_only"][0]
    summary = summarize(results, by)
    summary["defaults_only"] = summarize(defaults, by)
    summary["seconds"] = round(elapsed, 2)
    summary["model"] = model
    if a.ids:
        summary["ids_not_in_csv"] = ids_missing
    if a.out:
        extra = {}
        for r, d in zip(results, defaults):
            applied = ""
            if r.row.worker is not None and r.error is None:
                w = cache.layout(r.row, r.row.worker) if r.row.mode == "agg" else r.row.worker
                applied = "; ".join(cache.settings(r.row, w.tp, w.attention_dp).recipes)
            extra[r.row.id] = {"defaults_only_ttft_ms": "" if d.ttft_ms is None else repr(d.ttft_ms),
                               "defaults_only_tpot_ms": "" if d.tpot_ms is None else repr(d.tpot_ms),
                               "recipes": applied, "command": commands.get(r.row.id, "")}
        write_all(results, a.out, summary=summary, meta={"csv": str(csv_path), "ids": a.ids, "model": summary["model"]},
                  extra=extra)
    if summary["ttft_n"] == 0 and summary["tpot_n"] == 0:
        raise _nothing_scored(summary, csv_path)
    if a.json:
        print(json.dumps(summary, indent=1))
    else:
        from ..report.console import new_console

        # many columns: at a pipe's or a narrow terminal's default 80 columns rich cuts the
        # numbers short ("192…" for 1924 rows); as `search` does, print wider instead
        new_console(CONSOLE_MIN_WIDTH).print(render_console(summary, by, results=results, worst_n=worst))
        print(headline("with recipes", summary))
        print(headline("defaults only", summary["defaults_only"]))
        tail = f"; {ids_missing} id(s) of --ids not in the CSV" if ids_missing else ""
        print(f"{summary['predicted']}/{summary['rows']} rows predicted in {elapsed:.1f} s{tail}")
    return 0
