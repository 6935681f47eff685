"""A server process's lifecycle (:mod:`kvbench.bench.engines.server.process`), with real processes of the fake server
``tests/data/fake_server.py``: start on 127.0.0.1, health, log, stop on every exit path (SIGKILL, SIGINT and
SIGTERM of the process that started it included), checked with psutil, children included."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from kvbench.bench.engines.server.process import TAIL_BYTES, ServerExited, ServerProcess, ServerStartError, free_port
from kvbench.errors import BadParameter, NotRegular, SymlinkRefused, UnwritableOutput, UserError

ROOT = Path(__file__).resolve().parents[4]
FAKE = ROOT / "tests" / "data" / "fake_server.py"
PROGRAM = Path(sys.executable).name


def fake(port: int, *options: str) -> list[str]:
    """The fake server's command line on 127.0.0.1:port."""
    return [sys.executable, str(FAKE), "--host", "127.0.0.1", "--port", str(port), *options]


def gone(proc: psutil.Process, timeout: float = 5.0) -> bool:
    """Whether the process ends (or is a zombie: dead, not yet reaped by its new parent) within timeout s."""
    end = time.monotonic() + timeout
    while True:
        try:
            if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > end:
            return False
        time.sleep(0.05)


def children(pid: int, timeout: float = 10.0) -> list[psutil.Process]:
    """The process's children once it has one (the fake server's --child spawns it before serving)."""
    end = time.monotonic() + timeout
    while not (kids := psutil.Process(pid).children(recursive=True)) and time.monotonic() < end:
        time.sleep(0.05)
    assert kids, f"process {pid} has no child"
    return kids


def test_start_health_stop_leaves_nothing(tmp_path):
    port = free_port()
    log = tmp_path / "server.log"
    server = ServerProcess(fake(port, "--child"), log, port=port, grace_s=3.0)
    assert server.pid is None and server.stop() is None and not server.alive()
    with server:
        assert server.url == f"http://127.0.0.1:{port}"
        assert server.alive()
        server.check_alive()
        r = httpx.get(server.url + "/health", trust_env=False)
        assert (r.status_code, r.json()) == (200, {"status": "ok"})
        leader = psutil.Process(server.pid)
        kids = children(server.pid)
        assert len(kids) == 1 and os.getpgid(kids[0].pid) == server.pid  # its own process group
        assert os.getsid(server.pid) == server.pid != os.getsid(0)  # and its own session
        assert f"fake_server: listening on 127.0.0.1:{port}" in server.log_tail()
        assert f"child pid {kids[0].pid}" in log.read_text()
    assert gone(leader, 0.0) and gone(kids[0], 1.0)
    assert server.stop() == -signal.SIGTERM  # idempotent: the same status again
    assert not server.alive()
    with pytest.raises(ServerExited, match=r"was stopped by kvbench \(killed by SIGTERM \(exit status -15\)\)"):
        server.check_alive()


def test_loading_then_healthy(tmp_path):
    port = free_port()
    t0 = time.monotonic()
    with ServerProcess(fake(port, "--loading-s", "0.5"), tmp_path / "s.log", port=port) as server:
        assert time.monotonic() - t0 >= 0.5
        log = (tmp_path / "s.log").read_text()
        assert '"GET /health HTTP/1.1" 503' in log and '"GET /health HTTP/1.1" 200' in log
        assert server.alive()


def test_server_that_fails_at_once(tmp_path):
    port = free_port()
    server = ServerProcess(fake(port, "--fail", "error: failed to load model '/m.gguf'"), tmp_path / "s.log",
                           port=port)
    with pytest.raises(ServerStartError) as info:
        server.start()
    e = info.value
    assert isinstance(e, UserError) and isinstance(e, RuntimeError)
    assert str(e).startswith(f"{PROGRAM} at http://127.0.0.1:{port} did not start: it ended (exit status 3) "
                             "before /health answered 200\nlast lines of its log ")
    assert str(e).endswith("error: failed to load model '/m.gguf'")
    assert e.log_tail == "error: failed to load model '/m.gguf'"
    assert not psutil.pid_exists(server.pid) and server.stop() == 3


def test_missing_program(tmp_path):
    server = ServerProcess([str(tmp_path / "llama-server"), "--port", "1"], tmp_path / "s.log", port=1)
    with pytest.raises(ServerStartError, match=r"^llama-server at http://127.0.0.1:1 did not start: cannot run "
                       r".*/llama-server: No such file or directory\n\(its log .*s\.log is empty\)$"):
        server.start()
    assert server.pid is None


def test_server_that_never_gets_healthy(tmp_path):
    port = free_port()
    server = ServerProcess(fake(port, "--hang", "--child"), tmp_path / "s.log", port=port,
                           startup_timeout_s=1.5, grace_s=2.0)
    t0 = time.monotonic()
    with pytest.raises(ServerStartError, match=r"did not start: not healthy within 1.5 s \(last answer to "
                                               r"/health: HTTP 503\)\nlast lines of its log"):
        server.start()
    assert 1.5 <= time.monotonic() - t0 < 4.5
    assert server.stop() == -signal.SIGTERM
    assert not psutil.pid_exists(server.pid)
    assert "child pid" in server.log_tail()
    kid = int(server.log_tail().split("child pid ")[1].split()[0])
    try:
        assert gone(psutil.Process(kid), 1.0)
    except psutil.NoSuchProcess:
        pass  # reaped already


def test_server_ignoring_sigterm_is_killed_after_grace(tmp_path):
    port = free_port()
    server = ServerProcess(fake(port, "--ignore-term", "--child"), tmp_path / "s.log", port=port, grace_s=0.5)
    server.start()
    leader, kid = psutil.Process(server.pid), children(server.pid)[0]
    t0 = time.monotonic()
    assert server.stop() == -signal.SIGKILL
    assert 0.5 <= time.monotonic() - t0 < 3.0
    assert gone(leader, 0.0) and gone(kid, 1.0)


def test_port_taken_shows_the_servers_bind_error(tmp_path):
    with socket.socket() as taken:  # bound, not listening: kvbench's health check is refused at once
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        server = ServerProcess(fake(port), tmp_path / "s.log", port=port)
        with pytest.raises(ServerStartError, match=rf"it ended \(exit status 1\)(.|\n)*fake_server: cannot bind "
                                                   rf"127.0.0.1:{port}: \[Errno 98\] Address already in use"):
            server.start()
    assert not psutil.pid_exists(server.pid)


def test_log_path_must_be_a_regular_file_we_make(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    link = tmp_path / "server.log"
    link.symlink_to(target)
    port = free_port()
    server = ServerProcess(fake(port), link, port=port)
    with pytest.raises(SymlinkRefused, match=r"server\.log is a symbolic link"):
        server.start()
    assert target.read_text() == "keep me\n" and server.pid is None and server.log_tail() == ""
    with pytest.raises(NotRegular, match="not a regular file"):
        ServerProcess(fake(port), tmp_path, port=port).start()
    with pytest.raises(UnwritableOutput, match=r"cannot write the server's log to .*/no/such\.log: No such file"):
        ServerProcess(fake(port), tmp_path / "no" / "such.log", port=port).start()


def test_check_alive_after_the_server_was_killed(tmp_path):
    port = free_port()
    with ServerProcess(fake(port), tmp_path / "s.log", port=port) as server:
        os.kill(server.pid, signal.SIGKILL)
        end = time.monotonic() + 5
        while server.alive() and time.monotonic() < end:
            time.sleep(0.05)
        assert not server.alive()
        with pytest.raises(ServerExited) as info:
            server.check_alive()
        assert info.value.status == -9
        assert str(info.value).startswith(f"{PROGRAM} at http://127.0.0.1:{port} exited while in use (killed by "
                                          "SIGKILL (exit status -9))\nlast lines of its log")
        assert f"listening on 127.0.0.1:{port}" in info.value.log_tail
    assert server.stop() == -9


ORPHAN_SCRIPT = """
import atexit, signal, sys, time
from pathlib import Path
server = None
atexit.register(lambda: print("alive at exit:", server.alive(), flush=True))  # runs after stop_all (LIFO)
sys.path.insert(0, {root!r})
from kvbench.bench.engines.server.process import ServerProcess, free_port
mode, log = sys.argv[1], Path(sys.argv[2])
port = free_port()
argv = [sys.executable, {fake!r}, "--port", str(port), "--child", *sys.argv[3:]]
if mode == "sigterm":  # what kvbench.cli does; the server is started without `with`: atexit's stop_all stops it
    def leave(signum, frame):
        raise SystemExit(143)
    signal.signal(signal.SIGTERM, leave)
    server = ServerProcess(argv, log, port=port, grace_s=2.0)
    server.start()
    print(server.pid, flush=True)
    time.sleep(60)
with ServerProcess(argv, log, port=port, grace_s=2.0) as server:
    print(server.pid, flush=True)
    time.sleep(60)
"""


def start_starter(tmp_path, mode: str, *options: str) -> subprocess.Popen:
    """A Python process that starts a fake server (with a child) and prints the server's pid."""
    script = tmp_path / "starter.py"
    script.write_text(ORPHAN_SCRIPT.format(root=str(ROOT), fake=str(FAKE)))
    return subprocess.Popen([sys.executable, str(script), mode, str(tmp_path / "s.log"), *options],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize(("mode", "sig", "status"), [("sigkill", signal.SIGKILL, -9),
                                                     ("sigint", signal.SIGINT, -2),
                                                     ("sigterm", signal.SIGTERM, 143)])
def test_server_never_outlives_its_starter(tmp_path, mode, sig, status):
    starter = start_starter(tmp_path, mode)
    try:
        line = starter.stdout.readline()
        assert line.strip().isdigit(), starter.stderr.read() if starter.poll() is not None else line
        leader = psutil.Process(int(line))
        kid = children(leader.pid)[0]
        assert leader.ppid() == starter.pid
        starter.send_signal(sig)
        assert starter.wait(timeout=10) == status
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait()
    assert gone(leader) and gone(kid)
    if mode != "sigkill":  # stopped by kvbench itself (`with`, stop_all), not only by the watchdog
        assert starter.stdout.read() == "alive at exit: False\n"
        assert gone(leader, 0.0)
    if mode == "sigint":
        assert "KeyboardInterrupt" in starter.stderr.read()


def test_sigkilled_starter_kills_a_server_that_ignores_sigterm_at_once(tmp_path):
    # The kernel's SIGKILL (PR_SET_PDEATHSIG) ends the server at once; the watchdog's SIGTERM is ignored by the
    # child (SIG_IGN is inherited) until its SIGKILL, grace_s = 2 s later.
    starter = start_starter(tmp_path, "sigkill", "--ignore-term")
    try:
        leader = psutil.Process(int(starter.stdout.readline()))
        kid = children(leader.pid)[0]
        starter.kill()
        t0 = time.monotonic()
        assert gone(leader, 1.0)
        assert not gone(kid, 1.0)
        assert gone(kid, 5.0) and time.monotonic() - t0 >= 1.9
    finally:
        starter.kill()
        starter.wait()


def test_loopback_only_and_arguments_checked(tmp_path):
    log = tmp_path / "s.log"
    with pytest.raises(BadParameter, match=r"^host '0.0.0.0' is not a loopback address: kvbench runs servers on "
                                           r"127.0.0.1 or ::1 only"):
        ServerProcess(["x"], log, port=8080, host="0.0.0.0")
    with pytest.raises(BadParameter, match="host 'localhost' is not a loopback address"):
        free_port("localhost")
    with pytest.raises(BadParameter, match=r"^port must be a TCP port, 1 to 65535 \(got 0\)$") as info:
        ServerProcess(["x"], log, port=0)
    assert info.value.param == "port"
    with pytest.raises(BadParameter, match=r"^health_path must be a path starting with one '/' \(got '//x'\)$"):
        ServerProcess(["x"], log, port=1, health_path="//x")
    with pytest.raises(BadParameter, match=r"^startup_timeout_s must be > 0 seconds \(got 0\)$"):
        ServerProcess(["x"], log, port=1, startup_timeout_s=0)
    with pytest.raises(BadParameter, match=r"^grace_s must be >= 0 seconds \(got -1\)$"):
        ServerProcess(["x"], log, port=1, grace_s=-1)
    with pytest.raises(BadParameter, match="^argv is empty"):
        ServerProcess([], log, port=1)
    assert ServerProcess(["x"], log, port=8080, host="::1").url == "http://[::1]:8080"
    assert 1024 <= free_port() <= 65535 and free_port("127.0.0.2") > 0
    with pytest.raises(RuntimeError, match="check_alive\\(\\) before start\\(\\)"):
        ServerProcess(["x"], log, port=1).check_alive()


def test_log_tail_is_decoded_and_cleaned(tmp_path):
    log = tmp_path / "s.log"
    server = ServerProcess(["x"], log, port=1)
    assert server.log_tail() == ""  # no log yet
    log.write_bytes(b"one\ntwo\n\xff bad byte\n\x1b[31mred\x1b[0m\ttab\r\nlast")
    assert server.log_tail(3) == "\ufffd bad byte\n\ufffd[31mred\ufffd[0m\ttab\nlast"
    assert server.log_tail(0) == ""
    log.write_bytes(b"x" * 10 + b"\n" + b"y" * TAIL_BYTES + b"\nend\n")
    assert server.log_tail() == "end"  # the line cut at the start of the window is left out
