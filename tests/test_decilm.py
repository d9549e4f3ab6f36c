"""DeciLM (Llama-Nemotron NAS): each layer's attention and FFN from block_configs."""

from __future__ import annotations

import pytest

from infercast.data.model_configs import ModelConfig
from infercast.errors import InvalidConfigError, InvalidInputError, UnsupportedModelError
from infercast.models.families import decilm_ffn_width
from infercast.models.groups import AttentionGroup, FFNGroup
from infercast.models.plan import ParallelConfig, build_plan
from infercast.models.spec import build_spec
from infercast.serving.memory import kv_bytes_per_token, state_bytes_per_request, weight_bytes_per_gpu


def _attn(group=None, no_op=False, linear=False):
    return {"n_heads_in_group": group, "no_op": no_op, "replace_with_linear": linear}


def _ffn(mult=None, no_op=False, linear=False):
    return {"ffn_mult": mult, "no_op": no_op, "replace_with_linear": linear}


BLOCKS = [
    {"attention": _attn(4), "ffn": _ffn(1.0)},  # kv 2, ffn 2/3 x 384 = 256
    {"attention": _attn(4), "ffn": _ffn(2.0)},  # kv 2, ffn 512
    {"attention": _attn(no_op=True), "ffn": _ffn(1.3)},  # no attention, ffn int(332.8) -> 512
    {"attention": _attn(linear=True), "ffn": _ffn(no_op=True)},  # linear attention, no ffn
    {"attention": _attn(8), "ffn": _ffn(linear=True)},  # kv 1, linear ffn
]


def _decilm(blocks=BLOCKS, **cfg) -> ModelConfig:
    c = {"architectures": ["DeciLMForCausalLM"], "hidden_size": 384, "num_attention_heads": 8,
         "num_hidden_layers": len(blocks), "num_key_value_heads": None, "intermediate_size": None,
         "vocab_size": 1000, "block_configs": blocks, **cfg}
    return ModelConfig("x/deci", "x/deci", c)


def test_ffn_width_rule():
    # Llama-3.3-Nemotron-Super-49B's multipliers at hidden 8192
    assert [decilm_ffn_width(m, 8192) for m in (5.25, 3.28125, 2.625, 1.3125, 1.0, 0.5)] == \
        [28672, 17920, 14336, 7168, 5632, 2816]


def test_groups():
    spec = build_spec(_decilm())
    assert spec.family == "dense" and spec.head_dim == 48
    assert spec.attention_groups == (AttentionGroup(2, "gqa", 8, 2, 48, 48, 0), AttentionGroup(1, "gqa", 8, 1, 48, 48, 0),
                                     AttentionGroup(1, "linear"))
    assert spec.ffn_groups == (FFNGroup(2, 512), FFNGroup(1, 256), FFNGroup(1, 0, "linear"))
    assert spec.intermediate == 512 and spec.num_kv_heads == 2


def test_plan_sums_ops_per_layer_kind():
    ops = {o.name: o for o in build_plan(build_spec(_decilm()), ParallelConfig(tp=2)).ops}
    # attention in layers 0, 1, 3, 4; an FFN in layers 0, 1, 2, 4
    assert ops["input_norm"].count == 4 and ops["attn_allreduce"].count == 4
    assert ops["post_attn_norm"].count == 4 and ops["ffn_allreduce"].count == 4
    assert (ops["qkv_gemm_full_kv2_d48"].count, ops["qkv_gemm_full_kv2_d48"].params["n"]) == (2, 4 * 48 + 2 * 48)
    assert (ops["qkv_gemm_full_kv1_d48"].count, ops["qkv_gemm_full_kv1_d48"].params["n"]) == (1, 4 * 48 + 2 * 48)
    assert ops["attention_full_kv1_d48"].params["kv_heads"] == 1  # one KV head, replicated on both ranks
    assert ops["attn_linear_gemm"].params == {"n": 384, "k": 192, "quant": "bfloat16"}
    assert (ops["ffn512_gate_up_gemm"].count, ops["ffn512_gate_up_gemm"].params["n"]) == (2, 512)
    assert (ops["ffn256_down_gemm"].count, ops["ffn256_down_gemm"].params["k"]) == (1, 128)
    assert ops["ffn_linear_gemm"].count == 1
    assert sum(o.count for o in ops.values() if o.kind == "attention") == 3


def test_memory():
    spec = build_spec(_decilm())
    par = ParallelConfig(tp=1)
    assert kv_bytes_per_token(spec, par) == (2 * 2 + 1 * 1) * (48 + 48) * 2
    assert state_bytes_per_request(spec, par) == 0
    attn = 2 * (384 * 576 + 384 * 384) + (384 * 480 + 384 * 384) + 384 * 384
    ffn = 2 * 3 * 384 * 512 + 3 * 384 * 256 + 384 * 384
    assert weight_bytes_per_gpu(spec, par) == pytest.approx(2.0 * (attn + ffn + 5 * 2 * 384 + 2 * 1000 * 384))


def test_parallel_checks_and_bad_blocks():
    twelve = build_spec(_decilm(blocks=BLOCKS[:4], num_attention_heads=12))  # 3 KV heads (n_heads_in_group 4)
    ParallelConfig(tp=2).check(twelve)
    with pytest.raises(InvalidConfigError, match="TP 4 is not a multiple of the 3 KV heads"):
        ParallelConfig(tp=4).check(twelve)
    with pytest.raises(InvalidConfigError, match="TP 8 does not divide the 12 attention heads"):
        ParallelConfig(tp=8).check(twelve)
    with pytest.raises(InvalidInputError, match="n_heads_in_group 3 does not divide"):
        build_spec(_decilm(blocks=[{"attention": _attn(3), "ffn": _ffn(1.0)}]))
    with pytest.raises(InvalidInputError, match="block_configs has 5 entries for 4 layers"):
        build_spec(_decilm(num_hidden_layers=4))
    with pytest.raises(InvalidInputError, match="ffn_mult must be a positive number"):
        build_spec(_decilm(blocks=[{"attention": _attn(4), "ffn": _ffn(None)}]))
    with pytest.raises(UnsupportedModelError, match="sparsified"):
        build_spec(_decilm(blocks=[{"attention": {**_attn(4), "sparsify": ["x"]}, "ffn": _ffn(1.0)}]))


@pytest.mark.real_pack
@pytest.mark.parametrize("backend", ["trtllm", "vllm", "sglang"])
def test_nemotron_super_49b_on_the_real_pack(real_pack_available, backend):
    from infercast import Estimator

    est = Estimator("nvidia/Llama-3_3-Nemotron-Super-49B-v1", "h200_sxm", backend, tp=2)
    assert est.memory.weights * 2 / 2.0 == pytest.approx(49.9e9, rel=0.01)  # "49B", bf16
    res = est.static(8, 2048, 128)
    assert res.fits and res.ttft_ms > 0 and res.tpot_ms > 0
    ops = {o.name: o for o in est.plan.ops}
    assert ops["attention_full_kv8_d128"].count == 49 and ops["ffn28672_gate_up_gemm"].count == 49
