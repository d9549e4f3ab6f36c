"""A calibration's GPU-time scales (``prefill_scale`` / ``decode_scale``) reach every path that
times steps: the disaggregated search's array solver as well as ``serve-disagg``'s scalar one, and
no timing method of the wrapped engine is answered unscaled."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import synthpack as sp

from infercast.api import Estimator, serve_disagg
from infercast.engine.compiled import CompiledEngine
from infercast.serving.backends import scheduler_params
from infercast.serving.scaled import PhaseScaledEngine

SCALES = {"prefill_scale": 1.3, "decode_scale": 1.5}


def test_disagg_search_applies_the_scales_as_serve_disagg_does(synth):
    from infercast.search import search_disagg

    kw = dict(systems_path=synth.systems_dir, concurrencies=[2, 8], max_gpus=3, max_workers=2)
    plain = search_disagg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 256, 16, **kw)
    scaled = search_disagg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 256, 16, **kw,
                           scheduler_roles={"prefill": dict(SCALES), "decode": dict(SCALES)})
    assert scaled.candidates
    by_key = {(c.layout, c.concurrency): c for c in plain.candidates}
    ests: dict = {}
    for c in scaled.candidates:
        base = by_key[(c.layout, c.concurrency)]
        assert c.tpot_ms > 1.3 * base.tpot_ms  # decode GPU time x 1.5 plus unscaled host time
        assert c.ttft_ms > base.ttft_ms
        pe = ests.setdefault(c.prefill_layout, Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", tp=int(c.prefill_layout[2:]),
                                                          systems_path=synth.systems_dir))
        de = ests.setdefault(c.decode_layout, Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", tp=int(c.decode_layout[2:]),
                                                         systems_path=synth.systems_dir))
        p = replace(scheduler_params("trtllm", pe.data.system, pe.spec), **SCALES)
        one = serve_disagg(pe, de, concurrency=c.concurrency, isl=256, osl=16, prefill_workers=c.prefill_workers,
                           decode_workers=c.decode_workers, params_prefill=p, params_decode=p)
        assert c.ttft_ms == pytest.approx(one.ttft_ms, rel=1e-9)
        assert c.tpot_ms == pytest.approx(one.tpot_ms, rel=1e-9)


def test_every_timing_method_is_scaled_or_refused(synth):
    est = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)
    eng = est.engine
    assert isinstance(eng, CompiledEngine)
    wrapped = PhaseScaledEngine(eng, 2.0, 3.0)
    timing = [n for n in dir(CompiledEngine) if not n.startswith("_") and n.endswith(("_ms", "_scalar"))]
    assert "decode_steps_ms" in timing
    for name in timing:
        if name in vars(PhaseScaledEngine):
            continue
        with pytest.raises(AttributeError):
            getattr(wrapped, name)
    b, kv = np.array([1.0, 4.0, 16.0]), 300.0
    assert np.allclose(wrapped.decode_steps_ms(b, kv), 3.0 * eng.decode_steps_ms(b, kv))
    assert wrapped.decode_scalar(4.0, kv) == pytest.approx(3.0 * eng.decode_scalar(4.0, kv))
    assert wrapped.tokens_per_step == eng.tokens_per_step  # plain attributes pass through
