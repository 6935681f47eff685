"""A model's architecture fields read from its config.json or GGUF header without importing torch or transformers,
and the model code (``auto_map`` modules) a config asks to run.

Validation reads shapes through here: it never imports a model's own code and stays fast (no torch import).
Configs whose fields transformers derives in code (sliding layers of Gemma-2 or Qwen2, multimodal text configs)
are left to transformers' ``AutoConfig``, still without remote code.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from kvbench.safe_read import read_json_file
from kvbench.errors import RemoteCodeRefused

if TYPE_CHECKING:
    from kvbench.scenario import ModelSpec

#: config.json fields every light read needs.
REQUIRED = ("num_hidden_layers", "num_attention_heads", "hidden_size", "max_position_embeddings", "vocab_size")
#: Model types whose config.json fields are the whole story (transformers derives nothing per layer from them).
PLAIN_TYPES = ("llama",)
#: GGUF architectures read from the header.
GGUF_ARCHS = ("llama",)
#: GGUF key (after ``<architecture>.``) → config field.
_GGUF_KEYS = {"block_count": "num_hidden_layers", "attention.head_count": "num_attention_heads",
              "attention.head_count_kv": "num_key_value_heads", "embedding_length": "hidden_size",
              "context_length": "max_position_embeddings", "attention.key_length": "head_dim",
              "vocab_size": "vocab_size"}


#: The largest config.json (or tokenizer_config.json) read, in bytes: real ones are a few KiB.
MAX_CONFIG_BYTES = 16 << 20


def _json_file(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when there is no such file.

    Raises:
        ValueError: the file is not a regular file, is over :data:`MAX_CONFIG_BYTES`, or is not a JSON object
            (nested at most :data:`kvbench.safe_read.MAX_JSON_DEPTH` levels).
    """
    if not os.path.lexists(path):
        return None
    data = read_json_file(path, MAX_CONFIG_BYTES)  # a FIFO, a huge or deeply nested file: BadFile, a ValueError
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds {type(data).__name__}, not a JSON object")
    return data


def config_path(spec: "ModelSpec") -> Path | None:
    """The config.json a spec reads (a preset's, ``config``, or a located model's), None for a GGUF file.

    Raises:
        kvbench.models.ModelNotFound: the model cannot be found.
    """
    from kvbench.models import config_file, locate, preset_path

    if spec.preset:
        return preset_path(spec.preset)
    if spec.config:
        return config_file(spec.config)
    loc = locate(spec.name or "")
    if loc.gguf_file:
        return None
    if Path(loc.path).is_dir():
        return Path(loc.path) / "config.json"
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(loc.path, "config.json")
    return Path(cached) if isinstance(cached, str) else None


def _gguf_fields(path: Path) -> dict[str, Any] | None:
    """Config fields from a GGUF header (architectures of :data:`GGUF_ARCHS`), None for another architecture."""
    from gguf import GGUFReader

    fields = GGUFReader(path).fields
    arch_field = fields.get("general.architecture")
    arch = arch_field.contents() if arch_field is not None else None
    if arch not in GGUF_ARCHS:
        return None
    out: dict[str, Any] = {"model_type": arch}
    for suffix, key in _GGUF_KEYS.items():
        f = fields.get(f"{arch}.{suffix}")
        if f is not None:
            out[key] = f.contents()
    if "vocab_size" not in out and "tokenizer.ggml.tokens" in fields:
        out["vocab_size"] = len(fields["tokenizer.ggml.tokens"].data)
    return out


def _light(data: dict[str, Any], where: str) -> SimpleNamespace:
    """A config object with the fields :func:`kvbench.models.shape_of` reads.

    Raises:
        ValueError: a required field is missing or not a positive whole number.
    """
    for key in REQUIRED:
        v = data.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{where}: {key} must be a positive whole number (got {v!r})")
    fields = {"num_key_value_heads": None, "head_dim": None, "layer_types": None, "sliding_window": None,
              "attention_chunk_size": None, "model_type": None, **data}
    return SimpleNamespace(**fields)


def read_config(spec: "ModelSpec") -> Any:
    """The model's config for its shape, read without running any model code: config.json fields directly for
    :data:`PLAIN_TYPES` and for configs with an ``auto_map`` (custom code, never imported), the GGUF header for
    :data:`GGUF_ARCHS`, else transformers' ``AutoConfig`` with ``trust_remote_code=False``.

    Raises:
        kvbench.models.ModelNotFound: the model cannot be found.
        ValueError: the config is not valid JSON or lacks a field kvbench needs.
        OSError: the file cannot be read.
    """
    from kvbench.models import load_config, locate

    loc = locate(spec.name) if spec.name else None
    if loc is not None and loc.gguf_file:
        fields = _gguf_fields(Path(loc.path) / loc.gguf_file)
        if fields is not None:
            return _light(fields, loc.gguf_file)
    path = config_path(spec)
    data = _json_file(path) if path is not None else None
    if data is not None and (data.get("model_type") in PLAIN_TYPES or "auto_map" in data):
        return _light(data, str(path))
    return load_config(spec.model_copy(update={"trust_remote_code": False}))


def remote_code_modules(spec: "ModelSpec") -> list[str]:
    """The Python files a model's ``auto_map`` entries (config.json, and tokenizer_config.json beside it) name:
    the code ``trust_remote_code`` would import, e.g. ``['modeling_x.py']``; empty when there is none.

    Raises:
        kvbench.models.ModelNotFound: the model cannot be found.
        ValueError: a config file is not a JSON object.
    """
    path = config_path(spec)
    if path is None:
        return []
    modules: list[str] = []
    for file in (path, path.parent / "tokenizer_config.json"):
        modules += auto_map_modules(_json_file(file) or {})
    return sorted(set(modules))


def auto_map_modules(config: dict[str, Any]) -> list[str]:
    """The Python files the ``auto_map`` of one parsed config names (``"repo--pkg.mod.Class"`` → ``pkg/mod.py``),
    sorted; empty when there is none."""
    auto_map = config.get("auto_map")
    modules = set()
    for ref in auto_map.values() if isinstance(auto_map, dict) else []:
        for r in ref if isinstance(ref, list) else [ref]:
            if isinstance(r, str) and "." in r:
                modules.add(r.split("--")[-1].rsplit(".", 1)[0].replace(".", "/") + ".py")
    return sorted(modules)


def allowed_remote_code(spec: "ModelSpec", allowed: bool) -> list[str]:
    """The model files a run may import (:func:`remote_code_modules`) when the scenario sets
    ``model.trust_remote_code: true`` and the run ``allowed`` it (``kvbench run --trust-remote-code``); empty when
    the scenario does not ask for model code or its auto_map names none.

    Raises:
        RemoteCodeRefused: the scenario asks for model code and ``allowed`` is false (the message names the files).
        kvbench.models.ModelNotFound: the model cannot be found.
        ValueError: a config file is not a JSON object.
    """
    if not spec.trust_remote_code:
        return []
    modules = remote_code_modules(spec)
    if not allowed:
        named = ", ".join(modules) if modules else "its auto_map names no module"
        raise RemoteCodeRefused(f"model.trust_remote_code: true runs the model's own code ({named}); pass "
                                "--trust-remote-code to allow it, or set it to false")
    return modules
