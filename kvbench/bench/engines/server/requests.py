"""The requests of a server run as the server engine sees them: a prompt workload as a request stream, what each
request could reuse, and the working set a cache must hold to serve every revisit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvbench.bench.engines.server.session import common_prefix


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
