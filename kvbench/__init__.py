"""kvbench: measure what KV-cache offload really does for a model, a machine and a workload."""

__version__ = "0.1.0"
