"""A child that called :func:`kvbench.parent_death.die_with_parent` is SIGKILLed when its parent ends, however it
ends, and at once when its parent ended before it asked."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")


def python(code: str, **kwargs) -> subprocess.Popen:
    """``code`` in a fresh Python that imports this checkout's kvbench."""
    return subprocess.Popen([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r})\n{code}"],
                            text=True, **kwargs)


def alive(p: psutil.Process) -> bool:
    """Whether ``p`` runs (a zombie, dead and not yet reaped by its new parent, does not)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_child_asks_for_sigkill_and_lives_while_its_parent_does():
    child = python("import ctypes, os\nfrom kvbench.parent_death import die_with_parent\n"
                   "die_with_parent(os.getppid())\nsig = ctypes.c_int()\n"
                   "assert ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0) == 0  # PR_GET_PDEATHSIG\n"
                   "print(sig.value)", stdout=subprocess.PIPE)
    assert child.communicate(timeout=60) == (f"{int(signal.SIGKILL)}\n", None) and child.returncode == 0


def test_a_child_whose_parent_is_already_gone_ends_at_once():
    child = python("from kvbench.parent_death import die_with_parent\ndie_with_parent(0)\nprint('alive')",
                   stdout=subprocess.PIPE)
    assert child.communicate(timeout=60) == ("", None) and child.returncode == -signal.SIGKILL


def test_the_child_dies_when_its_parent_is_sigkilled():
    parent = python("import functools, os, subprocess, sys, time\nfrom kvbench.parent_death import die_with_parent\n"
                    "kid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],\n"
                    "                       preexec_fn=functools.partial(die_with_parent, os.getpid()))\n"
                    "print(kid.pid, flush=True)\ntime.sleep(120)", stdout=subprocess.PIPE)
    try:
        kid = psutil.Process(int(parent.stdout.readline()))
        assert kid.is_running() and kid.ppid() == parent.pid
        parent.kill()
        assert parent.wait(timeout=10) == -signal.SIGKILL
        end = time.monotonic() + 5
        while alive(kid):
            assert time.monotonic() < end, "the child outlived its parent"
            time.sleep(0.05)
    finally:
        parent.kill()
        parent.wait()
