"""What keeps a server scenario's comparisons from a verdict, said before it runs: too few independent units at a
concurrency above 1 (a whole load is one unit there), and servers kvbench did not start, which begin a mode's later
repeats (and levels) warm unless reset. Both give "inconclusive" after the run; ``validate`` says so first."""

from __future__ import annotations

from kvbench.scenario.schema import Scenario
from kvbench.serving import KINDS

#: Independent units a verdict needs (kvbench.analysis.intervals.MIN_PAIRS).
MIN_UNITS = 5


def server_verdict_warnings(s: Scenario) -> list[tuple[str, str]]:
    """``(key path, message)`` pairs: a concurrency level above 1 with fewer than :data:`MIN_UNITS` repeats (its
    requests overlap, so each repeat's load is one unit and that level gets no verdict); a running server (kind
    ``openai``, ``cold: check``) measured by more than one repeat or level, whose later ones begin with what the
    server kept."""
    out: list[tuple[str, str]] = []
    over = [level for level in s.load_spec.levels if level > 1]
    if over and s.repeats < MIN_UNITS:
        out.append(("repeats", f"{s.repeats}: at concurrency {', '.join(map(str, over))} requests overlap, so a "
                               f"repeat's whole load is one independent unit and a verdict needs {MIN_UNITS}: "
                               f"those levels will be inconclusive (repeats: {MIN_UNITS}, or {MIN_UNITS} runs "
                               "given to `kvbench cost` together)"))
    kind = KINDS.get(s.engine.kind)
    runs = s.repeats * len(s.load_spec.levels)
    if kind is not None and not kind.started and s.engine.cold_start == "check" and runs > 1:
        out.append(("engine.cold", f"kvbench starts nothing for kind {s.engine.kind}: of each mode's {runs} repeats "
                                   "and levels on a running server only the first can begin cold, and the others "
                                   "get no verdict (a warm start); restart the servers before each run with "
                                   "repeats: 1 and one level, and give all the runs to `kvbench cost` together, or "
                                   "set cold: reset with the engine's reset_path"))
    return out


__all__ = ["MIN_UNITS", "server_verdict_warnings"]
