"""Servers and scenarios under hostile input (issue 34), on the fake llama-server (tests/data/fake_llama_server.py):
no program or flag run without consent, no hang on a reply that never ends, no line held without bound, nothing
sent through a proxy, a token's text with Unicode line separators read as text, the --version probe's children
gone, an openai server that is not there refused before the sweep."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
import yaml
from typer.testing import CliRunner

import kvbench
from kvbench.bench.engines.server.client import ServerReplyError, complete_llamacpp
from kvbench.bench.engines.server.process import probe_output
from kvbench.bench.engines.server.stream import sse_lines
from kvbench.cli import app
from kvbench.errors import ServerConfigRefused
from kvbench.scenario import load_scenario
from kvbench.scenario.programs import consent_needed
from fake_servers import FAKE, nothing_left_running, record, rows, run, scenario  # noqa: F401

BASE = "http://127.0.0.1:8080"
WORKLOAD = {"source": "sharegpt", "n_prompts": 2, "seed": 0}


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "400"})


def flat(text: str) -> str:
    return " ".join(text.split())


# 1. No program run without consent ------------------------------------------------------------------------------

def marker_program(tmp_path: Path) -> tuple[Path, Path]:
    """An executable that, whenever it runs, appends its arguments to a marker file: (program, marker)."""
    marker = tmp_path / "ran.txt"
    prog = tmp_path / "evil-server"
    prog.write_text(f"#!/bin/sh\necho \"$@\" >> {marker}\nexit 1\n")
    prog.chmod(prog.stat().st_mode | stat.S_IXUSR)
    return prog, marker


def own_picks() -> str:
    """The llama-server programs kvbench would pick itself here, as its consent message lists them."""
    from kvbench.scenario.programs import _own_programs

    return "; ".join(" ".join(p.argv) for p in _own_programs("llama.cpp")) or "none found here"


def test_a_scenario_s_own_program_is_never_run_without_the_opt_in(tmp_path):
    prog, marker = marker_program(tmp_path)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario(engine={"kind": "llama.cpp", "binary": str(prog)})))
    r = invoke("run", str(path), "--out", str(tmp_path / "res"))
    assert r.exit_code == 2, r.output
    assert flat(r.output) == flat(
        f"error: {path}: engine.binary: {prog} is not a program kvbench picks itself for llama.cpp ({own_picks()}): "
        "kvbench would run this program; kvbench runs only the engine's own program on the "
        "scenario's model unless you pass --trust-server-config (read the scenario first: these would run as you)")
    assert not marker.exists() and not (tmp_path / "res").exists()  # not even its --version
    r = invoke("validate", str(path))
    assert "kvbench run refuses it without --trust-server-config" in flat(r.output)
    assert not marker.exists()


@pytest.mark.e2e
def test_a_results_folder_someone_sent_runs_nothing_on_resume(tmp_path, record):
    marker = tmp_path / "ran.txt"
    prog = tmp_path / "their-server"  # the sender's own program, recorded in run.json's scenario
    prog.write_text(f"#!/bin/sh\necho \"$@\" >> {marker}\nexec {sys.executable} {FAKE} \"$@\"\n")
    prog.chmod(0o755)
    data = scenario(name="sent", engine={"kind": "llama.cpp", "binary": str(prog)}, modes=[{"name": "none"}])
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    run_dir = kvbench.run_scenario(tmp_path / "s.yaml", out=tmp_path / "res", trust_server_config=True).run_dir
    assert marker.exists()
    marker.unlink()
    kept = (run_dir / "trials.jsonl").read_text().splitlines(keepends=True)
    (run_dir / "trials.jsonl").write_text("".join(kept[:2]))  # trials left to run
    with pytest.raises(ServerConfigRefused) as e:
        kvbench.run_scenario(resume=run_dir)
    assert str(e.value).startswith(f"{run_dir / 'run.json'}: engine.binary: {prog} is not a program kvbench picks "
                                   "itself for llama.cpp")
    r = invoke("run", "--resume", str(run_dir))
    assert r.exit_code == 2 and "--trust-server-config" in flat(r.output)
    assert not marker.exists() and len((run_dir / "trials.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("args, says", [
    (["--path", "/"], "--path: --path makes the server read or write files"),
    (["--log-file", "server.log"], "--log-file: --log-file makes the server read or write files"),
    (["-hf", "someone/model"], "-hf: -hf makes the server read or write files, fetch weights or code"),
    (["--fim-qwen-7b-default"], "--fim-qwen-7b-default: a llama.cpp hub preset downloads weights"),
    (["--fim-qwen-14b-spec"], "--fim-qwen-14b-spec: a llama.cpp hub preset downloads weights"),
    (["--slot-save-path", "slots"], "--slot-save-path: --slot-save-path makes the server read or write files"),
    (["--chat-template", "x", "--api-prefix", "/etc"], "'/etc': names a path or a URL the server would read")])
def test_server_flags_that_reach_files_or_the_hub_need_the_opt_in(tmp_path, args, says):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario(engine={"kind": "llama.cpp"},
                                            modes=[{"name": "none"}, {"name": "prefix-cache", "args": args}])))
    needs = consent_needed(load_scenario(path))
    assert [p for p, _ in needs] == ["modes[1].args"] and needs[0][1].startswith(says), needs
    r = invoke("run", str(path), "--out", str(tmp_path / "res"))
    assert r.exit_code == 2 and f"modes[1].args: {says}" in flat(r.output) and not (tmp_path / "res").exists()


def test_vllm_abbreviations_of_flags_that_need_the_opt_in_need_it_too(tmp_path):
    from kvbench.scenario import parse_scenario

    s = parse_scenario(scenario(engine={"kind": "vllm", "binary": "/bin/true",
                                        "args": ["--trust-remote", "--download_dir=x"]},
                                model="HuggingFaceTB/SmolLM2-135M-Instruct"), "s.yaml")
    got = [why for _, why in consent_needed(s)]
    assert got[1:] == ["--trust-remote: --trust-remote-code makes the server run code (runs the model folder's own "
                       "Python code)",
                       "--download_dir=x: --download-dir makes the server read or write files, fetch weights or "
                       "code, run code or reach another machine"]


def test_kvbench_s_own_build_and_the_engine_on_path_need_no_opt_in(tmp_path, monkeypatch):
    own = tmp_path / "prefix" / "bin"
    own.mkdir(parents=True)
    server = own / "llama-server"
    server.write_text("#!/bin/sh\nexit 0\n")
    server.chmod(0o755)
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "prefix"))
    for binary, needed in ((str(server), []), (str(own / ".." / "bin" / "llama-server"), []),
                           ("/bin/sh", ["engine.binary"])):
        s = load_scenario_data(tmp_path, scenario(engine={"kind": "llama.cpp", "binary": binary}))
        assert [p for p, _ in consent_needed(s)] == needed, binary
    monkeypatch.setenv("PATH", f"{own}{os.pathsep}{os.environ['PATH']}")
    assert consent_needed(load_scenario_data(tmp_path, scenario(engine={"kind": "llama.cpp",
                                                                        "binary": "llama-server"}))) == []


def load_scenario_data(tmp_path: Path, data: dict):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_scenario(path)


# 13. The --version probe runs like a server: its children die with it ------------------------------------------

def test_the_version_probe_leaves_no_child_behind(tmp_path):
    pid_file = tmp_path / "child.pid"
    prog = tmp_path / "forking-server"
    prog.write_text(f"#!/bin/sh\nsleep 300 &\necho $! > {pid_file}\necho 'version: 1 (forks)'\n")
    prog.chmod(0o755)
    assert probe_output([str(prog), "--version"]) == "version: 1 (forks)\n"
    child = int(pid_file.read_text())
    end = time.monotonic() + 5
    while psutil.pid_exists(child) and psutil.Process(child).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < end, "the probe's child outlived it"
        time.sleep(0.05)
    slow = tmp_path / "slow-server"
    slow.write_text("#!/bin/sh\nsleep 300\n")
    slow.chmod(0o755)
    t0 = time.monotonic()
    assert probe_output([str(slow), "--version"], timeout_s=0.5) is None and time.monotonic() - t0 < 5


# 3, 5, 7: streams ------------------------------------------------------------------------------------------------

def test_sse_lines_end_at_cr_lf_and_crlf_only_and_a_line_is_capped():
    async def lines(*chunks: bytes, cap: int = 100) -> list[str]:
        async def gen():
            for c in chunks:
                yield c
        return [x async for x in sse_lines(gen(), max_line_bytes=cap)]

    text = "a\u2028b\u2029c\u0085d".encode()
    assert asyncio.run(lines(b"data: " + text + b"\r", b"\nx\ry\n\nlast")) == [
        "data: a\u2028b\u2029c\u0085d", "x", "y", "", "last"]
    with pytest.raises(ServerReplyError) as e:
        asyncio.run(lines(b"ok\n", b"y" * 60, b"y" * 60))
    assert str(e.value) == ("the server: line 2 of the stream is longer than 100 bytes (a server-sent event is far "
                            f"shorter; kvbench reads no further): {'y' * 120!r}")


DEAD = "http://127.0.0.1:9"  # the discard port: nothing listens, so a request sent through this proxy fails
#: Per server (one per mode), its 1st reply sends tokens for ever, its 2nd only keep-alive comments, its 3rd one
#: line of 17 MiB; every token's text holds U+2028, U+2029 and U+0085; /metrics is 17 MiB; every proxy variable
#: names a proxy that is not there.
HOSTILE = {"FAKE_ENDLESS": 1, "FAKE_PINGS": 2, "FAKE_GIANT_LINE": 3, "FAKE_SEPARATORS": 1, "FAKE_GIANT_METRICS": 1,
           "HTTP_PROXY": DEAD, "HTTPS_PROXY": DEAD, "ALL_PROXY": DEAD, "http_proxy": DEAD, "all_proxy": DEAD,
           "NO_PROXY": "", "no_proxy": ""}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> Path:
    """A run on fake servers behaving as :data:`HOSTILE` says (2 modes × 4 requests): its run directory."""
    from fake_servers import fake_env

    tmp = tmp_path_factory.mktemp("hostile")
    with fake_env(tmp / "record.jsonl"):
        data = scenario(engine={"kind": "llama.cpp", "binary": str(FAKE), "request_timeout_s": 30,
                                "reply_timeout_s": 8})
        run_dir = run(tmp, data, **HOSTILE)
    (run_dir / "record.jsonl").write_text((tmp / "record.jsonl").read_text())
    return run_dir


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["none", "prefix-cache"])
@pytest.mark.parametrize("trial, says", [
    ("c0-t1", "line 9 of the stream: the stream carries 5 tokens, more than the 4 asked for (kvbench reads no "
              "further)"),
    ("c1-t1", "the reply did not end within 8 s (engine.reply_timeout_s; 0 of 4 tokens had come)"),
    ("c0-t2", "line 1 of the stream is longer than 4,194,304 bytes (a server-sent event is far shorter; kvbench "
              "reads no further): 'data: xxxx")])
def test_a_reply_that_never_ends_or_never_ends_its_line_fails_its_request_only(hostile, mode, trial, says):
    row = rows(hostile)[f"{trial}-{mode}-r0"]
    assert row["status"] == "error" and says in row["message"], row["message"]


@pytest.mark.e2e
def test_a_reply_with_unicode_line_separators_in_its_text_through_a_proxied_environment_is_a_good_row(hostile):
    import hashlib

    got = rows(hostile)
    done = [json.loads(line) for line in (hostile / "record.jsonl").read_text().splitlines()]
    done = [e for e in done if e["event"] == "completion"]
    assert len(done) == 2  # the 4th request of each server: the only one that ended
    for mode, event in zip(("none", "prefix-cache"), done):  # neither the separators nor a dead proxy broke it
        row = got[f"c1-t2-{mode}-r0"]
        assert row["status"] == "ok" and row["n_output_tokens"] == 4, row
        text = "".join(f" t{i}\u2028\u2029\u0085" for i in event["ids"])
        assert row["output_sha256"] == hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.e2e
def test_a_giant_metrics_page_is_not_read(hostile):
    servers = json.loads((hostile / "run.json").read_text())["servers"]
    assert [set(s["metrics_delta"].values()) for s in servers] == [{None}, {None}]


def test_an_openai_engine_may_opt_in_to_the_environment_s_proxy_and_is_told_so(tmp_path):
    data = {"name": "o", "model": "smollm2-135m", "engine": {"kind": "openai", "url": "http://127.0.0.1:8000",
                                                              "use_env_proxy": True},
            "modes": [{"name": "none"}], "prompt_tokens": [32], "max_new_tokens": 2, "workload": WORKLOAD}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    r = invoke("validate", str(tmp_path / "s.yaml"))
    assert r.exit_code == 0 and "engine.use_env_proxy: every request goes through the proxy" in flat(r.output)
    data["engine"] = {"kind": "llama.cpp", "use_env_proxy": True}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    r = invoke("validate", str(tmp_path / "s.yaml"))
    assert r.exit_code == 2 and "use_env_proxy: only for kind openai" in flat(r.output)


# 9. openai: a URL that points the wrong way ----------------------------------------------------------------------

@pytest.mark.parametrize("url, says", [
    ("http://127.0.0.1:8000/v1", "url: http://127.0.0.1:8000/v1 ends in /v1: give the server's base URL "
                                 "(http://127.0.0.1:8000); kvbench adds /v1/completions, /v1/models and /metrics"),
    ("http://127.0.0.1:99999", "url: http://127.0.0.1:99999: the port must be 1 to 65535"),
    ("http://:8000", "url: http://:8000: no host (give one, e.g. http://127.0.0.1:8000)"),
    ("http://[]:8000", "url: http://[]:8000: the host is no name or address")])
def test_an_openai_url_that_points_the_wrong_way_is_refused_by_validate(tmp_path, url, says):
    data = {"name": "o", "model": "smollm2-135m", "engine": {"kind": "openai", "url": url},
            "modes": [{"name": "none"}], "prompt_tokens": [32], "max_new_tokens": 2, "workload": WORKLOAD}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    r = invoke("validate", str(tmp_path / "s.yaml"))
    assert r.exit_code == 2 and says in flat(r.output), r.output


@pytest.mark.e2e
def test_an_openai_server_that_is_not_running_is_refused_before_the_sweep(tmp_path):
    data = {"name": "o", "model": "smollm2-135m", "engine": {"kind": "openai", "url": "http://127.0.0.1:9"},
            "modes": [{"name": "none"}], "prompt_tokens": [32], "max_new_tokens": 2, "workload": WORKLOAD}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    r = invoke("run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "res"))
    assert r.exit_code == 2, r.output
    assert "engine.url: nothing answers at http://127.0.0.1:9/v1/models (ConnectError" in flat(r.output)
    assert "start the server first, or fix engine.url" in flat(r.output)
    assert not list((tmp_path / "res").glob("*/trials.jsonl")) or all(
        not p.read_text() for p in (tmp_path / "res").glob("*/trials.jsonl"))


@pytest.mark.parametrize("url", ["http://[::ffff:127.0.0.1]:8000", "http://0.0.0.0:8000", "http://127.1:8000",
                                 "http://localhost:8000", "http://[::1]:8000"])
def test_an_openai_server_on_this_machine_gets_no_plaintext_warning(tmp_path, url):
    data = {"name": "o", "model": "smollm2-135m", "engine": {"kind": "openai", "url": url},
            "modes": [{"name": "none"}], "prompt_tokens": [32], "max_new_tokens": 2, "workload": WORKLOAD}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    r = invoke("validate", str(tmp_path / "s.yaml"))
    assert r.exit_code == 0 and "plain http" not in r.output, r.output


def test_an_openai_server_on_another_machine_over_plain_http_is_said_to_get_the_prompts_in_clear(tmp_path):
    data = {"name": "o", "model": "smollm2-135m", "engine": {"kind": "openai", "url": "http://10.1.2.3:8000"},
            "modes": [{"name": "none"}], "prompt_tokens": [32], "max_new_tokens": 2, "workload": WORKLOAD}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    r = invoke("validate", str(tmp_path / "s.yaml"))
    assert r.exit_code == 0 and ("engine.url: http://10.1.2.3:8000 is another machine over plain http: every "
                                 "prompt and reply crosses the network unencrypted") in flat(r.output)


# Mode request options that would change a reply's length or slot ---------------------------------------------

@pytest.mark.parametrize("key", ["id_slot", "t_max_predict_ms", "n", "echo", "stop"])
def test_request_options_that_change_a_reply_s_length_or_slot_are_refused(tmp_path, key):
    data = scenario(modes=[{"name": "none"}, {"name": "x", "preset": "prefix-cache", "request": {key: 99}}])
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    r = invoke("validate", str(tmp_path / "s.yaml"))
    assert r.exit_code == 2 and (f"modes[1].request: {key}: would change a reply's length or choices, or the slot "
                                 "it takes") in flat(r.output), r.output


def test_the_client_stops_reading_at_the_first_token_past_the_asked_count():
    sent = []

    async def endless():
        for k in range(1, 10**6):
            sent.append(k)
            yield (b"data: " + json.dumps({"content": " x", "tokens": [1], "stop": False,
                                           "tokens_predicted": k}).encode() + b"\n\n")

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(
                lambda r: httpx.Response(200, content=endless()))) as client:
            await complete_llamacpp(client, BASE, [1, 2], 3)

    with pytest.raises(ServerReplyError, match="the stream carries 4 tokens, more than the 3 asked for"):
        asyncio.run(go())
    assert len(sent) < 100


def test_a_poisson_rate_that_sends_everything_at_once_is_called_a_burst(tmp_path):
    data = {"name": "p", "model": "smollm2-135m", "engine": {"kind": "llama.cpp"}, "workload": WORKLOAD,
            "prompt_tokens": [64], "max_new_tokens": 2, "modes": [{"name": "none"}],
            "load": {"profile": "poisson", "rate": 1e6}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    r = invoke("validate", str(tmp_path / "s.yaml"))
    assert r.exit_code == 0 and ("load.rate: 1e+06 requests/s with no load.concurrency cap sends all 2 requests "
                                 "within about 0.002 ms: one burst queued at the server's slots, not a rate") in \
        flat(r.output), r.output
    data["load"] = {"profile": "poisson", "rate": 1.0}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    assert "burst" not in invoke("validate", str(tmp_path / "s.yaml")).output


@pytest.mark.e2e
def test_an_openai_url_where_another_kind_of_server_answers_is_refused_before_the_sweep(tmp_path):
    import http.server
    import threading

    class NotOpenAI(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_error(404)

        def log_message(self, *args) -> None:
            """Log nothing."""

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotOpenAI)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        data = {"name": "o", "model": "smollm2-135m", "engine": {"kind": "openai", "url": url},
                "modes": [{"name": "none"}], "prompt_tokens": [32], "max_new_tokens": 2, "workload": WORKLOAD}
        (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
        r = invoke("run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "res"))
    finally:
        srv.shutdown()
        srv.server_close()
    assert r.exit_code == 2, r.output
    assert (f"engine.url: {url}/v1/models lists no served model (no 200 with an OpenAI model list: is this an "
            "OpenAI-compatible server, at its base URL?); give engine.served_model") in flat(r.output)
    assert not list((tmp_path / "res").glob("*/trials.jsonl")) or all(
        not p.read_text() for p in (tmp_path / "res").glob("*/trials.jsonl"))
