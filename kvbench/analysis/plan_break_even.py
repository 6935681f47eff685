"""``kvbench plan --break-even``: where restoring a shared prefix pays against recomputing it, for a machine not
at hand, from the break-even map's roofline (:mod:`kvbench.analysis.break_even_fit`) with constants either
measured (a ``map.json`` that ``kvbench map`` wrote) or assumed from a model's config and a GPU's figures.

Assumed constants (each named as assumed in the output):

- prefill per token = 2 × active parameters ÷ (peak FLOP/s × utilisation): a forward pass's matrix products, 2 FLOP
  per weight a token passes through (Kaplan et al., "Scaling Laws for Neural Language Models", 2020, §2.1; a
  mixture of experts' routed experts count k of E: :mod:`kvbench.models.sizes`);
- attention per token pair = attention FLOPs per pair ÷ (peak FLOP/s × utilisation): QKᵀ and AV, a multiply-add
  each per head element per pair of tokens, 4 × layers × heads × head_dim (latent attention:
  :mod:`kvbench.models.sizes`);
- restore per token = KV bytes per token ÷ the tier's bandwidth (host tier → device over the link);
- decode step = weights a one-token step reads ÷ memory bandwidth, decode per context token = :data:`KV_PASSES` ×
  KV bytes per token ÷ memory bandwidth (the decode roofline of :mod:`kvbench.analysis.plan`);
- per-request overhead = 0.

Under N-way tensor parallelism the sizes are one GPU's share (:meth:`~kvbench.models.sizes.ModelSizes.split`) at
one GPU's figures: the N GPUs compute, restore and read their shares side by side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvbench.analysis.break_even_fit import (EXTRAPOLATION_FACTOR, TIERS, TPOT_TERMS, TTFT_TERMS, CellShape, Fit,
                                             beyond_range, predict_saving)
from kvbench.analysis.plan import KV_PASSES
from kvbench.errors import BadParameter, BadValue
from kvbench.models.sizes import ModelSizes
from kvbench.offload.modes import MAX_TOKENS
from kvbench.safe_read import read_json_file
from kvbench.scenario.workload import prefix_tokens

#: The share of a GPU's peak dense FLOP/s a prefill reaches (the GPU's figure: :mod:`kvbench.models.gpus`).
ASSUMED_UTILISATION = 0.5
#: The shared shares (percent) a plan shows.
PLAN_SHARES = (0, 25, 50, 75, 95)


@dataclass(frozen=True)
class Constants:
    """The roofline's constants (the names of :data:`~kvbench.analysis.break_even_fit.TTFT_TERMS`,
    ``restore_host_s_per_token`` and :data:`~kvbench.analysis.break_even_fit.TPOT_TERMS`; seconds) and, per
    constant, where it comes from (``measured: <runs>`` or ``assumed: <how>``); measured ones also the shortest
    and longest prompt (tokens) they were fitted to (None: assumed, or not recorded), ``busy`` (fitted to
    trials measured on a busy machine) and ``draws`` (constant → its bootstrap values, as many for each; None:
    assumed, or a map.json of an older kvbench that kept no draws)."""

    values: dict[str, float]
    source: dict[str, str]
    prompt_tokens: tuple[int, int] | None = None
    busy: bool = False
    draws: dict[str, np.ndarray] | None = None


def assumed_constants(arch: ModelSizes, dtype_bytes: int, tflops: float, link_bytes_per_s: float,
                      memory_bytes_per_s: float, utilisation: float = ASSUMED_UTILISATION) -> Constants:
    """The constants the module docstring derives from a model's sizes (one GPU's share under tensor parallelism),
    a GPU's figures (TFLOP/s, memory bytes/s) and the tier's bytes/s (``link_bytes_per_s``).

    Raises:
        BadValue: a figure that is not finite and above 0.
    """
    for what, v in (("TFLOP/s", tflops), ("link bandwidth", link_bytes_per_s), ("memory bandwidth",
                                                                                 memory_bytes_per_s)):
        if not (v > 0 and math.isfinite(v)):
            raise BadValue(f"the {what} must be a finite number above 0, not {v}")
    flops = tflops * 1e12 * utilisation
    per_token = arch.kv_bytes(1, dtype_bytes)
    values = {"overhead_s": 0.0, "prefill_s_per_token": 2 * arch.active_parameters / flops,
              "attention_s_per_token_pair": arch.attention_flops_per_token_pair / flops,
              "restore_host_s_per_token": per_token / link_bytes_per_s,
              "decode_s": arch.weights_read(1) * dtype_bytes / memory_bytes_per_s,
              "decode_s_per_context_token": KV_PASSES * per_token / memory_bytes_per_s}
    how = f"{tflops:g} TFLOP/s at {utilisation:.0%}"
    pair = ("2 × layers × heads × (qk_nope_head_dim + qk_rope_head_dim + v_head_dim)" if arch.latent_kv
            else "4 × layers × heads × head_dim")
    source = {"overhead_s": "assumed: 0", "prefill_s_per_token": f"assumed: 2 × active parameters ÷ ({how})",
              "attention_s_per_token_pair": f"assumed: {pair} ÷ ({how})",
              "restore_host_s_per_token": f"assumed: {per_token:,} KV bytes per token ÷ "
                                          f"{link_bytes_per_s / 1e9:g} GB/s",
              "decode_s": f"assumed: weights read at batch 1 ÷ {memory_bytes_per_s / 1e9:g} GB/s",
              "decode_s_per_context_token": f"assumed: {KV_PASSES} × KV bytes per token ÷ "
                                            f"{memory_bytes_per_s / 1e9:g} GB/s"}
    return Constants(values, source)


#: The largest map.json read (bytes): kvbench map writes some 15 KiB for a 2 × 5 map, a few hundred KiB for a large
#: one.
MAX_MAP_JSON_BYTES = 4 << 20
#: Runs a measured constant's source names (the rest counted), and characters kept of each name.
SHOWN_RUNS, SHOWN_CHARS = 3, 120


def _shown(value: Any) -> str:
    """``value`` as text of at most :data:`SHOWN_CHARS` characters (cut with ``...``)."""
    text = str(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."


#: The constants a measured fit must give (a restore tier: ``restore_host_s_per_token`` or a server's
#: ``restore_cache_s_per_token``).
REQUIRED = ("overhead_s", "prefill_s_per_token", "attention_s_per_token_pair", "decode_s",
            "decode_s_per_context_token")
#: Every constant a fit of kvbench map holds (any other key of a fit's values is refused).
KNOWN = (*TTFT_TERMS, *(f"restore_{tier}_s_per_token" for tier, _ in TIERS), *TPOT_TERMS)


def measured_constants(path: str | Path, scenario: str | None = None, mode: str | None = None,
                       allow_busy: bool = False) -> Constants:
    """The constants ``kvbench map`` fitted, from its ``map.json``: the first fitted scenario and mode, or the
    ones named (the source says which, and how many fits the file holds), with the prompt lengths they rest on.
    A host restore tier missing from the fit (a server's cache is ``cache``) takes the fitted cache's value and
    draws. A fit of trials measured on a busy machine (``busy``) is refused unless ``allow_busy``; then its source
    says busy.

    The file is read by :func:`kvbench.safe_read.read_json_file` (a regular file of at most
    :data:`MAX_MAP_JSON_BYTES`, bounded nesting and integers); the source names the first :data:`SHOWN_RUNS` runs
    (and how many more), each cut to :data:`SHOWN_CHARS` characters, as are the scenario and mode.

    Raises:
        BadValue: the file is not a regular file, too large, or cannot be read as JSON (its reason), has no
            ``constants`` list of fits (for that scenario and mode), or a fit lacks a constant, names one kvbench
            map does not fit (:data:`KNOWN`) or gives one that is not a finite number of at least 0, or a
            ``prompt_tokens`` that is not two whole numbers from 1 to 2^24, shortest first (naming the file and the
            key path).
        BadParameter: the fit is busy and ``allow_busy`` is False (param ``allow_busy``).
    """
    try:
        doc = read_json_file(path, MAX_MAP_JSON_BYTES)
    except ValueError as exc:  # BadFile: its message names the file
        why = str(exc).removeprefix(f"{path}: ")
        raise BadValue(f"{path}: not a map.json of kvbench map: {why}") from None
    fits = doc.get("constants") if isinstance(doc, dict) else None
    if not isinstance(fits, list) or not all(isinstance(f, dict) for f in fits):
        raise BadValue(f"{path}: constants: must be the list of fits kvbench map writes")
    chosen = [(i, f) for i, f in enumerate(fits) if (scenario is None or f.get("group") == scenario)
              and (mode is None or f.get("mode_label") == mode)]
    if not chosen:
        raise BadValue(f"{path}: no fitted constants" + (f" for {scenario or '*'} {mode or '*'}" if scenario or mode
                                                          else ""))
    i, f = chosen[0]
    raw = f.get("values")
    if not isinstance(raw, dict):
        raise BadValue(f"{path}: constants[{i}].values: must be a mapping of constant → seconds")
    values: dict[str, float] = {}
    for k, v in raw.items():
        if k not in KNOWN:
            raise BadValue(f"{path}: constants[{i}].values.{_shown(k)}: not a constant of kvbench map (its constants: "
                           f"{', '.join(KNOWN)})")
        if v is None and k not in REQUIRED:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise BadValue(f"{path}: constants[{i}].values.{_shown(k)}: must be a finite number of seconds, at "
                           f"least 0, not {_shown(repr(v))}")
        values[k] = float(v)
    missing = [k for k in REQUIRED if k not in values]
    if missing:
        raise BadValue(f"{path}: constants[{i}].values: {', '.join(missing)} missing")
    cache_for_host = "restore_host_s_per_token" not in values and "restore_cache_s_per_token" in values
    values.setdefault("restore_host_s_per_token", values.get("restore_cache_s_per_token", 0.0))
    span = f.get("prompt_tokens")
    if span is not None and not (isinstance(span, list) and len(span) == 2 and all(
            isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_TOKENS for n in span)
            and span[0] <= span[1]):
        raise BadValue(f"{path}: constants[{i}].prompt_tokens: must be [shortest, longest] prompt tokens, each 1 "
                       f"to {MAX_TOKENS:,}, not {_shown(repr(span))}")
    runs = f.get("runs") if isinstance(f.get("runs"), list) else []
    more = f", the first of {len(fits)} fits" if len(fits) > 1 and scenario is None and mode is None else ""
    name = f"{_shown(f.get('group', '?'))} {_shown(f.get('mode_label', '?'))}"
    if not isinstance(f.get("busy", False), bool):
        raise BadValue(f"{path}: constants[{i}].busy: must be true or false, not {_shown(repr(f.get('busy')))}")
    busy = f.get("busy") is True
    if busy and not allow_busy:
        trials = f.get("trials") if isinstance(f.get("trials"), int) else "?"
        raise BadParameter(f"{path}: constants[{i}] ({name}) were fitted to {trials} trials measured "
                           "on a busy machine: they are not a measurement of it; run the map's scenario again on a "
                           "quiet machine, or pass {allow_busy} to use them anyway", "allow_busy")
    shown = ", ".join(_shown(r) for r in runs[:SHOWN_RUNS]) + (
        f" and {len(runs) - SHOWN_RUNS:,} more" if len(runs) > SHOWN_RUNS else "")
    where = f"{'measured on a busy machine' if busy else 'measured'}: {name}{more}, runs {shown or '?'}"
    draws = _draws(f.get("draws"), values, f"{path}: constants[{i}].draws")
    if draws is not None and cache_for_host and "restore_cache_s_per_token" in draws:
        draws["restore_host_s_per_token"] = draws["restore_cache_s_per_token"]  # the host tier's value's draws
    return Constants(values, {k: where for k in values}, tuple(span) if span else None, busy, draws)


def _draws(raw: Any, values: dict[str, float], where: str) -> dict[str, np.ndarray] | None:
    """A fit's bootstrap draws as map.json keeps them (constant → list of seconds, every list as long), checked;
    None when absent.

    Raises:
        BadValue: not a mapping of the fit's constants to equally long lists of finite numbers of at least 0.
    """
    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw:
        raise BadValue(f"{where}: must map each constant to its bootstrap values")
    out: dict[str, np.ndarray] = {}
    for k, v in raw.items():
        if k not in values:
            raise BadValue(f"{where}.{_shown(k)}: not a constant of this fit (its constants: {', '.join(values)})")
        if not isinstance(v, list) or not v or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0 for x in v):
            raise BadValue(f"{where}.{_shown(k)}: must be a list of finite numbers of seconds, at least 0")
        out[k] = np.asarray(v, dtype=np.float64)
    if len({len(v) for v in out.values()}) > 1:
        raise BadValue(f"{where}: every constant must have as many draws")
    return out


def extrapolation_warning(constants: Constants, contexts: list[int]) -> str:
    """Why a plan's prompt lengths ``contexts`` (tokens) go beyond what measured ``constants`` rest on: those
    more than 2x outside their fitted prompt lengths (:func:`~kvbench.analysis.break_even_fit.beyond_range`),
    or that the file does not say what they rest on; ``""`` for assumed constants or lengths within range."""
    if not any(v.startswith("measured") for v in constants.source.values()):
        return ""
    if constants.prompt_tokens is None:
        return ("the measured constants do not record the prompt lengths they were fitted to (a map.json of an "
                "older kvbench): the savings below may be extrapolated")
    far = beyond_range(constants.prompt_tokens, contexts)
    if not far:
        return ""
    low, high = constants.prompt_tokens
    return (f"the measured constants were fitted to prompts of {low:,}–{high:,} tokens; the savings at "
            f"{', '.join(f'{n:,}' for n in far)} tokens extrapolate beyond {EXTRAPOLATION_FACTOR}x of that range "
            f"({low / EXTRAPOLATION_FACTOR:,.0f}–{high * EXTRAPOLATION_FACTOR:,} tokens)")


def plan_break_even(constants: Constants, contexts: list[int], shares: tuple[int, ...] = PLAN_SHARES,
                    visits: int = 3, new_tokens: int = 128, host_bytes: float = 0.0, gpu_per_hour: float = 1.0,
                    host_per_gib_hour: float = 0.0) -> pd.DataFrame:
    """Per prompt length × shared share: the saving (percent) of restoring a prefix that ``visits`` requests
    share (the first computes it, every revisit restores it whole from the host tier) against recomputing every
    prompt, with ``new_tokens`` generated per request, under ``constants``
    (:func:`~kvbench.analysis.break_even_fit.predict_saving`: a point, no interval). Columns ``prompt_tokens``,
    ``shared_pct``, ``saving_pct``, ``pays`` (saving above 0)."""
    values = dict(constants.values)
    fit = Fit(values, values, values, ["host"], {k: np.asarray([v]) for k, v in values.items()})
    rows = []
    for n in contexts:
        for pct in shares:
            shape = CellShape(n, prefix_tokens(n, pct), visits, 1, 1.0, {"host": 1.0}, new_tokens, host_bytes)
            saving = predict_saving(fit, shape, gpu_per_hour, host_per_gib_hour)[0]
            rows.append({"prompt_tokens": n, "shared_pct": pct, "saving_pct": saving, "pays": saving > 0})
    return pd.DataFrame(rows)


def contexts_up_to(tokens: int) -> list[int]:
    """The prompt lengths a plan shows: powers of two from 1,024 (or ``tokens`` when smaller) up to ``tokens``,
    and ``tokens`` itself, at most 8 (the longest kept)."""
    out = [tokens]
    while out[-1] // 2 >= 1024 and len(out) < 8:
        out.append(out[-1] // 2)
    return sorted(out)


def constant_rows(constants: Constants) -> list[dict[str, Any]]:
    """Each constant with its value and source, for the plan's table."""
    return [{"constant": k, "value": v, "source": constants.source.get(k, "")} for k, v in constants.values.items()]


__all__ = ["ASSUMED_UTILISATION", "Constants", "PLAN_SHARES", "assumed_constants",
           "constant_rows", "contexts_up_to", "extrapolation_warning", "measured_constants", "plan_break_even"]
