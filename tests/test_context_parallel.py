"""Context parallelism (``--cp``) on the synthetic pack: the plan's CP ops, the sequence split of
token-wise ops, the zigzag per-rank attention, the K/V exchange and the decode combine from the
NCCL all-gather table, KV memory per GPU, and the refusals.

tiny-llama: hidden 256, 8 heads, 2 KV heads, head_dim 32, 2 layers (tests/synthpack.py). At TP 1
a token's K/V for one layer is 2 x 2 x 32 = 128 bf16 elements; a decoding token's partial output
and LSE over cp ranks are cp x (8 x 32 + 2 x 8) elements.
"""

from __future__ import annotations

import numpy as np
import pytest

import synthpack as sp
from infercast import Estimator
from infercast.engine.context_parallel import sharded_cached, zigzag_chunks, zigzag_context
from infercast.errors import InvalidConfigError, InvalidInputError
from infercast.models.plan import Plan
from infercast.ops.attention import prefixed_context

LAYERS = 2
KV_ELEMENTS = 2 * 2 * 32  # K and V, 2 KV heads of 32 at TP 1


def _est(synth, **kw):
    return Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir, **kw)


@pytest.fixture(scope="module")
def cp1(synth):
    return _est(synth)


@pytest.fixture(scope="module")
def cp2(synth):
    return _est(synth, cp=2)


@pytest.fixture(scope="module")
def cp4(synth):
    return _est(synth, cp=4)


def _op(e, name):
    hits = [c for c in e.engine.ops if c.name == name]
    assert len(hits) == 1, [c.name for c in e.engine.ops]
    return hits[0]


# ---- the split itself ----------------------------------------------------------------------------

def test_zigzag_chunks_pair_first_with_last():
    # isl 1024 over 2 ranks: 4 chunks of 256; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    assert zigzag_chunks(1024, 0, 2) == [((256.0, 0.0), (256.0, 768.0)), ((256.0, 256.0), (256.0, 512.0))]
    # a cached prefix shifts every chunk's earlier tokens
    assert zigzag_chunks(800, 100, 4)[0] == ((100.0, 100.0), (100.0, 800.0))
    # every rank owns the same query-key pairs: c (2 prefix + (2cp - 1) c) + c (c + 1)
    for isl, prefix, cp in ((1024, 0, 2), (4096, 512, 4), (96, 7, 8)):
        pairs = [sum(q * pre + q * (q + 1) / 2 for q, pre in ranks) for ranks in zigzag_chunks(isl, prefix, cp)]
        assert max(pairs) == pytest.approx(min(pairs), rel=1e-12)


def test_zigzag_context_takes_the_slowest_rank():
    calls = []

    def attend(b, q, pre):
        calls.append((float(q), float(pre)))
        return np.asarray(b * (q + pre) ** 2, float), np.asarray(int(pre > 600), np.int8)

    v, p = zigzag_context(attend, 1.0, 1024.0, 0.0, 2)
    assert sorted(calls) == [(256.0, 0.0), (256.0, 256.0), (256.0, 512.0), (256.0, 768.0)]
    # rank 0: 256^2 + 1024^2; rank 1: 512^2 + 768^2 -> rank 0 is slower
    assert float(v) == 256.0**2 + 1024.0**2 and int(p) == 1


def test_sharded_decode_reads_its_share():
    np.testing.assert_array_equal(sharded_cached([1.0, 2.0, 1025.0], 4), [1.0, 1.0, 256.0])


# ---- the plan ------------------------------------------------------------------------------------

def test_plan_cp1_has_no_cp_ops_and_cp2_adds_them(cp1, cp2):
    assert not any(o.kind in ("cp_exchange", "cp_combine") for o in cp1.plan.ops)
    assert cp1.plan.parallel.cp == 1 and cp1.gpus == 1
    ops = {o.name: o for o in cp2.plan.ops}
    ex, co = ops["cp_kv_exchange_attention"], ops["cp_combine_attention"]
    assert (ex.kind, ex.count, ex.params["elements_per_token"], ex.params["group"], ex.params["overlap"]) == \
        ("cp_exchange", LAYERS, KV_ELEMENTS, 2, False)
    assert (co.kind, co.count, co.params["elements_per_token"]) == ("cp_combine", LAYERS, 2 * (8 * 32 + 2 * 8))
    # apart from them, the one rank's plan is the cp 1 plan
    assert [o for o in cp2.plan.ops if not o.kind.startswith("cp_")] == list(cp1.plan.ops)
    # the plan round-trips through JSON with its CP degree
    back = Plan.from_json(cp2.plan.to_json())
    assert back.parallel.cp == 2 and back == cp2.plan


def test_cp1_is_the_unsplit_engine_bit_for_bit(synth, cp1):
    same = _est(synth, cp=1)
    for a, b in ((same.static(2, 1024, 64), cp1.static(2, 1024, 64)),):
        assert a.ttft_ms == b.ttft_ms and a.tpot_ms == b.tpot_ms and a.memory == b.memory
    assert same.plan.to_json() == cp1.plan.to_json()


# ---- prefill -------------------------------------------------------------------------------------

def test_tokenwise_ops_run_on_a_share_of_the_prompt(cp1, cp2, cp4):
    tokenwise = ("qkv_gemm", "o_gemm", "gate_up_gemm", "down_gemm", "input_norm", "activation")
    c2 = cp2.engine.components(ctx_batch=1.0, ctx_isl=1024.0, phase="prefill")
    c4 = cp4.engine.components(ctx_batch=1.0, ctx_isl=1024.0, phase="prefill")
    half = cp1.engine.components(ctx_batch=1.0, ctx_isl=512.0, phase="prefill")
    quarter = cp1.engine.components(ctx_batch=1.0, ctx_isl=256.0, phase="prefill")
    for name in tokenwise:
        assert float(c2[name][0]) == float(half[name][0])
        assert float(c4[name][0]) == float(quarter[name][0])
    # on the GEMM table's own grid: the formula at m = 512 tokens, per layer
    assert float(c2["o_gemm"][0]) == pytest.approx(LAYERS * sp.gemm_ms("bfloat16", 512, 256, 256), rel=1e-12)
    # the LM head still runs on the one last token of the sequence
    assert float(c2["lm_head"][0]) == float(cp1.engine.components(ctx_batch=1.0, ctx_isl=1024.0)["lm_head"][0])


def test_attention_is_the_slowest_rank_at_the_zigzag_lengths(cp1, cp2):
    grid = _op(cp2, "attention").resolved[0].grid

    def chunk(q, pre):
        return float(prefixed_context(grid, np.asarray(1.0), np.asarray(q), np.asarray(pre))[0])

    rank0 = chunk(256.0, 0.0) + chunk(256.0, 768.0)
    rank1 = chunk(256.0, 256.0) + chunk(256.0, 512.0)
    got = float(cp2.engine.components(ctx_batch=1.0, ctx_isl=1024.0, phase="prefill")["attention"][0])
    assert got == pytest.approx(LAYERS * max(rank0, rank1), rel=1e-12)
    # chunk 0 of rank 0 is the measured 256-token prefill; chunk 3 is 1024-token attention's share of pairs
    assert chunk(256.0, 0.0) == pytest.approx(sp.ctx_ms(1, 256, 8, 32), rel=1e-12)
    share = (256 * 768 + 256 * 257 / 2) / (1024 * 1025 / 2)
    assert chunk(256.0, 768.0) == pytest.approx(max(sp.ctx_ms(1, 1024, 8, 32) * share, sp.ctx_ms(1, 256, 8, 32)), rel=1e-12)
    # less than the unsplit prompt, more than half of it (the ranks' fixed costs and the imbalance)
    whole = float(cp1.engine.components(ctx_batch=1.0, ctx_isl=1024.0, phase="prefill")["attention"][0])
    assert whole / 2 < got < whole


def test_kv_exchange_is_an_all_gather_of_the_sequence(cp2, cp4):
    c2 = cp2.engine.components(ctx_batch=1.0, ctx_isl=1024.0, phase="prefill")
    # 1024 tokens x 128 elements = 2^17, on the NCCL table's grid
    assert float(c2["cp_kv_exchange_attention"][0]) == pytest.approx(
        LAYERS * sp.nccl_ms("all_gather", 1024 * KV_ELEMENTS, 2), rel=1e-12)
    c4 = cp4.engine.components(ctx_batch=2.0, ctx_isl=512.0, ctx_prefix=512.0, phase="prefill")
    # the cached prefix is gathered too (its KV is sharded over the ranks): 2 x 1024 tokens
    assert float(c4["cp_kv_exchange_attention"][0]) == pytest.approx(
        LAYERS * sp.nccl_ms("all_gather", 2 * 1024 * KV_ELEMENTS, 4), rel=1e-12)
    # no prompt tokens, no exchange
    assert float(cp2.engine.components(dec_batch=4.0, dec_kv=100.0)["cp_kv_exchange_attention"][0]) == 0.0


def test_overlapped_exchange_shows_only_its_excess(synth, cp2):
    ov = _est(synth, cp=2, cp_overlap=True)
    a = cp2.engine.components(ctx_batch=1.0, ctx_isl=1024.0, phase="prefill")
    b = ov.engine.components(ctx_batch=1.0, ctx_isl=1024.0, phase="prefill")
    e, att = float(a["cp_kv_exchange_attention"][0]), float(a["attention"][0])
    assert float(b["cp_kv_exchange_attention"][0]) == pytest.approx(max(e - att, 0.0), abs=1e-15)
    assert ov.prefill_ms(1, 1024) == pytest.approx(cp2.prefill_ms(1, 1024) - e + max(e - att, 0.0), rel=1e-12)


def test_scalar_and_array_paths_agree(cp2, cp4):
    for e in (cp2, cp4):
        for b, isl, pre in ((1, 1024, 0), (3, 640, 200), (2, 96, 0)):
            arr = sum(float(v) for v, _ in e.engine.components(ctx_batch=b, ctx_isl=isl, ctx_prefix=pre, phase="prefill").values())
            assert e.engine.prefill_scalar(float(b), float(isl), float(pre)) == pytest.approx(arr, rel=1e-12)
        for b, kv in ((1, 2000.0), (16, 129.0)):
            arr = sum(float(v) for v, _ in e.engine.components(dec_batch=b, dec_kv=kv, phase="decode").values())
            assert e.engine.decode_scalar(float(b), kv) == pytest.approx(arr, rel=1e-12)
            run = e.engine.decode_run_ms(float(b), np.linspace(kv, kv + 50, 9))
            assert run[0] == pytest.approx(arr, rel=1e-12)
        mixed = e.engine.mixed_step_ms([1.0], [512.0], [128.0], 4.0, 300.0)
        arr = sum(float(v) for v, _ in e.engine.components(ctx_batch=1.0, ctx_isl=512.0, ctx_prefix=128.0,
                                                           dec_batch=4.0, dec_kv=300.0).values())
        assert mixed == pytest.approx(arr, rel=1e-12)


# ---- decode --------------------------------------------------------------------------------------

def test_decode_reads_a_share_of_the_kv_and_combines(cp1, cp2):
    gen = _op(cp2, "attention").resolved[1].grid
    d2 = cp2.engine.components(dec_batch=4.0, dec_kv=2049.0, phase="decode")
    # 2048 cached tokens over 2 ranks: 1024 each
    assert float(d2["attention"][0]) == pytest.approx(LAYERS * float(gen(4.0, 1024.0)[0]), rel=1e-12)
    assert float(d2["attention"][0]) < float(cp1.engine.components(dec_batch=4.0, dec_kv=2049.0)["attention"][0])
    # the combine: 4 tokens x 2 ranks x (8 heads x 32 + 8 fp32 LSE) elements, an all-gather over 2 GPUs
    assert float(d2["cp_combine_attention"][0]) == pytest.approx(
        LAYERS * sp.nccl_ms("all_gather", 4 * 2 * (8 * 32 + 2 * 8), 2), rel=1e-9)
    # token-wise ops: the whole decode batch on every rank
    d1 = cp1.engine.components(dec_batch=4.0, dec_kv=2049.0, phase="decode")
    assert float(d2["gate_up_gemm"][0]) == float(d1["gate_up_gemm"][0])


# ---- memory and layout ---------------------------------------------------------------------------

def test_kv_per_gpu_is_split_and_gpus_counted(cp1, cp2, cp4):
    assert cp2.memory.kv_per_token == cp1.memory.kv_per_token / 2
    assert cp4.memory.kv_per_token == cp1.memory.kv_per_token / 4
    assert cp2.memory.weights == cp1.memory.weights
    assert (cp2.gpus, cp4.gpus) == (2, 4)
    assert cp4.layout_words == "4 GPUs: TP 1, 4 context-parallel ranks"
    r = cp2.static(1, 1024, 16)
    assert (r.gpus, r.cp) == (2, 2) and r.memory["kv_capacity_tokens"] >= 2 * cp1.memory.kv_capacity_tokens - 64


# ---- refusals ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("kw", "err", "needle"), [
    ({"cp": 3}, InvalidConfigError, "not a power of two"),
    ({"cp": 0}, InvalidInputError, "positive integer"),
    ({"cp": 2.5}, InvalidInputError, "positive integer"),
    ({"cp": 16}, InvalidConfigError, "NVLink domain"),  # 16 GPUs of CP on 8-GPU nodes
    ({"cp": 2, "cp_overlap": "yes"}, InvalidInputError, "cp_overlap"),
])
def test_bad_cp_is_refused(synth, kw, err, needle):
    with pytest.raises(err, match=needle):
        _est(synth, **kw).prefill_ms(1, 64)


def test_surfaces_refuse_cp(cp2):
    with pytest.raises(InvalidConfigError, match="context parallelism"):
        cp2.surface()


def test_simulator_step_timer_composes_the_cp_step(cp2):
    from infercast.serving.backends import scheduler_params
    from infercast.serving.simulate.timer import _KV_GRID, EngineStepTimer

    params = scheduler_params("trtllm", cp2.data.system, cp2.spec)
    timer = EngineStepTimer(cp2.engine, params)
    kv = float(_KV_GRID[_KV_GRID > 300][0])  # a grid point: no interpolation between KV lengths
    got = timer.step_ms([(512.0, 128.0)], 4, 4 * kv)
    want = params.step_ms(cp2.engine.mixed_step_ms([1.0], [512.0], [128.0], 4.0, kv), 5)
    assert got == pytest.approx(want, rel=1e-9)
