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
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from kvbench.errors import BadValue, UserError
from kvbench.serving import KINDS
from kvbench.serving.kind import CounterSpec

#: The kinds whose counters kvbench reads.
ENGINES = tuple(k.name for k in KINDS.values() if k.counters)
TIERS = ("device", "host", "storage")

Samples = dict[str, list[tuple[dict[str, str], float]]]


class MetricsError(UserError, ValueError):
    """A ``/metrics`` reply that is not Prometheus text; the message names the URL (or file) and the first line of
    the parser's complaint."""


class UnknownEngine(BadValue):
    """An engine kind that is none of :data:`ENGINES`; the message names the kind and the allowed ones."""


#: The counters kvbench reads per server kind (each kind's :attr:`~kvbench.serving.kind.ServerKind.counters`).
COUNTERS: dict[str, tuple[CounterSpec, ...]] = {k.name: k.counters for k in KINDS.values() if k.counters}


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

    ``cached_prompt_share`` is cached ÷ all prompt tokens, as the kind's
    :attr:`~kvbench.serving.kind.ServerKind.hit_counts` counts them: llama.cpp ``prompt_tokens_cached /
    (prompt_tokens + prompt_tokens_cached)`` (its prompt_tokens exclude cached ones); vLLM ``(prefix_cache_hits +
    external_prefix_cache_hits) / prefix_cache_queries`` (the external tier counts only when reported); SGLang
    ``cached_tokens / prompt_tokens``. Where the engine splits hits by tier, ``cached_share_<tier>`` is that tier's
    hits ÷ the same denominator (vLLM: device, host; SGLang: device, host, storage). A share is None when a count
    it needs is None or the denominator is 0.

    Raises :class:`UnknownEngine` for an unknown kind."""
    specs = _specs(kind)
    d = {spec.name: deltas.get(spec.name) for spec in specs}
    cached_total, denominator = KINDS[kind].hit_counts(d)
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
