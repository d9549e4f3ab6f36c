"""Prediction intervals: how far a measured TTFT, TPOT or throughput falls from infercast's
prediction, as 80% and 95% ranges around every predicted figure.

The ranges are empirical. ``scripts/build_intervals.py`` predicted measured serving benchmarks
(the pack's ``silicon_sample.csv``, the rows the project may tune on, with the engines' defaults
only, as ``infercast validate``'s ``defaults_only`` score does) and kept, per *condition cell*, the
quantiles of the log ratio ``log(measured / predicted)``. This module reads that table (shipped as
package data, ``infercast/data/intervals.json``) and turns a prediction into ranges:
``[predicted x exp(q_lo), predicted x exp(q_hi)]`` with ``q_lo`` / ``q_hi`` the cell's
``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles (split-conformal ranks,
:func:`_quantile_pair`). Nothing reads the CSV at run time.

A cell is the combination of what makes the error differ (:func:`condition`):

* ``backend`` (trtllm / vllm / sglang),
* ``mode`` (agg / disagg),
* ``band``: the benchmark concurrency of the deployment (clients), banded by :data:`BANDS`,
* ``tables``: ``measured`` or ``extrapolated``: whether at least :data:`EXTRAPOLATED_SHARE` of the
  prediction's step time (the larger share of a one-prompt prefill step and of a decode step at
  the mean running batch) came from ops answered beyond the measured range of their tables: held
  at the edge of the collected range, from a learned utilisation or from a roofline
  (:data:`EXTRAPOLATED_CODES`, :func:`extrapolated_share`). Such predictions miss by two to three
  times as much as the others (docs/fidelity.md, 'Prediction intervals').

The builder keeps a cell only when it holds at least ``min_rows`` rows; a lookup takes the first
cell of :data:`HIERARCHY` the table holds (the backend dropped first, then agg / disagg, then
``tables``, then the concurrency band) down to one pooled cell. The interval reports the cell it
used (``cell``) and its row count (``n``).

Throughput: in a closed-loop benchmark of ``C`` clients on ``G`` GPUs, each request takes
``TTFT + (osl - 1) TPOT`` and the tokens per second per GPU are ``C osl / (G x that)`` (Little's
law); the builder takes the residual of that request latency, and a throughput's range is the
predicted throughput divided by the latency's ratio range (``tokens_per_s_per_user``, ``1000 /
TPOT`` per user, by the TPOT range the same way). This assumes the predicted and measured
deployments serve the same number of clients on the same GPUs, which a closed-loop benchmark fixes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..errors import DataFileError
from ..interp.provenance import Prov

__all__ = [
    "BANDS",
    "EXTRAPOLATED_SHARE",
    "HIERARCHY",
    "LEVELS",
    "METRICS",
    "Interval",
    "IntervalTable",
    "agg_intervals",
    "band_of",
    "condition",
    "default_intervals",
    "disagg_intervals",
    "extrapolated_share",
    "flat_intervals",
    "intervals_dict",
    "load_intervals",
    "quantile_cells",
    "serving_intervals",
    "static_intervals",
]

#: the nominal coverages every figure carries a range for
LEVELS = (0.80, 0.95)
#: the residuals the table holds: TTFT, TPOT and the request latency (for the throughputs)
METRICS = ("ttft", "tpot", "latency")
#: the prediction models the table has residuals of: the serving models and ``estimate``'s static batch
MODELS = ("serving", "static")
#: upper edges (clients, inclusive) of the concurrency bands; above the last: the last band's label
BANDS = ((4, "c1-4"), (32, "c5-32"), (128, "c33-128"), (math.inf, "c129+"))
#: the condition keys of a cell
KEYS = ("backend", "mode", "band", "tables")
#: the cells a lookup tries, finest first (a cell whose keys the condition lacks is skipped): the
#: backend goes first, then agg / disagg, keeping the concurrency band (the spread grows several-fold
#: from the lowest band to the highest) and ``tables``; then ``tables`` goes, then the band. Without
#: ``tables`` (a search's candidates) the same order without it.
HIERARCHY = (("backend", "mode", "band", "tables"), ("mode", "band", "tables"), ("band", "tables"),
             ("backend", "mode", "band"), ("mode", "band"), ("band",), ("tables",), ())
#: the share of step time from ops answered beyond the measured range that marks a prediction "extrapolated"
EXTRAPOLATED_SHARE = 0.30
#: the version of the table's layout this module reads
FORMAT_VERSION = 1
#: the file shipped in the package
DATA_FILE = "intervals.json"


def band_of(concurrency: float) -> str:
    """The :data:`BANDS` label of a deployment's benchmark concurrency (clients)."""
    c = float(concurrency)
    for edge, label in BANDS:
        if c <= edge:
            return label
    return BANDS[-1][1]


def condition(backend: str, mode: str, concurrency: float, share: float | None) -> dict[str, str]:
    """The cell keys of a prediction: backend, ``agg``/``disagg``, concurrency band and
    ``measured`` / ``extrapolated`` tables (``share`` from :func:`extrapolated_share`; None when
    not known: the key is left out, the lookup starts one level coarser)."""
    out = {"backend": str(backend), "mode": str(mode), "band": band_of(concurrency)}
    if share is not None:
        out["tables"] = "extrapolated" if share >= EXTRAPOLATED_SHARE else "measured"
    return out


def provenance_shares(engine, **shape) -> np.ndarray:
    """The share of one step's time (``shape``: :meth:`~infercast.engine.compiled.CompiledEngine.components`
    keywords) in ops of each :class:`~infercast.interp.provenance.Prov` code (an op counted at
    its worst code): an array indexed by the code, summing to 1 (all zeros for a step of no time)."""
    out = np.zeros(len(Prov))
    for v, p in engine.components(**shape).values():
        out[int(np.max(p))] += float(np.sum(v))
    total = out.sum()
    return out / total if total > 0 else out


#: the provenance codes that count as "beyond the measured range": a held edge (or an unmeasured
#: cell), a learned utilisation or a roofline. Not ``TRANSFERRED`` (an uncollected shape answered
#: from measured neighbouring sites: the common case, inside the range the tables span) and not
#: ``ANALYTIC`` (the element-wise ops with no table at all, modelled so in every prediction alike)
EXTRAPOLATED_CODES = (Prov.HELD, Prov.EMPIRICAL, Prov.SOL)


def step_shares(prefill_engine, decode_engine, *, isl: float, osl: float, decode_batch: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`provenance_shares` of a prefill step of one prompt of ``isl`` tokens on
    ``prefill_engine`` and of a decode step of ``decode_batch`` sequences at the mean KV length
    ``isl + osl / 2`` on ``decode_engine`` (zeros for a one-token output)."""
    pre = provenance_shares(prefill_engine, ctx_batch=1.0, ctx_isl=float(isl))
    if osl <= 1:
        return pre, np.zeros_like(pre)
    dec = provenance_shares(decode_engine, dec_batch=max(float(decode_batch), 1.0), dec_kv=float(isl) + float(osl) / 2.0)
    return pre, dec


def share_of(pre: np.ndarray, dec: np.ndarray) -> float:
    """The larger of the two steps' shares in :data:`EXTRAPOLATED_CODES`."""
    idx = [int(c) for c in EXTRAPOLATED_CODES]
    return float(max(np.sum(np.asarray(pre)[idx]), np.sum(np.asarray(dec)[idx])))


def extrapolated_share(prefill_engine, decode_engine, *, isl: float, osl: float, decode_batch: float) -> float:
    """The larger of two shares of step time in ops answered beyond a measured table point
    (:data:`EXTRAPOLATED_CODES`): in a prefill step of one prompt of ``isl`` tokens on
    ``prefill_engine``, and in a decode step of ``decode_batch`` sequences at the mean KV length
    ``isl + osl / 2`` on ``decode_engine`` (the same engine for an aggregated deployment). Both
    are compiled engines (:class:`~infercast.engine.compiled.CompiledEngine`)."""
    return share_of(*step_shares(prefill_engine, decode_engine, isl=isl, osl=osl, decode_batch=decode_batch))


@dataclass(frozen=True)
class Interval:
    """The ranges of one predicted figure: ``ranges[level] = (lo, hi)``; ``cell`` the condition
    keys the quantiles came from, ``n`` how many benchmark rows that cell held."""

    ranges: dict[float, tuple[float, float]]
    cell: dict[str, str]
    n: int

    def inverse(self, value: float, of: float) -> Interval:
        """The ranges of a figure ``value`` inversely proportional to this interval's figure,
        whose predicted value was ``of`` (a request rate from its request latency, by Little's
        law): the same cell, the ratio range turned over."""
        return Interval({lv: (value * of / hi, value * of / lo) for lv, (lo, hi) in self.ranges.items()}, self.cell, self.n)

    def to_dict(self) -> dict:
        out = {level_key(lv): [round_end(lo), round_end(hi)] for lv, (lo, hi) in sorted(self.ranges.items())}
        out["cell"] = cell_words(self.cell)
        out["n"] = self.n
        return out


def cell_words(cell: dict[str, str]) -> str:
    """A cell's keys as reports name it (``"backend=vllm, mode=agg"``; ``"all"`` for none)."""
    return ", ".join(f"{k}={v}" for k, v in cell.items()) or "all"


def round_end(x: float) -> float:
    """An interval's end as reports give it: four significant digits."""
    return float(f"{x:.4g}")


def cell_key(cell: dict[str, str], keys) -> str:
    """The table key of the cell ``cell`` restricted to ``keys`` (``"all"`` for none)."""
    return "|".join(f"{k}={cell[k]}" for k in keys) or "all"


class IntervalTable:
    """Log-ratio quantiles per prediction model, metric and cell (what ``intervals.json`` holds):
    ``cells[model][metric][cell key] = {"n": rows, "p80": [lo, hi], "p95": [lo, hi]}`` with
    ``model`` ``"serving"`` (the serving models: ``serve``, ``serve-disagg``, ``search``) or
    ``"static"`` (``estimate``'s single batch)."""

    def __init__(self, cells: dict[str, dict[str, dict[str, dict]]], meta: dict | None = None, source: str = "<memory>"):
        self.cells = cells
        self.meta = dict(meta or {})
        self.source = source
        self._found: dict = {}  # lookups done, by (model, metric, condition): a search asks for many alike

    def lookup(self, model: str, metric: str, cond: dict[str, str]) -> tuple[dict, dict[str, str]]:
        """The finest cell of ``model``'s ``metric`` along :data:`HIERARCHY` that ``cond`` names
        and the table holds: ``(entry, keys used)``."""
        key = (model, metric, tuple(sorted(cond.items())))
        hit = self._found.get(key)
        if hit is None:
            hit = self._found[key] = self._lookup(model, metric, cond)
        return hit

    def _lookup(self, model: str, metric: str, cond: dict[str, str]) -> tuple[dict, dict[str, str]]:
        table = self.cells.get(model, {}).get(metric)
        if table is None:
            raise DataFileError(f"prediction-interval table {self.source} has no {model} {metric!r} residuals",
                                f"it holds {', '.join(sorted(self.cells)) or 'none'}")
        for keys in HIERARCHY:
            if not all(k in cond for k in keys):
                continue
            entry = table.get(cell_key(cond, keys))
            if entry is not None:
                return entry, {k: cond[k] for k in keys}
        raise DataFileError(f"prediction-interval table {self.source} has no pooled 'all' cell for {model} {metric!r}",
                            "rebuild it with scripts/build_intervals.py")

    def interval(self, model: str, metric: str, value: float, cond: dict[str, str], invert: bool = False) -> Interval:
        """The ranges of a predicted ``value`` of ``metric`` in the cell of ``cond``; ``invert``:
        ``value`` is inversely proportional to the metric (a throughput from a latency)."""
        factors, used, n = self.factors(model, metric, cond, invert)
        return Interval({lv: (value * a, value * b) for lv, (a, b) in factors.items()}, used, n)

    def factors(self, model: str, metric: str, cond: dict[str, str], invert: bool = False):
        """``({level: (low, high) factor on the predicted value}, keys used, rows)`` of ``cond``'s
        cell (kept: a search asks for the same few cells tens of thousands of times)."""
        key = ("factors", model, metric, tuple(sorted(cond.items())), invert)
        hit = self._found.get(key)
        if hit is None:
            entry, used = self.lookup(model, metric, cond)
            f = {}
            for lv in LEVELS:
                lo, hi = entry[level_key(lv)]
                f[lv] = (math.exp(-hi), math.exp(-lo)) if invert else (math.exp(lo), math.exp(hi))
            hit = self._found[key] = (f, used, int(entry["n"]))
        return hit


def level_key(level: float) -> str:
    """A level's key in the table and in reports: 0.8 -> ``"p80"``."""
    return f"p{round(100 * level)}"


def _check_table(doc, source: str) -> IntervalTable:
    """An :class:`IntervalTable` from a parsed ``intervals.json``, or :class:`DataFileError`
    naming what is wrong with it."""
    def bad(what: str) -> DataFileError:
        return DataFileError(f"prediction-interval table {source}: {what}", "rebuild it with scripts/build_intervals.py")

    if not isinstance(doc, dict):
        raise bad("not a JSON object")
    if doc.get("format_version") != FORMAT_VERSION:
        raise bad(f"format_version {doc.get('format_version')!r}, this infercast reads {FORMAT_VERSION}")
    models = doc.get("models")
    if not isinstance(models, dict) or set(models) != set(MODELS):
        raise bad(f"'models' must hold exactly {', '.join(MODELS)}")
    cells = {}
    for model, block in models.items():
        table = block.get("cells") if isinstance(block, dict) else None
        if not isinstance(table, dict) or set(table) != set(METRICS):
            raise bad(f"{model}: 'cells' must hold the residuals of exactly {', '.join(METRICS)}")
        for metric, per_cell in table.items():
            if not isinstance(per_cell, dict) or "all" not in per_cell:
                raise bad(f"{model} {metric} has no pooled 'all' cell")
            for key, entry in per_cell.items():
                if not isinstance(entry, dict) or not isinstance(entry.get("n"), int) or entry["n"] < 1:
                    raise bad(f"{model} {metric} cell {key!r} has no row count 'n'")
                for lv in LEVELS:
                    pair = entry.get(level_key(lv))
                    if (not isinstance(pair, list) or len(pair) != 2
                            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in pair)
                            or not all(math.isfinite(x) for x in pair) or pair[0] > pair[1]):
                        raise bad(f"{model} {metric} cell {key!r}: {level_key(lv)} is not a [low, high] pair of log ratios")
        cells[model] = table
    return IntervalTable(cells, {k: v for k, v in doc.items() if k != "models"}, source)


def load_intervals(path: str | Path) -> IntervalTable:
    """Read an ``intervals.json`` (written by ``scripts/build_intervals.py``). A missing,
    unreadable or malformed file raises :class:`~infercast.errors.DataFileError`."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise DataFileError(f"cannot read prediction-interval table {p}", exc.strerror or str(exc)) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataFileError(f"prediction-interval table {p} is not JSON", f"line {exc.lineno}: {exc.msg}") from None
    return _check_table(doc, str(p))


@lru_cache(maxsize=1)
def default_intervals() -> IntervalTable:
    """The table shipped with infercast (``infercast/data/intervals.json``), read once: from the
    package's directory where it is a directory on disk, else through ``importlib.resources``
    (an installation the files of which are not plain files; that module costs ~3 ms to import)."""
    p = Path(__file__).resolve().parent.parent / "data" / DATA_FILE
    if p.is_file():
        return load_intervals(p)
    from importlib import resources

    with resources.as_file(resources.files("infercast.data").joinpath(DATA_FILE)) as p:
        return load_intervals(p)


def _quantile_pair(v: np.ndarray, level: float) -> tuple[float, float]:
    """The ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of ``v`` with the split-conformal
    finite-sample correction: the upper end is the ``ceil((n + 1)(1 + level) / 2)``-th smallest
    value (the largest when that rank exceeds ``n``), the lower end the same rank from the top;
    for exchangeable new values each end is then missed with probability at most
    ``(1 - level) / 2``."""
    s = np.sort(v)
    n = len(s)
    k = min(n, math.ceil((n + 1) * (1 + level) / 2 - 1e-9))  # less a rounding error: (n + 1) q may be whole
    return float(s[n - k]), float(s[k - 1])


def quantile_cells(log_ratios: np.ndarray, conds: list[dict[str, str]], min_rows: int) -> dict[str, dict]:
    """The table of one metric: for every cell of :data:`HIERARCHY` that holds at least
    ``min_rows`` of the finite ``log_ratios`` (one per row, the row's condition in ``conds``),
    the ranges of :func:`_quantile_pair` per :data:`LEVELS` and the count; the pooled ``"all"``
    cell always (when any value is finite)."""
    r = np.asarray(log_ratios, dtype=float)
    ok = np.isfinite(r)
    out: dict[str, dict] = {}
    for keys in HIERARCHY:
        groups: dict[str, list[int]] = {}
        for i in np.flatnonzero(ok):
            if all(k in conds[i] for k in keys):
                groups.setdefault(cell_key(conds[i], keys), []).append(int(i))
        for key, idx in groups.items():
            if len(idx) < min_rows and keys:
                continue
            entry: dict = {"n": len(idx)}
            for lv in LEVELS:
                entry[level_key(lv)] = list(_quantile_pair(r[idx], lv))
            out[key] = entry
    return out


#: a serving result's figures with ranges: (field, residual metric, inversely proportional)
FIGURES = (("ttft_ms", "ttft", False), ("tpot_ms", "tpot", False), ("request_latency_ms", "latency", False),
           ("tokens_per_s_per_gpu", "latency", True), ("tokens_per_s_per_user", "tpot", True))


def serving_intervals(table: IntervalTable, result, *, backend: str, mode: str, concurrency: float, osl: float,
                      share: float | None, model: str = "serving") -> dict[str, Interval]:
    """The ranges of a result's figures (:data:`FIGURES`: ``ttft_ms``, ``tpot_ms``,
    ``request_latency_ms``, ``tokens_per_s_per_gpu``, ``tokens_per_s_per_user``; read as
    attributes of ``result``), keyed by field name, from ``model``'s residuals. A figure that is
    missing or not positive gets none, and so do the TPOT figures of a one-token output."""
    cond = condition(backend, mode, concurrency, share)
    out: dict[str, Interval] = {}
    for field, metric, invert in FIGURES:
        if metric == "tpot" and osl <= 1:
            continue
        v = getattr(result, field, None)
        if v is None or isinstance(v, bool) or not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            continue
        out[field] = table.interval(model, metric, float(v), cond, invert=invert)
    return out


def intervals_dict(intervals: dict[str, Interval]) -> dict[str, dict]:
    """``{field: {"p80": [lo, hi], "p95": [lo, hi], "cell": ..., "n": ...}}`` for JSON."""
    return {k: v.to_dict() for k, v in intervals.items()}


def flat_intervals(intervals: dict[str, Interval]) -> dict[str, float]:
    """``{"<field>_p80_lo": ..., "<field>_p80_hi": ..., ...}``: one column per end (for CSV)."""
    out = {}
    for k, v in intervals.items():
        for lv, (lo, hi) in sorted(v.ranges.items()):
            out[f"{k}_{level_key(lv)}_lo"] = round_end(lo)
            out[f"{k}_{level_key(lv)}_hi"] = round_end(hi)
    return out


def flat_from_dict(intervals: dict[str, dict]) -> dict[str, float]:
    """:func:`flat_intervals` of intervals already in :func:`intervals_dict`'s form (its ends are
    rounded the same way: the same columns and values)."""
    out = {}
    for k, v in intervals.items():
        for level, ends in v.items():
            if level.startswith("p") and isinstance(ends, list):
                out[f"{k}_{level}_lo"], out[f"{k}_{level}_hi"] = ends
    return out


def agg_intervals(est, res, *, concurrency: float, isl: float, osl: float, table: IntervalTable | None = None) -> dict[str, Interval]:
    """:func:`serving_intervals` of an aggregated serving result ``res`` of Estimator ``est`` at
    ``concurrency`` clients of the replica (the conditions from ``est``'s backend and engine and
    ``res``'s decode batch)."""
    share = extrapolated_share(est.engine, est.engine, isl=isl, osl=osl, decode_batch=res.decode_batch)
    return serving_intervals(table or default_intervals(), res, backend=est.data.backend, mode="agg",
                             concurrency=concurrency, osl=osl, share=share)


def disagg_intervals(prefill, decode, res, *, concurrency: float, isl: float, osl: float,
                     table: IntervalTable | None = None) -> dict[str, Interval]:
    """:func:`serving_intervals` of a disaggregated serving result ``res`` of the ``prefill`` and
    ``decode`` Estimators at ``concurrency`` clients of the deployment."""
    share = extrapolated_share(prefill.engine, decode.engine, isl=isl, osl=osl, decode_batch=res.decode_batch)
    return serving_intervals(table or default_intervals(), res, backend=decode.data.backend, mode="disagg",
                             concurrency=concurrency, osl=osl, share=share)


def static_intervals(est, res, table: IntervalTable | None = None) -> dict[str, Interval]:
    """The ranges of a static estimate ``res`` (:meth:`infercast.api.Estimator.static`: one batch
    of ``res.batch_size`` requests per attention-DP rank) from the static model's residuals: what
    a closed-loop benchmark of that many clients per rank measured against that estimate."""
    share = extrapolated_share(est.engine, est.engine, isl=res.isl, osl=res.osl, decode_batch=res.batch_size)
    return serving_intervals(table or default_intervals(), res, backend=est.data.backend, mode="agg",
                             concurrency=res.batch_size * res.attention_dp, osl=res.osl, share=share, model="static")
