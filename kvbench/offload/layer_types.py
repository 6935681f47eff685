"""Which layers of a model slide over a window of tokens, read from its config as transformers reads it, and how
many tokens such a layer's cache holds.

The one place kvbench resolves layer types: the offload caches (which layers stay on the device), ``kvbench plan``
and the run-time KV prediction all use :func:`layer_windows`. Imports nothing but the config object it is given.
"""

from __future__ import annotations

from typing import Any

#: Layer types whose cache transformers' ``DynamicCache`` builds as a ``DynamicLayer`` (every token kept).
FULL_TYPES = ("full_attention",)
#: Layer types whose cache is a ``DynamicSlidingWindowLayer`` (transformers' ``DYNAMIC_LAYER_TYPE_MAPPING``:
#: "from a cache point of view, sliding and chunked are the same"), with the config field giving its window.
WINDOW_FIELDS = {"sliding_attention": "sliding_window", "chunked_attention": "attention_chunk_size"}


def _decoder_config(config: Any) -> Any:
    if hasattr(config, "get_text_config"):
        try:
            return config.get_text_config(decoder=True)
        except TypeError:  # a config object whose get_text_config takes no arguments
            return config.get_text_config()
    return config


def layer_windows(config: Any) -> tuple[int | None, ...]:
    """Per decoder layer, its sliding window in tokens, or None for full attention.

    Resolved exactly as transformers 5.24 builds ``DynamicCache(config=...)``
    (``transformers/cache_utils.py``: ``DynamicCache.__init__`` → ``get_layer_types_and_kwargs``):

    - the decoder text config (``config.get_text_config(decoder=True)``);
    - its ``layer_types`` when set; the model configs fill them in ``__post_init__``: Gemma-2 alternates
      ``sliding_attention`` (even layers) and ``full_attention``; Qwen2 sets ``sliding_window = None`` unless
      ``use_sliding_window``, then slides layers ``i >= max_window_layers``;
    - without ``layer_types`` (Mistral), per layer: ``sliding_attention`` if ``sliding_window`` is not None, else
      ``chunked_attention`` if ``attention_chunk_size`` is not None, else ``full_attention``; per-layer values are
      read from ``config.per_layer_config`` (heterogeneous configs) where transformers has it;
    - a ``sliding_attention`` layer's window is that layer config's ``sliding_window``, a ``chunked_attention``
      one's its ``attention_chunk_size``.

    Returns:
        One entry per layer (``num_hidden_layers`` of them): an int (tokens) or None.

    Raises:
        ValueError: a layer type without a per-token K/V cache kvbench can model (linear attention, KV-shared
            ``dummy``, indexed or compressed attention: transformers' ``DynamicCache`` gives them other layer
            classes), or a sliding/chunked layer whose config gives no positive window.
    """
    c = _decoder_config(config)
    n = c.num_hidden_layers
    per_layer = getattr(c, "per_layer_config", None)
    layer_configs = list(per_layer) if per_layer is not None else [c] * n
    types = getattr(c, "layer_types", None)
    if types is None:
        types = ["sliding_attention" if getattr(lc, "sliding_window", None) is not None
                 else "chunked_attention" if getattr(lc, "attention_chunk_size", None) is not None
                 else "full_attention" for lc in layer_configs]
    sharing = getattr(c, "kv_sharing_modes", None)
    if sharing is not None:
        types = ["dummy" if mode == "reuse" else t for t, mode in zip(types, sharing)]
    windows: list[int | None] = []
    for i, (t, lc) in enumerate(zip(types, layer_configs)):
        if t in FULL_TYPES:
            windows.append(None)
        elif t in WINDOW_FIELDS:
            w = getattr(lc, WINDOW_FIELDS[t], None)
            if not isinstance(w, int) or isinstance(w, bool) or w < 1:
                raise ValueError(f"layer {i} is {t} but the config's {WINDOW_FIELDS[t]} is {w!r}, not a window "
                                 "of 1 token or more")
            windows.append(w)
        else:
            raise ValueError(f"layer {i} is {t!r}: kvbench models the K/V of full-attention, sliding-window and "
                             "chunked layers only")
    return tuple(windows)


def tokens_held(tokens: int, window: int | None) -> int:
    """Tokens one layer's cache holds after ``tokens`` tokens went through it.

    Full attention (``window`` None) keeps every token. transformers' ``DynamicSlidingWindowLayer.update``
    (``transformers/cache_utils.py``) keeps ``full[:, :, -sliding_window + 1:]``: the last ``window - 1`` tokens,
    since the next step's query adds the window's last one (its attention sees ``window - 1 + new`` tokens); with
    ``window == 1`` that slice starts at 0 and it keeps every token.

    Raises:
        ValueError: negative ``tokens``.
    """
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    if window is None or window == 1:
        return tokens
    return min(tokens, window - 1)


__all__ = ["FULL_TYPES", "WINDOW_FIELDS", "layer_windows", "tokens_held"]
