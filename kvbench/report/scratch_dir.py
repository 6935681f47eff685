"""The private folder a report is written into before its files move into place, named for its owner:
``.kvbench-report-<host hash>-<PID>-<process start, ms>-<random>``. Made in one step (``mkdtemp``), so even a
report killed at once leaves a folder that says whose it is: the next report in the same place removes the folders
whose owner is provably dead, and never one of a report still running."""

from __future__ import annotations

import hashlib
import re
import shutil
import socket
import tempfile
from pathlib import Path

import psutil

PREFIX = ".kvbench-report-"
_NAME = re.compile(re.escape(PREFIX) + r"([0-9a-f]{8})-([0-9]+)-([0-9]+)-")


def _host() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def _started_ms(p: psutil.Process) -> int:
    return round(p.create_time() * 1000)


def owner_prefix() -> str:
    """The start of the scratch folder names of this process: ``.kvbench-report-<host>-<PID>-<start ms>-``."""
    me = psutil.Process()
    return f"{PREFIX}{_host()}-{me.pid}-{_started_ms(me)}-"


def _owner_gone(name: str) -> bool:
    """True only when the folder's owner is provably dead: a name of this scheme, made on this host, whose PID is
    gone or now another process (another start time). Any other name (an older kvbench), another host: False."""
    m = _NAME.match(name)
    if m is None or m.group(1) != _host():
        return False
    try:
        return _started_ms(psutil.Process(int(m.group(2)))) != int(m.group(3))
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def sweep(parent: Path) -> list[Path]:
    """Remove the scratch folders in ``parent`` whose owner is provably dead; returns those removed."""
    gone = [d for d in parent.glob(PREFIX + "*") if d.is_dir() and not d.is_symlink() and _owner_gone(d.name)]
    for d in gone:
        shutil.rmtree(d, ignore_errors=True)
    return gone


def remove_own(parent: Path) -> None:
    """Remove this process's scratch folders in ``parent`` (also one made just as an interrupt arrived, before its
    caller knew its name)."""
    for d in parent.glob(owner_prefix() + "*"):
        if d.is_dir() and not d.is_symlink():
            shutil.rmtree(d, ignore_errors=True)


def make(parent: Path) -> Path:
    """A new scratch folder in ``parent``, named for this process.

    Raises:
        OSError: it cannot be made.
    """
    return Path(tempfile.mkdtemp(dir=parent, prefix=owner_prefix()))


__all__ = ["PREFIX", "make", "owner_prefix", "remove_own", "sweep"]
