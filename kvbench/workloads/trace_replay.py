"""A request trace as a request stream (the ``workload.trace`` reuse workload): each hash id becomes one block of
real text tokens, so prompts share exactly the prefixes the trace says, and never one by accident.

A block is ``block_tokens`` tokens: first a *marker*, a token of the vocabulary (special tokens left out) that is
this id's alone among the slice's distinct ids (two markers when the slice holds more distinct ids than the
vocabulary has tokens: then two blocks may share their first token, never their first two), then a window of a
pool of real text (the workload's source: ShareGPT conversations, local files, or seeded random ids for
``synthetic``) taken at an offset of its own. The same id gives the same block wherever it appears, so two
prompts share a prefix of whole blocks exactly as long as their leading ids agree, and since their markers differ,
not one token more. A prompt's partial last block keeps its share of the block, rounded up (the trace's
``input_length`` less its whole blocks, × ``block_tokens`` ÷ the file's block size).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from kvbench.errors import WorkloadError
from kvbench.traces.read import read_trace
from kvbench.traces.trace import Trace, conversations, window
from kvbench.workloads.documents import Document
from kvbench.workloads.sessions import Request, Stream
from kvbench.workloads.synthetic import prompt_ids

if TYPE_CHECKING:
    from kvbench.scenario.workload import TraceSpec

#: Tokens of real text the blocks' windows are taken from (fewer when the source holds less).
POOL_TOKENS = 65_536


def text_pool(docs: Sequence[Document] | None, tokenizer: Any, vocab_size: int, seed: int,
              special: frozenset[int]) -> np.ndarray:
    """Up to :data:`POOL_TOKENS` token ids of real text: ``docs``' turns, tokenized without special tokens, in
    order; with no documents (``synthetic``), seeded random ids below ``vocab_size`` minus ``special``.

    Raises:
        kvbench.errors.WorkloadError: the documents hold no text.
    """
    if docs is None:
        return np.array(prompt_ids(POOL_TOKENS, 0, vocab_size=vocab_size, seed=seed, exclude=special), np.int64)
    out: list[int] = []
    for doc in docs:
        for _, text in doc.turns:
            out.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        if len(out) >= POOL_TOKENS:
            break
    if not out:
        raise WorkloadError("workload.trace: the workload's source holds no text to make blocks of")
    return np.array(out[:POOL_TOKENS], dtype=np.int64)


def replay_prompts(trace: Trace, block_tokens: int, pool: np.ndarray, markers: np.ndarray) -> list[list[int]]:
    """Every request's prompt (token ids) of ``trace``: per hash id a block of ``block_tokens`` (the module's
    docstring), ``markers`` the usable marker ids (int ``(K,)``, distinct), ``pool`` the text's ids.

    Raises:
        kvbench.errors.WorkloadError: ``block_tokens`` below 3 (a marker and text need room), or no markers.
    """
    if block_tokens < 3 or not len(markers):
        raise WorkloadError(f"workload.trace.block_tokens: {block_tokens} leaves no room for a marker and text "
                            "(at least 3)" if block_tokens < 3 else "workload.trace: the vocabulary has no "
                            "token to mark blocks with")
    ids, rank = np.unique(trace.block_ids, return_inverse=True)
    k = len(markers)
    two = len(ids) > k
    text = block_tokens - (2 if two else 1)
    span = max(1, len(pool) - text)
    blocks: dict[int, list[int]] = {}

    def block(r: int) -> list[int]:
        if r not in blocks:
            head = [int(markers[r % k])] + ([int(markers[(r // k) % k])] if two else [])
            at = (r * 7919 * text) % span
            window_ids = pool[at:at + text]
            if len(window_ids) < text:  # a pool shorter than a block: wrap around
                window_ids = np.resize(pool, text)
            blocks[r] = head + window_ids.tolist()
        return blocks[r]

    out = []
    rank = rank.ravel()
    for i in range(trace.n_requests):
        start, end = int(trace.offsets[i]), int(trace.offsets[i + 1])
        prompt: list[int] = []
        for r in rank[start:end]:
            prompt.extend(block(int(r)))
        whole = end - start - 1
        partial = int(trace.input_tokens[i]) - whole * trace.block_tokens
        keep = whole * block_tokens + max(1, math.ceil(partial * block_tokens / trace.block_tokens))
        out.append(prompt[:keep])
    return out


def trace_stream(spec: TraceSpec, docs: Sequence[Document] | None, tokenizer: Any, vocab_size: int, seed: int,
                 longest_prompt: int) -> Stream:
    """The replayed slice of ``spec``'s trace as a request stream: request ``t<file position>`` of conversation
    ``c<k>`` (:func:`~kvbench.traces.trace.conversations`, inferred from the ids: the independent units of its
    comparisons; the ids, not the conversation, say what a request shares), its turn in it, its arrival time and
    position kept.

    Raises:
        kvbench.errors.BadFile: the trace cannot be read.
        kvbench.errors.BadValue: the window holds no request.
        kvbench.errors.WorkloadError: a prompt longer than ``longest_prompt`` (lower ``block_tokens`` or
            ``max_requests``), or no text for the blocks.
    """
    trace = window(read_trace(spec.path, spec.format, spec.source_block_tokens), **spec.window_args)
    special = frozenset(getattr(tokenizer, "all_special_ids", []) or []) if tokenizer is not None else frozenset()
    known = min(vocab_size, len(tokenizer)) if tokenizer is not None else vocab_size  # servers refuse ids past it
    markers = np.array([t for t in range(known) if t not in special], dtype=np.int64)
    pool = text_pool(docs, tokenizer, vocab_size, seed, special)
    prompts = replay_prompts(trace, spec.block_tokens, pool, markers)
    too_long = [(int(trace.index[i]), len(p)) for i, p in enumerate(prompts) if len(p) > longest_prompt]
    if too_long:
        at, n = too_long[0]
        raise WorkloadError(f"workload.trace: {len(too_long)} replayed prompts are longer than the model's longest "
                            f"prompt of {longest_prompt} tokens (the first, request {at} of the file, has {n}): "
                            "lower block_tokens, or replay fewer requests")
    conv = conversations(trace)
    turn: dict[int, int] = {}
    requests = []
    for i, p in enumerate(prompts):
        c = int(conv[i])
        turn[c] = turn.get(c, 0) + 1
        requests.append(Request(f"t{int(trace.index[i])}", f"c{c}", turn[c], tuple(p), tuple(p),
                                trace_index=int(trace.index[i]), arrival_s=float(trace.arrival_s[i])))
    notes = [f"trace {trace.source}: {trace.n_requests:,} requests, {trace.block_tokens} tokens per id in the file, "
             f"{spec.block_tokens} per replayed block", *trace.notes]
    return Stream(requests, notes)
