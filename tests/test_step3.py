"""Step-3.7-Flash (models/step3.py): the spec of a small synthetic config (sliding / full attention
groups, the sliding layers' own heads from ``attention_other_setting``, shared expert, dense first
layers, MTP), its plan (group shapes per GPU, MTP draft on the full-attention group), its memory,
refusals, and the real pack's two checkpoints through ``estimate`` / ``serve`` / ``search``."""

from __future__ import annotations

import json
import math

import pytest

from infercast.data.model_configs import ModelConfig
from infercast.errors import InvalidInputError, UnsupportedModelError
from infercast.models.plan import ParallelConfig, Plan, SpecDecode, build_plan
from infercast.models.spec import ModelSpec, build_spec
from infercast.serving.memory import kv_bytes_per_token, state_bytes_per_request


def _config(**over) -> dict:
    cfg = {
        "architectures": ["Step3p7FlashForCausalLM"], "hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 2,
        "head_dim": 16, "num_hidden_layers": 6, "vocab_size": 256, "intermediate_size": 96, "sliding_window": 32,
        "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                        "sliding_attention"],
        "first_k_dense_replace": 2, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "share_expert_dim": 48, "n_shared_experts": 1, "num_nextn_predict_layers": 2,
    }
    cfg.update(over)
    return {k: v for k, v in cfg.items() if v is not None}


def _spec(**over) -> ModelSpec:
    return build_spec(ModelConfig("synth/step", "synth/step", _config(**over)))


def _ops(plan: Plan) -> dict:
    return {o.name: o for o in plan.ops}


def test_spec_reads_groups_experts_and_mtp():
    s = _spec()
    assert s.family == "moe" and s.num_layers == 6 and s.mtp_layers == 2
    full, local = s.attention_groups
    assert (full.count, full.heads, full.kv_heads, full.head_dim, full.window) == (2, 8, 2, 16, 0)
    assert (local.count, local.heads, local.kv_heads, local.window) == (4, 8, 2, 32)
    m = s.moe
    assert (m.experts, m.topk, m.inter, m.shared_inter, m.first_dense_layers, m.dense_inter) == (8, 2, 32, 48, 2, 96)
    assert ModelSpec.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    # the sliding layers' own heads (Step-3.5's attention_other_setting)
    other = _spec(attention_other_setting={"num_attention_heads": 16, "num_attention_groups": 4, "head_dim": 16})
    assert (other.attention_groups[1].heads, other.attention_groups[1].kv_heads) == (16, 4)
    assert other.attention_groups[0].heads == 8


@pytest.mark.parametrize("over, err, match", [
    (dict(use_head_wise_attn_gate=True), UnsupportedModelError, "head-wise attention output gate"),
    (dict(layer_types=["full_attention"] * 5), InvalidInputError, "layer_types has 5 entries"),
    (dict(num_experts_per_tok=9), InvalidInputError, "exceed the 8 experts"),
    (dict(first_k_dense_replace=7), InvalidInputError, "exceeds the 6 layers"),
    (dict(sliding_window=None), InvalidInputError, "sliding_window"),
])
def test_bad_configs_are_refused(over, err, match):
    with pytest.raises(err, match=match):
        _spec(**over)


def test_plan_groups_at_tp2():
    ops = _ops(build_plan(_spec(), ParallelConfig(tp=2)))
    # 4 query heads + 1 + 1 KV heads of 16 per GPU
    assert (ops["qkv_gemm_full_kv2_d16"].count, ops["qkv_gemm_full_kv2_d16"].params["n"]) == (2, 96)
    assert (ops["qkv_gemm_window32_kv2_d16"].count, ops["qkv_gemm_window32_kv2_d16"].params["n"]) == (4, 96)
    assert ops["attention_window32_kv2_d16"].params["window"] == 32
    assert ops["attention_full_kv2_d16"].params == {"heads": 4, "kv_heads": 1, "head_dim": 16, "window": 0,
                                                    "kv_quant": "bfloat16", "attn_quant": "bfloat16"}
    assert (ops["dense_gate_up_gemm"].count, ops["dense_gate_up_gemm"].params["n"]) == (2, 96)
    assert ops["moe_experts"].count == 4 and ops["shared_gate_up_gemm"].params["n"] == 48


def test_mtp_draft_runs_the_full_attention_group():
    plan = build_plan(_spec(), ParallelConfig(tp=1), SpecDecode(nextn=2))
    draft = {o.name: o for o in plan.ops if o.phase == "decode"}
    assert draft["mtp_attention_full_kv2_d16"].count == 2 and draft["mtp_qkv_gemm_full_kv2_d16"].count == 2
    assert "mtp_attention_window32_kv2_d16" not in draft
    assert draft["mtp_moe_experts"].count == 2 and draft["mtp_lm_head"].count == 2


def test_memory_by_hand():
    s, par = _spec(), ParallelConfig(tp=1)
    # per-token KV: the 2 full-attention layers, K and V of 2 heads x 16, bf16
    assert kv_bytes_per_token(s, par) == 2 * 2 * (16 + 16) * 2
    # the 4 sliding layers hold their 32-token window per request
    assert state_bytes_per_request(s, par) == 4 * 32 * 2 * (16 + 16) * 2


STEP = "stepfun-ai/Step-3.7-Flash"


@pytest.mark.real_pack
def test_real_specs(real_pack_available):
    from infercast.data.model_configs import resolve_model
    from infercast.data.pack import find_pack

    s = build_spec(resolve_model(find_pack(), STEP))
    full, local = s.attention_groups
    assert (full.count, local.count, local.window, local.heads, local.kv_heads) == (12, 33, 512, 64, 8)
    assert s.moe.first_dense_layers == 3 and s.moe.shared_inter == 1280 and s.mtp_layers == 3
    fp8 = build_spec(resolve_model(find_pack(), STEP + "-FP8"))
    assert fp8.quant.gemm == "fp8_block" and s.quant.gemm == "bfloat16"


@pytest.mark.real_pack
@pytest.mark.parametrize("model, system, backend, tp", [
    (STEP, "h200_sxm", "vllm", 8),
    (STEP + "-FP8", "b200_sxm", "sglang", 4),
    (STEP, "b200_sxm", "trtllm", 8),
])
def test_real_estimates(real_pack_available, model, system, backend, tp):
    from infercast.api import Estimator

    est = Estimator(model, system, backend, tp=tp)
    r = est.static(8, 2048, 256)
    assert r.fits and 0 < r.tpot_ms < r.ttft_ms and math.isfinite(r.tokens_per_s_per_gpu)
    rows = {x["op"]: x for x in est.engine.describe_ops()}
    assert any("window 512 not collected" in n for n in rows["attention_window512_kv8_d128"]["generation"].get("notes", []))


@pytest.mark.real_pack
def test_real_serve_and_search_cli(real_pack_available, capsys):
    from infercast.cli.main import main

    assert main(["serve", "--model", STEP, "--system", "h200_sxm", "--backend", "vllm", "--tp", "8", "--isl", "1024",
                 "--osl", "128", "--concurrency", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ttft_ms"] > 0 and out["tpot_ms"] > 0
    assert main(["search", "--model", STEP + "-FP8", "--system", "h200_sxm", "--backend", "sglang", "--isl", "1024",
                 "--osl", "128", "--gpus", "8", "--json"]) == 0
    assert capsys.readouterr().out.strip()
