"""Error statistics of predicted against measured latencies.

All ratios are fractions (0.2 = 20%). ``APE = |pred - meas| / meas``; the signed
relative error is ``(pred - meas) / meas`` (negative = under-prediction). A statistic
with no data is ``None`` so summaries serialise to JSON as-is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from infercast.errors import InvalidInputError
from infercast.validate.silicon import SiliconRow

__all__ = [
    "RowResult",
    "WITHIN",
    "STAT_KEYS",
    "SUMMARY_KEYS",
    "error_stats",
    "ape",
    "signed_error",
    "summarize",
    "GROUPABLE",
    "DEFAULT_GROUPS",
    "check_groupings",
    "unpredicted_counts",
]

#: Threshold of the "within" share (APE <= WITHIN counts as a hit).
WITHIN = 0.20
_EPS = 1e-12  # so that exactly 20% off, computed in floating point, still counts

#: Keys returned by :func:`error_stats`.
STAT_KEYS: tuple[str, ...] = ("n", "median_ape", "mape", "within20", "bias", "gmr")

#: Keys of every (overall or group) summary block.
SUMMARY_KEYS: tuple[str, ...] = (
    "rows",
    "predicted",
    "coverage",
    "ttft_n",
    "tpot_n",
    "ttft_median_ape",
    "tpot_median_ape",
    "ttft_mape",
    "tpot_mape",
    "ttft_within20",
    "tpot_within20",
    "ttft_bias",
    "tpot_bias",
    "ttft_gmr",
    "tpot_gmr",
)


@dataclass(frozen=True)
class RowResult:
    """The outcome of predicting one silicon row.

    ``ttft_ms`` / ``tpot_ms`` are ``None`` when the row could not be predicted; then
    ``error`` holds the reason (``"<ErrorClass>: <message>"``) and ``error_kind`` the
    error class name. ``note`` is free text from the predictor (e.g. a fallback it used).
    ``issues``: the row's input-data issues (:class:`~infercast.validate.row_checks.InputIssue`);
    a row left unpredicted for them has ``error_kind`` ``"InputData"``.

    A row whose TPOT is undefined (``osl`` 1, see :attr:`SiliconRow.tpot_defined`) is
    predicted with a TTFT alone: ``tpot_ms`` is ``None`` (any value given is ignored), its
    TTFT enters the TTFT statistics and it is left out of the TPOT statistics.
    """

    row: SiliconRow
    ttft_ms: float | None
    tpot_ms: float | None
    error: str | None = None
    note: str | None = None
    error_kind: str | None = None
    issues: tuple = ()

    @property
    def predicted(self) -> bool:
        if self.error is not None or self.ttft_ms is None:
            return False
        return self.tpot_ms is not None or not self.row.tpot_defined

    @property
    def scored_tpot_ms(self) -> float | None:
        """The predicted TPOT that enters the statistics (``None`` where TPOT is undefined)."""
        return self.tpot_ms if self.row.tpot_defined else None

    @property
    def ttft_ape(self) -> float | None:
        return _row_ape(self.ttft_ms, self.row.measured_ttft_ms)

    @property
    def tpot_ape(self) -> float | None:
        return _row_ape(self.scored_tpot_ms, self.row.measured_tpot_ms)

    @property
    def ttft_signed(self) -> float | None:
        return _row_signed(self.ttft_ms, self.row.measured_ttft_ms)

    @property
    def tpot_signed(self) -> float | None:
        return _row_signed(self.scored_tpot_ms, self.row.measured_tpot_ms)


def _row_signed(pred: float | None, meas: float | None) -> float | None:
    if pred is None or meas is None or not np.isfinite(pred) or not np.isfinite(meas) or meas <= 0:
        return None
    return (pred - meas) / meas


def _row_ape(pred: float | None, meas: float | None) -> float | None:
    s = _row_signed(pred, meas)
    return None if s is None else abs(s)


# --------------------------------------------------------------------------- arrays


def _as_float_array(values: Iterable[float | None] | np.ndarray) -> np.ndarray:
    if isinstance(values, np.ndarray):
        return values.astype(float, copy=False)
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def _valid(pred: np.ndarray, meas: np.ndarray) -> np.ndarray:
    if pred.shape != meas.shape:
        raise InvalidInputError(
            "predicted and measured arrays differ in shape", f"{pred.shape} vs {meas.shape}"
        )
    with np.errstate(invalid="ignore"):
        return np.isfinite(pred) & np.isfinite(meas) & (meas > 0)


def signed_error(pred: Any, meas: Any) -> np.ndarray:
    """``(pred - meas) / meas`` element-wise; NaN where either side is missing."""
    p, m = _as_float_array(pred), _as_float_array(meas)
    ok = _valid(p, m)
    out = np.full(p.shape, np.nan)
    out[ok] = (p[ok] - m[ok]) / m[ok]
    return out


def ape(pred: Any, meas: Any) -> np.ndarray:
    """Absolute percentage error as a fraction, element-wise; NaN where missing."""
    return np.abs(signed_error(pred, meas))


def _f(x: Any) -> float | None:
    x = float(x)
    return x if np.isfinite(x) else None


def error_stats(pred: Any, meas: Any) -> dict[str, Any]:
    """Statistics over the pairs where both values are finite and ``meas > 0``.

    Returns ``n`` (pairs used), ``median_ape``, ``mape`` (mean APE), ``within20``
    (share with APE <= 20%), ``bias`` (median signed relative error) and ``gmr``
    (geometric-mean ratio pred/meas, over the pairs with ``pred > 0``).
    """
    p, m = _as_float_array(pred), _as_float_array(meas)
    ok = _valid(p, m)
    n = int(ok.sum())
    if n == 0:
        return {"n": 0, "median_ape": None, "mape": None, "within20": None, "bias": None, "gmr": None}
    pv, mv = p[ok], m[ok]
    signed = (pv - mv) / mv
    absolute = np.abs(signed)
    pos = pv > 0
    gmr = _f(np.exp(np.mean(np.log(pv[pos] / mv[pos])))) if pos.any() else None
    return {
        "n": n,
        "median_ape": _f(np.median(absolute)),
        "mape": _f(np.mean(absolute)),
        "within20": _f(np.mean(absolute <= WITHIN + _EPS)),
        "bias": _f(np.median(signed)),
        "gmr": gmr,
    }


# --------------------------------------------------------------------------- summaries


def _block(results: Sequence[RowResult]) -> dict[str, Any]:
    rows = len(results)
    predicted = sum(1 for r in results if r.predicted)
    out: dict[str, Any] = {
        "rows": rows,
        "predicted": predicted,
        "coverage": (predicted / rows) if rows else None,
    }
    for metric in ("ttft", "tpot"):
        # A row without a TPOT (osl 1) contributes its TTFT only: NaN keeps it out of the TPOT pairs.
        pred = _as_float_array(
            (r.ttft_ms if metric == "ttft" else r.scored_tpot_ms) if r.predicted else None for r in results
        )
        meas = _as_float_array(getattr(r.row, f"measured_{metric}_ms") for r in results)
        stats = error_stats(pred, meas)
        out[f"{metric}_n"] = stats["n"]
        for key in ("median_ape", "mape", "within20", "bias", "gmr"):
            out[f"{metric}_{key}"] = stats[key]
    return {k: out[k] for k in SUMMARY_KEYS}


#: Row attributes :func:`summarize` can group by (any other name must be a SiliconRow attribute).
GROUPABLE: tuple[str, ...] = (
    "mode",
    "backend",
    "backend_version",
    "system",
    "model",
    "precision",
    "gemm_quant",
    "moe_quant",
    "isl",
    "osl",
    "concurrency",
    "concurrency_source",
    "fully_specified",
)


#: Joins the attributes of a compound grouping (``"backend+system"``) and their values in a label.
COMPOUND_SEP = "+"
_LABEL_SEP = " | "


def _group_key(by: str) -> Callable[[RowResult], str]:
    """The label function of a grouping: one row attribute, or several joined by ``+``
    (``"backend+backend_version+system"``: one group per combination, labelled ``"a | b | c"``)."""
    attrs = [a.strip() for a in by.split(COMPOUND_SEP)]
    probe = SiliconRow.__dataclass_fields__
    for attr in attrs:
        if attr not in probe and not isinstance(getattr(SiliconRow, attr, None), property):
            raise InvalidInputError(f"cannot group validation results by {attr!r}", available=GROUPABLE)

    def one(r: RowResult, attr: str) -> str:
        value = getattr(r.row, attr)
        return "(none)" if value is None or value == "" else str(value)

    return lambda r: _LABEL_SEP.join(one(r, a) for a in attrs)


def _sort_key(label: str) -> tuple[int, float, str]:
    try:
        return (0, float(label), label)
    except ValueError:
        return (1, 0.0, label)


#: The breakdowns :func:`summarize` gives when not told otherwise.
DEFAULT_GROUPS: tuple[str, ...] = ("mode", "backend", "system", "model")


def check_groupings(by: Sequence[str]) -> None:
    """Raise :class:`InvalidInputError` naming the groupable attributes when an entry of ``by``
    (an attribute or ``a+b+...``) names none of them (before any row is predicted)."""
    for g in by:
        _group_key(g)


def summarize(
    records: Iterable[RowResult],
    by: Sequence[str] = DEFAULT_GROUPS,
) -> dict[str, Any]:
    """Overall statistics plus one breakdown per ``by`` attribute.

    Returns ``{<SUMMARY_KEYS>..., "unpredicted": ..., "input_issues": ..., "by": {attr: {value:
    {<SUMMARY_KEYS>...}}}}`` (the two counts: :func:`unpredicted_counts`).
    ``coverage`` = predicted / rows; APE statistics use the predicted rows that
    have a measured value. Group values are strings (``"(none)"`` for missing),
    ordered numerically when they are numbers, else alphabetically. An entry of ``by`` may
    join attributes with ``+`` (``"backend+system"``): one group per combination of their
    values, labelled ``"trtllm | h200_sxm"``.
    """
    results = list(records)
    summary = _block(results)
    summary.update(unpredicted_counts(results))
    groups: dict[str, dict[str, Any]] = {}
    for attr in by:
        keyf = _group_key(attr)
        buckets: dict[str, list[RowResult]] = {}
        for r in results:
            buckets.setdefault(keyf(r), []).append(r)
        groups[attr] = {label: _block(buckets[label]) for label in sorted(buckets, key=_sort_key)}
    summary["by"] = groups
    return summary


def _count(counts: dict[str, int]) -> dict[str, int]:
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def unpredicted_counts(results: Sequence[RowResult]) -> dict[str, Any]:
    """Rows not predicted and rows with input-data issues, counted by reason.

    ``{"unpredicted": {"rows": n, "input_data": n1, "prediction_errors": n2, "by_reason": {...},
    "example": {...}},
    "input_issues": {"rows": m, "by_reason": {...}}}``. An unpredicted row's reason is, for an
    input-data issue, ``"input data: <column>: <problem>"`` (its blocking issues joined by ``"; "``,
    without the values, so rows with the same issue count together), else its error
    (``"<ErrorClass>: <message>"``); ``example`` holds, per reason, the first such row's error with
    its values (e.g. ``"InputData: isl: unparsable number ('abc')"``). ``input_issues`` counts each issue of every row, blocking or
    not (a row with two issues counts under both); most frequent first."""
    unpredicted: dict[str, int] = {}
    examples: dict[str, str] = {}
    issues: dict[str, int] = {}
    n_input = n_error = n_issue_rows = 0
    for r in results:
        if r.issues:
            n_issue_rows += 1
            for i in r.issues:
                issues[i.reason] = issues.get(i.reason, 0) + 1
        if r.predicted:
            continue
        if r.error_kind == "InputData":
            n_input += 1
            reason = "input data: " + "; ".join(i.reason for i in r.issues if i.blocking)
        else:
            n_error += 1
            reason = r.error or "no prediction"
        unpredicted[reason] = unpredicted.get(reason, 0) + 1
        examples.setdefault(reason, r.error or reason)
    by_reason = _count(unpredicted)
    return {
        "unpredicted": {"rows": n_input + n_error, "input_data": n_input, "prediction_errors": n_error,
                        "by_reason": by_reason, "example": {k: examples[k] for k in by_reason}},
        "input_issues": {"rows": n_issue_rows, "by_reason": _count(issues)},
    }
