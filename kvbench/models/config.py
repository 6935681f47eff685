"""A model's config, read without its weights: the light read of config.json fields or a GGUF header (no torch
or transformers import), transformers' ``AutoConfig`` for loading, the config.json ``kvbench plan`` reads, and the
model's :class:`~kvbench.offload.architecture.Architecture` built from it.

Validation reads architectures through here: it never imports a model's own code and stays fast (no torch
import). Configs whose fields transformers derives in code (sliding layers of Gemma-2 or Qwen2, multimodal text
configs) are left to transformers' ``AutoConfig``, still without remote code.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kvbench.errors import BadFile, ModelNotFound
from kvbench.models.gguf_bounds import check_gguf_header
from kvbench.models.spec import ModelRef
from kvbench.models.locate import config_file, locate, preset_path
from kvbench.offload.architecture import Architecture, architecture_of
from kvbench.safe_read import read_json_file
from kvbench.safe_text import visible

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
#: The largest model shape kvbench takes from a model's files (a config.json, a GGUF header) for a model it builds,
#: validates or exports, each far above any published model (Llama 3.1 405B: 126 layers, 128 heads, hidden size
#: 16,384; Gemma 3: a vocabulary of 262,144): a file past them is refused before anything is built from it (a GGUF
#: that claimed 200,000 layers kept transformers building them for minutes, at gigabytes).
SHAPE_LIMITS = {"num_hidden_layers": 1_024, "num_attention_heads": 1_024, "num_key_value_heads": 1_024,
                "head_dim": 4_096, "hidden_size": 65_536, "vocab_size": 2**21, "max_position_embeddings": 2**26}


def check_shape(fields: dict[str, Any], where: str | Path, names: dict[str, str] | None = None) -> None:
    """Refuse a model shape (config field → value, as :data:`SHAPE_LIMITS` names them; other fields and None are
    not looked at) whose sizes are not whole numbers from 1 to their :data:`SHAPE_LIMITS` bound. A per-layer list
    (some GGUF architectures give heads per layer; 0 for a layer without attention) has at most as many entries as
    layers may, each from 0 to the bound; KV heads must divide the attention heads (:func:`check_kv_heads`).

    Raises:
        BadFile: ``<where>: <key> = <value>: ...`` naming the first such field (as ``names`` calls it in the
            file: a GGUF's ``llama.block_count``) and its bound, or the KV heads that do not divide the heads.
    """
    name = (names or {}).get
    for key, most in SHAPE_LIMITS.items():
        v = fields.get(key)
        if v is None:
            continue
        per_layer = isinstance(v, list) and 0 < len(v) <= SHAPE_LIMITS["num_hidden_layers"] and all(
            isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= most for n in v)
        if not per_layer and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= most):
            shown = f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else repr(v)[:40]
            raise BadFile(f"{where}: {name(key, key)} = {shown}: must be a whole number from 1 to "
                          f"{most:,} (kvbench takes no larger model: no published one comes near)")
    check_kv_heads(fields, where, names)


def check_kv_heads(fields: dict[str, Any], where: str | Path, names: dict[str, str] | None = None) -> None:
    """Refuse KV heads (one number) that do not divide the attention heads: each serves a whole group of query
    heads (grouped-query attention, Ainslie et al. 2023); a per-layer list or a missing count is not looked at.

    Raises:
        BadFile: ``<where>: <kv key> = N: must divide <heads key> = M ...`` (keys as ``names`` calls them).
    """
    heads, kv = fields.get("num_attention_heads"), fields.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kv, int) and heads % kv:
        name = (names or {}).get
        raise BadFile(f"{where}: {name('num_key_value_heads', 'num_key_value_heads')} = {kv:,}: must divide "
                      f"{name('num_attention_heads', 'num_attention_heads')} = {heads:,} (each KV head serves a "
                      "whole group of query heads)")


def json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, or None when there is no such file.

    Raises:
        BadFile: the file is not a regular file, is over :data:`MAX_CONFIG_BYTES`, or is not a JSON object
            (nested at most :data:`kvbench.safe_read.MAX_JSON_DEPTH` levels).
    """
    if not os.path.lexists(path):
        return None
    data = read_json_file(path, MAX_CONFIG_BYTES)  # a FIFO, a huge or deeply nested file: BadFile, a ValueError
    if not isinstance(data, dict):
        raise BadFile(f"{path} holds {type(data).__name__}, not a JSON object")
    return data


def config_path(spec: ModelRef) -> Path | None:
    """The config.json a spec reads (a preset's, ``config``, or a located model's), None for a GGUF file.

    Raises:
        ModelNotFound: the model cannot be found.
    """
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


def gguf_header(path: Path) -> tuple[Any, dict[str, Any]]:
    """``(architecture, config fields)`` of a GGUF header, whatever its architecture: the keys of
    :data:`_GGUF_KEYS` it holds (the vocabulary counted from its tokens where no size is given), checked by
    :func:`check_shape`.

    Raises:
        BadFile: the header cannot be read as GGUF, claims more than the file holds
            (:func:`~kvbench.models.gguf_bounds.check_gguf_header`), lacks its layer count, or its shape is
            past :data:`SHAPE_LIMITS` (naming the key).
    """
    from gguf import GGUFReader

    check_gguf_header(path)  # before the reader, which trusts every count
    try:
        fields = GGUFReader(path).fields
        arch_field = fields.get("general.architecture")
        arch = arch_field.contents() if arch_field is not None else None
        out: dict[str, Any] = {}
        names = {key: f"{arch}.{suffix}" for suffix, key in _GGUF_KEYS.items()}
        for suffix, key in _GGUF_KEYS.items():
            f = fields.get(f"{arch}.{suffix}")
            if f is not None:
                out[key] = f.contents()
        if "vocab_size" not in out and "tokenizer.ggml.tokens" in fields:
            out["vocab_size"] = len(fields["tokenizer.ggml.tokens"].data)
            names["vocab_size"] = "tokenizer.ggml.tokens (its count)"
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:  # what gguf raises for a broken header
        raise BadFile(f"{path}: not a GGUF header kvbench can read: {type(exc).__name__}: {str(exc)[:200]}") from None
    if "num_hidden_layers" not in out:  # transformers would fill in its defaults: a model this file is not
        raise BadFile(f"{path}: not a model's GGUF header: no {visible(names['num_hidden_layers'])}")
    check_shape(out, path, names)
    return arch, out


def _gguf_fields(path: Path) -> dict[str, Any] | None:
    """Config fields from a GGUF header (architectures of :data:`GGUF_ARCHS`), None for another architecture.

    Raises:
        BadFile: as :func:`gguf_header`.
    """
    arch, out = gguf_header(path)
    return {"model_type": arch, **out} if arch in GGUF_ARCHS else None


def _light(data: dict[str, Any], where: str) -> SimpleNamespace:
    """A config object with the fields :func:`~kvbench.offload.architecture.architecture_of` reads.

    Raises:
        BadFile: a required field is missing or not a positive whole number, or a size is past
            :data:`SHAPE_LIMITS`.
    """
    check_shape(data, where)
    for key in REQUIRED:
        v = data.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise BadFile(f"{where}: {key} must be a positive whole number (got {v!r})")
    fields = {"num_key_value_heads": None, "head_dim": None, "layer_types": None, "sliding_window": None,
              "attention_chunk_size": None, "model_type": None, **data}
    return SimpleNamespace(**fields)


def read_config(spec: ModelRef) -> Any:
    """The model's config for its architecture, read without running any model code: config.json fields directly for
    :data:`PLAIN_TYPES` and for configs with an ``auto_map`` (custom code, never imported), the GGUF header for
    :data:`GGUF_ARCHS`, else transformers' ``AutoConfig`` with ``trust_remote_code=False``.

    Raises:
        ModelNotFound: the model cannot be found.
        BadFile: the config is not valid JSON or lacks a field kvbench needs.
        ValueError, OSError, KeyError: transformers cannot read the config.
    """
    loc = locate(spec.name) if spec.name else None
    if loc is not None and loc.gguf_file:
        fields = _gguf_fields(Path(loc.path) / loc.gguf_file)
        if fields is not None:
            return _light(fields, loc.gguf_file)
    path = config_path(spec)
    data = json_object(path) if path is not None else None
    if data is not None and (data.get("model_type") in PLAIN_TYPES or "auto_map" in data):
        return _light(data, str(path))
    return load_config(spec.model_copy(update={"trust_remote_code": False}))


def load_config(spec: ModelRef) -> Any:
    """The transformers config of a model spec, read without weights (running the model's own code when the spec
    trusts it). Raises ModelNotFound."""
    from transformers import AutoConfig

    if spec.preset:
        return AutoConfig.from_pretrained(preset_path(spec.preset))
    if spec.config:
        p = config_file(spec.config)
        try:
            read_json_file(p, MAX_CONFIG_BYTES)
        except ValueError as exc:
            raise ModelNotFound(str(exc)) from None
        return AutoConfig.from_pretrained(p, trust_remote_code=spec.trust_remote_code)
    loc = locate(spec.name or "")
    kw: dict[str, Any] = {"trust_remote_code": spec.trust_remote_code, "local_files_only": True}
    if loc.gguf_file:
        kw["gguf_file"] = loc.gguf_file
    return AutoConfig.from_pretrained(loc.path, **kw)


@functools.lru_cache(maxsize=32)
def read_architecture(spec: ModelRef) -> Architecture:
    """The model's architecture from its config alone (no weights loaded, no model code run, no torch import for
    config.json and GGUF files kvbench reads itself: see :func:`read_config`; cached per spec).

    Raises:
        ModelNotFound: the model cannot be found, or its config cannot be read or modelled, or its shape is past
            :data:`SHAPE_LIMITS` (saying why).
    """
    try:
        arch = architecture_of(read_config(spec))
        check_shape({"num_hidden_layers": len(arch.windows), "num_attention_heads": arch.heads,
                     "num_key_value_heads": arch.kv_heads, "head_dim": arch.head_dim, "hidden_size": arch.hidden,
                     "vocab_size": arch.vocab_size}, spec.name or spec.preset or spec.config or "?")
        return arch
    except ModelNotFound:
        raise
    except (OSError, ValueError, KeyError) as exc:
        raise ModelNotFound(f"cannot read the model's config: {exc}") from None


#: Config fields :func:`read_config_file` needs: plan counts parameters from them.
PLAN_FIELDS = ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size", "vocab_size")
#: The largest config sizes :func:`read_config_file` accepts (far above any published model; past them plan's
#: counts overflow).
CONFIG_LIMITS = {"num_hidden_layers": 100_000, "num_attention_heads": 65_536, "num_key_value_heads": 65_536,
                 "head_dim": 65_536, "hidden_size": 2**24, "intermediate_size": 2**26, "vocab_size": 2**26,
                 "sliding_window": 2**32, "max_position_embeddings": 2**32}


def read_config_file(path: str | Path) -> Any:
    """The transformers config in a ``config.json`` file, for ``kvbench plan``: it refuses one that lacks a size of
    :data:`PLAN_FIELDS` (transformers would fill them with its defaults, silently planning for another model), and
    never runs model code.

    Raises:
        BadFile: not JSON, or missing (or null) fields (named), or sizes that are not whole numbers from 1 to their
            :data:`CONFIG_LIMITS` bound (named, with the bound), KV heads that do not divide the heads, or an
            ``auto_map`` naming model code for an architecture transformers does not ship, or a config
            transformers cannot read (its words as one line, at most 400 characters, control characters escaped).
    """
    path = Path(path)
    raw = read_json_file(path, MAX_CONFIG_BYTES)  # BadFile: a FIFO, too large, invalid, too deep
    text = raw.get("text_config", raw) if isinstance(raw, dict) else {}
    if not isinstance(text, dict):
        shown = "null" if text is None else type(text).__name__
        raise BadFile(f"{path}: text_config is {shown}, not an object of the language model's fields")
    missing = [k for k in PLAN_FIELDS if k not in text or text[k] is None]
    if missing:
        raise BadFile(f"{path}: the config has no {', '.join(missing)}")

    def positive_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v > 0

    wrong = [k for k in CONFIG_LIMITS if text.get(k) is not None and not positive_int(text[k])]
    if wrong:
        raise BadFile(f"{path}: {', '.join(f'{k} = {text[k]!r}' for k in wrong)}: must be whole numbers above 0")
    big = [k for k, most in CONFIG_LIMITS.items() if text.get(k) is not None and text[k] > most]
    if big:
        raise BadFile(f"{path}: " + ", ".join(f"{k} = {text[k]:,} is above {CONFIG_LIMITS[k]:,}" for k in big)
                         + ": plan takes sizes up to these")
    check_kv_heads(text, path)
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if isinstance(raw, dict) and raw.get("auto_map") and text.get("model_type") not in CONFIG_MAPPING_NAMES:
        code = ", ".join(auto_map_modules(raw)) or "?"
        raise BadFile(f"{path}: the config's auto_map names the model's own code ({code}) (model_type "
                         f"{text.get('model_type')!r}); plan never runs model code: give a config of an architecture "
                         "transformers ships")
    try:  # never remote code: transformers would otherwise ask on the terminal whether to run it
        return AutoConfig.from_pretrained(path, trust_remote_code=False)
    except Exception as exc:  # transformers raises many kinds (ValueError, KeyError, OSError) for a bad config
        said = " ".join(str(exc).split()) or type(exc).__name__  # every line, as one
        said = visible(said if len(said) <= 400 else said[:397] + "...")
        raise BadFile(f"{path}: transformers cannot read this config: {said}") from None
