"""The offload engine: KV caches for transformers, registered by mode name.

Knows nothing of scenarios or files: a cache is built from a model config, a device and the mode's options.
"""

from kvbench.offload.registry import MODES, ModeInfo, available

__all__ = ["MODES", "ModeInfo", "available"]
