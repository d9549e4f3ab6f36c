"""Vision-language checkpoints served text-only: the language model's ops, plus the vision tower's
weights in memory (:func:`infercast.models.spec.vision_params`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from infercast.data.model_configs import ModelConfig
from infercast.errors import InvalidInputError
from infercast.models.plan import ParallelConfig
from infercast.models.spec import build_spec, vision_params
from infercast.serving.memory import VISION_WEIGHT_BYTES, weight_bytes_per_gpu

# Qwen3-VL layout, by hand: a block is 4 h^2 + 4 h (q, k, v, o with biases) + 2 h i + i + h (the
# MLP with biases) + 4 h (two norms) = 256 + 32 + 256 + 16 + 8 + 32 = 600 at h 8, i 16; two blocks
# 1200. Patch embedding 3 channels x 2 frames x 2 x 2 x 8 + 8 = 200; positions 4 x 8 = 32. A merger
# folds 2 x 2 patches: width 32, norm 64 + 32 x 32 + 32 + 32 x 12 + 12 = 1516, and one deepstack
# merger more: 3032. In all 1200 + 200 + 32 + 3032 = 4464.
QWEN_VISION = {"depth": 2, "hidden_size": 8, "intermediate_size": 16, "patch_size": 2, "temporal_patch_size": 2,
               "in_channels": 3, "num_position_embeddings": 4, "spatial_merge_size": 2, "out_hidden_size": 12,
               "deepstack_visual_indexes": [0]}
QWEN_VISION_PARAMS = 4464
# Kimi-K2.5's MoonViT names: one block of 600; patch embedding 3 x 1 x 2 x 2 x 8 + 8 = 104; a 2 x 3
# position table, 48; one merger of 2 x 2 patches into 10 wide: 64 + 1024 + 32 + 320 + 10 = 1450.
KIMI_VISION = {"vt_num_hidden_layers": 1, "vt_hidden_size": 8, "vt_intermediate_size": 16, "patch_size": 2,
               "init_pos_emb_height": 2, "init_pos_emb_width": 3, "merge_kernel_size": [2, 2], "text_hidden_size": 10}
KIMI_VISION_PARAMS = 600 + 104 + 48 + 1450


def test_vision_params_by_hand():
    assert vision_params({"vision_config": QWEN_VISION}, text_hidden=12) == QWEN_VISION_PARAMS
    assert vision_params({"vision_config": KIMI_VISION}, text_hidden=10) == KIMI_VISION_PARAMS
    assert vision_params({}, text_hidden=12) == 0
    # no out_hidden_size: the merger projects to the language model's width
    no_out = {k: v for k, v in QWEN_VISION.items() if k != "out_hidden_size"}
    assert vision_params({"vision_config": no_out}, text_hidden=12) == QWEN_VISION_PARAMS


def test_malformed_vision_config_names_the_field():
    broken = {k: v for k, v in QWEN_VISION.items() if k != "hidden_size"}
    with pytest.raises(InvalidInputError, match="vision_config.*hidden_size"):
        vision_params({"vision_config": broken}, text_hidden=12, where="x/vl")


def _vl_config(arch: str, **text) -> ModelConfig:
    t = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 1000, **text}
    return ModelConfig("x/vl", "x/vl", {"architectures": [arch], "text_config": t, "vision_config": QWEN_VISION})


@pytest.mark.parametrize("tp", [1, 2])
def test_vision_tower_weights_are_bf16_split_over_tp(tp):
    spec = build_spec(_vl_config("Qwen3VLForConditionalGeneration"))
    assert spec.family == "dense" and spec.vision_params == QWEN_VISION_PARAMS
    par = ParallelConfig(tp=tp)
    text_only = weight_bytes_per_gpu(replace(spec, vision_params=0), par)
    assert weight_bytes_per_gpu(spec, par) - text_only == pytest.approx(QWEN_VISION_PARAMS * VISION_WEIGHT_BYTES / tp)


def test_qwen3_vl_moe_is_the_moe_family():
    spec = build_spec(_vl_config("Qwen3VLMoeForConditionalGeneration", num_experts=8, num_experts_per_tok=2,
                                 moe_intermediate_size=32))
    assert spec.family == "moe" and spec.moe.experts == 8 and spec.moe.topk == 2
    assert spec.vision_params == QWEN_VISION_PARAMS


@pytest.mark.real_pack
def test_qwen3_vl_estimates_on_the_real_pack(real_pack_available):
    from infercast import Estimator

    est = Estimator("Qwen/Qwen3-VL-8B-Instruct", "h200_sxm", "vllm", tp=2)
    # the tower of the pack's config: 27 blocks of width 1152, 4304-wide MLPs, three deepstack mergers
    assert est.spec.vision_params == 576_395_248
    par = est.plan.parallel
    text_only = weight_bytes_per_gpu(replace(est.spec, vision_params=0), par)
    assert est.memory.weights - text_only == pytest.approx(576_395_248 * 2.0 / 2)
    res = est.static(8, 1024, 128)
    assert res.ttft_ms > 0 and res.tpot_ms > 0
    assert any("vision tower (0.58 B parameters" in n and "not modelled" in n for n in res.notes)
