"""MiniMax-M3: its config (sparse attention layers, dense / MoE layers, shared expert), the plan's
MSA op, the MSA module resolver (ops/msa.py) on synthetic tables whose latency is a power law
(exact under log-log interpolation), and estimates on the real pack."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from synthpack import SYSTEM, TRTLLM_CURRENT, make_pack

from infercast.data.database import PerfData
from infercast.data.model_configs import ModelConfig
from infercast.errors import InvalidInputError, NotAvailableError
from infercast.models.plan import ParallelConfig, SpecDecode, build_plan
from infercast.models.spec import build_spec
from infercast.ops.base import OpDB
from infercast.ops.msa import msa_sol, resolve_msa

HEADS = (16, 64)


def ctx_ms(b, isl, heads):
    return 1e-3 * b * isl * heads


def gen_ms(b, step, heads):
    return 1e-2 * b * step**0.5 * heads


def _msa_tables(data_dir):
    d = data_dir / "msa" / "trtllm" / TRTLLM_CURRENT
    d.mkdir(parents=True, exist_ok=True)
    for phase, curve, fn, steps in (("context", (1, 16, 64, 256), ctx_ms, (0, 128)),
                                    ("generation", (1, 15, 255, 4095), gen_ms, None)):
        rows = {k: [] for k in ("op_name", "kernel_source", "gemm_type", "kv_cache_dtype", "num_heads", "batch_size",
                                "isl", "step", "tp_size", "latency")}
        for gemm in ("bfloat16", "fp8_block"):
            for h in HEADS:
                for b in (1, 2, 8):
                    for x in curve:
                        for s in (steps or (None,)):
                            isl, step = (x, s) if phase == "context" else (1, x)
                            lat = fn(b, x, h) * (1.0 if gemm == "bfloat16" else 0.5) * (1.0 if not s else 7.0)
                            for k, v in zip(rows, (f"msa_{phase}_module", "default", gemm, "bfloat16", h, b, isl, step, 1, lat)):
                                rows[k].append(v)
        pq.write_table(pa.table(rows), d / f"msa_{phase}_module_perf.parquet")


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    pack = make_pack(tmp_path_factory.mktemp("msapack"))
    _msa_tables(pack.data_dir)
    return OpDB(PerfData.open(SYSTEM, "trtllm", TRTLLM_CURRENT, systems_path=pack.systems_dir))


KW = {"hidden": 64, "kv_heads": 1, "head_dim": 16, "topk_tokens": 32, "gemm_quant": "bfloat16", "kv_quant": "bfloat16"}


def test_exact_cells_and_loglog_interpolation(db):
    r = resolve_msa(db, "context", heads=16, **KW)
    assert r.source == "msa_context_module" and r.how == "exact" and r.kernel == "default"
    assert r.grid.scalar(2, 64)[0] == pytest.approx(ctx_ms(2, 64, 16))
    # step-0 rows only: the 7x prefix rows are not in the context curve
    assert r.grid.scalar(3, 100)[0] == pytest.approx(ctx_ms(3, 100, 16))
    g = resolve_msa(db, "generation", heads=64, **KW)
    assert g.grid.scalar(8, 255)[0] == pytest.approx(gen_ms(8, 255, 64))
    assert g.grid.scalar(4, 1000)[0] == pytest.approx(gen_ms(4, 1000, 64))


def test_quant_rows_are_kept_apart(db):
    r = resolve_msa(db, "context", heads=64, **{**KW, "gemm_quant": "fp8_block"})
    assert r.grid.scalar(8, 256)[0] == pytest.approx(0.5 * ctx_ms(8, 256, 64))
    with pytest.raises(NotAvailableError, match="nvfp4"):
        resolve_msa(db, "context", heads=64, **{**KW, "gemm_quant": "nvfp4"})
    with pytest.raises(NotAvailableError, match="fp8 KV cache"):
        resolve_msa(db, "generation", heads=64, **{**KW, "kv_quant": "fp8"})


def test_uncollected_heads_transfer_between_neighbours(db):
    r = resolve_msa(db, "context", heads=32, **KW)
    assert r.how != "exact" and r.donors
    v = r.grid.scalar(2, 64)[0]
    assert ctx_ms(2, 64, 16) < v < ctx_ms(2, 64, 64)


def test_bad_input(db):
    with pytest.raises(InvalidInputError):
        resolve_msa(db, "decode", heads=16, **KW)
    with pytest.raises(InvalidInputError):
        resolve_msa(db, "context", heads=0, **KW)


def test_sol_by_hand(db):
    sysm = db.system
    # context: 1 request of 4 tokens, top-k 2 keys: attended pairs 1 + 2 + 2 + 2 = 7
    v = msa_sol(sysm, "context", 1, 4, hidden=8, heads=2, kv_heads=1, head_dim=4, topk_tokens=2,
                weight_bytes=2.0, kv_bytes=2.0)
    w = 8 * (2 + 2) * 4 + 2 * 4 * 8
    flops = 2 * 4 * w / _flops(sysm) + 4 * 7 * 2 * 4 / _flops(sysm)
    nbytes = w * 2 + 4 * 2 * 1 * 4 * 2 + 4 * 4 * 8 + 4 * 4 * 2 * 4
    expect = max(flops, nbytes / sysm.gpu.effective_mem_bw) * 1e3 + sysm.gpu.mem_latency_s * 1e3
    assert float(v) == pytest.approx(expect)


def _flops(system):
    from infercast.interp import sol

    return sol._flops(system, "bfloat16")


# ---- config and plan ---------------------------------------------------------------------------


def _m3(**cfg) -> ModelConfig:
    c = {"architectures": ["MiniMaxM3ForCausalLM"], "hidden_size": 64, "num_attention_heads": 8,
         "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 5, "vocab_size": 1000,
         "intermediate_size": 24, "moe_intermediate_size": 24, "dense_intermediate_size": 96,
         "shared_intermediate_size": 24, "n_shared_experts": 1, "num_local_experts": 8, "num_experts_per_tok": 2,
         "moe_layer_freq": [0, 0, 1, 1, 1], "num_nextn_predict_layers": 1, "use_qk_norm": True,
         "sparse_attention_config": {"use_sparse_attention": True, "sparse_attention_freq": [0, 1, 1, 1, 1],
                                     "sparse_topk_blocks": 4, "sparse_block_size": 8}, **cfg}
    return ModelConfig("x/m3", "x/m3", c)


def test_spec():
    s = build_spec(_m3())
    assert s.family == "moe" and (s.msa_layers, s.msa_topk_tokens) == (4, 32)
    m = s.moe
    assert (m.experts, m.topk, m.inter, m.shared_inter, m.first_dense_layers, m.dense_inter) == (8, 2, 24, 24, 2, 96)
    assert s.qk_norm == "per_head" and s.mtp_layers == 1
    dense_only = build_spec(_m3(sparse_attention_config={"use_sparse_attention": False}))
    assert dense_only.msa_layers == 0
    with pytest.raises(InvalidInputError, match="sparse_attention_freq"):
        build_spec(_m3(sparse_attention_config={"use_sparse_attention": True, "sparse_attention_freq": [1, 1],
                                                "sparse_topk_blocks": 4, "sparse_block_size": 8}))
    with pytest.raises(InvalidInputError, match="multiple"):
        build_spec(_m3(num_key_value_heads=3))


def test_plan():
    ops = {o.name: o for o in build_plan(build_spec(_m3()), ParallelConfig(tp=2)).ops}
    msa = ops["msa"]
    assert msa.count == 4 and msa.kind == "msa"
    assert {k: msa.params[k] for k in ("heads", "kv_heads", "head_dim", "topk_tokens", "hidden", "tp")} == \
        {"heads": 4, "kv_heads": 1, "head_dim": 16, "topk_tokens": 32, "hidden": 64, "tp": 2}
    # the one dense-attention layer: q 4x16 + k, v 1x16 each per GPU
    assert (ops["qkv_gemm"].count, ops["qkv_gemm"].params["n"]) == (1, (4 + 2) * 16)
    assert ops["attention"].count == 1 and ops["qk_norm"].count == 1
    assert ops["dense_gate_up_gemm"].count == 2 and ops["moe_experts"].count == 3
    all_sparse = build_spec(_m3(sparse_attention_config={"use_sparse_attention": True, "sparse_attention_freq": 1,
                                                         "sparse_topk_blocks": 4, "sparse_block_size": 8}))
    names = {o.name for o in build_plan(all_sparse, ParallelConfig(tp=1)).ops}
    assert "msa" in names and "qkv_gemm" not in names and "attention" not in names
    mtp = {o.name: o for o in build_plan(build_spec(_m3()), ParallelConfig(tp=1), SpecDecode(nextn=1)).ops}
    assert mtp["mtp_msa"].count == 1 and mtp["mtp_msa"].phase == "decode"


# ---- real pack -----------------------------------------------------------------------------------


@pytest.mark.real_pack
@pytest.mark.parametrize("model,backend,version", [("MiniMaxAI/MiniMax-M3", "sglang", "0.5.16"),
                                                   ("MiniMaxAI/MiniMax-M3", "trtllm", "1.3.0rc23"),
                                                   ("nvidia/MiniMax-M3-NVFP4", "vllm", "0.24.0")])
def test_estimate_real_pack(capsys, model, backend, version):
    """b200 rows the pack's support matrix marks PASS for these models."""
    from cli_helpers import run_cli

    rc, out, err = run_cli(capsys, ["estimate", "--model", model, "--system", "b200_sxm", "--backend", backend,
                                    "--backend-version", version, "--tp", "8", "--moe-ep", "8", "--batch", "4",
                                    "--isl", "2048", "--osl", "128", "--json"])
    assert rc == 0, err
    d = json.loads(out)
    assert d["fits"] and np.isfinite(d["ttft_ms"]) and d["ttft_ms"] > 0 and d["tpot_ms"] > 0
    ops = {o["op"]: o for o in d["breakdown"]}
    assert ops["msa"]["count"] == 57 and ops["attention"]["count"] == 3
    src = ops["msa"]["source"]
    assert (src["context"]["source"], src["generation"]["source"]) == ("msa_context_module", "msa_generation_module")
    assert src["context"]["version"] == version
    assert d["versions"]["tables"]["msa_context_module"].startswith(version)
