"""What the benchmark recipes behind the silicon rows set that the rows do not say: server
settings of the public InferenceX launch scripts (SemiAnalysisAI/InferenceX, by model, GPU, engine
and benchmarked image), each rule with the script it reads; the dev-row evidence for each is in
docs/modelling-log.md, 'Benchmark recipes'.

The mapping in :mod:`infercast.validate.predict` applies them: :func:`trtllm_recipe` (MTP depth, MoE
kernel), :func:`vllm_recipe` (MoE kernel, expert parallelism, KV dtype), :func:`sglang_recipe` and
:data:`SGLANG_FP8_KV_SYSTEMS` (memory fraction, token budget, running requests, KV dtype),
:func:`postprocess_workers` (TensorRT-LLM's front end) and :func:`recipe_scheduler` (batching
delays, SGLang's lock-step waves or poll interval, the recipes' scheduler sizes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..serving.backends import mean_length_ratio, sglang_hybrid_overlap
from .silicon import SiliconRow


def _quant(q: str | None) -> str | None:
    q = (q or "").strip().lower()
    return q or None


def _gemm_quant(row: SiliconRow) -> str | None:
    return _quant(row.gemm_quant)


#: TensorRT-LLM image tags of the public InferenceX (InferenceMAX) DeepSeek-R1 single-node recipes
#: (``.github/configs/nvidia-master.yaml`` of SemiAnalysisAI/InferenceX, early 2026, and the
#: ``benchmarks/dsr1_*_b200_trt*.sh`` scripts they run): the MTP recipes ran
#: ``release:1.2.0rc6.post3``, the plain (STP) ones ``release:1.2.0rc6.post2`` (B200; on H200 both
#: ran ``1.1.0rc2.post2``, which therefore tells nothing). See :func:`trtllm_recipe`.
MTP_RECIPE_VERSION = "1.2.0rc6.post3"
STP_RECIPE_VERSION = "1.2.0rc6.post2"


def trtllm_recipe(row: SiliconRow, attention_dp: int) -> tuple[int, str | None] | None:
    """(MTP draft tokens, MoE kernel family or None for the table's own) of the recipe a
    TensorRT-LLM row's benchmarked version names (:data:`MTP_RECIPE_VERSION`,
    :data:`STP_RECIPE_VERSION`), or None for other versions. The caller asks only for checkpoints
    that ship MTP layers (DeepSeek-R1 / -V3). What the recipes' scripts set:

    * MTP recipe: ``num_nextn_predict_layers`` 3, or 1 with attention DP; fp8 MoE backend
      ``DEEPGEMM`` (the TensorRT-LLM table's own kernel);
    * STP recipe: no MTP; fp8 MoE backend ``TRTLLM`` (TensorRT-LLM-gen), ``DEEPGEMM`` only in the
      attention-DP points. TensorRT-LLM's tables hold no TensorRT-LLM-gen fp8 rows; vLLM's and
      SGLang's hold the same kernels through FlashInfer (:func:`infercast.ops.moe.resolve_moe`,
      ``kernel``).

nvfp4 keeps the table's own kernels in both: the scripts' ``TRTLLM`` backend (``CUTLASS`` with
attention DP or at >= 256 clients) is what :func:`infercast.ops.moe._prefer_low_latency`
already models at decode batch sizes (serving it from vLLM's TensorRT-LLM-gen nvfp4 rows instead
was rejected).

The MTP script's step budget is :func:`mtp_recipe_budget` (applied by
:func:`recipe_scheduler`). See docs/modelling-log.md, 'TensorRT-LLM DeepSeek MTP and STP
recipes'."""
    if row.backend != "trtllm" or row.backend_version not in (MTP_RECIPE_VERSION, STP_RECIPE_VERSION):
        return None
    adp = attention_dp > 1
    fp8 = _gemm_quant(row) == "fp8"
    if row.backend_version == MTP_RECIPE_VERSION:
        return (1 if adp else 3), None
    return 0, ("deepgemm" if adp else "trtllm") if fp8 else None


#: The public InferenceX recipes' TensorRT-LLM post-processing workers (``num_postprocess_workers``
#: of their ``trtllm-serve`` launches: ``benchmarks/70b_fp8_{b200,h200}_trt_slurm.sh`` 2,
#: ``benchmarks/gptoss_fp4_{b200,h200}_trt.sh`` 4; the DeepSeek-R1 scripts set none), by model
#: name; see :data:`infercast.serving.backends.TRTLLM_POSTPROCESS_FRONT_END_MS`.
INFERENCEX_POSTPROCESS_WORKERS = {"Llama-3.1-70B": 2, "Llama-3.1-70B-Instruct": 2, "gpt-oss-120b": 4}
_INFERENCEX_SOURCE = re.compile(r"source_file=\d{4}-\d{2}-\d{2}\.csv")


def inferencex_row(row: SiliconRow) -> bool:
    """Whether a row comes from InferenceX's exported results: the date-stamped source files
    (``silicon_data_source`` ``source_file=2026-04-06.csv``, ``...2026-03-25.csv``), whose ids
    carry that benchmark's own config names (``2026_04_06_..._tp8_ep8_<n>``).

The rows' random request lengths are handled by :func:`random_lengths` and
:data:`INFERENCEX_RANDOM_RANGE_RATIO` (KV cache only; see docs/modelling-log.md, 'Mean request
lengths for compute')."""
    return bool(_INFERENCEX_SOURCE.match(row.source or ""))


#: The InferenceX Llama-3.1-70B TensorRT-LLM recipes' context batching delay at 1024x1024 below TP 8
#: (``batch_wait_timeout_iters: 20``, ``batch_wait_max_tokens_ratio: 0.9`` in
#: ``benchmarks/70b_fp8_{b200,h200}_trt_slurm.sh``), with the b200 script's ``--max_num_tokens 16384``
#: (the h200 script's is ``$MAX_MODEL_LEN``, which the rows do not give; its rows fit the b200
#: value); see :func:`recipe_scheduler` and docs/modelling-log.md, 'Llama-3.1-70B TensorRT-LLM
#: batching delay'.
LLAMA_BATCH_WAIT = (20, 0.9, 16384)

#: The InferenceX Llama-3.1-70B TensorRT-LLM B200 recipe's step budget for every configuration
#: (``benchmarks/70b_fp8_b200_trt_slurm.sh``: ``trtllm-serve --max_num_tokens 16384``, and no
#: ``enable_chunked_prefill``, so TensorRT-LLM's default runs each prompt whole): an 8192-token
#: prompt takes one step beside the running decodes, where the engine default (8192, chunked
#: here) split it in two. The H200 script passes ``--max_num_tokens $MAX_MODEL_LEN``, which the
#: rows do not give, so its rows keep the default. See docs/modelling-log.md, 'Llama-3.1-70B
#: TensorRT-LLM B200 step budget' (the gpt-oss-120b scripts' 20000-token budget there too).
LLAMA_TRT_B200_STEP_BUDGET = 16384


#: The DeepSeek-R1 fp8 plain-recipe context batching delay (``benchmarks/dsr1_fp8_b200_trt.sh``:
#: ``DELAY_BATCHING`` at 1024x1024 from 64 to 255 clients: ``batch_wait_timeout_iters: 40``,
#: ``batch_wait_max_tokens_ratio: 0.8``, ``max_num_tokens`` 8192). The plain scripts' unchunked
#: step budget is not applied. See docs/modelling-log.md, 'DeepSeek-R1 fp8 TensorRT-LLM batching
#: delay and step budget'.
DSR1_FP8_BATCH_WAIT = (40, 0.8, 8192)


@dataclass(frozen=True)
class SglangRecipe:
    """An SGLang benchmark recipe's server sizes: ``--mem-fraction-static``,
    ``--chunked-prefill-size`` (the step's token budget), ``--max-running-requests`` and
    ``--scheduler-recv-interval`` (0: the rule of :func:`sglang_recv_interval`)."""

    kv_memory_fraction: float
    max_num_tokens: int
    max_batch_size: int
    recv_interval: int = 0


#: The public InferenceX DeepSeek-R1 fp8 SGLang recipe on B200 (``benchmarks/dsr1_fp8_b200.sh``,
#: ``single_node/dsr1_fp8_b200.sh``; its B300 entries reuse it as is) runs TP 4 for 8192x1024 only,
#: with ``MEM_FRAC_STATIC=0.95``, ``CHUNKED_PREFILL_SIZE=8192``, ``MAX_RUNNING_REQUESTS=32`` and
#: ``SCHEDULER_RECV_INTERVAL=10``:
#: DeepSeek-R1's fp8 weights take ~169 GB of each of four B200s, which SGLang's default static
#: fraction (0.88 here) would leave ~1 GB of KV cache (27k tokens: a c8 run would queue for
#: cache). Keyed (model-name prefix, system, gemm quant, GPUs per replica). Its TP 8 settings --
#: 0.82, 32768, 128 -- are not taken: the development rows at TP 8 go to 512 clients, which only the
#: recipe's MTP variant schedules, with other sizes. See docs/modelling-log.md, 'SGLang DeepSeek-R1
#: fp8 TP 4 recipe'; the Qwen3.5-397B-A17B fp8 MTP recipe on B200 is not applied (see 'SGLang
#: Qwen3.5 MTP recipe').
SGLANG_RECIPES = {
    ("DeepSeek", "b200_sxm", "fp8", 4): SglangRecipe(0.95, 8192, 32, 10),
    ("DeepSeek", "b300_sxm", "fp8", 4): SglangRecipe(0.95, 8192, 32, 10),
}


def sglang_recipe(row: SiliconRow, gpus: int) -> SglangRecipe | None:
    """The :data:`SGLANG_RECIPES` entry of the recipe that measured an SGLang row served on
    ``gpus`` GPUs per replica, or None."""
    if row.backend != "sglang":
        return None
    name = row.model.split("/")[-1]
    for (prefix, system, quant, width), recipe in SGLANG_RECIPES.items():
        if name.startswith(prefix) and row.system == system and _gemm_quant(row) == quant and gpus == width:
            return recipe
    return None


def mtp_recipe_budget(row: SiliconRow, clients_per_rank: float) -> tuple[int, int] | None:
    """(``max_num_tokens``, ``max_batch_size``) per rank of the InferenceX DeepSeek-R1 MTP recipe
    (:data:`MTP_RECIPE_VERSION`; ``benchmarks/dsr1_{fp8,fp4}_b200_trt_mtp.sh``) for ``row``, or None
    for any other. The script runs TensorRT-LLM without chunked prefill (its default) and sizes
    the step to the decodes' draft tokens plus one whole prompt: ``max_batch_size`` = the clients
    (per rank with attention DP: ``CONC / TP``), ``max_num_tokens = (MTP + 1) x max_batch_size +
    ISL + 64`` rounded up to 64, MTP the recipe's depth (:func:`trtllm_recipe`) -- so a step takes
one 1k prompt beside its decodes, where the engine default (8192, chunked) took seven;
``max_batch_size`` comes from the clients, not the row's attention-DP column (which some rows give
as TP x EP). See docs/modelling-log.md, 'TensorRT-LLM DeepSeek-R1 MTP recipe step budget'."""
    if (row.backend != "trtllm" or row.backend_version != MTP_RECIPE_VERSION
            or not row.model.split("/")[-1].startswith("DeepSeek") or row.worker is None):
        return None
    mtp, _ = trtllm_recipe(row, row.worker.attention_dp)
    batch = max(1, round(clients_per_rank))
    return -(-((mtp + 1) * batch + row.isl + 64) // 64) * 64, batch


#: Per-model gap-analysis files that re-export InferenceX measurements (``silicon_data_source``
#: ``source_file=qwen3.5-397b-gap-analysis.csv``, ``kimi-k2.5-gap-analysis.csv``: a bare file name,
#: where the AIC gap-analysis harness's own rows carry a local path, ``source_file=/Users/...``).
_REEXPORT_SOURCE = re.compile(r"source_file=[^/;]+-gap-analysis\.csv")


def random_lengths(row: SiliconRow) -> bool:
    """Whether the benchmark behind ``row`` drew each request's lengths at random: InferenceX's
    client does (``benchmark_serving --random-range-ratio 0.8``: input and output lengths uniform
    on ``[0.8 L, L]``), for its exported results (:func:`inferencex_row`), for the rows of its
    results database dump (``silicon_data_source`` ``db-dump/...``, with the run's workflow id) and
for the per-model gap-analysis files that re-export them (:data:`_REEXPORT_SOURCE`). Those files'
rows are InferenceX runs (most repeat an InferenceX row's TTFT and TPOT; see
docs/modelling-log.md, 'Gap-analysis re-exports are InferenceX runs'); predicted as InferenceX's,
one measurement gets one prediction. The AIC gap-analysis harness's own rows (local
``source_file`` paths) do not say."""
    src = row.source or ""
    return inferencex_row(row) or src.startswith("db-dump") or bool(_REEXPORT_SOURCE.match(src))


#: InferenceX's client draws each request's input and output lengths uniformly from
#: ``[RANGE x L, L]`` (``benchmark_serving --random-range-ratio 0.8`` in ``benchmarks/benchmark_lib.sh``
#: and the recipes that call it), so a request holds :data:`INFERENCEX_MEAN_LENGTH_RATIO` of the
#: nominal lengths' KV cache on average (:attr:`infercast.serving.backends.SchedulerParams.kv_length_ratio`,
#: set by :func:`recipe_scheduler` for every benchmark of random lengths). It moves only rows whose
#: running set the KV cache bounds. Compute stays at the nominal lengths, where the front-end
#: parameters are fitted. The engines' default KV fractions stay (the DeepSeek-R1 TensorRT-LLM
#: scripts' own are not applied). See docs/modelling-log.md, 'Random request lengths fill the KV
#: cache'.
INFERENCEX_RANDOM_RANGE_RATIO = 0.8
INFERENCEX_MEAN_LENGTH_RATIO = mean_length_ratio(INFERENCEX_RANDOM_RANGE_RATIO)


#: SGLang's ``--scheduler-recv-interval`` in the public InferenceX recipes, which set it by the
#: benchmark's client count: 10 below :data:`SGLANG_RECV_INTERVAL_FROM` clients, 30 from there
#: (``benchmarks/single_node/dsr1_fp4_b200.sh``, ``dsr1_fp8_b200.sh`` at TP 8,
#: ``qwen3.5_fp8_b200.sh``; the B300 entries reuse the B200 scripts), as (systems, model-name
#: prefixes). The DeepSeek-R1 fp8 TP 4 recipe polls every 10 (:data:`SGLANG_RECIPES`). The H200
#: DeepSeek-R1 (``benchmarks/dsr1_fp8_h200.sh``) and GLM-5 (``glm5_fp8_b200.sh``) recipes set none:
#: SGLang's default, a poll every iteration.
#:
#: How these rows are served (:func:`recipe_scheduler`): a closed loop whose requests draw random
#: lengths drifts apart wave by wave, so InferenceX's SGLang rows run the steady-state model, not
#: SGLang's lock-step waves (the default of :data:`infercast.serving.backends.SCHEDULERS`, which
#: describes a fixed-length benchmark); the poll interval adds its wait and gathers the requests
#: that arrived since the last poll into one prefill
#: (:attr:`infercast.serving.backends.SchedulerParams.recv_interval`). The AIC gap-analysis
#: harness's own rows keep the waves; the per-model gap-analysis files that re-export InferenceX
#: runs do not (:func:`random_lengths`). The recipes' chunked-prefill size 32768 on B200 is not
#: applied. See docs/modelling-log.md, 'SGLang poll interval and steady state for InferenceX rows'.
SGLANG_RECV_INTERVAL_RECIPES = (("b200_sxm", "b300_sxm"), ("DeepSeek", "Qwen3.5"))
SGLANG_RECV_INTERVAL = (10, 30)
SGLANG_RECV_INTERVAL_FROM = 16


def sglang_recv_interval(row: SiliconRow, recipe: SglangRecipe | None = None) -> int:
    """The ``--scheduler-recv-interval`` of the InferenceX SGLang recipe that measured ``row``
    (:data:`SGLANG_RECV_INTERVAL_RECIPES`; ``recipe``: its :data:`SGLANG_RECIPES` entry, whose own
    interval wins), 1 (SGLang's default) for any other."""
    if recipe is not None and recipe.recv_interval:
        return recipe.recv_interval
    systems, prefixes = SGLANG_RECV_INTERVAL_RECIPES
    name = row.model.split("/")[-1]
    if row.system not in systems or not any(name.startswith(p) for p in prefixes):
        return 1
    low, high = SGLANG_RECV_INTERVAL
    return high if (row.concurrency or 0) >= SGLANG_RECV_INTERVAL_FROM else low


#: The AIC gap-analysis harness's H200 campaign (``source_file=/.../aic-auto-gap-analysis/data/
#: h200_sxm/...``: 1000-8000-token prompts, 100-2000-token outputs, concurrencies such as 7, 9, 240,
#: 352) and its H100 one (``.../data/h100_sxm/...``: 1024-4096 x 128-512, 8-128 clients) ran
#: different benchmark clients, which the rows do not name. SGLang keeps a closed loop's lock-step
#: waves only as long as its clients stay in phase: the H100 campaign's SGLang rows fit the waves,
#: the H200 campaign's fit the steady state, so its clients drift apart as InferenceX's do. SGLang's
#: scheduler is prefill-first in both builds (sgl-project/sglang#32549), so the difference is the
#: client's. See docs/modelling-log.md, 'AIC H200 campaign clients drift'; variants for the
#: campaigns' other rows tried and rejected: 'AIC H100 campaign variants'.
_AIC_DRIFTING_CAMPAIGN = re.compile(r"source_file=/[^;]*/aic-auto-gap-analysis/data/h200_sxm/")


def clients_drift(row: SiliconRow) -> bool:
    """Whether the closed-loop clients behind ``row`` drift out of phase, so that a prefill-first
    engine keeps no lock-step waves: a benchmark of random lengths (:func:`random_lengths`) or the
    AIC gap-analysis campaign whose rows measure it (:data:`_AIC_DRIFTING_CAMPAIGN`)."""
    return random_lengths(row) or bool(_AIC_DRIFTING_CAMPAIGN.match(row.source or ""))


def recipe_scheduler(row: SiliconRow, params, clients_per_rank: float | None = None):
    """``params`` with the scheduler settings of the recipe that measured ``row``: a TensorRT-LLM
    step budget (:func:`llama_trt_b200_recipe`), context batching delay (:func:`_batch_wait`)
    and, given the clients per rank, the MTP recipe's unchunked step budget
    (:func:`mtp_recipe_budget`); SGLang's recipe sizes
    (:func:`sglang_recipe`) and, for a benchmark of random lengths (:func:`random_lengths`), the
    steady state with the recipe's poll interval instead of lock-step waves
    (:func:`sglang_recv_interval`), or the steady state alone where the clients drift apart
    otherwise (:func:`clients_drift`); and for any backend, a benchmark of random lengths holds
    their mean's KV cache (:data:`INFERENCEX_MEAN_LENGTH_RATIO`); else unchanged."""
    if random_lengths(row):
        params = replace(params, kv_length_ratio=INFERENCEX_MEAN_LENGTH_RATIO)
    if row.backend == "sglang":
        w = row.worker
        recipe = sglang_recipe(row, w.tp * w.attention_dp) if w is not None else None
        if recipe is not None:
            params = replace(params, max_num_tokens=recipe.max_num_tokens, max_batch_size=recipe.max_batch_size)
        if clients_drift(row):
            params = replace(params, lockstep=False)
            if random_lengths(row):
                # InferenceX's SGLang scripts poll every few steps and run --disable-radix-cache: the
                # builds that keep a hybrid model's overlap scheduler without it do (scheduler_params
                # turned it off for such a model)
                params = replace(params, recv_interval=sglang_recv_interval(row, recipe),
                                 overlap=params.overlap or sglang_hybrid_overlap(row.backend_version))
            return params
    if llama_trt_b200_recipe(row):
        params = replace(params, max_num_tokens=LLAMA_TRT_B200_STEP_BUDGET, chunked=False)
    step = mtp_recipe_budget(row, clients_per_rank) if clients_per_rank is not None else None
    if step is not None:
        tokens, batch = step
        params = replace(params, chunked=False, max_num_tokens=tokens, max_batch_size=batch)
    wait = _batch_wait(row)
    if wait is None:
        return params
    iters, ratio, budget = wait
    return replace(params, batch_wait_iters=iters, batch_wait_max_tokens_ratio=ratio, max_num_tokens=budget)


def llama_trt_b200_recipe(row: SiliconRow) -> bool:
    """Whether ``row`` is an InferenceX run of the Llama-3.1-70B TensorRT-LLM B200 recipe, whose
    step budget is :data:`LLAMA_TRT_B200_STEP_BUDGET`, unchunked."""
    return (row.backend == "trtllm" and row.system == "b200_sxm" and inferencex_row(row)
            and row.model.split("/")[-1].startswith("Llama-3.1-70B"))


def _batch_wait(row: SiliconRow) -> tuple[int, float, int] | None:
    """(iterations, token ratio, token budget) of the TensorRT-LLM context batching delay of the
    recipe that measured ``row`` (:data:`DSR1_FP8_BATCH_WAIT`, :data:`LLAMA_BATCH_WAIT`), or None."""
    if row.backend != "trtllm" or (row.isl, row.osl) != (1024, 1024):
        return None
    name = row.model.split("/")[-1]
    if (row.backend_version == STP_RECIPE_VERSION and _gemm_quant(row) == "fp8" and name.startswith("DeepSeek")
            and 64 <= (row.concurrency or 0) < 256):
        return DSR1_FP8_BATCH_WAIT
    if inferencex_row(row) and name.startswith("Llama-3.1-70B") and row.worker is not None and row.worker.tp < 8:
        return LLAMA_BATCH_WAIT
    return None


def postprocess_workers(row: SiliconRow) -> int:
    """TensorRT-LLM post-processing workers of the recipe that measured ``row``: the InferenceX
    recipes' (:data:`INFERENCEX_POSTPROCESS_WORKERS`) for their rows, else 0 (``trtllm-serve``'s
    default)."""
    if row.backend != "trtllm" or not inferencex_row(row):
        return 0
    return INFERENCEX_POSTPROCESS_WORKERS.get(row.model.split("/")[-1], 0)


@dataclass(frozen=True)
class VllmRecipe:
    """What a vLLM benchmark recipe set that the row does not say: the MoE kernel family the
    engine ran (:data:`infercast.ops.moe.MOE_KERNELS`), whether ``--enable-expert-parallel`` was
    on (experts sharded by EP over the whole replica, not by TP), and the KV-cache dtype
    (None: the model's own, vLLM's ``--kv-cache-dtype auto``)."""

    moe_kernel: str | None
    expert_parallel: bool
    kv_cache_quant: str | None


#: The public InferenceX MiniMax-M2.5 fp8 B200 recipe while it ran ``vllm/vllm-openai:v0.17.0``
#: (``benchmarks/single_node/minimaxm2.5_fp8_b200.sh`` before SemiAnalysisAI/InferenceX PR #947,
#: which moved it to v0.19.0): it exported ``VLLM_USE_FLASHINFER_MOE_FP8=0`` and
#: ``VLLM_MOE_USE_DEEP_GEMM=0`` (vLLM's Triton ``fused_moe`` experts), passed
#: ``--enable-expert-parallel`` whenever ``EP_SIZE >= 1`` (every point; PR #947 made it ``> 1``) and
#: no ``--kv-cache-dtype`` (the v0.19.0 recipe adds ``fp8``). Keyed (model name, system, gemm
#: quant, benchmarked version). The Triton rows come from vLLM's older b200 collections (0.22.0;
#: the current 0.24.0 measured FlashInfer's kernels only; :func:`infercast.ops.moe.resolve_moe`).
#: See docs/modelling-log.md, 'vLLM MiniMax-M2.5 B200 recipe'.
#:
#: Not modelled: the InferenceX gpt-oss-120b vLLM recipes on Hopper (``benchmarks/gptoss_fp4_h100.sh``,
#: ``gptoss_fp4_h200.sh``) export ``VLLM_MXFP4_USE_MARLIN=1``: their experts run the Marlin
#: weight-only kernel, not the OAI Triton one the h100 / h200 tables measured at gpt-oss's shape.
#: The pack measured Marlin mxfp4 experts only at one far shape (hidden 3584, 896 experts,
#: top-16), outside the transfer gates, so those rows keep the measured Triton kernel (see
#: docs/modelling-log.md, 'gpt-oss Hopper Marlin experts').
VLLM_RECIPES = {
    ("MiniMax-M2.5", "b200_sxm", "fp8", "0.17.0"): VllmRecipe("triton", True, None),
}


def vllm_recipe(row: SiliconRow) -> VllmRecipe | None:
    """The :data:`VLLM_RECIPES` entry of the recipe that measured a vLLM row, or None."""
    if row.backend != "vllm":
        return None
    return VLLM_RECIPES.get((row.model.split("/")[-1], row.system, _gemm_quant(row), row.backend_version))


#: Systems whose SGLang benchmark recipes run an fp8 KV cache: InferenceX's single-node SGLang
#: scripts on B200 (DeepSeek-R1 fp8 / fp4 / MTP, Qwen3.5, GLM-5: ``--kv-cache-dtype fp8_e4m3``) and
#: B300 (SemiAnalysisAI/InferenceX issue #135: "FP8 KV cache"); their H200 scripts keep the default.
#: GB200 / GB300, whose Dynamo recipes are not in that repository, are left out. See
#: docs/modelling-log.md, 'SGLang fp8 KV cache on Blackwell'.
SGLANG_FP8_KV_SYSTEMS = ("b200_sxm", "b300_sxm")
