"""The mode session and the declared capabilities (kvbench.bench.engines.base) on the transformers engine: one
slot, a warm trial only inside its mode's session, the store removed on every exit path, and release asked only
of an engine that says it holds memory of its own."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conftest import tiny_scenario
from kvbench.bench.engines.base import Capabilities
from kvbench.bench.engines.transformers import TransformersEngine
from kvbench.bench.executors.local import LocalExecutor
from kvbench.bench.trial import ReuseTrial
from kvbench.scenario import parse_scenario
from kvbench.workloads.documents import Document
from kvbench.workloads.sessions import Stream, doc_qa


@pytest.fixture
def reuse(tiny_model, smol_tokenizer, tmp_path):
    """A document-QA scenario (chunks of 16 tokens, disk tier in tmp_path) and its executor on the tiny model."""
    data = tiny_scenario(workload={"source": "sharegpt", "multi_turn": {"conversations": 2, "turns": 3}},
                         modes=[{"kind": "none"}, {"kind": "full"}], max_new_tokens=4, warmup=0,
                         store={"chunk_tokens": 16, "host_max_bytes": 16 * 512, "disk_max_bytes": "1MiB"},
                         disk_dir=str(tmp_path))
    data["model"] = {"preset": "tiny-llama", "weights": "random", "tokenizer": "smollm2-135m"}
    del data["prompt_tokens"], data["batch_sizes"]
    s = parse_scenario(data)
    doc = Document.from_turns("doc0", [("human", " ".join(["cache memory token layer"] * 40))])
    stream = doc_qa([doc], smol_tokenizer, documents=1, questions=2, doc_tokens=100, repeat_mode="tile")
    return s, LocalExecutor(s, TransformersEngine(s, tiny_model, Stream(stream.requests))), stream.requests


def test_the_transformers_engine_has_one_slot(reuse):
    s, runner, _ = reuse
    assert runner.plan.kind == "reuse" and runner.plan.family.name == "in-process"
    with pytest.raises(ValueError, match="the transformers engine runs one request at a time, not 2"):
        with runner.engine.session(s.modes[0], 0, slots=2):
            pass


def test_a_warm_trial_outside_its_session_is_an_error_row_not_a_silent_cold_one(reuse):
    s, runner, requests = reuse
    row = runner.run(ReuseTrial.of(requests[1], s.modes[1], 0, warm=True))
    assert row["status"] == "error"
    assert row["message"] == ("ValueError: d0-q2-full-warm-r0: a warm trial restores what its mode's session holds: "
                              "open the session first")
    with pytest.raises(ValueError, match="d0-q2-full-warm-r0: a warm trial restores from its mode's store: run it in "
                                         "a session"):
        runner.engine.run_trial(ReuseTrial.of(requests[1], s.modes[1], 0, warm=True), runner.watch, False)


def test_a_session_restores_what_it_holds_and_removes_its_store_on_every_exit_path(reuse, tmp_path):
    s, runner, requests = reuse
    full = s.modes[1]
    with pytest.raises(KeyboardInterrupt):
        with runner.session(full, 0) as ses:
            first = runner.run(ReuseTrial.of(requests[0], full, 0, warm=True))
            second = runner.run(ReuseTrial.of(requests[1], full, 0, warm=True))
            facts = ses.facts()
            assert list(tmp_path.glob("kvbench-*")) != [] and runner.engine.stores == {"full": ses.store}
            raise KeyboardInterrupt
    # the second question restores, from what the first one held, at most the prefix they share
    shared = next(i for i, (a, b) in enumerate(zip(requests[0].held, requests[1].ids)) if a != b)
    assert first["status"] == second["status"] == "ok"
    assert first["tokens_restored"] == 0 and 16 <= second["tokens_restored"] <= shared
    assert second["tokens_prefilled"] == len(requests[1].ids) - second["tokens_restored"]
    assert facts["store_chunks"] >= len(requests[1].held) // 16  # both held sequences, whole chunks at least
    assert 0 < facts["store_host_bytes"] <= 16 * 512 < facts["store_host_bytes"] + facts["store_disk_bytes"]
    assert list(tmp_path.glob("kvbench-*")) == [] and runner.engine.stores == {}


def test_release_is_asked_only_of_an_engine_that_holds_memory_of_its_own():
    calls = []
    s = parse_scenario(tiny_scenario())

    def engine(releases: bool) -> SimpleNamespace:
        caps = Capabilities(releases_memory=releases, tells_oom=False)
        e = SimpleNamespace(capabilities=caps, reference=None)
        if releases:
            e.release = lambda: calls.append("released")
        return e  # an engine without memory of its own has no release at all

    LocalExecutor(s, engine(False)).release()
    assert calls == []
    LocalExecutor(s, engine(True)).release()
    assert calls == ["released"]
