"""The fake llama-server (tests/data/fake_llama_server.py, no model) as tests drive it: a scenario on it, its
record file, runs and their rows, run.json and what the fake saw; and the autouse check that no fake server
outlives a test (import ``nothing_left_running`` into a module to apply it)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import yaml

import kvbench

FAKE = Path(__file__).resolve().parent / "data" / "fake_llama_server.py"
REQUESTS = ("c0-t1", "c1-t1", "c0-t2", "c1-t2")


def scenario(**over) -> dict:
    """2 ShareGPT conversations × 2 turns (round robin), 4 new tokens, on the fake; keyword arguments override."""
    base = {"name": "fake", "model": "smollm2-135m", "engine": {"kind": "llama.cpp", "binary": str(FAKE)},
            "workload": {"source": "sharegpt", "seed": 0, "multi_turn": {
                "conversations": 2, "turns": 2, "min_prompt_tokens": 300, "max_prompt_tokens": 600}},
            "max_new_tokens": 4, "modes": [{"name": "none"}, {"name": "prefix-cache"}], "repeats": 1, "warmup": 0,
            "seed": 0}
    return {**base, **over}


def no_fake_within(seconds: float) -> list[psutil.Process]:
    """This checkout's fake servers (psutil: a command line naming its fake_llama_server.py, so that another
    checkout's tests running beside these do not count) still running after waiting up to ``seconds`` for them to
    go."""
    end = time.monotonic() + seconds
    while (left := [p for p in psutil.process_iter(["cmdline", "status"]) if p.info["status"] != "zombie"
                    and str(FAKE) in (p.info["cmdline"] or ())]) and time.monotonic() < end:
        time.sleep(0.1)
    return left


@pytest.fixture(autouse=True)
def nothing_left_running():
    """Every test ends with no fake server running."""
    yield
    assert not no_fake_within(2), "a fake llama-server outlived the run"


@contextlib.contextmanager
def fake_env(path: Path) -> Iterator[None]:
    """The fake's record file (FAKE_RECORD) set to ``path``, every other FAKE_ variable unset."""
    with pytest.MonkeyPatch.context() as mp:
        for var in [v for v in os.environ if v.startswith("FAKE_")]:
            mp.delenv(var)
        mp.setenv("FAKE_RECORD", str(path))
        yield


@pytest.fixture
def record(tmp_path) -> Iterator[Path]:
    """This test's record file of the fake (see :func:`fake_env`)."""
    with fake_env(tmp_path / "record.jsonl"):
        yield tmp_path / "record.jsonl"


def run(tmp_path: Path, data: dict, **env) -> Path:
    """Run scenario ``data`` in-process under ``tmp_path/res`` with ``env`` set; the run directory."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, str(v))
        path = tmp_path / f"{data['name']}.yaml"
        path.write_text(yaml.safe_dump(data))
        return kvbench.run_scenario(path, out=tmp_path / "res", trust_server_config=True).run_dir


def rows(run_dir: Path) -> dict[str, dict]:
    """trial id -> row, in file order (a killed writer's partial last line left out)."""
    lines = (run_dir / "trials.jsonl").read_text().splitlines(keepends=True)
    return {(r := json.loads(line))["trial_id"]: r for line in lines if line.endswith("\n")}


def meta(run_dir: Path) -> dict:
    """run.json."""
    return json.loads((run_dir / "run.json").read_text())


def events(path: Path) -> list[dict]:
    """What the fake servers recorded, in order."""
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def arg(server: dict, flag: str) -> str:
    """The value of ``flag`` in a run.json server's argv."""
    return server["argv"][server["argv"].index(flag) + 1]


def digest(ids: list[int]) -> str:
    """sha256 of the ids as int64 ``[1][n]``, as rows' prompt_sha256."""
    return hashlib.sha256(np.asarray([ids], dtype=np.int64).tobytes()).hexdigest()


def common_prefix(a: list[int], b: list[int]) -> int:
    """Leading ids ``a`` and ``b`` share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def modelled_cache(evs: list[dict]) -> dict[str, int]:
    """Prompt digest -> cached tokens by llama.cpp's rule (its slot's last prompt or restored file, less the
    prompt's last token), walking one server's events."""
    slots: dict[int, list[int]] = {}
    files, out = {}, {}
    for e in evs:
        if e["event"] == "completion":
            p = e["prompt"]
            out[digest(p)] = min(common_prefix(slots.get(e["slot"], []), p), len(p) - 1) if e["cache_prompt"] else 0
            slots[e["slot"]] = p
        elif e["event"] == "save":
            files[e["filename"]] = slots.get(e["slot"], [])
        elif e["event"] == "restore":
            slots[e["slot"]] = files[e["filename"]]
    return out
