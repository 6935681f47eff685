"""GuideLLM's results (``guidellm run --output kind=json`` or ``kind=yaml``: ``benchmarks.json``), read as one
:class:`~kvbench.results.peers.common.PeerRun` per benchmark (one per load strategy).

Read in GuideLLM 0.8.1's source (``guidellm/schemas/base/request_stats.py``): its ``time_per_output_token_ms`` is
(last token − request start) ÷ output tokens, TTFT included: kvbench's NTPOT; its ``inter_token_latency_ms`` is
(last token − first token) ÷ (output tokens − 1): kvbench's TPOT. Its ``request_latency`` (seconds) ends when the
stream closes; kvbench's e2e ends at the last token, so e2e is taken from the request's ``timings``
(``last_token_iteration − request_start``) where they are kept. GuideLLM keeps no per-chunk times: no ITL.
Its aggregate ``time_per_output_token_ms`` and ``inter_token_latency_ms`` are weighted by tokens, so their medians
are not the medians over requests; kvbench's medians are taken over the requests.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvbench.errors import ResultsError
from kvbench.results.peers.common import (HEAD_CHARS, Doc, PeerRun, check_requests, prompt_key, requests_frame,
                                          scaled, short_label)

TOOL = "guidellm"


def is_guidellm(data: Any) -> bool:
    """A parsed document is GuideLLM's report: ``benchmarks`` list and GuideLLM's ``metadata``."""
    return (isinstance(data, dict) and isinstance(data.get("benchmarks"), list)
            and isinstance(data.get("metadata"), dict) and "guidellm_version" in data["metadata"])


def _prompt(request: Doc) -> str | None:
    """The prompt text of a request, from its ``request_args`` (a JSON string: ``body.prompt`` or
    ``body.messages``), or None where it was not kept."""
    raw = request.text("request_args", optional=True)
    if raw is None:
        return None
    try:
        args = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    body = args.get("body") if isinstance(args, dict) else None
    if not isinstance(body, dict):
        return None
    if isinstance(body.get("prompt"), str):
        return body["prompt"]
    if isinstance(body.get("messages"), list):
        return json.dumps(body["messages"], sort_keys=True)
    return None


def _request(r: Doc, ok: bool) -> dict[str, Any]:
    n = r.count("output_tokens", optional=True)
    ttft_ms = r.number("time_to_first_token_ms", optional=True)
    ttft = None if ttft_ms is None else ttft_ms / 1e3
    timings = r.at("info", "timings", optional=True)
    start = last = None
    if timings is not None:
        start = timings.number("request_start", optional=True)
        last = timings.number("last_token_iteration", optional=True)
    e2e = last - start if start is not None and last is not None else None
    ntpot_ms = r.number("time_per_output_token_ms", optional=True)
    if e2e is None and ntpot_ms is not None and n:
        e2e = ntpot_ms / 1e3 * n  # their NTPOT is (last token − start) ÷ n
    itl_ms = r.number("inter_token_latency_ms", optional=True) if n is None or n > 1 else None  # decode needs 2
    prompt = _prompt(r)
    return {"key": prompt_key(prompt) if prompt is not None else None,
            "prompt_head": prompt[:HEAD_CHARS] if prompt is not None else None,
            "prompt_tokens": r.count("prompt_tokens", optional=True), "n_output_tokens": n, "ttft_s": ttft,
            "tpot_s": None if itl_ms is None else itl_ms / 1e3,
            "ntpot_s": None if ntpot_ms is None else ntpot_ms / 1e3, "e2e_s": e2e, "itl_s": None,
            "start_s": start if start is not None else r.number("request_start_time", optional=True),
            "cached_prompt_tokens": r.count("cached_tokens", optional=True), "ok": ok}


def _aggregates(metrics: Doc) -> dict[str, dict[str, float]]:
    out = {}
    for name, metric, scale in (("ttft_s", "time_to_first_token_ms", 1e-3), ("tpot_s", "inter_token_latency_ms", 1e-3),
                                ("ntpot_s", "time_per_output_token_ms", 1e-3), ("e2e_s", "request_latency", 1.0)):
        s = metrics.at(metric, "successful", optional=True)
        if s is None:
            continue
        out[name] = scaled({"p50": s.number("median", optional=True, least=0),
                            "mean": s.number("mean", optional=True, least=0),
                            "p90": s.number("percentiles", "p90", optional=True, least=0),
                            "p99": s.number("percentiles", "p99", optional=True, least=0)}, scale)
    return out


def _prefix(doc: Doc, notes: list[str]) -> tuple[int | None, int | None]:
    """The shared prefix of GuideLLM's synthetic data (``config.spec.data[].prefix_buckets``): its tokens and
    count where there is one bucket; (None, None) otherwise, with a note where there are several."""
    data = doc.at("config", "spec", "data", optional=True)
    buckets = [b for d in (data.items() if data is not None and isinstance(data.data, list) else [])
               if (found := d.at("prefix_buckets", optional=True)) is not None for b in found.items()]
    if len(buckets) > 1:
        notes.append("several prefix buckets: no one shared prefix to map")
    if len(buckets) != 1:
        return None, None
    return buckets[0].count("prefix_tokens", optional=True), buckets[0].count("prefix_count", optional=True)


def read_guidellm(path: Path, data: Any) -> list[PeerRun]:
    """One :class:`PeerRun` per entry of ``benchmarks`` of GuideLLM's report ``data`` (parsed from ``path``).

    Raises:
        kvbench.errors.ResultsError: a key GuideLLM writes that is missing or of another type (naming the file
            and the key path).
    """
    doc = Doc(path, data)
    version = doc.text("metadata", "guidellm_version", optional=True)
    benchmarks = doc.at("benchmarks").items()
    if not benchmarks:
        raise ResultsError(f"{path}: benchmarks: empty: GuideLLM ran no benchmark")
    runs = []
    for k, b in enumerate(benchmarks):
        groups = b.at("requests")
        rows = []
        for status, ok in (("successful", True), ("incomplete", False), ("errored", False)):
            part = groups.at(status, optional=True)
            got = [_request(r, ok) for r in (part.items() if part is not None else [])]
            check_requests(path, got, f"{b.where}.requests.{status}[{{i}}]")
            rows += got
        strategy_doc = b.at("config", "strategy", optional=True)
        strategy = strategy_doc.text("type_", optional=True) if strategy_doc is not None else None
        conc = strategy_doc.number("streams", optional=True, least=1) if strategy == "concurrent" else None
        rate = strategy_doc.number("rate", optional=True) if strategy_doc is not None else None
        label = short_label(path)
        if len(benchmarks) > 1:
            label += f" [{strategy or k}" + (f" {conc:g}" if conc else f" {rate:g}/s" if rate else "") + "]"
        frame = requests_frame(rows)
        done = frame[frame["ok"]] if len(frame) else frame
        duration = b.number("duration", optional=True, least=0)
        total = b.at("metrics", "output_token_count", "successful", optional=True)
        tokens = total.number("total_sum", optional=True, least=0) if total is not None else None
        if tokens is None:
            tokens = float(done["n_output_tokens"].sum()) if len(done) else None
        notes = ["GuideLLM's time_per_output_token_ms includes TTFT: read as NTPOT; its inter_token_latency_ms "
                 "(decode only) as TPOT", "GuideLLM keeps no per-chunk times: no ITL"]
        made = b.count("metrics", "request_totals", "successful", optional=True)
        if made is not None and made > len(done):
            notes.append(f"{label}: {len(done)} of its {made} successful requests kept (GuideLLM's sample_size): "
                         "medians over those, tokens/s over all")
        if len(frame) and frame["key"].isna().any():
            notes.append("prompts not kept (GuideLLM's sample_size): those requests cannot be paired")
        prefix, count = _prefix(doc, notes)
        runs.append(PeerRun(
            path=path, tool=TOOL, tool_version=version, label=label, requests=frame,
            aggregates=_aggregates(b.at("metrics")),
            output_tokens_per_s=tokens / duration if tokens is not None and duration else None,
            concurrency=1 if strategy == "synchronous" else (int(conc) if conc else None),
            pairing="prompt text" if len(frame) else "", notes=notes, shared_prefix_tokens=prefix,
            prefixes=count))
    return runs


__all__ = ["TOOL", "is_guidellm", "read_guidellm"]
