"""The serving engines' ``/metrics`` (Prometheus text), read defensively as per-mode counter deltas.

A server's counters run from its start, so what one mode did is the difference of two scrapes, one before and one
after the mode's requests. :data:`COUNTERS` declares, per engine kind, the counters kvbench reads: its own name, the
sample names to try (names changed across engine versions), label filters and the cache tier a counter counts hits
of. Reading never guesses: a counter the server does not report is ``None`` (never 0), a counter that went down
(the server restarted) gives no delta, and each ``None`` delta carries a note saying why.

Text is parsed with :func:`prometheus_client.parser.text_string_to_metric_families`; it is only ever parsed as
numbers and labels, nothing in it is executed or rendered.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from kvbench.errors import BadValue, UserError

ENGINES = ("llama.cpp", "vllm", "sglang")
TIERS = ("device", "host", "storage")

Samples = dict[str, list[tuple[dict[str, str], float]]]


class MetricsError(UserError, ValueError):
    """A ``/metrics`` reply that is not Prometheus text; the message names the URL (or file) and the first line of
    the parser's complaint."""


class UnknownEngine(BadValue):
    """An engine kind that is none of :data:`ENGINES`; the message names the kind and the allowed ones."""


@dataclass(frozen=True)
class CounterSpec:
    """One counter kvbench reads from an engine's ``/metrics``.

    ``name`` is kvbench's name (e.g. ``"prompt_tokens_cached"``); ``sources`` are the sample names to try in order
    (the first the server reports wins; samples keep their ``_total``); ``meaning`` is one line with the unit
    (tokens, bytes, seconds, calls, blocks). ``labels`` keeps only samples with these label values (compared
    without regard to case; a value ending in ``*`` matches as a prefix, e.g. ``storage*`` also matches
    ``storage_HiCacheFile``); samples are summed over every other label (model_name, engine, ...). ``tier`` is
    ``"device"``, ``"host"`` or ``"storage"`` for a counter of prompt tokens served from that cache tier, else None.
    """

    name: str
    sources: tuple[str, ...]
    meaning: str
    labels: dict[str, str] = field(default_factory=dict)
    tier: str | None = None


def _c(name: str, sources: str | tuple[str, ...], meaning: str, tier: str | None = None, **labels: str) -> CounterSpec:
    return CounterSpec(name, (sources,) if isinstance(sources, str) else sources, meaning, dict(labels), tier)


COUNTERS: dict[str, tuple[CounterSpec, ...]] = {
    # llama-server --metrics (tools/server/server-task.cpp, to_metrics): unlabelled counters.
    "llama.cpp": (
        _c("prompt_tokens", "llamacpp:prompt_tokens_total", "prompt tokens evaluated, excluding cached ones (tokens)"),
        _c("prompt_tokens_cached", "llamacpp:prompt_tokens_cached_total",
           "prompt tokens reused from a slot's cache (tokens); absent in older builds"),
        _c("tokens_predicted", "llamacpp:tokens_predicted_total", "generated tokens (tokens)"),
        _c("prompt_seconds", "llamacpp:prompt_seconds_total", "time spent evaluating prompts (seconds)"),
        _c("tokens_predicted_seconds", "llamacpp:tokens_predicted_seconds_total",
           "time spent generating tokens (seconds)"),
        _c("n_decode", "llamacpp:n_decode_total",
           "llama_decode() calls, speculative and multimodal ones excluded (calls)"),
    ),
    # vLLM v1 (vllm/v1/metrics/loggers.py; the offloading connector's metrics). Counters are exposed by
    # prometheus_client, so samples end in _total; 0.8-era builds called the local prefix cache gpu_prefix_cache_*.
    "vllm": (
        _c("prefix_cache_queries", ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
           "prompt tokens looked up in the device prefix cache (tokens)"),
        _c("prefix_cache_hits", ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
           "prompt tokens found in the device prefix cache (tokens)", tier="device"),
        _c("external_prefix_cache_queries", "vllm:external_prefix_cache_queries_total",
           "prompt tokens looked up in the KV connector / offload tier (tokens)"),
        _c("external_prefix_cache_hits", "vllm:external_prefix_cache_hits_total",
           "prompt tokens loaded from the KV connector / offload tier, host RAM with native offloading (tokens)",
           tier="host"),
        _c("prompt_tokens", "vllm:prompt_tokens_total", "prompt tokens of the requests, cached ones included (tokens)"),
        _c("generation_tokens", "vllm:generation_tokens_total", "generated tokens (tokens)"),
        _c("kv_offload_bytes_device_to_host", "vllm:kv_offload_total_bytes_total",
           "KV bytes the offloading connector copied device to host (bytes)", transfer_type="GPU_to_CPU"),
        _c("kv_offload_bytes_host_to_device", "vllm:kv_offload_total_bytes_total",
           "KV bytes the offloading connector copied host to device (bytes)", transfer_type="CPU_to_GPU"),
        _c("kv_offload_seconds_device_to_host", "vllm:kv_offload_total_time_total",
           "time of the offloading connector's device-to-host copies (seconds)", transfer_type="GPU_to_CPU"),
        _c("kv_offload_seconds_host_to_device", "vllm:kv_offload_total_time_total",
           "time of the offloading connector's host-to-device copies (seconds)", transfer_type="CPU_to_GPU"),
        _c("kv_offload_stores_skipped", "vllm:kv_offload_stores_skipped_total",
           "offload stores skipped below the reuse threshold (stores); only with a store threshold"),
        _c("kv_offload_tiering_read_bytes", "vllm:kv_offload_tiering_read_bytes_total",
           "KV bytes read from secondary offload tiers into the primary one (bytes); tiered offloading builds"),
        _c("kv_offload_tiering_write_bytes", "vllm:kv_offload_tiering_write_bytes_total",
           "KV bytes written from the primary offload tier to secondary ones (bytes); tiered offloading builds"),
    ),
    # SGLang --enable-metrics (python/sglang/srt/metrics/collector.py). Builds before the HiCache breakdown report
    # sglang:cached_tokens_total without a cache_source label: "cached_tokens" (all sources) reads both.
    "sglang": (
        _c("prompt_tokens", "sglang:prompt_tokens_total",
           "prompt tokens of the requests, cached ones included (tokens)"),
        _c("generation_tokens", "sglang:generation_tokens_total", "generated tokens (tokens)"),
        _c("cached_tokens", "sglang:cached_tokens_total", "prompt tokens served from any cache tier (tokens)"),
        _c("cached_tokens_device", "sglang:cached_tokens_total", "prompt tokens served from the device radix cache "
           "(tokens)", tier="device", cache_source="device"),
        _c("cached_tokens_host", "sglang:cached_tokens_total", "prompt tokens served from HiCache host memory (tokens)",
           tier="host", cache_source="host"),
        _c("cached_tokens_storage", "sglang:cached_tokens_total", "prompt tokens served from HiCache storage "
           "(tokens)", tier="storage", cache_source="storage*"),
    ),
}


def _specs(kind: str) -> tuple[CounterSpec, ...]:
    if kind not in COUNTERS:
        raise UnknownEngine(f"unknown engine kind {kind!r}: allowed are {', '.join(ENGINES)}")
    return COUNTERS[kind]


def _parse(text: str, source: str) -> tuple[Samples, set[str]]:
    """The samples of ``text`` and the sample names its TYPE lines declare (a labelled counter no request has
    incremented yet is declared with no sample)."""
    samples: Samples = {}
    declared: set[str] = set()
    try:
        for family in text_string_to_metric_families(text):
            declared.add(family.name + "_total" if family.type == "counter" else family.name)
            for s in family.samples:
                samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    except Exception as exc:  # the parser raises ValueError, IndexError, KeyError, TypeError on bad text
        cause = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise MetricsError(f"{source}: the /metrics reply is not Prometheus text: {cause}") from exc
    return samples, declared


def parse_samples(text: str, source: str = "/metrics") -> Samples:
    """Every sample of a Prometheus text exposition: sample name (``_total`` kept) -> ``[(labels, value)]`` in the
    order of the text. ``source`` (the URL or file) names the text in errors.

    Raises :class:`MetricsError` when the text cannot be parsed."""
    return _parse(text, source)[0]


def _matches(labels: Mapping[str, str], wanted: Mapping[str, str]) -> bool:
    for key, value in wanted.items():
        have = labels.get(key, "").lower()
        want = value.lower()
        if not (have.startswith(want[:-1]) if want.endswith("*") else have == want):
            return False
    return True


def _read(spec: CounterSpec, samples: Samples, declared: set[str]) -> tuple[float | None, str, str]:
    """(value, the sample name it was read from, why it is None)."""
    why = f"looked for {', '.join(spec.sources)}"
    for name in spec.sources:
        if name not in samples:
            if name in declared:  # declared with no sample: a labelled counter that never went up
                return 0.0, name, ""
            continue
        rows = samples[name]
        if spec.labels and not any(all(k in lab for k in spec.labels) for lab, _ in rows):
            why = f"{name} has no {', '.join(spec.labels)} label"
            continue
        value = sum(v for lab, v in rows if _matches(lab, spec.labels))
        if not math.isfinite(value):
            return None, name, f"{name} is not a finite number ({value})"
        return float(value), name, ""
    return None, "", why


def read_counters(kind: str, text: str, source: str = "/metrics") -> dict[str, float | None]:
    """kvbench name -> the counter's value in one scrape (in the counter's unit, see :data:`COUNTERS`), summed over
    the samples that match its labels (over model_name, engine, ...); None where the server does not report it
    (never 0). A counter declared by a TYPE line with no sample yet (a labelled counter not incremented) reads 0.

    Raises :class:`UnknownEngine` (a ``ValueError``) for a kind not in :data:`ENGINES` and :class:`MetricsError`
    for text that is not Prometheus text."""
    specs = _specs(kind)
    samples, declared = _parse(text, source)
    return {spec.name: _read(spec, samples, declared)[0] for spec in specs}


def _fmt(value: float) -> str:
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:.6g}"


def counter_deltas(kind: str, before: str | None, after: str | None,
                   source: str = "/metrics") -> tuple[dict[str, float | None], dict[str, str]]:
    """What one mode did: ``(deltas, notes)``. ``deltas`` maps each kvbench counter name to after − before (in its
    unit); it is None when either scrape lacks the counter, when a scrape is missing (``before``/``after`` None), or
    when the counter went down. ``notes`` maps the name of each None delta to why: "not reported by this server
    (...)", "went down from X to Y (the server restarted?)", "no /metrics scrape before" (after, before or after).

    Raises :class:`UnknownEngine` for an unknown kind and :class:`MetricsError` (naming ``source``) for text that is
    not Prometheus text."""
    specs = _specs(kind)
    parsed = [None if text is None else _parse(text, f"{source} (scrape {side})")
              for side, text in (("before", before), ("after", after))]
    deltas: dict[str, float | None] = {}
    notes: dict[str, str] = {}
    missing = [side for side, p in zip(("before", "after"), parsed) if p is None]
    for spec in specs:
        deltas[spec.name] = None
        if missing:
            notes[spec.name] = f"no /metrics scrape {' or '.join(missing)}"
            continue
        (b, b_from, b_why), (a, a_from, a_why) = (_read(spec, *p) for p in parsed)
        if a is None or b is None:
            side = "" if a is None and b is None else (" in the scrape before" if b is None else " in the scrape after")
            notes[spec.name] = f"not reported by this server{side} ({b_why or a_why})"
        elif b_from != a_from:
            notes[spec.name] = f"read from {b_from} before and {a_from} after (the server changed?)"
        elif a < b:
            notes[spec.name] = f"went down from {_fmt(b)} to {_fmt(a)} (the server restarted?)"
        else:
            deltas[spec.name] = a - b
    return deltas, notes


def _share(part: float | None, whole: float | None) -> float | None:
    if part is None or whole is None or whole <= 0:
        return None
    return part / whole


def hit_shares(kind: str, deltas: Mapping[str, float | None]) -> dict[str, float | None]:
    """Shares of prompt tokens served from cache during a mode (fractions 0..1, from :func:`counter_deltas`).

    ``cached_prompt_share`` is cached ÷ all prompt tokens: llama.cpp ``prompt_tokens_cached / (prompt_tokens +
    prompt_tokens_cached)`` (its prompt_tokens exclude cached ones); vLLM ``(prefix_cache_hits +
    external_prefix_cache_hits) / prefix_cache_queries`` (the external tier counts only when reported); SGLang
    ``cached_tokens / prompt_tokens``. Where the engine splits hits by tier, ``cached_share_<tier>`` is that tier's
    hits ÷ the same denominator (vLLM: device, host; SGLang: device, host, storage). A share is None when a count
    it needs is None or the denominator is 0.

    Raises :class:`UnknownEngine` for an unknown kind."""
    specs = _specs(kind)
    d = {spec.name: deltas.get(spec.name) for spec in specs}
    if kind == "llama.cpp":
        cached, processed = d["prompt_tokens_cached"], d["prompt_tokens"]
        whole = None if cached is None or processed is None else cached + processed
        cached_total, denominator = cached, whole
    elif kind == "vllm":
        hits, external = d["prefix_cache_hits"], d["external_prefix_cache_hits"]
        cached_total = None if hits is None else hits + (external or 0.0)
        denominator = d["prefix_cache_queries"]
    else:
        cached_total, denominator = d["cached_tokens"], d["prompt_tokens"]
    shares: dict[str, float | None] = {"cached_prompt_share": _share(cached_total, denominator)}
    for spec in specs:
        if spec.tier is not None:
            shares[f"cached_share_{spec.tier}"] = _share(d[spec.name], denominator)
    return shares


def measured_deltas(kind: str, before: str | None, after: str | None,
                    hold_scrapes: Sequence[tuple[str | None, str | None]], holds_sent: int,
                    source: str = "/metrics") -> dict[str, Any]:
    """A mode's ``/metrics`` deltas for run.json, from the scrape ``before`` its measured requests to ``after``,
    with its unrecorded hold requests taken out where each ran alone (``hold_scrapes``: the scrapes just before
    and after each such hold; ``holds_sent``: how many holds were sent in all).

    Returns ``metrics_delta`` (the measured requests' own; where a hold overlapped another request, everything,
    holds included: ``metrics_holds.separated`` < ``sent`` says so and ``metrics_notes.holds`` why),
    ``metrics_delta_holds`` (the holds' own; None where not separable), ``metrics_holds`` (``sent``,
    ``separated``), ``metrics_notes`` (why a delta is None) and ``metrics_shares`` (:func:`hit_shares` of
    ``metrics_delta``). Text that is not Prometheus text gives no deltas and a ``metrics`` note; raises
    :class:`UnknownEngine` for an unknown kind."""
    try:
        deltas, notes = counter_deltas(kind, before, after, source)
        own = [counter_deltas(kind, b, a, source)[0] for b, a in hold_scrapes]
    except MetricsError as exc:  # a server whose /metrics is no Prometheus text: not reported
        return {"metrics_delta": {}, "metrics_notes": {"metrics": str(exc)}, "metrics_delta_holds": None,
                "metrics_holds": {"sent": holds_sent, "separated": 0}, "metrics_shares": hit_shares(kind, {})}
    held: dict[str, float | None] | None = None
    if len(own) == holds_sent:
        held = {k: sum(d[k] for d in own) if all(d[k] is not None for d in own) else None for k in deltas}
        deltas = {k: None if v is None or held[k] is None else v - held[k] for k, v in deltas.items()}
        for k, v in deltas.items():
            if v is None and k not in notes:
                notes[k] = "a hold's own share could not be read"
    elif holds_sent:
        notes["holds"] = (f"includes {holds_sent - len(own)} of its {holds_sent} unrecorded hold requests, sent "
                          "while other requests were in flight")
    return {"metrics_delta": deltas, "metrics_notes": notes, "metrics_delta_holds": held,
            "metrics_holds": {"sent": holds_sent, "separated": len(own)}, "metrics_shares": hit_shares(kind, deltas)}
