"""The one-pass simulator against the definition itself (an ordered-dict LRU per capacity, written here apart from
kvbench), on the Mooncake conversation trace's published figures and on random prefix-tree traces, for both
policies; the tier cascade and the per-request hits."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from kvbench.errors import BadValue
from kvbench.traces.read import read_trace
from kvbench.traces.simulate import capacity_grid, simulate, tier_hits
from kvbench.traces.trace import Trace, window

ROOT = Path(__file__).resolve().parents[2]
MOONCAKE = ROOT / "traces" / "mooncake" / "conversation_trace.jsonl"


def direct_lru(requests: list[list[int]], inputs: list[int], block: int, capacity: int,
               tail_first: bool = False) -> tuple[int, int, list[int]]:
    """Hit blocks, hit tokens and per-request hit blocks of an LRU of ``capacity`` blocks, simulated directly."""
    lru: OrderedDict[int, None] = OrderedDict()
    blocks = tokens = 0
    per = []
    for ids, n in zip(requests, inputs):
        hit = 0
        for b in ids:
            if b not in lru:
                break
            hit += 1
        per.append(hit)
        blocks += hit
        tokens += min(hit * block, n)
        for b in (reversed(ids) if tail_first else ids):
            lru[b] = None
            lru.move_to_end(b)
        while len(lru) > capacity:
            lru.popitem(last=False)
    return blocks, tokens, per


def random_trace(seed: int, n: int = 300, block: int = 4) -> Trace:
    """Requests walking a random prefix tree: each extends a random earlier prompt's prefix (or starts afresh) with
    fresh blocks, so prefixes are shared as in a real trace; a partial last block now and then."""
    rng = np.random.default_rng(seed)
    prompts: list[list[int]] = []
    next_id = 0
    for _ in range(n):
        if prompts and rng.random() < 0.7:
            base = prompts[rng.integers(len(prompts))]
            ids = base[:rng.integers(1, len(base) + 1)]
        else:
            ids = []
        fresh = int(rng.integers(0 if ids else 1, 6))
        ids = ids + list(range(next_id, next_id + fresh))
        next_id += fresh
        prompts.append(ids)
    counts = np.array([len(p) for p in prompts])
    inputs = counts * block - rng.integers(0, block, size=n)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return Trace("random", "mooncake", block, np.arange(n, dtype=np.float64), inputs.astype(np.int64),
                 np.full(n, 8, dtype=np.int64), offsets, np.concatenate(prompts).astype(np.int64),
                 np.arange(n, dtype=np.int64))


def requests_of(t: Trace) -> list[list[int]]:
    return [t.blocks(i).tolist() for i in range(t.n_requests)]


def test_mooncake_published_figures():
    curve = simulate(read_trace(MOONCAKE))
    assert curve.total_blocks == 288_500 and curve.distinct_blocks == 182_790 and curve.trace.n_requests == 12_031
    assert curve.ceiling == pytest.approx((0.366, 0.374), abs=0.0005)
    blocks, tokens = curve.rates(np.array([10_000, 100_000]))
    assert blocks == pytest.approx([0.211, 0.364], abs=0.0005)
    assert tokens == pytest.approx([0.215, 0.371], abs=0.0005)


@pytest.mark.parametrize("capacity", [10_000, 100_000])
def test_mooncake_matches_direct_simulation_on_a_held_back_half(capacity):
    """The second half of the trace, which no figure above was taken from, simulated both ways."""
    t = read_trace(MOONCAKE)
    half = window(t, first=t.n_requests // 2)
    curve = simulate(half)
    blocks, tokens, per = direct_lru(requests_of(half), half.input_tokens.tolist(), 512, capacity)
    hit_b, hit_t = curve.hits(capacity)
    assert (int(hit_b), int(hit_t)) == (blocks, tokens)
    assert curve.per_request(capacity)[0].tolist() == per


@pytest.mark.parametrize("policy", ["lru", "lru-tail-first"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_capacity_matches_direct_simulation(policy, seed):
    t = random_trace(seed)
    curve = simulate(t, policy)
    reqs, inputs = requests_of(t), t.input_tokens.tolist()
    for capacity in range(1, curve.distinct_blocks + 2):
        blocks, tokens, per = direct_lru(reqs, inputs, t.block_tokens, capacity, policy == "lru-tail-first")
        hit_b, hit_t = curve.hits(capacity)
        assert (int(hit_b), int(hit_t)) == (blocks, tokens), capacity
        got_b, got_t = curve.per_request(capacity)
        assert got_b.tolist() == per
        assert got_t.sum() == tokens


def test_the_two_policies_differ_where_the_order_of_touches_matters():
    # capacity 2: prompts [0, 1], [2], [0, 1]. In prompt order block 0 is older than 1, so [2] evicts the head of
    # the prefix and the third request finds nothing; tail first evicts 1 and keeps the head: one block hits.
    t = Trace("t", "mooncake", 1, np.arange(3, dtype=np.float64), np.array([2, 1, 2]), np.ones(3, dtype=np.int64),
              np.array([0, 2, 3, 5]), np.array([0, 1, 2, 0, 1]), np.arange(3))
    assert int(simulate(t, "lru").hits(2)[0]) == 0
    assert int(simulate(t, "lru-tail-first").hits(2)[0]) == 1
    assert int(simulate(t, "lru").hits(3)[0]) == 2


def test_tier_cascade_is_the_curve_at_the_cumulative_capacities():
    t = random_trace(5)
    curve = simulate(t)
    h = tier_hits(curve, 3, 7, 11)
    at = [int(curve.hits(c)[0]) for c in (3, 10, 21)]
    assert [h.blocks["device"], h.blocks["host"], h.blocks["disk"]] == [at[0], at[1] - at[0], at[2] - at[1]]
    assert sum(h.block_rate.values()) == pytest.approx(curve.rates(21)[0])
    assert tier_hits(curve, 5).blocks["host"] == 0
    with pytest.raises(BadValue, match="0 blocks or more"):
        tier_hits(curve, -1)


def test_capacity_grid_is_ascending_and_ends_at_the_ceiling():
    curve = simulate(random_trace(3))
    grid = capacity_grid(curve, 20)
    assert grid[0] == 1 and grid[-1] == curve.distinct_blocks and (np.diff(grid) > 0).all()


def test_unknown_policy_names_the_choices():
    with pytest.raises(BadValue, match="policy 'lfu' is not one of: lru, lru-tail-first"):
        simulate(random_trace(0), "lfu")


def test_window_cuts_and_rebases_times():
    t = random_trace(0, n=50)
    w = window(t, start_s=10, end_s=20, max_requests=5, time_scale=0.5)
    assert w.index.tolist() == [10, 11, 12, 13, 14]
    assert w.arrival_s.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert [w.blocks(i).tolist() for i in range(5)] == [t.blocks(i).tolist() for i in range(10, 15)]
    with pytest.raises(BadValue, match="no request of random"):
        window(t, start_s=1000)
    with pytest.raises(BadValue, match="time_scale 0 must be above 0"):
        window(t, time_scale=0)


def test_rechaining_keeps_chained_ids_hits_and_tells_content_ids_apart():
    from kvbench.traces.trace import rechained

    t = random_trace(4)
    assert (simulate(rechained(t)).need == simulate(t).need).all()
    # content ids: block 7 after [1, 2] and block 7 right after [1] are not the same prefix
    content = Trace("c", "bailian", 1, np.arange(2, dtype=np.float64), np.array([3, 2]), np.ones(2, dtype=np.int64),
                    np.array([0, 3, 5]), np.array([1, 2, 7, 1, 7]), np.arange(2))
    assert int(simulate(content).hits(10)[0]) == 2  # taken as chained, [1, 7] would find both of its ids
    assert rechained(content).block_ids.tolist() == [0, 1, 2, 0, 3]
    assert int(simulate(rechained(content)).hits(10)[0]) == 1
