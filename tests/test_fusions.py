"""Backend kernel fusions in the op plan (models/fusions.py): exact plan shapes on a tiny
DeepSeek-V3-shaped config."""

from __future__ import annotations

import json

import pytest

from infercast.data.model_configs import resolve_model
from infercast.models.fusions import engine_fusions
from infercast.models.plan import Fusions, ParallelConfig, Plan, build_plan
from infercast.models.spec import build_spec


def _deepseek_like(pack, tmp_path, experts=256, shared=1, arch="DeepseekV3ForCausalLM"):
    cfg = {
        "architectures": [arch], "model_type": "deepseek_v3", "hidden_size": 512, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 8, "intermediate_size": 1024, "vocab_size": 1000,
        "max_position_embeddings": 4096, "q_lora_rank": 128, "kv_lora_rank": 64, "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16, "v_head_dim": 32, "n_routed_experts": experts, "num_experts_per_tok": 8,
        "moe_intermediate_size": 128, "n_shared_experts": shared, "first_k_dense_replace": 1,
        "torch_dtype": "bfloat16",
    }
    d = tmp_path / f"ds-{experts}-{shared}-{arch}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return build_spec(resolve_model(pack, str(d)))


def _plain_and_fused(spec, par, fusions):
    """(ops by name without fusions, the fused plan, its ops by name)."""
    fused_plan = build_plan(spec, par, fusions=fusions)
    return {o.name: o for o in build_plan(spec, par).ops}, fused_plan, {o.name: o for o in fused_plan.ops}


@pytest.fixture()
def pack(synth):
    from infercast.data.pack import find_pack

    return find_pack(str(synth.systems_dir))


def test_shared_expert_fusion_plan(pack, tmp_path):
    spec = _deepseek_like(pack, tmp_path)
    plain, fused_plan, fused = _plain_and_fused(spec, ParallelConfig(tp=2), Fusions(shared_experts=True))
    assert {"shared_gate_up_gemm", "shared_activation", "shared_down_gemm"} <= set(plain)
    assert not any(n.startswith("shared_") for n in fused)
    # the expert kernel sees one more (always selected) expert per token: 9/8 the token-expert pairs
    assert plain["moe_experts"].params["tokens_multiplier"] == 1.0
    assert fused["moe_experts"].params["tokens_multiplier"] == pytest.approx(9 / 8)
    assert fused_plan.fusions.shared_experts
    # everything else is unchanged
    rest = {k: v for k, v in plain.items() if not k.startswith("shared_") and k != "moe_experts"}
    assert rest == {k: v for k, v in fused.items() if k != "moe_experts"}
    # the fusion survives the JSON round trip
    assert Plan.from_json(fused_plan.to_json()).fusions == Fusions(shared_experts=True)


def test_shared_expert_fusion_rule(pack, tmp_path):
    spec = _deepseek_like(pack, tmp_path)
    assert engine_fusions("sglang", spec, ParallelConfig(tp=8)).shared_experts
    assert not engine_fusions("trtllm", spec, ParallelConfig(tp=8)).shared_experts
    assert not engine_fusions("vllm", spec, ParallelConfig(tp=8)).shared_experts
    # expert parallelism turns it off
    assert not engine_fusions("sglang", spec, ParallelConfig(tp=8, moe_tp=1, moe_ep=8)).shared_experts
    # other expert layouts / architectures are not covered by the fused kernel
    assert not engine_fusions("sglang", _deepseek_like(pack, tmp_path, experts=384), ParallelConfig(tp=8)).shared_experts
    assert not engine_fusions("sglang", _deepseek_like(pack, tmp_path, shared=2), ParallelConfig(tp=8)).shared_experts
    assert not engine_fusions("sglang", _deepseek_like(pack, tmp_path, arch="MiMoForCausalLM"), ParallelConfig(tp=8)).shared_experts


def test_fusion_flag_without_shared_experts_is_inert(pack, tmp_path):
    spec = _deepseek_like(pack, tmp_path, shared=0)
    plan = build_plan(spec, ParallelConfig(tp=2), fusions=Fusions(shared_experts=True))
    assert not plan.fusions.shared_experts
    assert {o.name: o for o in plan.ops}["moe_experts"].params["tokens_multiplier"] == 1.0


def test_rope_in_attention(pack, synth):
    import synthpack as sp

    spec = build_spec(resolve_model(pack, sp.MODEL_ID))
    par = ParallelConfig(tp=1)
    plain = build_plan(spec, par)
    fused = build_plan(spec, par, fusions=Fusions(rope_in_attention=True))
    assert "rope" in {o.name for o in plain.ops} and not plain.fusions.rope_in_attention
    assert [o for o in plain.ops if o.name != "rope"] == list(fused.ops)
    assert fused.fusions.rope_in_attention
    assert engine_fusions("trtllm", spec, par).rope_in_attention
    assert not engine_fusions("vllm", spec, par).rope_in_attention
    assert not engine_fusions("sglang", spec, par).rope_in_attention


def test_allreduce_norm_fusion(pack, tmp_path):
    from types import SimpleNamespace

    spec = _deepseek_like(pack, tmp_path)
    plain, fused_plan, fused = _plain_and_fused(spec, ParallelConfig(tp=2), Fusions(allreduce_norm=True))
    assert plain["input_norm"].count == spec.num_layers and "post_attn_norm" in plain
    # the norms after the all-reduces are in the all-reduce kernel: only layer 0's input norm stays
    assert fused["input_norm"].count == 1 and "post_attn_norm" not in fused
    assert fused_plan.fusions.allreduce_norm
    # nothing to fuse without TP all-reduces
    solo = build_plan(spec, ParallelConfig(tp=1), fusions=Fusions(allreduce_norm=True))
    assert not solo.fusions.allreduce_norm and {o.name: o for o in solo.ops}["input_norm"].count == spec.num_layers

    def system(sm, gpn=8):
        return SimpleNamespace(gpu=SimpleNamespace(sm_version=sm), node=SimpleNamespace(gpus_per_node=gpn))

    assert engine_fusions("sglang", spec, ParallelConfig(tp=8), system(100)).allreduce_norm
    assert engine_fusions("sglang", spec, ParallelConfig(tp=8), system(90)).allreduce_norm
    assert not engine_fusions("sglang", spec, ParallelConfig(tp=8), system(120)).allreduce_norm
    assert not engine_fusions("sglang", spec, ParallelConfig(tp=8), system(100, gpn=4)).allreduce_norm  # multi-node
    assert not engine_fusions("sglang", spec, ParallelConfig(tp=1, attention_dp=8, moe_tp=1, moe_ep=8), system(100)).allreduce_norm
    assert not engine_fusions("sglang", spec, ParallelConfig(tp=8)).allreduce_norm  # system unknown
    assert not engine_fusions("trtllm", spec, ParallelConfig(tp=8), system(100)).allreduce_norm
    assert not engine_fusions("sglang", _deepseek_like(pack, tmp_path, arch="MiMoForCausalLM"), ParallelConfig(tp=8), system(100)).allreduce_norm


def _llama_like(pack, tmp_path, hidden=8192, arch="LlamaForCausalLM", fp8=True):
    cfg = {
        "architectures": [arch], "model_type": "llama", "hidden_size": hidden, "num_hidden_layers": 2,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": hidden // 64, "intermediate_size": 2 * hidden,
        "vocab_size": 1000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
    }
    if fp8:  # per-tensor fp8 weights (no weight_block_size)
        cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "static"}
    d = tmp_path / f"llama-{hidden}-{arch}-{'fp8' if fp8 else 'bf16'}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return build_spec(resolve_model(pack, str(d)))


def test_input_quant_fusion_rule(pack, tmp_path):
    wide = _llama_like(pack, tmp_path)
    tp2 = ParallelConfig(tp=2)
    v = engine_fusions("vllm", wide, tp2)
    assert v.norm_quant and v.act_quant  # vLLM: fuse_norm_quant and fuse_act_quant
    t = engine_fusions("trtllm", wide, tp2)
    assert t.norm_quant and t.act_quant  # the all-reduce + RMSNorm kernel quantises, and GatedMLP's SwiGLU
    solo = engine_fusions("trtllm", wide, ParallelConfig(tp=1))
    assert not solo.norm_quant and solo.act_quant  # no all-reduce to fuse into; the SwiGLU still quantises
    assert not engine_fusions("trtllm", _llama_like(pack, tmp_path, hidden=4096), tp2).norm_quant  # too narrow
    assert not engine_fusions("trtllm", _llama_like(pack, tmp_path, arch="Qwen3ForCausalLM"), tp2).norm_quant
    s = engine_fusions("sglang", wide, tp2)
    assert not s.norm_quant and not s.act_quant
    # a bf16 checkpoint has no quantisation kernel to fuse: the plan names no such fusion
    plain = _llama_like(pack, tmp_path, fp8=False)
    for backend in ("vllm", "trtllm"):
        f = engine_fusions(backend, plain, tp2)
        assert not f.norm_quant and not f.act_quant


def test_input_quant_fusion_plan(pack, tmp_path):
    spec = _llama_like(pack, tmp_path)
    par = ParallelConfig(tp=2)
    plain = {o.name: o for o in build_plan(spec, par).ops}
    assert not any("input_quant" in o.params for o in plain.values())
    norm_only = build_plan(spec, par, fusions=Fusions(norm_quant=True))
    ops = {o.name: o for o in norm_only.ops}
    fused = {n for n, o in ops.items() if o.params.get("input_quant") == "fused"}
    assert fused == {"qkv_gemm", "gate_up_gemm"}
    both = {o.name: o for o in build_plan(spec, par, fusions=Fusions(norm_quant=True, act_quant=True)).ops}
    assert {n for n, o in both.items() if o.params.get("input_quant") == "fused"} == {"qkv_gemm", "gate_up_gemm", "down_gemm"}
    # the O projection's input comes from attention: never covered
    assert "input_quant" not in both["o_gemm"].params
    # otherwise the plan is the same
    assert [o.name for o in norm_only.ops] == list(plain)
    assert Plan.from_json(norm_only.to_json()).fusions == Fusions(norm_quant=True)
