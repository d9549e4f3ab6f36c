"""``--engine-args FILE`` / ``--engine-cmd "..."``: an engine's own configuration as the input of
``estimate``, ``serve`` and ``recommend`` (read by :mod:`infercast.serving.engine_args`).

The configuration's settings fill in what the command line leaves at its defaults: the layout,
the KV-cache dtype, speculative decoding (method, draft tokens, draft model), the MoE kernel family, the KV memory fraction and (``serve``)
the scheduler settings. A flag given on the command line with another value than the
configuration's is a conflict, refused with both values named; the configuration's backend must
be ``--backend``'s. The flags read and the flags infercast does not model are stated in the
result's notes.
"""

from __future__ import annotations

from ..errors import InvalidInputError

#: infercast flag (argparse dest) -> its default: a dest still at its default takes the engine's value
_LAYOUT_DEFAULTS = {"tp": 1, "pp": 1, "attention_dp": 1, "moe_tp": None, "moe_ep": None, "cp": 1}
_ESTIMATOR_DEFAULTS = {"kv_cache_quant": None, "nextn": 0, "moe_kernel": None, "kv_memory_fraction": None,
                       "moe_comm": None, "speculative_method": None, "draft_model": None, "draft_tp": None,
                       "prompt_lookup_min": None, "prompt_lookup_max": None, "draft_quant": None,
                       "acceptance_per_position": None}
_FLAG = {"kv_cache_quant": "--kv-cache-quant", "nextn": "--nextn", "moe_kernel": "--moe-kernel",
         "kv_memory_fraction": "--kv-memory-fraction", "moe_comm": "--moe-comm", "tp": "--tp", "pp": "--pp", "attention_dp": "--attention-dp",
         "moe_tp": "--moe-tp", "moe_ep": "--moe-ep", "cp": "--cp", "speculative_method": "--speculative-method",
         "draft_model": "--draft-model", "draft_tp": "--draft-tp", "prompt_lookup_min": "--prompt-lookup-min",
         "prompt_lookup_max": "--prompt-lookup-max", "draft_quant": "--draft-quant",
         "acceptance_per_position": "--acceptance-per-position"}


def add_engine_args(p) -> None:
    """Add ``--engine-args`` / ``--engine-cmd`` to a command's parser."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--engine-args", metavar="FILE", default=None,
                   help="the engine's own configuration: a TensorRT-LLM extra-options YAML, or a file holding a "
                        "`vllm serve ...`, `python -m sglang.launch_server ...` or `trtllm-serve ...` command line; "
                        "its layout, KV dtype, MTP, MoE kernel, memory fraction and scheduler settings fill in "
                        "what the flags leave at their defaults")
    g.add_argument("--engine-cmd", metavar="CMD", default=None,
                   help="the same, as one command line in quotes (e.g. \"vllm serve MODEL --tensor-parallel-size 2 "
                        "--max-num-seqs 256\")")


def apply_engine_config(a) -> None:
    """Fold ``a.engine_args`` / ``a.engine_cmd`` into the parsed flags ``a`` (in place); sets
    ``a.engine_scheduler`` (SchedulerParams overrides) and ``a.engine_notes``."""
    a.engine_scheduler, a.engine_notes = {}, []
    if getattr(a, "engine_args", None) is None and getattr(a, "engine_cmd", None) is None:
        return
    from ..serving.engine_args import parse_engine_cmd, parse_engine_file

    s = parse_engine_file(a.engine_args) if a.engine_args is not None else parse_engine_cmd(a.engine_cmd)
    source = f"--engine-args {a.engine_args}" if a.engine_args is not None else "--engine-cmd"
    if s.backend != a.backend:
        raise InvalidInputError(f"{source} configures {s.backend}, but --backend is {a.backend}",
                                "give the engine's configuration for the backend being estimated")
    layout = dict(s.layout)
    if layout.pop("enable_attention_dp", False):
        # an options file without its command line: the TP the flags give is the attention-DP ranks
        layout.update(tp=1, attention_dp=a.tp)
    if hasattr(a, "tp"):
        for dest, value in layout.items():
            _fill(a, dest, value, _LAYOUT_DEFAULTS[dest], source)
    elif layout:
        a.engine_notes.append(f"{source}: its layout is not used here (search and recommend search layouts; "
                              "serve-disagg takes each role's from its flags or --prefill/--decode-engine-args)")
    for dest, value in s.estimator_kw.items():
        if dest == "speculative":
            _fill_speculative(a, value, source)
        elif value is not None:
            _fill(a, dest, value, _ESTIMATOR_DEFAULTS[dest], source)
    a.engine_scheduler = dict(s.scheduler)
    read = ", ".join(s.read) or "nothing infercast models"
    a.engine_notes.append(f"engine configuration ({s.backend}, {source}): read {read}")
    a.engine_notes += [f"engine configuration: {n}" for n in s.notes]
    if s.model and s.model != a.model:
        a.engine_notes.append(f"engine configuration names model {s.model}; estimated: {a.model}")


def _fill_speculative(a, value: dict | None, source: str) -> None:
    """The configuration's speculative decoding settings (method, draft model, ...) into their
    flags, one each (:data:`infercast.cli.speculative.DESTS`)."""
    from .speculative import DESTS

    dest_of = {key: dest for dest, key in DESTS.items()}
    for key, v in (value or {}).items():
        if v is not None:
            _fill(a, dest_of[key], v, _ESTIMATOR_DEFAULTS[dest_of[key]], source)


def _fill(a, dest: str, value, default, source: str, flag: str | None = None) -> None:
    given = getattr(a, dest)
    if given == default:
        setattr(a, dest, value)
        a.engine_filled = getattr(a, "engine_filled", set()) | {dest}  # set by the configuration, not a flag
    elif given != value:
        raise InvalidInputError(f"{flag or _FLAG[dest]} {given} conflicts with {source}, which sets {value}",
                                "drop the flag or change the configuration")


#: model settings a disaggregated deployment's roles may set apart (``--prefill-kv-cache-quant`` ...)
ROLE_MODEL_SETTINGS = ("kv_cache_quant", "kv_memory_fraction", "moe_kernel", "moe_comm")


def add_role_engine_args(p) -> None:
    """``--prefill-engine-args`` / ``--prefill-engine-cmd`` and the decode pair: one engine
    configuration per role of a disaggregated deployment."""
    for role in ("prefill", "decode"):
        g = p.add_mutually_exclusive_group()
        g.add_argument(f"--{role}-engine-args", metavar="FILE", default=None,
                       help=f"the {role} workers' engine configuration (as --engine-args): their layout, KV dtype, "
                            f"memory fraction, MoE kernel and all-to-all, and scheduler settings; MTP is shared by the roles")
        g.add_argument(f"--{role}-engine-cmd", metavar="CMD", default=None,
                       help=f"the same, as one command line in quotes (the {role} workers' `vllm serve ...`)")


def apply_role_engine_configs(a) -> None:
    """Fold ``--prefill-engine-args`` / ``--decode-engine-args`` (or ``-cmd``) into ``a`` (in
    place): the configuration's layout fills the role's ``--<role>-tp`` ... flags left at their
    defaults, its KV dtype, memory fraction, MoE kernel and all-to-all the role's own flags
    (:data:`ROLE_MODEL_SETTINGS`), its MTP the shared flag (a second role that sets another value
    is a conflict), its scheduler settings go to ``a.role_scheduler[role]``. A command without
    these flags is left alone."""
    a.role_scheduler = {}
    for role in ("prefill", "decode"):
        path, cmd = getattr(a, f"{role}_engine_args", None), getattr(a, f"{role}_engine_cmd", None)
        if path is None and cmd is None:
            continue
        from ..serving.engine_args import parse_engine_cmd, parse_engine_file

        s = parse_engine_file(path) if path is not None else parse_engine_cmd(cmd)
        source = f"--{role}-engine-args {path}" if path is not None else f"--{role}-engine-cmd"
        if s.backend != a.backend:
            raise InvalidInputError(f"{source} configures {s.backend}, but --backend is {a.backend}",
                                    "give the engine's configuration for the backend being estimated")
        layout = dict(s.layout)
        if layout.pop("enable_attention_dp", False):
            layout.update(tp=1, attention_dp=getattr(a, f"{role}_tp"))
        for dest, value in layout.items():
            _fill(a, f"{role}_{dest}", value, _LAYOUT_DEFAULTS[dest], source, f"--{role}-{dest.replace('_', '-')}")
        for dest, value in s.estimator_kw.items():
            if value is None:
                continue
            if dest in ROLE_MODEL_SETTINGS:  # the role's own flag (--decode-kv-memory-fraction ...)
                _fill(a, f"{role}_{dest}", value, None, source, f"--{role}-{dest.replace('_', '-')}")
            elif dest == "speculative":  # shared by the roles, as MTP: a second role must agree
                _fill_speculative(a, value, source)
            else:
                _fill(a, dest, value, _ESTIMATOR_DEFAULTS[dest], source)
        a.role_scheduler[role] = dict(s.scheduler)
        read = ", ".join(s.read) or "nothing infercast models"
        a.engine_notes.append(f"{role} engine configuration ({s.backend}, {source}): read {read}")
        a.engine_notes += [f"{role} engine configuration: {n}" for n in s.notes]
