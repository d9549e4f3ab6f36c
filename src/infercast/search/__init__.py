"""Deployment search: enumerate parallel layouts, evaluate them with the serving model at each
concurrency, filter by latency targets, keep the Pareto frontier and recommend one
(:func:`search_agg`)."""

from .pareto import meets, pareto_front, recommend
from .run import Candidate, SearchResult, search_agg
from .space import Layout, layouts

__all__ = ["Candidate", "Layout", "SearchResult", "layouts", "meets", "pareto_front", "recommend", "search_agg"]
