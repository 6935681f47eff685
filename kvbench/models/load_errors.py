"""Model loading that fails with one line naming the model: whatever transformers or torch raise while loading
(a pickled checkpoint torch's weights-only loader refuses, a truncated weights file, a config it cannot build)
becomes :class:`ModelLoadError`, so that a run refuses before its first trial instead of stopping in a traceback."""

from __future__ import annotations

import pickle
import re
from typing import TYPE_CHECKING

from kvbench.models import LoadedModel, ModelNotFound, load
from kvbench.errors import ModelLoadError

if TYPE_CHECKING:
    from kvbench.scenario import ModelSpec

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


def load_model(spec: "ModelSpec", device: str = "auto", seed: int = 0) -> LoadedModel:
    """:func:`kvbench.models.load`, every failure but :class:`~kvbench.models.ModelNotFound` raised as
    :class:`ModelLoadError`.

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
    except Exception as exc:  # noqa: BLE001 - whatever the loaders raise, the run refuses in one line
        raise ModelLoadError(f"model {spec.label}: cannot load it: {one_line(exc)}") from exc
