"""The requests of a server run as the server engine sees them: a prompt workload as a request stream, what each
request could reuse, and the working set a cache must hold to serve every revisit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvbench.bench.engines.server.session import common_prefix
from kvbench.scenario import Scenario


def reusable_tokens(requests: Sequence[Any]) -> dict[str, int]:
    """Per request id: the most leading prompt tokens any earlier request of the stream held (its ``held`` ids:
    a turn's prompt and reply), i.e. what a server's cache could reuse, in tokens."""
    out: dict[str, int] = {}
    for i, q in enumerate(requests):
        out[q.id] = max((common_prefix(q.ids, p.held) for p in requests[:i]), default=0)
    return out


def by_document(requests: Sequence[Any]) -> dict[str, list[Any]]:
    """``requests`` grouped by their conversation or document, in order."""
    out: dict[str, list[Any]] = {}
    for q in requests:
        out.setdefault(q.document, []).append(q)
    return out


def working_set_tokens(requests: Sequence[Any], followed: set[str]) -> int:
    """The working set of a request stream in tokens: per conversation (document), its longest prompt, with the
    reply held after it where a later turn follows (``followed``: the ids of such requests); the KV a cache must
    keep to serve every revisit from cache."""
    return sum(max(len(q.held) if q.id in followed else len(q.ids) for q in part)
               for part in by_document(requests).values())


def prompt_requests(s: Scenario, source: Any) -> Any:
    """A prompt workload as a request stream: for each of ``prompt_tokens``, ``workload.n_prompts`` prompts of
    exactly that many tokens (requests ``p<N>-i<k>``, each its own document)."""
    from kvbench.workloads.sessions import Request, Stream

    out = []
    for n in s.prompt_tokens:
        for k, ids in enumerate(source.batch(n, s.workload.n_prompts, 0)):
            out.append(Request(f"p{n}-i{k}", f"p{n}-i{k}", 1, tuple(ids), tuple(ids)))
    return Stream(out)
