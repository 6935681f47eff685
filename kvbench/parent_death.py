"""Child processes that never outlive the process that forked them: Linux's ``PR_SET_PDEATHSIG``, set in the child.

Used by the serving engines' server processes and their ``--version`` probes (a ``preexec_fn``): the kernel
SIGKILLs the child when the parent's forking thread ends, however it ends (SIGKILL included), where no handler of
the parent would run.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# prctl(2), looked up here, in the parent, at import: a forked child then calls it without loading anything (a
# library loaded after a fork can deadlock on a lock another thread of the parent held). None off Linux.
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
if _prctl is not None:
    _prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def die_with_parent(parent: int) -> None:
    """In a child forked by the process ``parent`` (its PID, read before the fork): ask the kernel for SIGKILL when
    the parent's thread that forked this child ends (Linux ``PR_SET_PDEATHSIG``; nothing elsewhere), and end at
    once by SIGKILL when the parent has already ended (the child's parent is no longer ``parent``: it ended
    between the fork and this call, before the request could take effect).

    The signal follows the forking *thread*: fork from the main thread (or a thread that lives as long as the
    child should).

    Raises:
        OSError: ``prctl`` refused (its errno).
    """
    if _prctl is not None and _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


__all__ = ["die_with_parent"]
