"""Whole-search speed against the reference: ``python -m benchmarks.search_speed [--reference CMD | --setup DIR] [--repeat N] [--json]``.

For each case (model, system, backend, GPUs; 4000 input / 500 output tokens; mean TTFT <= 2000 ms,
mean TPOT <= 30 ms) it runs, as whole processes timed by the wall clock, one after the other
(paired, so both see the same machine load):

* infercast: ``python -m infercast search --mode both --max-gpus N --json`` (this tree's sources;
  its default ``--jobs``, the usable CPUs up to 4, unless ``--jobs`` is given here; ``--python``
  names the interpreter, e.g. a virtual environment's, as the reference runs from its own: a
  Python whose site-packages run start-up hooks pays them on every run);
* the reference, NVIDIA's AIConfigurator 0.12.0, as a black box in its own Python environment:
  ``aiconfigurator cli default --model-path ... --system ... --backend ... --total-gpus N --isl
  --osl --ttft --tpot``, its printed top configurations parsed from stdout. Nothing of the
  reference is imported here.

The three cases of issue #38 run by default; ``--case 4`` adds a large wide-EP search (DeepSeek-R1
on gb200, 64 GPUs: about a million disaggregated candidates). Printed per case: both wall times, the CPU time of each run (user + sys, infercast's worker
processes included), the wall-time ratio (infercast / reference; the goal is at most
1/20), the candidates infercast evaluated and refused, and both top-3s per mode side by side.
Before the paired runs, infercast runs once with empty caches (``INFERCAST_CACHE_DIR`` a new
directory: every table parsed, every op compiled and kept), printed as "cold"; the paired runs
then find its caches warm, as a user's second search does. infercast's sources are byte-compiled
once before the runs (``compileall``; ``--no-compile`` skips it), as an installed package's are, so neither program compiles its sources at start-up when the
environment sets ``PYTHONDONTWRITEBYTECODE``. The reference command comes from ``--reference``,
else ``$INFERCAST_REFERENCE``, else ``aiconfigurator`` on ``PATH``, else
``/tmp/refvenv/bin/aiconfigurator``; ``--setup DIR`` first creates a virtual environment in DIR and
installs ``aiconfigurator==0.12.0`` there.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REFERENCE_VERSION = "0.12.0"
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Case:
    model: str
    system: str
    backend: str
    gpus: int
    isl: int = 4000
    osl: int = 500
    ttft_ms: float = 2000.0
    tpot_ms: float = 30.0

    @property
    def label(self) -> str:
        return f"{self.model.split('/')[-1]} {self.system} {self.backend} {self.gpus} GPUs"


CASES = (
    Case("Qwen/Qwen3-32B-FP8", "h200_sxm", "trtllm", 32),
    Case("Qwen/Qwen3-32B-FP8", "h200_sxm", "vllm", 32),
    Case("Qwen/Qwen3-235B-A22B-FP8", "h200_sxm", "trtllm", 16),
    # a large wide-EP search (~1 million disaggregated candidates), run only when asked: --case 4
    Case("deepseek-ai/DeepSeek-R1", "gb200", "trtllm", 64),
)
#: the cases run when no --case is given (issue #38's three)
DEFAULT_CASES = (1, 2, 3)


#: the Python that runs infercast (``--python``; default: the one running this benchmark)
PYTHON = [sys.executable]


def infercast_argv(c: Case, jobs: int | None = None) -> list[str]:
    return [*PYTHON, "-m", "infercast", "search", "--model", c.model, "--system", c.system, "--backend", c.backend,
            "--mode", "both", "--max-gpus", str(c.gpus), "--isl", str(c.isl), "--osl", str(c.osl),
            "--ttft-ms", f"{c.ttft_ms:g}", "--tpot-ms", f"{c.tpot_ms:g}", "--top", "3", "--json",
            *(["--jobs", str(jobs)] if jobs is not None else [])]


def reference_argv(cmd: list[str], c: Case) -> list[str]:
    return [*cmd, "cli", "default", "--model-path", c.model, "--system", c.system, "--backend", c.backend,
            "--total-gpus", str(c.gpus), "--isl", str(c.isl), "--osl", str(c.osl), "--ttft", f"{c.ttft_ms:g}",
            "--tpot", f"{c.tpot_ms:g}", "--no-color"]


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(argv: list[str], env: dict | None = None, timeout: float = 1800.0) -> tuple[float, float, subprocess.CompletedProcess | None, str]:
    """(wall seconds, CPU seconds (user + sys of the process and every process it waited for, its
    workers included), the finished process or None, an error message or "")."""
    t0, c0 = time.perf_counter(), _children_cpu()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - t0, _children_cpu() - c0, None, f"timed out after {timeout:.0f} s"
    wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
    if p.returncode != 0:
        return wall, cpu, p, f"exit {p.returncode}: {(p.stderr or p.stdout).strip().splitlines()[-1:]}"
    return wall, cpu, p, ""


def parse_reference_top(text: str, n: int = 3) -> dict[str, list[dict]]:
    """{"agg" | "disagg": the first ``n`` rows of the reference's "Top Configurations" tables}."""
    out: dict[str, list[dict]] = {}
    for mode in ("agg", "disagg"):
        m = re.search(rf"^{mode} Top Configurations.*?\n(\+[-+]+\+)\n(\|.*?\|)\n\+[-+]+\+\n(.*?)\n\+[-+]+\+", text, re.MULTILINE | re.DOTALL)
        if not m:
            continue
        head = [h.strip() for h in m.group(2).strip("|").split("|")]
        rows = []
        for line in m.group(3).splitlines()[:n]:
            cells = [x.strip() for x in line.strip().strip("|").split("|")]
            rows.append(dict(zip(head, cells)))
        out[mode] = rows
    return out


def reference_row_text(mode: str, r: dict) -> str:
    if mode == "agg":
        lay = f"{r.get('replicas', '?')}x {r.get('parallel', '?')}"
    else:
        lay = (f"P{r.get('(p)workers', '?')}x{r.get('(p)parallel', '?')} D{r.get('(d)workers', '?')}x{r.get('(d)parallel', '?')}"
               + (f" x{r['replicas']} replicas" if r.get("replicas", "1") != "1" else ""))
    return f"{lay} c{r.get('concurrency', '?')}: {r.get('tokens/s/gpu', '?')} tok/s/GPU, {r.get('tokens/s/user', '?')} tok/s/user"


def infercast_row_text(r: dict) -> str:
    return (f"{r['layout']} ({r['gpus']} GPUs) c{r['concurrency']}: {r['tokens_per_s_per_gpu']:.1f} tok/s/GPU, "
            f"{r['tokens_per_s_per_user']:.1f} tok/s/user")


def find_reference(arg: str | None) -> list[str] | None:
    cand = arg or os.environ.get("INFERCAST_REFERENCE") or shutil.which("aiconfigurator")
    if not cand and Path("/tmp/refvenv/bin/aiconfigurator").exists():
        cand = "/tmp/refvenv/bin/aiconfigurator"
    return cand.split() if cand else None


def setup_reference(target: Path) -> list[str]:
    subprocess.run([sys.executable, "-m", "venv", str(target)], check=True)
    subprocess.run([str(target / "bin" / "pip"), "install", "-q", f"aiconfigurator=={REFERENCE_VERSION}"], check=True)
    return [str(target / "bin" / "aiconfigurator")]


def run_case(c: Case, ref: list[str] | None, repeat: int, jobs: int | None = None) -> dict:
    import tempfile

    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    row: dict = {"case": c.label, "infercast_s": [], "reference_s": [], "infercast_cpu_s": [], "reference_cpu_s": [],
                 "errors": []}
    # first, one run with empty caches (no parsed table, no compiled op kept: a first search)
    with tempfile.TemporaryDirectory() as cache:
        wall, _, _, err = timed(infercast_argv(c, jobs), {**env, "INFERCAST_CACHE_DIR": cache})
        row["infercast_cold_s"] = wall
        if err:
            row["errors"].append(f"infercast (cold caches): {err}")
    for _ in range(repeat):
        if ref:
            wall, cpu, p, err = timed(reference_argv(ref, c))
            row["reference_s"].append(wall)
            row["reference_cpu_s"].append(cpu)
            if err:
                row["errors"].append(f"reference: {err}")
            elif p is not None:
                row["reference_top"] = parse_reference_top(p.stdout + p.stderr)
        wall, cpu, p, err = timed(infercast_argv(c, jobs), env)
        row["infercast_s"].append(wall)
        row["infercast_cpu_s"].append(cpu)
        if err:
            row["errors"].append(f"infercast: {err}")
        elif p is not None:
            d = json.loads(p.stdout)
            row["infercast_top"] = {m: d[m]["top"] for m in ("agg", "disagg")}
            row["evaluated"] = {m: d[m]["evaluated"] for m in ("agg", "disagg")}
            row["refused"] = {m: d[m]["refused"] for m in ("agg", "disagg")}
    # the least-disturbed run of each
    row["infercast_best_s"] = min(row["infercast_s"]) if row["infercast_s"] else None
    row["reference_best_s"] = min(row["reference_s"]) if row["reference_s"] else None
    for who in ("infercast", "reference"):  # the CPU time of that fastest run
        walls = row[f"{who}_s"]
        row[f"{who}_best_cpu_s"] = row[f"{who}_cpu_s"][walls.index(min(walls))] if walls else None
    if row["infercast_best_s"] and row["reference_best_s"]:
        row["ratio"] = row["infercast_best_s"] / row["reference_best_s"]
    return row


def print_rows(rows: list[dict], jobs: int | None = None) -> None:
    print(f"{'case':<46} {'infercast s':>11} {'(CPU s)':>8} {'cold s':>7} {'reference s':>11} {'(CPU s)':>8} {'ratio':>7}")
    for r in rows:
        ref = f"{r['reference_best_s']:.2f}" if r.get("reference_best_s") else "-"
        ref_cpu = f"{r['reference_best_cpu_s']:.2f}" if r.get("reference_best_cpu_s") is not None else "-"
        ratio = f"{r['ratio']:.3f}" if r.get("ratio") else "-"
        print(f"{r['case']:<46} {r['infercast_best_s']:>11.2f} {r['infercast_best_cpu_s']:>8.2f} "
              f"{r['infercast_cold_s']:>7.2f} {ref:>11} {ref_cpu:>8} {ratio:>7}")
    print("(goal: ratio <= 0.05; wall time of whole processes, the fastest of the paired runs; CPU: user + sys of that "
          f"run, workers included; cold: infercast's first run with empty caches (tables parsed, ops compiled and "
          f"kept), not in the ratio; infercast --jobs {'default' if jobs is None else jobs}, {os.cpu_count()} CPUs here)")
    for r in rows:
        print(f"\n== {r['case']}")
        for e in r["errors"]:
            print(f"  error: {e}")
        for m in ("agg", "disagg"):
            ev = r.get("evaluated", {}).get(m)
            if ev is not None:
                refused = sum(r["refused"][m].values())
                print(f"  infercast {m}: evaluated {', '.join(f'{n} {k}' for k, n in ev.items())}; refused {refused}")
        for m in ("agg", "disagg"):
            ours = r.get("infercast_top", {}).get(m, [])
            theirs = r.get("reference_top", {}).get(m, [])
            print(f"  {m} top-3:")
            for i in range(max(len(ours), len(theirs), 1)):
                a = infercast_row_text(ours[i]) if i < len(ours) else "-"
                b = reference_row_text(m, theirs[i]) if i < len(theirs) else "-"
                print(f"    {i + 1}. infercast {a}\n       reference {b}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", help="the reference's aiconfigurator command (default: $INFERCAST_REFERENCE, PATH, "
                                        "/tmp/refvenv/bin/aiconfigurator)")
    ap.add_argument("--setup", type=Path, help="create a venv here and install the reference into it first")
    ap.add_argument("--repeat", type=int, default=1, help="paired runs per case (the fastest of each is reported)")
    ap.add_argument("--case", type=int, action="append",
                    help="only these cases (1-based; repeatable; default 1, 2, 3; 4: DeepSeek-R1 gb200 64 GPUs)")
    ap.add_argument("--no-reference", action="store_true", help="time infercast only")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--no-compile", action="store_true", help="do not byte-compile infercast's sources first")
    ap.add_argument("--jobs", type=int, default=None, help="infercast search --jobs (default: its own default)")
    ap.add_argument("--python", help="the Python that runs infercast (default: this one), e.g. a virtual environment's "
                                     "with infercast installed, as the reference runs from its own")
    a = ap.parse_args(argv)
    if a.python:
        PYTHON[:] = [a.python]
    ref = None
    if not a.no_reference:
        ref = setup_reference(a.setup) if a.setup else find_reference(a.reference)
        if ref is None:
            print("search_speed: error: no reference found: give --reference, --setup DIR or --no-reference", file=sys.stderr)
            return 2
    bad = [i for i in a.case or () if not 1 <= i <= len(CASES)]
    if bad:
        print(f"search_speed: error: --case {bad[0]}: the cases are 1 to {len(CASES)}", file=sys.stderr)
        return 2
    cases = [CASES[i - 1] for i in (a.case or DEFAULT_CASES)]
    if not a.no_compile:  # written even under PYTHONDONTWRITEBYTECODE, and read by the timed runs
        compileall.compile_dir(str(ROOT / "src"), quiet=1)
    rows = [run_case(c, ref, a.repeat, a.jobs) for c in cases]
    if a.json:
        print(json.dumps(rows, indent=1))
    else:
        print_rows(rows, a.jobs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
