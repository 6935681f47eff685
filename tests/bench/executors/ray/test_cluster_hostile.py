"""The Ray executor against hostile circumstances (issue 34): an address whose port answers TCP but is no Ray GCS
(a silent listener, an HTTP server, a gRPC server without the GCS's calls) is refused in a bounded time with exit
status 2 and a message naming the port; a server engine's worker killed mid-request names the request in flight,
and its server logs reach the run folder (or run.json says why not); an interrupted server run keeps its logs; no
worker leaves its folder behind."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from conftest import tiny_scenario
from kvbench.bench.executors.ray import connect as connect_module
from kvbench.bench.run import RunProgress, run_scenario
from kvbench.errors import ClusterError
from kvbench.results.read import read_rows

ray = pytest.importorskip("ray", reason="the Ray executor's tests need the kvbench[ray] extra")

FAKE = Path(__file__).resolve().parents[3] / "data" / "fake_llama_server.py"
#: How a worker's folder is named in the temporary directory (kvbench.bench.executors.ray.watch.FOLDER_PREFIX).
FOLDER_PREFIX = "kvbench-worker-"
#: Seconds per token of the fake server in this module's Ray instance: 4 tokens make a request of about a second.
TOKEN_DELAY_S = 0.25


# --- ports that are no Ray GCS -------------------------------------------------------------------------------

@contextlib.contextmanager
def listener(answer: bytes | None = None) -> Iterator[int]:
    """A TCP port on 127.0.0.1 that accepts every connection and sends ``answer`` once it has read something
    (None: never answers); its port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            held.append(conn)
            if answer is not None:
                conn.recv(4096)
                conn.sendall(answer)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        t.join()
        for c in held:
            c.close()
        srv.close()


@contextlib.contextmanager
def http_server(port: int = 0) -> Iterator[int]:
    """An HTTP/1 server on 127.0.0.1 (``port``, 0: a free one); its port."""
    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            """Log nothing (BaseHTTPRequestHandler writes every request to stderr)."""

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), Quiet)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


def h2_frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


#: What a gRPC server without the GCS's method answers (gRPC C-core's encoding): its SETTINGS, then trailers only
#: on stream 1, status 12 (UNIMPLEMENTED).
UNIMPLEMENTED = (h2_frame(4, 0, 0, b"\x00\x03\x00\x00\x00\x64") + h2_frame(4, 1, 0, b"")
                 + h2_frame(1, 5, 1, b"\x88\x00\x0bgrpc-status\x0212\x00\x0cgrpc-message\x11Method not found!"))


def cli(tmp_path: Path, port: int, answer_s: float = 1.0) -> subprocess.CompletedProcess:
    """``kvbench run s.yaml --address 127.0.0.1:<port>`` in a new process whose GCS answer timeout is
    ``answer_s`` (bounded by 60 s: today's code waits in ray.init for ever)."""
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(tiny_scenario()))
    code = ("import kvbench.bench.executors.ray.connect as c; c.GCS_ANSWER_TIMEOUT_S = float(__import__('sys').argv.pop(1)); "
            "from kvbench.cli import app; app(prog_name='kvbench')")
    return subprocess.run([sys.executable, "-c", code, str(answer_s), "run", str(path), "--out", str(tmp_path / "out"),
                           "--address", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60)


@pytest.mark.e2e
def test_a_port_that_accepts_and_never_answers_exits_2_naming_it(tmp_path):
    with listener() as port:
        t0 = time.monotonic()
        r = cli(tmp_path, port)
    assert r.returncode == 2, r.stderr
    assert time.monotonic() - t0 < 30
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert lines == [f"error: cannot join the Ray cluster at 127.0.0.1:{port}: it accepted the connection but gave "
                     "no answer within 1 s (Ray's GCS answers at once); give the head's GCS port (6379 by default, "
                     "in the address `ray start --head` prints), not the dashboard's (8265) nor the Ray client "
                     "server's (10001, where ray:// addresses go: kvbench joins as a driver)"], r.stderr
    assert not list((tmp_path / "out").glob("*"))  # nothing was started, no run directory is left


@pytest.mark.e2e
def test_an_http_server_is_refused_as_no_gcs(tmp_path):
    with http_server() as port:
        r = cli(tmp_path, port, answer_s=20.0)  # it answers at once: the timeout is not what ends it
    assert r.returncode == 2, r.stderr
    assert f"error: cannot join the Ray cluster at 127.0.0.1:{port}: it answers HTTP, not as a Ray GCS (gRPC); " \
           "give the head's GCS port (6379 by default" in r.stderr
    from kvbench.bench.executors.ray.connect import check_gcs

    try:
        dashboard = http_server(8265)
        dashboard.__enter__()
    except OSError:  # something on this machine holds the dashboard's port: the words for it are not checked
        return
    try:
        with pytest.raises(ClusterError) as err:
            check_gcs("127.0.0.1:8265")
    finally:
        dashboard.__exit__(None, None, None)
    assert str(err.value).startswith("cannot join the Ray cluster at 127.0.0.1:8265: it answers HTTP, not as a Ray "
                                     "GCS (gRPC) (8265 is the Ray dashboard's port); give the head's GCS port")


def test_a_grpc_server_without_the_gcs_calls_and_a_closing_port_are_refused(monkeypatch):
    from kvbench.bench.executors.ray.connect import check_gcs
    from kvbench.bench.executors.ray.gcs_probe import probe_gcs

    monkeypatch.setattr(connect_module, "GCS_ANSWER_TIMEOUT_S", 2.0)
    with listener(UNIMPLEMENTED) as port:
        assert probe_gcs("127.0.0.1", port, 2.0, 2.0) == "grpc"
        monkeypatch.setitem(connect_module.OTHER_RAY_PORTS, port, "the Ray client server's port")
        with pytest.raises(ClusterError, match=rf"^cannot join the Ray cluster at 127\.0\.0\.1:{port}: it is a gRPC "
                                               rf"server without the GCS's calls \({port} is the Ray client server's "
                                               r"port\); give the head's GCS port \(6379 by default"):
            check_gcs(f"127.0.0.1:{port}")
    with listener(b"SSH-2.0-OpenSSH_9.6\r\n") as port:
        assert probe_gcs("127.0.0.1", port, 2.0, 2.0) == "other"
    with socket.socket() as s:  # refused: as before, "cannot reach"
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ClusterError, match=rf"^cannot reach the Ray cluster at 127\.0\.0\.1:{port}: "):
        check_gcs(f"127.0.0.1:{port}")


# --- server logs and folders of workers ----------------------------------------------------------------------

def test_a_lost_workers_folder_is_salvaged_and_removed_and_nothing_else(tmp_path):
    from kvbench.bench.executors.ray.watch import LogShipper, salvage

    root = tmp_path / f"{FOLDER_PREFIX}123-abc"
    shipper = LogShipper(root)
    shipper.begin(["none-r0.log"])  # a name the run has: a placeholder (a folder), never a log
    (root / "servers" / "prefix-cache-r0.log").write_bytes(b"x" * 10 + b"tail")
    (root / "servers" / "none-r0.2.log").write_text("second server\n")
    assert shipper.ship("none-r0.log") is None and (root / "servers" / "none-r0.log").is_dir()
    assert shipper.ship("none-r0.2.log") == ("none-r0.2.log", b"second server\n")
    assert shipper.ship("none-r0.2.log") is None  # sent once
    assert shipper.rest() == [("prefix-cache-r0.log", b"x" * 10 + b"tail")]
    assert [n for n, _ in shipper.rest(again=True)] == ["none-r0.2.log", "prefix-cache-r0.log"]
    other = tmp_path / "not-a-worker"
    other.mkdir()
    assert salvage(str(other)) == [] and other.is_dir()  # not a worker's folder: left alone
    assert salvage(str(root)) == [("none-r0.2.log", b"second server\n"), ("prefix-cache-r0.log", b"x" * 10 + b"tail")]
    assert not root.exists()
    assert salvage(str(root)) == []


def test_run_json_never_names_a_log_the_run_lacks(tmp_path):
    from kvbench.bench.executors.ray.logs import RunLogs

    class Run:
        path = tmp_path
        meta = {"servers": [{"mode_label": "none", "log": "servers/none-r0.log", "worker": "w1"},
                            {"mode_label": "none", "log": "servers/none-r0.2.log", "worker": "w2"},
                            {"mode_label": "x", "engine": "openai"}]}

        def update(self, **fields):
            self.meta.update(fields)

    run = Run()
    logs = RunLogs(run)
    logs.write("none-r0.2.log", b"kept\n")
    logs.write("none-r0.2.log", b"again\n")  # never over a file the run has
    logs.write("../escape.log", b"no")
    assert (tmp_path / "servers" / "none-r0.2.log").read_bytes() == b"kept\n"
    assert not (tmp_path / "escape.log").exists()
    logs.worker_lost("w1", "its worker (host h, pid 7) was lost, and its folder there could not be read: gone")
    logs.expect("prefix-cache-r0.log")
    assert logs.taken() == ["none-r0.2.log", "none-r0.log", "prefix-cache-r0.log"]
    logs.settle("the run ended before its worker sent it", threading.Lock())
    assert run.meta["servers"] == [
        {"mode_label": "none", "log": None, "worker": "w1",
         "log_lost": "its worker (host h, pid 7) was lost, and its folder there could not be read: gone"},
        {"mode_label": "none", "log": "servers/none-r0.2.log", "worker": "w2"}, {"mode_label": "x", "engine": "openai"}]


@pytest.fixture(scope="module")
def cluster():
    """A local Ray instance of 2 CPUs whose workers (and so their fake servers) see FAKE_TOKEN_DELAY_S, at nice
    0."""
    saved = {k: os.environ.get(k) for k in ("RAY_worker_niceness", "FAKE_TOKEN_DELAY_S")}
    os.environ.update(RAY_worker_niceness="0", FAKE_TOKEN_DELAY_S=str(TOKEN_DELAY_S))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def server_scenario(tmp_path: Path) -> Path:
    """2 ShareGPT conversations × 2 turns on the fake llama-server, modes none and prefix-cache, 4 new tokens, on
    the Ray executor."""
    data = {"name": "fake", "model": "smollm2-135m", "engine": {"kind": "llama.cpp", "binary": str(FAKE)},
            "workload": {"source": "sharegpt", "seed": 0, "multi_turn": {
                "conversations": 2, "turns": 2, "min_prompt_tokens": 300, "max_prompt_tokens": 600}},
            "max_new_tokens": 4, "modes": [{"name": "none"}, {"name": "prefix-cache"}], "repeats": 1, "warmup": 0,
            "seed": 0, "executor": {"kind": "ray"}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


class Watcher(RunProgress):
    """Keeps the warnings and the worker's pid (from the status lines); after ``after`` rows, SIGKILLs that worker
    ``delay_s`` seconds into the next request (``kill``), or stops the run (KeyboardInterrupt)."""

    def __init__(self, after: int, kill: bool, delay_s: float = 0.4):
        self.after, self.kill, self.delay_s = after, kill, delay_s
        self.pid: int | None = None
        self.killed: int | None = None
        self.warnings: list[str] = []
        self.rows = 0

    def warning(self, text):
        self.warnings.append(text)

    def status(self, text):
        m = re.match(r".* pid (\d+): ", text)
        if m:
            self.pid = int(m.group(1))

    def trial_done(self, row):
        self.rows += 1
        if self.rows == self.after:
            if not self.kill:
                raise KeyboardInterrupt
            if self.killed is None:
                time.sleep(self.delay_s)  # the next request (a second long) is in flight
                self.killed = self.pid
                os.kill(self.pid, signal.SIGKILL)


def worker_folders() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith(FOLDER_PREFIX)}


def no_fake_within(seconds: float) -> bool:
    import psutil

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not [p for p in psutil.process_iter(["cmdline", "status"]) if p.info["status"] != "zombie"
                and any("fake_llama_server.py" in a for a in p.info["cmdline"] or ())]:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.ray
def test_a_worker_killed_mid_request_names_it_and_its_server_log_reaches_the_run(tmp_path, cluster):
    before = worker_folders()
    watcher = Watcher(after=2, kill=True)
    res = run_scenario(server_scenario(tmp_path), out=tmp_path / "res", trust_server_config=True, progress=watcher)
    assert watcher.killed is not None
    rows = read_rows(res.run_dir / "trials.jsonl")[0]
    host = socket.gethostname()
    counts = Counter(r["trial_id"] for r in rows)
    assert len(counts) == 8 and counts["c0-t2-none-r0"] == 2 and sum(counts.values()) == 9, counts
    lost, retry = [r for r in rows if r["trial_id"] == "c0-t2-none-r0"]
    assert lost["status"] == "error" and lost["attempt"] == 0
    assert lost["message"].startswith(f"worker lost (host {host}, pid {watcher.killed}): ")
    assert retry["status"] == "ok" and retry["attempt"] == 1 and retry["worker"] != lost["worker"]
    meta = json.loads((res.run_dir / "run.json").read_text())
    [gone] = meta["lost_workers"]
    assert (gone["pid"], gone["trial_id"], gone["in_flight"]) == (watcher.killed, "c0-t2-none-r0", ["c0-t2-none-r0"])
    assert gone["logs_recovered"] == ["none-r0.log"] and gone["logs_problem"] is None
    assert any(f"(pid {watcher.killed}) was lost mid-request (c0-t2-none-r0 in flight): " in w
               and "1 server logs recovered from its folder" in w for w in watcher.warnings), watcher.warnings
    servers = meta["servers"]
    assert [(s["mode_label"], s["log"]) for s in servers] == [
        ("none", "servers/none-r0.log"), ("none", "servers/none-r0.2.log"),
        ("prefix-cache", "servers/prefix-cache-r0.log")]
    assert servers[0]["worker"] == lost["worker"] and servers[1]["worker"] == retry["worker"]
    dead_log = (res.run_dir / "servers" / "none-r0.log").read_text()
    assert "request 3: /completion of" in dead_log  # the request in flight when its worker died
    for s in servers[1:]:
        assert "request 1: /completion of" in (res.run_dir / s["log"]).read_text()
    assert sorted(p.name for p in (res.run_dir / "servers").iterdir()) == [
        "none-r0.2.log", "none-r0.log", "prefix-cache-r0.log"]
    assert worker_folders() == before  # the dead worker's folder too
    assert no_fake_within(10)


@pytest.mark.ray
def test_a_log_that_cannot_be_recovered_is_said_not_named(tmp_path, cluster, monkeypatch):
    import kvbench.bench.executors.ray.driver as driver

    before = worker_folders()
    monkeypatch.setattr(driver, "salvage_folders", lambda ray, folders, timeout_s=None: [
        ([], "its node could not be reached (NodeDiedError)") for _ in folders], raising=False)  # a node gone
    watcher = Watcher(after=2, kill=True)
    res = run_scenario(server_scenario(tmp_path), out=tmp_path / "res", trust_server_config=True, progress=watcher)
    meta = json.loads((res.run_dir / "run.json").read_text())
    [gone] = meta["lost_workers"]
    with contextlib.suppress(OSError):  # what the node's salvage would have removed
        import shutil

        shutil.rmtree(gone["folder"])
    assert gone["logs_recovered"] == [] and gone["logs_problem"] == "its node could not be reached (NodeDiedError)"
    servers = meta["servers"]
    assert servers[0]["mode_label"] == "none" and servers[0]["log"] is None
    assert servers[0]["log_lost"] == (f"its worker (host {socket.gethostname()}, pid {watcher.killed}) was lost, and "
                                      "its folder there could not be read: its node could not be reached "
                                      "(NodeDiedError)")
    assert [s["log"] for s in servers[1:]] == ["servers/none-r0.2.log", "servers/prefix-cache-r0.log"]
    assert all((res.run_dir / s["log"]).is_file() for s in servers[1:])
    assert not (res.run_dir / "servers" / "none-r0.log").exists()
    assert any("its server logs could not be recovered: its node could not be reached" in w for w in watcher.warnings)
    assert worker_folders() == before
    assert no_fake_within(10)


@pytest.mark.ray
def test_an_interrupted_server_run_keeps_its_logs_and_leaves_no_folder(tmp_path, cluster):
    before = worker_folders()
    res = run_scenario(server_scenario(tmp_path), out=tmp_path / "res", trust_server_config=True,
                       progress=Watcher(after=2, kill=False))
    assert res.interrupted
    meta = json.loads((res.run_dir / "run.json").read_text())
    assert meta["status"] == "interrupted"
    [none] = meta["servers"]
    assert none["mode_label"] == "none" and none["log"] == "servers/none-r0.log"
    log = (res.run_dir / none["log"]).read_text()
    assert "request 2: /completion of" in log  # what the server had written when the run stopped
    assert worker_folders() == before
    assert no_fake_within(10)
