"""What keeps a server scenario's comparisons from a verdict, or from being the comparison they are named, said
before it runs: too few independent units at a concurrency above 1 (a whole load is one unit there); servers
kvbench did not start, which begin a mode's later repeats (and levels) warm unless reset; and a tier saving whose
baseline is not prefix caching with the tier off, or whose tier mode has its tier off."""

from __future__ import annotations

from kvbench.scenario.schema import Scenario
from kvbench.scenario.servers import mode_flags, preset_of
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
    return out + _baseline_warnings(s)



def _baseline_warnings(s: Scenario) -> list[tuple[str, str]]:
    """A tier saving that would not be the tier's: the prefix-cache mode (its baseline) with prefix caching turned
    off (the ``none`` preset's own flag or request option) or a host tier of its own; a tier mode whose flags turn
    its tier off (a host tier of 0 bytes); an ``openai`` tier mode at engine.url itself."""
    kind = KINDS.get(s.engine.kind)
    if kind is None or kind.prefix_preset is None:
        return []
    base, cold = kind.presets[kind.prefix_preset], next((p for p in kind.presets.values() if p.cold), None)
    off_flags = {a for a in (cold.args if cold else ()) if a.startswith("-") and a not in base.args}
    off_request = {k: v for k, v in (cold.request if cold else {}).items() if base.request.get(k) != v}
    out = []
    first = next((i for i, m in enumerate(s.modes) if preset_of(s.engine.kind, m).name == base.name), None)
    for i, m in enumerate(s.modes):
        p = preset_of(s.engine.kind, m)
        argv, request = mode_flags(s, m)
        tier = kind.host_tier(argv) if kind.host_tier is not None and kind.started else (None, "")
        if i == first:  # an off flag counts where no flag of the prefix-cache preset comes after it
            on = max((j for j, a in enumerate(argv) if a.startswith("-") and a in base.args), default=-1)
            off = [a for j, a in enumerate(argv) if a.split("=")[0] in off_flags and j > on] + [
                f"{k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in off_request.items()
                if request.get(k) == v]
            if off:
                out.append((f"modes[{i}]", f"{m.name} is the tier saving's baseline (prefix caching, tier off) but "
                                           f"turns prefix caching off ({', '.join(off)}): a tier saving against it "
                                           "is a reuse saving"))
            elif tier[0]:
                out.append((f"modes[{i}]", f"{m.name} is the tier saving's baseline (prefix caching, tier off) but "
                                           f"has a host tier of its own ({tier[1]}): a tier saving against it is "
                                           "not one against prefix caching alone"))
        elif p.tier == "host" and tier[0] == 0:
            out.append((f"modes[{i}]", f"{m.name} is a host tier mode whose flags turn its tier off ({tier[1]}): its "
                                       "tier saving would be prefix caching against itself"))
        elif p.tier is not None and not kind.started and (m.url or "").rstrip("/") == (s.engine.url or "").rstrip("/"):
            out.append((f"modes[{i}].url", f"{m.url} is engine.url: the tier mode would measure the same server as "
                                           "its baseline; give the deployment with the tier on"))
    return out


__all__ = ["MIN_UNITS", "server_verdict_warnings"]
