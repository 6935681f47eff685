"""The model code a config asks to run: the modules its ``auto_map`` entries name (config.json, and the
tokenizer_config.json beside it), and whether a run may import them. Reads JSON only; imports no model code."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvbench.errors import RemoteCodeRefused
from kvbench.models.config import auto_map_modules, config_path, json_object

if TYPE_CHECKING:
    from kvbench.scenario import ModelSpec


def remote_code_modules(spec: "ModelSpec") -> list[str]:
    """The Python files a model's ``auto_map`` entries (config.json, and tokenizer_config.json beside it) name:
    the code ``trust_remote_code`` would import, e.g. ``['modeling_x.py']``; empty when there is none.

    Raises:
        ModelNotFound: the model cannot be found.
        BadFile: a config file is not a JSON object.
    """
    path = config_path(spec)
    if path is None:
        return []
    modules: list[str] = []
    for file in (path, path.parent / "tokenizer_config.json"):
        modules += auto_map_modules(json_object(file) or {})
    return sorted(set(modules))


def allowed_remote_code(spec: "ModelSpec", allowed: bool) -> list[str]:
    """The model files a run may import (:func:`remote_code_modules`) when the scenario sets
    ``model.trust_remote_code: true`` and the run ``allowed`` it (the user said so, beside the scenario); empty
    when the scenario does not ask for model code or its auto_map names none.

    Raises:
        RemoteCodeRefused: the scenario asks for model code and ``allowed`` is false (the message names the files;
            the caller says how to allow it).
        ModelNotFound: the model cannot be found.
        BadFile: a config file is not a JSON object.
    """
    if not spec.trust_remote_code:
        return []
    modules = remote_code_modules(spec)
    if not allowed:
        named = ", ".join(modules) if modules else "its auto_map names no module"
        raise RemoteCodeRefused(f"model.trust_remote_code: true runs the model's own code ({named})")
    return modules
