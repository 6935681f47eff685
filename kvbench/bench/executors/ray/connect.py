"""Joining a Ray cluster (or starting a local instance) for a run, with a clear error when Ray is missing, the
address cannot be reached, or what answers there is no Ray GCS (:mod:`~kvbench.bench.executors.ray.gcs_probe`)."""

from __future__ import annotations

import os
import signal
import socket
import threading
from typing import Any

from kvbench.bench.executors.ray.gcs_probe import Answer, probe_gcs
from kvbench.errors import ClusterError

#: Ray's setting of its workers' nice value (15 by default: a trial would lose the CPU to any other process).
WORKER_NICENESS = "RAY_worker_niceness"
#: Seconds to wait for a TCP connection to a ``HOST:PORT`` address before calling it unreachable.
CONNECT_TIMEOUT_S = 5.0
#: Seconds a ``HOST:PORT`` that accepted the connection gets to answer as a Ray GCS before it is called no GCS.
GCS_ANSWER_TIMEOUT_S = 5.0
#: Ports of Ray's other services, which an address may name by mistake, and what each is.
OTHER_RAY_PORTS = {8265: "the Ray dashboard's port", 10001: "the Ray client server's port",
                   8000: "Ray Serve's HTTP port", 52365: "the Ray dashboard agent's port"}
#: What :func:`~kvbench.bench.executors.ray.gcs_probe.probe_gcs` found, in words.
_FOUND = {"http": "it answers HTTP, not as a Ray GCS (gRPC)", "grpc": "it is a gRPC server without the GCS's calls",
          "closed": "it closed the connection without answering as a Ray GCS",
          "other": "it answers, but not as a Ray GCS (gRPC)"}


def import_ray() -> Any:
    """The ``ray`` module.

    Raises:
        ClusterError: Ray is not installed, naming the extra that installs it.
    """
    try:
        import ray
    except ImportError as exc:
        raise ClusterError("the Ray executor needs Ray, which is not installed: pip install 'kvbench[ray]' "
                           f"({exc})") from None
    return ray


def _auto_address(ray: Any) -> str | None:
    """The ``HOST:PORT`` that ``auto`` means here (``RAY_ADDRESS``, else the cluster the last ``ray start`` on this
    machine recorded, which may be gone), None when there is none or Ray cannot say."""
    try:
        from ray._private.services import canonicalize_bootstrap_address

        found = canonicalize_bootstrap_address("auto")
    except Exception:
        return None
    return found if isinstance(found, str) and ":" in found else None


def _tls() -> bool:
    """Whether Ray talks TLS here (``RAY_USE_TLS``): the probe speaks plain HTTP/2, so it is skipped."""
    return os.environ.get("RAY_USE_TLS", "0").strip().lower() in ("1", "true", "yes")


def check_gcs(target: str, found_by: str = "") -> None:
    """Check that a Ray GCS answers at ``target`` (``HOST:PORT``): a TCP connection within
    :data:`CONNECT_TIMEOUT_S` seconds, then an answer as a GCS within :data:`GCS_ANSWER_TIMEOUT_S` seconds
    (:func:`~kvbench.bench.executors.ray.gcs_probe.probe_gcs`; only the connection under ``RAY_USE_TLS``).
    ``found_by`` is said after the address (how ``auto`` found it).

    Raises:
        ClusterError: one line naming the address, what answers there and the likely mistake (the dashboard's
            8265, the client server's 10001 for the GCS's 6379).
    """
    host, _, port_text = target.rpartition(":")
    host = host.strip("[]")
    try:
        port = int(port_text)
        if _tls():
            socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
            return
        answer: Answer = probe_gcs(host, port, CONNECT_TIMEOUT_S, GCS_ANSWER_TIMEOUT_S)
    except (OSError, ValueError) as exc:
        raise ClusterError(f"cannot reach the Ray cluster at {target}{found_by}: "
                           f"{getattr(exc, 'strerror', None) or exc} (is `ray start --head` running there, and "
                           "is this its GCS port, 6379 by default?)") from None
    if answer == "gcs":
        return
    what = _FOUND.get(answer) or (f"it accepted the connection but gave no answer within {GCS_ANSWER_TIMEOUT_S:g} s "
                                  "(Ray's GCS answers at once)")
    known = f" ({port} is {OTHER_RAY_PORTS[port]})" if port in OTHER_RAY_PORTS else ""
    raise ClusterError(f"cannot join the Ray cluster at {target}{found_by}: {what}{known}; give the head's GCS port "
                       "(6379 by default, in the address `ray start --head` prints), not the dashboard's (8265) nor "
                       "the Ray client server's (10001, where ray:// addresses go: kvbench joins as a driver)")


def connect(address: str | None) -> bool:
    """Make this process a Ray driver: join the cluster at ``address`` (``auto``: the one ``ray start`` made on
    this machine, or ``RAY_ADDRESS``; ``HOST:PORT``: its head node's GCS port, checked first by
    :func:`check_gcs`, since ``ray.init`` would wait without end, deaf to Ctrl-C, at a port that is no GCS) or,
    with None, start a new Ray instance on this machine's CPUs and GPUs (even where ``ray start`` made one or
    ``RAY_ADDRESS`` names one: ``auto`` joins those), its workers at nice 0 (:data:`WORKER_NICENESS`, unless the
    environment sets it). A process already connected
    (``ray.init`` called before, e.g. by a test or a notebook) stays on its cluster.

    Returns:
        Whether this call connected (and so the run should disconnect at its end: ``ray.shutdown()``).

    Raises:
        ClusterError: Ray is missing, the address refuses or does not answer within :data:`CONNECT_TIMEOUT_S`
            seconds, what answers there is no Ray GCS (:func:`check_gcs`), ``auto`` finds no running cluster, or
            Ray refuses to join (e.g. a cluster that wants an authentication token this machine lacks).
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    target = _auto_address(ray) if address == "auto" else address
    if target is not None:  # ray.init would wait for an address that does not answer, deaf to Ctrl-C
        check_gcs(target, " (found by auto: RAY_ADDRESS, or the last `ray start` on this machine)"
                  if address == "auto" else "")
    if address is None:  # a local instance: its workers at the driver's priority, not Ray's default nice 15
        os.environ.setdefault(WORKER_NICENESS, "0")
    in_main = threading.current_thread() is threading.main_thread()
    term = signal.getsignal(signal.SIGTERM) if in_main else None
    try:
        ray.init(address=address or "local", include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as exc:
        raise ClusterError(f"cannot join the Ray cluster at {address or 'a new local instance'}: "
                           f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    if in_main and term is not None:  # ray.init installs its own SIGTERM handler, which exits at once: a run
        signal.signal(signal.SIGTERM, term)  # stopped by a scheduler must still write what finished and stop cleanly
    return True


__all__ = ["CONNECT_TIMEOUT_S", "GCS_ANSWER_TIMEOUT_S", "OTHER_RAY_PORTS", "WORKER_NICENESS", "check_gcs", "connect",
           "import_ray"]
