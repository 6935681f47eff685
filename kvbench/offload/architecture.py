"""A decoder-only transformer's architecture as kvbench models it, and the KV bytes it takes.

The one model of a model's sizes: ``kvbench plan`` (KV per sequence, weights, placement per mode), the run-time
predictions (``kv_bytes_predicted``, plan's predictions in each trial row), the scenario checks (context limit,
store caps, host preflight) and the KV store's bytes per token all read an :class:`Architecture` built by
:func:`architecture_of`. Its layer windows are the ones the offload caches build their layers from
(:func:`kvbench.offload.layer_types.layer_windows`), so the formulas here count what the caches hold.

The dtype is no field: the same architecture is planned at fp16, bf16 or fp8 (``kvbench plan --dtype``) and run at
float32 on a CPU, so each formula takes the bytes per element. Sizes are bytes, lengths tokens. Imports nothing but
:mod:`kvbench.offload.layer_types`, and reads only the config object it is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvbench.offload.layer_types import layer_windows, tokens_held

#: Config fields :func:`architecture_of` needs (transformers' names, attribute maps such as GPT-2's applied).
REQUIRED_FIELDS = ("num_hidden_layers", "num_attention_heads", "hidden_size", "vocab_size")


@dataclass(frozen=True)
class Architecture:
    """The numbers of a decoder-only transformer that set its KV and weights bytes, read from its config.

    Attributes:
        windows: per decoder layer, its sliding window in tokens, or None for full attention
            (:func:`~kvbench.offload.layer_types.layer_windows`: Mistral v0.1 slides every layer, Gemma-2 every
            other one).
        kv_heads: key/value heads per layer (grouped-query attention: fewer than ``heads``).
        head_dim: elements per head.
        heads: attention (query) heads per layer.
        hidden: hidden size (elements).
        intermediate: the MLP's intermediate size (elements), None when the config gives none (GPT-2's
            ``n_inner``): then :attr:`parameters` cannot be counted.
        vocab_size: tokens in the vocabulary.
        max_positions: max_position_embeddings (tokens), 0 when the config gives none.
        model_type: transformers' model_type ("" when the config names none).
        tied: the LM head shares the embeddings' weights.
        qkv_bias: the q/k/v projections have biases (Qwen2, or ``attention_bias``).
        norms_per_layer: RMSNorms per decoder layer (2; 4 in Gemma-2 and Gemma-3).
    """

    windows: tuple[int | None, ...]
    kv_heads: int
    head_dim: int
    heads: int
    hidden: int
    intermediate: int | None
    vocab_size: int
    max_positions: int
    model_type: str
    tied: bool
    qkv_bias: bool
    norms_per_layer: int

    @property
    def layers(self) -> int:
        """Decoder layers holding a K/V cache."""
        return len(self.windows)

    @property
    def full_layers(self) -> int:
        """Layers with full attention (the ones an offload mode moves to the host)."""
        return sum(w is None for w in self.windows)

    def token_layer_bytes(self, dtype_bytes: int) -> int:
        """K and V bytes of one token in one layer: 2 × kv_heads × head_dim × dtype bytes."""
        return 2 * self.kv_heads * self.head_dim * dtype_bytes

    def kv_bytes(self, tokens: int, dtype_bytes: int) -> int:
        """KV bytes one sequence's attention reads at a step with ``tokens`` tokens (the new one included):
        Σ over layers of 2 × kv_heads × head_dim × dtype bytes × min(tokens, window), window = the layer's sliding
        window or ``tokens`` (a sliding layer's cache keeps ``window - 1`` and the step's query adds one)."""
        per = self.token_layer_bytes(dtype_bytes)
        return sum(per * (tokens if w is None else min(tokens, w)) for w in self.windows)

    def sliding_kv_bytes(self, tokens: int, dtype_bytes: int) -> int:
        """:meth:`kv_bytes` of the sliding-window layers only (they stay on the device)."""
        per = self.token_layer_bytes(dtype_bytes)
        return sum(per * min(tokens, w) for w in self.windows if w is not None)

    def cached_kv_bytes(self, tokens: int, dtype_bytes: int) -> int:
        """KV bytes a cache holds for one sequence after ``tokens`` tokens went through it: Σ over layers of
        2 × kv_heads × head_dim × dtype bytes × :func:`~kvbench.offload.layer_types.tokens_held` (every token in
        a full-attention layer; the last ``window - 1`` in a sliding one, as transformers'
        ``DynamicSlidingWindowLayer`` keeps). The offload caches' ``stored_bytes`` for a batch of one.

        Raises:
            ValueError: negative ``tokens``.
        """
        per = self.token_layer_bytes(dtype_bytes)
        return sum(per * tokens_held(tokens, w) for w in self.windows)

    def host_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V bytes one token takes in the host (and disk) tier: full-attention layers only, since
        sliding-window layers never leave the device: full_layers × 2 × kv_heads × head_dim × dtype bytes."""
        return self.full_layers * self.token_layer_bytes(dtype_bytes)

    def sequence_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V bytes of one token in every layer: layers × 2 × kv_heads × head_dim × dtype bytes (131,072 for
        Llama-3.1-8B in bf16). What the KV store keeps per token: it stores each layer's whole sequence (and
        refuses sliding-window layers, :func:`kvbench.offload.cache_kv.sequence_kv`)."""
        return self.layers * self.token_layer_bytes(dtype_bytes)

    @property
    def parameters(self) -> int:
        """Parameter count from the config: embeddings (+ LM head unless tied), per layer q/k/v/o projections
        (+ q/k/v biases), a gated MLP (gate, up, down) and its norms, and the final norm; within a fraction of a
        percent of the published counts (8,030,261,248 for Llama-3.1-8B).

        Raises:
            ValueError: the config gave no intermediate size.
        """
        if self.intermediate is None:
            raise ValueError("the config has no intermediate_size: the parameter count needs it")
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = self.hidden * q + 2 * self.hidden * kv + q * self.hidden + ((q + 2 * kv) if self.qkv_bias else 0)
        mlp = 3 * self.hidden * self.intermediate
        per_layer = attn + mlp + self.norms_per_layer * self.hidden
        embed = self.vocab_size * self.hidden * (1 if self.tied else 2)
        return embed + self.layers * per_layer + self.hidden


def architecture_of(config: Any) -> Architecture:
    """The :class:`Architecture` of a transformers config (its text config for multimodal ones), or of any object
    with the same fields (kvbench's light reading of config.json, :func:`kvbench.models.config.read_config`).

    ``kv_heads`` defaults to ``heads`` and ``head_dim`` to hidden ÷ heads where the config gives none, as
    transformers' attention does.

    Raises:
        ValueError: a config without one of :data:`REQUIRED_FIELDS` (naming them), or with layer types kvbench
            cannot model (see :func:`~kvbench.offload.layer_types.layer_windows`).
    """
    c = config.get_text_config() if hasattr(config, "get_text_config") else config
    missing = [k for k in REQUIRED_FIELDS if getattr(c, k, None) is None]
    if missing:
        raise ValueError(f"the config has no {', '.join(missing)}")
    heads = c.num_attention_heads
    model_type = getattr(c, "model_type", None) or ""
    return Architecture(
        windows=layer_windows(config),  # as transformers' DynamicCache reads them (Mistral v0.1: every layer slides)
        kv_heads=getattr(c, "num_key_value_heads", None) or heads,
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads,
        heads=heads,
        hidden=c.hidden_size,
        intermediate=getattr(c, "intermediate_size", None),
        vocab_size=c.vocab_size,
        max_positions=getattr(c, "max_position_embeddings", None) or 0,
        model_type=model_type,
        tied=bool(getattr(c, "tie_word_embeddings", False)),
        qkv_bias=model_type.startswith("qwen2") or bool(getattr(c, "attention_bias", False)),
        norms_per_layer=4 if model_type.startswith(("gemma2", "gemma3")) else 2,
    )


def hadamard_fits(head_dim: int) -> bool:
    """Whether a mode's ``hadamard: true`` can rotate heads of ``head_dim`` elements: the Sylvester Hadamard matrix
    :func:`kvbench.offload.host_tiers.hadamard_matrix` builds exists only for a power of two."""
    return head_dim >= 1 and not head_dim & (head_dim - 1)


__all__ = ["REQUIRED_FIELDS", "Architecture", "architecture_of", "hadamard_fits"]
