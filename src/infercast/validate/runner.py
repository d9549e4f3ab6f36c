"""Predict many silicon rows with bounded memory: the rows of one system and backend at a time.

Every estimator of a system and backend shares that pair's perf tables and the curves built
from them (:meth:`infercast.ops.base.OpDB.shared`); kept for the whole CSV they came to 2.2 GB
(5,221 rows). Predicting the rows group by group, and releasing the group's estimators and tables
before the next (``release``), keeps only one pair's data in memory; a group's rows still share
everything they have in common. Results come back in the rows' order. Predictions do not depend
on the order: every cache is keyed by what it depends on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import groupby

from .metrics import RowResult
from .report import Predictor, run_validation
from .silicon import SiliconRow

__all__ = ["group_of", "run_grouped"]


def group_of(row: SiliconRow) -> tuple[str, str]:
    """The rows that share perf data: one system and backend."""
    return (row.system or "", row.backend or "")


def run_grouped(
    rows: Sequence[SiliconRow],
    predictor: Predictor,
    *,
    release: Callable[[], None] | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    key: Callable[[SiliconRow], tuple] = group_of,
) -> list[RowResult]:
    """:func:`~infercast.validate.report.run_validation` over ``rows``, one ``key`` group at a
    time (groups in sorted order), calling ``release()`` after each group; results in the order
    of ``rows``. ``progress(done, total, label)`` after each row, ``label`` naming the group."""
    rows = list(rows)
    total = len(rows)
    order = sorted(range(total), key=lambda i: key(rows[i]))
    out: list[RowResult | None] = [None] * total
    done = 0
    for group, members in groupby(order, key=lambda i: key(rows[i])):
        members = list(members)
        label = " ".join(str(g) for g in group if g)
        start = done

        def step(i: int, _n: int, start=start, label=label) -> None:
            if progress is not None:
                progress(start + i, total, label)

        try:
            results = run_validation([rows[i] for i in members], predictor, progress=step)
        finally:
            if release is not None:
                release()
        for i, r in zip(members, results):
            out[i] = r
        done += len(members)
    return [r for r in out if r is not None]
