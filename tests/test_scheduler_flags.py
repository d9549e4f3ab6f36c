"""Scheduler settings as input on every serving command (issue #39 item 1): ``serve-disagg``'s
shared and per-role ``--scheduler`` / shortcut flags and per-role engine configurations,
``search``'s scheduler flags, and the range checks of ``--scheduler FIELD=VALUE``. Each flag moves
the answer in the direction its meaning implies; a bad value is one line, exit code 2.
Synthetic pack, in-process CLI."""

from __future__ import annotations

import json

import pytest
import synthpack as sp
from cli_helpers import assert_one_line_error, run_cli


def _argv(synth, command, *extra):
    return [command, "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm",
            "--systems-path", str(synth.systems_dir), "--isl", "128", "--osl", "8", *extra]


def _disagg(synth, capsys, *extra):
    rc, out, err = run_cli(capsys, _argv(synth, "serve-disagg", "--prefill-workers", "1", "--decode-workers", "1",
                                         "--concurrency", "8", "--json", *extra))
    assert rc == 0, err
    return json.loads(out)


def test_serve_disagg_scheduler_per_role(synth, capsys):
    base = _disagg(synth, capsys)
    # host time per decode step: TPOT grows, the prefill scheduler is untouched
    dec = _disagg(synth, capsys, "--decode-scheduler", "step_overhead_ms=5")
    assert dec["tpot_ms"] > base["tpot_ms"] + 4.0
    assert dec["scheduler_decode"]["step_overhead_ms"] == 5.0
    assert dec["scheduler_prefill"]["step_overhead_ms"] == base["scheduler_prefill"]["step_overhead_ms"]
    # host time per prefill step: TTFT grows, TPOT does not
    pre = _disagg(synth, capsys, "--prefill-scheduler", "step_overhead_ms=50")
    assert pre["ttft_ms"] > base["ttft_ms"] + 40.0
    assert pre["tpot_ms"] == pytest.approx(base["tpot_ms"], rel=1e-2)
    # the shared flags set both roles; a role's own flag wins over them
    both = _disagg(synth, capsys, "--step-overhead-ms", "2", "--decode-scheduler", "step_overhead_ms=3")
    assert both["scheduler_prefill"]["step_overhead_ms"] == 2.0 and both["scheduler_decode"]["step_overhead_ms"] == 3.0
    shared = _disagg(synth, capsys, "--scheduler", "step_overhead_ms=5")
    assert shared["tpot_ms"] == pytest.approx(dec["tpot_ms"], rel=1e-3) and shared["ttft_ms"] > base["ttft_ms"]


def test_serve_disagg_decode_batch_cap_applied(synth, capsys):
    long = ("--concurrency", "64", "--osl", "256")
    base = _disagg(synth, capsys, *long)
    capped = _disagg(synth, capsys, *long, "--decode-scheduler", "max_batch_size=2")
    assert capped["scheduler_decode"]["max_batch_size"] == 2
    # the decode ranks hold at most max_batch_size requests; the rest wait for a slot, in TPOT
    assert base["decode_batch"] > 2 and capped["decode_batch"] == 2
    assert capped["decode_slot_wait_ms"] > 0 and base["decode_slot_wait_ms"] == 0
    assert capped["tpot_ms"] > base["tpot_ms"]
    assert any("max_batch_size 2" in n and "wait" in n for n in capped["notes"])
    assert not any("decode slot" in n for n in base["notes"])


def test_serve_disagg_role_engine_args(synth, capsys, tmp_path):
    f = tmp_path / "decode.yaml"
    f.write_text("max_batch_size: 2\nmax_num_tokens: 4096\n")
    d = _disagg(synth, capsys, "--decode-engine-args", str(f))
    assert d["scheduler_decode"]["max_batch_size"] == 2 and d["scheduler_decode"]["max_num_tokens"] == 4096
    assert d["scheduler_prefill"]["max_batch_size"] != 2
    assert any("decode engine configuration" in n for n in d["notes"])
    # the configuration's layout fills the role's layout flags
    g = tmp_path / "prefill.txt"
    g.write_text("trtllm-serve MODEL --tp_size 2\n")
    p = _disagg(synth, capsys, "--prefill-engine-cmd", "trtllm-serve MODEL --tp_size 2")
    assert p["prefill"]["gpus_per_worker"] == 2 and p["decode"]["gpus_per_worker"] == 1
    assert_one_line_error(*run_cli(capsys, _argv(synth, "serve-disagg", "--prefill-workers", "1", "--decode-workers", "1",
                                                 "--concurrency", "8", "--prefill-tp", "4",
                                                 "--prefill-engine-cmd", "trtllm-serve MODEL --tp_size 2")),
                          "--prefill-tp 4 conflicts with --prefill-engine-cmd")


@pytest.mark.parametrize("flag,item,needle", [
    ("--decode-scheduler", "max_batch_size=0", "max_batch_size must be a finite number >= 1, got 0"),
    ("--prefill-scheduler", "step_overhead_ms=-1", "step_overhead_ms must be a finite number >= 0"),
    ("--scheduler", "kv_length_ratio=1.5", "kv_length_ratio must be a finite number > 0 and <= 1"),
    ("--scheduler", "graph_batch_sizes=0,8", "graph_batch_sizes takes batch sizes >= 1"),
    ("--decode-scheduler", "overlap=maybe", "overlap takes true or false"),
    ("--decode-scheduler", "no_such=1", "not FIELD=VALUE of a scheduler setting"),
])
def test_serve_disagg_bad_scheduler_values(synth, capsys, flag, item, needle):
    assert_one_line_error(*run_cli(capsys, _argv(synth, "serve-disagg", "--prefill-workers", "1", "--decode-workers", "1",
                                                 "--concurrency", "8", flag, item)), flag, needle)


def test_serve_bad_scheduler_value(synth, capsys):
    assert_one_line_error(*run_cli(capsys, _argv(synth, "serve", "--concurrency", "4", "--scheduler", "recv_interval=0")),
                          "--scheduler recv_interval must be a finite number >= 1, got 0")


def test_serve_cuda_graph_sizes_pad_decode(synth, capsys):
    def tpot(*extra):
        rc, out, err = run_cli(capsys, _argv(synth, "serve", "--concurrency", "3", "--json", *extra))
        assert rc == 0, err
        return json.loads(out)["tpot_ms"]

    # decodes of 3 run in the graph of 64: the token-wise ops work on 64 rows
    assert tpot("--scheduler", "graph_batch_sizes=64") > tpot("--scheduler", "graph_batch_sizes=")


def _best(synth, capsys, *extra):
    rc, out, err = run_cli(capsys, _argv(synth, "search", "--max-gpus", "1", "--concurrency", "8", "--json",
                                         "--ttft-ms", "inf", "--tpot-ms", "inf", *extra))
    assert rc == 0, err
    return json.loads(out)["best"]


def test_search_scheduler_flags(synth, capsys):
    base = _best(synth, capsys)
    slow = _best(synth, capsys, "--step-overhead-ms", "5")
    assert slow["tpot_ms"] > base["tpot_ms"] + 4.0
    same = _best(synth, capsys, "--scheduler", "step_overhead_ms=5")
    assert same["tpot_ms"] == pytest.approx(slow["tpot_ms"])
    # a cap of 2 running requests: 8 clients are refused (they would only queue)
    assert_one_line_error(*run_cli(capsys, _argv(synth, "search", "--max-gpus", "1", "--concurrency", "8",
                                                 "--max-batch-size", "2")), "runs 2 requests", "give at most 2")


def test_search_role_scheduler(synth, capsys):
    def best(*extra):
        rc, out, err = run_cli(capsys, _argv(synth, "search", "--mode", "disagg", "--max-gpus", "2", "--concurrency", "8",
                                             "--json", "--ttft-ms", "inf", "--tpot-ms", "inf", *extra))
        assert rc == 0, err
        return json.loads(out)["best"]

    base = best()
    dec = best("--decode-scheduler", "step_overhead_ms=5")
    assert dec["tpot_ms"] > base["tpot_ms"] + 4.0
    assert_one_line_error(*run_cli(capsys, _argv(synth, "search", "--max-gpus", "1", "--decode-scheduler",
                                                 "step_overhead_ms=5")), "--decode-scheduler", "--mode disagg or both")
    assert_one_line_error(*run_cli(capsys, _argv(synth, "search", "--max-gpus", "1", "--max-batch-size", "0")),
                          "--max-batch-size must be a finite number >= 1")


def test_serve_disagg_role_model_settings(synth, capsys):
    base = _disagg(synth, capsys)
    # the decode workers' KV memory fraction: their KV capacity shrinks, the prefill workers' does not
    small = _disagg(synth, capsys, "--decode-kv-memory-fraction", "0.3")
    assert small["decode_kv_capacity"] < base["decode_kv_capacity"]
    assert small["prefill_kv_capacity"] == pytest.approx(base["prefill_kv_capacity"])
    # an fp8 KV cache on the prefill workers halves the KV bytes they send
    fp8 = _disagg(synth, capsys, "--prefill-kv-cache-quant", "fp8")
    assert fp8["kv_transfer_ms"] < base["kv_transfer_ms"]
    assert fp8["decode_kv_capacity"] == pytest.approx(base["decode_kv_capacity"])
    # a role's engine configuration sets that role's fraction only
    d = _disagg(synth, capsys, "--decode-engine-cmd", "trtllm-serve MODEL --kv_cache_free_gpu_memory_fraction 0.3")
    assert d["decode_kv_capacity"] == pytest.approx(small["decode_kv_capacity"])
    assert_one_line_error(*run_cli(capsys, _argv(synth, "serve-disagg", "--prefill-workers", "1", "--decode-workers", "1",
                                                 "--concurrency", "8", "--decode-kv-memory-fraction", "1.5")),
                          "--decode-kv-memory-fraction", "1.5")


def test_search_takes_the_engine_configuration_scheduler(synth, capsys, tmp_path):
    f = tmp_path / "extra.yaml"
    f.write_text("max_batch_size: 2\n")
    assert_one_line_error(*run_cli(capsys, _argv(synth, "search", "--max-gpus", "1", "--concurrency", "8",
                                                 "--engine-args", str(f))), "runs 2 requests")


def test_serve_disagg_engine_args_scheduler_both_roles(synth, capsys, tmp_path):
    f = tmp_path / "extra.yaml"
    f.write_text("max_num_tokens: 4096\n")
    d = _disagg(synth, capsys, "--engine-args", str(f))
    assert d["scheduler_prefill"]["max_num_tokens"] == d["scheduler_decode"]["max_num_tokens"] == 4096


def test_serve_disagg_role_moe_kernel_real_pack(real_pack_available, capsys):
    """vLLM on b200: the decode workers' Triton experts (0.22.0 rows) move TPOT and not the prefill
    workers' step; their rows measured power, so the energy covers the decode experts only."""
    def run(*extra):
        rc, out, err = run_cli(capsys, ["serve-disagg", "--model", "Qwen/Qwen3-30B-A3B", "--system", "b200_sxm",
                                        "--backend", "vllm", "--isl", "1024", "--osl", "128", "--concurrency", "16",
                                        "--prefill-workers", "1", "--decode-workers", "1", "--json", *extra])
        assert rc == 0, err
        return json.loads(out)

    base, triton = run(), run("--decode-moe-kernel", "triton")
    assert triton["tpot_ms"] != pytest.approx(base["tpot_ms"], rel=1e-3)
    assert base["energy"]["available"] is False
    assert triton["energy"]["available"] and triton["energy"]["measured_ops"] == ["moe_experts"]
    # Triton experts in both roles: the prefill's experts are measured too
    both = run("--moe-kernel", "triton")
    assert both["energy"]["measured_j_per_request"] > triton["energy"]["measured_j_per_request"]
    assert both["energy"]["coverage"] > triton["energy"]["coverage"]
