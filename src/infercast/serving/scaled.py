"""A serving engine whose GPU step times are scaled per phase (a calibration's GPU-time scales).

:attr:`~infercast.serving.backends.SchedulerParams.prefill_scale` and ``decode_scale`` multiply
the GPU time of a step's prefill work and decode work. A step's decode work is the decode-only
step of its decodes; its prefill work is the rest of the step (the step minus that decode-only
step), so a mixed step of ``D`` decodes and a prefill chunk takes
``decode_scale x t(D) + prefill_scale x (t(D + chunk) - t(D))``. Scales of 1 leave the engine as
it is (:func:`phase_scaled` returns it unwrapped). Host time is not scaled: it is added by
:meth:`~infercast.serving.backends.SchedulerParams.step_ms` after this.
"""

from __future__ import annotations

import numpy as np


from .wrapper import TimingWrapper


class PhaseScaledEngine(TimingWrapper):
    """``engine`` (a :class:`~infercast.engine.compiled.CompiledEngine` or anything with its step
    methods) with its prefill and decode GPU times multiplied by ``prefill`` and ``decode``.

    The timing methods the serving models call are defined here, scaled; any other is refused
    rather than answered unscaled (:class:`~.wrapper.TimingWrapper`)."""

    def __init__(self, engine, prefill: float, decode: float):
        super().__init__(engine)
        self._p = float(prefill)
        self._d = float(decode)

    def _decode_part(self, dec_batch, dec_kv, dec_pad=0.0):
        b = np.asarray(dec_batch, dtype=float)
        if not np.any(b > 0):
            return np.zeros(np.shape(b)) if np.ndim(b) else 0.0
        t = self._engine.step_ms(dec_batch=dec_batch, dec_kv=dec_kv, dec_pad=dec_pad)
        return np.where(b > 0, t, 0.0) if np.ndim(t) else (float(t) if float(b) > 0 else 0.0)

    def step_ms(self, **shape):
        t = self._engine.step_ms(**shape)
        dec = self._decode_part(shape.get("dec_batch", 0.0), shape.get("dec_kv", 1.0), shape.get("dec_pad", 0.0))
        return self._d * dec + self._p * (t - dec)

    def mixed_step_ms(self, ctx_batch, ctx_isl, ctx_prefix, dec_batch: float, dec_kv: float) -> float:
        t = self._engine.mixed_step_ms(ctx_batch, ctx_isl, ctx_prefix, dec_batch, dec_kv)
        dec = float(self._engine.decode_scalar(dec_batch, dec_kv)) if dec_batch > 0 else 0.0
        return self._d * dec + self._p * (t - dec)

    @property
    def mixed_steps_ms(self):
        """The wrapped engine's ``mixed_steps_ms`` (a recorded benchmark's steps), scaled as
        :meth:`mixed_step_ms` scales a step carrying prefill groups and :meth:`decode_run_ms` a
        decode-only step; AttributeError when the wrapped engine has none."""
        priced = self._engine.mixed_steps_ms

        def scaled(group_step, ctx_batch, ctx_isl, ctx_prefix, dec_batch, dec_kv, dec_pad):
            t = np.asarray(priced(group_step, ctx_batch, ctx_isl, ctx_prefix, dec_batch, dec_kv, dec_pad), dtype=float)
            prefill = np.bincount(np.asarray(group_step, dtype=np.int64), minlength=t.size) > 0
            dec = self._decode_part(np.where(prefill, dec_batch, 0.0), dec_kv) if prefill.any() else 0.0
            return np.where(prefill, self._d * dec + self._p * (t - dec), self._d * t)
        return scaled

    def decode_steps_ms(self, batch, kv_len, pad=0.0):
        """Decode-only steps for arrays of batches (the wrapped engine's array path), scaled."""
        fast = getattr(self._engine, "decode_steps_ms", None)
        if fast is None:
            return self._d * np.asarray(self._engine.step_ms(dec_batch=batch, dec_kv=kv_len, dec_pad=pad, phase="decode"))
        return self._d * fast(batch, kv_len, pad)

    def decode_scalar(self, batch: float, kv_len: float, pad: float = 0.0) -> float:
        return self._d * self._engine.decode_scalar(batch, kv_len, pad)

    def decode_run_ms(self, batch: float, kv_len, pad: float = 0.0):
        run = getattr(self._engine, "decode_run_ms", None)
        if run is None:
            return self._d * np.asarray(self._engine.step_ms(dec_batch=batch, dec_kv=kv_len, dec_pad=pad))
        return self._d * run(batch, kv_len, pad)

    def decode_one_ms(self, batch: float, kv_len: float, pad: float = 0.0) -> float:
        """:meth:`decode_run_ms` of a run of one step, as a float."""
        one = getattr(self._engine, "decode_one_ms", None)
        if one is None:
            return float(self.decode_run_ms(batch, np.array([float(kv_len)]), pad)[0])
        return self._d * one(batch, kv_len, pad)


def phase_scaled(engine, params):
    """``engine`` scaled by ``params``' ``prefill_scale`` / ``decode_scale`` (itself when both are 1)."""
    p = float(getattr(params, "prefill_scale", 1.0))
    d = float(getattr(params, "decode_scale", 1.0))
    if p == 1.0 and d == 1.0:
        return engine
    return PhaseScaledEngine(engine, p, d)
