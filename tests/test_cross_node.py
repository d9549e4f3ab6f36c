"""Collectives over groups that span nodes (ops.comm._cross_node, interp.sol.hierarchical_collective):
never an intra-node curve stretched across the network. Exact values on the synthetic pack
(8 GPUs per node, NVLink 2e11 B/s, network 5e10 B/s per GPU, P2P latency 10 us; NCCL rows over
2 / 4 / 8 GPUs from ``synthpack.nccl_ms``)."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import synthpack as sp

from infercast import Estimator
from infercast.data.database import PerfData
from infercast.errors import NotAvailableError
from infercast.interp import sol
from infercast.interp.provenance import Prov
from infercast.ops import comm
from infercast.ops.base import DatabaseMode, OpDB

INTRA_BW = 2e11
INTER_BW = 5e10
LAT_MS = 1e-2  # p2p_latency 1e-5 s
EB = 2.0  # bytes per element


def _db(pack, backend="trtllm", mode=DatabaseMode.SILICON):
    return OpDB(PerfData.open(sp.SYSTEM, backend, None, pack.systems_dir), mode)


def _edit_yaml(pack, old: str, new: str):
    path = pack.systems_dir / f"{sp.SYSTEM}.yaml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def _filter_table(pack, family, backend, version, stem, keep):
    path = pack.systems_dir / "data" / sp.SYSTEM / family / backend / version / f"{stem}.parquet"
    t = pq.read_table(path)
    pq.write_table(t.filter(keep(t)), path)


def _nccl(pack, keep):
    _filter_table(pack, "comm", "nccl", sp.NCCL_VERSION, "nccl_perf", keep)


# hand-written inter-node stage (ms) for a message of x elements over N nodes of 8
def _inter(op, x, nodes, d=8):
    if op == "alltoall":
        return LAT_MS + (nodes - 1) / nodes * x * EB / INTER_BW * 1e3
    f = 2.0 if op == "all_reduce" else 1.0
    return LAT_MS + f * (nodes - 1) / nodes * (x * EB / d) / INTER_BW * 1e3


X = np.array([2.0**9, 2.0**12, 2.0**16, 2.0**20, 2.0**24], float)


@pytest.fixture()
def pack(tmp_path):
    return sp.make_pack(tmp_path)


def test_all_reduce_over_two_nodes_is_hierarchical(pack):
    db = _db(pack)
    r = comm.resolve_collective(db, "all_reduce", 16)
    assert r.how == "hierarchical" and r.source == "nccl" and r.donors == ("num_gpus=8",)
    assert "2 nodes of 8" in r.notes[0] and "inter_node_bw" in r.notes[0] and "50 GB/s" in r.notes[0]
    v, p = r.grid(X)
    want = sp.nccl_ms("reduce_scatter", X, 8) + sp.nccl_ms("all_gather", X, 8) + _inter("all_reduce", X, 2)
    np.testing.assert_allclose(v, want, rtol=1e-12)
    assert (p == Prov.ANALYTIC).all()
    # one point by hand: x = 2^20 elements = 2 MiB; RS and AG over 8 GPUs each
    # 0.01 + 2^21 * 7/8 / 1.5e11 * 1e3; inter: 0.01 + 2 * 1/2 * 2^21 / 8 / 5e10 * 1e3
    x = 2.0**20
    hand = 2 * (0.01 + 2**21 * 7 / 8 / 1.5e11 * 1e3) + (0.01 + 2**21 / 8 / 5e10 * 1e3)
    assert r.grid.scalar(x)[0] == pytest.approx(hand, rel=1e-12)


@pytest.mark.parametrize(("op", "group"), [("all_gather", 16), ("all_gather", 32), ("reduce_scatter", 32), ("all_reduce", 64)])
def test_other_collectives_and_more_nodes(pack, op, group):
    r = comm.resolve_collective(_db(pack), op, group)
    nodes = group // 8
    intra = {"all_reduce": sp.nccl_ms("reduce_scatter", X, 8) + sp.nccl_ms("all_gather", X, 8),
             "all_gather": sp.nccl_ms("all_gather", X, 8), "reduce_scatter": sp.nccl_ms("reduce_scatter", X, 8)}[op]
    np.testing.assert_allclose(r.grid(X)[0], intra + _inter(op, X, nodes), rtol=1e-12)


def test_alltoall_is_the_slower_of_its_links(pack):
    r = comm.resolve_collective(_db(pack), "alltoall", 16)
    # the half of the buffer that stays in the node goes over NVLink (measured 8-GPU all-to-all of
    # x/2 elements) while the other half leaves through the network: the slower of the two
    want = np.maximum(sp.nccl_ms("alltoall", X / 2, 8), _inter("alltoall", X, 2))
    np.testing.assert_allclose(r.grid(X)[0], want, rtol=1e-12)
    # the network is 3x slower per byte here: it dominates at large messages
    assert r.grid.scalar(2.0**24)[0] == pytest.approx(_inter("alltoall", 2.0**24, 2), rel=1e-12)


def test_hierarchical_speed_of_light_by_hand(pack):
    system = _db(pack).system
    x = 2.0**20
    b = x * EB
    ring_intra = b * 7 / 8 / INTRA_BW * 1e3 + LAT_MS
    want = {
        "all_reduce": 2 * ring_intra + (LAT_MS + 2 * 0.5 * b / 8 / INTER_BW * 1e3),
        "all_gather": ring_intra + (LAT_MS + 0.5 * b / 8 / INTER_BW * 1e3),
        "reduce_scatter": ring_intra + (LAT_MS + 0.5 * b / 8 / INTER_BW * 1e3),
        "alltoall": max(b / 2 * 7 / 8 / INTRA_BW * 1e3 + LAT_MS, LAT_MS + 0.5 * b / INTER_BW * 1e3),
    }
    for op, w in want.items():
        assert sol.collective(system, op, b, 16)[0] == pytest.approx(w, rel=1e-12)
        assert float(sol.collective(system, op, np.array([b]), 16)[0][0]) == pytest.approx(w, rel=1e-12)
    # within the node: the ring over NVLink, as before
    assert sol.collective(system, "all_reduce", b, 8)[0] == pytest.approx(2 * b * 7 / 8 / INTRA_BW * 1e3 + LAT_MS, rel=1e-12)


def test_uneven_split_is_refused_in_silicon_and_empirical_in_hybrid(pack):
    with pytest.raises(NotAvailableError) as e:
        comm.resolve_collective(_db(pack), "all_reduce", 12)
    assert "do not split into whole nodes of 8" in str(e.value)
    r = comm.resolve_collective(_db(pack, mode=DatabaseMode.HYBRID), "all_reduce", 12)
    assert (r.grid.prov == Prov.EMPIRICAL).all()


def test_missing_intra_node_stage_is_named(pack):
    _nccl(pack, lambda t: pc.not_equal(t["op_name"], "reduce_scatter"))
    with pytest.raises(NotAvailableError) as e:
        comm.resolve_collective(_db(pack), "all_reduce", 16)
    msg = str(e.value)
    assert "hierarchical model (2 nodes x 8 GPUs)" in msg and "intra-node reduce_scatter over 8 GPUs" in msg
    # all-gather alone does not need it
    assert comm.resolve_collective(_db(pack), "all_gather", 16).how == "hierarchical"


def test_multi_node_table_rows_win(pack):
    # a pack that measured all_reduce over 16 GPUs: those rows answer 16 exactly, and 32 is
    # transferred from them (a multi-node curve), not from the 8-GPU one
    path = pack.systems_dir / "data" / sp.SYSTEM / "comm" / "nccl" / sp.NCCL_VERSION / "nccl_perf.parquet"
    t = pq.read_table(path)
    rows = t.filter(pc.and_(pc.equal(t["op_name"], "all_reduce"), pc.equal(t["num_gpus"], 8))).to_pydict()
    rows["num_gpus"] = [16] * len(rows["num_gpus"])
    rows["latency"] = [3.0 * v for v in rows["latency"]]
    import pyarrow as pa

    pq.write_table(pa.concat_tables([t, pa.Table.from_pydict(rows, schema=t.schema)]), path)
    db = _db(pack)  # custom_allreduce measured 2, 4, 8 GPUs only
    r16 = comm.resolve_collective(db, "all_reduce", 16)
    assert r16.how == "exact"
    np.testing.assert_allclose(r16.grid(X)[0], 3.0 * sp.nccl_ms("all_reduce", X, 8), rtol=1e-12)
    r32 = comm.resolve_collective(db, "all_reduce", 32)
    assert r32.how == "group-transfer" and r32.donors == ("num_gpus=16",)
    s = lambda g: sol.collective(db.system, "all_reduce", X * EB, g)[0]  # noqa: E731
    np.testing.assert_allclose(r32.grid(X)[0], 3.0 * sp.nccl_ms("all_reduce", X, 8) * s(32) / s(16), rtol=1e-12)


def test_groups_within_a_node_are_unchanged(pack):
    db = _db(pack)
    r = comm.resolve_collective(db, "all_gather", 8)
    assert r.how == "exact"
    np.testing.assert_allclose(r.grid(X)[0], sp.nccl_ms("all_gather", X, 8), rtol=0, atol=0)


def test_estimator_tp_across_two_nodes(pack):
    # 4 GPUs per node and no 8-GPU rows: TP 8 spans two nodes; its all-reduce is the hierarchical
    # one, with the intra-node stages measured over 4 GPUs
    _edit_yaml(pack, "num_gpus_per_node: 8", "num_gpus_per_node: 4")
    _nccl(pack, lambda t: pc.not_equal(t["num_gpus"], 8))
    _filter_table(pack, "comm", "trtllm", sp.TRTLLM_CURRENT, "custom_allreduce_perf", lambda t: pc.not_equal(t["num_gpus"], 8))
    est = Estimator("synth/tiny-llama", sp.SYSTEM, "trtllm", tp=8, systems_path=pack.systems_dir)
    ars = [c for c in est.engine.ops if c.op.kind == "allreduce"]
    assert ars
    for c in ars:
        r = c.resolved[0]
        assert r.how == "hierarchical" and "2 nodes of 4" in r.notes[0]
        x = 64.0 * c.x_per_token
        want = (sp.nccl_ms("reduce_scatter", x, 4) + sp.nccl_ms("all_gather", x, 4)
                + LAT_MS + 2 * 0.5 * (x * EB / 4) / INTER_BW * 1e3)
        assert r.grid.scalar(x, refuse=True)[0] == pytest.approx(float(want), rel=1e-12)
    rows = {b.op: b for b in est.static(4, 16, 8).breakdown}
    assert all(rows[c.name].provenance == "analytic" and rows[c.name].source["how"] == "hierarchical" for c in ars)


def test_cross_node_collective_beyond_its_stages_is_noted(pack):
    # the hierarchical grid spans the NCCL table's message sizes (up to 2^26 elements); a query
    # beyond them holds the edge, and the note says so
    from infercast.engine import beyond

    r = comm.resolve_collective(_db(pack), "all_reduce", 16)
    (e,) = beyond._check(r, (2.0**27,), ("message elements",), "x_allreduce", "prefill")
    assert e.above and e.hi == 2.0**26 and "message elements 134,217,728, measured up to 67,108,864" in e.text()
    assert beyond._check(r, (2.0**20,), ("message elements",), "x_allreduce", "prefill") == []
