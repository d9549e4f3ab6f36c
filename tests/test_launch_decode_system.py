"""Launch files of a disaggregated search whose decode workers run on another system
(``search`` / ``recommend --decode-system``): each worker kind's script, ``deployment.json`` and
Kubernetes service state its own system and GPU memory (parsed back from the written files; the
GPU memory is read from the estimator each worker was built with, so the decode worker's being
twice the prefill's shows it was built on its own system), and a one-system deployment gets no
node selector."""

from __future__ import annotations

import json
import shutil

import pytest
import synthpack as sp
import yaml
from cli_helpers import run_cli

from infercast.report.launch import SYSTEM_KEY, Deployment, WorkerSpec, dynamo_manifest, launch_files

BIG = "synth_big"  # the synthetic system with 32 GiB per GPU instead of 16


@pytest.fixture(scope="module")
def two_systems(synth, tmp_path_factory):
    """A copy of the synthetic pack with a second system: the same tables, twice the GPU memory."""
    root = tmp_path_factory.mktemp("twosystems")
    systems = root / "systems"
    shutil.copytree(synth.systems_dir, systems, symlinks=True)
    shutil.copytree(synth.systems_dir.parent / "model_configs", root / "model_configs")
    text = (systems / f"{sp.SYSTEM}.yaml").read_text()
    big = text.replace("mem_capacity: 17179869184", "mem_capacity: 34359738368")
    assert big != text
    (systems / f"{BIG}.yaml").write_text(big)
    return systems


def _header(script: str) -> str:
    return script.splitlines()[1]


def test_search_save_dir_states_each_roles_system(two_systems, tmp_path, capsys):
    out = tmp_path / "out"
    rc, stdout, err = run_cli(capsys, [
        "search", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm", "--isl", "128", "--osl", "8",
        "--mode", "disagg", "--decode-system", BIG, "--concurrency", "2,8", "--max-gpus", "4",
        "--ttft-ms", "inf", "--tpot-ms", "inf", "--systems-path", str(two_systems), "--save-dir", str(out), "--json"])
    assert rc == 0, err
    d = json.loads(stdout)
    assert d["decode_system"] == BIG and d["decode_backend_version"] == "1.0"
    tops = sorted((out / "top").iterdir())
    assert tops and all(p.name.startswith("disagg-") for p in tops)
    for sub in tops:
        meta = json.loads((sub / "deployment.json").read_text())
        assert meta["systems"] == {"prefill": sp.SYSTEM, "decode": BIG}
        mem = {w["role"]: (w["system"], w["backend_version"], w["gpu_memory_gib"]) for w in meta["workers"]}
        assert mem == {"prefill": (sp.SYSTEM, "1.0", 16.0),
                       "decode": (BIG, "1.0", 32.0)}
        assert _header((sub / "launch_prefill.sh").read_text()).endswith(f"on {sp.SYSTEM} (16 GiB per GPU); trtllm 1.0")
        assert _header((sub / "launch_decode.sh").read_text()).endswith(f"on {BIG} (32 GiB per GPU); trtllm 1.0")
        docs = list(yaml.safe_load_all((sub / "k8s_dynamo.yaml").read_text()))
        svcs = docs[-1]["spec"]["services"]
        for name, system in (("PrefillWorker", sp.SYSTEM), ("DecodeWorker", BIG)):
            assert svcs[name]["annotations"] == {SYSTEM_KEY: system}
            assert svcs[name]["extraPodSpec"]["nodeSelector"] == {SYSTEM_KEY: system}
        assert "nodeSelector" not in svcs["Frontend"]["extraPodSpec"]


def test_recommend_save_dir_states_each_roles_system(two_systems, tmp_path, capsys):
    out = tmp_path / "rec"
    rc, stdout, err = run_cli(capsys, [
        "recommend", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm", "--isl", "128", "--osl", "8",
        "--mode", "disagg", "--decode-system", BIG, "--max-gpus", "4", "--clients", "8", "--ttft-ms", "inf",
        "--tpot-ms", "inf", "--systems-path", str(two_systems), "--save-dir", str(out), "--json", "--quiet"])
    assert rc == 0, err
    assert json.loads(stdout)["decode_system"] == BIG
    meta = json.loads((out / "top" / "disagg-1" / "deployment.json").read_text())
    assert meta["systems"] == {"prefill": sp.SYSTEM, "decode": BIG}


def test_recommend_decode_system_needs_disagg(two_systems, capsys):
    from cli_helpers import assert_one_line_error

    rc, out, err = run_cli(capsys, [
        "recommend", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm", "--isl", "128", "--osl", "8",
        "--decode-system", BIG, "--clients", "8", "--systems-path", str(two_systems)])
    assert_one_line_error(rc, out, err, "--decode-system", "--mode disagg")


def test_one_system_gets_annotations_but_no_node_selector():
    pre = WorkerSpec(role="prefill", workers=1, tp=2, system="h200_sxm", gpu_memory_gib=141.0)
    dec = WorkerSpec(role="decode", workers=1, tp=4, system="h200_sxm", gpu_memory_gib=141.0)
    d = Deployment("org/model", "vllm", "1.0", (pre, dec), 1000, 100, 8)
    assert not d.mixed_systems
    svcs = dynamo_manifest(d)[-1]["spec"]["services"]
    for name in ("PrefillWorker", "DecodeWorker"):
        assert svcs[name]["annotations"] == {SYSTEM_KEY: "h200_sxm"}
        assert "nodeSelector" not in svcs[name]["extraPodSpec"]
    cross = Deployment("org/model", "vllm", "1.0", (pre, WorkerSpec(role="decode", workers=1, tp=4, system="b200_sxm")),
                       1000, 100, 8)
    assert cross.mixed_systems and cross.systems == {"prefill": "h200_sxm", "decode": "b200_sxm"}
    svcs = dynamo_manifest(cross)[-1]["spec"]["services"]
    assert svcs["DecodeWorker"]["extraPodSpec"]["nodeSelector"] == {SYSTEM_KEY: "b200_sxm"}
    # a worker whose system is not known (built by hand) states none
    files = launch_files(Deployment("org/model", "sglang", "1.0", (WorkerSpec(role="agg", workers=1),), 10, 10, 1))
    assert " on " not in files["launch_agg.sh"].splitlines()[1]
    assert json.loads(files["deployment.json"])["systems"] == {}
