"""Per-backend serving defaults that move the numbers. Each is a named parameter with its source.

Values are the engines' documented defaults for the versions in the pack:

* ``kv_memory_fraction`` / ``fraction_of``: how the engine sizes its KV cache.
  TensorRT-LLM ``KvCacheConfig.free_gpu_memory_fraction`` = 0.9 of the memory *free after* weights
  and activations; vLLM ``gpu_memory_utilization`` = 0.9 of *total* GPU memory for everything;
  SGLang ``mem_fraction_static`` ~0.88 of total for weights + KV only — activations, CUDA graphs
  and NCCL live outside it (SGLang derives the value from GPU memory and TP size; 0.88 is typical
  of 80-141 GB parts, e.g. 0.897 on H200 at TP8).
* ``tokens_per_block``: KV paging granularity (trtllm 32, vllm 16, sglang page size 1).
* ``max_num_tokens``: token budget of one step (trtllm ``max_num_tokens`` 8192, vLLM
  ``max_num_batched_tokens`` 8192 for online serving on >= 70 GiB GPUs other than A100, 2048
  elsewhere, SGLang ``chunked_prefill_size`` 2048 / 8192 / 16384 by GPU memory; see
  :func:`scheduler_params`).
* ``max_batch_size``: sequences per step (trtllm 2048, vLLM ``max_num_seqs`` 1024 (v1 engine on
  H100-class GPUs, 256 elsewhere), SGLang ``max_running_requests`` bounded by the KV pool -> 4096 here).
* ``step_overhead_ms``: host-side scheduling / launch cost per iteration not in the kernel
  tables. A starting point; the scheduler's fitted values are in :data:`SCHEDULERS`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class BackendDefaults:
    name: str
    kv_memory_fraction: float
    fraction_of: str  # "free" (after weights + activations) | "total" (everything) | "static" (weights + KV)
    tokens_per_block: int
    max_num_tokens: int
    max_batch_size: int
    step_overhead_ms: float


BACKENDS = {
    "trtllm": BackendDefaults("trtllm", 0.90, "free", 32, 8192, 2048, 0.0),
    "vllm": BackendDefaults("vllm", 0.90, "total", 16, 8192, 1024, 0.0),
    "sglang": BackendDefaults("sglang", 0.88, "static", 1, 8192, 4096, 0.0),
}


def backend_defaults(name: str) -> BackendDefaults:
    return BACKENDS[name]


@dataclass(frozen=True)
class SchedulerParams:
    """How a backend's scheduler composes steps (see :mod:`infercast.serving.sim`).

    * ``mixed``: prefill rides in the same step as decodes (TensorRT-LLM in-flight batching, vLLM
      chunked prefill) or runs as separate steps that pause decoding (SGLang without
      ``--enable-mixed-chunk``, its default).
    * ``chunked``: a prompt longer than the room left in the budget is split across steps (vLLM and
      SGLang chunked prefill; TensorRT-LLM is modelled chunked too, since its serving recipes enable
      it for long prompts).
    * ``max_num_tokens``: the step's token budget; ``min_prefill_chunk``: the least prefill work a
      step takes when decodes fill the budget.
    * ``max_batch_size``: running requests at most.
    * ``step_overhead_ms``: host time per step not in the kernel tables (scheduling, sampling,
      launch gaps).
    * ``seq_overhead_ms``: host time per step *per sequence in it* (a Python scheduler's and
      output processor's per-request work each iteration), on top of ``step_overhead_ms``.
    * ``overlap``: the scheduler prepares step n+1 on the CPU while the GPU runs step n (SGLang's
      overlap scheduler): a step then takes the longer of its GPU and host time, plus
      ``overlap_residual_ms`` that does not overlap (the hand-off of the sampled tokens).
    * ``schedule_ahead``: the scheduler composes step n+1 while step n runs, so a request that
      arrives during step n is first scheduled into step n+2 (TensorRT-LLM's PyTorch-backend
      overlap scheduler, vLLM's async scheduling; ``overlap`` -- SGLang's overlap scheduler --
      implies it). Read by the request-level simulation (:mod:`infercast.serving.simulate`);
      ``serve``'s steady state takes its wait for a first step from ``WAIT_STEPS`` instead
      (sources: :data:`VLLM_ASYNC_SCHEDULING_FROM`).
    * ``arrival_delay_ms``: client and front-end time between a request's send and its arrival in
      the scheduler's queue (HTTP, tokenisation); it also delays the first token as seen by the
      client.
    * ``front_end_per_stream_ms``: front-end time that grows with the open streams: the benchmark
      client and the engine's API server each run one Python event loop that handles every open
      stream's token events, so a new request's send and its first token's receipt wait behind the
      other streams' work (:meth:`front_end_ms`; :data:`VLLM_FRONT_END_PER_STREAM_MS`,
      :data:`SGLANG_FRONT_END_PER_STREAM_MS`, :data:`TRTLLM_FRONT_END_PER_STREAM_MS`).
    * ``front_end_per_prompt_token_ms``: front-end time per prompt token: the API server
      tokenises the prompt's text before the request reaches the engine
      (:data:`VLLM_FRONT_END_PER_PROMPT_TOKEN_MS`).
    * ``requests_per_client``: how many requests each benchmark client sends (the benchmark
      length; the first wave of a closed-loop benchmark starts synchronised).
    * ``lockstep``: requests that start together stay together for the whole benchmark (SGLang's
      prefill-first scheduler pauses every decode to prefill all waiting requests at once, so the
      closed loop of a fixed-length benchmark keeps its waves): the benchmark is played step by
      step over all its waves. Otherwise (mixed prefill/decode steps, or request lengths drawn at
      random) clients drift apart after the first wave and the steady state is solved
      analytically.
    * ``kv_reserve_full``: admission reserves a request's whole ``isl + osl`` KV up front
      (TensorRT-LLM's default ``GUARANTEED_NO_EVICT`` capacity policy) or allocates on demand
      (vLLM, SGLang: a running request holds ``isl + osl/2`` tokens on average; preemption keeps the
      pool full rather than idle).
    * ``graph_batch_sizes``: the decode batch sizes the engine captures CUDA graphs for, with
      padding: a decode-only step of ``d`` sequences runs the graph of the smallest captured size
      ``>= d``, so its token-wise ops (GEMM, MoE, norms, collectives) work on that many rows while
      attention sees the ``d`` real sequences (padded slots have no KV); beyond the largest size
      the step runs unpadded. Empty: no padding (:data:`CUDA_GRAPH_SIZES` gives the sources).
    * ``adp_balance_timeout_steps``: with attention data parallelism, a new request's prefill is
      held until every attention-DP rank has one to run, or until this many steps have passed
      since the hold began, so that no rank prefills while the others decode (TensorRT-LLM's
      ``attention_dp_config``: ``enable_balance``, ``timeout_iters``; see
      :func:`infercast.serving.agg.adp_balance_wait_steps`). 0: no hold.
    * ``batch_wait_iters``, ``batch_wait_max_tokens_ratio``: TensorRT-LLM's context batching
      delay (``batch_wait_timeout_iters``, ``batch_wait_max_tokens_ratio`` of the LLM API):
      waiting prompts are not scheduled until the step's tokens reach that share of
      ``max_num_tokens`` or that many iterations have passed, so more prompts share a prefill
      step (see :func:`infercast.serving.agg.batch_wait_steps`). 0: off (the default).
    * ``recv_interval``: the scheduler takes new requests off its queue only once every this
      many decode iterations, and right after a prefill step (SGLang's
      ``--scheduler-recv-interval``; 1, its default, polls every iteration): a request waits for
      the next poll, and the requests that arrived since the last one are prefilled together
      (see :func:`infercast.serving.agg.recv_poll`).
    * ``kv_length_ratio``: the benchmark's mean request length over its nominal ``isl`` / ``osl``
      (1: every request has the nominal lengths). A client that draws each request's lengths at
      random (InferenceX: uniform on ``[0.8 L, L]``, ratio 0.9) fills the KV cache with the
      requests' actual tokens, so the cache holds ``1 / ratio`` times as many running requests as
      nominal ones would fill; the serving models divide the KV capacity by it. Step costs stay
      at the nominal lengths (the front-end parameters are calibrated there).
    * ``prefill_scale``, ``decode_scale``: multipliers of the GPU time of a step's prefill and
      decode work (1: the perf tables' times). Set by a calibration profile
      (:mod:`infercast.calibrate`) fitted to a user's measured runs; applied by
      :func:`infercast.serving.scaled.phase_scaled`.
    """

    mixed: bool
    chunked: bool
    max_num_tokens: int
    max_batch_size: int
    step_overhead_ms: float
    arrival_delay_ms: float
    requests_per_client: float
    kv_reserve_full: bool
    lockstep: bool = False
    min_prefill_chunk: int = 256
    seq_overhead_ms: float = 0.0
    overlap: bool = False
    overlap_residual_ms: float = 0.0
    graph_batch_sizes: tuple[int, ...] = ()
    adp_balance_timeout_steps: int = 0
    front_end_per_stream_ms: float = 0.0
    front_end_per_prompt_token_ms: float = 0.0
    batch_wait_iters: int = 0
    batch_wait_max_tokens_ratio: float = 0.0
    recv_interval: int = 1
    kv_length_ratio: float = 1.0
    prefill_scale: float = 1.0
    decode_scale: float = 1.0
    schedule_ahead: bool = False

    def front_end_ms(self, streams: float, prompt_tokens: float = 0.0) -> float:
        """Client + front-end time of a request of ``prompt_tokens`` prompt tokens while
        ``streams`` requests are open on the replica's front end: ``arrival_delay_ms +
        front_end_per_stream_ms x streams + front_end_per_prompt_token_ms x prompt_tokens``."""
        return (self.arrival_delay_ms + self.front_end_per_stream_ms * float(streams)
                + self.front_end_per_prompt_token_ms * float(prompt_tokens))

    def for_streams(self, streams: float, prompt_tokens: float = 0.0) -> SchedulerParams:
        """These parameters with the front-end time of ``streams`` open streams and a prompt of
        ``prompt_tokens`` tokens folded into ``arrival_delay_ms`` (what the serving models read)."""
        if self.front_end_per_stream_ms == 0.0 and self.front_end_per_prompt_token_ms == 0.0:
            return self
        return replace(self, arrival_delay_ms=self.front_end_ms(streams, prompt_tokens), front_end_per_stream_ms=0.0,
                       front_end_per_prompt_token_ms=0.0)

    def graph_pad(self, decodes: float) -> float:
        """Padding rows a decode-only step of ``decodes`` sequences runs with (0 without a
        captured size that holds it)."""
        sizes = self.graph_batch_sizes
        if not sizes or decodes <= 0 or decodes > sizes[-1]:
            return 0.0
        i = int(np.searchsorted(sizes, decodes - 1e-9))
        return float(sizes[i]) - float(decodes)

    def host_ms(self, seqs) -> float:
        """Host time of one step carrying ``seqs`` sequences (decodes + prefills)."""
        return self.step_overhead_ms + self.seq_overhead_ms * seqs

    def step_ms(self, gpu_ms, seqs):
        """Wall time of one step of ``gpu_ms`` GPU time (scalar or numpy array): GPU + host, or
        with ``overlap`` the longer of the two plus ``overlap_residual_ms``."""
        host = self.host_ms(seqs)
        if self.overlap:
            return np.maximum(gpu_ms, host) + self.overlap_residual_ms
        return gpu_ms + host


def mean_length_ratio(range_ratio: float) -> float:
    """:attr:`SchedulerParams.kv_length_ratio` of a benchmark that draws each request's lengths
    uniformly from ``[range_ratio x L, L]`` (``benchmark_serving --random-range-ratio``): the mean,
    ``(1 + range_ratio) / 2``."""
    r = float(range_ratio)
    if not 0.0 < r <= 1.0:
        raise ValueError(f"a random range ratio is in (0, 1], got {range_ratio}")
    return (1.0 + r) / 2.0


#: ``step_overhead_ms``, ``seq_overhead_ms``, ``arrival_delay_ms``, ``overlap_residual_ms`` and
#: ``requests_per_client`` are fits to the development silicon rows (``python -m
#: benchmarks.calibrate_serving``); the rest are engine defaults. vLLM pays 10 us of host time per
#: sequence per step (a fit to the vLLM rows' TPOT); TensorRT-LLM's C++ runtime pays none. SGLang's
#: overlap scheduler hides its 2 ms host time per step behind the GPU step (``overlap``), leaving
#: 0.5 ms that does not overlap (both fits to the SGLang rows' TPOT); it is off for hybrid
#: linear-attention models (:func:`scheduler_params`). See docs/modelling-log.md, 'Host time per
#: sequence (vLLM)' and 'SGLang overlap scheduler'; benchmark and scheduler variants tried and
#: rejected: 'Benchmark length and step wait', 'TensorRT-LLM admission lag and SGLang lane
#: desynchronisation', 'TensorRT-LLM overlap-scheduler response lag'.
def _sizes(*parts) -> tuple[int, ...]:
    return tuple(sorted({int(x) for part in parts for x in part}))


#: CUDA-graph decode batch sizes with padding, per backend (``graph_batch_sizes``):
#: vLLM (V1 engine): ``[1, 2, 4]``, multiples of 8 below 256, multiples of 16 up to
#: ``min(2 x max_num_seqs, 512)`` = 512 (``VllmConfig`` cudagraph capture sizes); uniform-decode
#: batches are padded to the next size. SGLang: ``[1, 2, 4, 8]`` and multiples of 8 from 16 to
#: 160, to 256 on GPUs with more than 80 GB (``cuda_graph_bs`` / ``cuda_graph_max_bs``
#: defaults, model_runner ``get_batch_sizes_to_capture``); decode batches are padded. TensorRT-LLM:
#: ``CudaGraphConfig.enable_padding`` is False by default, so a batch size outside its list runs
#: without a graph rather than padded: no padding here (the host cost of such eager steps is not
#: modelled). The InferenceX TensorRT-LLM recipes set ``enable_padding: true``; that is not
#: modelled (see docs/modelling-log.md, 'TensorRT-LLM CUDA-graph padding').
CUDA_GRAPH_SIZES = {
    "vllm": _sizes([1, 2, 4], range(8, 256, 8), range(256, 513, 16)),
    "sglang": _sizes([1, 2, 4, 8], range(16, 161, 8)),
    "trtllm": (),
}
SGLANG_LARGE_GPU_GRAPH_SIZES = _sizes(CUDA_GRAPH_SIZES["sglang"], range(160, 257, 8))
SGLANG_GRAPH_LARGE_GPU_BYTES = 80 * 2**30

#: TensorRT-LLM's attention-DP context hold (``adp_balance_timeout_steps``): the attention-DP
#: configurations of NVIDIA's recipe database for DeepSeek-R1 (``examples/configs/database``; the six
#: read: B200 1k1k at concurrency 128 and 256, 1k8k at 256, 8k1k at 64 and 128, H200 8k1k at 128)
#: all set ``attention_dp_config: {enable_balance: true, timeout_iters: 60, batching_wait_iters:
#: 0}``; the mechanism is TensorRT-LLM tech blog 10 ("ADP Balance Strategy"). The library default
#: leaves it off; the recipes are what attention-DP deployments run. SGLang and vLLM have no such
#: hold. See docs/modelling-log.md, 'TensorRT-LLM attention-DP balance hold'.
TRTLLM_ADP_TIMEOUT_STEPS = 60

#: SGLang's per-sequence host time per step (``seq_overhead_ms``): its Python scheduler builds the
#: batch and processes every request's output each iteration (``process_batch_result``, the
#: detokenizer hand-off), work that grows with the running batch. Under the overlap scheduler it is
#: hidden while the GPU step is longer; it surfaces at large batches of short steps. 40 us is a fit
#: to the SGLang development rows' TPOT (see docs/modelling-log.md, 'SGLang per-sequence host time').
SGLANG_SEQ_OVERHEAD_MS = 0.040

#: vLLM's front end: 10 ms per request plus 0.7 ms per open stream (``arrival_delay_ms``,
#: ``front_end_per_stream_ms``) and 3 us per prompt token (:data:`VLLM_FRONT_END_PER_PROMPT_TOKEN_MS`).
#: Both the benchmark client (``vllm bench serve``: one asyncio loop for all streams) and vLLM's API
#: server (its output processor detokenises and sends every stream's tokens in the API-server
#: process) do per-stream work on one core, which is where a new request waits. Disaggregated
#: deployments sit behind their router (Dynamo's), so they take the base only. Both values are fits
#: to the vLLM development rows' TTFT (see docs/modelling-log.md, 'vLLM front end'). TensorRT-LLM's
#: own per-stream term: :data:`TRTLLM_FRONT_END_PER_STREAM_MS`.
VLLM_FRONT_END_MS = 10.0
VLLM_FRONT_END_PER_STREAM_MS = 0.7

#: vLLM's front-end time per prompt token, 3 us: the host work a request's prompt costs before its
#: first step, on the TTFT's path and growing with the prompt -- the API server tokenises the
#: prompt's text (the InferenceX client sends text made of random token ids), and the engine core
#: builds the request from its token ids (with prefix caching, vLLM V1's default, it hashes every
#: KV block of the prompt). The value is a fit, jointly with the 10 ms base, to the development
#: rows' TTFT. The other engines tokenise too, but no such term is applied to them (their rows do
#: not ask for it). A disaggregated deployment's router tokenises
#: (:func:`infercast.serving.disagg.solve_disagg` takes the base only). See docs/modelling-log.md,
#: 'vLLM per-prompt-token front end'.
VLLM_FRONT_END_PER_PROMPT_TOKEN_MS = 0.003

#: TensorRT-LLM's front end per open stream, 0.6 ms, when ``trtllm-serve`` runs without
#: post-processing workers (its default: the API server's own event loop detokenises and streams
#: every open stream's tokens, as vLLM's API server does; with workers,
#: :data:`TRTLLM_POSTPROCESS_FRONT_END_MS` and no per-stream term). A fit to the development rows'
#: TTFT (see docs/modelling-log.md, 'TensorRT-LLM per-stream front end').
TRTLLM_FRONT_END_PER_STREAM_MS = 0.6

#: Front-end and prefill terms tried and rejected (not modelled): see docs/modelling-log.md,
#: 'Front-end load per streamed token', 'Prefill cost per TP doubling', 'Stream interval' and
#: 'TTFT parts bound and SGLang prefill scale'.

#: SGLang's front end: 120 ms per request plus 1.5 ms per open stream. SGLang's tokenizer manager
#: (one asyncio process) receives every stream's detokenised output and writes its chunks to the
#: client, and the benchmark client handles every stream on one loop, as with vLLM's API server.
#: Both values are fits to the SGLang development rows' TTFT. Some (model, cluster) pairs' SGLang
#: rows measure more TTFT than the same build and model on another cluster; no input of a row
#: names that offset, so no per-model or per-prompt-token term stands in for it. See
#: docs/modelling-log.md, 'SGLang front end', 'SGLang front-end base re-swept', 'SGLang Qwen3.5
#: prompt cost', 'SGLang (model, cluster) TTFT offset' and 'SGLang per-prompt-token front end'.
SGLANG_FRONT_END_MS = 120.0
SGLANG_FRONT_END_PER_STREAM_MS = 1.5

#: Which engines compose the next step while the current one runs (``schedule_ahead``): each
#: engine's scheduler loop takes in new requests, composes a batch and launches it, then waits
#: for the *previous* batch's results, so the batch composed at the start of GPU step n runs as
#: step n+1, and a request arriving during step n joins step n+2 at the earliest (one step more
#: than a loop that composes between steps). TensorRT-LLM: the PyTorch backend's overlap scheduler
#: (``PyExecutor``'s overlap loop; on unless ``disable_overlap_scheduler``). vLLM: async
#: scheduling (vllm-project/vllm#19970: "the scheduler operate[s] one step ahead of the current
#: execution"), on by default from v0.14 (vllm-project/vllm#27614, merged after the 0.13 branch;
#: :func:`vllm_async_scheduling`). SGLang: its overlap scheduler (``overlap``). The simulation
#: reads it; see docs/modelling-log.md, 'Scheduling one step ahead in the simulation'. This is
#: the first vLLM release that runs async scheduling by default (:func:`vllm_async_scheduling`).
VLLM_ASYNC_SCHEDULING_FROM = (0, 14, 0)


def vllm_async_scheduling(engine_version: str | None) -> bool:
    """Whether the vLLM build ``engine_version`` (a release such as ``0.12.0``) schedules one step
    ahead by default (:data:`VLLM_ASYNC_SCHEDULING_FROM`). None or a build without a release
    number (a nightly): True, the behaviour of current builds."""
    m = _RELEASE.match(engine_version or "")
    if not m:
        return True
    return tuple(int(x) for x in m.groups()) >= VLLM_ASYNC_SCHEDULING_FROM


SCHEDULERS = {
    "trtllm": SchedulerParams(True, True, 8192, 2048, 0.0, 100.0, 10.0, True, graph_batch_sizes=CUDA_GRAPH_SIZES["trtllm"],
                              adp_balance_timeout_steps=TRTLLM_ADP_TIMEOUT_STEPS,
                              front_end_per_stream_ms=TRTLLM_FRONT_END_PER_STREAM_MS, schedule_ahead=True),
    "vllm": SchedulerParams(True, True, 8192, 1024, 0.0, VLLM_FRONT_END_MS, 10.0, False, seq_overhead_ms=0.010,
                            graph_batch_sizes=CUDA_GRAPH_SIZES["vllm"],
                            front_end_per_stream_ms=VLLM_FRONT_END_PER_STREAM_MS,
                            front_end_per_prompt_token_ms=VLLM_FRONT_END_PER_PROMPT_TOKEN_MS, schedule_ahead=True),
    "sglang": SchedulerParams(False, True, 8192, 4096, 2.0, SGLANG_FRONT_END_MS, 10.0, False, lockstep=True,
                              seq_overhead_ms=SGLANG_SEQ_OVERHEAD_MS, overlap=True, overlap_residual_ms=0.5,
                              graph_batch_sizes=CUDA_GRAPH_SIZES["sglang"],
                              front_end_per_stream_ms=SGLANG_FRONT_END_PER_STREAM_MS),
}


#: SGLang sizes its chunked-prefill budget by GPU memory (``server_args``: ``chunked_prefill_size``
#: 2048 below 35 GiB, 8192 below 160 GiB -- "H100, H200, A100, H20" -- and 16384 from 160 GiB --
#: "B200, MI300"). See docs/modelling-log.md, 'SGLang chunked-prefill size by GPU memory'.
SGLANG_LARGE_GPU_BYTES = 160 * 2**30
SGLANG_LARGE_GPU_CHUNK = 16384
SGLANG_SMALL_GPU_BYTES = 35 * 2**30
SGLANG_SMALL_GPU_CHUNK = 2048

#: vLLM's online-serving defaults by GPU (``EngineArgs.get_batch_defaults``): ``max_num_batched_tokens``
#: 8192 and ``max_num_seqs`` 1024 on GPUs with at least 70 GiB that are not A100s ("a larger
#: ``max_num_batched_tokens`` on A100 reduces throughput", vllm-project/vllm#17885); 2048 and 256
#: elsewhere (A100, L40S, L4, ...). See docs/modelling-log.md, 'vLLM batch defaults by GPU'.
VLLM_LARGE_GPU_BYTES = 70 * 2**30
VLLM_SMALL_GPU_TOKENS, VLLM_SMALL_GPU_SEQS = 2048, 256


#: TensorRT-LLM's front end when ``trtllm-serve`` runs post-processing workers
#: (``num_postprocess_workers`` > 0: detokenisation and response streaming in worker processes
#: instead of the API server's own loop, which otherwise also feeds the executor). The default
#: (:data:`SCHEDULERS`' 100 ms) is the front end of servers without them. The public InferenceX
#: recipes run Llama-3.1-70B with 2 workers and gpt-oss-120b with 4, DeepSeek-R1 with none. 25 ms is
#: a fit to the development rows of the TensorRT-LLM servers with workers (see docs/modelling-log.md,
#: 'TensorRT-LLM post-processing workers').
TRTLLM_POSTPROCESS_FRONT_END_MS = 25.0


def _vllm_small_gpu(system) -> bool:
    return system.gpu.mem_capacity < VLLM_LARGE_GPU_BYTES or "a100" in str(getattr(system, "name", "")).lower()


#: The first SGLang release, and the first nightly build date, whose hybrid linear-attention models
#: (Gated DeltaNet: Qwen3-Next, Qwen3.5) keep the overlap scheduler when the radix cache is off
#: (``--disable-radix-cache``, as the public InferenceX recipes run them): sgl-project/sglang#19169
#: (2026-02-23) notes that the ``no_buffer`` mamba strategy runs with the overlap scheduler once the
#: radix cache is off; the development rows' TPOT places the change between the 2026-02-16 nightly
#: and the 2026-04-02 one. See docs/modelling-log.md, 'SGLang hybrid-model overlap by build'.
SGLANG_HYBRID_OVERLAP_FROM = (0, 5, 10)
SGLANG_HYBRID_OVERLAP_NIGHTLY_FROM = "20260223"
_RELEASE = re.compile(r"(\d+)\.(\d+)\.(\d+)")
_NIGHTLY = re.compile(r"nightly[-\w]*?-(\d{8})(?:-|$)")


def sglang_hybrid_overlap(engine_version: str | None) -> bool:
    """Whether the SGLang build ``engine_version`` (a release ``0.5.10.post1`` or a dated nightly
    ``nightly-dev-20260402-<hash>``) keeps the overlap scheduler for a hybrid linear-attention
    model run without the radix cache (:data:`SGLANG_HYBRID_OVERLAP_FROM`; with the radix cache,
    SGLang's default, :func:`scheduler_params` keeps it off). None or an undated build: False,
    the behaviour of the builds before it."""
    v = engine_version or ""
    m = _NIGHTLY.match(v)
    if m:
        return m.group(1) >= SGLANG_HYBRID_OVERLAP_NIGHTLY_FROM
    m = _RELEASE.match(v)
    return bool(m) and tuple(int(x) for x in m.groups()) >= SGLANG_HYBRID_OVERLAP_FROM


def scheduler_params(name: str, system=None, spec=None, postprocess_workers: int = 0) -> SchedulerParams:
    """The backend's scheduler defaults; ``system`` (a SystemSpec) applies memory-dependent ones,
    ``spec`` (the served ModelSpec) model-dependent ones; ``postprocess_workers`` > 0: TensorRT-LLM's
    API server with post-processing workers (:data:`TRTLLM_POSTPROCESS_FRONT_END_MS`)."""
    p = SCHEDULERS[name]
    if name == "trtllm" and postprocess_workers > 0:
        # the workers take the per-stream detokenising and streaming out of the API server's loop
        p = replace(p, arrival_delay_ms=TRTLLM_POSTPROCESS_FRONT_END_MS, front_end_per_stream_ms=0.0)
    if system is not None and name == "sglang":
        mem = system.gpu.mem_capacity
        if mem >= SGLANG_LARGE_GPU_BYTES:
            p = replace(p, max_num_tokens=SGLANG_LARGE_GPU_CHUNK)
        elif mem < SGLANG_SMALL_GPU_BYTES:
            p = replace(p, max_num_tokens=SGLANG_SMALL_GPU_CHUNK)
        if mem > SGLANG_GRAPH_LARGE_GPU_BYTES:
            p = replace(p, graph_batch_sizes=SGLANG_LARGE_GPU_GRAPH_SIZES)
    if system is not None and name == "vllm" and _vllm_small_gpu(system):
        p = replace(p, max_num_tokens=VLLM_SMALL_GPU_TOKENS, max_batch_size=VLLM_SMALL_GPU_SEQS)
    if name == "sglang" and spec is not None and any(getattr(spec, k, None) is not None for k in ("gdn", "mamba", "kimi")):
        # SGLang runs hybrid linear-attention (Gated DeltaNet / Mamba / KDA) models without the overlap
        # scheduler unless --mamba-scheduler-strategy extra_buffer is set (sgl-project/sglang#14792)
        # or, from the builds of SGLANG_HYBRID_OVERLAP_FROM, the radix cache is off
        p = replace(p, overlap=False)
    return p
