"""What a run directory may hold, checked before anything reads it: the top level of ``run.json`` and the known
keys of a trial row, as strict pydantic models (the scenario inside ``run.json`` by :class:`kvbench.scenario.Scenario`
itself).

Unknown keys are accepted (a newer kvbench may add columns); known keys must have their types: whole numbers are
JSON integers (not ``true``, not ``"32"``), numbers are finite, statuses are the ones kvbench writes. An error names
the file, the line (rows), the key path and what is allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from typing_extensions import NotRequired, Required, TypedDict
from kvbench.errors import RecordError

#: Trial statuses kvbench writes (kvbench.bench.runner; over_budget: measured, but the device KV exceeded the budget).
ROW_STATUSES = ("ok", "over_budget", "skipped", "error", "oom")
#: run.json statuses: a sweep in progress (or killed), stopped by Ctrl-C/SIGTERM, or finished.
RUN_STATUSES = ("running", "interrupted", "complete")

#: Largest whole number a run directory may hold (a 64-bit signed integer: what the tables hold).
MAX_INT = 2**63 - 1
_Count = Optional[Annotated[int, Field(strict=True, ge=0, le=MAX_INT)]]
_Positive = Annotated[int, Field(strict=True, gt=0, le=MAX_INT)]
_Number = Optional[Annotated[float, Field(allow_inf_nan=False)]]
_Text = Optional[Annotated[str, Field(strict=True)]]
_Flag = Optional[Annotated[bool, Field(strict=True)]]
_Object = Optional[dict[str, Any]]
_List = Optional[list[Any]]

_COUNTS = ("repeat", "max_new_tokens", "n_output_tokens", "first_divergence_step", "n_samples", "window_final",
           "turn_index", "tokens_restored", "tokens_prefilled", "h2d_count", "d2h_count", "transfer_stalls",
           "gpu_other_processes", "kv_bytes_predicted", "budget_bytes", "kv_device_peak_bytes", "kv_host_peak_bytes",
           "kv_stored_peak_bytes", "kv_disk_peak_bytes", "kv_host_allocated_peak_bytes", "rss_peak_bytes",
           "rss_anon_peak_bytes", "rss_file_peak_bytes", "host_available_min_bytes",
           "pinned_host_requested_peak_bytes", "pinned_host_allocated_peak_bytes", "nvml_device_peak_bytes",
           "nvml_process_peak_bytes", "weights_baseline_bytes", "peak_device_allocated_bytes",
           "peak_device_reserved_bytes", "h2d_bytes", "d2h_bytes", "disk_read_bytes", "disk_write_bytes",
           "restore_host_bytes", "restore_disk_bytes")
_NUMBERS = ("ttft_s", "e2e_s", "tpot_s", "prefill_tokens_per_s", "decode_tokens_per_s", "throughput_tokens_per_s",
            "rss_mean_bytes", "cpu_percent_mean", "gpu_util_mean_percent", "pcie_tx_mean_bytes_per_s",
            "pcie_rx_mean_bytes_per_s", "power_mean_w", "h2d_bytes_per_s", "others_cpu_percent",
            "steal_cpu_percent", "load_resolution_percent", "load_window_s", "busy_threshold_percent",
            "sampler_cpu_s", "store_hit_rate", "top2_logit_gap", "itl_p50_s", "itl_p90_s", "itl_p99_s", "itl_max_s",
            "plan_kv_device_bytes", "plan_link_bytes_per_step", "plan_tpot_s")
_TEXTS = ("scenario", "scenario_digest", "mode_label", "message", "device", "dtype", "started_at", "prompt_sha256",
          "output_sha256", "rss_peak_source", "request_id", "document")
_FLAGS = ("tokens_match", "warm", "pinned", "divergence_acceptable", "machine_busy")
_OBJECTS = ("mode_options", "notes")
_LISTS = ("alerts", "window_events", "output_ids_head")

_ROW_FIELDS: dict[str, Any] = {
    "trial_id": Required[Annotated[str, Field(strict=True, min_length=1)]],
    "status": Required[Literal[ROW_STATUSES]],  # type: ignore[valid-type]
    "mode": Required[Annotated[str, Field(strict=True, min_length=1)]],
    "prompt_tokens": Required[_Positive],
    "batch_size": Required[_Positive],
    "itl_s": NotRequired[Optional[list[Annotated[float, Field(allow_inf_nan=False)]]]],
    "top2_logit_gaps": NotRequired[Optional[list[Annotated[float, Field(allow_inf_nan=False)]]]],
    **{k: NotRequired[_Count] for k in _COUNTS}, **{k: NotRequired[_Number] for k in _NUMBERS},
    **{k: NotRequired[_Text] for k in _TEXTS}, **{k: NotRequired[_Flag] for k in _FLAGS},
    **{k: NotRequired[_Object] for k in _OBJECTS}, **{k: NotRequired[_List] for k in _LISTS},
}
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
    gpus: Optional[list[_Gpu]] = None
    link_bandwidth: Optional[_Link] = None
    link_bandwidth_note: _Text = None
    git: Optional[_Git] = None
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
    probes: list[Annotated[list[Union[Annotated[int, Field(strict=True, ge=0, le=MAX_INT)], str]],
                           Field(min_length=2, max_length=2)]] = []
    stopped: _Text = None
    trial_ids: list[str] = []


class _RunMeta(_Open):
    schema_version: int
    status: Optional[Literal[RUN_STATUSES]] = None  # type: ignore[valid-type]
    started_at: _Text = None
    finished_at: _Text = None
    interrupted_at: _Text = None
    environment: Optional[_Environment] = None
    scenario: Optional[dict[str, Any]] = None
    weights_bytes: _Count = None
    capacity: Optional[list[_Capacity]] = None


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
    an object with ``trial_id``, ``status`` (one of :data:`ROW_STATUSES`), ``mode``, ``prompt_tokens`` and
    ``batch_size`` (whole numbers above 0), and the other keys of :data:`ROW_KEYS` of their types (byte counts and
    counts whole numbers ≥ 0, times and rates finite numbers, each or null). Other keys are kept as they are.

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


__all__ = ["ROW_KEYS", "ROW_STATUSES", "RUN_STATUSES", "RecordError", "check_rows", "check_run_meta"]
