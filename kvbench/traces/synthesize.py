"""Traces of any size from a real one, by prefix-tree resampling (the method of the field's trace synthesizers,
e.g. NVIDIA Dynamo's ``prefix_data_generator``): each new request takes a request of the source drawn at random,
keeps its *shared path* (its leading hash ids that some other request of the source also has: the prefixes the
traffic reuses, a system prompt, a conversation's earlier turns), gives its *unique tail* (the ids no other request
has) fresh ids of the same count, and keeps its prompt and output lengths; the gaps between arrivals are drawn
from the source's own gaps, divided by ``speedup``. ``copies`` makes that many disjoint copies of the prefix tree
(each new request's shared path goes to one copy at random): the working set grows with the copies while each
prefix keeps its popularity within its copy.

The result has the source's distributions of lengths, of prefix sharing and of arrival gaps; a request's shared
path is visited more often than in the source when the new trace is longer than ``copies`` × the source (so its
hit rates at a capacity rise), which ``copies`` offsets.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from kvbench.errors import BadValue
from kvbench.traces.trace import Trace

#: Most requests one synthesis makes (a million Mooncake-like requests take some 200 MB in memory).
MAX_REQUESTS = 10_000_000


def shared_lengths(trace: Trace) -> np.ndarray:
    """Per request, the length (blocks) of its shared path: its leading ids that at least one other request of
    ``trace`` also has (int64 ``(n_requests,)``). An id stands for its prefix, so once an id is unique every later
    one of the prompt is too."""
    _, inverse, counts = np.unique(trace.block_ids, return_inverse=True, return_counts=True)
    shared = counts[inverse.ravel()] > 1
    starts = trace.offsets[:-1]
    lengths = np.diff(trace.offsets)
    # leading run of shared visits per request: the first unshared visit's position, else the request's length
    position = np.arange(trace.n_visits, dtype=np.int64) - np.repeat(starts, lengths)
    first_unshared = np.full(trace.n_requests, np.iinfo(np.int64).max)
    np.minimum.at(first_unshared, np.repeat(np.arange(trace.n_requests), lengths)[~shared], position[~shared])
    return np.minimum(first_unshared, lengths)


def synthesize(trace: Trace, n_requests: int, seed: int = 0, copies: int = 1, speedup: float = 1.0) -> Trace:
    """A trace of ``n_requests`` requests resampled from ``trace`` (the module's docstring).

    Args:
        trace: the source.
        n_requests: requests to make, 1 to :data:`MAX_REQUESTS`.
        seed: the random generator's seed (the same seed, source and arguments make the same trace).
        copies: disjoint copies of the source's prefix tree, at least 1.
        speedup: arrival gaps divided by this (2: twice the source's request rate); above 0.

    Returns:
        A trace whose ``index`` is each new request's source request's position in the source's file.

    Raises:
        BadValue: an argument out of range.
    """
    if type(n_requests) is not int or not 1 <= n_requests <= MAX_REQUESTS:
        raise BadValue(f"requests: a whole number from 1 to {MAX_REQUESTS:,}, not {n_requests!r}")
    if type(copies) is not int or copies < 1:
        raise BadValue(f"copies: a whole number of at least 1, not {copies!r}")
    if not (isinstance(speedup, (int, float)) and np.isfinite(speedup) and speedup > 0):
        raise BadValue(f"speedup: a number above 0, not {speedup!r}")
    rng = np.random.default_rng(seed)
    source = rng.integers(0, trace.n_requests, size=n_requests)
    copy = rng.integers(0, copies, size=n_requests)
    lengths = np.diff(trace.offsets)
    shared = shared_lengths(trace)
    counts = lengths[source]
    offsets = np.zeros(n_requests + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    position = np.arange(offsets[-1], dtype=np.int64) - np.repeat(offsets[:-1], counts)
    taken = np.repeat(trace.offsets[:-1][source], counts) + position
    is_shared = position < np.repeat(shared[source], counts)
    # ids renumbered 0, 1, ... in their order (a trace's ids may be 64-bit hashes: offsets of those overflow)
    _, dense = np.unique(trace.block_ids, return_inverse=True)
    span = int(dense.max()) + 1 if trace.n_visits else 1
    n_fresh = int((~is_shared).sum())
    if copies * span + n_fresh > np.iinfo(np.int64).max:
        raise BadValue(f"copies: {copies:,} copies of {span:,} distinct ids do not fit in 64-bit ids")
    ids = dense.ravel().astype(np.int64)[taken] + np.repeat(copy, counts) * span
    fresh = copies * span + np.arange(n_fresh, dtype=np.int64)
    ids[~is_shared] = fresh
    gaps = np.diff(trace.arrival_s) if trace.n_requests > 1 else np.zeros(1)
    arrival = np.concatenate([[0.0], np.cumsum(rng.choice(gaps, size=n_requests - 1) / speedup)])
    return replace(trace, source=f"synthesized from {trace.source} (seed {seed}, copies {copies}, speedup "
                                 f"{speedup:g})", arrival_s=arrival, input_tokens=trace.input_tokens[source],
                   output_tokens=trace.output_tokens[source], offsets=offsets, block_ids=ids,
                   index=trace.index[source], notes=())
