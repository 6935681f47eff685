"""The server engine end to end on a fake llama-server (tests/data/fake_llama_server.py, no model): a scenario run
through `kvbench.run_scenario` or the CLI, checked against what the fake saw (its FAKE_RECORD file), its logs and
run.json; failures of every kind, concurrency levels, disk slots, signals, resume. No server may outlive a test."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

import kvbench
from conftest import kvbench_cmd
from fake_servers import (  # noqa: F401 - nothing_left_running and record are fixtures
    FAKE, REQUESTS, arg, common_prefix, digest, events, fake_env, meta, modelled_cache, no_fake_within, nothing_left_running, record, rows, run, scenario)
from kvbench.cli import app

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def basic(tmp_path_factory):
    """none, prefix-cache and disk-slots with one warm-up: (run directory, events by mode, tmp dir)."""
    tmp = tmp_path_factory.mktemp("basic")
    with fake_env(tmp / "record.jsonl"):
        run_dir = run(tmp, scenario(warmup=1, modes=[{"name": "none"}, {"name": "prefix-cache"},
                                                     {"name": "disk-slots"}]))
    by_port = {int(arg(s, "--port")): s["mode_label"] for s in meta(run_dir)["servers"]}
    evs = events(tmp / "record.jsonl")
    return run_dir, {m: [e for e in evs if by_port[e["port"]] == m] for m in by_port.values()}, tmp


def test_none_runs_first_cold_and_cached_tokens_are_the_servers_exact_prefix(basic):
    run_dir, by_mode, _ = basic
    got = rows(run_dir)
    assert set(got) == {f"{q}-{m}-r0" for q in REQUESTS for m in ("none", "prefix-cache", "disk-slots")}
    assert [r["mode_label"] for r in list(got.values())[:4]] == ["none"] * 4
    assert all(r["status"] == "ok" and r["n_output_tokens"] == 4 and r["stop_reason"] == "limit" for r in got.values())
    for mode, evs in by_mode.items():
        assert len(evs[0]["prompt"]) == 32 and evs[0]["n_predict"] == 4  # the warm-up, unrecorded
        assert digest(evs[0]["prompt"]) not in {r["prompt_sha256"] for r in got.values()}
        expected = modelled_cache(evs)
        sent = {digest(e["prompt"]): e for e in evs if e["event"] == "completion"}
        for q in REQUESTS:
            r = got[f"{q}-{mode}-r0"]
            e = sent[r["prompt_sha256"]]
            assert r["cached_prompt_tokens"] == e["cache_n"] == expected[r["prompt_sha256"]]
            assert r["server_prompt_tokens"] == r["prompt_tokens"] == len(e["prompt"])
            assert r["output_ids_head"] == [[(sum(e["prompt"]) + k) % 1000 for k in range(4)]] == [e["ids"]]
            assert r["tokens_match"] is True and r["first_divergence_step"] is None
            assert r["cold_verified"] is (True if q == "c0-t1" else None)
            assert e["cache_prompt"] is (mode != "none")
    assert all(got[f"{q}-none-r0"]["cached_prompt_tokens"] == 0 and not got[f"{q}-none-r0"]["contaminated"]
               for q in REQUESTS)
    for q in ("c0-t2", "c1-t2"):  # one slot, round robin: the other conversation took it; the disk tier did not
        prefix, disk = got[f"{q}-prefix-cache-r0"], got[f"{q}-disk-slots-r0"]
        assert 0 < prefix["cached_prompt_tokens"] < prefix["reusable_prompt_tokens"] - 100
        assert disk["cached_prompt_tokens"] == disk["reusable_prompt_tokens"] > 200
        assert disk["store_hit_rate"] == 1.0


def test_run_json_lists_each_server_with_its_command_line_version_metrics_and_log(basic):
    run_dir, by_mode, _ = basic
    servers = kvbench.load_results(run_dir).runs[0]["servers"]
    assert [s["mode_label"] for s in servers] == ["none", "prefix-cache", "disk-slots"]
    for s in servers:
        argv, evs = s["argv"], by_mode[s["mode_label"]]
        assert argv[0] == str(FAKE) and arg(s, "--host") == "127.0.0.1" and "--metrics" in argv
        assert arg(s, "-np") == "1" and arg(s, "--cache-ram") == "0"
        assert s["version"] == "version: 0.0.0 (fake llama-server)" and s["slots"] == 1
        every = [e for e in evs if e["event"] == "completion"]
        # the deltas start after the one warm-up; the measured requests' own, each hold's share (one token for
        # the turn's prompt and reply, sent alone one at a time) read around it and taken out
        done, holds = [e for e in every[1:] if e["n_predict"] == 4], [e for e in every[1:] if e["n_predict"] == 1]
        assert len(done) == 4 and len(holds) == (0 if s["mode_label"] == "none" else 2)
        for deltas, part in ((s["metrics_delta"], done), (s["metrics_delta_holds"], holds)):
            assert deltas["prompt_tokens_cached"] == sum(e["cache_n"] for e in part)
            assert deltas["prompt_tokens"] == sum(len(e["prompt"]) - e["cache_n"] for e in part)
            assert deltas["tokens_predicted"] == sum(e["n_predict"] for e in part)
        assert s["metrics_holds"] == {"sent": len(holds), "separated": len(holds)}
        assert s["load"]["profile"] == "sequential" and s["load"]["concurrency"] == 1
        assert s["load"]["rss_peak_bytes"] > 1e6 and s["load"]["n_samples"] >= 1
        assert s["log"] == f"servers/{s['mode_label']}-r0.log"
        log = (run_dir / s["log"]).read_text()
        assert f"listening on http://127.0.0.1:{arg(s, '--port')}, 1 slots" in log
        assert log.count("/completion of") == len(every)
    assert servers[0]["metrics_delta"]["prompt_tokens_cached"] == 0
    assert arg(servers[2], "--slot-save-path") == str(run_dir / "servers" / "disk-slots-r0.slots")
    assert "cache_prompt false" in (run_dir / "servers/none-r0.log").read_text()


def test_disk_slots_saves_after_each_turn_and_restores_before_the_next(basic):
    run_dir, by_mode, _ = basic
    got = rows(run_dir)
    doc = {q: got[f"{q}-disk-slots-r0"]["document"] for q in REQUESTS}
    sha = {got[f"{q}-disk-slots-r0"]["prompt_sha256"]: q for q in REQUESTS}
    steps = []  # the turns and slot actions in the order the server saw them (the holds left out)
    for e in by_mode["disk-slots"]:
        if e["event"] == "completion" and digest(e["prompt"]) in sha:
            steps.append(sha[digest(e["prompt"])])
        elif e["event"] in ("save", "restore"):
            steps.append(f"{e['event']} {e['filename']}")
    f = {q: f"{doc[q]}.bin" for q in REQUESTS}
    assert steps == ["c0-t1", f"save {f['c0-t1']}", "c1-t1", f"save {f['c1-t1']}",
                     f"restore {f['c0-t2']}", "c0-t2", f"save {f['c0-t2']}",
                     f"restore {f['c1-t2']}", "c1-t2", f"save {f['c1-t2']}"]
    last = {digest(e["prompt"]): e["prompt"] for e in by_mode["disk-slots"] if e["event"] == "completion"}
    for q in ("c0-t2", "c1-t2"):
        saved = run_dir / "servers" / "disk-slots-r0.slots" / f[q]
        assert json.loads(saved.read_text()) == last[got[f"{q}-disk-slots-r0"]["prompt_sha256"]]
    assert not (run_dir / "servers" / "prefix-cache-r0.slots").exists()


def test_report_and_cost_name_the_server_findings_and_price_each_mode(basic):
    run_dir, _, tmp = basic
    r = CliRunner().invoke(app, ["report", str(run_dir), "--out", str(tmp / "report")])
    text = " ".join(r.output.split())
    assert r.exit_code == 0, r.output
    assert "`none`: 0 cached prompt tokens on every one of 4 requests (checked)" in text
    assert "cold starts: 3 of 3 mode starts answered their first request with 0 cached tokens" in text
    assert "`disk-slots`: from turn 2 on reused 100% of what earlier turns held" in text
    r = CliRunner().invoke(app, ["cost", "--gpu-price", "2", str(run_dir), "--out", str(tmp / "cost")])
    assert r.exit_code == 0, r.output
    costs = pd.read_csv(tmp / "cost" / "reuse_cost.csv")
    # disk-slots: its reuse saving against none, its tier saving against prefix-cache
    assert list(zip(costs["mode_label"], costs["baseline"], costs["saving_kind"])) == [
        ("prefix-cache", "none", "reuse"), ("disk-slots", "none", "reuse"), ("disk-slots", "prefix-cache", "tier")]
    assert set(costs["engine"]) == {"llama.cpp"}
    assert (costs["recompute_usd_per_million"] > 0).all() and (costs["requests"] == 4).all()
    text = " ".join(r.output.split())
    assert all(f"`{m}` " in text and "USD per 1M tokens" in text for m in ("prefix-cache", "disk-slots"))


def test_a_cold_mode_that_reused_tokens_is_contaminated_and_never_the_reference(tmp_path, record):
    run_dir = run(tmp_path, scenario(), FAKE_CACHED_COLD=1)
    got = rows(run_dir)
    for q in REQUESTS:
        none, warm = got[f"{q}-none-r0"], got[f"{q}-prefix-cache-r0"]
        assert none["status"] == "ok" and none["contaminated"] is True and none["cached_prompt_tokens"] >= 16
        assert none["tokens_match"] is None and "not taken as the reference" in none["notes"]["tokens_match"]
        assert warm["contaminated"] is False and warm["tokens_match"] is None  # nothing to compare with
    assert got["c0-t1-none-r0"]["cold_verified"] is False and got["c0-t1-prefix-cache-r0"]["cold_verified"] is True
    r = CliRunner().invoke(app, ["report", str(run_dir), "--out", str(tmp_path / "report")])
    text = " ".join(r.output.split())
    assert "`none`: 4 of 4 requests reused cached tokens: contaminated, not used as the reference" in text
    assert "cold starts: 1 of 2 mode starts answered their first request with 0 cached tokens; 1 did not" in text


def test_outputs_that_differ_from_recompute_are_counted_not_hidden(tmp_path, record):
    got = rows(run(tmp_path, scenario(), FAKE_CACHE_SHIFT=1))
    warm = {q: got[f"{q}-prefix-cache-r0"] for q in REQUESTS}
    assert all(got[f"{q}-none-r0"]["tokens_match"] is True for q in REQUESTS)
    for r in warm.values():  # the fake shifts every id of a request that reused cached tokens
        assert r["tokens_match"] is (not r["cached_prompt_tokens"])
        assert r["first_divergence_step"] == (None if r["tokens_match"] else 0)
    assert sum(r["tokens_match"] is False for r in warm.values()) >= 2


def test_a_server_that_does_not_start_fails_its_mode_only(tmp_path, record):
    data = scenario(modes=[{"name": "none"}, {"name": "broken", "preset": "prefix-cache", "args": ["--bad-flag"]},
                           {"name": "prefix-cache"}])
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    r = CliRunner().invoke(app, ["run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "res"),
                                  "--trust-server-config"])
    assert r.exit_code == 1, r.output
    assert "4 trials failed with status error" in " ".join(r.output.split())
    got = rows(next((tmp_path / "res").iterdir()))
    for q in REQUESTS:
        broken = got[f"{q}-broken-r0"]
        assert broken["status"] == "error"
        assert "fake_llama_server.py at http://127.0.0.1:" in broken["message"]
        assert "did not start: it ended (exit status 1) before /health answered 200" in broken["message"]
        assert broken["message"].endswith("error: invalid argument: --bad-flag")
        assert got[f"{q}-none-r0"]["status"] == got[f"{q}-prefix-cache-r0"]["status"] == "ok"


@pytest.fixture(scope="module")
def crashed(tmp_path_factory):
    """A run whose servers exit after their 3rd completion, then resumed with the variable unset: (run dir,
    rows before the resume, the CLI's result of the resume, what the fake saw during the resume)."""
    tmp = tmp_path_factory.mktemp("crashed")
    with fake_env(tmp / "record.jsonl"):
        run_dir = run(tmp, scenario(), FAKE_CRASH_AFTER=3)
        before = rows(run_dir)
        n_events = len(events(tmp / "record.jsonl"))
        resumed = CliRunner().invoke(app, ["run", "--resume", str(run_dir), "--trust-server-config"])
        during = events(tmp / "record.jsonl")[n_events:]
    return run_dir, before, resumed, during


def test_a_server_that_exits_mid_mode_fails_what_was_in_flight_and_leaves_the_rest_to_resume(crashed):
    run_dir, before, resumed, during = crashed
    status = {t: r["status"] for t, r in before.items()}
    # none: its 4th completion finds the server gone; prefix-cache: turn 1 of c1 is answered, then the server exits
    # before the unrecorded hold of its reply: that request fails, and c0-t2, c1-t2 are not sent
    assert status == {**{f"{q}-none-r0": "ok" for q in REQUESTS[:3]}, "c1-t2-none-r0": "error",
                      "c0-t1-prefix-cache-r0": "ok", "c1-t1-prefix-cache-r0": "error"}
    for t, r in before.items():
        if r["status"] == "error":
            assert "the server exited mid-mode; the requests not sent yet are left for `kvbench run --resume`; its " \
                   "log ends:" in r["message"]
            assert "fake llama-server: exiting after 3 completions (FAKE_CRASH_AFTER)" in r["message"]
    assert resumed.exit_code == 1, resumed.output  # the error rows stay: a failed request is a finished trial
    assert "2 trials written to" in resumed.output and "(6 already there)" in resumed.output
    after = rows(run_dir)
    assert {t: r for t, r in after.items() if t in before} == before  # nothing repeated or lost
    assert {t: r["status"] for t, r in after.items() if t not in before} == {
        "c0-t2-prefix-cache-r0": "ok", "c1-t2-prefix-cache-r0": "ok"}
    # a new prefix-cache server: turn 1 of both conversations re-sent, unrecorded, before their turn 2
    sent = [digest(e["prompt"]) for e in during if e["event"] == "completion" and e["n_predict"] == 4]
    assert sent == [before[f"{q}-none-r0"]["prompt_sha256"] for q in ("c0-t1", "c1-t1", "c0-t2", "c1-t2")]


def test_a_resume_keeps_the_servers_of_the_earlier_call_in_run_json(crashed):
    run_dir, _, _, _ = crashed
    servers = meta(run_dir)["servers"]
    assert [s["mode_label"] for s in servers] == ["none", "prefix-cache", "prefix-cache"]
    assert ["exited" in s for s in servers] == [True, True, False]
    assert [s["log"] for s in servers] == ["servers/none-r0.log", "servers/prefix-cache-r0.log",
                                           "servers/prefix-cache-r0.2.log"]  # the crashed server's log is kept


def test_http_500_truncated_stream_and_hang_are_one_error_row_each(tmp_path, record):
    data = scenario(engine={"kind": "llama.cpp", "binary": str(FAKE), "request_timeout_s": 2})
    got = rows(run(tmp_path, data, FAKE_HTTP_500=1, FAKE_TRUNCATE=2, FAKE_HANG=3))
    for mode in ("none", "prefix-cache"):
        failed, truncated, hung, ok = (got[f"{q}-{mode}-r0"] for q in REQUESTS)
        assert [r["status"] for r in (failed, truncated, hung, ok)] == ["error", "error", "error", "ok"]
        assert "/completion: HTTP 500 Internal Server Error:" in failed["message"]
        assert "fake failure of completion request 1 (FAKE_HTTP_500)" in failed["message"]
        assert "the stream ended without its final event" in truncated["message"]
        assert "truncated after 1 tokens" in truncated["message"]
        assert "no reply within 2 s" in hung["message"]
        assert all("http://127.0.0.1:" in r["message"] for r in (failed, truncated, hung))


def test_each_concurrency_level_is_a_mode_of_its_own_with_its_slots(tmp_path, record):
    data = scenario(load={"profile": "concurrent", "concurrency": [1, 2]})
    run_dir = run(tmp_path, data, FAKE_TOKEN_DELAY_S=0.05)
    got = rows(run_dir)
    labels = [f"{m}@c{c}" for c in (1, 2) for m in ("none", "prefix-cache")]
    assert set(got) == {f"{q}-{label}-r0" for q in REQUESTS for label in labels}
    for r in got.values():
        assert r["status"] == "ok" and r["concurrency"] == int(r["mode_label"][-1]) and r["queue_s"] >= 0
        assert r["mode"] == r["mode_label"].split("@")[0] and r["load_profile"] == "concurrent"
    servers = {s["mode_label"]: s for s in meta(run_dir)["servers"]}
    assert list(servers) == labels
    assert all(arg(s, "-np") == label[-1] and s["slots"] == int(label[-1]) for label, s in servers.items())
    assert int(arg(servers["none@c2"], "-c")) == 2 * int(arg(servers["none@c1"], "-c"))
    firsts = [e for e in events(record) if str(e["port"]) == arg(servers["none@c2"], "--port")][:2]
    assert firsts[0]["start"] < firsts[1]["end"] and firsts[1]["start"] < firsts[0]["end"]  # in flight together
    for q in ("c0-t2", "c1-t2"):  # two slots: each conversation kept its own
        r = got[f"{q}-prefix-cache@c2-r0"]
        assert r["cached_prompt_tokens"] == r["reusable_prompt_tokens"] > 200


def mid_second_mode(out: Path) -> Path | None:
    """The run directory under ``out`` once run.json lists a server (none's, when its mode ended) and the row of
    prefix-cache's first request is written; else None."""
    try:
        run_dir = next(out.iterdir())
        return run_dir if meta(run_dir).get("servers") and "c0-t1-prefix-cache-r0" in rows(run_dir) else None
    except (StopIteration, FileNotFoundError, ValueError):
        return None


@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["sigint", "sigkill"])
def test_a_signal_mid_mode_leaves_no_server_and_resume_sends_only_what_is_missing(sig, tmp_path, record,
                                                                                  monkeypatch):
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(scenario()))
    out = tmp_path / "res"
    monkeypatch.setenv("FAKE_TOKEN_DELAY_S", "0.1")
    with open(tmp_path / "stderr.txt", "w") as errors:
        proc = subprocess.Popen([*kvbench_cmd(), "run", str(tmp_path / "s.yaml"), "--out", str(out),
                                 "--trust-server-config"],
                                stdout=subprocess.DEVNULL, stderr=errors)
    try:
        end = time.monotonic() + 60
        while (run_dir := mid_second_mode(out)) is None:
            assert proc.poll() is None and time.monotonic() < end, (tmp_path / "stderr.txt").read_text()
            time.sleep(0.05)
        proc.send_signal(sig)
        rc = proc.wait(timeout=10)
    finally:
        proc.kill()
        proc.wait()
    assert not no_fake_within(10)
    before = rows(run_dir)
    assert "c0-t2-prefix-cache-r0" not in before and len(before) < 8
    if sig == signal.SIGINT:
        assert rc == 130 and meta(run_dir)["status"] == "interrupted"
        assert f"continue with: kvbench run --resume {run_dir}" in (tmp_path / "stderr.txt").read_text()
        return
    assert rc == -signal.SIGKILL and meta(run_dir)["status"] == "running"
    monkeypatch.delenv("FAKE_TOKEN_DELAY_S")
    n_events = len(events(record))
    res = kvbench.run_scenario(resume=run_dir, trust_server_config=True)
    after = rows(run_dir)
    assert res.written == 8 - len(before) and list(after)[: len(before)] == list(before)
    assert set(after) == {f"{q}-{m}-r0" for q in REQUESTS for m in ("none", "prefix-cache")}
    assert all(after[t] == r for t, r in before.items()) and all(r["status"] == "ok" for r in after.values())
    resumed = events(record)[n_events:]  # the prefix-cache server of the resume
    sent = [digest(e["prompt"]) for e in resumed if e["event"] == "completion"]
    t1, t2 = after["c0-t1-prefix-cache-r0"]["prompt_sha256"], after["c0-t2-prefix-cache-r0"]["prompt_sha256"]
    assert t1 in sent and sent.index(t1) < sent.index(t2)  # turn 1 re-sent, unrecorded, before turn 2
    assert sent.count(t2) == 1 and after["c0-t2-prefix-cache-r0"]["cached_prompt_tokens"] == modelled_cache(
        resumed)[t2]


def test_requests_past_the_load_s_duration_are_skipped_and_resume_sends_none_of_them(tmp_path):
    data = scenario(load={"profile": "sequential", "duration_s": 0.3})
    run_dir = run(tmp_path, data, FAKE_TOKEN_DELAY_S=0.2)  # each request takes about 0.8 s
    got = rows(run_dir)
    for mode in ("none", "prefix-cache"):
        assert [got[f"{q}-{mode}-r0"]["status"] for q in REQUESTS] == ["ok", "skipped", "skipped", "skipped"]
        assert got[f"c1-t1-{mode}-r0"]["message"] == "not sent: load.duration_s (0.3 s) had passed"
    resumed = CliRunner().invoke(app, ["run", "--resume", str(run_dir), "--trust-server-config"])
    assert resumed.exit_code == 0, resumed.output
    # every planned trial has its row and the sweep ended complete: nothing is started or sent
    assert "nothing to run: every trial of" in resumed.output and rows(run_dir) == got


def test_a_metrics_page_that_is_not_prometheus_text_is_not_reported_and_the_sweep_goes_on(tmp_path):
    from kvbench.bench.engines.server.session import ServerSession

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ServerSession, "metrics_text", lambda self: "<html>hello</html>")
        got = rows(run_dir := run(tmp_path, scenario()))
    assert all(r["status"] == "ok" for r in got.values())
    for srv in meta(run_dir)["servers"]:
        assert srv["metrics_delta"] == {}
        assert "is not Prometheus text" in srv["metrics_notes"]["metrics"]
