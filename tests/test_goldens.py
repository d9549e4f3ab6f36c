"""End-to-end goldens: recompute every pinned case and compare with tests/goldens/*.json.

Four files (``dense``, ``moe``, ``serving``, ``hybrid``; see ``scripts/repin_goldens.py``). The comparison
is one function (``repin_goldens.compare_goldens``, also behind ``repin_goldens.py --check``) used
by the real test and by the guard tests that prove it catches a 1% change in every file. Re-pin
with ``python scripts/repin_goldens.py`` and review the files' git diff.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN_DIR = ROOT / "tests" / "goldens"


def _load_repin():
    name = "repin_goldens"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "repin_goldens.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses resolve their module through sys.modules
    spec.loader.exec_module(mod)
    return mod


repin = _load_repin()
compare_goldens = repin.compare_goldens
GROUPS = list(repin.GROUPS)
#: the numeric outputs of each group the 1% guard is proven on
GUARDED = {
    "dense": ("ttft_ms", "tpot_ms", "tokens_per_s_per_gpu", "memory_gb_per_gpu"),
    "moe": ("ttft_ms", "tpot_ms", "tokens_per_s_per_gpu", "memory_gb_per_gpu"),
    "serving": ("ttft_ms", "tpot_ms"),
    "hybrid": ("ttft_ms", "tpot_ms", "tokens_per_s_per_gpu", "memory_gb_per_gpu"),
    "intervals": ("ttft_ms_p80_lo", "ttft_ms_p95_hi", "tpot_ms_p80_hi", "tokens_per_s_per_gpu_p80_lo"),
}


@pytest.fixture(scope="module")
def pinned() -> dict[str, dict]:
    return {g: json.loads(repin.golden_path(g, GOLDEN_DIR).read_text()) for g in GROUPS}


def _static_cases(pinned) -> list[dict]:
    return pinned["dense"]["cases"] + pinned["moe"]["cases"]


# ---------------------------------------------------------------------------------------------
# the files themselves
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("group", GROUPS)
def test_golden_file_is_canonical(pinned, group):
    doc = pinned[group]
    assert doc["schema"] == repin.GOLDEN_SCHEMA and doc["pack"] == repin.PACK and doc["rel_tol"] == repin.REL_TOL
    assert repin.golden_path(group, GOLDEN_DIR).read_text() == repin.dumps(doc)  # sorted keys, stable formatting
    cases = repin.GROUPS[group]
    assert [c["id"] for c in doc["cases"]] == [c.id for c in cases]
    assert [c["inputs"] for c in doc["cases"]] == [c.inputs() for c in cases]
    for c, spec in zip(doc["cases"], cases):
        assert sorted(c["outputs"]) == sorted(spec.OUTPUT_KEYS)


def test_no_stray_golden_files():
    assert sorted(p.stem for p in GOLDEN_DIR.glob("*.json")) == sorted(GROUPS)


def test_dense_cases_kept():
    # the 31 dense cases pinned before MoE coverage existed keep their ids (and so their history)
    dense = repin.DENSE_CASES
    assert len(dense) >= 31
    assert dense[0].id == "Meta-Llama-3.1-8B|h100_sxm|trtllm|tp1pp1|b1|isl128|osl128"
    assert dense[30].id == "Qwen3-32B|h100_sxm|vllm|tp1pp1|b64|isl8192|osl1024"
    assert all(set(c.inputs()) == {"model", "system", "backend", "tp", "pp", "batch_size", "isl", "osl", "prefix"} for c in dense[:31])


def test_static_coverage(pinned):
    static = _static_cases(pinned)
    assert len(static) >= 60
    kinds = {(c["inputs"]["pp"] > 1, c["inputs"]["prefix"] > 0, c["outputs"]["fits"]) for c in static}
    assert (True, False, True) in kinds  # a pipeline-parallel case
    assert (False, True, True) in kinds  # a prefix case
    moe = pinned["moe"]["cases"]
    inp = [c["inputs"] for c in moe]
    models = {i["model"] for i in inp}
    assert {"Qwen/Qwen3-235B-A22B-FP8", "openai/gpt-oss-120b", "MiniMaxAI/MiniMax-M2.5", "deepseek-ai/DeepSeek-V3",
            "deepseek-ai/DeepSeek-R1", "moonshotai/Kimi-K2.5", "Qwen/Qwen3.5-397B-A17B"} <= models
    assert any(i.get("moe_ep", 1) > 1 and i.get("attention_dp", 1) == 1 for i in inp)  # TP attention + EP
    assert any(i.get("attention_dp", 1) == 16 and i.get("moe_ep") == 16 for i in inp)  # EP16
    assert {1, 3} <= {i.get("nextn", 0) for i in inp}  # MTP
    assert any(i["pp"] == 2 for i in inp)  # a pipelined MoE model
    assert any(i["isl"] >= 32768 and c["outputs"]["fits"] for i, c in zip(inp, moe))  # long context
    assert sum(not c["outputs"]["fits"] for c in moe) >= 2  # weights do not fit; KV does not fit
    assert {i["backend"] for i in inp} == {"trtllm", "vllm", "sglang"}
    for c in static:  # a case that fits has latencies, one that does not has none
        o = c["outputs"]
        assert (o["ttft_ms"] is not None) == o["fits"] == (o["tpot_ms"] is not None)


def test_serving_coverage(pinned):
    modes = [c["inputs"]["mode"] for c in pinned["serving"]["cases"]]
    assert modes.count("agg") >= 5 and modes.count("disagg") >= 1
    assert {c["inputs"]["backend"] for c in pinned["serving"]["cases"] if c["inputs"]["mode"] == "agg"} == {"trtllm", "vllm", "sglang"}
    assert any("DeepSeek" in c["inputs"]["prefill"]["model"] for c in pinned["serving"]["cases"] if c["inputs"]["mode"] == "disagg")


def test_interval_coverage(pinned):
    cases = pinned["intervals"]["cases"]
    kinds = {c["inputs"].get("mode", "static") for c in cases}
    assert kinds == {"static", "agg", "disagg"}
    assert {c["inputs"]["backend"] for c in cases if "backend" in c["inputs"]} == {"trtllm", "vllm", "sglang"}
    for c in cases:  # each range holds the narrower one
        o = c["outputs"]
        for f in ("ttft_ms", "tpot_ms", "tokens_per_s_per_gpu"):
            assert o[f"{f}_p95_lo"] <= o[f"{f}_p80_lo"] < o[f"{f}_p80_hi"] <= o[f"{f}_p95_hi"]


# ---------------------------------------------------------------------------------------------
# the comparison catches what it must
# ---------------------------------------------------------------------------------------------
def _first_with_latency(doc):
    return next(i for i, c in enumerate(doc["cases"]) if c["outputs"]["ttft_ms"] is not None)


@pytest.mark.parametrize("group", GROUPS)
def test_compare_identical_is_clean(pinned, group):
    assert compare_goldens(pinned[group], copy.deepcopy(pinned[group])) == []


@pytest.mark.parametrize(("group", "key"), [(g, k) for g in GROUPS for k in GUARDED[g]])
def test_guard_catches_one_percent_change(pinned, group, key):
    doc = pinned[group]
    changed = copy.deepcopy(doc)
    i = _first_with_latency(changed)
    changed["cases"][i]["outputs"][key] *= 1.01
    problems = compare_goldens(doc, changed)
    assert len(problems) == 1
    assert problems[0].startswith(doc["cases"][i]["id"] + f": {key} pinned")
    assert "+1.0000%" in problems[0]
    # and the other direction, on the last case with latencies too
    changed["cases"][i]["outputs"][key] = doc["cases"][i]["outputs"][key] * 0.99
    j = max(k for k, c in enumerate(doc["cases"]) if c["outputs"]["ttft_ms"] is not None)
    changed["cases"][j]["outputs"][key] = doc["cases"][j]["outputs"][key] * 0.99
    assert len(compare_goldens(doc, changed)) == (1 if i == j else 2)


@pytest.mark.parametrize("group", GROUPS)
def test_guard_tolerates_rounding_noise(pinned, group):
    doc = pinned[group]
    changed = copy.deepcopy(doc)
    i = _first_with_latency(changed)
    changed["cases"][i]["outputs"]["ttft_ms"] *= 1 + 1e-9
    assert compare_goldens(doc, changed) == []
    changed["cases"][i]["outputs"]["ttft_ms"] = doc["cases"][i]["outputs"]["ttft_ms"] * (1 + 1e-5)
    assert len(compare_goldens(doc, changed)) == 1


@pytest.mark.parametrize("group", GROUPS)
def test_guard_catches_structural_changes(pinned, group):
    doc = pinned[group]
    i = _first_with_latency(doc)
    cid = doc["cases"][i]["id"]
    if "fits" in doc["cases"][i]["outputs"]:
        c = copy.deepcopy(doc)
        c["cases"][i]["outputs"]["fits"] = False
        assert compare_goldens(doc, c) == [f"{cid}: fits pinned True now False"]
    c = copy.deepcopy(doc)
    c["cases"][i]["outputs"]["ttft_ms"] = None
    assert len(compare_goldens(doc, c)) == 1
    c = copy.deepcopy(doc)
    c["cases"][i]["outputs"]["backend_version"] = "0.0"
    assert len(compare_goldens(doc, c)) == 1
    c = copy.deepcopy(doc)
    c["cases"][i]["inputs"]["isl"] += 1
    assert len(compare_goldens(doc, c)) == 1
    c = copy.deepcopy(doc)
    del c["cases"][i]
    assert compare_goldens(doc, c) == [f"{cid}: pinned but not computed"]
    c = copy.deepcopy(doc)
    c["cases"][i]["outputs"]["ttft_ms"] = float("nan")
    assert len(compare_goldens(doc, c)) == 1
    c = copy.deepcopy(doc)
    del c["cases"][i]["outputs"]["tpot_ms"]
    assert compare_goldens(doc, c) == [f"{cid}: output 'tpot_ms' present on one side only"]


def test_check_compares_every_file(pinned, tmp_path):
    """``--check`` (``repin_goldens.check``) reads every group's file and reports per group."""
    assert len(repin.check(pinned, tmp_path)) == len(GROUPS)  # no files: each one missing
    for g, doc in pinned.items():
        repin.golden_path(g, tmp_path).write_text(repin.dumps(doc))
    assert repin.check(pinned, tmp_path) == []
    changed = copy.deepcopy(pinned)
    for g in GROUPS:
        changed[g]["cases"][_first_with_latency(changed[g])]["outputs"]["tpot_ms"] *= 1.01
    problems = repin.check(changed, tmp_path)
    assert [p.split("]")[0] + "]" for p in problems] == [f"[{g}]" for g in GROUPS]


def test_dumps_refuses_non_finite(pinned):
    doc = copy.deepcopy(pinned["moe"])
    doc["cases"][0]["outputs"]["ttft_ms"] = float("inf")
    with pytest.raises(ValueError, match="finite"):
        repin.dumps(doc)


# ---------------------------------------------------------------------------------------------
# the real thing
# ---------------------------------------------------------------------------------------------
@pytest.mark.real_pack
def test_goldens_reproduce(real_pack_available):
    problems = repin.check(repin.compute_all(), GOLDEN_DIR)
    assert not problems, (
        f"{len(problems)} golden difference(s); if intended, re-pin with "
        "`python scripts/repin_goldens.py` and review the diff:\n" + "\n".join(problems)
    )
