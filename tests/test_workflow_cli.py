"""The workflow commands as a user meets them: ``recommend`` and ``exp`` on the synthetic pack
(JSON answers, saved files) and their bad input (one line, exit 2, the key and line named)."""

from __future__ import annotations

import json

from cli_helpers import assert_one_line_error, run_cli

import synthpack as sp


def _base(synth):
    return ["--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm", "--systems-path", str(synth.systems_dir)]


def test_recommend_json_and_save_dir(synth, capsys, tmp_path):
    rc, out, err = run_cli(capsys, ["recommend", *_base(synth), "--isl", "128", "--osl", "8", "--rate", "20",
                                    "--mode", "agg", "--ttft-ms", "inf", "--tpot-ms", "inf", "--json", "--quiet",
                                    "--save-dir", str(tmp_path / "rec")])
    assert rc == 0, err
    d = json.loads(out)
    assert d["targets"] == {"ttft_ms": None, "tpot_ms": None} and d["rate"] == 20.0
    recs = d["recommendations"]
    assert recs and recs[0]["capacity_requests_per_s"] >= 20.0
    assert [r["gpus"] for r in recs] == sorted(r["gpus"] for r in recs)
    assert (tmp_path / "rec" / "results.csv").exists() and (tmp_path / "rec" / "top" / "agg-1" / "launch_agg.sh").exists()


def test_recommend_bad_input(synth, capsys):
    base = [*_base(synth), "--isl", "128", "--osl", "8"]
    assert_one_line_error(*run_cli(capsys, ["recommend", *base]), "--rate", "--clients")
    assert_one_line_error(*run_cli(capsys, ["recommend", *base, "--rate", "-3"]), "positive")
    assert_one_line_error(*run_cli(capsys, ["recommend", *base, "--clients", "4", "--ttft-ms", "0"]), "--ttft-ms")


EXP = f"""\
defaults:
  model: {sp.MODEL_ID}
  system: {sp.SYSTEM}
  isl: 128
  osl: 8
experiments:
  - name: served
    backend: trtllm
    layout: {{tp: 2}}
    concurrency: [1, 4]
  - name: searched
    backends: [trtllm, vllm]
    concurrency: [1, 4]
"""


def test_exp_runs_and_saves(synth, capsys, tmp_path):
    f = tmp_path / "e.yaml"
    f.write_text(EXP)
    rc, out, err = run_cli(capsys, ["exp", str(f), "--systems-path", str(synth.systems_dir), "--json", "--quiet",
                                    "--save-dir", str(tmp_path / "out")])
    assert rc == 0, err
    res = json.loads(out)["results"]
    assert [(r["experiment"], r["backend"]) for r in res] == [("served", "trtllm"), ("searched", "trtllm"),
                                                              ("searched", "vllm")]
    assert [row["concurrency"] for row in res[0]["rows"]] == [1, 4]
    assert (tmp_path / "out" / "searched" / f"{sp.SYSTEM}-trtllm" / "report.html").exists()
    assert (tmp_path / "out" / "served" / f"{sp.SYSTEM}-trtllm" / "outcome.json").exists()
    rc, out, err = run_cli(capsys, ["exp", str(f), "--systems-path", str(synth.systems_dir), "--quiet"])
    assert rc == 0 and "served" in out and "searched" in out


def test_exp_yaml_errors_name_key_and_line(capsys, tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text(EXP.replace("layout: {tp: 2}", "layout: {tp: 2, tpz: 1}"))
    assert_one_line_error(*run_cli(capsys, ["exp", str(f)]), "experiments[0].layout.tpz", "line 9", "unknown key")
    f.write_text(EXP.replace("  osl: 8", "  osl: -8"))
    assert_one_line_error(*run_cli(capsys, ["exp", str(f)]), "defaults.osl", "line 5")
    assert_one_line_error(*run_cli(capsys, ["exp", str(tmp_path / "missing.yaml")]), "cannot read")
