"""The unit every text source yields: a document made of chat turns."""

from __future__ import annotations

from dataclasses import dataclass

#: ShareGPT speaker names → chat-template roles.
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
         "bard": "assistant", "assistant": "assistant", "system": "system"}


@dataclass(frozen=True)
class Document:
    """One conversation or file.

    Attributes:
        id: the record id or file path.
        turns: ``(role, text)`` pairs, roles ``user`` / ``assistant`` / ``system``; consecutive turns of one role
            are merged and leading assistant turns dropped, so roles alternate as chat templates expect.
    """

    id: str
    turns: tuple[tuple[str, str], ...]

    @property
    def chars(self) -> int:
        """Characters of text in all turns."""
        return sum(len(t) for _, t in self.turns)

    @classmethod
    def from_turns(cls, id: str, raw: list[tuple[str, str]]) -> Document:
        """Normalise raw ``(speaker, text)`` pairs (unknown speakers and empty texts are dropped)."""
        turns: list[tuple[str, str]] = []
        for speaker, text in raw:
            role = ROLES.get(str(speaker).lower())
            if role is None or not isinstance(text, str) or not text.strip():
                continue
            if role == "system" and turns:
                role = "user"
            if not turns and role == "assistant":
                continue
            if turns and turns[-1][0] == role:
                turns[-1] = (role, turns[-1][1] + "\n\n" + text)
            else:
                turns.append((role, text))
        return cls(id, tuple(turns))
