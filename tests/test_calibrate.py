"""`infercast calibrate`: the fit recovers known constants of a synthetic engine, the readers of
each measured-run format, the profile applied by --calibration, and the command's errors."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import synthpack as sp
from cli_helpers import assert_one_line_error, run_cli

from infercast.api import Estimator, serve_agg_replica
from infercast.calibrate.fit import HOST, fit_runs
from infercast.calibrate.formats import MeasuredRun, read_runs
from infercast.calibrate.profile import load_profile
from infercast.calibrate.run import agg_predictor, calibrate_runs
from infercast.errors import InvalidInputError
from infercast.serving.backends import scheduler_params
from infercast.serving.scaled import PhaseScaledEngine

TRUTH = {"arrival_delay_ms": 37.0, "front_end_per_stream_ms": 1.3, "front_end_per_prompt_token_ms": 0.011,
         "step_overhead_ms": 0.8}
SHAPES = [(1, 512), (4, 1024), (16, 256), (32, 2048), (8, 4096), (64, 1024)]


@pytest.fixture(scope="module")
def engine(synth):
    est = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)
    return est, scheduler_params("trtllm", est.data.system, est.spec)


def _measured(est, params, shapes=SHAPES, osl=64):
    runs = []
    for c, isl in shapes:
        r, _ = serve_agg_replica(est, c, isl, osl, params)
        runs.append(MeasuredRun("synthetic", c, isl, osl, r.ttft_ms, r.tpot_ms))
    return runs


def test_recovers_known_host_constants(engine):
    est, base = engine
    runs = _measured(est, replace(base, **TRUTH))
    # noise-free runs: no pull toward the defaults
    prof = calibrate_runs(runs, agg_predictor(est, base, runs), base, {"backend": "trtllm"}, gpu="off", ridge=1e-6)
    assert set(prof.values) == set(TRUTH)  # leave-one-out frees all four: the runs identify them
    for k, v in TRUTH.items():
        assert prof.values[k] == pytest.approx(v, rel=0.01), k
    assert prof.summary["ttft_median_ape_before"] > 0.1
    assert prof.summary["ttft_median_ape_after"] < 1e-3 and prof.summary["tpot_median_ape_after"] < 1e-3
    assert prof.concurrency_range == (1, 64)


def test_recovers_gpu_scales(engine):
    est, base = engine
    truth = {"prefill_scale": 1.2, "decode_scale": 0.9}
    host = replace(base, **TRUTH)
    runs = _measured(est, replace(host, **truth), SHAPES[:4])
    m_t = np.array([r.ttft_ms for r in runs])
    m_p = np.array([r.tpot_ms for r in runs])
    start = {p.name: getattr(host, p.name) for p in HOST} | {"prefill_scale": 1.0, "decode_scale": 1.0}
    got = fit_runs(agg_predictor(est, host, runs), m_t, m_p, start, sets=[tuple(truth)], ridge=1e-6)
    for k, v in truth.items():
        assert got.values[k] == pytest.approx(v, rel=0.01), k


def test_default_prior_moves_toward_the_truth(engine):
    est, base = engine
    runs = _measured(est, replace(base, **TRUTH))
    prof = calibrate_runs(runs, agg_predictor(est, base, runs), base, {"backend": "trtllm"}, gpu="off")
    assert prof.summary["ttft_median_ape_after"] < prof.summary["ttft_median_ape_before"] / 3
    moved = [k for k in TRUTH if k in prof.values]
    assert moved and all(abs(prof.values[k] - TRUTH[k]) < abs(getattr(base, k) - TRUTH[k]) for k in moved)


def test_defaults_kept_when_runs_match_them(engine):
    est, base = engine
    runs = _measured(est, base, SHAPES[:4])
    prof = calibrate_runs(runs, agg_predictor(est, base, runs), base, {"backend": "trtllm"})
    assert prof.values == {}  # nothing to move: the simplest set (the defaults) predicts runs left out
    assert prof.summary["ttft_median_ape_after"] == pytest.approx(0.0, abs=1e-9)


class _Const:
    """Every step: 10 ms per prefill sequence-chunk present plus 1 ms per decode."""

    def step_ms(self, ctx_batch=0.0, ctx_isl=1.0, ctx_prefix=0.0, dec_batch=0.0, dec_kv=1.0, dec_pad=0.0):
        return 10.0 * (np.asarray(ctx_batch) > 0) + 1.0 * np.asarray(dec_batch, float)

    def mixed_step_ms(self, ctx_batch, ctx_isl, ctx_prefix, dec_batch, dec_kv):
        return 10.0 + dec_batch

    def decode_scalar(self, batch, kv, pad=0.0):
        return float(batch)


def test_phase_scaled_engine_scales_each_phase():
    e = PhaseScaledEngine(_Const(), 2.0, 0.5)
    assert float(e.step_ms(ctx_batch=1, ctx_isl=100, dec_batch=4, dec_kv=10)) == pytest.approx(2 * 10 + 0.5 * 4)
    assert float(e.step_ms(dec_batch=4, dec_kv=10)) == pytest.approx(2.0)
    assert float(e.step_ms(ctx_batch=1, ctx_isl=100)) == pytest.approx(20.0)
    assert e.mixed_step_ms([1], [100], [0], 4, 10) == pytest.approx(22.0)
    assert e.decode_scalar(6, 10) == pytest.approx(3.0)
    arr = e.step_ms(dec_batch=np.array([0.0, 2.0]), dec_kv=np.array([1.0, 1.0]))
    assert np.allclose(arr, [0.0, 1.0])


# ------------------------------------------------------------------ readers


def _aiperf_json(path, conc=8, ttft=120.0, itl=9.5, model="synth/tiny-llama"):
    doc = {"time_to_first_token": {"unit": "ms", "avg": ttft, "p50": ttft * 0.9, "p99": ttft * 2},
           "inter_token_latency": {"unit": "ms", "avg": itl, "p50": itl, "p99": itl * 1.5},
           "request_latency": {"unit": "ms", "avg": 700.0, "p50": 650.0, "p99": 900.0},
           "input_sequence_length": {"unit": "tokens", "avg": 1000.0}, "output_sequence_length": {"unit": "tokens", "avg": 64.0},
           "input_config": {"endpoint": {"model_names": [model], "streaming": True},
                            "loadgen": {"concurrency": conc}}}
    path.write_text(json.dumps(doc))
    return path


def _aiperf_csv(path, ttft=130.0, itl=8.0):
    path.write_text(
        "Metric,avg,min,max,p1,p5,p10,p25,p50,p75,p90,p95,p99,std\n"
        f"Request Latency (ms),700,600,900,600,600,600,600,650,700,800,850,900,10\n"
        f"Time to First Token (ms),{ttft},100,200,100,100,100,100,125,140,150,160,190,5\n"
        f"Inter Token Latency (ms),{itl},7,9,7,7,7,7,8,8,8,9,9,0.2\n"
        "Input Sequence Length (tokens),512,512,512,512,512,512,512,512,512,512,512,512,0\n"
        "Output Sequence Length (tokens),64,64,64,64,64,64,64,64,64,64,64,64,0\n"
        "\nMetric,Value\nRequest Throughput (requests/sec),13.2\nRequest Count,200\n")
    return path


def _vllm_json(path, conc=16, model="synth/tiny-llama"):
    path.write_text(json.dumps({"model_id": model, "max_concurrency": conc, "num_prompts": 100, "completed": 100,
                                "total_input_tokens": 102400, "total_output_tokens": 12800, "mean_ttft_ms": 210.5,
                                "median_ttft_ms": 200.0, "p99_ttft_ms": 400.0, "mean_tpot_ms": 11.25,
                                "median_tpot_ms": 11.0, "p99_tpot_ms": 14.0}))
    return path


def test_readers(tmp_path):
    a = read_runs([_aiperf_json(tmp_path / "profile_export_aiperf.json")])[0]
    assert (a.concurrency, a.isl, a.osl, a.ttft_ms, a.tpot_ms, a.model) == (8, 1000, 64, 120.0, 9.5, "synth/tiny-llama")
    assert read_runs([tmp_path / "profile_export_aiperf.json"], statistic="p99")[0].ttft_ms == 240.0
    c = read_runs([_aiperf_csv(tmp_path / "profile_export_aiperf.csv")], concurrency=4)[0]
    assert (c.concurrency, c.isl, c.osl, c.ttft_ms, c.tpot_ms) == (4, 512, 64, 130.0, 8.0)
    assert read_runs([tmp_path / "profile_export_aiperf.csv"], statistic="median", concurrency=4)[0].ttft_ms == 125.0
    v = read_runs([_vllm_json(tmp_path / "bench.json")])[0]
    assert (v.concurrency, v.isl, v.osl, v.ttft_ms, v.tpot_ms) == (16, 1024, 128, 210.5, 11.25)
    assert read_runs([tmp_path / "bench.json"], statistic="median")[0].tpot_ms == 11.0


def test_reader_errors(tmp_path):
    with pytest.raises(InvalidInputError, match="does not say the benchmark's concurrency"):
        read_runs([_aiperf_csv(tmp_path / "x.csv")])
    with pytest.raises(InvalidInputError, match="unknown format"):
        read_runs([tmp_path / "x.csv"], fmt="genai-perf")
    (tmp_path / "other.json").write_text('{"hello": 1}')
    with pytest.raises(InvalidInputError, match="cannot tell the format"):
        read_runs([tmp_path / "other.json"])


def _silicon_csv(path, rows):
    from infercast.validate.silicon import REQUIRED_COLUMNS

    cols = list(REQUIRED_COLUMNS)
    lines = [",".join(cols)]
    for i, (c, isl, ttft, tpot) in enumerate(rows):
        rec = {k: "" for k in cols}
        rec.update(id=f"r{i}_c{c}_", backend="trtllm", model_path=sp.MODEL_ID, system=sp.SYSTEM, mode="agg", isl=isl,
                   osl=64, batch_size=c, tp_size=1, pp_size=1, attention_dp_size=1, silicon_ttft_ms=ttft,
                   silicon_tpot_ms=tpot)
        lines.append(",".join(str(rec[k]) for k in cols))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_silicon_reader(tmp_path):
    runs = read_runs([_silicon_csv(tmp_path / "s.csv", [(2, 256, 50.0, 5.0), (8, 512, 80.0, 6.0)])])
    assert [(r.concurrency, r.isl, r.ttft_ms, r.tpot_ms) for r in runs] == [(2, 256, 50.0, 5.0), (8, 512, 80.0, 6.0)]


# ------------------------------------------------------------------ command line


def _flags(synth):
    return ["--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm", "--systems-path", str(synth.systems_dir)]


def test_cli_calibrate_and_apply(synth, engine, tmp_path, capsys):
    est, base = engine
    measured = _measured(est, replace(base, **TRUTH), SHAPES[:5])
    csv = _silicon_csv(tmp_path / "runs.csv", [(r.concurrency, r.isl, r.ttft_ms, r.tpot_ms) for r in measured])
    prof_path = tmp_path / "cal.yaml"
    rc, out, err = run_cli(capsys, ["calibrate", *_flags(synth), str(csv), "--out", str(prof_path), "--gpu-scales", "off",
                                    "--prior-weight", "1e-6"])
    assert rc == 0, err
    assert "TTFT median APE" in out and "written:" in out
    prof = load_profile(prof_path)
    assert prof.values["arrival_delay_ms"] == pytest.approx(37.0, rel=0.01)
    assert prof.concurrency_range == (1, 32)
    rc, out, err = run_cli(capsys, ["serve", *_flags(synth), "--concurrency", "16", "--isl", "1024", "--osl", "64",
                                    "--json", "--calibration", str(prof_path)])
    assert rc == 0, err
    d = json.loads(out)
    assert d["scheduler"]["arrival_delay_ms"] == pytest.approx(prof.values["arrival_delay_ms"])
    truth, _ = serve_agg_replica(est, 16, 1024, 64, replace(base, **TRUTH))
    assert d["ttft_ms"] == pytest.approx(truth.ttft_ms, rel=0.01)
    assert not any("extrapolated" in n for n in d["notes"])
    rc, out, err = run_cli(capsys, ["serve", *_flags(synth), "--concurrency", "128", "--isl", "1024", "--osl", "64",
                                    "--json", "--calibration", str(prof_path)])
    assert any("concurrency 128 is outside" in n for n in json.loads(out)["notes"])
    # a flag given still wins over the profile
    rc, out, err = run_cli(capsys, ["serve", *_flags(synth), "--concurrency", "16", "--isl", "1024", "--osl", "64",
                                    "--json", "--calibration", str(prof_path), "--front-end-ms", "5"])
    assert json.loads(out)["scheduler"]["arrival_delay_ms"] == 5.0
    rc, out, err = run_cli(capsys, ["search", *_flags(synth), "--isl", "128", "--osl", "8", "--concurrency", "4,64",
                                    "--json", "--calibration", str(prof_path)])
    assert rc == 0, err
    assert json.loads(out)["calibration"]["extrapolated_concurrencies"] == [64]
    rc, out, err = run_cli(capsys, ["serve-disagg", *_flags(synth), "--prefill-workers", "2", "--decode-workers", "1",
                                    "--concurrency", "8", "--isl", "128", "--osl", "8", "--json",
                                    "--calibration", str(prof_path)])
    assert rc == 0, err
    d = json.loads(out)
    for role in ("scheduler_prefill", "scheduler_decode"):
        assert d[role]["step_overhead_ms"] == pytest.approx(prof.values["step_overhead_ms"])
    assert any(n.startswith("calibration (") for n in d["notes"])
    rc, out, err = run_cli(capsys, ["estimate", *_flags(synth), "--isl", "128", "--osl", "8", "--json",
                                    "--calibration", str(prof_path)])
    assert rc == 0 and any("not used (the static estimate" in n for n in json.loads(out)["notes"])
    rc, out, err = run_cli(capsys, ["serve", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "vllm",
                                    "--systems-path", str(synth.systems_dir), "--concurrency", "4", "--isl", "128",
                                    "--osl", "8", "--calibration", str(prof_path)])
    assert_one_line_error(rc, out, err, "fitted on trtllm, not vllm")


def test_cli_errors(synth, tmp_path, capsys):
    aj = _aiperf_json(tmp_path / "a.json", model="meta-llama/Other-Model")
    rc, out, err = run_cli(capsys, ["calibrate", *_flags(synth), str(aj)])
    assert_one_line_error(rc, out, err, "measured model meta-llama/Other-Model", sp.MODEL_ID)
    rc, out, err = run_cli(capsys, ["calibrate", *_flags(synth), str(aj), "--format", "genai-perf"])
    assert_one_line_error(rc, out, err, "unknown format 'genai-perf'", "aiperf-json")
    empty = _silicon_csv(tmp_path / "empty.csv", [])
    rc, out, err = run_cli(capsys, ["calibrate", *_flags(synth), str(empty)])
    assert_one_line_error(rc, out, err, "no measured runs")
    rc, out, err = run_cli(capsys, ["calibrate", *_flags(synth), str(tmp_path / "missing.json")])
    assert_one_line_error(rc, out, err, "not found")
    ok = _aiperf_json(tmp_path / "ok.json")
    rc, out, err = run_cli(capsys, ["calibrate", *_flags(synth), str(ok), "--prior-weight", "-1"])
    assert_one_line_error(rc, out, err, "--prior-weight must be a finite number >= 0")
    bad = tmp_path / "bad.yaml"
    bad.write_text("values: {}\n")
    rc, out, err = run_cli(capsys, ["serve", *_flags(synth), "--concurrency", "4", "--isl", "128", "--osl", "8",
                                    "--calibration", str(bad)])
    assert_one_line_error(rc, out, err, "is not a calibration profile")


# ------------------------------------------------------------------ the benchmark's pieces


def _row(id_, ttft, tpot, source, conc=8, tp=2):
    from infercast.validate.silicon import SiliconRow, WorkerSpec

    return SiliconRow(id_, "vllm", "0.1", "m/x", "h200_sxm", "agg", 1024, 128, conc, "fp8", None, ttft, tpot,
                      worker=WorkerSpec(conc, tp=tp), source=source)


def test_noise_floor_pairs_repeated_configurations():
    """Pairwise APE over a configuration's distinct values: an exact re-export counts once, a
    configuration measured once or differing in layout is no repeat, and the over-1% set leaves
    out values that differ by rounding only."""
    from benchmarks.calibration import noise_floor

    rows = [_row("a1", 100.0, 10.0, "f1"), _row("a2", 110.0, 10.0, "f2"), _row("a3", 100.0, 10.0, "f3"),  # a3: a1 again
            _row("b1", 50.0, 5.0, "f1", conc=4), _row("b2", 50.0001, 5.0, "f2", conc=4),  # b: differs by 2e-6 only
            _row("c1", 70.0, 7.0, "f1", conc=16), _row("c2", 80.0, 8.0, "f1", conc=16, tp=4)]  # c: two layouts
    nf = noise_floor(rows)
    assert (nf["configurations"], nf["repeated"], nf["different"]) == (4, 2, 2)
    assert nf["all"]["configurations"] == 2 and nf["all"]["pairs"] == 4
    over = nf["over_1pct"]
    assert over["configurations"] == 1 and over["pairs"] == 2
    assert sorted(over["ttft"]) == pytest.approx([10.0 / 110.0, 10.0 / 100.0])
    assert list(over["tpot"]) == [0.0, 0.0]


def test_benchmark_calibration_rows_are_lowest_middle_highest():
    from benchmarks.calibration import pick

    assert pick([1, 2, 4, 8, 16, 32, 64]) == [0, 3, 6]
    assert pick([4, 4, 8, 8, 16, 16]) == [0, 3, 5]
