"""A registry: named entries in the order they were registered, and the error text for a name that is none of them.

One kind for every set of names kvbench looks up by what a person typed: offload modes
(:data:`kvbench.offload.modes.MODES`), architecture presets, engines, scenarios. It lives in ``offload`` because
``offload`` imports nothing else of kvbench and every other package may import it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator, Mapping
from typing import TypeVar

T = TypeVar("T")


class Registry(Mapping[str, T]):
    """Entries by name (a read-only mapping, in registration order) that can word an unknown name.

    Args:
        noun: what an entry is, for messages (``"mode"``, ``"preset"``).
        entries: ``(name, entry)`` pairs or a mapping; a name given twice keeps its last entry.
    """

    def __init__(self, noun: str, entries: Mapping[str, T] | Iterable[tuple[str, T]]):
        self.noun = noun
        self._entries: dict[str, T] = dict(entries)

    def __getitem__(self, name: str) -> T:
        """The entry called ``name``. Raises KeyError for a name that is not registered."""
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        """The registered names, in registration order."""
        return list(self._entries)

    def close(self, name: str, n: int = 1) -> list[str]:
        """Up to ``n`` registered names closest to ``name`` (difflib's ratio ≥ 0.6), best first."""
        return difflib.get_close_matches(name, self.names(), n=n)

    def did_you_mean(self, name: str, n: int = 1, quote: bool = True) -> str:
        """``"did you mean 'x'? "`` for the :meth:`close` names of ``name`` (comma-separated; unquoted with
        ``quote=False``), or ``""`` when none is close."""
        close = [f"'{c}'" if quote else c for c in self.close(name, n)]
        return f"did you mean {', '.join(close)}? " if close else ""

    def unknown(self, name: str) -> str:
        """The error text for a name that is not registered: ``unknown mode 'nonee'; did you mean 'none'?
        available: none, full, ...``."""
        return f"unknown {self.noun} '{name}'; {self.did_you_mean(name)}available: {', '.join(self.names())}"
