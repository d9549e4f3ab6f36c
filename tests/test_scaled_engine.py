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


def test_simulate_step_timer_scales_each_phase(synth):
    """The request-level simulation's step timer splits a step as PhaseScaledEngine does: the
    decode-only step of its decodes x decode_scale, the rest x prefill_scale (host time unscaled)."""
    from infercast.serving.simulate import EngineStepTimer

    est = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)
    p = replace(scheduler_params("trtllm", est.data.system, est.spec), step_overhead_ms=0.0, seq_overhead_ms=0.0)
    plain, scaled = EngineStepTimer(est.engine, p), EngineStepTimer(est.engine, replace(p, **SCALES))
    dec_only = plain.decode_ms(8, 8 * 400.0)
    assert scaled.decode_ms(8, 8 * 400.0) == pytest.approx(1.5 * dec_only, rel=1e-12)
    prompt_only = plain.step_ms([(256.0, 0.0)], 0, 0.0)
    assert scaled.step_ms([(256.0, 0.0)], 0, 0.0) == pytest.approx(1.3 * prompt_only, rel=1e-12)
    mixed = plain.step_ms([(256.0, 0.0)], 8, 8 * 400.0)
    eng = est.engine
    gen = mixed - eng.tokenwise_scalar(256.0 + 8.0, 9.0, 8.0, True) - eng.context_attention_scalar(1.0, 256.0, 0.0)
    dec = eng.tokenwise_scalar(8.0, 8.0, 8.0, False) + gen
    assert scaled.step_ms([(256.0, 0.0)], 8, 8 * 400.0) == pytest.approx(1.5 * dec + 1.3 * (mixed - dec), rel=1e-12)


def test_simulate_takes_the_calibration_and_the_engine_configuration(synth, capsys, tmp_path):
    """Before: ``simulate`` accepted --calibration and --engine-args but applied neither (the same
    numbers as without them). Now the profile's values and the engine's scheduler settings are
    applied as serve applies them, and the notes say so."""
    import json

    import yaml
    from cli_helpers import run_cli

    prof = tmp_path / "cal.yaml"
    prof.write_text(yaml.safe_dump({"kind": "infercast-calibration", "version": 1, "values": dict(SCALES),
                                    "defaults": {"prefill_scale": 1.0, "decode_scale": 1.0},
                                    "deployment": {"model": sp.MODEL_ID, "system": sp.SYSTEM, "backend": "trtllm"},
                                    "concurrency_range": [1, 64], "runs": [], "summary": {}, "evidence": {}}))
    extra = tmp_path / "extra.yaml"
    extra.write_text("max_batch_size: 2\n")
    base = ["simulate", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm", "--systems-path",
            str(synth.systems_dir), "--concurrency", "8", "--isl", "128", "--osl", "16", "--client-start", "together",
            "--json"]
    runs = {}
    for name, more in (("plain", []), ("cal", ["--calibration", str(prof)]), ("engine", ["--engine-args", str(extra)]),
                       ("flag", ["--max-batch-size", "2"])):
        rc, out, err = run_cli(capsys, base + more)
        assert rc == 0, err
        runs[name] = json.loads(out)
    mean = {k: (v["latency"]["ttft_ms"]["mean"], v["latency"]["tpot_ms"]["mean"]) for k, v in runs.items()}
    assert mean["cal"][1] > 1.3 * mean["plain"][1]
    assert any("calibration" in n for n in runs["cal"]["notes"])
    assert mean["engine"] == mean["flag"] != mean["plain"]
    assert any("--engine-args" in n for n in runs["engine"]["notes"])
