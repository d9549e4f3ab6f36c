"""Load for the simulator: request arrival times, request lengths, and traces read from files.

A :class:`Workload` is a list of requests (input and output lengths, optional prefix-block hashes)
with either their send times (open loop, trace replay) or a number of closed-loop clients that
send them one after another.

* Open loop: :func:`arrival_times` -- a renewal process of rate ``R`` whose inter-arrival times are
  gamma distributed with shape ``burstiness`` (1: Poisson; < 1 burstier, > 1 more regular), as
  ``vllm bench serve --request-rate R --burstiness B`` draws them.
* Lengths: fixed, or uniform integers on ``[ratio x L, L]`` as benchmark clients draw them with
  ``--random-range-ratio`` (:func:`uniform_lengths`; the convention
  :func:`infercast.serving.backends.mean_length_ratio` uses), or (input, output) pairs drawn with
  replacement from a trace (:func:`sample_lengths`).
* Traces (:func:`read_trace`), three formats recognised by their fields:

  - Mooncake-style JSONL: one object per line with ``timestamp`` (ms), ``input_length``,
    ``output_length`` and ``hash_ids`` (the prompt's blocks, each hash standing for one block of
    ``block_tokens`` tokens and, as in Mooncake's traces, for everything before it; 512 tokens
    unless told);
  - Azure-LLM-inference-style CSV: columns ``TIMESTAMP`` (a date-time, or seconds),
    ``ContextTokens``, ``GeneratedTokens``;
  - infercast's own CSV or JSONL: ``arrival_ms`` (or ``sent_ms`` / ``timestamp_ms``), ``isl``,
    ``osl`` and optionally ``hash_ids`` (space-separated in CSV, a list in JSONL) -- the per-request
    CSV that ``infercast simulate --out`` writes reads back as a trace.

  Times are made relative to the first request and multiplied by ``time_scale`` (0.5 replays a
  trace twice as fast).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from pathlib import Path

import numpy as np

from ...errors import DataFileError, InvalidInputError

#: tokens per hash block of a Mooncake trace (its published traces hash 512-token blocks)
MOONCAKE_BLOCK_TOKENS = 512


#: how closed-loop clients start (:class:`Workload` ``client_start``)
CLIENT_STARTS = ("together", "staggered", "wave-then-staggered", "auto")


@dataclass
class Workload:
    """Requests to simulate. ``sent_ms``: send times (open loop / trace), None for a closed loop
    of ``clients`` clients that send the requests in order. ``hashes[i]``: request ``i``'s
    prefix-block hashes (empty: it shares nothing), each block ``block_tokens`` tokens.

    ``client_start`` (closed loop only; :data:`CLIENT_STARTS`): ``together`` -- every client sends
    its first request at time 0, as benchmark clients start; ``staggered`` -- client ``c`` of ``C``
    sends its first request at ``c x ramp_up_ms / C``; ``wave-then-staggered`` -- every client
    starts at time 0, and client ``c`` waits ``c x ramp_up_ms / C`` after its first request
    completes before sending its second (the synchronised first wave kept, the clients spread
    over the cycle after it); ``auto`` -- ``wave-then-staggered`` when every request has the same
    lengths and the engine mixes prefill into decode steps, else ``together``
    (:func:`.deploy.simulate` resolves it). ``ramp_up_ms``: the spread; None: one expected request
    cycle of the deployment, which :func:`.deploy.simulate` estimates from the step timer."""

    isl: np.ndarray
    osl: np.ndarray
    sent_ms: np.ndarray | None = None
    clients: int = 0
    hashes: list[tuple] | None = None
    block_tokens: int = MOONCAKE_BLOCK_TOKENS
    description: str = ""
    notes: list[str] = field(default_factory=list)
    client_start: str = "together"
    ramp_up_ms: float | None = None

    def __post_init__(self):
        self.isl = np.asarray(self.isl, dtype=np.int64)
        self.osl = np.asarray(self.osl, dtype=np.int64)
        n = len(self.isl)
        if len(self.osl) != n or (self.sent_ms is not None and len(self.sent_ms) != n):
            raise InvalidInputError("a workload's columns differ in length",
                                    f"{n} input lengths, {len(self.osl)} output lengths")
        if n == 0:
            raise InvalidInputError("the workload has no requests", "give --num-requests or a trace with rows")
        if self.isl.min() < 1 or self.osl.min() < 1:
            raise InvalidInputError("every request needs at least one input and one output token",
                                    f"smallest input {int(self.isl.min())}, smallest output {int(self.osl.min())}")
        if self.sent_ms is None and self.clients < 1:
            raise InvalidInputError("a workload needs send times or closed-loop clients")
        if self.hashes is not None and len(self.hashes) != n:
            raise InvalidInputError("a workload's hash lists differ in number from its requests")
        if self.client_start not in CLIENT_STARTS:
            raise InvalidInputError(f"unknown closed-loop client start {self.client_start!r}",
                                    f"one of {', '.join(CLIENT_STARTS)}")
        if self.ramp_up_ms is not None and not (np.isfinite(self.ramp_up_ms) and self.ramp_up_ms >= 0):
            raise InvalidInputError("a closed loop's ramp-up must be a duration >= 0", f"got {self.ramp_up_ms} ms")

    def __len__(self) -> int:
        return len(self.isl)


def arrival_times(n: int, rate: float, burstiness: float = 1.0, rng=None, start_ms: float = 0.0) -> np.ndarray:
    """``n`` send times (ms) of a renewal process of ``rate`` requests/s whose gaps are gamma
    distributed with shape ``burstiness`` and mean ``1 / rate`` (Poisson at 1); the first
    request is sent at ``start_ms``."""
    if not (rate > 0 and np.isfinite(rate)):
        raise InvalidInputError("--request-rate must be a positive number of requests per second", f"got {rate}")
    if not (burstiness > 0 and np.isfinite(burstiness)):
        raise InvalidInputError("--burstiness must be a positive number (1: Poisson)", f"got {burstiness}")
    rng = np.random.default_rng(0) if rng is None else rng
    gaps = rng.gamma(shape=burstiness, scale=1e3 / (rate * burstiness), size=n)
    gaps[0] = 0.0
    return start_ms + np.cumsum(gaps)


def parse_rate_schedule(text: str) -> list[tuple[float, float]]:
    """``"0:5,600:10,1200:5"`` -> ``[(0, 5), (600, 10), (1200, 5)]``: from each time (s), that rate
    (requests/s) until the next; times strictly increasing from 0, rates >= 0, one of them > 0."""
    out = []
    try:
        for part in str(text).split(","):
            t, r = part.split(":")
            out.append((float(t), float(r)))
    except ValueError:
        raise InvalidInputError(f"--rate-schedule {text!r} is not a list of TIME_S:RATE pairs",
                                "e.g. 0:5,600:10,1200:5 (5 req/s, 10 from 600 s, 5 from 1200 s)") from None
    ts = [t for t, _ in out]
    if ts[0] != 0 or any(b <= a for a, b in pairwise(ts)) or not all(np.isfinite(ts)):
        raise InvalidInputError(f"--rate-schedule {text!r}: times must start at 0 and increase")
    if any(not (np.isfinite(r) and r >= 0) for _, r in out) or not any(r > 0 for _, r in out):
        raise InvalidInputError(f"--rate-schedule {text!r}: rates must be >= 0, one of them above 0")
    return out


def scheduled_arrival_times(schedule, duration_s: float, burstiness: float = 1.0, rng=None) -> np.ndarray:
    """Send times (ms) over ``duration_s`` seconds of a piecewise-constant rate ``schedule``
    (:func:`parse_rate_schedule`): a unit-rate renewal process of gamma gaps (shape
    ``burstiness``) mapped through the inverse of the cumulative rate (time rescaling), so each
    piece has its rate and the process its burstiness."""
    if not (burstiness > 0 and np.isfinite(burstiness)):
        raise InvalidInputError("--burstiness must be a positive number (1: Poisson)", f"got {burstiness}")
    rng = np.random.default_rng(0) if rng is None else rng
    knots = np.array([t for t, _ in schedule if t < duration_s] + [duration_s], dtype=float)
    rates = np.array([r for t, r in schedule if t < duration_s], dtype=float)
    cum = np.concatenate([[0.0], np.cumsum(rates * np.diff(knots))])  # expected requests by each knot
    total = cum[-1]
    n_guess = int(total + 10 * np.sqrt(total / burstiness) + 20)
    pts = np.cumsum(rng.gamma(burstiness, 1.0 / burstiness, size=n_guess))
    while pts[-1] < total:
        pts = np.concatenate([pts, pts[-1] + np.cumsum(rng.gamma(burstiness, 1.0 / burstiness, size=n_guess))])
    pts = pts[pts < total]
    # invert the piecewise-linear cumulative rate: the piece each point falls in (the last piece
    # starting at or below it, so a piece of rate 0 is skipped), then the time within that piece
    idx = np.minimum(np.searchsorted(cum, pts, side="right") - 1, len(rates) - 1)
    return (knots[idx] + (pts - cum[idx]) / rates[idx]) * 1e3


def uniform_lengths(length: int, ratio: float, n: int, rng=None) -> np.ndarray:
    """``n`` integer lengths uniform on ``[floor(ratio x length), length]`` (ratio 1: all equal)."""
    if not 0.0 < ratio <= 1.0:
        raise InvalidInputError("--random-range-ratio is the shortest request's share of the nominal length, in (0, 1]",
                                f"got {ratio}")
    if length < 1:
        raise InvalidInputError("a length must be >= 1", f"got {length}")
    lo = max(1, int(np.floor(ratio * length)))
    if lo >= length:
        return np.full(n, int(length), dtype=np.int64)
    rng = np.random.default_rng(0) if rng is None else rng
    return rng.integers(lo, length + 1, size=n)


def sample_lengths(trace: Workload, n: int, rng=None) -> tuple[np.ndarray, np.ndarray]:
    """``n`` (input, output) length pairs drawn with replacement from ``trace``'s requests."""
    rng = np.random.default_rng(0) if rng is None else rng
    idx = rng.integers(0, len(trace), size=n)
    return trace.isl[idx], trace.osl[idx]


# ---- traces --------------------------------------------------------------------------------------
def _bad(path: Path, line: int, what: str) -> DataFileError:
    return DataFileError(f"{path} line {line}: {what}",
                         "expected a Mooncake JSONL (timestamp, input_length, output_length, hash_ids), an Azure CSV "
                         "(TIMESTAMP, ContextTokens, GeneratedTokens) or infercast's CSV/JSONL (arrival_ms, isl, osl)")


def _number(path, line, value, name) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise _bad(path, line, f"{name} is not a number ({value!r})") from None
    if not np.isfinite(x):
        raise _bad(path, line, f"{name} is not finite ({value!r})")
    return x


def _length(path, line, value, name) -> int:
    x = _number(path, line, value, name)
    if x < 1 or x != int(x):
        raise _bad(path, line, f"{name} must be a whole number >= 1 ({value!r})")
    return int(x)


def _timestamp(path, line, value) -> float:
    """Seconds of an Azure ``TIMESTAMP``: a number, or an ISO-like date-time (fractions of any
    length)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        pass
    text = str(value).strip()
    try:
        head, _, frac = text.partition(".")
        t = datetime.fromisoformat(head).timestamp()
        return t + (float("0." + frac.rstrip("Z")) if frac else 0.0)
    except ValueError:
        raise _bad(path, line, f"TIMESTAMP is neither seconds nor a date-time ({value!r})") from None


def _hash_list(path, line, value) -> tuple:
    if value is None or value == "":
        return ()
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, str):
        return tuple(value.split())
    raise _bad(path, line, f"hash_ids must be a list ({value!r})")


_TIME_KEYS = ("arrival_ms", "sent_ms", "timestamp_ms")


def _own_row(path, line, rec) -> tuple[float, int, int, tuple]:
    key = next((k for k in _TIME_KEYS if k in rec), None)
    if key is None:
        raise _bad(path, line, "no arrival_ms / sent_ms / timestamp_ms column")
    return (_number(path, line, rec[key], key), _length(path, line, rec.get("isl"), "isl"),
            _length(path, line, rec.get("osl"), "osl"), _hash_list(path, line, rec.get("hash_ids")))


def read_trace(path, time_scale: float = 1.0, block_tokens: int | None = None) -> Workload:
    """The requests of a trace file (formats in the module docstring), send times relative to the
    first request and multiplied by ``time_scale``; ``block_tokens``: tokens per hash block
    (default :data:`MOONCAKE_BLOCK_TOKENS`)."""
    path = Path(path)
    if not (time_scale > 0 and np.isfinite(time_scale)):
        raise InvalidInputError("--time-scale must be a positive number (0.5: twice as fast)", f"got {time_scale}")
    try:
        text = path.read_text()
    except OSError as exc:
        raise DataFileError(f"cannot read trace {path}", exc.strerror or str(exc)) from None
    if not text.strip():
        raise DataFileError(f"trace {path} has no requests", "the file is empty")
    rows: list[tuple[float, int, int, tuple]] = []
    kind = ""
    first = text.lstrip()[:1]
    if first in ("{", "["):
        for i, raw in enumerate(text.splitlines(), 1):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise _bad(path, i, f"not a JSON object ({exc.msg})") from None
            if not isinstance(rec, dict):
                raise _bad(path, i, "not a JSON object")
            if "input_length" in rec:
                kind = "mooncake"
                rows.append((_number(path, i, rec.get("timestamp"), "timestamp"),
                             _length(path, i, rec.get("input_length"), "input_length"),
                             _length(path, i, rec.get("output_length"), "output_length"),
                             _hash_list(path, i, rec.get("hash_ids"))))
            else:
                kind = "infercast-jsonl"
                rows.append(_own_row(path, i, rec))
    else:
        reader = csv.DictReader(text.splitlines())
        fields = set(reader.fieldnames or ())
        if {"ContextTokens", "GeneratedTokens"} <= fields:
            kind = "azure"
            for i, rec in enumerate(reader, 2):
                rows.append((_timestamp(path, i, rec.get("TIMESTAMP")) * 1e3,
                             _length(path, i, rec.get("ContextTokens"), "ContextTokens"),
                             _length(path, i, rec.get("GeneratedTokens"), "GeneratedTokens"), ()))
        elif {"isl", "osl"} <= fields:
            kind = "infercast-csv"
            for i, rec in enumerate(reader, 2):
                rows.append(_own_row(path, i, rec))
        else:
            raise _bad(path, 1, f"unrecognised header {sorted(fields)}")
    if not rows:
        raise DataFileError(f"trace {path} has no requests", "the file is empty")
    rows.sort(key=lambda r: r[0])
    t = np.array([r[0] for r in rows], dtype=float)
    sent = (t - t[0]) * time_scale
    hashes = [r[3] for r in rows]
    bt = int(block_tokens or MOONCAKE_BLOCK_TOKENS)
    return Workload(isl=np.array([r[1] for r in rows]), osl=np.array([r[2] for r in rows]), sent_ms=sent,
                    hashes=hashes if any(hashes) else None, block_tokens=bt,
                    description=f"{kind} trace {path.name}: {len(rows)} requests over {sent[-1] / 1e3:.1f} s"
                                + (f" (time scale {time_scale:g})" if time_scale != 1 else ""))


#: tokens per KV-cache block of a synthetic load's shared prefix (vLLM's default block size)
SYNTHETIC_BLOCK_TOKENS = 16


def synthetic(n: int, *, isl: int | None = None, osl: int | None = None, range_ratio: float = 1.0,
              lengths_from: Workload | None = None, rate: float | None = None, burstiness: float = 1.0,
              clients: int = 0, seed: int = 0, sent_ms: np.ndarray | None = None, load: str = "",
              client_start: str = "together", ramp_up_ms: float | None = None, prefix: int = 0,
              block_tokens: int = SYNTHETIC_BLOCK_TOKENS) -> Workload:
    """``n`` requests of lengths fixed (``isl``, ``osl``), uniform on ``[range_ratio x L, L]``, or
    drawn from ``lengths_from``; sent at ``rate`` requests/s (gamma gaps of shape ``burstiness``)
    or by ``clients`` closed-loop clients starting as ``client_start`` says (:class:`Workload`; or at
    the given ``sent_ms``, described by ``load``). ``prefix``: every prompt starts with the same
    ``prefix`` tokens (a shared system prompt: its whole blocks of ``block_tokens`` tokens share
    their hashes, so the prefix caches hold them after the first request), the drawn input lengths
    after it."""
    if sent_ms is not None:
        n = len(sent_ms)
    if n < 1:
        raise InvalidInputError("the load has no requests", f"--num-requests / --duration-s give {n}")
    rng = np.random.default_rng(seed)
    if lengths_from is not None:
        i, o = sample_lengths(lengths_from, n, rng)
        how = f"lengths drawn from {lengths_from.description.split(':')[0]}"
    else:
        if isl is None or osl is None:
            raise InvalidInputError("synthetic load needs --isl and --osl (or --lengths-from TRACE)")
        i, o = uniform_lengths(isl, range_ratio, n, rng), uniform_lengths(osl, range_ratio, n, rng)
        how = f"isl {isl}, osl {osl}" + (f", uniform on [{range_ratio:g} L, L]" if range_ratio < 1 else "")
    shared = {}
    if prefix:
        if prefix < 0 or block_tokens < 1:
            raise InvalidInputError(f"a shared prefix is 0 or more tokens in blocks of 1 or more; got {prefix}, {block_tokens}")
        i = i + int(prefix)
        shared = dict(hashes=[tuple(range(int(prefix) // int(block_tokens)))] * n, block_tokens=int(block_tokens))
        how += f", after a shared {prefix}-token prefix"
    if sent_ms is not None:
        return Workload(i, o, sent_ms=np.asarray(sent_ms, float), description=f"{n} requests, {load}, {how}", **shared)
    if rate is not None:
        sent = arrival_times(n, rate, burstiness, rng)
        kind = "Poisson" if burstiness == 1 else f"gamma (burstiness {burstiness:g})"
        return Workload(i, o, sent_ms=sent, description=f"{n} requests, {kind} arrivals at {rate:g} req/s, {how}",
                        **shared)
    if clients < 1:
        raise InvalidInputError("--concurrency must be >= 1", f"got {clients}")
    return Workload(i, o, clients=clients, client_start=client_start, ramp_up_ms=ramp_up_ms,
                    description=f"{n} requests from {clients} closed-loop clients, {how}", **shared)
