"""Launch files: each engine's command line and options say exactly the settings the prediction
assumed (parsed back from the written text), layouts an engine cannot run are refused, and the
Kubernetes manifest and benchmark commands carry the same numbers."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from infercast.errors import InvalidInputError, NotAvailableError
from infercast.report.launch import Deployment, WorkerSpec, dynamo_manifest, engine_command, launch_files


def _flags(argv: list[str]) -> dict:
    """{--flag: value or True} of an argv (a flag followed by another flag is a switch)."""
    out, i = {}, 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                out[a] = argv[i + 1]
                i += 2
                continue
            out[a] = True
        i += 1
    return out


def _script_argv(text: str) -> list[str]:
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert len(lines) == 1, text
    return shlex.split(lines[0])


MOE = WorkerSpec(role="agg", workers=2, tp=1, attention_dp=8, moe_tp=1, moe_ep=8, max_num_tokens=4096,
                 max_batch_size=512, chunked=True, kv_memory_fraction=0.85, kv_cache_dtype="fp8", nextn=2,
                 moe_kernel="cutlass", is_moe=True, adp_balance_timeout_steps=60, recv_interval=10, mixed=False)


def _deploy(backend: str, *workers: WorkerSpec) -> Deployment:
    return Deployment("org/model", backend, "1.0", workers, isl=4000, osl=500, concurrency=64)


def test_trtllm_command_and_options_round_trip():
    files = launch_files(_deploy("trtllm", MOE))
    f = _flags(_script_argv(files["launch_agg.sh"]))
    # TensorRT-LLM counts every GPU of the stage in tp_size and turns attention DP on beside it
    assert (f["--tp_size"], f["--pp_size"], f["--ep_size"]) == ("8", "1", "8")
    assert (f["--max_batch_size"], f["--max_num_tokens"], f["--kv_cache_free_gpu_memory_fraction"]) == ("512", "4096", "0.85")
    opts = yaml.safe_load(files[f["--extra_llm_api_options"]])
    assert opts["enable_attention_dp"] is True
    assert opts["attention_dp_config"] == {"enable_balance": True, "timeout_iters": 60}
    assert opts["kv_cache_config"] == {"dtype": "fp8", "free_gpu_memory_fraction": 0.85}
    assert opts["speculative_config"] == {"decoding_type": "MTP", "num_nextn_predict_layers": 2}
    assert opts["moe_config"] == {"backend": "CUTLASS"}
    assert opts["enable_chunked_prefill"] is True
    assert (opts["moe_tensor_parallel_size"], opts["moe_expert_parallel_size"]) == (1, 8)


def test_vllm_command_round_trip():
    argv = _script_argv(launch_files(_deploy("vllm", MOE))["launch_agg.sh"])
    assert argv[:3] == ["vllm", "serve", "org/model"]
    f = _flags(argv)
    # vLLM counts TP per data-parallel rank; experts over all 8 GPUs by EP
    assert (f["--tensor-parallel-size"], f["--data-parallel-size"]) == ("1", "8")
    assert f["--enable-expert-parallel"] is True
    assert (f["--max-num-seqs"], f["--max-num-batched-tokens"], f["--gpu-memory-utilization"]) == ("512", "4096", "0.85")
    assert f["--kv-cache-dtype"] == "fp8" and f["--enable-chunked-prefill"] is True
    assert json.loads(f["--speculative-config"]) == {"method": "mtp", "num_speculative_tokens": 2}
    unchunked = WorkerSpec(role="agg", workers=1, tp=2, chunked=False)
    assert "--no-enable-chunked-prefill" in engine_command(_deploy("vllm", unchunked), unchunked)


def test_sglang_command_round_trip():
    f = _flags(_script_argv(launch_files(_deploy("sglang", MOE))["launch_agg.sh"]))
    assert (f["--tp-size"], f["--dp-size"], f["--ep-size"]) == ("8", "8", "8")
    assert f["--enable-dp-attention"] is True and "--enable-mixed-chunk" not in f  # prefill-first
    assert (f["--max-running-requests"], f["--chunked-prefill-size"], f["--mem-fraction-static"]) == ("512", "4096", "0.85")
    assert f["--kv-cache-dtype"] == "fp8_e4m3" and f["--scheduler-recv-interval"] == "10"
    assert (f["--speculative-num-steps"], f["--speculative-num-draft-tokens"]) == ("2", "3")
    dense = WorkerSpec(role="agg", workers=1, tp=4, chunked=False, mixed=True)
    g = _flags(engine_command(_deploy("sglang", dense), dense))
    assert g["--chunked-prefill-size"] == "-1" and g["--enable-mixed-chunk"] is True and "--dp-size" not in g


def test_layouts_an_engine_cannot_run_are_refused():
    adp_tp = WorkerSpec(role="agg", workers=1, tp=2, attention_dp=4, moe_tp=1, moe_ep=8, is_moe=True)
    with pytest.raises(NotAvailableError, match="attention at TP 1"):
        launch_files(_deploy("trtllm", adp_tp))
    mixed = WorkerSpec(role="agg", workers=1, tp=8, moe_tp=2, moe_ep=4, is_moe=True)
    with pytest.raises(NotAvailableError, match="TP 2 x EP 4"):
        launch_files(_deploy("vllm", mixed))
    assert _flags(_script_argv(launch_files(_deploy("sglang", mixed))["launch_agg.sh"]))["--ep-size"] == "4"
    with pytest.raises(InvalidInputError, match="known: trtllm, vllm, sglang"):
        launch_files(_deploy("tgi", MOE))


def test_disaggregated_files_and_manifest():
    pre = WorkerSpec(role="prefill", workers=3, tp=4)
    dec = WorkerSpec(role="decode", workers=2, tp=8, max_batch_size=128)
    for backend in ("trtllm", "vllm", "sglang"):
        d = _deploy(backend, pre, dec)
        files = launch_files(d)
        assert {"launch_prefill.sh", "launch_decode.sh", "k8s_dynamo.yaml", "benchmark.sh", "deployment.json"} <= set(files)
        docs = list(yaml.safe_load_all(files["k8s_dynamo.yaml"]))
        graph = docs[-1]
        assert graph["kind"] == "DynamoGraphDeployment"
        svcs = graph["spec"]["services"]
        assert svcs["PrefillWorker"]["replicas"] == 3 and svcs["PrefillWorker"]["resources"]["limits"]["gpu"] == "4"
        assert svcs["DecodeWorker"]["replicas"] == 2 and svcs["DecodeWorker"]["resources"]["limits"]["gpu"] == "8"
        args = svcs["DecodeWorker"]["extraPodSpec"]["mainContainer"]["args"]
        assert args[-2:] == ["--disaggregation-mode", "decode"]
        if backend == "trtllm":  # the engine configuration travels in a ConfigMap
            cfg = yaml.safe_load(docs[0]["data"]["decode.yaml"])
            assert (cfg["tensor_parallel_size"], cfg["max_batch_size"]) == (8, 128)
            assert cfg["cache_transceiver_config"] == {"backend": "DEFAULT"}
        else:
            assert "--host" not in args and d.model in args
        meta = json.loads(files["deployment.json"])
        assert meta["gpus"] == 3 * 4 + 2 * 8 == d.gpus
    assert dynamo_manifest(_deploy("vllm", pre, dec))[-1]["spec"]["services"]["Frontend"]["componentType"] == "frontend"


def test_benchmark_commands_state_the_predicted_load():
    text = launch_files(_deploy("vllm", MOE))["benchmark.sh"]
    cmds = [shlex.split(ln) for ln in text.splitlines() if ln and not ln.startswith("#")]
    aiperf, bench = (_flags(c) for c in cmds)
    assert (aiperf["--concurrency"], aiperf["--synthetic-input-tokens-mean"], aiperf["--output-tokens-mean"]) == ("64", "4000", "500")
    assert aiperf["--synthetic-input-tokens-stddev"] == aiperf["--output-tokens-stddev"] == "0"
    assert (bench["--max-concurrency"], bench["--random-input-len"], bench["--random-output-len"]) == ("64", "4000", "500")
    assert bench["--ignore-eos"] is True and bench["--random-range-ratio"] == "0"
