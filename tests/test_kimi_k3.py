"""Kimi-K3 (models/kimi_k3.py): the spec of a small synthetic Kimi-Linear config (1-based KDA /
MLA layer lists, latent MoE, MXFP4 experts from compressed-tensors), its plan (KDA projections,
MLA with the output gate, latent MoE, attention residuals; shapes per GPU), its memory by hand
(MLA-only KV, KDA state, weights), the KDA table read from another backend where the data version
has none (synthetic pack), and the real pack's checkpoint through ``estimate`` / ``serve`` /
``search``."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import synthpack as sp

from infercast.data.database import PerfData
from infercast.data.model_configs import ModelConfig
from infercast.errors import InvalidConfigError, InvalidInputError
from infercast.interp.provenance import Prov
from infercast.models.kimi_k3 import BETA_MIN_N, attn_res_bytes_per_token
from infercast.models.plan import ParallelConfig, Plan, SpecDecode, build_plan
from infercast.models.spec import ModelSpec, build_spec
from infercast.ops.base import OpDB
from infercast.ops.kda import resolve_kda
from infercast.serving.memory import kv_bytes_per_token, state_bytes_per_request, weight_bytes_per_gpu

MXFP4 = {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
         "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "float", "group_size": 32}, "targets": ["Linear"]}},
         "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*", "re:.*lm_head.*"]}


def _text(**over) -> dict:
    t = {
        "architectures": ["KimiLinearForCausalLM"], "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
        "num_hidden_layers": 6, "vocab_size": 256, "intermediate_size": 96, "first_k_dense_replace": 1,
        "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
        "mla_use_output_gate": True, "num_experts": 8, "num_experts_per_token": 2, "moe_intermediate_size": 32,
        "num_shared_experts": 2, "routed_expert_hidden_size": 32, "latent_moe_use_norm": True, "attn_res_block_size": 2,
        "linear_attn_config": {"kda_layers": [1, 2, 3, 5], "full_attn_layers": [4, 6], "num_heads": 4, "head_dim": 16,
                               "short_conv_kernel_size": 4, "use_full_rank_gate": True},
        "quantization_config": MXFP4,
    }
    t.update(over)
    return {k: v for k, v in t.items() if v is not None}


def _spec(**over) -> ModelSpec:
    cfg = {"architectures": ["KimiK3ForConditionalGeneration"], "text_config": _text(**over)}
    return build_spec(ModelConfig("synth/kimi-k3", "synth/kimi-k3", cfg))


def _ops(plan: Plan) -> dict:
    return {o.name: o for o in plan.ops}


def test_spec_reads_the_layers_and_the_latent_moe():
    s = _spec()
    k = s.kimi
    assert s.family == "kimi_k3" and k.pattern == "KKKAKA" and (k.kda_layers, k.mla_layers) == (4, 2)
    assert (k.kda_heads, k.kda_head_dim, k.conv_kernel, k.full_rank_gate) == (4, 16, 4, True)
    assert (k.moe_latent, k.latent_norm, k.mla_output_gate, k.attn_res_block) == (32, True, True, 2)
    m = s.moe
    assert (m.experts, m.topk, m.inter, m.shared_inter, m.first_dense_layers, m.dense_inter) == (8, 2, 32, 64, 1, 96)
    # MXFP4 experts (4-bit float weights in groups of 32), everything the ignore list names in bf16
    assert (s.quant.moe, s.quant.gemm, s.quant.attention_gemm) == ("mxfp4", "bfloat16", "bfloat16")
    assert ModelSpec.from_dict(json.loads(json.dumps(s.to_dict()))) == s


def test_int4_compressed_tensors_stay_int4():
    q = dict(MXFP4, config_groups={"g": {"weights": {"num_bits": 4, "type": "int", "group_size": 32}}})
    assert _spec(quantization_config=q).quant.moe == "int4_wo"


@pytest.mark.parametrize("lac, match", [
    ({"kda_layers": [0, 1, 2, 4], "full_attn_layers": [3, 5]}, "1-based"),
    ({"kda_layers": [1, 2, 3, 4], "full_attn_layers": [4, 5, 6]}, "each of the 6 layers once"),
    ({"kda_layers": [1, 2, 3], "full_attn_layers": [4, 6]}, "each of the 6 layers once"),
    ({"kda_layers": "1,2", "full_attn_layers": [4, 6]}, "list of layer numbers"),
])
def test_bad_layer_lists_are_refused(lac, match):
    base = {"num_heads": 4, "head_dim": 16}
    with pytest.raises(InvalidInputError, match=match):
        _spec(linear_attn_config={**base, **lac})


def test_missing_linear_attn_config_is_refused():
    with pytest.raises(InvalidInputError, match="linear_attn_config"):
        _spec(linear_attn_config=None)


def test_plan_shapes_at_tp2():
    plan = build_plan(_spec(), ParallelConfig(tp=2))
    ops = _ops(plan)
    # KDA: 2 heads x 16 per GPU (P = 32); q, k, v as three GEMMs per layer
    assert (ops["kda_qkv_gemm"].count, ops["kda_qkv_gemm"].params["n"], ops["kda_qkv_gemm"].params["k"]) == (12, 32, 64)
    assert ops["kda_f_a_gemm"].params["n"] == 16 and ops["kda_f_b_gemm"].params == {"n": 32, "k": 16, "quant": "bfloat16"}
    assert ops["kda_beta_gemm"].params["n"] == BETA_MIN_N == 32
    assert ops["kda_g_gemm"].params["n"] == 32 and "kda_g_a_gemm" not in ops
    assert ops["kda"].count == 4 and ops["kda"].params["num_heads"] == 2 and ops["kda"].params["head_dim"] == 16
    assert ops["kda_gated_norm"].params["bytes_per_token"] == 32 * 2 * 3
    assert ops["kda_o_gemm"].params == {"n": 64, "k": 32, "quant": "bfloat16"}
    # MLA (2 heads per GPU) and its output gate
    assert ops["mla"].count == 2 and ops["mla"].params["heads"] == 2
    assert ops["mla_gate_gemm"].params["n"] == 2 * 8 and ops["mla_output_gate"].count == 2
    # latent MoE on the 5 layers after the dense one
    assert ops["router_gemm"].params == {"n": 8, "k": 64, "quant": "bfloat16"} and ops["router_gemm"].count == 5
    assert ops["moe_latent_down"].params["n"] == 32 and ops["moe_latent_up"].params == {"n": 64, "k": 32, "quant": "bfloat16"}
    assert ops["moe_latent_norm"].params["bytes_per_token"] == 32 * 2 * 3
    e = ops["moe_experts"].params
    assert (e["hidden"], e["inter"], e["topk"], e["experts"], e["quant"], e["moe_tp"]) == (32, 32, 2, 8, "mxfp4", 2)
    assert ops["shared_gate_up_gemm"].params["n"] == 2 * 32 and ops["dense_gate_up_gemm"].params["n"] == 2 * 48
    assert {n: ops[n].count for n in ("attn_allreduce", "moe_allreduce", "dense_ffn_allreduce")} == \
        {"attn_allreduce": 6, "moe_allreduce": 5, "dense_ffn_allreduce": 1}
    assert ops["attn_res"].count == 6
    assert Plan.from_json(plan.to_json()).ops == plan.ops


@pytest.mark.parametrize(("comm", "allreduce"), [("alltoall", True), ("gather", False)])
def test_attention_dp_with_tp_reduces_the_shared_expert(comm, allreduce):
    """With attention DP x TP 2, the shared expert is split over the attention TP ranks: its partial
    sums are all-reduced when the experts' outputs come back by all-to-all (no reduce-scatter),
    as the MoE plan's block does; with all-gather + reduce-scatter the reduce-scatter sums them."""
    ops = _ops(build_plan(_spec(), ParallelConfig(tp=2, attention_dp=2, moe_ep=4, moe_comm=comm)))
    assert ("moe_allreduce" in ops) == allreduce and ("moe_reduce_scatter" in ops) == (not allreduce)


def test_low_rank_gate_and_no_attention_residuals():
    ops = _ops(build_plan(_spec(attn_res_block_size=None, linear_attn_config={
        "kda_layers": [1, 2, 3, 5], "full_attn_layers": [4, 6], "num_heads": 4, "head_dim": 16}), ParallelConfig(tp=1)))
    assert ops["kda_g_a_gemm"].params["n"] == 16 and ops["kda_g_b_gemm"].params == {"n": 64, "k": 16, "quant": "bfloat16"}
    assert "kda_g_gemm" not in ops and "attn_res" not in ops


def test_attention_residual_bytes_by_hand():
    # 6 layers in blocks of 2: candidates 1, 2, 2, 3, 3, 4; per layer (2 (c + 1) + 2) vectors of
    # 64 bf16: 6 + 8 + 8 + 10 + 10 + 12 = 54; the final sum reads 1 + 3 blocks and writes 1: 5
    assert attn_res_bytes_per_token(6, 2, 64) == (54 + 5) * 64 * 2
    assert _ops(build_plan(_spec(), ParallelConfig(tp=1)))["attn_res"].params["bytes_per_token"] == (54 + 5) * 128 / 6


def test_plan_refusals():
    with pytest.raises(InvalidConfigError, match="KDA heads"):
        build_plan(_spec(linear_attn_config={"kda_layers": [1, 2, 3, 5], "full_attn_layers": [4, 6], "num_heads": 6,
                                             "head_dim": 16}), ParallelConfig(tp=4))
    with pytest.raises(InvalidConfigError, match="no MTP layers"):
        build_plan(_spec(), ParallelConfig(tp=1), SpecDecode(nextn=1))


def test_memory_by_hand():
    s, par = _spec(), ParallelConfig(tp=1)
    # only the 2 MLA layers keep per-token KV: the latent 16 + 4, bf16
    assert kv_bytes_per_token(s, par) == 2 * 20 * 2
    assert kv_bytes_per_token(s, ParallelConfig(tp=1, pp=2)) == 1 * 20 * 2
    # KDA state per layer: 4 heads x 16 x 16 fp32 + 3 conv taps x 3 x 64 channels bf16
    assert state_bytes_per_request(s, par) == 4 * (4 * 16 * 16 * 4 + 3 * 192 * 2)
    assert state_bytes_per_request(s, ParallelConfig(tp=2)) == 4 * (2 * 16 * 16 * 4 + 3 * 96 * 2)
    # weights at tp 1 (bf16 except the experts and latent projections: MXFP4, 0.5 + 1/32 bytes)
    h, mx = 64, 0.5 + 1 / 32
    kda = (3 * h * 64 + h * 16 + 16 * 64 + h * 4 + h * 64 + 64 * h) * 2 + 3 * 64 * 4 * 2 + (64 + 4) * 4 + 16 * 2
    mla = (h * 32 + 32 * 4 * 12 + h * 20 + 16 * 4 * 16 + 4 * 8 * h + h * 4 * 8) * 2 + (32 + 16) * 2
    moe = 8 * 3 * 32 * 32 * mx + 2 * h * 32 * mx + 32 * 2 + 3 * h * 64 * 2 + h * 8 * 2
    dense = 3 * h * 96 * 2
    vectors = 6 * (2 + 4) * h * 2
    layers = 4 * kda + 2 * mla + 5 * moe + dense + vectors
    assert weight_bytes_per_gpu(s, par) == pytest.approx(layers + 2 * 256 * h * 2, rel=1e-12)


# ------------------------------------------------------------------------------------------------
# the KDA table from another backend (synthetic pack: vLLM has kda_perf, TensorRT-LLM has none)
# ------------------------------------------------------------------------------------------------

D, HD = 256, 128


def _kda_rows():
    rows = {k: [] for k in ("op_name", "kernel_source", "phase", "batch_size", "seq_len", "num_tokens", "d_model",
                            "d_conv", "num_k_heads", "head_k_dim", "num_v_heads", "head_v_dim", "latency")}
    for h in (8, 16):
        for b in (1, 4):
            for s_ in (16, 256):
                for kern, lat in (("causal_conv1d_fn_qkv3", 0.001 * b * s_), ("chunk_kda", 0.01 * b * s_ * h / 8)):
                    for k, v in zip(rows, ("kda", kern, "context", b, s_, b * s_, D, 4, h, HD, h, HD, lat)):
                        rows[k].append(v)
            for kern, lat in (("causal_conv1d_update", 0.002 * b), ("fused_recurrent_kda", 0.05 * b * h / 8)):
                for k, v in zip(rows, ("kda", kern, "generation", b, 1, b, D, 4, h, HD, h, HD, lat)):
                    rows[k].append(v)
    return rows


@pytest.fixture(scope="module")
def kda_pack(tmp_path_factory):
    pack = sp.make_pack(tmp_path_factory.mktemp("kdapeer"))
    d = pack.data_dir / "kda" / "vllm" / sp.VLLM_CURRENT
    d.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(_kda_rows()), d / "kda_perf.parquet")
    return pack


def test_kda_from_another_backend(kda_pack):
    db = OpDB(PerfData.open(sp.SYSTEM, "trtllm", sp.TRTLLM_CURRENT, systems_path=kda_pack.systems_dir))
    r = resolve_kda(db, "context", d_model=D, num_heads=16, head_dim=HD)
    v, p = r.grid(np.array([4.0]), np.array([256.0]), refuse=True)
    assert float(v[0]) == pytest.approx(0.001 * 4 * 256 + 0.01 * 4 * 256 * 2, rel=1e-12)  # vLLM's cell
    assert int(p[0]) == Prov.TRANSFERRED
    assert r.version == f"vllm {sp.VLLM_CURRENT}" and any("trtllm" in n and "has no kda_perf" in n for n in r.notes)
    g = resolve_kda(db, "generation", d_model=D, num_heads=8, head_dim=HD)
    assert g.grid.scalar(4, 1000)[0] == pytest.approx(0.002 * 4 + 0.05 * 4, rel=1e-12)
    # vLLM itself reads its own table
    own = resolve_kda(OpDB(PerfData.open(sp.SYSTEM, "vllm", sp.VLLM_CURRENT, systems_path=kda_pack.systems_dir)), "context",
                      d_model=D, num_heads=16, head_dim=HD)
    assert int(own.grid(np.array([4.0]), np.array([256.0]))[1][0]) == Prov.EXACT
    assert not any("has no kda_perf" in n for n in own.notes)


def test_kda_without_any_table_is_refused(synth):
    from infercast.errors import NotAvailableError

    db = OpDB(PerfData.open(sp.SYSTEM, "trtllm", sp.TRTLLM_CURRENT, systems_path=synth.systems_dir))
    with pytest.raises(NotAvailableError, match="kda"):
        resolve_kda(db, "context", d_model=D, num_heads=16, head_dim=HD)


# ------------------------------------------------------------------------------------------------
# the real pack
# ------------------------------------------------------------------------------------------------

K3 = "moonshotai/Kimi-K3"


@pytest.mark.real_pack
def test_real_spec(real_pack_available):
    from infercast.data.model_configs import resolve_model
    from infercast.data.pack import find_pack

    s = build_spec(resolve_model(find_pack(), K3))
    k = s.kimi
    assert (k.kda_layers, k.mla_layers, k.kda_heads, k.kda_head_dim, k.moe_latent) == (69, 24, 96, 128, 3584)
    assert k.pattern[0] == "K" and k.pattern[3] == "A" and k.pattern[-2:] == "AA"
    assert (s.moe.experts, s.moe.topk, s.moe.inter, s.moe.shared_inter, s.moe.first_dense_layers) == (896, 16, 3072, 6144, 1)
    assert s.quant.moe == "mxfp4" and s.quant.gemm == "bfloat16" and s.vision_params > 0


@pytest.mark.real_pack
@pytest.mark.parametrize("system, backend, layout", [
    ("b200_sxm", "vllm", dict(tp=16)),
    ("b200_sxm", "sglang", dict(tp=8, attention_dp=2, moe_ep=16)),
    ("gb200", "sglang", dict(tp=8, attention_dp=4, moe_ep=32)),
])
def test_real_estimates(real_pack_available, system, backend, layout):
    from infercast.api import Estimator

    est = Estimator(K3, system, backend, **layout)
    r = est.static(8, 1024, 256)
    assert r.fits and 0 < r.tpot_ms < r.ttft_ms and math.isfinite(r.tokens_per_s_per_gpu)
    rows = {x["op"]: x for x in est.engine.describe_ops()}
    assert rows["kda"]["context"]["source"] == "kda"
    if backend == "sglang":  # SGLang 0.5.14 has no kda_perf: 0.5.16's serves
        assert "0.5.16" in rows["kda"]["context"]["version"]
    # decode: the KDA op does not grow with the cached length
    a = est.engine.components(dec_batch=8.0, dec_kv=1024.0)["kda"][0]
    b = est.engine.components(dec_batch=8.0, dec_kv=8192.0)["kda"][0]
    assert float(a) == pytest.approx(float(b), rel=1e-12)
    assert est.memory.state_per_request > 0
    assert any("latent MoE projections" in n for n in est.context_notes(1024, 256))


@pytest.mark.real_pack
def test_real_serve_and_search_cli(real_pack_available, capsys):
    from infercast.cli.main import main

    assert main(["serve", "--model", K3, "--system", "b200_sxm", "--backend", "vllm", "--tp", "16", "--isl", "1024",
                 "--osl", "128", "--concurrency", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ttft_ms"] > 0 and out["tpot_ms"] > 0
    assert main(["search", "--model", K3, "--system", "gb200", "--backend", "sglang", "--isl", "1024", "--osl", "128",
                 "--gpus", "32", "--json"]) == 0
    assert capsys.readouterr().out.strip()


def test_kda_head_count_beyond_the_own_sites_reads_another_table(kda_pack, tmp_path):
    """TensorRT-LLM with a table of 64-head sites only: 8 heads are outside its gates, and vLLM's
    table, which collected 8, answers (noted)."""
    import shutil

    root = tmp_path / "pack"
    shutil.copytree(kda_pack.root, root)
    rows = _kda_rows()
    rows["num_k_heads"] = [64] * len(rows["num_k_heads"])
    rows["num_v_heads"] = [64] * len(rows["num_v_heads"])
    d = root / kda_pack.data_dir.relative_to(kda_pack.root) / "kda" / "trtllm" / sp.TRTLLM_CURRENT
    d.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(rows), d / "kda_perf.parquet")
    db = OpDB(PerfData.open(sp.SYSTEM, "trtllm", sp.TRTLLM_CURRENT, systems_path=root / "systems"))
    r = resolve_kda(db, "context", d_model=D, num_heads=8, head_dim=HD)
    assert r.grid.scalar(4, 256)[0] == pytest.approx(0.001 * 4 * 256 + 0.01 * 4 * 256, rel=1e-12)
    assert any("has no kda_perf site near 8 heads" in n for n in r.notes)
