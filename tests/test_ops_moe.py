"""MoE ops: the routed-expert block (``moe_perf``) and its all-to-all (``moe_a2a_perf`` / NCCL).

(a) real pack (skipped when aiconfigurator-core is not installed): exact table values, the quant
alias and kernel rules, (moe_tp, moe_ep) gating, dispatch + combine and the NCCL fallback;
(b) synthetic: a tiny ``moe_perf`` (and ``moe_a2a_perf``) written next to the synthetic pack's
tables, with latencies from closed forms so exact hits, interpolation and transfer through
utilisation can be checked to rounding.
"""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import synthpack as sp
from infercast.data.database import PerfData
from infercast.data.quant import COMPUTE_DTYPE, WEIGHT_BYTES
from infercast.errors import InvalidInputError, NotAvailableError
from infercast.interp import sol
from infercast.interp.provenance import Prov
from infercast.ops.base import DatabaseMode, OpDB
from infercast.ops.comm import resolve_collective
from infercast.interp.grid import Grid
from infercast.ops.moe import (
    CONSISTENT_UTIL_FACTOR, FIXED_COST_FRACTION, TOKEN_SCALE, WIDE_EP_CONTEXT_TABLE, WIDE_EP_TABLE, _get_lattice, _wide_ep_quant_transfer,
    a2a_sol_fn, choose_donors, consistent_moe_donors, fixed_cost, moe_sol_fn, quant_candidates, resolve_moe, resolve_moe_dispatch,
    transfer_sites,
)

DSV3 = dict(hidden=7168, inter=2048, topk=8, experts=256)
GPT_OSS = dict(hidden=2880, inter=2880, topk=4, experts=128)
QWEN3_235B = dict(hidden=4096, inter=1536, topk=8, experts=128)
NEMOTRON_NANO = dict(hidden=2688, inter=1856, topk=6, experts=128)


# ----------------------------------------------------------------------------------------------
# speed of light
# ----------------------------------------------------------------------------------------------


def test_sol_touched_experts_and_gating(synth):
    from infercast.data.system import load_system
    from infercast.data.pack import find_pack

    system = load_system(find_pack(str(synth.systems_dir)), sp.SYSTEM)
    # one token touches exactly topk experts: topk/ep of them on this rank
    assert sol.moe_touched_experts(1, 8, 256, 8) == pytest.approx(1.0)
    assert sol.moe_touched_experts(1, 8, 256, 1) == pytest.approx(8.0)
    # many tokens touch every local expert
    assert sol.moe_touched_experts(1e6, 8, 256, 8) == pytest.approx(32.0)
    t = np.array([1.0, 16.0, 1024.0])
    _, m_g, _ = sol.moe(system, "bfloat16", 2.0, t, 1024, 512, 2, 8, 1, 1, gated=True)
    _, m_n, _ = sol.moe(system, "bfloat16", 2.0, t, 1024, 512, 2, 8, 1, 1, gated=False)
    np.testing.assert_allclose(m_g / m_n, 1.5)
    # EP splits the rows, TP splits the width: math per rank scales 1/(tp*ep)
    _, m_tp, _ = sol.moe(system, "bfloat16", 2.0, t, 1024, 512, 2, 8, 2, 1)
    _, m_ep, _ = sol.moe(system, "bfloat16", 2.0, t, 1024, 512, 2, 8, 1, 2)
    np.testing.assert_allclose(m_tp, m_g / 2)
    np.testing.assert_allclose(m_ep, m_g / 2)


# ----------------------------------------------------------------------------------------------
# (a) real pack
# ----------------------------------------------------------------------------------------------


def _db(system: str, backend: str, mode: str = "SILICON") -> OpDB:
    return OpDB(PerfData.open(system, backend), DatabaseMode.parse(mode))


def _raw_moe(db: OpDB, quant, hidden, inter, topk, experts, tp, ep, kernel, distribution="balanced"):
    """The parquet rows of one curve, read with pyarrow directly (no infercast reader)."""
    path = db.data.served["moe"].path
    t = pq.read_table(path)
    cols = {c: t.column(c).to_pylist() for c in
            ("moe_dtype", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size",
             "distribution", "kernel_source", "num_tokens", "latency")}
    want = (quant, hidden, inter, topk, experts, tp, ep, distribution, kernel)
    rows = [(n, lat) for *key, n, lat in zip(*cols.values()) if tuple(key) == want]
    rows.sort()
    assert rows, f"no raw rows for {want}"
    tokens = np.array([r[0] for r in rows], float)
    assert len(np.unique(tokens)) == len(tokens), "duplicate keys: compare medians instead"
    return tokens, np.array([r[1] for r in rows])


@pytest.mark.real_pack
def test_deepseek_v3_exact_and_monotone(real_pack_available):
    db = _db("h200_sxm", "trtllm")
    r = resolve_moe(db, quant="fp8_block", moe_tp=1, moe_ep=8, **DSV3)
    assert r.source == "moe" and r.how == "exact"
    assert r.version == "1.3.0rc20"
    tokens, lat = _raw_moe(db, "fp8_block", 7168, 2048, 8, 256, 1, 8, r.kernel)
    v, p = r.grid(tokens)
    np.testing.assert_array_equal(v, lat)
    assert (p == Prov.EXACT).all()
    # scalar path agrees
    for n, want in zip(tokens[::5], lat[::5]):
        assert r.grid.scalar(n)[0] == want
    q = np.unique(np.concatenate([np.geomspace(1, 65536, 300), tokens]))
    vq, pq_ = r.grid(q)
    assert np.all(np.diff(vq) >= 0), "latency must not fall as tokens grow"
    assert (pq_[q > tokens.max()] == Prov.HELD).all()


@pytest.mark.real_pack
def test_gpt_oss_quant_alias(real_pack_available):
    h200 = _db("h200_sxm", "trtllm")
    r = resolve_moe(h200, quant="w4a16_mxfp4", moe_tp=1, moe_ep=1, **GPT_OSS)
    assert r.how == "exact" and r.kernel == "moe_torch_flow"
    # the alias picks weight-only MXFP4 on Hopper (no FP4 tensor cores) ...
    assert quant_candidates(h200.system, "mxfp4")[0] == "w4a16_mxfp4"
    ra = resolve_moe(h200, quant="mxfp4", moe_tp=1, moe_ep=1, **GPT_OSS)
    np.testing.assert_array_equal(ra.grid.values, r.grid.values)
    assert any("w4a16_mxfp4" in n for n in ra.notes)
    # ... and MXFP4 x MXFP8 on Blackwell
    b200 = _db("b200_sxm", "trtllm")
    assert quant_candidates(b200.system, "mxfp4")[0] == "w4a8_mxfp4_mxfp8"
    rb = resolve_moe(b200, quant="mxfp4", moe_tp=1, moe_ep=1, **GPT_OSS)
    assert rb.how == "exact" and any("w4a8_mxfp4_mxfp8" in n for n in rb.notes)
    tokens, lat = _raw_moe(b200, "w4a8_mxfp4_mxfp8", 2880, 2880, 4, 128, 1, 1, rb.kernel)
    np.testing.assert_array_equal(rb.grid(tokens)[0], lat)
    # b200 vLLM collected gpt-oss only as w4a16_mxfp4; SGLang's table has the preferred
    # w4a8_mxfp4_mxfp8 at this site and agrees with vLLM's on w4a16 there (the same FlashInfer
    # TRT-LLM kernels): SGLang's w4a8 rows serve the vLLM query, noted
    rv = resolve_moe(_db("b200_sxm", "vllm"), quant="mxfp4", moe_tp=1, moe_ep=1, **GPT_OSS)
    assert rv.how == "exact" and any("-> w4a8_mxfp4_mxfp8" in n for n in rv.notes)
    assert any(n.startswith("w4a8_mxfp4_mxfp8 from sglang") for n in rv.notes)
    sg = _db("b200_sxm", "sglang")
    rs = resolve_moe(sg, quant="w4a8_mxfp4_mxfp8", moe_tp=1, moe_ep=1, **GPT_OSS)
    tokens = rs.grid.axes[0]
    np.testing.assert_array_equal(rv.grid(tokens)[0], rs.grid(tokens)[0])
    # an explicit quant mode is never swapped: w4a16 stays vLLM's own
    r16 = resolve_moe(_db("b200_sxm", "vllm"), quant="w4a16_mxfp4", moe_tp=1, moe_ep=1, **GPT_OSS)
    assert not any("from sglang" in n for n in r16.notes)


@pytest.mark.real_pack
def test_qwen3_235b_tp_and_ep(real_pack_available):
    db = _db("h200_sxm", "trtllm")
    tp4 = resolve_moe(db, quant="bfloat16", moe_tp=4, moe_ep=1, **QWEN3_235B)
    ep4 = resolve_moe(db, quant="bfloat16", moe_tp=1, moe_ep=4, **QWEN3_235B)
    for r, (tp, ep) in ((tp4, (4, 1)), (ep4, (1, 4))):
        assert r.how == "exact" and "nongated" not in r.kernel
        tokens, lat = _raw_moe(db, "bfloat16", 4096, 1536, 8, 128, tp, ep, r.kernel)
        np.testing.assert_array_equal(r.grid(tokens)[0], lat)
    assert not np.array_equal(tp4.grid.values, ep4.grid.values)


@pytest.mark.real_pack
def test_uncollected_pair_lists_pairs(real_pack_available):
    db = _db("h200_sxm", "trtllm")
    with pytest.raises(NotAvailableError) as ei:
        resolve_moe(db, quant="fp8_block", moe_tp=3, moe_ep=8, **DSV3)
    assert "tp1xep8" in ei.value.available and "moe_tp=3" in str(ei.value)
    # tp8 x ep1 was not collected for Qwen3-235B, tp4 and tp2 (ep1) were: latency split as
    # a + b / moe_tp through them carries on one more octave (1.5 l4 - 0.5 l2, never below perfect
    # scaling of l4), and says so
    r = resolve_moe(db, quant="fp8_block", moe_tp=8, moe_ep=1, **QWEN3_235B)
    assert r.how == "pair-trend" and r.donors == ("moe_tp=4 moe_ep=1", "moe_tp=2 moe_ep=1")
    assert (r.grid.prov == Prov.TRANSFERRED).all() and any("1/moe_tp" in n for n in r.notes)
    tp4, tp2 = (resolve_moe(db, quant="fp8_block", moe_tp=t, moe_ep=1, **QWEN3_235B) for t in (4, 2))
    assert tp4.how == tp2.how == "exact"
    tok = r.grid.axes[0]
    l4, l2 = (b.grid(tok)[0] for b in (tp4, tp2))
    sq = moe_sol_fn(db, "fp8_block", 4096, 1536, 8, 128, 8, 1, True)(tok)
    want = np.maximum(1.5 * l4 - 0.5 * l2, l4 * sq / tp4.grid.sol(tok))
    np.testing.assert_allclose(r.grid(tok)[0], want, rtol=1e-12)
    assert (r.grid(tok)[0] < l4).all()  # more GPUs on the experts: faster, by less than half
    # tp16 x ep1: no tp8 to continue from -- transferred from a collected pair of the same width
    # (16 GPUs) through utilisation, and says so
    r = resolve_moe(db, quant="fp8_block", moe_tp=16, moe_ep=1, **QWEN3_235B)
    assert r.how == "pair-transfer" and (r.grid.prov >= Prov.TRANSFERRED).all()
    donor = r.donors[0]
    assert donor.startswith("moe_tp=") and "moe_tp=16 moe_ep=1" not in donor
    dtp, dep = (int(x.split("=")[1]) for x in donor.split())
    assert dtp * dep == 16
    base = resolve_moe(db, quant="fp8_block", moe_tp=dtp, moe_ep=dep, **QWEN3_235B)
    assert base.how == "exact"
    tok = base.grid.axes[0]
    ratio = r.grid(tok)[0] / base.grid(tok)[0]
    sq = moe_sol_fn(db, "fp8_block", 4096, 1536, 8, 128, 16, 1, True)(tok)
    sd = moe_sol_fn(db, "fp8_block", 4096, 1536, 8, 128, dtp, dep, True)(tok)
    np.testing.assert_allclose(ratio, sq / sd, rtol=1e-12)
    # HYBRID answers empirically
    r = resolve_moe(_db("h200_sxm", "trtllm", "HYBRID"), quant="fp8_block", moe_tp=3, moe_ep=8, **DSV3)
    assert r.how == "empirical" and (r.grid.prov == Prov.EMPIRICAL).all()
    assert np.all(r.grid.values > 0)


@pytest.mark.real_pack
def test_gated_kernel_rule(real_pack_available):
    db = _db("h200_sxm", "trtllm")
    r = resolve_moe(db, quant="bfloat16", moe_tp=1, moe_ep=8, gated=False, **NEMOTRON_NANO)
    assert r.kernel == "moe_torch_flow_nongated" and r.how == "exact"
    tokens, lat = _raw_moe(db, "bfloat16", 2688, 1856, 6, 128, 1, 8, "moe_torch_flow_nongated")
    np.testing.assert_array_equal(r.grid(tokens)[0], lat)
    g = resolve_moe(db, quant="bfloat16", moe_tp=1, moe_ep=8, gated=True, **QWEN3_235B)
    assert "nongated" not in g.kernel
    # vLLM names no non-gated kernel: the flag does not filter, the Nemotron site is still exact
    rv = resolve_moe(_db("h200_sxm", "vllm"), quant="bfloat16", moe_tp=1, moe_ep=8, gated=False, **NEMOTRON_NANO)
    assert rv.how == "exact"


@pytest.mark.real_pack
def test_off_site_shape_transfers(real_pack_available):
    db = _db("h200_sxm", "trtllm")
    r = resolve_moe(db, quant="fp8_block", hidden=5120, inter=2048, topk=8, experts=256, moe_tp=1, moe_ep=8)
    assert r.how in ("idw", "multilinear") and r.donors
    assert (r.grid.prov >= Prov.TRANSFERRED).all()
    lo = resolve_moe(db, quant="fp8_block", hidden=4096, inter=2048, topk=8, experts=256, moe_tp=1, moe_ep=8)
    hi = resolve_moe(db, quant="fp8_block", hidden=6144, inter=2048, topk=8, experts=256, moe_tp=1, moe_ep=8)
    t = np.array([64.0, 1024.0, 8192.0])
    v, lo_v, hi_v = r.grid(t)[0], lo.grid(t)[0], hi.grid(t)[0]
    assert np.all(v > 0.8 * lo_v) and np.all(v < 1.2 * hi_v)


A2A_TOKENS = np.array([16.0, 128.0, 256.0, 1024.0, 4096.0])


@pytest.mark.real_pack
@pytest.mark.parametrize("backend", ["trtllm", "vllm"])
@pytest.mark.parametrize("phase", ["context", "generation"])
def test_dispatch_ep8_positive_increasing(real_pack_available, backend, phase):
    db = _db("h200_sxm", backend)
    r = resolve_moe_dispatch(db, phase=phase, hidden=7168, topk=8, experts=256, ep=8, quant="fp8_block")
    assert r is not None and r.source == "moe_a2a" and r.how == "exact"
    want = {"trtllm": {"context": "trtllm_deepep_ht", "generation": "trtllm_deepep_ll"},
            "vllm": {"context": "deepep_ht", "generation": "deepep_ll"}}[backend][phase]
    assert r.kernel == want
    if backend == "trtllm":
        assert r.version == "1.3.0rc11 (backfill)"
    v, _ = r.grid(A2A_TOKENS)
    assert np.all(v > 0) and np.all(np.diff(v) > 0)


@pytest.mark.real_pack
def test_dispatch_is_dispatch_plus_combine(real_pack_available):
    db = _db("h200_sxm", "vllm")
    r = resolve_moe_dispatch(db, phase="context", hidden=7168, topk=8, experts=256, ep=8, quant="bfloat16")
    t = pq.read_table(db.data.served["moe_a2a"].path).to_pandas()
    s = t[(t.comm_backend == "deepep_ht") & (t.hidden_size == 7168) & (t.topk == 8) & (t.num_experts == 256) & (t.ep_size == 8)]
    d = s[s.phase == "dispatch"].set_index("num_tokens").latency.sort_index()
    c = s[s.phase == "combine"].set_index("num_tokens").latency.sort_index()
    total_ms = (d + c).values / 1000.0  # moe_a2a latency is in microseconds
    v, p = r.grid(d.index.values.astype(float))
    np.testing.assert_allclose(v, total_ms, rtol=1e-12)
    assert (p == Prov.EXACT).all()


@pytest.mark.real_pack
def test_dispatch_ep_transfer_and_nccl_fallback(real_pack_available):
    db = _db("h200_sxm", "trtllm")  # moe_a2a has ep_size 8 only: EP 4 (same node) through the a2a roofline
    r = resolve_moe_dispatch(db, phase="context", hidden=7168, topk=8, experts=256, ep=4, quant="fp8_block")
    assert r.source == "moe_a2a" and r.how == "ep-transfer" and r.donors[-1] == "ep=8"
    assert (r.grid.prov == Prov.TRANSFERRED).all()
    # no all-to-all table on a100: two NCCL all-to-alls
    da = _db("a100_sxm", "trtllm")
    r = resolve_moe_dispatch(da, phase="context", hidden=7168, topk=8, experts=256, ep=4, quant="fp8_block")
    assert r.source == "nccl" and any("NCCL alltoall x2" in n for n in r.notes)
    nccl = resolve_collective(da, "alltoall", 4).grid
    tokens = np.array([1.0, 8.0, 64.0, 512.0])
    np.testing.assert_allclose(r.grid(tokens)[0], 2.0 * nccl(tokens * 8 * 7168)[0], rtol=1e-12)
    assert np.all(np.diff(r.grid(tokens)[0]) > 0)
    # SGLang has no moe_a2a table: its DeepEP tables answer
    rs = resolve_moe_dispatch(_db("h200_sxm", "sglang"), phase="generation", hidden=7168, topk=8, experts=256, ep=8, quant="fp8_block")
    assert rs.source == "wideep_deepep_ll" and rs.how == "exact"
    assert resolve_moe_dispatch(db, phase="context", hidden=7168, topk=8, experts=256, ep=1, quant="fp8_block") is None


# ----------------------------------------------------------------------------------------------
# (b) synthetic pack
# ----------------------------------------------------------------------------------------------

SYN_TOKENS = (1, 2, 4, 8, 16, 64, 256, 1024, 4096)
SYN_SITES = ((1024, 512, 2, 8), (4096, 512, 2, 8))
SYN_PAIRS = ((1, 1), (1, 2), (2, 1))
SYN_UTIL = {"moe_torch_flow_cutlass": 0.5, "moe_torch_flow_nongated": 0.4, "alt_cutlass": 0.3}
SYN_SKEW = {"balanced": 1.0, "power_law_1.2": 1.7}
NONGATED_SITE = (1024, 512, 2, 8)
A2A_SITE = (1024, 2, 8)
A2A_EP = 2


def _syn_lat(system, quant, tokens, site, tp, ep, kernel, dist):
    h, n, k, e = site
    gated = "nongated" not in kernel
    s = sol.moe(system, COMPUTE_DTYPE[quant], WEIGHT_BYTES[quant], np.asarray(tokens, float), h, n, k, e, tp, ep, gated)[0]
    return s / SYN_UTIL[kernel] * SYN_SKEW[dist]


def _a2a_us(phase, tokens):
    t = np.asarray(tokens, float)
    return (20.0 + 0.05 * t) if phase == "dispatch" else (15.0 + 0.04 * t)


def _write(path, cols, types):
    schema = pa.schema([(c, types[c]) for c in cols])
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_arrays([pa.array(cols[c], type=types[c]) for c in cols], schema=schema), path)


@pytest.fixture(scope="module")
def moe_pack(tmp_path_factory):
    from infercast.data.pack import find_pack
    from infercast.data.system import load_system

    root = tmp_path_factory.mktemp("moepack")
    pack = sp.make_pack(root)
    system = load_system(find_pack(str(pack.systems_dir)), sp.SYSTEM)
    data = pack.systems_dir / "data" / sp.SYSTEM
    rows = []
    for site, (tp, ep), dist in itertools.product(SYN_SITES, SYN_PAIRS, SYN_SKEW):
        kernels = ["moe_torch_flow_cutlass"]
        if site == NONGATED_SITE:
            kernels.append("moe_torch_flow_nongated")
        for kern in kernels:
            for n in SYN_TOKENS:
                rows.append(("bfloat16", n, *site, tp, ep, dist, kern))
    # a second, smaller kernel: merge_kernels keeps the default where both have a point
    for n in SYN_TOKENS[:3]:
        rows.append(("bfloat16", n, *SYN_SITES[1], 1, 1, "balanced", "alt_cutlass"))
    # fp8: only a non-gated kernel was collected (exercises the cross-activation carry-over)
    for n in SYN_TOKENS:
        rows.append(("fp8", n, *NONGATED_SITE, 1, 1, "balanced", "moe_torch_flow_nongated"))
    q, n_, h, i, k, e, tp, ep, dist, kern = (list(c) for c in zip(*rows))
    lat = [float(_syn_lat(system, r[0], r[1], r[2:6], r[6], r[7], r[9], r[8])) for r in rows]
    N = len(rows)
    cols = {
        "framework": ["TRTLLM"] * N, "version": ["1.0"] * N, "device": [sp.DEVICE] * N,
        "op_name": ["moe"] * N, "kernel_source": kern, "moe_dtype": q, "num_tokens": n_,
        "hidden_size": h, "inter_size": i, "topk": k, "num_experts": e, "moe_tp_size": tp,
        "moe_ep_size": ep, "distribution": dist, "latency": lat,
    }
    types = {c: (pa.string() if isinstance(v[0], str) else pa.float64() if isinstance(v[0], float) else pa.int64())
             for c, v in cols.items()}
    _write(data / "moe" / "trtllm" / sp.TRTLLM_CURRENT / "moe_perf.parquet", cols, types)
    # moe_a2a: latency in microseconds, dispatch and combine at one site, ep 2
    arows = [(cb, ph, n) for cb in ("trtllm_deepep_ht", "trtllm_deepep_ll") for ph in ("dispatch", "combine") for n in SYN_TOKENS]
    cb_c, ph_c, n_c = (list(c) for c in zip(*arows))
    M = len(arows)
    acols = {
        "framework": ["TRTLLM"] * M, "version": ["1.0"] * M, "device": [sp.DEVICE] * M,
        "op_name": ["moe_a2a"] * M, "kernel_source": ["deepep"] * M, "comm_backend": cb_c, "phase": ph_c,
        "comm_dtype": ["bfloat16"] * M, "ep_size": [A2A_EP] * M, "node_num": [1] * M,
        "hidden_size": [A2A_SITE[0]] * M, "topk": [A2A_SITE[1]] * M, "num_experts": [A2A_SITE[2]] * M,
        "num_tokens": n_c, "sms": [0] * M,
        "transmit_us": [float(_a2a_us(p, n)) for p, n in zip(ph_c, n_c)], "notify_us": [0.0] * M,
        "latency": [float(_a2a_us(p, n)) for p, n in zip(ph_c, n_c)],
    }
    atypes = {c: (pa.string() if isinstance(v[0], str) else pa.float64() if isinstance(v[0], float) else pa.int64())
              for c, v in acols.items()}
    _write(data / "comm" / "trtllm" / sp.TRTLLM_CURRENT / "moe_a2a_perf.parquet", acols, atypes)
    return pack, system


def _sdb(moe_pack, mode="SILICON") -> OpDB:
    pack, _ = moe_pack
    return OpDB(PerfData.open(sp.SYSTEM, "trtllm", None, pack.systems_dir), DatabaseMode.parse(mode))


@pytest.mark.parametrize("pair", SYN_PAIRS)
@pytest.mark.parametrize("site", SYN_SITES)
def test_synth_exact_hits(moe_pack, site, pair):
    _, system = moe_pack
    h, n, k, e = site
    r = resolve_moe(_sdb(moe_pack), quant="bfloat16", hidden=h, inter=n, topk=k, experts=e, moe_tp=pair[0], moe_ep=pair[1])
    assert r.how == "exact" and r.version == sp.TRTLLM_CURRENT
    assert r.kernel.split("+")[0] == "moe_torch_flow_cutlass"
    t = np.array(SYN_TOKENS, float)
    v, p = r.grid(t)
    want = _syn_lat(system, "bfloat16", t, site, *pair, "moe_torch_flow_cutlass", "balanced")
    np.testing.assert_array_equal(v, want.astype(float))  # stored doubles, bit for bit
    assert (p == Prov.EXACT).all()


def test_synth_interpolation_between_points(moe_pack):
    _, system = moe_pack
    r = resolve_moe(_sdb(moe_pack), quant="bfloat16", hidden=1024, inter=512, topk=2, experts=8, moe_tp=1, moe_ep=1)
    assert TOKEN_SCALE == ("linear",) and r.grid.scales == TOKEN_SCALE
    t = np.array(SYN_TOKENS, float)
    lat = _syn_lat(system, "bfloat16", t, (1024, 512, 2, 8), 1, 1, "moe_torch_flow_cutlass", "balanced")
    for j in range(len(t) - 1):
        for frac in (0.25, 0.5, 0.9):
            q = t[j] + frac * (t[j + 1] - t[j])
            want = lat[j] + frac * (lat[j + 1] - lat[j])  # linear in tokens (the LOO-chosen rule)
            v, p = r.grid(np.array([q]))
            assert v[0] == pytest.approx(want, rel=1e-12)
            assert p[0] == Prov.INTERPOLATED
            assert r.grid.scalar(q)[0] == pytest.approx(want, rel=1e-12)
    # beyond the last point: utilisation held (value / SOL constant), flagged HELD
    big = np.array([8192.0, 20000.0])
    vb, pb = r.grid(big)
    np.testing.assert_allclose(vb, _syn_lat(system, "bfloat16", big, (1024, 512, 2, 8), 1, 1, "moe_torch_flow_cutlass", "balanced"), rtol=1e-12)
    assert (pb == Prov.HELD).all()


@pytest.mark.parametrize("hidden", [2048, 3000, 8192])
def test_synth_transfer_through_fixed_cost_roofline(moe_pack, hidden):
    """Off-site: utilisation (SOL + c) / latency of the two bracketing sites (log2 hidden 10, 12;
    8192 is clamped to 4096), blended multilinearly, answers (SOL(query) + c) / u, where c is
    FIXED_COST_FRACTION x the lowest latency collected at the pair."""
    _, system = moe_pack
    r = resolve_moe(_sdb(moe_pack), quant="bfloat16", hidden=hidden, inter=512, topk=2, experts=8, moe_tp=1, moe_ep=2)
    assert r.how != "exact" and r.donors
    t = np.array(SYN_TOKENS, float)

    def lat(h, tok):
        return _syn_lat(system, "bfloat16", tok, (h, 512, 2, 8), 1, 2, "moe_torch_flow_cutlass", "balanced")

    def sol_of(h, tok):
        return sol.moe(system, "bfloat16", 2.0, tok, h, 512, 2, 8, 1, 2)[0]

    c = FIXED_COST_FRACTION * min(float(lat(h, t).min()) for h, *_ in SYN_SITES)
    w = min(max((np.log2(hidden) - 10.0) / 2.0, 0.0), 1.0)
    u = (1 - w) * (sol_of(1024, t) + c) / lat(1024, t) + w * (sol_of(4096, t) + c) / lat(4096, t)
    np.testing.assert_allclose(r.grid(t)[0], (sol_of(hidden, t) + c) / u, rtol=1e-12)
    # not the plain-roofline answer (exact here: the synthetic data has constant utilisation and
    # no fixed cost), but near it: within 7% between the sites, 11% clamped one octave out
    assert not np.allclose(r.grid(t)[0], lat(hidden, t), rtol=1e-6)
    np.testing.assert_allclose(r.grid(t)[0], lat(hidden, t), rtol=0.07 if hidden < 4096 else 0.11)
    # the grid holds beyond the tokens range through the plain SOL, marked held
    big = np.array([8192.0, 30000.0])
    vb, pb = r.grid(big)
    assert np.all(vb > r.grid(t[-1:])[0]) and (pb >= Prov.HELD).all()
    assert (r.grid(t)[1] >= Prov.TRANSFERRED).all()


def test_transfer_reads_donors_at_equal_expert_rows():
    """Rule 3: a donor with topk/experts = 2x the query's is read at half the query's tokens."""
    axis = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 32.0])
    donor_sol = lambda x: 0.001 * np.asarray(x, float)
    donor_lat = 0.01 + 0.002 * axis  # utilisation varies along tokens
    donor = Grid((axis,), donor_lat, np.zeros(len(axis), np.int8), donor_sol)
    sites = np.array([[1024.0, 512.0, 4.0, 8.0], [1024.0, 512.0, 2.0, 8.0]])
    query = (1024, 512, 2, 16)  # 1/8 rows per token vs the donors' 1/2 and 1/4
    sol_q = lambda x: 0.003 * np.asarray(x, float)
    cost = 0.004
    from infercast.interp.transfer import SiteChoice

    for i, ratio in ((0, 0.25), (1, 0.5)):
        g = transfer_sites(SiteChoice((i,), (1.0,), "idw", 0.0), query, sites, lambda _: donor, sol_q, cost)
        tq = np.array([4.0, 16.0, 32.0])  # donor read at tq * ratio, inside its measured range
        u = (donor_sol(tq * ratio) + cost) / (0.01 + 0.002 * tq * ratio)
        np.testing.assert_allclose(g(tq)[0], (sol_q(tq) + cost) / u, rtol=1e-12)
        assert g.sol is sol_q
    # an exact choice is the site's own grid
    assert transfer_sites(SiteChoice((1,), (1.0,), "exact", 0.0), query, sites, lambda _: donor, sol_q, cost) is donor


def test_consistent_donors_at_expert_rows_over_fixed_cost():
    """Rule 4: donors whose utilisation (SOL + cost over latency, read at the query's expert rows)
    differs by more than CONSISTENT_UTIL_FACTOR are not blended together; the heavier side stays."""
    from infercast.interp.transfer import SiteChoice

    axis = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 32.0])
    sol = lambda x: 0.001 * np.asarray(x, float)  # noqa: E731
    cost = 0.002

    def donor(util):  # (SOL + cost) / latency == util at every token count
        return Grid((axis,), (sol(axis) + cost) / util, np.zeros(len(axis), np.int8), sol, scales=TOKEN_SCALE)

    grids = {0: donor(0.5), 1: donor(0.5 / 1.6), 2: donor(0.5 / 1.4)}
    sites = np.array([[1024.0, 512, 2, 8], [2048, 512, 2, 8], [4096, 512, 2, 8]])
    query = (1536, 512, 2, 8)  # same expert rows as every donor: read at the same tokens
    ch = SiteChoice((0, 1, 2), (0.5, 0.3, 0.2), "idw", 0.0)
    # 0 vs 1: 1.6x > 1.5 (disagree); 0 vs 2: 1.4x and 1 vs 2: 1.14x agree -> {0, 2} (0.7) beats {1, 2} (0.5)
    assert CONSISTENT_UTIL_FACTOR == 1.5
    got = consistent_moe_donors(ch, query, sites, grids.__getitem__, cost)
    assert got.indices == (0, 2) and got.how == "idw"
    np.testing.assert_allclose(got.weights, [0.5 / 0.7, 0.2 / 0.7], rtol=1e-12)
    # read at expert rows: a donor with twice the query's topk/experts is read at half the tokens; a
    # utilisation that varies along tokens is compared where the blend would read it
    ramp = Grid((axis,), (sol(axis) + cost) / (0.2 + 0.01 * axis), np.zeros(len(axis), np.int8), sol, scales=TOKEN_SCALE)
    half = Grid((axis,), (sol(axis) + cost) / (0.2 + 0.02 * axis), np.zeros(len(axis), np.int8), sol, scales=TOKEN_SCALE)
    sites2 = np.array([[1024.0, 512, 2, 8], [1024.0, 512, 4, 8]])
    ch2 = SiteChoice((0, 1), (0.5, 0.5), "idw", 0.0)
    same = consistent_moe_donors(ch2, (1024, 512, 2, 8), sites2, {0: ramp, 1: half}.__getitem__, cost)
    assert same is ch2  # half(t / 2) == ramp(t): they agree once read at equal expert rows
    # one donor or an exact hit: unchanged
    one = SiteChoice((1,), (1.0,), "idw", 0.0)
    assert consistent_moe_donors(one, query, sites, grids.__getitem__, cost) is one


def test_choose_donors_default_kernel_first():
    """Rule 1: donors among the default kernel's sites; an exact hit of any kernel wins; all
    sites when no default-kernel site is within the gates."""
    sites = np.array([[1024.0, 512, 2, 8], [2048, 512, 2, 8], [4096, 512, 2, 8], [65536, 512, 2, 8]])
    primary = np.array([True, False, True, False])
    c = choose_donors((1536, 512, 2, 8), sites, primary)
    assert set(c.indices) <= {0, 2} and c.how == "multilinear"
    assert set(choose_donors((1536, 512, 2, 8), sites, np.ones(4, bool)).indices) == {0, 1}
    assert choose_donors((2048, 512, 2, 8), sites, primary).indices == (1,)
    assert choose_donors((2048, 512, 2, 8), sites, primary).how == "exact"
    far = choose_donors((65536 * 1.5, 512, 2, 8), sites, primary)  # only the non-default site is near
    assert far is not None and far.indices == (3,)
    assert fixed_cost([np.array([0.3, 0.2, np.nan]), np.array([0.5])]) == pytest.approx(FIXED_COST_FRACTION * 0.2)


@pytest.mark.real_pack
def test_real_default_kernel_sites(real_pack_available):
    """b200 SGLang bf16 mixes FlashInfer-TRT-LLM and Triton sites: off-site queries take their
    donors from the default kernel's sites."""
    db = _db("b200_sxm", "sglang")
    lat = _get_lattice(db, "bfloat16", True, "balanced")
    assert lat.kernel.split("+")[0] == "sglang_flashinfer_trtllm_moe"
    triton = np.all(lat.sites[:, :4] == (4096, 2048, 8, 256), axis=1)
    flash = np.all(lat.sites[:, :4] == (6144, 2048, 8, 256), axis=1)
    assert triton.any() and not lat.primary[triton].any() and lat.primary[flash].all()
    r = resolve_moe(db, quant="bfloat16", hidden=5120, inter=2048, topk=8, experts=256, moe_tp=1, moe_ep=8)
    assert r.how in ("idw", "multilinear") and r.donors
    assert not any("hidden=4096, inter=2048, topk=8, experts=256" in d for d in r.donors)
    assert any("hidden=6144, inter=2048, topk=8, experts=256" in d for d in r.donors)


def test_synth_gated_and_distribution(moe_pack):
    _, system = moe_pack
    db = _sdb(moe_pack)
    t = np.array(SYN_TOKENS, float)
    ng = resolve_moe(db, quant="bfloat16", hidden=1024, inter=512, topk=2, experts=8, moe_tp=1, moe_ep=1, gated=False)
    assert ng.kernel == "moe_torch_flow_nongated"
    np.testing.assert_array_equal(ng.grid(t)[0], _syn_lat(system, "bfloat16", t, NONGATED_SITE, 1, 1, "moe_torch_flow_nongated", "balanced"))
    # non-gated rows exist only at hidden 1024: 4096 holds that site's (constant) utilisation
    x = resolve_moe(db, quant="bfloat16", hidden=4096, inter=512, topk=2, experts=8, moe_tp=1, moe_ep=1, gated=False)
    assert x.how == "multilinear-held" and x.kernel == "moe_torch_flow_nongated"
    lat_ng = _syn_lat(system, "bfloat16", t, NONGATED_SITE, 1, 1, "moe_torch_flow_nongated", "balanced")
    c = FIXED_COST_FRACTION * lat_ng.min()  # the one non-gated site is the pair's floor
    s_d, s_q = (sol.moe(system, "bfloat16", 2.0, t, h, 512, 2, 8, 1, 1, False)[0] for h in (1024, 4096))
    np.testing.assert_allclose(x.grid(t)[0], (s_q + c) * lat_ng / (s_d + c), rtol=1e-12)
    # fp8 has only a non-gated kernel: a gated query carries its utilisation across activations
    c = resolve_moe(db, quant="fp8", hidden=1024, inter=512, topk=2, experts=8, moe_tp=1, moe_ep=1, gated=True)
    assert c.how == "activation-transfer" and any("carried over" in n for n in c.notes)
    want = _syn_lat(system, "fp8", t, NONGATED_SITE, 1, 1, "moe_torch_flow_nongated", "balanced") * 1.5
    sol_g = sol.moe(system, "fp8", 1.0, t, 1024, 512, 2, 8, 1, 1, True)[0]
    sol_n = sol.moe(system, "fp8", 1.0, t, 1024, 512, 2, 8, 1, 1, False)[0]
    np.testing.assert_allclose(c.grid(t)[0], want / 1.5 * sol_g / sol_n, rtol=1e-12)
    skew = resolve_moe(db, quant="bfloat16", hidden=1024, inter=512, topk=2, experts=8, moe_tp=1, moe_ep=1, distribution="power_law_1.2")
    np.testing.assert_array_equal(skew.grid(t)[0], _syn_lat(system, "bfloat16", t, (1024, 512, 2, 8), 1, 1, "moe_torch_flow_cutlass", "power_law_1.2"))
    miss = resolve_moe(db, quant="bfloat16", hidden=1024, inter=512, topk=2, experts=8, moe_tp=1, moe_ep=1, distribution="power_law_1.01")
    assert any("power_law_1.01" in n and "balanced" in n for n in miss.notes)


def test_synth_errors_and_modes(moe_pack):
    db = _sdb(moe_pack)
    with pytest.raises(NotAvailableError) as ei:
        resolve_moe(db, quant="bfloat16", hidden=1024, inter=512, topk=2, experts=8, moe_tp=2, moe_ep=2)
    assert set(ei.value.available) == {"tp1xep1", "tp1xep2", "tp2xep1"}
    with pytest.raises(NotAvailableError) as ei:
        resolve_moe(db, quant="fp8_block", hidden=1024, inter=512, topk=2, experts=8, moe_tp=1, moe_ep=1)
    assert ei.value.available == ["bfloat16", "fp8"]
    with pytest.raises(NotAvailableError):  # far outside the gates
        resolve_moe(db, quant="bfloat16", hidden=1024, inter=65536, topk=2, experts=8, moe_tp=1, moe_ep=1)
    with pytest.raises(InvalidInputError):
        resolve_moe(db, quant="int3", hidden=1024, inter=512, topk=2, experts=8, moe_tp=1, moe_ep=1)
    with pytest.raises(InvalidInputError):
        resolve_moe(db, quant="bfloat16", hidden=1024, inter=512, topk=9, experts=8, moe_tp=1, moe_ep=1)
    with pytest.raises(InvalidInputError):
        resolve_moe(db, quant="bfloat16", hidden=0, inter=512, topk=2, experts=8, moe_tp=1, moe_ep=1)
    hy = resolve_moe(_sdb(moe_pack, "HYBRID"), quant="bfloat16", hidden=1024, inter=512, topk=2, experts=8, moe_tp=2, moe_ep=2)
    assert hy.how == "empirical" and np.all(hy.grid.values > 0)
    s = resolve_moe(_sdb(moe_pack, "SOL"), quant="bfloat16", hidden=1024, inter=512, topk=2, experts=8, moe_tp=1, moe_ep=1)
    assert s.how == "sol" and (s.grid.prov == Prov.SOL).all()


def test_synth_dispatch_from_table_and_nccl(moe_pack):
    db = _sdb(moe_pack)
    t = np.array(SYN_TOKENS, float)
    h, k, e = A2A_SITE
    for phase in ("context", "generation"):
        r = resolve_moe_dispatch(db, phase=phase, hidden=h, topk=k, experts=e, ep=A2A_EP, quant="bfloat16")
        assert r.source == "moe_a2a" and r.how == "exact"
        v, p = r.grid(t)
        np.testing.assert_allclose(v, (_a2a_us("dispatch", t) + _a2a_us("combine", t)) / 1000.0, rtol=1e-12)
        assert (p == Prov.EXACT).all()
    # ep 4 has no moe_a2a rows: the ep 2 curve (same node) through the all-to-all roofline
    r4 = resolve_moe_dispatch(db, phase="context", hidden=h, topk=k, experts=e, ep=4, quant="bfloat16")
    assert r4.source == "moe_a2a" and r4.how == "ep-transfer"
    ratio = a2a_sol_fn(db.system, h, k, 4, 2.0)(t) / a2a_sol_fn(db.system, h, k, A2A_EP, 2.0)(t)
    np.testing.assert_allclose(r4.grid(t)[0], (_a2a_us("dispatch", t) + _a2a_us("combine", t)) / 1000.0 * ratio, rtol=1e-12)
    # ep 8: 2 octaves from ep 2, within the gate; ep 16 spans two nodes: never from the
    # intra-node rows; two NCCL all-to-alls of tokens*topk*hidden elements, priced hierarchically
    r8 = resolve_moe_dispatch(db, phase="context", hidden=h, topk=k, experts=e, ep=8, quant="bfloat16")
    assert r8.source == "moe_a2a"
    r16 = resolve_moe_dispatch(db, phase="context", hidden=h, topk=k, experts=16, ep=16, quant="bfloat16")
    assert r16.source == "nccl" and r16.how == "hierarchical"
    tok = np.array([2.0, 16.0, 64.0, 1024.0])
    np.testing.assert_allclose(r16.grid(tok)[0], 2.0 * resolve_collective(db, "alltoall", 16).grid(tok * k * h)[0], rtol=1e-12)
    with pytest.raises(InvalidInputError):
        resolve_moe_dispatch(db, phase="warmup", hidden=h, topk=k, experts=e, ep=2, quant="bfloat16")


# ----------------------------------------------------------------------------------------------
# a preferred quant mode filled from another backend's table (ops.moe._peer_preferred)
# ----------------------------------------------------------------------------------------------


def _peer_moe_pack(tmp_path, trt_w4a16_scale: float, trt_has_w4a8: bool = True):
    """vLLM with only w4a16_mxfp4 at one site; TensorRT-LLM with w4a16_mxfp4 at ``trt_w4a16_scale``
    times vLLM's latency there and (optionally) w4a8_mxfp4_mxfp8 at half of it."""
    from infercast.data.pack import find_pack

    pack = sp.make_pack(tmp_path / "pk")
    data = pack.systems_dir / "data" / sp.SYSTEM
    site = (1024, 512, 2, 8)
    tokens = [1, 2, 4, 8, 16, 32]
    base = [0.01 + 0.001 * t for t in tokens]

    def table(backend, version, rows):
        q, lat = zip(*rows)
        n = len(rows)
        cols = {
            "framework": [backend] * n, "version": [version] * n, "device": [sp.DEVICE] * n, "op_name": ["moe"] * n,
            "kernel_source": ["k"] * n, "moe_dtype": list(q), "num_tokens": tokens * (n // len(tokens)),
            "hidden_size": [site[0]] * n, "inter_size": [site[1]] * n, "topk": [site[2]] * n,
            "num_experts": [site[3]] * n, "moe_tp_size": [1] * n, "moe_ep_size": [1] * n,
            "distribution": ["balanced"] * n, "latency": list(lat),
        }
        types = {c: (pa.string() if isinstance(v[0], str) else pa.float64() if isinstance(v[0], float) else pa.int64())
                 for c, v in cols.items()}
        _write(data / "moe" / backend / version / "moe_perf.parquet", cols, types)

    table("vllm", sp.VLLM_CURRENT, [("w4a16_mxfp4", v) for v in base])
    trt = [("w4a16_mxfp4", v * trt_w4a16_scale) for v in base]
    if trt_has_w4a8:
        trt += [("w4a8_mxfp4_mxfp8", v / 2) for v in base]
    table("trtllm", sp.TRTLLM_CURRENT, trt)
    find_pack(str(pack.systems_dir))
    return pack, site, base


def test_preferred_quant_from_an_agreeing_peer(tmp_path):
    from infercast.ops.moe import _peer_preferred

    pack, site, base = _peer_moe_pack(tmp_path, trt_w4a16_scale=1.05)
    vdb = OpDB(PerfData.open(sp.SYSTEM, "vllm", None, pack.systems_dir))
    lat = _get_lattice(vdb, "w4a16_mxfp4", True, "balanced")
    got = _peer_preferred(vdb, "w4a8_mxfp4_mxfp8", "w4a16_mxfp4", lat, site, 1, 1, True, "balanced")
    assert got is not None
    pdb, q, plat, note = got
    assert pdb.backend == "trtllm" and q == "w4a8_mxfp4_mxfp8"
    (ax,), vals = next(iter(plat.curves.values()))
    np.testing.assert_allclose(vals, np.asarray(base) / 2)
    assert "agree on w4a16_mxfp4" in note and "0.95" in note  # vllm/trtllm = 1/1.05
    # the pair at another site / pair: nothing to fill
    assert _peer_preferred(vdb, "w4a8_mxfp4_mxfp8", "w4a16_mxfp4", lat, site, 2, 1, True, "balanced") is None


@pytest.mark.parametrize("scale,has_w4a8", [(1.5, True), (1.0, False)])
def test_preferred_quant_not_filled_without_agreement_or_data(tmp_path, scale, has_w4a8):
    from infercast.ops.moe import _peer_preferred

    pack, site, _ = _peer_moe_pack(tmp_path, trt_w4a16_scale=scale, trt_has_w4a8=has_w4a8)
    vdb = OpDB(PerfData.open(sp.SYSTEM, "vllm", None, pack.systems_dir))
    lat = _get_lattice(vdb, "w4a16_mxfp4", True, "balanced")
    assert _peer_preferred(vdb, "w4a8_mxfp4_mxfp8", "w4a16_mxfp4", lat, site, 1, 1, True, "balanced") is None


def _wide_ep_pack(tmp_path):
    """A wide-EP expert table (DeepEP kernel) collected in fp8_block only, at one site and EP2."""
    from infercast.data.pack import find_pack
    from infercast.data.system import load_system

    pack = sp.make_pack(tmp_path / "pk")
    system = load_system(find_pack(str(pack.systems_dir)), sp.SYSTEM)
    site, tokens = (1024, 512, 2, 8), [2, 4, 8, 16, 32, 64]
    lat = [0.02 + 0.003 * t for t in tokens]
    _write_wide_ep(pack, WIDE_EP_TABLE, "moe_generation", site, tokens, lat)
    find_pack(str(pack.systems_dir))
    return pack, system, site, np.array(tokens, float), np.array(lat)


def _write_wide_ep(pack, stem: str, op_name: str, site, tokens, lat) -> None:
    """One wide-EP table (DeepEP kernel, fp8_block, EP2, balanced routing) of the synthetic pack."""
    n = len(tokens)
    cols = {
        "framework": ["SGLang"] * n, "version": [sp.TRTLLM_CURRENT] * n, "device": [sp.DEVICE] * n,
        "op_name": [op_name] * n, "kernel_source": ["deepepmoe"] * n, "moe_dtype": ["fp8_block"] * n,
        "num_tokens": list(tokens), "hidden_size": [site[0]] * n, "inter_size": [site[1]] * n, "topk": [site[2]] * n,
        "num_experts": [site[3]] * n, "moe_tp_size": [1] * n, "moe_ep_size": [2] * n,
        "distribution": ["balanced"] * n, "latency": list(lat),
    }
    types = {c: (pa.string() if isinstance(v[0], str) else pa.float64() if isinstance(v[0], float) else pa.int64())
             for c, v in cols.items()}
    _write(pack.systems_dir / "data" / sp.SYSTEM / "moe" / "trtllm" / sp.TRTLLM_CURRENT / f"{stem}_perf.parquet", cols, types)


def test_wide_ep_other_quant_through_sol_ratio(tmp_path):
    """A quant mode the wide-EP table lacks is served from the fp8_block curve at the same site and
    pair, scaled by SOL(query mode) / SOL(fp8_block) at each token count, and marked transferred."""
    pack, system, site, tokens, lat = _wide_ep_pack(tmp_path)
    db = OpDB(PerfData.open(sp.SYSTEM, "trtllm", None, pack.systems_dir))
    kw = dict(hidden=site[0], inter=site[1], topk=site[2], experts=site[3], moe_tp=1, moe_ep=2, wide_ep=True)
    exact = resolve_moe(db, quant="fp8_block", **kw)
    assert exact.how == "exact" and exact.source == WIDE_EP_TABLE
    np.testing.assert_array_equal(exact.grid(tokens)[0], lat)
    r = resolve_moe(db, quant="fp8", **kw)
    assert r.source == WIDE_EP_TABLE and r.how == "quant-transfer" and r.kernel == "deepepmoe"

    def s(q):
        return sol.moe(system, COMPUTE_DTYPE[q], WEIGHT_BYTES[q], tokens, *site, 1, 2, True)[0]

    v, p = r.grid(tokens)
    np.testing.assert_allclose(v, lat * s("fp8") / s("fp8_block"), rtol=1e-12)
    assert (p == Prov.TRANSFERRED).all()
    assert any("SOL(fp8) / SOL(fp8_block)" in n for n in r.notes)
    # another pair, or a mode without tensor cores here (no FP4 on this sm90 GPU): no wide-EP answer
    assert _wide_ep_quant_transfer(db, "fp8", (*site, 1, 4), True, "balanced") is None
    assert _wide_ep_quant_transfer(db, "nvfp4", (*site, 1, 2), True, "balanced") is None


def test_wide_ep_context_phase_reads_its_own_table(tmp_path):
    """The context phase reads the wide-EP context table (DeepEP's normal mode) where it holds the
    site and pair, the generation phase the generation table; a pair only the generation table holds
    serves both phases from it, with a note. Both tables name one kernel ("deepepmoe") and number
    their sites alike: each phase still gets its own table's curve."""
    pack, _, site, tokens, lat = _wide_ep_pack(tmp_path)
    ctx_tokens = [32, 64, 128, 256]
    ctx_lat = [0.5 + 0.01 * t for t in ctx_tokens]
    _write_wide_ep(pack, WIDE_EP_CONTEXT_TABLE, "moe_context", site, ctx_tokens, ctx_lat)
    db = OpDB(PerfData.open(sp.SYSTEM, "trtllm", None, pack.systems_dir))
    kw = {"quant": "fp8_block", "hidden": site[0], "inter": site[1], "topk": site[2], "experts": site[3], "moe_tp": 1,
          "moe_ep": 2, "wide_ep": True}
    gen = resolve_moe(db, phase="generation", **kw)
    ctx = resolve_moe(db, phase="prefill", **kw)  # an alias of context
    assert gen.source == WIDE_EP_TABLE and ctx.source == WIDE_EP_CONTEXT_TABLE
    np.testing.assert_array_equal(gen.grid(tokens)[0], lat)
    np.testing.assert_array_equal(ctx.grid(np.array(ctx_tokens, float))[0], ctx_lat)
    assert resolve_moe(db, **kw).source == WIDE_EP_TABLE  # the default phase: generation
    # no context rows in fp8: the context phase takes the generation table's SOL-ratio answer, said so
    fb = resolve_moe(db, **{**kw, "quant": "fp8"}, phase="context")
    assert fb.source == WIDE_EP_CONTEXT_TABLE and fb.how == "quant-transfer"
    with pytest.raises(InvalidInputError, match="unknown phase"):
        resolve_moe(db, phase="warmup", **kw)


def test_wide_ep_context_falls_back_to_the_generation_table(tmp_path):
    pack, _, site, tokens, lat = _wide_ep_pack(tmp_path)
    db = OpDB(PerfData.open(sp.SYSTEM, "trtllm", None, pack.systems_dir))
    kw = {"quant": "fp8_block", "hidden": site[0], "inter": site[1], "topk": site[2], "experts": site[3], "moe_tp": 1,
          "moe_ep": 2, "wide_ep": True}
    r = resolve_moe(db, phase="context", **kw)
    assert r.source == WIDE_EP_TABLE
    np.testing.assert_array_equal(r.grid(tokens)[0], lat)
    assert any(f"no {WIDE_EP_CONTEXT_TABLE} rows" in n for n in r.notes)


def test_wide_ep_skipped_ep_splits_fixed_and_per_ep_latency(tmp_path):
    """An EP the wide-EP table skipped, between two it collected at the same site: latency
    ``a + b / EP`` through them at every token count both curves cover (EP4 between EP2 and EP8:
    ``l2 / 3 + 2 l8 / 3``), never below perfect scaling of EP2, marked transferred; no collected EP
    on one side: no wide-EP answer."""
    pack, _, site, _, _ = _wide_ep_pack(tmp_path)
    path = pack.systems_dir / "data" / sp.SYSTEM / "moe" / "trtllm" / sp.TRTLLM_CURRENT / f"{WIDE_EP_TABLE}_perf.parquet"
    t = pq.read_table(path).to_pydict()
    ep8_tokens = [4, 8, 16, 32, 64, 128]  # starts above EP2's first count, ends past its last
    for k in ep8_tokens:
        for c in t:
            t[c].append(t[c][0])
        t["num_tokens"][-1], t["moe_ep_size"][-1], t["latency"][-1] = k, 8, 0.01 + 0.001 * k
    pq.write_table(pa.table(t, schema=pq.read_schema(path)), path)
    db = OpDB(PerfData.open(sp.SYSTEM, "trtllm", None, pack.systems_dir))
    kw = {"quant": "fp8_block", "hidden": site[0], "inter": site[1], "topk": site[2], "experts": site[3], "moe_tp": 1,
          "wide_ep": True}
    r = resolve_moe(db, moe_ep=4, **kw)
    assert r.how == "ep-transfer" and r.donors == ("EP2", "EP8") and r.source == WIDE_EP_TABLE
    axis = r.grid.axes[0]
    np.testing.assert_array_equal(axis, [4.0, 8.0, 16.0, 32.0, 64.0])  # the curves' common range
    e2, e8 = (resolve_moe(db, moe_ep=e, **kw) for e in (2, 8))
    l2, l8 = (e.grid(axis)[0] for e in (e2, e8))
    sol4 = moe_sol_fn(db, "fp8_block", *site, 1, 4, True)
    v, p = r.grid(axis)
    # b = (l2 - l8) / (1/2 - 1/8), a = l2 - b / 2, at EP4: a + b / 4 = l2 / 3 + 2 l8 / 3
    want = np.maximum(l2 / 3.0 + 2.0 * l8 / 3.0, l2 * sol4(axis) / e2.grid.sol(axis))
    np.testing.assert_allclose(v, want, rtol=1e-12)
    assert (p == Prov.TRANSFERRED).all()
    # EP16 lies beyond the last collected EP: the standard path (here: no moe table at all)
    with pytest.raises(NotAvailableError):
        resolve_moe(db, moe_ep=16, **{**kw, "experts": 16})


def test_wide_ep_nvfp4_real_pack(real_pack_available):
    """SGLang NVFP4 DeepSeek with DP32 x EP32 on gb200: the fp8_block DeepEP curve scaled by the SOL
    ratio (0.57-0.61 at these token counts), and the all-to-all dispatch instead of the gather."""
    from infercast.api import Estimator

    db = OpDB(PerfData.open("gb200", "sglang"))
    kw = dict(hidden=7168, inter=2048, topk=8, experts=256, moe_tp=1, moe_ep=32, distribution="power_law_1.01",
              wide_ep=True)
    fp8 = resolve_moe(db, quant="fp8_block", **kw)
    fp4 = resolve_moe(db, quant="nvfp4", **kw)
    assert fp4.source == WIDE_EP_TABLE and fp4.how == "quant-transfer"
    t = np.array([32.0, 256.0, 1024.0, 4096.0])
    ratio = fp4.grid(t)[0] / fp8.grid(t)[0]
    assert ((ratio > 0.55) & (ratio < 0.62)).all()
    est = Estimator("deepseek-ai/DeepSeek-V3", "gb200", "sglang", None, 1, 1, attention_dp=32, moe_ep=32, moe_tp=1,
                    gemm_quant="nvfp4", moe_quant="nvfp4")
    assert est.plan.parallel.moe_comm == "alltoall"


# ----------------------------------------------------------------------------------------------
# TensorRT-LLM's low-latency NVFP4 expert kernel at small batch
# ----------------------------------------------------------------------------------------------


def _kernel_table(rows):
    """A stand-in table (``keys`` only) of (kernel, tokens, site) rows at one pair (tp 8, ep 1)."""
    from types import SimpleNamespace

    kern, tokens, site = zip(*rows)
    keys = {"kernel_source": np.array(kern), "num_tokens": np.array(tokens, float),
            "moe_tp_size": np.full(len(rows), 8.0), "moe_ep_size": np.ones(len(rows))}
    for j, c in enumerate(("hidden_size", "inter_size", "topk", "num_experts")):
        keys[c] = np.array([s[j] for s in site], float)
    return SimpleNamespace(keys=keys)


def test_low_latency_rows_replace_cutlass_up_to_the_threshold_where_both_measured():
    from infercast.ops.moe import (
        TRTLLM_LOW_LATENCY_KERNEL,
        TRTLLM_LOW_LATENCY_MAX_TOKENS,
        _prefer_low_latency,
    )

    LL = TRTLLM_LOW_LATENCY_KERNEL
    a, b = (7168, 2048, 8, 256), (4096, 1536, 8, 128)
    cut = "moe_torch_flow_cutlass"
    rows = [(cut, n, a) for n in (1, 2, 64, 128, 256, 512)] + [(LL, n, a) for n in (1, 2, 128, 256)]
    rows += [(cut, n, b) for n in (1, 2, 256)]  # site b: no low-latency rows
    rows += [(cut, 4, a)]  # outside the mask below
    t = _kernel_table(rows)
    candidates = np.ones(len(rows), bool)
    candidates[-1] = False
    chosen = candidates & (t.keys["kernel_source"] == cut)  # what merge_kernels picks: CUTLASS first
    out = _prefer_low_latency(t, chosen, candidates, max_tokens=128)
    kept = {(k, int(n), s) for (k, n, s), m in zip(rows, out) if m}
    # at 1, 2 and 128 tokens the low-latency kernel's rows replace CUTLASS's ...
    assert {(LL, 1, a), (LL, 2, a), (LL, 128, a)} <= kept
    assert not {(cut, 1, a), (cut, 2, a), (cut, 128, a)} & kept
    # ... CUTLASS keeps 64 (not measured by the other), 256 and 512 (above the threshold), site b;
    # the low-latency row at 256 stays unused; the row outside the candidates is not brought in
    assert {(cut, 64, a), (cut, 256, a), (cut, 512, a), (cut, 1, b), (cut, 2, b), (cut, 256, b)} <= kept
    assert (LL, 256, a) not in kept and (cut, 4, a) not in kept
    assert out.sum() == 9  # one row per point
    # the default threshold, 512 tokens: decode steps, not prefill chunks
    assert TRTLLM_LOW_LATENCY_MAX_TOKENS == 512
    default = {(k, int(n), s) for (k, n, s), m in zip(rows, _prefer_low_latency(t, chosen, candidates)) if m}
    assert (LL, 256, a) in default and (cut, 256, a) not in default and (cut, 512, a) in default
    # a table without the low-latency kernel: the choice unchanged
    t2 = _kernel_table([r for r in rows if r[0] != LL])
    m2 = np.ones(len(t2.keys["num_tokens"]), bool)
    np.testing.assert_array_equal(_prefer_low_latency(t2, m2, m2), m2)


def test_expected_kernel_is_the_low_latency_one_up_to_the_threshold_when_in_force():
    from infercast.ops.moe import (
        TRTLLM_LOW_LATENCY_KERNEL,
        TRTLLM_LOW_LATENCY_MAX_TOKENS,
        _expected_kernel,
    )

    cut = "moe_torch_flow_cutlass"
    site = (7168, 2048, 8, 256)
    tokens = (1, 128, TRTLLM_LOW_LATENCY_MAX_TOKENS, TRTLLM_LOW_LATENCY_MAX_TOKENS + 1, 4096)
    t = _kernel_table([(cut, n, site) for n in tokens])
    rows = np.arange(len(tokens))
    low = TRTLLM_LOW_LATENCY_KERNEL
    assert list(_expected_kernel(t, rows, cut, True)) == [low, low, low, cut, cut]
    assert list(_expected_kernel(t, rows, cut, False)) == [cut] * len(tokens)


@pytest.mark.real_pack
def test_trtllm_b200_nvfp4_experts_run_the_low_latency_kernel_at_small_batch(real_pack_available):
    from infercast.ops.moe import TRTLLM_LOW_LATENCY_KERNEL

    db = _db("b200_sxm", "trtllm")
    r = resolve_moe(db, quant="nvfp4", moe_tp=8, moe_ep=1, **DSV3)
    low_t, low = _raw_moe(db, "nvfp4", 7168, 2048, 8, 256, 8, 1, TRTLLM_LOW_LATENCY_KERNEL)
    cut_t, cut = _raw_moe(db, "nvfp4", 7168, 2048, 8, 256, 8, 1, "moe_torch_flow_cutlass")
    mine = low_t <= 512  # the low-latency kernel's points up to 512 tokens are its own ...
    v, p = r.grid(low_t[mine])
    np.testing.assert_array_equal(v, low[mine])
    assert (p == Prov.EXACT).all()
    large = cut_t > 512  # ... CUTLASS answers above (prefill chunks)
    np.testing.assert_array_equal(r.grid(cut_t[large])[0], cut[large])
    # the low-latency kernel is the faster one at small batch (why the engine picks it)
    small = low_t <= 128
    assert np.all(low[small] < np.interp(low_t[small], cut_t, cut))
    # SGLang's table is untouched by the rule (its kernels are its own)
    rs = resolve_moe(_db("b200_sxm", "sglang"), quant="nvfp4", moe_tp=8, moe_ep=1, **DSV3)
    assert TRTLLM_LOW_LATENCY_KERNEL not in (rs.kernel or "")


@pytest.mark.real_pack
def test_trtllm_b200_nvfp4_transfer_donors_are_the_sites_served_with_the_low_latency_kernel(real_pack_available):
    """The two shapes with more than 256 experts have CUTLASS rows only; they are not where an
    uncollected shape borrows from, though CUTLASS has the most rows (ops.moe._expected_kernel)."""
    db = _db("b200_sxm", "trtllm")
    lat = _get_lattice(db, "nvfp4", True, "balanced")
    wide = lat.sites[:, 3] > 256
    assert wide.any()
    assert not lat.primary[wide].any()
    assert lat.primary[np.all(lat.sites[:, :4] == (7168, 2048, 8, 256), axis=1)].all()
    assert lat.primary[~wide].mean() > 0.95
    r = resolve_moe(db, quant="nvfp4", hidden=6656, inter=2048, topk=8, experts=256, moe_tp=8, moe_ep=1)
    assert r.how in ("idw", "multilinear")
    assert r.donors
    assert not any("experts=384" in d or "experts=512" in d for d in r.donors)


# ----------------------------------------------------------------------------------------------
# a kernel family the engine runs (ops.moe.resolve_moe(kernel=...)), from a peer table if need be
# ----------------------------------------------------------------------------------------------


def _kernel_pack(tmp_path):
    """One bf16 site: TensorRT-LLM measured it with "deepgemm" only; vLLM with a FlashInfer
    TensorRT-LLM-gen kernel at half that latency. Nobody measured CUTLASS."""
    from infercast.data.pack import find_pack

    pack = sp.make_pack(tmp_path / "pk")
    data = pack.systems_dir / "data" / sp.SYSTEM
    site, tokens = (1024, 512, 2, 8), [1, 2, 4, 8, 16, 32]
    base = np.array([0.01 + 0.001 * t for t in tokens])

    def table(backend, version, kernel, scale):
        n = len(tokens)
        cols = {
            "framework": [backend] * n, "version": [version] * n, "device": [sp.DEVICE] * n, "op_name": ["moe"] * n,
            "kernel_source": [kernel] * n, "moe_dtype": ["bfloat16"] * n, "num_tokens": tokens,
            "hidden_size": [site[0]] * n, "inter_size": [site[1]] * n, "topk": [site[2]] * n,
            "num_experts": [site[3]] * n, "moe_tp_size": [1] * n, "moe_ep_size": [1] * n,
            "distribution": ["balanced"] * n, "latency": [float(v) for v in base * scale],
        }
        types = {c: (pa.string() if isinstance(v[0], str) else pa.float64() if isinstance(v[0], float) else pa.int64())
                 for c, v in cols.items()}
        _write(data / "moe" / backend / version / "moe_perf.parquet", cols, types)

    table("trtllm", sp.TRTLLM_CURRENT, "deepgemm", 1.0)
    table("vllm", sp.VLLM_CURRENT, "vllm_x_flashinfer_trtllm_experts", 0.5)
    # TensorRT-LLM's previous collection measured a Triton kernel (vLLM's fused_moe name) that its
    # current one dropped
    table("trtllm", sp.TRTLLM_PREVIOUS, "vllm_fused_moe", 3.0)
    find_pack(str(pack.systems_dir))
    return pack, site, np.array(tokens, float), base


def test_moe_kernel_family_from_own_table_or_a_peer(tmp_path):
    pack, (h, i, k, e), tok, base = _kernel_pack(tmp_path)

    def resolve(kernel, mode="SILICON", backend="trtllm"):
        db = OpDB(PerfData.open(sp.SYSTEM, backend, None, pack.systems_dir), DatabaseMode.parse(mode))
        return resolve_moe(db, quant="bfloat16", hidden=h, inter=i, topk=k, experts=e, moe_tp=1, moe_ep=1, kernel=kernel)

    np.testing.assert_allclose(resolve(None).grid(tok)[0], base, rtol=1e-12)  # the table's own kernel
    np.testing.assert_allclose(resolve("deepgemm").grid(tok)[0], base, rtol=1e-12)  # ... by name
    r = resolve("trtllm")  # TensorRT-LLM did not measure it: vLLM's rows of the same kernels
    np.testing.assert_allclose(r.grid(tok)[0], base * 0.5, rtol=1e-12)
    assert any("trtllm MoE kernels from vllm" in n for n in r.notes)
    np.testing.assert_allclose(resolve("deepgemm", backend="vllm").grid(tok)[0], base, rtol=1e-12)  # and back
    with pytest.raises(InvalidInputError, match="unknown MoE kernel family"):
        resolve("bogus")
    # no backend measured the family: SILICON refuses, HYBRID keeps the table's own and says so
    with pytest.raises(NotAvailableError, match="no bfloat16 MoE rows of the cutlass kernels"):
        resolve("cutlass")
    hy = resolve("cutlass", mode="HYBRID")
    np.testing.assert_allclose(hy.grid(tok)[0], base, rtol=1e-12)
    assert any("no bfloat16 cutlass MoE rows" in n for n in hy.notes)
    # a family the current collection lacks comes from this backend's older collection first ...
    tr = resolve("triton")
    np.testing.assert_allclose(tr.grid(tok)[0], base * 3.0, rtol=1e-12)
    assert any(f"triton MoE kernels from trtllm {sp.TRTLLM_PREVIOUS}'s moe table (trtllm {sp.TRTLLM_CURRENT}'s has none"
               in n for n in tr.notes)
    # ... and is never looked for in a peer's older collection: vLLM has no Triton rows of its own
    with pytest.raises(NotAvailableError, match="no bfloat16 MoE rows of the triton kernels"):
        resolve("triton", backend="vllm")
    np.testing.assert_allclose(resolve(None).grid(tok)[0], base, rtol=1e-12)  # the default is untouched


def test_kernel_family_names():
    from infercast.ops.moe import KERNEL_FAMILY_NAMES, MOE_KERNELS, kernel_family_mask

    assert MOE_KERNELS == ("trtllm", "cutlass", "deepgemm", "triton")
    names = ["sglang_fused_moe_triton", "vllm_fused_moe", "vllm_fp8moe_flashinfer_trtllm_x", "deepgemm",
             "moe_torch_flow_cutlass", "vllm_unquantizedfusedmoe_flashinfer_cutlass_flashinferexperts"]

    from types import SimpleNamespace

    keys = {"kernel_source": np.array(names)}
    table = SimpleNamespace(latency=np.zeros(len(names)), keys=keys, has=lambda c: c in keys)
    got = {k: [n for n, m in zip(names, kernel_family_mask(table, k)) if m] for k in KERNEL_FAMILY_NAMES}
    assert got == {
        "triton": ["sglang_fused_moe_triton", "vllm_fused_moe"],
        "trtllm": ["vllm_fp8moe_flashinfer_trtllm_x"],
        "deepgemm": ["deepgemm"],
        "cutlass": ["moe_torch_flow_cutlass", "vllm_unquantizedfusedmoe_flashinfer_cutlass_flashinferexperts"],
    }


def test_estimator_moe_kernel_option(synth, real_pack_available):
    from infercast import Estimator

    with pytest.raises(InvalidInputError, match="needs an MoE model"):
        Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", moe_kernel="trtllm", systems_path=synth.systems_dir)
    with pytest.raises(InvalidInputError, match="unknown --moe-kernel 'bogus'"):
        Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", moe_kernel="bogus", systems_path=synth.systems_dir)
    # TensorRT-LLM's b200 fp8_block experts: its table measured DeepGEMM only; TRTLLM-gen comes from a peer
    own = Estimator("deepseek-ai/DeepSeek-R1", "b200_sxm", "trtllm", tp=8)
    gen = Estimator("deepseek-ai/DeepSeek-R1", "b200_sxm", "trtllm", tp=8, moe_kernel="TRTLLM")
    assert {o.params.get("kernel") for o in gen.plan.ops if o.kind == "moe"} == {"trtllm"}
    assert all("kernel" not in o.params for o in own.plan.ops)
    assert gen.decode_ms(16, 1024, 1024) < own.decode_ms(16, 1024, 1024)
    assert own.decode_ms(16, 1024, 1024) == Estimator("deepseek-ai/DeepSeek-R1", "b200_sxm", "trtllm", tp=8,
                                                      moe_kernel="deepgemm").decode_ms(16, 1024, 1024)


def test_moe_tp_octave_recovers_a_fixed_plus_parallel_split_exactly():
    """Latency a + b / moe_tp at every token count (a: routing and launches, b: the split work):
    from moe_tp 2 and 4 the octave to 8 is a + b / 8 exactly; a curve that would beat perfect
    scaling is held at it."""
    from infercast.interp.grid import Grid
    from infercast.ops.moe import TOKEN_SCALE, _fixed_plus_split

    tok = np.array([1.0, 16.0, 256.0, 4096.0])
    a, b = 0.02 + 1e-6 * tok, 0.1 + 4e-5 * tok

    def sol_at(tp):
        return lambda x: (1e-3 + 2e-5 * np.asarray(x, dtype=float)) / tp

    def grid(tp):
        return Grid((tok,), a + b / tp, np.zeros(len(tok), np.int8), sol_at(tp), scales=TOKEN_SCALE)

    g = _fixed_plus_split(grid(4), 4, grid(2), 2, 8, sol_at(8), ("moe_tp=4", "moe_tp=2"))
    np.testing.assert_allclose(g(tok)[0], a + b / 8, rtol=1e-12)
    assert (g.prov == Prov.TRANSFERRED).all()
    # a tp2 -> tp4 octave that more than halved latency (superlinear) is carried at perfect scaling
    fast = Grid((tok,), 3.0 * (a + b / 4), np.zeros(len(tok), np.int8), sol_at(2), scales=TOKEN_SCALE)
    g = _fixed_plus_split(grid(4), 4, fast, 2, 8, sol_at(8), ())
    np.testing.assert_allclose(g(tok)[0], (a + b / 4) / 2, rtol=1e-12)
    # curves that share fewer than two token counts give no answer
    lone = Grid((np.array([8192.0, 16384.0]),), np.array([1.0, 2.0]), np.zeros(2, np.int8), sol_at(2), scales=TOKEN_SCALE)
    assert _fixed_plus_split(grid(4), 4, lone, 2, 8, sol_at(8), ()) is None


# ----------------------------------------------------------------------------------------------
# an uncollected shape from another engine's table (ops.moe.peer_curve / resolve_moe "peer-transfer")
# ----------------------------------------------------------------------------------------------

PEER_TOKENS = np.array([1.0, 2.0, 4.0, 8.0, 16.0, 32.0])
PEER_SITES = [(1024, 512, 2, 8), (2048, 512, 2, 8), (1024, 1024, 2, 8), (2048, 1024, 2, 8)]
PEER_QUERY = (1536, 768, 2, 8)


def _peer_curve_of(site) -> np.ndarray:
    h, i, _, _ = site
    return 0.01 + 1e-9 * h * i * PEER_TOKENS


def _peer_lattice(sites, kernels, scale, pair=(1, 1)):
    """(sites (n, 6), curves by index, kernels): each site's curve x ``scale`` (a number, or an array
    over PEER_TOKENS, or a per-site list of either)."""
    scales = scale if isinstance(scale, list) else [scale] * len(sites)
    arr = np.array([(*s, *pair) for s in sites], float)
    curves = {i: ((PEER_TOKENS,), _peer_curve_of(s) * np.asarray(sc, float)) for i, (s, sc) in enumerate(zip(sites, scales))}
    return arr, curves, np.array(kernels, dtype=object)


def _own_and_peer(own_scale, peer_kernels=None, own_kernels=None, pair=(1, 1)):
    own = _peer_lattice(PEER_SITES, own_kernels or ["sglang_flashinfer_trtllm_moe"] * 4, own_scale)
    peer_kernels = peer_kernels or ["vllm_x_flashinfer_trtllm_experts"] * 5
    peer = _peer_lattice([*PEER_SITES, PEER_QUERY], peer_kernels, 1.0, pair)
    return own, peer


def test_kernel_family_of_a_kernel_name():
    from infercast.ops.moe import kernel_family

    assert kernel_family("sglang_flashinfer_trtllm_moe") == "trtllm"
    assert kernel_family("vllm_fp8moe_flashinfer_cutlass_flashinferexperts") == "cutlass"
    assert kernel_family("vllm_fused_moe") == kernel_family("sglang_fused_moe_triton") == "triton"
    assert kernel_family("sglang_marlin_moe") is None and kernel_family(None) is None


def test_peer_curve_scales_the_peers_measurement_by_the_engines_ratio():
    from infercast.ops.moe import peer_curve

    own, peer = _own_and_peer(0.8)
    pc = peer_curve(PEER_QUERY, 1, 1, "trtllm", *own, *peer)
    assert pc is not None and pc.index == 4 and pc.shared == 4
    np.testing.assert_allclose(pc.values, _peer_curve_of(PEER_QUERY) * 0.8, rtol=1e-12)
    assert pc.ratio == pytest.approx(0.8) and pc.spread == pytest.approx(0.0, abs=1e-12)
    # a ratio that changes along the tokens axis is carried point by point
    f = np.array([0.7, 0.75, 0.8, 0.9, 1.0, 1.1])
    own, peer = _own_and_peer(f)
    np.testing.assert_allclose(peer_curve(PEER_QUERY, 1, 1, "trtllm", *own, *peer).values,
                               _peer_curve_of(PEER_QUERY) * f, rtol=1e-12)


def test_peer_curve_refuses_an_unsteady_ratio_too_few_sites_or_another_kernel():
    from infercast.ops.moe import PEER_MIN_SITES, PEER_RATIO_SPREAD, peer_curve

    # per-site ratios 0.8 / 1.0 / 1.25 / 1.0: the engines differ by shape, not by a steady factor
    own, peer = _own_and_peer([0.8, 1.0, 1.25, 1.0])
    assert peer_curve(PEER_QUERY, 1, 1, "trtllm", *own, *peer) is None
    # just inside the spread gate (median absolute deviation of the log ratios) it serves
    d = PEER_RATIO_SPREAD * 0.9
    own, peer = _own_and_peer([np.exp(-d), np.exp(d), np.exp(d), np.exp(-d)])
    assert peer_curve(PEER_QUERY, 1, 1, "trtllm", *own, *peer) is not None
    # shared sites of another kernel family do not count: too few left
    other = ["sglang_fused_moe_triton"] * (len(PEER_SITES) - PEER_MIN_SITES + 1)
    own, peer = _own_and_peer(0.8, own_kernels=other + ["sglang_flashinfer_trtllm_moe"] * (PEER_MIN_SITES - 1))
    assert peer_curve(PEER_QUERY, 1, 1, "trtllm", *own, *peer) is None
    # the peer ran the query shape with another family than the one assumed for it
    own, peer = _own_and_peer(0.8, peer_kernels=["vllm_x_flashinfer_trtllm_experts"] * 4 + ["vllm_fused_moe"])
    assert peer_curve(PEER_QUERY, 1, 1, "trtllm", *own, *peer) is None
    assert peer_curve(PEER_QUERY, 1, 1, None, *_own_and_peer(0.8)[0], *_own_and_peer(0.8)[1]) is None
    # the peer measured the shape at another pair only
    own, peer = _own_and_peer(0.8, pair=(2, 1))
    assert peer_curve(PEER_QUERY, 1, 1, "trtllm", *own, *peer) is None


def _peer_transfer_pack(tmp_path, own_scales):
    """TensorRT-LLM measured the four PEER_SITES (curves x ``own_scales``), vLLM those and PEER_QUERY,
    all with FlashInfer TensorRT-LLM-gen kernels, bf16, one pair (1, 1)."""
    from infercast.data.pack import find_pack

    pack = sp.make_pack(tmp_path / "pk")
    data = pack.systems_dir / "data" / sp.SYSTEM

    def table(backend, version, kernel, sites, scales):
        cols = {c: [] for c in ("framework", "version", "device", "op_name", "kernel_source", "moe_dtype", "num_tokens",
                                "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size", "moe_ep_size",
                                "distribution", "latency")}
        for site, sc in zip(sites, scales):
            for t, v in zip(PEER_TOKENS, _peer_curve_of(site) * sc):
                for c, x in zip(cols, (backend, version, sp.DEVICE, "moe", kernel, "bfloat16", int(t), *site, 1, 1,
                                       "balanced", float(v))):
                    cols[c].append(x)
        types = {c: (pa.string() if isinstance(v[0], str) else pa.float64() if isinstance(v[0], float) else pa.int64())
                 for c, v in cols.items()}
        _write(data / "moe" / backend / version / "moe_perf.parquet", cols, types)

    table("trtllm", sp.TRTLLM_CURRENT, "trtllm_gen_moe", PEER_SITES, own_scales)
    table("vllm", sp.VLLM_CURRENT, "vllm_x_flashinfer_trtllm_experts", [*PEER_SITES, PEER_QUERY], [1.0] * 5)
    find_pack(str(pack.systems_dir))
    return pack


def test_uncollected_shape_from_a_peer_engine_in_resolve_moe(tmp_path):
    h, i, k, e = PEER_QUERY

    def resolve(pack, backend="trtllm", mode="SILICON"):
        db = OpDB(PerfData.open(sp.SYSTEM, backend, None, pack.systems_dir), DatabaseMode.parse(mode))
        return resolve_moe(db, quant="bfloat16", hidden=h, inter=i, topk=k, experts=e, moe_tp=1, moe_ep=1)

    r = resolve(_peer_transfer_pack(tmp_path, [0.8] * 4))
    assert r.how == "peer-transfer" and r.donors and r.donors[0].startswith(f"vllm {sp.VLLM_CURRENT}")
    np.testing.assert_allclose(r.grid(PEER_TOKENS)[0], _peer_curve_of(PEER_QUERY) * 0.8, rtol=1e-12)
    assert (r.grid(PEER_TOKENS)[1] == Prov.TRANSFERRED).all()
    assert any("trtllm/vllm latency ratio 0.80 (median over 4 shapes" in n for n in r.notes)
    # the engines disagree shape by shape: the shape transfers from TensorRT-LLM's own sites
    r = resolve(_peer_transfer_pack(tmp_path / "b", [0.8, 1.0, 1.25, 1.0]))
    assert r.how not in ("peer-transfer", "exact")
    # EMPIRICAL never reads a peer; the peer's own query is an exact hit
    assert resolve(_peer_transfer_pack(tmp_path / "c", [0.8] * 4), mode="EMPIRICAL").how == "empirical"
    assert resolve(_peer_transfer_pack(tmp_path / "d", [0.8] * 4), backend="vllm").how == "exact"
