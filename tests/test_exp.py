"""Experiments files: the schema refuses bad keys and values naming the key's path and line,
defaults merge into each experiment, and experiments run on the synthetic pack (served layouts
match ``serve``; searches keep their best)."""

from __future__ import annotations

from pathlib import Path

import pytest

import synthpack as sp
from infercast.api import Estimator, serve_agg_replica
from infercast.errors import ConfigFileError
from infercast.exp import load_experiments, parse_experiments
from infercast.exp.run import run_experiment

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

GOOD = f"""\
defaults:
  model: {sp.MODEL_ID}
  system: {sp.SYSTEM}
  backend: trtllm
  isl: 128
  osl: 8
  targets: {{ttft_ms: 1000000, tpot_ms: 1000000}}
experiments:
  - name: served
    layout: {{tp: 2}}
    concurrency: [1, 4]
    scheduler: {{max_num_tokens: 4096}}
  - name: searched
    mode: agg
    concurrency: [1, 4]
    targets: {{ttft_ms: 5000}}
"""


def test_defaults_merge_key_by_key():
    served, searched = parse_experiments(GOOD)
    assert served.layout.tp == 2 and served.scheduler.overrides() == {"max_num_tokens": 4096}
    # the experiment's own ttft target wins; the tpot target comes from the defaults
    assert (searched.targets.ttft_ms, searched.targets.tpot_ms) == (5000.0, 1000000.0)
    assert searched.system_list == [sp.SYSTEM] and searched.backend_list == ["trtllm"]


@pytest.mark.parametrize(("edit", "needles"), [
    (("mode: agg", "mode: agregated"), ["experiments[1].mode", "line 14", "'agg', 'disagg', 'both' or 'fixed'"]),
    (("layout: {tp: 2}", "layout: {tp: 2, tpp: 2}"), ["experiments[0].layout.tpp", "line 10", "unknown key",
                                                      "tp, pp, attention_dp, moe_tp, moe_ep"]),
    (("targets: {ttft_ms: 5000}", "targets: {ttft_ms: -1}"), ["experiments[1].targets.ttft_ms", "line 16",
                                                              "greater than 0", "-1"]),
    (("  osl: 8\n", "  osl: 8\n  colour: red\n"), ["defaults.colour", "line 7", "unknown key"]),
    (("  isl: 128", "  isl: lots"), ["defaults.isl", "line 5", "valid integer", "'lots'"]),
    (("name: searched", "name: served"), ["experiments[1].name", "line 13", "two experiments are named 'served'"]),
    (("    concurrency: [1, 4]\n    scheduler", "    scheduler"), ["experiments[0]", "line 9", "add concurrency"]),
    (("    mode: agg\n", "    mode: agg\n    mode: both\n"), ["experiments[1].mode", "lines 14 and 15", "given twice"]),
    (("isl: 128", "isl: [128"), ["line 6", "not valid YAML"]),
    (("scheduler: {max_num_tokens: 4096}", "scheduler: {max_num_tokens: 0}"), ["experiments[0].scheduler.max_num_tokens",
                                                                             "line 12", "greater than or equal to 1"]),
    (("concurrency: [1, 4]", "concurrency: [1, 0]"), ["experiments[0].concurrency", "every concurrency must be >= 1"]),
    (("scheduler: {max_num_tokens: 4096}", "scheduler: {cuda_graph_sizes: [8, 0]}"),
     ["experiments[0].scheduler.cuda_graph_sizes", "every CUDA-graph batch size must be >= 1"]),
])
def test_errors_name_the_key_and_line(edit, needles):
    text = GOOD.replace(*edit)
    assert text != GOOD
    with pytest.raises(ConfigFileError) as e:
        parse_experiments(text, "my.yaml")
    msg = str(e.value)
    assert msg.startswith("my.yaml")
    for n in needles:
        assert n in msg, (n, msg)


def test_not_an_experiments_file(tmp_path):
    for text in ("", "- a\n- b\n", "experiments: []\n"):
        with pytest.raises(ConfigFileError):
            parse_experiments(text, "x.yaml")
    with pytest.raises(ConfigFileError, match="cannot read"):
        load_experiments(tmp_path / "missing.yaml")


def test_run_on_the_synthetic_pack(synth):
    served, searched = parse_experiments(GOOD)
    (out,) = run_experiment(served, systems_path=synth.systems_dir)
    assert out.error is None and [r["concurrency"] for r in out.rows] == [1, 4]
    # the served rows are what serve_agg_replica answers with the same scheduler override
    from dataclasses import replace

    from infercast.serving.backends import scheduler_params

    est = Estimator(sp.MODEL_ID, sp.SYSTEM, "trtllm", tp=2, systems_path=synth.systems_dir)
    params = replace(scheduler_params("trtllm", est.data.system, est.spec), max_num_tokens=4096)
    r, _ = serve_agg_replica(est, 4, 128, 8, params)
    assert out.rows[1]["ttft_ms"] == r.ttft_ms and out.rows[1]["tpot_ms"] == r.tpot_ms
    (found,) = run_experiment(searched, systems_path=synth.systems_dir)
    res = found.searches["agg"]
    assert found.error is None and found.rows[0]["layout"] == res.candidates[res.best].layout


def test_a_failing_combination_does_not_stop_the_others(synth):
    text = GOOD.replace("  backend: trtllm\n", "  backends: [trtllm, sglang]\n")
    served, _ = parse_experiments(text)
    outs = run_experiment(served, systems_path=synth.systems_dir)
    assert [o.backend for o in outs] == ["trtllm", "sglang"]
    assert outs[0].error is None and outs[0].rows
    assert outs[1].error  # the synthetic pack has no sglang data: the reason is kept, not raised


def test_example_files_validate():
    files = sorted(EXAMPLES.glob("exp_*.yaml"))
    assert files
    for f in files:
        assert load_experiments(f)


DISAGG = f"""\
experiments:
  - name: split
    model: {sp.MODEL_ID}
    system: {sp.SYSTEM}
    backend: trtllm
    isl: 128
    osl: 8
    disagg: {{prefill_workers: 1, decode_workers: 1}}
    concurrency: [8]
    scheduler: {{step_overhead_ms: 1, cuda_graph_sizes: [8, 1, 4]}}
    decode_scheduler: {{step_overhead_ms: 5, overlap: false}}
"""


def test_role_schedulers_and_engine_settings(synth):
    (exp,) = parse_experiments(DISAGG)
    assert exp.scheduler.overrides() == {"step_overhead_ms": 1.0, "graph_batch_sizes": (1, 4, 8)}
    assert exp.role_overrides() == {"prefill": {}, "decode": {"step_overhead_ms": 5.0, "overlap": False}}
    (out,) = run_experiment(exp, systems_path=synth.systems_dir)
    (plain,) = run_experiment(parse_experiments(DISAGG.replace("    decode_scheduler: {step_overhead_ms: 5, overlap: false}\n", ""))[0],
                              systems_path=synth.systems_dir)
    assert out.error is None and plain.error is None
    # 4 ms more host time per decode step
    assert out.rows[0]["tpot_ms"] > plain.rows[0]["tpot_ms"] + 3.5
    # per-role settings need a disaggregated deployment; bad values name the key
    with pytest.raises(ConfigFileError, match="prefill_scheduler / decode_scheduler"):
        parse_experiments(GOOD.replace("    scheduler: {max_num_tokens: 4096}", "    decode_scheduler: {max_num_tokens: 4096}"))
    with pytest.raises(ConfigFileError, match="cuda_graph_sizes"):
        parse_experiments(DISAGG.replace("[8, 1, 4]", "[0, 4]"))
    with pytest.raises(ConfigFileError, match="moe_comm"):
        parse_experiments(DISAGG.replace("    concurrency: [8]\n", "    concurrency: [8]\n    moe_comm: sideways\n"))


def test_role_schedulers_in_a_disagg_search(synth):
    text = GOOD.replace("    mode: agg\n", "    mode: disagg\n    max_gpus: 2\n").replace(
        "    targets: {ttft_ms: 5000}\n", "    targets: {ttft_ms: 5000}\n    decode_scheduler: {step_overhead_ms: 5}\n")
    _, slow = parse_experiments(text)
    _, plain = parse_experiments(GOOD.replace("    mode: agg\n", "    mode: disagg\n    max_gpus: 2\n"))
    (a,) = run_experiment(slow, systems_path=synth.systems_dir)
    (b,) = run_experiment(plain, systems_path=synth.systems_dir)
    assert a.error is None and b.error is None
    assert a.rows[0]["tpot_ms"] > b.rows[0]["tpot_ms"] + 4.0
