"""One self-contained interactive HTML report of a simulation (``infercast simulate --report``).

Plotly figure with plotly.js inlined (opens offline): the measured requests' latency CDFs (TTFT,
TPOT, end-to-end, queueing), KV-cache use, queued and running requests over the run per
scheduler (a replica, or an attention-DP rank of one), completed requests and output tokens per
second over the run, and a summary table (mean / p50 / p90 / p95 / p99 of each latency,
throughput, goodput, prefix-cache hit rate). Statistics and the CDFs cover the measurement window
only (:mod:`infercast.serving.simulate.stats`: warm-up and cool-down left out); the time series
show the whole run with the window shaded.
"""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np

from ..errors import InvalidInputError

LATENCIES = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2e_ms", "end-to-end"), ("queue_ms", "queueing"))
STATS = ("mean", "p50", "p90", "p95", "p99")
#: per-scheduler series drawn; more schedulers than this are summed only (the plot stays legible)
MAX_UNIT_LINES = 16


def _cell(v, fmt="{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def summary_rows(res) -> list[tuple[str, str]]:
    """(quantity, value) rows of the summary table besides the latency statistics."""
    w0, w1 = (x / 1e3 for x in res.window_ms)
    rows = [("requests (measured)", f"{res.requests} ({res.measured})"),
            ("measurement window", (f"{w0:.1f} - {w1:.1f} s of {res.duration_ms / 1e3:.1f} s "
                                    "(warm-up and cool-down left out)")),
            ("throughput", f"{res.throughput_rps:.3f} req/s, {res.output_tokens_per_s:.1f} output tokens/s")]
    if res.goodput_rps is None:
        rows.append(("goodput", "no target given (--ttft-ms / --tpot-ms)"))
    else:
        slo = ", ".join(f"{k.replace('_ms', '').upper()} <= {v:g} ms" for k, v in res.slo.items() if v is not None)
        rows.append(("goodput", f"{res.goodput_rps:.3f} req/s ({slo})"))
    if res.prefix_hit_rate is None:
        rows.append(("prefix-cache hit rate", "cache off"))
    elif res.prefix_lookup_tokens == 0:
        rows.append(("prefix-cache hit rate", "no prompt blocks named (hash_ids): nothing to share"))
    else:
        rows.append(("prefix-cache hit rate", f"{res.prefix_hit_rate:.1%} of the prompts' whole-block tokens"))
    rows += [("KV use (window)", f"mean {res.kv_use['mean']:.1%}, max {res.kv_use['max']:.1%}"),
             ("queued requests (window)", f"mean {res.queue['mean']:.2f}, max {res.queue['max']:.0f}"),
             ("engine steps, preemptions", f"{res.steps}, {res.preemptions}")]
    return rows


def throughput_series(res, bins: int = 100) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bin centres (s), completed requests per second and output tokens per second in each of
    ``bins`` equal bins over the run (by completion time; the plot shows requests/s, tokens/s on
    hover)."""
    fin = np.asarray(res.per_request["finish_ms"], dtype=float)
    osl = np.asarray(res.per_request["osl"], dtype=float)
    end = max(float(res.duration_ms), 1e-9)
    edges = np.linspace(0.0, end, bins + 1)
    width_s = (edges[1] - edges[0]) / 1e3
    n, _ = np.histogram(fin, edges)
    tok, _ = np.histogram(fin, edges, weights=osl)
    return (edges[:-1] + edges[1:]) / 2e3, n / width_s, tok / width_s


def _figure(res, title: str):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=4, cols=2, vertical_spacing=0.07, horizontal_spacing=0.08,
                        subplot_titles=["TTFT CDF", "TPOT CDF", "end-to-end latency CDF", "queueing CDF",
                                        "KV-cache use per scheduler", "queued requests per scheduler",
                                        "running requests per scheduler", "throughput over the run"])
    m = np.asarray(res.per_request["measured"], dtype=bool)
    for (key, label), (row, col) in zip(LATENCIES, ((1, 1), (1, 2), (2, 1), (2, 2))):
        x = np.sort(np.asarray(res.per_request[key], dtype=float)[m])
        x = x[np.isfinite(x)]
        y = np.arange(1, x.size + 1) / max(x.size, 1)
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=f"{label} (ms)", showlegend=False,
                                 hovertemplate=f"{label} %{{x:.2f}} ms: %{{y:.1%}} of requests<extra></extra>"),
                      row=row, col=col)
        fig.update_xaxes(title_text=f"{label} (ms)", row=row, col=col)
        fig.update_yaxes(title_text="share of requests", range=[0, 1.02], row=row, col=col)
    ts = res.series or {}
    t = ts.get("t_s", [])
    units = ts.get("units", [])
    w0, w1 = (x / 1e3 for x in res.window_ms)
    for key, scale, label, (row, col) in (("kv_use", 100.0, "KV in use (%)", (3, 1)), ("queued", 1.0, "queued", (3, 2)),
                                          ("running", 1.0, "running", (4, 1))):
        if len(units) > 1:
            fig.add_trace(go.Scatter(x=t, y=np.asarray(ts[key], dtype=float) * scale,
                                     mode="lines", name=f"{label}: {'mean' if key == 'kv_use' else 'sum'}",
                                     line={"width": 3}, legendgroup=key), row=row, col=col)
        for u in units[:MAX_UNIT_LINES]:
            fig.add_trace(go.Scatter(x=t, y=np.asarray(u[key], dtype=float) * scale, mode="lines",
                                     name=f"{label}: scheduler {u['unit']}", line={"width": 1}, legendgroup=key),
                          row=row, col=col)
        fig.update_xaxes(title_text="time (s)", row=row, col=col)
        fig.update_yaxes(title_text=label, row=row, col=col)
        if t:
            fig.add_vrect(x0=w0, x1=w1, fillcolor="grey", opacity=0.12, line_width=0, row=row, col=col)
    tc, rps, tok = throughput_series(res, bins=int(min(100, max(10, res.requests // 20))))
    fig.add_trace(go.Scatter(x=tc, y=rps, mode="lines", line_shape="hvh", name="completed req/s", customdata=tok,
                             hovertemplate="%{x:.1f} s: %{y:.2f} req/s, %{customdata:.0f} output tokens/s<extra></extra>"),
                  row=4, col=2)
    fig.add_vrect(x0=w0, x1=w1, fillcolor="grey", opacity=0.12, line_width=0, row=4, col=2)
    fig.update_xaxes(title_text="time (s)", row=4, col=2)
    fig.update_yaxes(title_text="completed requests/s", rangemode="tozero", row=4, col=2)
    fig.update_layout(title=title, height=1500, hovermode="closest")
    return fig


def _table(res) -> str:
    head = "".join(f"<th>{c}</th>" for c in ("latency (ms)", *STATS))
    body = []
    for key, label in LATENCIES:
        s = res.latency[key]
        body.append(f"<tr><td>{label}</td>" + "".join(f"<td>{_cell(s[c])}</td>" for c in STATS) + "</tr>")
    rest = "".join(f"<tr><td>{html.escape(k)}</td><td colspan='5'>{html.escape(v)}</td></tr>"
                   for k, v in summary_rows(res))
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in res.notes)
    return (f"<table id='summary'><thead><tr>{head}</tr></thead><tbody>{''.join(body)}{rest}</tbody></table>"
            f"<ul id='notes'>{notes}</ul>")


_STYLE = ("body{font-family:sans-serif;margin:1.5em} table{border-collapse:collapse;margin-bottom:1em}"
          "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right} td:first-child{text-align:left}"
          "td[colspan]{text-align:left}")


def write_report(res, path, title: str = "infercast simulate") -> None:
    """Write ``res`` (:class:`infercast.serving.simulate.SimResult`) as one HTML file at ``path``."""
    fig = _figure(res, title)
    plot = fig.to_html(include_plotlyjs=True, full_html=False)
    doc = (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
           f"<style>{_STYLE}</style></head><body><h2>{html.escape(title)}</h2>{_table(res)}{plot}</body></html>")
    try:
        Path(path).write_text(doc, encoding="utf-8")
    except OSError as exc:
        raise InvalidInputError(f"cannot write --report {path}", exc.strerror or str(exc)) from None
