"""What a server configuration holds beside the KV it computes with: the size of its host tier as its command line
sets it, and the bytes of the slot files kvbench saved for it on disk. The cost charges them
(:func:`kvbench.analysis.reuse_cost.reuse_cost`), so that a mode which keeps KV in host RAM or on disk pays for it.

Configured sizes come from each kind's own flags, read by its
:attr:`~kvbench.serving.kind.ServerKind.host_tier` (llama.cpp ``--cache-ram`` MiB, vLLM ``--kv-offloading-size``
GiB, SGLang ``--hicache-size`` GB; the last occurrence wins, as the engines parse them).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from kvbench.serving import KINDS


def host_tier(kind: str, argv: Sequence[str] | None) -> tuple[int | None, str]:
    """``(bytes, source)``: the host KV tier a ``kind`` server started with ``argv`` may fill, and where that
    figure comes from (a flag and its value, or why it is not known), as the kind's
    :attr:`~kvbench.serving.kind.ServerKind.host_tier` reads it. ``bytes`` is 0 for a configuration without a
    host tier and None where the flags do not say (a server kvbench did not start)."""
    known = KINDS.get(kind)
    if known is None or not known.started or known.host_tier is None:
        return None, "a server kvbench did not start: its host tier is not known"
    return known.host_tier(list(argv or ()))


def files_bytes(folder: Path | None, names: Iterable[str]) -> int:
    """Bytes of the files ``names`` in ``folder`` (links not followed; a missing file counts 0)."""
    if folder is None:
        return 0
    total = 0
    for name in set(names):
        try:
            total += os.lstat(folder / name).st_size
        except OSError:
            continue
    return total


def tier_tokens(tier_bytes: int | None, kv_bytes_per_token: int) -> int:
    """Tokens of KV a host tier of ``tier_bytes`` holds, at 2 bytes an element (f16: llama.cpp's KV cache type by
    default; bf16: vLLM's and SGLang's on a GPU); ``kv_bytes_per_token``: every layer's K and V of one token at 4
    bytes an element. 0 without a tier or where either size is not known."""
    return int(tier_bytes) * 2 // kv_bytes_per_token if tier_bytes and kv_bytes_per_token else 0


__all__ = ["files_bytes", "host_tier", "tier_tokens"]
