"""A server already running at ``engine.url`` that speaks OpenAI's ``/v1/completions``: kvbench starts nothing,
checks the cold start on the first request, and reads ``/metrics`` with the names of whichever kind exports them
(:func:`kvbench.serving.metrics_kind`). A mode may name its own running server (``url``): the ``tier`` preset is the
same deployment with a host or disk tier on, whose tier saving is taken against ``prefix-cache``."""

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
        Preset("tier", "a server with a host or disk KV tier on top of its prefix cache (give the mode the url of "
               "that deployment): its tier saving is taken against prefix-cache", tier="host"),
    ),
    started=False,
    prefix_preset="prefix-cache",
    protocol="v1-completions",
)
