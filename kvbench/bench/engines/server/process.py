"""One serving engine's process: started on a loopback address, its output in a log file, stopped on every exit.

A server never outlives kvbench: ``with ServerProcess(...)`` stops it on every exit of the block (exceptions and
KeyboardInterrupt included); :func:`stop_all` (registered once with :mod:`atexit`) stops the rest at interpreter
exit. SIGTERM's default action skips atexit, so ``kvbench.cli`` installs a SIGTERM handler that raises
``SystemExit``; this module installs no signal handler. If kvbench is SIGKILLed, the kernel SIGKILLs the server
(Linux ``PR_SET_PDEATHSIG``, set when :meth:`ServerProcess.start` runs on the main thread: it follows the thread
that forked) and a watchdog process per server, seeing kvbench's pipe close, sends SIGTERM, then after
``grace_s`` SIGKILL, to the server's process group, so its children die too. Nothing a server sends is executed
or parsed: the health check reads the HTTP status only; quoted log lines have their control characters replaced.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import functools
import ipaddress
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx
import psutil

from kvbench.errors import BadParameter, NotRegular, SymlinkRefused, UnwritableOutput, UserError
from kvbench.parent_death import die_with_parent

#: Seconds between two health requests while a server starts.
POLL_S = 0.1
#: Bytes read from the end of a log for :meth:`ServerProcess.log_tail`.
TAIL_BYTES = 64 * 1024
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_LIVE: set[ServerProcess] = set()
_LIVE_LOCK = threading.Lock()
# The watchdog (argv: process group, grace in seconds). A byte on stdin: kvbench stopped the server itself. End
# of file without one: kvbench is gone, so SIGTERM to the group, SIGKILL after the grace if any member remains.
_WATCHDOG = """import os, signal, sys, time
pgid, grace = int(sys.argv[1]), float(sys.argv[2])
def sent(sig):
    try: os.killpg(pgid, sig); return True
    except ProcessLookupError: return False
if not os.read(0, 1) and sent(signal.SIGTERM):
    end = time.monotonic() + grace
    while time.monotonic() < end and sent(0): time.sleep(0.05)
    sent(signal.SIGKILL)
"""


def _check_host(host: str) -> None:
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise BadParameter(f"{{host}} {host!r} is not a loopback address: kvbench runs servers on 127.0.0.1 or "
                           "::1 only, never on an interface other machines can reach", "host")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the system's pick for port 0). Another process may take it before the
    server binds it; the server's bind error then appears in :class:`ServerStartError`.

    Raises:
        kvbench.errors.BadParameter: ``host`` is not a loopback address literal (127.0.0.0/8, ::1).
    """
    _check_host(host)
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _status_words(rc: int) -> str:
    if rc >= 0:
        return f"exit status {rc}"
    name = signal.Signals(-rc).name if -rc in signal.valid_signals() else f"signal {-rc}"
    return f"killed by {name} (exit status {rc})"


def _with_tail(head: str, log_path: Path, tail: str) -> str:
    return f"{head}\nlast lines of its log {log_path}:\n{tail}" if tail.strip() else \
        f"{head}\n(its log {log_path} is empty)"


class ServerStartError(UserError, RuntimeError):
    """A server that did not become healthy: its program could not be run, it ended before the health path
    answered 200, or no 200 came in time. The message names the program and the URL, says why and ends with the
    log's last lines. Attributes: ``program``, ``url``, ``why``, ``log_tail`` (may be empty)."""

    def __init__(self, program: str, url: str, why: str, log_path: Path, log_tail: str):
        self.program, self.url, self.why, self.log_tail = program, url, why, log_tail
        super().__init__(_with_tail(f"{program} at {url} did not start: {why}", log_path, log_tail))


class ServerExited(UserError, RuntimeError):
    """A server that no longer runs while kvbench uses it. ``status``: its exit status as :class:`subprocess.Popen`
    gives it (negative: the killing signal's number); the message names the program, the URL and the status and
    ends with the log's last lines (``log_tail``)."""

    def __init__(self, program: str, url: str, status: int, log_path: Path, log_tail: str, stopped: bool = False):
        self.program, self.url, self.status, self.log_tail = program, url, status, log_tail
        what = "was stopped by kvbench" if stopped else "exited while in use"
        super().__init__(_with_tail(f"{program} at {url} {what} ({_status_words(status)})", log_path, log_tail))


def _open_log(path: Path) -> int:
    """A new (truncated) log opened for appending, never through a symbolic link (O_NONBLOCK: a FIFO cannot
    block the open; it changes nothing for a regular file), readable by kvbench's user alone (a server logs its
    settings, SGLang its keys): its file descriptor."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise SymlinkRefused(path) from None
        if e.errno in (errno.EISDIR, errno.ENXIO):
            raise NotRegular(path) from None
        raise UnwritableOutput(path, e.strerror or str(e), "the server's log") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegular(path)
    with contextlib.suppress(OSError):  # a log that was there keeps its mode otherwise
        os.fchmod(fd, 0o600)
    return fd


def _death_signal_preexec():
    """On Linux and on the main thread, a function for the forked child: SIGKILL when this thread ends (at once
    when kvbench already ended between fork and prctl: :func:`kvbench.parent_death.die_with_parent`). Else None
    (the signal follows the thread that forked: a worker thread's end would kill the server)."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    return functools.partial(die_with_parent, os.getpid())


def _dead(p: psutil.Process) -> bool:
    """Whether ``p`` has ended: gone, or a zombie. (Not :func:`psutil.wait_procs`: it counts a zombie that is not
    kvbench's child as alive until its new parent reaps it, and an init may reap orphans late: 1.6 s on a Firecracker
    VM, where a server's stop then took 1.76 s instead of 0.05 s.)"""
    try:
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class ServerProcess:
    """One server process: started on 127.0.0.1 (never another interface) at a free port, its output written to
    `log_path`, stopped on every exit path.

    ``argv``: the whole command, which must make the server listen on ``host``:``port`` (no flag is added).
    ``log_path`` gets stdout and stderr. ``health_path`` is polled every :data:`POLL_S` s until it answers 200,
    for at most ``startup_timeout_s`` s; :meth:`stop` waits ``grace_s`` s after SIGTERM before SIGKILL. ``env``:
    the server's whole environment (None: kvbench's). ``url`` is ``http://127.0.0.1:PORT``, ``pid`` None before
    start (kept after stop), ``program`` the name of ``argv[0]``.

    Raises:
        kvbench.errors.BadParameter: an empty ``argv``; a host that is no loopback address; a port outside
            1..65535; a health path not starting with one "/"; a startup timeout not > 0 or a grace not >= 0 s.
    """

    def __init__(self, argv: Sequence[str], log_path: Path, *, port: int, host: str = "127.0.0.1",
                 health_path: str = "/health", startup_timeout_s: float = 120.0, grace_s: float = 5.0,
                 env: Mapping[str, str] | None = None):
        self.argv = [os.fspath(a) for a in argv]
        if not self.argv:
            raise BadParameter("{argv} is empty: it needs at least the server's program", "argv")
        _check_host(host)
        for ok, name, what, value in (
                (type(port) is int and 1 <= port <= 65535, "port", "a TCP port, 1 to 65535", port),
                (health_path[:1] == "/" != health_path[1:2], "health_path", "a path starting with one '/'",
                 health_path),
                (0 < startup_timeout_s < float("inf"), "startup_timeout_s", "> 0 seconds", startup_timeout_s),
                (0 <= grace_s < float("inf"), "grace_s", ">= 0 seconds", grace_s)):
            if not ok:
                raise BadParameter(f"{{{name}}} must be {what} (got {value!r})", name)
        self.log_path, self.host, self.port, self.health_path = Path(log_path), host, port, health_path
        self.startup_timeout_s, self.grace_s = float(startup_timeout_s), float(grace_s)
        self.env = dict(env) if env is not None else None
        self.program = Path(self.argv[0]).name
        self.url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        self.pid: int | None = None
        self._proc: subprocess.Popen | None = None
        self._watchdog: subprocess.Popen | None = None
        self._status: int | None = None
        self._stopped, self._lock = False, threading.RLock()

    def start(self) -> None:
        """Start the server (own session and process group, stdin /dev/null, log truncated) and wait until
        ``health_path`` answers 200. On any failure, KeyboardInterrupt included, the server is stopped first.

        Raises:
            kvbench.errors.SymlinkRefused / NotRegular / UnwritableOutput: ``log_path`` is a symbolic link
                (nothing is written through it) / not a regular file / cannot be created.
            ServerStartError: the program cannot be run; it ended before answering 200 (exit status and the log's
                last 20 lines: a taken port shows as the server's own bind error); no 200 within
                ``startup_timeout_s``.
            RuntimeError: ``start()`` was already called (a bug of the caller).
        """
        with self._lock:
            if self._proc is not None:
                raise RuntimeError(f"{self.program} at {self.url}: start() was already called")
            fd = _open_log(self.log_path)
            try:
                self._proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=fd,
                                              stderr=subprocess.STDOUT, env=self.env, start_new_session=True,
                                              preexec_fn=_death_signal_preexec())
            except (OSError, subprocess.SubprocessError) as e:  # SubprocessError: the preexec function failed
                raise self._start_error(f"cannot run {self.argv[0]}: {getattr(e, 'strerror', None) or e}") from None
            finally:
                os.close(fd)
            self.pid = self._proc.pid
            with _LIVE_LOCK:
                _LIVE.add(self)
        try:
            self._watchdog = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(self.pid), repr(self.grace_s)],
                                              stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL, start_new_session=True)
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise

    def _start_error(self, why: str) -> ServerStartError:
        return ServerStartError(self.program, self.url, why, self.log_path, self.log_tail())

    def _wait_healthy(self) -> None:
        deadline, last = time.monotonic() + self.startup_timeout_s, "no answer yet"
        with httpx.Client(trust_env=False, follow_redirects=False) as client:
            while (rc := self._proc.poll()) is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._start_error(f"not healthy within {self.startup_timeout_s:g} s (last answer to "
                                            f"{self.health_path}: {last})")
                try:
                    with client.stream("GET", self.url + self.health_path, timeout=min(max(left, POLL_S), 5)) as r:
                        if r.status_code == 200:
                            return
                        last = f"HTTP {r.status_code}"
                except httpx.TransportError as e:
                    last = "no connection" if isinstance(e, httpx.ConnectError) else f"no reply ({type(e).__name__})"
                time.sleep(max(0.0, min(POLL_S, deadline - time.monotonic())))
        raise self._start_error(f"it ended ({_status_words(rc)}) before {self.health_path} answered 200")

    def _tree(self) -> list[psutil.Process]:
        try:
            leader = psutil.Process(self._proc.pid)
            return [leader, *leader.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def alive(self) -> bool:
        """True while the started server process runs (False before start, after it ended or was stopped)."""
        return self._proc is not None and not self._stopped and self._proc.poll() is None

    def check_alive(self) -> None:
        """Return when the server runs.

        Raises:
            ServerExited: the process has ended (its exit status and the log's last 20 lines).
            RuntimeError: called before :meth:`start` (a bug of the caller).
        """
        if self._proc is None:
            raise RuntimeError(f"{self.program} at {self.url}: check_alive() before start()")
        if (rc := self._proc.poll()) is not None:
            raise ServerExited(self.program, self.url, rc, self.log_path, self.log_tail(), stopped=self._stopped)

    def log_tail(self, lines: int = 20) -> str:
        """The log's last ``lines`` lines (from its last :data:`TAIL_BYTES` bytes), decoded as UTF-8 with
        ``errors="replace"``, control characters but tab replaced by U+FFFD, joined by newlines; "" when the log
        is missing, not a regular file or a symbolic link, or when ``lines`` < 1."""
        try:
            fd = os.open(self.log_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return ""
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if lines < 1 or not stat.S_ISREG(st.st_mode):
                return ""
            f.seek(max(0, st.st_size - TAIL_BYTES))
            rows = _CONTROL.sub("\ufffd", f.read(TAIL_BYTES).decode("utf-8", errors="replace")).splitlines()
        return "\n".join(rows[1 if st.st_size > TAIL_BYTES else 0:][-lines:])  # past the cut: a line's end

    def _signal_group(self, sig: int) -> None:
        if self._proc.returncode is not None and psutil.pid_exists(self._proc.pid):
            return  # the leader was reaped and its pid names another process now: the group id may be theirs
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    def stop(self) -> int | None:
        """Stop the server: SIGTERM to its process group, wait up to ``grace_s`` seconds for it and its
        descendants, then SIGKILL to the group and to descendants that left it; reap it; end its watchdog.
        Idempotent.

        Returns:
            The exit status as :class:`subprocess.Popen` gives it (negative: the killing signal's number), the
            same on every call; None when the server was never started.
        """
        with self._lock:
            if self._proc is None or self._stopped:
                return self._status
            proc, others = self._proc, self._tree()[1:]
            self._signal_group(signal.SIGTERM)
            deadline = time.monotonic() + self.grace_s
            while (proc.poll() is None or not all(map(_dead, others))) and time.monotonic() < deadline:
                time.sleep(0.02)
            if proc.poll() is None or not all(map(_dead, others)):
                self._signal_group(signal.SIGKILL)
                for p in others:  # psutil refuses a pid that names another process now
                    with contextlib.suppress(psutil.NoSuchProcess):
                        p.kill()
            self._status = proc.wait()
            end = time.monotonic() + 1.0
            while not all(map(_dead, others)) and time.monotonic() < end:
                time.sleep(0.02)
            dog, self._watchdog = self._watchdog, None
            try:
                if dog is not None:  # the byte that says "stopped by kvbench": the watchdog kills nothing
                    dog.communicate(b"x", timeout=2.0)
            except subprocess.TimeoutExpired:
                dog.kill()
                dog.wait()
            self._stopped = True
            with _LIVE_LOCK:
                _LIVE.discard(self)
            return self._status

    def __enter__(self) -> ServerProcess:
        """Start the server (see :meth:`start`, whose errors it raises) and return it."""
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        """Stop the server on every exit of the ``with`` block, exceptions and KeyboardInterrupt included."""
        self.stop()


def probe_output(argv: Sequence[str], timeout_s: float = 30.0, limit: int = 4096) -> str | None:
    """What ``argv`` (a server's program asked ``--version``) prints on stdout and stderr, its first ``limit``
    bytes decoded as UTF-8 (``errors="replace"``), or None when it cannot run or takes over ``timeout_s``
    seconds. It runs as a server does: its own session and process group, stdin /dev/null, SIGKILLed when kvbench
    ends (Linux ``PR_SET_PDEATHSIG``), and its whole process group is SIGKILLed when it returns, so no child it
    started outlives the probe. Raises nothing."""
    import tempfile

    with tempfile.TemporaryFile() as out:
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, preexec_fn=_death_signal_preexec())
        except (OSError, subprocess.SubprocessError):
            return None
        try:
            proc.wait(timeout=timeout_s)
            ok = True
        except subprocess.TimeoutExpired:
            ok = False
        finally:  # the leader may be gone; its group lives while a member does, so its id names nobody else
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if not ok:
            return None
        out.seek(0)
        return out.read(limit).decode("utf-8", errors="replace")


def stop_all() -> None:
    """Stop every :class:`ServerProcess` still running (registered with :mod:`atexit` when this module is
    imported). All are stopped even when one stop fails; the first failure is raised afterwards."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    first: Exception | None = None
    for server in live:
        try:
            server.stop()
        except Exception as e:
            first = first or e
    if first is not None:
        raise first


atexit.register(stop_all)
