"""Console table and latency-CDF plot of a simulation's result."""

from __future__ import annotations

import numpy as np

from ...errors import InvalidInputError


def print_result(res, title: str = "") -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    t = Table(title=title or "simulation", header_style="bold")
    t.add_column("metric")
    for c in ("mean", "p50", "p90", "p95", "p99"):
        t.add_column(c, justify="right")
    for name, label in (("ttft_ms", "TTFT (ms)"), ("tpot_ms", "TPOT (ms)"), ("e2e_ms", "end-to-end (ms)"),
                        ("queue_ms", "queueing (ms)")):
        s = res.latency[name]
        t.add_row(label, *("-" if s[c] is None else f"{s[c]:.2f}" for c in ("mean", "p50", "p90", "p95", "p99")))
    con.print(t)
    lines = [
        (f"requests {res.requests} ({res.measured} measured), simulated {res.duration_ms / 1e3:.1f} s, "
         f"{res.steps} engine steps, {res.preemptions} preemptions"),
        f"throughput {res.throughput_rps:.3f} req/s, {res.output_tokens_per_s:.1f} output tokens/s",
    ]
    if res.goodput_rps is not None:
        slo = ", ".join(f"{k.replace('_ms', '').upper()} <= {v:g} ms" for k, v in res.slo.items() if v is not None)
        lines.append(f"goodput {res.goodput_rps:.3f} req/s ({slo})")
    if res.prefix_hit_rate is None:
        lines.append("prefix cache off")
    elif res.prefix_lookup_tokens == 0:
        lines.append("prefix cache on, but the load names no prompt blocks (hash_ids): nothing to share")
    else:
        lines.append(f"prefix-cache hit rate {res.prefix_hit_rate:.1%} of the prompts' whole-block tokens")
    lines.append(f"KV use mean {res.kv_use['mean']:.1%}, max {res.kv_use['max']:.1%}; queued mean {res.queue['mean']:.2f}, "
                 f"max {res.queue['max']:.0f}")
    for line in lines + [f"note: {n}" for n in res.notes]:
        con.print(line, highlight=False)


def plot_cdf(res, path) -> None:
    """PNG of the measured requests' TTFT, TPOT and end-to-end latency CDFs, and the KV-cache use
    and queued requests over the run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = np.asarray(res.per_request["measured"], dtype=bool)
    fig, grid = plt.subplots(2, 3, figsize=(13, 7.2))
    axes = grid[0]
    for ax, key, label in zip(axes, ("ttft_ms", "tpot_ms", "e2e_ms"), ("TTFT (ms)", "TPOT (ms)", "end-to-end (ms)")):
        x = np.sort(np.asarray(res.per_request[key], dtype=float)[m])
        x = x[np.isfinite(x)]
        if x.size:
            ax.plot(x, np.arange(1, x.size + 1) / x.size)
        ax.set_xlabel(label)
        ax.set_ylabel("share of requests")
        ax.grid(alpha=0.3)
    ts = res.series
    if ts:
        ax = grid[1][0]
        ax.plot(ts["t_s"], np.asarray(ts["kv_use"]) * 100)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("KV cache in use (%)")
        ax = grid[1][1]
        ax.plot(ts["t_s"], ts["queued"], label="queued")
        ax.plot(ts["t_s"], ts["running"], label="running")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("requests (all schedulers)")
        ax.legend()
        w0, w1 = (x / 1e3 for x in res.window_ms)
        for ax in grid[1][:2]:
            ax.axvspan(w0, w1, color="0.9", zorder=0)
            ax.grid(alpha=0.3)
    grid[1][2].axis("off")
    grid[1][2].text(0.0, 0.5, "shaded: measurement window\n(warm-up and cool-down outside)", va="center")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise InvalidInputError(f"cannot write --plot {path}", exc.strerror or str(exc)) from None
    finally:
        plt.close(fig)
