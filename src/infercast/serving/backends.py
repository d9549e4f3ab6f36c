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
  tables. A starting point; the serving model calibrates it on the dev rows.
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


#: ``step_overhead_ms``, ``seq_overhead_ms``, ``arrival_delay_ms`` and ``requests_per_client`` are
#: calibrated on the dev silicon rows (``python -m benchmarks.calibrate_serving``); the rest are
#: engine defaults. vLLM's per-sequence 10 us: agg TPOT median APE 8.9% (0) -> 8.4% (5 us) ->
#: 8.0% (10 us) -> 8.1% (15) -> 8.2% (20) -> 8.6% (30), TTFT unchanged (21.4-21.5%); the same
#: cost made TensorRT-LLM (C++ runtime) worse (9.2% -> 9.9% at 10 us) and, added to every step
#: before SGLang's overlap was modelled, SGLang worse (13.8% -> 14.5% at 20 us + 1 ms); hidden
#: behind the GPU step it pays (:data:`SGLANG_SEQ_OVERHEAD_MS`). SGLang's overlap scheduler hides
#: its 2 ms host time behind the GPU step (``overlap``), leaving 0.5 ms that does not overlap; it is
#: off for hybrid linear-attention models (:func:`scheduler_params`). Dev rows, SGLang TPOT median
#: APE (within 20%): 2 ms added to every step 14.7% (63.1%) -> overlap, residual 0 / 0.25 / 0.5 /
#: 0.75 ms: 13.2 / 12.4 / 13.0 / 13.0% (65.9 / 69.6 / 69.8 / 69.6%); host 1.5 / 3 ms at 0.5:
#: 13.3 / 13.4%; all rows 10.2% -> 9.8% (within 20%: 73.5% -> 75.2%), disagg 25.0% -> 20.0%. DeepSeek
#: rows implied ~0 ms of host time per step with the old additive model, Qwen3.5 (Gated DeltaNet)
#: rows 2-3 ms: the overlap scheduler explains both.
#: Measured and not kept (dev rows, all-row TTFT median APE 28.0% at the time): a benchmark capped
#: in duration (requests per client = min(10, cap / request latency); cap 300 / 900 s: 29.8 / 28.9%);
#: a length-biased wait for the step in progress (E[T^2] / 2E[T] over decode-only and prefill steps
#: instead of one average step: 28.5%; plus half a step: 27.9%, within noise); SGLang without
#: lock-step (SGLang agg TTFT 34.5% -> 55.8%; the better of the two per row would give
#: 23.9%, but nothing in a row tells which regime its harness ran); vLLM requests_per_client 7 with
#: a 30 ms front end (vLLM TTFT 21.3% -> 19.6%; TensorRT-LLM's optimum on the same grid stays at
#: 10 / 100 ms, and one benchmark length per backend would be a fit to harnesses, not engines).
#: Also measured and not kept (all-row TTFT 26.42%): one more step of wait before a TensorRT-LLM
#: request's first chunk (its overlap scheduler admits new work one iteration late): TensorRT-LLM
#: TTFT 30.4% -> 31.7%, TPOT 9.8% -> 9.9%; SGLang's lock-step waves desynchronised by output
#: lengths spread +-10% over 4 or 8 client lanes (each lane keeps its length, so lanes drift
#: apart wave by wave, as random lengths de-phase real clients; every wave simulated): SGLang
#: TTFT 35.8% -> 43.5% / 46.4%, TPOT 11.3% -> 11.3% / 11.4%. Bounds on what per-group constants
#: could do (fitted on the same rows, so optimistic): the best TTFT shift per (backend, version)
#: gives 22.0%, per (backend, system, model) 18.6%, the best TTFT scale per (backend, system,
#: model) 18.8%; the TTFT error varies within a model's rows, with concurrency and lengths.
#: Also measured and not kept (all-row TTFT 18.76%): TensorRT-LLM's overlap scheduler returning a
#: step's tokens after it launches the next step ("one extra decoding step", TensorRT-LLM docs,
#: Overlap Scheduler) as a lag on every response of the steady state: one average step,
#: TensorRT-LLM TTFT 19.6% -> 18.9% (all rows 18.5%), half a step 18.8%; with the first wave's
#: lag played out exactly (the next step there is another long prefill step) 19.6%, the b200
#: InferenceX rows 12.4% -> 17.5%. The lag is the host time of launching the next step, which
#: the rows do not pin down (as host time per sequence: 0.1 / 0.2 ms -> 19.2 / 18.9%, and 0.2 ms
#: per sequence would leave TensorRT-LLM host-bound where its TPOT fits without it).
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
#: modelled). Measured and not kept: the InferenceX TensorRT-LLM recipes set ``enable_padding: true``;
#: padding their rows' decode steps to 1, 2, 4, 8..128 by 8, 256, 512, 1024 moved the dev rows' TPOT
#: median APE 8.59% -> 8.61%.
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
#: hold. Dev rows, TensorRT-LLM agg with attention DP (35): TTFT median APE 57.7% -> 38.4%,
#: geometric-mean ratio 0.38 -> 0.81; all rows TTFT 26.84% -> 26.49%, TPOT unchanged (9.05%).
TRTLLM_ADP_TIMEOUT_STEPS = 60

#: SGLang's per-sequence host time per step (``seq_overhead_ms``): its Python scheduler builds the
#: batch and processes every request's output each iteration (``process_batch_result``, the
#: detokenizer hand-off), work that grows with the running batch. Under the overlap scheduler it is
#: hidden while the GPU step is longer; it surfaces at large batches of short steps, which is where
#: SGLang's TPOT was under-predicted (geometric-mean ratio 0.88 at concurrency 128-255, 0.72 at
#: 256-511). Dev rows, SGLang TPOT median APE (within 20%) at 0 / 10 / 20 / 30 / 40 / 50 / 60 us:
#: 11.2 (71.8%) / 11.0 / 10.8 / 10.7 / 10.5 (74.5%) / 10.5 / 10.9% (sweep without seven b300 rows;
#: all SGLang rows at 40 us: 10.6%, 74.5%); TTFT unchanged (35.8%). The
#: gain is at high concurrency and on the hybrid linear-attention rows that run without overlap
#: (Qwen3.5 B200 TPOT 10.0% -> 8.9%); DeepSeek rows, whose GPU steps are long, do not move.
SGLANG_SEQ_OVERHEAD_MS = 0.040

#: vLLM's front end: 10 ms per request plus 0.7 ms per open stream (``arrival_delay_ms``,
#: ``front_end_per_stream_ms``) and 3 us per prompt token (:data:`VLLM_FRONT_END_PER_PROMPT_TOKEN_MS`,
#: which moved the base from 15 ms, as first calibrated below, to 10). The vLLM dev rows' TTFT
#: residual against the model grows with concurrency (median measured - predicted at 4 / 16 / 64 / 128 / 256 / 512 clients: -10 / +5 /
#: +31 / +66 / +138 / +407 ms with a flat 40 ms front end), while vLLM 0.15-0.19 rows at low
#: concurrency imply 10-20 ms. Both the benchmark client (``vllm bench serve``: one asyncio loop for
#: all streams) and vLLM's API server (its output processor detokenises and sends every stream's
#: tokens in the API-server process) do per-stream work on one core, which is where a new request
#: waits. Disaggregated deployments sit behind their router (Dynamo's), so they take the base only (vLLM
#: disagg dev rows, 5: TTFT median APE 55.2% with the per-stream term, 38.0% without). Dev rows, vLLM TTFT median
#: APE (within 20%) at (base ms, ms per stream): (40, 0) 18.9% (53.1%); (40, 0.3) 17.1%; (30, 0.5)
#: 15.3%; (20, 0.7) 14.9% (60.2%); (15, 0.6) 14.3% (61.0%); (15, 0.7) 13.9% (60.5%); (10, 0.7)
#: 14.6%; (10, 0.9) 14.9%; (5, 0.8) 17.7%; (0, 0.9) 20.8%; TPOT unchanged. TensorRT-LLM's own
#: per-stream term: :data:`TRTLLM_FRONT_END_PER_STREAM_MS`.
VLLM_FRONT_END_MS = 10.0
VLLM_FRONT_END_PER_STREAM_MS = 0.7

#: vLLM's front-end time per prompt token, 3 us: the host work a request's prompt costs before its
#: first step, on the TTFT's path and growing with the prompt -- the API server tokenises the
#: prompt's text (the InferenceX client sends text made of random token ids), and the engine core
#: builds the request from its token ids (with prefix caching, vLLM V1's default, it hashes every
#: KV block of the prompt). The vLLM dev rows' TTFT residual grew with the prompt: at <= 8 clients
#: the median measured - predicted was +4 ms at 1k and +23 ms at 8k tokens (InferenceX rows; the
#: signed error of all vLLM rows -3.9% at 1k, -9.0% at 8k). Dev rows, all-row TTFT median APE (within
#: 15%), from 16.92% (873) at (15 ms base, 0 us): at 15 ms and 1.5 / 2 / 2.5 / 3 us: 16.77 / 16.72 /
#: 16.74 / 16.79% (885 / 888 / 886 / 892); at 10 ms and 2.5 / 3 / 3.5 / 4 us: 16.62 / 16.56 / 16.58 /
#: 16.63% (889 / 894 / 901 / 898); at 12 ms and 2.5 / 3 us: 16.68 / 16.69%; at 5 ms and 3 / 4 us:
#: 17.26 / 16.80%. At (10 ms, 3 us) vLLM's TTFT median APE goes 12.2% -> 11.5%, its signed error
#: -3.9 -> -2.1% at 1k and -9.0 -> -4.5% at 8k; TPOT unchanged. The other engines tokenise too, but
#: their rows do not ask for it: at the same 3 us TensorRT-LLM's rows within 15% go 329 -> 315 (its
#: 8k rows' TTFT is over-predicted at low concurrency already, -25 ms median) and SGLang's 159 -> 162,
#: while SGLang's best fit is 20 us, which no tokeniser costs (:data:`SGLANG_FRONT_END_MS`). A disaggregated deployment's
#: router tokenises (:func:`infercast.serving.disagg.solve_disagg` takes the base only).
VLLM_FRONT_END_PER_PROMPT_TOKEN_MS = 0.003

#: TensorRT-LLM's front end per open stream, 0.6 ms, when ``trtllm-serve`` runs without
#: post-processing workers (its default: the API server's own event loop detokenises and streams
#: every open stream's tokens, as vLLM's API server does; with workers,
#: :data:`TRTLLM_POSTPROCESS_FRONT_END_MS` and no per-stream term). Dev rows, all-row TTFT median
#: APE (within 20%) at 0 / 0.3 / 0.45 / 0.5 / 0.6 / 0.7 / 0.8 ms per stream: 17.56% (54.7%) / 17.32
#: / 17.12 / 17.01 / 16.92% (56.0%) / 17.10 / 17.30%; TensorRT-LLM 18.4% -> 17.3%, TPOT unchanged.
#: The gain is the AIC gap-analysis harness's rows (TensorRT-LLM 1.0.0rc3, h100; 261 rows: 23.5%
#: -> 18.5%, at 65-128 clients 24.6% -> 14.6%), whose TTFT excess grew with concurrency; on the
#: other TensorRT-LLM rows it is neutral (485 rows: 16.4% -> 16.7%, within 15% 227 -> 226).
#: Applied to every TensorRT-LLM row the term was worse in earlier sessions (30.2% -> 30.6% at
#: 0.3 ms, with the post-processing rows' 100 ms base).
TRTLLM_FRONT_END_PER_STREAM_MS = 0.6

#: Measured and not kept (dev fullspec rows, all rows 16.61%, 894 within 15%; each term added to the
#: predicted TTFT of the aggregated rows, without its small feedback on the clients' cycle):
#:
#: * the front end's per-stream load taken as the output it streams (concurrency / TPOT, tokens per
#:   ms) instead of the open streams, in place of each engine's per-stream term: at 2 / 5 / 10 / 20 /
#:   40 ms per 1,000 tokens/s streamed, TensorRT-LLM's rows give 883 / 881 / 889 / 896 / 879 rows,
#:   vLLM's 791 / 810 / 847 / 820 / 735, SGLang's 866 / 871 / 875 / 868 / 894. The open streams fit
#:   better: the benchmark client and API server pay per stream, not per token.
#: * a prefill cost growing with the tensor-parallel size, for the excess that grows with TP at low
#:   concurrency in some groups (<= 8 clients, 1k prompts, median measured - predicted at TP 1 / 2 / 4
#:   / 8: TensorRT-LLM gpt-oss-120b H200 +3 / +12 / +38 / +43 ms, Llama-3.1-70B B200 -23 / -18 / -4 /
#:   +6; vLLM Llama-3.1-70B B200 -3 / +13 / +26 / +38) but not in others (vLLM gpt-oss-120b on every
#:   GPU, vLLM Llama-3.1-70B H200, TensorRT-LLM gpt-oss-120b B200: flat within 12 ms): 3 / 5 /
#:   8 / 12 ms per doubling of TP on every row, 892 / 897 / 881 / 848 rows; on TensorRT-LLM's rows
#:   alone 904 / 908 / 899 / 891. No mechanism of that size was found: the prefill all-reduces of
#:   those rows are tens of microseconds each in the tables, and the excess would need ten times that.
#: * the first token held back by a stream interval (``--stream-interval`` 10-30 in the InferenceX
#:   SGLang recipes, ``stream_interval`` in TensorRT-LLM's): both engines send a request's first token
#:   at once (SGLang when it has one output token, TensorRT-LLM at its first decoding iteration), and
#:   the InferenceX client times the first chunk even when its text is empty; the AIC harness's
#:   SGLang rows, run at the default interval of 1, fit the same 120 ms front end as the recipes'.
#: * a bound, not a candidate (``python -m benchmarks.fidelity_bounds``): each row's predicted TTFT
#:   split into its three parts (front end, wait for the step in progress, own prefill; the 1,892
#:   rows whose prediction states them, 889 of them within 15%) and each part scaled by 0.70-2.00 in
#:   steps of 0.05. One scale per part for every row: at best 911 (front end x1.15, wait x1.05,
#:   prefill x0.95). One triple per engine, nine scales fitted on the scored rows: SGLang 161 -> 198
#:   of 490 (prefill x1.6, which its TPOT would not bear: see :data:`SGLANG_FRONT_END_MS`),
#:   TensorRT-LLM 322 -> 340 of 728, vLLM 406 -> 412 of 674; 950, so 955 of all 1,924 rows. No
#:   re-weighting of the modelled parts reaches 962: the remaining error lies between groups of rows
#:   that the parts do not separate. SGLang's prefill x1.6 played out in full (every SGLang step
#:   that carries prefill costs 1.2 / 1.4 / 1.6 / 2.0 times its context part, so the decodes wait
#:   for it too): all rows 896 / 906 / 916 / 921 within 15%, TPOT 7.71 / 7.69 / 7.79 / 8.07% (SGLang's
#:   8.42% -> 8.66 / 8.73 / 9.36 / 11.30%). At x1.6 the rows gained are Qwen3.5's on B200 0.5.9 (3 ->
#:   12 of 83) and H200, its B200 nightlies' and GLM-5's (B200 6 -> 12 of 22); lost, B300 Qwen3.5
#:   0.5.10.post1 (12 -> 8 of 31), DeepSeek-R1 (B200 0.5.9 20 -> 17 of 42, H200 9 -> 7 of 13) and
#:   -V3 (26 -> 24 of 37), whose TPOT says their prefill steps are not slower (B300 Qwen3.5 0.5.9 7.0 -> 16.2%, H200
#:   DeepSeek-R1 7.8 -> 14.0%): the (model, cluster) offset of :data:`SGLANG_FRONT_END_MS` again.

#: SGLang's front end: 120 ms per request plus 1.5 ms per open stream. SGLang's tokenizer manager
#: (one asyncio process) receives every stream's detokenised output and writes its chunks to the
#: client, and the benchmark client handles every stream on one loop, as with vLLM's API server.
#: Its rows did not ask for the per-stream term while most ran SGLang's lock-step waves (SGLang TTFT
#: 35.8% -> 36.0 / 36.9% at (120, 0.3) / (100, 0.8)); run as the steady state (InferenceX's random
#: lengths, :func:`infercast.validate.recipes.random_lengths`) they do. Dev rows, SGLang TTFT median
#: APE (within 20%) at (base ms, ms per stream): (120, 0) 28.3% (34.3%); (120, 0.7) 26.3%; (120,
#: 1.2) 26.1%; (120, 1.5) 25.2% (39.9%); (120, 1.8) 25.3%; (120, 2.0) 25.4%; (120, 3.0) 26.1%;
#: (100, 1.5) 27.3%; (140, 1.5) 25.4%; (100, 1.0) 28.2%; (160, 0.5) 26.0%; (200, 0) 25.3%; TPOT
#: unchanged. By group at (120, 1.5): H200 DeepSeek-R1 / -V3 21.3 / 20.0% -> 10.8 / 10.4%, B200
#: Qwen3.5 31.1% -> 25.2%, B200 DeepSeek-R1 34.8% -> 31.5%; worse B300 Qwen3.5 18.3% -> 26.8%. All
#: rows TTFT 18.76% -> 18.12%. Re-swept later (all rows TTFT 16.92%, 873 within 15%): a base of
#: 150 / 160 / 180 / 200 / 240 ms gives 16.79 / 16.79 / 16.72 / 16.79 / 17.23% (878 / 885 / 890 /
#: 873 / 871 within 15%). Every gain is the Qwen3.5 rows' on B200 and H200 (within 15%: B200 20 ->
#: 36 / 44 / 60 / 58 / 64 of 118, H200 1 -> 1 / 6 / 6 / 10 / 16 of 19), while every other SGLang
#: group loses rows (B200 DeepSeek-R1 23 -> 15 / 15 / 12 / 9 / 7 of 67, DeepSeek-V3 17 -> 13 / 12 /
#: 10 / 8 / 6 of 53, B300 Qwen3.5 16 -> 16 / 13 / 13 / 11 / 8 of 43, H100 Qwen3-32B 25 -> 23 / 22 /
#: 22 / 20 / 19 of 35): a cost of that model's requests, not the front end's, so 120 ms stays.
#: Such a cost, measured and not kept either: for Qwen3.5 on the SGLang builds without the hybrid
#: overlap (:func:`sglang_hybrid_overlap`), 60 ms + 10 us per prompt token before the scheduler
#: (``arrival_delay_ms``) gives all rows 15.80% (929 within 15%; those rows 25 -> 81 of 144), TPOT
#: unchanged; the same cost as host time of every prefill step, on the GPU's path, 15.80% (924) with
#: TPOT 7.61% -> 7.94% (those rows 7.1 -> 11.0%), so it is not GPU-serial. Its cause is not found: it
#: would be a constant of one (engine, model, version) triple, and the 0.5.10.post1 B300 rows of the
#: same model are over-predicted (+12% median) without it.
#: Where it shows, it is not the model's: the InferenceX runs of one SGLang 0.5.9 image
#: (``v0.5.9-cu130-amd64``) of Qwen3.5 on B200 (2026-03-24) and B300 (2026-04-03), same layouts, lengths
#: and clients, measure TTFT 100-130 ms apart (TP 8, 1k, c4: 305 vs 172 ms; c16: 441 vs 335; 8k, c8:
#: 519 vs 420) with the same TPOT (8.3 vs 7.9 ms, 12.2 vs 11.1, 10.4 vs 10.1), and the B300 runs fit
#: without any such cost (median -1 to -3%).
#: The same holds for GLM-5: its B300 recipe reuses the B200 one as is (``glm5_fp8_b300.sh``), and
#: the same nightly measures 116-160 ms more TTFT on B200 than on B300 (TP 8, 1k, c32 / c128: 369 vs
#: 210, 535 vs 419 ms; 8k, c8 / c16: 742 vs 618, 940 vs 799) with TPOT within 3% at 8k. DeepSeek-R1
#: on the same B200 cluster and SGLang build fits with 120 ms (1k rows -4% median), so the offset is
#: one of (model, cluster), not of the cluster: 100 ms more front end on every B200 SGLang row
#: takes Qwen3.5 0.5.9 from 3 to 34 rows within 15% and DeepSeek-R1 / -V3 from 20 / 16 to 4 / 6 (all
#: rows 873 -> 890). Also measured and not kept (all rows 16.92%, 873 within 15%): a front-end cost
#: per prompt token on SGLang rows, for the long prompts' under-prediction (SGLang 8k rows -31%
#: median, 1k rows -14%): 10 / 15 / 20 us per token give 882 / 892 / 897 rows; re-swept with the base
#: (80-120 ms) and per-stream term (1.0-2.0 ms), at best 902 (16.41%, at 100 ms, 1.5 ms, 20 us).
#: The gains are Qwen3.5's and GLM-5's, the losses H200 DeepSeek-R1, the AIC harness's H100
#: Qwen3-32B and B300 Qwen3.5 0.5.10; vLLM wants at most 5 us (+9 rows; 10 us: -45) and
#: TensorRT-LLM none (5 us: -11). SGLang tokenizes with the same fast tokenizer vLLM runs, so
#: 20 us per token has no mechanism; it is the (model, cluster) offset above in another shape.
#: Re-measured with vLLM's per-token term (:data:`VLLM_FRONT_END_PER_PROMPT_TOKEN_MS`; all rows
#: 16.56%, 894): (120 ms, 1.5 ms, 10 us) 903 rows (16.31%), (100, 1.5, 15) 916 (16.10%), (100, 1.5,
#: 20) 923 (15.89%). SGLang's TTFT error does grow with the prompt in every harness family (+0.06
#: to +0.07 in log TTFT per doubling of the prompt; 8k rows under-predicted by +0.31 / +0.43 / +0.33
#: in median log ratio in the database dump / InferenceX / AIC harness, their 1k rows by +0.11 /
#: +0.23 / -0.02), and the term narrows that gap in each; but only the InferenceX rows gain rows
#: within 15% (63 -> 91 of 260 at (100, 1.5, 20); 63 -> 89 at (120, 1.5, 15)), while the database
#: dump's and the AIC harness's hold or lose (57 -> 59 of 172 and 39 -> 38 of 72; at (120, 1.5,
#: 15) 57 -> 54 and 39 -> 35): it over-predicts their short prompts as much as it helps their
#: long ones, and the InferenceX gain is mostly the B200 Qwen3.5 rows, whose excess over the paired
#: B300 runs is the same at 1k and 8k prompts (+99 to +133 ms).
SGLANG_FRONT_END_MS = 120.0
SGLANG_FRONT_END_PER_STREAM_MS = 1.5

SCHEDULERS = {
    "trtllm": SchedulerParams(True, True, 8192, 2048, 0.0, 100.0, 10.0, True, graph_batch_sizes=CUDA_GRAPH_SIZES["trtllm"],
                              adp_balance_timeout_steps=TRTLLM_ADP_TIMEOUT_STEPS,
                              front_end_per_stream_ms=TRTLLM_FRONT_END_PER_STREAM_MS),
    "vllm": SchedulerParams(True, True, 8192, 1024, 0.0, VLLM_FRONT_END_MS, 10.0, False, seq_overhead_ms=0.010,
                            graph_batch_sizes=CUDA_GRAPH_SIZES["vllm"],
                            front_end_per_stream_ms=VLLM_FRONT_END_PER_STREAM_MS,
                            front_end_per_prompt_token_ms=VLLM_FRONT_END_PER_PROMPT_TOKEN_MS),
    "sglang": SchedulerParams(False, True, 8192, 4096, 2.0, SGLANG_FRONT_END_MS, 10.0, False, lockstep=True,
                              seq_overhead_ms=SGLANG_SEQ_OVERHEAD_MS, overlap=True, overlap_residual_ms=0.5,
                              graph_batch_sizes=CUDA_GRAPH_SIZES["sglang"],
                              front_end_per_stream_ms=SGLANG_FRONT_END_PER_STREAM_MS),
}


#: SGLang sizes its chunked-prefill budget by GPU memory (``server_args``: ``chunked_prefill_size``
#: 2048 below 35 GiB, 8192 below 160 GiB -- "H100, H200, A100, H20" -- and 16384 from 160 GiB --
#: "B200, MI300"). The dev rows agree: SGLang TTFT median APE 39% with 8192 everywhere, 34% with
#: 16384 on H200 and the Blackwell parts, and the same 34% (h200 rows 93% -> 75%, TPOT 11.4% ->
#: 11.35%) with H200 at 8192 as the rule says.
SGLANG_LARGE_GPU_BYTES = 160 * 2**30
SGLANG_LARGE_GPU_CHUNK = 16384
SGLANG_SMALL_GPU_BYTES = 35 * 2**30
SGLANG_SMALL_GPU_CHUNK = 2048

#: vLLM's online-serving defaults by GPU (``EngineArgs.get_batch_defaults``): ``max_num_batched_tokens``
#: 8192 and ``max_num_seqs`` 1024 on GPUs with at least 70 GiB that are not A100s ("a larger
#: ``max_num_batched_tokens`` on A100 reduces throughput", vllm-project/vllm#17885); 2048 and 256
#: elsewhere (A100, L40S, L4, ...). Every dev silicon row is on a large part, so no row moves.
VLLM_LARGE_GPU_BYTES = 70 * 2**30
VLLM_SMALL_GPU_TOKENS, VLLM_SMALL_GPU_SEQS = 2048, 256


#: TensorRT-LLM's front end when ``trtllm-serve`` runs post-processing workers
#: (``num_postprocess_workers`` > 0: detokenisation and response streaming in worker processes
#: instead of the API server's own loop, which otherwise also feeds the executor). The default
#: (:data:`SCHEDULERS`' 100 ms) is what the dev rows of servers without them imply. The public
#: InferenceX recipes run Llama-3.1-70B with 2 workers and gpt-oss-120b with 4, DeepSeek-R1 with
#: none; their dev rows (TensorRT-LLM, TTFT median APE at 15 / 25 / 35 / 50 ms for the rows with
#: workers, the rest at 100 ms): TensorRT-LLM 25.2 / 23.9 / 24.7 / 26.1% (from 30.1% with 100 ms
#: everywhere); with workers only where the recipes run them: Llama-3.1-70B b200 / h200 34.3 /
#: 32.8% -> 12.7 / 13.2%, gpt-oss-120b b200 / h200 81.6 / 35.4% -> 11.2 / 20.3%, DeepSeek-R1
#: unchanged; all TensorRT-LLM rows 30.1% -> 22.1%. (25 ms for every TensorRT-LLM row: 38.3%.)
TRTLLM_POSTPROCESS_FRONT_END_MS = 25.0


def _vllm_small_gpu(system) -> bool:
    return system.gpu.mem_capacity < VLLM_LARGE_GPU_BYTES or "a100" in str(getattr(system, "name", "")).lower()


#: The first SGLang release, and the first nightly build date, whose hybrid linear-attention models
#: (Gated DeltaNet: Qwen3-Next, Qwen3.5) keep the overlap scheduler when the radix cache is off
#: (``--disable-radix-cache``, as the public InferenceX recipes run them): sgl-project/sglang#19169
#: (2026-02-23) notes that the ``no_buffer`` mamba strategy runs with the overlap scheduler once the
#: radix cache is off, and the dev rows place the change between the 2026-02-16 nightly and the
#: 2026-04-02 one. Dev rows, Qwen3.5 on SGLang, TPOT median APE with the overlap off -> on: B300
#: 0.5.10.post1 22.1% -> 6.0% (31 rows), B200 nightly 2026-04-02 13.7% -> 9.0% (5); kept off, as
#: they measure: 0.5.9 on B200 / H200 / B300 8.3 / 7.1 / 7.0% (16.9 / 19.1 / 16.2% with it on),
#: the 2026-02-16 and undated nightlies 3.8 / 3.4% (13.7 / 18.6%). All rows: TPOT 7.81% -> 7.66%
#: (SGLang 9.2% -> 8.4%), TTFT 18.17% unchanged.
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
    if name == "sglang" and spec is not None and getattr(spec, "gdn", None) is not None:
        # SGLang runs hybrid linear-attention (Gated DeltaNet / Mamba) models without the overlap
        # scheduler unless --mamba-scheduler-strategy extra_buffer is set (sgl-project/sglang#14792)
        # or, from the builds of SGLANG_HYBRID_OVERLAP_FROM, the radix cache is off
        p = replace(p, overlap=False)
    return p
