"""Checks of the library's arguments (the CLI's flags are checked by Typer): a wrong type or value raises
:class:`kvbench.errors.BadParameter` naming the argument, never a TypeError from deep inside kvbench."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kvbench.errors import BadParameter


def path_arg(value: Any, param: str) -> Path:
    """``value`` as a :class:`~pathlib.Path` (a ``str`` or ``os.PathLike``, not empty).

    Raises:
        BadParameter: another type, or an empty string (``param`` names the argument).
    """
    if isinstance(value, (str, os.PathLike)) and str(value).strip():
        return Path(value)
    raise BadParameter(f"{{{param}}} must be a path (a str or pathlib.Path), not {_shown(value)}", param)


def paths_arg(value: Any, param: str) -> list[Path]:
    """One path or an iterable of paths as a list of :class:`~pathlib.Path` (see :func:`path_arg`).

    Raises:
        BadParameter: not a path nor an iterable of paths, or an empty iterable.
    """
    if isinstance(value, (str, os.PathLike)):
        return [path_arg(value, param)]
    if not isinstance(value, Iterable):
        raise BadParameter(f"{{{param}}} must be a path or a list of paths, not {_shown(value)}", param)
    paths = [path_arg(v, param) for v in value]
    if not paths:
        raise BadParameter(f"{{{param}}} is empty: give at least one path", param)
    return paths


def number_arg(value: Any, param: str, *, optional: bool = False) -> float | None:
    """``value`` as a real number (int or float, not bool); None passes when ``optional``. Ranges are the
    caller's to check.

    Raises:
        BadParameter: another type (a str, a list, a bool, None where a number is required).
    """
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadParameter(f"{{{param}}} must be a number, not {_shown(value)}", param)
    return float(value)


def positive_seconds(value: Any, param: str) -> float | None:
    """An optional limit in seconds: None, or a finite number above 0.

    Raises:
        BadParameter: another type, or not finite and above 0.
    """
    v = number_arg(value, param, optional=True)
    if v is not None and not (math.isfinite(v) and v > 0):
        raise BadParameter(f"{{{param}}} must be a finite number of seconds above 0, not {v:g}", param)
    return v


def count_arg(value: Any, param: str) -> int:
    """``value`` as an int (not a bool, not a float); ranges are the caller's to check.

    Raises:
        BadParameter: another type.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadParameter(f"{{{param}}} must be a whole number, not {_shown(value)}", param)
    return value


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '…' if len(text) > 60 else text}"
