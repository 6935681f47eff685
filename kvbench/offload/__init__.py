"""The offload engine: KV caches for transformers, registered by mode name (:mod:`kvbench.offload.modes`).

Knows nothing of scenarios or files: a cache is built from a model config, a device and the mode's options.
``from kvbench.offload import FullOffloadCache, HierarchicalCache, DynamicOffloadCache`` works, and ``KVStore`` (the
reuse store, :mod:`kvbench.offload.store`); the classes (and torch) are imported on first use so that the mode
registry stays cheap to import.
"""

from kvbench.offload.modes import MODES, ModeInfo, ModeUnavailable, make_cache

_CACHES = ("DynamicOffloadCache", "FullOffloadCache", "HierarchicalCache", "OffloadedCache", "kv_bytes")

_STORE = ("KVStore", "Prefix", "StoreWarning")

__all__ = ["MODES", "ModeInfo", "ModeUnavailable", "make_cache", *_CACHES, *_STORE]


def __getattr__(name: str):
    if name in _STORE:
        from kvbench.offload import store

        return getattr(store, name)
    if name in _CACHES:
        from kvbench.offload import caches

        return getattr(caches, name)
    raise AttributeError(f"module 'kvbench.offload' has no attribute {name!r}")
