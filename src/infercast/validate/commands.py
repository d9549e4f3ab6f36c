"""The ``infercast`` command line that reproduces a validated row's prediction: the Estimator the
row was predicted with (:attr:`validate_inputs`, recorded by
:meth:`~infercast.validate.predict.EstimatorCache.for_layout`) as ``--model`` / layout / quant /
MTP / MoE-kernel / memory-fraction flags, and the scheduler settings that differ from the
backend's defaults (:func:`infercast.serving.backends.scheduler_params`) as ``infercast serve``'s
scheduler flags, ``--random-range-ratio`` / ``--random-lengths`` for the benchmark client, and
``--scheduler FIELD=VALUE`` for the rest (chunked prefill, overlap, ...).

Floats are written with ``repr`` so that the command reads back the same numbers.
"""

from __future__ import annotations

import shlex
from dataclasses import fields

from ..serving.backends import SchedulerParams, scheduler_params

#: Estimator input -> ``infercast serve`` flag (flags left out where the value is the CLI's default)
_EST_FLAGS = (("gemm_quant", "--gemm-quant"), ("moe_quant", "--moe-quant"), ("kv_cache_quant", "--kv-cache-quant"),
              ("moe_kernel", "--moe-kernel"), ("kv_memory_fraction", "--kv-memory-fraction"))


def _num(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, tuple):
        return ",".join(str(x) for x in v)
    return str(v)


def _int(v) -> int | float:
    return int(v) if float(v).is_integer() else v


def _scheduler_flags() -> dict[str, str]:
    """SchedulerParams field -> the ``infercast serve`` flag that sets it."""
    from ..cli.main import SCHEDULER_FLAGS

    return {fld: "--" + flag.replace("_", "-") for flag, (fld, *_rest) in SCHEDULER_FLAGS.items()}


def _model_args(inputs: dict, prefix: str = "") -> list[str]:
    """Layout flags (``--tp`` ..., or ``--prefill-tp`` ... with ``prefix``)."""
    f = f"--{prefix}-" if prefix else "--"
    out = [f"{f}tp", str(inputs["tp"]), f"{f}pp", str(inputs["pp"]), f"{f}attention-dp", str(inputs["attention_dp"])]
    for key, flag in (("moe_tp", "moe-tp"), ("moe_ep", "moe-ep")):
        if inputs[key] is not None:
            out += [f"{f}{flag}", str(inputs[key])]
    return out


def _estimator_args(inputs: dict, moe: bool = True) -> list[str]:
    """Model, quant, MTP, kernel and memory flags; ``moe`` False (a dense model): no
    ``--moe-quant``, which has nothing to apply to (and which the CLI refuses for a dense model)."""
    out = ["--model", inputs["model"], "--system", inputs["system"], "--backend", inputs["backend"]]
    for key, flag in _EST_FLAGS:
        if key == "moe_quant" and not moe:
            continue
        if inputs[key] is not None:
            out += [flag, _num(inputs[key])]
    if inputs["nextn"]:
        out += ["--nextn", str(inputs["nextn"])]
    if inputs["database_mode"] != "SILICON":
        out += ["--database-mode", inputs["database_mode"]]
    return out


def scheduler_args(params: SchedulerParams, base: SchedulerParams, random_range_ratio: float | None) -> list[str]:
    """``infercast serve`` flags that turn ``base`` into ``params``."""
    named = _scheduler_flags()
    out: list[str] = []
    if random_range_ratio is not None and params.kv_length_ratio != base.kv_length_ratio:
        out += ["--random-range-ratio", _num(float(random_range_ratio))]
        implied = {"kv_length_ratio", "lockstep"}
    elif params.lockstep is False and base.lockstep is True:
        out += ["--random-lengths"]
        implied = {"lockstep"}
    else:
        implied = set()
    for f in fields(SchedulerParams):
        v, b = getattr(params, f.name), getattr(base, f.name)
        if v == b or f.name in implied:
            continue
        if f.name in named:
            out += [named[f.name], _num(v)]
        else:
            out += ["--scheduler", f"{f.name}={_num(v)}"]
    return out


def serve_command(est, per_rank: int, row, params: SchedulerParams, settings) -> str:
    """``infercast serve ...`` for an agg row predicted with ``est`` at ``per_rank`` clients per
    attention-DP rank under ``params``."""
    inputs = getattr(est, "validate_inputs", None)
    if inputs is None:
        return ""
    base = scheduler_params(inputs["backend"], est.data.system, est.spec)
    argv = ["infercast", "serve", *_estimator_args(inputs, est.spec.moe is not None), *_model_args(inputs),
            "--concurrency", str(per_rank * inputs["attention_dp"]), "--isl", str(_int(row.isl)), "--osl", str(_int(row.osl)),
            *scheduler_args(params, base, settings.random_range_ratio)]
    return shlex.join(argv)


def disagg_command(pe, de, row, concurrency: int) -> str:
    """``infercast serve-disagg ...`` for a disagg row (engine defaults in both pools), or "" when
    the two pools' Estimator inputs other than the layout differ (one set of flags serves both)."""
    pi, di = getattr(pe, "validate_inputs", None), getattr(de, "validate_inputs", None)
    if pi is None or di is None:
        return ""
    layout = ("tp", "pp", "attention_dp", "moe_tp", "moe_ep")
    if {k: v for k, v in pi.items() if k not in layout} != {k: v for k, v in di.items() if k not in layout}:
        return ""
    argv = ["infercast", "serve-disagg", *_estimator_args(pi, pe.spec.moe is not None),
            "--prefill-workers", str(row.prefill_workers), *_model_args(pi, "prefill"),
            "--prefill-batch", str(row.prefill.batch_size or 1),
            "--decode-workers", str(row.decode_workers), *_model_args(di, "decode"),
            "--concurrency", str(concurrency), "--isl", str(_int(row.isl)), "--osl", str(_int(row.osl))]
    return shlex.join(argv)
