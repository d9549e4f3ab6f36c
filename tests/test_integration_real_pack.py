"""Integration on the real aiconfigurator-core pack (skipped when it is not installed).

One module-scoped sweep builds every Estimator once (dense models x systems x backends x TP) and
records a static estimate at batch 8, isl 2048, osl 256; the tests then check sanity properties
over the whole table and report every offending row at once.
"""

from __future__ import annotations

import json
import math

import pytest

from infercast import Estimator
from infercast.cli.main import main
from infercast.data.model_configs import resolve_model
from infercast.data.pack import find_pack
from infercast.errors import InfercastError
from infercast.models.spec import build_spec

pytestmark = pytest.mark.real_pack

MODELS = ["meta-llama/Meta-Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-70B", "Qwen/Qwen3-32B", "Qwen/Qwen3-32B-FP8"]
SYSTEMS = ["h100_sxm", "h200_sxm", "b200_sxm"]
BACKENDS = ["trtllm", "vllm", "sglang"]
TPS = [1, 2, 4, 8]
BATCH, ISL, OSL = 8, 2048, 256
#: doubling TP may cost at most this much TTFT (more GPUs should not be much slower)
TP_SLACK = 1.15


@pytest.fixture(scope="module")
def sweep(real_pack_available):
    rows = {}
    for system in SYSTEMS:
        for backend in BACKENDS:
            for model in MODELS:
                for tp in TPS:
                    key = (system, backend, model, tp)
                    try:
                        est = Estimator(model, system, backend, tp=tp)
                        rows[key] = est.static(BATCH, ISL, OSL, breakdown=False)
                    except InfercastError as exc:
                        rows[key] = exc
    return rows


def _table(rows) -> str:
    out = []
    for (system, backend, model, tp), r in sorted(rows.items()):
        if isinstance(r, Exception):
            cell = f"ERROR {type(r).__name__}: {r}"
        elif not r.fits:
            cell = f"does not fit ({r.memory_gb_per_gpu:.1f} GB)"
        else:
            cell = f"ttft {r.ttft_ms:9.2f}  tpot {r.tpot_ms:7.3f}"
        out.append(f"{system:9s} {backend:7s} {model:32s} tp{tp}  {cell}")
    return "\n".join(out)


def test_every_estimate_is_sane(sweep):
    problems = []
    for key, r in sweep.items():
        if isinstance(r, Exception):
            problems.append(f"{key}: raised {type(r).__name__}: {r}")
            continue
        if not r.fits:
            if r.ttft_ms is not None or not any("does not fit" in n for n in r.notes):
                problems.append(f"{key}: fits=False but ttft={r.ttft_ms} notes={r.notes}")
            continue
        for name in ("ttft_ms", "tpot_ms", "tokens_per_s_per_gpu", "memory_gb_per_gpu"):
            v = getattr(r, name)
            if not (isinstance(v, float) and math.isfinite(v) and v > 0):
                problems.append(f"{key}: {name}={v!r}")
        if r.ttft_ms is not None and r.tpot_ms is not None and not r.tpot_ms < r.ttft_ms:
            problems.append(f"{key}: tpot {r.tpot_ms:.3f} >= ttft {r.ttft_ms:.3f} at isl {ISL}")
        if r.memory_gb_per_gpu > r.memory["capacity_gb"]:
            problems.append(f"{key}: fits but uses {r.memory_gb_per_gpu:.1f} GB of {r.memory['capacity_gb']:.1f}")
    assert not problems, "\n".join(problems) + "\n\n" + _table(sweep)


def test_ttft_does_not_grow_when_tp_doubles(sweep):
    problems = []
    for system in SYSTEMS:
        for backend in BACKENDS:
            for model in MODELS:
                for tp in TPS[:-1]:
                    a, b = sweep[(system, backend, model, tp)], sweep[(system, backend, model, 2 * tp)]
                    if isinstance(a, Exception) or isinstance(b, Exception) or not (a.fits and b.fits):
                        continue
                    if b.ttft_ms > TP_SLACK * a.ttft_ms:
                        problems.append(
                            f"{system} {backend} {model}: ttft tp{tp} {a.ttft_ms:.1f} -> tp{2 * tp} {b.ttft_ms:.1f}"
                        )
    assert not problems, "\n".join(problems)


def test_everything_fits_at_tp8_and_70b_does_not_fit_one_h100(sweep):
    for system in SYSTEMS:
        for backend in BACKENDS:
            for model in MODELS:
                r = sweep[(system, backend, model, 8)]
                assert not isinstance(r, Exception) and r.fits, (system, backend, model, r)
    r = sweep[("h100_sxm", "trtllm", "meta-llama/Meta-Llama-3.1-70B", 1)]
    assert r.fits is False
    assert 135 < r.memory["weights_gb"] < 145  # ~70.6e9 bf16 parameters


def test_fp8_prefill_faster_than_bf16(sweep):
    bf16 = sweep[("h200_sxm", "trtllm", "Qwen/Qwen3-32B", 1)]
    fp8 = sweep[("h200_sxm", "trtllm", "Qwen/Qwen3-32B-FP8", 1)]
    assert bf16.fits and fp8.fits
    assert fp8.ttft_ms < bf16.ttft_ms
    assert fp8.quant["gemm"] == "fp8_block" and bf16.quant["gemm"] == "bfloat16"
    assert fp8.memory["weights_gb"] < 0.6 * bf16.memory["weights_gb"]


def test_faster_gpu_is_faster(sweep):
    """B200 prefill beats H100 for the same model/backend/TP (2x+ the dense FLOPs)."""
    problems = []
    for backend in BACKENDS:
        for model in MODELS:
            for tp in TPS:
                h, b = sweep[("h100_sxm", backend, model, tp)], sweep[("b200_sxm", backend, model, tp)]
                if isinstance(h, Exception) or isinstance(b, Exception) or not (h.fits and b.fits):
                    continue
                if not b.ttft_ms < h.ttft_ms:
                    problems.append(f"{backend} {model} tp{tp}: b200 {b.ttft_ms:.1f} vs h100 {h.ttft_ms:.1f}")
    assert not problems, "\n".join(problems)


def test_reported_versions_are_the_current_slots(sweep):
    r = sweep[("h200_sxm", "trtllm", "Qwen/Qwen3-32B", 2)]
    assert r.backend_version == r.versions["slots"]["current"]
    assert {"gemm", "context_attention", "generation_attention"} <= set(r.versions["tables"])


# ---------------------------------------------------------------------------------------------
# model aliases on the real pack
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "asked,resolved,quant",
    [
        ("meta-llama/Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B", None),
        ("nvidia/Qwen3-32B-NVFP4", "Qwen/Qwen3-32B", "nvfp4"),
        # the NVFP4 export of an fp8 checkpoint is nvfp4, experts included (was served as fp8_block)
        ("nvidia/DeepSeek-R1-NVFP4", "deepseek-ai/DeepSeek-R1", "nvfp4"),
        ("zhipuai/GLM-5", "zai-org/GLM-5", None),
        ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B", None),
        ("Qwen/Qwen3-32B", "Qwen/Qwen3-32B", None),
    ],
)
def test_real_model_aliases(real_pack_available, asked, resolved, quant):
    pack = find_pack()
    mc = resolve_model(pack, asked)
    assert mc.resolved_id == resolved
    assert mc.quant_from_alias == quant
    if asked == resolved:
        assert mc.alias_note is None
    else:
        assert mc.alias_note and asked in mc.alias_note and resolved in mc.alias_note
    if quant:
        assert quant in mc.alias_note
        q = build_spec(mc).quant
        assert q.gemm == quant and q.moe in (None, quant)


def test_real_pack_is_found_without_arguments(real_pack_available):
    pack = find_pack()
    assert pack.origin == "installed aiconfigurator-core"
    assert (pack.systems_dir / "h200_sxm.yaml").is_file()
    assert pack.model_configs_dir is not None


def test_alias_note_reaches_static_result(real_pack_available):
    r = Estimator("meta-llama/Llama-3.1-8B-Instruct", "h200_sxm", "trtllm").static(1, 128, 8, breakdown=False)
    assert r.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert any("Meta-Llama-3.1-8B" in n for n in r.notes)


# ---------------------------------------------------------------------------------------------
# listing commands
# ---------------------------------------------------------------------------------------------
def test_cli_systems_json(real_pack_available, capsys):
    assert main(["systems", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["origin"] == "installed aiconfigurator-core"
    rows = {(r["system"], r["backend"]): r for r in d["systems"]}
    for be in BACKENDS:
        assert ("h200_sxm", be) in rows
        assert rows[("h200_sxm", be)]["slots"]["current"] in rows[("h200_sxm", be)]["collected"]


def test_cli_models_json(real_pack_available, capsys):
    assert main(["models", "--json"]) == 0
    rows = {r["model"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["Qwen/Qwen3-32B"]["supported"] is True
    assert rows["Qwen/Qwen3-32B"]["architecture"] == "Qwen3ForCausalLM"
    assert rows["meta-llama/Meta-Llama-3.1-70B"]["supported"] is True
    assert rows["deepseek-ai/DeepSeek-V3"]["supported"] is True
    assert rows["deepseek-ai/DeepSeek-V4-Flash"]["supported"] is True


def test_cli_tables_print_whole_values_when_piped(real_pack_available, capsys):
    """Printed to a pipe (rich's 80 columns), the tables fold long cells onto further lines instead
    of cutting them: every model id of `models` and every op name of `estimate --explain` shows in
    full, so what a user copies from the output is a valid argument."""
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    assert main(["models", "--json"]) == 0
    ids = [r["model"] for r in json.loads(capsys.readouterr().out)]
    printed: list[str] = []  # the model column, a folded cell's continuation lines rejoined
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) != 3:
            continue
        if cells[2]:  # a row's first line carries its "supported" cell
            printed.append(cells[0])
        elif printed:
            printed[-1] += cells[0]
    assert printed == ids
    assert main(["estimate", "--model", "deepseek-ai/DeepSeek-V3", "--system", "h200_sxm", "--backend", "trtllm",
                 "--tp", "8", "--batch", "8", "--isl", "1000", "--osl", "100", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out
    # --explain prints at least 140 columns, so a typical source (table, version, kernel, how)
    # reads on one line rather than folded over several
    assert any(len(line) >= 140 for line in out.splitlines())
    assert any("exact" in line and "gemm" in line and "│" in line for line in out.splitlines())


def test_cli_estimate_real_pack(real_pack_available, capsys):
    argv = ["estimate", "--model", "Qwen/Qwen3-32B", "--system", "h200_sxm", "--backend", "vllm",
            "--tp", "2", "--batch", "8", "--isl", "2048", "--osl", "256", "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    direct = Estimator("Qwen/Qwen3-32B", "h200_sxm", "vllm", tp=2).static(8, 2048, 256, breakdown=False)
    assert d["ttft_ms"] == direct.ttft_ms and d["tpot_ms"] == direct.tpot_ms


def test_cli_serve_json(real_pack_available, capsys):
    argv = ["serve", "--model", "Qwen/Qwen3-32B-FP8", "--system", "h200_sxm", "--backend", "vllm", "--tp", "2",
            "--concurrency", "32", "--isl", "2000", "--osl", "200", "--json"]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["concurrency"] == 32 and d["concurrency_per_rank"] == 32
    assert 0 < d["tpot_ms"] < d["ttft_ms"] < d["request_latency_ms"]
    # more clients: the decode batch grows, each token comes slower, each GPU does more
    assert main(argv[:-7] + ["--concurrency", "128", "--isl", "2000", "--osl", "200", "--json"]) == 0
    d2 = json.loads(capsys.readouterr().out)
    assert d2["tpot_ms"] > d["tpot_ms"] and d2["tokens_per_s_per_gpu"] > d["tokens_per_s_per_gpu"]


def test_cli_serve_attention_dp_counts_the_clients_there_are(real_pack_available, capsys):
    """Attention DP 8: one client keeps one rank busy and seven idle; the busiest rank's
    latencies stand for it, the throughput per GPU is an eighth of eight clients' (which share
    the same per-rank load)."""
    base = ["serve", "--model", "deepseek-ai/DeepSeek-V3", "--system", "h200_sxm", "--backend", "trtllm", "--tp", "1",
            "--attention-dp", "8", "--moe-ep", "8", "--isl", "1000", "--osl", "100", "--json", "--concurrency"]
    out = {}
    for c in (1, 8, 9):
        assert main([*base, str(c)]) == 0
        out[c] = json.loads(capsys.readouterr().out)
    assert out[1]["concurrency_per_rank"] == out[8]["concurrency_per_rank"] == 1 and out[9]["concurrency_per_rank"] == 2
    assert out[1]["ttft_ms"] == out[8]["ttft_ms"] and out[1]["tpot_ms"] == out[8]["tpot_ms"]
    assert out[1]["tokens_per_s_per_gpu"] == pytest.approx(out[8]["tokens_per_s_per_gpu"] / 8, rel=1e-12)
    # nine clients: two on the busiest rank (sixteen's latencies), nine sixteenths of its throughput
    assert main([*base, "16"]) == 0
    sixteen = json.loads(capsys.readouterr().out)
    assert out[9]["tpot_ms"] == sixteen["tpot_ms"]
    assert out[9]["tokens_per_s_per_gpu"] == pytest.approx(sixteen["tokens_per_s_per_gpu"] * 9 / 16, rel=1e-12)


def test_trtllm_fp8_gemm_host_floor_is_removed(real_pack_available):
    """TensorRT-LLM's fp8 torch_flow GEMM rows floor ~12 us on every GPU (host overhead); the
    excess over the sibling backends' floor is subtracted, other tables are left alone."""
    import numpy as np

    from infercast.data.database import PerfData
    from infercast.ops import gemm as gemm_ops
    from infercast.ops.base import OpDB

    db = OpDB(PerfData.open("h200_sxm", "trtllm"))
    t = db.data.table("gemm")
    mask = t.mask(gemm_dtype="fp8")
    excess, floor, sibling = gemm_ops.host_floor_excess(db, t, mask, "fp8")
    assert 0.005 < excess < 0.010 and floor > gemm_ops.HOST_FLOOR_RATIO * (floor - excess)
    assert sibling.split()[0] in ("sglang", "vllm")
    r = gemm_ops.resolve_gemm(db, "fp8", 8192, 8192)
    assert any("host overhead" in n for n in r.notes)
    row = mask & (t.keys["m"] == 1) & (t.keys["n"] == 8192) & (t.keys["k"] == 8192)
    want = max(float(t.latency[row][0]) - excess, floor - excess)
    assert float(r.grid(1.0)[0]) == pytest.approx(want, rel=1e-12)
    # a table at its siblings' floor is untouched (vLLM fp8 on the same GPU)
    dbv = OpDB(PerfData.open("h200_sxm", "vllm"))
    tv = dbv.data.table("gemm")
    assert gemm_ops.host_floor_excess(dbv, tv, tv.mask(gemm_dtype="fp8"), "fp8")[0] == 0.0
    assert not any("host overhead" in n for n in gemm_ops.resolve_gemm(dbv, "fp8", 8192, 8192).notes)
    assert np.isfinite(excess)


def test_trtllm_nvfp4_gemm_decode_gap_borrows_sibling(real_pack_available):
    """TensorRT-LLM's nvfp4 GEMM rows run near their own bf16 time at decode sizes and 1.6-1.8x
    SGLang's nvfp4 kernels on the same GPU: SGLang's table answers for them. vLLM's nvfp4 rows
    (well under bf16) and TensorRT-LLM's fp8 rows (host floor removed) keep their own."""
    from infercast.data.database import PerfData
    from infercast.ops import gemm as gemm_ops
    from infercast.ops.base import OpDB

    db = OpDB(PerfData.open("b200_sxm", "trtllm"))
    t = db.data.table("gemm")
    ratio, sib = gemm_ops.decode_gap(db, t, t.mask(gemm_dtype="nvfp4"), "nvfp4")
    assert ratio > gemm_ops.DECODE_GAP_RATIO and sib[0] == "sglang"
    r = gemm_ops.resolve_gemm(db, "nvfp4", 8192, 8192)
    assert r.kernel.startswith("sglang:") and any("decode sizes" in n for n in r.notes)
    st = sib[2]
    row = st.mask(gemm_dtype="nvfp4") & (st.keys["m"] == 16) & (st.keys["n"] == 8192) & (st.keys["k"] == 8192)
    assert float(r.grid(16.0)[0]) == pytest.approx(float(st.latency[row].min()), rel=1e-9)
    dbv = OpDB(PerfData.open("b200_sxm", "vllm"))
    assert dbv.data.table("gemm").mask(gemm_dtype="nvfp4").any()
    assert not gemm_ops.resolve_gemm(dbv, "nvfp4", 8192, 8192).kernel.startswith("sglang:")
    assert not gemm_ops.resolve_gemm(db, "fp8", 8192, 8192).kernel.startswith("sglang:")


def test_sglang_wide_ep_reads_deepep_expert_table(real_pack_available):
    """SGLang with attention DP x EP runs the DeepEP expert block: the wide-EP table answers where
    it holds the exact site and pair; without attention DP (or on TensorRT-LLM) the standard
    MoE table does; a pair the wide-EP table lacks falls back with a note."""
    import numpy as np

    from infercast.api import Estimator
    from infercast.data.database import PerfData
    from infercast.ops import moe as moe_ops
    from infercast.ops.base import OpDB

    def moe_src(est):
        return next(o.source for o in est.breakdown(4, 1024, 8) if o.op == "moe_experts")

    wide = Estimator("deepseek-ai/DeepSeek-V3", "gb200", "sglang", None, 1, 1, attention_dp=32, moe_ep=32, moe_tp=1)
    src = moe_src(wide)  # DeepEP's normal mode for prompt tokens, low-latency for decode steps
    assert src["generation"]["source"] == moe_ops.WIDE_EP_TABLE and src["generation"]["kernel"] == "deepepmoe"
    assert src["context"]["source"] == moe_ops.WIDE_EP_CONTEXT_TABLE and src["context"]["kernel"] == "deepepmoe"
    db = OpDB(PerfData.open("gb200", "sglang"))
    for phase, stem in (("generation", moe_ops.WIDE_EP_TABLE), ("context", moe_ops.WIDE_EP_CONTEXT_TABLE)):
        t = db.table_or_none(stem)
        row = (t.mask(moe_dtype="fp8_block", distribution="power_law_1.01") & (t.keys["moe_ep_size"] == 32)
               & (t.keys["num_tokens"] == 1024) & (t.keys["hidden_size"] == 7168))
        r = moe_ops.resolve_moe(db, quant="fp8_block", hidden=7168, inter=2048, topk=8, experts=256, moe_tp=1, moe_ep=32,
                                distribution="power_law_1.01", wide_ep=True, phase=phase)
        assert r.source == stem and float(r.grid(1024.0)[0]) == pytest.approx(float(t.latency[row][0]), rel=1e-9)
    # the engine reads the context table in a step with prompt tokens, the generation one otherwise
    moe_op = next(c for c in wide.engine.ops if c.name == "moe_experts")
    tokens = 32.0 * moe_op.x_per_token
    ctx = wide.engine.components(ctx_batch=1, ctx_isl=32)["moe_experts"][0]
    dec = wide.engine.components(dec_batch=32, dec_kv=1024)["moe_experts"][0]
    assert float(ctx) == pytest.approx(float(moe_op.resolved[0].grid(tokens)[0]) * moe_op.op.count, rel=1e-12)
    assert float(dec) == pytest.approx(float(moe_op.resolved[1].grid(tokens)[0]) * moe_op.op.count, rel=1e-12)
    assert float(ctx) > float(dec)
    assert wide.engine.prefill_scalar(1, 32) == pytest.approx(float(wide.engine.step_ms(ctx_batch=1, ctx_isl=32)), rel=1e-9)
    assert wide.engine.decode_scalar(32, 1024) == pytest.approx(float(wide.engine.step_ms(dec_batch=32, dec_kv=1024)), rel=1e-9)
    assert moe_src(Estimator("deepseek-ai/DeepSeek-V3", "b200_sxm", "sglang", None, 8, 1, moe_ep=8, moe_tp=1))["source"] == "moe"
    trt = Estimator("deepseek-ai/DeepSeek-V3", "gb200", "trtllm", None, 1, 1, attention_dp=32, moe_ep=32, moe_tp=1)
    assert moe_src(trt)["source"] != moe_ops.WIDE_EP_TABLE
    # EP8 is not in gb200's wide-EP tables: latency a + b / EP through EP4 and EP16, said so
    kw = {"quant": "fp8_block", "hidden": 7168, "inter": 2048, "topk": 8, "experts": 256, "moe_tp": 1,
          "distribution": "power_law_1.01", "wide_ep": True}
    r8 = moe_ops.resolve_moe(db, moe_ep=8, **kw)
    assert r8.source == moe_ops.WIDE_EP_TABLE and r8.how == "ep-transfer" and r8.donors == ("EP4", "EP16")
    assert any("1/EP part through EP4 and EP16" in n for n in r8.notes)
    r4, r16 = (moe_ops.resolve_moe(db, moe_ep=e, **kw) for e in (4, 16))
    t = np.array([256.0, 512.0])
    l4, l8, l16 = (r.grid(t)[0] for r in (r4, r8, r16))
    # b = (l4 - l16) / (1/4 - 1/16), at EP8: l4 - b / 4 + b / 8 = (l4 + 2 l16) / 3 (above perfect scaling here)
    np.testing.assert_allclose(l8, (l4 + 2.0 * l16) / 3.0, rtol=1e-9)
    assert (l16 < l8).all() and (l8 < l4).all()
    # a moe_tp the table never collected: nothing to interpolate, standard kernels, said so
    r = moe_ops.resolve_moe(db, moe_ep=8, **{**kw, "moe_tp": 2})
    assert r.source == "moe" and any("no wide-EP" in n for n in r.notes)


def test_wide_ep_moe_communication_is_alltoall(real_pack_available):
    """SGLang's wide-EP path dispatches tokens to their experts' ranks (one all-to-all pair per MoE
    layer) instead of all-gathering every token to every rank; other backends keep the gather."""
    from infercast.api import Estimator
    from infercast.errors import InvalidInputError
    from infercast.models.plan import ParallelConfig

    wide = Estimator("deepseek-ai/DeepSeek-V3", "gb200", "sglang", None, 1, 1, attention_dp=32, moe_ep=32, moe_tp=1)
    names = {o.name: o for o in wide.plan.ops}
    assert wide.plan.parallel.moe_comm == "alltoall"
    assert "moe_dispatch" in names and "moe_allgather" not in names and "moe_reduce_scatter" not in names
    assert names["moe_dispatch"].count == names["moe_experts"].count and names["moe_dispatch"].params["ep"] == 32
    trt = Estimator("deepseek-ai/DeepSeek-V3", "gb200", "trtllm", None, 1, 1, attention_dp=32, moe_ep=32, moe_tp=1)
    tnames = {o.name for o in trt.plan.ops}
    assert trt.plan.parallel.moe_comm == "gather" and {"moe_allgather", "moe_reduce_scatter"} <= tnames
    # the dispatch costs less than gathering all 32 ranks' tokens to every rank
    g = next(o for o in trt.breakdown(128, 1024, 8) if o.op == "moe_allgather").decode_ms
    d = next(o for o in wide.breakdown(128, 1024, 8) if o.op == "moe_dispatch").decode_ms
    assert 0 < d < g
    with pytest.raises(InvalidInputError, match="MoE communication"):
        ParallelConfig(tp=1, attention_dp=2, moe_ep=2, moe_comm="ring").check(trt.plan.model)


def test_trtllm_gemm_site_short_of_its_siblings_is_extended(real_pack_available):
    """TensorRT-LLM's h200 fp8 GEMM table stops at m = 16384 for some shapes (n=32, k=65536) and
    at 32768 for the rest: the short site is carried out to 32768 by its siblings' trend (held),
    its measured points stay exact."""
    from infercast.data.database import PerfData
    from infercast.interp.provenance import Prov
    from infercast.ops import gemm as gemm_ops
    from infercast.ops.base import OpDB

    db = OpDB(PerfData.open("h200_sxm", "trtllm"))
    r = gemm_ops.resolve_gemm(db, "fp8", 32, 65536)
    assert r.how == "exact"
    axis = r.grid.axes[0]
    assert axis[-1] == 32768.0 and 16384.0 in axis
    v, p = r.grid([16384.0, 32768.0])
    assert p[0] == Prov.EXACT and p[1] == Prov.HELD
    # this shape streams its activations (m x k): twice the rows take about twice as long
    assert 1.5 < v[1] / v[0] < 2.5


def test_validate_gpu_count_row_takes_the_best_deployment_of_its_gpus(real_pack_available):
    """A gb200 DeepSeek-R1 row whose TP column (36) counts GPUs is predicted as the best
    deployment of exactly 36 GPUs at its concurrency, and says so; the static model refuses it."""
    import re

    from infercast.validate.cli import default_silicon_csv, make_predictor
    from infercast.validate.report import run_validation
    from infercast.validate.silicon import load_rows

    rid = "2026_04_06_deepseek_r1_gb200_trtllm_fp4_agg_1024x1024_c4_tp36_ep1_18"
    rows = [r for r in load_rows(default_silicon_csv()) if r.id == rid]
    assert len(rows) == 1 and rows[0].worker.tp == 36
    (res,) = run_validation(rows, make_predictor("serving"))
    assert res.error is None and 0 < res.ttft_ms < 1e4 and 0 < res.tpot_ms < 100
    assert "tp 36 is no TP degree: the best of" in res.note and "deployments of 36 GPUs at c4" in res.note
    layout = res.note.rsplit(", ", 1)[-1]
    gpus = 0
    for count, lay in re.findall(r"(\d+)x(\S+)", layout) or [(1, layout)]:
        dims = dict(re.findall(r"(?<![a-z])(tp|pp|dp)(\d+)", lay))  # not etp (expert TP)
        gpus += int(count) * int(dims.get("tp", 1)) * int(dims.get("pp", 1)) * int(dims.get("dp", 1))
    assert gpus == 36, layout
    (static,) = run_validation(rows, make_predictor("static"))
    assert static.error is not None and "not a power of two" in static.error


def test_validate_recipes_reach_the_estimator(real_pack_available):
    """Recipe settings a row does not carry reach the estimator the row is predicted with: the
    SGLang DeepSeek-R1 fp8 TP 4 recipe's static memory fraction (room for its 8k x 8 KV), the vLLM
    MiniMax-M2.5 v0.17.0 recipe's Triton experts (from vLLM's older b200 collection), expert
    parallelism and bf16 KV cache."""
    from infercast.validate.predict import EstimatorCache
    from infercast.validate.silicon import SiliconRow, WorkerSpec

    def row(backend, model, version, tp):
        return SiliconRow(id="x", backend=backend, backend_version=version, model=model, system="b200_sxm", mode="agg",
                          isl=8192, osl=1024, concurrency=8, gemm_quant="fp8", moe_quant="fp8", measured_ttft_ms=1.0,
                          measured_tpot_ms=1.0, worker=WorkerSpec(batch_size=8, tp=tp, moe_tp=tp, moe_ep=1))

    cache = EstimatorCache()
    sg = row("sglang", "deepseek-ai/DeepSeek-R1", "0.5.9", 4)
    est = cache.get(sg, sg.worker)
    assert est.backend.kv_memory_fraction == 0.95
    assert est.memory.kv_capacity_tokens > 8 * (8192 + 1024)
    vl = row("vllm", "MiniMaxAI/MiniMax-M2.5", "0.17.0", 2)
    est = cache.get(vl, vl.worker)
    assert (est.plan.parallel.ep, est.plan.parallel.etp) == (2, 1)
    assert est.spec.quant.kv_cache in (None, "bfloat16")
    moe = [c for c in est.engine.ops if c.op.kind == "moe"]
    assert moe and all("triton MoE kernels from vllm" in " ".join(c.resolved[0].notes) for c in moe)
    assert all(c.resolved[0].kernel == "vllm_fused_moe" for c in moe)


@pytest.mark.parametrize(
    "parallel,needles",
    [
        # moe_tp left to default: the message names the layout, not an internal 0
        (("--tp", "4", "--moe-ep", "8"), ("moe-ep 8 does not divide the 4 GPUs", "moe-ep=4")),
        (("--tp", "4", "--moe-tp", "2", "--moe-ep", "4"), ("moe_tp x moe_ep = 2 x 4 does not equal attention tp x dp = 4 x 1",)),
    ],
)
def test_cli_moe_layout_errors_name_the_layout(real_pack_available, capsys, parallel, needles):
    argv = ["estimate", "--model", "deepseek-ai/DeepSeek-V3", "--system", "b200_sxm", "--backend", "trtllm",
            *parallel, "--batch", "8", "--isl", "1024", "--osl", "128"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and " 0 x " not in err
    for needle in needles:
        assert needle in err
