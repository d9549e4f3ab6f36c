"""Requests that share a cached prompt prefix (``serve`` / ``serve-disagg --prefix``): the step
shapes the serving models cost carry the prefix in their attention lengths only, each rank holds
it once, only the new tokens' KV cache moves, and bad values are refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import synthpack as sp
from cli_helpers import assert_one_line_error, run_cli

from infercast.api import Estimator, serve_agg, serve_disagg
from infercast.serving.prefix import PrefixedEngine, prefixed, shared_prefix_capacity, with_prefix
from infercast.serving.sim import DoesNotFitError

P = 600


@pytest.fixture(scope="module")
def est(synth):
    return Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)


def test_prefixed_engine_adds_the_prefix_to_attention_lengths_only(est):
    eng = est.engine
    pe = PrefixedEngine(eng, P)
    assert float(pe.step_ms(ctx_batch=2.0, ctx_isl=128.0, ctx_prefix=64.0)) == float(
        eng.step_ms(ctx_batch=2.0, ctx_isl=128.0, ctx_prefix=64.0 + P))
    assert float(pe.step_ms(dec_batch=8.0, dec_kv=300.0)) == float(eng.step_ms(dec_batch=8.0, dec_kv=300.0 + P))
    assert pe.mixed_step_ms([1.0], [128.0], [0.0], 4.0, 200.0) == eng.mixed_step_ms([1.0], [128.0], [float(P)], 4.0, 200.0 + P)
    assert pe.decode_scalar(4.0, 200.0) == eng.decode_scalar(4.0, 200.0 + P)
    kv = np.array([10.0, 200.0, 3000.0])
    assert np.array_equal(pe.decode_run_ms(4.0, kv), eng.decode_run_ms(4.0, kv + P))
    assert np.array_equal(pe.decode_steps_ms(np.array([1.0, 4.0]), 200.0), eng.decode_steps_ms(np.array([1.0, 4.0]), 200.0 + P))
    assert pe.decode_one_ms(4.0, 200.0) == eng.decode_one_ms(4.0, 200.0 + P)
    # the GEMMs run on the new tokens: a cached prefix costs less than prefilling it
    assert float(eng.step_ms(ctx_batch=1.0, ctx_isl=128.0)) < float(pe.step_ms(ctx_batch=1.0, ctx_isl=128.0)) < float(
        eng.step_ms(ctx_batch=1.0, ctx_isl=128.0 + P))
    with pytest.raises(AttributeError):
        pe.prefill_scalar  # noqa: B018  # not offset here: refused rather than answered without the prefix
    assert prefixed(eng, 0) is eng and pe.tokens_per_step == eng.tokens_per_step
    assert with_prefix({"ctx_batch": 1.0, "ctx_isl": 5.0, "dec_batch": 2.0, "dec_kv": 9.0}, 10) == {
        "ctx_batch": 1.0, "ctx_isl": 5.0, "ctx_prefix": 10, "dec_batch": 2.0, "dec_kv": 19.0}


def test_shared_prefix_capacity_rounds_to_blocks():
    assert shared_prefix_capacity(10_000, 0, 32) == 10_000
    assert shared_prefix_capacity(10_000, 100, 32) == 10_000 - 128
    assert shared_prefix_capacity(50, 100, 32) == 0.0


def test_serve_with_a_prefix_sits_between_the_new_tokens_and_the_whole_prompt(est):
    new, whole, cached = (serve_agg(est, 8, isl, 64, prefix=p) for isl, p in ((256, 0), (256 + P, 0), (256, P)))
    assert new.ttft_ms < cached.ttft_ms < whole.ttft_ms
    assert new.tpot_ms < cached.tpot_ms  # decodes read the prefix's KV too
    # the steady state's step shapes (which energy reads) are the ones the GPU runs
    for _, shape in cached.step_mix["steps"]:
        if "dec_batch" in shape:
            assert shape["dec_kv"] == pytest.approx(256 + 64 / 2 + P)
        if "ctx_batch" in shape:
            assert shape["ctx_prefix"] >= P
    assert any("cached prompt tokens" in n for n in cached.notes)


def test_serve_refuses_a_prefix_that_leaves_no_room(est):
    cap = est.memory.capacity_for(1)
    osl = 64
    isl = int(cap) - osl - 8  # one request fits alone
    serve_agg(est, 1, isl, osl)
    with pytest.raises(DoesNotFitError, match="prefix"):
        serve_agg(est, 1, isl, osl, prefix=64)


def test_serve_disagg_moves_only_the_new_tokens(est):
    kw = dict(concurrency=8, isl=256, osl=64, prefill_workers=1, decode_workers=1)
    plain, cached = serve_disagg(est, est, **kw), serve_disagg(est, est, **kw, prefix=P)
    assert cached.kv_transfer_ms == plain.kv_transfer_ms
    assert cached.ttft_ms > plain.ttft_ms and cached.tpot_ms > plain.tpot_ms
    held = -(-P // est.memory.tokens_per_block) * est.memory.tokens_per_block
    assert cached.decode_kv_capacity == pytest.approx(
        (est.memory.capacity_for(cached.decode_batch) - held) / (256 + 64))


def _argv(synth, cmd, *extra):
    return [cmd, "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm",
            "--systems-path", str(synth.systems_dir), "--concurrency", "8", "--isl", "256", "--osl", "64", *extra]


def test_cli_prefix(synth, capsys, est):
    rc, out, err = run_cli(capsys, _argv(synth, "serve", "--prefix", str(P), "--json"))
    assert rc == 0, err
    d = json.loads(out)
    assert d["prefix"] == P and d["ttft_ms"] == pytest.approx(serve_agg(est, 8, 256, 64, prefix=P).ttft_ms)
    rc, out, err = run_cli(capsys, _argv(synth, "serve-disagg", "--prefill-workers", "1", "--decode-workers", "1",
                                         "--prefix", str(P), "--json"))
    assert rc == 0, err
    assert json.loads(out)["prefix"] == P
    rc, out, err = run_cli(capsys, _argv(synth, "serve", "--prefix", str(P)))
    assert rc == 0 and f"prefix {P}" in out
    for cmd in ("serve", "serve-disagg"):
        extra = ("--prefill-workers", "1", "--decode-workers", "1") if cmd == "serve-disagg" else ()
        rc, out, err = run_cli(capsys, _argv(synth, cmd, *extra, "--prefix", "-5"))
        assert_one_line_error(rc, out, err, "--prefix")


def test_disaggregated_front_end_flags_are_refused_or_noted(synth, capsys):
    """Before: ``serve-disagg`` and ``search --mode disagg`` took --front-end-per-stream-ms and
    --front-end-per-prompt-token-ms and ignored them (the disaggregated model's front end is its
    router's base time). Now the flags are refused, and the same fields from another source
    (--scheduler, a calibration profile) are named as unused in the notes."""
    disagg = ("--prefill-workers", "1", "--decode-workers", "1")
    for flag in ("--front-end-per-stream-ms", "--front-end-per-prompt-token-ms"):
        rc, out, err = run_cli(capsys, _argv(synth, "serve-disagg", *disagg, flag, "2"))
        assert_one_line_error(rc, out, err, flag, "--front-end-ms")
        rc, out, err = run_cli(capsys, ["search", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm",
                                        "--systems-path", str(synth.systems_dir), "--isl", "128", "--osl", "8",
                                        "--mode", "disagg", flag, "2"])
        assert_one_line_error(rc, out, err, flag)
    rc, out, err = run_cli(capsys, _argv(synth, "serve-disagg", *disagg, "--scheduler", "front_end_per_stream_ms=2",
                                         "--json"))
    assert rc == 0, err
    assert any("front_end_per_stream_ms (given) not used" in n for n in json.loads(out)["notes"])


def test_searches_carry_the_prefix(synth, est):
    """search_agg / search_disagg with a prefix: each candidate is serve / serve-disagg of its
    deployment with the same prefix, and a rank holds fewer requests beside it."""
    from infercast.search import search_agg, search_disagg
    from infercast.search.run import rank_capacity
    from infercast.serving.backends import scheduler_params

    kw = dict(systems_path=synth.systems_dir, concurrencies=[2, 8], max_gpus=2)
    agg = search_agg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 256, 64, prefix=P, **kw)
    assert agg.prefix == P and agg.to_dict(candidates=False)["prefix"] == P
    for c in agg.candidates:
        e = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", tp=c.tp, pp=c.pp, systems_path=synth.systems_dir)
        assert c.ttft_ms == serve_agg(e, c.concurrency, 256, 64, prefix=P).ttft_ms
    dis = search_disagg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 256, 64, prefix=P, max_workers=1, **kw)
    assert dis.candidates
    for c in [c for c in dis.candidates if "pp" not in c.layout][:4]:
        pe, de = (Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", tp=int(x[2:]), systems_path=synth.systems_dir)
                  for x in (c.prefill_layout, c.decode_layout))
        one = serve_disagg(pe, de, concurrency=c.concurrency, isl=256, osl=64, prefill_workers=c.prefill_workers,
                           decode_workers=c.decode_workers, prefix=P)
        assert c.ttft_ms == pytest.approx(one.ttft_ms, rel=1e-9) and c.tpot_ms == pytest.approx(one.tpot_ms, rel=1e-9)
    from dataclasses import replace

    p = replace(scheduler_params("trtllm", est.data.system, est.spec), max_batch_size=10**9)
    half = int(est.memory.kv_capacity_tokens // 2)
    assert rank_capacity(est, 256, 64, p, prefix=half) == pytest.approx(rank_capacity(est, 256, 64, p) / 2, abs=1)


def test_launch_files_and_experiments_carry_the_prefix(synth, capsys, tmp_path):
    from infercast.exp import parse_experiments
    from infercast.exp.run import run_experiment
    from infercast.report.launch import Deployment, benchmark_commands

    d = Deployment(sp.MODEL_ID, "vllm", "0.0", (), 256, 64, 8, prefix=P)
    cmds = benchmark_commands(d)
    assert cmds["vllm_bench_serve"][-2:] == ["--random-prefix-len", str(P)]
    assert cmds["aiperf"][-4:] == ["--num-prefix-prompts", "1", "--prefix-prompt-length", str(P)]
    assert "--random-prefix-len" not in benchmark_commands(Deployment(sp.MODEL_ID, "vllm", "0.0", (), 256, 64, 8))["vllm_bench_serve"]
    (exp,) = parse_experiments(f"""\
experiments:
  - name: cached
    model: {sp.MODEL_ID}
    system: {sp.SYSTEM}
    backend: trtllm
    isl: 256
    osl: 64
    prefix: {P}
    layout: {{tp: 1}}
    concurrency: [8]
""")
    (out,) = run_experiment(exp, systems_path=synth.systems_dir)
    e = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)
    assert out.rows[0]["ttft_ms"] == serve_agg(e, 8, 256, 64, prefix=P).ttft_ms
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"experiments:\n  - name: x\n    model: {sp.MODEL_ID}\n    system: {sp.SYSTEM}\n    backend: trtllm\n"
                   "    isl: 256\n    osl: 64\n    prefix: -1\n    layout: {tp: 1}\n    concurrency: [8]\n")
    rc, out_, err = run_cli(capsys, ["exp", str(bad), "--systems-path", str(synth.systems_dir)])
    assert rc == 2 and "prefix" in err and "line 8" in err
    for cmd in (["search", "--mode", "agg"], ["recommend", "--rate", "1"]):
        rc, o, e_ = run_cli(capsys, [cmd[0], "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm",
                                     "--systems-path", str(synth.systems_dir), "--isl", "256", "--osl", "64",
                                     *cmd[1:], "--prefix", "-3"])
        assert_one_line_error(rc, o, e_, "--prefix")
    rc, o, e_ = run_cli(capsys, ["recommend", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm",
                                 "--systems-path", str(synth.systems_dir), "--isl", "256", "--osl", "64", "--rate", "1",
                                 "--prefix", str(P), "--json", "--max-gpus", "2", "--mode", "agg"])
    assert rc == 0, e_
    assert json.loads(o)["prefix"] == P
