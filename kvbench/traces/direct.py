"""Policies the one-pass stack algorithm cannot give, simulated directly at one capacity at a time: per request,
its hit blocks under prefix matching (a request's blocks looked up before it touches any, the first miss ends its
hit), as kvbench.traces.simulate defines them.

- ``lfu``: a cache of ``capacity`` blocks that evicts the block used least often since it entered the cache
  (the least recently used of equals first): a popular prefix outlives a burst of one-off prompts, and a new
  block is the first to go.
- ``prompt-lru``: llama.cpp's ``llama-server`` with one slot and ``--cache-ram`` (``tools/server``'s
  ``server_prompt_cache``): the slot holds the last prompt; a RAM cache of ``capacity`` blocks holds whole prompt
  states, each stored in full (prefixes they share are stored again), the oldest saved evicted first. A request
  that shares less than half the slot's prompt, or under 10% of its own (``--slot-prompt-similarity``), saves the
  slot's prompt to the cache (unless an entry already starts with it; entries that are its prefixes go, then the
  oldest until it fits) and takes
  the entry with the longest common prefix that keeps at least a quarter of the entry and improves on the slot
  in both shares; an entry taken leaves the cache for the slot. The hit is the common prefix with the slot.
"""

from __future__ import annotations

import heapq

import numpy as np

from kvbench.errors import BadParameter
from kvbench.traces.trace import Trace

#: The policies simulated one capacity at a time.
DIRECT_POLICIES = ("lfu", "prompt-lru")
#: llama.cpp's ``--slot-prompt-similarity`` default, the share of its slot's prompt a request must keep not to
#: save and reload, and the least share of a cached prompt a restore keeps (tools/server: 0.1, 0.5, 0.25).
SIMILARITY, KEEP_SLOT, KEEP_ENTRY = 0.1, 0.5, 0.25


def _lcp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _lfu(trace: Trace, capacity: int) -> np.ndarray:
    hits = np.zeros(trace.n_requests, dtype=np.int64)
    freq: dict[int, int] = {}
    stamp: dict[int, int] = {}
    heap: list[tuple[int, int, int]] = []
    clock = 0
    for i in range(trace.n_requests):
        ids = trace.blocks(i).tolist()
        n = 0
        for b in ids:
            if b not in freq:
                break
            n += 1
        hits[i] = n
        for b in ids:
            clock += 1
            freq[b] = freq.get(b, 0) + 1
            stamp[b] = clock
            heapq.heappush(heap, (freq[b], clock, b))
        while len(freq) > capacity:
            f, t, b = heapq.heappop(heap)
            if freq.get(b) == f and stamp.get(b) == t:  # the entry is current, not a stale one
                del freq[b], stamp[b]
    return hits


def _prompt_lru(trace: Trace, capacity: int) -> np.ndarray:
    hits = np.zeros(trace.n_requests, dtype=np.int64)
    slot: tuple[int, ...] = ()
    cache: list[tuple[int, ...]] = []  # oldest saved first
    for i in range(trace.n_requests):
        prompt = tuple(trace.blocks(i).tolist())
        lcp = _lcp(prompt, slot)
        keep, sim = (lcp / len(slot) if slot else 0.0), lcp / len(prompt)
        if slot and (sim <= SIMILARITY or keep < KEEP_SLOT) and capacity > 0:
            if not any(e[:len(slot)] == slot for e in cache):
                cache = [e for e in cache if not (len(e) < len(slot) and slot[:len(e)] == e)]
                while cache and sum(map(len, cache)) + len(slot) > capacity:  # room made before it is saved
                    cache.pop(0)
                cache.append(slot)
            best = None
            for j, e in enumerate(cache):
                n = _lcp(prompt, e)
                if n / len(e) >= KEEP_ENTRY and n / len(e) > keep and n / len(prompt) > sim:
                    best, keep, sim = j, n / len(e), n / len(prompt)
            if best is not None:
                slot = cache.pop(best)
            while len(cache) > 1 and sum(map(len, cache)) > capacity:
                cache.pop(0)
        hits[i] = _lcp(prompt, slot)
        slot = prompt
    return hits


def direct_hits(trace: Trace, policy: str, capacity_blocks: int) -> np.ndarray:
    """Per request of ``trace``, its hit blocks under ``policy`` at ``capacity_blocks`` (``prompt-lru``: the RAM
    cache's blocks, beside the slot): int64 ``(n_requests,)``.

    Raises:
        kvbench.errors.BadParameter: ``policy`` is not one of :data:`DIRECT_POLICIES`, or a capacity below 0.
    """
    if policy not in DIRECT_POLICIES:
        raise BadParameter(f"{{policy}} {policy!r} is not one of: {', '.join(DIRECT_POLICIES)}", "policy")
    if capacity_blocks < 0:
        raise BadParameter(f"{{capacity_blocks}} {capacity_blocks} must be 0 or more", "capacity_blocks")
    return _lfu(trace, capacity_blocks) if policy == "lfu" else _prompt_lru(trace, capacity_blocks)
