"""Step timers: what one engine iteration costs, the only thing the simulator asks of a model.

A *step timer* answers one question, :meth:`StepTimer.step_ms`: the wall time of one step
carrying prefill chunks (each ``(new tokens, prefix tokens)``: the prefix is what the sequence
already holds in KV, from earlier chunks or the prefix cache) beside ``n_decode`` decoding
sequences holding ``kv_tokens`` KV tokens in all (no chunks: a decode-only step). The simulator
jumps over runs of decode-only steps between events: it asks for the run's first and last steps
and takes the steps between as linear in the KV length (:mod:`.scheduler`).

Plus two attributes: ``tokens_per_step`` (output tokens a decoding sequence gains per step, > 1
with speculative decoding) and ``decode_width`` (step-budget tokens a decoding sequence takes).
The interface is kept this small so that another hot path (a faster forward-pass model) can be
put behind it; :class:`EngineStepTimer` puts the compiled engine there, :class:`LinearStepTimer`
is a synthetic one whose step times are known by hand (tests, M/D/1 checks).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from ...errors import InvalidInputError


class StepTimer(Protocol):
    tokens_per_step: float
    decode_width: float

    def step_ms(self, chunks: Sequence[tuple[float, float]], n_decode: int, kv_tokens: float) -> float: ...


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



#: KV lengths (tokens per decoding sequence) of the per-batch-size tables of
#: :class:`EngineStepTimer`: 48 points per doubling from 1 to 2^21 tokens; the generation
#: attention curve is smooth in the KV length, so linear interpolation between them is within
#: ~0.1% of the engine's own value
_KV_GRID = np.unique(np.round(2.0 ** np.linspace(0.0, 21.0, 21 * 48 + 1)))
_KV_LIST = _KV_GRID.tolist()


class EngineStepTimer:
    """Step times from the compiled engine (:class:`infercast.engine.compiled.CompiledEngine`) and
    a backend's :class:`~infercast.serving.backends.SchedulerParams`: the GPU time of the step's
    shape plus the scheduler's host time (``step_overhead_ms``, ``seq_overhead_ms``, the overlap
    rule of :meth:`SchedulerParams.step_ms`); decode-only steps run on CUDA-graph padded rows
    (:meth:`SchedulerParams.graph_pad`), as in :mod:`infercast.serving.sim`.

    Assumptions: a step's decodes are costed at their mean KV length (as the serving models do);
    prefill chunks of one step with the same (new, prefix) lengths are one group. Speed: the
    token-wise ops and context attention are memoised by the engine on exact shapes; generation
    attention is tabulated per decode batch size over :data:`_KV_GRID` and interpolated
    (within 0.1% of the engine's value). ``quantum``: prefill chunk and
    prefix lengths are rounded to a multiple of it before costing (1: exact; traces of many
    distinct lengths run faster with 16 or 32, at well under 1% error on the chunk's time).

    A calibration's GPU-time scales (``params.prefill_scale`` / ``decode_scale``) split a step as
    :class:`infercast.serving.scaled.PhaseScaledEngine` does: the decode-only step of its decodes
    is decode work, the rest of the step prefill work."""

    def __init__(self, engine, params, quantum: int = 1):
        self.engine = engine
        self.params = params
        self.prefill_scale = float(getattr(params, "prefill_scale", 1.0))
        self.decode_scale = float(getattr(params, "decode_scale", 1.0))
        self.tokens_per_step = float(getattr(engine, "tokens_per_step", 1.0))
        self.decode_width = float(getattr(engine, "decode_width", 1.0))
        self.quantum = max(1, int(quantum))
        self._dec_tables: dict[int, tuple[list, list]] = {}
        self._gen_tables: dict[int, np.ndarray] = {}
        self.calls = 0

    def step_ms(self, chunks, n_decode, kv_tokens) -> float:
        self.calls += 1
        eng = self.engine
        q = self.quantum
        n = int(n_decode)
        if not chunks:
            return self.decode_ms(n, kv_tokens)
        # the engine's own composition of a mixed step (CompiledEngine._scalar_step): token-wise
        # ops once over every token, context attention per prefill group, generation attention of
        # the decodes at their mean KV length (here from the per-batch table)
        groups: dict[tuple[float, float], int] = {}
        tokens = 0.0
        for c, p in chunks:
            if q > 1:
                c = float(max(q, round(c / q) * q))
                p = float(round(p / q) * q)
            key = (float(c), float(p))
            groups[key] = groups.get(key, 0) + 1
            tokens += c
        seqs = len(chunks)
        rows = float(n)
        cp = getattr(eng, "cp", 1)
        if cp > 1:  # context parallelism: each rank runs its share of the prompt tokens
            tokens = tokens / cp
        gpu = eng.tokenwise_scalar(tokens + rows * self.decode_width, seqs + rows, rows, True)
        for (c, p), b in groups.items():
            gpu += eng.context_attention_scalar(float(b), c, p)
        gen = float(np.interp(kv_tokens / n, _KV_GRID, self._gen_table(n))) if n else 0.0
        gpu += gen
        if self.prefill_scale != 1.0 or self.decode_scale != 1.0:
            dec = eng.tokenwise_scalar(rows * self.decode_width, rows, rows, False) + gen if n else 0.0
            gpu = self.decode_scale * dec + self.prefill_scale * (gpu - dec)
        return float(self.params.step_ms(gpu, n + seqs))

    def _gen_table(self, n: int) -> np.ndarray:
        """Generation attention alone of ``n`` decodes over :data:`_KV_GRID` (no padding)."""
        hit = self._gen_tables.get(n)
        if hit is None:
            eng = self.engine
            run = np.asarray(eng.decode_run_ms(float(n), _KV_GRID, 0.0), dtype=float)
            hit = self._gen_tables[n] = run - eng.tokenwise_scalar(n * self.decode_width, float(n), float(n))
        return hit

    def _dec_table(self, n: int) -> tuple[list, list]:
        """Decode-only GPU time of ``n`` sequences (CUDA-graph padded) over :data:`_KV_GRID`, as
        plain lists for a scalar lookup."""
        hit = self._dec_tables.get(n)
        if hit is None:
            run = np.asarray(self.engine.decode_run_ms(float(n), _KV_GRID, self.params.graph_pad(n)), dtype=float)
            hit = self._dec_tables[n] = (_KV_LIST, run.tolist())
        return hit

    def decode_ms(self, n: int, kv_tokens: float) -> float:
        """One decode-only step of ``n`` sequences holding ``kv_tokens`` in all (wall time)."""
        xs, ys = self._dec_table(n)
        x = kv_tokens / n
        i = bisect_right(xs, x)
        if i <= 0:
            gpu = ys[0]
        elif i >= len(xs):
            gpu = ys[-1] + (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) * (x - xs[-1])
        else:
            x0, x1 = xs[i - 1], xs[i]
            gpu = ys[i - 1] + (ys[i] - ys[i - 1]) * (x - x0) / (x1 - x0)
        return float(self.params.step_ms(self.decode_scale * gpu, n))
