"""How kvbench starts a server and finds one running: a mode's command line (:func:`server_argv`), its program's
version (:func:`program_version`) and the process serving a loopback URL (:func:`running_pid`)."""

from __future__ import annotations

import functools
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvbench.bench.engines.server.process import probe_output
from kvbench.bench.engines.server.stream import printable
from kvbench.bench.telemetry.server import listening_pid
from kvbench.scenario import Scenario
from kvbench.scenario.programs import Program, server_program
from kvbench.scenario.servers import Preset, loopback_url, size_text
from kvbench.serving import KINDS
from kvbench.serving.kind import Launch


def server_argv(s: Scenario, preset: Preset, mode: Any, port: int, slots: int, ctx_per_slot: int,
                slot_dir: Path, model_dir: str | None = None, device: str = "cpu",
                kv_bytes: int | None = None, program: Program | None = None) -> tuple[list[str], dict[str, str]]:
    """The command line of ``mode``'s server and the variables its environment gets over kvbench's: the program
    (:func:`~kvbench.scenario.programs.server_program`), the kind's words before the flags (vLLM's model as
    ``serve``'s positional word, its defaults), the engine's flags, the preset's, the mode's (a later flag wins
    where the server reads the last one), then kvbench's own last: the model, 127.0.0.1 and ``port``, metrics on,
    slots, context and seed, so that no earlier word can change where the server listens (the scenario's flags
    cannot name these either: :func:`~kvbench.scenario.server_flags.reserved_flag_problems`). ``slots``: parallel
    requests; ``ctx_per_slot``: tokens each holds; ``model_dir``: what the server loads when ``engine.model`` is
    not given (the scenario's model exported as a Hugging Face directory,
    :func:`~kvbench.bench.engines.server.engine.load_server_engine`); ``device``: what it computes on; ``kv_bytes``: the
    slots' full KV (bytes); ``program``: the server's program when the caller has it already (default: looked up). The
    kind's :attr:`~kvbench.serving.kind.ServerKind.launch` gives the words around the scenario's and
    :attr:`~kvbench.serving.kind.ServerKind.environment` the variables."""
    e, kind = s.engine, KINDS[s.engine.kind]
    program = program or server_program(e)
    size = mode.size if mode.size is not None else (preset.size[1] if preset.size else None)
    args = [a.replace("{size}", size_text(size) if size is not None else "").replace("{slot_dir}", str(slot_dir))
            for a in preset.args]
    at = Launch(e.model or model_dir, s.model.name, port, slots, ctx_per_slot, s.seed,
                module=program is not None and program.module, device=device, kv_bytes=kv_bytes,
                offline=Path(e.model).exists() if e.model else model_dir is not None,
                flags=(*e.args, *mode.args))
    head, own = kind.launch(at)
    env = kind.environment(at) if kind.environment is not None else {}
    return [*(program.argv if program else ()), *head, *e.args, *args, *mode.args, *own], env


def program_version(argv: Sequence[str]) -> str | None:
    """The first line a server's program (``argv[0]``) prints for ``--version`` (llama-server, vllm), or None;
    asked once per program (:func:`_version_of`)."""
    return _version_of(argv[0]) if argv else None


@functools.cache
def _version_of(program: str) -> str | None:
    text = (probe_output([program, "--version"]) or "").strip().splitlines()
    return printable(text[0], 200) if text else None


def running_pid(url: str) -> int | None:
    """The process serving ``url`` when it is on this machine (a loopback URL): the one listening on its port
    (:func:`~kvbench.bench.telemetry.server.listening_pid`); None for another machine's server, whose CPU is not
    this machine's load."""
    if not loopback_url(url):
        return None
    parts = urllib.parse.urlsplit(url)
    return listening_pid(parts.port or (443 if parts.scheme == "https" else 80))
