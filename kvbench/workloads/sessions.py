"""Request streams for reuse workloads: multi-turn dialogue and document QA, as token ids through the chat template.

A :class:`Request` is one prompt a server answers, with the tokens whose KV the server holds afterwards (``held``):
for a conversation turn, the prompt and the dataset's assistant reply that the conversation goes on with; for a
document question, the prompt. A later request whose prompt starts with an earlier request's ``held`` tokens can
restore their KV instead of recomputing it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvbench.workloads.documents import Document
from kvbench.errors import NotEnoughRequests
from kvbench.scenario.workload import extra_documents

#: The questions of ``doc_qa``, asked of each document in this order (generic questions, as in long-document QA
#: benchmarks; the documents are real texts).
QUESTIONS = (
    "Summarise the text above in three sentences.",
    "What is the main question or task in the text above?",
    "List the names, places and numbers mentioned in the text above.",
    "What would be a good title for the text above?",
    "Which parts of the text above are unclear or ambiguous?",
    "Rewrite the first paragraph of the text above in plain language.",
    "What does the author of the text above want to achieve?",
    "Give three follow-up questions about the text above.",
)


@dataclass(frozen=True)
class Request:
    """One request of a reuse workload.

    Attributes:
        id: stable within the workload: ``c<conversation>-t<turn>`` or ``d<document>-q<question>``.
        document: the source conversation's or document's id.
        turn_index: 1 for a conversation's first turn or a document's first question, 2 for the next, ...
        ids: the prompt's token ids.
        held: the ids whose KV a server holds after answering (``ids`` is a prefix of it).
        shared_prefix_tokens: ``shared_prefix`` only: the tokens its prefix shares with the prefix's other visits.
        working_set: ``shared_prefix`` only: the prefixes in rotation in its cell.
        shared_pct: ``shared_prefix`` only: the share of the prompt its cell asks to be shared (percent).
        cell: ``shared_prefix`` only: its cell's index in the workload (cells run one after another).
        trace_index: ``trace`` only: the request's position in the trace file (0-based).
        arrival_s: ``trace`` only: when it arrives, seconds from the replayed slice's first request (time_scale
            applied).
    """

    id: str
    document: str
    turn_index: int
    ids: tuple[int, ...]
    held: tuple[int, ...]
    shared_prefix_tokens: int | None = None
    working_set: int | None = None
    shared_pct: int | None = None
    cell: int | None = None
    trace_index: int | None = None
    arrival_s: float | None = None


@dataclass
class Stream:
    """A workload's requests in the order they arrive, and notes on what was left out (for run.json)."""

    requests: list[Request]
    notes: list[str] = field(default_factory=list)


def _ids(tokenizer: Any, messages: list[dict[str, str]], generation: bool) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def conversation_turns(tokenizer: Any, doc: Document, turns: int) -> list[tuple[list[int], list[int]]] | None:
    """Per user turn k = 1..``turns`` of a conversation: (the prompt's ids = turns 1..k through the chat template
    with the generation prompt, the ids of the conversation through the assistant's reply to turn k).

    Returns None when the conversation has fewer user turns, or when a rendering does not extend the previous one
    (a chat template that rewrites earlier turns: nothing could be reused).
    """
    msgs = [{"role": r, "content": t} for r, t in doc.turns if r in ("user", "assistant")]
    users = [i for i, m in enumerate(msgs) if m["role"] == "user"]
    if len(users) < turns:
        return None
    out = []
    for k in range(turns):
        prompt = _ids(tokenizer, msgs[:users[k] + 1], True)
        held = _ids(tokenizer, msgs[:users[k + 1]], False) if k + 1 < len(users) else prompt
        if held[:len(prompt)] != prompt:
            return None
        out.append((prompt, held))
    if any(b[0][:len(a[1])] != a[1] for a, b in zip(out, out[1:])):
        return None
    return out


def order_documents(docs: Sequence[Document], seed: int, order: str) -> list[Document]:
    """``docs`` in the order a workload tries them: ``longest`` first, or a shuffle seeded with ``seed``."""
    if order == "longest":
        return sorted(docs, key=lambda d: -d.chars)
    shuffled = list(docs)
    random.Random(seed).shuffle(shuffled)
    return shuffled


def multi_turn(docs: Sequence[Document], tokenizer: Any, *, conversations: int, turns: int, interleave: str,
               min_prompt_tokens: int, max_prompt_tokens: int, seed: int = 0, order: str = "random",
               keep: Callable[[Document], bool] | None = None) -> Stream:
    """Requests of ``conversations`` real conversations, ``turns`` user turns each, whose last prompt has
    ``min_prompt_tokens`` to ``max_prompt_tokens`` tokens; ``interleave`` = ``round_robin`` (turn 1 of every
    conversation, then turn 2, ...) or ``sequential``. ``order`` (``random`` with ``seed``, or ``longest``) is
    the order conversations are tried in; ``keep`` (e.g. a language check) is asked last, of candidates only.

    Raises:
        NotEnoughRequests: fewer such conversations in ``docs``.
    """
    chosen: list[tuple[Document, list[tuple[list[int], list[int]]]]] = []
    too_long = 0
    for doc in order_documents(docs, seed, order):
        users = [t for r, t in doc.turns if r == "user"]
        if len(users) < turns:
            continue
        # characters up to the last turn's question: a cheap bound (about 1 to 8 characters a token, the chat
        # template adding a few tokens a turn) before tokenising
        chars = sum(len(t) for _, t in doc.turns[:2 * turns - 1])
        if not min_prompt_tokens // 2 <= chars <= 8 * max_prompt_tokens:
            too_long += chars > 8 * max_prompt_tokens
            continue
        rendered = conversation_turns(tokenizer, doc, turns)
        if rendered is None or (keep is not None and not keep(doc)):
            continue
        n = len(rendered[-1][0])
        if n > max_prompt_tokens:
            too_long += 1
        elif n >= min_prompt_tokens:
            chosen.append((doc, rendered))
            if len(chosen) == conversations:
                break
    if len(chosen) < conversations:
        raise NotEnoughRequests(f"only {len(chosen)} of {conversations} conversations have {turns} user turns with "
                                f"a last prompt of {min_prompt_tokens}-{max_prompt_tokens} tokens; lower "
                                "conversations, turns or min_prompt_tokens")
    per_conv = [[Request(f"c{c}-t{k + 1}", doc.id, k + 1, tuple(p), tuple(h)) for k, (p, h) in enumerate(r)]
                for c, (doc, r) in enumerate(chosen)]
    if interleave == "round_robin":
        requests = [conv[k] for k in range(turns) for conv in per_conv]
    else:
        requests = [req for conv in per_conv for req in conv]
    notes = []
    if too_long:
        notes.append(f"{too_long} {'conversation' if too_long == 1 else 'conversations'} skipped: the prompt of "
                     f"turn {turns} is longer than {max_prompt_tokens} tokens (the limit; the model's positions "
                     "bound it)")
    return Stream(requests, notes)


def _cut_documents(docs: Iterable[Document], tokenizer: Any, n: int, doc_tokens: int,
                   keep: Callable[[Document], bool] | None) -> list[tuple[str, str]]:
    """``n`` (id, text) documents of exactly ``doc_tokens`` tokens when tokenised alone: the first user turn of
    conversations (or a file's text) at least that long, cut after ``doc_tokens`` tokens."""
    out = []
    for doc in docs:
        text = next((t for r, t in doc.turns if r == "user"), "")
        if len(text) < doc_tokens:  # fewer characters than tokens needed: too short
            continue
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) < doc_tokens or (keep is not None and not keep(doc)):
            continue
        out.append((doc.id, tokenizer.decode(ids[:doc_tokens])))
        if len(out) == n:
            break
    return out


def doc_qa(docs: Sequence[Document], tokenizer: Any, *, documents: int, questions: int, doc_tokens: int,
           repeat_mode: str, ratio: tuple[int, int] | None = None, seed: int = 0, order: str = "random",
           keep: Callable[[Document], bool] | None = None) -> Stream:
    """Requests asking ``questions`` of :data:`QUESTIONS` about each of ``documents`` real texts of ``doc_tokens``
    tokens; the prompt is one user message, the document then a blank line then the question.

    ``repeat_mode``: ``tile`` (every document with question 1, then every document with question 2, ...),
    ``interleave`` (all questions of a document in a row) or ``random`` (a seeded shuffle). ``ratio`` = (H, M)
    adds single-question documents, spread evenly through the stream, until there are M misses (first questions)
    for every H requests that can reuse a document. ``order``, ``seed`` and ``keep`` as in :func:`multi_turn`.

    Raises:
        NotEnoughRequests: fewer texts of at least ``doc_tokens`` tokens than needed.
    """
    extra = extra_documents(documents, questions, ratio)
    found = _cut_documents(order_documents(docs, seed, order), tokenizer, documents + extra, doc_tokens, keep)
    if len(found) < documents + extra:
        why = f" ({documents} documents + {extra} single-question ones for hit_miss_ratio)" if extra else ""
        raise NotEnoughRequests(f"only {len(found)} of {documents + extra} texts{why} have at least {doc_tokens} "
                                f"tokens; lower doc_tokens or documents" + (" or hit_miss_ratio's misses" if extra
                                                                           else ""))

    def request(d: int, q: int) -> Request:
        doc_id, text = found[d]
        ids = tuple(_ids(tokenizer, [{"role": "user", "content": f"{text}\n\n{QUESTIONS[q]}"}], True))
        return Request(f"d{d}-q{q + 1}", doc_id, q + 1, ids, ids)

    if repeat_mode == "tile":
        pairs = [(d, q) for q in range(questions) for d in range(documents)]
    elif repeat_mode == "interleave":
        pairs = [(d, q) for d in range(documents) for q in range(questions)]
    else:
        arrivals = [d for d in range(documents) for _ in range(questions)]
        random.Random(seed).shuffle(arrivals)
        asked = dict.fromkeys(range(documents), 0)  # a document's questions keep their order
        pairs = []
        for d in arrivals:
            pairs.append((d, asked[d]))
            asked[d] += 1
    if extra:
        step = len(pairs) / extra
        for i in reversed(range(extra)):
            pairs.insert(int(round((i + 1) * step)), (documents + i, 0))
    return Stream([request(d, q) for d, q in pairs])
