"""A scenario's ``workload.trace`` checked before anything starts: the file read as a replay reads it (every faulty
line said, kvbench.traces.read), the window cut, and the replayed slice's shape (requests, longest prompt,
distinct blocks and working set in replayed tokens) for the checks that need it."""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kvbench.errors import UserError
from kvbench.traces.read import read_trace
from kvbench.traces.trace import Trace, window

if TYPE_CHECKING:
    from kvbench.scenario.schema import Scenario
    from kvbench.scenario.workload import TraceSpec


@dataclass(frozen=True)
class TraceShape:
    """The replayed slice of a trace: its ``requests``, its longest prompt and its working set (distinct blocks ×
    replayed ``block_tokens``: the KV a cache must hold so that every revisit finds its prefix), in replayed
    tokens, and ``span_s``: seconds from its first arrival to its last, ``time_scale`` applied."""

    requests: int
    longest_prompt: int
    distinct_blocks: int
    working_set_tokens: int
    span_s: float = 0.0


@functools.lru_cache(maxsize=4)
def _slice(path: str, fmt: str, source_block: int | None, args: tuple[tuple[str, object], ...],
           stamp: tuple[int, int]) -> Trace:
    del stamp  # part of the cache key only: a file changed on disk is read again
    return window(read_trace(path, fmt, source_block), **dict(args))  # type: ignore[arg-type]


def replayed_slice(spec: TraceSpec) -> Trace:
    """The requests of ``spec``'s trace a replay sends (read once per file version and window).

    Raises:
        kvbench.errors.BadFile: the file cannot be read (one line per faulty line).
        kvbench.errors.BadValue: the window holds no request.
    """
    try:
        st = os.stat(spec.path)
        stamp = (st.st_mtime_ns, st.st_size)
    except OSError:
        stamp = (0, 0)
    return _slice(spec.path, spec.format, spec.source_block_tokens, tuple(sorted(spec.window_args.items())), stamp)


def trace_shape(spec: TraceSpec) -> TraceShape:
    """The shape of ``spec``'s replayed slice (:class:`TraceShape`).

    Raises:
        kvbench.errors.BadFile, kvbench.errors.BadValue: as :func:`replayed_slice`.
    """
    t = replayed_slice(spec)
    whole = np.diff(t.offsets) - 1
    partial = t.input_tokens - whole * t.block_tokens
    lengths = whole * spec.block_tokens + np.ceil(partial * spec.block_tokens / t.block_tokens).astype(np.int64)
    distinct = len(np.unique(t.block_ids))
    return TraceShape(t.n_requests, int(lengths.max()), distinct, distinct * spec.block_tokens,
                      float(t.arrival_s[-1]))


def trace_problems(s: Scenario, longest_prompt: int | None) -> list[tuple[str, str]]:
    """Why ``s``'s trace cannot be replayed, one ``(key path, message)`` each: a file that cannot be read (its
    faulty lines), an empty window, a replayed prompt longer than ``longest_prompt`` (the model's positions less
    ``max_new_tokens``; None: unknown)."""
    spec = s.workload.trace
    if spec is None:
        return []
    try:
        shape = trace_shape(spec)
    except UserError as exc:
        return [("workload.trace", line) for line in str(exc).splitlines()]
    if longest_prompt is not None and shape.longest_prompt > longest_prompt:
        fits = math.floor(spec.block_tokens * longest_prompt / shape.longest_prompt)
        how = f"at most {fits} tokens per block, or fewer requests" if fits >= 3 else \
            "replay fewer requests (blocks need 3 tokens at least: a marker and text)"
        return [("workload.trace.block_tokens", f"{spec.block_tokens} tokens per block make a prompt of "
                 f"{shape.longest_prompt:,} tokens, longer than the model's longest of {longest_prompt:,}: {how}")]
    return []
