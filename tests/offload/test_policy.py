"""The dynamic mode's window policy, on given sequences of limits and stalls."""

from __future__ import annotations

import pytest

from kvbench.offload.policy import WindowPolicy


def run(policy: WindowPolicy, limits: list[int], stalled: bool = True) -> list[int]:
    return [policy.decide(step, limit, stalled) for step, limit in enumerate(limits)]


def test_shrinks_at_once_with_headroom_then_waits():
    p = WindowPolicy(min_window=512, headroom=0.125, cooldown_steps=8)
    windows = run(p, [400] + [399] * 5)
    assert windows == [350] * 6  # ⌊400 × 0.875⌋, below min_window because the budget is hard
    assert [(e.step, e.old, e.new) for e in p.events] == [(0, 512, 350)]
    assert p.events[0].reason == "device KV would exceed the budget: at most 400 tokens fit"


def test_slowly_falling_limit_shrinks_in_steps_not_every_step():
    p = WindowPolicy(min_window=0, headroom=0.125, cooldown_steps=4)
    p.window = 1000
    limits = list(range(1000, 600, -1))  # the context grows one token per step: the room falls
    run(p, limits)
    assert 1 <= len(p.events) <= 5  # each shrink leaves 12.5% headroom: no change for dozens of steps
    assert all(e.new < e.old for e in p.events)


def test_grows_only_when_stalled_after_cooldown_and_never_flips_back():
    p = WindowPolicy(min_window=100, max_window=800, headroom=0.25, cooldown_steps=3)
    assert run(p, [1000] * 3, stalled=False) == [100, 100, 100]  # transfers hidden: no reason to grow
    p2 = WindowPolicy(min_window=100, max_window=800, headroom=0.25, cooldown_steps=3)
    windows = run(p2, [1000] * 10)
    assert windows[0] == 750 and set(windows) == {750}  # ⌊1000 × 0.75⌋, under max_window
    p3 = WindowPolicy(min_window=100, max_window=600, headroom=0.25, cooldown_steps=3)
    assert run(p3, [1000])[0] == 600  # max_window caps growth
    # alternating limits around the window never make it oscillate: growth waits out the cooldown
    p4 = WindowPolicy(min_window=0, headroom=0.1, cooldown_steps=5)
    p4.window = 500
    run(p4, [490, 600, 490, 600, 490, 600, 490, 600, 490, 600, 490, 600])
    kinds = ["shrink" if e.new < e.old else "grow" for e in p4.events]
    assert kinds == ["shrink"]  # 441 fits under every later limit; 600 × 0.9 = 540 is not 10% more than 441


def test_returns_to_min_window_when_room_comes_back():
    p = WindowPolicy(min_window=512, headroom=0.125, cooldown_steps=2)
    windows = run(p, [300, 300, 300, 2000, 2000], stalled=False)
    assert windows == [262, 262, 262, 262, 512]  # the room must last the 2 cooldown steps
    assert [(e.step, e.old, e.new) for e in p.events] == [(0, 512, 262), (4, 262, 512)]
    assert p.events[1].reason == "room again for min_window"


@pytest.mark.parametrize("kwargs,message", [
    ({"min_window": -1}, "windows must be >= 0 tokens"),
    ({"min_window": 600, "max_window": 500}, "min_window 600 is larger than max_window 500"),
    ({"headroom": 1.0}, r"headroom must be in \[0, 1\), got 1.0"),
    ({"cooldown_steps": -2}, "cooldown_steps must be >= 0, got -2"),
])
def test_bad_bounds_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WindowPolicy(**kwargs)
