"""The attention-DP ranks of one replica stepping together.

With attention data parallelism every rank of a replica runs each forward pass at the same time,
held together by the experts' collectives (all-to-all / all-gather per MoE layer), so a step
lasts as long as the slowest rank's step: the same rule as :func:`infercast.engine.forward_pass`
and :mod:`infercast.serving.agg`. :class:`Lockstep` drives the ranks' schedulers
(:class:`.scheduler.Unit`, each batching its own requests with its own KV cache) as one: at
every step boundary each rank plans its own work, and the group's segment is

* one step if any rank runs a prefill (or mixed) step: it lasts the longest rank's step (a
  decoding rank's first step, a prefill rank's step);
* otherwise a run of ``min k_i`` decode steps (the soonest completion, KV limit or poll over
  the ranks), each as long as the slowest rank's step. A rank's step time is linear in the step
  number over a run (:mod:`.scheduler`); the group's is their maximum, taken exactly at the
  first and last steps of the run and linear between them (exact when one rank is the slowest
  throughout, the usual case; otherwise an upper bound on the steps between).

With a balance hold (TensorRT-LLM's ``attention_dp_config: {enable_balance: true, timeout_iters:
T}``, :attr:`~infercast.serving.backends.SchedulerParams.adp_balance_timeout_steps`), new prompts
are admitted only at a step where every rank has one waiting, or once ``T`` steps have passed since
the hold began, or when some rank has no decode running; until then every rank runs its decodes
(and the chunks of prompts it already started) and the new prompts wait. This is the rule the
analytic model's :func:`infercast.serving.agg.adp_balance_wait_steps` averages; here it is played
out step by step, so the ranks' prefills are gathered into the same steps.

A rank with nothing to run idles through the group's steps (its time does not count; the small
cost of the dummy batch an idle rank runs on real engines is left out); a request reaching an idle
rank, or any rank during a decode run, waits for the end of the group's step in progress (and,
on a scheduler that composes steps one ahead, for the step after it: every rank, idle or not,
composes with the group's steps).
"""

from __future__ import annotations


class Lockstep:
    """Ranks (:class:`.scheduler.Unit`) stepping together; the event loop drives it as it drives
    a single scheduler (``plan``, ``commit``, ``truncate``, ``seg``, ``now``, ``version``)."""

    def __init__(self, ranks, balance_timeout_steps: int = 0):
        self.ranks = list(ranks)
        self.timeout = int(balance_timeout_steps) if len(self.ranks) > 1 else 0
        self.held_steps = 0  # steps the current balance hold has lasted
        self.holding = False  # the segment being run holds new prompts
        self.prefill_only = self.ranks[0].prefill_only
        self.now = 0.0
        self.seg = None  # the group's segment end, or None when every rank is idle
        self.version = 0
        self._by_index = {r.index: r for r in self.ranks}
        for r in self.ranks:
            r.driver = self

    def owner(self, req):
        """The rank that ran ``req``."""
        return self._by_index[req.unit]

    def _hold(self) -> bool:
        """Whether the balance hold keeps new prompts waiting at this step boundary."""
        if self.timeout <= 0 or self.held_steps >= self.timeout:
            return False
        wants = [bool(r.waiting or r.inbox) for r in self.ranks]
        if all(wants) or not any(wants):
            return False
        return all(r.n_dec > 0 for r in self.ranks)  # a rank without decodes releases the hold

    def plan(self) -> float | None:
        now = self.now
        self.holding = hold = self._hold()
        if not hold:
            self.held_steps = 0
        active = []
        for r in self.ranks:
            r.now = now
            r.adp_hold = hold
            if r.plan() is not None:
                active.append(r)
        if not active and any(r.waiting for r in self.ranks):
            # every rank's step composed ahead would be empty: the group idles, and its next pass
            # takes what arrived meanwhile at once
            for r in self.ranks:
                r.cut = now
                if r.plan() is not None:
                    active.append(r)
        if not active:
            self.seg = None
            return None
        if any(r.seg[0] == "p" for r in active):
            # a prefill rank's step: its segment's end - now; a decoding rank's: its run's first step
            step = max(r.seg[3] - now if r.seg[0] == "p" else r.seg[2] for r in active)
            end = now + step
            for r in active:
                r.seg = (*r.seg[:3], end) if r.seg[0] == "p" else ("d", 1, step, 0.0, end)
        else:
            k = min(r.seg[1] for r in active)
            if hold:  # the run ends when the hold times out
                k = max(1, min(k, self.timeout - self.held_steps))
            if any(r.cfg.schedule_ahead and r.waiting and r.waiting[-1].ready > r.cut for r in self.ranks):
                k = 1  # an idle rank's request, not seen when this step was composed, joins the next one
            a = max(r.seg[2] for r in active)
            b = 0.0
            if k > 1:
                last = max(r.seg[2] + r.seg[3] * (k - 1) for r in active)
                b = (last - a) / (k - 1)
            end = now + k * a + b * k * (k - 1) / 2.0
            for r in active:
                r.seg = ("d", k, a, b, end)
        self.seg = end
        return end

    def commit(self):
        """Every rank applies the group's segment; the requests it completed."""
        end = self.seg
        self.seg = None
        out = []
        if end is None:
            for r in self.ranks:
                r.cut = self.now
            return out
        steps = 1
        cut = self.now
        for r in self.ranks:
            if r.seg is not None:
                if r.seg[0] == "d":
                    steps = r.seg[1]
                out.extend(r.commit())
                cut = r.cut
        for r in self.ranks:  # an idle rank's scheduler composes its steps with the group's
            r.cut = cut
        if self.holding:
            self.held_steps += steps
        self.now = end
        for r in self.ranks:
            r.now = end
        return out

    def truncate(self, t: float) -> float | None:
        """A request arrived at ``t`` during the group's segment: a decode run ends with the step
        in progress (the same step on every rank). The new end, or None when unchanged."""
        runs = [r for r in self.ranks if r.seg is not None]
        if self.seg is None or not runs or runs[0].seg[0] != "d":
            return None
        end = runs[0].truncate(t)
        if end is None:
            return None
        m = runs[0].seg[1]
        for r in runs[1:]:
            _, _, a, b, _ = r.seg
            r.seg = ("d", m, a, b, end)
        self.seg = end
        return end
