"""Context parallelism through the interfaces: the CLI flags (estimate, serve-disagg, search), the
exp YAML, the engine-configuration readers and the launch files; refusals are one line, exit 2."""

from __future__ import annotations

import json

import pytest
import synthpack as sp
from cli_helpers import assert_one_line_error, run_cli

from infercast import Estimator
from infercast.errors import InvalidInputError, UnsupportedModelError
from infercast.exp import parse_experiments
from infercast.exp.run import run_experiment
from infercast.report.launch import Deployment, WorkerSpec, engine_command, launch_files, trtllm_extra_options
from infercast.serving.engine_args import parse_engine_cmd, parse_trtllm_options


def _argv(synth, cmd="estimate", *extra):
    return [cmd, "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm",
            "--systems-path", str(synth.systems_dir), "--isl", "1024", "--osl", "8", "--json", *extra]


def test_estimate_cp_json(synth, capsys):
    rc, out, err = run_cli(capsys, _argv(synth, "estimate", "--cp", "4"))
    assert rc == 0, err
    d = json.loads(out)
    assert (d["gpus"], d["cp"], d["layout"]) == (4, 4, "4 GPUs: TP 1, 4 context-parallel ranks")
    est = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", cp=4, systems_path=synth.systems_dir)
    assert d["ttft_ms"] == est.static(1, 1024, 8).ttft_ms
    assert "cp_kv_exchange_attention" in {b["op"] for b in d["breakdown"]}


@pytest.mark.parametrize(("extra", "needles"), [
    (("--cp", "0"), ["--cp must be a positive integer"]),
    (("--cp", "-2"), ["--cp must be a positive integer"]),
    (("--cp", "3"), ["--cp 3 is not a power of two"]),
    (("--cp", "16"), ["spans more than one NVLink domain"]),
])
def test_bad_cp_cli(synth, capsys, extra, needles):
    assert_one_line_error(*run_cli(capsys, _argv(synth, "estimate", *extra)), *needles)


def test_bad_prefill_cp_names_its_flag(synth, capsys):
    argv = _argv(synth, "serve-disagg", "--concurrency", "4", "--prefill-workers", "1", "--decode-workers", "1",
                 "--prefill-cp", "3")
    assert_one_line_error(*run_cli(capsys, argv), "--prefill-cp 3 is not a power of two")


def test_serve_disagg_with_a_cp_prefill(synth, capsys):
    argv = _argv(synth, "serve-disagg", "--concurrency", "4", "--prefill-workers", "1", "--decode-workers", "1",
                 "--prefill-cp", "2")
    rc, out, err = run_cli(capsys, argv)
    assert rc == 0, err
    d = json.loads(out)
    assert d["prefill"]["cp"] == 2 and d["prefill"]["gpus_per_worker"] == 2 and d["gpus"] == 3


def test_search_over_cp(synth, capsys):
    argv = [a for a in _argv(synth, "search", "--cp-list", "1,2", "--max-gpus", "4", "--concurrency", "1,2", "--all")
            if a != "--json"] + ["--json"]
    rc, out, err = run_cli(capsys, argv)
    assert rc == 0, err
    labels = {c["layout"]: c["gpus"] for c in json.loads(out)["candidates"]}
    assert labels["tp1-cp2"] == 2 and labels["tp2-cp2"] == 4 and labels["tp1"] == 1 and "tp4-cp2" not in labels
    # the candidates carry their cp degree as a field, not only in the label (results.csv filters on it)
    assert all(c["cp"] == (2 if c["layout"].endswith("-cp2") else 1) for c in json.loads(out)["candidates"])
    for extra, needle in ((("--cp-list", "1,3"), "powers of two"), (("--cp", "2", "--cp-list", "1,2"), "both given"),
                          (("--cp-list", "1,x"), "comma-separated integers")):
        argv = _argv(synth, "search", *extra)
        assert_one_line_error(*run_cli(capsys, argv), needle)


def test_exp_yaml_cp(synth):
    text = f"""\
defaults: {{model: {sp.MODEL_ID}, system: {sp.SYSTEM}, backend: trtllm, isl: 1024, osl: 8}}
experiments:
  - name: served
    layout: {{tp: 1, cp: 2}}
    concurrency: [2]
  - name: searched
    mode: agg
    max_gpus: 4
    cp_list: [1, 2]
    concurrency: [2]
"""
    served, searched = parse_experiments(text)
    (out,) = run_experiment(served, systems_path=synth.systems_dir)
    assert out.error is None and out.rows[0]["layout"] == "tp1-cp2" and out.rows[0]["gpus"] == 2
    (found,) = run_experiment(searched, systems_path=synth.systems_dir)
    assert found.error is None
    assert {"tp1-cp2", "tp2-cp2", "tp1"} <= {c.layout for c in found.searches["agg"].candidates}
    with pytest.raises(Exception, match="cp_list"):
        parse_experiments(text.replace("cp_list: [1, 2]", "cp_list: [1, 3]"))


def test_engine_args_read_cp():
    s = parse_engine_cmd("vllm serve m --tensor-parallel-size 2 --prefill-context-parallel-size 4")
    assert s.layout == {"tp": 2, "pp": 1, "attention_dp": 1, "cp": 4} and s.ignored == []
    s = parse_engine_cmd("vllm serve m -tp 2 -pcp 2")
    assert s.layout["cp"] == 2
    s = parse_engine_cmd("python -m sglang.launch_server --model-path m --tp-size 8 --attn-cp-size 4 --enable-prefill-cp")
    assert s.layout == {"tp": 2, "pp": 1, "attention_dp": 1, "cp": 4} and s.ignored == []
    s = parse_trtllm_options({"tensor_parallel_size": 2, "context_parallel_size": 2, "cp_config": {"cp_type": "HELIX"}})
    assert s.layout == {"tp": 2, "attention_dp": 1, "cp": 2} and any("HELIX" in n for n in s.notes)
    for cmd, needle in (("vllm serve m -tp 8 --decode-context-parallel-size 2", "inside the TP group is not modelled"),
                        ("python -m sglang.launch_server --model-path m --tp-size 8 --dcp-size 8", "not modelled"),
                        ("python -m sglang.launch_server --model-path m --tp-size 8 --dp-size 2 --enable-dp-attention "
                         "--attn-cp-size 2", "beside TP")):
        with pytest.raises(InvalidInputError, match=needle):
            parse_engine_cmd(cmd)


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_launch_files_round_trip_cp(backend):
    w = WorkerSpec(role="prefill", workers=1, tp=2, cp=4, max_num_tokens=8192, max_batch_size=8, kv_memory_fraction=0.8)
    assert w.gpus == 8
    s = parse_engine_cmd(engine_command(Deployment("org/model", backend, "1.0", (w,), 32768, 100, 8), w))
    assert (s.layout["tp"], s.layout.get("cp")) == (2, 4)


def test_trtllm_launch_files_cp():
    w = WorkerSpec(role="agg", workers=1, tp=2, cp=2)
    assert trtllm_extra_options(w)["context_parallel_size"] == 2
    files = launch_files(Deployment("org/model", "trtllm", "1.0", (w,), 32768, 100, 4))
    assert any("context_parallel_size: 2" in text for text in files.values())


@pytest.mark.real_pack
@pytest.mark.parametrize(("model", "needle"), [
    ("deepseek-ai/DeepSeek-V3.2", "DSA sparse attention"),
    ("deepseek-ai/DeepSeek-V4-Flash", "DeepSeek-V4"),
    ("moonshotai/Kimi-K3", "Kimi Delta Attention"),
    ("Qwen/Qwen3.5-397B-A17B", "Gated-DeltaNet"),
    ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "Mamba"),
])
def test_unmodelled_families_refuse_cp(real_pack_available, capsys, model, needle):
    with pytest.raises(UnsupportedModelError, match=needle):
        Estimator(model, "b200_sxm", "trtllm", tp=8, cp=2)
    argv = ["estimate", "--model", model, "--system", "b200_sxm", "--backend", "trtllm", "--tp", "8", "--cp", "2",
            "--isl", "1024", "--osl", "8"]
    assert_one_line_error(*run_cli(capsys, argv), "context parallelism (--cp 2) is not modelled", needle)


@pytest.mark.real_pack
def test_sliding_window_chunks_see_at_most_the_window(real_pack_available):
    import numpy as np

    from infercast.ops.attention import prefixed_context

    e = Estimator("openai/gpt-oss-120b", "h200_sxm", "vllm", tp=2, cp=2)
    (win,) = [c for c in e.engine.ops if c.op.kind == "attention" and c.op.params["window"] > 0]
    w, grid = float(win.op.params["window"]), win.resolved[0].grid

    def chunk(q, pre):
        return float(prefixed_context(grid, np.asarray(1.0), np.asarray(q), np.asarray(min(pre, w)))[0])

    want = max(chunk(2048.0, 0.0) + chunk(2048.0, 6144.0), chunk(2048.0, 2048.0) + chunk(2048.0, 4096.0))
    got = float(e.engine.components(ctx_batch=1.0, ctx_isl=8192.0, phase="prefill")[win.name][0])
    assert got == pytest.approx(win.op.count * want, rel=1e-12)
    assert e.engine.prefill_scalar(1.0, 8192.0) == pytest.approx(
        sum(float(v) for v, _ in e.engine.components(ctx_batch=1.0, ctx_isl=8192.0, phase="prefill").values()), rel=1e-12)


@pytest.mark.parametrize("cmd", [["estimate", "--batch", "2"], ["serve", "--concurrency", "4"],
                                 ["search", "--mode", "agg", "--max-gpus", "2"]])
def test_cp_overlap_without_a_cp_degree_is_refused(synth, capsys, cmd):
    """Before: --cp-overlap without a context-parallel degree above 1 was accepted and changed
    nothing. Now it is refused, naming the flag that would give it effect."""
    rc, out, err = run_cli(capsys, [cmd[0], "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm",
                                    "--systems-path", str(synth.systems_dir), "--isl", "128", "--osl", "8", *cmd[1:],
                                    "--cp-overlap"])
    assert_one_line_error(rc, out, err, "--cp-overlap", "--cp N")
