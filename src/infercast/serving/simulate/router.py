"""Routing requests across schedulers (replicas, or the attention-DP ranks of replicas).

* ``round-robin``: in turn, whatever their load;
* ``least-outstanding``: the one with the fewest requests routed to it and not finished (ties:
  the lowest index) -- a closed-loop client's next request goes where its last one finished;
* ``prefix-aware``: among those within ``slack`` outstanding requests of the least loaded, the
  one whose prefix cache holds the longest run of the request's leading blocks (ties: the least
  loaded), so shared prefixes land where they are cached without piling requests on one replica.
"""

from __future__ import annotations

from ...errors import InvalidInputError

ROUTERS = ("round-robin", "least-outstanding", "prefix-aware")


class Router:
    def __init__(self, policy: str, units, slack: int = 4):
        if policy not in ROUTERS:
            raise InvalidInputError(f"unknown router {policy!r}", "routers route requests across replicas", ROUTERS)
        self.policy = policy
        self.units = units
        self.slack = int(slack)
        self._next = 0

    def route(self, hashes) -> int:
        units = self.units
        n = len(units)
        if n == 1:
            return 0
        if self.policy == "round-robin":
            i = self._next
            self._next = (i + 1) % n
            return i
        loads = [u.outstanding for u in units]
        low = min(loads)
        if self.policy == "least-outstanding" or not hashes:
            return loads.index(low)
        best, best_key = 0, None
        for i, u in enumerate(units):
            if loads[i] > low + self.slack:
                continue
            key = (u.cache.match(hashes), -loads[i])
            if best_key is None or key > best_key:
                best, best_key = i, key
        return best
