"""TensorRT-LLM's all-reduce over a TP group that spans nodes of one NVLink rack
(ops.comm._rack_transfer): transferred from the backend's own largest measured group, exactly,
on a synthetic pack whose system is given a 16-GPU rack."""

from __future__ import annotations

import numpy as np
import pytest
import synthpack as sp

from infercast.data.database import PerfData
from infercast.interp import sol
from infercast.ops import comm as comm_ops
from infercast.ops.base import DatabaseMode, OpDB


def _pack(tmp_path, rack: int | None):
    p = sp.make_pack(tmp_path)
    if rack is not None:
        path = p.systems_dir / f"{sp.SYSTEM}.yaml"
        text = path.read_text()
        path.write_text(text.replace("node:\n", f"node:\n  num_gpus_per_rack: {rack}\n  inter_rack_bw: 10000000000\n", 1))
    return p


def _db(pack, backend="trtllm"):
    return OpDB(PerfData.open(sp.SYSTEM, backend, None, pack.systems_dir), DatabaseMode.SILICON)


def _sol(db, group, x):
    return sol.collective(db.system, "all_reduce", np.asarray(x, float) * comm_ops.ELEMENT_BYTES, group)[0]


def test_group_in_the_rack_comes_from_the_backends_kernel(tmp_path):
    db = _db(_pack(tmp_path, rack=16))
    r = comm_ops.resolve_collective(db, "all_reduce", 16)
    assert r.source == "custom_allreduce" and r.how == "group-transfer" and r.donors == ("num_gpus=8",)
    x = np.array(sp.AR_MESSAGE_SIZES[::4], float)
    want = sp.ar_ms(x, 8) * _sol(db, 16, x) / _sol(db, 8, x)
    np.testing.assert_allclose(r.grid(x)[0], want, rtol=1e-12)
    # measured group sizes are answered from the table as before, bit for bit
    r8 = comm_ops.resolve_collective(db, "all_reduce", 8)
    assert r8.how == "exact"
    np.testing.assert_allclose(r8.grid(x)[0], sp.ar_ms(x, 8), rtol=0, atol=0)


@pytest.mark.parametrize(("rack", "group"), [(None, 16), (16, 32)])
def test_beyond_the_rack_or_without_one_nccl_answers(tmp_path, rack, group):
    db = _db(_pack(tmp_path, rack=rack))
    r = comm_ops.resolve_collective(db, "all_reduce", group)
    assert r.source == "nccl"


def test_other_backends_keep_nccl(tmp_path):
    pack = _pack(tmp_path, rack=16)
    assert comm_ops._rack_transfer(_db(pack, "vllm"), None, 16, None) is None
