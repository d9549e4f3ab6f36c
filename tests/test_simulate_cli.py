"""``infercast simulate`` on the synthetic pack: it runs, agrees with itself, and refuses bad
input with one line."""

from __future__ import annotations

import json

import pytest
import synthpack as sp
from browser import needs_browser, rendered_dom
from cli_helpers import assert_one_line_error, run_cli


def argv(synth, *extra):
    return ["simulate", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm",
            "--systems-path", str(synth.systems_dir), *extra]


def test_closed_loop_json(synth, capsys):
    rc, out, err = run_cli(capsys, argv(synth, "--concurrency", "4", "--isl", "128", "--osl", "8", "--json",
                                        "--warmup", "0", "--cooldown", "0"))
    assert rc == 0, err
    d = json.loads(out)
    assert d["requests"] == 40 and d["measured"] == 40
    assert d["latency"]["ttft_ms"]["mean"] > 0 and d["latency"]["tpot_ms"]["mean"] > 0
    assert d["prefix_hit_rate"] == 0.0 and d["prefix_lookup_tokens"] == 0


def test_front_end_spread_changes_the_closed_loop(synth, capsys):
    """--front-end-spread draws each request's front-end time around the modelled one: the run
    differs from the fixed front end, and the same seed repeats it exactly."""
    base = ("--concurrency", "4", "--isl", "128", "--osl", "8", "--json", "--warmup", "0", "--cooldown", "0")
    runs = []
    for extra in ((), ("--front-end-spread", "1"), ("--front-end-spread", "1")):
        rc, out, err = run_cli(capsys, argv(synth, *base, *extra))
        assert rc == 0, err
        runs.append(json.loads(out)["latency"]["ttft_ms"]["mean"])
    assert runs[1] != runs[0] and runs[1] == runs[2]


def test_client_start(synth, capsys):
    """--client-start: staggered spreads the first requests over one expected cycle (or
    --ramp-up-s) and the first wave's queue for prefill is gone, so the mean TTFT drops below the
    synchronised start's; auto (the default) on fixed lengths and a mixing engine keeps the first
    wave and spreads the clients after it; the notes say which."""
    base = ("--concurrency", "8", "--isl", "2048", "--osl", "16", "--json", "--warmup", "0", "--cooldown", "0")
    runs = {}
    for start in ("together", "staggered", "auto"):
        rc, out, err = run_cli(capsys, argv(synth, *base, "--client-start", start))
        assert rc == 0, err
        runs[start] = json.loads(out)
    assert runs["staggered"]["latency"]["ttft_ms"]["mean"] < runs["together"]["latency"]["ttft_ms"]["mean"]
    assert any("first requests spread evenly over one expected request cycle" in n for n in runs["staggered"]["notes"])
    assert any("auto: requests of one length" in n for n in runs["auto"]["notes"])
    rc, out, err = run_cli(capsys, argv(synth, *base))
    assert rc == 0, err
    assert json.loads(out)["latency"] == runs["auto"]["latency"]
    rc, out, err = run_cli(capsys, argv(synth, *base, "--client-start", "staggered", "--ramp-up-s", "2"))
    assert rc == 0, err
    assert any("a ramp-up of 2000 ms" in n for n in json.loads(out)["notes"])


def test_scheduler_field_turns_schedule_ahead_off(synth, capsys):
    """--scheduler schedule_ahead=false: TensorRT-LLM's scheduler composes between steps, so a
    request arriving during a step is taken one step sooner: the mean TTFT drops."""
    base = ("--request-rate", "20", "--num-requests", "60", "--isl", "512", "--osl", "64", "--json", "--warmup", "0",
            "--cooldown", "0")
    rc, out, err = run_cli(capsys, argv(synth, *base))
    assert rc == 0, err
    ahead = json.loads(out)["latency"]["ttft_ms"]["mean"]
    rc, out, err = run_cli(capsys, argv(synth, *base, "--scheduler", "schedule_ahead=false"))
    assert rc == 0, err
    assert json.loads(out)["latency"]["ttft_ms"]["mean"] < ahead


def test_open_loop_writes_out_and_plot(synth, tmp_path):
    """Run as a subprocess: the plot imports matplotlib, which other tests in this session treat
    as absent (they block its import through sys.modules)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    out_csv, png = tmp_path / "r.csv", tmp_path / "cdf.png"
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "-m", "infercast", *argv(
        synth, "--request-rate", "5", "--duration-s", "20", "--isl", "128", "--osl", "8", "--random-range-ratio", "0.5",
        "--replicas", "2", "--router", "least-outstanding", "--ttft-ms", "1000", "--out", str(out_csv),
        "--plot", str(png))], check=False, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "TTFT (ms)" in p.stdout and "goodput" in p.stdout and "warm-up" in p.stdout
    lines = out_csv.read_text().splitlines()
    assert len(lines) == 101 and lines[0].startswith("idx,replica,sent_ms")
    assert png.stat().st_size > 0


def test_trace_replay_with_prefix_cache(synth, capsys, tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps({"timestamp": 200 * i, "input_length": 128, "output_length": 4,
                                     "hash_ids": [7, 8, 100 + i]}) + "\n" for i in range(6)))
    common = ("--trace", str(p), "--block-tokens", "32", "--json", "--warmup", "0", "--cooldown", "0")
    rc, out, err = run_cli(capsys, argv(synth, *common))
    assert rc == 0, err
    on = json.loads(out)
    assert on["prefix_hit_rate"] == pytest.approx(5 * 64 / (6 * 96))
    rc, out, _ = run_cli(capsys, argv(synth, *common, "--no-prefix-cache"))
    off = json.loads(out)
    assert off["prefix_hit_rate"] is None
    assert on["latency"]["ttft_ms"]["mean"] < off["latency"]["ttft_ms"]["mean"]


@pytest.mark.parametrize("extra,needle", [
    (("--isl", "8", "--osl", "8"), "give exactly one load"),
    (("--concurrency", "2", "--request-rate", "1", "--isl", "8", "--osl", "8"), "give exactly one load"),
    (("--concurrency", "0", "--isl", "8", "--osl", "8"), "--concurrency must be >= 1"),
    (("--concurrency", "2"), "synthetic load needs --isl and --osl"),
    (("--request-rate", "-1", "--isl", "8", "--osl", "8"), "--request-rate must be a positive number"),
    (("--request-rate", "1", "--burstiness", "0", "--isl", "8", "--osl", "8"), "--burstiness must be a positive"),
    (("--concurrency", "2", "--isl", "8", "--osl", "8", "--random-range-ratio", "2"), "--random-range-ratio"),
    (("--concurrency", "2", "--isl", "8", "--osl", "8", "--warmup", "0.7", "--cooldown", "0.5"), "leave nothing"),
    (("--concurrency", "2", "--isl", "8", "--osl", "8", "--ttft-ms", "0"), "--ttft-ms must be a positive number"),
    (("--trace", "/nonexistent/t.jsonl"), "cannot read trace"),
    (("--trace", "x.jsonl", "--time-scale", "0"), "--time-scale must be a positive number"),
    (("--concurrency", "2", "--isl", "8", "--osl", "8", "--out", "r.txt"), "unknown file type"),
    (("--concurrency", "2", "--isl", "8", "--osl", "8", "--front-end-spread", "1.5"), "--front-end-spread"),
    (("--request-rate", "1", "--isl", "8", "--osl", "8", "--client-start", "staggered"), "they need --concurrency"),
    (("--concurrency", "2", "--isl", "8", "--osl", "8", "--ramp-up-s", "3"), "give it with --client-start staggered"),
    (("--concurrency", "2", "--isl", "8", "--osl", "8", "--client-start", "staggered", "--ramp-up-s", "-1"),
     "--ramp-up-s must be a duration >= 0"),
])
def test_bad_input(synth, capsys, extra, needle):
    assert_one_line_error(*run_cli(capsys, argv(synth, *extra)), needle)


def test_router_choice_is_checked(synth, capsys):
    rc, _, err = run_cli(capsys, argv(synth, "--concurrency", "2", "--isl", "8", "--osl", "8", "--router", "random"))
    assert rc == 2 and "invalid choice" in err


def test_disaggregated(synth, capsys):
    rc, out, err = run_cli(capsys, argv(synth, "--concurrency", "4", "--isl", "128", "--osl", "8", "--prefill-workers",
                                        "2", "--decode-workers", "1", "--decode-tp", "2", "--json"))
    assert rc == 0, err
    d = json.loads(out)
    assert d["disaggregated"] and d["gpus"] == 4
    assert d["latency"]["tpot_ms"]["mean"] > 0
    assert_one_line_error(*run_cli(capsys, argv(synth, "--concurrency", "4", "--isl", "128", "--osl", "8",
                                                "--prefill-workers", "2")), "needs --prefill-workers and --decode-workers")


def test_rate_schedule_load(synth, capsys):
    rc, out, err = run_cli(capsys, argv(synth, "--rate-schedule", "0:2,10:6", "--duration-s", "20", "--isl", "64",
                                        "--osl", "4", "--json", "--warmup", "0", "--cooldown", "0"))
    assert rc == 0, err
    assert 50 <= json.loads(out)["requests"] <= 110
    assert_one_line_error(*run_cli(capsys, argv(synth, "--rate-schedule", "1:2", "--isl", "8", "--osl", "8")),
                          "times must start at 0")


def test_engine_step_timer_matches_the_compiled_engine(synth):
    """The engine-backed step timer on the synthetic pack: mixed and prefill steps exactly the
    engine's ``mixed_step_ms`` plus the scheduler's host time; decode-only steps from the
    tabulated attention within 0.2% of the engine's padded decode step."""
    from collections import Counter
    from dataclasses import replace

    from infercast.api import Estimator
    from infercast.serving.backends import scheduler_params
    from infercast.serving.simulate import EngineStepTimer

    est = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", systems_path=synth.systems_dir)
    # host time per sequence and CUDA-graph padding, so that both parts of the wall time are checked
    params = replace(scheduler_params("trtllm", est.data.system, est.spec), seq_overhead_ms=0.01,
                     graph_batch_sizes=(1, 2, 4, 8, 16, 32, 64))
    timer = EngineStepTimer(est.engine, params)
    for chunks, n, kv in [([(500.0, 0.0)], 0, 0.0), ([(256.0, 0.0), (256.0, 0.0), (100.0, 300.0)], 7, 7 * 900.0),
                          ([(64.0, 960.0)], 30, 30 * 2500.0)]:
        g = Counter(chunks)
        gpu = est.engine.mixed_step_ms([float(v) for v in g.values()], [k[0] for k in g], [k[1] for k in g], float(n),
                                       kv / n if n else 1.0)
        assert timer.step_ms(chunks, n, kv) == pytest.approx(float(params.step_ms(gpu, n + len(chunks))), rel=1e-12)
    for n, kv_len in [(1, 300.0), (13, 1777.0), (64, 3000.0)]:
        ref = params.step_ms(est.engine.decode_scalar(float(n), kv_len, params.graph_pad(n)), n)
        assert timer.step_ms((), n, n * kv_len) == pytest.approx(float(ref), rel=2e-3)


def test_lengths_from_trace_and_trace_prefix(synth, capsys, tmp_path):
    p = tmp_path / "a.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0,100,3\n1,200,5\n")
    rc, out, err = run_cli(capsys, argv(synth, "--request-rate", "4", "--num-requests", "30", "--lengths-from", str(p),
                                        "--out", str(tmp_path / "r.csv"), "--warmup", "0", "--cooldown", "0"))
    assert rc == 0, err
    lines = (tmp_path / "r.csv").read_text().splitlines()[1:]
    assert len(lines) == 30
    assert {(int(x.split(",")[7]), int(x.split(",")[8])) for x in lines} <= {(100, 3), (200, 5)}
    rc, out, err = run_cli(capsys, argv(synth, "--trace", str(p), "--num-requests", "1", "--json"))
    assert rc == 0, err
    assert json.loads(out)["requests"] == 1


@pytest.fixture(scope="module")
def html_report(synth, tmp_path_factory):
    """``--report`` of a 2-replica open-loop run with a goodput target (subprocess, as the plot test)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path_factory.mktemp("simreport") / "sim.html"
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run([sys.executable, "-m", "infercast", *argv(
        synth, "--request-rate", "5", "--duration-s", "20", "--isl", "128", "--osl", "8", "--replicas", "2",
        "--ttft-ms", "1000", "--json", "--report", str(out))], check=False, capture_output=True, text=True, env=env,
        timeout=300)
    assert p.returncode == 0, p.stderr
    return out, json.loads(p.stdout)


def test_report_html_is_self_contained_with_the_summary(html_report):
    out, d = html_report
    text = out.read_text()
    assert "<script" in text and "src=\"http" not in text  # plotly.js inlined, nothing fetched
    # the table states the run's own statistics, as the JSON summary gives them
    assert f"{d['latency']['ttft_ms']['p99']:.2f}" in text and f"{d['latency']['tpot_ms']['p50']:.2f}" in text
    assert f"{d['goodput_rps']:.3f} req/s" in text and "warm-up and cool-down left out" in text
    assert "scheduler 0" in text and "scheduler 1" in text


@needs_browser
def test_report_html_renders_in_headless_chromium(html_report, tmp_path):
    out, _ = html_report
    dom = rendered_dom(out, tmp_path / "profile")
    assert dom.count('class="main-svg"') >= 1
    # 4 CDFs + 3 series x (sum + 2 schedulers) + the throughput line, each drawn as a scatter trace
    assert dom.count('class="trace scatter') >= 4 + 3 * 3 + 1
    assert "id=\"summary\"" in dom


@pytest.mark.parametrize("extra,needle", [
    (("--burstiness", "0.5"), "--burstiness"),
    (("--duration-s", "5"), "--duration-s"),
    (("--time-scale", "2"), "--time-scale"),
    (("--block-tokens", "16"), "--block-tokens"),
])
def test_load_flags_of_another_load_are_refused(synth, capsys, extra, needle):
    """Before: a closed loop took --burstiness, --duration-s, --time-scale and --block-tokens and
    ran as if they were not given. Now each is refused with the load it belongs to."""
    rc, out, err = run_cli(capsys, argv(synth, "--concurrency", "4", "--isl", "128", "--osl", "8", *extra))
    assert_one_line_error(rc, out, err, needle)


def test_shared_prefix_of_a_synthetic_load(synth, capsys):
    """--prefix P: every prompt is P shared tokens (whole blocks hashed alike) + --isl new ones; the
    prefix caches hold the prefix after the first requests, so the hit rate approaches P / (P + isl)
    of the prompt tokens looked up, and TTFT falls against prompts of P + isl uncached tokens."""
    from infercast.serving.simulate.load import synthetic

    w = synthetic(40, isl=128, osl=8, clients=4, prefix=64, block_tokens=16)
    assert (w.isl == 192).all() and w.hashes == [(0, 1, 2, 3)] * 40 and w.block_tokens == 16
    base = ("--concurrency", "4", "--osl", "8", "--json", "--warmup", "0", "--cooldown", "0")
    rc, out, err = run_cli(capsys, argv(synth, *base, "--isl", "128", "--prefix", "512"))
    assert rc == 0, err
    cached = json.loads(out)
    rc, out, err = run_cli(capsys, argv(synth, *base, "--isl", "640"))
    whole = json.loads(out)
    assert cached["prefix_hit_rate"] > 0.8 and whole["prefix_hit_rate"] == 0.0
    assert cached["latency"]["ttft_ms"]["mean"] < whole["latency"]["ttft_ms"]["mean"]
    for extra, needle in ((("--prefix", "-1"), "--prefix"), (("--block-tokens", "8"), "--block-tokens")):
        rc, out, err = run_cli(capsys, argv(synth, *base, "--isl", "128", *extra))
        assert_one_line_error(rc, out, err, needle)
    rc, out, err = run_cli(capsys, argv(synth, *base, "--isl", "128", "--prefix", "512", "--block-tokens", "32"))
    assert rc == 0, err
