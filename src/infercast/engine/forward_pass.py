"""Forward-pass model: the time of one scheduler iteration, corrected online from measured times.

A simulator (a serving mocker, a planner) describes each iteration as the scheduler saw it, per
attention-DP rank (:class:`RankLoad`), and asks :class:`ForwardPassModel` for its time. The
iteration's *kind* follows from the fields: ``prefill`` (prompt tokens scheduled, no decodes),
``decode`` (decodes, no prompt tokens), ``mixed`` (both, continuous batching with chunked
prefill) or ``empty`` (neither: 0 ms, never learned from). The iteration takes as long as its
slowest rank.

One rank's step, from :class:`~infercast.engine.surface.Surface` (``Surface.mixed_ms``):
``prefill_requests`` sequences of ``prefill_tokens / prefill_requests`` new tokens each after
``prefill_cached_tokens / prefill_requests`` cached ones, and ``decode_requests`` decodes at KV
length ``decode_kv_tokens / decode_requests`` (the new token included). Sequences of one rank are
taken at their mean length: attention over uneven lengths costs somewhat more than at the mean
(it grows faster than linearly with the prompt), which the online correction absorbs.

Online correction (:meth:`ForwardPassModel.observe`): each measured iteration's ratio
``measured / engine`` updates, in log space, an exponential moving average with weight ``alpha``
(the first sample sets it) in the cell of its kind's workload grid (prefill: prefill tokens;
decode: decode requests x KV tokens; mixed: prefill tokens x KV tokens; cells are powers of two,
the features the slowest-loaded rank's) and in the kind as a whole. An estimate is multiplied by
its cell's factor once the cell holds ``min_samples`` observations, else by the kind's once the
kind does, else not at all; a factor is clipped to ``[min_factor, max_factor]`` (default 0.5-2:
at most 2x faster or slower; either may be None, unbounded). Empty iterations and non-positive
or non-finite times are ignored. Everything is deterministic: the same observations in the same
order give the same factors.

Regression (:meth:`ForwardPassModel.regression`, or :meth:`best_available` when the
configuration is not supported): per kind, time is fitted by non-negative least squares against
the kind's workload features (:data:`FEATURES`) over every retained observation of that kind;
until a kind holds ``min_regression_samples`` observations its estimates are None.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from itertools import combinations

import numpy as np

from ..errors import InfercastError, InvalidInputError

KINDS = ("prefill", "decode", "mixed")
#: regression features per kind (besides a constant): see :func:`features`
FEATURES = {
    "prefill": ("prefill_tokens", "attention_pairs"),
    "decode": ("decode_requests", "decode_kv_tokens"),
    "mixed": ("prefill_tokens", "attention_pairs", "decode_requests", "decode_kv_tokens"),
}


@dataclass(frozen=True)
class RankLoad:
    """What one attention-DP rank's scheduler put into one iteration (JSON: the same names).

    Attributes:
        prefill_requests: requests with prompt tokens scheduled this iteration (a whole prompt or
            a chunk of one).
        prefill_tokens: new prompt tokens those requests add, summed.
        prefill_cached_tokens: tokens those requests already hold in the KV cache (a reused
            prefix, or earlier chunks), summed.
        decode_requests: requests generating one token this iteration.
        decode_kv_tokens: KV length each decode attends over (the new token included), summed.
        queued_prefill_requests: waiting requests; accepted for schema compatibility, ignored.
        queued_decode_requests: likewise, ignored.
    """

    prefill_requests: int = 0
    prefill_tokens: int = 0
    prefill_cached_tokens: int = 0
    decode_requests: int = 0
    decode_kv_tokens: int = 0
    queued_prefill_requests: int = 0
    queued_decode_requests: int = 0

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(v) or v < 0:
                raise InvalidInputError(f"RankLoad.{f.name} must be a finite number >= 0", f"got {v!r}")
        if self.prefill_tokens > 0 and self.prefill_requests <= 0:
            raise InvalidInputError("prefill_tokens > 0 needs prefill_requests >= 1", f"got {self.prefill_requests}")
        if self.decode_requests > 0 and self.decode_kv_tokens < self.decode_requests:
            raise InvalidInputError("decode_kv_tokens must be at least decode_requests (one token each)",
                                    f"got {self.decode_kv_tokens} for {self.decode_requests} requests")

    @property
    def kind(self) -> str:
        return _kind(self.prefill_tokens > 0, self.decode_requests > 0)

    @classmethod
    def from_dict(cls, d: dict) -> RankLoad:
        if not isinstance(d, dict):
            raise InvalidInputError("a rank's load must be a JSON object", f"got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known - IGNORED_KEYS)
        if unknown:
            raise InvalidInputError(f"unknown rank-load fields {unknown}", "known fields", known)
        return cls(**{k: v for k, v in d.items() if k in known})

    def to_dict(self) -> dict:
        return asdict(self)


#: keys a caller may send and the model ignores (a measured time is passed to observe() apart)
IGNORED_KEYS = frozenset({"wall_time", "wall_time_ms", "rank"})


def _kind(prefill: bool, decode: bool) -> str:
    return ("mixed" if decode else "prefill") if prefill else ("decode" if decode else "empty")


@dataclass(frozen=True)
class Iteration:
    """One iteration: one :class:`RankLoad` per attention-DP rank. JSON: ``{"ranks": [...]}``,
    a list of rank objects, or one rank object (a single rank)."""

    ranks: tuple

    def __post_init__(self):
        if not self.ranks:
            raise InvalidInputError("an iteration needs at least one rank", "got none")
        if not all(isinstance(r, RankLoad) for r in self.ranks):
            object.__setattr__(self, "ranks", tuple(r if isinstance(r, RankLoad) else RankLoad.from_dict(r) for r in self.ranks))

    @property
    def kind(self) -> str:
        return _kind(any(r.prefill_tokens > 0 for r in self.ranks), any(r.decode_requests > 0 for r in self.ranks))

    @classmethod
    def of(cls, x) -> Iteration:
        """An Iteration from itself, a RankLoad, a dict or a list of either."""
        if isinstance(x, Iteration):
            return x
        if isinstance(x, RankLoad):
            return cls((x,))
        return cls.from_dict(x)

    @classmethod
    def from_dict(cls, d) -> Iteration:
        if isinstance(d, dict) and "ranks" in d:
            d = d["ranks"]
        if isinstance(d, dict):
            d = [d]
        if not isinstance(d, (list, tuple)):
            raise InvalidInputError("an iteration must be {'ranks': [...]}, a list of rank objects or one rank object",
                                    f"got {type(d).__name__}")
        return cls(tuple(RankLoad.from_dict(r) if not isinstance(r, RankLoad) else r for r in d))

    def to_dict(self) -> dict:
        return {"ranks": [r.to_dict() for r in self.ranks]}

    def features(self) -> dict:
        """The workload features of the iteration: each the largest over its ranks."""
        return {k: max(v) for k, v in zip(FEATURE_NAMES, zip(*(features(r) for r in self.ranks)))}


FEATURE_NAMES = ("prefill_tokens", "attention_pairs", "decode_requests", "decode_kv_tokens")


def features(r: RankLoad) -> tuple:
    """``(prefill_tokens, attention_pairs, decode_requests, decode_kv_tokens)`` of one rank;
    ``attention_pairs`` is the causal query-key pairs of its prompt tokens at their mean length,
    ``T * (C + T / 2) / n`` for ``T`` new and ``C`` cached tokens over ``n`` requests."""
    n = r.prefill_requests
    pairs = r.prefill_tokens * (r.prefill_cached_tokens + r.prefill_tokens / 2.0) / n if n > 0 else 0.0
    return (float(r.prefill_tokens), float(pairs), float(r.decode_requests), float(r.decode_kv_tokens))


@dataclass(frozen=True)
class IterationEstimate:
    """An iteration's estimated time and where it comes from.

    Attributes:
        ms: milliseconds (None: a regression model with too few observations of this kind).
        kind: prefill / decode / mixed / empty.
        source: ``engine`` (compiled surfaces, uncorrected), ``corrected`` (times a learned
            factor), ``regression``, or ``empty``.
        engine_ms: the uncorrected engine time (None for a regression model).
        factor: the correction factor applied (1.0 when none).
        slowest_rank: index of the rank that sets the time.
    """

    ms: float | None
    kind: str
    source: str
    engine_ms: float | None
    factor: float
    slowest_rank: int


@dataclass(frozen=True)
class CorrectionOptions:
    """Online-correction settings (see the module docstring)."""

    alpha: float = 0.2
    min_samples: int = 3
    min_factor: float | None = 0.5
    max_factor: float | None = 2.0
    min_regression_samples: int = 8
    max_retained: int = 100_000

    def __post_init__(self):
        if not 0.0 < self.alpha <= 1.0:
            raise InvalidInputError("alpha must be in (0, 1]", f"got {self.alpha!r}")
        if self.min_factor is not None and not 0.0 < self.min_factor <= 1.0:
            raise InvalidInputError("min_factor must be in (0, 1] or None (unbounded)", f"got {self.min_factor!r}")
        if self.max_factor is not None and not (self.max_factor >= 1.0 and math.isfinite(self.max_factor)):
            raise InvalidInputError("max_factor must be a finite number >= 1 or None (unbounded)", f"got {self.max_factor!r}")
        if int(self.min_samples) < 1 or int(self.min_regression_samples) < 1 or int(self.max_retained) < 1:
            raise InvalidInputError("sample counts must be >= 1", f"got {self.min_samples}, {self.min_regression_samples}, {self.max_retained}")


def _cell(v: float) -> int:
    """Power-of-two cell of a workload feature (0 for values below 1)."""
    return 0 if v < 1.0 else 1 + int(math.floor(math.log2(v)))


class _Ema:
    """A log-space moving average of ratios with its sample count."""

    __slots__ = ("n", "log")

    def __init__(self):
        self.n = 0
        self.log = 0.0

    def add(self, log_ratio: float, alpha: float) -> None:
        self.log = log_ratio if self.n == 0 else self.log + alpha * (log_ratio - self.log)
        self.n += 1


class ForwardPassModel:
    """Iteration times from compiled surfaces, corrected online, or from a regression alone.

    Build with :meth:`from_estimator` / :meth:`from_surface` (engine-backed), :meth:`regression`
    (regression only) or :meth:`best_available` (engine when the configuration is supported)."""

    def __init__(self, surface=None, options: CorrectionOptions | None = None, reason: str | None = None):
        self.surface = surface
        self.options = options or CorrectionOptions()
        self.reason = reason
        self.table = None
        self.identity = dict(getattr(surface, "identity", None) or {})
        self._roofline = None
        self._kind_ema = {k: _Ema() for k in KINDS}
        self._cells: dict = {k: {} for k in KINDS}
        self._obs: list = []  # (kind, features tuple, engine_ms or nan, measured_ms)
        self._fits: dict = {}

    # ---- construction ------------------------------------------------------------------------
    @classmethod
    def from_estimator(cls, est, options: CorrectionOptions | None = None) -> ForwardPassModel:
        return cls(est.surface(), options)

    @classmethod
    def from_surface(cls, surface, options: CorrectionOptions | None = None) -> ForwardPassModel:
        return cls(surface, options)

    @classmethod
    def regression(cls, options: CorrectionOptions | None = None, reason: str | None = None) -> ForwardPassModel:
        return cls(None, options, reason or "regression-only model requested")

    @classmethod
    def best_available(cls, config: dict, options: CorrectionOptions | None = None) -> ForwardPassModel:
        """The engine-backed model of ``config`` (keyword arguments of
        :class:`~infercast.Estimator`: model, system, backend, and optional backend_version, tp,
        pp, attention_dp, moe_tp, moe_ep, quant overrides, ...) when infercast supports it,
        else a regression-only model whose diagnostics carry the reason."""
        from ..api import Estimator

        try:
            est = Estimator(**config)
            return cls(est.surface(), options)
        except InfercastError as exc:
            return cls(None, options, f"{type(exc).__name__}: {exc}")
        except TypeError as exc:  # a config key Estimator does not take
            return cls(None, options, f"unsupported configuration: {exc}")

    def use_table(self, table, identity: dict | None = None, roofline=None) -> ForwardPassModel:
        """Answer from a whole-forward table first (:class:`~infercast.engine.fpm_table.FpmTable`):
        ``identity`` is this model's configuration (default: the surface's), ``roofline`` the
        ``(identity, kind, point) -> ms`` function a transfer from another layout needs
        (:func:`sol_roofline`; None: no transfers)."""
        from .fpm_table import identity_key

        if identity is not None:
            self.identity = dict(identity)
        identity_key(self.identity)  # complete enough to look up
        self.table = table
        self._roofline = roofline
        return self

    # ---- estimates ---------------------------------------------------------------------------
    def _from_table(self, it: Iteration, kind: str):
        from .fpm_table import KIND_AXES

        f = it.features()
        ans = self.table.lookup(self.identity, kind, {a: f[a] for a in KIND_AXES[kind]}, self._roofline)
        return ans if ans.ms is not None else None

    def _rank_ms(self, r: RankLoad) -> float:
        np_, nd = r.prefill_requests, r.decode_requests
        if r.prefill_tokens > 0:
            return self.surface.mixed_ms(np_, r.prefill_tokens / np_, r.prefill_cached_tokens / np_,
                                         nd, r.decode_kv_tokens / nd if nd else 1.0)
        if nd > 0:
            return self.surface.decode_step_ms(nd, r.decode_kv_tokens / nd)
        return 0.0

    def engine_ms(self, iteration) -> tuple[float, int]:
        """Uncorrected engine time of an iteration and its slowest rank."""
        it = Iteration.of(iteration)
        best, arg = 0.0, 0
        for k, r in enumerate(it.ranks):
            v = self._rank_ms(r)
            if v > best:
                best, arg = v, k
        return best, arg

    def estimate(self, iteration) -> IterationEstimate:
        """The time of one iteration (:class:`Iteration`, a :class:`RankLoad`, or their dict form)."""
        it = Iteration.of(iteration)
        kind = it.kind
        if kind == "empty":
            return IterationEstimate(0.0, kind, "empty", 0.0 if self.surface is not None else None, 1.0, 0)
        if self.table is not None:
            hit = self._from_table(it, kind)
            if hit is not None:
                raw = self.engine_ms(it)[0] if self.surface is not None else None
                return IterationEstimate(hit.ms, kind, "fpm_table" if hit.how != "transferred" else "fpm_transfer", raw, 1.0, 0)
        if self.surface is None:
            return IterationEstimate(self._regress(kind, it.features()), kind, "regression", None, 1.0, 0)
        raw, arg = self.engine_ms(it)
        f = self._factor(kind, it.features())
        return IterationEstimate(raw * f if f is not None else raw, kind, "engine" if f is None else "corrected", raw,
                                 1.0 if f is None else f, arg)

    def estimate_ms(self, iteration) -> float | None:
        """:meth:`estimate`'s milliseconds alone (a single :class:`RankLoad` takes a short path)."""
        if type(iteration) is RankLoad and self.surface is not None and self.table is None:
            r = iteration
            if r.prefill_tokens > 0:
                kind = "mixed" if r.decode_requests > 0 else "prefill"
            elif r.decode_requests > 0:
                kind = "decode"
            else:
                return 0.0
            raw = self._rank_ms(r)
            if self._kind_ema[kind].n < self.options.min_samples:
                return raw  # no cell of this kind can be ready either
            f = self._factor(kind, dict(zip(FEATURE_NAMES, features(r))))
            return raw if f is None else raw * f
        return self.estimate(iteration).ms

    def estimate_many(self, iterations) -> np.ndarray:
        """Milliseconds of many iterations (NaN where a regression model is not ready). Either a
        sequence of iterations, or a dict of arrays shaped ``(iterations, ranks)`` or
        ``(iterations,)`` keyed by the :class:`RankLoad` field names (the vectorised form)."""
        if isinstance(iterations, dict):
            if self.table is not None:
                raise InvalidInputError("the array form does not consult a whole-forward table",
                                        "pass a sequence of iterations to answer from the table first")
            return self._estimate_arrays(iterations)
        return np.asarray([np.nan if (e := self.estimate_ms(i)) is None else e for i in iterations], dtype=float)

    def _estimate_arrays(self, cols: dict) -> np.ndarray:
        names = ("prefill_requests", "prefill_tokens", "prefill_cached_tokens", "decode_requests", "decode_kv_tokens")
        arrs = np.broadcast_arrays(*(np.asarray(cols.get(n, 0.0), dtype=float) for n in names))
        if arrs[0].ndim == 1:
            arrs = [a[:, None] for a in arrs]
        pr, pt, pc, dr, dk = arrs
        if any(np.any(a < 0) or not np.all(np.isfinite(a)) for a in arrs):
            raise InvalidInputError("iteration arrays must be finite numbers >= 0", "got a negative or non-finite entry")
        pre, dec = pt > 0, dr > 0
        kind_code = np.where(pre.any(axis=1), np.where(dec.any(axis=1), 2, 0), np.where(dec.any(axis=1), 1, -1))
        npq = np.where(pre, pr, 1.0)
        ndq = np.where(dec, dr, 1.0)
        feats = np.stack([pt.max(axis=1), (pt * (pc + pt / 2.0) / npq).max(axis=1), dr.max(axis=1), dk.max(axis=1)], axis=1)
        if self.surface is None:
            out = np.full(len(kind_code), np.nan)
            for code, kind in enumerate(KINDS):
                m = kind_code == code
                if m.any():
                    fit = self._fit(kind)
                    if fit is not None:
                        out[m] = self._apply_fit(kind, fit, feats[m])
            out[kind_code < 0] = 0.0
            return out
        S = self.surface
        ms = np.zeros(pt.shape)
        only_dec = dec & ~pre
        if only_dec.any():
            ms[only_dec] = S.decode_step_many(dr[only_dec], dk[only_dec] / dr[only_dec])
        only_pre = pre & ~dec
        if only_pre.any():
            ms[only_pre] = S.prefill_many(npq[only_pre], pt[only_pre] / npq[only_pre], pc[only_pre] / npq[only_pre])
        both = pre & dec
        if both.any():
            ms[both] = S.mixed_many(npq[both], pt[both] / npq[both], pc[both] / npq[both], dr[both], dk[both] / ndq[both])
        raw = ms.max(axis=1)
        fac = np.ones(len(raw))
        for k in range(len(raw)):
            if kind_code[k] >= 0:
                f = self._factor(KINDS[kind_code[k]], dict(zip(FEATURE_NAMES, feats[k])))
                if f is not None:
                    fac[k] = f
        return raw * fac

    # ---- correction --------------------------------------------------------------------------
    @staticmethod
    def _cell_key(kind: str, f: dict) -> tuple:
        if kind == "prefill":
            return (_cell(f["prefill_tokens"]),)
        if kind == "decode":
            return (_cell(f["decode_requests"]), _cell(f["decode_kv_tokens"]))
        return (_cell(f["prefill_tokens"]), _cell(f["decode_kv_tokens"]))

    def _clip(self, log_ratio: float) -> float:
        f = math.exp(log_ratio)
        o = self.options
        if o.min_factor is not None and f < o.min_factor:
            f = o.min_factor
        if o.max_factor is not None and f > o.max_factor:
            f = o.max_factor
        return f

    def _factor(self, kind: str, f: dict) -> float | None:
        need = self.options.min_samples
        cell = self._cells[kind].get(self._cell_key(kind, f))
        if cell is not None and cell.n >= need:
            return self._clip(cell.log)
        k = self._kind_ema[kind]
        if k.n >= need:
            return self._clip(k.log)
        return None

    def observe(self, iterations, measured_ms) -> int:
        """Learn from measured iteration times: one iteration and one time, or sequences of each.
        Returns how many observations were used (empty iterations and non-positive or non-finite
        times are skipped)."""
        if isinstance(iterations, (list, tuple)) and isinstance(measured_ms, (list, tuple, np.ndarray)):
            if len(iterations) != len(measured_ms):
                raise InvalidInputError("observe() needs one measured time per iteration",
                                        f"got {len(iterations)} iterations and {len(measured_ms)} times")
            return sum(self._observe_one(Iteration.of(i), float(m)) for i, m in zip(iterations, measured_ms))
        return self._observe_one(Iteration.of(iterations), float(measured_ms))

    def _observe_one(self, it: Iteration, measured: float) -> int:
        kind = it.kind
        if kind == "empty" or not (measured > 0.0 and math.isfinite(measured)):
            return 0
        f = it.features()
        raw = math.nan
        if self.surface is not None:
            raw, _ = self.engine_ms(it)
            if raw > 0.0:
                lr = math.log(measured / raw)
                a = self.options.alpha
                self._kind_ema[kind].add(lr, a)
                self._cells[kind].setdefault(self._cell_key(kind, f), _Ema()).add(lr, a)
        else:
            self._kind_ema[kind].n += 1
        self._obs.append((kind, tuple(f[n] for n in FEATURE_NAMES), raw, measured, it))
        if len(self._obs) > self.options.max_retained:
            del self._obs[: len(self._obs) - self.options.max_retained]
        self._fits.pop(kind, None)
        return 1

    # ---- regression --------------------------------------------------------------------------
    def _fit(self, kind: str):
        if kind in self._fits:
            return self._fits[kind]
        rows = [(feat, m) for k, feat, _, m, _ in self._obs if k == kind]
        cols = [FEATURE_NAMES.index(n) for n in FEATURES[kind]]
        need = max(int(self.options.min_regression_samples), len(cols) + 1)
        fit = None
        if len(rows) >= need:
            X = np.asarray([[1.0] + [feat[c] for c in cols] for feat, _ in rows])
            y = np.asarray([m for _, m in rows])
            fit = nnls(X, y)
        self._fits[kind] = fit
        return fit

    @staticmethod
    def _apply_fit(kind: str, coef: np.ndarray, feats: np.ndarray) -> np.ndarray:
        cols = [FEATURE_NAMES.index(n) for n in FEATURES[kind]]
        return coef[0] + feats[:, cols] @ coef[1:]

    def _regress(self, kind: str, f: dict) -> float | None:
        coef = self._fit(kind)
        if coef is None:
            return None
        return float(coef[0] + sum(c * f[n] for c, n in zip(coef[1:], FEATURES[kind])))

    def regression_coefficients(self, kind: str) -> dict | None:
        """The fitted coefficients of a kind (``const`` and one per feature), or None if not ready."""
        coef = self._fit(kind)
        return None if coef is None else dict(zip(("const", *FEATURES[kind]), coef.tolist()))

    # ---- diagnostics -------------------------------------------------------------------------
    def diagnostics(self) -> dict:
        """Source, readiness, sample counts and factors per kind, and the mean absolute
        percentage error of the observations so far before and after correction (after: with
        the current factors, or the current fit for a regression model)."""
        o = self.options
        samples = {k: self._kind_ema[k].n for k in KINDS}
        if self.surface is None:
            ready = {k: self._fit(k) is not None for k in KINDS}
            source = "regression"
        else:
            ready = {k: samples[k] >= o.min_samples for k in KINDS}
            source = "corrected" if any(ready.values()) else "engine"
        factors = {}
        for k in KINDS:
            e = self._kind_ema[k]
            factors[k] = {
                "kind": self._clip(e.log) if self.surface is not None and e.n else None,
                "cells": [{"cell": list(key), "samples": c.n, "factor": self._clip(c.log)}
                          for key, c in sorted(self._cells[k].items())],
            }
        before, after = [], []
        for kind, feat, raw, m, it in self._obs:
            if self.surface is not None:
                before.append(abs(raw / m - 1.0))
                f = self._factor(kind, dict(zip(FEATURE_NAMES, feat)))
                after.append(abs(raw * (f or 1.0) / m - 1.0))
            else:
                r = self._regress(kind, dict(zip(FEATURE_NAMES, feat)))
                if r is not None:
                    after.append(abs(r / m - 1.0))
        return {
            "source": source, "reason": self.reason, "ready": ready, "samples": samples, "factors": factors,
            "regression": {k: self.regression_coefficients(k) for k in KINDS} if self.surface is None else None,
            "error_before": float(np.mean(before)) if before else None,
            "error_after": float(np.mean(after)) if after else None,
            "observations": len(self._obs),
            "options": asdict(o),
            "identity": getattr(self.surface, "identity", None),
        }

    def observations(self) -> list[dict]:
        """The retained observations: per iteration its kind, features, engine and measured ms,
        and the iteration itself."""
        return [{"kind": k, **dict(zip(FEATURE_NAMES, f)), "engine_ms": None if math.isnan(r) else r, "measured_ms": m,
                 "iteration": it.to_dict()} for k, f, r, m, it in self._obs]

    def export_observations(self, identity: dict | None = None):
        """A whole-forward table (:class:`~infercast.engine.fpm_table.FpmTable`) of the retained
        observations under ``identity`` (default: the surface's): per kind, one row per
        power-of-two cell of its axes at the cell's centre, the median of the cell's measured
        times, each carried to the centre by the engine's own shape (prefill: one request of the
        tokens; decode: the requests at their mean KV length; mixed and regression-only models:
        not carried)."""
        from .fpm_table import KIND_AXES, FpmTable, grid_rows, identity_key

        ident = dict(identity or self.identity)
        identity_key(ident)
        ident = {k: ident[k] for k in ("model", "system", "backend", "backend_version", "tp", "pp", "attention_dp",
                                       "moe_tp", "moe_ep") if k in ident}
        S = self.surface

        def carry_for(kind):
            if S is None or kind == "mixed":
                return None
            if kind == "prefill":
                return lambda p, c: S.prefill_ms(1.0, c[0]) / S.prefill_ms(1.0, p[0])
            return lambda p, c: S.decode_step_ms(c[0], max(c[1] / c[0], 1.0)) / S.decode_step_ms(p[0], max(p[1] / p[0], 1.0))

        rows = []
        for kind in KINDS:
            obs = [(tuple(dict(zip(FEATURE_NAMES, f))[a] for a in KIND_AXES[kind]), m, None if math.isnan(r) else r)
                   for k, f, r, m, _ in self._obs if k == kind]
            if obs:
                rows += grid_rows(ident, kind, obs, carry_for(kind))
        return FpmTable(rows)


def sol_roofline(**estimator_kwargs):
    """A roofline for :meth:`ForwardPassModel.use_table`: the configuration's speed-of-light
    iteration time (an :class:`~infercast.Estimator` in ``SOL`` database mode, one per identity,
    kept), at a representative load: prefill one request of ``prefill_tokens``; decode
    ``decode_requests`` at their mean KV length; mixed one prompt of ``prefill_tokens`` and one
    decode of ``decode_kv_tokens``."""
    from ..api import Estimator
    from .fpm_table import identity_key

    cache: dict = {}

    def roofline(identity: dict, kind: str, point: dict) -> float:
        key = identity_key(identity)
        est = cache.get(key)
        if est is None:
            from ..errors import InvalidConfigError

            args = dict(tp=key[4], pp=key[5], attention_dp=key[6], database_mode="SOL", **estimator_kwargs)
            try:
                est = Estimator(*key[:4], moe_tp=key[7], moe_ep=key[8], **args)
            except InvalidConfigError:  # a dense model: its expert layout is whatever the TP gives
                est = Estimator(*key[:4], **args)
            cache[key] = est
        e = est.engine
        if kind == "prefill":
            return float(e.prefill_scalar(1.0, point["prefill_tokens"], 0.0))
        if kind == "decode":
            n = max(point["decode_requests"], 1.0)
            return float(e.decode_scalar(n, max(point["decode_kv_tokens"] / n, 1.0)))
        return float(e.mixed_step_ms([1.0], [point["prefill_tokens"]], [0.0], 1.0, max(point["decode_kv_tokens"], 1.0)))

    return roofline


def nnls(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares for a handful of columns: the best unconstrained fit over every
    subset of the columns whose coefficients are all >= 0 (exact for the few features here;
    columns scaled to unit norm first). Deterministic; ties go to the first subset found."""
    n, k = X.shape
    scale = np.linalg.norm(X, axis=0)
    scale[scale == 0] = 1.0
    Xs = X / scale
    best, best_res = np.zeros(k), float(np.sum(y**2))
    for size in range(1, k + 1):
        for cols in combinations(range(k), size):
            c = list(cols)
            coef, *_ = np.linalg.lstsq(Xs[:, c], y, rcond=None)
            if np.any(coef < 0):
                continue
            res = float(np.sum((Xs[:, c] @ coef - y) ** 2))
            if res < best_res - 1e-12 * max(best_res, 1.0):
                best_res = res
                best = np.zeros(k)
                best[c] = coef
    return best / scale

