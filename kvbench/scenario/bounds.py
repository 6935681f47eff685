"""The value types of the scenario schema, with the bounds a run can use.

Booleans are never numbers, numbers are whole and bounded (a sweep of 10^12 repeats, a batch of 10^8 prompts or a
seed of 10^30 would hang or overflow before the first trial), byte sizes are finite, names are safe as the start
of a file name (the run directory is named after the scenario), paths hold no NUL byte. Every bound is named in
the error message. The bounded token counts (``Tokens``, ``TokensOrZero``, ``HostTokens``) are the offload modes'
own, in :mod:`kvbench.offload.modes`; the schema uses them for prompts and new tokens too.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ByteSize, ConfigDict, Field

from kvbench.offload.modes import whole_number

#: Sequences in one batch.
MAX_BATCH = 4096
#: Distinct prompts, conversations, documents or turns of a workload.
MAX_COUNT = 10_000
#: Recorded repeats per point, and unrecorded warm-up trials.
MAX_REPEATS, MAX_WARMUP = 1000, 100
#: Trials a plain sweep may plan (prompt lengths × batch sizes × modes × repeats).
MAX_TRIALS = 100_000
#: Seeds are below 2^32 (what numpy and every seeded generator kvbench uses accept).
SEED_LIMIT = 2**32
#: Byte sizes (budget, store caps, alerts): 1 EiB.
MAX_BYTES = 2**60
#: Sampling period of the monitor in ms (one minute).
MAX_INTERVAL_MS = 60_000
#: Characters of a scenario name (the run directory adds its time stamp) and of a path in a scenario.
MAX_NAME, MAX_PATH = 100, 4096
#: Characters of a description (one line in `kvbench list scenarios`).
MAX_DESCRIPTION = 500


class Strict(BaseModel):
    """The base of every scenario model: unknown keys are errors, and a loaded scenario cannot change."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def optional(description: str) -> Any:
    """A key that may be left out: None unless given."""
    return Field(None, description=description)


def whole_text(pattern: str, message: str) -> Any:
    """Text that ``pattern`` matches whole; anything else is refused with ``message`` (a ValueError)."""

    def check(v: str) -> str:
        if not re.fullmatch(pattern, v):
            raise ValueError(message)
        return v

    return Annotated[str, AfterValidator(check)]


Batch = whole_number(1, MAX_BATCH)
Count = whole_number(1, MAX_COUNT)
Repeats = whole_number(1, MAX_REPEATS)
Warmup = whole_number(0, MAX_WARMUP)
IntervalMs = whole_number(0, MAX_INTERVAL_MS)
Seed = Annotated[int, Field(strict=True, ge=0, lt=SEED_LIMIT)]
StrictBool = Annotated[bool, Field(strict=True)]


def _figure(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def number(low: float, high: float | None = None, *, above: bool = False) -> Any:
    """A finite number (a YAML integer or float, never ``true`` or ``"0.9"``) of at least ``low`` (above it with
    ``above``) and at most ``high`` (None: no upper bound); anything else is refused naming the range (a
    ValueError). Quoted text gets a hint, and text such as ``1e-3`` (YAML reads it as text) how to write it."""
    lower = f"above {_figure(low)}" if above else f"of at least {_figure(low)}"
    span = (f"from {_figure(low)} to {_figure(high)}" if high is not None and not above else
            f"{lower}, at most {_figure(high)}" if high is not None else lower)

    def check(v: Any) -> Any:
        if isinstance(v, str):
            hint = ("YAML reads 1e-3 as text: write 1.0e-3 or 0.001" if re.fullmatch(r"[-+]?[0-9.]+[eE][-+]?[0-9]+", v)
                    else "write a number without quotes")
            raise ValueError(f"must be a number {span}, not text ({hint})")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"must be a number {span}, not {'true or false' if isinstance(v, bool) else 'that'}")
        try:
            value = float(v)
        except OverflowError:
            raise ValueError(f"must be a number {span}") from None
        if not math.isfinite(value) or value < low or (above and value == low) or (high is not None and value > high):
            raise ValueError(f"must be a number {span}")
        return value

    bounds = {"gt" if above else "ge": low, **({"le": high} if high is not None else {})}
    return Annotated[float, Field(allow_inf_nan=False, **bounds), BeforeValidator(check)]  # Field: the reference


#: A size as text: a number (digits, at most one decimal point) and an optional unit, nothing else. pydantic's
#: ByteSize reads only a prefix of what it is given ('5.GiB' as 5 bytes, '1,5GiB' as 1), so text is checked first.
_SIZE_TEXT = re.compile(r"\s*(\d+(\.\d+)?|\.\d+)\s*([A-Za-z]+)?\s*", re.ASCII)  # \d: 0-9, not ١ or ²


def check_size_input(v: Any) -> Any:
    """Refuse what ByteSize would take as a number of bytes but is not one: a boolean, NaN or infinity, or text that
    is not a whole size such as ``512MiB`` or ``1.5GB``."""
    if isinstance(v, bool):
        raise ValueError("must be a number of bytes or a size such as 512MiB, not a boolean")
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError("must be a finite number of bytes or a size such as 512MiB")
    if isinstance(v, str) and not (m := _SIZE_TEXT.fullmatch(v)):
        raise ValueError(f"{v[:40]!r} is not a size: give bytes or a number and a unit, such as 512MiB or 1.5GB")
    if (isinstance(v, float) and not v.is_integer()) or (isinstance(v, str) and "." in m[1] and not m[3]):
        raise ValueError(f"{v!r}: a number of bytes is whole; give a unit for a fraction, such as 1.5GiB")
    return v


def _bytes_bound(v: ByteSize) -> ByteSize:
    if v > MAX_BYTES:
        raise ValueError(f"must be at most {MAX_BYTES:,} bytes (1 EiB)")
    return v


Bytes = Annotated[ByteSize, BeforeValidator(check_size_input), AfterValidator(_bytes_bound)]


def _path_text(v: str) -> str:
    if "\0" in v:
        raise ValueError("a path cannot hold a NUL byte")
    if len(v) > MAX_PATH:
        raise ValueError(f"must be at most {MAX_PATH} characters")
    return v


PathText = Annotated[str, AfterValidator(_path_text)]


def check_name(v: str) -> str:
    """A scenario name usable as the start of a directory name.

    Raises:
        ValueError: longer than :data:`MAX_NAME`, or other than letters, digits, ``_``, ``.``, ``-``, or starting
            with ``.`` or ``-``.
    """
    if len(v) > MAX_NAME:
        raise ValueError(f"must be at most {MAX_NAME} characters (it names the run directory; got {len(v)})")
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", v):
        raise ValueError("must be letters, digits, '_', '.' and '-', starting with a letter, digit or '_' (it names "
                         "the run directory)")
    return v


def check_description(v: str) -> str:
    """One line of at most :data:`MAX_DESCRIPTION` characters. Raises ValueError otherwise."""
    if len(v) > MAX_DESCRIPTION:
        raise ValueError(f"must be at most {MAX_DESCRIPTION} characters (got {len(v):,})")
    if any(ord(c) < 32 or ord(c) == 127 for c in v):
        raise ValueError("must be one line without control characters (it is printed by `kvbench list scenarios`)")
    return v


def sweep_problem(prompt_lengths: int, batch_sizes: int, modes: int, repeats: int) -> str | None:
    """Why a plain sweep plans too many trials (over :data:`MAX_TRIALS`), or None."""
    n = prompt_lengths * batch_sizes * modes * repeats
    if n > MAX_TRIALS:
        return (f"repeats: {prompt_lengths} prompt lengths × {batch_sizes} batch sizes × {modes} modes × {repeats} "
                f"repeats is {n:,} trials, more than {MAX_TRIALS:,}")
    return None

