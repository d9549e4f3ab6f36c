"""Fidelity validation against measured serving benchmarks (``silicon_sample.csv``).

Typical use::

    rows = load_rows(csv_path, load_ids(ids_path))
    results = run_validation(rows, predictor)      # predictor(row) -> (ttft_ms, tpot_ms)
    summary = summarize(results)
    write_all(results, out_dir, summary=summary)
"""

from infercast.validate.metrics import (
    RowResult,
    ape,
    error_stats,
    signed_error,
    summarize,
)
from infercast.validate.report import (
    plot_error_vs_concurrency,
    render_console,
    run_validation,
    write_all,
    write_csv,
    write_html,
    write_json,
    write_markdown,
)
from infercast.validate.silicon import SiliconRow, WorkerSpec, load_ids, load_rows

__all__ = [
    "SiliconRow",
    "WorkerSpec",
    "load_rows",
    "load_ids",
    "RowResult",
    "error_stats",
    "ape",
    "signed_error",
    "summarize",
    "run_validation",
    "write_csv",
    "write_json",
    "write_markdown",
    "write_html",
    "write_all",
    "plot_error_vs_concurrency",
    "render_console",
]
