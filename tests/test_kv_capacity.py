"""KV-cache capacity against the serving engines' own accounting (docs/kv_capacity.md).

Three documented cases. For each, the per-token KV bytes are asserted exactly (hand-computed from
the model config) and ``Estimator(...).memory.kv_capacity_tokens`` within a stated tolerance of
the figure the engine itself reports, derived by hand in the doc from the engine's documented
formula and publicly logged inputs (sources cited there). The engine formulas are implemented
here once and anchored on logged engine output, so a wrong transcription fails too.
"""

from __future__ import annotations

import math

import pytest

GiB = 2**30

pytestmark = pytest.mark.real_pack


# ---------------------------------------------------------------------------------------------
# the engines' formulas (see docs/kv_capacity.md for the source of each)
# ---------------------------------------------------------------------------------------------
def vllm_tokens(util: float, total_gib: float, non_kv_gib: float, cudagraph_gib: float, bytes_per_token: int, block: int = 16) -> int:
    """vLLM v1: (gpu_memory_utilization x total - non-KV memory - CUDA-graph estimate) in whole blocks."""
    avail = util * total_gib - non_kv_gib - cudagraph_gib
    return math.floor(avail * GiB / (bytes_per_token * block)) * block


def trtllm_tokens(fraction: float, total_gib: float, peak_gib: float, bytes_per_token: int, block: int = 32) -> int:
    """TensorRT-LLM (PyTorch flow): free_gpu_memory_fraction x (total - profiling peak), whole blocks."""
    tokens = math.floor(fraction * (total_gib - peak_gib) * GiB / bytes_per_token)
    return tokens // block * block


def sglang_tokens(mem_fraction_static: float, total_after_init_gib: float, weights_gib: float, cell_size: int) -> int:
    """SGLang ``profile_max_num_token``: rest = available after weights - total x (1 - mfs)."""
    rest = (total_after_init_gib - weights_gib) - total_after_init_gib * (1.0 - mem_fraction_static)
    return int(rest * GiB // cell_size)


def sglang_default_mem_fraction(gpu_mem_mib: float, chunked_prefill_size: int, cuda_graph_max_bs: int, tp: int, pp: int = 1) -> float:
    """SGLang's default ``mem_fraction_static`` (server_args heuristic, sgl-project/sglang#10975)."""
    reserved = 512 + max(chunked_prefill_size, 2048) * 1.5 + cuda_graph_max_bs * 2 + tp * pp / 8 * 1024
    if gpu_mem_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)


def test_vllm_formula_reproduces_a_logged_pool():
    # vLLM 0.19.0, H100 80GB, Llama-3.1-8B-Instruct, --gpu-memory-utilization 0.95: total 79.19 GiB,
    # non-KV 17.12 GiB, logged "Available KV cache memory: 58.11 GiB", "GPU KV cache size: 476,016 tokens"
    got = vllm_tokens(0.95, 79.19, 17.12, 0.0, 131072)
    assert got == pytest.approx(476_016, rel=1e-4)  # 58.11 is rounded to 10 MiB: one block apart


def test_sglang_formula_reproduces_a_logged_pool():
    # SGLang, DeepSeek on GB200: total_gpu_mem 174.8407 GiB, avail after load 78.7196 GiB,
    # rest_memory 69.9776 GiB (mem_fraction_static 0.95), cell_size 70272, max_num_tokens 1069242
    total, avail, rest = 174.8406982421875, 78.7196044921875, 69.97756958007812
    assert 1.0 - (avail - rest) / total == pytest.approx(0.95, abs=1e-9)  # the run's mem_fraction_static
    assert sglang_tokens(0.95, total, total - avail, 70272) == 1_069_242
    # the H200 default: 143,771 MiB, chunked prefill 8192, CUDA graphs up to bs 512 at TP >= 4
    assert sglang_default_mem_fraction(143_771, 8192, 512, tp=8) == 0.897


# ---------------------------------------------------------------------------------------------
# the three cases
# ---------------------------------------------------------------------------------------------
H200_TORCH_TOTAL_GIB = 143_771 / 1024 - (81_559 / 1024 - 79.19)  # nvidia-smi total less the H100's torch gap

CASES = {
    # (a) vLLM: Llama-3.1-8B, H100 SXM, TP1, bf16. Per token: 32 layers x 2 (K, V) x 8 KV heads x
    # 128 dims x 2 bytes. Engine: 0.90 x 79.19 GiB - 17.12 GiB non-KV (14.99 weights + 1.89 torch
    # peak + 0.25 non-torch, vLLM 0.19 log) - 0.84 GiB CUDA-graph estimate.
    "a-vllm-llama8b-h100": dict(
        estimator=("meta-llama/Meta-Llama-3.1-8B", "h100_sxm", "vllm", dict(tp=1)),
        kv_per_token=32 * 2 * 8 * 128 * 2,
        engine_tokens=vllm_tokens(0.90, 79.19, 17.12, 0.84, 32 * 2 * 8 * 128 * 2),
        engine_weights_gib=14.99,
        block=16,
        tolerance=0.05,
    ),
    # (b) TensorRT-LLM: Llama-3.1-70B, H200 SXM, TP4, fp8 weights, fp8 KV. Per token per GPU:
    # 80 layers x 2 x (8 KV heads / 4) x 128 x 1 byte. Engine: 0.9 x (H200 total as torch sees it -
    # profiling peak 21.65 GiB = 16.96 weights + 4.18 activation/non-torch at 8192 tokens + 0.51
    # CUDA context), in 32-token blocks.
    "b-trtllm-llama70b-h200-fp8": dict(
        estimator=("meta-llama/Meta-Llama-3.1-70B", "h200_sxm", "trtllm", dict(tp=4, gemm_quant="fp8", kv_cache_quant="fp8")),
        kv_per_token=80 * 2 * (8 // 4) * 128 * 1,
        engine_tokens=trtllm_tokens(0.9, H200_TORCH_TOTAL_GIB, 16.96 + 4.18 + 0.51, 80 * 2 * 2 * 128),
        engine_weights_gib=16.96,
        block=32,
        tolerance=0.05,
    ),
    # (c) SGLang: DeepSeek-V3, H200 SXM, TP8, MLA latent cache in bf16 (replicated on every rank):
    # 61 layers x (kv_lora_rank 512 + qk_rope_head_dim 64) x 2 bytes. Engine: default
    # mem_fraction_static 0.897 x 137.29 GiB free after init - 79.41 GiB weights.
    "c-sglang-deepseekv3-h200-mla": dict(
        estimator=("deepseek-ai/DeepSeek-V3", "h200_sxm", "sglang", dict(tp=8)),
        kv_per_token=61 * (512 + 64) * 2,
        engine_tokens=sglang_tokens(sglang_default_mem_fraction(143_771, 8192, 512, tp=8), 137.29, 79.41, 61 * 576 * 2),
        engine_weights_gib=79.41,
        block=1,
        tolerance=0.05,
    ),
}

@pytest.fixture(scope="module")
def memories(real_pack_available):
    from infercast import Estimator

    out = {}
    for name, case in CASES.items():
        model, system, backend, kw = case["estimator"]
        out[name] = Estimator(model, system, backend, **kw).memory
    return out


def test_engine_figures_as_documented():
    # the numbers docs/kv_capacity.md states for each engine
    assert CASES["a-vllm-llama8b-h100"]["engine_tokens"] == 436_720
    assert CASES["b-trtllm-llama70b-h200-fp8"]["engine_tokens"] == 2_790_880
    assert CASES["c-sglang-deepseekv3-h200-mla"]["engine_tokens"] == 668_324


@pytest.mark.parametrize("name", list(CASES))
def test_kv_bytes_per_token_exact(memories, name):
    assert memories[name].kv_per_token == CASES[name]["kv_per_token"]


@pytest.mark.parametrize("name", list(CASES))
def test_weights_match_the_logged_footprint(memories, name):
    assert memories[name].weights / GiB == pytest.approx(CASES[name]["engine_weights_gib"], rel=0.02)


@pytest.mark.parametrize("name", list(CASES))
def test_capacity_is_whole_blocks(memories, name):
    mem = memories[name]
    assert mem.tokens_per_block == CASES[name]["block"]
    assert mem.kv_capacity_tokens == mem.kv_capacity_blocks * mem.tokens_per_block > 0


@pytest.mark.parametrize("name", [
    "a-vllm-llama8b-h100",
    "b-trtllm-llama70b-h200-fp8",
    "c-sglang-deepseekv3-h200-mla",
])
def test_kv_capacity_matches_the_engine(memories, name):
    case = CASES[name]
    got, want = memories[name].kv_capacity_tokens, case["engine_tokens"]
    assert abs(got / want - 1.0) <= case["tolerance"], f"infercast {got} vs engine {want} ({got / want - 1.0:+.2%})"
