"""The offload modes kvbench can run, by name.

Plain data (no torch import) so that `kvbench validate` and `kvbench list modes` stay fast.
The caches themselves are built by :func:`kvbench.offload.caches.make_cache`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass


#: Tokens per block of the disk tier: the host tier spills its oldest tokens to disk in whole blocks, so a host
#: cap (``host_max_tokens``) must hold at least one block.
DISK_BLOCK_TOKENS = 16

#: Windows under this many tokens make ``kvbench validate`` warn: every step moves most of the history (churn).
SMALL_WINDOW_TOKENS = 256


@dataclass(frozen=True)
class ModeInfo:
    """One registered offload mode.

    Attributes:
        kind: the name used in a scenario's ``modes: [{kind: ...}]``.
        summary: one line on what stays on the device.
        needs_cuda: the mode cannot run without a CUDA device; elsewhere its trials are recorded as
            ``skipped`` with ``skip_reason``.
        host_tier: the mode is one of kvbench's offload caches (a host tier, optional disk tier, own accounting).
        skip_reason: why the mode is skipped without CUDA (the error it would raise).
    """

    kind: str
    summary: str
    needs_cuda: bool = False
    skip_reason: str = ""
    host_tier: bool = False


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
        ModeInfo("full", "the layer being computed + the one being prefetched; all history on the host",
                 host_tier=True),
        ModeInfo("hierarchical", "the last `window` tokens of every layer; older tokens on the host", host_tier=True),
        ModeInfo("dynamic", "a window chosen each step from the budget, grown while transfers stall compute",
                 host_tier=True),
    )
}


def available() -> list[str]:
    """Names of the modes this version can run, in registry order."""
    return list(MODES)


def unknown_mode_message(kind: str) -> str:
    """The error text for a mode name that is not registered: a did-you-mean and the available names."""
    close = difflib.get_close_matches(kind, available(), n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return f"unknown mode '{kind}'; {hint}available: {', '.join(available())}"
