"""The offload modes kvbench can run, by name.

Plain data (no torch import) so that `kvbench validate` and `kvbench list modes` stay fast.
The caches themselves are built by :func:`kvbench.offload.caches.make_cache`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass


@dataclass(frozen=True)
class ModeInfo:
    """One registered offload mode.

    Attributes:
        kind: the name used in a scenario's ``modes: [{kind: ...}]``.
        summary: one line on what stays on the device.
        needs_cuda: the mode cannot run without a CUDA device; elsewhere its trials are recorded as
            ``skipped`` with ``skip_reason``.
        skip_reason: why the mode is skipped without CUDA (the error it would raise).
    """

    kind: str
    summary: str
    needs_cuda: bool = False
    skip_reason: str = ""


MODES: dict[str, ModeInfo] = {
    m.kind: m
    for m in (
        ModeInfo("none", "everything on the device: transformers DynamicCache, the baseline for every ratio"),
        ModeInfo(
            "hf-offloaded",
            "transformers' own DynamicCache(offloading=True): ~1-2 layers on the device",
            needs_cuda=True,
            skip_reason="hf-offloaded needs a CUDA device: on CPU-only torch DynamicCache(offloading=True) "
            "raises AssertionError: Torch not compiled with CUDA enabled",
        ),
        ModeInfo("full", "the layer being computed + the one being prefetched; all history on the host"),
        ModeInfo("hierarchical", "the last `window` tokens of every layer; older tokens on the host"),
    )
}

#: Modes the scenario schema knows (with their options) that this version cannot run yet.
PLANNED: dict[str, str] = {
    "dynamic": "a window chosen each step from the budget and measured transfer/compute time",
}


def available() -> list[str]:
    """Names of the modes this version can run, in registry order."""
    return list(MODES)


def unknown_mode_message(kind: str) -> str:
    """The error text for a mode name that is not registered: a did-you-mean and the available names."""
    if kind in PLANNED:
        return f"mode '{kind}' is not implemented in this version of kvbench; available: {', '.join(available())}"
    close = difflib.get_close_matches(kind, available() + list(PLANNED), n=1)
    hint = f"did you mean '{close[0]}'? " if close and close[0] in MODES else ""
    return f"unknown mode '{kind}'; {hint}available: {', '.join(available())}"
