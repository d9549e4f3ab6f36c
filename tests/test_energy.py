"""Energy where the tables measured power (issue #37 item 6): power x latency resolved and
interpolated as latency is, the coverage of the GPU time, per request / per token for estimate,
serve and serve-disagg, and "not available" (never 0) where nothing was measured.

Synthetic pack: a copy whose TensorRT-LLM 1.0 attention tables carry a ``power`` column
(``POWER_BASE + POWER_PER_BATCH x batch_size`` watts, varying by row), so every expected energy
is exact. Real pack: b200_sxm vLLM's MoE rows with power (its 0.22.0 Triton table) and h200 (none).
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import synthpack as sp
from cli_helpers import run_cli

from infercast.api import Estimator
from infercast.engine.energy import EnergyModel, StepEnergy, energy_view

POWER_BASE, POWER_PER_BATCH = 300.0, 10.0


def _power(batch) -> np.ndarray:
    return POWER_BASE + POWER_PER_BATCH * np.asarray(batch, dtype=float)


@pytest.fixture(scope="module")
def powered(tmp_path_factory):
    """The synthetic pack with measured power in its trtllm 1.0 attention tables."""
    pack = sp.make_pack(tmp_path_factory.mktemp("powerpack"))
    for stem in ("context_attention_perf", "generation_attention_perf"):
        path = pack.systems_dir / "data" / sp.SYSTEM / "attention" / "trtllm" / sp.TRTLLM_CURRENT / f"{stem}.parquet"
        t = pq.read_table(path)
        t = t.append_column("power", pa.array(_power(t.column("batch_size").to_numpy())))
        t = t.append_column("power_limit", pa.array(np.full(t.num_rows, 1000.0)))
        pq.write_table(t, path)
    return pack


def _est(pack, **kw):
    return Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=pack.systems_dir, **kw)


def _attn(est):
    (op,) = [o for o in est.plan.ops if o.kind == "attention"]
    return op


def test_energy_view_is_power_times_latency(powered):
    est = _est(powered)
    t = est.data.table("context_attention")
    v = energy_view(t)
    assert np.array_equal(v.latency, t.values["latency"] * t.values["power"])
    assert v.keys is t.keys and energy_view(t) is v
    with pytest.raises(Exception, match="no measured power"):
        energy_view(est.data.table("gemm"))


def test_exact_points_and_coverage(powered):
    est = _est(powered)
    m = EnergyModel(est.engine)
    assert m.available and m.measured == ("attention",)
    op = _attn(est)
    h, d = op.params["heads"], op.params["head_dim"]
    # a measured context point: batch 4, isl 256
    lat = sp.ctx_ms(4, 256, h, d) * op.count
    comps = est.engine.components(ctx_batch=4, ctx_isl=256, phase="prefill")
    assert comps["attention"][0] == pytest.approx(lat, rel=1e-12)
    e = m.step(ctx_batch=4, ctx_isl=256, phase="prefill")
    assert e.energy_mj == pytest.approx(float(_power(4)) * lat, rel=1e-9)
    assert e.covered_ms == pytest.approx(lat, rel=1e-12)
    assert e.gpu_ms == pytest.approx(sum(float(v) for v, _ in comps.values()), rel=1e-12)
    assert 0 < e.coverage < 1
    # a measured generation point: batch 8, 63 cached tokens (KV length 64)
    lat_g = sp.gen_ms(8, 63, op.params["kv_heads"], d) * op.count
    g = m.step(dec_batch=8, dec_kv=64, phase="decode")
    assert g.energy_mj == pytest.approx(float(_power(8)) * lat_g, rel=1e-9)
    assert g.covered_ms == pytest.approx(lat_g, rel=1e-12)


def test_between_batches_energy_blends_as_latency(powered):
    """Batch 6 lies halfway between the measured 4 and 8: latency and energy blend linearly there,
    so the energy is the mean of the two measured energies (not the mean power x the mean time)."""
    est = _est(powered)
    m = EnergyModel(est.engine)
    op = _attn(est)
    h, d = op.params["heads"], op.params["head_dim"]
    e4, e8 = (float(_power(b)) * sp.ctx_ms(b, 256, h, d) * op.count for b in (4, 8))
    lat = float(est.engine.components(ctx_batch=6, ctx_isl=256, phase="prefill")["attention"][0])
    assert lat == pytest.approx(0.5 * (sp.ctx_ms(4, 256, h, d) + sp.ctx_ms(8, 256, h, d)) * op.count, rel=1e-9)
    assert m.step(ctx_batch=6, ctx_isl=256, phase="prefill").energy_mj == pytest.approx(0.5 * (e4 + e8), rel=1e-9)


def test_estimate_energy_per_request_and_token(powered, capsys):
    argv = ["estimate", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm",
            "--systems-path", str(powered.systems_dir), "--batch", "4", "--isl", "256", "--osl", "2"]
    rc, out, err = run_cli(capsys, [*argv, "--json"])
    assert rc == 0, err
    d = json.loads(out)
    e = d["energy"]
    m = EnergyModel(_est(powered).engine)
    # one prefill step of the batch and one decode step (KV length 257), shared by 4 requests, on 1 GPU
    step = m.step(ctx_batch=4, ctx_isl=256, phase="prefill") + m.step(dec_batch=4, dec_kv=257, phase="decode")
    assert e["available"] is True and e["measured_ops"] == ["attention"]
    assert e["measured_j_per_request"] == pytest.approx(step.energy_mj / 4 / 1e3, rel=1e-9)
    assert e["measured_j_per_token"] == pytest.approx(e["measured_j_per_request"] / 2, rel=1e-12)
    assert e["coverage"] == pytest.approx(step.coverage, rel=1e-9)
    # the bound: every other GPU-second of the request at the system's TDP (sp.GPU power)
    gpu_s = 2 / d["tokens_per_s_per_gpu"]
    tdp = float(sp.SYSTEM_GPU["power"])
    assert e["tdp_w"] == tdp
    assert e["upper_bound_j_per_request"] == pytest.approx(
        e["measured_j_per_request"] + (gpu_s - step.covered_ms / 4 / 1e3) * tdp, rel=1e-9)
    rc, out, err = run_cli(capsys, argv)
    assert rc == 0 and "energy (measured part," in out and "J/token" in out and "upper bound" in out


def test_serve_energy_is_the_steady_step_mix(powered, capsys):
    from infercast.api import serve_agg_replica
    from infercast.serving.energy import agg_energy

    est = _est(powered)
    res, _ = serve_agg_replica(est, 8, 256, 16)
    mix = res.step_mix
    m = EnergyModel(est.engine)
    step = StepEnergy()
    for w, shape in mix["steps"]:
        step = step + m.step(**shape).scaled(w)
    e = agg_energy(est, res, 16)
    assert e["measured_j_per_request"] == pytest.approx(step.energy_mj / mix["requests"] / 1e3, rel=1e-12)
    assert 0 < e["coverage"] < 1 and e["upper_bound_j_per_request"] > e["measured_j_per_request"]
    rc, out, err = run_cli(capsys, ["serve", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm",
                                    "--systems-path", str(powered.systems_dir), "--concurrency", "8", "--isl", "256",
                                    "--osl", "16", "--json"])
    assert rc == 0, err
    assert json.loads(out)["energy"]["measured_j_per_request"] == pytest.approx(e["measured_j_per_request"], rel=1e-9)


def test_serve_disagg_energy(powered, capsys):
    rc, out, err = run_cli(capsys, ["serve-disagg", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm",
                                    "--systems-path", str(powered.systems_dir), "--concurrency", "8", "--isl", "256",
                                    "--osl", "16", "--prefill-workers", "1", "--decode-workers", "1", "--json"])
    assert rc == 0, err
    d = json.loads(out)
    e = d["energy"]
    m = EnergyModel(_est(powered).engine)
    k, dec = d["prefill_batch"], max(d["decode_batch"], 1.0)
    pre = m.step(ctx_batch=float(k), ctx_isl=256.0).scaled(1.0 / k)
    de = m.step(dec_batch=dec, dec_kv=256 + 8.0).scaled(15.0 / dec)  # no CUDA-graph padding on trtllm
    assert e["measured_j_per_request"] == pytest.approx((pre + de).energy_mj / 1e3, rel=1e-9)
    assert e["coverage"] == pytest.approx((pre + de).coverage, rel=1e-9)


def test_no_power_is_not_available_never_zero(synth, capsys):
    argv = ["--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm", "--systems-path", str(synth.systems_dir),
            "--isl", "256", "--osl", "16"]
    for cmd in (["estimate"], ["serve", "--concurrency", "4"]):
        rc, out, err = run_cli(capsys, [*cmd, *argv, "--json"])
        assert rc == 0, err
        e = json.loads(out)["energy"]
        assert e["available"] is False and e["coverage"] == 0.0
        assert e["measured_j_per_request"] is None and e["measured_j_per_token"] is None
        assert e["upper_bound_j_per_request"] is None
        rc, out, err = run_cli(capsys, [*cmd, *argv])
        assert "energy: not available" in out


def test_sol_mode_measures_nothing(powered):
    assert not EnergyModel(_est(powered, database_mode="SOL").engine).available


# ---- real pack ------------------------------------------------------------------------------
def test_real_b200_vllm_moe_power(real_pack_available, capsys):
    """vLLM on b200: the Triton expert kernels are in the 0.22.0 MoE table, which measured power;
    attention and GEMMs come from 0.24.0, which did not."""
    base = ["--model", "Qwen/Qwen3-30B-A3B", "--system", "b200_sxm", "--backend", "vllm", "--isl", "1024", "--osl", "128",
            "--json"]
    rc, out, err = run_cli(capsys, ["serve", *base, "--moe-kernel", "triton", "--concurrency", "16"])
    assert rc == 0, err
    e = json.loads(out)["energy"]
    assert e["available"] and e["measured_ops"] == ["moe_experts"] and 0.2 < e["coverage"] < 1.0
    assert 0 < e["measured_j_per_token"] < e["upper_bound_j_per_token"]
    est = Estimator("Qwen/Qwen3-30B-A3B", "b200_sxm", "vllm", moe_kernel="triton")
    step = EnergyModel(est.engine).step(dec_batch=16, dec_kv=1100, phase="decode")
    # the experts' mean power while they run: within the measured 243-1,023 W
    assert 243 <= step.energy_mj / step.covered_ms <= 1023
    rc, out, err = run_cli(capsys, ["estimate", *base, "--moe-kernel", "triton", "--batch", "8"])
    assert rc == 0 and json.loads(out)["energy"]["coverage"] > 0.2


def test_real_h200_not_available(real_pack_available, capsys):
    rc, out, err = run_cli(capsys, ["serve", "--model", "Qwen/Qwen3-30B-A3B", "--system", "h200_sxm", "--backend", "vllm",
                                    "--isl", "1024", "--osl", "128", "--concurrency", "16", "--json"])
    assert rc == 0, err
    e = json.loads(out)["energy"]
    assert e["available"] is False and e["measured_j_per_request"] is None


def test_search_candidates_carry_energy(powered, synth, capsys):
    def best(pack):
        rc, out, err = run_cli(capsys, ["search", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm",
                                        "--systems-path", str(pack.systems_dir), "--isl", "256", "--osl", "16",
                                        "--max-gpus", "1", "--concurrency", "4", "--json", "--ttft-ms", "inf",
                                        "--tpot-ms", "inf"])
        assert rc == 0, err
        return json.loads(out)["best"]

    b = best(powered)
    from infercast.api import serve_agg_replica
    from infercast.serving.energy import agg_energy

    est = _est(powered)
    res, _ = serve_agg_replica(est, 4, 256, 16)
    e = agg_energy(est, res, 16)
    assert b["energy_j_per_token"] == pytest.approx(e["measured_j_per_token"], rel=1e-9)
    assert b["energy_coverage"] == pytest.approx(e["coverage"], rel=1e-9)
    plain = best(synth)
    assert plain["energy_j_per_token"] is None and plain["energy_coverage"] is None
