"""Deployment search: enumerate parallel layouts, evaluate them with the serving model at each
concurrency, filter by latency targets, keep the Pareto frontier and recommend one
(:func:`search_agg`; disaggregated prefill/decode worker splits: :func:`search_disagg`; every
deployment of a fixed number of GPUs at one concurrency: :func:`search_fixed`; the fewest GPUs
for a load: :mod:`.sizing`)."""

from .fixed import search_fixed
from .pareto import meets, pareto_front, recommend
from .run import (
           Candidate,
           DisaggCandidate,
           SearchResult,
           search_agg,
           search_backends,
           search_disagg,
)
from .space import Layout, layouts

__all__ = ["Candidate", "DisaggCandidate", "Layout", "SearchResult", "layouts", "meets", "pareto_front", "recommend", "search_agg", "search_backends", "search_disagg",
           "search_fixed"]
