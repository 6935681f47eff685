"""AIPerf's results (``aiperf profile``'s artifact folder): ``profile_export.jsonl`` (one record per request),
``profile_export_aiperf.json`` (aggregates) and ``inputs.json`` (the payloads sent), read as one
:class:`~kvbench.results.peers.common.PeerRun`.

Read in AIPerf 0.13.0's source (``aiperf/metrics/types/``): ``time_to_first_token`` is the first content chunk −
the request's start; ``request_latency`` ends at the last content chunk (kvbench's e2e); its
``inter_token_latency`` is (request latency − TTFT) ÷ (output tokens − 1): kvbench's TPOT (vLLM's ``tpot``);
``inter_chunk_latency`` is the list of gaps between content chunks: kvbench's ITL. Times are in the record's
unit (``ms``). Warm-up records (``benchmark_phase`` ``warmup``) are left out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvbench.errors import BadFile, ResultsError
from kvbench.results.peers.common import (HEAD_CHARS, Doc, PeerRun, check_requests, prompt_key, requests_frame,
                                          scaled, short_label)
from kvbench.safe_read import read_json_file, scan_rows

TOOL = "aiperf"
RECORDS = "profile_export.jsonl"
SUMMARY = "profile_export_aiperf.json"
INPUTS = "inputs.json"
#: Seconds per unit of a time in AIPerf's files.
UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "sec": 1.0, "s": 1.0}


def is_aiperf_summary(data: Any) -> bool:
    """A parsed document is AIPerf's ``profile_export_aiperf.json``."""
    return isinstance(data, dict) and ("aiperf_version" in data or (
        isinstance(data.get("time_to_first_token"), dict) and "p50" in data["time_to_first_token"]
        and "input_config" in data))


def is_aiperf_record(data: Any) -> bool:
    """A parsed JSON line is one of AIPerf's per-request records."""
    return isinstance(data, dict) and isinstance(data.get("metadata"), dict) and isinstance(data.get("metrics"), dict)


def _seconds(metric: Doc | None) -> float | list[float] | None:
    """A record's time metric ``{"value", "unit"}`` in seconds (a list stays a list)."""
    if metric is None:
        return None
    unit = metric.text("unit")
    if unit not in UNITS:
        raise ResultsError(f"{metric.file}: {metric.where}.unit: {unit!r} is not a unit of time "
                           f"({', '.join(UNITS)})")
    value = metric.at("value")
    if isinstance(value.data, list):
        return [v * UNITS[unit] for v in value.numbers()]
    return value.number() * UNITS[unit]


def _prompts(folder: Path) -> dict[tuple[str, int], str]:
    """``inputs.json``'s prompt texts by (session id, turn index); empty without the file."""
    path = folder / INPUTS
    if not path.is_file():
        return {}
    doc = Doc(path, read_json_file(path))
    out = {}
    for session in doc.at("data").items():
        sid = session.text("session_id")
        for turn, payload in enumerate(session.at("payloads").items()):
            body = payload.data if isinstance(payload.data, dict) else {}
            prompt = body.get("prompt", body.get("messages"))
            if prompt is not None:
                out[(sid, turn)] = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)
    return out


def _record(r: Doc, prompts: dict[tuple[str, int], str]) -> dict[str, Any] | None:
    meta = r.at("metadata")
    if meta.text("benchmark_phase", optional=True) == "warmup":
        return None
    m = r.at("metrics")
    def count(tag: str) -> int | None:
        """The ``value`` count of metric ``tag``; None when the record has no such metric."""
        return (lambda d: None if d is None else d.count("value"))(m.at(tag, optional=True))

    n = count("output_sequence_length") if m.has("output_sequence_length") else count("output_token_count")
    ttft, e2e = _seconds(m.at("time_to_first_token", optional=True)), _seconds(m.at("request_latency", optional=True))
    tpot = _seconds(m.at("inter_token_latency", optional=True))
    sid = meta.text("conversation_id", optional=True)
    turn = meta.count("turn_index", optional=True) or 0
    prompt = prompts.get((sid, turn)) if sid is not None else None
    start = meta.number("request_start_ns", optional=True)
    return {"key": prompt_key(prompt) if prompt is not None else None,
            "prompt_head": prompt[:HEAD_CHARS] if prompt is not None else None,
            "prompt_tokens": count("input_sequence_length"), "n_output_tokens": n, "ttft_s": ttft, "tpot_s": tpot,
            "ntpot_s": e2e / n if e2e is not None and n else None, "e2e_s": e2e,
            "itl_s": _seconds(m.at("inter_chunk_latency", optional=True)),
            "start_s": None if start is None else start * 1e-9,
            "cached_prompt_tokens": count("usage_prompt_cache_read_tokens"),
            "ok": r.data.get("error") is None and not meta.data.get("was_cancelled") and bool(n)}


def _prefix(doc: Doc) -> tuple[int | None, int | None]:
    """The shared prefix of AIPerf's synthetic dataset (``input_config.datasets[].prefix_prompts``: ``length``
    tokens, ``pool_size`` prefixes) where one dataset has one; (None, None) otherwise."""
    sets = doc.at("input_config", "datasets", optional=True)
    found = [d.at("prefix_prompts") for d in (sets.items() if sets is not None else [])
             if d.at("prefix_prompts", optional=True) is not None]
    if len(found) != 1:
        return None, None
    return found[0].count("length", optional=True), found[0].count("pool_size", optional=True)


def _summary(path: Path) -> tuple[dict[str, dict[str, float]], float | None, int | None, str | None,
                                  tuple[int | None, int | None]]:
    """Aggregates (seconds), output tokens/s, concurrency, AIPerf's version and the shared prefix (:func:`_prefix`)
    from its summary, read once."""
    doc = Doc(path, read_json_file(path))
    out = {}
    for name, tag in (("ttft_s", "time_to_first_token"), ("tpot_s", "inter_token_latency"),
                      ("itl_s", "inter_chunk_latency"), ("e2e_s", "request_latency")):
        m = doc.at(tag, optional=True)
        if m is None:
            continue
        unit = m.text("unit", optional=True) or "ms"
        if unit not in UNITS:
            raise ResultsError(f"{path}: {tag}.unit: {unit!r} is not a unit of time ({', '.join(UNITS)})")
        out[name] = scaled({k: m.number(key, optional=True, least=0) for k, key in (
            ("p50", "p50"), ("mean", "avg"), ("p90", "p90"), ("p99", "p99"))}, UNITS[unit])
    rate = doc.at("output_token_throughput", optional=True)
    conc = doc.at("input_config", "loadgen", "concurrency", optional=True)  # before 0.13
    phases = doc.at("input_config", "phases", optional=True)
    for phase in phases.items() if phases is not None else []:
        if phase.text("kind", optional=True) == "profiling" and phase.has("concurrency"):
            conc = phase.at("concurrency")
    return (out, rate.number("avg", optional=True, least=0) if rate is not None else None,
            conc.count() if conc is not None else None, doc.text("aiperf_version", optional=True), _prefix(doc))


def read_aiperf(path: Path) -> PeerRun:
    """An AIPerf run from ``path``: its artifact folder, its ``profile_export.jsonl`` or its
    ``profile_export_aiperf.json`` (the other files are read from the same folder where they are).

    Raises:
        kvbench.errors.ResultsError: a record or summary not of AIPerf's shape (naming the file, line and key),
            or a folder with neither file.
    """
    folder = path if path.is_dir() else path.parent
    records, summary = folder / RECORDS, folder / SUMMARY
    if path.is_file() and path.name not in (RECORDS, SUMMARY):
        records = path if path.suffix == ".jsonl" else records
        summary = path if path.suffix == ".json" else summary
    if not records.is_file() and not summary.is_file():
        raise ResultsError(f"{path}: no AIPerf results here ({RECORDS} or {SUMMARY})")
    aggregates, rate, conc, version, (prefix, count) = (_summary(summary) if summary.is_file()
                                                        else ({}, None, None, None, (None, None)))
    rows, notes = [], ["AIPerf's inter_token_latency is decode only: read as TPOT; inter_chunk_latency as ITL"]
    if records.is_file():
        prompts = _prompts(folder)
        try:
            parsed, lines, skipped = scan_rows(records)
        except BadFile as exc:
            raise ResultsError(str(exc)) from None
        for data, line in zip(parsed, lines):
            if not is_aiperf_record(data):
                raise ResultsError(f"{records}: line {line}: not an AIPerf record (no metadata and metrics)")
            row = _record(Doc(records, data, f"line {line}"), prompts)
            if row is not None:
                rows.append(row)
        check_requests(records, rows, "request {i}")
        notes += [f"{records}: line {i}: skipped ({why})" for i, why in skipped]
        if not prompts:
            notes.append(f"no {INPUTS} beside {RECORDS}: requests cannot be paired by prompt")
    else:
        notes.append(f"no {RECORDS}: aggregates only")
    frame = requests_frame(rows)
    if rate is None and len(frame) and frame["ok"].any():
        done = frame[frame["ok"]]
        wall = float((done["start_s"] + done["e2e_s"]).max())
        rate = float(done["n_output_tokens"].sum()) / wall if wall > 0 else None
    return PeerRun(path=path, tool=TOOL, tool_version=version, label=short_label(folder),
                   requests=frame, aggregates=aggregates, output_tokens_per_s=rate, concurrency=conc,
                   pairing="prompt text" if len(frame) and frame["key"].notna().any() else
                   ("" if not len(frame) else "none"), notes=notes, shared_prefix_tokens=prefix, prefixes=count)


__all__ = ["INPUTS", "RECORDS", "SUMMARY", "TOOL", "is_aiperf_record", "is_aiperf_summary", "read_aiperf"]
