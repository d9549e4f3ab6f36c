"""The command line's output contract (issue #36): the GPU count and layout in words everywhere,
one rule for a configuration that does not fit (an answer: ``fits: false``, exit code 0),
``search``'s default latency targets and its refusal of concurrencies no deployment holds,
unwrapped output to a pipe, help on every flag, ``--version``, plain numbers in errors, and the
README's test command.

CLI cases run in-process on the synthetic pack; cases that need an MoE model use the real pack.
"""

from __future__ import annotations

import argparse
import json
import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
import synthpack as sp
from cli_helpers import assert_one_line_error, run_cli

from infercast.cli.main import build_parser
from infercast.report.layout import layout_words, plural
from infercast.search.run import DEFAULT_TPOT_MS, DEFAULT_TTFT_MS

ROOT = Path(__file__).resolve().parents[1]


def _argv(synth, command, *extra):
    return [command, "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm",
            "--systems-path", str(synth.systems_dir), "--isl", "128", "--osl", "8", *extra]


# ---- GPUs and layout in words -------------------------------------------------------------------
def test_layout_words_and_plural():
    assert layout_words(8, 1, 8, None, 8, moe=True) == "64 GPUs: 8 attention-DP ranks x TP 8; experts EP 8 x TP 8"
    assert layout_words(1, 1, 8, 1, 8, moe=True) == "8 GPUs: 8 attention-DP ranks x TP 1; experts EP 8 x TP 1"
    assert layout_words(4, 2) == "8 GPUs: TP 4, 2 pipeline stages"
    assert layout_words(1) == "1 GPU: TP 1"
    assert layout_words(4, moe=True) == "4 GPUs: TP 4; experts EP 1 x TP 4"
    assert [plural(n, "GPU") for n in (0, 1, 2, 1.0, 2.5)] == ["0 GPUs", "1 GPU", "2 GPUs", "1 GPU", "2.5 GPUs"]


@pytest.mark.parametrize("tp,words", [("1", "1 GPU: TP 1"), ("2", "2 GPUs: TP 2")])
def test_estimate_states_gpus_and_layout(synth, capsys, tp, words):
    rc, out, err = run_cli(capsys, _argv(synth, "estimate", "--tp", tp, "--json"))
    assert rc == 0, err
    d = json.loads(out)
    assert d["gpus"] == int(tp) and d["layout"] == words and d["fits"] is True and d["reason"] is None
    rc, out, err = run_cli(capsys, _argv(synth, "estimate", "--tp", tp))
    assert rc == 0 and words in out.splitlines()[0] and "1 GPUs" not in out


def test_serve_states_gpus_and_layout(synth, capsys):
    rc, out, err = run_cli(capsys, _argv(synth, "serve", "--tp", "2", "--concurrency", "4", "--json"))
    assert rc == 0, err
    d = json.loads(out)
    assert (d["gpus"], d["layout"], d["tp"], d["fits"]) == (2, "2 GPUs: TP 2", 2, True)
    rc, out, err = run_cli(capsys, _argv(synth, "serve", "--tp", "2", "--concurrency", "4"))
    assert rc == 0 and "2 GPUs: TP 2" in out.splitlines()[0]


def test_search_states_each_deployment_in_words(synth, capsys):
    rc, out, err = run_cli(capsys, _argv(synth, "search", "--max-gpus", "2", "--concurrency", "1,4", "--json", "--all"))
    assert rc == 0, err
    d = json.loads(out)
    assert all(c["description"] == ("1 GPU: TP 1" if c["gpus"] == 1 else f"{c['gpus']} GPUs: TP {c['tp']}")
               for c in d["candidates"] if c["pp"] == 1)
    rc, out, err = run_cli(capsys, _argv(synth, "search", "--gpus", "2", "--concurrency", "4", "--json", "--all"))
    d = json.loads(out)
    words = {c["layout"]: c["description"] for c in d["candidates"]}
    assert words["2xtp1"] == "2 GPUs: 2 replicas x (1 GPU: TP 1)"
    assert words["P1xtp1 D1xtp1"] == "2 GPUs: 1 prefill worker x (1 GPU: TP 1) + 1 decode worker x (1 GPU: TP 1)"
    rc, out, err = run_cli(capsys, _argv(synth, "search", "--max-gpus", "2", "--concurrency", "4"))
    assert re.search(r"recommended: \S+ \((1 GPU: TP 1|2 GPUs: TP 2)\) at 4 clients per replica", out), out


@pytest.mark.real_pack
def test_attention_dp_layout_counts_every_gpu(capsys):
    """infercast's --tp is per attention-DP rank: --tp 8 --attention-dp 8 --moe-ep 8 is 64 GPUs,
    and the output says so (the engines' "tp 8 with attention DP" is --tp 1 --attention-dp 8)."""
    base = ["--model", "Qwen/Qwen3-30B-A3B", "--system", "h200_sxm", "--backend", "trtllm", "--isl", "1000", "--osl", "100"]
    rc, out, err = run_cli(capsys, ["estimate", *base, "--tp", "8", "--attention-dp", "8", "--moe-ep", "8", "--json"])
    assert rc == 0, err
    d = json.loads(out)
    assert d["gpus"] == 64 and d["layout"] == "64 GPUs: 8 attention-DP ranks x TP 8; experts EP 8 x TP 8"
    rc, out, err = run_cli(capsys, ["serve", *base, "--attention-dp", "8", "--moe-ep", "8", "--concurrency", "16"])
    assert rc == 0, err
    assert "8 GPUs: 8 attention-DP ranks x TP 1; experts EP 8 x TP 1" in out.splitlines()[0]


# ---- does not fit: an answer, exit code 0, for every command ----------------------------------
def test_does_not_fit_is_an_answer_everywhere(synth, capsys):
    starve = ("--kv-memory-fraction", "1e-7")  # no KV cache: not even one request fits
    rc, out, err = run_cli(capsys, _argv(synth, "estimate", *starve, "--json"))
    d = json.loads(out)
    assert rc == 0 and d["fits"] is False and "KV" in d["reason"] and d["ttft_ms"] is None
    rc, out, err = run_cli(capsys, _argv(synth, "serve", *starve, "--concurrency", "4", "--json"))
    d = json.loads(out)
    assert rc == 0 and err == "" and d["fits"] is False and "KV cache" in d["reason"] and d["gpus"] == 1
    rc, out, err = run_cli(capsys, _argv(synth, "serve", *starve, "--concurrency", "4"))
    assert rc == 0 and "does not fit: one request of 128+8 tokens" in out and "1 GPU: TP 1" in out
    rc, out, err = run_cli(capsys, _argv(synth, "search", *starve, "--max-gpus", "2", "--json"))
    d = json.loads(out)
    assert rc == 0 and d["best"] is None and d["reason"].startswith("no deployment could serve this workload")
    rc, out, err = run_cli(capsys, _argv(synth, "search", *starve, "--max-gpus", "2"))
    assert rc == 0 and "no recommendation: no deployment could serve this workload" in out


# ---- search: default targets, inf for none, the concurrency bound --------------------------------
def test_search_uses_and_prints_default_targets(synth, capsys):
    rc, out, err = run_cli(capsys, _argv(synth, "search", "--max-gpus", "2", "--json", "--all"))
    assert rc == 0, err
    d = json.loads(out)
    assert d["targets"] == {"ttft_max_ms": DEFAULT_TTFT_MS, "ttft_from": "default",
                            "tpot_max_ms": DEFAULT_TPOT_MS, "tpot_from": "default"}
    assert (d["ttft_max_ms"], d["tpot_max_ms"]) == (2000.0, 30.0)
    for c in d["candidates"]:
        assert c["meets_targets"] == (c["ttft_ms"] <= 2000.0 and c["tpot_ms"] <= 30.0)
    assert d["best"] is None or d["best"]["meets_targets"]
    rc, out, err = run_cli(capsys, _argv(synth, "search", "--max-gpus", "2", "--concurrency", "1"))
    assert "targets: TTFT <= 2000 ms (default), TPOT <= 30 ms (default)" in out


def test_search_targets_can_be_widened_or_set(synth, capsys):
    rc, out, err = run_cli(capsys, _argv(synth, "search", "--max-gpus", "2", "--concurrency", "1,2",
                                         "--ttft-ms", "inf", "--tpot-ms", "50", "--json", "--all"))
    assert rc == 0, err
    d = json.loads(out)
    assert d["targets"] == {"ttft_max_ms": None, "ttft_from": "--ttft-ms", "tpot_max_ms": 50.0, "tpot_from": "--tpot-ms"}
    assert all(c["meets_targets"] == (c["tpot_ms"] <= 50.0) for c in d["candidates"])
    rc, out, err = run_cli(capsys, _argv(synth, "search", "--max-gpus", "2", "--concurrency", "1", "--ttft-ms", "inf",
                                         "--tpot-ms", "inf"))
    assert rc == 0 and "targets: no TTFT target, no TPOT target" in out
    assert_one_line_error(*run_cli(capsys, _argv(synth, "search", "--ttft-ms", "nan")), "--ttft-ms", "inf for no target")


def test_search_refuses_concurrency_no_deployment_holds(synth, capsys):
    """The bound is the most requests any searched deployment runs at once; at the bound the
    search runs, one beyond it is refused before any serving run, in one line naming the bound."""
    line = assert_one_line_error(*run_cli(capsys, _argv(synth, "search", "--max-gpus", "2", "--concurrency",
                                                        "1,1000000")), "concurrency 1000000", "give at most")
    bound = int(re.search(r"give at most (\d+)", line).group(1))
    assert bound > 1
    assert_one_line_error(*run_cli(capsys, _argv(synth, "search", "--max-gpus", "2", "--concurrency", str(bound + 1))),
                          f"concurrency {bound + 1}", f"give at most {bound}")
    rc, out, err = run_cli(capsys, _argv(synth, "search", "--max-gpus", "1", "--concurrency", str(bound), "--json"))
    assert rc == 0, err
    assert json.loads(out)["concurrencies"] == [bound]
    # the default grid stops at the bound instead
    rc, out, err = run_cli(capsys, _argv(synth, "search", "--max-gpus", "2", "--json"))
    d = json.loads(out)
    assert d["max_concurrency"] == bound and max(d["concurrencies"]) <= bound
    # the Python API caps only when asked (validation predicts rows measured beyond the memory model's bound)
    from infercast.search import search_agg

    r = search_agg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, max_gpus=1, concurrencies=[bound + 1],
                   systems_path=synth.systems_dir)
    assert r.max_concurrency == bound and [c.concurrency for c in r.candidates] == [bound + 1]
    for mode in (("--mode", "disagg", "--max-gpus", "2"), ("--gpus", "2")):
        assert_one_line_error(*run_cli(capsys, _argv(synth, "search", *mode, "--concurrency", "100000000")),
                              "concurrency 100000000", "give at most")


# ---- output to a pipe is not wrapped ---------------------------------------------------------
def test_piped_output_is_not_wrapped(synth, capsys):
    """Not a terminal: no line is folded at 80 (or 140) columns -- the search title stays one
    line, and every table row is one line with its header cells whole."""
    rc, out, err = run_cli(capsys, _argv(synth, "search", "--max-gpus", "2", "--concurrency", "1,2"))
    assert rc == 0, err
    lines = out.splitlines()
    title = lines[0]
    assert title.startswith(sp.MODEL_ID) and title.endswith("TPOT <= 30 ms (default)") and len(title) > 140
    header = next(ln for ln in lines if "tok/s/GPU" in ln)
    for cell in ("layout", "GPUs", "clients", "TTFT ms", "TPOT ms", "tok/s/GPU", "tok/s/user", "meets"):
        assert cell in header
    rows = [ln for ln in lines if ln.startswith("│")]
    rc, out, err = run_cli(capsys, _argv(synth, "search", "--max-gpus", "2", "--concurrency", "1,2", "--json"))
    d = json.loads(out)
    # one line per row, no cell folded: the frontier, the top deployments and the recommendation's
    # prediction intervals (one row per figure)
    assert len(rows) == len(d["frontier"]) + len(d["top"]) + len(d["best"]["intervals"]) > 0


# ---- help, version, plain numbers in errors --------------------------------------------------
def _subparsers(parser: argparse.ArgumentParser, path=("infercast",)):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subparsers(sub, (*path, name))


def test_every_flag_has_help():
    missing = [(" ".join(path), a.option_strings or a.dest)
               for path, p in _subparsers(build_parser()) for a in p._actions
               if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and not (a.help or "").strip()]
    assert missing == []


def test_help_says_how_the_layout_flags_combine():
    subs = dict(_subparsers(build_parser()))
    for cmd in ("estimate", "serve", "serve-disagg", "search"):
        desc = subs[("infercast", cmd)].description
        assert "GPUs = tp x attention-dp x pp" in desc and "moe-tp x moe-ep = tp x attention-dp" in desc, cmd
    flags = {a.dest: a.help for a in subs[("infercast", "estimate")]._actions}
    assert "one attention-DP rank" in flags["tp"] and "--tp 1 --attention-dp N" in flags["attention_dp"]
    assert "moe-tp x moe-ep = tp x attention-dp" in flags["moe_tp"]


def test_version(capsys):
    rc, out, err = run_cli(capsys, ["--version"])
    assert rc == 0 and out.strip() == f"infercast {version('infercast')}"


@pytest.mark.parametrize("extra,needle", [(("--batch", "0"), "got 0"), (("--prefix", "-3"), "got -3")])
def test_errors_show_plain_numbers(synth, capsys, extra, needle):
    line = assert_one_line_error(*run_cli(capsys, _argv(synth, "estimate", *extra)), needle)
    assert "[" not in line


# ---- the README's test command -----------------------------------------------------------------
def test_readme_test_command_is_what_ci_runs_and_reports_a_count():
    """CI runs exactly the README's test command, and pytest's options do not add a second -q
    (two would hide the "N passed" line)."""
    cmd = next(ln.strip() for ln in (ROOT / "README.md").read_text().splitlines() if "python -m pytest" in ln
               and "pip install" in ln)
    assert cmd in [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    opts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"].get("addopts", "")
    assert "-q" not in opts.split() and "--quiet" not in opts.split()


def test_the_command_starts_before_numpy_with_one_blas_thread():
    """``import infercast`` loads no numpy (its public names come on first use), and the command's
    package (infercast.cli) sets numpy's BLAS to one thread before numpy loads, unless the
    environment says otherwise."""
    import os
    import subprocess
    import sys

    code = ("import sys, os, infercast; assert 'numpy' not in sys.modules; import infercast.cli.main; "
            "assert 'numpy' not in sys.modules; name = infercast.Estimator.__name__; assert 'numpy' in sys.modules; "
            "print(os.environ['OPENBLAS_NUM_THREADS'], name)")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "Estimator"]
    out = subprocess.run([sys.executable, "-c", code], env={**env, "OPENBLAS_NUM_THREADS": "3"}, capture_output=True,
                         text=True, check=True).stdout
    assert out.split() == ["3", "Estimator"]  # the user's own setting stands


def test_a_command_line_builds_only_its_subcommand():
    """``main`` builds only the subcommand the command line names (``build_parser(only)``): every
    subcommand is in :data:`COMMANDS`, and each one built alone parses and describes itself as the
    whole parser's does."""
    from infercast.cli.main import COMMANDS, build_parser

    full = dict(_subparsers(build_parser()))
    assert {path[1] for path in full if len(path) > 1} == set(COMMANDS)
    for name in COMMANDS:
        alone = {path: p for path, p in _subparsers(build_parser(name)) if len(path) > 1}
        assert set(alone) == {path for path in full if len(path) > 1 and path[1] == name}
        for path, p in alone.items():
            assert p.format_help() == full[path].format_help()


def test_the_command_collects_garbage_seldom():
    """The command line (``run``) collects the garbage collector's first generation every
    COMMAND_GC_THRESHOLD allocations (a command's objects mostly live to its end); ``main``, as a
    library caller runs it, leaves the collector as it is."""
    import subprocess
    import sys

    from infercast.cli.main import COMMAND_GC_THRESHOLD

    code = ("import atexit, gc, sys; atexit.register(lambda: print(gc.get_threshold()[0], file=sys.stderr)); "
            "sys.argv = ['infercast', 'models', '--json']; from infercast.cli.main import run; run()")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(p.stderr.split()[-1]) == COMMAND_GC_THRESHOLD > 700
    code = ("import gc, io, contextlib; from infercast.cli.main import main; "
            "contextlib.redirect_stdout(io.StringIO()).__enter__(); main(['models', '--json']); "
            "print(gc.get_threshold()[0], file=__import__('sys').stderr)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(p.stderr.split()[-1]) == 700
