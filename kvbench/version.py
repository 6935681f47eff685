"""The version of kvbench (one place; the root package and run.json read it here)."""

__version__ = "0.1.0"
