"""One scheduler's continuous batching (one replica, or one attention-DP rank of one), played
iteration by iteration.

A step carries every running decode (``tokens_per_step`` tokens each) and, within the token
budget (``max_num_tokens``, less the decodes' ``decode_width`` each on an engine that mixes),
prefill work first come first served: the chunks of prompts already started, then new requests
from the queue. A prompt longer than the room left is chunked (at least ``min_prefill_chunk``
tokens when decodes fill the budget) or, without chunked prefill, waits for a step with room for
all of it. An engine that does not mix (``mixed`` off: SGLang's default) runs prefill steps that
pause the decodes whenever a prompt can be admitted. A request completes when it has its output;
its first token comes with the step that ends its prompt.

Admission (a new request starts prefilling) needs a free slot (``max_batch_size`` running
requests at most) and KV room: its prompt's blocks that the prefix cache (:mod:`.prefix_cache`)
does not hold, plus, when ``kv_reserve_full`` (TensorRT-LLM's guaranteed-no-evict policy), its
whole output; otherwise (vLLM, SGLang) KV grows as tokens are generated, and when a decode step
would overflow the cache the most recently admitted decoding request is preempted: its KV is
freed and it goes back to the head of the queue to recompute its prompt and the tokens it has
generated (vLLM's recompute preemption). Cached blocks that no running request holds fill the
rest of the capacity and are evicted least recently used first.

Between events the scheduler jumps: a run of decode-only steps up to the next completion (or the
KV limit) is one *segment*; the step timer times its first and last steps and the steps between
are taken as linear in the KV length (each step adds the same tokens; attention is linear in the
KV read, to well under 0.1% over a run), so a run of any length costs two timer calls and
closed-form sums. An arrival cuts the run at the end of the step in progress. Decoding requests share one counter of generated tokens (``done``),
so a step costs the same however many requests decode.

Disaggregated serving: a prefill worker's scheduler (``prefill_only``) lets a request go when its
prompt is done (its first token); the request then arrives at a decode worker's scheduler with its
KV cache (:meth:`Unit.enqueue_decode`), is admitted when KV room and a slot allow, and decodes.

A scheduler that polls its queue only every ``recv_interval`` decode steps (SGLang's
``--scheduler-recv-interval``) keeps new arrivals in an inbox until the next poll (or the step after
a prefill step, or at once when it is idle).

A context batching delay (TensorRT-LLM's ``batch_wait_timeout_iters`` and
``batch_wait_max_tokens_ratio``) holds new prompts while decodes run, until the step's tokens (the
decodes' plus the waiting prompts') would reach the ratio of the budget or the delay has lasted
``batch_wait_iters`` steps; an idle engine takes them at once.

A scheduler that composes each step while the one before it runs (``schedule_ahead``: the
engines' overlap / async schedulers, :func:`schedule_ahead`) admits at a step boundary only the
requests it had seen when the step before began (``cut``): a request arriving during step ``n``
joins step ``n + 2`` at the earliest (a decode run is cut one step after the step in progress),
or, polled from the inbox, the step after the one composed at its poll; when the step composed
ahead would be empty (nothing running), the idle engine takes the request at once.

The attention-DP balance hold (``adp_balance_timeout_steps``) is the replica's rule, played by
:class:`.lockstep.Lockstep`, which sets ``adp_hold`` on its ranks: a held rank admits no new
prompt (it runs its decodes and the chunks of prompts it already started).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

from ...errors import InvalidConfigError
from .prefix_cache import PrefixCache


@dataclass(frozen=True)
class UnitConfig:
    max_num_tokens: int
    max_batch_size: int
    chunked: bool
    mixed: bool
    kv_capacity_tokens: float
    kv_reserve_full: bool
    min_prefill_chunk: int = 256
    recv_interval: int = 1  # the queue is polled every this many decode steps, and after a prefill step
    batch_wait_iters: int = 0  # context batching delay: new prompts held up to this many steps ...
    batch_wait_ratio: float = 0.0  # ... or until the step's tokens would reach this share of the budget
    schedule_ahead: bool = False  # step n+1 is composed while step n runs: arrivals during n join n+2 at the earliest

    @classmethod
    def from_params(cls, params, kv_capacity_tokens: float, ahead: bool | None = None) -> UnitConfig:
        """The scheduler settings of a :class:`~infercast.serving.backends.SchedulerParams`;
        ``ahead``: ``schedule_ahead`` as stated (None: :func:`schedule_ahead` of ``params``)."""
        return cls(int(params.max_num_tokens), int(params.max_batch_size), bool(params.chunked), bool(params.mixed),
                   float(kv_capacity_tokens), bool(params.kv_reserve_full), int(params.min_prefill_chunk),
                   max(1, int(getattr(params, "recv_interval", 1))), int(getattr(params, "batch_wait_iters", 0)),
                   float(getattr(params, "batch_wait_max_tokens_ratio", 0.0)),
                   schedule_ahead(params) if ahead is None else bool(ahead))



def schedule_ahead(params) -> bool:
    """Whether a backend's scheduler composes the next step while the current one runs, so that a
    request arriving during step ``n`` is first scheduled into step ``n + 2``:
    :attr:`~infercast.serving.backends.SchedulerParams.schedule_ahead` (TensorRT-LLM's overlap
    scheduler, vLLM's async scheduling), or ``overlap`` (SGLang's overlap scheduler)."""
    return bool(getattr(params, "schedule_ahead", False) or getattr(params, "overlap", False))


class Request:
    """One request and its progress. ``prompt`` / ``target``: the prefill tokens and output
    tokens of its current incarnation (a preempted request recomputes its prompt plus the tokens
    it had, then generates the rest)."""

    __slots__ = (
        "arrival",
        "cached",
        "client",
        "done_prefill",
        "entry",
        "finish",
        "first",
        "handoff",
        "hashes",
        "idx",
        "inc",
        "isl",
        "nblocks",
        "osl",
        "preemptions",
        "prefill_unit",
        "priv",
        "prompt",
        "ready",
        "remote",
        "rep",
        "sent",
        "start",
        "target",
        "unit",
    )

    def __init__(self, idx: int, sent: float, isl: int, osl: int, hashes=(), client: int = -1):
        self.idx = idx
        self.sent = sent
        self.arrival = sent
        self.ready = sent  # when the scheduler saw it: its arrival, the poll that took it in, or its KV hand-off
        self.isl = isl
        self.osl = osl
        self.hashes = hashes
        self.prompt = isl
        self.target = osl
        self.done_prefill = 0.0
        self.cached = 0  # prompt tokens found in the prefix cache at first admission
        self.start = -1.0  # when its first prefill chunk's step began
        self.first = -1.0
        self.finish = -1.0
        self.entry = 0.0
        self.priv = 0.0
        self.unit = -1
        self.preemptions = 0
        self.inc = 0
        self.nblocks = 0
        self.client = client
        self.remote = False  # its prompt was prefilled elsewhere (disaggregated): it arrives to decode
        self.prefill_unit = -1
        self.handoff = -1.0  # when its KV reached the decode worker
        self.rep = -1  # the replica whose front end it went through


class Unit:
    """One scheduler. ``now``: the next step boundary (the end of the last committed step)."""

    def __init__(self, index: int, cfg: UnitConfig, timer, block_tokens: int, prefix_cache: bool = True,
                 prefill_only: bool = False):
        self.index = index
        self.prefill_only = prefill_only  # a disaggregated prefill worker: requests leave at their first token
        self.cfg = cfg
        self.timer = timer
        self.tau = float(timer.tokens_per_step)
        self.width = float(timer.decode_width)
        self.cache = PrefixCache(block_tokens, prefix_cache)
        self.bt = int(block_tokens)
        self.now = 0.0
        self.waiting: deque[Request] = deque()
        self.inbox: list[Request] = []  # arrived, not yet polled (recv_interval > 1)
        self.since_poll = 0  # decode steps since the queue was last polled
        self.poll_now = True  # the next step boundary polls (after a prefill step, or idle)
        self.held = 0  # steps the waiting prompts have been held by the context batching delay
        self.hold_active = False  # the segment being run holds them
        self.adp_hold = False  # the attention-DP balance hold keeps new prompts waiting (set by Lockstep)
        self.cut = 0.0  # schedule_ahead: the step planned at ``now`` sees the requests queued by this time
        self.prefilling: list[Request] = []
        self.decoding: dict[Request, None] = {}  # in admission order (preemption takes the last)
        self.heap: list = []  # (finish key, seq, request, incarnation)
        self._seq = 0
        self.done = 0.0
        self.n_dec = 0
        self.kv_a = 0.0  # sum over decodes of (prompt + 1 - entry): their KV = kv_a + n_dec x done
        self.entry_sum = 0.0
        self.priv = 0.0  # running requests' own KV tokens, fixed parts
        self.outstanding = 0  # routed here and not finished (set by the loop)
        self.driver = self  # what the event loop steps: this scheduler, or its replica's Lockstep
        self.seg = None  # ("p", groups, with decodes, end) or ("d", steps, first step, increment, end)
        self.version = 0
        self.steps = 0
        self.preemptions = 0
        self.busy_ms = 0.0
        self.series: list[tuple[float, float, int, int]] = []  # (t, KV used, waiting, running)

    def owner(self, r: Request) -> Unit:
        """The scheduler that ran ``r`` (this one: a scheduler drives only itself)."""
        return self

    # ---- KV accounting ----------------------------------------------------------------------
    def kv_used(self) -> float:
        used = self.cache.pinned_tokens + self.priv
        if not self.cfg.kv_reserve_full:
            used += self.n_dec * (1.0 + self.done) - self.entry_sum
        return used

    def running(self) -> int:
        return len(self.prefilling) + self.n_dec

    def _decode_kv(self) -> float:
        return self.kv_a + self.n_dec * self.done

    # ---- planning ---------------------------------------------------------------------------
    def plan(self) -> float | None:
        """Choose the next segment at ``now``; its end time, or None when idle."""
        cfg = self.cfg
        cap = cfg.kv_capacity_tokens
        interval = cfg.recv_interval
        if self.poll_now or not self.running() or (self.since_poll > 0 and self.since_poll % interval == 0):
            # a poll (every ``interval`` decode steps, after a prefill step, or when idle)
            for r in self.inbox:
                r.ready = self.now
            self.waiting.extend(self.inbox)
            self.inbox.clear()
            self.since_poll = 0
        else:  # polls passed during the last run found the inbox empty
            self.since_poll %= interval
        self.poll_now = False
        if self.n_dec and not cfg.kv_reserve_full:
            self._preempt_for(self.n_dec * self.tau)
        ahead = cfg.schedule_ahead
        groups = self._compose(cap, self.cut if ahead else math.inf)
        if ahead and not groups and not self.n_dec and self.waiting and self.driver is self:
            # the step composed ahead would be empty: the engine idles, and its next pass takes
            # what arrived meanwhile at once (attention-DP ranks: the group decides, Lockstep.plan)
            groups = self._compose(cap, math.inf)
        if groups:
            with_dec = cfg.mixed and self.n_dec > 0
            chunks = [(c, r.done_prefill) for r, c in groups]
            dt = self.timer.step_ms(chunks, self.n_dec if with_dec else 0, self._decode_kv() if with_dec else 0.0)
            end = self.now + dt
            self.seg = ("p", groups, with_dec, end)
            return end
        if self.n_dec:
            key = self._next_finish_key()
            k = max(1, math.ceil((key - self.done) / self.tau - 1e-9))
            if not cfg.kv_reserve_full:
                room = cap - self.kv_used()
                k = max(1, min(k, int(room // (self.n_dec * self.tau))))
            if self.inbox:  # stop at the next poll
                k = max(1, min(k, cfg.recv_interval - self.since_poll))
            if self.hold_active:  # stop when the batching delay ends
                k = max(1, min(k, cfg.batch_wait_iters - self.held))
            if ahead and self.waiting and self.waiting[-1].ready > self.cut:
                k = 1  # a request the step composed ahead did not see joins the step after it
            kv0 = self._decode_kv()
            a = self.timer.step_ms((), self.n_dec, kv0)
            b = 0.0
            if k > 1:
                b = (self.timer.step_ms((), self.n_dec, kv0 + (k - 1) * self.n_dec * self.tau) - a) / (k - 1)
            end = self.now + k * a + b * k * (k - 1) / 2.0
            self.seg = ("d", k, a, b, end)
            return end
        self.seg = None
        return None

    def _next_finish_key(self) -> float:
        h = self.heap
        while h:
            key, _, r, inc = h[0]
            if r.inc == inc and r in self.decoding:
                return key
            heapq.heappop(h)
        raise AssertionError("decoding requests without finish keys")

    def _compose(self, cap: float, cut: float = math.inf):
        """The step's prefill groups: started prompts' chunks, then new requests from the queue
        (those queued by ``cut``, first come first served) as slots, KV and budget allow."""
        cfg = self.cfg
        room = cfg.max_num_tokens - (self.n_dec * self.width if cfg.mixed else 0.0)
        if cfg.chunked:
            room = max(room, float(cfg.min_prefill_chunk))
        groups = []
        for r in self.prefilling:
            if room <= 0:
                break
            rem = r.prompt - r.done_prefill
            chunk = rem if rem <= room else (room if cfg.chunked else 0.0)
            if chunk <= 0:
                break
            groups.append((r, chunk))
            room -= chunk
        self.hold_active = False
        if not self.waiting or self.adp_hold:
            return groups
        growth = self.n_dec * self.tau if (cfg.mixed and not cfg.kv_reserve_full) else 0.0
        self.hold_active = self._holding()
        if self.hold_active:
            return groups
        self.held = 0
        waiting = self.waiting
        cache = self.cache
        bt = self.bt
        while waiting and self.running() < cfg.max_batch_size:
            r = waiting[0]
            if r.ready > cut:
                break
            if r.remote:  # prefilled elsewhere: joins the decodes with its KV, no prefill work here
                need = r.prompt + (r.target if cfg.kv_reserve_full else 1)
                if need > cap - self.kv_used() - growth:
                    break
                waiting.popleft()
                self.cache.evict_to(cap - self.kv_used() - need)
                r.priv = need if cfg.kv_reserve_full else r.prompt
                self.priv += r.priv
                r.start = self.now
                self._start_decode(r)
                continue
            if room <= 0:
                break
            rem_full = r.prompt
            if not cfg.chunked and rem_full > room:
                break
            hashes = r.hashes
            if cache.enabled and hashes:
                hashes = hashes[:min(len(hashes), r.prompt // bt)]
                hit = cache.match(hashes)
                new = cache.unpinned_blocks(hashes)
            else:
                hashes, hit, new = (), 0, 0
            priv = r.prompt - len(hashes) * bt + (r.target if cfg.kv_reserve_full else 0)
            need = new * bt + priv
            if need > cap - self.kv_used() - growth:
                break
            cache.acquire(hashes, hit)
            cache.evict_to(cap - self.kv_used() - need)
            waiting.popleft()
            r.nblocks = len(hashes)
            r.priv = priv
            self.priv += priv
            hit_tokens = min(hit * bt, r.prompt - 1)
            if r.inc == 0:
                r.cached = hit_tokens
                r.start = self.now
            r.done_prefill = float(hit_tokens)
            self.prefilling.append(r)
            rem = r.prompt - r.done_prefill
            chunk = min(rem, room)
            groups.append((r, chunk))
            room -= chunk
        return groups

    def _holding(self) -> bool:
        """Whether the context batching delay holds the waiting prompts this step."""
        cfg = self.cfg
        if cfg.batch_wait_iters <= 0 or self.n_dec == 0 or self.held >= cfg.batch_wait_iters:
            return False
        tokens = self.n_dec * self.width + sum(r.prompt - r.done_prefill for r in self.waiting if not r.remote)
        return tokens < cfg.batch_wait_ratio * cfg.max_num_tokens

    def _preempt_for(self, growth: float) -> None:
        """Preempt the latest admitted decodes until the next step's KV growth fits."""
        cap = self.cfg.kv_capacity_tokens
        while self.n_dec > 1 and self.kv_used() + growth > cap:
            r = next(reversed(self.decoding))
            self._drop_decode(r)
            self._free(r)
            gen = 1.0 + self.done - r.entry
            r.prompt = int(r.prompt + gen)
            r.target = int(max(1, round(r.target - gen)))
            r.inc += 1
            r.preemptions += 1
            self.preemptions += 1
            self.waiting.appendleft(r)
            growth = self.n_dec * self.tau

    def _drop_decode(self, r: Request) -> None:
        del self.decoding[r]
        self.n_dec -= 1
        self.kv_a -= r.prompt + 1.0 - r.entry
        self.entry_sum -= r.entry

    def _free(self, r: Request) -> None:
        self.priv -= r.priv
        r.priv = 0.0
        if r.nblocks:
            self.cache.release(r.hashes[:r.nblocks])
            r.nblocks = 0

    # ---- arrivals and commits -----------------------------------------------------------------
    def truncate(self, t: float) -> float | None:
        """An arrival at ``t`` during a decode run: end the run with the step in progress (the
        first whose end is at or after ``t``). The new end, or None when the segment is unchanged."""
        seg = self.seg
        if seg is None or seg[0] != "d":
            return None
        _, k, a, b, _ = seg
        el = t - self.now

        def span(m):
            return m * a + b * m * (m - 1) / 2.0

        if abs(b) < 1e-12 * max(a, 1e-12):
            m = math.ceil(el / a - 1e-12)
        else:  # smallest m with span(m) >= el: the root of b/2 m^2 + (a - b/2) m - el
            c1 = a - b / 2.0
            disc = c1 * c1 + 2.0 * b * el
            m = math.ceil((-c1 + math.sqrt(max(disc, 0.0))) / b) if disc >= 0 else k
        m = max(1, min(m, k))
        while m < k and span(m) < el:
            m += 1
        while m > 1 and span(m - 1) >= el:
            m -= 1
        interval = self.cfg.recv_interval
        if interval > 1:  # the arrival is seen at the first poll after the step in progress
            m += (-(self.since_poll + m)) % interval
        if m >= k:
            return None
        end = self.now + span(m)
        self.seg = ("d", m, a, b, end)
        return end

    def commit(self) -> list[Request]:
        """Apply the segment that just ended; the requests it completed."""
        seg = self.seg
        self.seg = None
        out: list[Request] = []
        if seg is None:  # woken from idle: no step was running, the next one sees every request
            self.cut = self.now
            return out
        if seg[0] == "d":
            k, end = seg[1], seg[4]
            a, b = seg[2], seg[3]
            self.cut = self.now + (k - 1) * a + b * (k - 1) * (k - 2) / 2.0  # the last step's start
            self.busy_ms += end - self.now
            self.now = end
            self.steps += k
            self.since_poll += k
            self.held = self.held + k if self.hold_active else 0
            self.done += k * self.tau
            self._finish_decodes(end, out)
        else:
            _, groups, with_dec, end = seg
            self.cut = self.now
            self.busy_ms += end - self.now
            self.now = end
            self.steps += 1
            self.poll_now = True
            self.held = self.held + 1 if self.hold_active else 0
            if with_dec:
                self.done += self.tau
                self._finish_decodes(end, out)
            for r, chunk in groups:
                r.done_prefill += chunk
                if r.done_prefill >= r.prompt - 1e-9:
                    self.prefilling.remove(r)
                    if r.first < 0:
                        r.first = end
                    if r.target <= 1 or self.prefill_only:
                        self._complete(r, end, out)
                    else:
                        self._start_decode(r)
        self.series.append((self.now, self.kv_used(), len(self.waiting), self.running()))
        return out

    def _start_decode(self, r: Request) -> None:
        """``r`` has its first token: it decodes from the next step (``entry``: the shared token
        count now, so it has generated ``1 + done - entry`` tokens)."""
        r.entry = self.done
        self.decoding[r] = None
        self.n_dec += 1
        self.kv_a += r.prompt + 1.0 - r.entry
        self.entry_sum += r.entry
        self._seq += 1
        heapq.heappush(self.heap, (r.entry + r.target - 1.0, self._seq, r, r.inc))

    def _finish_decodes(self, t: float, out: list) -> None:
        h = self.heap
        done = self.done + 1e-9
        while h and h[0][0] <= done:
            _, _, r, inc = heapq.heappop(h)
            if r.inc != inc or r not in self.decoding:
                continue
            self._drop_decode(r)
            self._complete(r, t, out)

    def _complete(self, r: Request, t: float, out: list) -> None:
        r.finish = t
        self._free(r)
        cap = self.cfg.kv_capacity_tokens
        self.cache.evict_to(cap - self.kv_used())
        out.append(r)

    def enqueue(self, r: Request) -> None:
        """``r`` reaches this scheduler's queue (at ``r.arrival``)."""
        if not self.cfg.chunked and r.isl > self.cfg.max_num_tokens:
            raise InvalidConfigError(
                f"a prompt of {r.isl} tokens does not fit the step budget of {self.cfg.max_num_tokens} tokens, and the "
                "scheduler runs without chunked prefill", "raise --max-num-tokens or use a backend with chunked prefill")
        if self.prefill_only:
            r.target = 1  # leaves with its first token; the decode worker holds the output's KV
        need = r.isl + r.target if self.cfg.kv_reserve_full else r.isl + 1
        if need > self.cfg.kv_capacity_tokens:
            raise InvalidConfigError(
                f"request {r.idx} needs {need} KV tokens, more than a replica's cache holds "
                f"({int(self.cfg.kv_capacity_tokens)})", "use more GPUs per replica, or shorter requests")
        r.unit = self.index
        r.ready = r.arrival
        if self.cfg.recv_interval > 1:
            self.inbox.append(r)
        else:
            self.waiting.append(r)

    def enqueue_decode(self, r: Request) -> None:
        """A request prefilled by another worker arrives with its KV cache to decode here."""
        need = r.isl + r.osl if self.cfg.kv_reserve_full else r.isl + 1
        if need > self.cfg.kv_capacity_tokens:
            raise InvalidConfigError(
                f"request {r.idx} needs {need} KV tokens, more than a decode worker's cache holds "
                f"({int(self.cfg.kv_capacity_tokens)})", "use more GPUs per decode worker, or shorter requests")
        r.remote = True
        r.prompt, r.target = r.isl, r.osl
        r.unit = self.index
        r.ready = r.handoff
        self.waiting.append(r)
