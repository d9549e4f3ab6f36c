"""A search's parts on forked worker processes (``search --jobs N``, :mod:`infercast.search.parallel`):
the same result as in one process, bit for bit, in the same order; bad ``jobs`` refused."""

from __future__ import annotations

import json
from dataclasses import astuple

import pytest

import synthpack as sp
from infercast.cli.main import main
from infercast.errors import InvalidInputError
from infercast.search import search_agg, search_disagg
from infercast.search import parallel
from infercast.search.run import SearchResult

needs_fork = pytest.mark.skipif(not parallel.fork_available(), reason="parallel parts need fork (Linux)")


@pytest.fixture
def forks(monkeypatch):
    """The workers forked by each pool :func:`run_parts` opened: ``jobs - 1``, this process taking
    parts too (proof that the parts did not all run quietly in this process)."""
    seen: list[int] = []
    real_fork, real_groups = parallel._fork, parallel.run_groups

    def groups(*a, **k):
        seen.append(0)
        try:
            return real_groups(*a, **k)
        finally:
            if not seen[-1]:
                seen.pop()  # this one forked nothing

    def fork():
        seen[-1] += 1
        return real_fork()

    monkeypatch.setattr(parallel, "_fork", fork)
    monkeypatch.setattr(parallel, "run_groups", groups)
    import infercast.search.run as run

    monkeypatch.setattr(run, "run_groups", groups)
    return seen


def _same(a: SearchResult, b: SearchResult) -> None:
    """Equal field by field, candidates in the same order and of the same classes, dictionaries in
    the same order of keys (what JSON output shows)."""
    assert [type(c) for c in a.candidates] == [type(c) for c in b.candidates]
    assert [astuple(c) for c in a.candidates] == [astuple(c) for c in b.candidates]
    for name in ("skipped", "evaluated", "refused"):
        assert list(getattr(a, name).items()) == list(getattr(b, name).items())
    assert (a.frontier, a.best, a.concurrencies, a.reason) == (b.frontier, b.best, b.concurrencies, b.reason)


@needs_fork
@pytest.mark.parametrize("jobs", [2, 3])
def test_agg_search_on_workers_equals_one_process(synth, jobs, forks):
    # default concurrencies: refinement runs too; a TPOT target some layouts miss
    kw = dict(systems_path=synth.systems_dir, max_gpus=8, tpot_max_ms=2.0)
    one = search_agg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, jobs=1, **kw)
    assert forks == []
    many = search_agg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, jobs=jobs, **kw)
    assert forks == [jobs - 1]
    assert len(one.candidates) > 20 and one.skipped  # refusals (layouts that do not shard) merged too
    _same(one, many)


@needs_fork
def test_disagg_search_on_workers_equals_one_process(synth, forks):
    kw = dict(systems_path=synth.systems_dir, max_gpus=8, max_workers=4, tpot_max_ms=2.0)
    one = search_disagg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 64, jobs=1, **kw)
    many = search_disagg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 64, jobs=2, **kw)
    assert forks == [1]
    assert len({c.decode_layout for c in one.candidates}) >= 3  # several parts
    _same(one, many)


@needs_fork
@pytest.mark.parametrize("jobs", [1, 2])
def test_search_both_shares_one_pool_and_equals_two_searches(synth, jobs, forks):
    """search_both (search --mode both): the aggregated and disaggregated searches' parts on one
    pool (one fork of the workers, not one per search), each result equal to its own search's."""
    from infercast.search.run import search_both, sharing_estimators

    kw = dict(systems_path=synth.systems_dir, max_gpus=8, tpot_max_ms=2.0)
    agg = search_agg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 64, jobs=1, **kw)
    dis = search_disagg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 64, jobs=1, max_workers=4, **kw)
    assert forks == []
    seen = []
    with sharing_estimators():
        both = search_both(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 64, jobs=jobs, disagg_kw={"max_workers": 4},
                           progress=lambda done, total: seen.append((done, total)), **kw)
    assert forks == ([] if jobs == 1 else [1])  # one pool for both searches
    assert list(both) == ["agg", "disagg"]
    _same(agg, both["agg"])
    _same(dis, both["disagg"])
    parts = seen[-1][1]
    assert seen[-1] == (parts, parts) and [d for d, _ in seen] == list(range(1, parts + 1))


def test_run_groups_merges_each_group_in_its_parts_order():
    """Parts of several groups, taken longest first over all groups: each group's additions
    merged in its own parts' order, whatever order they ran in."""
    a, b = SearchResult("m", "s", "x", "v", 1, 1, 1, None, None), SearchResult("m", "s", "x", "v", 1, 1, 1, None, None)

    def part(tag):
        return lambda res: res.skipped.update({tag: tag})

    parallel.run_groups([(a, [part("a0"), part("a1")], [1.0, 9.0]), (b, [part("b0")], [5.0])], jobs=1)
    assert list(a.skipped) == ["a0", "a1"] and list(b.skipped) == ["b0"]
    if parallel.fork_available():
        a2, b2 = (SearchResult("m", "s", "x", "v", 1, 1, 1, None, None) for _ in range(2))
        parallel.run_groups([(a2, [part("a0"), part("a1")], [1.0, 9.0]), (b2, [part("b0")], [5.0])], jobs=2)
        assert list(a2.skipped) == ["a0", "a1"] and list(b2.skipped) == ["b0"]


def test_serial_path_is_the_plain_loop(synth, monkeypatch):
    """One worker (or one part) never forks: the parts run on the result itself."""
    def no_pool(*a, **k):
        raise AssertionError("forked for one job")

    import multiprocessing

    monkeypatch.setattr(multiprocessing, "get_context", no_pool)
    r = search_agg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, systems_path=synth.systems_dir, concurrencies=[1, 4], jobs=1)
    assert len(r.candidates) == 14
    seen = []
    parallel.run_parts(r, [seen.append], jobs=4)  # a single part: in this process
    assert seen == [r]


def test_workers_for():
    assert parallel.workers_for(1, 10) == 1
    assert parallel.workers_for(8, 3) == 3  # no more workers than parts
    assert parallel.workers_for(4, 1) == 1
    auto = parallel.workers_for(None, 100)
    assert 1 <= auto <= parallel.AUTO_MAX_JOBS
    assert auto == (min(parallel.usable_cpus(), parallel.AUTO_MAX_JOBS) if parallel.fork_available() else 1)


@pytest.mark.parametrize("jobs", [0, -2, 1.5, "2", True])
def test_bad_jobs_refused(synth, jobs):
    with pytest.raises(InvalidInputError, match="jobs must be a positive integer"):
        search_agg(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 8, systems_path=synth.systems_dir, jobs=jobs)


def test_jobs_without_fork_refused(monkeypatch):
    monkeypatch.setattr(parallel, "fork_available", lambda: False)
    with pytest.raises(InvalidInputError, match="forked worker processes"):
        parallel.check_jobs(2)
    assert parallel.check_jobs(1) == 1 and parallel.workers_for(None, 50) == 1


@needs_fork
def test_search_cli_jobs(synth, capsys, forks):
    argv = ["search", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm", "--systems-path",
            str(synth.systems_dir), "--isl", "128", "--osl", "8", "--mode", "both", "--max-gpus", "4", "--json", "--all"]
    assert main([*argv, "--jobs", "1"]) == 0
    one = capsys.readouterr().out
    assert main([*argv, "--jobs", "2"]) == 0
    assert capsys.readouterr().out == one and forks == [1]  # both searches' parts on one pool
    assert json.loads(one)["disagg"]["candidates"]
    assert main([*argv, "--jobs", "0"]) == 2
    err = capsys.readouterr().err
    assert "jobs must be a positive integer, got 0" in err and "Traceback" not in err


def test_a_process_with_other_threads_is_not_forked():
    import threading

    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert parallel.workers_for(2, 10) == 1 and parallel.workers_for(None, 10) == 1
    finally:
        stop.set()
        t.join()
    assert parallel.workers_for(2, 10) == (2 if parallel.fork_available() else 1)


@needs_fork
def test_recommend_cli_jobs(synth, capsys, forks):
    argv = ["recommend", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm", "--systems-path",
            str(synth.systems_dir), "--isl", "128", "--osl", "8", "--max-gpus", "4", "--rate", "50", "--json"]
    assert main([*argv, "--jobs", "1"]) == 0
    one = capsys.readouterr().out
    assert main([*argv, "--jobs", "2"]) == 0
    assert capsys.readouterr().out == one and json.loads(one)["recommendations"] and forks == [1]  # one pool, both modes
    assert main([*argv, "--jobs", "-1"]) == 2
    assert "jobs must be a positive integer" in capsys.readouterr().err


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_search_progress_on_stderr(synth, capsys, jobs):
    """``--progress`` off a terminal: plain lines on stderr per tenth of the layouts, in both modes;
    stdout stays one JSON object; ``--quiet``: nothing on stderr."""
    argv = ["search", "--model", sp.MODEL_ID, "--system", sp.SYSTEM, "--backend", "trtllm", "--systems-path",
            str(synth.systems_dir), "--isl", "128", "--osl", "8", "--mode", "both", "--max-gpus", "4", "--json",
            "--jobs", jobs]
    assert main([*argv, "--progress"]) == 0
    out, err = capsys.readouterr()
    json.loads(out)
    lines = err.splitlines()
    # both searches' parts together (one pool): 5 aggregated layouts and 2 decode layouts
    assert lines[0].startswith("infercast search: ") and lines[0].endswith("[aggregated and decode layouts]")
    assert lines[-1].startswith("infercast search: 7/7 layouts (100%) in ") and lines[-1].endswith("[aggregated and decode layouts]")
    assert main([*argv[:argv.index("both")], "agg", *argv[argv.index("both") + 1:], "--progress"]) == 0
    assert capsys.readouterr().err.splitlines()[-1].startswith("infercast search: 5/5 layouts (100%) in ")
    assert main([*argv, "--quiet"]) == 0
    assert capsys.readouterr().err == ""


@needs_fork
def test_a_worker_that_dies_is_an_error_not_a_hang(forks):
    """A worker killed mid-part (here it exits; in life the OOM killer) ends the run with a
    WorkerError saying what to do, instead of waiting for its answer forever."""
    import os
    import time

    from infercast.errors import WorkerError

    res = SearchResult("m", "s", "b", None, 1, 1, 1, None, None)
    here = os.getpid()

    def ok(r):
        r.evaluated["part"] = r.evaluated.get("part", 0) + 1

    def dies_in_a_worker(r):
        if os.getpid() != here:
            os._exit(3)
        time.sleep(0.3)  # (this process's part lasts long enough for the worker to take one)
        ok(r)

    with pytest.raises(WorkerError, match="--jobs 1"):
        parallel.run_parts(res, [dies_in_a_worker] * 4, jobs=2)
    assert forks == [1] and res.evaluated == {}  # nothing merged from a broken run
    parallel.run_parts(res, [ok, ok, ok], jobs=2)
    assert res.evaluated == {"part": 3}


@needs_fork
def test_parts_run_here_and_on_the_workers(forks):
    """With ``jobs`` N, this process and N - 1 forked workers take the parts (the most costly
    first) from one counter: here, each part lasting long enough, both kinds of process run some."""
    import os
    import time

    res = SearchResult("m", "s", "b", None, 1, 1, 1, None, None)

    def part(r):
        time.sleep(0.05)
        r.evaluated[f"pid {os.getpid()}"] = r.evaluated.get(f"pid {os.getpid()}", 0) + 1

    parallel.run_parts(res, [part] * 8, jobs=2)
    assert forks == [1] and sum(res.evaluated.values()) == 8
    assert f"pid {os.getpid()}" in res.evaluated and len(res.evaluated) == 2


@needs_fork
def test_fixed_gpu_search_on_workers_equals_one_process(synth, forks):
    from infercast.search import search_fixed

    kw = dict(systems_path=synth.systems_dir, gpus=4, tpot_max_ms=2.0)
    one = search_fixed(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 64, jobs=1, **kw)
    many = search_fixed(sp.MODEL_ID, sp.SYSTEM, "trtllm", 128, 64, jobs=2, **kw)
    assert forks == [1]
    kinds = {type(c).__name__ for c in one.candidates}
    assert kinds == {"Candidate", "DisaggCandidate"}  # both kinds of part
    _same(one, many)


@needs_fork
def test_exp_searches_fork_their_workers_when_run_here(synth, forks, tmp_path, capsys):
    """``exp`` run in this process: the searches fork their workers (one pool for both modes; its
    progress display runs no thread); the same outcome as one process per search."""
    from infercast.exp import parse_experiments
    from infercast.exp.run import run_one

    text = f"""\
defaults:
  model: {sp.MODEL_ID}
  system: {sp.SYSTEM}
  backend: trtllm
  isl: 128
  osl: 8
experiments:
  - name: both
    mode: both
    max_gpus: 4
"""
    f = tmp_path / "e.yaml"
    f.write_text(text)
    assert main(["exp", str(f), "--systems-path", str(synth.systems_dir), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["results"]
    n = parallel.workers_for(None, 10)  # the default: the usable CPUs, at most 4
    assert forks == ([n - 1] if n > 1 else [])  # one pool for both searches' parts
    (exp,) = parse_experiments(text)
    alone = run_one((exp, sp.SYSTEM, "trtllm", synth.systems_dir, 1)).to_dict()
    assert json.loads(json.dumps(alone, default=str)) == got[0]


def test_parts_run_with_the_collector_paused_and_restored():
    import gc

    res = SearchResult("m", "s", "b", None, 1, 1, 1, None, None)
    seen = []
    assert gc.isenabled()
    parallel.run_parts(res, [lambda r: seen.append(gc.isenabled())] * 2, jobs=1)
    assert seen == [False, False] and gc.isenabled()
    gc.disable()
    try:
        parallel.run_parts(res, [lambda r: seen.append(gc.isenabled())], jobs=1)
        assert not gc.isenabled()  # left as the caller had it
    finally:
        gc.enable()
    if parallel.fork_available():
        parallel.run_parts(res, [lambda r: r.evaluated.update(enabled=gc.isenabled(), frozen=gc.get_freeze_count() > 0)] * 2,
                           jobs=2)
        assert res.evaluated == {"enabled": 0, "frozen": 2} and gc.get_freeze_count() == 0 and gc.isenabled()


@pytest.mark.parametrize("state,prefix", [(0.0, 0), (0.0, 1000), (2048.0, 0), (2048.0, 1000), (1e9, 37)])
def test_decode_kv_capacity_on_arrays_is_the_scalar_formula(state, prefix):
    from types import SimpleNamespace

    from infercast.search.run import DisaggGroup
    from infercast.serving.memory import MemoryBreakdown
    from infercast.serving.prefix import shared_prefix_capacity

    mem = SimpleNamespace(kv_capacity_tokens=500_000.0, state_per_request=state, kv_per_token=4.0, tokens_per_block=32)
    mem.capacity_for = lambda r: MemoryBreakdown.capacity_for(mem, r)
    g = DisaggGroup.__new__(DisaggGroup)
    g.de = SimpleNamespace(memory=mem)
    g.res = SimpleNamespace(isl=4000, osl=500, prefix=prefix)
    batch = [0.0, 1.0, 63.5, 250.0, 1e6]
    want = [shared_prefix_capacity(mem.capacity_for(d), prefix, 32) / 4500 for d in batch]
    assert g._kv_capacity(batch) == want


@needs_fork
def test_a_process_with_many_open_files_runs_its_workers(forks):
    """A long-lived process may hold more than 1,024 descriptors (each memory-mapped table column
    keeps one): the workers' pipes then have numbers ``select`` refuses; they are polled."""
    import os
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        pytest.skip(f"this process may open {soft} files")
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        res = SearchResult("m", "s", "b", None, 1, 1, 1, None, None)

        def part(r):
            r.evaluated["part"] = r.evaluated.get("part", 0) + 1

        parallel.run_parts(res, [part] * 6, jobs=2)
        assert res.evaluated == {"part": 6} and forks == [1]
    finally:
        for fd in fds:
            os.close(fd)


def test_more_parts_than_the_token_pipe_holds_run_here(forks, monkeypatch):
    """When the parts' tokens do not fit a pipe (``_tokens`` answers None), they run in this
    process, in order: the same result, nothing forked."""
    res = SearchResult("m", "s", "b", None, 1, 1, 1, None, None)
    seen = []
    monkeypatch.setattr(parallel, "_tokens", lambda n: None)
    parallel.run_parts(res, [lambda r, k=k: seen.append(k) for k in range(5)], jobs=2)
    assert seen == [0, 1, 2, 3, 4] and forks == []


def test_the_frontier_and_best_of_the_parts_fronts_are_those_of_every_candidate():
    """_finish from the parts' own frontiers and bests (what forked workers send back) gives the
    frontier and the recommendation of ordering every candidate, index for index: random metrics
    with many ties (equal to 10 digits, equal GPUs), parts of random sizes (empty ones too), none
    meeting the targets in some parts; a NaN in a part makes its summary None (every candidate
    ordered)."""
    import numpy as np

    from infercast.search.candidates import Candidates
    from infercast.search.run import Candidate, _front_all, _front_of_parts, front_of

    rng = np.random.default_rng(3)
    for trial in range(300):
        n = int(rng.integers(1, 400))
        grid = rng.integers(1, 6, size=(n, 2)).astype(float)  # few distinct values: many ties
        jitter = 1.0 + rng.choice([0.0, 1e-13, 1e-6], size=(n, 2))  # equal to 10 digits, or not
        u, g = grid[:, 0] * 10.0 * jitter[:, 0], grid[:, 1] * 100.0 * jitter[:, 1]
        gpus, ttft = rng.integers(1, 4, n), rng.choice([100.0, 200.0, 200.0 * (1 + 1e-13)], n)
        ok = rng.random(n) < rng.choice([0.0, 0.3, 1.0])
        cands = [Candidate("tp1", 1, 1, 1, 1, 1, int(gpus[i]), 1, float(ttft[i]), 10.0, None, None, 1.0, float(g[i]),
                           float(u[i]), "clients", bool(ok[i])) for i in range(n)]
        if trial % 10 == 0:
            cands[int(rng.integers(n))].tokens_per_s_per_user = float("nan")
        cuts = np.sort(rng.integers(0, n + 1, size=int(rng.integers(0, 6))))
        bounds = [0, *cuts.tolist(), n]
        parts = [(lo, front_of(Candidates(cands[lo:hi]))) for lo, hi in zip(bounds, bounds[1:])]
        whole = Candidates(cands)
        got = _front_of_parts(whole, parts)
        if trial % 10 == 0:
            assert got is None or all(s is not None for _, s in parts)
            continue
        assert got == _front_all(whole)
        if bounds[-2] < n:  # parts that do not cover every candidate
            assert _front_of_parts(whole, parts[:-1]) is None
