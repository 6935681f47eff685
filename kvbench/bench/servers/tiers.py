"""What a server configuration holds beside the KV it computes with: the size of its host tier as its command line
sets it, and the bytes of the slot files kvbench saved for it on disk. The cost charges them
(:func:`kvbench.analysis.reuse_cost.reuse_cost`), so that a mode which keeps KV in host RAM or on disk pays for it.

Configured sizes, from each engine's own flags (the last occurrence wins, as the engines parse them):

- llama.cpp ``--cache-ram N`` / ``-cram N``: MiB of host RAM for idle slots' prompt caches; 8192 when absent
  (``common_params::cache_ram_mib``), 0 = off, -1 = no limit (unknown from the flags);
- vLLM ``--kv-offloading-size N``: GiB of host RAM for the native CPU offloading tier (with
  ``--kv-offloading-backend``); LMCache's size is in its own configuration (unknown from the flags);
- SGLang ``--hicache-size N``: GB (10⁹ bytes) of host memory for HiCache, overriding ``--hicache-ratio``; with only
  a ratio the size depends on the device pool (unknown from the flags).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

MIB, GIB = 2**20, 2**30
#: llama-server's ``--cache-ram`` when the command line does not set it (MiB; ``common/common.h``).
LLAMA_CACHE_RAM_DEFAULT_MIB = 8192


def last_value(argv: Sequence[str], flags: Iterable[str]) -> str | None:
    """The value of the last of ``flags`` in ``argv`` (``--flag v`` or ``--flag=v``), or None."""
    names, found = set(flags), None
    for i, a in enumerate(argv):
        name, eq, value = a.partition("=")
        if name in names:
            found = value if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return found


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def host_tier(kind: str, argv: Sequence[str] | None) -> tuple[int | None, str]:
    """``(bytes, source)``: the host KV tier a server started with ``argv`` may fill, and where that figure comes
    from (a flag and its value, or why it is not known). ``bytes`` is 0 for a configuration without a host tier
    and None where the flags do not say (``openai``: a server kvbench did not start)."""
    argv = list(argv or ())
    if kind == "llama.cpp":
        given = last_value(argv, ("--cache-ram", "-cram"))
        mib = _number(given) if given is not None else float(LLAMA_CACHE_RAM_DEFAULT_MIB)
        if mib is None:
            return None, f"--cache-ram {given}: not a number of MiB, the size is not known from the flags"
        if mib < 0:
            return None, f"--cache-ram {given}: no limit, the size is not known from the flags"
        default = "" if given is not None else " (llama-server's default)"
        return (int(mib * MIB), f"--cache-ram {mib:g} MiB{default}") if mib else (0, "--cache-ram 0: no host tier")
    if kind == "vllm":
        if any(a.startswith("--kv-transfer-config") for a in argv):
            return None, "a KV connector (--kv-transfer-config): its host size is in its own configuration"
        if last_value(argv, ("--kv-offloading-backend",)) is None and last_value(argv, ("--kv-offloading-size",)) \
                is None:
            return 0, "no --kv-offloading-size: no host tier"
        gib = _number(last_value(argv, ("--kv-offloading-size",)))
        return (int(gib * GIB), f"--kv-offloading-size {gib:g} GiB") if gib is not None else (
            None, "--kv-offloading-backend without --kv-offloading-size: not known from the flags")
    if kind == "sglang":
        if "--enable-hierarchical-cache" not in argv:
            return 0, "no --enable-hierarchical-cache: no host tier"
        gb = _number(last_value(argv, ("--hicache-size",)))
        if gb:
            return int(gb * 1e9), f"--hicache-size {gb:g} GB"
        ratio = last_value(argv, ("--hicache-ratio",))
        return None, f"--hicache-ratio {ratio}: a multiple of the device pool, not known from the flags"
    return None, "a server kvbench did not start: its host tier is not known"


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


__all__ = ["LLAMA_CACHE_RAM_DEFAULT_MIB", "files_bytes", "host_tier", "last_value"]
