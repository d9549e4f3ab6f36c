"""Run a predictor over silicon rows and write the fidelity report.

The per-row outputs (CSV, worst-row tables) name row ids: only feed them rows you
may look at (the dev split), never held-out rows.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infercast.errors import DataFileError, InfercastError
from infercast.validate.metrics import RowResult, summarize
from infercast.validate.row_checks import INPUT_DATA, input_issues
from infercast.validate.silicon import SiliconRow

__all__ = [
    "Predictor",
    "run_validation",
    "write_csv",
    "write_json",
    "write_markdown",
    "write_html",
    "plot_error_vs_concurrency",
    "render_console",
    "write_all",
    "prepare_out_dir",
    "NO_TPOT_NOTE",
    "CSV_COLUMNS",
    "WORST_N",
    "WORST_CONSOLE_N",
]

#: ``predictor(row) -> (ttft_ms, tpot_ms)`` or ``(ttft_ms, tpot_ms, note)``.
Predictor = Callable[[SiliconRow], tuple[Any, ...]]

WORST_N = 20

#: Note of a row whose TPOT is undefined (osl 1), see :func:`run_validation`.
NO_TPOT_NOTE = "osl 1: TPOT undefined, row left out of the TPOT statistics"

CSV_COLUMNS: tuple[str, ...] = (
    "id",
    "mode",
    "backend",
    "backend_version",
    "system",
    "model",
    "isl",
    "osl",
    "concurrency",
    "measured_ttft_ms",
    "predicted_ttft_ms",
    "ttft_ape",
    "ttft_signed_error",
    "measured_tpot_ms",
    "predicted_tpot_ms",
    "tpot_ape",
    "tpot_signed_error",
    "error",
    "note",
    "problems",
)

#: Columns :func:`write_csv` adds after :data:`CSV_COLUMNS` when given ``extra`` (by row id):
#: the defaults-only prediction (no recipe: model, system, backend, version, layout and the
#: checkpoint's own quantisation only), the recipes applied, and the ``infercast`` command line
#: that reproduces the prediction.
EXTRA_COLUMNS: tuple[str, ...] = ("defaults_only_ttft_ms", "defaults_only_tpot_ms", "recipes", "command")


# --------------------------------------------------------------------------- running


def _check_prediction(value: Any, what: str) -> tuple[float | None, str | None]:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None, f"{what} is not a number ({value!r})"
    if not math.isfinite(x) or x <= 0:
        return None, f"{what} is not a finite positive latency ({x!r})"
    return x, None


def run_validation(
    rows: Iterable[SiliconRow],
    predictor: Predictor,
    *,
    progress: Callable[[int, int], None] | None = None,
    check_inputs: bool = True,
) -> list[RowResult]:
    """Call ``predictor`` on every row and collect the outcomes, in row order.

    The predictor returns ``(ttft_ms, tpot_ms)`` or ``(ttft_ms, tpot_ms, note)``. An
    :class:`InfercastError` it raises becomes the row's ``error`` (``"<Class>: <msg>"``)
    and the run goes on; any other exception is a bug and propagates. A returned
    latency that is not a finite positive number is recorded as an
    ``InvalidPrediction`` error so it shows up in the report instead of skewing the
    statistics. ``progress(done, total)`` is called after each row when given.

    ``check_inputs`` (default): a row with a blocking input-data issue (:mod:`.row_checks`: a
    missing or unusable length, model, system, backend, concurrency or worker count, or no usable
    measured latency) is not handed to the predictor; its ``error_kind`` is
    :data:`~.row_checks.INPUT_DATA` and its ``error`` names each column and the value found. Every
    row's issues, blocking or not, are in :attr:`RowResult.issues`.

    Rows with ``osl`` 1 have no TPOT (one output token, no inter-token gap; see
    :attr:`SiliconRow.tpot_defined`): whatever TPOT the predictor returns (typically 0.0) is
    ignored, the row's ``tpot_ms`` is ``None`` and its note says so. The row counts as predicted
    when its TTFT is valid, its TTFT enters the TTFT statistics, and it is left out of the TPOT
    statistics (``tpot_n`` does not count it).
    """
    rows = list(rows)
    total = len(rows)
    out: list[RowResult] = []
    for i, row in enumerate(rows, 1):
        issues = input_issues(row) if check_inputs else []
        blocking = [x for x in issues if x.blocking]
        if blocking:
            out.append(RowResult(row, None, None, error=f"{INPUT_DATA}: " + "; ".join(map(str, blocking)),
                                 error_kind=INPUT_DATA, issues=tuple(issues)))
            if progress is not None:
                progress(i, total)
            continue
        try:
            value = predictor(row)
        except InfercastError as exc:
            out.append(RowResult(row, None, None, error=f"{type(exc).__name__}: {exc}", error_kind=type(exc).__name__,
                                 issues=tuple(issues)))
        else:
            if not isinstance(value, (tuple, list)) or len(value) not in (2, 3):
                raise TypeError(
                    "predictor must return (ttft_ms, tpot_ms) or (ttft_ms, tpot_ms, note); "
                    f"got {value!r} for row {row.id}"
                )
            note = None if len(value) == 2 or value[2] is None else str(value[2])
            ttft, bad_ttft = _check_prediction(value[0], "predicted TTFT")
            if row.tpot_defined:
                tpot, bad_tpot = _check_prediction(value[1], "predicted TPOT")
            else:
                tpot, bad_tpot = None, None
                note = "; ".join(n for n in (note, NO_TPOT_NOTE) if n)
            bad = "; ".join(b for b in (bad_ttft, bad_tpot) if b)
            if bad:
                out.append(RowResult(row, None, None, error=f"InvalidPrediction: {bad}", note=note,
                                     error_kind="InvalidPrediction", issues=tuple(issues)))
            else:
                out.append(RowResult(row, ttft, tpot, note=note, issues=tuple(issues)))
        if progress is not None:
            progress(i, total)
    return out


# --------------------------------------------------------------------------- formatting


def _pct(x: float | None, signed: bool = False) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    return f"{x * 100:+.1f}%" if signed else f"{x * 100:.1f}%"


def _ratio(x: float | None) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.3f}"


def _ms(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x:.4g}" if x < 100 else f"{x:,.0f}"


def _num(x: Any) -> str:
    return "–" if x is None else str(x)


def _csv_float(x: float | None) -> str:
    return "" if x is None else repr(float(x))


@dataclass
class _Table:
    headers: list[str]
    rows: list[list[str]]


@dataclass
class _Section:
    title: str
    text: list[str] = field(default_factory=list)
    tables: list[_Table] = field(default_factory=list)


_GROUP_HEADERS = [
    "rows",
    "coverage",
    "TTFT median APE",
    "TTFT within 20%",
    "TTFT bias",
    "TTFT GMR",
    "TPOT median APE",
    "TPOT within 20%",
    "TPOT bias",
    "TPOT GMR",
]


def _group_cells(block: Mapping[str, Any]) -> list[str]:
    return [
        f"{block['predicted']}/{block['rows']}",
        _pct(block["coverage"]),
        _pct(block["ttft_median_ape"]),
        _pct(block["ttft_within20"]),
        _pct(block["ttft_bias"], signed=True),
        _ratio(block["ttft_gmr"]),
        _pct(block["tpot_median_ape"]),
        _pct(block["tpot_within20"]),
        _pct(block["tpot_bias"], signed=True),
        _ratio(block["tpot_gmr"]),
    ]


def _overall_table(summary: Mapping[str, Any]) -> _Table:
    return _Table(
        ["statistic", "TTFT", "TPOT"],
        [
            ["rows with a measurement and a prediction", _num(summary["ttft_n"]), _num(summary["tpot_n"])],
            ["median APE", _pct(summary["ttft_median_ape"]), _pct(summary["tpot_median_ape"])],
            ["mean APE (MAPE)", _pct(summary["ttft_mape"]), _pct(summary["tpot_mape"])],
            ["within 20%", _pct(summary["ttft_within20"]), _pct(summary["tpot_within20"])],
            [
                "bias (median signed error)",
                _pct(summary["ttft_bias"], signed=True),
                _pct(summary["tpot_bias"], signed=True),
            ],
            ["geometric-mean ratio pred/meas", _ratio(summary["ttft_gmr"]), _ratio(summary["tpot_gmr"])],
        ],
    )


def _worst(results: Sequence[RowResult], metric: str, n: int) -> _Table:
    scored = [(getattr(r, f"{metric}_ape"), r) for r in results]
    ranked = sorted(((a, r) for a, r in scored if a is not None), key=lambda t: (-t[0], t[1].row.id))[:n]
    rows = []
    for _, r in ranked:
        meas = getattr(r.row, f"measured_{metric}_ms")
        pred = getattr(r, f"{metric}_ms")
        rows.append(
            [
                r.row.id,
                r.row.mode,
                r.row.backend,
                r.row.system,
                r.row.model,
                f"{_num(r.row.isl)}x{_num(r.row.osl)}",
                _num(r.row.concurrency),
                _ms(meas),
                _ms(pred),
                _pct(getattr(r, f"{metric}_signed"), signed=True),
                r.note or "",
            ]
        )
    return _Table(
        ["id", "mode", "backend", "system", "model", "isl x osl", "conc", "measured ms", "predicted ms", "error", "note"],
        rows,
    )


def _error_groups(
    results: Sequence[RowResult], examples: int = 3, max_reasons: int = 50
) -> tuple[_Table, _Table]:
    by_reason: dict[str, list[str]] = {}
    by_kind: dict[str, int] = {}
    for r in results:
        if r.error is None:
            continue
        by_reason.setdefault(r.error, []).append(r.row.id)
        kind = r.error_kind or r.error.split(":", 1)[0]
        by_kind[kind] = by_kind.get(kind, 0) + 1
    reasons = sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    body = [[str(len(ids)), reason, ", ".join(ids[:examples])] for reason, ids in reasons[:max_reasons]]
    if len(reasons) > max_reasons:
        rest = reasons[max_reasons:]
        body.append([str(sum(len(ids) for _, ids in rest)), f"... {len(rest)} more distinct reasons (see the CSV)", ""])
    reason_table = _Table(["rows", "reason", "example ids"], body)
    kind_table = _Table(
        ["rows", "error class"],
        [[str(c), k] for k, c in sorted(by_kind.items(), key=lambda kv: (-kv[1], kv[0]))],
    )
    return reason_table, kind_table


def _problem_groups(results: Sequence[RowResult]) -> _Table:
    counts: dict[str, int] = {}
    for r in results:
        for p in r.row.problems:
            # Group by the column and the kind of issue, not by the offending value.
            head = p.split(";", 1)[0].split("(", 1)[0].split("'", 1)[0]
            key = re.sub(r"\d+", "N", head).rstrip(" ;:")
            counts[key] = counts.get(key, 0) + 1
    return _Table(["rows", "issue"], [[str(c), k] for k, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))])


def _sections(
    summary: Mapping[str, Any],
    results: Sequence[RowResult],
    meta: Mapping[str, Any] | None,
    worst_n: int,
) -> list[_Section]:
    secs: list[_Section] = []
    head = _Section("Overall")
    rows, pred = summary["rows"], summary["predicted"]
    head.text.append(
        f"{rows} rows, {pred} predicted (coverage {_pct(summary['coverage'])}). "
        "APE = |predicted - measured| / measured; bias < 0 means under-prediction; "
        "GMR = geometric-mean ratio predicted/measured."
    )
    unmeasured = sum(1 for r in results if not r.row.measured)
    if unmeasured:
        head.text.append(f"{unmeasured} row(s) lack a usable measurement and are left out of the error statistics.")
    if meta:
        head.tables.append(_Table(["setting", "value"], [[str(k), str(v)] for k, v in meta.items()]))
    head.tables.append(_overall_table(summary))
    secs.append(head)

    for attr, groups in (summary.get("by") or {}).items():
        sec = _Section(f"By {attr}")
        sec.tables.append(_Table([attr, *_GROUP_HEADERS], [[label, *_group_cells(b)] for label, b in groups.items()]))
        secs.append(sec)

    for metric in ("ttft", "tpot"):
        sec = _Section(f"Worst {worst_n} rows by {metric.upper()} APE")
        table = _worst(results, metric, worst_n)
        if table.rows:
            sec.tables.append(table)
        else:
            sec.text.append("No row has both a prediction and a measurement.")
        secs.append(sec)

    sec = _Section("Unpredictable rows")
    failed = sum(1 for r in results if r.error is not None)
    if failed:
        reason_table, kind_table = _error_groups(results)
        sec.text.append(f"{failed} row(s) could not be predicted, grouped by error class and by reason.")
        sec.tables.extend([kind_table, reason_table])
    else:
        sec.text.append("Every row was predicted.")
    secs.append(sec)

    problems = _problem_groups(results)
    if problems.rows:
        sec = _Section("Input data issues")
        sec.text.append("Issues found while parsing the silicon CSV (rows load anyway; see the per-row CSV).")
        sec.tables.append(problems)
        secs.append(sec)
    return secs


# --------------------------------------------------------------------------- writers


def write_csv(results: Iterable[RowResult], path: str | Path,
              extra: Mapping[str, Mapping[str, str]] | None = None) -> Path:
    """Per-row results, one line per row (see :data:`CSV_COLUMNS`; with ``extra``, row id ->
    values of :data:`EXTRA_COLUMNS`, those columns too)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_COLUMNS + (EXTRA_COLUMNS if extra is not None else ()))
        for r in results:
            row = r.row
            w.writerow(
                [
                    row.id,
                    row.mode,
                    row.backend,
                    row.backend_version or "",
                    row.system,
                    row.model,
                    _num(row.isl) if row.isl is not None else "",
                    _num(row.osl) if row.osl is not None else "",
                    row.concurrency if row.concurrency is not None else "",
                    _csv_float(row.measured_ttft_ms),
                    _csv_float(r.ttft_ms),
                    _csv_float(r.ttft_ape),
                    _csv_float(r.ttft_signed),
                    _csv_float(row.measured_tpot_ms),
                    _csv_float(r.tpot_ms),
                    _csv_float(r.tpot_ape),
                    _csv_float(r.tpot_signed),
                    r.error or "",
                    r.note or "",
                    "; ".join(row.problems),
                ]
                + ([str((extra.get(row.id) or {}).get(c, "")) for c in EXTRA_COLUMNS] if extra is not None else [])
            )
    return path


def write_json(summary: Mapping[str, Any], path: str | Path) -> Path:
    """The summary dict as JSON (``None`` -> ``null``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return path


def _md_cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def _md_table(t: _Table) -> list[str]:
    out = ["| " + " | ".join(_md_cell(h) for h in t.headers) + " |", "|" + "---|" * len(t.headers)]
    out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in t.rows]
    return out


def write_markdown(
    summary: Mapping[str, Any],
    results: Sequence[RowResult],
    path: str | Path,
    *,
    title: str = "infercast fidelity report",
    meta: Mapping[str, Any] | None = None,
    plot_path: str | Path | None = None,
    worst_n: int = WORST_N,
) -> Path:
    """Markdown report: overall, breakdowns, worst rows, unpredictable rows, data issues.

    ``plot_path``: a PNG to link (relative to the report's folder when possible).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"# {title}", ""]
    for sec in _sections(summary, results, meta, worst_n):
        lines += [f"## {sec.title}", ""]
        for t in sec.text:
            lines += [t, ""]
        for tab in sec.tables:
            lines += _md_table(tab) + [""]
        if sec.title == "Overall" and plot_path is not None and Path(plot_path).exists():
            rel = _relative(Path(plot_path), path.parent)
            lines += [f"![signed error vs concurrency]({rel})", ""]
        elif sec.title == "Overall":
            lines += ["_Plot not available (matplotlib is not installed or nothing to plot)._", ""]
    path.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    return path


def _relative(target: Path, base: Path) -> str:
    try:
        return target.resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        return target.as_posix()


_CSS = (
    "body{font-family:system-ui,sans-serif;margin:2em;max-width:110em}"
    "table{border-collapse:collapse;margin:0.5em 0 1.5em}"
    "th,td{border:1px solid #bbb;padding:2px 8px;text-align:left;font-size:13px}"
    "th{background:#eee}td.n{text-align:right}"
)


def write_html(
    summary: Mapping[str, Any],
    results: Sequence[RowResult],
    path: str | Path,
    *,
    title: str = "infercast fidelity report",
    meta: Mapping[str, Any] | None = None,
    plot_path: str | Path | None = None,
    worst_n: int = WORST_N,
) -> Path:
    """Self-contained HTML with the same content as :func:`write_markdown`.

    The plot PNG at ``plot_path`` is embedded as base64 when it exists.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    e = html.escape
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{e(title)}</h1>",
    ]
    for sec in _sections(summary, results, meta, worst_n):
        parts.append(f"<h2>{e(sec.title)}</h2>")
        parts += [f"<p>{e(t)}</p>" for t in sec.text]
        for tab in sec.tables:
            parts.append("<table><thead><tr>" + "".join(f"<th>{e(h)}</th>" for h in tab.headers) + "</tr></thead><tbody>")
            for row in tab.rows:
                parts.append("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>")
            parts.append("</tbody></table>")
        if sec.title == "Overall":
            if plot_path is not None and Path(plot_path).exists():
                data = base64.b64encode(Path(plot_path).read_bytes()).decode("ascii")
                parts.append(f'<p><img alt="signed error vs concurrency" src="data:image/png;base64,{data}"></p>')
            else:
                parts.append("<p><em>Plot not available (matplotlib is not installed or nothing to plot).</em></p>")
    parts.append("</body></html>")
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")
    return path


_PLOT_CLIP = 3.0  # signed errors above +300% are drawn at the top edge


def plot_error_vs_concurrency(results: Sequence[RowResult], path: str | Path) -> Path | None:
    """Scatter of signed error (%) against concurrency (log x), TTFT and TPOT panels.

    Returns the PNG path, or ``None`` when matplotlib is not installed or no row has
    a prediction, a measurement and a concurrency.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    points: dict[str, dict[str, tuple[list[float], list[float]]]] = {"ttft": {}, "tpot": {}}
    for r in results:
        if r.row.concurrency is None:
            continue
        for metric in ("ttft", "tpot"):
            s = getattr(r, f"{metric}_signed")
            if s is None:
                continue
            xs, ys = points[metric].setdefault(r.row.mode, ([], []))
            xs.append(float(r.row.concurrency))
            ys.append(s)
    if not any(points[m] for m in points):
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(12, 4.5), dpi=110)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharey=True)
    colors = {"agg": "tab:blue", "disagg": "tab:orange"}
    for ax, metric in zip(axes, ("ttft", "tpot")):
        for mode, (xs, ys) in sorted(points[metric].items()):
            inside = [(x, y * 100) for x, y in zip(xs, ys) if y <= _PLOT_CLIP]
            above = [(x, _PLOT_CLIP * 100) for x, y in zip(xs, ys) if y > _PLOT_CLIP]
            c = colors.get(mode, "tab:gray")
            if inside:
                ax.scatter(*zip(*inside), s=10, alpha=0.5, color=c, label=f"{mode} ({len(xs)})")
            if above:
                ax.scatter(*zip(*above), s=18, marker="^", color=c, alpha=0.8)
        ax.axhline(0, color="black", lw=0.8)
        for lim in (-20, 20):
            ax.axhline(lim, color="gray", lw=0.6, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_ylim(-100, _PLOT_CLIP * 100 + 10)
        ax.set_xlabel("benchmark concurrency")
        ax.set_title(f"{metric.upper()} signed error (predicted - measured) / measured")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # no legend on a panel with no labelled points
            ax.legend(loc="upper left", fontsize=8)
    axes[0].set_ylabel(f"signed error % (clipped at +{_PLOT_CLIP * 100:.0f}%, triangles)")
    fig.tight_layout()
    fig.savefig(path, format="png")
    return path


#: worst rows the console lists (``infercast validate --worst``)
WORST_CONSOLE_N = 10
#: reasons the console lists for unpredicted rows and for input-data issues (the rest summed)
REASONS_CONSOLE_N = 10


def _console_worst(results: Sequence[RowResult], n: int) -> tuple[list[str], list[list[str]]]:
    """The ``n`` rows with the largest TTFT APE: who they are, predicted vs measured."""
    ranked = sorted((r for r in results if r.ttft_ape is not None), key=lambda r: (-r.ttft_ape, r.row.id))[:n]
    headers = ["id", "model", "system", "backend", "conc", "TTFT meas", "TTFT pred", "TTFT err", "TPOT meas",
               "TPOT pred", "TPOT err"]
    body = [[r.row.id, r.row.model, r.row.system, r.row.backend, _num(r.row.concurrency),
             _ms(r.row.measured_ttft_ms), _ms(r.ttft_ms), _pct(r.ttft_signed, signed=True),
             _ms(r.row.measured_tpot_ms), _ms(r.scored_tpot_ms), _pct(r.tpot_signed, signed=True)] for r in ranked]
    return headers, body


def _console_reasons(counts: Mapping[str, int], n: int) -> list[list[str]]:
    items = list(counts.items())
    body = [[str(c), reason] for reason, c in items[:n]]
    if len(items) > n:
        rest = items[n:]
        body.append([str(sum(c for _, c in rest)), f"... {len(rest)} more reasons (--out writes them all)"])
    return body


def render_console(
    summary: Mapping[str, Any],
    groups: Sequence[str] = ("mode", "backend", "system", "model"),
    *,
    results: Sequence[RowResult] | None = None,
    worst_n: int = WORST_CONSOLE_N,
) -> Any:
    """The console report: a table of the overall and per-group statistics (one section per
    entry of ``groups``), then, with ``results``, the ``worst_n`` rows by TTFT APE (id, model,
    system, backend, measured vs predicted), and from ``summary`` the unpredicted rows and the
    input-data issues counted by reason (:func:`~infercast.validate.metrics.unpredicted_counts`).

    A rich renderable (a ``Group`` of tables); a plain string when rich is not importable.
    """
    headers = ["scope", *_GROUP_HEADERS]
    body: list[tuple[list[str], bool]] = [(["all", *_group_cells(summary)], True)]
    by = summary.get("by") or {}
    for attr in groups:
        first = True
        for label, block in (by.get(attr) or {}).items():
            body.append(([f"{attr}={label}", *_group_cells(block)], first))
            first = False
    tables: list[tuple[str, list[str], list[tuple[list[str], bool]]]] = [("fidelity vs measured silicon", headers, body)]
    if results is not None and worst_n > 0:
        wh, wb = _console_worst(results, worst_n)
        if wb:
            tables.append((f"worst {len(wb)} rows by TTFT APE (ms; err = (predicted - measured) / measured)", wh,
                           [(r, False) for r in wb]))
    un = summary.get("unpredicted") or {}
    if un.get("rows"):
        title = (f"{un['rows']} rows not predicted ({un.get('input_data', 0)} input-data issues, "
                 f"{un.get('prediction_errors', 0)} prediction errors), by reason")
        tables.append((title, ["rows", "reason"], [(r, False) for r in _console_reasons(un["by_reason"], REASONS_CONSOLE_N)]))
    issues = summary.get("input_issues") or {}
    if issues.get("rows"):
        title = f"input-data issues of {issues['rows']} rows, by column"
        tables.append((title, ["rows", "issue"], [(r, False) for r in _console_reasons(issues["by_reason"], REASONS_CONSOLE_N)]))
    try:
        from rich.console import Group
        from rich.table import Table
    except ImportError:
        return "\n\n".join(_plain_table(title, h, [r for r, _ in b]) for title, h, b in tables)
    out = []
    for n, (title, h, b) in enumerate(tables):
        table = Table(title=title)
        for i, name in enumerate(h):
            number = n == 0 and i > 0 or (n > 0 and (name in ("rows", "conc") or name.endswith(("meas", "pred", "err"))))
            # whole: the scope column (rich would wrap "backend=sglang" mid-word or cut a model id)
            # and the numbers; ids, models and reasons fold where the width runs out
            whole = i == 0 if n == 0 else (number or name in ("system", "backend"))
            widest = max((len(cells[i]) for cells, _ in b), default=0)
            table.add_column(name, justify="right" if number else "left", no_wrap=whole, overflow="fold",
                             min_width=min(widest, 72) if whole else min(widest, 28))
        for i, (cells, new_section) in enumerate(b):
            if new_section and i > 0:
                table.add_section()
            table.add_row(*cells)
        out.append(table)
    return Group(*out)


def _plain_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([title, fmt.format(*headers), *(fmt.format(*r) for r in rows)])


def prepare_out_dir(out_dir: str | Path) -> Path:
    """Create the report directory ``out_dir`` (and its parents) if needed and return it.

    Raises :class:`DataFileError` naming the path when it exists but is not a directory, cannot
    be created, or is not writable. Call it before a long prediction run so a bad ``--out`` fails
    at once rather than after every row was predicted.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise DataFileError(f"cannot write the report to {out}", "it exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataFileError(f"cannot create the report directory {out}", exc.strerror or str(exc)) from exc
    if not os.access(out, os.W_OK | os.X_OK):
        raise DataFileError(f"cannot write the report to {out}", "the directory is not writable")
    return out


def write_all(
    results: Sequence[RowResult],
    out_dir: str | Path,
    *,
    summary: Mapping[str, Any] | None = None,
    by: Sequence[str] = ("mode", "backend", "system", "model"),
    meta: Mapping[str, Any] | None = None,
    title: str = "infercast fidelity report",
    extra: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, Path]:
    """Write ``results.csv`` (with ``extra``'s columns, see :func:`write_csv`), ``summary.json``,
    ``report.md``, ``report.html`` and, when matplotlib is available, ``error_vs_concurrency.png``
    into ``out_dir``.

    Returns the written paths keyed ``csv``, ``json``, ``markdown``, ``html``, ``plot``.
    Raises :class:`DataFileError` when ``out_dir`` is not a usable directory (see
    :func:`prepare_out_dir`) or a file in it cannot be written.
    """
    out = prepare_out_dir(out_dir)
    if summary is None:
        summary = summarize(results, by=by)
    written: dict[str, Path] = {}
    target = out
    try:
        target = out / "error_vs_concurrency.png"
        plot = plot_error_vs_concurrency(results, target)
        if plot is not None:
            written["plot"] = plot
        target = out / "results.csv"
        written["csv"] = write_csv(results, target, extra)
        target = out / "summary.json"
        written["json"] = write_json(summary, target)
        target = out / "report.md"
        written["markdown"] = write_markdown(summary, results, target, title=title, meta=meta, plot_path=plot)
        target = out / "report.html"
        written["html"] = write_html(summary, results, target, title=title, meta=meta, plot_path=plot)
    except OSError as exc:
        raise DataFileError(f"cannot write {target}", exc.strerror or str(exc)) from exc
    return written
