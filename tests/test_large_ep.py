"""Large expert parallelism: the MoE dispatch + combine from the DeepEP tables (across hosts, from an
older collected version), group sizes carried within / across the NVLink domain, the moe_a2a
node count by NVLink domain, and plans at EP 16 / 32 / 64.

(a) synthetic: DeepEP tables written next to the synthetic pack (8-GPU hosts), values exact;
(b) real pack: the h100 / h200 SGLang multi-host rows, GB200's rack-wide EP 8.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import synthpack as sp
from infercast.data.database import PerfData
from infercast.interp.provenance import Prov
from infercast.ops.base import DatabaseMode, OpDB
from infercast.ops.comm import resolve_collective
from infercast.ops.moe import DEEPEP_DEFAULT_SMS, a2a_sol_fn, resolve_moe_dispatch
from infercast.ops.moe.a2a_tables import donor_ranks

SITE = dict(hidden=1024, topk=2, experts=128)
TOKENS = (1, 4, 16, 64, 256, 1024)
OLD = sp.TRTLLM_PREVIOUS  # the version holding the multi-host rows


def _normal_us(part: str, tokens, nodes: int, sms: int):
    """Synthetic DeepEP normal transmit time (us): grows with hosts, falls with SMs."""
    t = np.asarray(tokens, float)
    base = (30.0 + 0.02 * t) if part == "dispatch" else (40.0 + 0.03 * t)
    return base * nodes * (DEEPEP_DEFAULT_SMS / sms)


def _write(path, cols):
    types = {c: (pa.string() if isinstance(v[0], str) else pa.float64() if isinstance(v[0], float) else pa.int64())
             for c, v in cols.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_arrays([pa.array(cols[c], type=types[c]) for c in cols],
                                        schema=pa.schema([(c, types[c]) for c in cols])), path)


def _normal_table(path, nodes_sms):
    rows = [(nodes, sms, n) for nodes, sms in nodes_sms for n in TOKENS]
    N = len(rows)
    nodes_c, sms_c, n_c = (list(c) for c in zip(*rows))
    _write(path, {
        "framework": ["sglang"] * N, "version": ["0.5.0"] * N, "device": [sp.DEVICE] * N, "op_name": ["normal"] * N,
        "node_num": nodes_c, "kernel_source": ["deepep"] * N, "hidden_size": [SITE["hidden"]] * N,
        "num_token": n_c, "num_topk": [SITE["topk"]] * N, "num_experts": [SITE["experts"]] * N,
        "dispatch_sms": sms_c,
        "dispatch_transmit_us": [float(_normal_us("dispatch", n, a, s)) for a, s, n in rows],
        "dispatch_notify_us": [5.0] * N, "combine_sms": sms_c,
        "combine_transmit_us": [float(_normal_us("combine", n, a, s)) for a, s, n in rows],
        "combine_notify_us": [7.0] * N,
    })


@pytest.fixture(scope="module")
def ep_pack(tmp_path_factory):
    root = tmp_path_factory.mktemp("eppack")
    pack = sp.make_pack(root)
    comm = pack.systems_dir / "data" / sp.SYSTEM / "comm" / "trtllm"
    # the current version: one host (8 GPUs) at two SM budgets; the older one: 1, 2 and 4 hosts
    _normal_table(comm / sp.TRTLLM_CURRENT / "wideep_deepep_normal_perf.parquet", [(1, 8), (1, DEEPEP_DEFAULT_SMS)])
    _normal_table(comm / OLD / "wideep_deepep_normal_perf.parquet",
                  [(1, DEEPEP_DEFAULT_SMS), (2, DEEPEP_DEFAULT_SMS), (2, 8), (4, DEEPEP_DEFAULT_SMS)])
    return pack


def _db(pack, mode="SILICON") -> OpDB:
    return OpDB(PerfData.open(sp.SYSTEM, "trtllm", None, pack.systems_dir), DatabaseMode.parse(mode))


def _expected_ms(tokens, nodes):
    t = np.asarray(tokens, float)
    return (_normal_us("dispatch", t, nodes, DEEPEP_DEFAULT_SMS) + 5.0
            + _normal_us("combine", t, nodes, DEEPEP_DEFAULT_SMS) + 7.0) / 1000.0


def test_one_host_from_the_current_version_at_deepep_default_sms(ep_pack):
    r = resolve_moe_dispatch(_db(ep_pack), phase="context", ep=8, quant="bfloat16", **SITE)
    assert r.source == "wideep_deepep_normal" and r.how == "exact" and r.version == sp.TRTLLM_CURRENT
    v, p = r.grid(np.array(TOKENS, float))
    np.testing.assert_allclose(v, _expected_ms(TOKENS, 1), rtol=1e-12)  # transmit + notify, 20 SMs (not 8)
    assert (p == Prov.EXACT).all()


@pytest.mark.parametrize("ep,nodes", [(16, 2), (32, 4)])
def test_multi_host_rows_from_an_older_version(ep_pack, ep, nodes):
    r = resolve_moe_dispatch(_db(ep_pack), phase="prefill", ep=ep, quant="bfloat16", **SITE)
    assert r.source == "wideep_deepep_normal" and r.how == "exact" and r.version.startswith(OLD)
    np.testing.assert_allclose(r.grid(np.array(TOKENS, float))[0], _expected_ms(TOKENS, nodes), rtol=1e-12)
    assert any(f"node_num={nodes}" in n for n in r.notes)


def test_unmeasured_hosts_carried_through_the_all_to_all_roofline(ep_pack):
    db = _db(ep_pack)
    r = resolve_moe_dispatch(db, phase="context", ep=64, quant="bfloat16", **SITE)  # 8 hosts: 4 measured
    assert r.how == "ep-transfer" and r.donors[-1] == "ep=32"
    t = np.array(TOKENS, float)
    h, k = SITE["hidden"], SITE["topk"]
    ratio = a2a_sol_fn(db.system, h, k, 64, 2.0)(t) / a2a_sol_fn(db.system, h, k, 32, 2.0)(t)
    v, p = r.grid(t)
    np.testing.assert_allclose(v, _expected_ms(t, 4) * ratio, rtol=1e-12)
    assert (p == Prov.TRANSFERRED).all()
    # within the node: EP 4 from the 8-GPU rows, never from a multi-host curve
    r4 = resolve_moe_dispatch(db, phase="context", ep=4, quant="bfloat16", **SITE)
    assert r4.how == "ep-transfer" and r4.donors[-1] == "ep=8"
    ratio4 = a2a_sol_fn(db.system, h, k, 4, 2.0)(t) / a2a_sol_fn(db.system, h, k, 8, 2.0)(t)
    np.testing.assert_allclose(r4.grid(t)[0], _expected_ms(t, 1) * ratio4, rtol=1e-12)


def test_no_deepep_table_for_the_phase_falls_back_to_hierarchical_nccl(ep_pack):
    db = _db(ep_pack)
    r = resolve_moe_dispatch(db, phase="generation", ep=16, quant="bfloat16", **SITE)  # no ll table
    assert r.source == "nccl" and r.how == "hierarchical"
    assert any("wideep_deepep_ll" in n for n in r.notes) and any("NCCL alltoall x2" in n for n in r.notes)
    tok = np.array([4.0, 64.0, 1024.0])
    kh = SITE["topk"] * SITE["hidden"]
    np.testing.assert_allclose(r.grid(tok)[0], 2.0 * resolve_collective(db, "alltoall", 16).grid(tok * kh)[0], rtol=1e-12)


def test_donor_ranks_stay_on_their_side_of_the_nvlink_domain():
    hgx = SimpleNamespace(node=SimpleNamespace(nvlink_gpus=8, gpus_per_node=8))
    rack = SimpleNamespace(node=SimpleNamespace(nvlink_gpus=72, gpus_per_node=4))
    assert donor_ranks(hgx, [8], 8) == 8
    assert donor_ranks(hgx, [8], 16) is None  # an intra-node curve never answers a group across nodes
    assert donor_ranks(hgx, [8, 16], 32) == 16
    assert donor_ranks(hgx, [16, 32], 8) is None  # nor the reverse
    assert donor_ranks(hgx, [8], 4) == 8  # smallest above when none below
    assert donor_ranks(hgx, [16], 256) is None  # 4 octaves: beyond the gate
    # GB200 / GB300: the rack is one NVLink domain, so EP 8 (two trays) comes from the 4-GPU rows
    assert donor_ranks(rack, [4], 8) == 4
    assert donor_ranks(rack, [4], 32) == 4
    assert donor_ranks(rack, [4], 64) is None


# ----------------------------------------------------------------------------------------------
# (b) real pack
# ----------------------------------------------------------------------------------------------

def _real(system, backend):
    return OpDB.shared(PerfData.open(system, backend), DatabaseMode.SILICON)


@pytest.mark.real_pack
def test_h100_two_hosts_read_from_the_deepep_table(real_pack_available):
    """8192 tokens per rank over 2 H100 hosts: the 0.5.6.post2 normal rows at 20 SMs (5.7 ms);
    the hierarchical NCCL path said 18.8 ms."""
    db = _real("h100_sxm", "sglang")
    r = resolve_moe_dispatch(db, phase="context", hidden=7168, topk=8, experts=256, ep=16, quant="fp8_block")
    assert r.source == "wideep_deepep_normal" and r.how == "exact" and r.version.startswith("0.5.6.post2")
    t = pq.read_table(PerfData.open("h100_sxm", "sglang", "0.5.6.post2").locate("wideep_deepep_normal").path).to_pandas()
    row = t[(t.node_num == 2) & (t.num_token == 8192) & (t.dispatch_sms == DEEPEP_DEFAULT_SMS)
            & (t.hidden_size == 7168) & (t.num_topk == 8) & (t.num_experts == 256)]
    assert len(row) == 1
    want = float((row.dispatch_transmit_us + row.dispatch_notify_us + row.combine_transmit_us + row.combine_notify_us).iloc[0]) / 1e3
    assert r.grid(np.array([8192.0]))[0][0] == pytest.approx(want, rel=1e-12)
    assert 5.0 < want < 6.5


@pytest.mark.real_pack
def test_gb200_ep8_within_the_rack_from_moe_a2a(real_pack_available):
    r = resolve_moe_dispatch(_real("gb200", "trtllm"), phase="generation", hidden=7168, topk=8, experts=256, ep=8,
                             quant="fp8_block")
    assert r.source == "moe_a2a" and r.how == "ep-transfer" and r.donors[-1] == "ep=4"


@pytest.mark.real_pack
def test_other_backends_across_hosts_use_sglangs_deepep_measurement(real_pack_available):
    r = resolve_moe_dispatch(_real("h200_sxm", "vllm"), phase="context", hidden=7168, topk=8, experts=256, ep=32,
                             quant="fp8_block")
    assert r.source == "wideep_deepep_normal" and any("sglang's collector" in n for n in r.notes)


@pytest.mark.real_pack
@pytest.mark.parametrize("ep", [32, 64])
def test_sglang_wide_ep_plan_at_large_ep(real_pack_available, ep):
    from infercast.api import Estimator

    e = Estimator("deepseek-ai/DeepSeek-V3", "h200_sxm", "sglang", tp=1, attention_dp=ep, moe_ep=ep)
    assert e.plan.parallel.moe_comm == "alltoall"
    res = e.static(batch_size=8, isl=2048, osl=256)  # the low-latency table (<= 256 tokens here) is not asked at prefill
    assert res.ttft_ms > 0 and res.tpot_ms > 0
    dispatch = next(c for c in e.engine.ops if c.op.kind == "moe_dispatch")
    assert [r.source for r in dispatch.resolved] == ["wideep_deepep_normal", "wideep_deepep_ll"]
    assert all(r.how == "exact" for r in dispatch.resolved)


@pytest.mark.real_pack
@pytest.mark.parametrize("backend", ["trtllm", "vllm"])
def test_all_to_all_plan_on_engines_without_wide_ep_expert_tables(real_pack_available, backend):
    """A plan that asks for the all-to-all path (``ParallelConfig.moe_comm``) on TensorRT-LLM or vLLM:
    dispatch from the DeepEP measurement across hosts, experts from the standard moe table (noted)."""
    from infercast.api import Estimator
    from infercast.data.model_configs import resolve_model
    from infercast.models.fusions import engine_fusions
    from infercast.models.plan import ParallelConfig, build_plan
    from infercast.models.spec import build_spec

    data = PerfData.open("h200_sxm", backend)
    spec = build_spec(resolve_model(data.pack, "deepseek-ai/DeepSeek-V3"))
    par = ParallelConfig(1, 1, 32, None, 32, moe_comm="alltoall")
    plan = build_plan(spec, par, None, engine_fusions(backend, spec, par, data.system))
    e = Estimator.from_plan(plan, "h200_sxm", backend)
    res = e.static(batch_size=8, isl=1024, osl=128)
    assert res.ttft_ms > 0 and res.tpot_ms > 0
    ops = {c.op.kind: c for c in e.engine.ops}
    assert "allgather" not in ops and "reduce_scatter" not in ops
    assert ops["moe_dispatch"].resolved[0].source == "wideep_deepep_normal"
    experts = ops["moe"].resolved[0]
    assert experts.source == "moe" and any("no wide-EP expert tables" in n for n in experts.notes)
