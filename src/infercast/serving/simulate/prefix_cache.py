"""A block-level prefix cache of one replica (one scheduler's KV cache).

A prompt is a sequence of blocks, each named by a hash that stands for the block *and everything
before it* (as in Mooncake's traces and in vLLM's / SGLang's prefix caches), so a new request
reuses the longest run of its leading blocks that the cache holds. Blocks belong to one of two
sets:

* *pinned*: held by running requests (reference-counted; a block shared by several running
  requests is stored once);
* *cached*: held by no running request, kept in least-recently-used order in whatever KV capacity
  the running requests leave, and evicted oldest first when a request needs the room.

The cache counts blocks; the scheduler (:mod:`.scheduler`) counts tokens, with ``block_tokens``
tokens per block. Only a prompt's whole blocks are shared; its last partial block and its output
tokens are the request's own.
"""

from __future__ import annotations

from collections import OrderedDict


class PrefixCache:
    def __init__(self, block_tokens: int, enabled: bool = True):
        self.block_tokens = int(block_tokens)
        self.enabled = bool(enabled)
        self.pinned: dict = {}  # hash -> running requests holding it
        self.lru: OrderedDict = OrderedDict()  # hash -> None, least recently used first
        self.lookups = 0  # prompt tokens looked up (whole blocks)
        self.hit_tokens = 0  # of which found in the cache

    @property
    def pinned_tokens(self) -> int:
        return len(self.pinned) * self.block_tokens

    @property
    def cached_tokens(self) -> int:
        return len(self.lru) * self.block_tokens

    def match(self, hashes) -> int:
        """Leading blocks of ``hashes`` the cache holds (pinned or cached)."""
        if not self.enabled:
            return 0
        n = 0
        for h in hashes:
            if h in self.pinned or h in self.lru:
                n += 1
            else:
                break
        return n

    def unpinned_blocks(self, hashes) -> int:
        """Blocks of ``hashes`` that no running request holds: admitting it pins them, and each
        adds a block to the running requests' KV (a cached one moves out of the evictable set, a
        missing one is allocated)."""
        pinned = self.pinned
        return sum(1 for h in set(hashes) if h not in pinned)

    def acquire(self, hashes, hit: int) -> None:
        """Pin ``hashes`` for a request admitted with ``hit`` leading blocks found."""
        if not self.enabled:
            return
        self.lookups += len(hashes) * self.block_tokens
        self.hit_tokens += hit * self.block_tokens
        pinned, lru = self.pinned, self.lru
        for h in hashes:
            c = pinned.get(h)
            if c is None:
                lru.pop(h, None)
                pinned[h] = 1
            else:
                pinned[h] = c + 1

    def release(self, hashes) -> None:
        """Unpin a finished (or preempted) request's blocks; blocks no request holds become cached
        (most recently used, the prompt's last block the most recent)."""
        if not self.enabled:
            return
        pinned, lru = self.pinned, self.lru
        for h in hashes:
            c = pinned.get(h)
            if c is None:
                continue
            if c <= 1:
                del pinned[h]
                lru[h] = None
            else:
                pinned[h] = c - 1

    def evict_to(self, tokens: float) -> int:
        """Evict least recently used cached blocks until the cached ones take at most ``tokens``
        tokens; the blocks evicted."""
        keep = max(0, int(tokens // self.block_tokens))
        n = len(self.lru) - keep
        for _ in range(max(0, n)):
            self.lru.popitem(last=False)
        return max(0, n)
