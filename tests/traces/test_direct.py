"""Policies simulated one capacity at a time: LFU against a scan-everything implementation written here, and
llama.cpp's prompt cache (a slot and whole prompt states in RAM) on hand-made request sequences whose hits
follow from its rules."""

from __future__ import annotations

import numpy as np
import pytest

from kvbench.errors import BadParameter
from kvbench.traces.direct import direct_hits
from kvbench.traces.trace import Trace
from tests.traces.test_simulate import random_trace


def scan_lfu(requests: list[list[int]], capacity: int) -> list[int]:
    """LFU by the definition: on overflow evict the block with the fewest uses since it entered, the least recently
    used of equals, found by scanning every block."""
    uses: dict[int, int] = {}
    last: dict[int, int] = {}
    clock, out = 0, []
    for ids in requests:
        hit = 0
        for b in ids:
            if b not in uses:
                break
            hit += 1
        out.append(hit)
        for b in ids:
            clock += 1
            uses[b] = uses.get(b, 0) + 1
            last[b] = clock
        while len(uses) > capacity:
            victim = min(uses, key=lambda b: (uses[b], last[b]))
            del uses[victim], last[victim]
    return out


def trace_of(prompts: list[list[int]], block: int = 1) -> Trace:
    counts = np.array([len(p) for p in prompts])
    return Trace("t", "mooncake", block, np.arange(len(prompts), dtype=np.float64), counts * block,
                 np.ones(len(prompts), dtype=np.int64), np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
                 np.array([b for p in prompts for b in p], dtype=np.int64), np.arange(len(prompts)))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("capacity", [1, 3, 8, 20, 60])
def test_lfu_matches_the_definition(seed, capacity):
    t = random_trace(seed, n=150)
    expected = scan_lfu([t.blocks(i).tolist() for i in range(t.n_requests)], capacity)
    assert direct_hits(t, "lfu", capacity).tolist() == expected


def test_lfu_keeps_a_popular_prefix_through_one_off_prompts():
    # capacity 3: [0, 1] twice makes 0 and 1 used twice; one-off blocks then evict each other, not the prefix
    prompts = [[0, 1], [0, 1], [7], [8], [9], [0, 1, 5]]
    assert direct_hits(trace_of(prompts), "lfu", 3).tolist() == [0, 2, 0, 0, 0, 2]
    assert direct_hits(trace_of(prompts), "lfu", 0).tolist() == [0] * 6


def test_prompt_cache_slot_only_hits_the_previous_prompt():
    prompts = [[0, 1, 2], [0, 1, 3], [5, 6], [0, 1, 3, 4]]
    # no RAM cache: each request shares only what the slot held (the previous prompt)
    assert direct_hits(trace_of(prompts), "prompt-lru", 0).tolist() == [0, 2, 0, 0]


def test_prompt_cache_restores_a_saved_prompt_from_ram():
    prompts = [[0, 1, 2, 3], [5, 6], [0, 1, 2, 3, 4]]
    # [5, 6] shares nothing with the slot: [0..3] is saved to RAM; the third finds it there (keeps all of it)
    assert direct_hits(trace_of(prompts), "prompt-lru", 100).tolist() == [0, 0, 4]


def test_prompt_cache_makes_room_by_evicting_the_oldest_before_it_saves():
    prompts = [[0, 1, 2, 3], [10, 11, 12, 13], [20, 21, 22, 23], [0, 1, 2, 3, 4], [10, 11, 12, 13, 14]]
    # RAM of 12 blocks: the fourth request saves the third prompt (12 blocks in all), then restores the first; the
    # fifth saves the fourth (5 blocks): the second prompt, the oldest, goes to make room, so nothing is found
    assert direct_hits(trace_of(prompts), "prompt-lru", 12).tolist() == [0, 0, 0, 4, 0]
    # RAM of 8: saving the third prompt evicts the first before the fourth request looks
    assert direct_hits(trace_of(prompts), "prompt-lru", 8).tolist() == [0, 0, 0, 0, 0]
    assert direct_hits(trace_of(prompts), "prompt-lru", 100).tolist() == [0, 0, 0, 4, 4]


def test_prompt_cache_skips_an_entry_it_would_keep_under_a_quarter_of():
    prompts = [[0, 1, 2, 3, 4, 5, 6, 7, 8], [30, 31], [0, 9]]
    # [0, 9] shares 1 of the saved prompt's 9 blocks (under 25%): not restored
    assert direct_hits(trace_of(prompts), "prompt-lru", 100).tolist() == [0, 0, 0]


def test_unknown_policy_and_negative_capacity_are_refused():
    t = trace_of([[0]])
    with pytest.raises(BadParameter, match="policy 'lru' is not one of: lfu, prompt-lru"):
        direct_hits(t, "lru", 1)
    with pytest.raises(BadParameter, match="capacity_blocks -1 must be 0 or more"):
        direct_hits(t, "lfu", -1)
