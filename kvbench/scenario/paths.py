"""The file paths a scenario names: taken from the scenario file's directory, and a ``files:`` glob expanded
without ever descending through a symbolic link to a directory in ``**`` (a link loop cannot make it explode),
refusing more than :data:`MAX_MATCHES` paths."""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from kvbench.errors import TooManyFiles

if TYPE_CHECKING:
    from kvbench.scenario.schema import Scenario

#: The most paths a ``files:`` glob may match.
MAX_MATCHES = 10_000
_MAGIC = re.compile(r"[*?[]")


def _hidden(name: str, part: str) -> bool:
    return name.startswith(".") and not part.startswith(".")  # as glob: only a pattern with a dot matches one


def _entries(d: str) -> list[os.DirEntry]:
    try:
        with os.scandir(d or ".") as it:
            return list(it)
    except OSError:  # not a directory, gone, not readable: nothing matches below it, as with glob
        return []


def _real_dirs(d: str) -> Iterator[str]:
    """``d`` and every directory below it that is not hidden, never through a symbolic link."""
    stack = [d]
    while stack:
        here = stack.pop()
        yield here
        stack.extend(os.path.join(here, e.name) for e in _entries(here)
                     if not e.name.startswith(".") and e.is_dir(follow_symlinks=False))


def _select(d: str, parts: tuple[str, ...]) -> Iterator[str]:
    head, rest = parts[0], parts[1:]
    if head == "**":
        for sub in _real_dirs(d):
            yield from _select(sub, rest or ("*",))
    elif not _MAGIC.search(head):
        path = os.path.join(d, head)
        if rest:
            if os.path.isdir(path):
                yield from _select(path, rest)
        elif os.path.lexists(path):
            yield path
    else:
        for e in _entries(d):
            if fnmatch.fnmatchcase(e.name, head) and not _hidden(e.name, head):
                path = os.path.join(d, e.name)
                if not rest:
                    yield path
                elif e.is_dir():  # a link to a directory is followed here: one level, bounded by the pattern
                    yield from _select(path, rest)


def match(pattern: str, limit: int = MAX_MATCHES) -> list[str]:
    """The paths glob ``pattern`` matches (``**`` = any depth of directories), sorted: as :func:`glob.glob` with
    ``recursive=True``, except that ``**`` never descends through a symbolic link to a directory.

    Raises:
        TooManyFiles: more than ``limit`` paths match (the message names the pattern and the limit).
    """
    root = "/" if pattern.startswith("/") else ""
    parts = tuple(p for p in pattern.split("/") if p)
    lit = next((i for i, p in enumerate(parts) if _MAGIC.search(p)), len(parts))
    base = root + "/".join(parts[:lit])
    if lit == len(parts):
        return [base] if base and os.path.lexists(base) else []
    found: set[str] = set()
    for path in _select(base, parts[lit:]):
        found.add(path)
        if len(found) > limit:
            raise TooManyFiles(f"workload.files: the pattern {pattern!r} matches more than {limit:,} paths (the "
                               "limit): narrow it")
    return sorted(found)


def resolve_paths(s: Scenario, base: Path) -> Scenario:
    """Make the scenario's relative file paths relative to the scenario file's directory."""
    model = s.model
    if model.config and not Path(model.config).is_absolute():
        model = model.model_copy(update={"config": str(base / model.config)})
    if model.name and (base / model.name).exists() and not Path(model.name).exists():
        model = model.model_copy(update={"name": str(base / model.name)})
    wl = s.workload
    if wl.files and not Path(wl.files).is_absolute():
        wl = wl.model_copy(update={"files": str(base / wl.files)})
    if wl.trace is not None and not Path(wl.trace.path).is_absolute():
        wl = wl.model_copy(update={"trace": wl.trace.model_copy(update={"path": str(base / wl.trace.path)})})
    disk_dir = s.disk_dir
    if disk_dir is not None:
        disk_dir = os.path.expanduser(disk_dir)
        if not Path(disk_dir).is_absolute():
            disk_dir = str(base / disk_dir)
    engine = s.engine  # a server's program or model given as a path relative to the scenario file
    for key in ("binary", "python", "model"):
        v = getattr(engine, key)
        if v and "/" in v and not Path(v).is_absolute() and (base / v).exists():
            engine = engine.model_copy(update={key: str(base / v)})
    return s.model_copy(update={"model": model, "workload": wl, "disk_dir": disk_dir, "engine": engine})
