"""A search's independent parts run on several local processes: ``search --jobs N``.

A search is a list of *parts* that do not depend on each other: an aggregated search evaluates
each layout at its concurrencies (one part per layout), a disaggregated search solves the
deployments of a few decode layouts together (one part per group of decode layouts,
:func:`~infercast.search.run.decode_chunks`). Each part adds
candidates, refusals and counts to a :class:`~infercast.search.run.SearchResult`. Several
searches' parts can share one set of workers (:func:`run_groups`: ``search --mode both`` runs the
aggregated and disaggregated searches' parts together, the longest of either first).
:func:`run_parts` runs them either in this process one after another, adding to the result
directly, or on ``jobs`` processes: this one and ``jobs - 1`` workers *forked* from it, so that the
workers start with everything this process has built (the parsed tables, the layouts' estimators
and their compiled op lattices) instead of building it again. All of them take the parts, most
costly first, from a pipe holding one token per part (a read of a few bytes from a pipe is
atomic: no lock, and none of ``multiprocessing``'s machinery); a worker leaves each answer in a file
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
import struct
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
    """Whether parts can run on forked workers here (Linux, where ``os.fork`` of a process that has
    imported numpy is well supported)."""
    return sys.platform.startswith("linux") and hasattr(os, "fork")


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
    # decreasing cost, ties in the parts' order (sorted is stable)
    order = sorted(range(len(flat)), key=lambda i: -costs[i])
    tokens = _tokens(len(order)) if n > 1 else None
    if tokens is None:  # one process (or more parts than a pipe holds tokens for)
        with paused_gc():  # once for all the parts: each resumption would pass over the candidates so far
            for i, (res, part) in enumerate(flat):
                part(res)
                if on_done is not None:
                    on_done(i + 1, len(flat))
        return
    import select
    _PARTS, _RESULT, _ORDER = [part for _, part in flat], [res for res, _ in flat], order
    done: dict = {}
    workers: dict = {}  # the reading end of each worker's pipe -> (its process id, bytes not yet read)
    spool = _spool()

    def answers(fd: int) -> None:
        """Take what the worker of ``fd`` has said so far: ``(part, 0)`` when part's answer is in
        its file, ``(part, 1)`` when the part raised (the exception in its file)."""
        pid, pending = workers[fd]
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return
        if not chunk:  # the worker has ended: after its last part, or killed before
            del workers[fd]
            os.close(fd)
            code = _reap(pid)
            if code != 0:
                raise WorkerError(
                    f"a search worker process died before answering ({len(done)} of {len(flat)} parts done, "
                    f"exit code {code}): killed by the operating system? (out of memory)",
                    "run it in one process: --jobs 1")
            return
        pending += chunk
        while len(pending) >= _SAID.size:
            i, failed = _SAID.unpack_from(pending)
            pending = pending[_SAID.size:]
            path = os.path.join(spool, f"{i}.pickle")
            with open(path, "rb") as f:
                got = pickle.load(f)
            os.unlink(path)
            if failed:
                raise got
            done[i] = got
            if on_done is not None:
                on_done(len(done), len(flat))
        workers[fd] = (pid, pending)

    # the objects built so far are never garbage the workers collect: frozen, the workers' collector
    # neither scans them nor writes to their pages (which the workers share with this process)
    gc.freeze()
    try:
        for _ in range(n - 1):
            reader, writer = os.pipe()
            pid = _fork()
            if pid == 0:  # the worker
                os.close(reader)
                _work(tokens, writer, spool)  # (ends the process)
            os.close(writer)
            os.set_blocking(reader, False)
            workers[reader] = (pid, b"")
        # this process takes parts too, and reads the workers' answers between its own
        while True:
            k = _next(tokens)
            if k is None:
                break
            i, got = _run_one(order[k])
            done[i] = got
            if on_done is not None:
                on_done(len(done), len(flat))
            for fd in list(workers):
                answers(fd)
        while workers:  # (poll, not select: a process with many files open has descriptors beyond select's 1024)
            waiting = select.poll()
            for fd in workers:
                waiting.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
            for fd, _ in waiting.poll():
                answers(fd)
        if len(done) < len(flat):  # (a worker cannot end cleanly with a part taken and not answered)
            raise WorkerError(f"the search workers answered {len(done)} of {len(flat)} parts", "run it in one process: --jobs 1")
    finally:
        for fd, (pid, _) in workers.items():
            os.close(fd)
            _stop(pid)
        os.close(tokens)
        _PARTS, _RESULT, _ORDER = (), (), ()
        gc.unfreeze()
        shutil.rmtree(spool, ignore_errors=True)
    with paused_gc():
        for i, (res, _) in enumerate(flat):
            _merge(res, done[i])


#: where the workers leave their answers for this process (memory-backed where the system has it)
_SPOOL_DIR = "/dev/shm"
#: a part's position in :data:`_ORDER`, as taken from the token pipe (:func:`_tokens`)
_TOKEN = struct.Struct("<I")
#: what a worker says of a part: its index, and 1 if it raised (the answer or the exception is in its file)
_SAID = struct.Struct("<IB")


def _spool() -> str:
    """A new directory for the workers' answers (under :data:`_SPOOL_DIR` where there is one)."""
    import time

    base = _SPOOL_DIR if os.path.isdir(_SPOOL_DIR) and os.access(_SPOOL_DIR, os.W_OK) else os.environ.get("TMPDIR", "/tmp")
    for attempt in range(100):
        path = os.path.join(base, f"infercast-parts-{os.getpid()}-{time.monotonic_ns()}-{attempt}")
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue
    raise OSError(f"cannot make a directory for the search workers' answers under {base}")


def _tokens(n: int) -> int | None:
    """The reading end of a pipe holding the positions ``0 .. n - 1`` (one :data:`_TOKEN` each,
    the write end closed): every process takes the next part by reading one (a read of a few
    bytes from a pipe is atomic), and an empty pipe means none is left. None when ``n`` tokens do
    not fit the pipe (Linux lets a pipe grow to ``/proc/sys/fs/pipe-max-size``, 1 MB by default)."""
    reader, writer = os.pipe()
    need = n * _TOKEN.size
    try:
        if need > 65536:
            import fcntl

            fcntl.fcntl(writer, getattr(fcntl, "F_SETPIPE_SZ", 1031), need)
        os.set_blocking(writer, False)
        data = b"".join(_TOKEN.pack(k) for k in range(n))
        if os.write(writer, data) != len(data):
            raise OSError("short write")
    except OSError:
        os.close(reader)
        return None
    finally:
        os.close(writer)
    return reader


def _next(tokens: int) -> int | None:
    """The next part's position from the token pipe, or None when none is left."""
    got = os.read(tokens, _TOKEN.size)
    return _TOKEN.unpack(got)[0] if len(got) == _TOKEN.size else None


def _fork() -> int:
    """``os.fork()``, this process's buffered output written out first (a child that inherited it
    must not write it again)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    return os.fork()


def _reap(pid: int) -> int:
    """The exit code of ended worker ``pid`` (a signal's number, negated, if one ended it); 0 when
    the system reaped it already (``SIGCHLD`` ignored by a library): its unanswered parts, if any,
    still end the run with :class:`WorkerError`."""
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return 0
    return os.waitstatus_to_exitcode(status)


def _stop(pid: int) -> None:
    """End worker ``pid`` if it still runs (this process is leaving on an error) and reap it."""
    import signal

    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _work(tokens: int, conn: int, spool: str) -> None:
    """A worker's loop, in the forked process: take the next part (:func:`_next`), run it, leave its
    answer in ``spool/<part>.pickle`` and say so on ``conn`` (:data:`_SAID`), until none is left;
    a part that raises leaves the exception instead and ends the loop. The answers go through
    files, not the pipe: a pipe holds ~64 KB, and the worker would wait, answer in hand, while this
    process runs a part. The process ends here (``os._exit``: none of the parent's exit handlers,
    none of its buffered output)."""
    code = 0
    try:
        while True:
            k = _next(tokens)
            if k is None:
                break
            i = _ORDER[k]
            try:
                i, got = _run_one(i)
                failed = 0
            except Exception as exc:  # noqa: BLE001 (handed to the parent, which raises it)
                got, failed = exc, 1
            path = os.path.join(spool, f"{i}.pickle")
            with open(path, "wb") as f:
                try:
                    pickle.dump(got, f, protocol=pickle.HIGHEST_PROTOCOL)
                except Exception as exc:  # noqa: BLE001 (an exception that does not pickle: its words)
                    f.seek(0)
                    f.truncate()
                    pickle.dump(RuntimeError(f"search part {i} failed: {got!r} ({exc})"), f)
                    failed = 1
            os.write(conn, _SAID.pack(i, failed))
            if failed:
                break
    except BaseException:  # noqa: BLE001 (whatever happens, the worker ends here)
        code = 1
    finally:
        os._exit(code)


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
    objects, and kept as rows in this process too: :class:`~infercast.search.candidates.Candidates`),
    and the copy's ``part_summary()`` where the result has one (a search's: the part's own frontier
    and best, so that the merged result orders only those), handed to the result's
    ``add_part_summary(start, summary)`` as it is merged."""
    sub = _empty_copy(_RESULT[i])
    with paused_gc():
        _PARTS[i](sub)
        summary = getattr(sub, "part_summary", None)
        said = summary() if summary is not None else None
    return i, (sub.candidates.runs(), sub.skipped, sub.evaluated, sub.refused, said)


def _merge(res, got) -> None:
    runs, skipped, evaluated, refused, said = got
    start = len(res.candidates)
    for cls, rows in runs:
        res.candidates.add_rows(cls, rows)
    keep = getattr(res, "add_part_summary", None)
    if keep is not None:
        keep(start, said)
    res.skipped.update(skipped)
    for kind, n in evaluated.items():
        res.evaluated[kind] = res.evaluated.get(kind, 0) + n
    for why, n in refused.items():
        res.refused[why] = res.refused.get(why, 0) + n
