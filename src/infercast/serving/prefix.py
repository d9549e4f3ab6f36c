"""A serving engine whose requests share a cached prompt prefix (a system prompt kept in the
engine's prefix cache).

Each request's prompt is ``prefix`` cached tokens followed by ``isl`` new ones. The serving models
(:mod:`.agg`, :mod:`.sim`, :mod:`.disagg`) describe steps by the new tokens only; this wrapper adds
the prefix where it costs GPU time:

* a prefill chunk attends to the cached prefix as well as to the prompt's earlier chunks: its
  context attention runs with ``ctx_prefix + prefix`` (the GEMMs and other token-wise ops run on
  the new tokens only, as the engine skips the cached ones);
* a decoding request's KV cache holds the prefix too: generation attention reads ``dec_kv +
  prefix`` tokens per sequence (paged attention reads shared blocks once per sequence; cascade /
  shared-prefix attention kernels, which read them once per step, are not modelled).

Assumptions (what the callers do with the same number): the prefix is one block run shared by
every request and already cached when the benchmark starts (a warm-up request, or a benchmark
client's shared prefix such as ``vllm bench serve --random-prefix-len``), so no request computes
it and each rank's KV cache holds it once (:func:`shared_prefix_capacity`); the front end still
tokenises the whole prompt; a disaggregated deployment moves only the new tokens' KV, the decode
worker holding the prefix in its own cache.
"""

from __future__ import annotations

import numpy as np

from .wrapper import TimingWrapper


class PrefixedEngine(TimingWrapper):
    """``engine`` with every request's ``prefix`` cached tokens added to the attention lengths of
    its steps (module docstring); a timing method not defined here is refused rather than answered
    without the prefix (:class:`~.wrapper.TimingWrapper`)."""

    def __init__(self, engine, prefix: float):
        super().__init__(engine)
        self.prefix = float(prefix)

    def step_ms(self, **shape):
        return self._engine.step_ms(**with_prefix(shape, self.prefix))

    def mixed_step_ms(self, ctx_batch, ctx_isl, ctx_prefix, dec_batch: float, dec_kv: float) -> float:
        prefixes = [float(x) + self.prefix for x in np.atleast_1d(np.asarray(ctx_prefix, dtype=float))]
        return self._engine.mixed_step_ms(ctx_batch, ctx_isl, prefixes, dec_batch, dec_kv + self.prefix)

    def decode_scalar(self, batch: float, kv_len: float, pad: float = 0.0) -> float:
        return self._engine.decode_scalar(batch, kv_len + self.prefix, pad)

    @property
    def mixed_steps_ms(self):
        """The wrapped engine's ``mixed_steps_ms`` (a recorded benchmark's steps) with the prefix
        added to every prefill group's prefix and to the decodes' KV length; AttributeError when the
        wrapped engine has none."""
        priced = self._engine.mixed_steps_ms

        def with_prefix_added(group_step, ctx_batch, ctx_isl, ctx_prefix, dec_batch, dec_kv, dec_pad):
            return priced(group_step, ctx_batch, ctx_isl, np.asarray(ctx_prefix, dtype=float) + self.prefix, dec_batch,
                          np.asarray(dec_kv, dtype=float) + self.prefix, dec_pad)
        return with_prefix_added

    def decode_steps_ms(self, batch, kv_len, pad=0.0):
        kv = np.asarray(kv_len, dtype=float) + self.prefix
        fast = getattr(self._engine, "decode_steps_ms", None)
        if fast is None:
            return self._engine.step_ms(dec_batch=batch, dec_kv=kv, dec_pad=pad, phase="decode")
        return fast(batch, kv, pad)

    def decode_run_ms(self, batch: float, kv_len, pad: float = 0.0):
        kv = np.asarray(kv_len, dtype=float) + self.prefix
        run = getattr(self._engine, "decode_run_ms", None)
        if run is None:
            return np.asarray(self._engine.step_ms(dec_batch=batch, dec_kv=kv, dec_pad=pad))
        return run(batch, kv, pad)

    def decode_one_ms(self, batch: float, kv_len: float, pad: float = 0.0) -> float:
        one = getattr(self._engine, "decode_one_ms", None)
        if one is None:
            return float(self.decode_run_ms(batch, np.array([float(kv_len)]), pad)[0])
        return one(batch, kv_len + self.prefix, pad)


def prefixed(engine, prefix: float):
    """``engine`` with a cached prefix of ``prefix`` tokens per request (itself when it is 0)."""
    if not prefix:
        return engine
    return PrefixedEngine(engine, prefix)


def shared_prefix_capacity(kv_capacity_tokens: float, prefix: float, tokens_per_block: int = 1) -> float:
    """KV tokens left for the requests of a rank once the shared prefix (``prefix`` tokens,
    rounded up to whole cache blocks) is held: at least 0."""
    if not prefix:
        return kv_capacity_tokens
    return max(float(kv_capacity_tokens) - prefix_tokens_held(prefix, tokens_per_block), 0.0)


def prefix_tokens_held(prefix: float, tokens_per_block: int = 1) -> int:
    """KV tokens a rank holds for the shared prefix: ``prefix`` rounded up to whole cache blocks."""
    block = max(int(tokens_per_block), 1)
    return -(-int(np.ceil(prefix)) // block) * block


def with_prefix(shape: dict, prefix: float) -> dict:
    """A step shape (:meth:`CompiledEngine.step_ms` keywords, new tokens only) with the cached
    prefix added to its attention lengths, as :class:`PrefixedEngine` adds it."""
    out = dict(shape)
    if prefix and "ctx_batch" in out:
        out["ctx_prefix"] = out.get("ctx_prefix", 0.0) + prefix
    if prefix and "dec_batch" in out:
        out["dec_kv"] = out.get("dec_kv", 1.0) + prefix
    return out
