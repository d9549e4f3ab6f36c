"""Property-based fuzzing of the command line (hypothesis): ``estimate``, ``serve``, ``search`` and
``validate`` with flags drawn from valid and invalid values -- small and huge integers, zero,
negatives, fractions, NaN / inf spelled as strings, junk, empty strings, unknown models, systems
and backends.

Properties, for every argument list:

* no traceback: any exception other than ``SystemExit`` (argparse) escaping ``main`` fails;
* the exit code is 0 (an answer) or 2 (bad input, one ``infercast: error:`` line on stderr);
* an exit-0 ``--json`` result is valid JSON without NaN / Infinity, and every latency in it
  (a key ending in ``_ms``) is a finite number >= 0.

Everything runs in-process on the synthetic pack; ``search`` always gets a small GPU budget so an
example stays quick.
"""

from __future__ import annotations

import json
import math

import pytest
import synthpack as sp
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from infercast.cli.main import main

#: (plausible, invalid) values of integer flags
INTS = (["1", "2", "4", "8"], ["3", "0", "-1", "-8", "1000000", "10000000000", "1e3", "0.5", "2.0", "nan", "inf",
                               "-inf", "junk", ""])
#: ... of float flags
FLOATS = (["0", "0.5", "0.8", "1", "1.5", "1e-300", "1e300"], ["-1", "1e308", "nan", "inf", "-inf", "junk", ""])
#: ... of the shape flags (a huge valid isl is an answer, but a slow one: at most 10^5 here)
SHAPES = (["1", "2", "8", "128", "4096", "100000"], ["0", "-5", "1.5", "nan", "inf", "junk", "", "100000000000"])
FRACTIONS = (["0.01", "0.5", "0.9", "1"], ["0", "-0.5", "1.5", "nan", "inf", "junk"])
MODELS = ([sp.MODEL_ID, sp.MODEL_ID_FP8], ["nope/not-a-model", "", "Qwen/../../etc"])
SYSTEMS = ([sp.SYSTEM], ["h9000", ""])
BACKENDS = (["trtllm", "vllm"], ["sglang", "junk"])
QUANTS = (["bfloat16", "fp8"], ["fp8_block", "nvfp4", "int3", "", "junk"])
MODES = (["SILICON", "SOL", "HYBRID", "EMPIRICAL"], ["junk", ""])
ONE = (["1"], INTS[1])

ESTIMATE_FLAGS = {
    "--batch": INTS, "--isl": SHAPES, "--osl": SHAPES, "--prefix": (["0", "64", "4096"], SHAPES[1]),
    "--tp": INTS, "--pp": (["1", "2"], INTS[1]), "--attention-dp": ONE, "--moe-tp": ONE, "--moe-ep": ONE,
    "--nextn": (["0", "1", "3"], INTS[1]), "--mtp-acceptance": FRACTIONS, "--kv-memory-fraction": FRACTIONS,
    "--gemm-quant": QUANTS, "--kv-cache-quant": QUANTS, "--attention-quant": QUANTS, "--moe-quant": ([], QUANTS[0]),
    "--moe-kernel": ([], ["trtllm", "cutlass", "triton", "junk"]), "--database-mode": MODES,
    "--backend-version": (["current", "1.0"], ["previous", "7.7", "junk"]),
}
SERVE_FLAGS = {
    **{k: v for k, v in ESTIMATE_FLAGS.items() if k not in ("--batch", "--prefix")},
    "--concurrency": (["1", "3", "16", "100", "10000"], INTS[1]), "--max-num-tokens": (["512", "8192"], INTS[1]),
    "--max-batch-size": INTS, "--front-end-ms": FLOATS, "--step-overhead-ms": FLOATS,
    "--requests-per-client": (["1", "2", "10"], FLOATS[1]), "--batch-wait-iters": (["0", "2"], INTS[1]),
    "--batch-wait-max-tokens-ratio": FRACTIONS, "--recv-interval": INTS, "--random-range-ratio": FRACTIONS,
    "--prefill-scheduling": (["mixed", "prefill-first"], ["junk"]), "--random-lengths": None,
}
SEARCH_FLAGS = {
    "--isl": SHAPES, "--osl": SHAPES, "--mode": (["agg", "disagg", "both"], ["fixed", "junk"]),
    "--gpus": (["1", "2"], ["3", "0", "-2", "junk"]),
    "--concurrency": (["1", "1,4", "2,8,16", "1000"], ["0", "-1", "1,x", ",", "", "1e3", "100000000", "1,100000000"]),
    "--ttft-ms": (["0.01", "100", "2000", "inf"], FLOATS[1]), "--tpot-ms": (["0.01", "30", "inf"], FLOATS[1]),
    "--top": INTS, "--nextn": (["0", "1"], INTS[1]), "--database-mode": MODES, "--kv-memory-fraction": FRACTIONS,
    "--gemm-quant": QUANTS, "--all": None,
}
VALIDATE_FLAGS = {"--database-mode": MODES, "--by": (["mode", "backend+system"], ["junk", "", "+"]),
                  "--ids": ([], ["/nonexistent/ids.txt"]), "--static": None}

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _pick(values, broken: bool):
    good, bad = values
    return st.sampled_from(good + bad if broken or not good else good)


@st.composite
def _flags(draw, table: dict, broken: bool, max_size: int = 5) -> list[str]:
    """A few of ``table``'s flags with a value each (a None entry: a switch without one), from
    the plausible values only unless ``broken``."""
    keys = draw(st.lists(st.sampled_from(sorted(table)), max_size=max_size, unique=True))
    out = []
    for k in keys:
        out += [k] if table[k] is None else [k, draw(_pick(table[k], broken))]
    return out


@st.composite
def _command(draw, table: dict, max_size: int = 5) -> list[str]:
    """The model / system / backend flags and a few of ``table``'s: in half the examples all
    plausible (they mostly run, so the JSON properties are exercised), else anything."""
    broken = draw(st.booleans())
    head = ["--model", draw(_pick(MODELS, broken)), "--system", draw(_pick(SYSTEMS, broken)),
            "--backend", draw(_pick(BACKENDS, broken))]
    return head + draw(_flags(table, broken, max_size)) + (["--json"] if draw(st.booleans()) else [])


def _reject_constant(name: str):
    raise AssertionError(f"JSON holds {name}")


def _check_latencies(node, path="") -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            if k.endswith("_ms") and v is not None and not isinstance(v, (dict, list)):
                assert isinstance(v, (int, float)) and math.isfinite(v) and v >= 0, (f"{path}.{k}", v)
            _check_latencies(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _check_latencies(v, f"{path}[{i}]")


def _run(capsys, argv: list[str]) -> None:
    """The properties of one invocation."""
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse: usage errors (2), --help (0)
        rc = exc.code
    except Exception as exc:  # noqa: BLE001 - the failure this test exists for
        pytest.fail(f"uncaught {type(exc).__name__} from the CLI for {argv}: {exc}")
    out, err = capsys.readouterr()
    assert rc in (0, 2), (argv, rc, err)
    event(f"exit {rc}" + (" --json" if "--json" in argv else ""))  # coverage: --hypothesis-show-statistics
    assert "Traceback" not in out + err
    if rc == 2:
        assert err.strip().splitlines()[-1].startswith(("infercast: error: ", "infercast ")), (argv, err)
    elif "--json" in argv:
        _check_latencies(json.loads(out, parse_constant=_reject_constant))


def _synth(synth) -> list[str]:
    return ["--systems-path", str(synth.systems_dir)]


@FUZZ
@given(argv=_command(ESTIMATE_FLAGS))
def test_fuzz_estimate(synth, capsys, argv):
    _run(capsys, ["estimate", *_synth(synth), "--isl", "128", "--osl", "8", *argv])


@FUZZ
@given(argv=_command(SERVE_FLAGS))
def test_fuzz_serve(synth, capsys, argv):
    _run(capsys, ["serve", *_synth(synth), "--isl", "128", "--osl", "8", "--concurrency", "4", *argv])


@settings(FUZZ, max_examples=25)
@given(argv=_command(SEARCH_FLAGS, 4), max_gpus=st.sampled_from(["1", "2", "2", "0", "-1", "junk"]))
def test_fuzz_search(synth, capsys, argv, max_gpus):
    extra = [] if "--gpus" in argv else ["--max-gpus", max_gpus]  # they exclude each other; a small budget either way
    extra += [] if "--concurrency" in argv else ["--concurrency", "1,4"]
    _run(capsys, ["search", *_synth(synth), "--isl", "128", "--osl", "8", *extra, *argv])


@pytest.fixture(scope="module")
def silicon_csv(tmp_path_factory):
    """Two agg rows of the synthetic model and one junk row."""
    from test_validate_harness import _synth_agg, _write

    rows = [_synth_agg("synth_agg_128x8_c4_a", "silicon_concurrency=4"),
            _synth_agg("synth_agg_128x8_c8_b", "silicon_concurrency=8", bs="8"),
            {**_synth_agg("synth_agg_128x8_c2_c", "silicon_concurrency=2"), "isl": "junk", "tp_size": "-3"}]
    return _write(tmp_path_factory.mktemp("fuzz") / "silicon.csv", rows)


@settings(FUZZ, max_examples=20)
@given(flags=st.booleans().flatmap(lambda broken: _flags(VALIDATE_FLAGS, broken, 3)), as_json=st.booleans(),
       silicon=st.sampled_from(["good", "good", "/nonexistent/s.csv", ""]))
def test_fuzz_validate(synth, capsys, silicon_csv, flags, as_json, silicon):
    path = str(silicon_csv) if silicon == "good" else silicon
    _run(capsys, ["validate", "--silicon", path, *_synth(synth), *flags, *(["--json"] if as_json else [])])


#: layouts of an MoE model (the synthetic pack has none): the real pack
POW2 = (["1", "2", "4", "8"], INTS[1])
MOE_FLAGS = {
    "--tp": POW2, "--attention-dp": POW2, "--moe-tp": POW2, "--moe-ep": POW2, "--pp": (["1", "2"], INTS[1]),
    "--nextn": (["0", "1"], INTS[1]), "--moe-kernel": (["trtllm", "cutlass", "deepgemm", "triton"], ["junk"]),
    "--moe-quant": (["fp8_block", "nvfp4", "mxfp4"], ["junk"]), "--kv-memory-fraction": FRACTIONS,
    "--isl": SHAPES, "--osl": SHAPES,
}


@pytest.mark.real_pack
@settings(FUZZ, max_examples=20)
@given(command=st.sampled_from([["estimate", "--batch", "8"], ["serve", "--concurrency", "32"]]),
       backend=st.sampled_from(["trtllm", "vllm", "sglang"]), model=st.sampled_from(["Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-235B-A22B-FP8"]),
       flags=st.booleans().flatmap(lambda broken: _flags(MOE_FLAGS, broken, 5)), as_json=st.booleans())
def test_fuzz_moe_layouts_real_pack(capsys, command, backend, model, flags, as_json):
    _run(capsys, [*command, "--model", model, "--system", "h200_sxm", "--backend", backend, "--isl", "1000",
                  "--osl", "100", *flags, *(["--json"] if as_json else [])])
