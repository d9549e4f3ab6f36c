"""End-to-end goldens: recompute every pinned case and compare with tests/goldens/dense.json.

The comparison is one function (:func:`compare_goldens`) used by the real test and by the guard
tests that prove it catches a 1% change. Re-pin with ``python scripts/repin_goldens.py`` and
review the file's git diff.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN_FILE = ROOT / "tests" / "goldens" / "dense.json"
REL_TOL = 1e-6


def _load_repin():
    spec = importlib.util.spec_from_file_location("repin_goldens", ROOT / "scripts" / "repin_goldens.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


repin = _load_repin()


def _same(a, b, rel: float) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None or isinstance(a, str) or isinstance(b, str):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isfinite(a) and math.isfinite(b) and math.isclose(a, b, rel_tol=rel, abs_tol=0.0)
    return a == b


def compare_goldens(expected: dict, actual: dict, rel: float = REL_TOL) -> list[str]:
    """Every difference between two golden documents, one line each (empty list = identical)."""
    problems = []
    exp_cases = {c["id"]: c for c in expected["cases"]}
    act_cases = {c["id"]: c for c in actual["cases"]}
    for cid in sorted(exp_cases.keys() - act_cases.keys()):
        problems.append(f"{cid}: pinned but not computed")
    for cid in sorted(act_cases.keys() - exp_cases.keys()):
        problems.append(f"{cid}: computed but not pinned (re-pin)")
    for cid in [c["id"] for c in expected["cases"] if c["id"] in act_cases]:
        e, a = exp_cases[cid], act_cases[cid]
        if e["inputs"] != a["inputs"]:
            problems.append(f"{cid}: inputs differ: pinned {e['inputs']} vs {a['inputs']}")
        for key in sorted(e["outputs"].keys() | a["outputs"].keys()):
            if key not in e["outputs"] or key not in a["outputs"]:
                problems.append(f"{cid}: output {key!r} present on one side only")
                continue
            ev, av = e["outputs"][key], a["outputs"][key]
            if not _same(ev, av, rel):
                detail = ""
                if isinstance(ev, float) and isinstance(av, float) and ev:
                    detail = f" ({(av - ev) / ev:+.4%})"
                problems.append(f"{cid}: {key} pinned {ev!r} now {av!r}{detail}")
    return problems


@pytest.fixture(scope="module")
def pinned() -> dict:
    return json.loads(GOLDEN_FILE.read_text())


# ---------------------------------------------------------------------------------------------
# the file itself
# ---------------------------------------------------------------------------------------------
def test_golden_file_is_canonical(pinned):
    assert pinned["schema"] == repin.GOLDEN_SCHEMA and pinned["pack"] == repin.PACK
    assert GOLDEN_FILE.read_text() == repin.dumps(pinned)  # sorted keys, stable formatting
    assert 25 <= len(pinned["cases"]) <= 40
    assert [c["id"] for c in pinned["cases"]] == [repin.case_id(c) for c in repin.CASES]
    assert [c["inputs"] for c in pinned["cases"]] == [repin.case_inputs(c) for c in repin.CASES]
    kinds = {(c["inputs"]["pp"] > 1, c["inputs"]["prefix"] > 0, c["outputs"]["fits"]) for c in pinned["cases"]}
    assert (True, False, True) in kinds  # a pipeline-parallel case
    assert (False, True, True) in kinds  # a prefix case
    assert any(not c["outputs"]["fits"] for c in pinned["cases"])  # an out-of-memory case


# ---------------------------------------------------------------------------------------------
# the comparison catches what it must
# ---------------------------------------------------------------------------------------------
def _first_fitting(doc):
    return next(i for i, c in enumerate(doc["cases"]) if c["outputs"]["fits"])


def test_compare_identical_is_clean(pinned):
    assert compare_goldens(pinned, copy.deepcopy(pinned)) == []


@pytest.mark.parametrize("key", ["ttft_ms", "tpot_ms", "tokens_per_s_per_gpu", "memory_gb_per_gpu"])
def test_guard_catches_one_percent_change(pinned, key):
    changed = copy.deepcopy(pinned)
    i = _first_fitting(changed)
    changed["cases"][i]["outputs"][key] *= 1.01
    problems = compare_goldens(pinned, changed)
    assert len(problems) == 1
    assert problems[0].startswith(pinned["cases"][i]["id"] + f": {key} pinned")
    assert "+1.0000%" in problems[0]
    # and the other direction
    changed["cases"][i]["outputs"][key] = pinned["cases"][i]["outputs"][key] * 0.99
    assert len(compare_goldens(pinned, changed)) == 1


def test_guard_tolerates_rounding_noise(pinned):
    changed = copy.deepcopy(pinned)
    i = _first_fitting(changed)
    changed["cases"][i]["outputs"]["ttft_ms"] *= 1 + 1e-9
    assert compare_goldens(pinned, changed) == []
    changed["cases"][i]["outputs"]["ttft_ms"] = pinned["cases"][i]["outputs"]["ttft_ms"] * (1 + 1e-5)
    assert len(compare_goldens(pinned, changed)) == 1


def test_guard_catches_structural_changes(pinned):
    i = _first_fitting(pinned)
    cid = pinned["cases"][i]["id"]
    c = copy.deepcopy(pinned)
    c["cases"][i]["outputs"]["fits"] = False
    assert compare_goldens(pinned, c) == [f"{cid}: fits pinned True now False"]
    c = copy.deepcopy(pinned)
    c["cases"][i]["outputs"]["ttft_ms"] = None
    assert len(compare_goldens(pinned, c)) == 1
    c = copy.deepcopy(pinned)
    c["cases"][i]["outputs"]["backend_version"] = "0.0"
    assert len(compare_goldens(pinned, c)) == 1
    c = copy.deepcopy(pinned)
    c["cases"][i]["inputs"]["batch_size"] += 1
    assert len(compare_goldens(pinned, c)) == 1
    c = copy.deepcopy(pinned)
    del c["cases"][i]
    assert compare_goldens(pinned, c) == [f"{cid}: pinned but not computed"]
    c = copy.deepcopy(pinned)
    c["cases"][i]["outputs"]["ttft_ms"] = float("nan")
    assert len(compare_goldens(pinned, c)) == 1


# ---------------------------------------------------------------------------------------------
# the real thing
# ---------------------------------------------------------------------------------------------
@pytest.mark.real_pack
def test_goldens_reproduce(pinned, real_pack_available):
    actual = repin.compute_all()
    problems = compare_goldens(pinned, actual)
    assert not problems, (
        f"{len(problems)} golden difference(s); if intended, re-pin with "
        "`python scripts/repin_goldens.py` and review the diff:\n" + "\n".join(problems)
    )
