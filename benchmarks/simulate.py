"""Simulator speed: ``python -m benchmarks.simulate [--duration-s S] [--rate R] [--profile]``.

One hour of Poisson traffic at 10 requests/s (36,000 requests; input lengths uniform on
[512, 1024], outputs on [256, 512], as ``--random-range-ratio 0.5`` draws them) on 8 replicas of
Qwen3-32B (bf16, TP 1) on H200 with TensorRT-LLM's scheduler, round-robin routing. Goal: <= 5 s
on one core. Prints wall and CPU time (estimator build excluded, reported apart; on a shared
machine the CPU time is the measure), requests and engine steps simulated per CPU second, step-timer calls, and the run's TTFT / TPOT.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time

import numpy as np

from infercast.api import Estimator
from infercast.serving.backends import scheduler_params
from infercast.serving.simulate import (
    Workload,
    arrival_times,
    simulate_estimator,
    uniform_lengths,
)


def workload(rate: float, duration_s: float, seed: int = 0) -> Workload:
    rng = np.random.default_rng(seed)
    n = round(rate * duration_s)
    return Workload(isl=uniform_lengths(1024, 0.5, n, rng), osl=uniform_lengths(512, 0.5, n, rng),
                    sent_ms=arrival_times(n, rate, 1.0, rng))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--duration-s", type=float, default=3600.0)
    ap.add_argument("--rate", type=float, default=10.0)
    ap.add_argument("--replicas", type=int, default=8)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    t0 = time.perf_counter()
    est = Estimator("Qwen/Qwen3-32B", "h200_sxm", "trtllm", tp=1)
    params = scheduler_params("trtllm", est.data.system, est.spec)
    build = time.perf_counter() - t0
    w = workload(a.rate, a.duration_s)
    prof = cProfile.Profile() if a.profile else None
    t1 = time.perf_counter()
    c1 = time.process_time()
    if prof:
        prof.enable()
    res, timer = simulate_estimator(est, params, w, replicas=a.replicas)
    if prof:
        prof.disable()
    wall = time.perf_counter() - t1
    cpu = time.process_time() - c1
    out = {"requests": res.requests, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "estimator_build_s": round(build, 3),
           "requests_per_cpu_s": round(res.requests / cpu), "engine_steps": res.steps,
           "engine_steps_per_cpu_s": round(res.steps / cpu), "timer_calls": timer.calls,
           "ttft_ms_mean": round(res.latency["ttft_ms"]["mean"], 2), "ttft_ms_p99": round(res.latency["ttft_ms"]["p99"], 2),
           "tpot_ms_mean": round(res.latency["tpot_ms"]["mean"], 3), "throughput_rps": round(res.throughput_rps, 3),
           "kv_use_mean": round(res.kv_use["mean"], 4), "goal_s": 5.0}
    print(json.dumps(out, indent=1) if a.json else "\n".join(f"{k:>20}: {v}" for k, v in out.items()))
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


if __name__ == "__main__":
    main()
