"""What every serving model reports: the numbers a benchmark client measures.

Besides the means, the serving models report the p50 / p90 / p99 of TTFT and TPOT over the
benchmark's requests. They come from a per-request :class:`Distribution` (values with weights =
shares of the requests): the simulated first wave contributes its requests as they ran; the
analytic steady states contribute the spread their own assumptions imply (see
:mod:`.agg` and :mod:`.disagg`): where a request lands in the step cycle, how many prefill steps
interrupt its decoding, how long it queues. Quantiles are of that mixture, weighted by the share
of requests each part stands for — the same weights as the means.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from functools import lru_cache

import numpy as np

#: percentiles every serving result reports
PERCENTILES = (50, 90, 99)
#: points that stand for a continuous distribution (equal-weight quantile midpoints)
QUANTILE_POINTS = 200

#: where a request's time to first token goes (:attr:`ServingMetrics.ttft_parts`, in this order):
#: ``front_end``, the client and the engine's front end before the scheduler sees the request
#: (HTTP, tokenisation, the per-stream load of the API server); ``wait``, from then until the step
#: that carries its first prefill chunk begins (the step in progress, the scheduler's polls and
#: holds, other prompts ahead of it, a full KV cache or running set); ``prefill``, from that step's
#: start to the end of the step that completes its prompt (with whatever else those steps carry)
TTFT_PARTS = ("front_end", "wait", "prefill")


def ttft_parts(front_end: float, wait: float, prefill: float) -> dict[str, float]:
    """The :data:`TTFT_PARTS` of a mean TTFT, in ms."""
    return dict(zip(TTFT_PARTS, (float(front_end), float(wait), float(prefill))))


def blend_parts(*parts: tuple[dict[str, float], float]) -> dict[str, float]:
    """The parts of a mean over groups of requests: each part's mean, weighted by the groups'
    shares (as the mean TTFT of the mixture is)."""
    total = sum(share for _, share in parts)
    return {k: sum(p[k] * share for p, share in parts) / total for k in TTFT_PARTS}


@dataclass(frozen=True)
class Distribution:
    """Per-request values (ms) and their weights (any positive scale; shares of the requests)."""

    values: np.ndarray
    weights: np.ndarray

    def __post_init__(self):
        v = np.asarray(self.values, float).ravel()
        w = np.asarray(self.weights, float).ravel()
        if v.shape != w.shape or not len(v) or (w < 0).any() or not w.sum() > 0:
            raise ValueError("a distribution needs matching values and non-negative weights with a positive sum")
        object.__setattr__(self, "values", v)
        object.__setattr__(self, "weights", w)

    @classmethod
    def _made(cls, values: np.ndarray, weights: np.ndarray) -> Distribution:
        """A distribution of 1-D float arrays that are already what :meth:`__post_init__` checks
        and makes them (derived here from checked ones: shifted, scaled, mixed, quantile points)."""
        d = object.__new__(cls)
        object.__setattr__(d, "values", values)
        object.__setattr__(d, "weights", weights)
        return d

    @staticmethod
    def point(value: float) -> Distribution:
        return Distribution._made(np.array([float(value)]), np.array([1.0]))

    def mean(self) -> float:
        return float(np.dot(self.values, self.weights) / self.weights.sum())

    def percentile(self, q: float) -> float:
        """The smallest value with at least ``q`` % of the weight at or below it."""
        return self.percentiles((q,))[0]

    def percentiles(self, qs) -> list[float]:
        """:meth:`percentile` of each of ``qs``, sorting once."""
        if len(self.values) == 1:
            return [float(self.values[0])] * len(qs)
        o = np.argsort(self.values, kind="stable")
        cw = np.cumsum(self.weights[o])
        ordered = self.values[o]
        last = len(o) - 1
        return [float(ordered[min(int(np.searchsorted(cw, q / 100.0 * cw[-1] * (1.0 - 1e-12))), last)]) for q in qs]

    def shifted(self, ms: float) -> Distribution:
        return Distribution._made(self.values + float(ms), self.weights)

    def scaled(self, factor: float) -> Distribution:
        return Distribution._made(self.values * float(factor), self.weights)

    def plus(self, other: Distribution, n: int = QUANTILE_POINTS) -> Distribution:
        """The sum of independent draws from ``self`` and ``other``, as ``n`` equal-weight quantile
        midpoints, shifted so its mean is the exact sum of the two means."""
        vals = np.add.outer(self.values, other.values).ravel()
        wts = np.outer(self.weights / self.weights.sum(), other.weights / other.weights.sum()).ravel()
        if (wts == wts[0]).all():
            # equal weights (two sets of quantile midpoints): the cumulative weights in sorted
            # order are the same array whatever the order, so the values need sorting, not their
            # order (the same numbers as the general path, several times faster)
            q = np.sort(vals)[_equal_weight_picks(len(wts), float(wts[0]), n)]
        else:
            o = np.argsort(vals, kind="stable")
            cw = np.cumsum(wts[o])
            idx = np.minimum(np.searchsorted(cw, (np.arange(n) + 0.5) / n * cw[-1]), len(o) - 1)
            q = vals[o][idx]
        return Distribution._made(q + (self.mean() + other.mean() - q.mean()), np.ones(n))


@lru_cache(maxsize=64)
def _equal_weight_picks(size: int, weight: float, n: int) -> np.ndarray:
    """The positions, in sorted order, of the ``n`` quantile midpoints of ``size`` values of
    equal ``weight`` (:meth:`Distribution.plus`): the same for every pair of distributions of
    these sizes, so worked out once."""
    cw = np.cumsum(np.full(size, weight))
    idx = np.minimum(np.searchsorted(cw, (np.arange(n) + 0.5) / n * cw[-1]), size - 1)
    idx.setflags(write=False)
    return idx


def mixture(*parts: tuple[Distribution, float]) -> Distribution:
    """Requests drawn from ``parts`` in proportion to their shares (each part's weights normalised)."""
    vals, wts = [], []
    for d, share in parts:
        if share > 0:
            vals.append(d.values)
            wts.append(d.weights / d.weights.sum() * share)
    if not vals:  # no part with a positive share: refused as an empty distribution
        return Distribution(np.zeros(0), np.zeros(0))
    return Distribution._made(np.concatenate(vals), np.concatenate(wts))


def uniform(lo: float, hi: float, n: int = QUANTILE_POINTS, shift: float | None = None) -> Distribution:
    """Uniform on ``[lo, hi]`` as ``n`` equal-weight quantile midpoints (then ``shift`` ms added,
    as :meth:`Distribution.shifted` adds it)."""
    u = (np.arange(n) + 0.5) / n
    v = lo + (hi - lo) * u
    return Distribution._made(v if shift is None else v + float(shift), np.ones(n))


def binomial_share(trials: float, p: float) -> Distribution:
    """The share ``B / n`` of ``n`` independent trials that succeed with probability ``p``
    (``n`` rounded to a whole number of trials, at least one): exact probabilities."""
    n = max(1, int(round(trials)))
    p = min(max(float(p), 0.0), 1.0)
    if p in (0.0, 1.0):
        return Distribution.point(p)
    # the counts within 12 standard deviations of the mean carry all but ~1e-30 of the mass; a
    # few trials are all kept (there the window's skewed tail can hold ~1e-9 of the mean)
    half = 12.0 * math.sqrt(n * p * (1.0 - p)) + 1.0
    lo, hi = max(0, int(n * p - half)), min(n, int(math.ceil(n * p + half)))
    if n <= 256:
        lo, hi = 0, n
    k = np.arange(lo, hi + 1)
    # log C(n, k) from C(n, lo) by the ratio (n - k + 1) / k, vectorised
    steps = np.log(n - k[1:] + 1.0) - np.log(k[1:].astype(float))
    log_c = math.lgamma(n + 1) - math.lgamma(lo + 1) - math.lgamma(n - lo + 1) + np.concatenate(([0.0], np.cumsum(steps)))
    logp = log_c + k * math.log(p) + (n - k) * math.log1p(-p)
    w = np.exp(logp - logp.max())
    keep = w > 1e-12 * w.sum()
    return Distribution._made(k[keep] / n, w[keep])


_UNIT_EXPONENTIAL: dict[int, tuple[np.ndarray, float]] = {}


def _unit_exponential(n: int) -> tuple[np.ndarray, float]:
    """The unit exponential's ``n`` quantile midpoints and their mean (computed once per ``n``;
    the array is read-only, shared by every caller)."""
    if n not in _UNIT_EXPONENTIAL:
        x = -np.log1p(-((np.arange(n) + 0.5) / n))
        x.setflags(write=False)
        _UNIT_EXPONENTIAL[n] = (x, x.mean())
    return _UNIT_EXPONENTIAL[n]


def exponential_tail(mean: float, p_zero: float, n: int = QUANTILE_POINTS) -> Distribution:
    """0 with probability ``p_zero``, else exponential with the mean that makes the overall mean
    ``mean`` (a queueing wait: no wait when the server is free, an exponential tail otherwise)."""
    p_zero = min(max(float(p_zero), 0.0), 1.0)
    if mean <= 0 or p_zero >= 1.0:
        return Distribution.point(0.0)
    x, x_mean = _unit_exponential(n)  # unit exponential at quantile midpoints, rescaled to the exact mean
    tail = Distribution(x * (mean / (1.0 - p_zero) / x_mean), np.ones(n))
    return mixture((Distribution.point(0.0), p_zero), (tail, 1.0 - p_zero)) if p_zero > 0 else tail


@dataclass
class ServingMetrics:
    concurrency: float  # clients of one attention-DP rank (agg) or of the deployment (disagg)
    ttft_ms: float  # mean time to first token, from the client's send
    tpot_ms: float  # mean time per output token after the first
    request_latency_ms: float
    tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float
    # over the benchmark's requests (set by :meth:`set_percentiles`; keyword-only, so subclasses
    # keep their positional fields)
    ttft_p50_ms: float | None = field(default=None, kw_only=True)
    ttft_p90_ms: float | None = field(default=None, kw_only=True)
    ttft_p99_ms: float | None = field(default=None, kw_only=True)
    tpot_p50_ms: float | None = field(default=None, kw_only=True)
    tpot_p90_ms: float | None = field(default=None, kw_only=True)
    tpot_p99_ms: float | None = field(default=None, kw_only=True)
    # mean TTFT split by where the time goes (TTFT_PARTS; the parts sum to ttft_ms), or None
    ttft_parts: dict[str, float] | None = field(default=None, kw_only=True)
    #: what the caller should know about the numbers (e.g. ops answered beyond their tables)
    notes: list[str] = field(default_factory=list, kw_only=True)
    ttft_dist: Distribution | None = field(default=None, kw_only=True, repr=False)  # per request
    tpot_dist: Distribution | None = field(default=None, kw_only=True, repr=False)

    def to_dict(self) -> dict:
        """The numbers (per-request distributions, fields ending in ``_dist``, and fields marked
        ``metadata={"report": False}`` left out)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if not f.name.endswith("_dist") and f.metadata.get("report", True)}

    def set_percentiles(self, ttft: Distribution, tpot: Distribution) -> None:
        """Keep the per-request distributions and fill ``ttft_p50_ms`` ... ``tpot_p99_ms``."""
        for metric, dist in (("ttft", ttft), ("tpot", tpot)):
            setattr(self, f"{metric}_dist", dist)
            for q, v in zip(PERCENTILES, dist.percentiles(PERCENTILES)):
                setattr(self, f"{metric}_p{q}_ms", v)
