"""Nemotron-H hybrids: the Mamba2 rooflines (hand-computed on the synthetic system), the conv op
from a synthetic ``mamba2_perf`` table (exact, transferred) and without one (roofline), the spec
and plan of a small synthetic Nemotron-H config (block counts, shapes per GPU, quant exceptions,
MTP), its memory (fixed-size state, KV of the attention blocks), and the real pack's models
through ``estimate`` / ``serve`` / ``search``.

Synthetic system (tests/synthpack.py): effective bandwidth 1e12 x 0.5 = 5e11 B/s, constant
latency 1 us, bf16 peak 1e14 FLOP/s.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import synthpack as sp

from infercast.api import Estimator
from infercast.data.database import PerfData
from infercast.data.model_configs import ModelConfig
from infercast.errors import InvalidConfigError, InvalidInputError, NotAvailableError
from infercast.interp import sol
from infercast.interp.provenance import Prov
from infercast.models.plan import ParallelConfig, Plan, SpecDecode, build_plan
from infercast.models.spec import ModelSpec, build_spec
from infercast.ops.base import DatabaseMode, OpDB
from infercast.ops.mamba import CONV_SOURCE, SSM_SOURCE, mamba_state_bytes, resolve_mamba_conv, resolve_mamba_ssm
from infercast.serving.memory import kv_bytes_per_token, state_bytes_per_request, weight_bytes_per_gpu

BW, LAT_MS, PEAK = 5e11, 1e-3, 1e14


def _ms(flops: float, nbytes: float) -> float:
    return max(flops / PEAK, nbytes / BW) * 1e3 + LAT_MS


# ------------------------------------------------------------------------------------------------
# rooflines, by hand
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def system(synth):
    return PerfData.open(sp.SYSTEM, "trtllm", None, synth.systems_dir).system


def test_ssm_context_roofline_by_hand(system):
    # H=4 P=8 N=16 G=2 chunk 4; 2 requests of 8 tokens: 16 tokens, 4 chunks, state 512
    # flops/token 2*2*4*16 + 2*4*4*8 + 4*4*16*8 = 2560; bytes/token 2*32*2 + 2*32*2 + 4*4 = 272
    total, math_ms, mem_ms = sol.mamba2_ssm(system, "context", 2, 8, 4, 8, 16, 2, chunk=4)
    nbytes = 16 * 272 + 4 * 2 * 512 * 4 + 2 * 512 * 4
    assert float(total) == pytest.approx(_ms(16 * 2560, nbytes), rel=1e-12)
    assert float(mem_ms) == pytest.approx(nbytes / BW * 1e3, rel=1e-12)
    assert float(math_ms) == pytest.approx(16 * 2560 / PEAK * 1e3, rel=1e-12)


def test_ssm_generation_roofline_by_hand(system):
    # 3 requests, one token each: state 512 read + written in fp32, 6 flops per state element
    total, _, mem_ms = sol.mamba2_ssm(system, "generation", 3, 1, 4, 8, 16, 2, chunk=4)
    nbytes = 3 * (272 + 4 * 8 * 2) + 3 * 2 * 512 * 4
    assert float(mem_ms) == pytest.approx(nbytes / BW * 1e3, rel=1e-12)
    assert float(total) == pytest.approx(_ms(3 * 6 * 512, nbytes), rel=1e-12)
    # a bf16 state halves the dominant term
    half = sol.mamba2_ssm(system, "generation", 3, 1, 4, 8, 16, 2, chunk=4, state_bytes=2.0)[2]
    assert float(half) == pytest.approx((3 * 336 + 3 * 2 * 512 * 2) / BW * 1e3, rel=1e-12)


def test_conv_roofline_by_hand(system):
    # channels 4*8 + 2*2*16 = 96, 4 taps
    ctx = sol.mamba2_conv(system, "context", 2, 8, 96, 4)[0]
    assert float(ctx) == pytest.approx(_ms(16 * 2 * 4 * 96, 16 * 2 * 96 * 2 + 96 * 4 * 2), rel=1e-12)
    assert sol.mamba2_conv_channels(4, 8, 2, 16) == 96
    gen = sol.mamba2_conv(system, "generation", 3, 1, 96, 4)[0]
    assert float(gen) == pytest.approx(_ms(3 * 8 * 96, 3 * 2 * 96 * 2 + 96 * 4 * 2 + 3 * 2 * 3 * 96 * 2), rel=1e-12)
    with pytest.raises(InvalidConfigError):
        sol.mamba2_conv(system, "verify", 1, 1, 96)


def test_state_bytes_by_hand():
    assert mamba_state_bytes(4, 8, 16, 2, 4) == 4 * 8 * 16 * 4 + 3 * 96 * 2
    assert mamba_state_bytes(4, 8, 16, 2, 4, state_bytes=2.0) == 4 * 8 * 16 * 2 + 3 * 96 * 2
    with pytest.raises(InvalidInputError):
        mamba_state_bytes(0, 8, 16, 2, 4)


# ------------------------------------------------------------------------------------------------
# ops: SSM (always a roofline), conv (table, or roofline without one)
# ------------------------------------------------------------------------------------------------


def _db(pack, mode=DatabaseMode.SILICON, backend="trtllm"):
    return OpDB(PerfData.open(sp.SYSTEM, backend, None, pack.systems_dir), mode)


SSM = dict(nheads=4, head_dim=8, d_state=16, n_groups=2, chunk=4)


def test_ssm_op_is_an_analytic_roofline_in_silicon(synth, system):
    db = _db(synth)
    ctx = resolve_mamba_ssm(db, "context", **SSM)
    assert ctx.source == SSM_SOURCE["context"] == "sol: mamba2 ssm scan"
    assert ctx.how == "analytic"
    v, p = ctx.grid(np.array([2.0]), np.array([8.0]), refuse=True)
    assert float(v[0]) == pytest.approx(float(sol.mamba2_ssm(system, "context", 2, 8, 4, 8, 16, 2, chunk=4)[0]), rel=1e-12)
    assert int(p[0]) == Prov.ANALYTIC
    gen = resolve_mamba_ssm(db, "generation", **SSM)
    assert gen.source == "sol: mamba2 ssm state update"
    # fixed-size state: the same cost at any cached length, also far beyond the step axis
    a, pa_ = gen.grid(np.array([3.0, 3.0]), np.array([5.0, 1e9]), refuse=True)
    want = float(sol.mamba2_ssm(system, "generation", 3, 1, 4, 8, 16, 2, chunk=4)[0])
    assert a.tolist() == pytest.approx([want, want], rel=1e-12)
    assert set(pa_.tolist()) == {int(Prov.ANALYTIC)}


def test_ssm_op_in_sol_mode_says_sol(synth):
    r = resolve_mamba_ssm(_db(synth, DatabaseMode.SOL), "context", **SSM)
    assert r.how == "sol"
    assert int(r.grid(np.array([1.0]), np.array([64.0]))[1][0]) == Prov.SOL


def test_conv_without_table_is_a_roofline(synth, system):
    r = resolve_mamba_conv(_db(synth), "context", d_model=64, nheads=4, head_dim=8, n_groups=2, d_state=16)
    assert r.source == CONV_SOURCE and r.how == "analytic"
    assert any("no mamba2_perf table" in n for n in r.notes)
    v, p = r.grid(np.array([2.0]), np.array([8.0]), refuse=True)
    assert float(v[0]) == pytest.approx(float(sol.mamba2_conv(system, "context", 2, 8, 96, 4)[0]), rel=1e-12)
    assert int(p[0]) == Prov.ANALYTIC


def test_bad_op_input_is_refused(synth):
    with pytest.raises(InvalidInputError):
        resolve_mamba_ssm(_db(synth), "context", **{**SSM, "nheads": 0})
    with pytest.raises(InvalidInputError):
        resolve_mamba_conv(_db(synth), "prefill", d_model=64, nheads=4, head_dim=8, n_groups=2, d_state=16)


#: synthetic conv sites (d_model, nheads, head_dim, n_groups, d_state, d_conv) and their utilisation
CONV_SITES = ((64, 4, 8, 1, 16, 4), (64, 16, 8, 4, 16, 4))
CONV_UTIL = 0.5
CTX_B, CTX_S, GEN_B = (1, 2, 4, 8), (8, 64, 512), (1, 8, 64)


@pytest.fixture(scope="module")
def conv_pack(tmp_path_factory):
    """The synthetic pack plus a mamba2_perf table (TensorRT-LLM) whose rows are the conv
    roofline at utilisation 0.5, so a transfer through utilisation is exact."""
    pack = sp.make_pack(tmp_path_factory.mktemp("mamba_pack"))
    system = PerfData.open(sp.SYSTEM, "trtllm", None, pack.systems_dir).system
    rows = []
    for site in CONV_SITES:
        _, h, p, g, n, k = site
        for b in CTX_B:
            for s in CTX_S:
                rows.append(("context", "causal_conv1d_fn", b, s, *site,
                             float(sol.mamba2_conv(system, "context", b, s, h * p + 2 * g * n, k)[0]) / CONV_UTIL))
        for b in GEN_B:
            rows.append(("generation", "causal_conv1d_update", b, 1, *site,
                         float(sol.mamba2_conv(system, "generation", b, 1, h * p + 2 * g * n, k)[0]) / CONV_UTIL))
    names = ("phase", "kernel_source", "batch_size", "seq_len", "d_model", "nheads", "head_dim", "n_groups", "d_state",
             "d_conv", "latency")
    cols = {c: [r[i] for r in rows] for i, c in enumerate(names)}
    n = len(rows)
    cols.update(framework=["TRTLLM"] * n, version=[sp.TRTLLM_CURRENT] * n, device=[sp.DEVICE] * n, op_name=["mamba2"] * n,
                chunk_size=[128] * n, num_tokens=[b * s for b, s in zip(cols["batch_size"], cols["seq_len"])],
                model_name=["synth/mamba"] * n)
    types = {c: (pa.string() if isinstance(v[0], str) else pa.float64() if isinstance(v[0], float) else pa.int64())
             for c, v in cols.items()}
    out = pack.data_dir / "linear_attention" / "trtllm" / sp.TRTLLM_CURRENT
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_arrays([pa.array(cols[c], type=types[c]) for c in cols],
                                        schema=pa.schema([(c, types[c]) for c in cols])), out / "mamba2_perf.parquet")
    (out / "collection_meta.yaml").write_text(sp._collection_meta_yaml("trtllm", sp.TRTLLM_CURRENT, ["mamba2_perf"]))
    return pack


def test_conv_exact_at_a_collected_site(conv_pack):
    db = _db(conv_pack)
    _, h, p, g, n, k = CONV_SITES[0]
    r = resolve_mamba_conv(db, "context", d_model=64, nheads=h, head_dim=p, n_groups=g, d_state=n, conv_kernel=k)
    assert r.source == "mamba2" and r.how == "exact" and r.kernel == "causal_conv1d_fn"
    v, pr = r.grid(np.array([4.0]), np.array([64.0]), refuse=True)
    assert float(v[0]) == pytest.approx(float(sol.mamba2_conv(db.system, "context", 4, 64, h * p + 2 * g * n, k)[0]) / CONV_UTIL, rel=1e-9)
    assert int(pr[0]) == Prov.EXACT
    gen = resolve_mamba_conv(db, "generation", d_model=64, nheads=h, head_dim=p, n_groups=g, d_state=n, conv_kernel=k)
    a = gen.grid(np.array([8.0, 8.0]), np.array([10.0, 5000.0]), refuse=True)[0]
    assert a[0] == pytest.approx(a[1], rel=1e-12)  # step-independent


def test_conv_transferred_between_sites(conv_pack):
    """A TP split between the collected channel counts (4x8 + 2x1x16 = 64 and 16x8 + 2x4x16 = 256;
    the query 8x8 + 2x2x16 = 128): same utilisation, so the transfer gives the query's roofline /
    0.5. d_model does not enter the conv."""
    db = _db(conv_pack)
    r = resolve_mamba_conv(db, "context", d_model=2048, nheads=8, head_dim=8, n_groups=2, d_state=16)
    assert r.how != "exact"
    v, pr = r.grid(np.array([2.0]), np.array([512.0]), refuse=True)
    assert float(v[0]) == pytest.approx(float(sol.mamba2_conv(db.system, "context", 2, 512, 128, 4)[0]) / CONV_UTIL, rel=1e-6)
    assert int(pr[0]) == Prov.TRANSFERRED
    assert any("128 conv channels" in note for note in r.notes)
    # the same channels split another way are the same site
    same = resolve_mamba_conv(db, "context", d_model=64, nheads=12, head_dim=8, n_groups=1, d_state=16)
    assert float(same.grid(np.array([2.0]), np.array([512.0]))[0][0]) == pytest.approx(float(v[0]), rel=1e-12)


def test_conv_outside_the_gates_raises_in_silicon(conv_pack):
    with pytest.raises(NotAvailableError, match="outside the collected sites"):
        resolve_mamba_conv(_db(conv_pack), "context", d_model=64, nheads=512, head_dim=64, n_groups=64, d_state=256)
    r = resolve_mamba_conv(_db(conv_pack, DatabaseMode.HYBRID), "context", d_model=64, nheads=512, head_dim=64, n_groups=64,
                           d_state=256)
    assert r.how == "empirical"


# ------------------------------------------------------------------------------------------------
# spec, plan, memory of a synthetic Nemotron-H config
# ------------------------------------------------------------------------------------------------


def _config(**over) -> dict:
    cfg = {
        "architectures": ["NemotronHForCausalLM"], "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "mamba_num_heads": 8, "mamba_head_dim": 8, "ssm_state_size": 16,
        "n_groups": 2, "conv_kernel": 4, "chunk_size": 4, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "moe_shared_expert_intermediate_size": 64, "n_shared_experts": 1,
        "intermediate_size": 48, "vocab_size": 256, "hybrid_override_pattern": "ME*EM-ME", "num_hidden_layers": 8,
        "mamba_ssm_cache_dtype": "float32", "mlp_hidden_act": "relu2",
    }
    cfg.update(over)
    return {k: v for k, v in cfg.items() if v is not None}


def _spec(hf_quant=None, **over) -> ModelSpec:
    return build_spec(ModelConfig("synth/nemotron-h", "synth/nemotron-h", _config(**over), hf_quant=hf_quant))


def _ops(plan: Plan) -> dict:
    return {o.name: o for o in plan.ops}


def test_spec_reads_the_pattern():
    s = _spec()
    assert s.family == "nemotron_h" and s.num_layers == 8
    m = s.mamba
    assert (m.mamba_layers, m.attention_layers, m.count("mlp"), m.count("moe")) == (3, 1, 1, 3)
    assert s.moe.gated is False and s.moe.shared_inter == 64 and s.moe.first_dense_layers == 1
    # layers_block_type names the same blocks; num_hidden_layers may be left out
    names = {"M": "mamba", "E": "moe", "*": "attention", "-": "mlp"}
    alt = _spec(hybrid_override_pattern=None, num_hidden_layers=None, layers_block_type=[names[c] for c in "ME*EM-ME"])
    assert alt.mamba.pattern == "ME*EM-ME" and alt.num_layers == 8
    assert ModelSpec.from_dict(json.loads(json.dumps(s.to_dict()))) == s


@pytest.mark.parametrize("over, match", [
    (dict(hybrid_override_pattern="MX*"), "string of"),
    (dict(num_hidden_layers=9), "9 but the block pattern has 8"),
    (dict(hybrid_override_pattern=None), "hybrid_override_pattern or layers_block_type"),
    (dict(mamba_num_heads=None), "mamba_num_heads"),
    (dict(mamba_ssm_cache_dtype="int8"), "mamba_ssm_cache_dtype"),
])
def test_malformed_configs_are_refused(over, match):
    with pytest.raises(InvalidInputError, match=match):
        _spec(**over)


def test_plan_counts_and_shapes_at_tp2():
    plan = build_plan(_spec(), ParallelConfig(tp=2))
    ops = _ops(plan)
    # Mamba: 4 heads x 8, 1 group x 16 per GPU: in_proj 2*32 + 2*16 + 4 = 100 outputs
    assert (ops["mamba_in_proj"].count, ops["mamba_in_proj"].params["n"], ops["mamba_in_proj"].params["k"]) == (3, 100, 64)
    assert ops["mamba_out_proj"].params == {"n": 64, "k": 32, "quant": "bfloat16"}
    assert ops["mamba_conv"].params["nheads"] == 4 and ops["mamba_conv"].params["n_groups"] == 1
    assert ops["mamba_ssm"].count == 3 and ops["mamba_ssm"].params["chunk"] == 4
    assert ops["mamba_gated_norm"].params["bytes_per_token"] == 32 * 2 * 3
    # attention: 2 q heads + 2 x 1 kv head of 16, no RoPE
    assert ops["qkv_gemm"].count == 1 and ops["qkv_gemm"].params["n"] == 64 and "rope" not in ops
    assert ops["attention"].params["kv_heads"] == 1
    # MLP (relu^2, not gated): up 48/2 = 24
    assert ops["mlp_up_gemm"].params["n"] == 24 and ops["mlp_down_gemm"].params["k"] == 24
    # MoE: non-gated experts at the hidden width, shared expert 64/2 = 32
    assert ops["moe_experts"].count == 3 and ops["moe_experts"].params["gated"] is False
    assert ops["moe_experts"].params["hidden"] == 64 and "moe_latent_down" not in ops
    assert ops["shared_up_gemm"].params["n"] == 32
    assert ops["input_norm"].count == 8
    assert {n: ops[n].count for n in ops if n.endswith("_allreduce") and n != "embedding_allreduce"} == \
        {"mamba_allreduce": 3, "attention_allreduce": 1, "mlp_allreduce": 1, "moe_allreduce": 3}
    assert Plan.from_json(plan.to_json()).ops == plan.ops


def test_plan_latent_moe():
    ops = _ops(build_plan(_spec(moe_latent_size=32), ParallelConfig(tp=1)))
    assert ops["moe_experts"].params["hidden"] == 32
    assert ops["moe_latent_down"].params == {"n": 32, "k": 64, "quant": "bfloat16"}
    assert ops["moe_latent_up"].params == {"n": 64, "k": 32, "quant": "bfloat16"}
    assert ops["shared_up_gemm"].params["k"] == 64  # the shared expert stays at the hidden width


def test_plan_refuses_layouts_without_whole_heads_or_groups():
    with pytest.raises(InvalidConfigError, match="Mamba heads"):
        build_plan(_spec(mamba_num_heads=6, n_groups=1), ParallelConfig(tp=4))
    with pytest.raises(InvalidConfigError, match="Mamba groups"):
        build_plan(_spec(n_groups=3, mamba_num_heads=12), ParallelConfig(tp=2))
    # more GPUs than groups: the groups are replicated
    assert _ops(build_plan(_spec(), ParallelConfig(tp=4)))["mamba_conv"].params["n_groups"] == 1


def test_export_exclusions_split_the_projections():
    hq = {"quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8",
                           "exclude_modules": ["lm_head", "backbone.layers.4.mixer.in_proj", "backbone.layers.4.mixer.out_proj",
                                               "backbone.layers.2.mixer.q_proj", "backbone.layers.2.mixer.o_proj"]}}
    s = _spec(hf_quant=hq)
    assert s.quant.gemm == "nvfp4" and s.quant.kv_cache == "fp8"
    assert s.quant.attention_gemm == "bfloat16"  # the only attention block is excluded
    assert s.mamba.bf16_mamba_layers == 1
    ops = _ops(build_plan(s, ParallelConfig(tp=1)))
    assert (ops["mamba_in_proj"].count, ops["mamba_in_proj"].params["quant"]) == (2, "nvfp4")
    assert (ops["mamba_in_proj_bf16"].count, ops["mamba_in_proj_bf16"].params["quant"]) == (1, "bfloat16")
    assert ops["qkv_gemm"].params["quant"] == "bfloat16" and ops["moe_experts"].params["quant"] == "nvfp4"
    # an explicit other GEMM mode replaces the exceptions
    from dataclasses import replace

    fp8 = replace(s, quant=s.quant.with_overrides(gemm="fp8"))
    ops = _ops(build_plan(fp8, ParallelConfig(tp=1)))
    assert "mamba_in_proj_bf16" not in ops and ops["mamba_in_proj"].params["quant"] == "fp8"


def test_mixed_precision_export_per_module():
    layers = {"backbone.layers.0.mixer.in_proj": {"quant_algo": "FP8"}, "backbone.layers.0.mixer.out_proj": {"quant_algo": "FP8"},
              "backbone.layers.1.mixer.experts.0.up_proj": {"quant_algo": "W4A16_NVFP4", "group_size": 16},
              "backbone.layers.1.mixer.shared_experts.up_proj": {"quant_algo": "W4A16_NVFP4", "group_size": 16}}
    s = _spec(hf_quant={"quantization": {"quant_algo": "MIXED_PRECISION", "quantized_layers": layers,
                                         "exclude_modules": ["backbone.layers.2.mixer.q_proj"]}})
    assert s.mamba.mamba_gemm == "fp8" and s.quant.moe == "nvfp4" and s.quant.shared_expert_gemm == "nvfp4"
    assert "weight-only NVFP4" in s.quant.source
    ops = _ops(build_plan(s, ParallelConfig(tp=1)))
    assert ops["mamba_in_proj"].params["quant"] == "fp8" and ops["qkv_gemm"].params["quant"] == "bfloat16"


def test_mtp_draft_runs_the_mtp_blocks():
    s = _spec(num_nextn_predict_layers=1, mtp_hybrid_override_pattern="*E")
    plan = build_plan(s, ParallelConfig(tp=1), SpecDecode(nextn=2))
    draft = {o.name: o for o in plan.ops if o.phase == "decode"}
    assert draft["mtp_attention"].count == 2 and draft["mtp_moe_experts"].count == 2
    assert draft["mtp_lm_head"].count == 2 and draft["mtp_input_norm"].count == 4
    assert not any("mamba" in n for n in draft)
    with pytest.raises(InvalidConfigError, match="no MTP layers"):
        build_plan(_spec(), ParallelConfig(tp=1), SpecDecode(nextn=1))


def test_memory_state_and_kv_by_hand():
    s = _spec()
    par = ParallelConfig(tp=1)
    # per Mamba block: 8 heads x 8 x 16 fp32 + 3 taps x (64 + 2*2*16) channels bf16
    assert state_bytes_per_request(s, par) == 3 * (8 * 8 * 16 * 4 + 3 * 128 * 2)
    # only the attention block keeps per-token KV: K and V, 2 heads of 16, bf16
    assert kv_bytes_per_token(s, par) == 2 * 1 * 2 * 16 * 2
    assert state_bytes_per_request(s, ParallelConfig(tp=2, pp=2)) == 2 * (4 * 8 * 16 * 4 + 3 * (32 + 32) * 2)
    # weights: blocks by kind plus embedding and LM head (bf16)
    h = 64
    mamba = h * (2 * 64 + 2 * 2 * 16 + 8) * 2 + 64 * h * 2 + (64 + 64) * 5 * 2 + 3 * 8 * 4 + 64 * 2 + h * 2
    attn = (h * (4 + 4) * 16 + 4 * 16 * h) * 2 + h * 2
    mlp = 2 * h * 48 * 2 + h * 2
    moe = 8 * 2 * h * 32 * 2 + 2 * h * 64 * 2 + h * 8 * 2 + h * 2
    assert weight_bytes_per_gpu(s, par) == pytest.approx(3 * mamba + attn + mlp + 3 * moe + 2 * 256 * h * 2, rel=1e-12)


# ------------------------------------------------------------------------------------------------
# a dense synthetic Nemotron-H through the engine (the synthetic pack has no MoE table)
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dense_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("nh") / "config.json"
    cfg = _config(hybrid_override_pattern="M*M-M-", num_hidden_layers=6, n_routed_experts=None, num_experts_per_tok=None,
                  moe_intermediate_size=None, moe_shared_expert_intermediate_size=None, n_shared_experts=None,
                  intermediate_size=64, hidden_size=256, num_attention_heads=8, head_dim=32)
    path.write_text(json.dumps(cfg))
    return path


def test_engine_sums_the_mamba_rooflines(synth, dense_config, system):
    est = Estimator(str(dense_config), sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)
    comps = est.engine.components(dec_batch=4.0, dec_kv=100.0)
    want = 3 * float(sol.mamba2_ssm(system, "generation", 4, 1, 8, 8, 16, 2, chunk=4)[0])
    assert float(comps["mamba_ssm"][0]) == pytest.approx(want, rel=1e-9)
    assert int(comps["mamba_ssm"][1]) == Prov.ANALYTIC
    # the SSM and conv do not grow with the cached length; attention does
    later = est.engine.components(dec_batch=4.0, dec_kv=4000.0)
    assert float(later["mamba_ssm"][0]) == pytest.approx(want, rel=1e-9)
    assert float(later["mamba_conv"][0]) == pytest.approx(float(comps["mamba_conv"][0]), rel=1e-9)
    assert float(later["attention"][0]) > float(comps["attention"][0])
    # a cached prefix does not enter the stateful ops' prefill
    a = est.engine.components(ctx_batch=1.0, ctx_isl=256.0, ctx_prefix=0.0)
    b = est.engine.components(ctx_batch=1.0, ctx_isl=256.0, ctx_prefix=1024.0)
    assert float(a["mamba_ssm"][0]) == float(b["mamba_ssm"][0])
    assert est.memory.state_per_request == 3 * (8 * 8 * 16 * 4 + 3 * 128 * 2)
    rows = {r["op"]: r for r in est.engine.describe_ops()}
    assert rows["mamba_ssm"]["generation"]["source"] == "sol: mamba2 ssm state update"
    assert rows["mamba_conv"]["context"]["source"] == CONV_SOURCE


# ------------------------------------------------------------------------------------------------
# the real pack
# ------------------------------------------------------------------------------------------------

NANO = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"


@pytest.mark.real_pack
def test_real_nano_spec(real_pack_available):
    from infercast.data.model_configs import resolve_model
    from infercast.data.pack import find_pack

    s = build_spec(resolve_model(find_pack(), NANO))
    assert s.mamba.pattern.count("M") == 23 and s.mamba.attention_layers == 6 and s.mamba.count("moe") == 23
    assert s.num_layers == 52 and s.moe.experts == 128 and s.moe.topk == 6 and not s.moe.gated
    nv = build_spec(resolve_model(find_pack(), "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4"))
    assert nv.quant.attention_gemm == "bfloat16" and nv.mamba.bf16_mamba_layers == 6
    ultra = build_spec(resolve_model(find_pack(), "nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-FP8"))
    assert ultra.num_layers == len(ultra.mamba.pattern) and ultra.mamba.moe_latent == 2048 and ultra.mtp_layers == 1


@pytest.mark.real_pack
def test_real_nano_decode_step_against_bytes(real_pack_available):
    """Decode at batch 1: every block reads its weights once (one token picks 6 experts, so only
    the touched experts' weights move) plus the SSM state; the step must lie between that
    byte count over the bandwidth and a few times it."""
    est = Estimator(NANO, "b200_sxm", "trtllm")
    s, gpu = est.spec, est.data.system.gpu
    h, m, e = s.hidden, s.mamba, s.moe
    active = (m.mamba_layers * h * (2 * 4096 + 2 * 8 * 128 + 64 + 4096) + m.attention_layers * h * (32 + 4) * 128 * 2
              + m.count("moe") * (e.topk * 2 * h * e.inter + 2 * h * e.shared_inter + h * e.experts) + h * s.vocab) * 2.0
    state = est.memory.state_per_request * 2  # read and written
    floor_ms = (active + state) / gpu.effective_mem_bw * 1e3
    step = float(est.engine.decode_ms(1.0, 2048.0))
    assert floor_ms < step < 4 * floor_ms, (floor_ms, step)
    # the SSM state update at batch 64 is the roofline of its bytes
    comps = est.engine.components(dec_batch=64.0, dec_kv=2048.0, phase="decode")
    want = m.mamba_layers * (64 * 2 * 64 * 64 * 128 * 4 / gpu.effective_mem_bw * 1e3 + gpu.mem_latency_s * 1e3)
    assert float(comps["mamba_ssm"][0]) == pytest.approx(want, rel=0.02)


@pytest.mark.real_pack
def test_real_conv_exact_on_trtllm_and_roofline_on_vllm(real_pack_available):
    t = {r["op"]: r for r in Estimator(NANO, "b200_sxm", "trtllm").engine.describe_ops()}
    assert t["mamba_conv"]["context"]["how"] == "exact" and t["mamba_conv"]["context"]["source"] == "mamba2"
    v = {r["op"]: r for r in Estimator(NANO, "b200_sxm", "vllm").engine.describe_ops()}
    assert v["mamba_conv"]["context"]["source"] == CONV_SOURCE


@pytest.mark.real_pack
@pytest.mark.parametrize("model, system, backend, tp", [
    (NANO, "h100_sxm", "vllm", 2),
    ("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4", "b200_sxm", "sglang", 1),
    ("nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-NVFP4", "gb200", "trtllm", 2),
    ("nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-FP8", "h200_sxm", "trtllm", 1),
])
def test_real_pass_rows_estimate(real_pack_available, model, system, backend, tp):
    r = Estimator(model, system, backend, tp=tp).static(8, 1024, 256)
    assert r.fits and 0 < r.tpot_ms < r.ttft_ms
    assert math.isfinite(r.tokens_per_s_per_gpu)


@pytest.mark.real_pack
def test_real_serve_and_search_cli(real_pack_available, capsys):
    from infercast.cli.main import main

    assert main(["serve", "--model", NANO, "--system", "b200_sxm", "--backend", "trtllm", "--isl", "1024", "--osl", "128",
                 "--concurrency", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ttft_ms"] > 0 and out["tpot_ms"] > 0
    assert main(["search", "--model", NANO, "--system", "h200_sxm", "--backend", "vllm", "--isl", "1024", "--osl", "128",
                 "--gpus", "2", "--json"]) == 0
    assert capsys.readouterr().out.strip()


def test_disagg_transfer_carries_the_state():
    from infercast.serving.disagg import kv_transfer_ms

    # 1000 tokens x 100 B + 50,000 B of state per GPU over 1e9 B/s, plus 10 us
    assert kv_transfer_ms(100.0, 1000, 2, 1e9, 1e-5, 50_000.0) == pytest.approx((100_000 + 50_000) / 1e9 * 1e3 + 1e-2, rel=1e-12)
    assert kv_transfer_ms(100.0, 1000, 2, 1e9, 1e-5) == pytest.approx(100_000 / 1e9 * 1e3 + 1e-2, rel=1e-12)
