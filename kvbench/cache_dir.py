"""Where kvbench keeps what it makes once and reuses between commands (the last link probe, exported models):
``$KVBENCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/kvbench``, else ``~/.cache/kvbench``."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """kvbench's cache folder (it may not exist yet): ``$KVBENCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/kvbench``,
    else ``~/.cache/kvbench``."""
    if os.environ.get("KVBENCH_CACHE_DIR"):
        return Path(os.environ["KVBENCH_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvbench"
