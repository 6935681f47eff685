"""The in-process engine's KV stores for reuse workloads: one per mode (fresh per repeat and per ``shared_prefix``
cell), made as the scenario's ``store:`` says, holding K/V in the mode's host formats."""

from __future__ import annotations

from typing import Any

from kvbench.offload.modes import host_formats
from kvbench.offload.store import KVStore
from kvbench.scenario import Scenario


def make_store(s: Scenario, shape: Any, dtype: Any, options: dict[str, Any] | None = None) -> KVStore:
    """A fresh KV store for one mode, as ``s.store_spec`` says, holding K/V in the host formats the mode's
    ``options`` name (``host_dtype``...; the model's ``dtype`` by default); ``shape``: the model's architecture.

    Raises:
        ValueError: a cap smaller than one chunk of ``token_bytes`` × ``chunk_tokens``.
        kvbench.offload.tiers.DiskTierError: the disk tier's directory cannot be made.
    """
    spec = s.store_spec
    return KVStore(spec.chunk_tokens, int(spec.host_max_bytes), int(spec.disk_max_bytes), s.disk_dir,
                   token_bytes=store_token_bytes(shape, dtype, options), page_cache=s.disk.page_cache,
                   formats=_store_formats(options))


def _store_formats(options: dict[str, Any] | None) -> Any:
    from kvbench.offload.host_tiers import HostFormat

    return host_formats(options or {}) or (HostFormat(), HostFormat())


def store_token_bytes(shape: Any, dtype: Any, options: dict[str, Any] | None = None) -> int:
    """Bytes one token takes in a mode's KV store, every layer, in the host formats its ``options`` name (scales
    included; :meth:`~kvbench.offload.architecture.Architecture.sequence_bytes_per_token` in the model's dtype)."""
    return shape.layers * sum(f.token_bytes(shape.kv_heads, shape.head_dim, dtype) for f in _store_formats(options))


__all__ = ["make_store", "store_token_bytes"]
