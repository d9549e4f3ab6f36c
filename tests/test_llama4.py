"""Llama 4: MoE with a shared expert, dense FFNs between MoE layers, chunked local attention."""

from __future__ import annotations

from dataclasses import replace

import pytest

from infercast.data.model_configs import ModelConfig
from infercast.errors import InvalidInputError
from infercast.models.plan import ParallelConfig
from infercast.models.spec import build_spec
from infercast.serving.memory import WINDOW_KV_COUNTED_FROM, kv_bytes_per_token


def _llama4(**text) -> ModelConfig:
    t = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "num_hidden_layers": 8, "intermediate_size": 32, "intermediate_size_mlp": 96, "vocab_size": 1000,
         "num_local_experts": 4, "num_experts_per_tok": 1, "attention_chunk_size": 8192, **text}
    return ModelConfig("x/l4", "x/l4", {"architectures": ["Llama4ForConditionalGeneration"], "text_config": t})


def test_scout_layout_every_layer_moe_with_a_shared_expert():
    spec = build_spec(_llama4(interleave_moe_layer_step=1))
    assert spec.family == "moe"
    assert (spec.moe.experts, spec.moe.topk, spec.moe.inter, spec.moe.shared_inter) == (4, 1, 32, 32)
    assert spec.moe.first_dense_layers == 0 and spec.moe.dense_inter == 0
    # RoPE layers chunk, every fourth (NoPE) layer attends to the whole context
    assert spec.layer_windows == (8192, 8192, 8192, 0) * 2


def test_maverick_layout_dense_ffn_on_every_other_layer():
    spec = build_spec(_llama4(interleave_moe_layer_step=2))
    assert spec.moe.first_dense_layers == 4 and spec.moe.dense_inter == 96
    # an explicit moe_layers list wins over the step
    spec = build_spec(_llama4(interleave_moe_layer_step=2, moe_layers=[7]))
    assert spec.moe.first_dense_layers == 7


def test_no_rope_layers_and_missing_chunk():
    spec = build_spec(_llama4(no_rope_layers=[1, 0] * 4))
    assert spec.layer_windows == (8192, 0) * 4
    assert build_spec(_llama4(attention_chunk_size=None)).layer_windows is None
    with pytest.raises(InvalidInputError, match="no_rope_layers has 3 entries for 8 layers"):
        build_spec(_llama4(no_rope_layers=[1, 1, 0]))


def test_window_layers_kv_counted_only_for_large_windows():
    spec = build_spec(_llama4())  # 6 chunked layers of 8192 + 2 full ones
    par = ParallelConfig(tp=1)
    per_layer = 2 * 2 * 16 * 2.0  # K and V x 2 KV heads x head_dim 16 x bf16
    assert kv_bytes_per_token(spec, par) == pytest.approx(8 * per_layer)
    small = replace(spec, layer_windows=(128, 128, 128, 0) * 2)  # gpt-oss-like windows: left out
    assert kv_bytes_per_token(small, par) == pytest.approx(2 * per_layer)
    edge = replace(spec, layer_windows=(WINDOW_KV_COUNTED_FROM - 1, WINDOW_KV_COUNTED_FROM, 0, 0) * 2)
    assert kv_bytes_per_token(edge, par) == pytest.approx(6 * per_layer)


@pytest.mark.real_pack
@pytest.mark.parametrize("model, params_b", [("meta-llama/Llama-4-Scout-17B-16E-Instruct", 109),
                                             ("meta-llama/Llama-4-Maverick-17B-128E-Instruct", 400)])
def test_llama4_estimates_on_the_real_pack(real_pack_available, model, params_b):
    from infercast import Estimator

    est = Estimator(model, "h200_sxm", "vllm", tp=8)
    # the published sizes (109 B and 400 B parameters in all), bf16 over 8 GPUs
    assert est.memory.weights == pytest.approx(params_b * 1e9 * 2 / 8, rel=0.02)
    res = est.static(16, 2048, 256)
    assert res.fits and res.ttft_ms > 0 and res.tpot_ms > 0
    names = {op.name for op in est.plan.ops}
    assert {"attention_full", "attention_window8192", "moe_experts", "shared_gate_up_gemm"} <= names
    assert ("dense_gate_up_gemm" in names) == ("Maverick" in model)
