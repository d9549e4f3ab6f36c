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
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

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
    if (rate is None) == (clients is None):
        raise InvalidInputError("give exactly one load: a request rate or a number of clients")
    if rate is not None and not (math.isfinite(rate) and rate > 0):
        raise InvalidInputError(f"the request rate must be a positive number of requests/s, got {rate}")
    if clients is not None and not (isinstance(clients, int) and clients > 0):
        raise InvalidInputError(f"the number of clients must be a positive integer, got {clients}")
    out = []
    for c in candidates:
        if not c.meets_targets or not (c.request_latency_ms > 0):
            continue
        rps = requests_per_s(c.concurrency, c.request_latency_ms)
        copies = math.ceil(clients / c.concurrency) if clients is not None else math.ceil(rate / rps - 1e-12)
        copies = max(copies, 1)
        out.append(Recommendation(mode, asdict(c), copies, copies * int(c.gpus), int(c.concurrency), rps, copies * rps,
                                  copies * int(c.concurrency)))
    key_headroom = (lambda r: -r.capacity_clients) if clients is not None else (lambda r: -r.capacity_requests_per_s)
    out.sort(key=lambda r: (r.gpus, key_headroom(r), r.unit["ttft_ms"]))
    return out


def recommend_deployment(results: dict, *, rate: float | None = None, clients: int | None = None,
                         top: int = 5) -> list[Recommendation]:
    """The ``top`` best ways to serve the load across the modes of ``results`` ({mode:
    SearchResult}), fewest GPUs first."""
    merged: list[Recommendation] = []
    for mode, res in results.items():
        merged += options(res.candidates, mode, rate=rate, clients=clients)
    key_headroom = (lambda r: -r.capacity_clients) if clients is not None else (lambda r: -r.capacity_requests_per_s)
    merged.sort(key=lambda r: (r.gpus, key_headroom(r), r.unit["ttft_ms"]))
    return merged[:top]
