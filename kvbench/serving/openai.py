"""A server already running at ``engine.url`` that speaks OpenAI's ``/v1/completions``: kvbench starts nothing,
checks the cold start on the first request, and reads ``/metrics`` with the names of whichever kind exports them
(:func:`kvbench.serving.metrics_kind`)."""

from __future__ import annotations

from kvbench.serving.kind import Preset, ServerKind, presets

NAME = "openai"

KIND = ServerKind(
    name=NAME,
    meaning="a server already running at engine.url (OpenAI /v1/completions); kvbench starts nothing",
    presets=presets(
        NAME,
        Preset("none", "the server as configured, expected to reuse nothing (checked: 0 cached tokens)", cold=True),
        Preset("prefix-cache", "the server as configured, reusing prefixes"),
    ),
    started=False,
    protocol="v1-completions",
)
