"""Row -> worker layout rules of the fidelity mapping (pure functions, no pack needed). The
benchmark recipes' tests are in test_recipes_data.py."""

from __future__ import annotations

import pytest

from infercast.validate.predict import _product_layout, _width_rule, gpu_count
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
