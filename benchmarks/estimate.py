"""Speed of infercast's estimator: cold start, warm throughput, construction and table loading.

``python -m benchmarks.estimate [--json] [--quick]``

(a) cold start: a fresh interpreter runs ``import infercast`` then
    ``Estimator("Qwen/Qwen3-32B-FP8", "h200_sxm", "trtllm", tp=2).static(8, 4000, 500)``; the wall
    time of the import, of the construction and of that first estimate are taken inside the
    child, the whole child (interpreter start included) from outside; median of 3 children.
(b) warm throughput on one constructed Estimator: scalar ``prefill_ms`` / ``decode_ms`` with
    distinct random shapes (every call misses the Estimator's result cache), the same shape
    repeated (every call hits it), ``prefill_ms`` / ``decode_step_ms`` over numpy arrays of 100k
    shapes, and ``static()`` with distinct shapes.
(c) construction of a few configurations in a fresh child, each twice: the first pays for reading
    its perf tables, the second finds them in the per-process table cache. Plus the time
    ``infercast.data.tables.read_table`` takes on the largest ``*_perf.parquet`` (by rows) in the pack.
(d) the serving model, one closed-loop benchmark configuration per call on constructed
    estimators: ``serving.agg.serve_agg`` for TensorRT-LLM (analytic steady state + the simulated
    first wave) and SGLang (the lock-step simulation of every wave), and
    ``serving.disagg.solve_disagg`` (prefill and decode pools), each over distinct (concurrency,
    isl, osl) configurations drawn from c 1-512, isl 128-8192, osl 64-2048.

Whole run: about 15-20 s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
COLD_CONFIG = ("Qwen/Qwen3-32B-FP8", "h200_sxm", "trtllm", 2)
COLD_SHAPE = (8, 4000, 500)
#: (model, system, backend, tp) built twice each in one fresh process; distinct (system, backend)
#: pairs so every first build reads its own tables
CONSTRUCT_CONFIGS = [
    ("Qwen/Qwen3-32B-FP8", "h200_sxm", "trtllm", 2),
    ("meta-llama/Meta-Llama-3.1-70B", "h200_sxm", "vllm", 4),
    ("Qwen/Qwen3-8B", "b200_sxm", "sglang", 1),
    ("Qwen/Qwen3-32B", "b200_sxm", "trtllm", 2),
]
VECTOR_SHAPES = 100_000

# The child imports nothing but time/json before ``import infercast`` so the import is timed cold.
COLD_CHILD = r"""
import json, time, sys
t0 = time.perf_counter()
import infercast
t1 = time.perf_counter()
model, system, backend, tp, b, isl, osl = json.loads(sys.argv[1])
est = infercast.Estimator(model, system, backend, tp=tp)
t2 = time.perf_counter()
res = est.static(b, isl, osl)
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "construct_s": t2 - t1, "first_static_s": t3 - t2,
                  "ttft_ms": res.ttft_ms, "tpot_ms": res.tpot_ms}))
"""

CONSTRUCT_CHILD = r"""
import json, sys, time
import infercast
from infercast.data import tables
out = []
for model, system, backend, tp in json.loads(sys.argv[1]):
    row = {"config": f"{model} {system} {backend} tp={tp}"}
    for which in ("first", "second"):
        before = dict(tables.LOAD_STATS)
        t0 = time.perf_counter()
        infercast.Estimator(model, system, backend, tp=tp)
        row[which + "_s"] = time.perf_counter() - t0
        row[which + "_table_read_s"] = sum(v for k, v in tables.LOAD_STATS.items() if before.get(k) != v)
        row[which + "_tables_read"] = sum(1 for k, v in tables.LOAD_STATS.items() if before.get(k) != v)
    out.append(row)
print(json.dumps(out))
"""


def _child_env() -> dict:
    env = dict(os.environ)
    src = str(ROOT / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _run_child(code: str, arg) -> tuple[object, float]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(arg)], capture_output=True, text=True,
                          env=_child_env(), cwd=str(ROOT))
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child failed (exit {proc.returncode}):\n{proc.stderr.strip()}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), wall


# ---- (a) cold start -----------------------------------------------------------------------------
def cold_start(runs: int) -> dict:
    model, system, backend, tp = COLD_CONFIG
    samples = []
    for _ in range(runs):
        out, wall = _run_child(COLD_CHILD, [model, system, backend, tp, *COLD_SHAPE])
        out["process_s"] = wall
        samples.append(out)
    keys = ("import_s", "construct_s", "first_static_s", "process_s")
    return {
        "config": f"{model} {system} {backend} tp={tp}, static{COLD_SHAPE}",
        "runs": runs,
        **{k: statistics.median(s[k] for s in samples) for k in keys},
        "samples": samples,
        "ttft_ms": samples[0]["ttft_ms"],
        "tpot_ms": samples[0]["tpot_ms"],
    }


# ---- (b) warm throughput ------------------------------------------------------------------------
def _rate(call, items, budget_s: float) -> dict:
    """Call ``call(*item)`` over ``items`` until they run out or ``budget_s`` passes."""
    n = 0
    t0 = time.perf_counter()
    elapsed = 0.0
    for item in items:
        call(*item)
        n += 1
        if n % 32 == 0:
            elapsed = time.perf_counter() - t0
            if elapsed >= budget_s:
                break
    elapsed = time.perf_counter() - t0
    return {"calls": n, "seconds": elapsed, "per_s": n / elapsed, "us_per_call": 1e6 * elapsed / n}


def _distinct_pairs(rng: np.random.Generator, n: int, max_batch: int, max_len: int) -> list[tuple[int, int]]:
    """``n`` distinct random (batch, length) pairs, in draw order."""
    b = rng.integers(1, max_batch + 1, 2 * n)
    i = rng.integers(1, max_len + 1, 2 * n)
    _, first = np.unique(b * (max_len + 1) + i, return_index=True)
    keep = np.sort(first)[:n]
    if len(keep) < n:
        raise ValueError("shape space too small for that many distinct pairs")
    return list(zip(b[keep].tolist(), i[keep].tolist()))


def warm_throughput(budget_s: float, seed: int = 0) -> dict:
    import infercast

    model, system, backend, tp = COLD_CONFIG
    est = infercast.Estimator(model, system, backend, tp=tp)
    rng = np.random.default_rng(seed)
    n_items = 100_000  # more than a budget here consumes
    out: dict = {"config": f"{model} {system} {backend} tp={tp}"}

    # one pool of distinct (batch, isl) pairs, split so no loop hits another's cache entries
    pairs = _distinct_pairs(rng, 2 * n_items, 256, 32768)
    out["prefill_ms scalar, distinct shapes"] = _rate(est.prefill_ms, pairs[:n_items], budget_s)
    out["prefill_ms scalar, repeated shape (cache hit)"] = _rate(est.prefill_ms, [(8, 4000)] * n_items, budget_s)
    osl = rng.integers(2, 2049, n_items).tolist()
    triples = [(b, i, o) for (b, i), o in zip(pairs[n_items:], osl)]
    out["decode_ms scalar, distinct shapes"] = _rate(est.decode_ms, triples, budget_s)
    out["decode_ms scalar, repeated shape (cache hit)"] = _rate(est.decode_ms, [(8, 4000, 500)] * n_items, budget_s)

    b = rng.integers(1, 257, VECTOR_SHAPES).astype(float)
    i = rng.integers(1, 32769, VECTOR_SHAPES).astype(float)
    for name, fn in (("prefill_ms", est.prefill_ms), ("decode_step_ms", est.decode_step_ms)):
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn(b, i)
            times.append(time.perf_counter() - t0)
        t = statistics.median(times)
        out[f"{name} vectorised, {VECTOR_SHAPES // 1000}k shapes per call"] = {
            "calls": 3, "seconds": t, "per_s": VECTOR_SHAPES / t, "us_per_call": 1e6 * t / VECTOR_SHAPES,
        }

    # static shapes: batch <= 64, isl <= 8192 (fits in memory); isl offset past the pool above
    s_pairs = _distinct_pairs(rng, 40_000, 64, 8192)
    s_osl = rng.integers(2, 2049, 40_000).tolist()
    shapes = [(b_, i_ + 40_000, o) for (b_, i_), o in zip(s_pairs, s_osl)]
    out["static(), distinct shapes, breakdown"] = _rate(est.static, shapes[:20_000], budget_s)
    out["static(), distinct shapes, no breakdown"] = _rate(
        lambda bb, ii, oo: est.static(bb, ii, oo, breakdown=False), shapes[20_000:], budget_s)
    out["result cache entries at the end"] = len(est._cache)
    return out


# ---- (d) serving model per configuration ---------------------------------------------------------
SERVING_CONFIGS = {
    "trtllm": ("Qwen/Qwen3-32B-FP8", "h200_sxm", "trtllm", 2),
    "sglang": ("Qwen/Qwen3-32B-FP8", "h200_sxm", "sglang", 2),
}


def serving_speed(budget_s: float, seed: int = 0) -> dict:
    import infercast
    from infercast.api import serve_agg
    from infercast.serving.backends import scheduler_params
    from infercast.serving.disagg import kv_transfer_ms, solve_disagg

    rng = np.random.default_rng(seed)
    n = 2_000
    cfgs = list(zip(rng.integers(1, 513, n).tolist(), rng.integers(128, 8193, n).tolist(), rng.integers(64, 2049, n).tolist()))
    out: dict = {}
    ests = {}
    for be, (model, system, backend, tp) in SERVING_CONFIGS.items():
        est = ests[be] = infercast.Estimator(model, system, backend, tp=tp)
        params = scheduler_params(backend, est.data.system, est.spec)

        def agg(c, i, o, est=est, params=params):
            return serve_agg(est, c, i, o, params)

        kind = "lock-step simulation" if params.lockstep else "steady state + first wave"
        out[f"serve_agg, {backend} ({kind}), distinct configs"] = _rate(agg, cfgs, budget_s)
    pe = de = ests["trtllm"]
    p = scheduler_params("trtllm", pe.data.system, pe.spec)
    node = pe.data.system.node

    def disagg(c, i, o):
        transfer = kv_transfer_ms(pe.memory.kv_per_token, i, pe.gpus, node.inter_node_bw, node.p2p_latency_s,
                                  pe.memory.state_per_request)
        return solve_disagg(pe.engine, de.engine, float(c), i, o, 2, 2, 1, 1, p, p, transfer, 4 * pe.gpus)

    out["solve_disagg, trtllm 2 prefill x 2 decode workers, distinct configs"] = _rate(disagg, cfgs, budget_s)
    model, system, _, tp = SERVING_CONFIGS["trtllm"]
    out["config"] = f"{model} {system} tp={tp}"
    # a whole deployment search: every layout of one node x 11 concurrencies (tables already read)
    from infercast.search import search_agg

    t0 = time.perf_counter()
    res = search_agg(model, system, "trtllm", 4000, 500, ttft_max_ms=2000, tpot_max_ms=30)
    dt = time.perf_counter() - t0
    out["search"] = {"seconds": dt, "candidates": len(res.candidates),
                     "layouts": len({c.layout for c in res.candidates}), "per_candidate_ms": 1e3 * dt / max(len(res.candidates), 1)}
    return out


# ---- (c) construction and table load ------------------------------------------------------------
def construction() -> list[dict]:
    out, _ = _run_child(CONSTRUCT_CHILD, [list(c) for c in CONSTRUCT_CONFIGS])
    return out


def largest_table(runs: int = 3) -> dict:
    import pyarrow.parquet as pq

    from infercast.data.pack import find_pack
    from infercast.data.tables import read_table

    root = find_pack().data_root
    best = max(((pq.read_metadata(f).num_rows, f) for f in root.rglob("*_perf.parquet")), key=lambda x: (x[0], str(x[1])))
    rows, path = best
    times, table = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        table = read_table(path)
        times.append(time.perf_counter() - t0)
    return {
        "path": str(path.relative_to(root)), "raw_rows": rows, "rows_after_dedup": len(table),
        "mb": path.stat().st_size / 1e6, "read_table_s": statistics.median(times), "runs": runs,
    }


# ---- output -------------------------------------------------------------------------------------
def _fmt_s(x: float) -> str:
    return f"{x * 1e3:.0f} ms" if x < 10 else f"{x:.1f} s"


def render(res: dict) -> None:
    rows: list[tuple[str, str, str]] = []
    c = res["cold_start"]
    sec = f"(a) cold start, median of {c['runs']} fresh processes: {c['config']}"
    rows += [(sec, "", "")]
    rows += [("  import infercast", _fmt_s(c["import_s"]), "")]
    rows += [("  Estimator(...) construction", _fmt_s(c["construct_s"]), "reads the perf tables, compiles the plan")]
    rows += [("  first static(8, 4000, 500)", _fmt_s(c["first_static_s"]), f"ttft {c['ttft_ms']:.1f} ms, tpot {c['tpot_ms']:.2f} ms")]
    rows += [("  whole process (interpreter start included)", _fmt_s(c["process_s"]), "")]
    w = res["warm"]
    rows += [(f"(b) warm throughput: {w['config']}", "", "")]
    for k, v in w.items():
        if isinstance(v, dict):
            rows.append((f"  {k}", f"{v['per_s']:,.0f} /s", f"{v['us_per_call']:.2f} us each, {v['calls']:,} calls in {v['seconds']:.2f} s"))
    rows.append(("  result cache entries at the end", f"{w['result cache entries at the end']:,}", "scalar results kept; cleared at Estimator.CACHE_LIMIT (100,000)"))
    rows += [("(c) construction in one fresh process (first / second)", "", "")]
    for r in res["construction"]:
        rows.append((f"  {r['config']}", f"{_fmt_s(r['first_s'])} / {_fmt_s(r['second_s'])}",
                     f"first read {r['first_tables_read']} tables in {_fmt_s(r['first_table_read_s'])}; "
                     f"second read {r['second_tables_read']}"))
    t = res["largest_table"]
    rows.append((f"  read_table on the largest table: {t['path']}", _fmt_s(t["read_table_s"]),
                 f"{t['raw_rows']:,} rows ({t['rows_after_dedup']:,} after median of repeats), {t['mb']:.1f} MB, median of {t['runs']}"))
    sv = res["serving"]
    rows += [(f"(d) serving model, one configuration per call: {sv['config']}", "", "")]
    for k, v in sv.items():
        if isinstance(v, dict):
            rows.append((f"  {k}", f"{v['per_s']:,.0f} /s", f"{v['us_per_call'] / 1e3:.2f} ms each, {v['calls']:,} calls in {v['seconds']:.2f} s")
                        if "per_s" in v else
                        (f"  search_agg, trtllm, isl 4000 osl 500 ({v['layouts']} layouts x concurrency 1-1024)", _fmt_s(v["seconds"]),
                         f"{v['candidates']} candidates, {v['per_candidate_ms']:.1f} ms each (estimator construction included)"))
    rows.append(("total benchmark time", _fmt_s(res["elapsed_s"]), ""))
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        w0 = max(len(r[0]) for r in rows)
        w1 = max(len(r[1]) for r in rows)
        for a, b, n in rows:
            print(f"{a.ljust(w0)}  {b.rjust(w1)}  {n}")
        return
    table = Table(title="infercast estimator speed")
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_column("note")
    for a, b, n in rows:
        style = "bold" if not b and not n else None
        table.add_row(a, b, n, style=style)
    Console(width=200).print(table)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.estimate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON")
    ap.add_argument("--quick", action="store_true", help="1 cold-start run and 0.3 s per throughput loop")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    res = {
        "cold_start": cold_start(1 if args.quick else 3),
        "construction": construction(),
        "largest_table": largest_table(1 if args.quick else 3),
        "warm": warm_throughput(0.3 if args.quick else 1.5),
        "serving": serving_speed(0.3 if args.quick else 1.5),
    }
    res["elapsed_s"] = time.perf_counter() - t0
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        render(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
