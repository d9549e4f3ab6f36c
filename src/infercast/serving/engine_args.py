"""Reading an engine's own configuration into infercast's inputs: a TensorRT-LLM extra-options
YAML (or a ``trtllm-serve`` command line), a ``vllm serve`` command line, a
``python -m sglang.launch_server`` command line.

The result, :class:`EngineSettings`, holds the layout (infercast's ``tp`` is per attention-DP
rank: the engines' own TP sizes are converted, see :mod:`infercast.report.launch`, which writes the
same flags), the :class:`~infercast.Estimator` keywords (KV-cache dtype, MTP draft tokens, MoE
kernel family, KV memory fraction), the scheduler overrides
(:class:`~infercast.serving.backends.SchedulerParams` fields), the flags read, and the flags
infercast does not model (listed, never silently dropped). A value of a modelled flag that
infercast cannot represent (an unknown KV-cache dtype, a speculative method other than MTP, EAGLE,
EAGLE-3, n-gram and draft model,
``--dp-size`` without DP attention) raises :class:`~infercast.errors.InvalidInputError` naming the
flag and the values it knows.

Flag names are the engines' own, as their ``--help`` prints them (dashes and underscores, and
``--flag=value``, are both accepted where the engine accepts them).

Context parallelism (infercast's ``cp``: ranks beside the TP group, prompts split over them, the
KV cache sharded over them; :mod:`infercast.models.context_parallel`): vLLM's
``--prefill-context-parallel-size`` / ``-pcp`` (its world is ``tp x pp x pcp``), SGLang's
``--attn-cp-size`` (counted inside its ``--tp-size``, as its attention DP is: attention TP is
``tp-size / attn-cp-size``) and TensorRT-LLM's ``context_parallel_size`` (``--cp_size`` on older
``trtllm-serve``; a ``cp_config`` is read as that degree's settings). Decode context parallelism
inside the TP group (vLLM ``--decode-context-parallel-size`` / ``-dcp``, SGLang ``--dcp-size``),
which shards the KV cache over TP ranks without adding GPUs, is a different layout that infercast
does not model: refused.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path


from ..errors import InvalidInputError

#: flags that take no value, per engine (the rest take one)
_SWITCHES = {
    "vllm": {"--enable-expert-parallel", "--enable-chunked-prefill", "--no-enable-chunked-prefill", "--trust-remote-code",
             "--enforce-eager", "--enable-prefix-caching", "--no-enable-prefix-caching", "--disable-log-requests",
             "--disable-log-stats", "--async-scheduling", "--enable-eplb"},
    "sglang": {"--enable-dp-attention", "--enable-mixed-chunk", "--disable-overlap-schedule", "--disable-radix-cache",
               "--trust-remote-code", "--enable-torch-compile", "--disable-cuda-graph", "--enable-dp-lm-head",
               "--enable-two-batch-overlap", "--enable-eplb", "--enable-prefill-cp",
               "--enable-nsa-prefill-context-parallel"},
    "trtllm": {"--trust_remote_code", "--trust-remote-code", "--enable_chunked_prefill"},
}
#: flags that do not change a prediction (server plumbing): read and ignored without a notice
_PLUMBING = {"--host", "--port", "--served-model-name", "--served_model_name", "--api-key", "--log-level",
             "--log_level", "--tokenizer", "--trust-remote-code", "--trust_remote_code", "--disable-log-requests",
             "--disable-log-stats", "--backend", "--download-dir", "--revision"}


@dataclass
class EngineSettings:
    """What an engine configuration says, in infercast's terms."""

    backend: str
    model: str | None = None
    layout: dict = field(default_factory=dict)  # tp, pp, attention_dp, moe_tp, moe_ep
    estimator_kw: dict = field(default_factory=dict)
    scheduler: dict = field(default_factory=dict)
    read: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"backend": self.backend, "model": self.model, "layout": self.layout, "estimator": self.estimator_kw,
                "scheduler": self.scheduler, "read": self.read, "ignored": self.ignored, "notes": self.notes}


def _tokens(argv: list[str], backend: str) -> tuple[list[str], dict[str, str | bool]]:
    """(positionals, {flag: value or True}) of an argv; ``--flag=value`` splits."""
    pos, flags, i = [], {}, 0
    switches = _SWITCHES[backend]
    while i < len(argv):
        a = argv[i]
        if a.startswith("-") and len(a) > 1:
            if "=" in a:
                k, v = a.split("=", 1)
                flags[k] = v
            elif a in switches or i + 1 >= len(argv) or (argv[i + 1].startswith("--")):
                flags[a] = True
            else:
                flags[a] = argv[i + 1]
                i += 1
        else:
            pos.append(a)
        i += 1
    return pos, flags


def _int(flag: str, v) -> int:
    try:
        x = int(str(v))
    except ValueError:
        raise InvalidInputError(f"{flag} takes an integer, got {v!r}") from None
    if x < 1 and flag not in ("--chunked-prefill-size", "--num_postprocess_workers"):
        raise InvalidInputError(f"{flag} must be >= 1, got {x}")
    return x


def _frac(flag: str, v) -> float:
    try:
        x = float(str(v))
    except ValueError:
        raise InvalidInputError(f"{flag} takes a number, got {v!r}") from None
    if not 0.0 < x <= 1.0:
        raise InvalidInputError(f"{flag} is a fraction of GPU memory in (0, 1], got {x}")
    return x


def _kv_dtype(flag: str, v) -> str | None:
    """infercast's KV-cache quant of an engine's KV dtype name (None: the checkpoint's own)."""
    s = str(v).lower()
    if s in ("auto",):
        return None
    if s in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        return "fp8"
    if s in ("bf16", "bfloat16", "fp16", "float16", "half"):
        return "bfloat16"
    raise InvalidInputError(f"{flag} {v!r} is not a KV-cache dtype infercast models",
                            "known: auto, bfloat16 / bf16 / fp16, fp8 / fp8_e4m3 / fp8_e5m2")


def _first(flags: dict, *names):
    for n in names:
        if n in flags:
            return n, flags[n]
    return None, None


def _argv(cmd) -> list[str]:
    if isinstance(cmd, str):
        try:
            return shlex.split(cmd)
        except ValueError as exc:
            raise InvalidInputError(f"cannot split the engine command line: {exc}") from None
    return [str(a) for a in cmd]


def detect_backend(argv: list[str]) -> str:
    """The engine an argv launches: ``vllm serve``, ``python -m sglang.launch_server`` (or
    ``sglang.launch_server`` anywhere), ``trtllm-serve``."""
    joined = " ".join(argv[:4])
    if "sglang.launch_server" in joined or "sglang" in (argv[0] if argv else ""):
        return "sglang"
    if argv[:2] == ["vllm", "serve"] or "vllm.entrypoints" in joined:
        return "vllm"
    if argv and Path(argv[0]).name == "trtllm-serve":
        return "trtllm"
    raise InvalidInputError("cannot tell which engine this command line launches",
                            "expected `vllm serve MODEL ...`, `python -m sglang.launch_server ...` or `trtllm-serve MODEL ...`")


def parse_engine_cmd(cmd) -> EngineSettings:
    """:class:`EngineSettings` of an engine command line (text or argv)."""
    argv = _argv(cmd)
    backend = detect_backend(argv)
    return {"vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm_cmd}[backend](argv)


def _finish(s: EngineSettings, flags: dict, used: set[str]) -> EngineSettings:
    s.read = sorted(used)
    s.ignored = sorted(k for k in flags if k not in used and k not in _PLUMBING)
    if s.ignored:
        s.notes.append("not modelled, ignored: " + ", ".join(s.ignored))
    return s


#: flags read as one value each: flag -> (EngineSettings field, key, reader)
_VLLM_SIMPLE = {
    "--max-num-seqs": ("scheduler", "max_batch_size", _int),
    "--max-num-batched-tokens": ("scheduler", "max_num_tokens", _int),
    "--gpu-memory-utilization": ("estimator_kw", "kv_memory_fraction", _frac),
    "--kv-cache-dtype": ("estimator_kw", "kv_cache_quant", _kv_dtype),
}
_SGLANG_SIMPLE = {
    "--max-running-requests": ("scheduler", "max_batch_size", _int),
    "--mem-fraction-static": ("estimator_kw", "kv_memory_fraction", _frac),
    "--kv-cache-dtype": ("estimator_kw", "kv_cache_quant", _kv_dtype),
    "--scheduler-recv-interval": ("scheduler", "recv_interval", _int),
}


def _read_simple(s: EngineSettings, flags: dict, used: set[str], table: dict) -> None:
    """Read every flag of ``table`` that ``flags`` holds into ``s``."""
    for flag, (where, key, read) in table.items():
        if flag in flags:
            getattr(s, where)[key] = read(flag, flags[flag])
            used.add(flag)


def _moe_runner(s: EngineSettings, flags: dict, used: set[str], flag: str) -> None:
    """The engine's MoE kernel flag: ``triton`` pins the Triton ``fused_moe`` family; any other
    runner keeps the table's own kernels (said in the notes)."""
    if flag not in flags:
        return
    used.add(flag)
    if str(flags[flag]).lower() == "triton":
        s.estimator_kw["moe_kernel"] = "triton"
    else:
        s.notes.append(f"{flag} {flags[flag]}: the table's own kernels are used")


# ---- speculative decoding ----------------------------------------------------------------------
# Each engine's speculative settings become ``estimator_kw["nextn"]`` (draft tokens per step) and,
# for methods other than MTP, ``estimator_kw["speculative"]``: the method (vLLM's names), the draft
# network and its TP size, the n-gram window (:func:`infercast.models.speculative.spec_decode_of`).

_VLLM_METHODS = ("eagle", "eagle3", "ngram", "draft_model")


def _speculative(s: EngineSettings, method: str, k: int, **kw) -> None:
    s.estimator_kw["nextn"] = k
    if method != "mtp":
        s.estimator_kw["speculative"] = {"method": method, **{key: v for key, v in kw.items() if v is not None}}


def _vllm_speculative(s: EngineSettings, spec: dict) -> None:
    """vLLM's ``--speculative-config``: ``method`` (``mtp`` and the model-specific ``*_mtp`` names,
    ``eagle``, ``eagle3``, ``ngram``, ``draft_model``; without one, a ``model`` is a draft model),
    ``num_speculative_tokens``, ``model``, ``draft_tensor_parallel_size``,
    ``prompt_lookup_min`` / ``prompt_lookup_max``; other keys are listed as not modelled."""
    raw = spec.get("method")
    method = str(raw or ("draft_model" if spec.get("model") else "")).lower()
    if method.endswith("mtp"):
        method = "mtp"
    if method not in ("mtp",) + _VLLM_METHODS:
        raise InvalidInputError(f"--speculative-config method {raw!r} is not modelled",
                                "infercast models: mtp (and the *_mtp names), " + ", ".join(_VLLM_METHODS))
    k = _int("num_speculative_tokens", spec.get("num_speculative_tokens", 1))
    tp = spec.get("draft_tensor_parallel_size")
    lo, hi = spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")
    _speculative(s, method, k, draft_model=spec.get("model") if method != "mtp" else None,
                 draft_tp=None if tp is None else _int("draft_tensor_parallel_size", tp),
                 prompt_lookup_min=None if lo is None else _int("prompt_lookup_min", lo),
                 prompt_lookup_max=None if hi is None else _int("prompt_lookup_max", hi))
    extra = sorted(set(spec) - {"method", "num_speculative_tokens", "model", "draft_tensor_parallel_size",
                                "prompt_lookup_min", "prompt_lookup_max"})
    if extra:
        s.notes.append("--speculative-config keys not modelled, ignored: " + ", ".join(extra))


_SGLANG_METHODS = {"EAGLE": "eagle", "EAGLE3": "eagle3", "NEXTN": "mtp", "STANDALONE": "draft_model", "NGRAM": "ngram"}


def _sglang_speculative(s: EngineSettings, flags: dict, used: set[str]) -> None:
    """SGLang's ``--speculative-algorithm`` (``EAGLE``, ``EAGLE3``, ``NEXTN``, ``STANDALONE``,
    ``NGRAM``) with ``--speculative-num-steps`` (draft tokens of a chain; default 1),
    ``--speculative-draft-model-path``, ``--speculative-eagle-topk``,
    ``--speculative-num-draft-tokens`` and the n-gram match window
    (``--speculative-ngram-min/max-match-window-size``). ``EAGLE`` without a draft path runs the
    checkpoint's MTP layers (SGLang's way of serving them): read as MTP. ``NGRAM`` verifies
    ``--speculative-num-draft-tokens`` tokens per step, the last verified one among them: its
    draft tokens are that minus one. A tree (``--speculative-eagle-topk`` > 1) is costed as a chain
    of ``--speculative-num-steps`` (said in the notes)."""
    used.add("--speculative-algorithm")
    algo = str(flags["--speculative-algorithm"]).upper()
    if algo not in _SGLANG_METHODS:
        raise InvalidInputError(f"--speculative-algorithm {flags['--speculative-algorithm']} is not modelled",
                                "infercast models: " + ", ".join(_SGLANG_METHODS))
    names = ("--speculative-num-steps", "--speculative-num-draft-tokens", "--speculative-eagle-topk",
             "--speculative-draft-model-path", "--speculative-ngram-min-match-window-size",
             "--speculative-ngram-max-match-window-size")
    used |= set(names) & set(flags)
    draft = flags.get("--speculative-draft-model-path")
    method = _SGLANG_METHODS[algo]
    if method == "eagle" and draft is None:
        method = "mtp"
    if method == "draft_model" and draft is None:
        raise InvalidInputError("--speculative-algorithm STANDALONE needs --speculative-draft-model-path")
    if method == "ngram":
        n = flags.get("--speculative-num-draft-tokens")
        k = _int("--speculative-num-draft-tokens", n) - 1 if n is not None else 1
        if k < 1:
            raise InvalidInputError("--speculative-num-draft-tokens must be >= 2 for NGRAM (the verified token and one draft)")
    else:
        steps = flags.get("--speculative-num-steps")
        k = _int("--speculative-num-steps", steps) if steps is not None else 1
    topk = flags.get("--speculative-eagle-topk")
    if topk is not None and _int("--speculative-eagle-topk", topk) > 1:
        s.notes.append(f"--speculative-eagle-topk {topk}: tree drafting is costed as a chain of {k} draft tokens")
    lo, hi = flags.get("--speculative-ngram-min-match-window-size"), flags.get("--speculative-ngram-max-match-window-size")
    _speculative(s, method, k, draft_model=None if method == "mtp" else draft,
                 prompt_lookup_min=None if lo is None else _int("--speculative-ngram-min-match-window-size", lo),
                 prompt_lookup_max=None if hi is None else _int("--speculative-ngram-max-match-window-size", hi))


_TRTLLM_METHODS = {"MTP": "mtp", "EAGLE": "eagle", "EAGLE3": "eagle3", "NGRAM": "ngram", "DRAFTTARGET": "draft_model"}


def _trtllm_speculative(s: EngineSettings, spec: dict) -> None:
    """TensorRT-LLM's ``speculative_config``: ``decoding_type`` ``MTP`` (draft tokens
    ``num_nextn_predict_layers``), ``Eagle``, ``Eagle3``, ``NGram``, ``DraftTarget`` (draft tokens
    ``max_draft_len``; the draft network ``speculative_model_dir`` or ``speculative_model``; the
    n-gram matcher's longest match ``max_matching_ngram_size``). Other keys are listed as not
    modelled."""
    if not isinstance(spec, dict):
        raise InvalidInputError("speculative_config is a mapping", f"got {type(spec).__name__}")
    raw = spec.get("decoding_type", "")
    kind = str(raw).upper()
    if kind not in _TRTLLM_METHODS:
        raise InvalidInputError(f"speculative_config.decoding_type {raw!r} is not modelled",
                                "known: MTP, Eagle, Eagle3, NGram, DraftTarget")
    method = _TRTLLM_METHODS[kind]
    if method == "mtp":
        k = _int("speculative_config.num_nextn_predict_layers", spec.get("num_nextn_predict_layers", 1))
        known = {"decoding_type", "num_nextn_predict_layers"}
    else:
        k = _int("speculative_config.max_draft_len", spec.get("max_draft_len", 1))
        known = {"decoding_type", "max_draft_len", "speculative_model_dir", "speculative_model", "max_matching_ngram_size"}
    hi = spec.get("max_matching_ngram_size") if method == "ngram" else None
    _speculative(s, method, k, draft_model=spec.get("speculative_model_dir") or spec.get("speculative_model"),
                 prompt_lookup_max=None if hi is None else _int("speculative_config.max_matching_ngram_size", hi))
    extra = sorted(set(spec) - known)
    if extra:
        s.notes.append("speculative_config keys not modelled, ignored: " + ", ".join(extra))


def _vllm(argv: list[str]) -> EngineSettings:
    start = 2 if argv[:2] == ["vllm", "serve"] else next((i + 1 for i, a in enumerate(argv) if "vllm.entrypoints" in a), 1)
    pos, flags = _tokens(argv[start:], "vllm")
    s = EngineSettings("vllm", model=pos[0] if pos else flags.get("--model"))
    used: set[str] = {"--model"} & set(flags)
    k, v = _first(flags, "--tensor-parallel-size", "-tp")
    tp = _int("--tensor-parallel-size", v) if k else 1
    k2, v2 = _first(flags, "--data-parallel-size", "-dp")
    dp = _int("--data-parallel-size", v2) if k2 else 1
    k3, v3 = _first(flags, "--pipeline-parallel-size", "-pp")
    pp = _int("--pipeline-parallel-size", v3) if k3 else 1
    used |= {x for x in (k, k2, k3) if x}
    s.layout = {"tp": tp, "pp": pp, "attention_dp": dp}
    _refuse_dcp(flags, "--decode-context-parallel-size", "-dcp")
    k4, v4 = _first(flags, "--prefill-context-parallel-size", "-pcp")
    if k4:
        used.add(k4)
        s.layout["cp"] = _int("--prefill-context-parallel-size", v4)
    if flags.get("--enable-expert-parallel") is True:
        used.add("--enable-expert-parallel")
        s.layout.update(moe_tp=1, moe_ep=tp * dp)
    _read_simple(s, flags, used, _VLLM_SIMPLE)
    for flag, on in (("--enable-chunked-prefill", True), ("--no-enable-chunked-prefill", False)):
        if flags.get(flag) is True:
            s.scheduler["chunked"] = on
            used.add(flag)
    if "--speculative-config" in flags:
        used.add("--speculative-config")
        try:
            spec = json.loads(flags["--speculative-config"])
        except json.JSONDecodeError:
            raise InvalidInputError("--speculative-config is JSON", f"got {flags['--speculative-config']!r}") from None
        if not isinstance(spec, dict):
            raise InvalidInputError("--speculative-config is a JSON object", f"got {flags['--speculative-config']!r}")
        _vllm_speculative(s, spec)
    if "--all2all-backend" in flags:
        used.add("--all2all-backend")
        b = str(flags["--all2all-backend"]).lower()
        s.estimator_kw["moe_comm"] = "gather" if b in ("allgather_reducescatter", "naive") else "alltoall"
    _cuda_graphs(s, flags, used)
    _moe_runner(s, flags, used, "--moe-backend")
    return _finish(s, flags, used)


def _refuse_dcp(flags: dict, *names: str) -> None:
    """Refuse decode context parallelism inside the TP group (see the module docstring)."""
    k, v = _first(flags, *names)
    if k and _int(k, v) > 1:
        raise InvalidInputError(f"{k} {v}: decode context parallelism inside the TP group is not modelled",
                                "infercast's --cp models context-parallel ranks beside TP (vLLM "
                                "--prefill-context-parallel-size, SGLang --attn-cp-size, TensorRT-LLM context_parallel_size)")


def _cuda_graphs(s: EngineSettings, flags: dict, used: set) -> None:
    """The decode CUDA-graph sizes (``graph_batch_sizes``) a command line sets: vLLM
    ``--enforce-eager`` and SGLang ``--disable-cuda-graph`` capture none (decode batches run
    unpadded; the host cost of eager steps is not modelled); SGLang ``--cuda-graph-max-bs N``
    captures its default sizes up to ``N`` (:data:`~infercast.serving.backends.CUDA_GRAPH_SIZES`,
    the large-GPU list), a decode batch above ``N`` running unpadded."""
    from .backends import SGLANG_LARGE_GPU_GRAPH_SIZES

    for flag in ("--enforce-eager", "--disable-cuda-graph"):
        if flags.get(flag) is True:
            used.add(flag)
            s.scheduler["graph_batch_sizes"] = ()
            s.notes.append(f"{flag}: no CUDA graphs, decode batches are not padded (the host cost of eager steps is "
                           "not modelled)")
            return
    if s.backend == "sglang" and "--cuda-graph-max-bs" in flags:
        n = _int("--cuda-graph-max-bs", flags["--cuda-graph-max-bs"])
        used.add("--cuda-graph-max-bs")
        s.scheduler["graph_batch_sizes"] = tuple(b for b in SGLANG_LARGE_GPU_GRAPH_SIZES if b <= n)
        if n > SGLANG_LARGE_GPU_GRAPH_SIZES[-1]:
            s.notes.append(f"--cuda-graph-max-bs {n}: the sizes above {SGLANG_LARGE_GPU_GRAPH_SIZES[-1]} are not known "
                           "here; decode batches above it run unpadded")


def _sglang(argv: list[str]) -> EngineSettings:
    start = next((i + 1 for i, a in enumerate(argv) if "sglang.launch_server" in a), 1)
    _, flags = _tokens(argv[start:], "sglang")
    s = EngineSettings("sglang", model=flags.get("--model-path") or flags.get("--model"))
    used = {"--model-path", "--model"} & set(flags)
    k, v = _first(flags, "--tp-size", "--tp", "--tensor-parallel-size")
    world = _int("--tp-size", v) if k else 1
    kd, vd = _first(flags, "--dp-size", "--dp", "--data-parallel-size")
    dp = _int("--dp-size", vd) if kd else 1
    kp, vp = _first(flags, "--pp-size", "--pp")
    pp = _int("--pp-size", vp) if kp else 1
    used |= {x for x in (k, kd, kp) if x}
    if dp > 1 and flags.get("--enable-dp-attention") is not True:
        raise InvalidInputError(f"--dp-size {dp} without --enable-dp-attention runs {dp} separate replicas",
                                "infercast estimates one replica: give that replica's flags, or add "
                                "--enable-dp-attention for attention data parallelism")
    if flags.get("--enable-dp-attention") is True:
        used.add("--enable-dp-attention")
        if world % dp:
            raise InvalidInputError(f"--tp-size {world} is not a multiple of --dp-size {dp}")
        s.layout = {"tp": world // dp, "pp": pp, "attention_dp": dp}
    else:
        s.layout = {"tp": world, "pp": pp, "attention_dp": 1}
    _refuse_dcp(flags, "--dcp-size", "--decode-context-parallel-size")
    kc, vc = _first(flags, "--attn-cp-size")
    if kc and _int("--attn-cp-size", vc) > 1:
        cp = _int("--attn-cp-size", vc)
        used.add(kc)
        used |= {"--enable-prefill-cp", "--enable-nsa-prefill-context-parallel"} & set(flags)
        if s.layout["attention_dp"] > 1 or s.layout["tp"] % cp:
            raise InvalidInputError(f"--attn-cp-size {cp} must divide the attention TP ({s.layout['tp']}) of a layout "
                                    "without DP attention", "infercast models context parallelism beside TP, not attention DP")
        s.layout.update(tp=s.layout["tp"] // cp, cp=cp)
    ke, ve = _first(flags, "--ep-size", "--ep", "--expert-parallel-size")
    if ke:
        ep = _int("--ep-size", ve)
        used.add(ke)
        if world % ep:
            raise InvalidInputError(f"--tp-size {world} is not a multiple of --ep-size {ep}")
        if ep > 1:
            s.layout.update(moe_tp=world // ep, moe_ep=ep)
    _read_simple(s, flags, used, _SGLANG_SIMPLE)
    if "--chunked-prefill-size" in flags:
        n = _int("--chunked-prefill-size", flags["--chunked-prefill-size"])
        used.add("--chunked-prefill-size")
        if n <= 0:
            s.scheduler["chunked"] = False
        else:
            s.scheduler.update(chunked=True, max_num_tokens=n)
    if flags.get("--enable-mixed-chunk") is True:
        s.scheduler.update(mixed=True, lockstep=False)
        used.add("--enable-mixed-chunk")
    if flags.get("--disable-overlap-schedule") is True:
        s.scheduler["overlap"] = False
        used.add("--disable-overlap-schedule")
    if "--speculative-algorithm" in flags:
        _sglang_speculative(s, flags, used)
    if "--moe-a2a-backend" in flags:
        used.add("--moe-a2a-backend")
        s.estimator_kw["moe_comm"] = "gather" if str(flags["--moe-a2a-backend"]).lower() == "none" else "alltoall"
    _cuda_graphs(s, flags, used)
    _moe_runner(s, flags, used, "--moe-runner-backend")
    return _finish(s, flags, used)


_TRTLLM_MOE = {"TRTLLM": "trtllm", "CUTLASS": "cutlass", "DEEPGEMM": "deepgemm"}
#: extra-options keys that do not change a prediction
_TRTLLM_PLUMBING = {"print_iter_log", "backend", "trust_remote_code", "return_perf_metrics", "stream_interval"}


def parse_trtllm_options(options: dict, name: str = "extra options") -> EngineSettings:
    """:class:`EngineSettings` of TensorRT-LLM's LLM-API options (the ``--extra_llm_api_options``
    YAML, or a whole engine configuration in the same names)."""
    if not isinstance(options, dict):
        raise InvalidInputError(f"{name}: TensorRT-LLM options are a YAML mapping", f"got {type(options).__name__}")
    s = EngineSettings("trtllm")
    used: set[str] = set()
    o = dict(options)
    world = _int("tensor_parallel_size", o["tensor_parallel_size"]) if "tensor_parallel_size" in o else None
    adp = bool(o.get("enable_attention_dp", False))
    used |= {"tensor_parallel_size", "enable_attention_dp"} & set(o)
    if world is not None:
        s.layout = {"tp": 1, "attention_dp": world} if adp else {"tp": world, "attention_dp": 1}
    elif adp:
        # the ranks are the TP size of the command line this file goes with
        s.layout = {"enable_attention_dp": True}
    if "pipeline_parallel_size" in o:
        s.layout["pp"] = _int("pipeline_parallel_size", o["pipeline_parallel_size"])
        used.add("pipeline_parallel_size")
    if o.get("context_parallel_size") is not None:
        s.layout["cp"] = _int("context_parallel_size", o["context_parallel_size"])
        used.add("context_parallel_size")
    if o.get("cp_config"):
        used.add("cp_config")
        kind = (o["cp_config"] or {}).get("cp_type", "") if isinstance(o["cp_config"], dict) else ""
        s.notes.append(f"cp_config {kind or '(no cp_type)'}: costed as infercast's context parallelism (prompt split "
                       "over the cp ranks, decode KV sharded over them with the FFN replicated)")
    for key, dst in (("moe_expert_parallel_size", "moe_ep"), ("moe_tensor_parallel_size", "moe_tp")):
        if key in o and o[key] is not None and int(o[key]) > 0:
            s.layout[dst] = _int(key, o[key])
            used.add(key)
    if "max_batch_size" in o:
        s.scheduler["max_batch_size"] = _int("max_batch_size", o["max_batch_size"])
        used.add("max_batch_size")
    if "max_num_tokens" in o:
        s.scheduler["max_num_tokens"] = _int("max_num_tokens", o["max_num_tokens"])
        used.add("max_num_tokens")
    if "enable_chunked_prefill" in o:
        s.scheduler["chunked"] = bool(o["enable_chunked_prefill"])
        used.add("enable_chunked_prefill")
    kv = o.get("kv_cache_config") or {}
    if kv:
        used.add("kv_cache_config")
        if "free_gpu_memory_fraction" in kv:
            s.estimator_kw["kv_memory_fraction"] = _frac("kv_cache_config.free_gpu_memory_fraction",
                                                         kv["free_gpu_memory_fraction"])
        if "dtype" in kv:
            s.estimator_kw["kv_cache_quant"] = _kv_dtype("kv_cache_config.dtype", kv["dtype"])
        extra = sorted(set(kv) - {"free_gpu_memory_fraction", "dtype"})
        if extra:
            s.notes.append("kv_cache_config keys not modelled, ignored: " + ", ".join(extra))
    spec = o.get("speculative_config")
    if spec:
        used.add("speculative_config")
        _trtllm_speculative(s, spec)
    moe = o.get("moe_config") or {}
    if "backend" in moe:
        used.add("moe_config")
        b = str(moe["backend"]).upper()
        if b not in _TRTLLM_MOE:
            raise InvalidInputError(f"moe_config.backend {moe['backend']!r} is not a kernel family infercast models",
                                    "known: " + ", ".join(_TRTLLM_MOE))
        s.estimator_kw["moe_kernel"] = _TRTLLM_MOE[b]
    adp_cfg = o.get("attention_dp_config") or {}
    if adp_cfg:
        used.add("attention_dp_config")
        if adp_cfg.get("enable_balance"):
            s.scheduler["adp_balance_timeout_steps"] = _int("attention_dp_config.timeout_iters",
                                                            adp_cfg.get("timeout_iters", 50))
        else:
            s.scheduler["adp_balance_timeout_steps"] = 0
    if "batch_wait_timeout_iters" in o:
        s.scheduler["batch_wait_iters"] = int(o["batch_wait_timeout_iters"])
        used.add("batch_wait_timeout_iters")
    if "batch_wait_max_tokens_ratio" in o:
        r = float(o["batch_wait_max_tokens_ratio"])
        if not 0.0 <= r <= 1.0:
            raise InvalidInputError(f"batch_wait_max_tokens_ratio is a share of max_num_tokens (0-1), got {r}")
        s.scheduler["batch_wait_max_tokens_ratio"] = r
        used.add("batch_wait_max_tokens_ratio")
    if o.get("disable_overlap_scheduler"):
        s.scheduler["overlap"] = False
    used |= {"disable_overlap_scheduler"} & set(o)
    s.read = sorted(used)
    s.ignored = sorted(k for k in o if k not in used and k not in _TRTLLM_PLUMBING)
    if s.ignored:
        s.notes.append("not modelled, ignored: " + ", ".join(s.ignored))
    return s


def _trtllm_cmd(argv: list[str]) -> EngineSettings:
    pos, flags = _tokens(argv[1:], "trtllm")
    options: dict = {}
    if "--extra_llm_api_options" in flags or "--config" in flags:
        key = "--extra_llm_api_options" if "--extra_llm_api_options" in flags else "--config"
        options = load_yaml(flags[key], key)
    # the command line's sizes, in the LLM API's names, under the file's other options
    names = {"--tp_size": "tensor_parallel_size", "--pp_size": "pipeline_parallel_size", "--ep_size": "moe_expert_parallel_size",
             "--cp_size": "context_parallel_size", "--max_batch_size": "max_batch_size", "--max_num_tokens": "max_num_tokens"}
    for flag, key in names.items():
        if flag in flags:
            options.setdefault(key, _int(flag, flags[flag]))
    if "--kv_cache_free_gpu_memory_fraction" in flags:
        kv = dict(options.get("kv_cache_config") or {})
        kv.setdefault("free_gpu_memory_fraction", _frac("--kv_cache_free_gpu_memory_fraction",
                                                        flags["--kv_cache_free_gpu_memory_fraction"]))
        options["kv_cache_config"] = kv
    s = parse_trtllm_options(options)
    s.model = pos[0] if pos else None
    used = set(names) | {"--kv_cache_free_gpu_memory_fraction", "--extra_llm_api_options", "--config"}
    if "--num_postprocess_workers" in flags:
        from .backends import TRTLLM_POSTPROCESS_FRONT_END_MS

        if _int("--num_postprocess_workers", flags["--num_postprocess_workers"]) > 0:
            # the workers take detokenising and streaming out of the API server's loop
            s.scheduler.update(arrival_delay_ms=TRTLLM_POSTPROCESS_FRONT_END_MS, front_end_per_stream_ms=0.0)
        used.add("--num_postprocess_workers")
    cmd_ignored = sorted(k for k in flags if k not in used and k not in _PLUMBING)
    s.read = sorted(set(s.read) | (used & set(flags)))
    s.ignored = sorted(set(s.ignored) | set(cmd_ignored))
    s.notes = [n for n in s.notes if not n.startswith("not modelled")]
    if s.ignored:
        s.notes.append("not modelled, ignored: " + ", ".join(s.ignored))
    return s


def load_yaml(path, flag: str = "--engine-args") -> dict:
    """A YAML mapping from ``path`` (an engine's options file)."""
    import yaml

    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise InvalidInputError(f"cannot read {flag} {p}", exc.strerror or str(exc)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise InvalidInputError(f"{flag} {p}{f', line {mark.line + 1}' if mark else ''}: not valid YAML",
                                str(getattr(exc, "problem", exc))) from None
    if not isinstance(data, dict):
        raise InvalidInputError(f"{flag} {p}: expected a YAML mapping of options", f"got {type(data).__name__}")
    return data


def parse_engine_file(path) -> EngineSettings:
    """:class:`EngineSettings` of a file: a TensorRT-LLM options YAML, or a text file holding
    one engine command line (``#`` comments and line continuations allowed)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise InvalidInputError(f"cannot read --engine-args {p}", exc.strerror or str(exc)) from None
    body = " ".join(ln.rstrip("\\").strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#"))
    first = body.split(" ", 1)[0] if body else ""
    if first and (Path(first).name in ("trtllm-serve", "vllm", "python", "python3") or "sglang" in first):
        return parse_engine_cmd(body)
    return parse_trtllm_options(load_yaml(p), str(p))
