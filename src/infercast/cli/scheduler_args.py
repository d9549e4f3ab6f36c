"""Scheduler settings as command-line input: ``--scheduler FIELD=VALUE`` (every
:class:`~infercast.serving.backends.SchedulerParams` field), its per-role forms on
``serve-disagg`` and ``search`` (``--prefill-scheduler`` / ``--decode-scheduler``), the one-value
shortcut flags (``--max-num-tokens`` ...), and the order in which the sources of a setting stack.

Order, later wins: the backend's defaults, an engine configuration (``--engine-args`` for both
roles, then ``--prefill-engine-args`` / ``--decode-engine-args``), a calibration profile, the
shortcut flags, ``--scheduler``, then the role's own ``--<role>-scheduler``.

Every value is checked against the field's range (:data:`FIELD_RANGES`): a bad one is an
:class:`~infercast.errors.InvalidInputError` naming the flag, the field and the range.
"""

from __future__ import annotations

import math

from ..errors import InvalidInputError

#: SchedulerParams field -> (lowest, highest, lowest allowed itself): the values a setting can take.
#: Fields not listed take any finite number >= 0 (booleans: true/false).
FIELD_RANGES: dict[str, tuple[float, float, bool]] = {
    "max_num_tokens": (1, math.inf, True),
    "max_batch_size": (1, math.inf, True),
    "min_prefill_chunk": (1, math.inf, True),
    "requests_per_client": (1, math.inf, True),
    "recv_interval": (1, math.inf, True),
    "batch_wait_max_tokens_ratio": (0, 1, True),
    "kv_length_ratio": (0, 1, False),
    "prefill_scale": (0, math.inf, False),
    "decode_scale": (0, math.inf, False),
}

ROLES = ("prefill", "decode")


def _kinds() -> dict[str, type]:
    from dataclasses import fields

    from ..serving.backends import SCHEDULERS, SchedulerParams

    return {f.name: type(getattr(SCHEDULERS["trtllm"], f.name)) for f in fields(SchedulerParams)}


def _check(flag: str, name: str, value):
    """``value`` of field ``name`` if it is in the field's range, else a one-line error."""
    if isinstance(value, bool):
        return value
    if isinstance(value, tuple):  # CUDA-graph batch sizes: positive, each once, ascending
        if any(v < 1 for v in value):
            raise InvalidInputError(f"{flag} {name} takes batch sizes >= 1, got {','.join(map(str, value))}")
        return tuple(sorted(set(value)))
    lo, hi, closed = FIELD_RANGES.get(name, (0, math.inf, True))
    ok = math.isfinite(value) and (value >= lo if closed else value > lo) and value <= hi
    if not ok:
        where = f"{'>=' if closed else '>'} {lo:g}" + ("" if math.isinf(hi) else f" and <= {hi:g}")
        raise InvalidInputError(f"{flag} {name} must be a finite number {where}, got {value:g}")
    return value


def parse_fields(items: list[str] | None, flag: str = "--scheduler") -> dict:
    """``FIELD=VALUE`` items (``flag``'s) as {SchedulerParams field: value}: the value read as the
    field's type (true/false, an integer, a number, or comma-separated integers) and checked
    against its range."""
    known = _kinds()
    out = {}
    for item in items or []:
        name, eq, text = item.partition("=")
        name = name.strip().replace("-", "_")
        if not eq or name not in known:
            raise InvalidInputError(f"{flag} {item!r} is not FIELD=VALUE of a scheduler setting", available=sorted(known))
        kind = known[name]
        try:
            if kind is bool:
                if text.lower() not in ("true", "false", "1", "0", "on", "off"):
                    raise ValueError
                value = text.lower() in ("true", "1", "on")
            elif kind is tuple:
                value = tuple(int(x) for x in text.split(",") if x.strip())
            else:
                value = kind(text)
        except ValueError:
            what = {bool: "true or false", int: "an integer", float: "a number", tuple: "comma-separated integers"}[kind]
            raise InvalidInputError(f"{flag} {name} takes {what}, got {text!r}") from None
        out[name] = _check(flag, name, value)
    return out


def add_shortcut_flags(p, flags: dict, who: str = "") -> None:
    """The one-value scheduler flags (``SCHEDULER_FLAGS`` of :mod:`.main`: flag -> (field, type,
    minimum, what)) on parser ``p``; ``who`` says which workers they set."""
    for flag, (_, kind, _, what) in flags.items():
        p.add_argument(f"--{flag.replace('_', '-')}", type=kind, default=None,
                       help=f"{what}{who} (default: the backend's, see infercast.serving.backends)")


def add_scheduler_flags(p, roles: bool) -> None:
    """``--scheduler FIELD=VALUE`` and, with ``roles``, ``--prefill-scheduler`` /
    ``--decode-scheduler`` on parser ``p``."""
    p.add_argument("--scheduler", action="append", metavar="FIELD=VALUE", default=None,
                   help="set any scheduler setting by its name in infercast.serving.backends.SchedulerParams "
                        "(e.g. chunked=false, overlap=true, graph_batch_sizes=1,2,4,8)"
                        + (" for prefill and decode workers" if roles else "") + "; repeatable")
    if roles:
        for role in ROLES:
            p.add_argument(f"--{role}-scheduler", action="append", metavar="FIELD=VALUE", default=None,
                           help=f"as --scheduler, for the {role} workers only; applied after --scheduler")


def role_overrides(a, shared: dict) -> dict[str, dict]:
    """{role: SchedulerParams overrides} of the parsed flags ``a`` for ``prefill`` and
    ``decode`` workers: the engine configurations (``a.engine_scheduler``, then the role's
    ``a.role_scheduler[role]``), ``shared`` (a calibration profile's, then the shortcut flags'),
    ``--scheduler`` and the role's ``--<role>-scheduler``, later ones winning."""
    both = parse_fields(getattr(a, "scheduler", None))
    out = {}
    for role in ROLES:
        own = parse_fields(getattr(a, f"{role}_scheduler", None), f"--{role}-scheduler")
        out[role] = {**getattr(a, "engine_scheduler", {}), **getattr(a, "role_scheduler", {}).get(role, {}),
                     **shared, **both, **own}
    return out
