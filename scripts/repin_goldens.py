#!/usr/bin/env python
"""Re-pin the end-to-end golden estimates in tests/goldens/dense.json.

    python scripts/repin_goldens.py            # recompute and rewrite the file
    python scripts/repin_goldens.py --check    # recompute and report differences, write nothing

Each case is one static estimate on the real aiconfigurator-core pack. The file is written with
sorted keys, one value per line and a trailing newline, so ``git diff tests/goldens/dense.json``
after a re-pin shows exactly which predictions moved: that diff is what a reviewer reads.

tests/test_goldens.py imports this module (``CASES``, ``compute_all``) so the test and the
re-pin compute every case the same way.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN_PATH = ROOT / "tests" / "goldens" / "dense.json"
GOLDEN_SCHEMA = 1
PACK = "aiconfigurator-core==0.12.0"
REL_TOL = 1e-6

if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

L8 = "meta-llama/Meta-Llama-3.1-8B"
L70 = "meta-llama/Meta-Llama-3.1-70B"
Q32 = "Qwen/Qwen3-32B"
Q32F = "Qwen/Qwen3-32B-FP8"

#: (model, system, backend, tp, pp, batch, isl, osl, prefix). Add cases at the end; ids derive
#: from the inputs, so editing a case shows up as one removed and one added entry in the diff.
CASES: list[tuple[str, str, str, int, int, int, int, int, int]] = [
    # Llama-3.1-8B across systems and backends
    (L8, "h100_sxm", "trtllm", 1, 1, 1, 128, 128, 0),
    (L8, "h100_sxm", "vllm", 1, 1, 8, 2048, 256, 0),
    (L8, "h100_sxm", "sglang", 2, 1, 32, 1024, 512, 0),
    (L8, "h200_sxm", "trtllm", 1, 1, 8, 2048, 256, 0),
    (L8, "h200_sxm", "vllm", 2, 1, 64, 512, 128, 0),
    (L8, "h200_sxm", "sglang", 1, 1, 4, 8000, 200, 0),
    (L8, "b200_sxm", "trtllm", 4, 1, 16, 4096, 1024, 0),
    (L8, "b200_sxm", "vllm", 1, 1, 128, 256, 256, 0),
    # Llama-3.1-70B: memory-bound at TP1, TP sweep, a pipeline-parallel case
    (L70, "h100_sxm", "trtllm", 1, 1, 8, 2048, 256, 0),
    (L70, "h100_sxm", "trtllm", 4, 1, 8, 2048, 256, 0),
    (L70, "h200_sxm", "trtllm", 2, 1, 8, 2048, 256, 0),
    (L70, "h200_sxm", "trtllm", 8, 1, 8, 2048, 256, 0),
    (L70, "h200_sxm", "trtllm", 4, 2, 16, 4096, 512, 0),
    (L70, "h200_sxm", "vllm", 4, 1, 32, 1024, 1024, 0),
    (L70, "b200_sxm", "sglang", 2, 1, 8, 2048, 256, 0),
    (L70, "b200_sxm", "trtllm", 8, 1, 256, 1000, 300, 0),
    # Qwen3-32B bf16
    (Q32, "h100_sxm", "sglang", 4, 1, 16, 3000, 500, 0),
    (Q32, "h200_sxm", "trtllm", 1, 1, 8, 2048, 256, 0),
    (Q32, "h200_sxm", "trtllm", 2, 1, 8, 1024, 256, 3072),
    (Q32, "h200_sxm", "vllm", 2, 1, 8, 2048, 256, 0),
    (Q32, "h200_sxm", "sglang", 8, 1, 2, 16000, 100, 0),
    (Q32, "b200_sxm", "trtllm", 2, 1, 48, 777, 333, 0),
    (Q32, "b200_sxm", "vllm", 4, 1, 8, 2048, 256, 0),
    # Qwen3-32B FP8 (block-scaled weights)
    (Q32F, "h100_sxm", "trtllm", 1, 1, 8, 2048, 256, 0),
    (Q32F, "h200_sxm", "trtllm", 1, 1, 8, 2048, 256, 0),
    (Q32F, "h200_sxm", "vllm", 2, 1, 16, 1024, 128, 0),
    (Q32F, "h200_sxm", "sglang", 2, 1, 8, 2048, 256, 1024),
    (Q32F, "b200_sxm", "trtllm", 4, 1, 64, 2048, 512, 0),
    (Q32F, "b200_sxm", "sglang", 1, 1, 1, 32000, 64, 0),
    (Q32F, "b200_sxm", "vllm", 8, 1, 8, 2048, 256, 0),
    # an out-of-memory case: fits=false, no latencies
    (Q32, "h100_sxm", "vllm", 1, 1, 64, 8192, 1024, 0),
]

OUTPUT_KEYS = ("backend_version", "fits", "memory_gb_per_gpu", "tokens_per_s_per_gpu", "tpot_ms", "ttft_ms")


def case_id(case) -> str:
    model, system, backend, tp, pp, batch, isl, osl, prefix = case
    s = f"{model.split('/')[-1]}|{system}|{backend}|tp{tp}pp{pp}|b{batch}|isl{isl}|osl{osl}"
    return s + (f"|prefix{prefix}" if prefix else "")


def case_inputs(case) -> dict:
    model, system, backend, tp, pp, batch, isl, osl, prefix = case
    return {"model": model, "system": system, "backend": backend, "tp": tp, "pp": pp,
            "batch_size": batch, "isl": isl, "osl": osl, "prefix": prefix}


def compute_case(case, estimators: dict | None = None) -> dict:
    from infercast import Estimator

    model, system, backend, tp, pp, batch, isl, osl, prefix = case
    key = (model, system, backend, tp, pp)
    est = None if estimators is None else estimators.get(key)
    if est is None:
        est = Estimator(model, system, backend, tp=tp, pp=pp)
        if estimators is not None:
            estimators[key] = est
    r = est.static(batch, isl, osl, prefix, breakdown=False)
    return {k: getattr(r, k) for k in OUTPUT_KEYS}


def compute_all(cases=CASES) -> dict:
    """The golden document for ``cases`` (same structure as the file)."""
    ests: dict = {}
    out = []
    for case in cases:
        out.append({"id": case_id(case), "inputs": case_inputs(case), "outputs": compute_case(case, ests)})
    ids = [c["id"] for c in out]
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate golden case ids")
    return {"schema": GOLDEN_SCHEMA, "pack": PACK, "rel_tol": REL_TOL, "cases": out}


def dumps(doc: dict) -> str:
    for case in doc["cases"]:
        for k, v in case["outputs"].items():
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"{case['id']}: {k} is {v}; goldens hold finite numbers only")
    return json.dumps(doc, indent=1, sort_keys=True, allow_nan=False) + "\n"


def load(path: Path = GOLDEN_PATH) -> dict:
    return json.loads(path.read_text())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the pinned file, write nothing")
    ap.add_argument("--out", type=Path, default=GOLDEN_PATH)
    a = ap.parse_args(argv)
    doc = compute_all()
    if a.check:
        old = load(a.out)
        changed = [c["id"] for c, o in zip(doc["cases"], old["cases"]) if c != o]
        if len(doc["cases"]) != len(old["cases"]) or changed:
            print(f"{len(changed)} case(s) differ from {a.out}:", *changed, sep="\n  ")
            return 1
        print(f"all {len(doc['cases'])} cases match {a.out}")
        return 0
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(dumps(doc))
    print(f"wrote {len(doc['cases'])} cases to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
