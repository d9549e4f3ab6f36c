"""Row -> worker layout rules of the fidelity mapping (pure functions, no pack needed)."""

from __future__ import annotations

import pytest

from infercast.validate.predict import _product_layout, _width_rule, gpu_count
from infercast.validate.recipes import (
    clients_drift,
    inferencex_row,
    mtp_recipe_budget,
    postprocess_workers,
    random_lengths,
    recipe_scheduler,
    sglang_recipe,
    sglang_recv_interval,
    trtllm_recipe,
    vllm_recipe,
)
from infercast.validate.silicon import SiliconRow, WorkerSpec


def _row(id_: str, w: WorkerSpec, mode: str = "agg") -> SiliconRow:
    return SiliconRow(
        id=id_, backend="trtllm", backend_version=None, model="m", system="b200_sxm", mode=mode,
        isl=1024, osl=1024, concurrency=4, gemm_quant=None, moe_quant=None,
        measured_ttft_ms=1.0, measured_tpot_ms=1.0, worker=w,
    )


@pytest.mark.parametrize(
    ("id_", "cols", "want"),
    [
        # the id names tp8 ep8, the TP column holds the product 64: 8 GPUs, TP 8, EP 8
        ("2026_04_06_x_b200_sxm_trtllm_fp8_agg_1024x1024_c4_tp8_ep8_7", (64, 1, 8, 8), (8, 1, 1, 8)),
        ("2026_04_06_x_b200_sxm_trtllm_fp8_agg_1024x1024_c4_tp4_ep4_7", (16, 1, 4, 4), (4, 1, 1, 4)),
        # attention-DP flavour: DP column holds the product
        ("2026_04_06_x_b200_sxm_trtllm_fp8_agg_1024x1024_c4_tp8_ep8_7", (1, 64, 8, 8), (1, 8, 1, 8)),
        # no tokens in the id: the column signature (width = E^2 > node, moe_tp = moe_ep = E) decides
        ("dsr1_b200_sglang_fp4_agg_1024x1024_c4_cfg202", (64, 1, 8, 8), (8, 1, 1, 8)),
        # consistent rows are left alone
        ("2026_04_06_x_b200_sxm_trtllm_fp8_agg_1024x1024_c4_tp8_ep8_7", (8, 1, 1, 8), (8, 1, 1, 8)),
        # the square signature (T, T, 1, T*T): T GPUs, TP T, EP T (ids say tp<T>_ep<T>)
        ("2026_04_06_x_b200_sxm_vllm_fp4_agg_1024x1024_c4_tp4_ep4_7", (4, 4, 1, 16), (4, 1, 1, 4)),
        ("kimik2_5_b200_vllm_fp4_agg_1024x1024_c4_cfg635", (4, 4, 1, 16), (4, 1, 1, 4)),
        ("minimax_b200_vllm_fp8_agg_1024x1024_c16_tp2_ep2_1", (2, 2, 1, 4), (2, 1, 1, 2)),
        # ... but not when the id's tokens say otherwise
        ("x_vllm_fp4_agg_1024x1024_c4_tp16_ep1_7", (4, 4, 1, 16), (4, 4, 1, 16)),
        ("x_vllm_fp4_agg_1024x1024_c4_tp4_ep2_7", (4, 4, 1, 16), (4, 4, 1, 16)),
        ("dsr1_b200_sglang_fp4_agg_1024x1024_c4_cfg1", (8, 1, 8, 1), (8, 1, 8, 1)),
        # a product signature that fits one node is a real layout
        ("dsr1_b200_sglang_fp4_agg_1024x1024_c4_cfg1", (4, 1, 2, 2), (4, 1, 2, 2)),
        ("x_tp2_epnone_1", (2, 1, 2, 1), (2, 1, 2, 1)),
    ],
)
def test_product_layout(id_, cols, want) -> None:
    tp, dp, mtp, mep = cols
    w = WorkerSpec(batch_size=4, tp=tp, attention_dp=dp, moe_tp=mtp, moe_ep=mep)
    got = _product_layout(_row(id_, w), w, 8)
    assert (got.tp, got.attention_dp, got.moe_tp, got.moe_ep) == want


def test_product_layout_leaves_disagg_alone() -> None:
    w = WorkerSpec(batch_size=4, tp=64, moe_tp=8, moe_ep=8)
    assert _product_layout(_row("a_tp8_ep8_1", w, mode="disagg"), w, 8) is w


def test_width_rule_spreads_attention_dp() -> None:
    w = _width_rule(WorkerSpec(batch_size=4, tp=1, attention_dp=1, moe_tp=2, moe_ep=1))
    assert (w.tp, w.attention_dp) == (1, 2)


def test_gemm_decode_ratio_helpers() -> None:
    """The decode-gap rule's shape-by-shape median: only shapes both tables hold, only m <= 16."""
    import numpy as np

    from infercast.ops import gemm as gemm_ops

    class T:
        def __init__(self, lat):
            n = np.repeat([1024, 2048, 4096, 8192, 16384], 8).astype(float)
            k = np.tile(np.repeat([4096.0, 8192.0], 4), 5)
            m = np.tile([1.0, 8.0, 16.0, 32.0], 10)
            self.keys = {"n": n, "k": k, "m": m}
            self.latency = np.asarray(lat(n, k, m), float)

    fast = T(lambda n, k, m: 1e-9 * n * k)
    slow = T(lambda n, k, m: np.where(m <= 16, 2e-9 * n * k, 5e-9 * n * k))
    mask = np.ones(40, bool)
    a, b = gemm_ops._decode_latencies(slow, mask), gemm_ops._decode_latencies(fast, mask)
    assert len(a) == 30 and all(key[2] <= 16 for key in a)
    assert gemm_ops._median_ratio(a, b) == pytest.approx(2.0)
    assert gemm_ops._median_ratio(a, {}) is None
    big = gemm_ops._decode_latencies(slow, mask, 2**25)
    assert all(key[0] * key[1] >= 2**25 for key in big) and len(big) == 15


@pytest.mark.parametrize(("cols", "mode", "want"), [
    ((36, 1, 1), "agg", 36),     # no backend shards by 36: a GPU count
    ((72, 1, 1), "agg", 72),
    ((20, 1, 1), "agg", 20),
    ((32, 1, 1), "agg", None),   # a power of two is a TP degree, taken as the row says ...
    ((8, 1, 1), "agg", None),
    ((1, 1, 1), "agg", None),
    ((6, 2, 1), "agg", None),    # pipeline stages or attention DP: not the GPU-count signature
    ((6, 1, 2), "agg", None),
    ((36, 1, 1), "disagg", None),
])
def test_gpu_count_rows(cols, mode, want) -> None:
    tp, pp, dp = cols
    w = WorkerSpec(batch_size=4, tp=tp, pp=pp, attention_dp=dp, moe_tp=tp, moe_ep=1)
    assert gpu_count(_row("2026_04_06_x_gb200_trtllm_fp4_agg_1024x1024_c4_tp36_ep1_1", w, mode)) == want


@pytest.mark.parametrize(("tp", "ep", "want"), [
    (32, 1, 32),    # ... except an MoE model's TP wider than 8 without EP: a GPU count
    (64, 1, 64),
    (16, 1, 16),
    (8, 1, None),   # TP 8 experts are served
    (32, 8, None),  # with expert parallelism the width is a layout (the product rule reads it)
    (36, 1, 36),
])
def test_gpu_count_wide_moe_tp_without_ep(tp, ep, want) -> None:
    w = WorkerSpec(batch_size=4, tp=tp, attention_dp=1, moe_tp=tp // ep, moe_ep=ep)
    row = _row("2026_04_06_x_gb200_trtllm_fp4_agg_8192x1024_c4_tp32_ep1_1", w)
    assert gpu_count(row, moe_model=True) == want
    assert gpu_count(row, moe_model=False) == (want if tp & (tp - 1) else None)  # a dense model's TP 32 is TP 32


@pytest.mark.parametrize(("backend", "version", "quant", "adp", "want"), [
    ("trtllm", "1.2.0rc6.post3", "fp8", 1, (3, None)),       # the MTP recipe: depth 3, DeepGEMM (own table)
    ("trtllm", "1.2.0rc6.post3", "nvfp4", 8, (1, None)),     # ... depth 1 with attention DP
    ("trtllm", "1.2.0rc6.post2", "fp8", 1, (0, "trtllm")),   # the STP recipe: no MTP, TensorRT-LLM-gen experts
    ("trtllm", "1.2.0rc6.post2", "fp8", 8, (0, "deepgemm")),  # ... DeepGEMM with attention DP
    ("trtllm", "1.2.0rc6.post2", "nvfp4", 1, (0, None)),
    ("trtllm", "1.1.0rc2.post2", "fp8", 1, None),            # both recipes ran this tag: no reading
    ("trtllm", None, "fp8", 1, None),
    ("sglang", "1.2.0rc6.post3", "fp8", 1, None),
])
def test_trtllm_recipe_by_benchmarked_version(backend, version, quant, adp, want) -> None:
    row = _row("x_trtllm_fp8_agg_1024x1024_c4_1", WorkerSpec(batch_size=4, tp=8, attention_dp=adp))
    from dataclasses import replace

    row = replace(row, backend=backend, backend_version=version, gemm_quant=quant)
    assert trtllm_recipe(row, adp) == want


IX = "source_file=2026-04-06.csv; model=X; silicon_concurrency=4"


@pytest.mark.parametrize(("model", "backend", "source", "workers"), [
    ("meta-llama/Llama-3.1-70B", "trtllm", IX, 2),
    ("openai/gpt-oss-120b", "trtllm", IX, 4),
    ("deepseek-ai/DeepSeek-R1", "trtllm", IX, 0),          # the DeepSeek recipes set none
    ("openai/gpt-oss-120b", "vllm", IX, 0),                # a TensorRT-LLM setting
    ("openai/gpt-oss-120b", "trtllm", "db-dump/2026-04-27; config_id=1", 0),  # another harness
])
def test_inferencex_postprocess_workers(model, backend, source, workers) -> None:
    from dataclasses import replace

    row = replace(_row("x", WorkerSpec(batch_size=4, tp=4)), model=model, backend=backend, source=source)
    assert inferencex_row(row) == source.startswith("source_file=2026")
    assert postprocess_workers(row) == workers


@pytest.mark.parametrize(("tp", "lengths", "source", "delayed"), [
    (4, (1024, 1024), IX, True),
    (8, (1024, 1024), IX, False),     # the recipe sets it below TP 8 only
    (4, (1024, 8192), IX, False),     # ... and at 1024x1024 only
    (4, (1024, 1024), "db-dump/2026-04-27", False),
])
def test_llama_recipe_batch_wait(tp, lengths, source, delayed) -> None:
    from dataclasses import replace

    from infercast.serving.backends import scheduler_params

    row = replace(_row("x", WorkerSpec(batch_size=4, tp=tp)), model="meta-llama/Llama-3.1-70B", source=source,
                  isl=lengths[0], osl=lengths[1])
    p = recipe_scheduler(row, scheduler_params("trtllm"))
    assert (p.batch_wait_iters, p.batch_wait_max_tokens_ratio) == ((20, 0.9) if delayed else (0, 0.0))


@pytest.mark.parametrize(("system", "source", "budget"), [
    ("b200_sxm", IX, 16384),   # 70b_fp8_b200_trt_slurm.sh: --max_num_tokens 16384, every configuration
    ("h200_sxm", IX, None),    # the H200 script's $MAX_MODEL_LEN is not in the rows: the default
    ("b200_sxm", "db-dump/2026-04-27", None),  # another harness
])
@pytest.mark.parametrize("lengths", [(1024, 1024), (8192, 1024)])
def test_llama_trt_b200_recipe_budget(system, source, budget, lengths) -> None:
    from dataclasses import replace

    from infercast.serving.backends import scheduler_params

    row = replace(_row("x", WorkerSpec(batch_size=4, tp=8)), model="meta-llama/Llama-3.1-70B", source=source,
                  system=system, isl=lengths[0], osl=lengths[1])
    default = scheduler_params("trtllm")
    p = recipe_scheduler(row, default)
    if budget is None:
        assert (p.max_num_tokens, p.chunked) == (default.max_num_tokens, default.chunked)
    else:
        # the whole prompt runs in one step: TensorRT-LLM's default, no chunked prefill
        assert (p.max_num_tokens, p.chunked) == (budget, False)


_IX = "source_file=2026-04-06.csv; model=m; silicon_concurrency=4"
_DUMP = "db-dump/2026-04-27; config_id=1; silicon_concurrency=4"
_AIC = "source_file=/Users/x/aic-auto-gap-analysis/data/h100_sxm/sglang/0.5.1.post1/Qwen_Qwen3-32B.csv"
_REEXPORT = "source_file=qwen3.5-397b-gap-analysis.csv; silicon_concurrency=8"


@pytest.mark.parametrize(("system", "model", "source", "conc", "tp", "quant", "interval"), [
    ("b200_sxm", "deepseek-ai/DeepSeek-R1", _IX, 4, 8, "nvfp4", 10),     # dsr1_fp4_b200.sh: 10 below 16 clients
    ("b200_sxm", "deepseek-ai/DeepSeek-R1", _IX, 16, 8, "nvfp4", 30),    # ... 30 from 16
    ("b200_sxm", "deepseek-ai/DeepSeek-R1", _DUMP, 64, 4, "fp8", 10),    # dsr1_fp8_b200.sh TP 4: always 10
    ("b300_sxm", "Qwen/Qwen3.5-397B-A17B", _DUMP, 128, 4, "fp8", 30),   # B300 reuses the B200 scripts
    ("h200_sxm", "deepseek-ai/DeepSeek-R1", _IX, 64, 8, "fp8", 1),       # dsr1_fp8_h200.sh: none (SGLang's 1)
    ("b200_sxm", "zai-org/GLM-5", _IX, 64, 8, "fp8", 1),                 # glm5_fp8_b200.sh: none
    ("h100_sxm", "Qwen/Qwen3-32B", _AIC, 64, 2, "fp8", None),           # fixed lengths: lock-step waves
    ("b200_sxm", "Qwen/Qwen3.5-397B-A17B", _REEXPORT, 8, 4, "fp8", 10),  # InferenceX runs, re-exported
    ("h200_sxm", "Qwen/Qwen3.5-397B-A17B", _REEXPORT, 8, 8, "fp8", 1),   # ... on H200: no interval
])
def test_sglang_recipe_poll_interval_and_waves(system, model, source, conc, tp, quant, interval) -> None:
    """InferenceX's random lengths drift the closed loop apart: its SGLang rows run the steady
    state with the recipe's --scheduler-recv-interval; other rows keep SGLang's lock-step waves."""
    from dataclasses import replace

    from infercast.serving.backends import scheduler_params

    row = replace(_row("x", WorkerSpec(batch_size=conc, tp=tp)), backend="sglang", system=system, model=model,
                  source=source, concurrency=conc, gemm_quant=quant)
    p = recipe_scheduler(row, scheduler_params("sglang"))
    assert random_lengths(row) is (interval is not None)
    if interval is None:
        assert p.lockstep is True and p.recv_interval == 1
    else:
        assert p.lockstep is False and p.recv_interval == interval
        assert sglang_recv_interval(row, sglang_recipe(row, tp)) == interval
    # other engines keep their own defaults
    assert recipe_scheduler(replace(row, backend="vllm"), scheduler_params("vllm")).recv_interval == 1


@pytest.mark.parametrize(("version", "worker", "per_rank", "want"), [
    ("1.2.0rc6.post3", WorkerSpec(batch_size=128, tp=8), 128, (1600, 128)),          # MTP 3: 4 x 128 + 1024 + 64
    ("1.2.0rc6.post3", WorkerSpec(batch_size=16, tp=1, attention_dp=8), 16, (1152, 16)),  # MTP 1 with attention DP
    ("1.2.0rc6.post2", WorkerSpec(batch_size=128, tp=8), 128, None),                 # the plain recipe: engine defaults
])
def test_mtp_recipe_step_budget(version, worker, per_rank, want) -> None:
    """dsr1_*_b200_trt_mtp.sh: max_batch_size = the clients per rank, max_num_tokens = (MTP + 1) x
    that + ISL + 64 rounded up to 64, no chunked prefill."""
    from dataclasses import replace

    from infercast.serving.backends import scheduler_params

    row = replace(_row("x", worker), model="deepseek-ai/DeepSeek-R1", backend_version=version, gemm_quant="fp8",
                  concurrency=128)
    assert mtp_recipe_budget(row, per_rank) == want
    p = recipe_scheduler(row, scheduler_params("trtllm"), per_rank)
    default = scheduler_params("trtllm")
    if want is None:
        assert (p.chunked, p.max_num_tokens, p.max_batch_size) == (default.chunked, default.max_num_tokens, default.max_batch_size)
    else:
        assert (p.chunked, p.max_num_tokens, p.max_batch_size) == (False, *want)
    # without the clients per rank (a search over layouts) the rule has nothing to size by
    assert recipe_scheduler(row, scheduler_params("trtllm")).max_num_tokens == default.max_num_tokens
    assert mtp_recipe_budget(replace(row, model="meta-llama/Llama-3.1-70B"), per_rank) is None


@pytest.mark.parametrize(("backend", "system", "quant", "kv"), [
    ("sglang", "b200_sxm", None, "fp8"),      # the B200 / B300 SGLang recipes: --kv-cache-dtype fp8_e4m3
    ("sglang", "b300_sxm", "fp8", "fp8"),
    ("sglang", "h200_sxm", "fp8", None),      # ... the H200 ones keep the default
    ("trtllm", "h200_sxm", "fp8", "fp8"),     # quantised checkpoints on TensorRT-LLM / vLLM
    ("vllm", "b200_sxm", None, None),
])
def test_kv_cache_dtype_by_recipe(backend, system, quant, kv) -> None:
    from dataclasses import replace

    from infercast.validate.predict import _kv_quant

    row = replace(_row("x", WorkerSpec(batch_size=4, tp=8)), backend=backend, system=system, gemm_quant=quant)
    assert _kv_quant(row) == kv


@pytest.mark.parametrize(("version", "quant", "conc", "delayed"), [
    ("1.2.0rc6.post2", "fp8", 64, True),     # dsr1_fp8_b200_trt.sh: DELAY_BATCHING from 64 to 255 clients
    ("1.2.0rc6.post2", "fp8", 256, False),
    ("1.2.0rc6.post2", "fp8", 32, False),
    ("1.2.0rc6.post2", "nvfp4", 64, False),
    ("1.2.0rc6.post3", "fp8", 64, False),    # the MTP recipe does not delay
])
def test_deepseek_plain_recipe_batch_wait(version, quant, conc, delayed) -> None:
    from dataclasses import replace

    from infercast.serving.backends import scheduler_params

    row = replace(_row("x", WorkerSpec(batch_size=conc, tp=8)), model="deepseek-ai/DeepSeek-R1", backend_version=version,
                  gemm_quant=quant, concurrency=conc)
    p = recipe_scheduler(row, scheduler_params("trtllm"))
    assert (p.batch_wait_iters, p.batch_wait_max_tokens_ratio) == ((40, 0.8) if delayed else (0, 0.0))


@pytest.mark.parametrize(("model", "system", "quant", "version", "want"), [
    # minimaxm2.5_fp8_b200.sh at v0.17.0: Triton experts, --enable-expert-parallel, no --kv-cache-dtype
    ("MiniMaxAI/MiniMax-M2.5", "b200_sxm", "fp8", "0.17.0", ("triton", True, None)),
    ("MiniMaxAI/MiniMax-M2.5", "b200_sxm", "fp8", "0.19.0", None),     # PR #947: the defaults again
    ("MiniMaxAI/MiniMax-M2.5", "b200_sxm", "nvfp4", "0.17.0", None),   # another script
    ("MiniMaxAI/MiniMax-M2.5", "h200_sxm", "fp8", "0.17.0", None),
])
def test_vllm_recipe_by_benchmarked_version(model, system, quant, version, want) -> None:
    from dataclasses import astuple, replace

    from infercast.validate.predict import _kv_quant

    row = replace(_row("x", WorkerSpec(batch_size=4, tp=2)), backend="vllm", model=model, system=system,
                  gemm_quant=quant, backend_version=version)
    got = vllm_recipe(row)
    assert (astuple(got) if got else None) == want
    assert _kv_quant(row) == (None if want else "fp8")  # the recipe's KV dtype, else the quantised default
    assert vllm_recipe(replace(row, backend="sglang")) is None


@pytest.mark.parametrize(("system", "quant", "tp", "want"), [
    ("b200_sxm", "fp8", 4, (0.95, 8192, 32, 10)),   # dsr1_fp8_b200.sh at TP 4: room for KV beside ~169 GB of weights
    ("b300_sxm", "fp8", 4, (0.95, 8192, 32, 10)),   # the B300 entries reuse the B200 recipe
    ("b200_sxm", "fp8", 8, None),               # TP 8: the rows are the MTP variant's, not taken
    ("b200_sxm", "nvfp4", 4, None),
    ("h200_sxm", "fp8", 4, None),
])
def test_sglang_recipe_sizes(system, quant, tp, want) -> None:
    from dataclasses import astuple, replace

    from infercast.serving.backends import scheduler_params

    row = replace(_row("x", WorkerSpec(batch_size=8, tp=tp)), backend="sglang", system=system, gemm_quant=quant,
                  model="deepseek-ai/DeepSeek-R1", isl=8192)
    got = sglang_recipe(row, tp)
    assert (astuple(got) if got else None) == want
    p = recipe_scheduler(row, scheduler_params("sglang"))
    default = scheduler_params("sglang")
    assert (p.max_num_tokens, p.max_batch_size) == ((want[1], want[2]) if want else (default.max_num_tokens, default.max_batch_size))
    assert sglang_recipe(replace(row, backend="vllm"), tp) is None


@pytest.mark.parametrize(("model", "quant", "want"), [
    # no NVIDIA export config in the pack: the export's alias, whose MLA projections stay BF16
    ("deepseek-ai/DeepSeek-R1", "nvfp4", ("nvidia/DeepSeek-R1-NVFP4", None, None)),
    ("deepseek-ai/DeepSeek-V3", "nvfp4", ("nvidia/DeepSeek-V3-NVFP4", None, None)),
    ("nvidia/DeepSeek-R1-NVFP4", "nvfp4", ("nvidia/DeepSeek-R1-NVFP4", None, None)),  # the row names it
    # the export's config is in the pack
    ("MiniMaxAI/MiniMax-M2.5", "nvfp4", ("nvidia/MiniMax-M2.5-NVFP4", None, None)),
    # another architecture keeps the row's override (every dense GEMM nvfp4)
    ("meta-llama/Llama-3.1-70B", "nvfp4", ("meta-llama/Llama-3.1-70B", "nvfp4", "nvfp4")),
])
def test_nvfp4_rows_run_nvidias_export(real_pack_available, model, quant, want) -> None:
    from dataclasses import replace

    from infercast.validate.predict import map_quant

    row = replace(_row("x", WorkerSpec(batch_size=4, tp=8)), model=model, gemm_quant=quant, moe_quant=quant)
    assert map_quant(row) == want


@pytest.mark.parametrize(("source", "random"), [
    ("source_file=kimi-k2.5-gap-analysis.csv; silicon_concurrency=4", True),    # re-exported InferenceX runs
    ("source_file=2026-03-25.csv; model=m", True),
    ("db-dump/2026-04-27; config_id=1", True),
    ("source_file=/Users/x/aic-auto-gap-analysis/data/b200_sxm/vllm/0.12.0/m-gap-analysis.csv", False),  # harness path
    ("source_file=/Users/x/aic-auto-gap-analysis/data/h100_sxm/vllm/0.12.0/Qwen_Qwen3-32B.csv", False),
    ("", False),
])
def test_random_lengths_by_source(source, random) -> None:
    from dataclasses import replace

    assert random_lengths(replace(_row("x", WorkerSpec(batch_size=4, tp=8)), source=source)) is random


@pytest.mark.parametrize(("version", "source", "overlap"), [
    ("0.5.10.post1", _IX, True),              # keeps the overlap without the radix cache
    ("nightly-dev-20260402-d7256eb6", _DUMP, True),
    ("0.5.9", _IX, False),                    # an older build: off, as scheduler_params set it
    ("0.5.10.post1", _AIC, False),            # not an InferenceX recipe (radix cache unknown)
])
def test_sglang_hybrid_model_overlap_by_build(version, source, overlap) -> None:
    """A hybrid linear-attention model's SGLang scheduler (overlap off by default) keeps the
    overlap in InferenceX's recipes (--disable-radix-cache) from the builds that support it."""
    from dataclasses import replace
    from types import SimpleNamespace

    from infercast.serving.backends import scheduler_params

    hybrid = scheduler_params("sglang", spec=SimpleNamespace(gdn=object()))
    assert hybrid.overlap is False
    row = replace(_row("x", WorkerSpec(batch_size=4, tp=8)), backend="sglang", system="b300_sxm",
                  model="Qwen/Qwen3.5-397B-A17B", source=source, backend_version=version, concurrency=4)
    assert recipe_scheduler(row, hybrid).overlap is overlap
    # a model SGLang overlaps anyway keeps it whatever the build
    assert recipe_scheduler(replace(row, backend_version="0.5.9"), scheduler_params("sglang")).overlap is True


@pytest.mark.parametrize(("source", "drift"), [
    ("source_file=/Users/x/aic-auto-gap-analysis/data/h200_sxm/sglang/0.5.6.post2/m.csv; silicon_concurrency=240", True),
    ("source_file=/Users/x/aic-auto-gap-analysis/data/h100_sxm/sglang/0.5.1.post1/m.csv; silicon_concurrency=64", False),
    ("source_file=2026-04-06.csv; model=m", True),               # random lengths drift too
    ("source_file=/Users/x/elsewhere/data/h200_sxm/sglang/0.5.6.post2/m.csv", False),
])
def test_clients_drift_by_campaign(source, drift) -> None:
    """The AIC harness's H200 campaign runs SGLang's steady state, its H100 campaign lock-step
    waves; neither takes InferenceX's poll interval."""
    from dataclasses import replace

    from infercast.serving.backends import scheduler_params

    row = replace(_row("x", WorkerSpec(batch_size=64, tp=2)), backend="sglang", system="h200_sxm",
                  model="Qwen/Qwen3-235B-A22B-FP8", source=source, concurrency=64)
    assert clients_drift(row) is drift
    p = recipe_scheduler(row, scheduler_params("sglang"))
    assert p.lockstep is (not drift)
    assert p.recv_interval == 1


@pytest.mark.parametrize(("backend", "source", "ratio"), [
    ("trtllm", _IX, 0.9),        # InferenceX: lengths uniform on [0.8 L, L]
    ("vllm", _IX, 0.9),
    ("sglang", _REEXPORT, 0.9),  # InferenceX runs, re-exported
    ("sglang", _AIC, 1.0),       # the AIC harness: fixed lengths
    ("vllm", None, 1.0),         # no source: nominal lengths
])
def test_random_lengths_hold_their_mean_kv(backend, source, ratio) -> None:
    """A benchmark of random lengths fills the KV cache with its mean lengths' tokens."""
    from dataclasses import replace

    from infercast.serving.backends import mean_length_ratio, scheduler_params
    from infercast.validate.recipes import INFERENCEX_MEAN_LENGTH_RATIO

    assert INFERENCEX_MEAN_LENGTH_RATIO == mean_length_ratio(0.8) == pytest.approx(0.9)
    row = replace(_row("x", WorkerSpec(batch_size=4, tp=8)), backend=backend, source=source)
    assert recipe_scheduler(row, scheduler_params(backend)).kv_length_ratio == pytest.approx(ratio)
    for bad in (0.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError):
            mean_length_ratio(bad)
