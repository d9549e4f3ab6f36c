"""What the benchmark recipes behind the silicon rows set that the rows do not say: server
settings of the public InferenceX launch scripts (SemiAnalysisAI/InferenceX, by model, GPU, engine
and benchmarked image), each rule with the script it reads and the dev-row evidence for it.

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
    already models at decode batch sizes; serving it from vLLM's TensorRT-LLM-gen nvfp4 rows instead
    moved the dev rows' TPOT median APE 8.71% -> 8.79% (DeepSeek-R1 1.2.0rc6.post3 nvfp4 15.9% ->
    19.3%) and TTFT 25.32% -> 25.21%.

    The MTP script's step budget is :func:`mtp_recipe_budget` (applied by
    :func:`recipe_scheduler`).

    Dev rows, TensorRT-LLM DeepSeek b200 TPOT median APE, before (MTP 1 for R1, none for V3, the
    tables' own kernels) -> after: R1 1.2.0rc6.post3 fp8 48.3% -> 16.4%, nvfp4 23.6% -> 15.9%;
    R1 1.2.0rc6.post2 fp8 12.8% -> 8.3%, nvfp4 20.6% -> 18.2%; V3 1.2.0rc6.post2 fp8 41.3% -> 4.0%.
    All dev rows: TPOT 8.91% -> 8.71% (within 20%: 80.4% -> 81.7%), TTFT 25.32% unchanged."""
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

    Measured and not kept: InferenceX's client draws each request's input and output lengths
    uniformly from ``[0.8 L, L]`` (``--random-range-ratio 0.8``, mean 0.9 L); predicting those rows
    (and the database dump's) at 0.9 x isl / osl moved the dev rows' TTFT median APE 21.45% -> 22.94%
    (vLLM 13.9% -> 17.2%: its front end was calibrated at the nominal lengths), TPOT 8.71% -> 8.67%."""
    return bool(_INFERENCEX_SOURCE.match(row.source or ""))


#: The InferenceX Llama-3.1-70B TensorRT-LLM recipes' context batching delay at 1024x1024 below TP 8
#: (``batch_wait_timeout_iters: 20``, ``batch_wait_max_tokens_ratio: 0.9`` in
#: ``benchmarks/70b_fp8_{b200,h200}_trt_slurm.sh``), with the b200 script's ``--max_num_tokens 16384``
#: (the h200 script's is ``$MAX_MODEL_LEN``, which the rows do not give; its rows fit the b200
#: value, e.g. h200 fp8 TP1 c128: 1882 ms measured, 1621 predicted). Dev rows: those rows' TTFT was under-predicted by ~20 decode
#: steps (b200 fp8 TP1 c4: 383 ms measured, 129 predicted, 406 with the delay; h200 fp8 TP1 c4: 562
#: measured, 575 with it; TP 8 rows fit without it); see :func:`recipe_scheduler`.
LLAMA_BATCH_WAIT = (20, 0.9, 16384)

#: The InferenceX Llama-3.1-70B TensorRT-LLM B200 recipe's step budget for every configuration
#: (``benchmarks/70b_fp8_b200_trt_slurm.sh``: ``trtllm-serve --max_num_tokens 16384``, and no
#: ``enable_chunked_prefill``, so TensorRT-LLM's default runs each prompt whole): an 8192-token
#: prompt takes one step beside the running decodes, where the engine default (8192, chunked
#: here) split it in two. The H200 script passes ``--max_num_tokens $MAX_MODEL_LEN``, which the
#: rows do not give, so its rows keep the default. Dev rows (the recipe's 75 B200 rows, 61 of whose
#: predictions change): TTFT median APE 8.0% -> 4.7% (62 within 15% before and after), TPOT 5.8% ->
#: 5.7%; all rows 16.56% -> 16.61% (894 within 15% before and after: rows near the 15% line trade
#: places), TPOT 7.61% -> 7.60%. (The same budget on the H200 rows too: H200 Llama-3.1-70B rows
#: within 15% 59 -> 61 of 74, all rows 16.58%.) Measured and not kept: the gpt-oss-120b scripts'
#: ``--max_num_tokens 20000``, unchunked (``gptoss_fp4_{b200,h200}_trt.sh``), on their InferenceX
#: rows: b200 1.2.0rc2.post2 22 -> 13 of 25 within 15%, h200 gpt-oss-dev 12 -> 14 of 25; all rows
#: 16.61% -> 16.68% (894 -> 885). The b200 script has had many versions, and which one ran is
#: not in the rows.
LLAMA_TRT_B200_STEP_BUDGET = 16384


#: The DeepSeek-R1 fp8 plain-recipe context batching delay (``benchmarks/dsr1_fp8_b200_trt.sh``:
#: ``DELAY_BATCHING`` at 1024x1024 from 64 to 255 clients: ``batch_wait_timeout_iters: 40``,
#: ``batch_wait_max_tokens_ratio: 0.8``, ``max_num_tokens`` 8192). One dev measurement (TP 8, c64,
#: exported twice): 643 ms measured, 246 predicted without it, 715 with it. Measured and not kept:
#: the DeepSeek-R1 plain scripts' step budget (``dsr1_fp8_{b200,h200}_trt.sh``: no chunked prefill,
#: ``max_num_tokens = max(8192, CONC + ISL + 64 rounded up to 64)``) on the InferenceX DeepSeek rows
#: other than the MTP recipe's: TensorRT-LLM DeepSeek TTFT median APE 32.2% -> 33.6% (8192-token
#: prompts in one step instead of two chunks; e.g. b200 V3 1.2.0rc6.post2 8k rows 10.8% -> 17.2%).
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
#: cache). Keyed (model-name prefix, system, gemm quant, GPUs per replica). Dev rows (b200 TP 4,
#: 8192x1024, c8 / c16): TTFT 18.9 / 48.2 s predicted -> 1.19 / 2.14 s (0.78 / 1.00 s measured);
#: all rows TTFT 19.69% unchanged, TPOT 8.38% -> 8.36%. (Its TP 8 settings -- 0.82, 32768, 128 --
#: are not taken: the dev rows at TP 8 go to 512 clients, which only the recipe's MTP variant
#: schedules, with other sizes; capping them at 128 running requests predicts 68 s of TTFT for a
#: 3.1 s measurement.)
#:
#: Measured and not kept: the InferenceX Qwen3.5-397B-A17B fp8 MTP recipe on B200
#: (``qwen3.5-fp8-b200-sglang-mtp``, image ``lmsysorg/sglang:v0.5.9-cu130``, TP 4 / EP 1;
#: ``single_node/qwen3.5_fp8_b200_mtp.sh``: EAGLE, 3 steps of the MTP layer, top-1, 4 draft tokens,
#: ``--mem-fraction-static 0.9``, ``--chunked-prefill-size 32768``; its plain sibling ran
#: ``v0.5.9-cu130-amd64``). With MTP 3 at the default acceptance its 28 image-tagged dev rows go
#: from TPOT 18.8% over at low concurrency (c4: 9.7 ms predicted, 5.1 measured) to 21.3%, now far
#: under at high concurrency (c256: 19.7 predicted, 47.9 measured, where the measured TPOT shows no
#: speculative gain at all); TTFT 29.9% -> 27.8%, all rows TPOT 8.20% -> 8.22%.
#: Re-measured later (all rows TTFT 16.92%), MTP 3 on the recipe's rows (the 26 tagged with that image
#: and the 14 gap-analysis re-exports of its TP 4 / EP 1 runs) at acceptance 0.5 / 0.8: their TPOT median
#: APE 26.9% -> 13.5 / 33.8%, TTFT 41.0% -> 30.6 / 28.7% (0 -> 4 / 7 within 15%); all rows TTFT 16.89 /
#: 16.82%: speculative decoding explains their TPOT, not their TTFT.
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
    one 1k prompt beside its decodes, where the engine default (8192, chunked) took seven. Dev rows (the 44 MTP
    recipe rows), TTFT / TPOT median APE: 1k inputs 27.3 / 17.1% -> 19.7 / 17.1%, 8k inputs 21.5 /
    10.7% -> 13.5 / 13.7%; geometric-mean TTFT ratio 0.79 -> 0.83; all rows TTFT 18.12% -> 17.94%,
    TPOT 7.83% -> 7.85%. (An earlier trial sized ``max_batch_size`` from the row's attention-DP
    column, which some rows give as TP x EP: its queue over-predicted TTFT, 0.80 -> 1.61.)"""
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
    dev rows are InferenceX runs: 46 of their 62 repeat the TTFT and TPOT of an InferenceX row of
    the same system, engine, lengths and concurrency to within 0.1% (the other 16 match none that
    closely); predicted as InferenceX's, one measurement gets one prediction. The AIC gap-analysis
    harness's own rows (local ``source_file`` paths) do not say."""
    src = row.source or ""
    return inferencex_row(row) or src.startswith("db-dump") or bool(_REEXPORT_SOURCE.match(src))


#: InferenceX's client draws each request's input and output lengths uniformly from
#: ``[RANGE x L, L]`` (``benchmark_serving --random-range-ratio 0.8`` in ``benchmarks/benchmark_lib.sh``
#: and the recipes that call it), so a request holds :data:`INFERENCEX_MEAN_LENGTH_RATIO` of the
#: nominal lengths' KV cache on average (:attr:`infercast.serving.backends.SchedulerParams.kv_length_ratio`,
#: set by :func:`recipe_scheduler` for every benchmark of random lengths). It moves only rows whose
#: running set the KV cache bounds: dev rows, 22 of 1,924 predictions change (long prompts or outputs
#: at 64-512 clients), 2 -> 10 of them within 15% of the measured TTFT (e.g. TensorRT-LLM b200
#: DeepSeek-R1 nvfp4 TP4 8192x1024 c256: 3737 ms measured, 11653 -> 4303 predicted; vLLM b300
#: MiniMax-M2.5 8192x1024 c128: 3445, 9836 -> 4330); all rows TTFT median APE 17.97% -> 17.64%,
#: TPOT 7.64% -> 7.61%. (Compute stays at the nominal lengths, where the front-end parameters are
#: calibrated: the mean lengths throughout moved TTFT 21.45% -> 22.94% when that was measured.)
#: Measured and not kept with it: the DeepSeek-R1 TensorRT-LLM scripts' KV fraction
#: (``free_gpu_memory_fraction`` 0.8, 0.75 at TP 4 8192x1024, 0.7 at 1024x8192 from 256 clients, in
#: ``dsr1_fp8_b200_trt.sh``) in place of the engine default 0.9: TTFT 17.64% -> 17.72%, its
#: TP 4 nvfp4 c256 rows queueing for cache they measurably had.
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
#: (:attr:`infercast.serving.backends.SchedulerParams.recv_interval`). Dev rows, SGLang agg TTFT /
#: TPOT median APE by group, lock-step waves -> this: B200 DeepSeek-R1 0.5.9 27.8 / 6.5% -> 17.5 /
#: 6.6%, DeepSeek-V3 0.5.9 30.3 / 5.3% -> 11.9 / 4.7%, B300 Qwen3.5 0.5.10.post1 64.9 / 13.3% -> 17.2
#: / 22.1%; worse: B200 Qwen3.5 0.5.9 29.4 / 10.5% -> 35.5 / 8.4% and H200 Qwen3.5 (InferenceX rows
#: 15-32% -> 36-39%), whose TTFT every variant under-predicts by 0.5-0.8x (a cost of that model's
#: requests not found). The same rows without the interval's wait and gathering: SGLang TTFT
#: 46.6%; with its wait but no gathering: 26.6% (DeepSeek 18.0 / 15.5%). All SGLang rows: TTFT
#: 29.9% -> 28.3%, TPOT 10.4% -> 9.6%; all rows: TTFT 18.95% -> 18.76%, TPOT 7.97% -> 7.83%. (Before
#: this rule, rows whose recipes set no interval -- DeepSeek H200, GLM-5 -- were already served
#: without waves, all of them InferenceX rows: SGLang TTFT 36.0% -> 30.1% then.) The AIC
#: gap-analysis harness's own rows keep the waves: their h100 Qwen3-32B rows (SGLang 0.5.1.post1)
#: fit them at 6.0% and the steady state at 81.6%; the per-model gap-analysis files that re-export
#: InferenceX runs do not (:func:`random_lengths`): their b200 / h200 Qwen3.5 rows' TTFT 25.1 / 29.5%
#: with waves -> 34.7 / 23.6% (all rows 17.94% -> 18.17%), the waves having over-predicted them 2x
#: from 64 clients and under-predicted them below, as the steady state under-predicts the
#: InferenceX Qwen3.5 rows of SGLang 0.5.9 on B200 and H200 (geometric-mean ratio 0.66-0.76 by
#: source). Measured and not kept: the recipes' chunked-prefill size 32768 on B200 (TTFT 28.3% ->
#: 27.6% over SGLang's rows, no group moving by more than a point).
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
#: waves only as long as its clients stay in phase: the H100 campaign's SGLang rows (0.5.1.post1)
#: fit the waves (TTFT median APE 6.0%; the steady state 81.6%), the H200 campaign's (0.5.6.post2,
#: 35 rows) do not -- the waves 126.8% (2-5x over from 176 clients: a wave of 240 1k prompts
#: prefilled before any first token) and the steady state 26.1% (TPOT 20.7% -> 12.9%), so its
#: clients drift apart as InferenceX's do. SGLang's scheduler is prefill-first in both builds
#: (sgl-project/sglang#32549), so the difference is the client's. All rows: TTFT 18.17% -> 17.97%,
#: TPOT 7.66% -> 7.64%. (Its low-concurrency Qwen3-235B rows fit neither: 0.4-0.8x of the
#: measurement either way.) Measured and not kept (dev fullspec rows, TTFT median APE 16.92%, 873
#: within 15%): the H100 campaign's TensorRT-LLM and vLLM rows (mixed prefill / decode steps) as
#: lock-step waves too, as its SGLang rows run: TTFT 17.7 / 24.2% -> 129.7 / 116.9% (geometric-mean
#: ratio 0.81 / 0.79 -> 2.12 / 2.45), all rows 20.97%; the share of waves that would fit a row's
#: TTFT and the share that would fit its TPOT disagree (correlation -0.2), so no mixture of the two
#: regimes holds either. A shorter benchmark for that campaign (3 / 5 requests per client, the
#: first wave weighing more): TensorRT-LLM 42.7 / 27.2%, vLLM 56.6 / 23.3%. The whole closed loop
#: played out request by request, each request's front-end time drawn uniformly within +-50% /
#: +-100% of the mean so that the waves can come apart: TensorRT-LLM 104.7 / 65.2%, vLLM 95.0 /
#: 68.4% (geometric-mean ratio 1.88 / 1.46 and 2.35 / 2.00): such jitter breaks the waves up far
#: more slowly than these rows do. Also measured and not kept (all rows 16.92%, 873 within 15%): the
#: deployment aiconfigurator's own generator writes for TensorRT-LLM agg
#: (``generator/rule_plugin/trtllm.rule``: no chunked prefill, ``max_num_tokens = max_batch_size + isl +
#: 1500``) on this campaign's TensorRT-LLM rows: 17.28% (873; 17.32%, 869, with its vLLM rows on the
#: same budget), no group moving by more than four rows; its benchmark template's length
#: (``bench_run.sh.j2``: aiperf, ``--num-requests`` 50 x C after 2 x C warm-up requests, so the
#: synchronised first wave weighs 1/50): 18.49% (827), Qwen3-32B 42 -> 12, Qwen3-235B 41 -> 19 and
#: Llama-3.1-8B 18 -> 24 of their rows within 15% -- the rows need the first wave's weight of a
#: 10-request run. Where their excess sits: on TensorRT-LLM Qwen3-32B up to 32 clients it is flat in the
#: output length and the client count (TP 1, 4096-token prompts: +610 / +643 ms at 8 / 16 clients) and
#: grows with the prompt and the per-GPU work (+588 / +300 / +209 / +127 ms at TP 1 / 2 / 4 / 8 against
#: 310 / 192 / 128 / 99 ms of predicted own prefill), while the TPOT, which carries every prefill the
#: GPU runs, fits (27.8 measured, 31.2 ms predicted at TP 1, c8): time that is not the GPU's.
#: The excess does fit, at low concurrency, a prompt chunked into ~256-token steps, each also
#: running the decodes (TP 1 / 8, 4096 tokens: 15 more steps of ~35 / ~9 ms). A chunked step budget
#: of 256 / 384 / 512 / 1024 tokens on this campaign's TensorRT-LLM and vLLM rows: all rows 810 /
#: 823 / 830 / 856 within 15% (873 before), TPOT 7.61% -> 8.27 / 8.14 / 8.14 / 7.90%, every model
#: worse: so small a budget also caps the decode batch, which the high-concurrency rows' TPOT refutes.
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
#: Dev rows (28, 1024x1024 / 1024x8192 / 8192x1024, TP 2 / 4, 4-64 clients), TTFT / TPOT median
#: APE: as the v0.19.0 recipe (FlashInfer experts, TP experts, fp8 KV) 31-43% / 15-21%
#: (under-predicted, geometric-mean ratio 0.51-0.65 / 0.80-0.84) -> Triton experts 16.9% / 7.1% ->
#: with expert parallelism 10.4% / 5.8%; fp8 KV instead of bf16 there 10.6% / 5.5%. All rows:
#: TTFT 20.22% -> 19.67%, TPOT 8.59% -> 8.38%.
#:
#: Not modelled: the InferenceX gpt-oss-120b vLLM recipes on Hopper (``benchmarks/gptoss_fp4_h100.sh``,
#: ``gptoss_fp4_h200.sh``) export ``VLLM_MXFP4_USE_MARLIN=1``: their experts run the Marlin
#: weight-only kernel, not the OAI Triton one the h100 / h200 tables measured at gpt-oss's shape.
#: Their 8192x1024 dev rows fit that: TTFT under-predicted by a steady 0.65-0.72x at every TP and
#: concurrency (h200 0.18.0, 13 rows, spread of the log ratio 0.04) while the 1k rows and the TPOT
#: fit (Marlin keeps pace at decode batch sizes, not at an 8k prefill). The pack measured Marlin
#: mxfp4 experts only at one far shape (hidden 3584, 896 experts, top-16), outside the transfer
#: gates; serving them from vLLM 0.19.0's Marlin int4 table through utilisation transfer instead
#: moved those rows' TPOT median APE 5.5% -> 94.6% (the transfer across those shapes does not hold
#: for this kernel), so they keep the measured Triton kernel.
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
#: Dev rows (SGLang, all of its B200 / B300 rows): TPOT median APE 10.9% -> 10.5% (disaggregated
#: 10.5% -> 7.4%), TTFT 30.1% -> 29.4%; all rows TPOT 8.71% -> 8.59%, TTFT 20.31% -> 20.22%. (GB200 /
#: GB300 too, whose Dynamo recipes are not in that repository: the same all-row figures.)
SGLANG_FP8_KV_SYSTEMS = ("b200_sxm", "b300_sxm")
