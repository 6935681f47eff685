"""Engines: what runs one trial for the sweep. :mod:`~kvbench.bench.engines.base` declares the seam (the
:class:`~kvbench.bench.engines.base.Engine` protocol and what it hands back); the first engine is
:mod:`~kvbench.bench.engines.transformers` (in-process, kvbench's own offload caches)."""
