"""Step timers: what one engine iteration costs, the only thing the simulator asks of a model.

A *step timer* answers two questions:

* :meth:`StepTimer.step_ms` -- one step carrying prefill chunks (each ``(new tokens, prefix
  tokens)``: the prefix is what the sequence already holds in KV, from earlier chunks or the
  prefix cache) beside ``n_decode`` decoding sequences holding ``kv_tokens`` KV tokens in all;
* :meth:`StepTimer.decode_run_ms` -- ``steps`` decode-only steps in a row of ``n_decode``
  sequences, whose summed KV grows by ``n_decode x tokens_per_step`` each step (the simulator
  jumps over such runs between events instead of stepping token by token).

Plus two attributes: ``tokens_per_step`` (output tokens a decoding sequence gains per step, > 1
with speculative decoding) and ``decode_width`` (step-budget tokens a decoding sequence takes).
The interface is kept this small so that another hot path (a faster forward-pass model) can be
put behind it; :class:`EngineStepTimer` puts the compiled engine there, :class:`LinearStepTimer`
is a synthetic one whose step times are known by hand (tests, M/D/1 checks).
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from ...errors import InvalidInputError


class StepTimer(Protocol):
    tokens_per_step: float
    decode_width: float

    def step_ms(self, chunks: Sequence[tuple[float, float]], n_decode: int, kv_tokens: float) -> float: ...

    def decode_run_ms(self, n_decode: int, kv_tokens: float, steps: int) -> np.ndarray: ...


class LinearStepTimer:
    """A synthetic engine: a step costs ``base_ms`` plus ``per_prefill_token_ms`` per prefill
    token, ``per_decode_ms`` per decoding sequence and ``per_kv_token_ms`` per KV token the
    decodes read. All zero but ``base_ms``: every step costs the same (a constant-step engine)."""

    def __init__(self, base_ms: float, per_prefill_token_ms: float = 0.0, per_decode_ms: float = 0.0,
                 per_kv_token_ms: float = 0.0, tokens_per_step: float = 1.0):
        if base_ms <= 0:
            raise InvalidInputError("a step must take some time", f"got base_ms={base_ms}")
        self.base_ms = float(base_ms)
        self.per_prefill_token_ms = float(per_prefill_token_ms)
        self.per_decode_ms = float(per_decode_ms)
        self.per_kv_token_ms = float(per_kv_token_ms)
        self.tokens_per_step = float(tokens_per_step)
        self.decode_width = 1.0

    def step_ms(self, chunks, n_decode, kv_tokens) -> float:
        tokens = sum(c for c, _ in chunks)
        return (self.base_ms + self.per_prefill_token_ms * tokens + self.per_decode_ms * n_decode
                + self.per_kv_token_ms * (kv_tokens if n_decode else 0.0))

    def decode_run_ms(self, n_decode, kv_tokens, steps) -> np.ndarray:
        kv = kv_tokens + np.arange(steps, dtype=float) * n_decode * self.tokens_per_step
        return self.base_ms + self.per_decode_ms * n_decode + self.per_kv_token_ms * kv


#: KV lengths (tokens per decoding sequence) of the per-batch-size tables of
#: :class:`EngineStepTimer`: 48 points per doubling from 1 to 2^21 tokens; the generation
#: attention curve is smooth in the KV length, so linear interpolation between them is within
#: ~0.1% of the engine's own value
_KV_GRID = np.unique(np.round(2.0 ** np.linspace(0.0, 21.0, 21 * 48 + 1)))


class EngineStepTimer:
    """Step times from the compiled engine (:class:`infercast.engine.compiled.CompiledEngine`) and
    a backend's :class:`~infercast.serving.backends.SchedulerParams`: the GPU time of the step's
    shape plus the scheduler's host time (``step_overhead_ms``, ``seq_overhead_ms``, the overlap
    rule of :meth:`SchedulerParams.step_ms`); decode-only steps run on CUDA-graph padded rows
    (:meth:`SchedulerParams.graph_pad`), as in :mod:`infercast.serving.sim`.

    Assumptions: a step's decodes are costed at their mean KV length (as the serving models do);
    prefill chunks of one step with the same (new, prefix) lengths are one group. Speed: the
    token-wise ops and context attention are memoised by the engine on exact shapes; generation
    attention of decode-only runs is tabulated per decode batch size over :data:`_KV_GRID` and
    interpolated, so a run of any length costs one ``np.interp``. ``quantum``: prefill chunk and
    prefix lengths are rounded to a multiple of it before costing (1: exact; traces of many
    distinct lengths run faster with 16 or 32, at well under 1% error on the chunk's time)."""

    def __init__(self, engine, params, quantum: int = 1):
        self.engine = engine
        self.params = params
        self.tokens_per_step = float(getattr(engine, "tokens_per_step", 1.0))
        self.decode_width = float(getattr(engine, "decode_width", 1.0))
        self.quantum = max(1, int(quantum))
        self._dec_tables: dict[int, tuple[float, np.ndarray]] = {}
        self._step_memo: dict = {}
        self.calls = 0

    def _q(self, x: float) -> float:
        q = self.quantum
        return float(x) if q == 1 else float(max(q, round(x / q) * q))

    def step_ms(self, chunks, n_decode, kv_tokens) -> float:
        self.calls += 1
        groups: dict[tuple[float, float], int] = {}
        for c, p in chunks:
            key = (self._q(c), self._q(p) if p > 0 else 0.0)
            groups[key] = groups.get(key, 0) + 1
        kv = kv_tokens / n_decode if n_decode else 1.0
        if not groups:
            return float(self.decode_run_ms(n_decode, kv_tokens, 1)[0])
        items = sorted(groups.items())
        cb = [float(n) for _, n in items]
        ci = [k[0] for k, _ in items]
        cp = [k[1] for k, _ in items]
        gpu = self.engine.mixed_step_ms(cb, ci, cp, float(n_decode), float(kv))
        return float(self.params.step_ms(gpu, n_decode + sum(cb)))

    def _table(self, n: int) -> tuple[float, np.ndarray]:
        hit = self._dec_tables.get(n)
        if hit is None:
            pad = self.params.graph_pad(n)
            run = np.asarray(self.engine.decode_run_ms(float(n), _KV_GRID, pad), dtype=float)
            hit = self._dec_tables[n] = (pad, run)
        return hit

    def decode_run_ms(self, n_decode, kv_tokens, steps) -> np.ndarray:
        self.calls += 1
        n = int(n_decode)
        _, run = self._table(n)
        grow = n * self.tokens_per_step
        kv_mean = (kv_tokens + np.arange(steps, dtype=float) * grow) / n
        gpu = np.interp(kv_mean, _KV_GRID, run)
        return np.asarray(self.params.step_ms(gpu, n), dtype=float)
