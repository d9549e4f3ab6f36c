"""Terminal output of the workflow commands: ``recommend`` and ``exp`` (rich tables)."""

from __future__ import annotations

from rich.table import Table

from .console import _f, _print_intervals, new_console


def print_recommend(d: dict) -> None:
    """``infercast recommend``'s answer: the load, the targets, and the cheapest ways to serve it."""
    c = new_console(min_width=120)
    load = f"{d['rate']:g} requests/s" if d.get("rate") is not None else f"{d['clients']} concurrent clients"
    t = d["targets"]
    on = d["system"] + (f" (decode workers on {d['decode_system']})" if d.get("decode_system") else "")
    c.print(f"[bold]{d['model']} on {on} · {d['backend']} {d.get('backend_version') or ''} · "
            f"{d['isl']} in / {d['osl']} out" + (f" (+{d['prefix']} cached)" if d.get("prefix") else "") + "[/bold]")
    c.print(f"load: {load}; targets: mean TTFT <= {_f(t['ttft_ms'], '{:g}')} ms, mean TPOT <= {_f(t['tpot_ms'], '{:g}')} ms")
    recs = d["recommendations"]
    if not recs:
        c.print("[bold red]no deployment meets the targets[/bold red] at any searched concurrency: "
                "relax the targets, or allow more GPUs per replica (--max-gpus)")
        return
    tab = Table(show_header=True, header_style="bold")
    for col in ("#", "mode", "deployment", "copies", "GPUs", "clients/copy", "TTFT ms", "TPOT ms", "req/s capacity",
                "tok/s/GPU"):
        tab.add_column(col, justify="right" if col not in ("mode", "deployment") else "left")
    for i, r in enumerate(recs, start=1):
        u = r["unit"]
        tab.add_row(str(i), r["mode"], u["layout"], str(r["copies"]), str(r["gpus"]), str(r["concurrency_per_copy"]),
                    _f(u["ttft_ms"], "{:.0f}"), _f(u["tpot_ms"], "{:.2f}"), _f(r["capacity_requests_per_s"], "{:.2f}"),
                    _f(u["tokens_per_s_per_gpu"], "{:.1f}"))
    c.print(tab)
    best = recs[0]
    c.print(f"recommended: {best['copies']} x {best['unit']['layout']} ({best['mode']}) = [bold]{best['gpus']} GPUs[/bold], "
            f"each copy at {best['concurrency_per_copy']} clients")
    _print_intervals(c, best.get("intervals"))


#: the figures whose 80% prediction interval ``exp``'s table shows in a column of its own (field, format)
EXP_RANGES = (("ttft_ms", "{:.0f}"), ("tpot_ms", "{:.2f}"), ("tokens_per_s_per_gpu", "{:.0f}"))


def _range80(row: dict, key: str, fmt: str) -> str:
    """``lo-hi``: the 80% prediction interval of ``row``'s figure ``key`` (``-`` without one)."""
    iv = (row.get("intervals") or {}).get(key)
    if not iv:
        return "-"
    lo, hi = iv["p80"]
    return f"{fmt.format(lo)}-{fmt.format(hi)}"


def print_exp(rows: list[dict]) -> None:
    """``infercast exp``'s results: one row per experiment, system, backend and answer, with the
    80% prediction intervals of TTFT, TPOT and tokens/s/GPU (both levels of every figure: ``--json``)."""
    c = new_console(min_width=140)
    tab = Table(show_header=True, header_style="bold")
    numeric = ("GPUs", "clients", "TTFT ms", "TTFT 80%", "TPOT ms", "TPOT 80%", "tok/s/GPU", "tok/s/GPU 80%", "tok/s/user")
    for col in ("experiment", "system", "backend", "kind", "deployment", *numeric, "meets"):
        tab.add_column(col, justify="right" if col in numeric else "left")
    any_range = False
    for o in rows:
        head = (o["experiment"], o["system"], o["backend"])
        if o["error"]:
            tab.add_row(*head, o["kind"], f"[red]{o['error']}[/red]", *([""] * (len(numeric) + 1)))
            continue
        for r in o["rows"]:
            kind = r.get("mode") or o["kind"]
            any_range = any_range or bool(r.get("intervals"))
            (t80, p80, g80) = (_range80(r, k, fmt) for k, fmt in EXP_RANGES)
            tab.add_row(*head, kind, r["layout"], str(r["gpus"]), str(r["concurrency"]), _f(r["ttft_ms"], "{:.0f}"), t80,
                        _f(r["tpot_ms"], "{:.2f}"), p80, _f(r["tokens_per_s_per_gpu"], "{:.1f}"), g80,
                        _f(r["tokens_per_s_per_user"], "{:.1f}"), "yes" if r["meets_targets"] else "no")
    c.print(tab)
    if any_range:
        c.print("80%: prediction intervals, where a measured benchmark's mean falls, by similar benchmarks "
                "(95% ranges, the other figures and the cells: --json)")
