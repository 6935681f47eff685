"""The disk tier's directory and its file I/O.

- :class:`DiskTier`: a private directory for the files of one cache, removed on every exit path but SIGKILL.
  Its owner holds an exclusive ``flock`` on the directory's ``.owner`` file (which names its host and PID) for
  the tier's lifetime; a directory left by a killed owner is removed by the next tier made in the same place, but
  only when it is provably dead (see :func:`remove_stale`).
- How a file is written and read: explicit ``pwrite``/``preadv`` between host tensors and the file (no long-lived
  memory map). By default (``page_cache=False``) every write is synced to the device (``fdatasync``) and then
  dropped from the page cache (``posix_fadvise(POSIX_FADV_DONTNEED)``), and so is every read once it has been
  copied into its host tensor: the next read comes from the device, not from RAM. ``page_cache=True`` skips both
  (writes stay dirty in the page cache, reads come from it): faster, but what it times is RAM.

A mapped page cannot be dropped while it is mapped, which is why the tier does not read through a mapping.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import re
import shutil
import socket
import stat
import tempfile
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a tensor's bytes are read: kvbench validate reads the block size
    import torch

#: Tokens per block of the disk tier: the host tier spills its oldest tokens to disk in whole blocks, so a host
#: cap (``host_max_tokens``) must hold at least one block.
DISK_BLOCK_TOKENS = 16

#: Whether the page cache can be told to drop a file's pages here (Linux, most BSDs; not macOS or Windows).
CAN_DROP = hasattr(os, "posix_fadvise") and hasattr(os, "POSIX_FADV_DONTNEED")

#: Why pages are not dropped on this platform (empty where they are).
NO_DROP_REASON = "" if CAN_DROP else "os.posix_fadvise is not available on this platform: disk reads may come from RAM"

#: Flush a file's data to the device (``fdatasync``; ``fsync`` where there is none, as on macOS).
sync_file = getattr(os, "fdatasync", os.fsync)


def drop_pages(fd: int, offset: int = 0) -> None:
    """Drop the file's pages from ``offset`` (rounded down to a page: the kernel keeps partial pages) to its end
    from the page cache, where the platform can (:data:`CAN_DROP`). Only clean pages go: sync what was written
    first."""
    if CAN_DROP:
        os.posix_fadvise(fd, offset // mmap.PAGESIZE * mmap.PAGESIZE, 0, os.POSIX_FADV_DONTNEED)


class DiskTierError(OSError):
    """The disk tier cannot be created or grown (unwritable directory, disk full, file size limit).

    ``errno`` is the system error; the message names the directory or file and the bytes asked for.
    """

    def __init__(self, errno: int | None, message: str):
        super().__init__(message)
        self.errno = errno


_DIR_PREFIX = "kvbench-kv-"
#: A tier directory's name: the prefix, the owner's PID, ``mkdtemp``'s 8 random characters. Nothing else is swept.
_DIR_NAME = re.compile(rf"{_DIR_PREFIX}\d+-[a-z0-9_]{{8}}")
#: The file inside a tier directory that its owner keeps locked; it holds ``host\npid\n``.
OWNER_FILE = ".owner"


def _owner_text(host: str, pid: int) -> bytes:
    return f"{host}\n{pid}\n".encode()


def _take_ownership(path: Path) -> int:
    """Create ``path``'s owner file, lock it (exclusive ``flock``, held until the descriptor is closed) and only
    then record this host and PID in it; the descriptor is returned to be kept open for the tier's lifetime."""
    fd = os.open(path / OWNER_FILE, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        # where the file system has no flock (ENOLCK), no sweep can take it either: the directory is never swept
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, _owner_text(socket.gethostname(), os.getpid()))
    except OSError:
        os.close(fd)
        raise
    return fd


def _remove_if_dead(parent_fd: int, name: str) -> bool:
    """Remove tier directory ``name`` (in the directory open as ``parent_fd``) if it is provably dead."""
    dir_fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    try:
        if os.fstat(dir_fd).st_uid != os.getuid():
            return False
        fd = os.open(OWNER_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        host, _, pid = os.read(fd, 4096).decode("utf-8", "replace").partition("\n")
        if host != socket.gethostname() or pid.strip() == str(os.getpid()):
            return False  # another host's (its lock may not be seen here) or this process's own
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # its owner is alive, whatever its PID means here
        shutil.rmtree(name, dir_fd=parent_fd, ignore_errors=True)  # no link is followed
        return True
    finally:
        os.close(fd)


def remove_stale(parent: str | Path) -> list[str]:
    """Remove the disk-tier directories in ``parent`` whose owner is provably dead (killed with SIGKILL); the names
    of those removed.

    A directory is removed only when all of these hold: its name is a tier's (``kvbench-kv-<pid>-<8 characters>``),
    it is a directory and not a symbolic link, this user owns it, its ``.owner`` file is a regular file naming this
    host and another PID, and that file's exclusive ``flock`` can be taken at once (the owner holds it as long as
    it lives, in any PID namespace or container of this kernel). Directories of other hosts are always left: a
    PID means nothing there and ``flock`` over NFS may not reach their owners. A directory without an ``.owner``
    file (being created, or made by an older kvbench) is left too. Nothing inside is followed through a link.
    Errors on one directory leave it and go on; none is raised.
    """
    removed: list[str] = []
    try:
        parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return removed
    try:
        try:
            names = sorted(os.listdir(parent_fd))
        except OSError:  # writable but not readable: nothing can be found to sweep
            names = []
        for name in names:
            if _DIR_NAME.fullmatch(name):
                with contextlib.suppress(OSError):
                    if _remove_if_dead(parent_fd, name):
                        removed.append(name)
    finally:
        os.close(parent_fd)
    return removed


def _close_and_remove(path: str, fds: list[int], owner_fd: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.close(owner_fd)  # the lock goes last: until the directory is gone, no sweep may take it


def _bytes_of(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor (any dtype, bfloat16 included), writable, without a copy.

    Raises:
        ValueError: ``t`` is not contiguous (its bytes are not one block).
    """
    if not t.is_contiguous():
        raise ValueError(f"disk tier: I/O needs a contiguous tensor, got strides {t.stride()}")
    import torch

    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


class DiskTier:
    """A private directory (mode 0700) for the disk files of one cache, and how they are written and read.

    Removed by :meth:`close`, when the object is garbage-collected, and at interpreter exit (Ctrl-C included), so
    no exit path leaves it behind except SIGKILL; directories of dead kvbench processes on this host are removed
    when the next one is created in the same place (:func:`remove_stale`: never a live one, whatever its PID
    namespace, and never another host's). The files it opens are closed with it.

    Args:
        parent: where to create it (default: the system temporary directory).
        page_cache: keep written and read pages in the page cache (no sync, no drop: disk timings measure RAM).
            Default False: every write is synced to the device and every write and read dropped from the page
            cache where the platform can (see :attr:`drops`).

    Raises:
        DiskTierError: ``parent`` does not exist or is not writable, or the owner lock cannot be taken there.
    """

    def __init__(self, parent: str | Path | None = None, page_cache: bool = False):
        where = Path(parent) if parent is not None else Path(tempfile.gettempdir())
        try:
            self.path = Path(tempfile.mkdtemp(prefix=f"{_DIR_PREFIX}{os.getpid()}-", dir=where))
        except OSError as exc:
            raise DiskTierError(exc.errno, f"cannot create the disk tier in {where}: {exc.strerror or exc}") from None
        try:
            owner_fd = _take_ownership(self.path)
        except OSError as exc:
            shutil.rmtree(self.path, ignore_errors=True)
            raise DiskTierError(exc.errno, f"cannot lock the disk tier {self.path}: {exc.strerror or exc}") from None
        self._fds: list[int] = []
        self._finalizer = weakref.finalize(self, _close_and_remove, str(self.path), self._fds, owner_fd)
        remove_stale(where)
        self._files = 0
        self.page_cache = page_cache
        #: Bytes and calls of ``fdatasync`` so far (0 with ``page_cache``).
        self.synced_bytes = 0
        self.sync_count = 0

    @property
    def syncs(self) -> bool:
        """Whether every write is synced to the device before the tier goes on."""
        return not self.page_cache

    @property
    def drops(self) -> bool:
        """Whether written and read pages are dropped from the page cache (False with ``page_cache`` or where
        ``posix_fadvise`` is missing: :data:`NO_DROP_REASON`)."""
        return not self.page_cache and CAN_DROP

    def new_file(self) -> Path:
        """A fresh file name inside the directory."""
        self._files += 1
        return self.path / f"{self._files}.kv"

    def open(self, path: Path) -> int:
        """Open (create) ``path`` for reading and writing (mode 0600); the descriptor is closed with the tier.

        Raises:
            DiskTierError: the tier is closed, or the file cannot be opened.
        """
        self._check_open()
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise DiskTierError(exc.errno, f"disk tier: cannot open {path}: {exc.strerror or exc}") from None
        self._fds.append(fd)
        return fd

    def _check_open(self) -> None:
        if self.closed:
            raise DiskTierError(None, f"disk tier {self.path} is closed (removed): make a new one")

    def reserve(self, fd: int, path: Path, nbytes: int) -> None:
        """Reserve ``nbytes`` bytes for the file (``posix_fallocate``), so writes within them never fail.

        Raises:
            DiskTierError: the space cannot be reserved (ENOSPC: disk full; EFBIG: file size limit).
        """
        self._check_open()
        try:
            os.posix_fallocate(fd, 0, nbytes)
        except OSError as exc:
            raise DiskTierError(exc.errno, f"disk tier: cannot grow {path} to {nbytes} bytes: "
                                           f"{exc.strerror or exc}") from None

    def write(self, fd: int, src: torch.Tensor, offset: int) -> None:
        """Write contiguous CPU tensor ``src`` at byte ``offset`` of the file; then, unless ``page_cache``, sync
        the file to the device and drop its pages from the page cache."""
        self._check_open()
        data, done = _bytes_of(src), 0
        while done < len(data):
            done += os.pwrite(fd, data[done:], offset + done)
        if self.page_cache or not len(data):
            return
        sync_file(fd)
        self.synced_bytes += len(data)
        self.sync_count += 1
        drop_pages(fd, offset)

    def read(self, fd: int, out: torch.Tensor, offset: int) -> None:
        """Fill contiguous CPU tensor ``out`` from byte ``offset`` of the file; then, unless ``page_cache``, drop
        the pages read from the page cache, so the next read also comes from the device.

        Raises:
            DiskTierError: the file ends before ``out`` is full (it was truncated behind the tier's back).
        """
        self._check_open()
        data, done = _bytes_of(out), 0
        while done < len(data):
            n = os.preadv(fd, [data[done:]], offset + done)
            if n == 0:
                raise DiskTierError(None, f"disk tier: a file ended {len(data) - done} bytes early at "
                                          f"{offset + done} (fd {fd})")
            done += n
        if not self.page_cache:
            drop_pages(fd, offset)

    @property
    def closed(self) -> bool:
        """Whether the directory has been removed."""
        return not self._finalizer.alive

    def close(self) -> None:
        """Close the tier's files and remove the directory and every file in it (idempotent)."""
        self._finalizer()
