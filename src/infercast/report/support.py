"""Terminal output of ``infercast support`` and of the support-matrix benchmark (rich): the
support table, CSV, the agreement with the pack's matrix, and a progress bar on stderr."""

from __future__ import annotations

import csv
import io
from collections import Counter
from contextlib import contextmanager

from rich.console import Console
from rich.table import Table

from ..search.support import gpus_text
from .console import _f, _fold, new_console

#: the CSV / table columns of a support row, in order
COLUMNS = ("model", "architecture", "system", "backend", "version", "mode", "supported", "reason", "layout", "gpus",
           "ttft_ms", "tpot_ms")


@contextmanager
def progress_bar(description: str, enabled: bool = True):
    """A ``progress(done, total, label)`` callback drawing a rich bar on stderr (a no-op when not
    ``enabled``, e.g. ``--quiet``); the bar is removed when the block ends."""
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[label]}"), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=None, label="")

        def update(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, label=label)

        yield update


def support_csv(rows, extra: dict[str, list] | None = None) -> str:
    """``rows`` (:class:`~infercast.search.support.SupportRow`) as CSV text with a header;
    ``extra``: further columns, {name: one value per row}."""
    extra = extra or {}
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([*COLUMNS, *extra])
    for i, r in enumerate(rows):
        d = r.to_dict()
        w.writerow(["" if d[c] is None else ("yes" if d[c] is True else "no" if d[c] is False else d[c])
                    for c in COLUMNS] + [vals[i] for vals in extra.values()])
    return buf.getvalue()


def print_support(rows) -> None:
    """The support table, then a count of supported rows and of the reasons for the others."""
    c = new_console(min_width=120)
    t = Table(show_header=True, header_style="bold")
    for col in ("model", "system", "backend", "version", "mode", "supported", "layout / reason"):
        t.add_column(col)
    for r in rows:
        how = (f"{r.layout} ({gpus_text(r.gpus)}): TTFT {_f(r.ttft_ms, '{:.1f}')} ms, TPOT {_f(r.tpot_ms)} ms"
               if r.supported else r.reason)
        t.add_row(r.model, r.system, r.backend, r.version, r.mode,
                  "[green]yes[/green]" if r.supported else "[red]no[/red]", how)
    c.print(_fold(t))
    yes = sum(r.supported for r in rows)
    c.print(f"{yes} of {len(rows)} combinations supported")
    groups = Counter(r.group for r in rows if not r.supported)
    if groups:
        g = Table(show_header=True, header_style="bold", title="why not")
        g.add_column("rows", justify="right")
        g.add_column("reason")
        for reason, n in groups.most_common():
            g.add_row(str(n), reason)
        c.print(_fold(g))


def _pct(a: int, b: int) -> str:
    return f"{a} / {b} ({100.0 * a / b:.1f}%)" if b else "0 / 0"


def print_agreement(agreement, by: tuple[str, ...] = (), fail_sample: int = 10) -> None:
    """Agreement with the pack's matrix: PASS rows answered, PASS rows missed grouped by reason,
    coverage by each matrix field in ``by``, and the non-PASS rows infercast answers (a sample
    with the layout and latencies, to be checked for sense)."""
    c = new_console(min_width=120)
    s = agreement.summary()
    c.print(f"[bold]pack matrix PASS rows answered:[/bold] {_pct(s['pass_answered'], s['pass_rows'])}")
    for attr in by:
        t = Table(show_header=True, header_style="bold", title=f"coverage by {attr}")
        t.add_column(attr)
        t.add_column("answered / PASS rows", justify="right")
        for k, (a, n) in agreement.coverage_by(attr).items():
            t.add_row(k, _pct(a, n))
        c.print(_fold(t))
    if s["pass_missed_by_reason"]:
        t = Table(show_header=True, header_style="bold", title="PASS rows missed, by reason")
        t.add_column("rows", justify="right")
        t.add_column("models", justify="right")
        t.add_column("reason")
        models: dict[str, set] = {}
        for m, r in agreement.passed:
            if not r.supported:
                models.setdefault(r.group, set()).add(m.model)
        for reason, n in s["pass_missed_by_reason"].items():
            t.add_row(str(n), str(len(models[reason])), reason)
        c.print(_fold(t))
    if s["other_rows"]:
        c.print("non-PASS matrix rows: " + ", ".join(f"{st} {n} (infercast answers {s['other_answered'].get(st, 0)})"
                                                     for st, n in sorted(s["other_rows"].items())))
        answered = [(m, r) for m, r in agreement.others if r.supported]
        if answered and fail_sample:
            step = max(1, len(answered) // fail_sample)
            t = Table(show_header=True, header_style="bold",
                      title=f"a sample of the {len(answered)} non-PASS rows infercast answers")
            for col in ("model", "system / backend / version / mode", "matrix", "infercast: layout, TTFT / TPOT ms",
                        "the reference's error"):
                t.add_column(col)
            for m, r in answered[::step][:fail_sample]:
                err = m.error if len(m.error) <= 100 else m.error[:99] + "…"
                t.add_row(m.model, f"{m.system} {m.backend} {m.version} {m.mode}", m.status,
                          f"{r.layout} ({gpus_text(r.gpus)}): {_f(r.ttft_ms, '{:.1f}')} / {_f(r.tpot_ms)}", err)
            c.print(_fold(t))
