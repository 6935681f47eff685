"""The model code a config asks to run: the modules its ``auto_map`` entries name (config.json, and the
tokenizer_config.json beside it). Reads JSON only; imports no model code."""

from __future__ import annotations

from kvbench.models.config import auto_map_modules, config_path, json_object
from kvbench.models.spec import ModelRef


def remote_code_modules(spec: ModelRef) -> list[str]:
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
