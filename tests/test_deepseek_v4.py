"""DeepSeek-V4: its config (compress ratios per layer, mHC, hash layers, MTP, quant), the plan, the
compressed-KV memory, the CSA / HCA module resolver (ops/dsv4.py) and the mHC op (ops/mhc.py) on
synthetic tables whose latency is a power law (exact under log-log interpolation), and estimates
on the real pack."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from synthpack import SYSTEM, TRTLLM_CURRENT, make_pack

from infercast.data.database import PerfData
from infercast.data.model_configs import ModelConfig
from infercast.errors import InvalidConfigError, InvalidInputError, NotAvailableError
from infercast.interp.provenance import Prov
from infercast.models.deepseek_v4 import kv_bytes_per_token, state_bytes_per_request
from infercast.models.plan import ParallelConfig, Plan, SpecDecode, build_plan
from infercast.models.spec import ModelSpec, build_spec
from infercast.ops.base import DatabaseMode, OpDB
from infercast.ops.dsv4 import DSV4Dims, dims_of_config, dsv4_sol, resolve_dsv4_attention
from infercast.ops.mhc import mhc_sol, resolve_mhc

HEADS = (4, 16)
MODEL = "synth/tiny-dsv4"
OTHER = "synth/wide-dsv4"  # another attention shape: its rows must never serve MODEL


def _cfg(**over) -> dict:
    c = {"architectures": ["DeepseekV4ForCausalLM"], "hidden_size": 64, "num_attention_heads": 16,
         "num_key_value_heads": 1, "head_dim": 32, "qk_rope_head_dim": 8, "q_lora_rank": 24, "o_lora_rank": 16,
         "o_groups": 4, "index_n_heads": 4, "index_head_dim": 8, "index_topk": 16, "sliding_window": 8,
         "num_hidden_layers": 6, "compress_ratios": [0, 4, 128, 4, 128, 0, 4], "num_nextn_predict_layers": 1,
         "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 1,
         "num_hash_layers": 2, "hc_mult": 4, "hc_sinkhorn_iters": 20, "vocab_size": 1000,
         "expert_dtype": "fp4", "max_position_embeddings": 4096,
         "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    c.update(over)
    return c


def ctx_ms(b, isl, heads, ratio):
    return 1e-3 * b * isl * heads * (2.0 if ratio == 4 else 1.0)


def gen_ms(b, step, heads, ratio):
    return 1e-2 * b * step**0.5 * heads * (2.0 if ratio == 4 else 1.0)


def mhc_ms(which, tokens, hidden):
    return 1e-3 * tokens**0.8 * hidden / 64 * (1.0 if which == "pre" else 0.5)


def _tables(data_dir):
    d = data_dir / "sparse_attention" / "trtllm" / TRTLLM_CURRENT
    d.mkdir(parents=True, exist_ok=True)
    for kind, ratio in (("csa", 4), ("hca", 128)):
        for phase, curve, fn in (("context", (1, 16, 64, 256), ctx_ms), ("generation", (1, 15, 255, 4095), gen_ms)):
            cols = ("model", "op_name", "kernel_source", "mla_dtype", "gemm_type", "kv_cache_dtype", "num_heads",
                    "batch_size", "isl", "step", "tp_size", "compress_ratio", "latency")
            rows = {k: [] for k in cols}
            for model, scale in ((MODEL, 1.0), (OTHER, 100.0)):
                for gemm in ("bfloat16", "fp8_block"):
                    for h in HEADS:
                        for b in (1, 2, 8):
                            for x in curve:
                                for s in ((0, 128) if phase == "context" else (None,)):
                                    isl, step = (x, s) if phase == "context" else (1, x)
                                    lat = fn(b, x, h, ratio) * scale * (1.0 if gemm == "fp8_block" else 1.5) * (1 if not s else 7)
                                    vals = (model, f"dsv4_{kind}_{phase}_module", "default", "bfloat16", gemm, "fp8_e4m3",
                                            h, b, isl, step, 16 // h, ratio, lat)
                                    for k, v in zip(cols, vals):
                                        rows[k].append(v)
            pq.write_table(pa.table(rows), d / f"dsv4_{kind}_{phase}_module_perf.parquet")
    m = data_dir / "mhc" / "trtllm" / TRTLLM_CURRENT
    m.mkdir(parents=True, exist_ok=True)
    cols = ("op_name", "kernel_source", "architecture", "num_tokens", "num_sites", "hc_mult", "hidden_size",
            "sinkhorn_iters", "latency")
    rows = {k: [] for k in cols}
    for which in ("pre", "post"):
        for t in (1, 16, 256, 4096):
            # the pre op has two kernels; the slower one must never be used
            for kernel, f in ((f"k_{which}", 1.0), (f"k_{which}_slow", 3.0)):
                for k, v in zip(cols, (which, kernel, "DeepseekV4ForCausalLM", t, 2, 4, 64, 20, mhc_ms(which, t, 64) * f)):
                    rows[k].append(v)
    pq.write_table(pa.table(rows), m / "mhc_module_perf.parquet")


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    p = make_pack(tmp_path_factory.mktemp("dsv4pack"))
    _tables(p.data_dir)
    for mid, cfg in ((MODEL, _cfg()), (OTHER, _cfg(hidden_size=128))):
        (p.model_configs_dir / f"{mid.replace('/', '--')}_config.json").write_text(json.dumps(cfg))
    return p


def _db(pack, mode=DatabaseMode.SILICON):
    return OpDB(PerfData.open(SYSTEM, "trtllm", TRTLLM_CURRENT, systems_path=pack.systems_dir), mode)


@pytest.fixture(scope="module")
def db(pack):
    return _db(pack)


DIMS = dims_of_config(_cfg())


def _kw(**over):
    kw = {"kind": "csa", "ratio": 4, "dims": DIMS, "heads": 4, "o_groups": 1, "gemm_quant": "fp8_block",
          "kv_quant": "fp8", "tp": 4, "model_id": MODEL}
    kw.update(over)
    return kw


# ---- attention module ----------------------------------------------------------------------------


def test_exact_cells_and_loglog_interpolation(db):
    r = resolve_dsv4_attention(db, "context", **_kw())
    assert r.source == "dsv4_csa_context_module" and r.how == "exact" and r.kernel == "default"
    assert r.grid.scalar(2, 64)[0] == pytest.approx(ctx_ms(2, 64, 4, 4))
    # step-0 rows only (the 7x prefix rows stay out); power law: exact between collected points
    assert r.grid.scalar(3, 100)[0] == pytest.approx(ctx_ms(3, 100, 4, 4))
    g = resolve_dsv4_attention(db, "generation", **_kw(kind="hca", ratio=128, heads=16, tp=1))
    assert g.source == "dsv4_hca_generation_module"
    assert g.grid.scalar(8, 255)[0] == pytest.approx(gen_ms(8, 255, 16, 128))
    assert g.grid.scalar(4, 1000)[0] == pytest.approx(gen_ms(4, 1000, 16, 128))


def test_rows_are_matched_on_shape_quant_and_ratio(db):
    # bf16 projections: their own rows (1.5x), not the fp8 ones
    r = resolve_dsv4_attention(db, "context", **_kw(gemm_quant="bfloat16"))
    assert r.grid.scalar(8, 256)[0] == pytest.approx(1.5 * ctx_ms(8, 256, 4, 4))
    # a model id the tables do not name, of the same shape, is served by MODEL's rows (noted)
    r = resolve_dsv4_attention(db, "context", **_kw(model_id="someone/else"))
    assert r.grid.scalar(2, 64)[0] == pytest.approx(ctx_ms(2, 64, 4, 4))
    assert any("same DeepSeek-V4 attention shape" in n for n in r.notes)
    # per-tensor fp8 projections: carried from the nearest quant's rows, provenance transferred
    r = resolve_dsv4_attention(db, "context", **_kw(gemm_quant="fp8"))
    assert "gemm-transfer" in r.how and r.grid.scalar(2, 64)[1] >= int(Prov.TRANSFERRED)
    with pytest.raises(NotAvailableError, match="bfloat16 KV"):
        resolve_dsv4_attention(db, "generation", **_kw(kv_quant="bfloat16"))
    with pytest.raises(NotAvailableError, match="compress_ratio=64"):
        resolve_dsv4_attention(db, "context", **_kw(kind="hca", ratio=64))
    other = DSV4Dims(**{**DIMS.__dict__, "hidden": 96})
    with pytest.raises(NotAvailableError, match="attention shape"):
        resolve_dsv4_attention(db, "context", **_kw(dims=other))


def test_uncollected_heads_transfer_between_neighbours(db):
    r = resolve_dsv4_attention(db, "context", **_kw(heads=8, tp=2))
    assert r.how != "exact" and r.donors
    assert ctx_ms(2, 64, 4, 4) < r.grid.scalar(2, 64)[0] < ctx_ms(2, 64, 16, 4)


def test_hybrid_without_rows_is_empirical_and_sol_is_the_roofline(pack):
    other = DSV4Dims(**{**DIMS.__dict__, "hidden": 96})
    r = resolve_dsv4_attention(_db(pack, DatabaseMode.HYBRID), "generation", **_kw(dims=other))
    assert r.how == "empirical" and any("no silicon answer" in n for n in r.notes)
    s = resolve_dsv4_attention(_db(pack, DatabaseMode.SOL), "context", **_kw())
    sysm = _db(pack).system
    expect = dsv4_sol(sysm, "context", 2.0, 64.0, dims=DIMS, heads=4, o_groups=1, ratio=4, weight_bytes=1.0 + 4.0 / 16384,
                      kv_bytes=1.0, gemm_compute="fp8", indexer=True)
    assert s.how == "sol" and s.grid.scalar(2, 64)[0] == pytest.approx(float(expect))


def test_bad_input(db):
    with pytest.raises(InvalidInputError):
        resolve_dsv4_attention(db, "decode", **_kw())
    with pytest.raises(InvalidInputError):
        resolve_dsv4_attention(db, "context", **_kw(kind="swa"))
    with pytest.raises(InvalidInputError):
        resolve_dsv4_attention(db, "context", **_kw(heads=0))


def test_sol_by_hand(db):
    sysm = db.system
    d = DSV4Dims(hidden=8, q_lora_rank=4, o_lora_rank=2, head_dim=4, qk_rope_head_dim=2, index_n_heads=1,
                 index_head_dim=2, index_topk=1, window=2)
    # HCA (ratio 2), one request decoding after 3 cached tokens: context 4 -> window 2 + 4/2 = 2 compressed
    v = dsv4_sol(sysm, "generation", 1, 3, dims=d, heads=1, o_groups=1, ratio=2, weight_bytes=2.0, kv_bytes=2.0)
    w = 8 * 4 + 4 * 1 * 4 + 8 * 4 + 1 * 4 * 2 + 1 * 2 * 8 + 1 * 8 * 2 * 4
    entry = (4 - 2) * 2 + 2 * 2
    pairs = 2 + 2
    from infercast.interp import sol

    f = sol._flops(sysm, "bfloat16")
    compute = 2 * w / f + 4 * pairs * 4 / f
    nbytes = w * 2 + pairs * entry + entry + 2 * 2 * 8
    expect = max(compute, nbytes / sysm.gpu.effective_mem_bw) * 1e3 + sysm.gpu.mem_latency_s * 1e3
    assert float(v) == pytest.approx(expect)


# ---- mHC ------------------------------------------------------------------------------------------


def test_mhc_fastest_kernel_exact_and_interpolated(db):
    r = resolve_mhc(db, "pre", hidden=64, hc_mult=4, sinkhorn_iters=20)
    assert r.source == "mhc_module" and r.how == "exact"
    assert r.grid.scalar(256)[0] == pytest.approx(mhc_ms("pre", 256, 64))
    assert r.grid.scalar(100)[0] == pytest.approx(mhc_ms("pre", 100, 64))
    post = resolve_mhc(db, "post", hidden=64, hc_mult=4, sinkhorn_iters=20)
    assert post.grid.scalar(16)[0] == pytest.approx(mhc_ms("post", 16, 64))


def test_mhc_other_hidden_is_transferred_and_missing_rows_are_the_roofline(db):
    r = resolve_mhc(db, "pre", hidden=128, hc_mult=4, sinkhorn_iters=20)
    sysm = db.system
    ratio = mhc_sol(sysm, "pre", 256, hidden=128, hc_mult=4, sinkhorn_iters=20) / \
        mhc_sol(sysm, "pre", 256, hidden=64, hc_mult=4, sinkhorn_iters=20)
    assert r.how == "transferred" and r.grid.scalar(256)[0] == pytest.approx(mhc_ms("pre", 256, 64) * float(ratio))
    s = resolve_mhc(db, "post", hidden=64, hc_mult=2, sinkhorn_iters=20)
    assert s.how == "sol" and "roofline" in s.notes[0]
    assert s.grid.scalar(16)[0] == pytest.approx(float(mhc_sol(sysm, "post", 16, hidden=64, hc_mult=2, sinkhorn_iters=20)))
    with pytest.raises(InvalidInputError):
        resolve_mhc(db, "middle", hidden=64, hc_mult=4, sinkhorn_iters=20)


def test_mhc_sol_by_hand(db):
    sysm = db.system
    from infercast.interp import sol

    v = mhc_sol(sysm, "post", 10, hidden=8, hc_mult=2, sinkhorn_iters=3, sites=2)
    nbytes = (2 * 2 + 1) * 8 * 2
    flops = 3 * 2 * 8 + 2 * 2 * 2 * 8
    expect = max(2 * 10 * flops / sol._flops(sysm, "bfloat16"), 2 * 10 * nbytes / sysm.gpu.effective_mem_bw) * 1e3
    assert float(v) == pytest.approx(expect + sysm.gpu.mem_latency_s * 1e3)


# ---- spec, plan, memory ---------------------------------------------------------------------------


def _spec(**over) -> ModelSpec:
    return build_spec(ModelConfig("x/dsv4", "x/dsv4", _cfg(**over)))


def test_spec():
    s = _spec()
    d = s.dsv4
    assert s.family == "deepseek_v4" and s.num_layers == 6 and s.num_kv_heads == 1 and s.head_dim == 32
    assert d.compress_ratios == (0, 4, 128, 4, 128, 0) and d.mtp_ratios == (4,)
    assert (d.count("window"), d.count("csa"), d.count("hca")) == (2, 2, 2)
    assert (s.moe.experts, s.moe.topk, s.moe.inter, s.moe.shared_inter) == (8, 2, 32, 32)
    assert (s.quant.gemm, s.quant.moe, s.quant.kv_cache) == ("fp8_block", "mxfp4", "fp8")
    assert ModelSpec.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    # MTP layers default to window-only when the list stops at the decoder
    assert _spec(compress_ratios=[0, 4, 128, 4, 128, 0]).dsv4.mtp_ratios == (0,)
    nv = build_spec(ModelConfig("x/nv", "x/nv", _cfg(), hf_quant={"quantization": {
        "quant_algo": "MIXED_PRECISION", "quantized_layers": {f"layers.{i}.ffn.experts": {"quant_algo": "NVFP4"}
                                                              for i in range(6)}}}))
    assert (nv.quant.gemm, nv.quant.moe) == ("fp8_block", "nvfp4")
    with pytest.raises(InvalidInputError, match="compress_ratios"):
        _spec(compress_ratios=[4, 128])
    with pytest.raises(InvalidInputError, match="o_groups"):
        _spec(o_groups=3)
    with pytest.raises(InvalidInputError, match="one KV head"):
        _spec(num_key_value_heads=2)


def test_plan():
    s = _spec()
    ops = {o.name: o for o in build_plan(s, ParallelConfig(tp=2)).ops}
    assert (ops["attention_window"].count, ops["attention_csa4"].count, ops["attention_hca128"].count) == (2, 2, 2)
    w = ops["attention_window"].params
    assert (w["kind"], w["ratio"], w["heads"], w["o_groups"], w["tp"]) == ("hca", 128, 8, 2, 2)
    assert ops["attention_csa4"].params["kind"] == "csa" and ops["attention_csa4"].params["ratio"] == 4
    assert ops["mhc_pre"].count == 6 and ops["mhc_post"].params["which"] == "post"
    assert ops["router_gemm"].count == 4  # the 2 hash-routed layers have no gate
    assert ops["moe_experts"].count == 6 and ops["moe_experts"].params["quant"] == "mxfp4"
    assert ops["shared_gate_up_gemm"].params["n"] == 2 * 32 // 2
    plan = build_plan(s, ParallelConfig(tp=1), SpecDecode(nextn=2))
    assert Plan.from_json(plan.to_json()) == plan  # the family's spec part survives a plan file
    mtp = {o.name: o for o in plan.ops}
    assert mtp["mtp_attention_csa4"].count == 2 and mtp["mtp_attention_csa4"].phase == "decode"
    assert mtp["mtp_proj"].params["k"] == 128 and mtp["mtp_lm_head"].count == 2
    with pytest.raises(InvalidConfigError):
        build_plan(_spec(num_nextn_predict_layers=0, compress_ratios=[0, 4, 128, 4, 128, 0]), ParallelConfig(),
                   SpecDecode(nextn=1))


def test_kv_and_state_bytes_by_hand():
    s = _spec()
    entry = (32 - 8) * 1.0 + 8 * 2.0  # fp8 non-RoPE channels + bf16 RoPE channels
    csa = entry / 4 + (8 + 4) / 4  # + the indexer key (fp8 + one fp32 scale)
    hca = entry / 128
    assert kv_bytes_per_token(s, ParallelConfig()) == pytest.approx(2 * csa + 2 * hca)
    # two stages: ceil(6 / 2) = 3 of 6 layers at the average layer
    assert kv_bytes_per_token(s, ParallelConfig(pp=2)) == pytest.approx((2 * csa + 2 * hca) / 2)
    window = 8 * entry
    comp_csa = 2 * 4 * 2 * 32 * 4.0 + 2 * 4 * 2 * 8 * 4.0
    comp_hca = 2 * 128 * 1 * 32 * 4.0
    assert state_bytes_per_request(s, ParallelConfig()) == pytest.approx(6 * window + 2 * comp_csa + 2 * comp_hca)


# ---- real pack -----------------------------------------------------------------------------------


@pytest.mark.real_pack
def test_models_lists_the_family(capsys):
    from cli_helpers import run_cli

    rc, out, err = run_cli(capsys, ["models", "--json"])
    assert rc == 0, err
    text = out
    for mid in ("deepseek-ai/DeepSeek-V4-Flash", "deepseek-ai/DeepSeek-V4-Pro", "sgl-project/DeepSeek-V4-Flash-FP8",
                "sgl-project/DeepSeek-V4-Pro-FP8", "nvidia/DeepSeek-V4-Flash-NVFP4", "nvidia/DeepSeek-V4-Pro-NVFP4"):
        assert mid in text
    rows = json.loads(out)
    rows = rows if isinstance(rows, list) else rows.get("models", [])
    dsv4 = [r for r in rows if "DeepSeek-V4" in json.dumps(r)]
    assert len(dsv4) == 6 and all(r.get("supported", True) is True for r in dsv4)


@pytest.mark.real_pack
@pytest.mark.parametrize("system,backend,version", [("h200_sxm", "sglang", "0.5.14"), ("h200_sxm", "vllm", "0.24.0"),
                                                    ("b200_sxm", "sglang", "0.5.14"), ("b200_sxm", "vllm", "0.24.0"),
                                                    ("b200_sxm", "trtllm", "1.3.0rc23")])
def test_estimate_real_pack(capsys, system, backend, version):
    from cli_helpers import run_cli

    rc, out, err = run_cli(capsys, ["estimate", "--model", "deepseek-ai/DeepSeek-V4-Flash", "--system", system,
                                    "--backend", backend, "--backend-version", version, "--tp", "4", "--moe-ep", "4",
                                    "--batch", "4", "--isl", "2048", "--osl", "128", "--json"])
    assert rc == 0, err
    d = json.loads(out)
    assert d["fits"] and np.isfinite(d["ttft_ms"]) and d["ttft_ms"] > 0 and d["tpot_ms"] > 0
    ops = {o["op"]: o for o in d["breakdown"]}
    assert ops["attention_csa4"]["count"] == 21 and ops["attention_hca128"]["count"] == 20
    assert ops["attention_window"]["count"] == 2 and ops["mhc_pre"]["count"] == 43
    src = ops["attention_csa4"]["source"]
    assert (src["context"]["source"], src["generation"]["source"]) == ("dsv4_csa_context_module", "dsv4_csa_generation_module")
    assert ops["mhc_post"]["source"]["source"] == "mhc_module"
    assert d["versions"]["tables"]["dsv4_hca_context_module"].startswith(version)


@pytest.mark.real_pack
def test_no_table_is_a_one_line_refusal(capsys):
    from cli_helpers import assert_one_line_error, run_cli

    # h200 TensorRT-LLM collected no DeepSeek-V4 attention module
    rc, out, err = run_cli(capsys, ["estimate", "--model", "deepseek-ai/DeepSeek-V4-Flash", "--system", "h200_sxm",
                                    "--backend", "trtllm", "--tp", "4", "--batch", "4", "--isl", "1024", "--osl", "128"])
    assert_one_line_error(rc, out, err, "DeepSeek-V4")


@pytest.mark.real_pack
def test_search_and_disaggregated_serving_real_pack(capsys):
    from cli_helpers import run_cli

    base = ["--model", "deepseek-ai/DeepSeek-V4-Flash", "--system", "b200_sxm", "--backend", "vllm", "--isl", "1024",
            "--osl", "128", "--json"]
    rc, out, err = run_cli(capsys, ["search", *base, "--max-gpus", "4", "--mode", "agg", "--concurrency", "8", "--top", "2"])
    assert rc == 0, err
    front = json.loads(out)["frontier"]
    assert front and all(r["tpot_ms"] > 0 and r["ttft_ms"] > 0 for r in front)
    rc, out, err = run_cli(capsys, ["serve-disagg", *base, "--concurrency", "16", "--prefill-workers", "1",
                                    "--prefill-tp", "2", "--decode-workers", "1", "--decode-tp", "2"])
    assert rc == 0, err
    d = json.loads(out)
    assert d["ttft_ms"] > 0 and d["tpot_ms"] > 0


@pytest.mark.real_pack
@pytest.mark.parametrize("backend,version,offset", [("sglang", "0.5.14", 0), ("vllm", "0.24.0", 1)])
def test_real_cells_reproduced(backend, version, offset):
    """Collected cells come back exactly: context at no prefix, generation at step = cached tokens
    (vLLM's rows count the decoded token)."""
    import pandas as pd

    from infercast.data.model_configs import resolve_model

    db = OpDB(PerfData.open("h200_sxm", backend, version))
    dims = dims_of_config(resolve_model(db.data.pack, "deepseek-ai/DeepSeek-V4-Flash").config)
    for phase, query, pick in (("context", (4, 1024), {"step": 0, "batch_size": 4, "isl": 1024}),
                               ("generation", (8, 4096 - offset), {"batch_size": 8, "step": 4096})):
        r = resolve_dsv4_attention(db, phase, kind="csa", ratio=4, dims=dims, heads=16, o_groups=2, gemm_quant="fp8_block",
                                   kv_quant="fp8", tp=4, model_id="deepseek-ai/DeepSeek-V4-Flash")
        t = pd.read_parquet(db.data.table(f"dsv4_csa_{phase}_module").path)
        sel = (t.model == "sgl-project/DeepSeek-V4-Flash-FP8") & (t.gemm_type == "fp8_block") & (t.num_heads == 16) & (t.tp_size == 4)
        for k, v in pick.items():
            sel &= t[k] == v
        assert sel.sum() == 1
        assert r.grid.scalar(*query)[0] == pytest.approx(float(t.latency[sel].iloc[0]))
