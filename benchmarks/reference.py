"""Side by side with the reference estimator: ``python -m benchmarks.reference [--reference CMD | --setup DIR] [--json]``.

Runs the same static configurations (one batch: TTFT = its prefill, TPOT = its mean decode step)
through infercast and through the reference, NVIDIA's AIConfigurator 0.12.0, as a black box: its
``aiconfigurator cli estimate --estimate-mode static`` command in *its own* Python environment,
one process per configuration, its printed TTFT / TPOT / memory parsed from stdout. Nothing of the
reference is imported here. Both read the same data pack (``aiconfigurator-core==0.12.0``).

The reference command comes from ``--reference`` (the ``aiconfigurator`` executable), else
``$INFERCAST_REFERENCE``, else ``aiconfigurator`` on ``PATH``; ``--setup DIR`` first creates a
virtual environment in DIR and installs ``aiconfigurator==0.12.0`` there with pip (Linux x86-64).

Printed per configuration: both TTFT and TPOT, their ratio (infercast / reference), and the time
per estimate — the reference's whole process (its CLI has no warm mode) against infercast's
construction + first estimate (cold, in this process) and a warm ``static()`` call. Agreement is
not accuracy: which estimate is closer to real GPUs is what ``benchmarks.fidelity`` measures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REFERENCE_VERSION = "0.12.0"


@dataclass(frozen=True)
class Config:
    model: str
    system: str
    backend: str
    tp: int
    batch: int
    isl: int
    osl: int
    attention_dp: int = 1
    moe_tp: int | None = None
    moe_ep: int | None = None

    @property
    def label(self) -> str:
        par = f"tp{self.tp}" + (f" dp{self.attention_dp}" if self.attention_dp > 1 else "") + (
            f" ep{self.moe_ep}" if self.moe_ep and self.moe_ep > 1 else "")
        return f"{self.model.split('/')[-1]} {self.system} {self.backend} {par} b{self.batch} {self.isl}/{self.osl}"


#: dense, GQA MoE and MLA MoE models on Hopper and Blackwell, each serving backend
CONFIGS = (
    Config("Qwen/Qwen3-32B-FP8", "h200_sxm", "trtllm", 2, 8, 4000, 500),
    Config("Qwen/Qwen3-32B-FP8", "h200_sxm", "vllm", 2, 8, 4000, 500),
    Config("Qwen/Qwen3-32B-FP8", "h200_sxm", "sglang", 2, 8, 4000, 500),
    Config("meta-llama/Meta-Llama-3.1-70B", "h100_sxm", "trtllm", 4, 16, 2000, 200),
    Config("meta-llama/Meta-Llama-3.1-8B", "b200_sxm", "vllm", 1, 64, 1024, 1024),
    Config("Qwen/Qwen3-235B-A22B-FP8", "h200_sxm", "trtllm", 4, 16, 4000, 500, moe_tp=1, moe_ep=4),
    Config("Qwen/Qwen3-30B-A3B-FP8", "b200_sxm", "sglang", 1, 32, 2000, 500, moe_tp=1, moe_ep=1),
    Config("deepseek-ai/DeepSeek-V3", "h200_sxm", "trtllm", 8, 32, 4000, 500, moe_tp=1, moe_ep=8),
    Config("deepseek-ai/DeepSeek-V3", "b200_sxm", "sglang", 8, 16, 1024, 1024, moe_tp=1, moe_ep=8),
    Config("MiniMaxAI/MiniMax-M2.5", "b200_sxm", "vllm", 4, 32, 1024, 1024, moe_tp=1, moe_ep=4),
)

_NUM = r"([0-9]+(?:\.[0-9]+)?)"


def parse_reference(text: str) -> dict:
    """TTFT / TPOT (ms) and memory (GB) from the reference's printed static estimate."""
    out = {}
    for key, pat in (("ttft_ms", rf"TTFT:\s+{_NUM}\s*ms"), ("tpot_ms", rf"TPOT:\s+{_NUM}\s*ms"),
                     ("memory_gb", rf"Memory \(GPU\):\s+{_NUM}\s*GB")):
        m = re.search(pat, text)
        if m:
            out[key] = float(m.group(1))
    return out


def reference_argv(cmd: list[str], c: Config) -> list[str]:
    argv = [*cmd, "cli", "estimate", "--estimate-mode", "static", "--model-path", c.model, "--system", c.system,
            "--backend", c.backend, "--isl", str(c.isl), "--osl", str(c.osl), "--batch-size", str(c.batch),
            "--tp-size", str(c.tp)]
    if c.attention_dp > 1:
        argv += ["--attention-dp-size", str(c.attention_dp)]
    if c.moe_tp is not None:
        argv += ["--moe-tp-size", str(c.moe_tp)]
    if c.moe_ep is not None:
        argv += ["--moe-ep-size", str(c.moe_ep)]
    return argv


def run_reference(cmd: list[str], c: Config, timeout: float) -> dict:
    t0 = time.perf_counter()
    try:
        p = subprocess.run(reference_argv(cmd, c), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - t0
    got = parse_reference(p.stdout + p.stderr)
    if p.returncode != 0 or "ttft_ms" not in got:
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"exit {p.returncode}: {tail[0][:160]}", "seconds": wall}
    return {**got, "seconds": wall}


def run_infercast(c: Config, warm_calls: int = 50) -> dict:
    from infercast import Estimator
    from infercast.errors import InfercastError

    try:
        t0 = time.perf_counter()
        est = Estimator(c.model, c.system, c.backend, tp=c.tp, attention_dp=c.attention_dp, moe_tp=c.moe_tp, moe_ep=c.moe_ep)
        res = est.static(c.batch, c.isl, c.osl)
        cold = time.perf_counter() - t0
        t1 = time.perf_counter()
        for i in range(warm_calls):  # distinct shapes: no result-cache hits
            est.static(c.batch, c.isl + 1 + i, c.osl, breakdown=False)
        warm = (time.perf_counter() - t1) / warm_calls
    except InfercastError as exc:
        return {"error": str(exc)[:160]}
    if res.ttft_ms is None:
        return {"error": "does not fit (memory)"}
    return {"ttft_ms": res.ttft_ms, "tpot_ms": res.tpot_ms, "memory_gb": res.memory_gb_per_gpu, "cold_s": cold, "warm_s": warm}


def find_reference(arg: str | None) -> list[str] | None:
    cand = arg or os.environ.get("INFERCAST_REFERENCE") or shutil.which("aiconfigurator")
    if not cand:
        return None
    path = Path(cand)
    return [str(path)] if path.exists() or shutil.which(cand) else None


def setup_reference(target: Path) -> list[str]:
    """A fresh virtual environment with the reference installed (pip, package registry)."""
    subprocess.run([sys.executable, "-m", "venv", str(target)], check=True)
    pip = target / "bin" / "pip"
    subprocess.run([str(pip), "install", "-q", f"aiconfigurator=={REFERENCE_VERSION}"], check=True)
    return [str(target / "bin" / "aiconfigurator")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.reference", description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", help="the reference's aiconfigurator executable (default: $INFERCAST_REFERENCE, then PATH)")
    ap.add_argument("--setup", metavar="DIR", help=f"create a venv in DIR and install aiconfigurator=={REFERENCE_VERSION} there first")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per reference process (default 300)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    cmd = setup_reference(Path(args.setup)) if args.setup else find_reference(args.reference)
    if cmd is None:
        print("benchmarks.reference: error: no reference found: pass --reference PATH/TO/aiconfigurator, set "
              f"$INFERCAST_REFERENCE, or --setup DIR to install aiconfigurator=={REFERENCE_VERSION} into a new venv",
              file=sys.stderr)
        return 2
    rows = []
    for c in CONFIGS:
        print(f"  {c.label}", file=sys.stderr, flush=True)
        rows.append({"config": c.label, "reference": run_reference(cmd, c, args.timeout), "infercast": run_infercast(c)})
    both = [r for r in rows if "ttft_ms" in r["reference"] and "ttft_ms" in r["infercast"]]
    summary = {}
    for k in ("ttft_ms", "tpot_ms"):
        lr = np.array([np.log(r["infercast"][k] / r["reference"][k]) for r in both])
        summary[k] = {"geomean_ratio": float(np.exp(lr.mean())) if len(lr) else None,
                      "median_abs_diff": float(np.median(np.abs(np.exp(lr) - 1))) if len(lr) else None}
    ref_s = [r["reference"]["seconds"] for r in rows if "seconds" in r["reference"]]
    cold = [r["infercast"]["cold_s"] for r in rows if "cold_s" in r["infercast"]]
    warm = [r["infercast"]["warm_s"] for r in rows if "warm_s" in r["infercast"]]
    summary["seconds"] = {"reference_process_median": float(np.median(ref_s)) if ref_s else None,
                          "infercast_cold_median": float(np.median(cold)) if cold else None,
                          "infercast_warm_median": float(np.median(warm)) if warm else None}
    if args.json:
        print(json.dumps({"reference": f"aiconfigurator {REFERENCE_VERSION}", "rows": rows, "summary": summary}, indent=1))
        return 0
    _print(rows, summary)
    return 0


def _print(rows, summary) -> None:
    from rich.console import Console
    from rich.table import Table

    def f(d, k, fmt="{:.2f}"):
        return fmt.format(d[k]) if k in d else d.get("error", "-")[:40]

    t = Table(title=f"infercast vs aiconfigurator {REFERENCE_VERSION}, static estimates (ratio = infercast / reference)")
    for col in ("configuration", "TTFT ref", "TTFT ours", "ratio", "TPOT ref", "TPOT ours", "ratio", "ref s", "ours cold s", "ours warm ms"):
        t.add_column(col, justify="left" if col == "configuration" else "right")
    for r in rows:
        a, b = r["reference"], r["infercast"]
        ratio = lambda k: f"{b[k] / a[k]:.2f}" if k in a and k in b else "-"  # noqa: E731
        t.add_row(r["config"], f(a, "ttft_ms", "{:.1f}"), f(b, "ttft_ms", "{:.1f}"), ratio("ttft_ms"),
                  f(a, "tpot_ms", "{:.3f}"), f(b, "tpot_ms", "{:.3f}"), ratio("tpot_ms"),
                  f(a, "seconds"), f(b, "cold_s"), f"{1e3 * b['warm_s']:.2f}" if "warm_s" in b else "-")
    c = Console(width=max(Console().width, 150))
    c.print(t)
    s = summary
    c.print(f"geometric-mean ratio TTFT {s['ttft_ms']['geomean_ratio']:.2f}, TPOT {s['tpot_ms']['geomean_ratio']:.2f}; "
            f"median |ratio - 1| TTFT {100 * s['ttft_ms']['median_abs_diff']:.1f}%, TPOT {100 * s['tpot_ms']['median_abs_diff']:.1f}%")
    sec = s["seconds"]
    c.print(f"time per estimate (median): reference process {sec['reference_process_median']:.2f} s; infercast cold "
            f"{sec['infercast_cold_median']:.2f} s (construction + first estimate), warm {1e3 * sec['infercast_warm_median']:.2f} ms")


if __name__ == "__main__":
    sys.exit(main())
