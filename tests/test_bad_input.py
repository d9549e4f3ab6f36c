"""Bad input: every user mistake ends in exit code 2 and one line on stderr, never a traceback.

CLI cases run ``infercast.cli.main.main([...])`` in-process; Python API cases check the typed
error. Cases that need the real pack are marked ``real_pack``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import synthpack as sp
from cli_helpers import assert_one_line_error, run_cli

from infercast import Estimator
from infercast.errors import (
    DataFileError,
    InfercastError,
    InvalidConfigError,
    InvalidInputError,
    NotAvailableError,
    UnknownBackendError,
    UnknownModelError,
    UnknownSystemError,
    UnknownVersionError,
    UnsupportedModelError,
)

SRC = Path(__file__).resolve().parents[1] / "src"


def estimate_argv(synth, *extra, model=sp.MODEL_ID, system=sp.SYSTEM, backend="trtllm"):
    return [
        "estimate", "--model", model, "--system", system, "--backend", backend,
        "--systems-path", str(synth.systems_dir), "--isl", "128", "--osl", "8", "--json", *extra,
    ]


# ---------------------------------------------------------------------------------------------
# sanity: the good path exits 0 and prints JSON
# ---------------------------------------------------------------------------------------------
def test_good_input_exits_zero(synth, capsys):
    rc, out, err = run_cli(capsys, estimate_argv(synth, "--batch", "4"))
    assert rc == 0 and err == ""
    d = json.loads(out)
    assert d["fits"] is True and d["ttft_ms"] > 0 and d["batch_size"] == 4


# ---------------------------------------------------------------------------------------------
# unknown names
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw,extra,needles",
    [
        ({"model": "nope/not-a-model"}, (), ("unknown model", "synth/tiny-llama")),
        ({"system": "h9000"}, (), ("unknown system 'h9000'", sp.SYSTEM)),
        ({"backend": "sglang"}, (), ("'sglang'", "trtllm, vllm")),
        ({}, ("--backend-version", "7.7"), ("'7.7'", "current=1.0")),
        ({"backend": "vllm"}, ("--backend-version", "previous"), ("'previous'",)),
        ({}, ("--backend-version", sp.RELABELLED_VERSION), (sp.RELABELLED_VERSION,)),
        ({}, ("--database-mode", "FAST"), ("database mode", "SILICON")),
        ({}, ("--gemm-quant", "int3"), ("--gemm-quant 'int3'",)),
        ({}, ("--kv-cache-quant", "fp4"), ("--kv-cache-quant 'fp4'",)),
    ],
)
def test_unknown_names(synth, capsys, kw, extra, needles):
    assert_one_line_error(*run_cli(capsys, estimate_argv(synth, *extra, **kw)), *needles)


def test_unknown_backend_rejected_by_argparse(synth, capsys):
    rc, out, err = run_cli(capsys, estimate_argv(synth, backend="tensorrt"))
    assert rc == 2 and "Traceback" not in out + err
    assert "invalid choice: 'tensorrt'" in err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "args,exc",
    [
        ((sp.MODEL_ID, sp.SYSTEM, "tensorrt"), UnknownBackendError),
        ((sp.MODEL_ID, "h9000", "trtllm"), UnknownSystemError),
        (("nope/nope", sp.SYSTEM, "trtllm"), UnknownModelError),
        ((sp.MODEL_ID, sp.SYSTEM, "trtllm", "9.9"), UnknownVersionError),
    ],
)
def test_unknown_names_python_api(synth, args, exc):
    with pytest.raises(exc) as ei:
        Estimator(*args, systems_path=synth.systems_dir)
    assert ei.value.available  # says what exists


def test_missing_systems_path(capsys, tmp_path):
    argv = ["systems", "--json", "--systems-path", str(tmp_path / "nowhere")]
    assert_one_line_error(*run_cli(capsys, argv), "not a directory")


# ---------------------------------------------------------------------------------------------
# parallel configuration
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "extra,needles",
    [
        (("--tp", "16"), ("TP 16 does not divide the 8 attention heads", "tp=8")),
        (("--tp", "3"), ("not a power of two",)),
        (("--tp", "0"), ("--tp must be a positive integer",)),
        (("--pp", "-2"), ("--pp must be a positive integer",)),
        (("--pp", "4"), ("PP 4 exceeds the 2 layers",)),
        (("--gemm-quant", "nvfp4"), ("no fp4 tensor cores",)),
        (("--gemm-quant", "fp8"), ("no fp8 GEMM data", "fp8_block")),
    ],
)
def test_bad_parallel_or_quant_config(synth, capsys, extra, needles):
    assert_one_line_error(*run_cli(capsys, estimate_argv(synth, *extra)), *needles)


def test_tp_not_dividing_heads_python_api(synth):
    with pytest.raises(InvalidConfigError) as ei:
        Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", tp=16, systems_path=synth.systems_dir)
    assert ei.value.available == ["tp=1", "tp=2", "tp=4", "tp=8"]


# ---------------------------------------------------------------------------------------------
# shapes: <= 0, NaN, absurd
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "extra,needles",
    [
        (("--batch", "0"), ("batch_size must be > 0",)),
        (("--batch", "-3"), ("batch_size must be > 0",)),
        (("--isl", "0"), ("isl must be > 0",)),
        (("--osl", "0"), ("osl must be > 0",)),
        (("--prefix", "-1"), ("prefix must be a finite number >= 0",)),
        (("--batch", "1000000000000"), ("batch_size is absurdly large",)),
        (("--isl", "1000000000000"), ("isl is absurdly large",)),
        (("--osl", "1000000000000"), ("osl is absurdly large",)),
        (("--prefix", "1000000000000"), ("prefix is absurdly large",)),
    ],
)
def test_bad_shapes_cli(synth, capsys, extra, needles):
    assert_one_line_error(*run_cli(capsys, estimate_argv(synth, *extra)), *needles)


def test_non_numeric_shape_rejected_by_argparse(synth, capsys):
    rc, out, err = run_cli(capsys, estimate_argv(synth, "--batch", "nan"))
    assert rc == 2 and "Traceback" not in out + err
    assert "invalid int value: 'nan'" in err.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def est(synth):
    return Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda e: e.prefill_ms(NAN, 128), "batch_size must be finite"),
        (lambda e: e.prefill_ms(4, NAN), "isl must be finite"),
        (lambda e: e.prefill_ms(4, 128, NAN), "prefix must be a finite"),
        (lambda e: e.prefill_ms(4, INF), "isl must be finite"),
        (lambda e: e.prefill_ms(np.array([1.0, NAN]), 128), "batch_size must be finite"),
        (lambda e: e.prefill_ms(0, 128), "batch_size must be > 0"),
        (lambda e: e.prefill_ms(-1.0, 128), "batch_size must be > 0"),
        (lambda e: e.prefill_ms(1e12, 128), "batch_size is absurdly large"),
        (lambda e: e.prefill_ms(1, 1e12), "isl is absurdly large"),
        (lambda e: e.prefill_ms(np.array([]), 128), "batch_size is empty"),
        (lambda e: e.decode_ms(4, 128, NAN), "osl must be finite"),
        (lambda e: e.decode_ms(NAN, 128, 8), "batch_size must be finite"),
        (lambda e: e.decode_ms(4, 128, 1e12), "osl is absurdly large"),
        (lambda e: e.decode_step_ms(4, NAN), "kv_len must be finite"),
        (lambda e: e.decode_step_ms(4, 0), "kv_len must be > 0"),
        (lambda e: e.decode_step_ms(1e12, 10), "batch_size is absurdly large"),
        (lambda e: e.static(NAN, 128, 8), "batch_size must be finite"),
        (lambda e: e.static(4, 128, NAN), "osl must be finite"),
        (lambda e: e.static(4, 1e12, 8), "isl is absurdly large"),
        # arrays that do not broadcast: a typed error naming the shapes, not numpy's ValueError
        (lambda e: e.prefill_ms(np.array([1, 2]), np.array([64, 128, 256])),
         r"do not broadcast to one shape: batch_size \(2,\), isl \(3,\)"),
        (lambda e: e.prefill_ms(np.array([1, 2]), 128, np.array([0, 1, 2])), r"prefix \(3,\)"),
        (lambda e: e.decode_step_ms(np.array([1, 2]), np.array([64, 128, 256])), r"kv_len \(3,\)"),
        (lambda e: e.decode_ms(np.array([1, 2]), 128, np.array([2, 4, 8])), r"osl \(3,\)"),
        (lambda e: e.prefill_ms("many", 128), "batch_size, isl and prefix must be numbers"),
        (lambda e: e.decode_step_ms(4, "long"), "batch_size and kv_len must be numbers: got 4, 'long'"),
    ],
)
def test_bad_shapes_python_api(est, call, match):
    with pytest.raises(InvalidInputError, match=match):
        call(est)


def test_perfdb_arrays_that_do_not_broadcast(synth):
    from infercast import PerfDB

    db = PerfDB(sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)
    with pytest.raises(InvalidInputError, match=r"m \(2,\), n \(3,\)"):
        db.gemm("bfloat16", m=[1, 2], n=[128, 256, 512], k=128)
    with pytest.raises(InvalidInputError, match=r"batch \(2,\), isl \(3,\)"):
        db.context_attention([1, 2], [64, 128, 256], heads=8, kv_heads=8, head_dim=128)
    with pytest.raises(InvalidInputError, match=r"batch \(2,\), kv_len \(3,\)"):
        db.generation_attention([1, 2], [64, 128, 256], heads=8, kv_heads=8, head_dim=128)
    assert db.gemm("bfloat16", m=[1, 2], n=[128, 256], k=128).ms.shape == (2,)  # shapes that do broadcast


@pytest.mark.parametrize("args,needle", [
    ((None, sp.SYSTEM, "trtllm"), "model must be a model id or a config path: got None"),
    (("", sp.SYSTEM, "trtllm"), "model must be a model id or a config path: got ''"),
    ((sp.MODEL_ID, None, "trtllm"), "system must be a non-empty name: got None"),
    ((sp.MODEL_ID, sp.SYSTEM, None), "backend must be a non-empty name: got None"),
    ((sp.MODEL_ID, sp.SYSTEM, 3), "backend must be a non-empty name: got 3"),
])
def test_names_that_are_not_strings_python_api(synth, args, needle):
    # a typed error naming the argument, not a TypeError from the path handling underneath
    with pytest.raises(InvalidInputError) as ei:
        Estimator(*args, systems_path=synth.systems_dir)
    assert needle in str(ei.value)


@pytest.mark.parametrize("call,needle", [
    (lambda db: db.gemm("fp9", m=[1], n=128, k=128), "unknown GEMM quant mode 'fp9' (available: bfloat16"),
    (lambda db: db.gemm("bfloat16", m="many", n=128, k=128), "m must be numbers"),
    (lambda db: db.gemm("bfloat16", m=[1], n=128.5, k=128), "n must be whole numbers: got 128.5"),
    (lambda db: db.context_attention(1, 64, heads=8, kv_heads=8, head_dim=128, kv_quant="fp7"),
     "unknown KV-cache dtype 'fp7' (available: bfloat16, fp8)"),
    (lambda db: db.context_attention(1, 64, heads=8, kv_heads=8, head_dim=128, attn_quant="int8"), "unknown attention dtype"),
    (lambda db: db.context_attention(1, 64, heads=8, kv_heads=3, head_dim=128), "kv_heads must divide heads"),
    (lambda db: db.generation_attention(1, 64, heads=8, kv_heads=16, head_dim=128), "kv_heads must divide heads"),
    (lambda db: db.generation_attention(1, 64, heads=8.5, kv_heads=1, head_dim=128), "heads must be whole numbers"),
    (lambda db: db.context_attention(1, 64, heads=8, kv_heads=8, head_dim=128, prefix=-5), "prefix must be a finite number >= 0"),
    (lambda db: db.context_attention(1, 64, heads=8, kv_heads=8, head_dim=128, window=-1), "window must be a finite number >= 0"),
    (lambda db: db.collective("all_reduce", elements="lots", group=2), "elements must be numbers"),
])
def test_perfdb_bad_arguments(synth, call, needle):
    """PerfDB refuses what no kernel runs -- an unknown quant or dtype, a fractional head count or
    width, KV heads that do not divide the query heads, a negative prefix or window -- with a typed
    error, where it used to raise KeyError / ValueError or round the shape to a collected site."""
    from infercast import PerfDB

    db = PerfDB(sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)
    with pytest.raises(InvalidInputError) as ei:
        call(db)
    assert needle in str(ei.value)


def test_invalid_input_is_also_value_error(est):
    with pytest.raises(ValueError):
        est.prefill_ms(math.nan, 1)


# ---------------------------------------------------------------------------------------------
# missing or damaged data
# ---------------------------------------------------------------------------------------------
def test_missing_table_cli(synth, capsys):
    line = assert_one_line_error(
        *run_cli(capsys, estimate_argv(synth, backend="vllm")), "no context_attention table for vllm 2.0"
    )
    assert "(available: gemm, generation_attention)" in line


def test_missing_table_python_api(synth):
    with pytest.raises(NotAvailableError) as ei:
        Estimator(sp.MODEL_ID, sp.SYSTEM, "vllm", systems_path=synth.systems_dir)
    assert "context_attention" in str(ei.value)
    assert ei.value.available == ["gemm", "generation_attention"]


@pytest.fixture(scope="module")
def lfs_gemm_pack(tmp_path_factory):
    return sp.make_pack(tmp_path_factory.mktemp("badlfs"), lfs_pointer_table="gemm_perf")


@pytest.fixture(scope="module")
def corrupt_ar_pack(tmp_path_factory):
    return sp.make_pack(tmp_path_factory.mktemp("badcorrupt"), corrupt_table="custom_allreduce_perf")


def test_lfs_pointer_table_cli(lfs_gemm_pack, capsys):
    path = lfs_gemm_pack.table_path("gemm", "trtllm", "1.0", "gemm_perf").resolve()
    assert_one_line_error(*run_cli(capsys, estimate_argv(lfs_gemm_pack)), str(path), "Git LFS pointer")


def test_lfs_pointer_table_python_api(lfs_gemm_pack):
    with pytest.raises(DataFileError, match="LFS"):
        Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=lfs_gemm_pack.systems_dir)


def test_corrupt_table_cli(corrupt_ar_pack, capsys):
    path = corrupt_ar_pack.table_path("comm", "trtllm", "1.0", "custom_allreduce_perf").resolve()
    # TP=1 never reads the all-reduce table; TP=2 does
    rc, out, _ = run_cli(capsys, estimate_argv(corrupt_ar_pack))
    assert rc == 0 and json.loads(out)["fits"]
    assert_one_line_error(*run_cli(capsys, estimate_argv(corrupt_ar_pack, "--tp", "2")), str(path), "unreadable")


# ---------------------------------------------------------------------------------------------
# bad model configs
# ---------------------------------------------------------------------------------------------
def test_local_model_path_errors(synth, capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    assert_one_line_error(*run_cli(capsys, estimate_argv(synth, model=str(tmp_path / "empty"))), "has no config.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{oops")
    assert_one_line_error(*run_cli(capsys, estimate_argv(synth, model=str(bad))), "not valid JSON")


def _config_variants(synth, tmp_path):
    cfg = json.loads((synth.model_configs_dir / "synth--tiny-llama_config.json").read_text())
    variants = {
        "missing-layers": {k: v for k, v in cfg.items() if k != "num_hidden_layers"},
        "zero-heads": {**cfg, "num_attention_heads": 0},
        "string-hidden": {**cfg, "hidden_size": "abc"},
        "not-an-object": [1, 2, 3],
    }
    paths = {}
    for name, body in variants.items():
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps(body))
        paths[name] = p
    return paths


def test_malformed_local_config_is_a_clean_error(synth, capsys, tmp_path):
    for name, path in _config_variants(synth, tmp_path).items():
        rc, out, err = run_cli(capsys, estimate_argv(synth, model=str(path)))
        assert_one_line_error(rc, out, err, str(path))


@pytest.mark.real_pack
def test_unsupported_family_real_pack(capsys, tmp_path):
    """Every architecture of the pack is modelled; a config of an architecture infercast does not
    know (a local config path) is refused with the known ones listed."""
    cfg = {
        "architectures": ["FooBarForCausalLM"], "model_type": "foobar", "hidden_size": 1024, "num_hidden_layers": 2,
        "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 4096, "vocab_size": 32000}
    model = tmp_path / "config.json"
    model.write_text(json.dumps(cfg))
    model = str(model)
    with pytest.raises(UnsupportedModelError) as ei:
        Estimator(model, "h200_sxm", "trtllm")
    assert "not modelled yet" in str(ei.value)
    assert "Qwen3ForCausalLM" in ei.value.available
    argv = ["estimate", "--model", model, "--system", "h200_sxm", "--backend", "trtllm", "--isl", "128", "--osl", "8"]
    assert_one_line_error(*run_cli(capsys, argv), "is not modelled yet")


# ---------------------------------------------------------------------------------------------
# the real process
# ---------------------------------------------------------------------------------------------
def test_subprocess_error_has_no_traceback(synth):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    env.pop("INFERCAST_SYSTEMS_PATH", None)
    proc = subprocess.run(
        [sys.executable, "-m", "infercast", *estimate_argv(synth, "--tp", "16")],
        capture_output=True, text=True, env=env, timeout=60,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.strip().splitlines() == [
        "infercast: error: TP 16 does not divide the 8 attention heads of synth/tiny-llama: each GPU must hold "
        "whole heads (available: tp=1, tp=2, tp=4, tp=8)"
    ]


def test_all_cli_errors_are_infercast_errors():
    # the contract the CLI relies on: the typed errors share one base
    for exc in (DataFileError, InvalidConfigError, InvalidInputError, NotAvailableError, UnknownBackendError,
                UnknownModelError, UnknownSystemError, UnknownVersionError, UnsupportedModelError):
        assert issubclass(exc, InfercastError)


# ---------------------------------------------------------------------------------------------
# `serve` scheduler overrides
# ---------------------------------------------------------------------------------------------
def serve_argv(synth, *extra):
    return [
        "serve", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm",
        "--systems-path", str(synth.systems_dir), "--concurrency", "4", "--isl", "128", "--osl", "8", "--json", *extra,
    ]


@pytest.mark.parametrize(
    "extra,needle",
    [
        (("--max-batch-size", "0"), "--max-batch-size must be a finite number >= 1"),
        (("--max-num-tokens", "-5"), "--max-num-tokens must be a finite number >= 1"),
        (("--front-end-ms", "nan"), "--front-end-ms must be a finite number >= 0.0"),
        (("--front-end-per-stream-ms", "-1"), "--front-end-per-stream-ms must be a finite number >= 0.0"),
        (("--step-overhead-ms", "-1"), "--step-overhead-ms must be a finite number >= 0.0"),
        (("--requests-per-client", "0.5"), "--requests-per-client must be a finite number >= 1.0"),
        (("--batch-wait-iters", "-1"), "--batch-wait-iters must be a finite number >= 0"),
        (("--batch-wait-max-tokens-ratio", "1.5"), "--batch-wait-max-tokens-ratio is a share of the token budget (0-1)"),
        (("--random-range-ratio", "0"), "--random-range-ratio is the shortest request's share of the nominal lengths"),
        (("--random-range-ratio", "1.2"), "--random-range-ratio is the shortest request's share of the nominal lengths"),
        (("--random-range-ratio", "nan"), "--random-range-ratio is the shortest request's share of the nominal lengths"),
    ],
)
def test_serve_bad_scheduler_override(synth, capsys, extra, needle):
    assert_one_line_error(*run_cli(capsys, serve_argv(synth, *extra)), needle)


def test_serve_scheduler_overrides_apply(synth, capsys):
    """Overrides reach the serving model: the front-end time shifts every request's first token by
    exactly the difference (TPOT unchanged), and the JSON reports the scheduler it ran."""
    import json

    # the backend's own per-stream front end (TensorRT-LLM's) set to 0, so the base alone differs
    rc, out, _ = run_cli(capsys, serve_argv(synth, "--front-end-ms", "5", "--front-end-per-stream-ms", "0"))
    a = json.loads(out)
    rc2, out2, _ = run_cli(capsys, serve_argv(synth, "--front-end-ms", "25", "--front-end-per-stream-ms", "0",
                                              "--max-batch-size", "64"))
    b = json.loads(out2)
    assert rc == rc2 == 0
    assert a["scheduler"]["arrival_delay_ms"] == 5.0 and b["scheduler"]["arrival_delay_ms"] == 25.0
    assert b["scheduler"]["max_batch_size"] == 64
    assert b["ttft_ms"] - a["ttft_ms"] == pytest.approx(20.0, rel=1e-9)
    assert b["tpot_ms"] == pytest.approx(a["tpot_ms"], rel=1e-12)
    # 4 clients x 5 ms per open stream = the same 20 ms more
    rc3, out3, _ = run_cli(capsys, serve_argv(synth, "--front-end-ms", "5", "--front-end-per-stream-ms", "5",
                                              "--max-batch-size", "64"))
    c = json.loads(out3)
    assert rc3 == 0 and c["scheduler"]["front_end_per_stream_ms"] == 5.0
    assert c["ttft_ms"] == pytest.approx(b["ttft_ms"], rel=1e-9)
    # the mean TTFT's parts: the 20 ms are all front end, and the parts add up to the mean
    assert b["ttft_parts"]["front_end"] - a["ttft_parts"]["front_end"] == pytest.approx(20.0)
    assert b["ttft_parts"]["wait"] == pytest.approx(a["ttft_parts"]["wait"])
    assert sum(c["ttft_parts"].values()) == pytest.approx(c["ttft_ms"])
    rc4, out4, _ = run_cli(capsys, [x for x in serve_argv(synth, "--front-end-ms", "25", "--front-end-per-stream-ms", "0")
                                    if x != "--json"])
    assert rc4 == 0 and "mean TTFT = front end 25.0 + wait to be scheduled" in out4


def test_serve_batch_wait_flags_reach_the_model(synth, capsys):
    import json

    rc, out, _ = run_cli(capsys, serve_argv(synth))
    rc2, out2, _ = run_cli(capsys, serve_argv(synth, "--batch-wait-iters", "20", "--batch-wait-max-tokens-ratio", "0.9"))
    a, b = json.loads(out), json.loads(out2)
    assert rc == rc2 == 0 and b["scheduler"]["batch_wait_iters"] == 20 and b["scheduler"]["batch_wait_max_tokens_ratio"] == 0.9
    assert b["ttft_ms"] > a["ttft_ms"]


def test_serve_poll_interval_and_random_lengths_reach_the_model(synth, capsys):
    """--recv-interval waits for the scheduler's poll in the steady state; a prefill-first engine's
    lock-step waves (SGLang's default) reach an idle engine, so only with --random-lengths does it
    move TTFT."""
    import json

    base = serve_argv(synth, "--prefill-scheduling", "prefill-first")
    runs = {}
    for name, extra in {"waves": [], "waves_poll": ["--recv-interval", "30"], "drift": ["--random-lengths"],
                        "drift_poll": ["--random-lengths", "--recv-interval", "30"]}.items():
        rc, out, _ = run_cli(capsys, base + extra)
        assert rc == 0
        runs[name] = json.loads(out)
    assert runs["waves"]["scheduler"]["lockstep"] is True and runs["drift"]["scheduler"]["lockstep"] is False
    assert runs["waves_poll"]["ttft_ms"] == pytest.approx(runs["waves"]["ttft_ms"])
    assert runs["drift_poll"]["scheduler"]["recv_interval"] == 30
    assert runs["drift_poll"]["ttft_ms"] > runs["drift"]["ttft_ms"]
    rc, _, err = run_cli(capsys, base + ["--recv-interval", "0"])
    assert rc != 0 and "--recv-interval" in err


def test_serve_random_range_ratio_reaches_the_model(synth, capsys):
    """--random-range-ratio R: random lengths (no lock-step waves) whose KV cache holds the mean,
    (1 + R) / 2 of the nominal lengths' tokens."""
    import json

    rc, out, _ = run_cli(capsys, serve_argv(synth, "--prefill-scheduling", "prefill-first", "--random-range-ratio", "0.8"))
    a = json.loads(out)
    assert rc == 0 and a["scheduler"]["lockstep"] is False
    assert a["scheduler"]["kv_length_ratio"] == pytest.approx(0.9)
    rc, out, _ = run_cli(capsys, serve_argv(synth))
    assert rc == 0 and json.loads(out)["scheduler"]["kv_length_ratio"] == 1.0


def test_serve_prefill_scheduling(synth, capsys):
    """--prefill-scheduling picks the regime: prefill-first runs the lock-step simulation, mixed
    the steady state; a value outside the two is a usage error (rc 2)."""
    import json

    argv = lambda *x: serve_argv(synth, *x)  # noqa: E731  (the regime applies to any backend)
    rc, out, _ = run_cli(capsys, argv("--prefill-scheduling", "prefill-first"))
    first = json.loads(out)
    rc2, out2, _ = run_cli(capsys, argv("--prefill-scheduling", "mixed"))
    mixed = json.loads(out2)
    assert rc == rc2 == 0
    assert first["scheduler"]["lockstep"] and not first["scheduler"]["mixed"]
    assert mixed["scheduler"]["mixed"] and not mixed["scheduler"]["lockstep"]
    assert first["bound"] == "lock-step simulation" and mixed["bound"] != "lock-step simulation"
    rc3, _, err = run_cli(capsys, argv("--prefill-scheduling", "sometimes"))
    assert rc3 == 2 and "invalid choice" in err


def disagg_argv(synth, *extra):
    return [
        "serve-disagg", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm",
        "--systems-path", str(synth.systems_dir), "--prefill-workers", "2", "--decode-workers", "1",
        "--decode-tp", "2", "--concurrency", "8", "--isl", "128", "--osl", "8", "--json", *extra,
    ]


def test_serve_disagg_runs_each_pool_with_its_layout(synth, capsys):
    """serve-disagg: two prefill workers of one GPU and a TP2 decode worker; the JSON names both
    layouts, counts their GPUs and reports the percentiles."""
    import json

    rc, out, err = run_cli(capsys, disagg_argv(synth))
    assert rc == 0, err
    d = json.loads(out)
    assert d["prefill"] == {"workers": 2, "gpus_per_worker": 1, "layout": "1 GPU: TP 1", "tp": 1, "pp": 1,
                            "attention_dp": 1, "moe_tp": 1, "moe_ep": 1, "cp": 1}
    assert d["decode"]["tp"] == 2 and d["decode"]["gpus_per_worker"] == 2 and d["gpus"] == 4
    assert d["decode"]["layout"] == "2 GPUs: TP 2" and d["fits"] is True
    assert d["ttft_p50_ms"] <= d["ttft_p90_ms"] <= d["ttft_p99_ms"] and d["tpot_p99_ms"] == d["tpot_ms"]
    assert "ttft_dist" not in d and d["decode_kv_capacity"] > 0
    rc, out, err = run_cli(capsys, [a for a in disagg_argv(synth) if a != "--json"])
    assert rc == 0 and "prefill: 2 workers x (1 GPU: TP 1)" in out and "decode:  1 worker x (2 GPUs: TP 2)" in out
    assert "TTFT ms" in out and "4 GPUs" in out


@pytest.mark.parametrize(
    "extra,needle",
    [
        (("--prefill-workers", "0"), "--prefill-workers must be >= 1"),
        (("--decode-workers", "0"), "--decode-workers must be >= 1"),
        (("--prefill-batch", "0"), "--prefill-batch must be >= 1"),
        (("--decode-tp", "3"), "not a power of two"),
        (("--concurrency", "0"), "--concurrency must be >= 1"),
    ],
)
def test_serve_disagg_bad_input(synth, capsys, extra, needle):
    assert_one_line_error(*run_cli(capsys, disagg_argv(synth, *extra)), needle)


def test_serve_disagg_python_api_checks_the_pair(synth):
    from infercast.api import Estimator, serve_disagg

    pe = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)
    de = Estimator(sp.MODEL_ID_FP8, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)
    with pytest.raises(InvalidInputError, match="same model on the same system and backend"):
        serve_disagg(pe, de, concurrency=4, isl=128, osl=8, prefill_workers=1, decode_workers=1)
    with pytest.raises(InvalidInputError, match="concurrency must be a positive integer"):
        serve_disagg(pe, pe, concurrency=0, isl=128, osl=8, prefill_workers=1, decode_workers=1)


def test_serve_notes_a_request_longer_than_the_context_window(synth, capsys):
    """The synthetic model's window is 4096 tokens: `serve` still answers (the engine would need an
    extended window) but says so, in the JSON and on the console; within the window, no note."""
    import json

    def argv(isl, *extra):
        a = serve_argv(synth, *extra)
        a[a.index("--isl") + 1] = str(isl)
        return a

    rc, out, _ = run_cli(capsys, argv(4090))
    notes = json.loads(out)["notes"]
    assert rc == 0 and notes[0] == "isl+prefix+osl=4098 exceeds the model's max_position_embeddings 4096"
    # the rest: ops answered beyond the synthetic tables at this length (tests/test_held_notes.py)
    assert all("answered outside its measured table" in n for n in notes[1:])
    rc, out, _ = run_cli(capsys, argv(128))
    assert rc == 0 and json.loads(out)["notes"] == []
    rc, out, _ = run_cli(capsys, [x for x in argv(4090) if x != "--json"])
    assert rc == 0 and "note: isl+prefix+osl=4098 exceeds" in out


def test_serve_disagg_refuses_a_worker_that_cannot_hold_one_request(synth):
    """A worker whose weights alone exceed its GPU's memory cannot run: serve_disagg refuses it,
    naming the pool. One whose KV cache (by the conservative memory account) holds less than a
    request is served, with the capacity reported; the disaggregated search, which recommends,
    skips it with the reason."""
    import dataclasses

    from infercast.api import Estimator, one_request_misfit, serve_disagg
    from infercast.search import search_disagg
    from infercast.serving.sim import DoesNotFitError

    def est(tp, **mem):
        e = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", tp=tp, systems_path=synth.systems_dir)
        if mem:  # the synthetic GPUs hold millions of tokens: shrink what is left
            e.memory = dataclasses.replace(e.memory, **mem)
        return e

    ok = est(2)
    heavy = est(1, weights=est(1).memory.capacity * 1.01)
    short = est(1, kv_capacity_tokens=1000)
    assert one_request_misfit(ok, 1000) is None
    assert "more than the GPU's" in one_request_misfit(heavy, 10, strict=False)
    assert one_request_misfit(short, 1001, strict=False) is None
    assert "holds 1000 tokens of the 1001" in one_request_misfit(short, 1001)
    kw = {"concurrency": 2, "prefill_workers": 1, "decode_workers": 1}
    with pytest.raises(DoesNotFitError, match="a prefill worker cannot serve one request: its weights take"):
        serve_disagg(heavy, ok, isl=128, osl=8, **kw)
    with pytest.raises(DoesNotFitError, match="a decode worker cannot serve one request"):
        serve_disagg(ok, heavy, isl=128, osl=8, **kw)
    r = serve_disagg(short, ok, isl=1200, osl=8, **kw)
    assert r.ttft_ms > 0 and r.prefill_kv_capacity == pytest.approx(1000 / 1200)
    # aggregated serving of such a replica says the same, not "a KV cache of 0 tokens"
    from infercast.api import serve_agg

    with pytest.raises(DoesNotFitError, match="a replica cannot serve one request: its weights take .* more than the GPU's"):
        serve_agg(heavy, 2, 128, 8)
    with pytest.raises(DoesNotFitError, match="needs more KV cache than a rank has"):
        serve_agg(short, 2, 1200, 8)
    # the search: with max_gpus 1 no pair of workers fits, and says so
    r = search_disagg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, max_gpus=1, concurrencies=[1],
                      systems_path=synth.systems_dir)
    assert not r.candidates and r.skipped == {"P tp1 D tp1": "one prefill worker (1 GPU) and one decode worker (1) exceed 1 GPU"}


def test_serve_disagg_errors_name_the_pools_flags(synth, capsys):
    argv = ["serve-disagg", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm",
            "--systems-path", str(synth.systems_dir), "--concurrency", "4", "--isl", "128", "--osl", "8",
            "--prefill-workers", "1", "--decode-workers", "1"]
    assert_one_line_error(*run_cli(capsys, [*argv, "--prefill-tp", "3"]), "--prefill-tp 3 is not a power of two")
    assert_one_line_error(*run_cli(capsys, [*argv, "--decode-tp", "3"]), "--decode-tp 3 is not a power of two")


def test_moe_quant_on_a_dense_model_is_refused(synth, capsys):
    argv = ["estimate", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm",
            "--systems-path", str(synth.systems_dir), "--isl", "128", "--osl", "8", "--moe-quant", "fp8"]
    assert_one_line_error(*run_cli(capsys, argv), f"--moe-quant fp8 given, but {sp.MODEL_ID} has no MoE experts")


@pytest.mark.parametrize("kernel,needle", [("bogus", "unknown --moe-kernel 'bogus'"), ("trtllm", "--moe-kernel trtllm needs an MoE model")])
def test_moe_kernel_bad_input(synth, capsys, kernel, needle):
    argv = ["estimate", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm",
            "--systems-path", str(synth.systems_dir), "--isl", "128", "--osl", "8", "--moe-kernel", kernel]
    assert_one_line_error(*run_cli(capsys, argv), needle)


@pytest.mark.parametrize("value,needle", [("1.5", "--kv-memory-fraction must be a number in [0, 1]"),
                                          ("nan", "--kv-memory-fraction must be a number in [0, 1]"),
                                          ("0", "--kv-memory-fraction must be above 0")])
def test_kv_memory_fraction_bad_input(synth, capsys, value, needle):
    argv = ["serve", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm", "--concurrency", "4",
            "--systems-path", str(synth.systems_dir), "--isl", "128", "--osl", "8", "--kv-memory-fraction", value]
    assert_one_line_error(*run_cli(capsys, argv), needle)


def test_plan_out_that_cannot_be_written(synth, capsys, tmp_path):
    argv = ["estimate", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm",
            "--systems-path", str(synth.systems_dir), "--isl", "128", "--osl", "8", "--plan-out"]
    assert_one_line_error(*run_cli(capsys, [*argv, str(tmp_path / "missing" / "plan.json")]),
                          "cannot write --plan-out")
    assert_one_line_error(*run_cli(capsys, [*argv, str(tmp_path)]), "cannot write --plan-out")


def test_command_process_ends_cleanly(synth):
    """``run`` (the ``infercast`` command) ends the process itself after flushing: the whole JSON
    reaches a pipe, the exit handlers registered during the run still run, the exit code is
    main's, and a reader that closes the pipe after one line ends it quietly with 0."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    argv = estimate_argv(synth, "--tp", "2", "--json")
    code = ("import atexit, sys; atexit.register(lambda: print('exit handler ran', file=sys.stderr)); "
            f"sys.argv = ['infercast', *{argv!r}]; from infercast.cli.main import run; run()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0 and json.loads(proc.stdout)["tp"] == 2
    assert proc.stderr.strip().splitlines()[-1] == "exit handler ran"
    bad = subprocess.run([sys.executable, "-m", "infercast", *estimate_argv(synth, "--tp", "16")], capture_output=True,
                         text=True, env=env, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    head = subprocess.run(f"{sys.executable} -m infercast {' '.join(argv)} | head -n 1", shell=True, capture_output=True,
                          text=True, env=env, timeout=60, executable="/bin/bash")
    assert head.stdout == "{\n" and "Traceback" not in head.stderr and "Exception" not in head.stderr
