"""The ``infercast`` command line. Any :class:`InfercastError` -> one line on stderr, exit code 2.

A configuration that cannot run (weights or one request exceed the memory) is an answer, not bad
input: every command reports it (``fits: false`` and the ``reason`` in JSON; ``search``: ``best:
null`` and the ``reason``) with exit code 0. Every command's output states the GPU count and the
layout in words (:mod:`infercast.report.layout`)."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from ..errors import InfercastError, InvalidInputError
from .speculative import add_speculative_args, speculative_kw
from .scheduler_args import add_scheduler_flags, add_shortcut_flags, role_overrides

EXIT_USAGE = 2


def _add_progress_args(p) -> None:
    """``--progress`` / ``--quiet`` (:mod:`infercast.report.progress`; default ``auto``)."""
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--progress", dest="progress", action="store_const", const="on", default="auto",
                       help="show progress on stderr (default: a bar on a terminal, once the run takes a few seconds)")
    shown.add_argument("--quiet", dest="progress", action="store_const", const="off", help="no progress on stderr")


def _add_data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--systems-path", help="a pack's systems/ directory (default: $INFERCAST_SYSTEMS_PATH, then the installed aiconfigurator-core data)")


#: how the layout flags combine (every command's description that takes or reports a layout)
LAYOUT_HELP = (
    "Layout: --tp is the tensor-parallel size of ONE attention-DP rank, so a replica runs attention on "
    "tp x attention-dp GPUs and has pp stages of them: GPUs = tp x attention-dp x pp. The MoE experts "
    "are split over the same tp x attention-dp GPUs as moe-tp x moe-ep (moe-tp x moe-ep = tp x attention-dp). "
    "Example: --tp 8 --attention-dp 8 --moe-ep 8 is 64 GPUs (8 attention-DP ranks x TP 8; experts EP 8 x TP 8); "
    "the engines' own \"tp 8 with attention DP\" (8 GPUs) is --tp 1 --attention-dp 8 --moe-ep 8. Every output "
    "states the GPU count and the layout in words (JSON: gpus, layout)."
)

#: the rule for a configuration that does not fit (every command's description)
FITS_HELP = ("A configuration that cannot run (weights or one request exceed the memory) is an answer, "
             "not bad input: it is reported as does not fit (JSON: fits false, with the reason), exit code 0. "
             "Bad input: one line on stderr, exit code 2.")


def _add_parallel_args(p: argparse.ArgumentParser, prefix: str = "", who: str = "") -> None:
    f = f"--{prefix}-" if prefix else "--"
    p.add_argument(f"{f}tp", type=int, default=1,
                   help=f"tensor parallel size of one attention-DP rank{who} (GPUs = tp x attention-dp x pp; default 1)")
    p.add_argument(f"{f}pp", type=int, default=1, help=f"pipeline parallel stages{who}, each of tp x attention-dp GPUs (default 1)")
    p.add_argument(f"{f}attention-dp", type=int, default=1,
                   help=f"attention data-parallel ranks{who} (MoE models), each of --tp GPUs serving its own requests "
                        "(default 1; the engines' 'tp N with attention DP' is --tp 1 --attention-dp N)")
    p.add_argument(f"{f}moe-tp", type=int, default=None,
                   help=f"tensor parallel size of the experts{who}; moe-tp x moe-ep = tp x attention-dp "
                        "(default: tp x attention-dp / moe-ep)")
    p.add_argument(f"{f}moe-ep", type=int, default=None,
                   help=f"expert parallel size{who}: the experts are spread over moe-ep groups of moe-tp GPUs (default 1)")
    p.add_argument(f"{f}cp", type=int, default=1,
                   help=f"context-parallel ranks{who}, each a copy of the tp x attention-dp x pp layout (GPUs x cp): "
                        "prompts split over them, the KV cache sharded over them (default 1; docs/model.md)")


def _add_model_args(p: argparse.ArgumentParser, parallel: bool = True) -> None:
    p.add_argument("--model", required=True, help="HF id (as in the pack's model_configs/), alias, or a local config path")
    p.add_argument("--system", required=True, help="system name, e.g. h200_sxm (see `infercast systems`)")
    p.add_argument("--backend", required=True, choices=["trtllm", "vllm", "sglang"],
                   help="serving engine: trtllm (TensorRT-LLM), vllm or sglang")
    p.add_argument("--backend-version", default=None, help="data version or slot alias current/previous/next (default: current)")
    if parallel:
        _add_parallel_args(p)
    add_speculative_args(p)
    p.add_argument("--moe-quant", default=None, help="override the MoE expert quant mode (fp8_block, nvfp4, mxfp4, int4_wo, ...)")
    p.add_argument("--moe-kernel", default=None,
                   help="MoE kernel family the engine runs: trtllm (TensorRT-LLM-gen), cutlass, deepgemm "
                        "(TensorRT-LLM's moe_config.backend) or triton (vLLM / SGLang fused_moe); "
                        "default: the table's own kernels")
    p.add_argument("--gemm-quant", default=None, help="override the GEMM weight quant mode (bfloat16, fp8, fp8_block, nvfp4, ...)")
    p.add_argument("--kv-cache-quant", default=None, help="override the KV cache dtype (bfloat16, fp8)")
    p.add_argument("--kv-memory-fraction", type=float, default=None,
                   help="the backend's KV memory knob: TensorRT-LLM free_gpu_memory_fraction, vLLM "
                        "gpu_memory_utilization, SGLang mem_fraction_static (default: the engine's)")
    p.add_argument("--attention-quant", default=None, help="override the attention compute dtype (bfloat16, fp8)")
    p.add_argument("--database-mode", default="SILICON", help="SILICON (default), HYBRID, EMPIRICAL or SOL")
    p.add_argument("--cp-overlap", action="store_true",
                   help="with --cp > 1: the per-layer K/V exchange of a prefill overlaps its attention (default: runs before it)")
    p.add_argument("--moe-comm", choices=("gather", "alltoall"), default=None,
                   help="how attention-DP tokens reach the expert-parallel ranks: gather (all-gather + "
                        "reduce-scatter; TensorRT-LLM's and vLLM's default) or alltoall (DeepEP dispatch / combine: "
                        "SGLang --moe-a2a-backend deepep, vLLM --all2all-backend deepep_*); default: alltoall where "
                        "the backend's wide-EP tables cover the shape")
    _add_data_args(p)
    p.add_argument("--calibration", metavar="FILE", default=None,
                   help="a calibration profile written by `infercast calibrate`: its fitted scheduler values (front end, "
                        "step overhead, GPU-time scales) replace the backend's defaults, under any flag given")
    from .engine_config import add_engine_args

    add_engine_args(p)


def _estimator(a, prefix: str = ""):
    """The Estimator of the parsed flags; ``prefix`` picks the ``--<prefix>-tp`` ... layout flags."""
    from ..api import Estimator

    def par(name):
        return getattr(a, f"{prefix}_{name}" if prefix else name)

    def role(name):  # a role's own model setting (--prefill-kv-cache-quant ...), else the shared flag's
        own = getattr(a, f"{prefix}_{name}", None) if prefix else None
        return getattr(a, name, None) if own is None else own

    try:
        est = Estimator(
            a.model, a.system, a.backend, a.backend_version, par("tp"), par("pp"),
            attention_dp=par("attention_dp"), moe_tp=par("moe_tp"), moe_ep=par("moe_ep"), moe_quant=a.moe_quant,
            nextn=a.nextn, mtp_acceptance=a.mtp_acceptance, moe_kernel=role("moe_kernel"), speculative=speculative_kw(a),
            gemm_quant=a.gemm_quant, kv_cache_quant=role("kv_cache_quant"), attention_quant=a.attention_quant,
            kv_memory_fraction=role("kv_memory_fraction"), database_mode=a.database_mode, systems_path=a.systems_path,
            moe_comm=role("moe_comm"),
            cp=getattr(a, f"{prefix}_cp" if prefix else "cp", 1), cp_overlap=bool(getattr(a, "cp_overlap", False)),
        )
    except InfercastError as exc:
        if not prefix:
            raise
        # name the flag the user gave: --prefill-tp, not --tp (and a role's own model setting)
        own = [n.replace("_", "-") for n in ("kv_cache_quant", "kv_memory_fraction", "moe_kernel", "moe_comm")
               if getattr(a, f"{prefix}_{n}", None) is not None]

        def flag(text):
            return re.sub(r"--(" + "|".join(["tp", "pp", "attention-dp", "moe-tp", "moe-ep", "cp", *own]) + r")\b(?!-)",
                          rf"--{prefix}-\1", text)

        raise type(exc)(flag(exc.what), flag(exc.why), exc.available) from exc
    if a.moe_quant and est.spec.moe is None:
        raise InvalidInputError(f"--moe-quant {a.moe_quant} given, but {a.model} has no MoE experts",
                                "--gemm-quant sets the quant mode of a dense model's layers")
    return est


def cmd_estimate(a) -> int:
    from ..api import static_energy

    est = _estimator(a)
    res = est.static(a.batch, a.isl, a.osl, a.prefix)
    res.energy = static_energy(est, res)
    res.notes = list(res.notes) + getattr(a, "engine_notes", [])
    cal, cal_notes = _calibration(a)
    if cal is not None:
        from ..calibrate.profile import apply_to_static

        res.notes += cal_notes + apply_to_static(res, cal)
        if res.energy is not None and res.energy.get("available") and (
                cal.values.get("prefill_scale", 1.0) != 1.0 or cal.values.get("decode_scale", 1.0) != 1.0):
            res.energy["note"] += "; the calibration's GPU-time scales are not applied to energy"
    if a.plan_out:
        try:
            Path(a.plan_out).write_text(est.plan.to_json())
        except OSError as exc:
            raise InvalidInputError(f"cannot write --plan-out {a.plan_out}", exc.strerror or str(exc)) from exc
    from ..serving.intervals import intervals_dict, static_intervals

    intervals = intervals_dict(static_intervals(est, res)) if res.fits else {}
    if a.json:
        print(json.dumps({**res.to_dict(), "intervals": intervals}, indent=1, default=str))
        return 0
    from ..report.console import print_static

    print_static(res, explain=a.explain, intervals=intervals)
    return 0


#: ``infercast serve`` flags that override the backend's scheduler defaults
#: (:class:`infercast.serving.backends.SchedulerParams`): flag -> (field, type, minimum, what)
SCHEDULER_FLAGS = {
    "max_num_tokens": ("max_num_tokens", int, 1, "token budget of one engine step (max batched tokens)"),
    "max_batch_size": ("max_batch_size", int, 1, "running requests at most (max num seqs)"),
    "front_end_ms": ("arrival_delay_ms", float, 0.0, "client + front-end time per request (HTTP, tokenisation), ms"),
    "front_end_per_stream_ms": ("front_end_per_stream_ms", float, 0.0,
                                "front-end time per open stream (the client's and API server's event loops), ms"),
    "front_end_per_prompt_token_ms": ("front_end_per_prompt_token_ms", float, 0.0,
                                      "front-end time per prompt token (tokenising the prompt), ms"),
    "step_overhead_ms": ("step_overhead_ms", float, 0.0, "host time per engine step, ms"),
    "requests_per_client": ("requests_per_client", float, 1.0, "requests each benchmark client sends (the benchmark length)"),
    "adp_balance_timeout_steps": ("adp_balance_timeout_steps", int, 0,
                                  "attention DP: steps a prefill is held waiting for every rank to have one (0: no hold)"),
    "batch_wait_iters": ("batch_wait_iters", int, 0,
                         "TensorRT-LLM context batching delay: iterations waiting prompts may wait (0: off)"),
    "batch_wait_max_tokens_ratio": ("batch_wait_max_tokens_ratio", float, 0.0,
                                    "... ended early once the step's tokens reach this share of --max-num-tokens (0-1)"),
    "recv_interval": ("recv_interval", int, 1,
                      ("SGLang --scheduler-recv-interval: new requests are taken every this many decode steps "
                       "(1: every step; no effect on lock-step waves, whose requests reach an idle engine)")),
}


def _scheduler_overrides(a) -> dict:
    import math

    out = {}
    for flag, (field, kind, lo, _) in SCHEDULER_FLAGS.items():
        v = getattr(a, flag, None)
        if v is None:
            continue
        if not (isinstance(v, (int, float)) and math.isfinite(v)) or v < lo:
            raise InvalidInputError(f"--{flag.replace('_', '-')} must be a finite number >= {lo}, got {v}")
        out[field] = kind(v)
    if out.get("batch_wait_max_tokens_ratio", 0.0) > 1.0:
        raise InvalidInputError(f"--batch-wait-max-tokens-ratio is a share of the token budget (0-1), got "
                                f"{out['batch_wait_max_tokens_ratio']}")
    return out


def _scheduler_fields(items: list[str]) -> dict:
    """``--scheduler FIELD=VALUE`` settings (:func:`.scheduler_args.parse_fields`)."""
    from .scheduler_args import parse_fields

    return parse_fields(items)


def cmd_serve(a) -> int:
    from dataclasses import asdict, replace

    from ..api import serve_agg_replica
    from ..serving.backends import mean_length_ratio, scheduler_params
    from ..serving.sim import DoesNotFitError

    for name in ("concurrency", "isl", "osl"):
        if getattr(a, name) < 1:
            raise InvalidInputError(f"--{name} must be >= 1, got {getattr(a, name)}")
    _check_prefix(a)
    # the engine configuration's scheduler settings, then a calibration profile's, under the flags given
    cal, cal_notes = _calibration(a, a.concurrency)
    overrides = {**getattr(a, "engine_scheduler", {}), **(cal.overrides() if cal else {}), **_scheduler_overrides(a)}
    if a.prefill_scheduling is not None:
        # mixed: prefill chunks ride in decode steps (vLLM / TensorRT-LLM, SGLang --enable-mixed-chunk);
        # prefill-first: waiting prompts are prefilled in their own steps before decoding resumes
        # (SGLang's default), which keeps a closed-loop benchmark's clients in lock-step waves
        mixed = a.prefill_scheduling == "mixed"
        overrides.update(mixed=mixed, lockstep=not mixed)
    if a.random_lengths or a.random_range_ratio is not None:
        # lengths drawn at random drift a closed loop's clients apart: no lock-step waves
        overrides.update(lockstep=False)
    if a.random_range_ratio is not None:
        try:
            overrides.update(kv_length_ratio=mean_length_ratio(a.random_range_ratio))
        except ValueError:
            raise InvalidInputError(f"--random-range-ratio is the shortest request's share of the nominal lengths, "
                                    f"in (0, 1]; got {a.random_range_ratio}") from None
    overrides.update(_scheduler_fields(getattr(a, "scheduler", None) or []))
    est = _estimator(a)
    params = replace(scheduler_params(a.backend, est.data.system, est.spec), **overrides)
    head = {"model": a.model, "system": a.system, "backend": a.backend, "backend_version": est.version,
            "gpus": est.gpus, "layout": est.layout_words, **_layout(est), "concurrency": a.concurrency,
            "isl": a.isl, "osl": a.osl, "prefix": a.prefix}
    try:
        res, per_rank = serve_agg_replica(est, a.concurrency, a.isl, a.osl, params, prefix=a.prefix)
    except DoesNotFitError as exc:
        return _emit(a, _misfit(head, exc), "print_misfit")
    from ..serving.energy import agg_energy, with_scales_note
    from ..serving.intervals import agg_intervals, intervals_dict

    out = {"fits": True, **res.to_dict(), **head, "concurrency_per_rank": per_rank,
           "intervals": intervals_dict(agg_intervals(est, res, concurrency=a.concurrency, isl=a.isl, osl=a.osl)),
           "energy": with_scales_note(agg_energy(est, res, a.osl), params), "scheduler": asdict(params),
           "notes": est.context_notes(a.isl, a.osl, a.prefix) + res.notes + getattr(a, "engine_notes", []) + cal_notes}
    return _emit(a, out, "print_serving")


#: scheduler fields of an engine's own API server, which the disaggregated model does not use
#: (its front end is the router's: ``front_end_ms``; :class:`infercast.serving.disagg._PrefillService`)
_API_SERVER_FIELDS = ("front_end_per_stream_ms", "front_end_per_prompt_token_ms")


def _check_prefix(a) -> None:
    """``--prefix``: cached prompt tokens per request, 0 or more."""
    if a.prefix < 0:
        raise InvalidInputError(f"--prefix is cached prompt tokens per request, 0 or more; got {a.prefix}")


def _misfit(head: dict, exc: InfercastError) -> dict:
    """The answer for a configuration that cannot hold one request: ``fits: false`` and why (an
    answer, exit code 0, as ``estimate`` gives it; not bad input)."""
    return {"fits": False, "reason": str(exc), **head}


def _emit(a, out: dict, printer: str) -> int:
    """``out`` as JSON with ``--json`` (:func:`~infercast.report.json_text.write_json`: a long
    list of records, such as ``search --all``'s candidates, one record per line, written as made),
    else through ``report.console.<printer>``."""
    if a.json:
        from ..report.json_text import write_json

        write_json(out, sys.stdout)
        sys.stdout.write("\n")
        return 0
    from ..report import console

    getattr(console, printer)(out)
    return 0


def cmd_serve_disagg(a) -> int:
    from dataclasses import asdict, replace

    from ..api import serve_disagg
    from ..serving.backends import scheduler_params
    from ..serving.sim import DoesNotFitError

    for name in ("concurrency", "isl", "osl", "prefill_workers", "decode_workers", "prefill_batch"):
        if getattr(a, name) < 1:
            raise InvalidInputError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    _check_prefix(a)
    pe, de = _estimator(a, "prefill"), _estimator(a, "decode")
    layout = {
        "prefill": {"workers": a.prefill_workers, "gpus_per_worker": pe.gpus, "layout": pe.layout_words, **_layout(pe)},
        "decode": {"workers": a.decode_workers, "gpus_per_worker": de.gpus, "layout": de.layout_words, **_layout(de)},
    }
    head = {"model": a.model, "system": a.system, "backend": a.backend, "backend_version": pe.version,
            "gpus": a.prefill_workers * pe.gpus + a.decode_workers * de.gpus, "concurrency": a.concurrency,
            "isl": a.isl, "osl": a.osl, "prefix": a.prefix, **layout}
    for flag in ("front_end_per_stream_ms", "front_end_per_prompt_token_ms"):
        if getattr(a, flag, None) is not None:
            raise InvalidInputError(f"--{flag.replace('_', '-')} sets the engine API server's front end, which a "
                                    "disaggregated deployment does not have: its router's time is --front-end-ms",
                                    "drop the flag (serve uses it for aggregated replicas)")
    cal, cal_notes = _calibration(a, a.concurrency)
    roles = role_overrides(a, {**(cal.overrides() if cal else {}), **_scheduler_overrides(a)})
    unused = sorted({k for r in roles.values() for k in r if k in _API_SERVER_FIELDS})
    if unused:
        cal_notes = cal_notes + [f"{', '.join(unused)} (given) not used: a disaggregated deployment's front end is its "
                                 "router's base time (front_end_ms), not the engine API server's per-stream and "
                                 "per-prompt-token work"]
    pp = replace(scheduler_params(a.backend, pe.data.system, pe.spec), **roles["prefill"])
    pd = replace(scheduler_params(a.backend, de.data.system, de.spec), **roles["decode"])
    try:
        res = serve_disagg(pe, de, concurrency=a.concurrency, isl=a.isl, osl=a.osl, prefill_workers=a.prefill_workers,
                           decode_workers=a.decode_workers, prefill_batch=a.prefill_batch,
                           params_prefill=pp, params_decode=pd, prefix=a.prefix)
    except DoesNotFitError as exc:
        return _emit(a, _misfit(head, exc), "print_misfit")
    from ..serving.energy import disagg_energy, with_scales_note
    from ..serving.intervals import disagg_intervals, intervals_dict

    out = {"fits": True, **res.to_dict(), **head,
           "intervals": intervals_dict(disagg_intervals(pe, de, res, concurrency=a.concurrency, isl=a.isl, osl=a.osl)),
           "energy": with_scales_note(disagg_energy(pe, de, res, a.isl, a.osl, pp, pd, a.prefix), pp, pd),
           "scheduler_prefill": asdict(pp),
           "scheduler_decode": asdict(pd),
           "notes": pe.context_notes(a.isl, a.osl, a.prefix) + res.notes + getattr(a, "engine_notes", []) + cal_notes}
    return _emit(a, out, "print_serving_disagg")


def cmd_search(a) -> int:
    from ..search.pareto import ranked
    from ..search import search_agg, search_backends, search_disagg, search_fixed
    from functools import partial

    from ..report.json_text import Records
    from ..search.run import candidate_dict, iter_candidate_records, search_both, sharing_estimators

    conc = None
    if a.concurrency:
        try:
            conc = [int(x) for x in a.concurrency.split(",") if x.strip()]
        except ValueError:
            raise InvalidInputError(f"--concurrency must be comma-separated integers, got {a.concurrency!r}") from None
    if a.top < 1:
        raise InvalidInputError(f"--top must be >= 1, got {a.top}")
    mode = a.mode or ("fixed" if a.gpus is not None else "agg")
    if mode == "fixed" and a.gpus is None:
        raise InvalidInputError("--mode fixed needs --gpus N: the number of GPUs every deployment uses")
    if mode != "fixed" and a.gpus is not None:
        raise InvalidInputError(f"--gpus fixes the GPU count, which --mode {mode} does not: use --mode fixed, "
                                "or --max-gpus for a budget")
    if mode == "fixed" and a.max_gpus is not None:
        raise InvalidInputError("--mode fixed uses exactly --gpus GPUs: drop --max-gpus")
    if mode == "disagg":
        for flag in _API_SERVER_FIELDS:
            if getattr(a, flag, None) is not None:
                raise InvalidInputError(f"--{flag.replace('_', '-')} sets the engine API server's front end of "
                                        "aggregated replicas; a disaggregated deployment's front end is its router's "
                                        "(--front-end-ms)", "drop the flag, or search --mode agg or both")
    targets = _search_targets(a)
    kw = dict(max_gpus=a.max_gpus, concurrencies=conc, ttft_max_ms=targets["ttft_max_ms"], tpot_max_ms=targets["tpot_max_ms"],
              backend_version=a.backend_version, systems_path=a.systems_path, moe_quant=a.moe_quant,
              gemm_quant=a.gemm_quant, kv_cache_quant=a.kv_cache_quant, attention_quant=a.attention_quant,
              nextn=a.nextn, mtp_acceptance=a.mtp_acceptance, moe_kernel=a.moe_kernel, speculative=speculative_kw(a),
              kv_memory_fraction=a.kv_memory_fraction, database_mode=a.database_mode, cap_concurrency=True,
              prefix=a.prefix)
    _check_prefix(a)
    cal, cal_notes = _calibration(a)
    refuse_unsearched_flags(a, "search")
    _search_scheduler(a, kw, cal, mode)
    cps = _search_cps(a)
    if cps is not None:
        if mode == "fixed":
            raise InvalidInputError("--cp / --cp-list are not searched with --mode fixed", "use --mode agg, disagg or both")
        kw["cps"] = cps
    if a.cp_overlap:
        kw["cp_overlap"] = True
    if mode == "fixed":
        kw.pop("max_gpus")
        kw["gpus"] = a.gpus
    backends = _search_backends(a)
    if a.decode_system is not None:
        if mode != "disagg":
            raise InvalidInputError(f"--decode-system puts disaggregated decode workers on another system: it needs "
                                    f"--mode disagg, not {mode}")
        kw["decode_system"] = a.decode_system
    outs, results, per_backend = {}, {}, {}
    from ..report.progress import RowProgress

    # --mode both: each layout compiled once for both searches; the bar draws without a refresh
    # thread, so that the searches may fork their workers (--jobs)
    with sharing_estimators(), RowProgress(a.progress, command="search", unit="layouts", refresh=False) as bar:
        if mode == "both" and backends is None:
            # one set of worker processes for both searches (search_both): the same results
            roles = {"scheduler_roles": kw["scheduler_roles"]} if "scheduler_roles" in kw else {}
            results.update(search_both(a.model, a.system, a.backend, a.isl, a.osl, jobs=a.jobs, disagg_kw=roles,
                                       progress=lambda done, total: bar.update(
                                           done, total, "aggregated and decode layouts"),
                                       **{k: v for k, v in kw.items() if k != "scheduler_roles"}))
        for m, fn in (("agg", search_agg), ("disagg", search_disagg), ("fixed", search_fixed)):
            if mode in (m, "both") and not (m == "fixed" and mode == "both"):
                mkw = kw if m == "disagg" else {k: v for k, v in kw.items() if k != "scheduler_roles"}
                words = {"agg": "aggregated layouts", "disagg": "decode layouts (disaggregated)",
                         "fixed": "aggregated and decode layouts"}[m]
                mkw = {**mkw, "jobs": a.jobs, "progress": lambda done, total, w=words: bar.update(done, total, w)}
                if m in results:  # searched above
                    res = results[m]
                elif backends is None:
                    res = results[m] = fn(a.model, a.system, a.backend, a.isl, a.osl, **mkw)
                else:
                    res, per_backend[m] = search_backends(fn, a.model, a.system, backends, a.isl, a.osl, **mkw)
                    results[m] = res
                # --all: every candidate's record made as it is written (a search may have a million)
                out = res.to_dict(candidates=a.all, candidate_dicts=Records(
                    len(res.candidates), partial(iter_candidate_records, res)) if a.all else None)
                out["mode"] = m
                out["targets"] = targets
                if cal is not None:
                    out["calibration"] = calibration_summary(cal, cal_notes, res.concurrencies)
                out["top"] = [candidate_dict(c, res) for c in ranked(res.candidates, a.top)]  # distinct layouts
                outs[m] = out
    if a.save_dir:
        from ..report.artifacts import write_search_artifacts

        est_kw = {k: kw[k] for k in ("systems_path", "moe_quant", "gemm_quant", "kv_cache_quant", "attention_quant", "nextn",
                                     "mtp_acceptance", "moe_kernel", "kv_memory_fraction", "database_mode", "cp_overlap",
                                     "speculative") if k in kw}
        if backends is None:
            write_search_artifacts(a.save_dir, results, est_kw)
        else:  # one report per backend (a deployment's launch files are its backend's)
            from pathlib import Path

            for b in {b for per in per_backend.values() for b in per}:
                write_search_artifacts(Path(a.save_dir) / b, {m: per[b] for m, per in per_backend.items() if b in per}, est_kw)
        for out in outs.values():
            out["save_dir"] = str(a.save_dir)
    if mode != "both":
        rc = _emit(a, outs[mode], "print_search")
        _print_calibration_notes(a, outs[mode])
    else:
        bests = {m: o["best"] for m, o in outs.items() if o["best"] is not None}
        outs["best_mode"] = max(bests, key=lambda m: bests[m]["tokens_per_s_per_gpu"]) if bests else None
        if not bests:
            outs["reason"] = "neither mode has a deployment that meets the targets: " + "; ".join(
                f"{m}: {outs[m]['reason']}" for m in ("agg", "disagg"))
        rc = _emit(a, outs, "print_search_both")
        _print_calibration_notes(a, outs.get("agg") or outs.get("disagg") or {})
    if not a.json:
        _print_search_tail(a, results)
    return rc


def _search_cps(a) -> list[int] | None:
    """The context-parallel degrees ``search`` takes from ``--cp`` / ``--cp-list`` (None: neither)."""
    if a.cp is not None and a.cp_list is not None:
        raise InvalidInputError("--cp and --cp-list both given", "give one degree with --cp or several with --cp-list")
    if a.cp is not None:
        return [a.cp]
    if a.cp_list is None:
        return None
    try:
        return [int(x) for x in a.cp_list.split(",") if x.strip()]
    except ValueError:
        raise InvalidInputError(f"--cp-list must be comma-separated integers, got {a.cp_list!r}") from None


def refuse_unsearched_flags(a, command: str) -> None:
    """``search`` / ``recommend`` choose each layout's expert communication themselves (all-to-all
    where the backend's wide-EP tables cover the layout, else gather): a ``--moe-comm`` flag would
    be ignored, so it is refused (an engine configuration's all-to-all backend is one of its
    settings a search does not use, as its layout)."""
    if getattr(a, "moe_comm", None) is not None and "moe_comm" not in getattr(a, "engine_filled", ()):
        raise InvalidInputError(f"--moe-comm {a.moe_comm}: {command} picks each layout's expert communication itself",
                                "all-to-all where the backend's wide-EP tables cover the layout, else gather; "
                                "estimate, serve and serve-disagg take --moe-comm")


def _search_scheduler(a, kw: dict, cal, mode: str) -> None:
    """``search``'s scheduler settings into its keywords ``kw``: both roles' (an engine
    configuration's, a calibration's, the shortcut flags', ``--scheduler``'s) as ``scheduler``,
    and ``--prefill-scheduler`` / ``--decode-scheduler`` as ``scheduler_roles`` of the
    disaggregated search (:func:`.scheduler_args.role_overrides`)."""
    from .scheduler_args import parse_fields

    shared = {**getattr(a, "engine_scheduler", {}), **(cal.overrides() if cal else {}), **_scheduler_overrides(a),
              **parse_fields(a.scheduler)}
    if shared:
        kw["scheduler"] = shared
    own = {role: parse_fields(getattr(a, f"{role}_scheduler"), f"--{role}-scheduler") for role in ("prefill", "decode")}
    if any(own.values()):
        if mode not in ("disagg", "both"):
            given = "--prefill-scheduler" if own["prefill"] else "--decode-scheduler"
            raise InvalidInputError(f"{given} sets the workers of one role of a disaggregated deployment: it needs "
                                    f"--mode disagg or both, not {mode}", "--scheduler sets every worker")
        kw["scheduler_roles"] = own


def _search_backends(a) -> list[str] | None:
    """``--backend auto``: every serving backend with data for ``--system`` (None: one backend)."""
    if a.backend != "auto":
        return None
    from ..data.pack import find_pack
    from ..data.system import load_system
    from ..data.versions import backends_for

    found = backends_for(load_system(find_pack(a.systems_path), a.system))
    if not found:
        raise InvalidInputError(f"--backend auto: no serving backend has data for {a.system}",
                                "list the systems and their backends with: infercast systems")
    return found


def _print_search_tail(a, results: dict) -> None:
    """What ``search`` prints after the tables: per mode, the candidates evaluated and refused
    by kind and reason; the Pareto frontier as a terminal plot; where ``--save-dir`` wrote."""
    import sys

    from ..report.artifacts import text_pareto

    for m, res in results.items():
        ev = ", ".join(f"{n} {kind}{'s' if n != 1 else ''}" for kind, n in res.evaluated.items())
        print(f"{m}: evaluated {ev or 'nothing'}; refused {sum(res.refused.values())}"
              + ("" if not res.refused else ": " + "; ".join(f"{n} {why}" for why, n in
                                                              sorted(res.refused.items(), key=lambda kv: -kv[1]))))
    if any(res.frontier for res in results.values()):  # indented: apart from the tables
        print("\n".join("  " + line for line in text_pareto(results, color=sys.stdout.isatty()).splitlines()))
    if a.save_dir:
        print(f"saved: {a.save_dir}")


def _print_calibration_notes(a, out: dict) -> None:
    """The calibration notes of a search or recommendation on the console (JSON carries them)."""
    if a.json or not out.get("calibration"):
        return
    for n in out["calibration"]["notes"]:
        print(f"note: {n}")


def _calibration(a, concurrency: int | None = None):
    """(the profile of ``--calibration``, its notes) or (None, []): the profile is refused for
    another backend; the notes name it, a model or system other than the calibrated one, and a
    ``concurrency`` outside the calibrated range."""
    if getattr(a, "calibration", None) is None:
        return None, []
    from ..calibrate.profile import check_applies, load_profile

    cal = load_profile(a.calibration)
    notes = check_applies(cal, a.backend, a.model, a.system)
    outside = cal.note_for(concurrency)
    return cal, notes + ([outside] if outside else [])


def calibration_summary(cal, notes: list[str], concurrencies) -> dict:
    """What a search's or recommendation's output says of the profile applied: its values, the
    calibrated concurrency range and the evaluated concurrencies outside it (extrapolated)."""
    lo, hi = cal.concurrency_range
    outside = sorted(int(c) for c in (concurrencies or []) if not lo <= c <= hi)
    if outside:
        notes = notes + [(f"calibration: fitted at concurrency {lo}-{hi}; results at concurrency "
                          f"{', '.join(map(str, outside))} are extrapolated")]
    return {"values": cal.overrides(), "concurrency_range": [lo, hi], "extrapolated_concurrencies": outside,
            "notes": notes}


def _search_targets(a) -> dict:
    """The latency targets of ``search``: ``--ttft-ms`` / ``--tpot-ms``, else the defaults
    (:data:`infercast.search.run.DEFAULT_TTFT_MS`, ``DEFAULT_TPOT_MS``); ``inf`` means no target.
    {"ttft_max_ms", "tpot_max_ms" (None: no target), "ttft_from", "tpot_from" ("default",
    "--ttft-ms" / "--tpot-ms")}."""
    import math

    from ..search.run import DEFAULT_TPOT_MS, DEFAULT_TTFT_MS

    out = {}
    for key, flag, given, default in (("ttft", "--ttft-ms", a.ttft_ms, DEFAULT_TTFT_MS),
                                      ("tpot", "--tpot-ms", a.tpot_ms, DEFAULT_TPOT_MS)):
        if given is None:
            out[f"{key}_max_ms"], out[f"{key}_from"] = default, "default"
            continue
        if math.isnan(given) or given <= 0:
            raise InvalidInputError(f"{flag} must be a positive number of milliseconds, or inf for no target; "
                                    f"got {given:g}")
        out[f"{key}_max_ms"], out[f"{key}_from"] = (None if math.isinf(given) else given), flag
    return out


def _layout(est) -> dict:
    p = est.plan.parallel
    return {"tp": p.tp, "pp": p.pp, "attention_dp": p.attention_dp, "moe_tp": p.etp, "moe_ep": p.ep, "cp": p.cp}


def cmd_calibrate(a) -> int:
    """``infercast calibrate``: fit the deployment's scheduler values to the user's measured runs
    (:mod:`infercast.calibrate`), write the profile (``--out``) and report the residuals."""
    from dataclasses import replace

    from ..calibrate.formats import read_runs
    from ..calibrate.run import agg_predictor, calibrate_runs
    from ..serving.backends import scheduler_params

    if a.calibration is not None:
        raise InvalidInputError("--calibration is not an input of calibrate", "it fits from the backend's defaults; "
                                "--engine-args / --engine-cmd give the deployment's own settings")
    runs = read_runs(a.runs, a.format, a.statistic, a.concurrency)
    if not runs:
        raise InvalidInputError(f"no measured runs in {', '.join(a.runs)}",
                                "rows need a concurrency, isl, osl and a measured TTFT")
    matching = []
    for r in runs:
        row = r.row
        if row is not None and (row.system != a.system or row.backend != a.backend or not _same_model(row.model, a.model)
                                or row.mode != "agg" or row.worker is None
                                or (row.worker.tp, row.worker.pp, row.worker.attention_dp) != (a.tp, a.pp, a.attention_dp)):
            continue  # a silicon CSV holds many deployments: this one's (model, system, backend, layout) rows only
        if r.model and not _same_model(r.model, a.model):
            raise InvalidInputError(f"{r.source} measured model {r.model}, but --model is {a.model}",
                                    "calibrate on runs of the model being estimated")
        if r.mode != "agg":
            raise InvalidInputError(f"{r.source} is a disaggregated run", "calibrate fits aggregated deployments")
        matching.append(r)
    if not matching:
        raise InvalidInputError(f"no run in {', '.join(a.runs)} measured {a.model} on {a.system} ({a.backend}, "
                                f"tp {a.tp} pp {a.pp} attention-dp {a.attention_dp})",
                                "a silicon row is used when its model, system, backend, mode (agg) and layout are the flags'")
    est = _estimator(a)
    base = replace(scheduler_params(a.backend, est.data.system, est.spec), **getattr(a, "engine_scheduler", {}))
    deployment = {"model": a.model, "system": a.system, "backend": a.backend, "backend_version": est.version,
                  "gpus": est.gpus, "layout": est.layout_words, **_layout(est)}
    if a.prior_weight is not None and not (0.0 <= a.prior_weight < float("inf")):
        raise InvalidInputError(f"--prior-weight must be a finite number >= 0, got {a.prior_weight}")
    prof = calibrate_runs(matching, agg_predictor(est, base, matching), base, deployment, gpu=a.gpu_scales, ridge=a.prior_weight)
    if a.out:
        prof.write(a.out)
    out = prof.to_dict()
    if a.out:
        out["written"] = str(a.out)
    if a.json:
        print(json.dumps(out, indent=1, default=str))
        return 0
    _print_calibration(out)
    return 0


def _same_model(measured: str, given: str) -> bool:
    """Whether a run's model name is ``given``: equal, or the same last path component (a served
    model name without its organisation), case-insensitive."""
    m, g = measured.strip().lower(), given.strip().lower()
    return m == g or m.rsplit("/", 1)[-1] == g.rsplit("/", 1)[-1]


def _print_calibration(out: dict) -> None:
    s = out["summary"]
    lo, hi = out["concurrency_range"]

    def pct(x):
        return "-" if x is None else f"{100 * x:.1f}%"

    print(f"calibrated {out['deployment']['model']} on {out['deployment']['system']} ({out['deployment']['backend']}), "
          f"{out['deployment']['layout']}: {s['runs']} runs, concurrency {lo}-{hi}")
    for k, v in out["values"].items():
        print(f"  {k}: {out['defaults'].get(k, float('nan')):.4g} -> {v:.4g}")
    if not out["values"]:
        print("  no value changed: the runs do not support moving any (defaults kept)")
    print(f"  why: {out['evidence'].get('reason', '')}")
    print(f"  TTFT median APE {pct(s['ttft_median_ape_before'])} -> {pct(s['ttft_median_ape_after'])}; "
          f"TPOT median APE {pct(s['tpot_median_ape_before'])} -> {pct(s['tpot_median_ape_after'])} (on the runs fitted)")
    print(f"  {'concurrency':>11} {'isl':>6} {'osl':>6} {'TTFT meas':>10} {'before':>9} {'after':>9} "
          f"{'TPOT meas':>10} {'before':>8} {'after':>8}")
    for r in out["runs"]:
        tp = r["measured_tpot_ms"]
        print(f"  {r['concurrency']:>11} {r['isl']:>6} {r['osl']:>6} {r['measured_ttft_ms']:>10.1f} {r['before_ttft_ms']:>9.1f} "
              f"{r['after_ttft_ms']:>9.1f} {('-' if tp is None else f'{tp:.2f}'):>10} {r['before_tpot_ms']:>8.2f} "
              f"{r['after_tpot_ms']:>8.2f}")
    if out.get("written"):
        print(f"written: {out['written']} (apply with --calibration {out['written']}; results at concurrency outside "
              f"{lo}-{hi} are noted as extrapolated)")
    else:
        print("not written: give --out FILE to keep the profile")


def cmd_systems(a) -> int:
    from ..data.pack import find_pack
    from ..data.system import scan_systems
    from ..data.versions import backends_for, version_info

    pack = find_pack(a.systems_path)
    rows = []
    for name, spec, problem in scan_systems(pack):
        if spec is None:  # a broken system file is listed with what is wrong, not fatal
            rows.append({"system": name, "backend": None, "slots": {}, "collected": [], "error": problem})
            continue
        for be in backends_for(spec):
            info = version_info(pack, spec, be)
            rows.append({"system": name, "backend": be, "slots": info.slots(), "collected": list(info.collected)})
        if not backends_for(spec):
            rows.append({"system": name, "backend": None, "slots": {}, "collected": []})
    if a.json:
        print(json.dumps({"pack": str(pack.systems_dir), "origin": pack.origin, "systems": rows}, indent=1))
        return 0
    from ..report.console import print_systems

    print_systems(pack, rows)
    return 0


def cmd_models(a) -> int:
    from ..data.model_configs import pack_model_ids, resolve_model
    from ..data.pack import find_pack
    from ..models.spec import FAMILIES

    pack = find_pack(a.systems_path)
    out = []
    for mid in pack_model_ids(pack):
        try:
            mc = resolve_model(pack, mid)
        except InfercastError as exc:  # one unreadable config does not end the listing
            out.append({"model": mid, "architecture": None, "supported": False, "error": str(exc)})
            continue
        cfg = mc.config.get("text_config") or mc.config
        arch = (mc.config.get("architectures") or cfg.get("architectures") or ["?"])[0]
        out.append({"model": mid, "architecture": arch, "supported": arch in FAMILIES})
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    from ..report.console import print_models

    print_models(out)
    return 0


def cmd_support(a) -> int:
    from ..data.pack import find_pack
    from ..report.support import print_agreement, print_support, progress_bar, support_csv
    from ..search.support import MODES, Probe, Prober, combos, compare, support_rows

    if a.json and a.csv:
        raise InvalidInputError("--json and --csv both given", "pick one output format")
    modes = [m.strip() for m in (a.mode or ",".join(MODES)).split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise InvalidInputError(f"--mode {a.mode}: not a serving mode", available=MODES)
    for name in ("isl", "osl", "concurrency", "max_gpus", "jobs"):
        if getattr(a, name) is not None and getattr(a, name) < 1:
            raise InvalidInputError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    pack = find_pack(a.systems_path)
    probe = Probe(isl=a.isl, osl=a.osl, concurrency=a.concurrency, max_gpus=a.max_gpus)
    prober = Prober(probe, systems_path=a.systems_path)
    sel = combos(pack, a.model, a.system, a.backend, a.backend_version or ("all" if a.against_pack else None))
    quiet = a.quiet or not sys.stderr.isatty()
    if a.against_pack:
        from ..data.support_matrix import read_matrix

        every = read_matrix(pack)
        if not every:
            raise InvalidInputError(f"--against-pack: the pack at {pack.systems_dir} has no support_matrix/*.csv",
                                    "drop --against-pack to list what infercast answers")
        pairs = {(c.system, c.backend) for c in sel}
        versions = {(c.system, c.backend, c.version) for c in sel}
        models = {c.model for c in sel}
        matrix = [m for m in every if m.mode in modes and (m.system, m.backend) in pairs
                  and (a.model is None or m.model in models)
                  and (a.backend_version is None or (m.system, m.backend, m.version) in versions)]
        if not matrix:
            raise InvalidInputError("the pack's support matrix has no row for the filters",
                                    "its rows are of the systems", sorted({m.system for m in every}))
        with progress_bar("support vs the pack's matrix", enabled=not quiet) as progress:
            agreement = compare(prober, matrix, jobs=a.jobs, ray=a.ray, progress=progress)
        rows = [r for _, r in agreement.pairs]
        status = [m.status for m, _ in agreement.pairs]
        if a.json:
            print(json.dumps({"probe": probe.__dict__, "summary": agreement.summary(),
                              "rows": [{**r.to_dict(), "pack_status": st, "pack_error": m.error or None}
                                       for (m, r), st in zip(agreement.pairs, status)]}, indent=1))
        elif a.csv:
            sys.stdout.write(support_csv(rows, extra={"pack_status": status}))
        else:
            print_agreement(agreement, by=("architecture", "system", "backend", "version"))
        return 0
    with progress_bar("support", enabled=not quiet) as progress:
        rows = support_rows(prober, sel, modes, jobs=a.jobs, ray=a.ray, progress=progress)
    if a.json:
        print(json.dumps({"probe": probe.__dict__, "rows": [r.to_dict() for r in rows]}, indent=1))
    elif a.csv:
        sys.stdout.write(support_csv(rows))
    else:
        print_support(rows)
    return 0


def cmd_data_fetch(a) -> int:
    from ..data.fetch import fetch_pack
    from ..data.pack import cache_dir

    r = fetch_pack(Path(a.dest) if a.dest else None, Path(a.wheel) if a.wheel else None)
    print(f"pack data from {r.wheel} ({r.files} files) {'replaced the earlier pack' if r.replaced else 'extracted'} "
          f"in {r.dest}")
    if r.dest != cache_dir().expanduser().resolve():
        print(f"read it with --systems-path {r.systems_dir}")
    return 0


def cmd_validate(a) -> int:
    from ..validate.cli import run_validate

    return run_validate(a)


class _VersionAction(argparse.Action):
    """``--version``: the version looked up only when asked (:mod:`importlib.metadata` is ~15 ms
    of imports every command would otherwise pay)."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"infercast {_version()}")
        parser.exit()


def _version() -> str:
    """The installed distribution's version (the package's own when it runs from a source tree)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("infercast")
    except PackageNotFoundError:
        from .. import __version__

        return __version__


def cmd_compile(a) -> int:
    """Tabulate the configuration's latency surfaces and write them (docs/surface-format.md)."""
    from ..engine.surface import DEFAULT_TOL

    if a.tolerance is not None and not (0.0 < a.tolerance < 0.1):
        raise InvalidInputError(f"--tolerance {a.tolerance} is out of range", "give a relative error in (0, 0.1), e.g. 1e-4")
    out = Path(a.out)
    if not out.parent.exists():
        raise InvalidInputError(f"--out {a.out}: no such directory {out.parent}", "create it first or pick another path")
    est = _estimator(a)
    surf = est.surface(a.tolerance if a.tolerance is not None else DEFAULT_TOL)
    surf.write(out)
    info = {"out": str(out), "identity": surf.identity, "numbers": surf.size(), "tolerance": surf.tol,
            "curves": {k: len(c.x) for k, c in surf.curves.items()},
            "sheets": {k: [list(t.ends[0]), list(t.ends[1])] for k, t in surf.sheets.items()}}
    if a.json:
        print(json.dumps(info, indent=1))
    else:
        print(f"wrote {out}: {surf.size():,} numbers, {len(surf.curves)} curves, {len(surf.sheets)} sheets, "
              f"tolerance {surf.tol:g} against the op-by-op path")

#: ``--jobs`` of search and recommend (infercast.search.parallel)
SEARCH_JOBS_HELP = ("evaluate the layouts on N processes, this one and N - 1 forked from it (default: the CPUs this "
                    "process may use, at most 4; 1: in this process; the same answer with any N; Linux)")
#: ``--prefix`` of serve, serve-disagg, search and recommend (``estimate`` has its own wording)
PREFIX_HELP = ("cached prompt tokens every request starts with (a shared prefix, e.g. a system prompt, kept warm in "
               "the engine's prefix cache): attended to, not prefilled, held once per rank; --isl counts the new "
               "tokens after it (default 0)")

#: the layout flags of :func:`_add_parallel_args` and their defaults
_LAYOUT_DEFAULTS = {"tp": 1, "pp": 1, "attention_dp": 1, "moe_tp": None, "moe_ep": None, "cp": 1}


def _refuse_unused_layout_flags(a, disagg: bool) -> None:
    """``simulate`` takes both the replica's layout flags (``--tp`` ... ``--cp``) and the
    disaggregated workers' (``--prefill-*`` / ``--decode-*``), but runs one of the two: a flag of
    the other set, set away from its default, would be ignored, so it is refused."""
    prefixes = ("",) if disagg else ("prefill_", "decode_")
    for pre in prefixes:
        for k, default in _LAYOUT_DEFAULTS.items():
            if getattr(a, pre + k, default) != default:
                flag = "--" + (pre + k).replace("_", "-")
                if disagg:
                    raise InvalidInputError(f"{flag} sets the replica layout, which a disaggregated simulation "
                                            "(--prefill-workers / --decode-workers) does not use",
                                            f"give each role's layout: --prefill-{k.replace('_', '-')} / "
                                            f"--decode-{k.replace('_', '-')}")
                raise InvalidInputError(f"{flag} sets a disaggregated worker's layout, but this simulation runs "
                                        "--replicas of one layout",
                                        f"add --prefill-workers and --decode-workers, or use --{k.replace('_', '-')}")


def _refuse_unused_load_flags(a) -> None:
    """Flags of one kind of ``simulate`` load given with another, which would not read them."""
    open_loop = a.request_rate is not None or a.rate_schedule is not None
    if a.burstiness != 1.0 and not open_loop:
        raise InvalidInputError("--burstiness shapes open-loop arrivals: give it with --request-rate or --rate-schedule")
    if a.duration_s is not None and not open_loop:
        raise InvalidInputError("--duration-s is how long open-loop arrivals last: give it with --request-rate or "
                                "--rate-schedule (a closed loop runs --num-requests, a trace its own length)")
    if a.time_scale != 1.0 and a.trace is None:
        raise InvalidInputError("--time-scale speeds a trace up or down: give it with --trace")
    if a.block_tokens is not None and a.trace is None and not a.prefix:
        raise InvalidInputError("--block-tokens is the tokens per prefix-hash block of a trace or of a shared --prefix: "
                                "give it with --trace or --prefix")
    if a.prefix and a.trace is not None:
        raise InvalidInputError("--prefix gives a synthetic load a shared prompt prefix; a trace's prefixes are its hashes")
    _check_prefix(a)


def _client_start(a) -> tuple[str, float | None]:
    """(``--client-start``, its ramp-up in ms from ``--ramp-up-s``: None for one expected request
    cycle, resolved by the simulation)."""
    import math

    if a.concurrency is None and (a.client_start != "auto" or a.ramp_up_s is not None):
        raise InvalidInputError("--client-start / --ramp-up-s set how closed-loop clients start; they need --concurrency")
    if a.ramp_up_s is None:
        return a.client_start, None
    if a.client_start not in ("staggered", "wave-then-staggered"):
        raise InvalidInputError("--ramp-up-s spreads the clients over the cycle: give it with --client-start staggered "
                                "or wave-then-staggered", f"got --client-start {a.client_start}")
    if not (math.isfinite(a.ramp_up_s) and a.ramp_up_s >= 0):
        raise InvalidInputError(f"--ramp-up-s must be a duration >= 0 (seconds), got {a.ramp_up_s}")
    return a.client_start, 1e3 * a.ramp_up_s


def cmd_simulate(a) -> int:
    """``infercast simulate``: a request-level simulation of ``--replicas`` replicas under a load."""
    import math
    from dataclasses import replace

    from ..serving.backends import scheduler_params
    from ..serving.simulate import read_trace, simulate_estimator, write_out
    from ..serving.simulate.load import synthetic

    loads = [x for x in ("request_rate", "rate_schedule", "concurrency", "trace") if getattr(a, x) is not None]
    if len(loads) != 1:
        raise InvalidInputError("give exactly one load: --request-rate R, --rate-schedule T:R,..., --concurrency C or "
                                "--trace FILE",
                                f"got {', '.join('--' + x.replace('_', '-') for x in loads) or 'none'}")
    for name in ("replicas", "num_requests", "concurrency", "isl", "osl", "step_quantum"):
        v = getattr(a, name)
        if v is not None and v < 1:
            raise InvalidInputError(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    for name in ("ttft_ms", "tpot_ms", "duration_s"):
        v = getattr(a, name)
        if v is not None and not (math.isfinite(v) and v > 0):
            raise InvalidInputError(f"--{name.replace('_', '-')} must be a positive number, got {v}")
    if a.block_tokens is not None and a.block_tokens < 1:
        raise InvalidInputError(f"--block-tokens must be >= 1, got {a.block_tokens}")
    _refuse_unused_load_flags(a)
    client_start, ramp_up_ms = _client_start(a)
    if a.trace is not None:
        w = read_trace(a.trace, a.time_scale, a.block_tokens)
        if a.num_requests is not None and a.num_requests < len(w):
            w = type(w)(w.isl[:a.num_requests], w.osl[:a.num_requests], w.sent_ms[:a.num_requests],
                        hashes=None if w.hashes is None else w.hashes[:a.num_requests], block_tokens=w.block_tokens,
                        description=w.description + f", first {a.num_requests} replayed")
    else:
        lengths = read_trace(a.lengths_from) if a.lengths_from else None
        ratio = 1.0 if a.random_range_ratio is None else a.random_range_ratio
        sent, load = None, ""
        if a.rate_schedule is not None:
            import numpy as np

            from ..serving.simulate.load import (
                parse_rate_schedule,
                scheduled_arrival_times,
            )

            sched = parse_rate_schedule(a.rate_schedule)
            sent = scheduled_arrival_times(sched, a.duration_s or 600.0, a.burstiness, np.random.default_rng(a.seed + 1))
            if a.num_requests is not None:
                sent = sent[:a.num_requests]
            load = f"arrivals at the rate schedule {a.rate_schedule} (req/s from each second) over {a.duration_s or 600:g} s"
        if sent is not None:
            n = len(sent)
        elif a.num_requests is not None:
            n = a.num_requests
        elif a.request_rate is not None:
            if not (a.request_rate > 0 and math.isfinite(a.request_rate)):
                raise InvalidInputError("--request-rate must be a positive number of requests per second",
                                        f"got {a.request_rate}")
            n = round(a.request_rate * (a.duration_s or 600.0))
        else:
            n = 10 * a.concurrency
        w = synthetic(n, isl=a.isl, osl=a.osl, range_ratio=ratio, lengths_from=lengths, rate=a.request_rate,
                      burstiness=a.burstiness, clients=a.concurrency or 0, seed=a.seed, sent_ms=sent, load=load,
                      client_start=client_start, ramp_up_ms=ramp_up_ms, prefix=a.prefix,
                      **({"block_tokens": a.block_tokens} if a.block_tokens else {}))
    # the engine configuration's scheduler settings, then a calibration profile's, under the flags
    # given (as serve and serve-disagg take them)
    cal, cal_notes = _calibration(a, a.concurrency)
    overrides = {**getattr(a, "engine_scheduler", {}), **(cal.overrides() if cal else {}), **_scheduler_overrides(a),
                 **_scheduler_fields(getattr(a, "scheduler", None) or [])}
    progress = sys.stderr.isatty() and len(w) >= 20000
    _refuse_unused_layout_flags(a, disagg=a.prefill_workers is not None or a.decode_workers is not None)
    if a.prefill_workers is not None or a.decode_workers is not None:
        from ..serving.simulate import simulate_estimator_disagg

        if not (a.prefill_workers and a.decode_workers and a.prefill_workers >= 1 and a.decode_workers >= 1):
            raise InvalidInputError("a disaggregated simulation needs --prefill-workers and --decode-workers, both >= 1",
                                    f"got {a.prefill_workers} and {a.decode_workers}")
        pe, de = _estimator(a, "prefill"), _estimator(a, "decode")
        pp = replace(scheduler_params(a.backend, pe.data.system, pe.spec), **overrides)
        pd = replace(scheduler_params(a.backend, de.data.system, de.spec), **overrides)
        per_unit = (a.concurrency or 1) / (a.decode_workers * de.plan.parallel.attention_dp)
        res = simulate_estimator_disagg(pe, de, pp, pd, w, prefill_workers=a.prefill_workers,
                                        decode_workers=a.decode_workers, router=a.router,
                                        prefix_cache=not a.no_prefix_cache, warmup=a.warmup, cooldown=a.cooldown,
                                        ttft_ms=a.ttft_ms, tpot_ms=a.tpot_ms, progress=progress, quantum=a.step_quantum,
                                        expected_running=max(1.0, per_unit), front_end_spread=a.front_end_spread,
                                        seed=a.seed)
        est, gpus = pe, a.prefill_workers * pe.gpus + a.decode_workers * de.gpus
        where = f"{a.prefill_workers} prefill x {pe.gpus} + {a.decode_workers} decode x {de.gpus}"
    else:
        est = _estimator(a)
        params = replace(scheduler_params(a.backend, est.data.system, est.spec), **overrides)
        per_unit = (a.concurrency or 1) / (a.replicas * est.plan.parallel.attention_dp)
        res, _ = simulate_estimator(est, params, w, replicas=a.replicas, router=a.router,
                                    prefix_cache=not a.no_prefix_cache, warmup=a.warmup, cooldown=a.cooldown,
                                    ttft_ms=a.ttft_ms, tpot_ms=a.tpot_ms, progress=progress, quantum=a.step_quantum,
                                    expected_running=max(1.0, per_unit), front_end_spread=a.front_end_spread,
                                    seed=a.seed)
        gpus, where = a.replicas * est.gpus, f"{a.replicas} x {est.gpus}"
    res.notes.insert(0, w.description)
    res.notes.extend(getattr(a, "engine_notes", []) + cal_notes)
    if a.out:
        write_out(res, a.out)
    if a.plot:
        from ..serving.simulate.report import plot_cdf

        plot_cdf(res, a.plot)
    if a.report:
        from ..report.simulate_html import write_report

        write_report(res, a.report, f"infercast simulate: {a.model} on {where} {a.system} GPUs ({a.backend} "
                                    f"{est.version}), {a.router} routing")
    if a.json:
        out = {**res.to_dict(), "model": a.model, "system": a.system, "backend": a.backend,
               "backend_version": est.version, "replicas": a.replicas, "gpus": gpus, "router": a.router,
               "disaggregated": a.prefill_workers is not None}
        print(json.dumps(out, indent=1, default=float))
        return 0
    from ..serving.simulate.report import print_result

    print_result(res, f"{a.model} on {where} {a.system} GPUs ({a.backend} {est.version}), "
                      f"{a.router} routing")
    return 0


def _add_role_settings(p, engine_files: bool = True) -> None:
    """The scheduler flags of a command with prefill and decode workers: the shortcut flags and
    ``--scheduler`` for both roles, ``--prefill-scheduler`` / ``--decode-scheduler`` for one, and
    (``engine_files``) ``--prefill-engine-args`` / ``--decode-engine-args`` (:mod:`.scheduler_args`)."""
    add_shortcut_flags(p, SCHEDULER_FLAGS, " (prefill and decode workers)")
    add_scheduler_flags(p, roles=True)
    if engine_files:
        from .engine_config import add_role_engine_args

        add_role_engine_args(p)
        for r in ("prefill", "decode"):  # the model settings a role's engine may set apart from the other's
            p.add_argument(f"--{r}-kv-cache-quant", default=None, help=f"as --kv-cache-quant, for the {r} workers only")
            p.add_argument(f"--{r}-kv-memory-fraction", type=float, default=None,
                           help=f"as --kv-memory-fraction, for the {r} workers only")
            p.add_argument(f"--{r}-moe-kernel", default=None, help=f"as --moe-kernel, for the {r} workers only")
            p.add_argument(f"--{r}-moe-comm", choices=("gather", "alltoall"), default=None,
                           help=f"as --moe-comm, for the {r} workers only")


#: the subcommands :func:`build_parser` adds (checked against it by the tests)
COMMANDS = ("estimate", "serve", "serve-disagg", "search", "compile", "calibrate", "systems", "models", "support", "data",
            "validate", "simulate", "recommend", "exp")


class _Unbuilt:
    """The parser of a subcommand the command line did not name (:func:`build_parser`'s ``only``):
    whatever is asked of it is accepted and nothing is built."""

    _actions: tuple = ()  # (what a builder that adjusts its arguments walks)

    def __getattr__(self, name):
        return lambda *a, **k: self


class _OnlyCommand:
    """``argparse``'s subparsers action, building only the subcommand ``only`` (None: every one)."""

    def __init__(self, sub, only: str | None):
        self._sub, self._only = sub, only

    def add_parser(self, name, **kw):
        return self._sub.add_parser(name, **kw) if self._only in (None, name) else _Unbuilt()

    def __getattr__(self, name):
        return getattr(self._sub, name)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; ``only``: build that subcommand's arguments alone (a command
    line naming it needs no other: building all of them is ~15 ms of the command's start)."""
    p = argparse.ArgumentParser(prog="infercast", description="Predict LLM serving performance on GPUs from measured per-operator tables.")
    p.add_argument("--version", action=_VersionAction, nargs=0, help="print the version and exit")
    sub = _OnlyCommand(p.add_subparsers(dest="command", required=True), only)

    e = sub.add_parser("estimate", help="static estimate: TTFT, TPOT, throughput, memory for one configuration",
                       description="Static estimate of one batch: TTFT, TPOT, throughput and memory of one "
                                   f"configuration. {LAYOUT_HELP} {FITS_HELP}")
    _add_model_args(e)
    e.add_argument("--batch", type=int, default=1, help="concurrent requests in the batch")
    e.add_argument("--isl", type=int, required=True, help="input sequence length (new tokens per request)")
    e.add_argument("--osl", type=int, required=True, help="output sequence length")
    e.add_argument("--prefix", type=int, default=0, help="cached prefix tokens per request")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.add_argument("--explain", action="store_true", help="show each op's data source and provenance")
    e.add_argument("--plan-out", help="write the compiled op plan (JSON) to this file")
    e.set_defaults(func=cmd_estimate)

    sv = sub.add_parser("serve", help="serving model: what a closed-loop benchmark at a concurrency measures (aggregated)",
                        description="What a closed-loop benchmark of --concurrency clients measures on one "
                                    f"aggregated replica. {LAYOUT_HELP} {FITS_HELP}")
    _add_model_args(sv)
    sv.add_argument("--concurrency", type=int, required=True, help="closed-loop clients (over the replica's attention-DP ranks)")
    sv.add_argument("--isl", type=int, required=True, help="input sequence length (prompt tokens per request)")
    sv.add_argument("--osl", type=int, required=True, help="output sequence length (tokens generated per request)")
    sv.add_argument("--prefix", type=int, default=0, help=PREFIX_HELP)
    sv.add_argument("--json", action="store_true", help="print one JSON object")
    add_shortcut_flags(sv, SCHEDULER_FLAGS)
    sv.add_argument("--prefill-scheduling", choices=("mixed", "prefill-first"), default=None,
                    help="mixed: prefill chunks share steps with decodes (vLLM, TensorRT-LLM, SGLang with "
                         "--enable-mixed-chunk); prefill-first: prompts get their own steps and decoding pauses "
                         "(SGLang's default; clients stay in lock-step waves). Default: the backend's")
    sv.add_argument("--random-lengths", action="store_true",
                    help="the benchmark draws each request's lengths at random (e.g. --random-range-ratio 0.8): "
                         "its clients drift apart, so a prefill-first engine keeps no lock-step waves")
    sv.add_argument("--random-range-ratio", type=float, default=None, metavar="R",
                    help="the benchmark draws each request's input and output lengths uniformly from [R x L, L] "
                         "(benchmark_serving's --random-range-ratio): implies --random-lengths, and the KV cache "
                         "holds the mean lengths' tokens, (1 + R) / 2 of the nominal ones")
    add_scheduler_flags(sv, roles=False)
    sv.set_defaults(func=cmd_serve)

    sd = sub.add_parser("serve-disagg", help="serving model, disaggregated: prefill workers x decode workers under a "
                                            "closed-loop benchmark",
                        description="What a closed-loop benchmark measures on prefill workers x decode workers; "
                                    "each pool has its own layout flags (--prefill-tp ..., --decode-tp ...). "
                                    f"{LAYOUT_HELP} {FITS_HELP}")
    _add_model_args(sd, parallel=False)
    sd.add_argument("--prefill-workers", type=int, required=True, help="prefill workers (replicas of the prefill layout)")
    _add_parallel_args(sd, "prefill", " of a prefill worker")
    sd.add_argument("--prefill-batch", type=int, default=1, help="prompts per prefill step at least (default 1; under "
                                                                   "load a prefill rank batches what arrived, up to its token budget)")
    sd.add_argument("--decode-workers", type=int, required=True, help="decode workers (replicas of the decode layout)")
    _add_parallel_args(sd, "decode", " of a decode worker")
    sd.add_argument("--concurrency", type=int, required=True, help="closed-loop clients of the whole deployment")
    sd.add_argument("--isl", type=int, required=True, help="input sequence length (prompt tokens per request)")
    sd.add_argument("--osl", type=int, required=True, help="output sequence length (tokens generated per request)")
    sd.add_argument("--prefix", type=int, default=0, help=PREFIX_HELP)
    sd.add_argument("--json", action="store_true", help="print one JSON object")
    _add_role_settings(sd)
    sd.set_defaults(func=cmd_serve_disagg)

    se = sub.add_parser("search", help="search deployments (layouts x concurrency; agg, disagg or a fixed GPU count) under latency targets",
                        description="Search deployments (layouts x concurrency) under latency targets (default: "
                                    "mean TTFT <= 2000 ms and mean TPOT <= 30 ms; --ttft-ms / --tpot-ms inf for none). "
                                    f"{LAYOUT_HELP} A search where nothing fits or meets the targets is an answer "
                                    "(exit code 0; JSON best null with the reason).")
    _add_model_args(se, parallel=False)
    se.add_argument("--isl", type=int, required=True, help="input sequence length (prompt tokens per request)")
    se.add_argument("--osl", type=int, required=True, help="output sequence length (tokens generated per request)")
    se.add_argument("--prefix", type=int, default=0, help=PREFIX_HELP)
    se.add_argument("--mode", choices=("agg", "disagg", "both", "fixed"), default=None,
                    help="aggregated replicas, disaggregated prefill/decode workers, both, or every deployment of "
                         "exactly --gpus GPUs (default agg; fixed with --gpus)")
    se.add_argument("--max-gpus", type=int, default=None,
                    help="GPUs at most: per replica (agg, default one node) or in all (disagg, default two nodes)")
    se.add_argument("--gpus", type=int, default=None,
                    help="exactly this many GPUs: agg replicas and disagg splits that use them all (--mode fixed)")
    se.add_argument("--ttft-ms", type=float, default=None,
                    help="target: mean TTFT at most this (ms; default 2000; inf: no TTFT target)")
    se.add_argument("--tpot-ms", type=float, default=None,
                    help="target: mean TPOT at most this (ms; default 30; inf: no TPOT target)")
    se.add_argument("--concurrency", default=None,
                    help="comma-separated clients per replica (agg) or of the whole deployment (disagg, fixed); "
                         "default 1, 2, 4, ..., 1024, up to the most requests a searched deployment runs at once "
                         "(more is refused: the clients would only queue)")
    se.add_argument("--top", type=int, default=5,
                    help="how many distinct deployments that meet the targets to list, each layout once at its best "
                         "concurrency (default 5; --save-dir writes launch files for the first 3)")
    se.add_argument("--all", action="store_true", help="JSON: include every evaluated candidate")
    se.add_argument("--cp", type=int, default=None,
                    help="context-parallel ranks of every layout searched (agg; disagg: of the prefill workers); default 1")
    se.add_argument("--cp-list", default=None,
                    help="comma-separated context-parallel degrees to search over, e.g. 1,2,4 (agg layouts; disagg: "
                         "the prefill workers, decode workers at 1)")
    for act in se._actions:  # search also takes every backend at once
        if act.dest == "backend":
            act.choices = [*act.choices, "auto"]
            act.help = (act.help or "") + "; auto: every backend with data for the system, ranked together"
    se.add_argument("--decode-system", default=None,
                    help="disagg: run the decode workers on this system (the prefill workers on --system); the KV "
                         "cache moves over the slower of the two systems' node-to-node links")
    se.add_argument("--save-dir", default=None,
                    help="write the search's results (CSV, JSON), Pareto plot, HTML report and the top deployments' "
                         "launch and benchmark files here (created if missing)")
    se.add_argument("--jobs", type=int, default=None, metavar="N", help=SEARCH_JOBS_HELP)
    _add_progress_args(se)
    se.add_argument("--json", action="store_true", help="print one JSON object")
    _add_role_settings(se, engine_files=False)
    se.set_defaults(func=cmd_search)

    co = sub.add_parser("compile", help="tabulate one configuration's latency surfaces into a file (Arrow IPC) a simulator can evaluate")
    _add_model_args(co)
    co.add_argument("--out", required=True, help="the file to write (Arrow IPC; format in docs/surface-format.md)")
    co.add_argument("--tolerance", type=float, default=None, help="relative error allowed against the op-by-op path (default 2.5e-4)")
    co.add_argument("--json", action="store_true", help="print a JSON summary")
    co.set_defaults(func=cmd_compile)

    ca = sub.add_parser("calibrate", help="fit the scheduler's host-side values (and, if the runs support it, GPU-time "
                                          "scales) to your own measured runs; write a profile for --calibration",
                        description="Reads measured closed-loop runs of ONE aggregated deployment -- AIPerf's "
                                    "profile_export_aiperf.json / .csv, `vllm bench serve --save-result` JSON, or a CSV in "
                                    "the silicon schema -- and fits the front-end time per request, per open stream and "
                                    "per prompt token and the per-step overhead; GPU-time scales per phase (0.7-1.5x) "
                                    "only where leaving runs out shows they help. The deployment is given as for "
                                    f"`serve` (flags or --engine-args / --engine-cmd). {LAYOUT_HELP} See docs/calibrate.md.")
    _add_model_args(ca)
    ca.add_argument("runs", nargs="+", metavar="FILE", help="measured-run files (one run per AIPerf / vllm file; one per "
                                                            "row of a silicon CSV)")
    ca.add_argument("--format", default=None, help="aiperf-json, aiperf-csv, vllm-json or silicon-csv (default: detected)")
    ca.add_argument("--statistic", default="mean", help="which summary to fit: mean (default), median or p99")
    ca.add_argument("--concurrency", type=int, default=None,
                    help="the runs' concurrency where a file does not say it (AIPerf CSV), or to override it")
    ca.add_argument("--gpu-scales", default="auto", choices=["auto", "on", "off"],
                    help="fit GPU-time scales per phase: auto (only when leaving runs out shows they help), on, off")
    ca.add_argument("--prior-weight", type=float, default=None,
                    help="weight of the pull toward the defaults, per unit step of a field squared, against squared log "
                         "errors (default 0.01: runs scatter ~10%%; 0 for runs without noise)")
    ca.add_argument("--out", default=None, help="write the calibration profile (YAML) here")
    ca.add_argument("--json", action="store_true", help="print the profile as one JSON object")
    ca.set_defaults(func=cmd_calibrate)

    s = sub.add_parser("systems", help="list systems, backends and data versions in the pack")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    _add_data_args(s)
    s.set_defaults(func=cmd_systems)

    m = sub.add_parser("models", help="list model ids in the pack and whether their family is supported")
    m.add_argument("--json", action="store_true", help="print a JSON list")
    _add_data_args(m)
    m.set_defaults(func=cmd_models)

    from .workflow import add_executor_args

    su = sub.add_parser("support", help="which model x system x backend x version x mode infercast answers, and why not")
    su.add_argument("--model", default=None, help="model id(s), comma-separated (default: every model_config in the pack)")
    su.add_argument("--system", default=None, help="system(s), comma-separated (default: every system with data)")
    su.add_argument("--backend", default=None, help="backend(s): trtllm, vllm, sglang, comma-separated (default: all)")
    su.add_argument("--backend-version", default=None,
                    help="data version(s) or slots current/previous/next, comma-separated, or all (default: the slots)")
    su.add_argument("--mode", default=None, help="agg, disagg or agg,disagg (default: both)")
    su.add_argument("--isl", type=int, default=256, help="the representative request's input length (default 256)")
    su.add_argument("--osl", type=int, default=256, help="its output length (default 256)")
    su.add_argument("--concurrency", type=int, default=8, help="closed-loop clients of the probe (default 8)")
    su.add_argument("--max-gpus", type=int, default=128,
                    help="GPU budget of the smallest layout that holds the model (default 128, as the pack's matrix)")
    su.add_argument("--against-pack", action="store_true",
                    help="probe the pack's own support_matrix rows (each with its GPU budget) and report agreement")
    add_executor_args(su, "the (system, backend) groups")
    su.add_argument("--csv", action="store_true", help="print CSV")
    su.add_argument("--json", action="store_true", help="print one JSON object")
    su.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    _add_data_args(su)
    su.set_defaults(func=cmd_support)

    d = sub.add_parser("data", help="manage the perf-data pack")
    dsub = d.add_subparsers(dest="data_command", required=True)
    f = dsub.add_parser("fetch", help="download the aiconfigurator-core wheel with pip and extract only its data into the user cache",
                        description="Extract only the data of the aiconfigurator-core wheel into a directory. Files are "
                                    "unpacked beside it and moved into place when complete: a non-empty directory "
                                    "that is not an earlier infercast pack is refused, an earlier pack is replaced.")
    f.add_argument("--dest", metavar="DIR", help="target directory: new, empty, or an earlier pack this command wrote (default: the user cache)")
    f.add_argument("--wheel", metavar="FILE", help="use this local aiconfigurator-core .whl file (the version infercast reads) instead of "
                                                   "`pip download` (e.g. behind a proxy or offline)")
    f.set_defaults(func=cmd_data_fetch)

    v = sub.add_parser("validate", help="predict measured silicon rows and report the error")
    v.add_argument("--silicon", help="CSV of measurements (default: the pack's silicon_sample.csv)")
    v.add_argument("--ids", help="file of row ids to use (one per line)")
    v.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    v.add_argument("--out", help="directory for per-row CSV and Markdown/HTML reports")
    v.add_argument("--static", action="store_true", help="use the static (single batch) model instead of the serving model")
    v.add_argument("--by", action="append", metavar="ATTR[+ATTR...]",
                   help="break the statistics down by this row attribute, or by a combination joined with + "
                        "(e.g. backend+system); repeatable (default: mode, backend, system, model)")
    v.add_argument("--database-mode", default="SILICON", metavar="MODE",
                   help="where op latencies come from: SILICON (default; the measured tables, and a row "
                        "whose ops they do not cover is not predicted), HYBRID (the tables, else speed of light "
                        "with the family's learned utilisation), EMPIRICAL (speed of light with learned "
                        "utilisation everywhere) or SOL (speed of light only)")
    v.add_argument("--worst", type=int, default=10, metavar="N", help="list the N rows with the largest TTFT error (default 10; 0: none)")
    _add_progress_args(v)
    _add_data_args(v)
    v.set_defaults(func=cmd_validate)

    from .workflow import add_parsers

    add_parsers(sub, _add_model_args)

    sm = sub.add_parser("simulate", help="request-level simulation of replicas under a load: request rate, closed-loop "
                                         "clients or a trace; prefix caching, routing, goodput")
    _add_model_args(sm)
    sm.add_argument("--replicas", type=int, default=1, help="replicas of the layout (default 1)")
    sm.add_argument("--prefill-workers", type=int, default=None,
                    help="disaggregated: prefill workers of the --prefill-* layout (with --decode-workers)")
    sm.add_argument("--decode-workers", type=int, default=None, help="disaggregated: decode workers of the --decode-* layout")
    _add_parallel_args(sm, "prefill", " (disaggregated prefill worker)")
    _add_parallel_args(sm, "decode", " (disaggregated decode worker)")
    sm.add_argument("--request-rate", type=float, default=None, metavar="R", help="open loop: requests per second")
    sm.add_argument("--rate-schedule", default=None, metavar="T:R,...",
                    help="open loop at a rate that changes over time: from each T seconds, R requests/s "
                         "(e.g. 0:5,600:10,1200:5); with --duration-s")
    sm.add_argument("--burstiness", type=float, default=1.0,
                    help="shape of the gamma inter-arrival times (1: Poisson; < 1 burstier)")
    sm.add_argument("--concurrency", type=int, default=None, metavar="C", help="closed loop: C clients in all")
    sm.add_argument("--client-start", choices=("auto", "together", "staggered", "wave-then-staggered"), default="auto",
                    help="closed loop: together (every client's first request at time 0, as benchmark clients "
                         "start), staggered (first requests spread evenly over --ramp-up-s), wave-then-staggered "
                         "(together, then each client waits once after its first request so that the second ones "
                         "spread over --ramp-up-s), or auto (default: wave-then-staggered for requests of one length "
                         "on an engine that mixes prefill into decode steps, whose real runs de-phase, else together)")
    sm.add_argument("--ramp-up-s", type=float, default=None, metavar="S",
                    help="with --client-start staggered / wave-then-staggered: the spread in seconds (default: one "
                         "expected request cycle)")
    sm.add_argument("--prefix", type=int, default=0, metavar="P",
                    help="synthetic load: every prompt starts with the same P tokens (a shared system prompt; the "
                         "prefix caches hold it after the first request), --isl new tokens after it (default 0); "
                         "its blocks are --block-tokens long (default 16)")
    sm.add_argument("--trace", default=None, metavar="FILE",
                    help="replay a trace: Mooncake JSONL, Azure LLM-inference CSV, or infercast CSV/JSONL")
    sm.add_argument("--time-scale", type=float, default=1.0,
                    help="multiply the trace's times by this (0.5: twice as fast; default 1)")
    sm.add_argument("--block-tokens", type=int, default=None,
                    help="tokens per prefix-hash block of the trace (default 512, as Mooncake's traces)")
    sm.add_argument("--num-requests", type=int, default=None,
                    help="requests to send (default: rate x duration, 10 per client, or the whole trace)")
    sm.add_argument("--duration-s", type=float, default=None, help="open loop: seconds of arrivals (default 600)")
    sm.add_argument("--isl", type=int, default=None, help="input length (synthetic load)")
    sm.add_argument("--osl", type=int, default=None, help="output length (synthetic load)")
    sm.add_argument("--random-range-ratio", type=float, default=None, metavar="R",
                    help="draw each length uniformly from [R x L, L] as benchmark clients do (default: fixed)")
    sm.add_argument("--lengths-from", default=None, metavar="TRACE", help="draw (input, output) lengths from a trace")
    sm.add_argument("--router", choices=("round-robin", "least-outstanding", "prefix-aware"), default="round-robin",
                    help="how requests are spread over replicas (default round-robin)")
    sm.add_argument("--no-prefix-cache", action="store_true", help="turn the prefix cache off")
    sm.add_argument("--ttft-ms", type=float, default=None, help="goodput target: TTFT at most this (ms)")
    sm.add_argument("--tpot-ms", type=float, default=None, help="goodput target: TPOT at most this (ms)")
    sm.add_argument("--warmup", type=float, default=0.1, help="share of the run left out at the start (default 0.1)")
    sm.add_argument("--cooldown", type=float, default=0.1, help="share of the run left out at the end (default 0.1)")
    sm.add_argument("--seed", type=int, default=0, help="random seed of arrivals, lengths and front-end times (default 0)")
    sm.add_argument("--front-end-spread", type=float, default=0.0, metavar="S",
                    help="each request's front-end time drawn uniformly from [(1-S) m, (1+S) m] around the modelled m "
                         "(0-1; default 0: exactly m)")
    sm.add_argument("--step-quantum", type=int, default=16,
                    help="round prefill chunk lengths to this many tokens when timing a step (default 16; 1: exact)")
    sm.add_argument("--out", default=None, help="per-request results: .csv, or .json with the summary")
    sm.add_argument("--plot", default=None, metavar="PNG", help="latency CDFs as a PNG")
    sm.add_argument("--report", default=None, metavar="HTML",
                    help="one self-contained interactive HTML report (plotly): latency CDFs, KV use, queues and "
                         "throughput over time, summary table")
    sm.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    for flag, (_, kind, _, what) in SCHEDULER_FLAGS.items():
        sm.add_argument(f"--{flag.replace('_', '-')}", type=kind, default=None,
                        help=f"{what} (default: the backend's, see infercast.serving.backends)")
    add_scheduler_flags(sm, roles=False)
    sm.set_defaults(func=cmd_simulate)
    return p


def _refuse_idle_cp_overlap(a) -> None:
    """``--cp-overlap`` hides the context-parallel K/V exchange behind the attention: without a
    context-parallel degree above 1 (``--cp``, ``--prefill-cp`` / ``--decode-cp``, ``--cp-list``)
    there is no exchange and the flag would change nothing, so it is refused."""
    keys = ("cp", "prefill_cp", "decode_cp", "cp_list")
    if not getattr(a, "cp_overlap", False) or not any(hasattr(a, k) for k in keys):
        return  # a command without context-parallel flags says so itself (recommend)
    degrees = [getattr(a, k, None) for k in ("cp", "prefill_cp", "decode_cp")]
    listed = getattr(a, "cp_list", None)
    if listed:
        degrees += [int(x) for x in str(listed).split(",") if x.strip().isdigit()]
    if not any(d is not None and d > 1 for d in degrees):
        raise InvalidInputError("--cp-overlap overlaps the context-parallel K/V exchange, but no context-parallel degree "
                                "above 1 is given: it would change nothing", "add --cp N (or --cp-list with N > 1)")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(args[0] if args and args[0] in COMMANDS else None)
    a = parser.parse_args(args)
    try:
        if hasattr(a, "engine_args"):
            from .engine_config import apply_engine_config, apply_role_engine_configs

            apply_engine_config(a)
            apply_role_engine_configs(a)
        _refuse_idle_cp_overlap(a)
        if getattr(a, "mtp_acceptance", None) is not None and not getattr(a, "nextn", 0):
            raise InvalidInputError("--acceptance-rate (--mtp-acceptance) is given without draft tokens: it would "
                                    "change nothing", "add --num-speculative-tokens K (and --speculative-method)")
        return int(a.func(a) or 0)
    except InfercastError as exc:
        print(f"infercast: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader of a pipe stopped early (| head): nothing more to say
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


#: allocations between two collections of the garbage collector's first generation in a command
#: (:func:`run`; Python's default is 700)
COMMAND_GC_THRESHOLD = 100_000


def run() -> None:
    """The ``infercast`` command (and ``python -m infercast``): :func:`main`, then the process
    ends as soon as its output is flushed and the exit handlers have run (a local Ray instance
    shut down, worker processes reaped), without the interpreter's teardown, which would free
    every parsed table, memo and candidate one object at a time (~50 ms after a search) for a
    process about to end anyway (not under a profiler or a coverage tool, which write their data
    once the program returns). A reader that closed the pipe early ends it quietly, as
    :func:`main` does.

    The cyclic garbage collector's first generation is collected every
    :data:`COMMAND_GC_THRESHOLD` allocations instead of Python's 700: nearly everything a command
    makes lives until it ends (the modules it imports, tens of thousands of objects, the parsed
    tables, the compiled ops, the estimators, the candidates), and each collection traverses the
    young objects before promoting them, for nothing (a warm ``search`` ran ~90 collections,
    ~15 ms of its ~350 ms). Cycles of garbage are still collected, later."""
    import atexit
    import gc
    import os

    gc.set_threshold(COMMAND_GC_THRESHOLD, *gc.get_threshold()[1:])
    code = main()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except ValueError:  # stdout closed: nothing left to write
        pass
    try:
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):
        pass
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_exit_handlers is None or sys.getprofile() is not None or sys.gettrace() is not None:
        # an interpreter without it, or a profiler or coverage tool that writes its data after
        # the program returns: the usual exit
        sys.exit(code)
    run_exit_handlers()
    os._exit(code)


if __name__ == "__main__":
    run()
