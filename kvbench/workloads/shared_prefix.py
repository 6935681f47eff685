"""The ``shared_prefix`` reuse workload: cells of prompt length × shared share × working set, on real text cut to
exact token counts (:class:`kvbench.scenario.workload.SharedPrefixSpec`), for the break-even map.

Every prompt is ``prefix + suffix``: the prefix (``round(tokens × shared_pct / 100)`` tokens) is shared by the
``visits`` requests of one prefix, each with a suffix of its own (``tokens − prefix`` tokens). Prefixes and
suffixes are consecutive, non-overlapping spans of one stream of token ids: the first user turns of the source's
documents, each tokenised alone, in the seeded order, separated by a blank line's ids. So no two spans repeat
text, and nothing outside a prefix can be reused. Prompts are raw token ids (no chat template), as in vLLM's
``random`` and ``prefix_repetition`` datasets: the lengths are exact.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kvbench.errors import NotEnoughRequests
from kvbench.scenario.workload import cell_kv_tokens, prefix_tokens
from kvbench.workloads.documents import Document
from kvbench.workloads.sessions import Request, Stream, order_documents


def _token_stream(docs: Sequence[Document], tokenizer: Any, keep: Callable[[Document], bool] | None
                  ) -> Iterator[int]:
    sep = list(tokenizer("\n\n", add_special_tokens=False)["input_ids"])
    for doc in docs:
        text = next((t for r, t in doc.turns if r == "user"), "")
        if not text.strip() or (keep is not None and not keep(doc)):
            continue
        yield from tokenizer(text, add_special_tokens=False)["input_ids"]
        yield from sep


def shared_prefix(docs: Sequence[Document], tokenizer: Any, *, cells: Sequence[tuple[int, int, int]], visits: int,
                  seed: int = 0, order: str = "random", keep: Callable[[Document], bool] | None = None) -> Stream:
    """The requests of ``cells`` (``(prompt tokens, shared_pct, working set)`` each), cell after cell; within a
    cell visit 1 of every prefix, then visit 2, ... (round robin). Request ``s<cell>-p<prefix>-v<visit>`` of
    document ``s<cell>-p<prefix>`` (a prefix's visits are one independent unit), ``turn_index`` the visit, ``cell``
    its cell's index.

    Raises:
        NotEnoughRequests: the source's text gives fewer tokens than the workload needs.
    """
    need = sum(w * (prefix_tokens(n, pct) + visits * (n - prefix_tokens(n, pct))) for n, pct, w in cells)
    stream = _token_stream(order_documents(docs, seed, order), tokenizer, keep)
    pool: list[int] = []
    for tok in stream:
        pool.append(int(tok))
        if len(pool) == need:
            break
    if len(pool) < need:
        raise NotEnoughRequests(f"shared_prefix needs {need:,} tokens of text, the source gives {len(pool):,}; "
                                "lower prompt_tokens, working_set or visits")
    at = 0

    def take(k: int) -> tuple[int, ...]:
        nonlocal at
        at += k
        return tuple(pool[at - k:at])

    requests = []
    for c, (n, pct, w) in enumerate(cells):
        p = prefix_tokens(n, pct)
        prefixes = [take(p) for _ in range(w)]
        for v in range(visits):
            for j in range(w):
                ids = prefixes[j] + take(n - p)
                requests.append(Request(f"s{c}-p{j}-v{v + 1}", f"s{c}-p{j}", v + 1, ids, ids,
                                        shared_prefix_tokens=p, working_set=w, shared_pct=pct, cell=c))
    return Stream(requests, [f"shared_prefix: {len(cells)} cells, {len(requests)} requests, {need:,} tokens of text"])


def cell_tokens(requests: Sequence[Request], unit: int) -> dict[int, int]:
    """Per cell index of a ``shared_prefix`` stream's ``requests``: the KV tokens its requests hold once all ran,
    in units of ``unit`` tokens (:func:`~kvbench.scenario.workload.cell_kv_tokens`; visits: its requests ÷ its
    prefixes). Empty for a stream without cells."""
    cells: dict[int, list[Request]] = {}
    for q in requests:
        if q.cell is not None:
            cells.setdefault(q.cell, []).append(q)
    return {c: cell_kv_tokens(len(qs[0].ids), qs[0].shared_prefix_tokens, qs[0].working_set,
                              len(qs) // qs[0].working_set, unit) for c, qs in cells.items()}
