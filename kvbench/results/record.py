"""What a run directory may hold, checked before anything reads it: the top level of ``run.json`` and the columns
of a trial row (declared in :mod:`kvbench.results.rows`), as strict pydantic models (the scenario inside ``run.json``
by :class:`kvbench.scenario.Scenario` itself).

Unknown keys are accepted (a newer kvbench may add columns); known keys must have their types: whole numbers are
JSON integers (not ``true``, not ``"32"``), numbers are finite, statuses are the ones kvbench writes. An error names
the file, the line (rows), the key path and what is allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from typing_extensions import TypedDict
from typing import NotRequired, Required

from kvbench.errors import RecordError
from kvbench.results.rows import COLUMNS, Kind, Status

#: Trial statuses kvbench writes (:class:`kvbench.results.rows.Status`, in its order).
ROW_STATUSES = tuple(s.value for s in Status)
#: run.json statuses: a sweep in progress (or killed), stopped by Ctrl-C/SIGTERM, or finished.
RUN_STATUSES = ("running", "interrupted", "complete")
#: The run directory's format version (run.json ``schema_version``): what this kvbench writes and reads.
SCHEMA_VERSION = 1

#: Largest whole number a run directory may hold (a 64-bit signed integer: what the tables hold).
MAX_INT = 2**63 - 1
_Count = Annotated[int, Field(strict=True, ge=0, le=MAX_INT)] | None
_Positive = Annotated[int, Field(strict=True, gt=0, le=MAX_INT)]
_Number = Annotated[float, Field(allow_inf_nan=False)] | None
_Text = Annotated[str, Field(strict=True)] | None
_Flag = Annotated[bool, Field(strict=True)] | None
_Object = dict[str, Any] | None
_List = list[Any] | None

#: The type a row's value of each kind of column must have.
_TYPES: dict[Kind, Any] = {
    Kind.NAME: Required[Annotated[str, Field(strict=True, min_length=1)]],
    Kind.STATUS: Required[Literal[ROW_STATUSES]],  # type: ignore[valid-type]
    Kind.SIZE: Required[_Positive],
    Kind.COUNT: NotRequired[_Count],
    Kind.NUMBER: NotRequired[_Number],
    Kind.NUMBERS: NotRequired[list[Annotated[float, Field(allow_inf_nan=False)]] | None],
    Kind.TEXT: NotRequired[_Text],
    Kind.FLAG: NotRequired[_Flag],
    Kind.OBJECT: NotRequired[_Object],
    Kind.LIST: NotRequired[_List],
}
# the required columns first: a row's first fault is named in this order
_ROW_FIELDS: dict[str, Any] = {c.name: _TYPES[c.kind] for c in sorted(COLUMNS, key=lambda c: not c.required)}
_Row = TypedDict("_Row", _ROW_FIELDS)  # type: ignore[misc]
_Row.__pydantic_config__ = ConfigDict(extra="allow")  # type: ignore[attr-defined]
_ROWS = TypeAdapter(list[_Row])
#: The keys whose types a row is checked for (any other key is kept as it is).
ROW_KEYS = tuple(_ROW_FIELDS)


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class _Link(_Open):
    h2d_pinned_gbps: _Number = None
    h2d_pageable_gbps: _Number = None


class _Gpu(_Open):
    name: _Text = None


class _Git(_Open):
    commit: _Text = None
    dirty: _Flag = None


class _Environment(_Open):
    cpu: _Text = None
    cpu_count: _Count = None
    memory_total_bytes: _Count = None
    gpus: list[_Gpu] | None = None
    link_bandwidth: _Link | None = None
    link_bandwidth_note: _Text = None
    git: _Git | None = None
    kvbench: _Text = None
    torch: _Text = None
    transformers: _Text = None
    python: _Text = None


class _Capacity(_Open):
    mode: str
    mode_label: str
    searched: Literal["batch_size", "prompt_tokens"]
    prompt_tokens: _Count = None
    batch_size: _Count = None
    capacity: _Count = None
    first_failure: _Count = None
    # [value, status] pairs; JSON has no tuples and strict models take none from a list
    probes: list[Annotated[list[Annotated[int, Field(strict=True, ge=0, le=MAX_INT)] | str],
                           Field(min_length=2, max_length=2)]] = []
    stopped: _Text = None
    trial_ids: list[str] = []


#: A ``/metrics`` counter delta: a finite number that is not true or false, or null (not read).
_Delta = Annotated[float, Field(strict=True, allow_inf_nan=False)] | None


class _Server(_Open):
    """A server entry of run.json: the keys the reading code takes figures from (the rest are kept as written)."""

    mode_label: _Text = None
    metrics_delta: dict[str, _Delta] | None = None
    metrics_delta_holds: dict[str, _Delta] | None = None
    device_cache_tokens: _Count = None
    working_set_tokens: _Count = None


class _RunMeta(_Open):
    schema_version: int
    status: Literal[RUN_STATUSES] | None = None  # type: ignore[valid-type]
    started_at: _Text = None
    finished_at: _Text = None
    interrupted_at: _Text = None
    environment: _Environment | None = None
    scenario: dict[str, Any] | None = None
    weights_bytes: _Count = None
    capacity: list[_Capacity] | None = None
    servers: list[_Server] | None = None


def _key(loc: tuple[Any, ...]) -> str:
    """``environment.gpus[0].name`` from a pydantic error location."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _why(err: dict[str, Any]) -> str:
    """What is allowed, and the value found (cut to 80 characters)."""
    kind, ctx = err["type"], err.get("ctx") or {}
    allowed = {"int_type": "a whole number", "int_from_float": "a whole number", "float_type": "a number",
               "finite_number": "a finite number", "string_type": "text", "bool_type": "true or false",
               "dict_type": "an object", "model_type": "an object", "list_type": "a list", "tuple_type": "a list",
               "missing": "required", "too_short": "not empty", "string_too_short": "not empty"}
    if kind == "literal_error":
        what = f"one of {ctx.get('expected', '')}"
    elif kind in ("greater_than", "greater_than_equal"):
        what = f"a whole number {'above' if kind == 'greater_than' else 'of at least'} {ctx.get('gt', ctx.get('ge'))}"
    elif kind == "less_than_equal":
        what = f"a whole number of at most {ctx.get('le')} (2**63 - 1)"
    else:
        what = allowed.get(kind, err["msg"])
    if kind == "missing":
        return "missing (required)"
    return f"must be {what}, not {_shown(err.get('input'))}"


def check_run_meta(meta: Any, path: str | Path) -> dict[str, Any]:
    """``meta`` (a parsed ``run.json``) when its known keys hold what kvbench writes: ``schema_version`` a whole
    number, ``status`` one of :data:`RUN_STATUSES`, ``environment`` an object (its machine fields typed),
    ``scenario`` a scenario (:func:`kvbench.scenario.parse_scenario`), ``capacity`` a list of search results,
    ``weights_bytes`` a byte count. The schema version itself is the caller's to judge.

    Raises:
        RecordError: the first fault, naming ``path`` and the key path (``environment.cpu_count``).
    """
    if not isinstance(meta, dict):
        raise RecordError(path, None, "", f"not a kvbench run.json (a JSON object was expected, not "
                                          f"{type(meta).__name__})")
    try:
        _RunMeta.model_validate(meta)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        raise RecordError(path, None, _key(err["loc"]), _why(err)) from None
    if meta.get("scenario") is not None:
        from kvbench.scenario import ScenarioError, parse_scenario

        try:
            parse_scenario(meta["scenario"], path)
        except ScenarioError as exc:
            key, why = exc.problems[0]
            raise RecordError(path, None, f"scenario.{key}" if key else "scenario", why) from None
    return meta


def check_rows(rows: list[Any], lines: list[int], path: str | Path) -> list[dict[str, Any]]:
    """``rows`` (parsed lines of a ``trials.jsonl``, ``lines`` their line numbers) when every one is a trial row:
    an object with the required columns of :data:`kvbench.results.rows.COLUMNS` (``trial_id``, ``mode``: text;
    ``prompt_tokens``, ``batch_size``: whole numbers above 0; ``status``: one of :data:`ROW_STATUSES`), and its other
    columns of their kinds (byte counts and counts whole numbers ≥ 0, times and rates finite numbers, each or null).
    Other keys are kept as they are.

    Raises:
        RecordError: the first fault, naming ``path``, the line and the key.
    """
    for row, line in zip(rows, lines):
        if not isinstance(row, dict):
            raise RecordError(path, line, "", f"not a trial row (a JSON object was expected, not {_shown(row)})")
    try:
        _ROWS.validate_python(rows)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        index, *loc = err["loc"]
        raise RecordError(path, lines[index], _key(tuple(loc)), _why(err)) from None
    return rows


__all__ = ["ROW_KEYS", "ROW_STATUSES", "RUN_STATUSES", "SCHEMA_VERSION", "check_rows", "check_run_meta"]
