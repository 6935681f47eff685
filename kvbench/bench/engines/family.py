"""The two engine families behind the seam (:mod:`kvbench.bench.engines.base`), each with its one loader: the
in-process engine (:mod:`kvbench.bench.engines.transformers`) and the servers reached over HTTP
(:mod:`kvbench.bench.engines.server`). Which family a run uses is its plan's
(:attr:`kvbench.bench.plans.plan.Plan.family`); nothing here imports a family before it loads."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbench.bench.engines.base import Engine
from kvbench.scenario import Scenario


@dataclass(frozen=True)
class Family:
    """One engine family.

    Attributes:
        name: ``in-process`` or ``server``.
        loading: what a run shows while the family loads a scenario's engine (one line).
        load: ``load(scenario, where, run_path, environment)`` → ``(engine, line)``: the engine, ready for its
            first trial (preflight not yet run), and one line that describes it. ``where`` is the file named in
            messages, ``run_path`` the run's folder (a server's logs and slots go under it), ``environment`` the
            run's machine probe (its bandwidths feed the in-process engine's predictions; None on a cluster's
            driver). Raises what the family's loader raises (the model or workload cannot load, a server
            scenario that cannot run on this machine: :class:`~kvbench.errors.ScenarioError`).
        own_files: the engine writes files of its own under ``run_path`` (a server's logs and slot files).
    """

    name: str
    loading: Callable[[Scenario], str]
    load: Callable[[Scenario, Path, Path, dict[str, Any] | None], tuple[Engine, str]]
    own_files: bool


def _load_in_process(s: Scenario, where: Path, run_path: Path,
                     environment: dict[str, Any] | None) -> tuple[Engine, str]:
    """The transformers engine (:func:`kvbench.bench.engines.transformers.load_engine`) and a line naming the
    model's shape, dtype, device and load time."""
    from kvbench.bench.engines.transformers import load_engine

    t0 = time.perf_counter()
    engine = load_engine(s, environment)
    m = engine.m
    return engine, (f"model {s.model.label}: {m.shape.layers} layers, {m.shape.kv_heads} kv heads × "
                    f"{m.shape.head_dim}, {str(m.dtype).removeprefix('torch.')} on {m.device}; loaded in "
                    f"{time.perf_counter() - t0:.1f} s")


def _load_server(s: Scenario, where: Path, run_path: Path,
                 environment: dict[str, Any] | None) -> tuple[Engine, str]:
    """The server engine (:func:`kvbench.bench.engines.server.engine.load_server_engine`) and a line naming its
    requests, modes, repeats and load."""
    from kvbench.bench.engines.server.engine import load_server_engine

    engine = load_server_engine(s, run_path, where)
    load = s.load_spec
    return engine, (f"engine {s.engine.kind}: {len(engine.source.requests)} requests × {len(s.modes)} modes × "
                    f"{s.repeats} repeats, load {load.profile} at concurrency {', '.join(map(str, load.levels))}")


#: The in-process engine: a cache object, a decode loop, this process's memory.
IN_PROCESS = Family("in-process", lambda s: f"loading {s.model.label} and the {s.workload.source} workload",
                    _load_in_process, own_files=False)
#: A server reached over HTTP, started per mode (or running already: ``openai``).
SERVER = Family("server", lambda s: f"tokenizing the {s.workload.source} workload for {s.engine.kind}",
                _load_server, own_files=True)
