"""Readers of a user's measured benchmark runs: one :class:`MeasuredRun` per closed-loop run.

Formats (``--format``, or detected from the file):

* ``aiperf-json``: AIPerf's ``profile_export_aiperf.json`` -- one run per file. Metrics are
  objects ``{"unit": "ms", "avg": ..., "p50": ..., "p99": ...}``: ``time_to_first_token``,
  ``inter_token_latency`` (the mean gap between a request's output tokens, i.e. TPOT),
  ``input_sequence_length`` / ``output_sequence_length`` (tokens); the run's settings are under
  ``input_config``: ``loadgen.concurrency``, ``endpoint.model_names``.
* ``aiperf-csv``: AIPerf's ``profile_export_aiperf.csv`` -- one run per file, a ``Metric,avg,...``
  table whose rows are named "Time to First Token (ms)", "Inter Token Latency (ms)", "Input
  Sequence Length (tokens)", "Output Sequence Length (tokens)". It does not carry the concurrency:
  give it (``concurrency=``, the CLI's ``--concurrency``).
* ``vllm-json``: ``vllm bench serve --save-result`` -- one run per file: ``mean_ttft_ms``,
  ``mean_tpot_ms`` (``median_*``, ``p99_*`` too), ``max_concurrency``, ``completed``,
  ``total_input_tokens``, ``total_output_tokens``, ``model_id``; the mean prompt / output lengths
  are the totals over the completed requests.
* ``silicon-csv``: the silicon schema (:mod:`infercast.validate.silicon`): one run per row.

``statistic`` picks which summary is read: ``mean`` (default; what the serving model predicts),
``median`` or ``p99`` (reported in the profile; the model predicts means).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidInputError

FORMATS = ("aiperf-json", "aiperf-csv", "vllm-json", "silicon-csv")
STATISTICS = ("mean", "median", "p99")


@dataclass(frozen=True)
class MeasuredRun:
    """One measured closed-loop run: ``concurrency`` clients, mean prompt ``isl`` and output
    ``osl`` tokens, the TTFT and TPOT the clients saw (ms; TPOT None when not measured)."""

    source: str
    concurrency: int
    isl: int
    osl: int
    ttft_ms: float
    tpot_ms: float | None
    model: str | None = None
    mode: str = "agg"
    row: object = None  # the SiliconRow of a silicon-csv run (its layout), else None


def detect_format(path: Path) -> str:
    """The format of ``path`` from its name and first bytes."""
    head = path.read_text(errors="replace")[:4096]
    if path.suffix.lower() == ".json" or head.lstrip().startswith("{"):
        try:
            doc = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise InvalidInputError(f"{path} is not valid JSON", str(exc)) from None
        if isinstance(doc, dict) and ("input_config" in doc or "time_to_first_token" in doc):
            return "aiperf-json"
        if isinstance(doc, dict) and ("mean_ttft_ms" in doc or "max_concurrency" in doc):
            return "vllm-json"
        raise InvalidInputError(f"cannot tell the format of {path}",
                                "a JSON file with neither AIPerf's time_to_first_token nor vllm bench's mean_ttft_ms",
                                FORMATS)
    first = head.splitlines()[0] if head else ""
    if first.startswith("Metric,"):
        return "aiperf-csv"
    if "silicon_ttft_ms" in first:
        return "silicon-csv"
    raise InvalidInputError(f"cannot tell the format of {path}", "give --format", FORMATS)


def read_runs(paths, fmt: str | None = None, statistic: str = "mean", concurrency: int | None = None,
              ids: set[str] | None = None) -> list[MeasuredRun]:
    """Every measured run in ``paths`` (files). ``fmt`` None: detected per file. ``concurrency``:
    the runs' concurrency where the file does not say (AIPerf CSV). ``ids``: silicon rows kept."""
    if fmt is not None and fmt not in FORMATS:
        raise InvalidInputError(f"unknown format {fmt!r}", "", FORMATS)
    if statistic not in STATISTICS:
        raise InvalidInputError(f"unknown statistic {statistic!r}", "", STATISTICS)
    runs: list[MeasuredRun] = []
    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise InvalidInputError(f"measured-run file {path} not found")
        f = fmt or detect_format(path)
        if f == "aiperf-json":
            runs.append(_aiperf_json(path, statistic, concurrency))
        elif f == "aiperf-csv":
            runs.append(_aiperf_csv(path, statistic, concurrency))
        elif f == "vllm-json":
            runs.append(_vllm_json(path, statistic, concurrency))
        else:
            runs += _silicon(path, ids)
    return runs


def _positive(path, what: str, v) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        x = math.nan
    if not (math.isfinite(x) and x > 0):
        raise InvalidInputError(f"{path}: {what} is {v!r}", "a measured run needs a positive number there")
    return x


def _conc(path, given, override) -> int:
    if override is not None:
        return int(override)
    if given is None:
        raise InvalidInputError(f"{path} does not say the benchmark's concurrency", "give --concurrency N")
    return int(_positive(path, "the concurrency", given))


_AIPERF_KEY = {"mean": "avg", "median": "p50", "p99": "p99"}


def _aiperf_json(path: Path, statistic: str, concurrency) -> MeasuredRun:
    doc = json.loads(path.read_text())
    key = _AIPERF_KEY[statistic]

    def metric(name, required=True):
        m = doc.get(name)
        if not isinstance(m, dict) or m.get(key) is None:
            if required:
                raise InvalidInputError(f"{path} has no {name}.{key}", "AIPerf writes it for a streaming run")
            return None
        unit = m.get("unit", "ms")
        v = float(m[key])
        return v * 1000.0 if unit in ("s", "sec") else v

    cfg = doc.get("input_config") or {}
    loadgen = cfg.get("loadgen") or {}
    names = (cfg.get("endpoint") or {}).get("model_names") or []
    isl = doc.get("input_sequence_length") or {}
    osl = doc.get("output_sequence_length") or {}
    prompt = ((cfg.get("input") or {}).get("prompt") or {})
    isl_v = isl.get("avg") if isinstance(isl, dict) else None
    if isl_v is None:
        isl_v = ((prompt.get("input_tokens") or {}).get("mean"))
    osl_v = osl.get("avg") if isinstance(osl, dict) else None
    if osl_v is None:
        osl_v = ((prompt.get("output_tokens") or {}).get("mean"))
    return MeasuredRun(
        source=str(path), concurrency=_conc(path, loadgen.get("concurrency"), concurrency),
        isl=round(_positive(path, "the input sequence length", isl_v)),
        osl=round(_positive(path, "the output sequence length", osl_v)),
        ttft_ms=_positive(path, "the TTFT", metric("time_to_first_token")),
        tpot_ms=metric("inter_token_latency", required=False), model=names[0] if names else None,
    )


def _aiperf_csv(path: Path, statistic: str, concurrency) -> MeasuredRun:
    key = _AIPERF_KEY[statistic]
    table: dict[str, float] = {}
    header: list[str] | None = None
    with path.open(newline="") as fh:
        for rec in csv.reader(fh):
            if not rec or not any(c.strip() for c in rec):
                header = None
                continue
            if rec[0] == "Metric":
                header = rec
                continue
            if header is not None and key in header and len(rec) == len(header):
                try:
                    table[rec[0].strip().lower()] = float(rec[header.index(key)])
                except ValueError:
                    pass

    def get(name, required=True):
        v = table.get(name.lower())
        if v is None and required:
            raise InvalidInputError(f"{path} has no '{name}' row with a {key} value",
                                    "AIPerf's profile_export_aiperf.csv has one for a streaming run")
        return v

    return MeasuredRun(
        source=str(path), concurrency=_conc(path, None, concurrency),
        isl=round(_positive(path, "the input sequence length", get("Input Sequence Length (tokens)"))),
        osl=round(_positive(path, "the output sequence length", get("Output Sequence Length (tokens)"))),
        ttft_ms=_positive(path, "the TTFT", get("Time to First Token (ms)")),
        tpot_ms=get("Inter Token Latency (ms)", required=False),
    )


def _vllm_json(path: Path, statistic: str, concurrency) -> MeasuredRun:
    doc = json.loads(path.read_text())
    done = _positive(path, "completed", doc.get("completed", doc.get("num_prompts")))
    ttft = doc.get(f"{statistic}_ttft_ms")
    tpot = doc.get(f"{statistic}_tpot_ms")
    return MeasuredRun(
        source=str(path), concurrency=_conc(path, doc.get("max_concurrency"), concurrency),
        isl=round(_positive(path, "total_input_tokens", doc.get("total_input_tokens")) / done),
        osl=round(_positive(path, "total_output_tokens", doc.get("total_output_tokens")) / done),
        ttft_ms=_positive(path, f"{statistic}_ttft_ms", ttft),
        tpot_ms=None if tpot is None else _positive(path, f"{statistic}_tpot_ms", tpot),
        model=doc.get("model_id"),
    )


def _silicon(path: Path, ids) -> list[MeasuredRun]:
    from ..validate.silicon import load_rows

    out = []
    for r in load_rows(path, ids):
        if not r.measured or r.concurrency is None or not r.isl or not r.osl:
            continue
        out.append(MeasuredRun(source=f"{path}:{r.id}", concurrency=int(r.concurrency), isl=int(r.isl), osl=int(r.osl),
                               ttft_ms=float(r.measured_ttft_ms), tpot_ms=r.measured_tpot_ms, model=r.model,
                               mode=r.mode, row=r))
    return out
