"""Launch files for a predicted deployment: the engine command lines (and TensorRT-LLM's
extra-options YAML) that run the settings the prediction assumed, a Dynamo-style Kubernetes
manifest, and the benchmark commands that measure what the prediction states.

The translation is one way, from infercast's inputs to each engine's own flag names:

* **Layout.** infercast's ``tp`` is the tensor-parallel size *per attention-DP rank*, so a worker
  runs ``tp x pp x attention_dp`` GPUs, and its experts are split ``moe_tp x moe_ep`` over the
  ``tp x attention_dp`` GPUs of a stage. TensorRT-LLM (``trtllm-serve --tp_size``) and SGLang
  (``--tp-size``) count every GPU of a stage in their TP size and turn attention DP on beside it
  (``enable_attention_dp``; ``--enable-dp-attention --dp-size``); vLLM counts TP per data-parallel
  rank (``--tensor-parallel-size`` with ``--data-parallel-size``). A layout an engine cannot run is
  refused with :class:`~infercast.errors.NotAvailableError` naming why: TensorRT-LLM's attention
  DP runs attention at TP 1 per rank; vLLM splits experts either by TP over every GPU of the stage
  or by EP over them (``--enable-expert-parallel``), never both. Context-parallel ranks
  (``cp``, beside the TP group): TensorRT-LLM's ``context_parallel_size`` (extra options), vLLM's
  ``--prefill-context-parallel-size`` and SGLang's ``--attn-cp-size`` with ``--enable-prefill-cp``
  (counted inside its ``--tp-size``, as :mod:`infercast.serving.engine_args` reads them).
* **Scheduler.** :class:`~infercast.serving.backends.SchedulerParams` fields map to the engine's
  token budget, running-request cap, chunked prefill, attention-DP balance hold, context batching
  delay, receive interval and mixed chunks.
* **Hardware.** Each worker kind names the system it was predicted on (and its GPU memory):
  prefill and decode workers may run on different systems (``search --decode-system``). The
  launch scripts and ``deployment.json`` state it per worker kind; the Kubernetes manifest puts
  it on each worker service as the annotation :data:`SYSTEM_KEY`, and when the worker kinds run on
  different systems also as a ``nodeSelector`` on that key, so that each kind's pods land on
  nodes labelled with its system (``kubectl label node NODE infercast/system=SYSTEM``).
* **Memory and precision.** The KV memory knob (``free_gpu_memory_fraction`` /
  ``gpu_memory_utilization`` / ``mem_fraction_static``, each in the engine's own sense), the KV
  cache dtype, speculative decoding (MTP, EAGLE / EAGLE-3, n-gram, draft model: vLLM's
  ``--speculative-config``, SGLang's ``--speculative-algorithm`` flags, TensorRT-LLM's
  ``speculative_config``; an EAGLE head sized from the target is written as
  :data:`DRAFT_PLACEHOLDER`, for the user to replace) and the MoE kernel family.

Sources: ``trtllm-serve --help`` and the LLM API's option names (``kv_cache_config``,
``speculative_config``, ``attention_dp_config``, ``moe_config``, ``batch_wait_timeout_iters``);
``vllm serve --help``; ``python -m sglang.launch_server --help``; NVIDIA Dynamo's
``DynamoGraphDeployment`` resource; AIPerf's ``profile`` and vLLM's ``bench serve`` options.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field


from ..errors import InvalidInputError, NotAvailableError

BACKENDS = ("trtllm", "vllm", "sglang")
#: the Kubernetes annotation / node-label key naming the system a worker kind was predicted on
SYSTEM_KEY = "infercast/system"


@dataclass(frozen=True)
class WorkerSpec:
    """One kind of engine worker (an aggregated replica, or a prefill or decode worker) and the
    settings the prediction assumed for it.

    ``tp``, ``pp``, ``attention_dp``, ``moe_tp``, ``moe_ep`` are infercast's layout (see the
    module docstring); ``max_num_tokens`` and ``max_batch_size`` the step's token budget and
    running-request cap; ``chunked`` chunked prefill; ``kv_memory_fraction`` the engine's KV
    memory knob in its own sense; ``kv_cache_dtype`` ``"bfloat16"`` / ``"fp8"``; ``nextn`` MTP
    draft tokens (0: off) of the speculative method ``spec_method`` (vLLM's names: ``mtp``,
    ``eagle``, ``eagle3``, ``ngram``, ``draft_model``) with its ``draft_model`` / ``draft_tp`` and
    n-gram window ``prompt_lookup_min`` / ``prompt_lookup_max``; ``moe_kernel`` the expert kernel family, or None for the engine's
    default; ``system``, ``backend_version`` and ``gpu_memory_gib`` the system (pack name), data
    version and GPU memory (GiB, the unit GPUs are sold in: 141 on an H200) the worker kind was
    predicted on ("" / 0 when not known); the remaining fields are the scheduler settings of the
    same names in
    :class:`~infercast.serving.backends.SchedulerParams`."""

    role: str  # "agg" | "prefill" | "decode"
    workers: int
    tp: int = 1
    pp: int = 1
    attention_dp: int = 1
    moe_tp: int = 1
    moe_ep: int = 1
    max_num_tokens: int = 8192
    max_batch_size: int = 256
    chunked: bool = True
    kv_memory_fraction: float = 0.9
    kv_cache_dtype: str = "bfloat16"
    nextn: int = 0
    moe_kernel: str | None = None
    is_moe: bool = False
    spec_method: str = "mtp"
    draft_model: str | None = None
    draft_tp: int | None = None
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    adp_balance_timeout_steps: int = 0
    batch_wait_iters: int = 0
    batch_wait_max_tokens_ratio: float = 0.0
    recv_interval: int = 1
    mixed: bool = True
    cp: int = 1
    system: str = ""
    backend_version: str = ""
    gpu_memory_gib: float = 0.0

    @property
    def gpus(self) -> int:
        """GPUs of one worker."""
        return self.tp * self.pp * self.attention_dp * self.cp

    @property
    def hardware(self) -> str:
        """The system and GPU memory in words (empty when not known)."""
        if not self.system:
            return ""
        return self.system + (f" ({self.gpu_memory_gib:.0f} GiB per GPU)" if self.gpu_memory_gib else "")


@dataclass(frozen=True)
class Deployment:
    """What to launch: a model served by ``backend`` as aggregated replicas (one ``agg`` worker
    spec) or as disaggregated prefill and decode pools, benchmarked by ``concurrency`` clients of
    ``isl`` + ``osl`` tokens."""

    model: str
    backend: str
    backend_version: str
    workers: tuple[WorkerSpec, ...]
    isl: int
    osl: int
    concurrency: int
    image: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    prefix: int = 0  # cached prompt tokens every request starts with (one shared prefix)

    @property
    def disaggregated(self) -> bool:
        return any(w.role != "agg" for w in self.workers)

    @property
    def gpus(self) -> int:
        return sum(w.workers * w.gpus for w in self.workers)

    @property
    def systems(self) -> dict[str, str]:
        """{role: system} of the worker kinds whose system is known."""
        return {w.role: w.system for w in self.workers if w.system}

    @property
    def mixed_systems(self) -> bool:
        """Whether the worker kinds run on different systems."""
        return len(set(self.systems.values())) > 1


def worker_spec(est, params, role: str = "agg", workers: int = 1) -> WorkerSpec:
    """The :class:`WorkerSpec` of an :class:`~infercast.Estimator` ``est`` served with scheduler
    parameters ``params`` (what the prediction ran with)."""
    p = est.plan.parallel
    q = est.spec.quant
    return WorkerSpec(
        role=role, workers=int(workers), tp=p.tp, pp=p.pp, attention_dp=p.attention_dp, moe_tp=p.etp, moe_ep=p.ep,
        max_num_tokens=int(params.max_num_tokens), max_batch_size=int(params.max_batch_size), chunked=bool(params.chunked),
        kv_memory_fraction=float(est.backend.kv_memory_fraction), kv_cache_dtype=str(q.kv_cache or "bfloat16"),
        nextn=int(est.plan.spec_decode.nextn), moe_kernel=_moe_kernel(est), is_moe=est.spec.moe is not None,
        adp_balance_timeout_steps=int(params.adp_balance_timeout_steps), batch_wait_iters=int(params.batch_wait_iters),
        batch_wait_max_tokens_ratio=float(params.batch_wait_max_tokens_ratio), recv_interval=int(params.recv_interval),
        mixed=bool(params.mixed), cp=int(p.cp), **_speculative_fields(est),
        system=str(est.data.system.name), backend_version=str(est.version),
        gpu_memory_gib=float(est.data.system.gpu.mem_capacity) / 2**30,
    )


def _speculative_fields(est) -> dict:
    """The WorkerSpec speculative fields of ``est``'s plan (the draft as the user named it)."""
    sd = est.plan.spec_decode
    if sd.method == "mtp" or not sd.nextn:
        return {}
    tp = est.plan.draft_parallel.tp if est.plan.draft_parallel is not None and sd.draft_tp else None
    return {"spec_method": sd.method, "draft_model": sd.draft, "draft_tp": tp,
            "prompt_lookup_min": sd.prompt_lookup_min, "prompt_lookup_max": sd.prompt_lookup_max}


def _moe_kernel(est) -> str | None:
    """The MoE kernel family the plan's expert ops were pinned to (``--moe-kernel``), else None."""
    for op in est.plan.ops:
        if op.kind == "moe" and op.params.get("kernel"):
            return str(op.params["kernel"])
    return None


# ---- engine command lines ---------------------------------------------------------------------

_TRTLLM_MOE_BACKEND = {"trtllm": "TRTLLM", "cutlass": "CUTLASS", "deepgemm": "DEEPGEMM"}


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise InvalidInputError(f"no launch files for backend {backend!r}", "known: " + ", ".join(BACKENDS))


def trtllm_extra_options(w: WorkerSpec) -> dict:
    """TensorRT-LLM's extra LLM-API options (the ``--extra_llm_api_options`` YAML) for ``w``."""
    opts: dict = {
        "enable_chunked_prefill": w.chunked,
        "kv_cache_config": {"free_gpu_memory_fraction": w.kv_memory_fraction,
                            "dtype": "fp8" if w.kv_cache_dtype == "fp8" else "auto"},
    }
    if w.cp > 1:
        opts["context_parallel_size"] = w.cp
    if w.attention_dp > 1:
        opts["enable_attention_dp"] = True
        if w.adp_balance_timeout_steps > 0:
            opts["attention_dp_config"] = {"enable_balance": True, "timeout_iters": w.adp_balance_timeout_steps}
    if w.is_moe:
        opts["moe_tensor_parallel_size"] = w.moe_tp
        opts["moe_expert_parallel_size"] = w.moe_ep
    if w.moe_kernel in _TRTLLM_MOE_BACKEND:
        opts["moe_config"] = {"backend": _TRTLLM_MOE_BACKEND[w.moe_kernel]}
    if w.nextn > 0:
        opts["speculative_config"] = _trtllm_speculative(w)
    if w.batch_wait_iters > 0:
        opts["batch_wait_timeout_iters"] = w.batch_wait_iters
        opts["batch_wait_max_tokens_ratio"] = w.batch_wait_max_tokens_ratio
    if w.role != "agg":
        opts["cache_transceiver_config"] = {"backend": "DEFAULT"}
    return opts


def trtllm_command(model: str, w: WorkerSpec, options_file: str = "extra_llm_api_options.yaml") -> list[str]:
    """``trtllm-serve`` argv for ``w`` (its extra options in ``options_file``)."""
    if w.attention_dp > 1 and w.tp > 1:
        raise NotAvailableError(
            f"TensorRT-LLM cannot run TP {w.tp} inside each of {w.attention_dp} attention-DP ranks",
            "its attention DP runs attention at TP 1 per rank (enable_attention_dp with tp_size = the ranks)")
    return ["trtllm-serve", model, "--backend", "pytorch", "--host", "0.0.0.0", "--port", "8000",
            "--tp_size", str(w.tp * w.attention_dp), "--pp_size", str(w.pp), "--ep_size", str(w.moe_ep),
            "--max_batch_size", str(w.max_batch_size), "--max_num_tokens", str(w.max_num_tokens),
            "--kv_cache_free_gpu_memory_fraction", str(w.kv_memory_fraction),
            "--extra_llm_api_options", options_file]


def vllm_command(model: str, w: WorkerSpec) -> list[str]:
    """``vllm serve`` argv for ``w``."""
    argv = ["vllm", "serve", model, "--host", "0.0.0.0", "--port", "8000",
            "--tensor-parallel-size", str(w.tp), "--pipeline-parallel-size", str(w.pp)]
    if w.attention_dp > 1:
        argv += ["--data-parallel-size", str(w.attention_dp)]
    if w.cp > 1:
        argv += ["--prefill-context-parallel-size", str(w.cp)]
    if w.is_moe:
        stage = w.tp * w.attention_dp
        if w.moe_ep == stage:
            if w.moe_ep > 1:
                argv.append("--enable-expert-parallel")
        elif w.moe_tp != stage:
            raise NotAvailableError(
                f"vLLM cannot split experts as TP {w.moe_tp} x EP {w.moe_ep}",
                f"it runs them either TP {stage} or, with --enable-expert-parallel, EP {stage} over a stage's GPUs")
    argv += ["--max-num-seqs", str(w.max_batch_size), "--max-num-batched-tokens", str(w.max_num_tokens),
             "--gpu-memory-utilization", str(w.kv_memory_fraction),
             "--enable-chunked-prefill" if w.chunked else "--no-enable-chunked-prefill"]
    if w.kv_cache_dtype == "fp8":
        argv += ["--kv-cache-dtype", "fp8"]
    if w.nextn > 0:
        argv += ["--speculative-config", json.dumps(_vllm_speculative(w))]
    if w.moe_kernel == "triton":
        argv += ["--moe-backend", "triton"]
    if w.role != "agg":
        argv += ["--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})]
    return argv


def sglang_command(model: str, w: WorkerSpec) -> list[str]:
    """``python -m sglang.launch_server`` argv for ``w``."""
    argv = ["python", "-m", "sglang.launch_server", "--model-path", model, "--host", "0.0.0.0", "--port", "8000",
            "--tp-size", str(w.tp * w.attention_dp * w.cp), "--pp-size", str(w.pp)]
    if w.attention_dp > 1:
        argv += ["--dp-size", str(w.attention_dp), "--enable-dp-attention"]
    if w.cp > 1:
        argv += ["--attn-cp-size", str(w.cp), "--enable-prefill-cp"]
    if w.is_moe and w.moe_ep > 1:
        argv += ["--ep-size", str(w.moe_ep)]
    argv += ["--max-running-requests", str(w.max_batch_size),
             "--chunked-prefill-size", str(w.max_num_tokens if w.chunked else -1),
             "--mem-fraction-static", str(w.kv_memory_fraction)]
    if w.kv_cache_dtype == "fp8":
        argv += ["--kv-cache-dtype", "fp8_e4m3"]
    if w.mixed:
        argv.append("--enable-mixed-chunk")
    if w.recv_interval > 1:
        argv += ["--scheduler-recv-interval", str(w.recv_interval)]
    if w.nextn > 0:
        argv += _sglang_speculative(w)
    if w.moe_kernel == "triton":
        argv += ["--moe-runner-backend", "triton"]
    if w.role != "agg":
        argv += ["--disaggregation-mode", w.role]
    return argv


#: what stands for the EAGLE head's checkpoint when the estimate sized it from the target (no
#: ``--draft-model``): the engines need a path, which the user supplies
DRAFT_PLACEHOLDER = "PATH_TO_DRAFT_CHECKPOINT"


def _draft(w: WorkerSpec) -> str:
    return w.draft_model or DRAFT_PLACEHOLDER


def _trtllm_speculative(w: WorkerSpec) -> dict:
    """TensorRT-LLM's ``speculative_config`` for ``w``'s method."""
    if w.spec_method == "mtp":
        return {"decoding_type": "MTP", "num_nextn_predict_layers": w.nextn}
    kind = {"eagle": "Eagle", "eagle3": "Eagle3", "ngram": "NGram", "draft_model": "DraftTarget"}[w.spec_method]
    cfg = {"decoding_type": kind, "max_draft_len": w.nextn}
    if w.spec_method == "ngram":
        if w.prompt_lookup_max:
            cfg["max_matching_ngram_size"] = w.prompt_lookup_max
    else:
        cfg["speculative_model_dir"] = _draft(w)
    return cfg


def _vllm_speculative(w: WorkerSpec) -> dict:
    """vLLM's ``--speculative-config`` for ``w``'s method."""
    cfg: dict = {"method": w.spec_method, "num_speculative_tokens": w.nextn}
    if w.spec_method in ("eagle", "eagle3", "draft_model"):
        cfg["model"] = _draft(w)
        if w.draft_tp:
            cfg["draft_tensor_parallel_size"] = w.draft_tp
    for key in ("prompt_lookup_min", "prompt_lookup_max"):
        if getattr(w, key):
            cfg[key] = getattr(w, key)
    return cfg


def _sglang_speculative(w: WorkerSpec) -> list[str]:
    """SGLang's speculative flags for ``w``'s method: a chain (top-k 1) of ``nextn`` steps; MTP
    runs as ``EAGLE`` over the checkpoint's MTP layers; n-gram verifies ``nextn + 1`` tokens."""
    if w.spec_method == "ngram":
        argv = ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(w.nextn + 1)]
        if w.prompt_lookup_min:
            argv += ["--speculative-ngram-min-match-window-size", str(w.prompt_lookup_min)]
        if w.prompt_lookup_max:
            argv += ["--speculative-ngram-max-match-window-size", str(w.prompt_lookup_max)]
        return argv
    algo = {"mtp": "EAGLE", "eagle": "EAGLE", "eagle3": "EAGLE3", "draft_model": "STANDALONE"}[w.spec_method]
    argv = ["--speculative-algorithm", algo]
    if w.spec_method != "mtp":
        argv += ["--speculative-draft-model-path", _draft(w)]
    return argv + ["--speculative-num-steps", str(w.nextn), "--speculative-eagle-topk", "1",
                   "--speculative-num-draft-tokens", str(w.nextn + 1)]


def engine_command(d: Deployment, w: WorkerSpec) -> list[str]:
    """The engine's argv for one worker of ``d``."""
    _check_backend(d.backend)
    if d.backend == "trtllm":
        return trtllm_command(d.model, w, f"extra_llm_api_options_{w.role}.yaml")
    if d.backend == "vllm":
        return vllm_command(d.model, w)
    return sglang_command(d.model, w)


# ---- benchmark commands -----------------------------------------------------------------------


def benchmark_commands(d: Deployment, requests_per_client: int = 10) -> dict[str, list[str]]:
    """Client commands that measure what the prediction states: ``concurrency`` streaming clients
    of exactly ``isl`` prompt and ``osl`` output tokens (end-of-sequence ignored), against the
    server on ``localhost:8000``; with a ``prefix``, every prompt starts with one shared prefix of
    that many tokens (AIPerf's prefix prompts, ``vllm bench serve --random-prefix-len``), the
    ``isl`` random tokens after it."""
    n = max(1, int(requests_per_client)) * d.concurrency
    aiperf = ["aiperf", "profile", "--model", d.model, "--url", "http://localhost:8000", "--endpoint-type", "chat",
              "--streaming", "--synthetic-input-tokens-mean", str(d.isl), "--synthetic-input-tokens-stddev", "0",
              "--output-tokens-mean", str(d.osl), "--output-tokens-stddev", "0", "--extra-inputs", "ignore_eos:true",
              "--concurrency", str(d.concurrency), "--request-count", str(n)]
    vllm_bench = ["vllm", "bench", "serve", "--model", d.model, "--base-url", "http://localhost:8000",
                  "--dataset-name", "random", "--random-input-len", str(d.isl), "--random-output-len", str(d.osl),
                  "--random-range-ratio", "0", "--ignore-eos", "--max-concurrency", str(d.concurrency),
                  "--num-prompts", str(n)]
    if d.prefix:
        aiperf += ["--num-prefix-prompts", "1", "--prefix-prompt-length", str(d.prefix)]
        vllm_bench += ["--random-prefix-len", str(d.prefix)]
    return {"aiperf": aiperf, "vllm_bench_serve": vllm_bench}


# ---- Kubernetes --------------------------------------------------------------------------------

_DYNAMO_MODULE = {"trtllm": "dynamo.trtllm", "vllm": "dynamo.vllm", "sglang": "dynamo.sglang"}
#: where the manifest's ConfigMap of TensorRT-LLM engine configurations is mounted
TRTLLM_CONFIG_DIR = "/config"


def trtllm_engine_config(w: WorkerSpec) -> dict:
    """TensorRT-LLM's whole engine configuration for ``w`` in LLM-API names (what Dynamo's
    TensorRT-LLM worker reads from ``--extra-engine-args``): the command line's sizes and limits
    plus :func:`trtllm_extra_options`."""
    trtllm_command("-", w)  # refuses layouts TensorRT-LLM cannot run
    return {"tensor_parallel_size": w.tp * w.attention_dp, "pipeline_parallel_size": w.pp,
            "moe_expert_parallel_size": w.moe_ep, "max_batch_size": w.max_batch_size,
            "max_num_tokens": w.max_num_tokens, **trtllm_extra_options(w)}


def _dynamo_args(d: Deployment, w: WorkerSpec) -> list[str]:
    """The Dynamo worker's arguments for ``w``: vLLM's and SGLang's take the engine's own flags
    (without the server's host and port), TensorRT-LLM's an engine-configuration file."""
    if d.backend == "trtllm":
        args = ["--model-path", d.model, "--extra-engine-args", f"{TRTLLM_CONFIG_DIR}/{w.role}.yaml"]
    else:
        argv = engine_command(d, w)
        skip = {"--host", "--port", "--kv-transfer-config", "--disaggregation-mode"}
        body = argv[3:] if d.backend == "vllm" else argv[5:]  # drop the program and the model
        args = ["--model" if d.backend == "vllm" else "--model-path", d.model]
        i = 0
        while i < len(body):
            if body[i] in skip:
                i += 2
                continue
            args.append(body[i])
            i += 1
    if w.role != "agg":
        args += ["--disaggregation-mode", w.role]
    return args


def dynamo_manifest(d: Deployment, name: str = "infercast-deployment") -> list[dict]:
    """Kubernetes documents for ``d`` in the shape of NVIDIA Dynamo's ``DynamoGraphDeployment``: a
    frontend and one service per worker kind (replicas, GPUs per replica, the backend's Dynamo
    worker with the engine settings); for TensorRT-LLM also a ConfigMap holding each worker kind's
    engine configuration, mounted at :data:`TRTLLM_CONFIG_DIR`."""
    import yaml

    _check_backend(d.backend)
    services: dict = {"Frontend": {"componentType": "frontend", "replicas": 1,
                                   "extraPodSpec": {"mainContainer": {"command": ["python3", "-m", "dynamo.frontend"]}}}}
    docs: list[dict] = []
    for w in d.workers:
        container: dict = {"command": ["python3", "-m", _DYNAMO_MODULE[d.backend]], "args": _dynamo_args(d, w)}
        if d.image:
            container["image"] = d.image
        svc: dict = {"componentType": "worker", "replicas": w.workers, "resources": {"limits": {"gpu": str(w.gpus)}},
                     "extraPodSpec": {"mainContainer": container}}
        if w.role != "agg":
            svc["subComponentType"] = w.role
        if w.system:
            svc["annotations"] = {SYSTEM_KEY: w.system}
            if d.mixed_systems:  # each kind's pods on its own hardware
                svc["extraPodSpec"]["nodeSelector"] = {SYSTEM_KEY: w.system}
        if d.backend == "trtllm":
            container["volumeMounts"] = [{"name": "engine-config", "mountPath": TRTLLM_CONFIG_DIR}]
            svc["extraPodSpec"]["volumes"] = [{"name": "engine-config", "configMap": {"name": f"{name}-engine-config"}}]
        services[f"{w.role.capitalize()}Worker"] = svc
    if d.backend == "trtllm":
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{name}-engine-config"},
                     "data": {f"{w.role}.yaml": yaml.safe_dump(trtllm_engine_config(w), sort_keys=True)
                              for w in d.workers}})
    docs.append({"apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoGraphDeployment", "metadata": {"name": name},
                 "spec": {"services": services}})
    return docs


# ---- files -----------------------------------------------------------------------------------


def launch_files(d: Deployment) -> dict[str, str]:
    """{file name: text}: per worker kind a shell script with the engine command (and
    TensorRT-LLM's extra-options YAML), ``k8s_dynamo.yaml``, ``benchmark.sh`` and
    ``deployment.json`` (the settings, for scripts)."""
    import yaml

    _check_backend(d.backend)
    files: dict[str, str] = {}
    for w in d.workers:
        argv = engine_command(d, w)
        on = f" on {w.hardware}" if w.hardware else ""
        head = (f"# {w.role} worker: {w.workers} x {w.gpus} GPU(s){on}; {d.backend} {w.backend_version or d.backend_version}\n"
                f"# infercast layout: tp {w.tp}, pp {w.pp}, attention-dp {w.attention_dp}, "
                f"moe-tp {w.moe_tp}, moe-ep {w.moe_ep}{f', cp {w.cp}' if w.cp > 1 else ''}\n")
        files[f"launch_{w.role}.sh"] = "#!/usr/bin/env bash\n" + head + shlex.join(argv) + "\n"
        if d.backend == "trtllm":
            files[f"extra_llm_api_options_{w.role}.yaml"] = yaml.safe_dump(trtllm_extra_options(w), sort_keys=True)
    files["k8s_dynamo.yaml"] = yaml.safe_dump_all(dynamo_manifest(d), sort_keys=False)
    bench = benchmark_commands(d)
    files["benchmark.sh"] = ("#!/usr/bin/env bash\n# measures what the prediction states: "
                             f"{d.concurrency} clients, {d.isl} prompt + {d.osl} output tokens"
                             + (f" after a shared {d.prefix}-token prefix" if d.prefix else "") + "\n"
                             + "\n".join(f"# {k}\n{shlex.join(v)}" for k, v in bench.items()) + "\n")
    files["deployment.json"] = json.dumps(
        {"model": d.model, "backend": d.backend, "backend_version": d.backend_version, "isl": d.isl, "osl": d.osl,
         "prefix": d.prefix,
         "concurrency": d.concurrency, "gpus": d.gpus, "systems": d.systems, "notes": list(d.notes),
         "workers": [{**w.__dict__, "gpus_per_worker": w.gpus} for w in d.workers]}, indent=1)
    return files
