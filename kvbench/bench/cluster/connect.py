"""Joining a Ray cluster (or starting a local instance) for a run, with a clear error when Ray is missing or the
address cannot be reached."""

from __future__ import annotations

import os
import signal
import socket
import threading
from typing import Any

from kvbench.errors import ClusterError

#: Ray's setting of its workers' nice value (15 by default: a trial would lose the CPU to any other process).
WORKER_NICENESS = "RAY_worker_niceness"
#: Seconds to wait for a TCP connection to a ``HOST:PORT`` address before calling it unreachable.
CONNECT_TIMEOUT_S = 5.0


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
    except Exception:  # noqa: BLE001 - Ray's own lookup (not public API): without it, ray.init decides
        return None
    return found if isinstance(found, str) and ":" in found else None


def connect(address: str | None) -> bool:
    """Make this process a Ray driver: join the cluster at ``address`` (``auto``: the one ``ray start`` made on
    this machine, or ``RAY_ADDRESS``; ``HOST:PORT``: its head node's GCS port, checked with a TCP connection
    first) or, with None, start a new Ray instance on this machine's CPUs and GPUs (even where ``ray start`` made
    one or ``RAY_ADDRESS`` names one: ``auto`` joins those), its workers at nice 0
    (:data:`WORKER_NICENESS`, unless the environment sets it). A process already connected
    (``ray.init`` called before, e.g. by a test or a notebook) stays on its cluster.

    Returns:
        Whether this call connected (and so the run should disconnect at its end: ``ray.shutdown()``).

    Raises:
        ClusterError: Ray is missing, the address refuses or does not answer within :data:`CONNECT_TIMEOUT_S`
            seconds, or ``auto`` finds no running cluster.
    """
    ray = import_ray()
    if ray.is_initialized():
        return False
    target = _auto_address(ray) if address == "auto" else address
    if target is not None:  # ray.init would wait for an address that does not answer, deaf to Ctrl-C
        host, _, port = target.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
        except (OSError, ValueError) as exc:
            found = " (found by auto: RAY_ADDRESS, or the last `ray start` on this machine)" if address == "auto" else ""
            raise ClusterError(f"cannot reach the Ray cluster at {target}{found}: "
                               f"{getattr(exc, 'strerror', None) or exc} (is `ray start --head` running there, and "
                               "is this its GCS port, 6379 by default?)") from None
    if address is None:  # a local instance: its workers at the driver's priority, not Ray's default nice 15
        os.environ.setdefault(WORKER_NICENESS, "0")
    in_main = threading.current_thread() is threading.main_thread()
    term = signal.getsignal(signal.SIGTERM) if in_main else None
    try:
        ray.init(address=address or "local", include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ClusterError(f"cannot join the Ray cluster at {address or 'a new local instance'}: "
                           f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    if in_main and term is not None:  # ray.init installs its own SIGTERM handler, which exits at once: a run
        signal.signal(signal.SIGTERM, term)  # stopped by a scheduler must still write what finished and stop cleanly
    return True


__all__ = ["CONNECT_TIMEOUT_S", "WORKER_NICENESS", "connect", "import_ray"]
