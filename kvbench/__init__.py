"""kvbench: measure what KV-cache offload really does for a model, a machine and a workload."""

from kvbench.version import __version__

__all__ = ["__version__"]
