"""A search's independent parts run on several local processes: ``search --jobs N``.

A search is a list of *parts* that do not depend on each other: an aggregated search evaluates
each layout at its concurrencies (one part per layout), a disaggregated search solves the
deployments of each decode layout together (one part per decode layout). Each part adds
candidates, refusals and counts to a :class:`~infercast.search.run.SearchResult`. Several
searches' parts can share one set of workers (:func:`run_groups`: ``search --mode both`` runs the
aggregated and disaggregated searches' parts together, the longest of either first).
:func:`run_parts` runs them either in this process one after another, adding to the result
directly, or on ``jobs`` processes: this one and ``jobs - 1`` workers *forked* from it, so that the
workers start with everything this process has built (the parsed tables, the layouts' estimators
and their compiled op lattices) instead of building it again. All of them take the parts, most
costly first, from a counter they share (under its lock); a worker leaves each answer in a file
(under ``/dev/shm`` where there is one: memory) and says so over its pipe, which this process reads
between its own parts (a pipe holds ~64 KB: an answer sent through it would keep the worker
waiting until this process finished its part). Each part fills an empty
copy of the result, and the copies are merged into the result in the parts' order: the candidates in the same order, the
refusals and counts in the same order of first appearance. A part's numbers depend only on its
inputs (the estimators' memos only hold what they compute), so a search gives the same result,
bit for bit, with any number of jobs (tested).

Forking is the one way to start workers that already hold the estimators, so parallel parts need
the ``fork`` start method on Linux (the platform where forking a process that has imported numpy
is well supported), from a process that runs no other thread (:func:`workers_for`). Otherwise, and
with ``jobs`` 1, the parts run in this process. ``jobs``
``None`` (the command line's default) uses the CPUs this process may run on, at most
:data:`AUTO_MAX_JOBS`, and only when there are at least two parts. A worker that dies before
answering (the operating system's out-of-memory killer) ends the run with
:class:`~infercast.errors.WorkerError`, never a wait for an answer that cannot come.
"""

from __future__ import annotations

import gc
import os
import pickle
import shutil
import sys
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from copy import copy

from ..errors import InvalidInputError, WorkerError

#: the most processes ``jobs=None`` runs parts on, this one included (a search has tens of parts;
#: beyond a few workers the forks and the merging cost more than they save)
AUTO_MAX_JOBS = 4

Part = Callable[[object], None]

#: the parts of the :func:`run_parts` call in progress, read by the forked workers
_PARTS: Sequence[Part] = ()
#: the result each part of :data:`_PARTS` fills (an empty copy of it, in a worker)
_RESULT: Sequence = ()
#: the order in which the workers take the parts (the most costly first)
_ORDER: Sequence[int] = ()


def fork_available() -> bool:
    """Whether parts can run on forked workers here (Linux with the ``fork`` start method)."""
    import multiprocessing

    return sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_jobs(jobs: int | None) -> int | None:
    """``jobs`` checked: None (automatic) or a positive integer; more than one needs forked workers."""
    if jobs is None:
        return None
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise InvalidInputError(f"jobs must be a positive integer, got {jobs!r}", "1 runs the search in this process")
    if jobs > 1 and not fork_available():
        raise InvalidInputError(f"jobs {jobs}: a search runs its parts on forked worker processes, which this platform "
                                f"({sys.platform}) does not offer", "use jobs 1")
    return jobs


def workers_for(jobs: int | None, parts: int) -> int:
    """How many processes run ``parts`` parts, this one included (1: this one alone). A process that runs
    other threads (a caller's progress display that refreshes itself, a library's pool) is not
    forked: a lock one of them held at the fork would stay locked in the workers forever, so its
    parts run here (the same answer, on one CPU)."""
    import threading

    if parts < 2 or threading.active_count() > 1:
        return 1
    if jobs is None:
        if not fork_available():
            return 1
        jobs = min(usable_cpus(), AUTO_MAX_JOBS)
    return max(1, min(jobs, parts))


def run_parts(res, parts: Sequence[Part], jobs: int | None = None, cost: Sequence[float] | None = None,
              on_done: Callable[[int, int], None] | None = None) -> None:
    """Run every part on ``res`` (see the module docstring). ``cost``: each part's relative
    expected work; the workers take the parts in decreasing cost, so that the longest do not
    start last (the merge still follows the parts' order). ``on_done(done, total)``: called in
    this process as each part finishes (progress)."""
    run_groups([(res, parts, cost)], jobs, on_done)


def run_groups(groups: Sequence[tuple], jobs: int | None = None, on_done: Callable[[int, int], None] | None = None) -> None:
    """:func:`run_parts` of several searches at once: ``groups`` is a sequence of ``(res, parts,
    cost)``, each part filling its own group's ``res``. All the groups' parts share one set of
    workers, taken in decreasing cost over every group (the costs of all groups in one unit), so
    one search's long parts overlap another's short ones; each group's result is merged in its
    parts' order, as :func:`run_parts` would. ``on_done(done, total)`` counts every group's parts."""
    global _PARTS, _RESULT, _ORDER

    flat = [(res, part) for res, parts, _ in groups for part in parts]
    costs = [c for _, parts, cost in groups for c in (cost if cost is not None else [0.0] * len(parts))]
    n = workers_for(jobs, len(flat))
    if n == 1:
        with paused_gc():  # once for all the parts: each resumption would pass over the candidates so far
            for i, (res, part) in enumerate(flat):
                part(res)
                if on_done is not None:
                    on_done(i + 1, len(flat))
        return
    import multiprocessing
    import tempfile
    from multiprocessing.connection import wait

    # decreasing cost, ties in the parts' order (sorted is stable)
    order = sorted(range(len(flat)), key=lambda i: -costs[i])
    _PARTS, _RESULT, _ORDER = [part for _, part in flat], [res for res, _ in flat], order
    done: dict = {}
    ctx = multiprocessing.get_context("fork")
    taken = ctx.Value("i", 0)  # how many of ``order`` this process and the workers have taken
    workers: dict = {}  # the reading end of each worker's pipe -> the worker
    spool = tempfile.mkdtemp(prefix="infercast-parts-", dir=_SPOOL_DIR if os.path.isdir(_SPOOL_DIR) else None)

    def answer(reader, block: bool) -> None:
        """Take the worker's next message (if one is there, or waiting for it with ``block``)."""
        if not block and not reader.poll(0):
            return
        try:
            kind, i, got = reader.recv()
        except EOFError:  # the worker has ended: after its last part, or killed before
            proc = workers.pop(reader)
            proc.join()
            if proc.exitcode != 0:
                raise WorkerError(
                    f"a search worker process died before answering ({len(done)} of {len(flat)} parts done, "
                    f"exit code {proc.exitcode}): killed by the operating system? (out of memory)",
                    "run it in one process: --jobs 1") from None
            return
        if kind == "error":
            raise got
        with open(got, "rb") as f:
            done[i] = pickle.load(f)
        os.unlink(got)
        if on_done is not None:
            on_done(len(done), len(flat))

    # the objects built so far are never garbage the workers collect: frozen, the workers' collector
    # neither scans them nor writes to their pages (which the workers share with this process)
    gc.freeze()
    try:
        for _ in range(n - 1):
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_work, args=(taken, writer, spool), daemon=True)
            proc.start()
            writer.close()  # this process's copy: the pipe ends when the worker's does
            workers[reader] = proc
        # this process takes parts too, and reads the workers' answers between its own
        while True:
            k = _take(taken)
            if k is None:
                break
            i, got = _run_one(order[k])
            done[i] = got
            if on_done is not None:
                on_done(len(done), len(flat))
            for reader in list(workers):
                answer(reader, False)
        while workers:
            for reader in wait(list(workers)):
                answer(reader, True)
        if len(done) < len(flat):  # (a worker cannot end cleanly with a part taken and not answered)
            raise WorkerError(f"the search workers answered {len(done)} of {len(flat)} parts", "run it in one process: --jobs 1")
    finally:
        for proc in workers.values():
            proc.terminate()
        for proc in workers.values():
            proc.join()
        _PARTS, _RESULT, _ORDER = (), (), ()
        gc.unfreeze()
        shutil.rmtree(spool, ignore_errors=True)
    with paused_gc():
        for i, (res, _) in enumerate(flat):
            _merge(res, done[i])


#: where the workers leave their answers for this process (memory-backed where the system has it)
_SPOOL_DIR = "/dev/shm"


def _take(taken) -> int | None:
    """The position in :data:`_ORDER` of the next part not taken yet (``taken`` counts them, under
    its lock), or None."""
    with taken.get_lock():
        k = taken.value
        if k >= len(_ORDER):
            return None
        taken.value = k + 1
    return k


def _work(taken, conn, spool: str) -> None:
    """A worker's loop: take the next part (:func:`_take`), run it, leave its answer in a file of
    ``spool`` and send ``("done", i, path)``, until none is left; a part that raises sends
    ``("error", i, exception)`` and ends the loop. The answers go through files, not the pipe: a
    pipe holds ~64 KB, and the worker would wait, answer in hand, while this process runs a part."""
    try:
        while True:
            k = _take(taken)
            if k is None:
                return
            i = _ORDER[k]
            try:
                i, got = _run_one(i)
                path = os.path.join(spool, f"{i}.pickle")
                with open(path, "wb") as f:
                    pickle.dump(got, f, protocol=pickle.HIGHEST_PROTOCOL)
                conn.send(("done", i, path))
            except Exception as exc:  # noqa: BLE001 (handed to the parent, which raises it)
                try:
                    conn.send(("error", i, exc))
                except Exception:  # an exception that does not pickle: its words
                    conn.send(("error", i, RuntimeError(f"search part {i} failed: {exc!r}")))
                return
    finally:
        conn.close()


@contextmanager
def paused_gc():
    """Python's cyclic garbage collector paused for the block (restored as it was). A part builds
    many small objects that form no cycles (a large disaggregated search, ~1 million candidates:
    the collector's passes over the growing heap made it ~15% slower); they are freed by reference
    counting as usual, and any cycle left is collected once the collector runs again."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _empty_copy(res):
    from .candidates import Candidates

    sub = copy(res)
    sub.candidates, sub.skipped, sub.evaluated, sub.refused = Candidates(), {}, {}, {}
    return sub


def _run_one(i: int):
    """In a worker: part ``i`` on an empty copy of the result; its additions as plain data (the
    candidates as rows of field values, a run per class: far cheaper to send back than the
    objects, and kept as rows in this process too: :class:`~infercast.search.candidates.Candidates`)."""
    sub = _empty_copy(_RESULT[i])
    with paused_gc():
        _PARTS[i](sub)
    return i, (sub.candidates.runs(), sub.skipped, sub.evaluated, sub.refused)


def _merge(res, got) -> None:
    runs, skipped, evaluated, refused = got
    for cls, rows in runs:
        res.candidates.add_rows(cls, rows)
    res.skipped.update(skipped)
    for kind, n in evaluated.items():
        res.evaluated[kind] = res.evaluated.get(kind, 0) + n
    for why, n in refused.items():
        res.refused[why] = res.refused.get(why, 0) + n
