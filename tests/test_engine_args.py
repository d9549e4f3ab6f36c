"""Reading engines' own configurations (real flag names): each engine's layout convention,
scheduler and memory flags, unknown flags reported as ignored, bad values refused; and the round
trip with the launch files infercast writes (what it writes, it reads back the same)."""

from __future__ import annotations

import pytest
import yaml

from infercast.errors import InvalidInputError
from infercast.report.launch import Deployment, WorkerSpec, engine_command, launch_files
from infercast.serving.engine_args import parse_engine_cmd, parse_engine_file, parse_trtllm_options


def test_vllm_command():
    s = parse_engine_cmd("vllm serve deepseek-ai/DeepSeek-V3 --tensor-parallel-size 1 --data-parallel-size 8 "
                         "--enable-expert-parallel --max-num-seqs 512 --max-num-batched-tokens=16384 "
                         "--gpu-memory-utilization 0.85 --kv-cache-dtype fp8 --no-enable-chunked-prefill "
                         "--speculative-config '{\"method\": \"deepseek_mtp\", \"num_speculative_tokens\": 2}' "
                         "--host 0.0.0.0 --port 8000 --enable-prefix-caching --swap-space 16")
    assert s.backend == "vllm" and s.model == "deepseek-ai/DeepSeek-V3"
    assert s.layout == {"tp": 1, "pp": 1, "attention_dp": 8, "moe_tp": 1, "moe_ep": 8}
    assert s.scheduler == {"max_batch_size": 512, "max_num_tokens": 16384, "chunked": False}
    assert s.estimator_kw == {"kv_memory_fraction": 0.85, "kv_cache_quant": "fp8", "nextn": 2}
    # plumbing (--host, --port) is silent; flags that change serving but are not modelled are reported
    assert s.ignored == ["--enable-prefix-caching", "--swap-space"]
    assert any("--swap-space" in n for n in s.notes)


def test_sglang_command():
    s = parse_engine_cmd(["python3", "-m", "sglang.launch_server", "--model-path", "deepseek-ai/DeepSeek-R1",
                          "--tp-size", "8", "--dp-size", "8", "--enable-dp-attention", "--ep-size", "8",
                          "--mem-fraction-static", "0.9", "--chunked-prefill-size", "16384", "--max-running-requests",
                          "1024", "--kv-cache-dtype", "fp8_e4m3", "--scheduler-recv-interval", "10",
                          "--enable-mixed-chunk", "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
                          "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4", "--cuda-graph-max-bs", "256"])
    assert s.layout == {"tp": 1, "pp": 1, "attention_dp": 8, "moe_tp": 1, "moe_ep": 8}
    graphs = s.scheduler.pop("graph_batch_sizes")
    assert s.scheduler == {"chunked": True, "max_num_tokens": 16384, "max_batch_size": 1024, "recv_interval": 10,
                           "mixed": True, "lockstep": False}
    assert s.estimator_kw == {"kv_memory_fraction": 0.9, "kv_cache_quant": "fp8", "nextn": 3}
    assert s.ignored == []
    # --cuda-graph-max-bs 256: SGLang's default capture list up to 256
    assert graphs[:5] == (1, 2, 4, 8, 16) and graphs[-1] == 256 and all(b % 8 == 0 for b in graphs[3:])
    small = parse_engine_cmd("python -m sglang.launch_server --model-path m --cuda-graph-max-bs 20").scheduler
    assert small["graph_batch_sizes"] == (1, 2, 4, 8, 16)
    for cmd in ("python -m sglang.launch_server --model-path m --disable-cuda-graph", "vllm serve m --enforce-eager"):
        e = parse_engine_cmd(cmd)
        assert e.scheduler == {"graph_batch_sizes": ()} and any("no CUDA graphs" in n for n in e.notes)
    assert parse_engine_cmd("python -m sglang.launch_server --model-path m --tp 4 --chunked-prefill-size -1").scheduler == {"chunked": False}


def test_trtllm_command_with_its_options_file(tmp_path):
    opts = tmp_path / "extra.yaml"
    opts.write_text(yaml.safe_dump({
        "enable_attention_dp": True, "kv_cache_config": {"dtype": "fp8", "free_gpu_memory_fraction": 0.8, "enable_block_reuse": False},
        "speculative_config": {"decoding_type": "MTP", "num_nextn_predict_layers": 1},
        "moe_config": {"backend": "CUTLASS"}, "attention_dp_config": {"enable_balance": True, "timeout_iters": 60},
        "cuda_graph_config": {"enable_padding": True, "max_batch_size": 256}, "print_iter_log": True}))
    s = parse_engine_cmd(f"trtllm-serve deepseek-ai/DeepSeek-R1 --tp_size 8 --ep_size 8 --max_batch_size 256 "
                         f"--max_num_tokens 8448 --num_postprocess_workers 2 --extra_llm_api_options {opts}")
    assert s.model == "deepseek-ai/DeepSeek-R1"
    assert s.layout == {"tp": 1, "attention_dp": 8, "moe_ep": 8}
    assert s.scheduler["max_batch_size"] == 256 and s.scheduler["max_num_tokens"] == 8448
    assert s.scheduler["adp_balance_timeout_steps"] == 60
    assert s.scheduler["arrival_delay_ms"] == 25.0 and s.scheduler["front_end_per_stream_ms"] == 0.0
    assert s.estimator_kw == {"kv_memory_fraction": 0.8, "kv_cache_quant": "fp8", "nextn": 1, "moe_kernel": "cutlass"}
    assert s.ignored == ["cuda_graph_config"]
    assert any("enable_block_reuse" in n for n in s.notes)
    # the options file on its own: its keys, with the attention-DP switch kept for the command line's TP
    alone = parse_engine_file(opts)
    assert alone.layout == {"enable_attention_dp": True} and alone.estimator_kw["nextn"] == 1


@pytest.mark.parametrize(("cmd", "needle"), [
    ("vllm serve m --kv-cache-dtype fp4", "not a KV-cache dtype"),
    ("vllm serve m --tensor-parallel-size zero", "takes an integer"),
    ("vllm serve m --gpu-memory-utilization 1.5", "fraction of GPU memory"),
    ("vllm serve m --speculative-config '{\"method\": \"medusa\"}'", "not modelled"),
    ("vllm serve m --speculative-config '{\"num_speculative_tokens\": 2}'", "not modelled"),
    ("python -m sglang.launch_server --model-path m --tp-size 8 --dp-size 2", "without --enable-dp-attention"),
    ("python -m sglang.launch_server --model-path m --tp-size 8 --ep-size 3", "not a multiple"),
    ("python -m sglang.launch_server --model-path m --speculative-algorithm LOOKAHEAD", "not modelled"),
    ("text-generation-launcher --model-id m", "cannot tell which engine"),
])
def test_bad_values_are_refused(cmd, needle):
    with pytest.raises(InvalidInputError, match=needle):
        parse_engine_cmd(cmd)
    with pytest.raises(InvalidInputError, match="decoding_type"):
        parse_trtllm_options({"speculative_config": {"decoding_type": "Medusa"}})
    with pytest.raises(InvalidInputError, match="kernel family"):
        parse_trtllm_options({"moe_config": {"backend": "WIDEEP_X"}})


WORKERS = [
    WorkerSpec(role="agg", workers=1, tp=1, attention_dp=8, moe_tp=1, moe_ep=8, max_num_tokens=4096, max_batch_size=512,
               kv_memory_fraction=0.85, kv_cache_dtype="fp8", nextn=2, is_moe=True, mixed=True, recv_interval=4),
    WorkerSpec(role="agg", workers=1, tp=4, pp=2, max_num_tokens=16384, max_batch_size=64, chunked=False,
               kv_memory_fraction=0.7, mixed=True),
]


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
@pytest.mark.parametrize("w", WORKERS, ids=["moe-adp-ep", "dense-tp4-pp2"])
def test_round_trip_with_the_launch_files(backend, w):
    d = Deployment("org/model", backend, "1.0", (w,), 1000, 100, 8)
    s = parse_engine_cmd(engine_command(d, w))
    assert (s.layout["tp"], s.layout["pp"], s.layout["attention_dp"]) == (w.tp, w.pp, w.attention_dp)
    if w.moe_ep > 1:
        assert (s.layout["moe_tp"], s.layout["moe_ep"]) == (w.moe_tp, w.moe_ep)
    assert s.scheduler["max_batch_size"] == w.max_batch_size and s.scheduler["chunked"] == w.chunked
    if w.chunked:
        assert s.scheduler["max_num_tokens"] == w.max_num_tokens
    assert s.estimator_kw["kv_memory_fraction"] == w.kv_memory_fraction
    assert s.estimator_kw.get("nextn", 0) == w.nextn
    assert s.ignored == []


def test_round_trip_trtllm(tmp_path):
    w = WorkerSpec(role="agg", workers=1, tp=1, attention_dp=4, moe_tp=1, moe_ep=4, max_num_tokens=4096,
                   max_batch_size=128, kv_memory_fraction=0.75, kv_cache_dtype="fp8", nextn=1, moe_kernel="deepgemm",
                   is_moe=True, adp_balance_timeout_steps=30, batch_wait_iters=5, batch_wait_max_tokens_ratio=0.5)
    files = launch_files(Deployment("org/model", "trtllm", "1.0", (w,), 1000, 100, 8))
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    script = (tmp_path / "launch_agg.sh").read_text().replace("extra_llm_api_options_agg.yaml",
                                                               str(tmp_path / "extra_llm_api_options_agg.yaml"))
    (tmp_path / "launch_agg.sh").write_text(script)
    s = parse_engine_file(tmp_path / "launch_agg.sh")
    assert s.layout == {"tp": 1, "attention_dp": 4, "pp": 1, "moe_ep": 4, "moe_tp": 1}
    assert s.scheduler == {"max_batch_size": 128, "max_num_tokens": 4096, "chunked": True, "adp_balance_timeout_steps": 30,
                           "batch_wait_iters": 5, "batch_wait_max_tokens_ratio": 0.5}
    assert s.estimator_kw == {"kv_memory_fraction": 0.75, "kv_cache_quant": "fp8", "nextn": 1, "moe_kernel": "deepgemm"}
    assert s.ignored == []


# ---- through the CLI -----------------------------------------------------------------------------

def test_cli_engine_cmd_fills_the_flags(synth, capsys):
    import json

    from cli_helpers import assert_one_line_error, run_cli

    import synthpack as sp

    base = ["--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--systems-path", str(synth.systems_dir)]
    cmd = f"trtllm-serve {sp.MODEL_ID} --tp_size 2 --max_batch_size 8 --max_seq_len 4096"
    rc, out, err = run_cli(capsys, ["serve", *base, "--backend", "trtllm", "--concurrency", "4", "--isl", "128",
                                    "--osl", "8", "--engine-cmd", cmd, "--json"])
    assert rc == 0, err
    d = json.loads(out)
    assert d["tp"] == 2 and d["scheduler"]["max_batch_size"] == 8
    assert any("read --max_batch_size, --tp_size" in n for n in d["notes"]), d["notes"]
    assert any("ignored: --max_seq_len" in n for n in d["notes"])
    # a flag that disagrees with the configuration, and a configuration for another engine
    assert_one_line_error(*run_cli(capsys, ["estimate", *base, "--backend", "trtllm", "--isl", "8", "--osl", "2",
                                            "--tp", "4", "--engine-cmd", cmd]), "--tp 4 conflicts", "sets 2")
    assert_one_line_error(*run_cli(capsys, ["estimate", *base, "--backend", "trtllm", "--isl", "8", "--osl", "2",
                                            "--engine-cmd", "vllm serve m --max-num-seqs 4"]),
                          "configures vllm", "--backend is trtllm")


def test_cli_trtllm_options_file(synth, capsys, tmp_path):
    import json

    from cli_helpers import run_cli

    import synthpack as sp

    f = tmp_path / "extra.yaml"
    f.write_text("max_batch_size: 16\nmax_num_tokens: 2048\nkv_cache_config:\n  free_gpu_memory_fraction: 0.5\n")
    rc, out, err = run_cli(capsys, ["serve", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm",
                                    "--systems-path", str(synth.systems_dir), "--tp", "2", "--concurrency", "4",
                                    "--isl", "128", "--osl", "8", "--engine-args", str(f), "--json"])
    assert rc == 0, err
    d = json.loads(out)
    assert (d["scheduler"]["max_batch_size"], d["scheduler"]["max_num_tokens"], d["tp"]) == (16, 2048, 2)


def test_moe_communication_flags():
    assert parse_engine_cmd("python -m sglang.launch_server --model-path m --tp 8 --dp 8 --enable-dp-attention "
                            "--ep 8 --moe-a2a-backend deepep").estimator_kw == {"moe_comm": "alltoall"}
    assert parse_engine_cmd("vllm serve m --data-parallel-size 8 --enable-expert-parallel "
                            "--all2all-backend deepep_low_latency").estimator_kw == {"moe_comm": "alltoall"}
    assert parse_engine_cmd("vllm serve m --all2all-backend allgather_reducescatter").estimator_kw == {"moe_comm": "gather"}


def test_estimator_moe_comm_choice(real_pack_available):
    from infercast.api import Estimator
    from infercast.errors import InvalidConfigError

    if not real_pack_available:
        pytest.skip("needs the real pack")
    kw = dict(tp=1, attention_dp=8, moe_ep=8)
    a2a = Estimator("deepseek-ai/DeepSeek-V3", "h200_sxm", "vllm", moe_comm="alltoall", **kw)
    gather = Estimator("deepseek-ai/DeepSeek-V3", "h200_sxm", "vllm", moe_comm="gather", **kw)
    assert a2a.plan.parallel.moe_comm == "alltoall" and gather.plan.parallel.moe_comm == "gather"
    assert any(o.name == "moe_dispatch" for o in a2a.plan.ops)
    assert not any(o.name == "moe_dispatch" for o in gather.plan.ops)
    with pytest.raises(InvalidConfigError, match="needs an MoE model"):
        Estimator("Qwen/Qwen3-32B-FP8", "h200_sxm", "vllm", moe_comm="alltoall")
    with pytest.raises(InvalidInputError, match="unknown --moe-comm"):
        Estimator("deepseek-ai/DeepSeek-V3", "h200_sxm", "vllm", moe_comm="ring", **kw)
