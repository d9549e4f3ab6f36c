"""The deployment-workflow commands: ``recommend`` (the fewest GPUs for a load) and ``exp``
(experiments from a YAML file). Their parsers are added by :func:`add_parsers`."""

from __future__ import annotations

import json
import sys

from ..errors import InvalidInputError
from ..search.run import DEFAULT_TPOT_MS, DEFAULT_TTFT_MS


def _progress(quiet: bool, refresh: bool = True):
    """A rich progress display on stderr (JSON on stdout stays clean); off with ``--quiet``.
    ``refresh=False``: redrawn only when it advances, with no refresh thread (a search that forks
    its workers needs a process without other threads: :mod:`infercast.search.parallel`)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), disable=quiet, transient=True, auto_refresh=refresh)


def cmd_recommend(a) -> int:
    from ..search import search_agg, search_disagg
    from ..search.run import search_both, sharing_estimators
    from ..search.sizing import recommend_deployment

    if (a.rate is None) == (a.clients is None):
        raise InvalidInputError("give the load: --rate R (requests/s) or --clients N (concurrent clients)")
    for name in ("isl", "osl"):
        if getattr(a, name) < 1:
            raise InvalidInputError(f"--{name} must be >= 1, got {getattr(a, name)}")
    if a.top < 1:
        raise InvalidInputError(f"--top must be >= 1, got {a.top}")
    from .main import _calibration, _check_prefix, _search_targets, calibration_summary, refuse_unsearched_flags

    _check_prefix(a)
    from .speculative import speculative_kw

    targets = _search_targets(a)
    cal, cal_notes = _calibration(a)
    ttft, tpot = targets["ttft_max_ms"], targets["tpot_max_ms"]
    kw = dict(ttft_max_ms=ttft, tpot_max_ms=tpot, backend_version=a.backend_version, systems_path=a.systems_path,
              moe_quant=a.moe_quant, gemm_quant=a.gemm_quant, kv_cache_quant=a.kv_cache_quant,
              attention_quant=a.attention_quant, nextn=a.nextn, mtp_acceptance=a.mtp_acceptance, moe_kernel=a.moe_kernel,
              speculative=speculative_kw(a),
              kv_memory_fraction=a.kv_memory_fraction, database_mode=a.database_mode, prefix=a.prefix)
    shared = {**getattr(a, "engine_scheduler", {}), **(cal.overrides() if cal is not None else {})}
    if shared:  # the engine configuration's scheduler settings, then the calibration's (as search)
        kw["scheduler"] = shared
    refuse_unsearched_flags(a, "recommend")
    if a.cp_overlap:
        raise InvalidInputError("--cp-overlap: recommend does not search context parallelism",
                                "use search --cp-list 1,2 --cp-overlap")
    if a.decode_system is not None and a.mode != "disagg":
        raise InvalidInputError(f"--decode-system puts disaggregated decode workers on another system: it needs "
                                f"--mode disagg, not {a.mode}")
    results = {}
    modes = [m for m in ("agg", "disagg") if a.mode in (m, "both")]
    # both modes share each layout's estimator (sharing_estimators); no refresh thread, so the
    # searches may fork their workers (--jobs)
    with _progress(a.quiet, refresh=False) as prog, sharing_estimators():
        task = prog.add_task("searching", total=len(modes))
        prog.refresh()
        if len(modes) == 2:  # both searches' parts on one set of workers (search_both)
            results.update(search_both(a.model, a.system, a.backend, a.isl, a.osl, max_gpus=a.max_gpus,
                                       cap_concurrency=True, jobs=a.jobs, **kw))
            prog.advance(task, 2)
            prog.refresh()
        for m in modes:
            if m in results:
                continue
            fn = search_agg if m == "agg" else search_disagg
            extra = {"decode_system": a.decode_system} if m == "disagg" and a.decode_system else {}
            results[m] = fn(a.model, a.system, a.backend, a.isl, a.osl, max_gpus=a.max_gpus, cap_concurrency=True,
                            jobs=a.jobs, **kw, **extra)
            prog.advance(task)
            prog.refresh()
    recs = recommend_deployment(results, rate=a.rate, clients=a.clients, top=a.top)
    first = next(iter(results.values()))
    out = {"model": first.model, "system": a.system, "decode_system": first.decode_system, "backend": a.backend,
           "backend_version": first.backend_version,
           "isl": a.isl, "osl": a.osl, "prefix": a.prefix, "rate": a.rate, "clients": a.clients,
           "targets": {"ttft_ms": ttft, "tpot_ms": tpot},
           "recommendations": [r.to_dict() for r in recs],
           "searched": {m: {"candidates": len(r.candidates), "skipped": len(r.skipped)} for m, r in results.items()}}
    if cal is not None:
        out["calibration"] = calibration_summary(cal, cal_notes, sorted({c for r in results.values() for c in r.concurrencies}))
    if a.save_dir:
        from ..report.artifacts import write_search_artifacts

        est_kw = {k: v for k, v in kw.items() if k not in ("ttft_max_ms", "tpot_max_ms", "backend_version", "scheduler", "prefix")}
        write_search_artifacts(a.save_dir, results, est_kw)
        out["save_dir"] = str(a.save_dir)
    if a.json:
        print(json.dumps(out, indent=1, default=str))
        return 0
    from ..report.workflow import print_recommend

    print_recommend(out)
    from .main import _print_calibration_notes

    _print_calibration_notes(a, out)
    if a.save_dir:
        print(f"saved: {a.save_dir}")
    return 0


def cmd_exp(a) -> int:
    from ..exp import load_experiments
    from ..exp.run import run_experiments, work_items

    exps = load_experiments(a.file)
    total = len(work_items(exps))
    # no refresh thread: run here, the experiments' searches fork their workers
    with _progress(a.quiet, refresh=False) as prog:
        task = prog.add_task("experiments", total=total)

        prog.refresh()

        def done(o) -> None:
            prog.update(task, advance=1, description=f"{o.experiment} {o.system} {o.backend}")
            prog.refresh()

        outcomes = run_experiments(exps, a.systems_path, jobs=a.jobs, ray=a.ray, on_done=done)
    if a.save_dir:
        _save_exp(a.save_dir, outcomes)
    rows = [o.to_dict() for o in outcomes]
    if a.json:
        print(json.dumps({"file": str(a.file), "results": rows}, indent=1, default=str))
    else:
        from ..report.workflow import print_exp

        print_exp(rows)
    if not any(o.error is None for o in outcomes):
        print(f"infercast: error: no experiment in {a.file} could be answered: {outcomes[0].error}", file=sys.stderr)
        return 2
    return 0


def _save_exp(save_dir, outcomes) -> None:
    from pathlib import Path

    from ..report.artifacts import write_search_artifacts

    root = Path(save_dir)
    if root.exists() and not root.is_dir():
        raise InvalidInputError(f"--save-dir {root} is a file", "give a directory (it is created if missing)")
    for o in outcomes:
        sub = root / o.experiment / f"{o.system}-{o.backend}"
        if o.searches:
            write_search_artifacts(sub, o.searches, dict(o.estimator_kw))
        sub.mkdir(parents=True, exist_ok=True)
        (sub / "outcome.json").write_text(json.dumps(o.to_dict(), indent=1, default=str))


def add_executor_args(p, what: str) -> None:
    """``--jobs N`` and ``--ray [ADDRESS]``: where ``what`` runs (:mod:`infercast.search.executor`)."""
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help=f"run {what} over N local processes (default 1; same answers); with --ray: at most N Ray "
                        "tasks at once (and the CPUs of --ray local)")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help=f"run {what} as Ray tasks (pip install 'infercast[ray]'; same answers): ADDRESS local (a "
                        "private instance started and stopped here), auto, HOST:PORT or ray://HOST:PORT of a running "
                        "cluster; without ADDRESS, RAY_ADDRESS, else the cluster last started here, else a new local "
                        "instance")


def add_parsers(sub, add_model_args) -> None:
    """Add ``recommend`` and ``exp`` to the subcommand parsers ``sub`` (``add_model_args``: the
    model / system / backend / quant flags every estimating command takes)."""
    r = sub.add_parser("recommend", help="the fewest GPUs (and the deployment) that serve a request rate or a number "
                                         "of clients within the latency targets, aggregated or disaggregated")
    add_model_args(r, parallel=False)
    r.add_argument("--isl", type=int, required=True, help="prompt tokens per request")
    r.add_argument("--osl", type=int, required=True, help="output tokens per request")
    from .main import PREFIX_HELP, SEARCH_JOBS_HELP

    r.add_argument("--prefix", type=int, default=0, help=PREFIX_HELP)
    load = r.add_mutually_exclusive_group()
    load.add_argument("--rate", type=float, default=None, help="the load as requests per second")
    load.add_argument("--clients", type=int, default=None, help="the load as concurrent clients (closed loop)")
    r.add_argument("--ttft-ms", type=float, default=None,
                   help=f"target: mean TTFT at most this (ms; default {DEFAULT_TTFT_MS:g}; inf: none)")
    r.add_argument("--tpot-ms", type=float, default=None,
                   help=f"target: mean TPOT at most this (ms; default {DEFAULT_TPOT_MS:g}; inf: none)")
    r.add_argument("--mode", choices=("agg", "disagg", "both"), default="both",
                   help="aggregated replicas, disaggregated prefill/decode deployments, or both (default)")
    r.add_argument("--max-gpus", type=int, default=None,
                   help="GPUs of one copy at most: per replica (agg, default one node), per deployment (disagg, "
                        "default two nodes)")
    r.add_argument("--top", type=int, default=5, help="how many options to list (default 5)")
    r.add_argument("--decode-system", default=None,
                   help="with --mode disagg: run the decode workers on this system (the prefill workers on --system); "
                        "the KV cache moves over the slower of the two systems' node-to-node links")
    r.add_argument("--save-dir", default=None, help="write the searches' results, plots, report and launch files here")
    r.add_argument("--jobs", type=int, default=None, metavar="N", help=SEARCH_JOBS_HELP)
    r.add_argument("--quiet", action="store_true", help="no progress display on stderr")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    r.set_defaults(func=cmd_recommend)

    e = sub.add_parser("exp", help="run the experiments of a YAML file (searches or served deployments; docs/exp.md)")
    e.add_argument("file", help="the experiments YAML (schema: docs/exp.md; examples under examples/)")
    e.add_argument("--save-dir", default=None, help="write each search's files under DIR/<name>/<system>-<backend>/")
    e.add_argument("--quiet", action="store_true", help="no progress display on stderr")
    e.add_argument("--json", action="store_true", help="print every result as one JSON object")
    add_executor_args(e, "the experiments' (experiment, system, backend) runs")
    e.add_argument("--systems-path", help="a pack's systems/ directory (default: $INFERCAST_SYSTEMS_PATH, then the "
                                          "installed aiconfigurator-core data)")
    e.set_defaults(func=cmd_exp)
