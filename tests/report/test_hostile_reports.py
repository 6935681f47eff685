"""Issue 34 ("hostile input"), the reading side: `kvbench compare` of two server runs of plain prompts (and what it
says when runs share no point), `kvbench cost` of a server run whose requests all failed, counters that went down
in the report, `kvbench validate` of a placement under the local executor, and a server mode whose own request
options change its outputs. The runs are made on the fake llama-server (tests/data/fake_llama_server.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import kvbench
from conftest import tiny_scenario
from golden_run import RUN as GOLDEN
from kvbench.analysis.compare import compare_points
from kvbench.cli import app
from kvbench.errors import ScenarioError
from kvbench.results.load import load_results
from fake_servers import FAKE, fake_env, meta, nothing_left_running, rows, run  # noqa: F401

METRICS = Path(__file__).resolve().parents[1] / "data" / "metrics"
#: The plain-prompt scenario's mode labels: three configurations at concurrency 1 and 2.
LABELS = [f"{m}@c{c}" for c in (1, 2) for m in ("none", "prefix-cache", "penalty")]


def plain_scenario(**over) -> dict:
    """Plain prompts (3 of 64 and 3 of 128 tokens) on the fake: none, prefix-cache and `penalty` (prefix-cache
    with its own request option repeat_penalty 1.5), at concurrency 1 and 2, 4 new tokens, one repeat."""
    base = {"name": "plain", "model": "smollm2-135m", "engine": {"kind": "llama.cpp", "binary": str(FAKE)},
            "workload": {"source": "synthetic", "n_prompts": 3}, "prompt_tokens": [64, 128], "max_new_tokens": 4,
            "modes": [{"name": "none"}, {"name": "prefix-cache"},
                      {"name": "penalty", "preset": "prefix-cache", "request": {"repeat_penalty": 1.5}}],
            "load": {"profile": "concurrent", "concurrency": [1, 2]}, "repeats": 1, "warmup": 0, "seed": 0}
    return {**base, **over}


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    """The run directory of :func:`plain_scenario`."""
    tmp = tmp_path_factory.mktemp("plain")
    with fake_env(tmp / "record.jsonl"):
        return run(tmp, plain_scenario())


@pytest.fixture(scope="module")
def failing(tmp_path_factory) -> Path:
    """A run of plain prompts whose servers refuse a flag and exit at start: every request fails."""
    tmp = tmp_path_factory.mktemp("failing")
    data = plain_scenario(name="failing", prompt_tokens=[64], load={"profile": "sequential"},
                          modes=[{"name": "none"}, {"name": "prefix-cache"}],
                          engine={"kind": "llama.cpp", "binary": str(FAKE), "args": ["--bad-flag"]})
    with fake_env(tmp / "record.jsonl"):
        return run(tmp, data)


def copy_run(src: Path, dst: Path, edit=None, edit_meta=None) -> Path:
    """A copy of the run ``src`` at ``dst``, its rows (and run.json) passed through the edit functions."""
    shutil.copytree(src, dst)
    if edit is not None:
        got = [edit(dict(r)) for r in rows(dst).values()]
        (dst / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in got))
    if edit_meta is not None:
        m = meta(dst)
        edit_meta(m)
        (dst / "run.json").write_text(json.dumps(m))
    return dst


def one_line(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.e2e
def test_the_plain_run_is_what_the_tests_below_take_it_for(plain):
    got = rows(plain)
    assert len(got) == 6 * len(LABELS) and all(r["status"] == "ok" for r in got.values())
    assert {r["mode_label"] for r in got.values()} == set(LABELS)
    assert all(r["cached_prompt_tokens"] == 0 and r["tokens_match"] is True for r in got.values())
    assert {r["mode_label"]: r["mode_options"] for r in got.values()}["penalty@c2"] == {
        "request": {"repeat_penalty": 1.5}}


@pytest.mark.e2e
def test_compare_gates_two_server_runs_of_plain_prompts_point_by_point(plain, tmp_path):
    def slower(r):
        if r["mode_label"] == "prefix-cache@c2" and r["prompt_tokens"] == 128:
            r["ttft_s"] *= 1.5
        return r

    b = copy_run(plain, tmp_path / "b", edit=slower)
    frame, only_a, only_b = compare_points(load_results([plain]), load_results([b]))
    assert only_a == only_b == []
    assert sorted(zip(frame["mode_label"], frame["prompt_tokens"], frame["concurrency"])) == sorted(
        (label, p, int(label[-1])) for label in LABELS for p in (64, 128))
    hit = (frame["mode_label"] == "prefix-cache@c2") & (frame["prompt_tokens"] == 128)
    assert frame.loc[hit, "ttft_s_ratio"].tolist() == pytest.approx([1.5])
    assert (frame.loc[~hit, "ttft_s_ratio"] == 1).all()
    for m in ("tpot_s", "itl_p99_s", "throughput_tokens_per_s"):
        assert (frame[f"{m}_ratio"] == 1).all(), m

    cli = CliRunner()
    r = cli.invoke(app, ["compare", str(plain), str(b), "--fail-on", "ttft_s:20"], env={"COLUMNS": "200"})
    assert r.exit_code == 1, r.output
    assert "fail: ttft_s worse by 50.0% (limit 20%) at plain p128 c2 prefix-cache@c2: " in r.output
    assert "reuse runs" not in r.output
    r = cli.invoke(app, ["compare", str(plain), str(b), "--fail-on", "tpot_s:1", "--fail-on", "itl_p99_s:1"])
    assert r.exit_code == 0, r.output
    assert "pass: no matched point worse than tpot_s 1%, itl_p99_s 1%" in r.output
    r = cli.invoke(app, ["compare", str(plain), str(b), "--fail-on", "kv_device_peak_bytes:10"])
    assert r.exit_code == 2
    assert ("--fail-on kv_device_peak_bytes: no matched point has kv_device_peak_bytes in both runs: server rows "
            "carry ttft_s, tpot_s, e2e_s, throughput_tokens_per_s") in one_line(r.output)


@pytest.mark.e2e
def test_compare_says_exactly_what_keeps_two_runs_from_sharing_a_point(plain, failing, tmp_path):
    cli = CliRunner()
    r = cli.invoke(app, ["compare", str(GOLDEN), str(plain)])
    assert r.exit_code == 2
    assert ("B ran on a server (llama.cpp: points by concurrency), A on kvbench's in-process engine (points by "
            "batch size): a server's point never matches an in-process one") in one_line(r.output)
    r = cli.invoke(app, ["compare", str(plain), str(failing)])
    assert r.exit_code == 2
    assert ("B measured no point: all 6 of its trials ended error (the first, p64-i0-none-r0: ServerStartError: "
            "fake_llama_server.py at http://127.0.0.1:") in one_line(r.output)
    assert "did not start: it ended (exit status 1) before /health answered 200" in one_line(r.output)
    reuse = copy_run(plain, tmp_path / "reuse", edit=lambda r: dict(r, document="c0"))  # requests sharing one
    r = cli.invoke(app, ["compare", str(plain), str(reuse)])
    assert r.exit_code == 2
    assert "B is a reuse run (multi_turn, doc_qa): a reuse workload has no such points" in one_line(r.output)


@pytest.mark.e2e
def test_cost_of_a_server_run_whose_requests_all_failed_says_so_with_the_first_reason(plain, failing, tmp_path):
    r = CliRunner().invoke(app, ["cost", "--gpu-price", "2", str(failing)])
    assert r.exit_code == 2, r.output  # nothing to cost, as compare with no point: bad input
    text = one_line(r.output)
    assert text.startswith("error: nothing to cost: failing: every request failed: all 6 ended error; the first, "
                           "p64-i0-none-r0: ServerStartError: fake_llama_server.py at http://127.0.0.1:"), text
    assert "did not start: it ended (exit status 1) before /health answered 200" in text
    assert text.endswith("error: invalid argument: --bad-flag")  # the first reason whole, its log's last line too
    assert not (failing / "report").exists()  # refused before any file
    r = CliRunner().invoke(app, ["cost", "--gpu-price", "2", str(plain), str(failing), "--out", str(tmp_path / "c")])
    assert r.exit_code == 0, r.output
    assert "not costed: failing: every request failed: all 6 ended error; the first, p64-i0-none-r0:" in \
        one_line(r.output)


@pytest.mark.e2e
def test_the_report_says_why_a_counter_has_no_delta_as_run_json_does(plain, tmp_path):
    from kvbench.bench.engines.server.metrics import measured_deltas

    before, after = ((METRICS / f"llamacpp_{s}.txt").read_text() for s in ("before", "after"))
    went_down = measured_deltas("llama.cpp", after, before, [], 0)  # a server that restarted between the scrapes
    assert went_down["metrics_notes"]["prompt_tokens_cached"] == "went down from 7585 to 0 (the server restarted?)"

    def restarted(m):
        for srv in m["servers"]:
            if srv["mode_label"] == "prefix-cache@c1":
                srv.update(went_down)

    b = copy_run(plain, tmp_path / "b", edit_meta=restarted)
    rep = kvbench.write_report(load_results([b]), tmp_path / "report")
    [line] = [f for f in rep.findings["plain"] if f.startswith("`prefix-cache@c1` /metrics")]
    assert line == ("`prefix-cache@c1` /metrics deltas of its measured requests over its servers: prompt_tokens: went "
                    "down from 1523 to 1518 (the server restarted?), prompt_tokens_cached: went down from 7585 to 0 "
                    "(the server restarted?)")
    [other] = [f for f in rep.findings["plain"] if f.startswith("`prefix-cache@c2` /metrics")]
    assert "went down" not in other and "not reported" not in other


@pytest.mark.e2e
def test_a_mode_whose_own_options_change_its_outputs_is_not_blamed_on_the_cache(plain, tmp_path):
    def diverged(r):
        if r["mode"] != "none":  # every other mode's ids differ from none's from the first step
            r.update(tokens_match=False, first_divergence_step=0)
        if r["mode_label"] == "prefix-cache@c1":
            r["cached_prompt_tokens"] = 40
        return r

    b = copy_run(plain, tmp_path / "b", edit=diverged)
    findings = kvbench.write_report(load_results([b]), tmp_path / "report").findings["plain"]
    ids = {f.split(":")[0]: f for f in findings if "generated other ids" in f}
    assert ids["`penalty@c1`"] == (
        "`penalty@c1`: 6 of 6 requests generated other ids than `none` (first differing token at step 0 in 6 "
        "requests): the mode sets its own options (request repeat_penalty: 1.5), which change what it generates: "
        "its outputs differ because of them, not because of the cache (those requests reused 0 cached prompt "
        "tokens)")
    assert "not bit-identical" not in ids["`penalty@c2`"] and "repeat_penalty: 1.5" in ids["`penalty@c2`"]
    assert ids["`prefix-cache@c1`"].endswith(": the server's cached and recomputed prompts are not bit-identical, a "
                                             "finding about the engine, not an error of kvbench")
    assert ids["`prefix-cache@c2`"].endswith(": not the cache's doing: those requests reused 0 cached prompt tokens "
                                             "(the server's outputs vary between runs of the same prompt, e.g. with "
                                             "concurrent batching)")


def test_validate_refuses_a_placement_under_the_local_executor_as_run_does(tmp_path):
    path = tmp_path / "placed.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario(placement=[{"accelerator_type": "H100"}])))
    r = CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "300"})
    assert r.exit_code == 2, r.output
    message = (f"{path}: placement: needs the ray executor (executor.kind: ray): a local run measures this machine "
               "only")
    assert one_line(r.output) == message
    with pytest.raises(ScenarioError) as refused:  # what `kvbench run` says of the same file
        kvbench.run_scenario(path, out=tmp_path / "out")
    assert str(refused.value) == message
    path.write_text(yaml.safe_dump(tiny_scenario(placement=[{"accelerator_type": "H100"}], executor={"kind": "ray"})))
    r = CliRunner().invoke(app, ["validate", str(path)])
    assert r.exit_code == 0 and f"{path}: ok (" in r.output
