"""Input-data checks of silicon rows: which rows cannot be predicted or scored, and why.

A row is an *input-data issue* when the CSV does not give what a prediction or its score needs:
the backend, model or system; the input / output lengths (missing, not a number, zero); the
benchmark concurrency; the prefill and decode worker counts of a disaggregated row; or any usable
measured latency (TTFT, and TPOT where the row defines one). Such a row is not handed to a
predictor (:func:`infercast.validate.report.run_validation`) and is counted by reason. A row
with one usable measured latency of two is predicted and scored on that one; its unusable
measurement is still reported as an issue.

Every issue names the CSV column, what is wrong and the value found (never a bare "None").
"""

from __future__ import annotations

from dataclasses import dataclass

from .silicon import SiliconRow

__all__ = ["INPUT_DATA", "InputIssue", "input_issues", "blocking_issues"]

#: ``RowResult.error_kind`` of a row left unpredicted for an input-data issue
INPUT_DATA = "InputData"


@dataclass(frozen=True)
class InputIssue:
    """One unusable value of a row: its CSV ``column`` (or columns), the ``problem`` and the raw
    ``value`` found (``""`` for an empty cell). ``blocking``: the row cannot be predicted or
    scored because of it."""

    column: str
    problem: str
    value: str = ""
    blocking: bool = True

    @property
    def reason(self) -> str:
        """The issue without the row's value, for counting rows by reason."""
        return f"{self.column}: {self.problem}"

    def __str__(self) -> str:
        if self.value == "":
            return f"{self.reason} (empty cell)" if self.problem == "missing value" else self.reason
        return f"{self.reason} ({self.value!r})"


def _value_issue(row: SiliconRow, column: str, blocking: bool = True) -> InputIssue:
    """The reader's account of why ``column`` has no usable value."""
    bad = row.bad_value(column)
    if bad is None:
        return InputIssue(column, "missing value", "", blocking)
    problem, raw = bad
    return InputIssue(column, problem, "" if problem == "missing value" and raw.lower() in ("", "none", "null") else raw,
                      blocking)


def input_issues(row: SiliconRow) -> list[InputIssue]:
    """Every input-data issue of ``row`` (module docstring), blocking ones first."""
    out: list[InputIssue] = []
    for column, value in (("backend", row.backend), ("model_path", row.model), ("system", row.system)):
        if not value:
            out.append(_value_issue(row, column))
    for column, value in (("isl", row.isl), ("osl", row.osl)):
        if value is None:
            out.append(_value_issue(row, column))
        elif value == 0:
            out.append(InputIssue(column, "zero", "0"))
    if row.concurrency is None:
        out.append(InputIssue("concurrency", "not in silicon_data_source (silicon_concurrency=N), the id (_c<N>_) "
                                             "or the batch columns"))
    if row.mode == "disagg":
        lacking = [c for c, v in (("prefill_num_workers", row.prefill_workers), ("decode_num_workers", row.decode_workers))
                   if v is None]
        if lacking:
            found = [bad[1] for bad in map(row.bad_value, lacking) if bad is not None and bad[1]]
            out.append(InputIssue(" and ".join(lacking), "missing value (a disaggregated row needs both worker counts)",
                                  ", ".join(found)))
    ttft_ok = row.measured_ttft_ms is not None
    tpot_ok = row.measured_tpot_ms is not None or not row.tpot_defined
    scorable = ttft_ok or (row.measured_tpot_ms is not None and row.tpot_defined)
    if not ttft_ok:
        out.append(_value_issue(row, "silicon_ttft_ms", blocking=not scorable))
    if not tpot_ok:
        out.append(_value_issue(row, "silicon_tpot_ms", blocking=not scorable))
    return sorted(out, key=lambda i: not i.blocking)


def blocking_issues(row: SiliconRow) -> list[InputIssue]:
    """The issues that keep ``row`` from being predicted or scored (empty: predict it)."""
    return [i for i in input_issues(row) if i.blocking]
