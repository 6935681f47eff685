"""Prompts of exactly the requested token count, built from real text, and the pool a sweep draws batches from.

A prompt is whole turns through the model's chat template; the last turn included is trimmed at a token
boundary so the ids number exactly ``n_tokens``. It ends with the generation prompt when that turn is the
user's, or continues the assistant's reply when it is the assistant's (``continue_final_message``).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Any

from kvbench.errors import TooLittleText, WorkloadError
from kvbench.scenario.workload import LANGDETECT_MISSING
from kvbench.workloads.documents import Document

_SENTINEL = "\ue000kvbench-content\ue001"
#: Tokens a chat template may add per turn (role markers, system prompt) when bounding a document's length.
_FRAME_ALLOWANCE = 64


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def _frame(tokenizer: Any, turns: Sequence[tuple[str, str]]) -> tuple[list[int], list[int]]:
    """Token ids of the chat template around the last turn's content: (before it, after it)."""
    msgs = [{"role": r, "content": t} for r, t in turns[:-1]]
    msgs.append({"role": turns[-1][0], "content": _SENTINEL})
    last_is_user = turns[-1][0] != "assistant"
    text = tokenizer.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=last_is_user, continue_final_message=not last_is_user
    )
    before, sep, after = text.partition(_SENTINEL)
    if not sep or _SENTINEL in after:
        raise ValueError("the chat template does not render message content verbatim")
    return _encode(tokenizer, before), _encode(tokenizer, after)


def build_prompt(tokenizer: Any, doc: Document, n_tokens: int, max_turns: int | None = None) -> list[int] | None:
    """Exactly ``n_tokens`` ids from a document, or None when it has too little text.

    With a chat template: the fewest whole turns whose rendering reaches ``n_tokens``, the last one trimmed.
    Without one: the turns' text joined by blank lines, cut at ``n_tokens``.
    """
    turns = doc.turns[:max_turns] if max_turns else doc.turns
    if not turns:
        return None
    if not getattr(tokenizer, "chat_template", None):
        ids = _encode(tokenizer, "\n\n".join(t for _, t in turns))
        return ids[:n_tokens] if len(ids) >= n_tokens else None
    # Token counts of the turns alone bound the rendering from below; the exact check below renders the
    # template. A generous frame allowance only skips documents that cannot reach the length.
    counts = [len(ids) for ids in tokenizer([t for _, t in turns], add_special_tokens=False)["input_ids"]]
    total, first = 0, len(turns)
    for k, c in enumerate(counts, start=1):
        total += c
        if total + _FRAME_ALLOWANCE * (k + 1) >= n_tokens:
            first = k
            break
    else:
        return None
    for k in range(first, len(turns) + 1):
        before, after = _frame(tokenizer, turns[:k])
        room = n_tokens - len(before) - len(after)
        if room < 1:
            return None  # the frame alone reaches the length: no text of this turn would fit
        content = _encode(tokenizer, turns[k - 1][1])
        if len(content) >= room:
            return before + content[:room] + after
    return None


def language_of(text: str) -> str | None:
    """The ISO 639-1 code langdetect gives ``text`` (seeded, so repeatable), or None when it cannot tell.

    Raises:
        kvbench.errors.WorkloadError: langdetect (kvbench's optional ``lang`` extra) is not installed; the
            message gives the command that installs it.
    """
    try:
        from langdetect import DetectorFactory, LangDetectException, detect
    except ImportError:
        raise WorkloadError(f"workload.language {LANGDETECT_MISSING}") from None

    DetectorFactory.seed = 0  # langdetect is random unless seeded
    try:
        return detect(text[:2000])
    except LangDetectException:
        return None


class PromptPool:
    """Distinct prompts per length, drawn lazily from documents in a seeded or longest-first order.

    Args:
        documents: the source texts.
        tokenizer: a transformers tokenizer.
        n_prompts: how many distinct prompts to keep per length.
        seed: order of the documents for ``order='random'``.
        order: ``random`` or ``longest`` (most characters first).
        language: keep documents whose first user text langdetect labels with this ISO 639-1 code.
        max_turns: use at most this many turns of each document.
        source_name: named in errors.
    """

    def __init__(
        self,
        documents: Sequence[Document],
        tokenizer: Any,
        *,
        n_prompts: int,
        seed: int = 0,
        order: str = "random",
        language: str | None = None,
        max_turns: int | None = None,
        source_name: str = "workload",
    ):
        self.tokenizer = tokenizer
        self.n_prompts = n_prompts
        self.language = language
        self.max_turns = max_turns
        self.source_name = source_name
        idx = list(range(len(documents)))
        if order == "longest":
            idx.sort(key=lambda i: (-documents[i].chars, documents[i].id))
        else:
            random.Random(seed).shuffle(idx)
        self._docs = [documents[i] for i in idx]
        self._lang: dict[int, str | None] = {}
        self._pools: dict[int, list[list[int]]] = {}

    def _language_ok(self, i: int) -> bool:
        if self.language is None:
            return True
        if i not in self._lang:
            self._lang[i] = language_of(self._docs[i].turns[0][1]) if self._docs[i].turns else None
        return self._lang[i] == self.language

    def prompts(self, n_tokens: int) -> list[list[int]]:
        """Up to ``n_prompts`` distinct prompts of exactly ``n_tokens`` ids (computed once per length)."""
        if n_tokens not in self._pools:
            pool: list[list[int]] = []
            seen: set[bytes] = set()
            for i, doc in enumerate(self._docs):
                if len(pool) >= self.n_prompts:
                    break
                if not self._language_ok(i):
                    continue
                ids = build_prompt(self.tokenizer, doc, n_tokens, self.max_turns)
                if ids is None:
                    continue
                h = hashlib.sha1(repr(ids).encode()).digest()
                if h not in seen:
                    seen.add(h)
                    pool.append(ids)
            self._pools[n_tokens] = pool
        return self._pools[n_tokens]

    def batch(self, n_tokens: int, batch_size: int, repeat: int) -> list[list[int]]:
        """``batch_size`` distinct prompts of ``n_tokens`` ids; repeat ``r`` rotates on through the pool.

        Raises:
            TooLittleText: fewer distinct prompts of that length than the batch needs.
        """
        pool = self.prompts(n_tokens)
        if len(pool) < batch_size and getattr(self.tokenizer, "chat_template", None):
            before, after = _frame(self.tokenizer, [("user", "x")])
            frame = len(before) + len(after)
            if n_tokens <= frame:
                raise TooLittleText(f"{self.source_name}: the chat template alone takes {frame} tokens around a "
                                    f"user turn; prompt lengths must be above {frame} (got {n_tokens})")
        if len(pool) < batch_size:
            lang = f" in language '{self.language}'" if self.language else ""
            raise TooLittleText(
                f"{self.source_name}: only {len(pool)} of {len(self._docs)} texts{lang} reach {n_tokens} tokens; "
                f"a batch of {batch_size} needs {batch_size} (use shorter prompt_tokens, a smaller batch, "
                f"more text, or order: longest)"
            )
        start = repeat * batch_size
        return [pool[(start + i) % len(pool)] for i in range(batch_size)]
