"""The engine contract: the same promises checked, with the same workload, over every engine family kvbench
runs, through the same calls (``kvbench.run_scenario``, which reaches each family's engine through its plan): the
in-process transformers engine on the tiny random model, the fake llama-server, the real llama-server and the real
vLLM CPU build. A new engine is in when it passes this suite with its fake.

The workload: two ShareGPT conversations of two turns (300 to 600 prompt tokens), four new tokens, ``none`` and one
reusing mode, one repeat, no warm-up. The promises:

1. every measured row generated exactly ``max_new_tokens`` tokens;
2. each mode starts cold: its first request restores nothing (and a server says so, ``cold_verified``);
3. every output is compared with ``none``'s on the same prompt, and where the engine promises exact reuse
   (kvbench's own lossless modes; the fake) equals it (a real server's cached prefix is not bit-exact: llama-server's
   greedy outputs differed cold vs cached in 2 of 5 conversations; it is compared, not equal);
4. a run interrupted after some rows and resumed has the rows of an uninterrupted run (trial ids, statuses,
   outputs);
5. every exit path (the end, Ctrl-C) stops what the run started: no child process is left.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

import kvbench
from kvbench.bench.run import RunProgress
from kvbench.scenario.programs import own_python
from fake_servers import FAKE, rows

pytestmark = pytest.mark.e2e

LLAMA_SERVER = Path(sys.prefix) / "bin" / "llama-server"
WORKLOAD = {"source": "sharegpt", "seed": 0, "multi_turn": {
    "conversations": 2, "turns": 2, "interleave": "sequential", "min_prompt_tokens": 300, "max_prompt_tokens": 600}}
#: engine family -> (the scenario keys that choose it, the reusing mode's label, whether its reuse is exact)
ENGINES = {
    "transformers": ({"model": {"preset": "tiny-llama", "weights": "random", "tokenizer": "smollm2-135m"},
                      "device": "cpu", "modes": [{"kind": "none"}, {"kind": "full"}]}, "full", True),
    "llama.cpp-fake": ({"model": "smollm2-135m", "engine": {"kind": "llama.cpp", "binary": str(FAKE)},
                        "modes": [{"name": "none"}, {"name": "prefix-cache"}]}, "prefix-cache", True),
    "llama.cpp": ({"model": "smollm2-135m", "engine": {"kind": "llama.cpp", "args": ["-t", "1"]},
                   "modes": [{"name": "none"}, {"name": "prefix-cache"}]}, "prefix-cache", False),
    "vllm": ({"model": "smollm2-135m", "engine": {"kind": "vllm"},
              "modes": [{"name": "none"}, {"name": "prefix-cache"}]}, "prefix-cache", False),
}
#: what each real engine needs built, and how: (present, the reason to skip without it)
BUILDS = {"llama.cpp": (lambda: os.access(LLAMA_SERVER, os.X_OK),
                        f"llama-server is not built at {LLAMA_SERVER}: `make llama-server` builds it there"),
          "vllm": (lambda: own_python("vllm") is not None,
                   "vLLM's CPU build is not installed in .venv/vllm: `make vllm` installs it")}


def scenario(family: str) -> dict:
    keys = ENGINES[family][0]
    return {"name": f"contract-{family.replace('.', '')}", "workload": WORKLOAD, "max_new_tokens": 4,
            "repeats": 1, "warmup": 0, "seed": 0, **keys}


class _StopAfter(RunProgress):
    """Ctrl-C (KeyboardInterrupt) once ``n`` rows are written."""

    def __init__(self, n: int):
        self.n, self.seen = n, 0

    def trial_done(self, row: dict) -> None:
        self.seen += 1
        if self.seen == self.n:
            raise KeyboardInterrupt


def _children() -> list[psutil.Process]:
    """This process's children still running (zombies reaped by now are not), after up to 10 s."""
    end = time.monotonic() + 10
    while True:
        left = [p for p in psutil.Process().children(recursive=True)
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE and "ray" not in " ".join(p.cmdline())]
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.1)


#: what each family needs beyond the e2e mark: the real llama-server build, the real vLLM build
MARKS = {"llama.cpp": pytest.mark.server, "vllm": pytest.mark.vllm}


@pytest.fixture(scope="module", params=[pytest.param(f, marks=MARKS[f]) if f in MARKS else f for f in ENGINES])
def runs(request, tmp_path_factory):
    """One engine family's runs: uninterrupted, and interrupted after 3 rows then resumed; the rows of each, the
    resumed run's result, and the children left after each."""
    family = request.param
    present, why = BUILDS.get(family, (lambda: True, ""))
    if not present():
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp(family)
    path = tmp / "contract.yaml"
    path.write_text(yaml.safe_dump(scenario(family)))
    whole = kvbench.run_scenario(path, out=tmp / "whole", trust_server_config=True)
    left_whole = _children()
    cut = kvbench.run_scenario(path, out=tmp / "cut", trust_server_config=True, progress=_StopAfter(3))
    left_cut = _children()
    cut_rows = rows(cut.run_dir)
    resumed = kvbench.run_scenario(resume=cut.run_dir, trust_server_config=True)
    return {"family": family, "reusing": ENGINES[family][1], "exact": ENGINES[family][2], "whole": rows(whole.run_dir), "cut": cut,
            "cut_rows": cut_rows, "resumed": resumed, "resumed_rows": rows(cut.run_dir),
            "left": left_whole + left_cut + _children()}


def _measured(rs: dict) -> list[dict]:
    return [r for r in rs.values() if r["status"] == "ok"]


def test_every_request_ran_and_generated_exactly_max_new_tokens(runs):
    whole = runs["whole"]
    assert whole and all(r["status"] == "ok" for r in whole.values()), {t: r["message"] for t, r in whole.items()}
    assert {r["n_output_tokens"] for r in whole.values()} == {4}
    assert {r["request_id"] for r in whole.values()} == {"c0-t1", "c0-t2", "c1-t1", "c1-t2"}
    assert {r["mode_label"] for r in whole.values()} == {"none", runs["reusing"]}


def test_each_mode_starts_cold(runs):
    for label in ("none", runs["reusing"]):
        mode_rows = [r for r in runs["whole"].values() if r["mode_label"] == label]
        first = [r for r in mode_rows if r["request_id"] == "c0-t1"]
        assert first and all(r["tokens_restored"] == 0 for r in first), label
        if "cold_verified" in first[0]:  # a server says so itself: 0 cached tokens on its first request
            assert [r["cold_verified"] for r in first] == [True], label
    later = [r for r in runs["whole"].values() if r["mode_label"] == runs["reusing"] and r["request_id"] == "c0-t2"
             and r.get("warm", True)]
    assert later and all(r["tokens_restored"] > 0 for r in later)  # and the reusing mode does reuse


def test_every_output_is_compared_with_none_and_exact_reuse_equals_it(runs):
    whole = runs["whole"]
    for r in whole.values():
        assert isinstance(r["tokens_match"], bool), r["trial_id"]  # every prompt has its none reference
        if r["mode"] == "none" or runs["exact"]:
            assert r["tokens_match"] or r.get("divergence_acceptable"), r["trial_id"]
    nones = {r["prompt_sha256"]: r["output_sha256"] for r in whole.values() if r["mode"] == "none"}
    for r in whole.values():
        if r["tokens_match"]:
            assert r["output_sha256"] == nones[r["prompt_sha256"]], r["trial_id"]


def test_a_resumed_run_equals_an_uninterrupted_one(runs):
    assert runs["cut"].interrupted and len(runs["cut_rows"]) == 3
    assert runs["resumed"].already == 3 and not runs["resumed"].interrupted
    assert runs["resumed"].written == len(runs["whole"]) - 3
    whole, resumed = runs["whole"], runs["resumed_rows"]
    assert sorted(resumed) == sorted(whole)
    assert {t: r["status"] for t, r in resumed.items()} == {t: r["status"] for t, r in whole.items()}
    assert {t: r["output_sha256"] for t, r in resumed.items()} == {t: r["output_sha256"] for t, r in whole.items()}
    assert all(resumed[t] == r for t, r in runs["cut_rows"].items())  # what was written stays as it was


def test_every_exit_path_stops_what_it_started(runs):
    assert runs["left"] == []
