"""The serving engine kinds kvbench drives, one registry line each; a kind's module declares everything kvbench
knows of it (:class:`~kvbench.serving.kind.ServerKind`: presets, command line, flags, protocol, counters, host
tier). Adding a kind is one module, one line here and a recorded ``/metrics`` fixture (``docs/adding-an-engine.md``).

Sits below :mod:`kvbench.scenario` (which validates ``engine:`` and ``modes:`` against it) and above
:mod:`kvbench.models`.
"""

from __future__ import annotations

from kvbench.offload.registry import Registry
from kvbench.serving import llamacpp, openai, sglang, vllm
from kvbench.serving.kind import CounterSpec, Launch, Preset, ServerKind

#: Every server kind, by ``engine.kind`` (did-you-mean for a wrong one).
KINDS: Registry[ServerKind] = Registry("engine", ((k.name, k) for k in (
    llamacpp.KIND,
    vllm.KIND,
    sglang.KIND,
    openai.KIND,
)))
#: Whose ``/metrics`` names an already running server's text is read with when it shows no kind's prefix.
METRICS_FALLBACK = vllm.NAME


def metrics_kind(text: str) -> str:
    """Whose metric names a ``/metrics`` text uses: the first kind (in registry order) whose
    :attr:`~kvbench.serving.kind.ServerKind.metrics_prefix` it holds, else :data:`METRICS_FALLBACK`."""
    return next((k.name for k in KINDS.values() if k.metrics_prefix and k.metrics_prefix in text),
                METRICS_FALLBACK)


__all__ = ["KINDS", "METRICS_FALLBACK", "CounterSpec", "Launch", "Preset", "ServerKind", "metrics_kind"]
