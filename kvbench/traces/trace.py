"""A request trace in memory: per request its arrival time, its prompt and output lengths in tokens and the hash
ids of its prompt's blocks (one id per ``block_tokens`` tokens; the last block may be partial), as flat numpy
arrays so that a trace of a million requests and tens of millions of block visits fits in a few hundred MB.

A hash id stands for its block *and everything before it* (Mooncake's and Bailian's convention): two prompts share a
prefix exactly as long as their leading ids agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from kvbench.errors import BadValue


@dataclass(frozen=True)
class Trace:
    """A request trace, its requests in arrival order.

    Attributes:
        source: where it was read from (a file name, or how it was made), for messages.
        format: ``mooncake``, ``bailian`` or ``columns`` (a CSV or JSONL of Mooncake's columns).
        block_tokens: tokens per hash block (Mooncake 512, Bailian 16).
        arrival_s: float64 ``(n,)``, seconds from the trace's first request, non-decreasing.
        input_tokens: int64 ``(n,)``, prompt tokens per request (at least 1).
        output_tokens: int64 ``(n,)``, generated tokens per request.
        offsets: int64 ``(n + 1,)``: request ``i``'s hash ids are ``block_ids[offsets[i]:offsets[i + 1]]``.
        block_ids: int64 ``(offsets[-1],)``, every request's hash ids in prompt order.
        index: int64 ``(n,)``, each request's position in the file (0-based), kept through sorting and slicing.
        notes: what reading changed or noticed (times sorted, ...), one line each.
    """

    source: str
    format: str
    block_tokens: int
    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    offsets: np.ndarray
    block_ids: np.ndarray
    index: np.ndarray
    notes: tuple[str, ...] = field(default=())

    @property
    def n_requests(self) -> int:
        """The number of requests."""
        return int(self.input_tokens.shape[0])

    @property
    def n_visits(self) -> int:
        """Block visits: the hash ids of every request, counted with repeats."""
        return int(self.block_ids.shape[0])

    def blocks(self, i: int) -> np.ndarray:
        """Request ``i``'s hash ids, int64 ``(ceil(input_tokens[i] / block_tokens),)``."""
        return self.block_ids[self.offsets[i]:self.offsets[i + 1]]

    def block_weights(self) -> np.ndarray:
        """Tokens of each block visit, int64 ``(n_visits,)``: ``block_tokens``, less for a prompt's partial last block
        (so that a request's weights sum to its ``input_tokens``)."""
        counts = np.diff(self.offsets)
        position = np.arange(self.n_visits, dtype=np.int64) - np.repeat(self.offsets[:-1], counts)
        rest = np.repeat(self.input_tokens, counts) - position * self.block_tokens
        return np.minimum(rest, self.block_tokens)

    def take(self, rows: np.ndarray, why: str | None = None) -> Trace:
        """The requests at ``rows`` (int ``(k,)``, ascending), arrival times from the first of them.

        Args:
            rows: positions of requests in this trace.
            why: a note saying what was taken, added to ``notes``.
        """
        counts = np.diff(self.offsets)[rows]
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        starts = self.offsets[:-1][rows]
        flat = np.repeat(starts - offsets[:-1], counts) + np.arange(offsets[-1], dtype=np.int64)
        arrival = self.arrival_s[rows]
        return replace(self, arrival_s=arrival - (arrival[0] if len(arrival) else 0.0),
                       input_tokens=self.input_tokens[rows], output_tokens=self.output_tokens[rows],
                       offsets=offsets, block_ids=self.block_ids[flat], index=self.index[rows],
                       notes=self.notes + ((why,) if why else ()))


def window(trace: Trace, start_s: float | None = None, end_s: float | None = None, first: int | None = None,
           last: int | None = None, max_requests: int | None = None, time_scale: float = 1.0,
           conversations_kept: int | None = None) -> Trace:
    """A slice of ``trace``: the requests arriving in ``[start_s, end_s)`` seconds, then those at positions
    ``[first, last)`` of what is left, then (``conversations_kept``) only the requests of the first that many
    conversations with more than one request (:func:`conversations`, inferred within the window), then at most the
    first ``max_requests``; arrival times from the first request kept, multiplied by ``time_scale`` (0.5 replays
    twice as fast).

    Raises:
        BadValue: a bound that is negative, an empty range, ``time_scale`` not above 0, or nothing left.
    """
    for name, value in (("start_s", start_s), ("end_s", end_s), ("first", first), ("last", last),
                        ("conversations_kept", conversations_kept)):
        if value is not None and value < 0:
            raise BadValue(f"trace window: {name} {value} is negative")
    if not time_scale > 0 or not np.isfinite(time_scale):
        raise BadValue(f"trace window: time_scale {time_scale} must be above 0")
    if max_requests is not None and max_requests < 1:
        raise BadValue(f"trace window: max_requests {max_requests} must be at least 1")
    rows = np.arange(trace.n_requests)
    t = trace.arrival_s
    if start_s is not None:
        rows = rows[t[rows] >= start_s]
    if end_s is not None:
        rows = rows[t[rows] < end_s]
    rows = rows[first:last]
    if conversations_kept is not None and len(rows):
        conv = conversations(trace.take(rows))
        ids, counts = np.unique(conv, return_counts=True)
        rows = rows[np.isin(conv, ids[counts > 1][:conversations_kept])]
    if max_requests is not None:
        rows = rows[:max_requests]
    if not len(rows):
        raise BadValue(f"trace window: no request of {trace.source} ({trace.n_requests:,} requests over "
                       f"{float(t[-1]) if len(t) else 0:,.1f} s) is in the window asked for")
    parts = [f"{k} {v}" for k, v in (("from", start_s), ("to", end_s), ("first", first), ("last", last),
                                      ("conversations", conversations_kept), ("max_requests", max_requests))
             if v is not None]
    taken = trace.take(rows, f"requests {', '.join(parts)}: {len(rows):,} of {trace.n_requests:,}" if parts else None)
    if time_scale != 1.0:
        taken = replace(taken, arrival_s=taken.arrival_s * time_scale,
                        notes=taken.notes + (f"times scaled by {time_scale:g}",))
    return taken


def conversations(trace: Trace, min_shared_blocks: int = 2) -> np.ndarray:
    """Per request, the conversation it belongs to, inferred from its ids (int64 ``(n_requests,)``, numbered in
    order of first request): a request whose leading ids were seen before, at least ``min_shared_blocks`` of
    them (more than a first block every prompt shares, such as a system prompt), continues the conversation of the
    latest earlier request that held the last of them; any other request starts a conversation."""
    holder: dict[int, int] = {}
    conv = np.zeros(trace.n_requests, dtype=np.int64)
    count = 0
    for i in range(trace.n_requests):
        ids = trace.block_ids[trace.offsets[i]:trace.offsets[i + 1]].tolist()
        seen = 0
        for b in ids:
            if b not in holder:
                break
            seen += 1
        if seen >= min_shared_blocks:
            conv[i] = conv[holder[ids[seen - 1]]]
        else:
            conv[i], count = count, count + 1
        for b in ids:
            holder[b] = i
    return conv


def rechained(trace: Trace) -> Trace:
    """``trace`` with each hash id replaced by an id of the pair (the id before it in the prompt, this id), numbered
    in order of first appearance: two prompts then share a prefix exactly as long as their leading ids agree
    whether the file's ids named a block with everything before it (Mooncake's) or the block's content alone (as
    Bailian's may: its format does not say). For ids that chain already, the hits are unchanged."""
    pairs: dict[tuple[int, int], int] = {}
    ids = trace.block_ids.tolist()
    out = np.empty(len(ids), dtype=np.int64)
    starts = set(trace.offsets[:-1].tolist())
    parent = -1
    for k, b in enumerate(ids):
        if k in starts:
            parent = -1
        parent = pairs.setdefault((parent, b), len(pairs))
        out[k] = parent
    return replace(trace, block_ids=out)
