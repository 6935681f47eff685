"""llm-d Benchmark Reports (v0.2 and v0.2.1, JSON or YAML) read as aggregates-only
:class:`~kvbench.results.peers.common.PeerRun` objects: a report holds statistics, never requests.

Units are read from each Statistics object (``ms``/``s``, ``ms/token``/``s/token``). llm-d's own GuideLLM
converter writes GuideLLM's ``time_per_output_token_ms`` (TTFT included) as ``time_per_output_token``: where the
load generator is GuideLLM that figure is read as NTPOT, and said so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvbench.errors import ResultsError
from kvbench.results.peers.common import Doc, PeerRun, requests_frame

TOOL = "llm-d report"
VERSIONS = ("0.2", "0.2.1")
#: Seconds per unit of a latency's ``units``.
UNITS = {"ms": 1e-3, "s": 1.0, "ms/token": 1e-3, "s/token": 1.0}
#: The units each latency field may have (llm-d's pydantic model: TIME or GEN_LATENCY).
FIELD_UNITS = {"time_to_first_token": ("ms", "s"), "request_latency": ("ms", "s"),
               "normalized_time_per_output_token": ("ms/token", "s/token"),
               "time_per_output_token": ("ms/token", "s/token"), "inter_token_latency": ("ms/token", "s/token")}


def is_llmd_report(data: Any) -> bool:
    """A parsed document is an llm-d Benchmark Report (version 0.2 or 0.2.1)."""
    return (isinstance(data, dict) and str(data.get("version")) in VERSIONS and isinstance(data.get("run"), dict)
            and isinstance(data.get("results"), dict))


def _stats(s: Doc, allowed: tuple[str, ...] = tuple(UNITS)) -> dict[str, float]:
    units = s.text("units")
    if units not in allowed:
        what = "a unit of time" if allowed == tuple(UNITS) else "a unit this field can have"
        raise ResultsError(f"{s.file}: {s.where}.units: {units!r} is not {what} ({', '.join(allowed)})")
    return {k: v * UNITS[units] for k in ("p50", "mean", "p90", "p99")
            if (v := s.number(k, optional=True, least=0)) is not None}


def read_llmd(path: Path, data: Any) -> PeerRun:
    """The aggregates of the Benchmark Report ``data`` (parsed from ``path``).

    Raises:
        kvbench.errors.ResultsError: a key the schema declares that is missing or of another type, or a unit the
            field cannot have (naming the file and the key path).
    """
    doc = Doc(path, data)
    load = doc.at("scenario", "load", "standardized", optional=True)
    tool = load.text("tool", optional=True) if load is not None else None
    agg = doc.at("results", "request_performance", "aggregate", optional=True)
    aggregates: dict[str, dict[str, float]] = {}
    notes = ["an llm-d report holds aggregates only: no requests to pair",
             "an llm-d report's output rate is over the load's wall-clock time (idle time included); kvbench cost of "
             "a kvbench run prices the time requests were in flight"]
    rate = None
    if agg is not None:
        lat = agg.at("latency", optional=True)
        guidellm_tpot = (tool or "").lower().startswith("guidellm")
        names = {"time_to_first_token": "ttft_s", "normalized_time_per_output_token": "ntpot_s",
                 "time_per_output_token": "ntpot_s" if guidellm_tpot else "tpot_s",
                 "inter_token_latency": "tpot_s" if guidellm_tpot else "itl_s", "request_latency": "e2e_s"}
        if guidellm_tpot:
            notes.append("load by GuideLLM: its time_per_output_token includes TTFT, read as NTPOT; its "
                         "inter_token_latency (decode only) as TPOT")
        for field, name in names.items():
            s = lat.at(field, optional=True) if lat is not None else None
            if s is not None:
                aggregates.setdefault(name, _stats(s, FIELD_UNITS[field]))
        out = agg.at("throughput", "output_token_rate", optional=True)
        if out is not None:
            if out.text("units") != "tokens/s":
                raise ResultsError(f"{path}: {out.where}.units: must be 'tokens/s', not {out.data.get('units')!r}")
            rate = out.number("mean", least=0)
    requests = agg.at("requests", optional=True) if agg is not None else None
    total = requests.count("total", optional=True) if requests is not None else None
    failures = (requests.count("failures", optional=True) or 0) if requests is not None else 0
    if total is not None and failures > total:
        raise ResultsError(f"{path}: {requests.where}.failures: {failures} failures of {total} requests")
    hit = None
    for component in (doc.at("results", "observability", "components", optional=True) or Doc(path, [])).items():
        rate_doc = component.at("aggregate", "cache_hit_rate", optional=True)
        if rate_doc is not None and hit is None:
            units, most = rate_doc.text("units"), {"percent": 100.0, "fraction": 1.0}
            if units not in most:
                raise ResultsError(f"{path}: {rate_doc.where}.units: {units!r}: a hit rate is 'percent' or 'fraction'")
            hit = rate_doc.number("mean", least=0) / most[units]
            if hit > 1:
                raise ResultsError(f"{path}: {rate_doc.where}.mean: a hit rate above 100%")
    conc = load.at("concurrency", optional=True) if load is not None else None
    concurrency = None
    if conc is not None and not (isinstance(conc.data, float) and conc.data == float("inf")):
        concurrency = conc.count()  # a whole number ≥ 0 (4.0 is 4; true, -3 and 2.5 refused)
        if concurrency < 1 or isinstance(conc.data, bool):
            raise ResultsError(f"{path}: {conc.where}: concurrency must be a whole number ≥ 1, not {conc.data!r}")
    ext = doc.at("results", "observability", "kvbench", optional=True)
    label = path.name
    mode = ext.text("mode", "label") if ext is not None and ext.at("mode", "label", optional=True) else None
    if mode is not None and mode not in label:
        label += f" ({mode})"
    version = load.text("tool_version", optional=True) if load is not None else None
    prefix = load.at("prefix", optional=True) if load is not None else None
    prefix_len = prefix.number("prefix_len", "value", optional=True) if prefix is not None else None
    return PeerRun(path=path, tool=TOOL, tool_version=f"{tool} {version}".strip() if tool else None, label=label,
                   requests=requests_frame([]), aggregates=aggregates, output_tokens_per_s=rate,
                   concurrency=concurrency, notes=notes,
                   shared_prefix_tokens=int(prefix_len) if prefix_len is not None else None,
                   prefixes=prefix.count("num_prefixes", optional=True) if prefix is not None else None,
                   reported_requests=None if total is None else total - failures, reported_cached_share=hit,
                   none_mode=ext is not None and ext.at("mode", "kind", optional=True) is not None
                   and ext.data["mode"]["kind"] == "none")


__all__ = ["TOOL", "VERSIONS", "is_llmd_report", "read_llmd"]
