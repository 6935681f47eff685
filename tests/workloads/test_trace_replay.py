"""A trace replayed as prompts (kvbench.workloads.trace_replay), without a tokenizer: prompts share exactly the
prefixes their hash ids say, each id's block starts with a marker of its own, a partial last block is cut in
proportion; trace_stream on the committed Mooncake trace."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from kvbench.errors import WorkloadError
from kvbench.scenario.workload import TraceSpec
from kvbench.traces.trace import Trace, conversations
from kvbench.workloads.trace_replay import replay_prompts, trace_stream

ROOT = Path(__file__).resolve().parents[2]
MOONCAKE = ROOT / "traces" / "mooncake" / "conversation_trace.jsonl"
#: Marker ids and pool text ids kept apart, so that a test can tell them.
POOL = np.arange(10_000, 10_300, dtype=np.int64)


def tree_trace(seed: int, n: int = 80, source_block: int = 16) -> Trace:
    """Requests walking a random prefix tree (each extends a random earlier prompt's prefix, or starts afresh),
    ids drawn sparse and large (as a real trace's hashes), a partial last block of 1 to ``source_block`` tokens."""
    rng = np.random.default_rng(seed)
    prompts: list[list[int]] = []
    fresh_ids = iter(rng.choice(2**40, size=n * 6, replace=False).tolist())
    for _ in range(n):
        base = prompts[rng.integers(len(prompts))] if prompts and rng.random() < 0.75 else []
        ids = base[:rng.integers(1, len(base) + 1)] if base else []
        ids = ids + [next(fresh_ids) for _ in range(int(rng.integers(0 if ids else 1, 5)))]
        prompts.append(ids)
    counts = np.array([len(p) for p in prompts])
    inputs = (counts - 1) * source_block + rng.integers(1, source_block + 1, size=n)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return Trace("tree", "mooncake", source_block, np.arange(n, dtype=np.float64), inputs.astype(np.int64),
                 np.ones(n, dtype=np.int64), offsets, np.concatenate(prompts).astype(np.int64),
                 np.arange(n, dtype=np.int64))


def common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def leading(a: np.ndarray, b: np.ndarray) -> int:
    return common(a.tolist(), b.tolist())


def expected_length(t: Trace, i: int, block_tokens: int) -> int:
    blocks = len(t.blocks(i))
    partial = int(t.input_tokens[i]) - (blocks - 1) * t.block_tokens
    return (blocks - 1) * block_tokens + math.ceil(partial * block_tokens / t.block_tokens)


@pytest.mark.parametrize("seed, block_tokens", [(0, 8), (1, 3), (2, 5), (3, 32)])
def test_prompts_share_exactly_the_prefix_their_ids_say(seed, block_tokens):
    """For every pair of requests a, b with L leading hash ids in common, the prompts' common prefix is
    min(L × block_tokens, len(a), len(b)) tokens: L whole blocks, cut to the shorter prompt when the last shared
    block is its partial last one; not a token more (the next blocks start with different markers)."""
    t = tree_trace(seed)
    markers = np.arange(50, 50 + 1000, dtype=np.int64)
    prompts = replay_prompts(t, block_tokens, POOL, markers)
    pairs = shared = 0
    for a in range(t.n_requests):
        for b in range(a + 1, t.n_requests):
            ids = leading(t.blocks(a), t.blocks(b))
            want = min(ids * block_tokens, len(prompts[a]), len(prompts[b]))
            assert common(prompts[a], prompts[b]) == want, (a, b, ids)
            pairs += 1
            shared += ids > 0
    assert shared > pairs // 10  # the tree shares prefixes often
    for i in range(t.n_requests):
        assert len(prompts[i]) == expected_length(t, i, block_tokens)


def test_each_id_s_block_starts_with_its_own_marker_then_pool_text():
    t = tree_trace(4)
    prompts = replay_prompts(t, 6, POOL, np.arange(50, 1050, dtype=np.int64))
    first: dict[int, list[int]] = {}
    for i in range(t.n_requests):
        for j, h in enumerate(t.blocks(i).tolist()):
            block = prompts[i][6 * j:6 * (j + 1)]
            if len(block) == 6:  # a whole block: the same wherever its id appears
                assert first.setdefault(h, block) == block
            assert 50 <= block[0] < 1050 and all(x in range(10_000, 10_300) for x in block[1:])
    starts = [b[0] for b in first.values()]
    assert len(set(starts)) == len(starts) == len(first)  # distinct ids: distinct markers


def test_more_ids_than_markers_take_two_markers_never_the_same_pair():
    t = tree_trace(5)
    distinct = len(np.unique(t.block_ids))
    k = math.isqrt(distinct - 1) + 1  # k² ≥ distinct: every id its own pair
    assert k < distinct <= k * k
    prompts = replay_prompts(t, 5, POOL, np.arange(k, dtype=np.int64))
    heads = {}
    for i in range(t.n_requests):
        for j, h in enumerate(t.blocks(i).tolist()):
            head = tuple(prompts[i][5 * j:5 * j + 2])
            if len(head) == 2:
                assert heads.setdefault(h, head) == head
                assert head[1] < k and head[0] < k and all(x >= 10_000 for x in prompts[i][5 * j + 2:5 * j + 5])
    assert len(set(heads.values())) == len(heads)
    # a prompt is never longer than its share, and two prompts share at most one token past their common ids
    for a in range(t.n_requests):
        assert len(prompts[a]) == expected_length(t, a, 5)
        for b in range(a + 1, t.n_requests):
            ids = leading(t.blocks(a), t.blocks(b))
            got = common(prompts[a], prompts[b])
            assert min(ids * 5, len(prompts[a]), len(prompts[b])) <= got <= ids * 5 + 1


def test_partial_last_blocks_are_cut_in_proportion_rounded_up():
    t = Trace("hand", "mooncake", 512, np.zeros(4), np.array([512, 513, 1000, 1024 + 1]), np.ones(4, np.int64),
              np.array([0, 1, 3, 5, 8]), np.array([1, 1, 2, 1, 3, 1, 3, 4]), np.arange(4))
    prompts = replay_prompts(t, 32, POOL, np.arange(10, dtype=np.int64))
    # 512 tokens: one whole block; 513: a block and 1 token (1 × 32 / 512 → 1); 1000: 32 + ceil(488 / 16) = 63;
    # 1025: 64 + 1
    assert [len(p) for p in prompts] == [32, 33, 63, 65]
    assert prompts[1][:32] == prompts[0] and prompts[2][:32] == prompts[0]
    assert prompts[3][:63] == prompts[2]  # ids 1, 3 of request 2 lead request 3's
    assert common(prompts[1], prompts[2]) == 32


@pytest.mark.parametrize("block_tokens", [0, 1, 2])
def test_a_block_too_small_for_a_marker_and_text_is_refused(block_tokens):
    with pytest.raises(WorkloadError) as e:
        replay_prompts(tree_trace(0, n=3), block_tokens, POOL, np.arange(10))
    assert str(e.value) == (f"workload.trace.block_tokens: {block_tokens} leaves no room for a marker and text (at "
                            "least 3)")
    with pytest.raises(WorkloadError) as e:
        replay_prompts(tree_trace(0, n=3), 3, POOL, np.zeros(0, dtype=np.int64))
    assert str(e.value) == "workload.trace: the vocabulary has no token to mark blocks with"


def file_rows(start_s: float, n: int) -> list[tuple[int, dict]]:
    """The file's first ``n`` requests arriving at or after ``start_s`` (its timestamps in ms), with positions."""
    out = []
    for i, line in enumerate(MOONCAKE.read_text().splitlines()):
        rec = json.loads(line)
        if rec["timestamp"] / 1000 >= start_s:
            out.append((i, rec))
            if len(out) == n:
                break
    return out


def test_trace_stream_names_requests_by_file_position_and_conversations_by_ids():
    spec = TraceSpec(path=str(MOONCAKE), block_tokens=8, start_s=100.0, max_requests=40)
    stream = trace_stream(spec, None, None, 1000, 0, 100_000)
    rows = file_rows(100.0, 40)
    assert [r.id for r in stream.requests] == [f"t{i}" for i, _ in rows]
    assert [r.trace_index for r in stream.requests] == [i for i, _ in rows]
    first = rows[0][1]["timestamp"]
    assert [r.arrival_s for r in stream.requests] == pytest.approx([(rec["timestamp"] - first) / 1000
                                                                    for _, rec in rows], abs=1e-9)
    assert stream.requests[0].arrival_s == 0.0 and stream.requests[-1].arrival_s > 0
    # conversations as kvbench.traces.trace.conversations numbers them, turns counted within each
    from kvbench.traces.read import read_trace
    from kvbench.traces.trace import window

    sliced = window(read_trace(MOONCAKE), start_s=100.0, max_requests=40)
    conv = conversations(sliced)
    assert [r.document for r in stream.requests] == [f"c{c}" for c in conv]
    assert len(set(conv.tolist())) == 40 and {r.turn_index for r in stream.requests} == {1}
    for r, (_, rec) in zip(stream.requests, rows):
        blocks = len(rec["hash_ids"])
        partial = rec["input_length"] - (blocks - 1) * 512
        assert len(r.ids) == (blocks - 1) * 8 + math.ceil(partial * 8 / 512)
        assert r.held == r.ids and max(r.ids) < 1000
    assert stream.notes[0] == "trace conversation_trace.jsonl: 40 requests, 512 tokens per id in the file, 8 per " \
                              "replayed block"
    # the same slice again: the same prompts
    again = trace_stream(spec, None, None, 1000, 0, 100_000)
    assert [r.ids for r in again.requests] == [r.ids for r in stream.requests]


def test_trace_stream_refuses_prompts_longer_than_the_model_s():
    spec = TraceSpec(path=str(MOONCAKE), block_tokens=16, max_requests=10)
    rows = file_rows(0.0, 10)
    lengths = [(len(rec["hash_ids"]) - 1) * 16 + math.ceil((rec["input_length"] - (len(rec["hash_ids"]) - 1) * 512)
                                                           * 16 / 512) for _, rec in rows]
    limit = sorted(lengths)[3]  # the 4th shortest: 6 are longer, unless lengths repeat
    longer = [(i, n) for (i, _), n in zip(rows, lengths) if n > limit]
    with pytest.raises(WorkloadError) as e:
        trace_stream(spec, None, None, 1000, 0, limit)
    assert str(e.value) == (f"workload.trace: {len(longer)} replayed prompts are longer than the model's longest "
                            f"prompt of {limit} tokens (the first, request {longer[0][0]} of the file, has "
                            f"{longer[0][1]}): lower block_tokens, or replay fewer requests")
    assert len(trace_stream(spec, None, None, 1000, 0, max(lengths)).requests) == 10


def test_trace_stream_of_kept_conversations_counts_their_turns():
    spec = TraceSpec(path=str(MOONCAKE), block_tokens=8, conversations=3, max_requests=64)
    stream = trace_stream(spec, None, None, 1000, 0, 100_000)
    docs = [r.document for r in stream.requests]
    assert sorted(set(docs)) == ["c0", "c1", "c2"]
    index = [r.trace_index for r in stream.requests]
    assert index == sorted(index) and stream.requests[0].arrival_s == 0.0
    ids = {r.trace_index: r.ids for r in stream.requests}
    for d in set(docs):
        mine = [r for r in stream.requests if r.document == d]
        assert len(mine) >= 2 and [r.turn_index for r in mine] == list(range(1, len(mine) + 1))
        for later in mine[1:]:  # each turn extends an earlier turn's prompt by at least 2 whole blocks of 8
            assert max(common(list(ids[e.trace_index]), list(later.ids)) for e in mine
                       if e.trace_index < later.trace_index) >= 16
    assert any("conversations 3" in n for n in stream.notes)
