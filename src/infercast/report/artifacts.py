"""The files a search leaves behind (``--save-dir DIR``): every candidate and the Pareto frontier
as CSV / JSON, the frontier as a PNG (matplotlib) and as an interactive HTML report (plotly,
one self-contained file), and launch files for the top deployments
(:mod:`infercast.report.launch`).

Layout of ``DIR``::

    results.csv, results.json   every evaluated candidate, one row each, with its mode
    pareto.csv                  the candidates on each mode's frontier
    pareto.png                  tokens/s/GPU against tokens/s/user, frontier per mode
    report.html                 the same, interactive (hover: layout, concurrency, TTFT, TPOT),
                                the frontier's 80% prediction intervals as error bars
                                (:mod:`infercast.serving.intervals`; the CSV / JSON carry
                                80% and 95%), plus the per-op breakdown of each mode's
                                recommendation
    top/<mode>-<rank>/          launch files of the ``top`` best distinct deployments per mode
                                that meet the targets (:func:`ranked`: each layout once, at its
                                best concurrency; ``launch_*.sh``, TensorRT-LLM option YAMLs,
                                ``k8s_dynamo.yaml``, ``benchmark.sh``, ``deployment.json``)
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..errors import InfercastError, InvalidInputError, NotAvailableError
from ..search.pareto import ranked
from .launch import Deployment, launch_files, worker_spec

#: the frontier's axes: (candidate field, axis title)
X_AXIS = ("tokens_per_s_per_user", "tokens/s per user")
Y_AXIS = ("tokens_per_s_per_gpu", "tokens/s per GPU")


def _layout_kw(label: str) -> dict:
    """Estimator layout keywords of a layout label such as ``tp2-dp4-ep4`` or ``tp1-dp8-etp2-ep4``
    (``tp``, ``pp``, ``dp`` = attention DP, ``etp`` = expert TP, ``ep`` = expert parallel; without
    ``etp`` the experts' TP follows from the width rule)."""
    names = {"tp": "tp", "pp": "pp", "dp": "attention_dp", "etp": "moe_tp", "ep": "moe_ep", "cp": "cp"}
    out: dict = {}
    for part in label.split("-"):
        m = re.fullmatch(r"(etp|tp|pp|dp|ep|cp)(\d+)", part)
        if not m:
            raise InvalidInputError(f"not a layout label: {label!r}", "expected parts like tp2, pp2, dp4, etp2, ep8 joined by -")
        out[names[m.group(1)]] = int(m.group(2))
    return out


def deployment_of(candidate, result, estimator_kw: dict) -> tuple[Deployment, dict]:
    """The :class:`Deployment` a search candidate stands for, and {role: Estimator} of its
    worker layouts (built with the search's own estimator settings). A disaggregated search with
    decode workers on another system (``result.decode_system``) builds the decode worker on that
    system at the data version the search used there, so each worker kind's launch files state
    its own system."""
    from ..api import Estimator
    from ..serving.backends import scheduler_params

    def est(label: str, system: str, version):
        return Estimator(result.model, system, result.backend, version, **_layout_kw(label), **estimator_kw)

    if getattr(candidate, "prefill_layout", ""):
        dsys = getattr(result, "decode_system", None) or result.system
        dver = (getattr(result, "decode_backend_version", None) or result.backend_version) if dsys != result.system \
            else result.backend_version
        roles = {"prefill": (est(candidate.prefill_layout, result.system, result.backend_version), candidate.prefill_workers),
                 "decode": (est(candidate.decode_layout, dsys, dver), candidate.decode_workers)}
    else:
        roles = {"agg": (est(candidate.layout, result.system, result.backend_version),
                         getattr(candidate, "replicas", 1) or 1)}
    own = getattr(result, "scheduler", None) or {}  # the overrides the search ran each worker kind with
    workers = tuple(worker_spec(e, replace(scheduler_params(result.backend, e.data.system, e.spec), **own.get(role, {})),
                                role, n)
                    for role, (e, n) in roles.items())
    first = next(iter(roles.values()))[0]
    d = Deployment(first.spec.model_id, result.backend, first.version, workers, result.isl, result.osl,
                   int(candidate.concurrency), prefix=int(getattr(result, "prefix", 0) or 0))
    return d, {role: e for role, (e, _) in roles.items()}


def _row(mode: str, record: dict) -> dict:
    """A candidate's CSV row from its JSON record (:func:`~infercast.search.run.candidate_dict`
    with intervals): its mode, fields and the ends of its prediction intervals (``ttft_ms_p80_lo``
    ... ``tokens_per_s_per_user_p95_hi``)."""
    from ..serving.intervals import flat_from_dict

    return {"mode": mode, **{k: v for k, v in record.items() if k != "intervals"}, **flat_from_dict(record["intervals"])}


def _records(results: dict) -> dict[str, list[dict]]:
    """Per mode, every candidate's JSON record (:func:`~infercast.search.run.candidate_records`: the
    :func:`~infercast.search.run.candidate_dict` of each, built in bulk, its prediction intervals
    worked out once: a search has tens of thousands of candidates)."""
    from ..search.run import candidate_records

    return {mode: candidate_records(res) for mode, res in results.items()}


def _write_csv(path: Path, rows: list[dict]) -> None:
    """``rows`` as CSV: the columns every row's keys in order of first appearance, an empty cell
    where a row has no such key (as :class:`csv.DictWriter` writes them, row lists being faster)."""
    keys: dict[str, None] = {}
    for r in rows:
        keys.update(dict.fromkeys(r))
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(keys)
        w.writerows([r.get(k, "") for k in keys] for r in rows)


def _cached(res) -> str:
    """`` + N cached`` when a search's requests start with a cached prefix (``SearchResult.prefix``)."""
    n = getattr(res, "prefix", 0)
    return f" + {n} cached" if n else ""


def pareto_png(path: Path, results: dict) -> None:
    """Tokens/s per GPU against tokens/s per user, every candidate faint and each mode's frontier
    as a line (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for mode, res in results.items():
        xs, ys = _column(res.candidates, X_AXIS[0]), _column(res.candidates, Y_AXIS[0])
        pts = ax.scatter(xs, ys, s=10, alpha=0.25, label=f"{mode}: candidates")
        front = sorted((res.candidates[i] for i in res.frontier), key=lambda c: getattr(c, X_AXIS[0]))
        ax.plot([getattr(c, X_AXIS[0]) for c in front], [getattr(c, Y_AXIS[0]) for c in front], "-o", ms=4,
                color=pts.get_facecolor()[0][:3], label=f"{mode}: Pareto frontier")
    ax.set_xlabel(X_AXIS[1])
    ax.set_ylabel(Y_AXIS[1])
    first = next(iter(results.values()))
    ax.set_title(f"{first.model} on {first.system}, {first.backend} ({first.isl} in{_cached(first)} / {first.osl} out)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _column(candidates, name: str) -> np.ndarray:
    """Field ``name`` of every candidate as a float array (read by column: no candidate object made)."""
    from ..search.candidates import column_reader

    return np.asarray(column_reader(candidates)(name), dtype=float)


def _hovers(candidates) -> list[str]:
    """:func:`_hover` of every candidate (without intervals), from the candidates' columns."""
    from ..search.candidates import column_reader

    column = column_reader(candidates)
    names = ("layout", "gpus", "concurrency", "ttft_ms", "tpot_ms", "tokens_per_s_per_gpu", "tokens_per_s_per_user",
             "meets_targets")
    return [f"{layout}<br>{gpus} GPUs, {conc} clients<br>TTFT {ttft:.0f} ms, TPOT {tpot:.2f} ms<br>{gpu:.0f} tok/s/GPU, "
            f"{user:.1f} tok/s/user" + ("" if ok else "<br>misses the targets")
            for layout, gpus, conc, ttft, tpot, gpu, user, ok in zip(*(column(n) for n in names))]


def _range(intervals: dict, key: str, level: float = 0.80) -> str:
    iv = intervals.get(key)
    if iv is None:
        return ""
    lo, hi = iv.ranges[level]
    return f" ({round(100 * level)}%: {lo:.4g}-{hi:.4g})"


def _hover(c, res=None) -> str:
    iv = {}
    if res is not None:
        from ..search.run import candidate_intervals

        iv = candidate_intervals(c, res)
    return (f"{c.layout}<br>{c.gpus} GPUs, {c.concurrency} clients<br>TTFT {c.ttft_ms:.0f} ms{_range(iv, 'ttft_ms')}, "
            f"TPOT {c.tpot_ms:.2f} ms{_range(iv, 'tpot_ms')}<br>{c.tokens_per_s_per_gpu:.0f} tok/s/GPU"
            f"{_range(iv, 'tokens_per_s_per_gpu')}, {c.tokens_per_s_per_user:.1f} tok/s/user"
            f"{_range(iv, 'tokens_per_s_per_user')}" + ("" if c.meets_targets else "<br>misses the targets"))


def _error_bars(front: list, res, field: str, level: float = 0.80) -> dict:
    """A plotly asymmetric error bar of each frontier point's ``level`` prediction interval of
    ``field`` (:func:`infercast.search.run.candidate_intervals`)."""
    from ..search.run import candidate_intervals

    plus, minus = [], []
    for c in front:
        v = getattr(c, field)
        iv = candidate_intervals(c, res).get(field)
        lo, hi = iv.ranges[level] if iv is not None else (v, v)
        plus.append(hi - v)
        minus.append(v - lo)
    return {"type": "data", "symmetric": False, "array": plus, "arrayminus": minus, "thickness": 1}


def report_html(path: Path, results: dict, breakdowns: dict) -> None:
    """One self-contained HTML file (plotly.js inlined): the candidates and frontiers, hover
    naming each deployment, and for each mode's recommendation each op's share of a phase's time
    (hover: ms over all layers, provenance) from ``breakdowns`` ({title: (phases, breakdown
    rows)}, phases among ``prefill_ms`` / ``decode_ms``)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    n = len(breakdowns)
    fig = make_subplots(rows=1 + n, cols=1, row_heights=[0.5] + [0.5 / max(n, 1)] * n, vertical_spacing=0.08,
                        subplot_titles=["Pareto frontier: throughput per GPU against per user", *breakdowns])
    for mode, res in results.items():
        fig.add_trace(go.Scatter(x=_column(res.candidates, X_AXIS[0]), y=_column(res.candidates, Y_AXIS[0]),
                                 mode="markers", name=f"{mode} candidates", opacity=0.35, marker={"size": 6},
                                 hovertext=_hovers(res.candidates), hoverinfo="text"), row=1, col=1)
        front = sorted((res.candidates[i] for i in res.frontier), key=lambda c: getattr(c, X_AXIS[0]))
        # the frontier's points carry their 80% prediction intervals as error bars
        fig.add_trace(go.Scatter(x=[getattr(c, X_AXIS[0]) for c in front], y=[getattr(c, Y_AXIS[0]) for c in front],
                                 mode="lines+markers", name=f"{mode} frontier (bars: 80% prediction interval)",
                                 hovertext=[_hover(c, res) for c in front], hoverinfo="text",
                                 error_x=_error_bars(front, res, X_AXIS[0]), error_y=_error_bars(front, res, Y_AXIS[0])),
                      row=1, col=1)
    fig.update_xaxes(title_text=X_AXIS[1], row=1, col=1)
    fig.update_yaxes(title_text=Y_AXIS[1], row=1, col=1)
    for i, (title, (phases, rows)) in enumerate(breakdowns.items(), start=2):
        ops = [r["op"] for r in rows]
        for phase in phases:
            total = sum(r[phase] for r in rows) or 1.0
            fig.add_trace(go.Bar(x=ops, y=[100.0 * r[phase] / total for r in rows],
                                 name=f"{title.split(':')[0]}: {phase[:-3]} ({total:.4g} ms)",
                                 hovertext=[f"{r['op']}: {r[phase]:.4g} ms of {total:.4g} ({r['provenance']})" for r in rows],
                                 hoverinfo="text"), row=i, col=1)
        fig.update_yaxes(title_text="% of the phase", row=i, col=1)
    first = next(iter(results.values()))
    fig.update_layout(title=f"infercast search: {first.model} on {first.system}, {first.backend} "
                            f"({first.isl} in{_cached(first)} / {first.osl} out)", height=520 + 360 * n, barmode="group")
    fig.write_html(str(path), include_plotlyjs=True, full_html=True)


def text_pareto(results: dict, width: int = 60, height: int = 14, color: bool = False) -> str:
    """Each mode's frontier as a terminal line plot (uniplot): tokens/s per GPU against
    tokens/s per user. ``color`` tells the modes apart with ANSI colours (for a terminal)."""
    from uniplot import plot_to_string

    xs, ys, labels = [], [], []
    for mode, res in results.items():
        front = sorted((res.candidates[i] for i in res.frontier), key=lambda c: getattr(c, X_AXIS[0]))
        if len(front) >= 1:
            xs.append([getattr(c, X_AXIS[0]) for c in front])
            ys.append([getattr(c, Y_AXIS[0]) for c in front])
            labels.append(mode)
    if not xs:
        return "(no frontier: no candidate was evaluated)"
    return plot_to_string(xs=xs, ys=ys, legend_labels=labels, lines=True, width=width, height=height, color=color,
                          title=f"Pareto frontier: y {Y_AXIS[1]}, x {X_AXIS[1]}")


def write_search_artifacts(save_dir, results: dict, estimator_kw: dict, top: int = 3) -> list[Path]:
    """Write ``save_dir``'s files (module docstring) for ``results`` ({mode: SearchResult}, each
    searched with Estimator keywords ``estimator_kw``); returns the paths written. The directory
    is created if missing; files of the same names are replaced, nothing else in it is touched.
    Needs matplotlib and plotly (``pip install 'infercast[report]'``)."""
    import importlib.util

    missing = [m for m in ("matplotlib", "plotly") if importlib.util.find_spec(m) is None]
    if missing:
        raise NotAvailableError(f"saving a search report needs {' and '.join(missing)}",
                                "install them: pip install 'infercast[report]'")
    out = Path(save_dir)
    if out.exists() and not out.is_dir():
        raise InvalidInputError(f"--save-dir {out} is a file", "give a directory (it is created if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidInputError(f"cannot create --save-dir {out}", exc.strerror or str(exc)) from exc
    written: list[Path] = []
    dicts = _records(results)
    p = out / "results.csv"
    _write_csv(p, [_row(mode, d) for mode, ds in dicts.items() for d in ds])
    written.append(p)
    p = out / "results.json"
    # compact: json's C encoder writes it (an indented file of this size takes ~10x longer)
    p.write_text(json.dumps({mode: res.to_dict(candidate_dicts=dicts[mode]) for mode, res in results.items()},
                            default=str))
    written.append(p)
    p = out / "pareto.csv"
    _write_csv(p, [_row(m, dicts[m][i]) for m, r in results.items() for i in r.frontier])
    written.append(p)
    p = out / "pareto.png"
    pareto_png(p, results)
    written.append(p)
    breakdowns: dict = {}
    for mode, res in results.items():
        for rank, c in enumerate(ranked(res.candidates, top), start=1):
            try:
                d, ests = deployment_of(c, res, estimator_kw)
                files = launch_files(d)
            except InfercastError as exc:  # an engine that cannot run this layout: say so in place
                files = {"NOT_LAUNCHABLE.txt": f"{c.layout}: {exc}\n"}
                ests = {}
            sub = out / "top" / f"{mode}-{rank}"
            sub.mkdir(parents=True, exist_ok=True)
            for name, text in files.items():
                (sub / name).write_text(text)
                written.append(sub / name)
            if rank == 1:
                for role, e in ests.items():
                    batch = max(1, round(c.concurrency / (c.prefill_workers if role == "prefill" else
                                                          getattr(c, "decode_workers", 0) or 1)
                                         / e.plan.parallel.attention_dp)) if role != "prefill" else 1
                    try:
                        bd = e.static(batch, res.isl, res.osl, getattr(res, "prefix", 0)).to_dict()["breakdown"]
                    except InfercastError:
                        continue
                    phases = {"agg": ("prefill_ms", "decode_ms"), "prefill": ("prefill_ms",),
                              "decode": ("decode_ms",)}[role]
                    name = mode if role == "agg" else f"{mode} {role}"
                    lay = c.layout if role == "agg" else getattr(c, role + "_layout")
                    breakdowns[f"{name}: {lay}, batch {batch} per rank"] = (phases, bd)
    p = out / "report.html"
    report_html(p, results, breakdowns)
    written.append(p)
    return written
