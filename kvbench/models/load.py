"""Loading a model and its tokenizer: the device and dtype a spec resolves to, then the weights (or random ones
from the config) in eval mode. Never downloads: hub ids are loaded with ``local_files_only=True``.

:func:`load_model` is the one a run calls: whatever transformers or torch raise while loading (a pickled checkpoint
torch's weights-only loader refuses, a truncated weights file, a config it cannot build) becomes one line of
:class:`~kvbench.errors.ModelLoadError` naming the model, so that a run refuses before its first trial instead of
stopping in a traceback.
"""

from __future__ import annotations

import pickle
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvbench.errors import BadValue, ModelLoadError, ModelNotFound
from kvbench.models.config import load_config
from kvbench.models.spec import ModelRef
from kvbench.models.locate import locate
from kvbench.offload.architecture import Architecture, architecture_of

if TYPE_CHECKING:
    import torch



def resolve_device(device: str) -> torch.device:
    """``auto`` → cuda when available, else cpu. Raises BadValue (a ValueError) for a CUDA device that is not there."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise BadValue(f"device {device!r}: no CUDA device is available (torch {torch.__version__})")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise BadValue(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s)")
    return dev


def resolve_dtype(spec: ModelRef, config: Any, device: torch.device) -> torch.dtype:
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
        shape: its architecture (layers and their windows, kv heads, head_dim, context limit, vocabulary), from
            the loaded config: :func:`~kvbench.offload.architecture.architecture_of`.
        device: where the model runs.
        dtype: its compute dtype.
        weights_bytes: bytes of parameters and buffers.
    """

    model: Any
    tokenizer: Any
    shape: Architecture
    device: torch.device
    dtype: torch.dtype
    weights_bytes: int


def load_tokenizer(name: str, trust_remote_code: bool = False) -> Any:
    """The tokenizer of a pretrained model name (alias, directory, GGUF or cached hub id). Raises ModelNotFound."""
    from transformers import AutoTokenizer

    loc = locate(name)
    kw: dict[str, Any] = {"trust_remote_code": trust_remote_code, "local_files_only": True}
    if loc.gguf_file:
        kw["gguf_file"] = loc.gguf_file
    return AutoTokenizer.from_pretrained(loc.path, **kw)


def load(spec: ModelRef, device: str = "auto", seed: int = 0) -> LoadedModel:
    """Load the model (and tokenizer) a spec names, in eval mode on the device.

    Random-weight models are built with ``from_config`` under ``torch.manual_seed(seed)``, so the same seed gives
    the same weights. Raises ModelNotFound, BadValue (bad device), ValueError (layer types kvbench cannot model).
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
    return LoadedModel(model, tokenizer, architecture_of(model.config), dev, dtype, weights)


#: Longest message of the cause kept in a :class:`ModelLoadError` (characters).
CAUSE_CHARS = 300


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line: terminal colour codes dropped, only the message's first line, whitespace
    collapsed, at most :data:`CAUSE_CHARS` characters. A checkpoint torch's weights-only unpickler refused is
    described by the global it refused (torch's own text advises loading it unsafely)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    if isinstance(exc, pickle.UnpicklingError) and "Weights only load failed" in text:
        found = re.search(r"Unsupported global: GLOBAL (\S+)", text)
        held = f" (it holds {found[1]})" if found else ""
        text = (f"a pickled checkpoint torch's weights-only loader refused{held}; kvbench never unpickles code: "
                "give the weights as safetensors")
    first = " ".join(text.strip().splitlines()[0].split()) if text.strip() else ""
    if len(first) > CAUSE_CHARS:
        first = first[: CAUSE_CHARS - 1] + "…"
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def load_model(spec: ModelRef, device: str = "auto", seed: int = 0) -> LoadedModel:
    """:func:`load`, every failure but :class:`~kvbench.errors.ModelNotFound` raised as :class:`ModelLoadError`.

    Raises:
        ModelNotFound: no such model.
        ModelLoadError: anything else that stopped the load, e.g. ``model /data/m: cannot load it:
            UnpicklingError: a pickled checkpoint torch's weights-only loader refused (it holds
            argparse.Namespace); ...``.
    """
    try:
        return load(spec, device, seed)
    except ModelNotFound:
        raise
    except Exception as exc:
        raise ModelLoadError(f"model {spec.label}: cannot load it: {one_line(exc)}") from exc
