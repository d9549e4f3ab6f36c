"""Progress of a long command, on stderr (stdout stays for the report / JSON): ``validate``'s rows,
``search``'s parts (a layout or a decode layout each).

Three modes, chosen by ``--progress`` / ``--quiet`` (default ``"auto"``):

* ``"auto"``: a rich progress bar when stderr is a terminal, shown only once the run has taken
  :data:`SHOW_AFTER_S` seconds (a short run prints nothing); nothing when stderr is a pipe or file;
* ``"on"``: the bar from the first update on a terminal; elsewhere (a log file, a CI job) one plain
  line per :data:`LINE_EVERY` of the total;
* ``"off"``: nothing.

``refresh=False`` draws the bar only when it is updated, with no refresh thread: a command whose
work forks worker processes (``search --jobs``) must not run other threads
(:mod:`infercast.search.parallel`).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["RowProgress", "SHOW_AFTER_S", "LINE_EVERY", "MODES"]

#: seconds a run takes before ``"auto"`` shows its bar
SHOW_AFTER_S = 2.0
#: share of the rows between two plain progress lines (``"on"`` without a terminal)
LINE_EVERY = 0.1
MODES = ("auto", "on", "off")


class RowProgress:
    """Context manager; call :meth:`update` after each item (``done`` of ``total``, ``label`` saying
    what is being done, e.g. the system and backend). ``command``: the command's name on the bar
    and the plain lines; ``unit``: what is counted."""

    def __init__(self, mode: str = "auto", stream: TextIO | None = None, command: str = "validate", unit: str = "rows",
                 refresh: bool = True):
        if mode not in MODES:
            raise ValueError(f"progress mode {mode!r}; expected one of {MODES}")
        self.command, self.unit, self.refresh = command, unit, refresh
        self.stream = stream if stream is not None else sys.stderr
        terminal = bool(getattr(self.stream, "isatty", lambda: False)())
        self.mode = mode
        self.bar = mode != "off" and terminal
        self.lines = mode == "on" and not terminal
        self._t0 = time.perf_counter()
        self._progress = None
        self._task = None
        self._next_line = 0
        self._last = 0

    def __enter__(self) -> RowProgress:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def update(self, done: int, total: int, label: str = "") -> None:
        """``done`` of ``total``; a ``done`` below the last one starts a new pass (``validate``
        predicts its rows twice: with recipes, then defaults only)."""
        if done < self._last:
            self._next_line = 0
        self._last = done
        if self.bar:
            self._update_bar(done, total, label)
        elif self.lines and total and done >= self._next_line:
            elapsed = time.perf_counter() - self._t0
            print(f"infercast {self.command}: {done}/{total} {self.unit} ({100.0 * done / total:.0f}%) in {elapsed:.0f} s"
                  + (f" [{label}]" if label else ""), file=self.stream, flush=True)
            step = max(1, int(total * LINE_EVERY))
            self._next_line = min(total, (done // step + 1) * step)

    def _update_bar(self, done: int, total: int, label: str) -> None:
        if self._progress is None:
            if self.mode == "auto" and time.perf_counter() - self._t0 < SHOW_AFTER_S:
                return
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn(self.command + " {task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn(self.unit),
                TimeElapsedColumn(), TimeRemainingColumn(), console=Console(file=self.stream), transient=True,
                auto_refresh=self.refresh,
            )
            self._progress.start()
            self._task = self._progress.add_task(label, total=total, completed=done)
        self._progress.update(self._task, completed=done, total=total, description=label)
        if not self.refresh:
            self._progress.refresh()
