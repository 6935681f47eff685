"""Reuse workloads: request streams (multi_turn, doc_qa), scenario checks, warm vs cold trials through the runner
(exact ids in every mode, restored token counts, the store partly on disk, damaged files, resume), and the
report and cost tables."""

from __future__ import annotations

import json
import random
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import tiny_scenario
from kvbench.analysis.cost import Prices
from kvbench.offload.store import StoreWarning
from kvbench.results.frame import trials_frame
from kvbench.results.load import load_results
from kvbench.results.read import read_trials
from kvbench.results.rows import BY_NAME
from kvbench.results.run_dir import RunDir
from kvbench.analysis.reuse import ids_verdict, length_bin, reuse_table
from kvbench.analysis.reuse_cost import reuse_cost
from kvbench.report.cost import quiet_count, reuse_cost_display, reuse_verdicts
from kvbench.bench.engines.transformers import TransformersEngine
from kvbench.bench.executors.local import LocalExecutor
from kvbench.bench.plans.sweep import run_sweep
from kvbench.bench.plans.plan import plan_for
from kvbench.scenario import ScenarioError, check_scenario, load_scenario, parse_scenario
from kvbench.workloads.documents import Document
from kvbench.workloads.sessions import QUESTIONS, NotEnoughRequests, conversation_turns, doc_qa, multi_turn

WORDS = ("cache", "memory", "token", "layer", "tensor", "offload", "budget", "device", "host", "chunk", "prefix",
         "request", "model", "batch", "window", "latency", "the", "a", "of", "and", "to", "is", "in", "for")


def text(n_words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words)) + "."


def conversation(i: int, turns: int = 3, words: int = 60) -> Document:
    raw = []
    for k in range(turns):
        raw += [("human", f"Question {k}: {text(words, 100 * i + 2 * k)}"),
                ("gpt", f"Answer {k}: {text(words, 100 * i + 2 * k + 1)}")]
    return Document.from_turns(f"conv{i}", raw)


def documents(n: int, words: int = 200) -> list[Document]:
    return [Document.from_turns(f"doc{i}", [("human", text(words, 1000 + i))]) for i in range(n)]


# --------------------------------------------------------------------------- request streams


def test_conversation_turns_extend_one_another(smol_tokenizer):
    turns = conversation_turns(smol_tokenizer, conversation(0), 3)
    assert len(turns) == 3
    for k, (prompt, held) in enumerate(turns):
        assert held[:len(prompt)] == prompt
        if k + 1 < len(turns):
            assert len(held) > len(prompt)  # the reply
            assert turns[k + 1][0][:len(held)] == held  # the next prompt starts with what was held
    assert turns[-1][1] == turns[-1][0]  # after the last turn used, nothing more is held
    assert conversation_turns(smol_tokenizer, conversation(0, turns=2), 3) is None


def test_multi_turn_orders_and_limits(smol_tokenizer):
    docs = [conversation(i) for i in range(4)]
    rr = multi_turn(docs, smol_tokenizer, conversations=2, turns=3, interleave="round_robin", min_prompt_tokens=1,
                    max_prompt_tokens=2000, order="longest")
    assert [r.id for r in rr.requests] == ["c0-t1", "c1-t1", "c0-t2", "c1-t2", "c0-t3", "c1-t3"]
    assert [r.turn_index for r in rr.requests] == [1, 1, 2, 2, 3, 3]
    seq = multi_turn(docs, smol_tokenizer, conversations=2, turns=3, interleave="sequential", min_prompt_tokens=1,
                     max_prompt_tokens=2000, order="longest")
    assert [r.id for r in seq.requests] == ["c0-t1", "c0-t2", "c0-t3", "c1-t1", "c1-t2", "c1-t3"]
    assert {r.id: r.ids for r in seq.requests} == {r.id: r.ids for r in rr.requests}
    longest = max(len(r.ids) for r in rr.requests)
    with pytest.raises(NotEnoughRequests, match=r"only 0 of 2 conversations have 3 user turns with a last prompt "
                                                r"of 1-100 tokens"):
        multi_turn(docs, smol_tokenizer, conversations=2, turns=3, interleave="sequential", min_prompt_tokens=1,
                   max_prompt_tokens=100)
    short = multi_turn(docs, smol_tokenizer, conversations=1, turns=3, interleave="sequential", min_prompt_tokens=1,
                       max_prompt_tokens=longest - 1, order="longest")
    assert all(len(r.ids) < longest for r in short.requests)
    assert short.notes == [f"1 conversation skipped: the prompt of turn 3 is longer than {longest - 1} tokens (the "
                           "limit; the model's positions bound it)"]


def test_keep_filters_candidates_only(smol_tokenizer):
    asked = []

    def keep(doc):  # refuses the first candidate it is asked about
        asked.append(doc.id)
        return len(asked) > 1

    docs = [conversation(i) for i in range(4)]
    s = multi_turn(docs, smol_tokenizer, conversations=2, turns=3, interleave="sequential", min_prompt_tokens=1,
                   max_prompt_tokens=2000, order="longest", keep=keep)
    assert len(asked) == 3 and {r.document for r in s.requests} == set(asked[1:])
    d = doc_qa(documents(3), smol_tokenizer, documents=2, questions=1, doc_tokens=64, repeat_mode="tile",
               order="longest", keep=lambda doc: doc.id != "doc0")
    assert [r.document for r in d.requests] == [x.id for x in sorted(documents(3), key=lambda x: -x.chars)
                                                if x.id != "doc0"][:2]


def test_doc_qa_orders_and_hit_miss_ratio(smol_tokenizer):
    docs = documents(6)
    tile = doc_qa(docs, smol_tokenizer, documents=2, questions=3, doc_tokens=64, repeat_mode="tile")
    assert [r.id for r in tile.requests] == ["d0-q1", "d1-q1", "d0-q2", "d1-q2", "d0-q3", "d1-q3"]
    inter = doc_qa(docs, smol_tokenizer, documents=2, questions=3, doc_tokens=64, repeat_mode="interleave")
    assert [r.id for r in inter.requests] == ["d0-q1", "d0-q2", "d0-q3", "d1-q1", "d1-q2", "d1-q3"]
    rnd = doc_qa(docs, smol_tokenizer, documents=2, questions=3, doc_tokens=64, repeat_mode="random", seed=3)
    assert sorted(r.id for r in rnd.requests) == sorted(r.id for r in tile.requests)
    for d in ("d0", "d1"):  # each document's questions keep their order: the first one is the miss
        assert [r.id for r in rnd.requests if r.id.startswith(d)] == [f"{d}-q1", f"{d}-q2", f"{d}-q3"]
    a, b = tile.requests[0], tile.requests[2]  # d0 with questions 1 and 2
    assert a.held == a.ids and b.turn_index == 2
    common = next(i for i, (x, y) in enumerate(zip(a.ids, b.ids)) if x != y)
    assert common >= 64  # the whole document (and the template before it) is shared
    assert smol_tokenizer.decode(b.ids).rstrip().endswith(QUESTIONS[1]) or QUESTIONS[1] in smol_tokenizer.decode(b.ids)
    # 2 documents × 3 questions = 4 hits, 2 misses; 1:1 asks for 4 misses: 2 single-question documents more
    mixed = doc_qa(docs, smol_tokenizer, documents=2, questions=3, doc_tokens=64, repeat_mode="tile", ratio=(1, 1))
    ids = [r.id for r in mixed.requests]
    assert len(ids) == 8 and ids.count("d2-q1") == 1 and ids.count("d3-q1") == 1
    assert sum(r.turn_index == 1 for r in mixed.requests) == 4
    with pytest.raises(NotEnoughRequests, match="only 6 of 2 texts|only 0 of 2 texts have at least 5000 tokens"):
        doc_qa(docs, smol_tokenizer, documents=2, questions=3, doc_tokens=5000, repeat_mode="tile")


# --------------------------------------------------------------------------- scenario checks


def reuse_scenario(**over):
    base = tiny_scenario(workload={"source": "sharegpt", "multi_turn": {"conversations": 2, "turns": 3}})
    base["model"] = {"preset": "tiny-llama", "weights": "random", "tokenizer": "smollm2-135m"}
    del base["prompt_tokens"], base["batch_sizes"]
    base.update(over)
    return base


def problems(data, tmp_path):
    with pytest.raises(ScenarioError) as e:
        s = parse_scenario(data, "s.yaml")
        found = check_scenario(s)
        if found:
            raise ScenarioError("s.yaml", found)
    return str(e.value)


def test_reuse_scenario_errors(tmp_path):
    s = parse_scenario(reuse_scenario())
    assert s.workload.reuse == "multi_turn" and s.largest_batch == 1 and s.longest_prompt is None
    assert s.run_kind == "reuse" and type(plan_for(s)).__name__ == "ReusePlan"
    assert "s.yaml: prompt_tokens: does not apply to workload multi_turn" in problems(
        reuse_scenario(prompt_tokens=[8]), tmp_path)
    assert "s.yaml: store: is for a reuse workload" in problems(tiny_scenario(store={"chunk_tokens": 8}), tmp_path)
    assert "s.yaml: batch_sizes: required key is missing" in problems(
        {k: v for k, v in tiny_scenario().items() if k != "batch_sizes"}, tmp_path)
    msg = problems(reuse_scenario(workload={"source": "sharegpt", "multi_turn": {"conversation": 2}}), tmp_path)
    assert ("workload.multi_turn.conversation: unknown key 'conversation'; did you mean 'conversations'? allowed keys: "
            "conversations, turns, "
            "interleave, min_prompt_tokens, max_prompt_tokens") in msg
    assert "multi_turn needs source: sharegpt" in problems(
        reuse_scenario(workload={"source": "synthetic", "multi_turn": {}}), tmp_path)
    assert "must be 'H:M' with whole numbers" in problems(
        reuse_scenario(workload={"source": "sharegpt", "doc_qa": {"hit_miss_ratio": "3"}}), tmp_path)
    assert "3 documents × 4 questions already give 9 hits to 3 misses" in problems(
        reuse_scenario(workload={"source": "sharegpt", "doc_qa": {"hit_miss_ratio": "4:1"}}), tmp_path)
    # tiny-llama: 2 layers × 2 (K, V) × 2 kv heads × 16 × 4 bytes = 512 bytes a token; chunk 256 tokens = 131,072
    msg = problems(reuse_scenario(store={"host_max_bytes": 131071, "disk_max_bytes": 1000}), tmp_path)
    assert ("store.host_max_bytes: 131,071 bytes is smaller than one chunk: 256 tokens × 512 bytes of KV per token = "
            "131,072 bytes") in msg and "store.disk_max_bytes: 1,000 bytes" in msg
    assert "store" not in problems(reuse_scenario(store={"host_max_bytes": 131072}, max_new_tokens=9000), tmp_path)
    # 2048 positions − 3 new tokens = 2045
    msg = problems(reuse_scenario(workload={"source": "sharegpt",
                                            "multi_turn": {"min_prompt_tokens": 10, "max_prompt_tokens": 3000}}),
                   tmp_path)
    assert ("workload.multi_turn.max_prompt_tokens: 3000 tokens + max_new_tokens 3 exceeds the model's "
            "max_position_embeddings 2048; the longest prompt allowed is 2045") in msg
    assert "documents of at most 1917 tokens fit" in problems(
        reuse_scenario(workload={"source": "sharegpt", "doc_qa": {"doc_tokens": 2000}}), tmp_path)


def test_reuse_scenario_round_trips_and_yaml_slips(tmp_path):
    s = parse_scenario(reuse_scenario(store={"chunk_tokens": 64}))
    assert parse_scenario(s.model_dump(mode="json")) == s  # what --resume reads back from run.json
    assert "s.yaml: prompt_tokens: required key is missing" in problems(tiny_scenario(prompt_tokens=None), tmp_path)
    assert parse_scenario(reuse_scenario(workload={"source": "sharegpt", "multi_turn": None})).workload.multi_turn \
        .turns == 4  # `multi_turn:` alone: the defaults
    assert ("workload.doc_qa.hit_miss_ratio: must be a quoted string 'H:M' such as '3:1' (YAML reads an unquoted "
            "3:2 as the number 182") in problems(
        reuse_scenario(workload={"source": "sharegpt", "doc_qa": {"hit_miss_ratio": 182}}), tmp_path)
    assert "store.host_max_bytes: cannot be negative" in problems(reuse_scenario(store={"host_max_bytes": -5}),
                                                                 tmp_path)
    # device auto without CUDA computes in float32: 512 bytes a token for tiny-llama, as with device cpu
    msg = problems(reuse_scenario(device="auto", store={"host_max_bytes": 131071}), tmp_path)
    if not torch.cuda.is_available():
        assert "256 tokens × 512 bytes of KV per token = 131,072 bytes" in msg
    assert ("store.chunk_tokens: 1000 tokens is not less than the longest prefix the workload can share "
            "(multi_turn.max_prompt_tokens: 900 tokens): no whole chunk could ever be restored") in problems(
        reuse_scenario(workload={"source": "sharegpt", "multi_turn": {"min_prompt_tokens": 10,
                                                                      "max_prompt_tokens": 900}},
                       store={"chunk_tokens": 1000}), tmp_path)


def test_extra_documents_for_a_hit_miss_ratio():
    from kvbench.scenario.workload import extra_documents

    assert extra_documents(3, 3, None) == 0
    assert extra_documents(3, 3, (3, 2)) == 1  # 6 hits → 4 misses: 3 first questions + 1
    assert extra_documents(2, 3, (1, 1)) == 2 and extra_documents(3, 3, (2, 1)) == 0


def test_unwritable_store_directory_is_refused(tmp_path, write_yaml):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    f = write_yaml(reuse_scenario(store={"disk_max_bytes": "1MiB"}, disk_dir=str(locked)))
    try:
        if not __import__("os").access(locked, __import__("os").W_OK):  # root can write anywhere
            with pytest.raises(ScenarioError, match="disk_dir: .* is not writable"):
                load_scenario(f)
        f2 = write_yaml(reuse_scenario(store={"disk_max_bytes": "1MiB"}, disk_dir=str(tmp_path / "nope")), "b.yaml")
        with pytest.raises(ScenarioError, match=r"disk_dir: .*nope does not exist"):
            load_scenario(f2)
    finally:
        locked.chmod(0o700)


# --------------------------------------------------------------------------- trials


def make_runner(tiny_model, smol_tokenizer, modes, requests, store, repeats=1, **over):
    data = reuse_scenario(modes=modes, store=store, repeats=repeats, max_new_tokens=4, warmup=1, **over)
    s = parse_scenario(data)
    from kvbench.workloads.sessions import Stream

    return s, LocalExecutor(s, TransformersEngine(s, tiny_model, Stream(requests)))


MODES = [{"kind": "none"}, {"kind": "full"}, {"kind": "hierarchical", "window": 16},
         {"kind": "dynamic", "min_window": 16}, {"kind": "full", "host_max_tokens": 64}]


def expected_restored(requests, chunk, tails=True):
    """Per request id: the tokens a warm trial restores when nothing is evicted: the whole chunks of the longest
    prefix its prompt shares with what earlier requests held, at most the prompt less one token, then (``tails``)
    the longest earlier held sequence the prompt starts with if it ends within one chunk after them, unless a later
    held sequence extends it (that one's chunks replaced its tail)."""
    out, held, kept = {}, [], []
    for r in requests:
        limit, best = len(r.ids) - 1, 0
        for h in held:
            n = 0
            for x, y in zip(h, r.ids):
                if x != y:
                    break
                n += 1
            best = max(best, n)
        whole = min(best, limit) // chunk * chunk
        ends = [len(t) for t in kept if len(t) <= limit and r.ids[:len(t)] == t and len(t) // chunk * chunk == whole]
        out[r.id] = max([whole, *ends])
        held.append(r.held)
        if tails:
            kept = [t for t in kept if r.held[:len(t)] != t or len(t) == len(r.held)]
            kept += [r.held] if len(r.held) % chunk else []
    return out


@pytest.mark.e2e
def test_multi_turn_warm_trials_restore_exactly_in_every_mode(tiny_model, smol_tokenizer, tmp_path):
    stream = multi_turn([conversation(i) for i in range(2)], smol_tokenizer, conversations=2, turns=3,
                        interleave="round_robin", min_prompt_tokens=1, max_prompt_tokens=2000)
    s, runner = make_runner(tiny_model, smol_tokenizer, MODES, stream.requests,
                            {"chunk_tokens": 32, "host_max_bytes": "1MiB"}, budget="1MiB", disk_dir=str(tmp_path))
    run = RunDir.create(tmp_path / "runs", s.model_dump(mode="json"), {"test": True})
    res = run_sweep(s, run, runner)
    rows = read_trials(run.trials_path)
    assert not res.interrupted and len(rows) == 6 * len(MODES) * 2
    assert sorted({k for r in rows for k in r} - set(BY_NAME)) == []  # every column declared (kvbench.results.rows)
    assert all(r["status"] == "ok" for r in rows), [r["message"] for r in rows if r["status"] != "ok"]
    assert all(r["tokens_match"] is True for r in rows)
    want = expected_restored(stream.requests, 32)
    # turn k restores the whole of what turn k - 1 held (its whole chunks and the tail after them), not only the
    # whole chunks (160 of 163 tokens, 288 of 312)
    held = {q.id: len(q.held) for q in stream.requests}
    assert want == {"c0-t1": 0, "c1-t1": 0, "c0-t2": 163, "c1-t2": 169, "c0-t3": 312, "c1-t3": 315}
    assert [want[f"c{i}-t{k}"] == held[f"c{i}-t{k - 1}"] for i in (0, 1) for k in (2, 3)] == [True] * 4
    assert expected_restored(stream.requests, 32, tails=False)["c0-t2"] == 160
    for r in rows:
        if r["warm"]:
            assert r["tokens_restored"] == want[r["request_id"]], r["trial_id"]
            assert r["tokens_prefilled"] == r["prompt_tokens"] - r["tokens_restored"]
            assert r["restore_host_bytes"] == r["tokens_restored"] * 512 and r["restore_disk_bytes"] == 0
        else:
            assert r["tokens_restored"] == 0 and r["store_hit_rate"] is None
    # none's warm trial of turn 2 in conversation 0: a chunk hit rate = restored chunks ÷ whole chunks of the prompt
    r = next(r for r in rows if r["trial_id"] == "c0-t2-none-warm-r0")
    assert r["store_hit_rate"] == pytest.approx(want["c0-t2"] // 32 / ((r["prompt_tokens"] - 1) // 32))
    assert r["turn_index"] == 2 and r["document"] == "conv0"
    # after the last turn each conversation's KV is held once: the tails of turns 1 and 2 were replaced by the
    # chunks of the turns that extended them (389 + 393 tokens × 512 bytes)
    last = next(r for r in rows if r["trial_id"] == "c1-t3-none-warm-r0")
    assert last["store_host_bytes"] == (389 + 393) * 512 and last["store_evicted"] == 0
    meta = json.loads((run.path / "run.json").read_text())
    assert [q["id"] for q in meta["requests"]] == [q.id for q in stream.requests] and meta["status"] == "complete"
    assert list(tmp_path.glob("kvbench-*")) == []  # every disk tier removed


def test_preflight_makes_a_store_with_the_loaded_model(tiny_model, smol_tokenizer, tmp_path):
    stream = doc_qa(documents(1), smol_tokenizer, documents=1, questions=1, doc_tokens=50, repeat_mode="tile")
    # parsed without check_scenario: the preflight on the loaded model still catches the cap
    _, runner = make_runner(tiny_model, smol_tokenizer, [{"kind": "none"}], stream.requests,
                            {"chunk_tokens": 32, "host_max_bytes": 1000})
    assert runner.engine.preflight() == ["store: host_max_bytes 1,000 is smaller than one chunk: 32 tokens × 512 "
                                         "bytes = 16,384 bytes"]


@pytest.mark.e2e
def test_store_partly_on_disk_damaged_files_and_resume(tiny_model, smol_tokenizer, tmp_path):
    stream = doc_qa(documents(3), smol_tokenizer, documents=2, questions=3, doc_tokens=150, repeat_mode="tile")
    store = {"chunk_tokens": 32, "host_max_bytes": 32 * 512 * 2, "disk_max_bytes": "1MiB"}  # 2 chunks in memory
    s, runner = make_runner(tiny_model, smol_tokenizer, [{"kind": "none"}, {"kind": "full"}], stream.requests, store,
                            disk_dir=str(tmp_path))
    run = RunDir.create(tmp_path / "runs", s.model_dump(mode="json"), {"test": True})
    damaged: list[str] = []

    def damage(row):  # after d1-q1 (the second request), break every chunk file of none's store
        if row["trial_id"] == "d1-q1-full-cold-r0" or (row["trial_id"] == "d1-q1-full-warm-r0" and not damaged):
            for f in runner.engine.stores["none"].tier.path.glob("*.kv"):
                f.write_bytes(f.read_bytes()[:-7])
                damaged.append(f.name)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_sweep(s, run, runner, on_trial=damage)
    rows = {r["trial_id"]: r for r in read_trials(run.trials_path)}
    assert damaged and all(r["tokens_match"] is True for r in rows.values())
    assert any(issubclass(w.category, StoreWarning) and "truncated" in str(w.message) for w in caught)
    want = expected_restored(stream.requests, 32)
    # full's store was left alone: d0's document comes back partly from disk
    full = rows["d0-q2-full-warm-r0"]
    assert full["tokens_restored"] == want["d0-q2"] and full["restore_disk_bytes"] > 0
    assert full["restore_host_bytes"] + full["restore_disk_bytes"] == want["d0-q2"] * 512
    # none's d0 chunks on disk were damaged: a miss (fewer tokens restored, never wrong ids), counted
    hurt = rows["d0-q2-none-warm-r0"]
    assert hurt["tokens_restored"] < want["d0-q2"] and hurt["store_corrupt"] > 0

    # interrupt a fresh run after 7 trials, resume: the store is rebuilt for the finished warm trials
    s2, runner2 = make_runner(tiny_model, smol_tokenizer, [{"kind": "none"}, {"kind": "full"}], stream.requests,
                              store, disk_dir=str(tmp_path))
    run2 = RunDir.create(tmp_path / "runs2", s2.model_dump(mode="json"), {"test": True})
    real, calls = runner2.run, {"n": 0}

    def interrupting(t):
        calls["n"] += 1
        if calls["n"] == 10:  # 2 warm-ups + 7 trials
            raise KeyboardInterrupt
        return real(t)

    runner2.run = interrupting
    assert run_sweep(s2, run2, runner2).interrupted and len(read_trials(run2.trials_path)) == 7
    assert list(tmp_path.glob("kvbench-*")) == []  # stores closed on Ctrl-C too
    runner2.run = real
    res = run_sweep(s2, RunDir.open(run2.path), runner2)
    again = {r["trial_id"]: r for r in read_trials(run2.trials_path)}
    assert res.skipped_done == 7 and len(again) == len(stream.requests) * 2 * 2
    for tid, r in again.items():
        if r["warm"] and r["mode"] == "full":
            assert r["tokens_restored"] == want[r["request_id"]], tid


def test_a_wrong_restore_is_caught_with_the_top2_gap(tiny_model, smol_tokenizer, tmp_path, monkeypatch):
    stream = doc_qa(documents(2), smol_tokenizer, documents=1, questions=2, doc_tokens=100, repeat_mode="tile")
    s, runner = make_runner(tiny_model, smol_tokenizer, [{"kind": "none"}], stream.requests,
                            {"chunk_tokens": 32, "host_max_bytes": "1MiB"})
    from kvbench.offload import store as store_mod

    real_get = store_mod.KVStore.get

    def noisy(self, ids, max_tokens=None):
        p = real_get(self, ids, max_tokens)
        # not the stored bytes: must show as a divergence
        p.values = [torch.randn_like(v, generator=torch.Generator().manual_seed(0)) * 100 for v in p.values]
        return p

    monkeypatch.setattr(store_mod.KVStore, "get", noisy)
    run = RunDir.create(tmp_path, s.model_dump(mode="json"), {"test": True})
    run_sweep(s, run, runner)
    rows = {r["trial_id"]: r for r in read_trials(run.trials_path)}
    bad = rows["d0-q2-none-warm-r0"]
    assert bad["tokens_restored"] > 0 and bad["tokens_match"] is False
    step = bad["first_divergence_step"]
    assert step is not None
    gaps = runner.reference.baseline_gaps[rows["d0-q2-none-cold-r0"]["prompt_sha256"]]
    assert len(gaps) == 4 and bad["top2_logit_gap"] == gaps[step]
    assert bad["divergence_acceptable"] is (gaps[step] <= 1e-3)
    verdict = ids_verdict(pd.DataFrame([rows["d0-q2-none-cold-r0"], bad]))
    assert verdict == ("near tie" if bad["divergence_acceptable"] else False)
    # a resumed run takes the reference from the cold row (ids and gaps), never from the warm one that differed
    cold = rows["d0-q2-none-cold-r0"]
    assert cold["top2_logit_gaps"] == gaps and "top2_logit_gaps" not in bad
    _, again = make_runner(tiny_model, smol_tokenizer, [{"kind": "none"}], stream.requests,
                           {"chunk_tokens": 32, "host_max_bytes": "1MiB"})
    again.remember(list(rows.values()))
    assert again.reference.baseline_sha[cold["prompt_sha256"]] == cold["output_sha256"] != bad["output_sha256"]
    assert again.reference.baseline_gaps[cold["prompt_sha256"]] == gaps


# --------------------------------------------------------------------------- tables


def reuse_rows():
    rows = []
    for turn, prompt, restored, cold, warm in ((1, 100, 0, 0.10, 0.11), (2, 600, 512, 0.50, 0.10),
                                                (2, 700, 512, 0.70, 0.20)):
        base = {"scenario": "r", "mode": "none", "mode_label": "none", "batch_size": 1, "status": "ok",
                "message": "", "prompt_tokens": prompt, "turn_index": turn, "n_output_tokens": 4,
                "tokens_match": True, "store_host_bytes": 1000, "store_disk_bytes": 24}
        base.update(request_id=f"c{prompt}-t{turn}", repeat=0)
        rows.append({**base, "trial_id": f"t{turn}-{prompt}-cold", "warm": False, "ttft_s": cold,
                     "e2e_s": cold + 0.3, "tokens_restored": 0, "store_hit_rate": None,
                     "restore_host_bytes": 0, "restore_disk_bytes": 0})
        rows.append({**base, "trial_id": f"t{turn}-{prompt}-warm", "warm": True, "ttft_s": warm,
                     "e2e_s": warm + 0.3, "tokens_restored": restored,
                     "store_hit_rate": None if turn == 1 else 1.0, "restore_host_bytes": restored * 10,
                     "restore_disk_bytes": 0})
    return rows


def test_reuse_table_and_cost_from_known_rows():
    trials = trials_frame(reuse_rows(), "r")
    t = reuse_table(trials)
    assert list(t["turn_index"]) == [1, 2]
    two = t.iloc[1]
    assert two["cold_ttft_s"] == pytest.approx(0.6) and two["warm_ttft_s"] == pytest.approx(0.15)
    # paired by request: (0.10 + 0.20) / (0.50 + 0.70), the workload's ratio; too few pairs for a verdict
    assert two["ttft_ratio"] == pytest.approx(0.25) and two["hit_rate"] == 1.0
    assert two["pairs"] == 2 and two["ttft_verdict"] == "inconclusive: 2 pairs, need 5"
    assert two["prefill_saved_pct"] == pytest.approx(100 * 1024 / 1300) and two["tokens_match"] is True
    assert list(length_bin(pd.Series([0, 511, 512, 2047, 2048]))) == ["0-511", "0-511", "512-1023", "1024-2047",
                                                                      "2048-4095"]
    c = reuse_cost(trials, Prices(3600.0)).iloc[0]  # 1 USD a second: USD per 1M = 1e6 / tokens/s
    assert c["recompute_tokens_per_s"] == pytest.approx(12 / (1.3 + 0.9))
    assert c["restore_tokens_per_s"] == pytest.approx(12 / (0.41 + 0.9))
    assert c["recompute_usd_per_million"] == pytest.approx(1e6 / c["recompute_tokens_per_s"])
    assert c["saving_pct"] == pytest.approx(100 * (1 - 1.31 / 2.2))
    assert c["prefill_saved_pct"] == pytest.approx(100 * 1024 / 1400)
    assert c["ttft_saved_s"] == pytest.approx((1.3 - 0.41) / 3) and c["store_bytes"] == 1024
    charged = reuse_cost(trials, Prices(3600.0, host_per_gib_hour=3600.0)).iloc[0]
    # the store's 1000 host bytes at 1 USD per second per GiB; its 24 disk bytes at the disk price (0)
    assert charged["restore_usd_per_million"] == pytest.approx((1 + 1000 / 2**30) * 1e6 / c["restore_tokens_per_s"],
                                                               rel=1e-12)
    charged = reuse_cost(trials, Prices(3600.0, host_per_gib_hour=3600.0, disk_per_gib_hour=3600.0)).iloc[0]
    assert charged["restore_usd_per_million"] == pytest.approx((1 + 1024 / 2**30) * 1e6 / c["restore_tokens_per_s"],
                                                               rel=1e-12)
    # 3 request pairs: no interval, no verdict
    assert c["pairs"] == 3 and c["saving_verdict"] == "inconclusive: 3 pairs, need 5"
    assert reuse_verdicts(reuse_cost(trials, Prices(3600.0)))[0].startswith(
        "r: `none` inconclusive: 3 pairs, need 5: restore ")


def test_reuse_saving_interval_is_a_bootstrap_over_request_pairs():
    """Six requests, restore 2× faster than recompute in each (e2e 0.5 vs 1.0 s for 4 tokens): the saving is 50%,
    and every resample of the pairs gives 50% too; one busy trial withholds the verdict."""
    rows = []
    for k in range(6):
        base = {"scenario": "r", "mode": "full", "mode_label": "full", "batch_size": 1, "status": "ok",
                "message": "", "prompt_tokens": 600, "turn_index": 2, "n_output_tokens": 4, "tokens_match": True,
                "store_host_bytes": 0, "store_disk_bytes": 0, "request_id": f"c{k}-t2", "repeat": 0,
                "machine_busy": False}
        rows.append({**base, "trial_id": f"c{k}-cold", "warm": False, "ttft_s": 0.9, "e2e_s": 1.0 + 0.1 * k,
                     "tokens_restored": 0})
        rows.append({**base, "trial_id": f"c{k}-warm", "warm": True, "ttft_s": 0.4, "e2e_s": (1.0 + 0.1 * k) / 2,
                     "tokens_restored": 512})
    c = reuse_cost(trials_frame(rows, "r"), Prices(2.0)).iloc[0]
    assert c["pairs"] == 6 and c["saving_pct"] == pytest.approx(50.0)
    assert (c["saving_ci_low"], c["saving_ci_high"]) == (pytest.approx(50.0), pytest.approx(50.0))
    assert c["saving_verdict"] == ""
    assert reuse_verdicts(pd.DataFrame([c]))[0].startswith(
        "r: `full` restoring stored KV lowers the cost to ")
    assert c["pairs_figure"] == 6 and quiet_count(c) == "6"
    rows[3]["machine_busy"] = True
    c = reuse_cost(trials_frame(rows, "r"), Prices(2.0)).iloc[0]
    assert c["saving_verdict"] == "inconclusive: the machine was busy during 1 of 12 trials"
    # the figures are the 5 quiet pairs' (a busy pair sets none), and the table says so
    assert c["pairs"] == 6 and c["pairs_figure"] == 5 and quiet_count(c) == "6 (5 quiet)"
    assert reuse_cost_display(pd.DataFrame([c]))[0]["pairs"].tolist() == ["6 (5 quiet)"]


@pytest.mark.e2e
def test_report_and_cost_of_a_reuse_run(tiny_model, smol_tokenizer, tmp_path):
    from kvbench.report.write import write_report

    stream = doc_qa(documents(2), smol_tokenizer, documents=1, questions=2, doc_tokens=100, repeat_mode="tile")
    s, runner = make_runner(tiny_model, smol_tokenizer, [{"kind": "none"}, {"kind": "full"}], stream.requests,
                            {"chunk_tokens": 32, "host_max_bytes": "1MiB"})
    run = RunDir.create(tmp_path, s.model_dump(mode="json"), {"test": True})
    run_sweep(s, run, runner)
    results = load_results([run.path])
    rep = write_report(results, tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    assert "### Restore vs recompute per turn" in md and "### Restore vs recompute per prompt length" in md
    assert "every restored run generated the same ids as recomputing the request with `none`" in md
    # one request after a first turn: one pair, no advice (on the tiny model restoring is not even faster)
    assert rep.recommendations[s.name].startswith("restore or recompute: inconclusive: 1 pair, need 5 (restore ÷ "
                                                  "recompute ")
    assert (tmp_path / "report" / f"reuse_ttft_{s.name}.png").stat().st_size > 10_000
    assert len(rep.table) == 0  # no per-point rows: cold and warm runs are not points
    csv = pd.read_csv(tmp_path / "report" / "reuse.csv")
    assert list(csv["turn_index"].dropna()) == [1, 2, 1, 2] and csv["length_bin"].notna().sum() == 2
    c = reuse_cost(results.trials, Prices(2.0))
    assert list(c["mode_label"]) == ["none", "full"] and list(c["requests"]) == [2, 2]


@pytest.mark.e2e
def test_cli_runs_and_resumes_a_reuse_scenario(write_yaml, tmp_path):
    import subprocess

    from conftest import kvbench_cmd

    scenario = write_yaml(reuse_scenario(
        workload={"source": "sharegpt", "multi_turn": {"conversations": 1, "turns": 2, "min_prompt_tokens": 200,
                                                       "max_prompt_tokens": 800}},
        modes=[{"kind": "none"}, {"kind": "full"}], repeats=1, warmup=0, store={"chunk_tokens": 64}))
    r = subprocess.run([*kvbench_cmd(), "run", str(scenario), "--out", str(tmp_path / "res")], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "8 trials written" in r.stdout and "restore TTFT ms" in r.stdout
    run = next((tmp_path / "res").iterdir())
    lines = (run / "trials.jsonl").read_text().splitlines(keepends=True)
    (run / "trials.jsonl").write_text("".join(lines[:5]))  # as if stopped after 5 trials
    r = subprocess.run([*kvbench_cmd(), "run", "--resume", str(run)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = read_trials(run / "trials.jsonl")
    assert len(rows) == 8 and len({x["trial_id"] for x in rows}) == 8 and "3 trials written" in r.stdout
    first = {json.loads(x)["trial_id"]: json.loads(x) for x in lines}
    for x in rows[5:]:  # the resumed warm trials restore what the uninterrupted run did (the store was rebuilt)
        assert x["tokens_restored"] == first[x["trial_id"]]["tokens_restored"] and x["tokens_match"] is True
    assert any(x["warm"] and x["tokens_restored"] > 0 for x in rows[5:])


def test_reuse_recommendation_follows_the_paired_verdict():
    from kvbench.report.advice import reuse_recommendation
    from kvbench.analysis.reuse import reuse_later_turns

    def run(warm_e2e):
        rows = []
        for k in range(6):
            base = {"scenario": "r", "mode": "none", "mode_label": "none", "batch_size": 1, "status": "ok",
                    "message": "", "prompt_tokens": 600, "turn_index": 2, "n_output_tokens": 4,
                    "tokens_match": True, "store_host_bytes": 0, "store_disk_bytes": 0, "request_id": f"c{k}-t2",
                    "repeat": 0, "machine_busy": False, "store_hit_rate": 1.0, "restore_host_bytes": 0,
                    "restore_disk_bytes": 0}
            rows.append({**base, "trial_id": f"c{k}-cold", "warm": False, "ttft_s": 0.30 + 0.01 * k, "e2e_s": 1.0,
                         "tokens_restored": 0})
            rows.append({**base, "trial_id": f"c{k}-warm", "warm": True, "ttft_s": warm_e2e * (0.30 + 0.01 * k),
                         "e2e_s": 1.0, "tokens_restored": 512})
        trials = trials_frame(rows, "r")
        return reuse_recommendation(reuse_table(trials), "r", reuse_later_turns(trials))

    assert run(0.1).startswith("keep finished requests' KV and restore it: with `none`")
    assert run(0.1).endswith("restore ÷ recompute 0.10 [0.10, 0.10] over 6 request pairs")
    # restore measurably slower (a tiny model: the lookup costs more than the prefill it saves): no such advice
    assert run(1.2).startswith("restoring does not pay here: restore ÷ recompute 1.20 [1.20, 1.20] over 6 request "
                               "pairs")


def test_a_lossy_server_preset_is_gated_by_max_server_kl_not_the_in_process_max_kl():
    """A server's KL is a lower bound from its top-k log-probabilities (kl_bound): the in-process max_kl does not
    apply to it, max_server_kl does; the agreement gated is the share of steps before the first differing id."""
    from kvbench.report.advice import reuse_recommendation

    turns = pd.DataFrame([
        {"group": "r", "turn_index": 2, "mode": "prefix-cache", "mode_label": "prefix-cache", "tokens_match": True,
         "warm_ttft_s": 0.5, "cold_ttft_s": 1.0, "kl_mean": np.nan, "token_agreement": np.nan,
         "agreement_to_divergence": np.nan, "kl_bound": False},
        {"group": "r", "turn_index": 2, "mode": "kv-q4_0", "mode_label": "kv-q4_0", "tokens_match": False,
         "warm_ttft_s": 0.4, "cold_ttft_s": 1.0, "kl_mean": 0.038, "token_agreement": 0.75,
         "agreement_to_divergence": 0.19, "kl_bound": True}]).assign(min_agreement=0.5)
    line = reuse_recommendation(turns.assign(max_kl=0.01, max_server_kl=0.05), "r", need_match=False)
    assert "not considered: `kv-q4_0` fails quality: 19.0% of steps before the first differing id < " \
           "min_agreement 50.0%" in line and "max_kl" not in line
    line = reuse_recommendation(turns.assign(max_kl=np.nan, max_server_kl=0.01), "r", need_match=False)
    assert line.endswith("not considered: `kv-q4_0` fails quality: KL ≥ 0.038 nats > max_server_kl 0.01; 19.0% of "
                         "steps before the first differing id < min_agreement 50.0%")
    # without thresholds the faster lossy preset is named, with its quality beside its figures
    line = reuse_recommendation(turns.assign(max_kl=np.nan, max_server_kl=np.nan, min_agreement=np.nan), "r",
                                need_match=False)
    assert line.endswith("with `kv-q4_0`, TTFT from turn 2 on is 400 ms against 1,000 ms recomputing every prompt "
                         "(median over turns; the baseline is `none`); quality vs none: KL ≥ 0.038 nats (a lower "
                         "bound from the server's top-k log-probabilities)")


def test_the_sampling_unit_is_the_conversation_one_at_a_time_and_the_load_when_requests_overlap():
    from kvbench.analysis.reuse import sampling_units

    pairs = pd.DataFrame({"request_id": ["c0-t1", "c0-t2", "c1-t1", "c1-t2"], "document": ["a", "a", "b", "b"],
                          "run_path": "/r", "repeat": [0, 0, 1, 1], "concurrency": 1})
    labels, unit = sampling_units(pairs)
    assert list(labels) == ["a", "a", "b", "b"] and unit == "conversations"
    assert sampling_units(pairs.assign(request_id=["d0-q1", "d0-q2", "d1-q1", "d1-q2"]))[1] == "documents"
    labels, unit = sampling_units(pairs.assign(concurrency=4))
    assert list(labels) == ["/r#0", "/r#0", "/r#1", "/r#1"] and unit == "concurrent loads"
    labels, unit = sampling_units(pairs.assign(document=["a", "b", "c", "d"]))
    assert list(labels) == [0, 1, 2, 3] and unit == "pairs"
