"""MiMo-V2-Flash: sliding-window / full attention of different KV heads, v heads narrower than q/k
heads, MoE with a dense first layer."""

from __future__ import annotations

import pytest

from infercast.data.model_configs import ModelConfig
from infercast.errors import InvalidInputError
from infercast.models.groups import AttentionGroup
from infercast.models.plan import ParallelConfig, build_plan
from infercast.models.spec import build_spec
from infercast.serving.memory import kv_bytes_per_token, state_bytes_per_request, weight_bytes_per_gpu


def _mimo(**cfg) -> ModelConfig:
    c = {"architectures": ["MiMoV2FlashForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
         "num_key_value_heads": 1, "head_dim": 24, "v_head_dim": 16, "swa_num_attention_heads": 4,
         "swa_num_key_value_heads": 2, "swa_head_dim": 24, "swa_v_head_dim": 16, "sliding_window_size": 8,
         "num_hidden_layers": 6, "hybrid_layer_pattern": [0, 1, 1, 0, 1, 1], "moe_layer_freq": [0, 1, 1, 1, 1, 1],
         "intermediate_size": 96, "moe_intermediate_size": 16, "n_routed_experts": 8, "num_experts_per_tok": 2,
         "n_shared_experts": None, "vocab_size": 1000, **cfg}
    return ModelConfig("x/mimo", "x/mimo", c)


def _ops(plan):
    return {o.name: o for o in plan.ops}


def test_layer_groups_and_moe():
    spec = build_spec(_mimo())
    assert spec.family == "moe"
    # hybrid_layer_pattern 1 = sliding window, 0 = full attention
    assert spec.attention_groups == (AttentionGroup(4, "gqa", 4, 2, 24, 16, 8), AttentionGroup(2, "gqa", 4, 1, 24, 16, 0))
    m = spec.moe
    assert (m.experts, m.topk, m.inter, m.shared_inter, m.first_dense_layers, m.dense_inter) == (8, 2, 16, 0, 1, 96)
    every = build_spec(_mimo(moe_layer_freq=1)).moe
    assert every.first_dense_layers == 0 and every.dense_inter == 0


def test_plan_shapes_with_narrow_v_heads():
    ops = _ops(build_plan(build_spec(_mimo()), ParallelConfig(tp=1)))
    # q 4x24 + k 2x24 + v 2x16 (sliding); q 4x24 + k 24 + v 16 (full)
    assert (ops["qkv_gemm_window8_kv2_d24"].count, ops["qkv_gemm_window8_kv2_d24"].params["n"]) == (4, 176)
    assert (ops["qkv_gemm_full_kv1_d24"].count, ops["qkv_gemm_full_kv1_d24"].params["n"]) == (2, 136)
    # the output projection reads the 16-wide v heads; attention runs at the q/k head size
    assert ops["o_gemm_window8_kv2_d24"].params["k"] == 4 * 16 and ops["attention_full_kv1_d24"].params["head_dim"] == 24
    assert ops["attention_window8_kv2_d24"].params["window"] == 8
    assert ops["dense_gate_up_gemm"].count == 1 and ops["moe_experts"].count == 5 and ops["router_gemm"].count == 5
    assert "sandwich_norms" not in ops and "qk_norm_full_kv1_d24" not in ops


def test_memory():
    spec = build_spec(_mimo())
    par = ParallelConfig(tp=1)
    assert kv_bytes_per_token(spec, par) == 2 * 1 * (24 + 16) * 2  # the two full layers
    assert state_bytes_per_request(spec, par) == 4 * 8 * 2 * (24 + 16) * 2  # four windows of 8 tokens
    attn = 4 * (64 * 176 + 64 * 64) + 2 * (64 * 136 + 64 * 64)
    ffn = 5 * (8 * 3 * 64 * 16 + 64 * 8) + 3 * 64 * 96
    assert weight_bytes_per_gpu(spec, par) == pytest.approx(2.0 * (attn + 6 * 2 * 64 + ffn + 2 * 1000 * 64))


def test_malformed_patterns():
    with pytest.raises(InvalidInputError, match="hybrid_layer_pattern has 5 entries for 6 layers"):
        build_spec(_mimo(hybrid_layer_pattern=[0, 1, 1, 1, 1]))
    with pytest.raises(InvalidInputError, match="moe_layer_freq holds 2"):
        build_spec(_mimo(moe_layer_freq=[0, 1, 2, 1, 1, 1]))
    with pytest.raises(InvalidInputError, match="dense layers .* need intermediate_size"):
        build_spec(_mimo(intermediate_size=None))


@pytest.mark.real_pack
@pytest.mark.parametrize("system, backend, kv", [("h200_sxm", "trtllm", None), ("h200_sxm", "sglang", None),
                                                 ("b200_sxm", "vllm", "fp8")])
def test_mimo_v2_flash_on_the_real_pack(real_pack_available, system, backend, kv):
    from infercast import Estimator

    est = Estimator("XiaomiMiMo/MiMo-V2-Flash", system, backend, tp=4, kv_cache_quant=kv)
    # 309 B parameters in block-scaled fp8 (the published total)
    assert est.memory.weights * 4 / 1.0 == pytest.approx(309e9, rel=0.02)
    res = est.static(8, 2048, 128)
    assert res.fits and res.ttft_ms > 0 and res.tpot_ms > 0
    names = {op.name for op in est.plan.ops}
    assert {"attention_window128_kv8_d192", "attention_full_kv4_d192", "moe_experts", "dense_gate_up_gemm"} <= names


def test_notes_say_what_the_layer_groups_approximate():
    from infercast.models.groups import layer_group_notes

    notes = layer_group_notes(build_spec(_mimo()), 4096)
    assert notes[0].startswith("4 of 6 layers attend over a 8-token window")
    assert "window8_kv2_d24 layers costed at head size 24" in notes[1] and "v heads are 16 wide" in notes[1]
    assert len(notes) == 3
    # windows from the limit on hold every token: no per-request note
    assert len(layer_group_notes(build_spec(_mimo(sliding_window_size=4096)), 4096)) == 2
