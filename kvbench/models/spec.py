"""What the model loaders read of a scenario's ``model:`` section, as a protocol: the scenario's ``ModelSpec``
(:class:`kvbench.scenario.schema.ModelSpec`, a pydantic model) has these attributes, so ``models`` needs nothing
of ``scenario`` (which sits above it and imports it)."""

from __future__ import annotations

from typing import Any, Protocol


class ModelRef(Protocol):
    """A model to read or load.

    Attributes:
        name: a local model directory, a GGUF file, a cached hub id or a kvbench alias (``smollm2-135m``); None with
            ``preset`` or ``config``.
        preset: an architecture shipped with kvbench (its config.json), or None.
        config: a transformers config.json path, or None.
        weights: ``pretrained`` (from ``name``) or ``random`` (from the config).
        dtype: ``auto`` or a torch dtype's name (``float32``, ``bfloat16``...).
        trust_remote_code: whether a model's own Python code may run.
        tokenizer: the tokenizer to use when the model has none (random weights), or None.
    """

    name: str | None
    preset: str | None
    config: str | None
    weights: str
    dtype: str
    trust_remote_code: bool
    tokenizer: str | None

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False) -> ModelRef:
        """A copy with ``update``'s fields replaced (pydantic's)."""
        ...
