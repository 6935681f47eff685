"""The programs of the servers kvbench starts: where each engine's program is found, what keeps it from starting
here, and what in a scenario needs the user's consent on the command line (``--trust-server-config``) before
kvbench runs it: another program than the engine's own, or flags of
:func:`~kvbench.scenario.server_flags.consent_reasons`."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbench.scenario.server_flags import consent_reasons
from kvbench.scenario.servers import STARTED_KINDS, EngineSpec, ServerMode
from kvbench.serving import KINDS

@dataclass(frozen=True)
class Program:
    """How a server's program starts: ``argv``, the words before the server's own (``llama-server``; ``vllm
    serve``; ``<python> -m <module>``), and ``module``: ``argv`` is a Python interpreter running the kind's
    :attr:`~kvbench.serving.kind.ServerKind.python_module`."""

    argv: tuple[str, ...]
    module: bool = False


def module_program(kind: str, python: str) -> Program:
    """``python -I -m <module>``: isolated (``-I``), so that neither the working directory nor ``PYTHONPATH`` can
    put a module of someone else's before the engine's own."""
    return Program((python, "-I", "-m", KINDS[kind].python_module), module=True)


def own_python(kind: str) -> Path | None:
    """The Python of the kind's own environment under kvbench's (``<prefix>/<own_env>/bin/python``, where
    ``make vllm`` installs vLLM's CPU build), when it is there; else None."""
    own_env = KINDS[kind].own_env
    python = Path(sys.prefix) / own_env / "bin" / "python" if own_env else None
    return python if python is not None and os.access(python, os.X_OK) else None


def _own_programs(kind: str) -> list[Program]:
    """The kind's own programs found here, in the order kvbench picks them: the Python of its environment under
    kvbench's (:func:`own_python`), its named program in kvbench's ``<prefix>/bin`` (where ``make llama-server``
    puts llama-server) or on PATH, and kvbench's own interpreter where the kind's module is installed in it."""
    k, out = KINDS[kind], []
    if (python := own_python(kind)) is not None:
        out.append(module_program(kind, str(python)))
    if k.program:
        found = shutil.which(k.program[0], path=str(Path(sys.prefix) / "bin")) or shutil.which(k.program[0])
        if found:
            out.append(Program((found, *k.program[1:])))
    if k.python_module and importlib.util.find_spec(k.python_module.split(".")[0]) is not None:
        out.append(module_program(kind, sys.executable))
    return out


def _executable(given: str) -> str | None:
    return shutil.which(given) if "/" not in given else (given if shutil.which(given) else None)


def server_program(engine: EngineSpec) -> Program | None:
    """How ``engine``'s server starts: ``engine.python`` running the kind's module, ``engine.binary`` (with vLLM's
    ``serve``; for a kind that is only a module, a Python running it), else the first of the kind's own programs
    found here (:func:`_own_programs`). None when none is found (or for ``openai`` and ``transformers``)."""
    if engine.kind not in STARTED_KINDS:
        return None
    kind = KINDS[engine.kind]
    if engine.python is not None:
        found = _executable(engine.python)
        return module_program(engine.kind, found) if found else None
    if engine.binary is not None:
        found = _executable(engine.binary)
        if found is None:
            return None
        return Program((found, *kind.program[1:])) if kind.program else module_program(engine.kind, found)
    own = _own_programs(engine.kind)
    return own[0] if own else None


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _same_program(given: Program, own: Program) -> bool:
    """Whether ``given`` runs what ``own`` runs: the same file for a program; for a Python running a module, the
    same interpreter in the same folder (every virtual environment's ``python`` links to one interpreter: the
    environment is the folder, ``python`` and ``python3`` of one ``bin`` are the same)."""
    if given.module or own.module:
        a, b = Path(os.path.abspath(given.argv[0])), Path(os.path.abspath(own.argv[0]))
        return given.module == own.module and a.parent == b.parent and _same_file(str(a), str(b))
    return _same_file(given.argv[0], own.argv[0])


def consent_needed(s: Any) -> list[tuple[str, str]]:
    """What a scenario ``s`` with a server engine would have kvbench run or fetch beyond the engine's own program
    serving a model on this machine: ``(key path, reason)`` pairs for an ``engine.python`` or ``engine.binary`` that
    is none of the programs kvbench picks itself (:func:`_own_programs`; one that is not found is
    :func:`server_problems`' to refuse), an ``engine.model`` that a Hugging Face kind would fetch from the hub (no
    such path here), and the server flags of :func:`consent_reasons` in ``engine.args`` and each mode's ``args``.
    ``kvbench run`` refuses such a scenario (and a run folder holding one) unless given ``--trust-server-config``;
    ``validate`` warns."""
    e = s.engine
    if e.kind not in STARTED_KINDS:
        return []
    out, kind = [], KINDS[e.kind]
    given = server_program(e) if e.python is not None or e.binary is not None else None
    if given is not None:
        key = "python" if e.python is not None else "binary"
        own = _own_programs(e.kind)
        if not any(_same_program(given, p) for p in own):
            picks = "; ".join(" ".join(p.argv) for p in own) or "none found here"
            out.append((f"engine.{key}", f"{getattr(e, key)} is not a program kvbench picks itself for {kind.name} "
                        f"({picks}): kvbench would run this program"))
    if kind.model_format == "hf" and e.model is not None and not Path(e.model).exists():
        out.append(("engine.model", f"{e.model} is no folder here: the {kind.name} server would fetch it from the "
                                    "Hugging Face hub (leave engine.model out to serve the scenario's model)"))
    out += [("engine.args", why) for why in consent_reasons(e.kind, e.args)]
    for i, m in enumerate(s.modes):
        if isinstance(m, ServerMode):
            out += [(f"modes[{i}].args", why) for why in consent_reasons(e.kind, m.args)]
    return out


def server_problems(s: Any) -> list[tuple[str, str]]:
    """What keeps scenario ``s`` (a server engine) from starting its server here: ``(key path, message)`` pairs
    (the program not found, a preset that needs a GPU on a machine without one is a warning, not here)."""
    e = s.engine
    if e.kind in STARTED_KINDS and server_program(e) is None:
        for key in ("python", "binary"):
            if getattr(e, key) is not None:
                return [(f"engine.{key}", f"{getattr(e, key)} is not an executable file or a program on PATH")]
        kind = KINDS[e.kind]
        what = " or ".join(([kind.program[0]] if kind.program else []) +
                           ([f"the {kind.python_module.split('.')[0]} package"] if kind.python_module else []))
        return [("engine.kind", f"{what} not found in kvbench's environment or on PATH: {kind.install_hint}")]
    return []


def cpu_refusals(s: Any, device_type: str) -> list[tuple[str, str]]:
    """What of server scenario ``s`` cannot run on a CPU, when the server computes on ``device_type`` ``cpu``:
    the kind's own program (its :attr:`~kvbench.serving.kind.ServerKind.cpu_refusal`, unless ``engine.python``
    or ``engine.binary`` names another build), else each mode whose preset cannot (its
    :attr:`~kvbench.serving.kind.Preset.cpu_refusal`): ``(key path, message)`` pairs. ``kvbench run`` refuses
    them before any server starts."""
    from kvbench.scenario.servers import preset_of

    if device_type != "cpu" or s.engine.kind not in STARTED_KINDS:
        return []
    kind = KINDS[s.engine.kind]
    if kind.cpu_refusal is not None and s.engine.python is None and s.engine.binary is None:
        return [("engine.kind", f"{kind.name} cannot serve on a CPU here: {kind.cpu_refusal}; run it on a GPU "
                                "machine (device: cuda), or give engine.python for a CPU build of your own")]
    return [(f"modes[{i}]", f"preset {m.kind} of {s.engine.kind} cannot run on a CPU: {p.cpu_refusal}; run it on a "
                            "GPU machine (device: cuda)")
            for i, m in enumerate(s.modes) if isinstance(m, ServerMode)
            and (p := preset_of(s.engine.kind, m)).cpu_refusal is not None]


def server_notices(s: Any, consent: bool = True) -> list[tuple[str, str]]:
    """What a server scenario ``s`` does that its user should know before running it: ``(key path, message)``
    pairs for each :func:`consent_needed` item (with ``consent``: ``kvbench run``, which refuses or names them
    itself, leaves them out), an ``openai`` URL reached in plaintext over the network, and requests sent through
    the environment's proxy."""
    from kvbench.scenario.servers import loopback_url

    e = s.engine
    out = [(path, f"{why} (kvbench run refuses it without --trust-server-config)")
           for path, why in (consent_needed(s) if consent else [])]
    if e.kind not in STARTED_KINDS and e.url is not None:
        urls = [("engine.url", e.url)] + [(f"modes[{i}].url", m.url) for i, m in enumerate(s.modes)
                                          if getattr(m, "url", None) is not None]
        for key, url in urls:
            if url.startswith("http://") and not loopback_url(url):
                out.append((key, f"{url} is another machine over plain http: every prompt and reply crosses the "
                                 "network unencrypted (use https:// or a tunnel)"))
        if e.use_env_proxy:
            out.append(("engine.use_env_proxy", "every request goes through the proxy the environment names "
                                                "(HTTP_PROXY / HTTPS_PROXY / ALL_PROXY): it sees every prompt and "
                                                "its latency is in every TTFT"))
    return out
