"""Modules a quantised export keeps unquantised (models.spec.excluded_quant / QuantSpec.attn_gemm,
shared_gemm): exact plan params and weight bytes on the synthetic pack, the rule on hand-written
exclusion lists, and the NVIDIA NVFP4 exports of the real pack."""

from __future__ import annotations

from dataclasses import replace

import pytest
import synthpack as sp

from infercast.data.model_configs import resolve_model
from infercast.data.quant import WEIGHT_BYTES
from infercast.models.plan import ParallelConfig, build_plan
from infercast.models.spec import QuantSpec, build_spec, excluded_quant
from infercast.serving.memory import _attention_weights, weight_bytes_per_gpu


@pytest.mark.parametrize(("patterns", "layers", "want"), [
    ([f"model.layers.{i}.self_attn*" for i in range(8)], 8, (True, False)),        # every layer
    ([f"model.layers.{i}.self_attn.q_a_proj" for i in range(5)], 8, (True, False)),  # most layers
    ([f"model.layers.{i}.self_attn*" for i in range(4)], 8, (False, False)),       # half: not most
    (["*.attn.*", "*.ffn.shared_experts.*", "head"], 61, (True, True)),            # no layer index: all
    ([f"model.layers.{i}.mlp.gate" for i in range(8)], 8, (False, False)),          # the router only
    ([f"model.language_model.layers.{i}.linear_attn*" for i in range(6)]
     + [f"model.language_model.layers.{i}.mlp.shared_expert*" for i in range(8)], 8, (True, True)),
    # GLM-5-FP8: only the attention block's norms and its sparse-attention indexer stay unquantised
    ([f"model.layers.{i}.self_attn.{m}" for i in range(8) for m in ("kv_a_layernorm", "q_a_layernorm", "indexers_proj")]
     + [f"model.layers.{i}.self_attn.indexer.k_norm" for i in range(8)], 8, (False, False)),
    (["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*"], 61, (True, True)),  # compressed-tensors regexes
    ([f"model.layers.{i}.mlp.shared_expert_gate" for i in range(8)], 8, (False, False)),  # the gate only
    (None, 8, (False, False)),
    ([None, 3, "lm_head"], 8, (False, False)),
])
def test_excluded_quant_rule(patterns, layers, want):
    assert excluded_quant(patterns, layers) == want


def test_attention_and_shared_modes_reach_the_plan_and_the_weights(synth):
    from infercast.data.pack import find_pack

    spec = build_spec(resolve_model(find_pack(str(synth.systems_dir)), sp.MODEL_ID))
    fp8 = replace(spec, quant=replace(spec.quant, gemm="fp8"))
    kept = replace(spec, quant=replace(fp8.quant, attn_gemm="bfloat16"))
    par = ParallelConfig(tp=2)
    ops = {o.name: o.params for o in build_plan(kept, par).ops}
    assert ops["qkv_gemm"]["quant"] == ops["o_gemm"]["quant"] == "bfloat16"
    assert ops["gate_up_gemm"]["quant"] == ops["down_gemm"]["quant"] == "fp8"
    # the attention weights are held at 2 bytes instead of 1, and nothing else changes
    extra = spec.num_layers * (_attention_weights(spec, 2, WEIGHT_BYTES["bfloat16"]) - _attention_weights(spec, 2, WEIGHT_BYTES["fp8"]))
    assert weight_bytes_per_gpu(kept, par) - weight_bytes_per_gpu(fp8, par) == pytest.approx(extra, rel=1e-12)
    assert extra > 0


def test_an_explicit_gemm_mode_is_every_dense_gemms():
    q = QuantSpec(gemm="nvfp4", moe="nvfp4", attn_gemm="bfloat16", shared_gemm="bfloat16")
    assert (q.attention_gemm, q.shared_expert_gemm) == ("bfloat16", "bfloat16")
    o = q.with_overrides(gemm="fp8")
    assert (o.gemm, o.attention_gemm, o.shared_expert_gemm) == ("fp8", "fp8", "fp8")
    k = q.with_overrides(kv_cache="fp8")  # other overrides keep the checkpoint's exclusions
    assert (k.attention_gemm, k.shared_expert_gemm) == ("bfloat16", "bfloat16")
    same = q.with_overrides(gemm="nvfp4")  # and so does naming the checkpoint's own mode
    assert (same.attention_gemm, same.shared_expert_gemm) == ("bfloat16", "bfloat16")


@pytest.mark.parametrize(("model", "attn", "shared"), [
    ("nvidia/Kimi-K2.5-NVFP4", "bfloat16", "nvfp4"),          # ignore: language_model.model.layers.N.self_attn*
    ("nvidia/MiniMax-M2.5-NVFP4", "bfloat16", "nvfp4"),       # exclude_modules: model.layers.N.self_attn*
    ("nvidia/Qwen3.5-397B-A17B-NVFP4", "bfloat16", "bfloat16"),  # + linear_attn*, shared_expert*
    ("nvidia/DeepSeek-V3.1-NVFP4", "bfloat16", "nvfp4"),      # the MLA projections
    ("nvidia/Qwen3-235B-A22B-NVFP4", "nvfp4", "nvfp4"),       # only the routers
    ("nvidia/DeepSeek-R1-NVFP4", "bfloat16", "nvfp4"),        # an alias: the architecture's exports' rule
    ("nvidia/Llama-3.1-70B-NVFP4", "nvfp4", "nvfp4"),          # an alias of another architecture
])
def test_nvidia_exports(real_pack_available, model, attn, shared):
    from infercast.data.pack import find_pack

    q = build_spec(resolve_model(find_pack(None), model)).quant
    assert q.gemm == "nvfp4"
    assert (q.attention_gemm, q.shared_expert_gemm) == (attn, shared)


def test_excluded_quant_kept_by_its_arguments():
    """The exclusion list's answer is kept per (patterns, layers): the same answer as working it
    out, for lists, tuples, None and an unhashable entry."""
    from infercast.models.spec import _excluded_quant, excluded_quant

    pats = [f"model.layers.{i}.self_attn.q_proj" for i in range(40)] + ["lm_head"]
    for p, n in ((pats, 61), (tuple(pats), 61), (pats, 80), (None, 4), (["mlp.shared_experts*"], 2)):
        assert excluded_quant(p, n) == _excluded_quant(p, n)
    assert excluded_quant(pats, 61) == (True, False) and excluded_quant(pats, 80) == (False, False)
    assert excluded_quant([["unhashable"], "mlp.shared_experts"], 2) == (False, True)
