"""The programs of the servers kvbench starts: where each engine's program is found, what keeps it from starting
here, and what in a scenario needs the user's consent on the command line (``--trust-server-config``) before
kvbench runs it: another program than the engine's own, or flags of :func:`~kvbench.scenario.server_flags.
consent_reasons`."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from kvbench.scenario.server_flags import consent_reasons
from kvbench.scenario.servers import STARTED_KINDS, EngineSpec, ServerMode
from kvbench.serving import KINDS

#: The program each started kind runs when ``engine.binary`` is not given
#: (:attr:`~kvbench.serving.kind.ServerKind.program`).
DEFAULT_PROGRAMS = {k.name: k.program for k in KINDS.values() if k.started}


def _default_program(kind: str) -> list[str] | None:
    """The argv prefix of ``kind``'s own program: kvbench's build in ``<prefix>/bin`` (where ``make
    llama-server`` puts llama-server), else the named program on PATH; a kind whose program is a Python module
    (SGLang): that module of this interpreter."""
    default, module = DEFAULT_PROGRAMS[kind], KINDS[kind].python_module
    if module is not None:  # a module of this interpreter's environment
        return [sys.executable, *default[1:]] if importlib.util.find_spec(module) is not None else None
    found = shutil.which(default[0], path=str(Path(sys.prefix) / "bin")) or shutil.which(default[0])
    return [found, *default[1:]] if found else None


def server_program(engine: EngineSpec) -> list[str] | None:
    """The argv prefix that starts ``engine``'s server: ``engine.binary`` (with vLLM's ``serve``), else the
    default program in kvbench's own environment (``<prefix>/bin``, where ``make llama-server`` puts
    llama-server), else on PATH. None when it is not found (or for ``openai`` and ``transformers``)."""
    if engine.kind not in STARTED_KINDS:
        return None
    if engine.binary is not None:
        found = shutil.which(engine.binary) if "/" not in engine.binary else (
            engine.binary if shutil.which(engine.binary) else None)
        return [found, *DEFAULT_PROGRAMS[engine.kind][1:]] if found else None
    return _default_program(engine.kind)


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def consent_needed(s: Any) -> list[tuple[str, str]]:
    """What a scenario ``s`` with a server engine would have kvbench run beyond the engine's own program serving
    the scenario's model: ``(key path, reason)`` pairs for an ``engine.binary`` that is not kvbench's build of
    the engine nor the engine's program on PATH (:func:`_default_program`), and for the server flags of
    :func:`consent_reasons` in ``engine.args`` and each mode's ``args``. ``kvbench run`` refuses such a scenario
    (and a run folder holding one) unless given ``--trust-server-config``; ``validate`` warns."""
    e = s.engine
    if e.kind not in STARTED_KINDS:
        return []
    out = []
    if e.binary is not None:
        given, own = server_program(e), _default_program(e.kind)
        if given is None or own is None or not _same_file(given[0], own[0]):
            module = KINDS[e.kind].python_module
            name = f"the {module} module's python" if module else DEFAULT_PROGRAMS[e.kind][0]
            out.append(("engine.binary", f"{e.binary} is not kvbench's own {name} ({Path(sys.prefix) / 'bin'}) nor "
                        f"{name} on PATH: kvbench would run this program"))
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
        if e.binary is not None:
            return [("engine.binary", f"{e.binary} is not an executable file or a program on PATH")]
        kind = KINDS[e.kind]
        what = f"the {kind.python_module} package" if kind.python_module else DEFAULT_PROGRAMS[e.kind][0]
        how = kind.install_hint
        return [("engine.kind", f"{what} not found in kvbench's environment or on PATH: {how}")]
    return []


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
        if e.url.startswith("http://") and not loopback_url(e.url):
            out.append(("engine.url", f"{e.url} is another machine over plain http: every prompt and reply "
                                      "crosses the network unencrypted (use https:// or a tunnel)"))
        if e.use_env_proxy:
            out.append(("engine.use_env_proxy", "every request goes through the proxy the environment names "
                                                "(HTTP_PROXY / HTTPS_PROXY / ALL_PROXY): it sees every prompt and "
                                                "its latency is in every TTFT"))
    return out
