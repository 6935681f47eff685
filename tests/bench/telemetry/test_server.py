"""A server's process as the telemetry sees it (kvbench.bench.telemetry.server)."""

from __future__ import annotations


def test_listening_pid_finds_the_process_on_a_port_and_only_that():
    """A server kvbench did not start is found by the port it listens on (its CPU then counts as the trial's own);
    a port nobody listens on, and a server on another machine, give None."""
    import os
    import socket

    from kvbench.bench.engines.server.launch import running_pid
    from kvbench.bench.telemetry.server import listening_pid

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert listening_pid(port) == os.getpid()
        assert running_pid(f"http://127.0.0.1:{port}") == os.getpid()
        assert running_pid(f"http://localhost:{port}/") == os.getpid()
        assert running_pid(f"http://10.1.2.3:{port}") is None  # another machine's load is not this one's
    assert listening_pid(port) is None
