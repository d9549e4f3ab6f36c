"""Readable terminal output (rich)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .layout import plural


#: columns of a console that writes to a pipe or a file: wide enough that no line and no table
#: cell is ever wrapped (rich would otherwise assume 80 and fold header cells and model ids)
UNWRAPPED_WIDTH = 100_000


def new_console(min_width: int = 0) -> Console:
    """A console for stdout. On a terminal: its width, at least ``min_width`` columns (a wide table
    folds its cells to fit). Not a terminal (a pipe, a file): nothing wraps -- text lines stay
    whole (``soft_wrap``) and tables take their natural width."""
    c = Console(highlight=False)
    if not c.is_terminal:
        return Console(highlight=False, width=UNWRAPPED_WIDTH, soft_wrap=True)
    if c.width < min_width:
        c.width = min_width
    return c


def _fold(t: Table) -> Table:
    """``t`` with every column folding what does not fit onto further lines: at a narrow width
    (a pipe's 80 columns) rich would otherwise cut model ids, op names and numbers to "…"."""
    for col in t.columns:
        col.overflow = "fold"
    return t


def _f(x, fmt="{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


#: how the console names a figure with a prediction interval
_INTERVAL_NAMES = {"ttft_ms": "TTFT ms", "tpot_ms": "TPOT ms", "request_latency_ms": "request ms",
                   "tokens_per_s_per_gpu": "tok/s/GPU", "tokens_per_s_per_user": "tok/s/user",
                   "requests_per_s_per_copy": "req/s per copy", "capacity_requests_per_s": "req/s capacity"}


def _plain(x: float) -> str:
    """A range end as a plain number with about four significant digits (no exponent: 11620, not
    1.162e+04)."""
    ax = abs(x)
    if ax >= 100:
        return f"{x:.0f}"
    return f"{x:.1f}" if ax >= 10 else f"{x:.2f}" if ax >= 1 else f"{x:.3g}"


def _print_intervals(c, intervals: dict | None) -> None:
    """The 80% / 95% prediction intervals of a result's figures (:mod:`infercast.serving.intervals`)."""
    if not intervals:
        return
    t = Table(title="prediction intervals: where a measured benchmark's mean falls, by similar benchmarks", show_header=True,
              header_style="bold")
    for col in ("figure", "80%", "95%", "from"):
        t.add_column(col, justify="left" if col in ("figure", "from") else "right")
    for key, iv in intervals.items():
        name = _INTERVAL_NAMES.get(key, key)
        t.add_row(name, *(f"{_plain(iv[p][0])} - {_plain(iv[p][1])}" for p in ("p80", "p95")),
                  f"{iv['cell']} ({iv['n']} rows)")
    c.print(_fold(t))


def print_static(res, explain: bool = False, intervals: dict | None = None) -> None:
    c = new_console(min_width=140 if explain else 0)  # --explain: a source column of kernel names
    per_rank = " per attention-DP rank" if res.attention_dp > 1 else ""
    title = (
        f"{res.model} on {res.system} · {res.backend} {res.backend_version} · {res.layout} · "
        f"batch {res.batch_size}{per_rank} · isl {res.isl} osl {res.osl}" + (f" prefix {res.prefix}" if res.prefix else "")
    )
    c.print(f"[bold]{title}[/bold]")
    q = res.quant
    c.print(f"quant: gemm {q['gemm']}, kv cache {q['kv_cache']}, attention {q['attention']}  ({q['source']})")
    for n in res.notes:
        c.print(f"[yellow]note:[/yellow] {n}")
    m = res.memory
    c.print(
        f"memory/GPU: {res.memory_gb_per_gpu:.1f} GB of {m['capacity_gb']:.0f} GB  (weights {m['weights_gb']:.1f}, "
        f"KV {m['kv_cache_gb']:.1f}, activations {m['activations_gb']:.1f}, reserves {m['reserves_gb']:.1f}; "
        f"KV capacity {m['kv_capacity_tokens']:,} tokens)"
    )
    if not res.fits:
        c.print("[bold red]does not fit[/bold red]: no latency is reported for a configuration that cannot run")
        return
    t = Table(show_header=True, header_style="bold")
    for col in ("TTFT ms", "TPOT ms", "request ms", "tok/s/GPU", "tok/s/user"):
        t.add_column(col, justify="right")
    t.add_row(_f(res.ttft_ms), _f(res.tpot_ms, "{:.3f}"), _f(res.request_latency_ms, "{:.0f}"),
              _f(res.tokens_per_s_per_gpu, "{:.1f}"), _f(res.tokens_per_s_per_user, "{:.1f}"))
    c.print(_fold(t))
    _print_intervals(c, intervals)
    print_energy(c, res.energy)
    if res.breakdown:
        b = Table(title="per-op (all layers)", show_header=True, header_style="bold")
        b.add_column("op")
        b.add_column("count", justify="right")
        b.add_column("prefill ms", justify="right")
        b.add_column("decode ms", justify="right")
        b.add_column("provenance")
        if explain:
            b.add_column("source")
        for row in res.breakdown:
            cells = [row.op, str(row.count), f"{row.prefill_ms:.3f}", f"{row.decode_ms:.4f}", row.provenance]
            if explain:
                cells.append(_source_text(row.source))
            b.add_row(*cells)
        c.print(_fold(b))
    c.print(f"data: {res.versions['tables']}")


def _source_text(src: dict) -> str:
    if "context" in src:
        return "ctx: " + _source_text(src["context"]) + " | gen: " + _source_text(src["generation"])
    parts = [src.get("source", "?")]
    for k in ("version", "kernel", "how"):
        if src.get(k):
            parts.append(str(src[k]))
    if src.get("donor_sites"):
        parts.append("from " + "; ".join(src["donor_sites"]))
    return " ".join(parts)


def print_systems(pack, rows) -> None:
    c = new_console()
    c.print(f"pack: {pack.systems_dir} ({pack.origin})")
    t = Table(show_header=True, header_style="bold")
    for col in ("system", "backend", "current", "previous", "next", "collected versions"):
        t.add_column(col)
    for r in rows:
        s = r["slots"]
        t.add_row(r["system"], r["backend"] or (f"(broken: {r['error']})" if r.get("error") else "(no data)"), s.get("current", "-"), s.get("previous", "-"), s.get("next", "-"), ", ".join(r["collected"]))
    c.print(_fold(t))


def print_models(rows) -> None:
    t = Table(show_header=True, header_style="bold")
    t.add_column("model")
    t.add_column("architecture")
    t.add_column("supported")
    for r in rows:
        if r.get("error"):
            t.add_row(r["model"], f"(unreadable: {r['error']})", "no")
            continue
        t.add_row(r["model"], r["architecture"], "yes" if r["supported"] else "not yet")
    new_console().print(_fold(t))


def _print_percentiles(c, d: dict) -> None:
    if d.get("ttft_p50_ms") is None:
        return
    p = Table(show_header=True, header_style="bold")
    for col in ("over requests", "p50", "p90", "p99", "mean"):
        p.add_column(col, justify="right")
    for metric, fmt in (("ttft", "{:.2f}"), ("tpot", "{:.3f}")):
        p.add_row(f"{metric.upper()} ms", *(_f(d[f"{metric}_p{q}_ms"], fmt) for q in (50, 90, 99)), _f(d[f"{metric}_ms"], fmt))
    c.print(_fold(p))


#: how the console names the parts of a mean TTFT (``infercast.serving.result.TTFT_PARTS``)
_TTFT_PART_NAMES = {"front_end": "front end", "wait": "wait to be scheduled", "prefill": "own prefill"}


def _print_ttft_parts(c, d: dict) -> None:
    parts = d.get("ttft_parts")
    if parts:
        c.print("mean TTFT = " + " + ".join(f"{_TTFT_PART_NAMES.get(k, k)} {v:.1f}" for k, v in parts.items()) + " ms")


def print_serving_disagg(d: dict) -> None:
    c = new_console()

    def lay(x):
        return f"{plural(x['workers'], 'worker')} x ({x['layout']})"

    c.print(f"[bold]{d['model']} on {d['system']} · {d['backend']} {d['backend_version']} · {plural(d['gpus'], 'GPU')} · "
            f"concurrency {d['concurrency']:.0f} · isl {d['isl']} osl {d['osl']}{_prefix(d)}[/bold]")
    c.print(f"prefill: {lay(d['prefill'])}\ndecode:  {lay(d['decode'])}")
    t = Table(show_header=True, header_style="bold")
    for col in ("mean TTFT ms", "mean TPOT ms", "request ms", "tok/s/GPU", "tok/s/user", "decode batch",
                "prefill util", "KV transfer ms"):
        t.add_column(col, justify="right")
    t.add_row(_f(d["ttft_ms"]), _f(d["tpot_ms"], "{:.3f}"), _f(d["request_latency_ms"], "{:.0f}"),
              _f(d["tokens_per_s_per_gpu"], "{:.1f}"), _f(d["tokens_per_s_per_user"], "{:.1f}"),
              _f(d["decode_batch"], "{:.1f}"), _f(d["prefill_utilisation"], "{:.2f}"), _f(d["kv_transfer_ms"], "{:.3f}"))
    c.print(_fold(t))
    _print_intervals(c, d.get("intervals"))
    _print_percentiles(c, d)
    _print_ttft_parts(c, d)
    cap = d.get("decode_kv_capacity")
    if cap is not None and d["decode_batch"] > cap:
        c.print(f"[yellow]warning: a decode rank runs {d['decode_batch']:.1f} requests but its KV cache holds "
                f"{cap:.1f} of {d['isl']}+{d['osl']} tokens by infercast's memory model[/yellow]")
    pcap = d.get("prefill_kv_capacity")
    if pcap is not None and d.get("prefill_batch", 1) > pcap:
        c.print(f"[yellow]warning: a prefill rank runs {d.get('prefill_batch', 1)} prompts at once but its KV cache "
                f"holds {pcap:.1f} of {d['isl']} tokens by infercast's memory model[/yellow]")
    print_energy(c, d.get("energy"))
    _print_notes(c, d)


def print_energy(c, e: dict | None) -> None:
    """One line of energy (:mod:`infercast.serving.energy`): the measured part per request and
    per output token with its coverage, and the TDP bound; "not available" when nothing was
    measured."""
    if e is None:
        return
    if not e.get("available"):
        c.print(f"energy: not available ({escape(e.get('note', '').removeprefix('not available: '))})")
        return
    line = (f"energy (measured part, {e['coverage']:.0%} of GPU time): {e['measured_j_per_request']:.3g} J/request, "
            f"{e['measured_j_per_token']:.3g} J/token")
    if e.get("upper_bound_j_per_request") is not None:
        line += (f"; upper bound with the rest at {e['tdp_w']:g} W TDP: {e['upper_bound_j_per_request']:.3g} J/request, "
                 f"{e['upper_bound_j_per_token']:.3g} J/token")
    c.print(line)


def _print_notes(c, d: dict) -> None:
    for note in d.get("notes") or ():
        c.print(f"[yellow]note: {note}[/yellow]")


def print_misfit(d: dict) -> None:
    """``serve`` / ``serve-disagg`` of a configuration that cannot hold one request: what was
    asked (model, GPUs, layout) and why it does not fit."""
    c = new_console()
    if "prefill" in d:
        where = (f"{plural(d['gpus'], 'GPU')}: prefill {plural(d['prefill']['workers'], 'worker')} x "
                 f"({d['prefill']['layout']}), decode {plural(d['decode']['workers'], 'worker')} x ({d['decode']['layout']})")
    else:
        where = d["layout"]
    c.print(f"[bold]{d['model']} on {d['system']} · {d['backend']} {d['backend_version']} · {where} · "
            f"concurrency {d['concurrency']} · isl {d['isl']} osl {d['osl']}{_prefix(d)}[/bold]")
    c.print(f"[bold red]does not fit[/bold red]: {escape(d['reason'])}")


def _prefix(d: dict) -> str:
    """`` prefix N`` after the lengths when requests start with cached prompt tokens."""
    return f" prefix {d['prefix']}" if d.get("prefix") else ""


def print_serving(d: dict) -> None:
    c = new_console()
    c.print(f"[bold]{d['model']} on {d['system']} · {d['backend']} {d['backend_version']} · {d['layout']} · "
            f"concurrency {d['concurrency']} · isl {d['isl']} osl {d['osl']}{_prefix(d)}[/bold]")
    t = Table(show_header=True, header_style="bold")
    for col in ("mean TTFT ms", "mean TPOT ms", "request ms", "tok/s/GPU", "tok/s/user", "decode batch", "bound"):
        t.add_column(col, justify="right")
    t.add_row(_f(d["ttft_ms"]), _f(d["tpot_ms"], "{:.3f}"), _f(d["request_latency_ms"], "{:.0f}"),
              _f(d["tokens_per_s_per_gpu"], "{:.1f}"), _f(d["tokens_per_s_per_user"], "{:.1f}"),
              _f(d["decode_batch"], "{:.1f}"), str(d["bound"]))
    c.print(_fold(t))
    _print_intervals(c, d.get("intervals"))
    _print_percentiles(c, d)
    _print_ttft_parts(c, d)
    if d.get("balance_hold_ms"):
        c.print(f"attention-DP balance hold: {d['balance_hold_ms']:.1f} ms of the steady-state TTFT (a prefill waits "
                "until every rank has one, or the backend's timeout)")
    print_energy(c, d.get("energy"))
    _print_notes(c, d)


def print_search(d: dict) -> None:
    c = new_console(min_width=140)  # ten columns: wider than a default terminal
    t = d.get("targets") or {"ttft_max_ms": d["ttft_max_ms"], "tpot_max_ms": d["tpot_max_ms"]}
    targets = ", ".join(
        (f"{name} <= {t[f'{key}_max_ms']:g} ms" if t[f"{key}_max_ms"] is not None else f"no {name} target")
        + (" (default)" if t.get(f"{key}_from") == "default" else "")
        for key, name in (("ttft", "TTFT"), ("tpot", "TPOT")))
    mode = d.get("mode", "agg")
    gpus = plural(d["max_gpus"], "GPU")
    scope = {"agg": f"up to {gpus} per replica", "fixed": f"exactly {gpus} (agg replicas "
             "or disaggregated workers)"}.get(mode, f"up to {gpus} in all (disaggregated)")
    on = d["system"] + (f" (decode workers on {d['decode_system']}, {d.get('decode_backend_version') or ''})"
                        if d.get("decode_system") else "")
    c.print(f"[bold]{d['model']} on {on} · {d['backend']} {d['backend_version']} · isl {d['isl']} osl {d['osl']}{_prefix(d)} · "
            f"{scope} · targets: {targets}[/bold]")

    conc = d.get("concurrencies")
    if conc:
        held = d.get("max_concurrency")
        c.print(f"concurrencies: {', '.join(map(str, conc))}"
                + (f" (the most requests a deployment searched runs at once: {held})" if held else ""))

    def table(title, rows):
        t = Table(title=title, show_header=True, header_style="bold")
        for col in ("layout", "GPUs", "clients", "TTFT ms", "TPOT ms", "TTFT p90", "tok/s/GPU", "tok/s/user", "bound", "meets"):
            t.add_column(col, justify="left" if col in ("layout", "bound") else "right")
        for r in rows:
            t.add_row(r["layout"], str(r["gpus"]), str(r["concurrency"]), _f(r["ttft_ms"]), _f(r["tpot_ms"], "{:.2f}"),
                      _f(r["ttft_p90_ms"]), _f(r["tokens_per_s_per_gpu"], "{:.1f}"), _f(r["tokens_per_s_per_user"], "{:.1f}"),
                      str(r["bound"]), "yes" if r["meets_targets"] else "no")
        c.print(_fold(t))

    if not d["frontier"]:
        why = " (reasons below)" if d.get("skipped") else ""
        if mode == "fixed":
            c.print(f"[yellow]no deployment of exactly {gpus} could serve this workload{why}[/yellow]")
        else:
            c.print(f"[yellow]no layout of up to {gpus} could serve this workload{why}; "
                    f"allow more GPUs with --max-gpus[/yellow]")
    else:
        table("Pareto frontier (tokens/s/user vs tokens/s/GPU)", d["frontier"])
    if d["top"]:
        table("best deployments that meet the targets (tokens/s/GPU; each layout once, at its best clients)", d["top"])
    best = d["best"]
    if best is None:
        c.print(f"[yellow]no recommendation: {escape(d.get('reason') or 'no evaluated deployment meets the targets')}[/yellow]")
    else:
        unit = "per replica" if mode == "agg" else "in all"
        c.print(f"recommended: [bold]{best['layout']}[/bold] ({escape(best.get('description') or plural(best['gpus'], 'GPU'))}"
                f"{'' if mode == 'agg' else ' in all'}) at {plural(best['concurrency'], 'client')} {unit}: "
                f"TTFT {best['ttft_ms']:.1f} ms, TPOT {best['tpot_ms']:.2f} ms, "
                f"{best['tokens_per_s_per_gpu']:.1f} tokens/s/GPU, {best['tokens_per_s_per_user']:.1f} tokens/s/user")
        _print_intervals(c, best.get("intervals"))
    if d["skipped"]:
        c.print(f"skipped ({len(d['skipped'])}):")
        for k, v in list(d["skipped"].items())[:8]:
            c.print(f"  {k}: {v}")


def print_search_both(d: dict) -> None:
    for mode in ("agg", "disagg"):
        print_search(d[mode])
    c = new_console()
    if d["best_mode"] is None:
        c.print(f"[yellow]{escape(d.get('reason') or 'neither mode has a deployment that meets the targets')}[/yellow]")
    else:
        b = d[d["best_mode"]]["best"]
        c.print(f"[bold]best overall: {d['best_mode']}, {b['layout']} ({escape(b.get('description') or plural(b['gpus'], 'GPU'))}): "
                f"{b['tokens_per_s_per_gpu']:.1f} tokens/s/GPU[/bold]")
