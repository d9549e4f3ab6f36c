"""Sweeps beyond one process (:mod:`infercast.search.executor`): ``infercast support`` and
``infercast exp`` give the serial run's answers, in its order, over local processes (``--jobs``)
and on a private Ray instance (``--ray local``); asking for Ray without it installed, or at an
address nothing answers, is one line and exit code 2.

The Ray tests start a local instance of two CPUs (about 10-30 s on a loaded two-core machine) and
are skipped when ray is not importable (``pip install -e '.[test]'`` installs it)."""

from __future__ import annotations

import importlib.util
import json
import sys
import types

import pytest
from cli_helpers import assert_one_line_error, run_cli
from synthpack import MODEL_ID, SYSTEM, add_support_models, make_pack

from infercast.errors import InvalidInputError
from infercast.search.executor import Executor, ProcessExecutor, check_reachable, executor

HAS_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAS_RAY, reason="ray is not installed (pip install 'infercast[ray]')")

#: two experiments over four (system, backend) runs: a served layout on three backends, and a
#: search of both modes
EXP = f"""\
defaults:
  model: {MODEL_ID}
  system: {SYSTEM}
  isl: 128
  osl: 8
  targets: {{ttft_ms: 1000000, tpot_ms: 1000000}}
experiments:
  - name: served
    backends: [trtllm, sglang, vllm]
    layout: {{tp: 2}}
    concurrency: [1, 4]
  - name: searched
    backend: trtllm
    mode: both
    concurrency: [1, 4]
    targets: {{ttft_ms: 5000}}
"""


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    p = make_pack(tmp_path_factory.mktemp("executorpack"))
    add_support_models(p)
    return p


@pytest.fixture(scope="module")
def exp_file(tmp_path_factory):
    f = tmp_path_factory.mktemp("exp") / "sweep.yaml"
    f.write_text(EXP)
    return f


def _square(x: int) -> int:
    return x * x


def _slow_first(x: int) -> int:
    """Finishes in reverse order of its items (the first sleeps longest)."""
    import time

    time.sleep(0.5 * (2 - x))
    return x


def test_serial_and_processes_keep_the_items_order():
    seen: list[int] = []
    assert Executor().map(_square, [3, 1, 2], lambda i, r: seen.append(i)) == [9, 1, 4]
    assert seen == [0, 1, 2]
    done: list[tuple[int, int]] = []
    with executor(jobs=2) as ex:
        assert isinstance(ex, ProcessExecutor)
        assert ex.map(_slow_first, [0, 1], lambda i, r: done.append((i, r))) == [0, 1]
    assert sorted(done) == [(0, 0), (1, 1)]  # every item reported once, as it finished


@pytest.mark.parametrize("jobs", [0, -1, 1.5, True])
def test_bad_jobs(jobs):
    with pytest.raises(InvalidInputError, match="--jobs must be >= 1"):
        executor(jobs=jobs)


@pytest.fixture(scope="module")
def serial(pack, exp_file):
    """The serial runs' JSON: (support, exp)."""
    out = []
    for argv in (["support", "--json", "--quiet"], ["exp", str(exp_file), "--json", "--quiet"]):
        rc, stdout, err = _run(argv, pack)
        assert rc == 0, err
        out.append(stdout)
    return out


def _run(argv, pack, capsys=None):
    from infercast.cli.main import main

    if capsys is not None:
        return run_cli(capsys, [*argv, "--systems-path", str(pack.systems_dir)])
    import contextlib
    import io

    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        rc = main([*argv, "--systems-path", str(pack.systems_dir)])
    return rc, buf.getvalue(), err.getvalue()


def test_serial_runs_are_what_the_tests_compare(serial):
    support, exp = (json.loads(s) for s in serial)
    assert sum(r["supported"] for r in support["rows"]) > 0 and any(not r["supported"] for r in support["rows"])
    runs = [(r["experiment"], r["backend"], r["error"] is None) for r in exp["results"]]
    # the synthetic pack has no sglang data and no vllm context-attention table: those runs keep
    # their reasons
    assert runs == [("served", "trtllm", True), ("served", "sglang", False), ("served", "vllm", False),
                    ("searched", "trtllm", True)]


def test_jobs_give_the_serial_answers_bit_for_bit(pack, exp_file, serial, capsys):
    for argv, want in ((["support", "--json", "--quiet"], serial[0]),
                       (["exp", str(exp_file), "--json", "--quiet"], serial[1])):
        rc, out, err = _run([*argv, "--jobs", "2"], pack, capsys)
        assert rc == 0, err
        assert out == want


@needs_ray
def test_ray_local_gives_the_serial_answers_bit_for_bit(pack, exp_file, serial, capsys):
    """One private instance (started as ``--ray local --jobs 2`` starts it), which both commands
    then use as a caller's open connection, left open by them and stopped by its owner."""
    import ray

    from infercast.search.executor import RayExecutor

    assert not ray.is_initialized()
    with RayExecutor("local", jobs=2) as owner:
        assert ray.is_initialized() and ray.cluster_resources().get("CPU") == 2
        for argv, want in ((["exp", str(exp_file), "--json"], serial[1]),  # progress shown on stderr
                           (["support", "--json", "--quiet"], serial[0])):
            rc, out, err = _run([*argv, "--ray", "local", "--jobs", "2"], pack, capsys)
            assert rc == 0, err
            assert out == want
            assert ray.is_initialized()
        assert owner.map(abs, [-3, 1, -2]) == [3, 1, 2]
    assert not ray.is_initialized()


@pytest.mark.parametrize("command", ["support", "exp"])
def test_ray_not_installed_is_one_line(pack, exp_file, capsys, monkeypatch, command):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    argv = ["support"] if command == "support" else ["exp", str(exp_file)]
    rc, out, err = _run([*argv, "--ray"], pack, capsys)
    assert_one_line_error(rc, out, err, "--ray needs Ray", "pip install 'infercast[ray]'")


def _fake_ray(monkeypatch):
    """A stand-in ``ray`` module whose init must not be reached."""
    fake = types.ModuleType("ray")
    fake.is_initialized = lambda: False

    def init(**kw):  # pragma: no cover - reaching it is the failure
        raise AssertionError(f"ray.init reached with {kw}")

    fake.init = init
    monkeypatch.setitem(sys.modules, "ray", fake)


@pytest.mark.parametrize(("address", "needles"), [
    ("127.0.0.1:1", ["--ray 127.0.0.1:1: unreachable", "--ray local"]),
    ("ray://127.0.0.1:1", ["--ray ray://127.0.0.1:1: unreachable"]),
    ("not an address", ["not a Ray address", "HOST:PORT"]),
])
def test_unreachable_ray_address_is_one_line(pack, exp_file, capsys, monkeypatch, address, needles):
    _fake_ray(monkeypatch)
    for argv in (["support"], ["exp", str(exp_file)]):
        rc, out, err = _run([*argv, "--ray", address], pack, capsys)
        assert_one_line_error(rc, out, err, *needles)


def test_ray_address_from_the_environment_is_checked(pack, capsys, monkeypatch):
    _fake_ray(monkeypatch)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    rc, out, err = _run(["support", "--ray"], pack, capsys)
    assert_one_line_error(rc, out, err, "RAY_ADDRESS 127.0.0.1:1: unreachable")


def test_check_reachable_accepts_a_listening_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        check_reachable(f"127.0.0.1:{s.getsockname()[1]}")
        check_reachable(f"ray://127.0.0.1:{s.getsockname()[1]}")
    check_reachable("auto")  # left to ray.init
