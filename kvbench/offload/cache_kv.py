"""A cache's KV in and out, for the reuse store (:mod:`kvbench.offload.store`): :func:`sequence_kv` reads every
token's K and V a cache holds, over all its tiers; :func:`restore` loads a stored prefix into an empty cache of any
mode through the cache's own ``update``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from kvbench.offload.store import Prefix


def sequence_kv(cache: Any, row: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """K and V of every token a cache holds for batch row ``row``, per layer ``[kv_heads, tokens, head_dim]`` on
    the CPU (all tiers of kvbench's offload caches: disk, host, then the device window), ready for
    :meth:`kvbench.offload.store.KVStore.put`.

    Raises:
        ValueError: an empty cache, or a sliding-window layer (it keeps only its last tokens: its KV cannot be
            restored for a longer prompt).
    """
    from kvbench.offload.layers import OffloadedLayer

    keys, values = [], []
    for i, layer in enumerate(cache.layers):
        if getattr(layer, "sliding_window", None):
            raise ValueError(f"layer {i} is a sliding-window layer: its KV cannot be stored for reuse")
        if not getattr(layer, "is_initialized", False):
            raise ValueError(f"layer {i} holds no KV")
        k, v = layer.keys[row].cpu(), layer.values[row].cpu()
        if isinstance(layer, OffloadedLayer) and layer.keys_history.length:
            k = torch.cat([layer.keys_history.view(layer.engine)[row].cpu(), k], dim=-2)
            v = torch.cat([layer.values_history.view(layer.engine)[row].cpu(), v], dim=-2)
        keys.append(k)
        values.append(v)
    return keys, values


def restore(cache: Any, prefix: Prefix, device: Any, dtype: torch.dtype | None = None) -> None:
    """Load a restored prefix into an empty cache of any mode, batch 1, through the cache's own ``update`` — the
    path a prefill's K/V take — so each mode places it in its tiers (``none``: the device; ``full``,
    ``hierarchical``, ``dynamic``: their windows, host and disk). Then prefill only the tokens after
    ``prefix.tokens``, at positions ``prefix.tokens`` onwards.

    Raises:
        ValueError: the cache already holds tokens, or the prefix has another number of layers.
    """
    if cache.get_seq_length() != 0:
        raise ValueError(f"restore needs an empty cache (it holds {cache.get_seq_length()} tokens)")
    if prefix.tokens == 0:
        return
    if len(prefix.keys) != len(cache.layers):
        raise ValueError(f"the prefix has {len(prefix.keys)} layers, the cache {len(cache.layers)}")
    for i, (k, v) in enumerate(zip(prefix.keys, prefix.values)):
        cache.update(k[None].to(device, dtype), v[None].to(device, dtype), i)


__all__ = ["restore", "sequence_kv"]
