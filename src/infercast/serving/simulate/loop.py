"""The discrete-event loop: sends, routing, front-end delay, scheduler segments.

Events, in time order (at equal times: sends, arrivals at a scheduler, KV hand-offs, then segment
ends):

* *send*: a request leaves its client (open loop: at its send time; closed loop: each client's
  first request at time 0, or spread as the workload's ``client_start`` says, then each next one
  the moment its previous request completes -- after a one-time wait for ``wave-then-staggered``). The
  router (:mod:`.router`) picks a scheduler; the request reaches it after the front end's time
  (``front_end(open streams of that replica, prompt tokens)`` ms: HTTP, tokenisation, the API
  server's per-stream work, :meth:`~infercast.serving.backends.SchedulerParams.front_end_ms`), fixed
  or spread uniformly around it (``front_end_spread``). The spread matters beyond percentiles:
  closed-loop clients of fixed lengths that complete in the same step send their next requests
  together, and with a fixed front end they stay phase-locked in waves for the whole benchmark;
  a front end whose time varies from request to request (as real HTTP handling, tokenisation and
  event loops do) spreads them over steps and the waves dissolve.
* *arrival*: the request joins the scheduler's queue. An idle scheduler starts a step at once
  (with every request arriving at the same instant); a
  scheduler in a run of decode steps ends the run with the step in progress, so the request is
  considered at the next step boundary.
* *hand-off* (disaggregated): a request prefilled by a prefill worker reaches a decode worker
  with its KV cache, after the transfer time, and waits there for admission to the decodes.
* *segment end*: the scheduler (or the attention-DP ranks of a replica stepping together,
  :mod:`.lockstep`) commits its segment (:meth:`.scheduler.Unit.commit`), completes
  requests, and plans the next one.

Nothing steps token by token: time jumps from event to event.
"""

from __future__ import annotations

import heapq
import sys
import time

from .scheduler import Request

SEND, ARRIVE, HANDOFF, SEGMENT = 0, 1, 2, 3


def run(units, router, workload, front_end, replica_of=None, progress: bool = False, front_end_spread: float = 0.0,
        seed: int = 0, decode_units=None, decode_router=None, transfer_ms=None) -> list[Request]:
    """Play ``workload`` (:class:`.load.Workload`) on ``units`` (:class:`.scheduler.Unit`);
    ``replica_of[i]``: the replica whose front end unit ``i`` sits behind (default: its own).
    ``front_end_spread`` ``s``: each request's front-end time is drawn uniformly from
    ``[(1 - s) m, (1 + s) m]`` around the modelled ``m`` (0: every request takes ``m``).
    Disaggregated (``decode_units`` given): ``units`` are the prefill workers' schedulers
    (``prefill_only``); a request leaves its prefill worker with its first token and reaches the
    decode worker that ``decode_router`` picks ``transfer_ms(request)`` ms later (its KV cache's
    move), to decode there.
    Returns the requests with their times filled in."""
    if not 0.0 <= front_end_spread <= 1.0:
        from ...errors import InvalidInputError

        raise InvalidInputError("--front-end-spread is a share of the front-end time, in [0, 1]", f"got {front_end_spread}")
    import random

    rnd = random.Random(seed)
    spread = float(front_end_spread)
    n = len(workload)
    replica_of = list(range(len(units))) if replica_of is None else list(replica_of)
    decode_units = decode_units or []
    n_rep = max(replica_of) + 1
    rep_streams = [0] * n_rep
    hashes = workload.hashes
    isl, osl = workload.isl.tolist(), workload.osl.tolist()
    reqs: list[Request] = []
    heap: list = []
    seq = 0

    def push(t, kind, obj):
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, kind, seq, obj))

    def new_request(i: int, t: float, client: int = -1) -> Request:
        r = Request(i, t, isl[i], osl[i], tuple(hashes[i]) if hashes is not None else (), client)
        reqs.append(r)
        return r

    if workload.sent_ms is None:
        clients = min(workload.clients, n)
        start, ramp = workload.client_start, workload.ramp_up_ms
        if start not in ("together", "staggered", "wave-then-staggered") or (start != "together" and ramp is None):
            from ...errors import InvalidInputError

            raise InvalidInputError("a closed loop's client start must be resolved first (deploy.simulate)",
                                    f"got {start}, ramp-up {ramp}")
        after_first = start == "wave-then-staggered"
        ramp = float(ramp or 0.0) if start != "together" else 0.0
        for c in range(clients):
            t0 = ramp * c / clients if start == "staggered" else 0.0
            push(t0, SEND, new_request(c, t0, c))
        client_sent = [1] * clients
        issued = clients
    else:
        sent = workload.sent_ms.tolist()
        for i in range(n):
            push(sent[i], SEND, new_request(i, sent[i]))
        issued = n

    bar = _Progress(n) if progress else None
    finished = 0
    events = 0
    while heap:
        t, kind, _, obj = heapq.heappop(heap)
        events += 1
        if kind == SEGMENT:
            u, version = obj
            if version != u.version:
                continue
            for r in u.commit():
                u.owner(r).outstanding -= 1
                if u.prefill_only:  # disaggregated: the KV cache moves to a decode worker
                    r.prefill_unit = u.owner(r).index
                    r.handoff = r.finish + transfer_ms(r)
                    r.finish = -1.0
                    push(r.handoff, HANDOFF, r)
                    continue
                rep_streams[r.rep] -= 1
                finished += 1
                if r.client >= 0 and issued < n:
                    c = r.client
                    t_next = r.finish
                    if after_first and client_sent[c] == 1:  # the ramp, after the synchronised first wave
                        t_next += ramp * c / clients
                    client_sent[c] += 1
                    push(t_next, SEND, new_request(issued, t_next, c))
                    issued += 1
            end = u.plan()
            if end is not None:
                u.version += 1
                push(end, SEGMENT, (u, u.version))
            if bar is not None and events % 4096 == 0:
                bar.update(finished)
        elif kind == SEND:
            r = obj
            i = router.route(r.hashes)
            u = units[i]
            rep = r.rep = replica_of[i]
            rep_streams[rep] += 1
            u.outstanding += 1
            delay = front_end(rep_streams[rep], r.isl)
            if spread > 0 and delay > 0:
                delay *= 1.0 + spread * (2.0 * rnd.random() - 1.0)
            r.arrival = t + delay
            if delay > 0:
                push(r.arrival, ARRIVE, (u, r))
            else:
                u.enqueue(r)
                _wake(u.driver, t, push)
        elif kind == ARRIVE:
            u, r = obj
            u.enqueue(r)
            _wake(u.driver, t, push)
        else:  # HANDOFF: the request's KV cache reaches a decode worker
            r = obj
            u = decode_units[decode_router.route(())]
            u.outstanding += 1
            u.enqueue_decode(r)
            _wake(u.driver, t, push)
    if bar is not None:
        bar.close(finished)
    return reqs


def _wake(u, t, push) -> None:
    """A request joined the queue of a scheduler that ``u`` drives (itself, or the
    :class:`.lockstep.Lockstep` of its replica's attention-DP ranks) at ``t``."""
    if u.seg is None:
        # an idle scheduler wakes at ``t``, after every arrival of the same instant (a segment
        # event with nothing to commit), so that requests arriving together start together
        u.now = max(u.now, t)
        u.version += 1
        push(u.now, SEGMENT, (u, u.version))
        return
    end = u.truncate(t)
    if end is not None:
        u.version += 1
        push(end, SEGMENT, (u, u.version))


class _Progress:
    """Completed requests on stderr (rich), refreshed at most a few times a second."""

    def __init__(self, total: int):
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TimeElapsedColumn,
        )

        self.p = Progress("simulating", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=Console(file=sys.stderr), transient=True)
        self.p.start()
        self.task = self.p.add_task("requests", total=total)
        self.last = 0.0

    def update(self, done: int) -> None:
        now = time.perf_counter()
        if now - self.last > 0.2:
            self.last = now
            self.p.update(self.task, completed=done)

    def close(self, done: int) -> None:
        self.p.update(self.task, completed=done)
        self.p.stop()
