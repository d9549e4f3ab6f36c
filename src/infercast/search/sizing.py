"""Sizing: the fewest GPUs that serve a load within the latency targets (``infercast recommend``).

A load is either a request rate (requests/s arriving at the service) or a number of concurrent
clients (closed loop). Each searched deployment unit -- an aggregated replica, or a disaggregated
set of prefill and decode workers -- has been evaluated at several concurrencies ``c`` by the
serving model; at a concurrency where it meets the targets it serves

* ``c`` clients, and
* ``c / request latency`` requests per second (Little's law for a closed loop: each of its ``c``
  clients sends its next request when the last one completes),

so the load needs ``ceil(clients / c)`` or ``ceil(rate / (c / latency))`` copies of the unit, i.e.
copies x the unit's GPUs. The answer is the unit and concurrency with the fewest GPUs in all;
ties go to more headroom (the most requests/s, or clients, the copies could carry), then the lower
TTFT. Copies serve independent shares of the load (a router spreads requests evenly), so each
copy runs at the evaluated per-copy concurrency or below, where latencies are no worse.

The rate model assumes arrivals a closed loop of ``c`` clients per copy could carry; bursty
open-loop traffic queues beyond that (request-level simulation models it).

Each listed option carries the 80% / 95% prediction intervals of its unit's figures (the search
candidate's, :func:`infercast.search.run.candidate_intervals`) and of its request rates per copy
and in all: a rate is ``c / request latency``, so its range is the request latency's range turned
over (:meth:`infercast.serving.intervals.Interval.inverse`). The copy count itself is sized on the
predicted latency; the rate ranges say how much of the load the copies would carry if the
measured latency fell at the ends.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from ..errors import InvalidInputError


@dataclass(frozen=True)
class Recommendation:
    """One way to serve the load: ``copies`` of candidate ``unit`` (an aggregated replica or a
    disaggregated deployment) at ``concurrency_per_copy`` clients each."""

    mode: str
    unit: dict  # the search candidate's fields
    copies: int
    gpus: int
    concurrency_per_copy: int
    requests_per_s_per_copy: float
    capacity_requests_per_s: float  # copies x requests_per_s_per_copy
    capacity_clients: int  # copies x concurrency_per_copy
    #: prediction intervals by figure ({"ttft_ms": {"p80": [lo, hi], "p95": ..., "cell", "n"}, ...}):
    #: the unit's figures and the two request rates (:func:`recommendation_intervals`)
    intervals: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def requests_per_s(concurrency: float, request_latency_ms: float) -> float:
    """Requests/s a closed loop of ``concurrency`` clients completes at a mean request latency of
    ``request_latency_ms`` (Little's law)."""
    return float(concurrency) / (float(request_latency_ms) / 1000.0)


def options(candidates: list, mode: str, *, rate: float | None = None, clients: int | None = None) -> list[Recommendation]:
    """Every way the candidates that meet their targets serve the load (``rate`` requests/s or
    ``clients`` concurrent clients: exactly one), best first (fewest GPUs, then most headroom,
    then lowest TTFT)."""
    return [r for r, _ in _ranked(_options(candidates, mode, rate=rate, clients=clients), clients)]


def _options(candidates: list, mode: str, *, rate: float | None, clients: int | None) -> list[tuple[Recommendation, object]]:
    """:func:`options` unsorted, each with the candidate it was built from."""
    _check_load(rate, clients)
    out = []
    for c in candidates:
        if not c.meets_targets or not (c.request_latency_ms > 0):
            continue
        rps = requests_per_s(c.concurrency, c.request_latency_ms)
        copies = math.ceil(clients / c.concurrency) if clients is not None else math.ceil(rate / rps - 1e-12)
        copies = max(copies, 1)
        out.append((Recommendation(mode, asdict(c), copies, copies * int(c.gpus), int(c.concurrency), rps, copies * rps,
                                   copies * int(c.concurrency)), c))
    return out


def _ranked(pairs: list[tuple], clients: int | None) -> list[tuple]:
    """``pairs`` (a :class:`Recommendation` first) fewest GPUs first, then most headroom (clients
    for a client load, requests/s for a rate), then lowest TTFT."""
    def key(p):
        r = p[0]
        return (r.gpus, -r.capacity_clients if clients is not None else -r.capacity_requests_per_s, r.unit["ttft_ms"])

    return sorted(pairs, key=key)


def recommendation_intervals(rec: Recommendation, candidate, res) -> dict:
    """The prediction intervals of ``rec`` (built from ``candidate`` of search result ``res``) as
    JSON: the candidate's figures (:func:`~infercast.search.run.candidate_intervals`) and
    ``requests_per_s_per_copy`` / ``capacity_requests_per_s``, from the request latency's range."""
    from ..serving.intervals import intervals_dict
    from .run import candidate_intervals

    iv = candidate_intervals(candidate, res)
    lat = iv.get("request_latency_ms")
    if lat is not None:
        of = float(candidate.request_latency_ms)
        iv["requests_per_s_per_copy"] = lat.inverse(rec.requests_per_s_per_copy, of)
        iv["capacity_requests_per_s"] = lat.inverse(rec.capacity_requests_per_s, of)
    return intervals_dict(iv)


def recommend_deployment(results: dict, *, rate: float | None = None, clients: int | None = None,
                         top: int = 5) -> list[Recommendation]:
    """The ``top`` best ways to serve the load across the modes of ``results`` ({mode:
    SearchResult}), fewest GPUs first, each with its prediction intervals
    (:func:`recommendation_intervals`)."""
    _check_load(rate, clients)
    # every option's ranking key from the candidates' columns; Recommendations built for the top only
    keys, where = [], []
    for mode, res in results.items():
        k = _option_keys(res.candidates, rate=rate, clients=clients)
        keys.append(k)
        where += [(mode, res, int(i)) for i in k[3]]
    if not where:
        return []
    gpus, headroom, ttft, _ = (np.concatenate([k[j] for k in keys]) for j in range(4))
    if np.isnan(headroom).any() or np.isnan(ttft).any():  # Python's tuple order, as _ranked sorts
        order = sorted(range(len(where)), key=lambda j: (gpus[j], headroom[j], ttft[j]))
    else:
        order = np.lexsort((np.arange(len(where)), ttft, headroom, gpus)).tolist()
    out = []
    for j in order[:top]:
        mode, res, i = where[j]
        r, c = _options([res.candidates[i]], mode, rate=rate, clients=clients)[0]
        out.append(replace(r, intervals=recommendation_intervals(r, c, res)))
    return out


def _option_keys(candidates, *, rate: float | None, clients: int | None) -> tuple:
    """For the candidates that meet their targets, :func:`_ranked`'s key parts as arrays (GPUs in
    all, minus the headroom, TTFT) and their indices: the same numbers :func:`_options` works out
    one candidate at a time, on columns (a search may have a million candidates)."""
    from .candidates import column_reader

    column = column_reader(candidates)
    ok = np.asarray(column("meets_targets"), dtype=bool)
    lat = np.asarray(column("request_latency_ms"), dtype=float)
    idx = np.flatnonzero(ok & (lat > 0))
    conc = np.asarray(column("concurrency"), dtype=np.int64)[idx]
    units = np.asarray(column("gpus"), dtype=np.int64)[idx]
    ttft = np.asarray(column("ttft_ms"), dtype=float)[idx]
    rps = conc.astype(float) / (lat[idx] / 1000.0)
    if clients is not None:
        copies = np.maximum(np.ceil(clients / conc), 1).astype(np.int64)
        headroom = -(copies * conc).astype(float)
    else:
        copies = np.maximum(np.ceil(rate / rps - 1e-12), 1).astype(np.int64)
        headroom = -(copies * rps)
    return copies * units, headroom, ttft, idx


def _check_load(rate: float | None, clients: int | None) -> None:
    """Exactly one load, and a valid one (:class:`InvalidInputError` otherwise)."""
    if (rate is None) == (clients is None):
        raise InvalidInputError("give exactly one load: a request rate or a number of clients")
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise InvalidInputError(f"the request rate must be a positive number of requests/s, got {rate}")
    if clients is not None and not (isinstance(clients, int) and clients > 0):
        raise InvalidInputError(f"the number of clients must be a positive integer, got {clients}")
