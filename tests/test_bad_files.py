"""Bad files: a local model config or a system YAML that is unreadable or holds an impossible
value ends in a typed error naming the file, the field and the value (CLI: exit 2, one line),
never a traceback, a NaN or a negative capacity; one broken system YAML does not break
``infercast systems``. A pack without its model configs, a corrupt Parquet table or a damaged
pack YAML names the file (or where it looked), the cause and the fix.

Everything runs on small files written here next to the synthetic pack of :mod:`synthpack`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import synthpack as sp
from cli_helpers import assert_one_line_error, run_cli

from infercast.data.model_configs import resolve_model
from infercast.data.pack import find_pack
from infercast.data.system import (
    list_systems,
    load_system,
    scan_systems,
    system_yaml_names,
)
from infercast.errors import DataFileError, InvalidInputError, UnknownSystemError
from infercast.models.spec import build_spec

SRC = Path(__file__).resolve().parents[1] / "src"


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def estimate_argv(systems_dir, model=sp.MODEL_ID, system=sp.SYSTEM, *extra):
    return [
        "estimate", "--model", str(model), "--system", system, "--backend", "trtllm",
        "--systems-path", str(systems_dir), "--isl", "128", "--osl", "8", "--json", *extra,
    ]


def _base_config(synth) -> dict:
    return json.loads((synth.model_configs_dir / "synth--tiny-llama_config.json").read_text())


def _write_config(tmp_path: Path, name: str, body) -> Path:
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(body))
    return p


def _system_yaml(synth, **changes) -> str:
    """The synthetic system YAML with ``key: value`` lines replaced (value written verbatim)."""
    text = (synth.systems_dir / f"{sp.SYSTEM}.yaml").read_text()
    for key, value in changes.items():
        text, n = re.subn(rf"(?m)^(\s+){key}:.*$", lambda m, v=value, k=key: f"{m.group(1)}{k}: {v}", text)
        if n == 0:  # a key the synthetic YAML does not have: add it to the gpu section
            text = text.replace("gpu:\n", f"gpu:\n  {key}: {value}\n", 1)
    return text


def _systems_dir(tmp_path: Path, synth, systems: dict[str, str]) -> Path:
    """A pack whose systems/ holds ``systems`` (name -> YAML text) and the synthetic pack's
    query_versions.yaml, with data/ and model_configs/ linked to the synthetic pack's."""
    root = tmp_path / "pack"
    sysdir = root / "systems"
    sysdir.mkdir(parents=True)
    (sysdir / "query_versions.yaml").write_text((synth.systems_dir / "query_versions.yaml").read_text())
    (sysdir / "data").symlink_to(synth.systems_dir / "data", target_is_directory=True)
    (root / "model_configs").symlink_to(synth.model_configs_dir, target_is_directory=True)
    for name, text in systems.items():
        (sysdir / f"{name}.yaml").write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return sysdir


# ---------------------------------------------------------------------------------------------
# 1. local model configs
# ---------------------------------------------------------------------------------------------
def test_non_utf8_model_config_is_a_data_file_error(synth, capsys, tmp_path):
    bad = tmp_path / "latin1.json"
    bad.write_bytes(b'\xff\xfe{"hidden_size": 256}')
    with pytest.raises(DataFileError, match="not UTF-8"):
        resolve_model(find_pack(str(synth.systems_dir)), str(bad))
    assert_one_line_error(*run_cli(capsys, estimate_argv(synth.systems_dir, bad)), str(bad), "not UTF-8")


def test_config_json_that_is_a_directory_is_a_data_file_error(synth, capsys, tmp_path):
    model_dir = tmp_path / "model"
    (model_dir / "config.json").mkdir(parents=True)
    with pytest.raises(DataFileError, match="is a directory"):
        resolve_model(find_pack(str(synth.systems_dir)), str(model_dir))
    assert_one_line_error(*run_cli(capsys, estimate_argv(synth.systems_dir, model_dir)),
                          str(model_dir / "config.json"), "is a directory")


def test_hf_quant_config_that_is_a_directory_is_a_data_file_error(synth, capsys, tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(_base_config(synth)))
    (model_dir / "hf_quant_config.json").mkdir()
    assert_one_line_error(*run_cli(capsys, estimate_argv(synth.systems_dir, model_dir)),
                          str(model_dir / "hf_quant_config.json"), "is a directory")


BAD_FIELDS = [
    # (field, value, words the message must hold)
    ("num_key_value_heads", 0, "num_key_value_heads must be positive, got 0"),
    ("num_key_value_heads", -2, "num_key_value_heads must be positive, got -2"),
    ("num_attention_heads", -8, "num_attention_heads must be positive, got -8"),
    ("num_attention_heads", 0, "num_attention_heads must be positive, got 0"),
    ("hidden_size", 0, "hidden_size must be positive, got 0"),
    ("hidden_size", -256, "hidden_size must be positive, got -256"),
    ("hidden_size", "abc", "hidden_size must be a whole number, got 'abc'"),
    ("hidden_size", 256.5, "hidden_size must be a whole number, got 256.5"),
    ("hidden_size", True, "hidden_size must be a whole number, got True"),
    ("num_hidden_layers", 0, "num_hidden_layers must be positive, got 0"),
    ("num_hidden_layers", -1, "num_hidden_layers must be positive, got -1"),
    ("head_dim", 0, "head_dim must be positive, got 0"),
    ("head_dim", -32, "head_dim must be positive, got -32"),
    ("vocab_size", 0, "vocab_size must be positive, got 0"),
    ("vocab_size", -1000, "vocab_size must be positive, got -1000"),
    ("intermediate_size", 0, "intermediate_size must be positive, got 0"),
    ("max_position_embeddings", -1, "max_position_embeddings must be >= 0, got -1"),
    ("sliding_window", -4, "sliding_window must be >= 0, got -4"),
]


@pytest.mark.parametrize(("field", "value", "needle"), BAD_FIELDS, ids=[f"{f}={v!r}" for f, v, _ in BAD_FIELDS])
def test_impossible_model_field_names_field_and_value(synth, capsys, tmp_path, field, value, needle):
    path = _write_config(tmp_path, "cfg", {**_base_config(synth), field: value})
    with pytest.raises(InvalidInputError) as ei:
        build_spec(resolve_model(find_pack(str(synth.systems_dir)), str(path)))
    assert needle in str(ei.value) and str(path) in str(ei.value)
    assert_one_line_error(*run_cli(capsys, estimate_argv(synth.systems_dir, path)), str(path), needle)


def test_heads_not_divisible_by_kv_heads_is_rejected(synth, capsys, tmp_path):
    # 64 query heads over 3 KV heads: GQA needs whole groups (was accepted and estimated)
    cfg = {**_base_config(synth), "num_attention_heads": 64, "num_key_value_heads": 3, "hidden_size": 2048}
    path = _write_config(tmp_path, "gqa", cfg)
    with pytest.raises(InvalidInputError, match="num_attention_heads=64 is not a multiple of num_key_value_heads=3"):
        build_spec(resolve_model(find_pack(str(synth.systems_dir)), str(path)))
    # more KV heads than query heads is the same mistake
    path2 = _write_config(tmp_path, "gqa2", {**_base_config(synth), "num_key_value_heads": 16})
    with pytest.raises(InvalidInputError, match="num_attention_heads=8 is not a multiple of num_key_value_heads=16"):
        build_spec(resolve_model(find_pack(str(synth.systems_dir)), str(path2)))
    assert_one_line_error(*run_cli(capsys, estimate_argv(synth.systems_dir, path)), str(path),
                          "num_attention_heads=64", "num_key_value_heads=3")


def test_missing_required_field_names_it(synth, tmp_path):
    cfg = {k: v for k, v in _base_config(synth).items() if k != "num_hidden_layers"}
    with pytest.raises(InvalidInputError, match="missing field num_hidden_layers"):
        build_spec(resolve_model(find_pack(str(synth.systems_dir)), str(_write_config(tmp_path, "c", cfg))))


def test_defaulted_head_dim_that_comes_out_zero_is_rejected(synth, tmp_path):
    # no head_dim: hidden_size // num_attention_heads = 4 // 8 = 0
    cfg = {k: v for k, v in _base_config(synth).items() if k != "head_dim"}
    cfg.update(hidden_size=4)
    with pytest.raises(InvalidInputError, match=r"head_dim \(not set; hidden_size // num_attention_heads = 4 // 8\)"):
        build_spec(resolve_model(find_pack(str(synth.systems_dir)), str(_write_config(tmp_path, "c", cfg))))


def test_moe_expert_counts_are_checked(synth, tmp_path):
    base = {**_base_config(synth), "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 8,
            "num_experts_per_tok": 2, "moe_intermediate_size": 128}
    pack = find_pack(str(synth.systems_dir))
    ok = build_spec(resolve_model(pack, str(_write_config(tmp_path, "ok", base))))
    assert (ok.moe.experts, ok.moe.topk, ok.moe.inter) == (8, 2, 128)
    for change, needle in (({"num_experts": 0}, "num_experts must be positive, got 0"),
                           ({"num_experts_per_tok": 0}, "num_experts_per_tok must be positive, got 0"),
                           ({"num_experts_per_tok": 9}, "9 experts per token"),
                           ({"moe_intermediate_size": -1}, "moe_intermediate_size must be positive, got -1")):
        path = _write_config(tmp_path, "moe", {**base, **change})
        with pytest.raises(InvalidInputError) as ei:
            build_spec(resolve_model(pack, str(path)))
        assert needle in str(ei.value) and str(path) in str(ei.value)


def test_valid_variants_still_build(synth, tmp_path):
    pack = find_pack(str(synth.systems_dir))
    base = _base_config(synth)
    ref = build_spec(resolve_model(pack, str(_write_config(tmp_path, "ref", base))))
    # integral floats / numeric strings mean the number
    spec = build_spec(resolve_model(pack, str(_write_config(tmp_path, "f", {**base, "hidden_size": 256.0,
                                                                           "num_hidden_layers": "2"}))))
    assert (spec.hidden, spec.num_layers) == (ref.hidden, ref.num_layers) == (256, 2)
    # no num_key_value_heads: multi-head attention (kv = heads); a null head_dim: hidden // heads
    cfg = {k: v for k, v in base.items() if k != "num_key_value_heads"}
    cfg["head_dim"] = None
    spec = build_spec(resolve_model(pack, str(_write_config(tmp_path, "mha", cfg))))
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim) == (8, 8, 32)


# ---------------------------------------------------------------------------------------------
# 2. system YAMLs
# ---------------------------------------------------------------------------------------------
def test_numeric_string_memory_capacity_is_a_number(synth, capsys, tmp_path):
    # PyYAML reads 141e9 (no dot) as the string "141e9"; the user means 141 GB
    sysdir = _systems_dir(tmp_path, synth, {sp.SYSTEM: _system_yaml(synth, mem_capacity="141e9", mem_bw="1e12")})
    spec = load_system(find_pack(str(sysdir)), sp.SYSTEM)
    assert spec.gpu.mem_capacity == 141_000_000_000 and isinstance(spec.gpu.mem_capacity, int)
    assert spec.gpu.mem_bw == 1e12
    rc, out, err = run_cli(capsys, estimate_argv(sysdir))
    assert rc == 0, err
    d = json.loads(out)
    assert math.isfinite(d["ttft_ms"]) and d["ttft_ms"] > 0 and math.isfinite(d["tpot_ms"])


BAD_SYSTEM_VALUES = [
    # (key, YAML value, section, shown value)
    ("mem_capacity", "abc", "gpu", "'abc'"),
    ("mem_capacity", "0", "gpu", "0"),
    ("mem_capacity", "-5", "gpu", "-5"),
    ("mem_capacity", "1.5e3x", "gpu", "'1.5e3x'"),
    ("mem_bw", "0", "gpu", "0"),
    ("mem_bw", "-1.0e12", "gpu", "'-1.0e12'"),  # PyYAML: a string
    ("mem_bw", ".nan", "gpu", "nan"),
    ("mem_bw", ".inf", "gpu", "inf"),
    ("mem_bw", "fast", "gpu", "'fast'"),
    ("mem_bw_empirical_scaling_factor", "0", "gpu", "0"),
    ("bfloat16_tc_flops", "0", "gpu", "0"),
    ("fp8_tc_flops", "-1", "gpu", "-1"),
    ("int8_tc_flops", "lots", "gpu", "'lots'"),
    ("fp4_tc_flops", "0", "gpu", "0"),
    ("mem_empirical_constant_latency", "-0.000001", "gpu", "-1e-06"),
    ("num_gpus_per_node", "0", "node", "0"),
    ("num_gpus_per_node", "2.5", "node", "2.5"),
    ("num_gpus_per_node", "yes", "node", "True"),
    ("intra_node_bw", "0", "node", "0"),
    ("inter_node_bw", "-5", "node", "-5"),
    ("pcie_bw", "abc", "node", "'abc'"),
    ("p2p_latency", "-0.1", "node", "-0.1"),
]


@pytest.mark.parametrize(("key", "value", "sect", "shown"), BAD_SYSTEM_VALUES,
                         ids=[f"{k}={v}" for k, v, _, _ in BAD_SYSTEM_VALUES])
def test_impossible_system_value_names_file_field_and_value(synth, capsys, tmp_path, key, value, sect, shown):
    sysdir = _systems_dir(tmp_path, synth, {sp.SYSTEM: _system_yaml(synth, **{key: value})})
    path = str(sysdir.resolve() / f"{sp.SYSTEM}.yaml")
    with pytest.raises(DataFileError) as ei:
        load_system(find_pack(str(sysdir)), sp.SYSTEM)
    msg = str(ei.value)
    assert path in msg and f"{sect}.{key}" in msg and f"got {shown}" in msg, msg
    assert_one_line_error(*run_cli(capsys, estimate_argv(sysdir)), path, f"{sect}.{key}", f"got {shown}")


def test_zero_flops_no_longer_gives_nan_json(synth, capsys, tmp_path):
    # was: "ttft_ms": NaN in the --json output (not JSON at all)
    sysdir = _systems_dir(tmp_path, synth, {sp.SYSTEM: _system_yaml(synth, bfloat16_tc_flops="0")})
    rc, out, err = run_cli(capsys, estimate_argv(sysdir))
    assert "NaN" not in out
    assert_one_line_error(rc, out, err, "gpu.bfloat16_tc_flops must be a positive number, got 0")


@pytest.mark.parametrize(("body", "needle"), [
    (b"gpu: {mem_bw: 1\xff}\n", "not UTF-8"),
    (b"- just\n- a list\n", "is not a mapping of sections"),
    (b"gpu: fast\nnode: {num_gpus_per_node: 8, intra_node_bw: 1}\n", "gpu must be a mapping"),
    (b"gpu: {mem_bw: [1, 2}\n", "cannot read system spec"),  # PyYAML's message spans lines
], ids=["non-utf8", "top-level-list", "section-not-mapping", "yaml-syntax"])
def test_unreadable_system_yaml_is_a_data_file_error(synth, capsys, tmp_path, body, needle):
    sysdir = _systems_dir(tmp_path, synth, {sp.SYSTEM: body})
    with pytest.raises(DataFileError, match=needle):
        load_system(find_pack(str(sysdir)), sp.SYSTEM)
    assert_one_line_error(*run_cli(capsys, estimate_argv(sysdir)), f"{sp.SYSTEM}.yaml", needle)


def test_bad_nccl_mem_and_other_mem(synth, tmp_path):
    good = _system_yaml(synth)
    for i, (old, new, needle) in enumerate((
        ("    2: 100000000", "    two: 100000000", "misc.nccl_mem.gpus must be a positive whole number, got 'two'"),
        ("    2: 100000000", "    2: -1", "misc.nccl_mem.2 must be a whole number >= 0, got -1"),
        (f"  other_mem: {sp.SYSTEM_OTHER_MEM}", "  other_mem: -1", "misc.other_mem must be a whole number >= 0, got -1"),
    )):
        assert old in good
        sysdir = _systems_dir(tmp_path / str(i), synth, {sp.SYSTEM: good.replace(old, new)})
        with pytest.raises(DataFileError) as ei:
            load_system(find_pack(str(sysdir)), sp.SYSTEM)
        assert needle in str(ei.value)


def test_optional_node_keys_checked_when_present(synth, tmp_path):
    text = _system_yaml(synth).replace("node:\n", "node:\n  num_gpus_per_rack: 0\n  inter_rack_bw: 1.0e11\n", 1)
    sysdir = _systems_dir(tmp_path, synth, {sp.SYSTEM: text})
    with pytest.raises(DataFileError, match=r"node\.num_gpus_per_rack must be a positive whole number, got 0"):
        load_system(find_pack(str(sysdir)), sp.SYSTEM)


# ---------------------------------------------------------------------------------------------
# 3. one broken system YAML does not break the listing
# ---------------------------------------------------------------------------------------------
BROKEN = "broken_gpu"


@pytest.fixture
def mixed_pack(synth, tmp_path):
    """A pack with the good synthetic system and one whose memory bandwidth is 0."""
    return _systems_dir(tmp_path, synth, {sp.SYSTEM: _system_yaml(synth), BROKEN: _system_yaml(synth, mem_bw="0")})


def test_listing_skips_a_broken_system_with_the_reason(mixed_pack, caplog):
    pack = find_pack(str(mixed_pack))
    assert system_yaml_names(pack) == sorted([BROKEN, sp.SYSTEM])
    with caplog.at_level(logging.WARNING, logger="infercast"):
        assert list_systems(pack) == [sp.SYSTEM]
    warned = [r.getMessage() for r in caplog.records if r.name == "infercast"]
    assert len(warned) == 1, warned
    assert BROKEN in warned[0] and f"{BROKEN}.yaml" in warned[0] and "gpu.mem_bw must be a positive number, got 0" in warned[0]
    scanned = {name: (spec, problem) for name, spec, problem in scan_systems(pack)}
    assert scanned[sp.SYSTEM][0] is not None and scanned[sp.SYSTEM][1] is None
    assert scanned[BROKEN][0] is None and "gpu.mem_bw" in scanned[BROKEN][1]


def test_systems_command_survives_a_broken_system(mixed_pack, capsys):
    rc, out, err = run_cli(capsys, ["systems", "--systems-path", str(mixed_pack), "--json"])
    assert rc == 0, err
    d = json.loads(out)
    good = [r for r in d["systems"] if r["system"] == sp.SYSTEM]
    assert {r["backend"] for r in good} == {"trtllm", "vllm"} and not any(r.get("error") for r in good)
    (broken,) = [r for r in d["systems"] if r["system"] == BROKEN]  # listed, with what is wrong
    assert broken["backend"] is None and "gpu.mem_bw must be a positive number, got 0" in broken["error"]
    rc, out, err = run_cli(capsys, ["systems", "--systems-path", str(mixed_pack)])
    assert rc == 0 and "broken" in out and BROKEN in out


def test_commands_that_need_the_broken_system_get_its_error(mixed_pack, capsys):
    path = str(mixed_pack.resolve() / f"{BROKEN}.yaml")
    pack = find_pack(str(mixed_pack))
    with pytest.raises(DataFileError, match="gpu.mem_bw must be a positive number, got 0"):
        load_system(pack, BROKEN)
    assert_one_line_error(*run_cli(capsys, estimate_argv(mixed_pack, system=BROKEN)), path, "gpu.mem_bw", "got 0")
    # the good system still estimates; an unknown name lists both files
    rc, out, err = run_cli(capsys, estimate_argv(mixed_pack))
    assert rc == 0 and json.loads(out)["fits"] is True, err
    with pytest.raises(UnknownSystemError) as ei:
        load_system(pack, "h9000")
    assert ei.value.available == sorted([BROKEN, sp.SYSTEM])


def test_systems_command_subprocess_reports_broken_system_on_stderr(mixed_pack):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    env.pop("INFERCAST_SYSTEMS_PATH", None)
    proc = subprocess.run(
        [sys.executable, "-m", "infercast", "systems", "--systems-path", str(mixed_pack), "--json"],
        check=False, capture_output=True, text=True, env=env, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    rows = json.loads(proc.stdout)["systems"]
    assert [r["system"] for r in rows] == sorted([BROKEN, sp.SYSTEM, sp.SYSTEM])
    (broken,) = [r for r in rows if r.get("error")]
    assert f"{BROKEN}.yaml" in broken["error"] and "gpu.mem_bw must be a positive number, got 0" in broken["error"]
    assert proc.stderr.strip() == ""  # the listing reports it in its rows, not as a warning


def test_models_command_survives_an_unreadable_config(synth, capsys, tmp_path):
    """`infercast models` lists an unreadable model config with what is wrong and goes on."""
    sysdir = _systems_dir(tmp_path, synth, {sp.SYSTEM: _system_yaml(synth)})
    root = sysdir.parent
    (root / "model_configs").unlink()  # a private copy, with one broken file beside the good ones
    shutil.copytree(synth.model_configs_dir, root / "model_configs")
    (root / "model_configs" / "broken--model_config.json").write_bytes(b"\xff\xfe not json")
    rc, out, err = run_cli(capsys, ["models", "--systems-path", str(sysdir), "--json"])
    assert rc == 0, err
    rows = {r["model"]: r for r in json.loads(out)}
    assert "not UTF-8" in rows["broken/model"]["error"] and rows["broken/model"]["supported"] is False
    assert rows[sp.MODEL_ID]["supported"] is True and "error" not in rows[sp.MODEL_ID]
    rc, out, _ = run_cli(capsys, ["models", "--systems-path", str(sysdir)])
    assert rc == 0 and "unreadable" in out


# ---------------------------------------------------------------------------------------------
# 4. a pack without its model configs; damaged table and YAML files
# ---------------------------------------------------------------------------------------------
def test_systems_copy_without_model_configs_says_where_it_looked(synth, capsys, tmp_path):
    """A copy of systems/ alone: the model ids are unknown, not "none" (was: an empty table, exit 0,
    and "available: none")."""
    sysdir = _systems_dir(tmp_path, synth, {sp.SYSTEM: _system_yaml(synth)})
    (sysdir.parent / "model_configs").unlink()
    expected = str(sysdir.resolve().parent / "model_configs")
    for argv in (["models", "--systems-path", str(sysdir)], ["models", "--systems-path", str(sysdir), "--json"],
                 estimate_argv(sysdir)):
        assert_one_line_error(*run_cli(capsys, argv), "model configs not found", f"no directory {expected}",
                              "beside systems/")
    # a local config still estimates without the pack's model configs
    local = _write_config(tmp_path, "local", _base_config(synth))
    rc, out, err = run_cli(capsys, estimate_argv(sysdir, local))
    assert rc == 0 and json.loads(out)["ttft_ms"] > 0, err
    # an empty model_configs/ says so too
    sysdir = _systems_dir(tmp_path / "empty", synth, {sp.SYSTEM: _system_yaml(synth)})
    (sysdir.parent / "model_configs").unlink()
    (sysdir.parent / "model_configs").mkdir()
    assert_one_line_error(*run_cli(capsys, ["models", "--systems-path", str(sysdir)]), "model configs not found",
                          f"{sysdir.resolve().parent / 'model_configs'} holds no *_config.json files")


FIX = ("reinstall the data pack", "infercast data fetch", "--systems-path")


def test_corrupt_parquet_names_file_cause_and_fix(capsys, tmp_path):
    # was: "perf table ... is unreadable: ArrowInvalid"
    pack = sp.make_pack(tmp_path / "p", corrupt_table="gemm_perf")
    path = pack.systems_dir / "data" / sp.SYSTEM / "gemm" / "trtllm" / sp.TRTLLM_CURRENT / "gemm_perf.parquet"
    line = assert_one_line_error(*run_cli(capsys, estimate_argv(pack.systems_dir)), str(path.resolve()),
                                 "is unreadable (ArrowInvalid: Parquet magic bytes not found", *FIX)
    assert "file is corrupted" in line  # pyarrow's own words, kept on the one line


@pytest.mark.parametrize(("which", "body", "needle"), [
    ("query_versions.yaml", b"defaults: {trtllm: [1,\n", "while parsing"),
    ("query_versions.yaml", b"- a list\n", "holds a list, not a mapping"),
    ("query_versions.yaml", b"defaults: \xff\n", "not UTF-8 text"),
    ("reuse.yaml", b"reuse: [{table: gemm_perf\n", "while parsing"),
], ids=["qv-syntax", "qv-list", "qv-non-utf8", "reuse-syntax"])
def test_damaged_pack_yaml_names_file_cause_and_fix(capsys, tmp_path, which, body, needle):
    # was: a multi-line "cannot parse" message, or a traceback (non-UTF-8, a list)
    pack = sp.make_pack(tmp_path / "p")
    if which == "reuse.yaml":
        path = pack.systems_dir / "data" / sp.SYSTEM / "gemm" / "trtllm" / sp.TRTLLM_NEXT / "reuse.yaml"
        argv = estimate_argv(pack.systems_dir, sp.MODEL_ID, sp.SYSTEM, "--backend-version", sp.TRTLLM_NEXT)
    else:
        path = pack.systems_dir / "query_versions.yaml"
        argv = estimate_argv(pack.systems_dir)
    path.write_bytes(body)
    assert_one_line_error(*run_cli(capsys, argv), f"cannot read pack file {path.resolve()}", needle, *FIX)
