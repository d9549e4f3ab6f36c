"""Results of a simulation: per-request times, their statistics, throughput, goodput, and the
schedulers' KV use and queue length over time.

Per request (ms): TTFT = first token - send; TPOT = (finish - first token) / (output - 1) (requests
of one output token have none); end-to-end = finish - send; queueing = start of the first
prefill chunk - arrival at the scheduler (after the front end).

Measurement window: warm-up and cool-down are cut by time. With ``T`` the last completion,
latency statistics are over the requests *sent* in ``[warmup x T, (1 - cooldown) x T]``, and
throughput and goodput count the requests *completing* in that window over its length (goodput:
those meeting every given target, TTFT <= ``ttft_ms`` and TPOT <= ``tpot_ms``). KV use and queue
length are sampled over the window. ``series``: KV use (share of the capacity), queued and
running requests on a grid over the whole run, summed over the schedulers and (``units``) per
scheduler.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ...errors import InvalidInputError

PERCENTILES = (50, 90, 95, 99)
REQUEST_FIELDS = ("idx", "replica", "sent_ms", "arrival_ms", "start_ms", "first_token_ms", "finish_ms", "isl", "osl",
                  "cached_tokens", "preemptions", "ttft_ms", "tpot_ms", "e2e_ms", "queue_ms", "measured", "hash_ids")


@dataclass
class SimResult:
    requests: int
    measured: int
    window_ms: tuple[float, float]
    duration_ms: float
    latency: dict  # metric -> {mean, p50, p90, p95, p99}
    throughput_rps: float
    output_tokens_per_s: float
    goodput_rps: float | None
    slo: dict
    prefix_hit_rate: float | None  # share of looked-up prompt tokens found; None with the cache off
    prefix_lookup_tokens: int
    kv_use: dict  # mean / max share of the KV capacity, over the window
    queue: dict  # mean / max requests waiting (all schedulers), over the window
    steps: int
    preemptions: int
    notes: list[str] = field(default_factory=list)
    series: dict = field(default_factory=dict)
    per_request: dict = field(default_factory=dict)  # column -> numpy array

    def to_dict(self, with_requests: bool = False) -> dict:
        d = asdict(self)
        d.pop("per_request")
        if with_requests:
            d["requests_table"] = [dict(zip(self.per_request, vals)) for vals in zip(*(
                (v.tolist() if isinstance(v, np.ndarray) else v) for v in self.per_request.values()))]
        return d


def _summary(x: np.ndarray) -> dict:
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    q = np.percentile(x, PERCENTILES)
    return {"mean": float(x.mean()), **{f"p{p}": float(v) for p, v in zip(PERCENTILES, q)}}


def summarise(reqs, units, *, warmup: float = 0.1, cooldown: float = 0.1, ttft_ms: float | None = None,
              tpot_ms: float | None = None, notes=(), series_points: int = 200, kv_units=None) -> SimResult:
    """``kv_units``: the schedulers whose KV use and queues the series show (default all)."""
    for name, v in (("--warmup", warmup), ("--cooldown", cooldown)):
        if not 0.0 <= v < 1.0:
            raise InvalidInputError(f"{name} is a share of the run to leave out, in [0, 1)", f"got {v}")
    if warmup + cooldown >= 1.0:
        raise InvalidInputError("--warmup and --cooldown leave nothing to measure", f"{warmup} + {cooldown} >= 1")
    reqs = sorted(reqs, key=lambda r: r.idx)
    g = {k: np.array([getattr(r, k) for r in reqs], dtype=float)
         for k in ("sent", "arrival", "start", "first", "finish", "isl", "osl", "cached")}
    end = float(g["finish"].max())
    w0, w1 = warmup * end, (1.0 - cooldown) * end
    meas = (g["sent"] >= w0) & (g["sent"] <= w1)
    ttft = g["first"] - g["sent"]
    tpot = np.where(g["osl"] > 1, (g["finish"] - g["first"]) / np.maximum(g["osl"] - 1, 1), np.nan)
    e2e = g["finish"] - g["sent"]
    queue = g["start"] - g["arrival"]
    lat = {"ttft_ms": _summary(ttft[meas]), "tpot_ms": _summary(tpot[meas]), "e2e_ms": _summary(e2e[meas]),
           "queue_ms": _summary(queue[meas])}
    span = max(w1 - w0, 1e-9)
    done_in = (g["finish"] >= w0) & (g["finish"] <= w1)
    thr = float(done_in.sum()) / span * 1e3
    tok = float(g["osl"][done_in].sum()) / span * 1e3
    goodput = None
    if ttft_ms is not None or tpot_ms is not None:
        ok = done_in.copy()
        if ttft_ms is not None:
            ok &= ttft <= ttft_ms
        if tpot_ms is not None:
            ok &= np.where(np.isnan(tpot), True, tpot <= tpot_ms)
        goodput = float(ok.sum()) / span * 1e3
    lookups = sum(u.cache.lookups for u in units)
    hits = sum(u.cache.hit_tokens for u in units)
    enabled = any(u.cache.enabled for u in units)
    hit_rate = (hits / lookups if lookups else 0.0) if enabled else None
    kv, qlen, series = _series(kv_units or units, w0, w1, end, series_points)
    notes = list(notes)
    notes.append(f"statistics leave out warm-up (first {warmup:.0%} of the run) and cool-down (last {cooldown:.0%}): "
                 f"latencies of the {int(meas.sum())} requests sent in [{w0 / 1e3:.1f}, {w1 / 1e3:.1f}] s, throughput "
                 "and goodput of those completing in it")
    per = {"idx": np.array([r.idx for r in reqs]), "replica": np.array([r.unit for r in reqs]),
           "sent_ms": g["sent"], "arrival_ms": g["arrival"], "start_ms": g["start"], "first_token_ms": g["first"],
           "finish_ms": g["finish"], "isl": g["isl"].astype(int), "osl": g["osl"].astype(int),
           "cached_tokens": g["cached"].astype(int), "preemptions": np.array([r.preemptions for r in reqs]),
           "ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": e2e, "queue_ms": queue, "measured": meas,
           "hash_ids": [" ".join(str(h) for h in r.hashes) for r in reqs]}
    return SimResult(
        requests=len(reqs), measured=int(meas.sum()), window_ms=(w0, w1), duration_ms=end, latency=lat,
        throughput_rps=thr, output_tokens_per_s=tok, goodput_rps=goodput,
        slo={"ttft_ms": ttft_ms, "tpot_ms": tpot_ms}, prefix_hit_rate=hit_rate, prefix_lookup_tokens=int(lookups), kv_use=kv, queue=qlen,
        steps=sum(u.steps for u in units), preemptions=sum(u.preemptions for u in units), notes=notes,
        series=series, per_request=per)


def _at(times: np.ndarray, values: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Step function (value after the last record at or before ``t``; 0 before the first)."""
    i = np.searchsorted(times, t, side="right") - 1
    return np.where(i >= 0, values[np.maximum(i, 0)], 0.0)


def _series(units, w0, w1, end, points):
    grid = np.linspace(0.0, end, points + 1)
    fine = np.linspace(w0, w1, 2001)
    kv_share = np.zeros_like(grid)
    kv_fine = np.zeros_like(fine)
    q = np.zeros_like(grid)
    q_fine = np.zeros_like(fine)
    run = np.zeros_like(grid)
    per_unit = []
    for u in units:
        if not u.series:
            per_unit.append({"unit": u.index, "kv_use": [0.0] * grid.size, "queued": [0.0] * grid.size,
                             "running": [0.0] * grid.size})
            continue
        s = np.asarray(u.series, dtype=float)
        cap = u.cfg.kv_capacity_tokens
        kv_u = _at(s[:, 0], s[:, 1], grid) / cap
        q_u = _at(s[:, 0], s[:, 2], grid)
        run_u = _at(s[:, 0], s[:, 3], grid)
        kv_share += kv_u / len(units)
        kv_fine += _at(s[:, 0], s[:, 1], fine) / cap / len(units)
        q += q_u
        q_fine += _at(s[:, 0], s[:, 2], fine)
        run += run_u
        per_unit.append({"unit": u.index, "kv_use": kv_u.round(5).tolist(), "queued": q_u.tolist(),
                         "running": run_u.tolist()})
    kv = {"mean": float(kv_fine.mean()), "max": float(kv_fine.max())}
    ql = {"mean": float(q_fine.mean()), "max": float(q_fine.max())}
    series = {"t_s": (grid / 1e3).round(4).tolist(), "kv_use": kv_share.round(5).tolist(),
              "queued": q.tolist(), "running": run.tolist(), "units": per_unit}
    return kv, ql, series


def write_out(res: SimResult, path) -> None:
    """Per-request CSV (``.csv``) or the whole result with every request as JSON (``.json``)."""
    p = Path(path)
    try:
        if p.suffix.lower() == ".json":
            p.write_text(json.dumps(res.to_dict(with_requests=True), indent=1, default=float))
            return
        if p.suffix.lower() != ".csv":
            raise InvalidInputError(f"--out {path}: unknown file type", "per-request CSV (.csv) or JSON (.json)")
        cols = res.per_request
        with p.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(REQUEST_FIELDS)
            for vals in zip(*(cols[k] for k in REQUEST_FIELDS)):
                w.writerow([_fmt(v) for v in vals])
    except OSError as exc:
        raise InvalidInputError(f"cannot write --out {path}", exc.strerror or str(exc)) from None


def _fmt(v):
    if isinstance(v, (float, np.floating)):
        return "" if not np.isfinite(v) else f"{float(v):.4f}"
    if isinstance(v, (np.bool_, bool)):
        return int(v)
    return v
