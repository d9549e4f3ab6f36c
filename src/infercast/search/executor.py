"""Where many independent work items run: in this process, over local processes, or on a Ray
cluster -- one interface for the commands whose sweeps can outgrow one machine (``infercast
support``, ``infercast exp``).

:func:`executor` picks the backend from the command line's ``--jobs N`` and ``--ray [ADDRESS]``:

* serial (``jobs`` 1, no ``ray``): the items one after another in this process;
* local processes (``jobs`` > 1): a :class:`concurrent.futures.ProcessPoolExecutor` of that
  many *spawned* processes (each imports infercast afresh and reads its own tables);
* Ray (``ray`` given): each item a Ray task. ``"local"`` starts a private Ray instance in this
  process (``jobs`` CPUs when given, else every core) and stops it at the end; ``"auto"``, an
  address ``HOST:PORT`` (the cluster's GCS) or ``ray://HOST:PORT`` (Ray Client) connects to a
  running cluster; ``""`` (``--ray`` without an address) lets :func:`ray.init` choose (the
  ``RAY_ADDRESS`` environment variable, else the cluster last started on this machine, else a
  new local instance). When Ray is already
  initialised in this process (a library caller ran :func:`ray.init`), that connection is used
  and left open. ``jobs`` then caps the tasks in flight.

Every backend's :meth:`Executor.map` returns the results in the items' order, whatever order
they finish in, and calls ``on_done(index, result)`` as each finishes (progress). The function
and items must be picklable (a module-level function; plain data), and each result must depend
on its item alone: then every backend's answers are the serial run's, bit for bit.

Assumptions on a remote Ray cluster: its nodes have infercast (the same version) and its Python
dependencies installed, and the data pack at the ``systems_path`` the caller passes (or the
installed ``aiconfigurator-core`` when it is None). Ray is an optional dependency
(``pip install 'infercast[ray]'``); without it, asking for Ray raises
:class:`~infercast.errors.NotAvailableError` saying how to install it.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Self

from ..errors import InvalidInputError, NotAvailableError

#: seconds to wait for a Ray address to accept a connection before calling it unreachable
CONNECT_TIMEOUT_S = 5.0
#: the one-line hint printed when Ray is asked for but not installed
RAY_INSTALL_HINT = "install it with: pip install 'infercast[ray]'"

OnDone = Callable[[int, Any], None]


class Executor:
    """Runs ``fn`` over items (see the module docstring). Use as a context manager: a backend that
    holds resources (processes, a Ray connection) releases them on exit."""

    name = "serial"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Release what the backend holds (nothing for the serial one)."""

    def map(self, fn: Callable, items: Sequence, on_done: OnDone | None = None) -> list:
        """``[fn(item) for item in items]``, calling ``on_done(i, result)`` after each."""
        out = []
        for i, item in enumerate(items):
            out.append(fn(item))
            if on_done is not None:
                on_done(i, out[-1])
        return out

    def describe(self) -> str:
        """The backend in words, for progress lines."""
        return "in this process"


class ProcessExecutor(Executor):
    """``jobs`` spawned local processes (:class:`concurrent.futures.ProcessPoolExecutor`)."""

    name = "processes"

    def __init__(self, jobs: int):
        self.jobs = jobs

    def map(self, fn: Callable, items: Sequence, on_done: OnDone | None = None) -> list:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        items = list(items)
        if len(items) < 2:
            return Executor.map(self, fn, items, on_done)
        out: list = [None] * len(items)
        with ProcessPoolExecutor(max_workers=min(self.jobs, len(items)), mp_context=mp.get_context("spawn")) as pool:
            futures = {pool.submit(fn, item): i for i, item in enumerate(items)}
            for f in as_completed(futures):
                i = futures[f]
                out[i] = f.result()
                if on_done is not None:
                    on_done(i, out[i])
        return out

    def describe(self) -> str:
        return f"over {self.jobs} local processes"


class RayExecutor(Executor):
    """Ray tasks on a local instance or a cluster (module docstring: ``address``); ``jobs``: the
    local instance's CPUs (``"local"``) and the most tasks in flight, None for no cap."""

    name = "ray"

    def __init__(self, address: str, jobs: int | None = None):
        ray = import_ray()
        self.ray = ray
        self.address = address
        self.jobs = jobs
        self._owned = False
        if ray.is_initialized():
            return
        import logging

        kw: dict = {"logging_level": logging.ERROR, "log_to_driver": False, "configure_logging": True}
        if address == "local":
            kw.update(address="local", include_dashboard=False)
            if jobs is not None:
                kw["num_cpus"] = jobs
        elif address:
            check_reachable(address)
            kw["address"] = address
        elif os.environ.get("RAY_ADDRESS"):
            check_reachable(os.environ["RAY_ADDRESS"], "RAY_ADDRESS")
        try:
            ray.init(**kw)
        except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
            raise InvalidInputError(f"--ray {address or '(default)'}: cannot connect to Ray: "
                                    f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}",
                                    "give --ray local for a private instance, or a running cluster's address "
                                    "(ray start --head prints it)") from None
        self._owned = True

    def close(self) -> None:
        if self._owned:
            self.ray.shutdown()
            self._owned = False

    def map(self, fn: Callable, items: Sequence, on_done: OnDone | None = None) -> list:
        ray = self.ray
        items = list(items)
        if not items:
            return []
        task = ray.remote(_apply).options(max_retries=0)
        fn_ref = ray.put(fn)
        cap = self.jobs or len(items)
        out: list = [None] * len(items)
        pending: dict = {}
        todo = iter(enumerate(items))
        for i, item in todo:
            pending[task.remote(fn_ref, item)] = i
            if len(pending) >= cap:
                break
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            ref = ready[0]
            i = pending.pop(ref)
            try:
                out[i] = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:  # the task's own error, without Ray's wrapping
                cause = getattr(exc, "cause", None)
                raise (cause if isinstance(cause, BaseException) else exc) from None
            if on_done is not None:
                on_done(i, out[i])
            nxt = next(todo, None)
            if nxt is not None:
                pending[task.remote(fn_ref, nxt[1])] = nxt[0]
        return out

    def describe(self) -> str:
        where = "a local Ray instance" if self.address == "local" else f"Ray at {self.address}" if self.address else "Ray"
        return f"on {where}"


def _apply(fn: Callable, item):
    """One Ray task: ``fn(item)`` (Ray's decorator takes plain functions only, not partials)."""
    return fn(item)


def import_ray():
    """The ``ray`` module, or :class:`~infercast.errors.NotAvailableError` saying how to get it."""
    try:
        import ray
    except ImportError:
        raise NotAvailableError("--ray needs Ray, which is not installed", RAY_INSTALL_HINT) from None
    return ray


_HOST_PORT = re.compile(r"^(?:ray://)?(?P<host>\[[^\]]+\]|[^:/\s]+):(?P<port>\d+)/?$")


def check_reachable(address: str, source: str = "--ray", timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Refuse a Ray address that is neither ``auto`` nor ``[ray://]HOST:PORT``, or whose port does
    not accept a TCP connection within ``timeout`` seconds (:func:`ray.init` would otherwise wait
    minutes for it). ``source`` names where the address came from in the message. A port that
    accepts connections but is no Ray cluster is left to :func:`ray.init` to refuse."""
    if address == "auto":
        return
    m = _HOST_PORT.match(address)
    if not m:
        raise InvalidInputError(f"{source} {address}: not a Ray address",
                                "give local, auto, HOST:PORT (the cluster's GCS) or ray://HOST:PORT (Ray Client)")
    host, port = m.group("host").strip("[]"), int(m.group("port"))
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise InvalidInputError(f"{source} {address}: unreachable ({why} after at most {timeout:g} s)",
                                "start a cluster there (ray start --head), or give --ray local") from None


def executor(jobs: int | None = None, ray: str | None = None) -> Executor:
    """The backend for ``--jobs`` and ``--ray`` (module docstring); ``jobs`` must be a positive
    integer or None (1 without Ray, no cap with it)."""
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise InvalidInputError(f"--jobs must be >= 1, got {jobs!r}")
    if ray is not None:
        return RayExecutor(ray, jobs)
    if jobs is not None and jobs > 1:
        return ProcessExecutor(jobs)
    return Executor()


def run_all(fn: Callable, items: Iterable, *, jobs: int | None = None, ray: str | None = None,
            on_done: OnDone | None = None) -> list:
    """``fn`` over ``items`` on the backend of ``jobs`` / ``ray``, results in the items' order."""
    with executor(jobs, ray) as ex:
        return ex.map(fn, list(items), on_done)
