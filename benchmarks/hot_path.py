"""The simulator hot path: per-call speed of infercast's surfaces and forward-pass model, side by side
with the reference.

``python -m benchmarks.hot_path [--reference PYTHON] [--shapes N] [--json]``

One configuration (Qwen/Qwen3-32B on h200_sxm, vLLM, TP1, as in issue #40), N never-repeated
shapes per row (default 10,000), one call at a time:

* prefill ``(batch 1-32, isl 1-16384)``; decode step ``(batch 1-256, KV 2-16384)``; mean decode
  step ``decode_ms(batch 1-256, isl 1-8192, osl 2-2048)``; a forward-pass iteration (one rank:
  decode-only, and mixed with one prefill chunk of 1-2048 tokens); the slow rows (op-by-op and
  reference ``decode_ms``) run on the first tenth / twentieth of the shapes;
* infercast's op-by-op Estimator methods (result cache missed: every shape is new) and the
  compiled surfaces (``Estimator.surface()``) and :class:`~infercast.ForwardPassModel`;
* arrays: ``prefill_many`` / ``decode_step_many`` over 1M shapes;
* the largest relative difference between the surfaces and the op-by-op path over the shapes.

``--reference PYTHON``: a Python interpreter of an environment with ``aiconfigurator==0.12.0``
(e.g. ``python -m venv /tmp/refvenv && /tmp/refvenv/bin/pip install aiconfigurator==0.12.0``).
Its per-call API is timed as a black box in a child process of that interpreter, on the same
shapes, right after infercast's rows (paired in one run): ``EngineHandle.predict_prefill_latency``,
``decode_step_latency`` (one decode step), ``predict_decode_latency(bs, isl, osl)`` and
``RustForwardPassPerfModel.estimate_forward_pass_time_ms``. Without it the issue's quoted
reference figures are printed, labelled as quoted. Every row gives calls per wall second and per
CPU second of its process: on a shared machine the wall rate moves with the load (both sides are
measured in the same minute for that reason), the CPU rate counts only the time the code ran.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

CONFIG = ("Qwen/Qwen3-32B", "h200_sxm", "vllm", 1)
#: what each reference row calls
REF_CALLS = {"prefill": "EngineHandle.predict_prefill_latency(bs, isl, 0)",
             "decode step": "EngineHandle.decode_step_latency(bs, kv, 2)",
             "decode_ms": "EngineHandle.predict_decode_latency(bs, isl, osl)",
             "fpm decode": "RustForwardPassPerfModel.estimate_forward_pass_time_ms (decode)"}
#: issue #40's figures for the reference 0.12 (quoted, not measured here)
QUOTED = {"prefill": 181_000, "decode step": 9_300, "decode step (0.13)": 97_000}

REF_CHILD = r"""
import json, sys, time
model, system, backend, tp, shapes = json.loads(sys.stdin.read())
t0 = time.perf_counter()
from aiconfigurator_core.sdk.engine import EngineHandle
h = EngineHandle.compile(model, system, backend, tp_size=tp)
build = time.perf_counter() - t0
out = {"build_s": build}
def rate(name, fn, items):
    c, t = time.process_time(), time.perf_counter()
    vals = [fn(*x) for x in items]
    dt, dc = time.perf_counter() - t, time.process_time() - c
    out[name] = {"per_s": len(items) / dt, "us": 1e6 * dt / len(items), "per_cpu_s": len(items) / max(dc, 1e-9),
                 "sample": vals[:5]}
rate("prefill", lambda b, i: h.predict_prefill_latency(b, i, 0), shapes["prefill"])
rate("decode step", lambda b, kv: h.decode_step_latency(b, kv, 2), shapes["decode"])
rate("decode_ms", lambda b, i, o: h.predict_decode_latency(b, i, o), shapes["decode_ms"][: max(len(shapes["decode_ms"]) // 20, 100)])
try:
    from aiconfigurator_core.sdk.rust_engine_step import RustForwardPassPerfModel
    m = RustForwardPassPerfModel.best_available({"schema_version": 1, "model_name": model, "system_name": system,
                                                 "backend": backend, "tp_size": tp, "pp_size": 1})
    def fpm(b, kv):
        return m.estimate_forward_pass_time_ms({"scheduled_requests": {"num_prefill_requests": 0, "sum_prefill_tokens": 0,
                                                "num_decode_requests": b, "sum_decode_kv_tokens": b * kv}})
    rate("fpm decode", fpm, shapes["decode"])
except Exception as exc:
    out["fpm decode"] = {"error": str(exc)[:200]}
print(json.dumps(out))
"""


def _distinct(rng, n, cols):
    """``n`` distinct integer tuples, column ``k`` drawn from ``cols[k] = (lo, hi)`` inclusive."""
    seen, out = set(), []
    while len(out) < n:
        draw = [rng.integers(lo, hi + 1, 2 * n) for lo, hi in cols]
        for t in zip(*(d.tolist() for d in draw)):
            if t not in seen:
                seen.add(t)
                out.append(t)
                if len(out) == n:
                    break
    return out


def _rate(fn, items) -> dict:
    """Calls per wall second and per CPU second of this process (the machine may be shared:
    CPU time leaves out the time spent waiting for a core)."""
    c, t = time.process_time(), time.perf_counter()
    for x in items:
        fn(*x)
    dt, dc = time.perf_counter() - t, time.process_time() - c
    return {"per_s": len(items) / dt, "us": 1e6 * dt / len(items), "per_cpu_s": len(items) / max(dc, 1e-9)}


def run(n: int, reference: str | None, seed: int = 0) -> dict:
    from infercast import Estimator, ForwardPassModel, RankLoad

    rng = np.random.default_rng(seed)
    shapes = {
        "prefill": _distinct(rng, n, [(1, 32), (1, 16384)]),
        "decode": _distinct(rng, n, [(1, 256), (2, 16384)]),
        "decode_ms": _distinct(rng, n, [(1, 256), (1, 8192), (2, 2048)]),
        "mixed": _distinct(rng, n, [(1, 2048), (1, 128), (2, 8192)]),
    }
    model, system, backend, tp = CONFIG
    t0 = time.perf_counter()
    est = Estimator(model, system, backend, tp=tp)
    t1 = time.perf_counter()
    surf = est.surface()
    t2 = time.perf_counter()
    fpm = ForwardPassModel.from_surface(surf)
    res: dict = {"config": f"{model} {system} {backend} tp={tp}", "shapes": n,
                 "estimator_build_s": t1 - t0, "surface_build_s": t2 - t1, "surface_numbers": surf.size()}
    ours = res["infercast"] = {}
    ours["prefill, op by op (Estimator.prefill_ms)"] = _rate(est.prefill_ms, shapes["prefill"])
    ours["prefill, surface"] = _rate(surf.prefill_ms, shapes["prefill"])
    ours["decode step, op by op (Estimator.decode_step_ms)"] = _rate(est.decode_step_ms, shapes["decode"])
    ours["decode step, surface"] = _rate(surf.decode_step_ms, shapes["decode"])
    ours["decode_ms(bs, isl, osl), op by op (Estimator.decode_ms)"] = _rate(est.decode_ms, shapes["decode_ms"][: max(n // 10, 100)])
    ours["decode_ms(bs, isl, osl), surface closed form"] = _rate(surf.decode_ms, shapes["decode_ms"])
    dec_it = [RankLoad(decode_requests=b, decode_kv_tokens=b * kv) for b, kv in shapes["decode"]]
    mix_it = [RankLoad(prefill_requests=1, prefill_tokens=p, decode_requests=b, decode_kv_tokens=b * kv) for p, b, kv in shapes["mixed"]]
    ours["ForwardPassModel.estimate_ms, decode iteration"] = _rate(fpm.estimate_ms, [(r,) for r in dec_it])
    ours["ForwardPassModel.estimate_ms, mixed iteration"] = _rate(fpm.estimate_ms, [(r,) for r in mix_it])
    big = 1_000_000
    b = rng.integers(1, 33, big).astype(float)
    i = rng.integers(1, 16385, big).astype(float)
    for name, fn in (("prefill_many, 1M shapes", lambda: surf.prefill_many(b, i)),
                     ("decode_step_many, 1M shapes", lambda: surf.decode_step_many(b * 8, i))):
        times, cpu = [], []
        for _ in range(3):
            c, t = time.process_time(), time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
        dt = float(np.median(times))
        ours[name] = {"per_s": big / dt, "us": 1e6 * dt / big, "per_cpu_s": big / max(float(np.median(cpu)), 1e-9)}
    # agreement with the op-by-op path on the same shapes
    e = est.engine
    errs = {}
    errs["prefill"] = max(abs(surf.prefill_ms(bb, ii) / e.prefill_scalar(bb, ii, 0.0) - 1) for bb, ii in shapes["prefill"][:3000])
    errs["decode step"] = max(abs(surf.decode_step_ms(bb, kv) / e.decode_scalar(bb, kv) - 1) for bb, kv in shapes["decode"][:3000])
    errs["decode_ms"] = max(abs(surf.decode_ms(bb, ii, oo) / float(np.mean(e.decode_ms(float(bb), ii + 1.0 + np.arange(max(oo - 1, 1))))) - 1)
                            for bb, ii, oo in shapes["decode_ms"][:300])
    res["max_rel_diff_vs_op_by_op"] = errs
    if reference:
        payload = json.dumps([model, system, backend, tp, {k: shapes[k] for k in ("prefill", "decode", "decode_ms")}])
        p = subprocess.run([reference, "-c", REF_CHILD], input=payload, capture_output=True, text=True, timeout=1800)
        if p.returncode != 0:
            res["reference"] = {"error": (p.stderr.strip().splitlines() or ["no output"])[-1][:300]}
        else:
            res["reference"] = json.loads(p.stdout.strip().splitlines()[-1])
    return res


def render(res: dict) -> None:
    print(f"hot path: {res['config']}, {res['shapes']:,} never-repeated shapes per row, one call at a time")
    print(f"Estimator construction {res['estimator_build_s']:.2f} s; surface build {res['surface_build_s']:.2f} s "
          f"({res['surface_numbers']:,} numbers)")
    rows = [(k, f"{v['per_s']:,.0f}/s", f"{v['per_cpu_s']:,.0f}/s", f"{v['us']:.2f} us") for k, v in res["infercast"].items()]
    ref = res.get("reference")
    if ref and "error" not in ref:
        print(f"reference (aiconfigurator 0.12.0, measured in a child process; its build {ref['build_s']:.1f} s):")
        for k in ("prefill", "decode step", "decode_ms", "fpm decode"):
            v = ref.get(k, {})
            rows.append((f"reference {REF_CALLS[k]}", f"{v['per_s']:,.0f}/s" if "per_s" in v else v.get("error", "-")[:60],
                         f"{v['per_cpu_s']:,.0f}/s" if "per_cpu_s" in v else "", f"{v['us']:.2f} us" if "us" in v else ""))
    else:
        if ref:
            print(f"reference failed: {ref['error']}")
        for k, v in QUOTED.items():
            rows.append((f"reference {k} (QUOTED from issue #40, not measured)", f"{v:,}/s", "", ""))
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    w2 = max(len(r[2]) for r in rows + [("", "", "per CPU second", "")])
    print(f"| {'call'.ljust(w0)} | {'per wall second'.rjust(w1)} | {'per CPU second'.rjust(w2)} | wall per call |")
    print(f"|{'-' * (w0 + 2)}|{'-' * (max(w1, 15) + 2)}|{'-' * (w2 + 2)}|---------------|")
    for a, b, c, d in rows:
        print(f"| {a.ljust(w0)} | {b.rjust(max(w1, 15))} | {c.rjust(w2)} | {d} |")
    e = res["max_rel_diff_vs_op_by_op"]
    print("largest |surface / op-by-op - 1| on these shapes: " + ", ".join(f"{k} {v:.2e}" for k, v in e.items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.hot_path", description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", metavar="PYTHON", help="python of an environment with aiconfigurator==0.12.0")
    ap.add_argument("--shapes", type=int, default=10_000, help="never-repeated shapes per row (default 10,000)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.reference and not Path(a.reference).exists():
        print(f"benchmarks.hot_path: error: --reference {a.reference}: no such interpreter", file=sys.stderr)
        return 2
    res = run(a.shapes, a.reference)
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        render(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
