"""Every result says which ops it answered beyond their measured tables (engine.beyond): the op,
the axis, the query, the measured bound and the op's share of TTFT / TPOT. Synthetic pack:
context attention measured at isl 16..2048 (batch x isl <= 8192), generation attention at
step 1..4095; tiny-llama has 2 layers (one ``attention`` op of count 2)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import synthpack as sp
from cli_helpers import run_cli

from infercast import Estimator
from infercast.api import serve_agg, serve_disagg
from infercast.engine import beyond

NOTE = "attention answered outside its measured table"


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return sp.make_pack(tmp_path_factory.mktemp("held"))


@pytest.fixture(scope="module")
def est(pack):
    return Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=pack.systems_dir)


def _attn(est):
    (c,) = [c for c in est.engine.ops if c.name == "attention"]
    return c


def _note(notes, head=NOTE):
    hits = [n for n in notes if n.startswith(head)]
    assert len(hits) == 1, notes
    return hits[0]


def test_static_note_names_axis_value_bound_and_shares(est):
    res = est.static(1, 4096, 64)
    note = _note(res.notes)
    assert "prefill tokens per sequence 4,096, measured up to 2,048" in note
    # the last decode step has 4096 + 63 tokens, 4158 of them cached before the new one
    assert "decode cached tokens 4,158, measured up to 4,095" in note
    c = _attn(est)
    # TTFT: the prefill step of one 4096-token prompt; attention's part of it over the whole
    ttft_share = c.resolved[0].grid.scalar(1.0, 4096.0)[0] * c.op.count / res.ttft_ms
    assert 0.5 < ttft_share < 1.0
    assert f"({ttft_share:.1%} of TTFT)" in note
    # TPOT: the mean over the 63 decode steps (KV 4097 .. 4159) of attention over the whole step
    kv = np.arange(4097.0, 4160.0)
    attn = sum(c.resolved[1].grid.scalar(1.0, k - 1.0)[0] * c.op.count for k in kv)
    total = sum(est.decode_step_ms(1, k) for k in kv)
    assert f"({attn / total:.1%} of TPOT)" in note
    assert res.tpot_ms == pytest.approx(total / len(kv), rel=1e-9)


def test_inside_the_tables_no_note(est):
    res = est.static(8, 100, 8)
    assert not [n for n in res.notes if "answered outside" in n]


def test_truncated_corner_and_low_edge(est):
    # batch 16 x isl 1024: the table measured batch up to 8 at that length (batch x isl <= 8192)
    note = _note(est.static(16, 1024, 8).notes)
    assert "prefill batch 16, measured up to 8" in note
    # isl 8: below the first measured length
    note = _note(est.static(1, 8, 4).notes)
    assert "prefill tokens per sequence 8, measured from 16" in note


def test_excursions_keep_the_farthest_query():
    a = beyond.Excursion("x", "decode", "cached tokens", 5000.0, 1.0, 4095.0)
    b = beyond.Excursion("x", "decode", "cached tokens", 6000.0, 1.0, 4095.0)
    assert beyond.farthest([a, b]) == [b]
    assert beyond.number(1234567.0) == "1,234,567" and beyond.number(5.794) == "5.794"


def test_serving_results_carry_the_notes(est):
    res = serve_agg(est, 1, 4096, 64)
    note = _note(res.notes)
    assert "prefill tokens per sequence 4,096, measured up to 2,048" in note and "% of TTFT)" in note
    assert "decode cached tokens 4,158, measured up to 4,095" in note and "~" in note
    assert res.to_dict()["notes"] == res.notes
    d = serve_disagg(est, est, concurrency=2, isl=4096, osl=64, prefill_workers=1, decode_workers=1)
    assert any("prefill tokens per sequence 4,096" in n for n in d.notes)
    assert any("decode cached tokens 4,158" in n for n in d.notes)


def _argv(pack, cmd, *extra):
    return [cmd, "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm",
            "--systems-path", str(pack.systems_dir), "--isl", "4096", "--osl", "64", *extra]


def test_cli_estimate_json_and_console(pack, capsys):
    rc, out, _ = run_cli(capsys, _argv(pack, "estimate", "--batch", "1", "--json"))
    assert rc == 0
    note = _note(json.loads(out)["notes"])
    assert "tokens per sequence 4,096, measured up to 2,048" in note
    rc, out, _ = run_cli(capsys, _argv(pack, "estimate", "--batch", "1"))
    assert rc == 0
    flat = " ".join(out.split())
    assert NOTE in flat and "measured up to 2,048" in flat


def test_cli_serve_json_and_console(pack, capsys):
    rc, out, _ = run_cli(capsys, _argv(pack, "serve", "--concurrency", "1", "--json"))
    assert rc == 0
    assert "measured up to 4,095" in _note(json.loads(out)["notes"])
    rc, out, _ = run_cli(capsys, _argv(pack, "serve", "--concurrency", "1"))
    assert rc == 0 and NOTE in " ".join(out.split())


def test_token_wise_share_matches_the_breakdown(est):
    # 16 prompts of 1024 tokens: the GEMMs run at m = 16,384, beyond the table's 4,096
    res = est.static(16, 1024, 8)
    rows = {b.op: b for b in res.breakdown}
    note = _note(res.notes, "gate_up_gemm answered outside")
    assert "prefill tokens 16,384, measured up to 4,096" in note
    assert f"({rows['gate_up_gemm'].prefill_ms / res.ttft_ms:.1%} of TTFT)" in note
    assert rows["gate_up_gemm"].provenance == "held"
    # decode: 16 tokens per step, inside the table: no decode part
    assert "decode" not in note
