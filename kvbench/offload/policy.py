"""The ``dynamic`` mode's window policy: how many tokens per layer stay on the device, chosen each step.

Pure Python (no torch): the cache measures, the policy decides, so the decisions can be tested on given sequences.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass

#: The smallest window (tokens per layer) the policy keeps while the budget allows it, unless told otherwise: the
#: article's 512.
MIN_WINDOW = 512


@dataclass(frozen=True)
class WindowEvent:
    """One change of the window: at decode ``step`` (0 = the prefill), from ``old`` to ``new`` tokens."""

    step: int
    old: int
    new: int
    reason: str

    def as_dict(self) -> dict:
        """The event as a plain dict (for trials.jsonl)."""
        return asdict(self)


class WindowPolicy:
    """Chooses the window each step from the room the budget leaves, with hysteresis so it never oscillates.

    Each step the cache reports ``limit``, the largest window (tokens per layer) whose device KV stays within the
    budget for this step, and ``stalled``, whether compute waited for a host→device copy in the previous step
    (transfers not hidden behind compute). Then:

    - **shrink** at once when ``window > limit``, to ``max(min_window, ⌊limit·(1 − headroom)⌋)`` if that fits,
      else to ``⌊limit·(1 − headroom)⌋`` (the budget is a hard limit, below ``min_window`` too): the headroom keeps
      the next shrink from being due at the very next step as the context grows;
    - **grow** when compute stalled, at least ``cooldown_steps`` after the last change, and the room allows a window
      at least ``headroom`` (fraction) larger: to ``min(max_window, ⌊m·(1 − headroom)⌋)`` where ``m`` is the
      smallest limit of the last ``cooldown_steps`` steps, so a grow is never followed by a shrink unless the
      room falls below anything seen in that time;
    - a window forced under ``min_window`` goes back up to ``min_window`` (at most ``⌊limit·(1 − headroom)⌋``)
      once the cooldown has passed, stall or not.

    Args:
        min_window: the smallest window the policy chooses while the budget allows it (tokens; :data:`MIN_WINDOW`).
        max_window: the largest window (tokens); None = no cap but the budget.
        headroom: fraction of the limit left free after a change (0 ≤ headroom < 1).
        cooldown_steps: steps after a change before the window may grow again.

    Raises:
        ValueError: negative windows, ``min_window > max_window``, headroom outside [0, 1), negative cooldown.
    """

    def __init__(self, min_window: int = MIN_WINDOW, max_window: int | None = None, headroom: float = 0.125,
                 cooldown_steps: int = 8):
        if min_window < 0 or (max_window is not None and max_window < 0):
            raise ValueError("windows must be >= 0 tokens")
        if max_window is not None and min_window > max_window:
            raise ValueError(f"min_window {min_window} is larger than max_window {max_window}")
        if not 0 <= headroom < 1:
            raise ValueError(f"headroom must be in [0, 1), got {headroom}")
        if cooldown_steps < 0:
            raise ValueError(f"cooldown_steps must be >= 0, got {cooldown_steps}")
        self.min_window = min_window
        self.max_window = max_window
        self.headroom = headroom
        self.cooldown_steps = cooldown_steps
        self.window = min_window if max_window is None else min(min_window, max_window)
        self.last_change: int | None = None
        self.events: list[WindowEvent] = []
        self._recent: deque[int] = deque(maxlen=max(1, cooldown_steps))

    def _cap(self, w: int) -> int:
        return w if self.max_window is None else min(w, self.max_window)

    def _change(self, step: int, new: int, reason: str) -> int:
        self.events.append(WindowEvent(step, self.window, new, reason))
        self.window, self.last_change = new, step
        return new

    def decide(self, step: int, limit: int, stalled: bool) -> int:
        """The window for ``step``, given the budget's ``limit`` (tokens per layer, ≥ 0) and whether compute
        stalled on transfers in the previous step; records a :class:`WindowEvent` when it changes."""
        limit = max(0, limit)
        self._recent.append(limit)
        target = self._cap(int(limit * (1 - self.headroom)))
        if self.window > limit:
            new = max(self.min_window, target)
            new = new if new <= limit else target
            return self._change(step, new, f"device KV would exceed the budget: at most {limit} tokens fit")
        cooled = self.last_change is None or step - self.last_change >= self.cooldown_steps
        if not cooled:
            return self.window
        target = self._cap(int(min(self._recent) * (1 - self.headroom)))  # grow only into room that lasted
        if self.window < self.min_window and target > self.window:
            return self._change(step, min(self.min_window, target), "room again for min_window")
        if stalled and target >= self.window * (1 + self.headroom) and target > self.window:
            return self._change(step, target, "compute waited for transfers and the budget has room")
        return self.window
