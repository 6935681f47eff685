"""Local text files as documents: each file is one user turn.

:func:`load` expands a ``files:`` glob with :func:`kvbench.scenario.paths.match` (never through a symbolic link
to a directory in ``**``, at most :data:`~kvbench.scenario.paths.MAX_MATCHES` paths), reads at most
a bounded prefix of each regular file, never opens anything else (opening a FIFO would block), and skips, with a
warning naming them, files it cannot use.
"""

from __future__ import annotations

import codecs
import os
import stat
import warnings

from kvbench.errors import NoFilesError
from kvbench.scenario.paths import match
from kvbench.workloads.documents import Document

#: The most bytes read from one file.
MAX_FILE_BYTES = 8 * 2**20
#: Bytes read per token of the longest prompt: generous (English text averages about 4 bytes a token).
BYTES_PER_TOKEN = 64
_SHOWN = 5  # paths named in one warning


class FilesWarning(UserWarning):
    """Files a glob matched that were cut at the read limit or skipped (not regular, unreadable, not UTF-8)."""


def read_limit(longest_prompt: int | None) -> int:
    """Bytes :func:`load` reads of each file for prompts of at most ``longest_prompt`` tokens:
    ``longest_prompt`` × :data:`BYTES_PER_TOKEN`, at most :data:`MAX_FILE_BYTES` (also when it is None)."""
    if longest_prompt is None:
        return MAX_FILE_BYTES
    return min(MAX_FILE_BYTES, max(1, longest_prompt) * BYTES_PER_TOKEN)


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _read(path: str, max_bytes: int) -> tuple[str | None, bool, str]:
    """(text, whether it was cut at ``max_bytes``, why it cannot be used; text None then, why "" for a
    directory, which is skipped without a word)."""
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode):
            return None, False, ""
        if not stat.S_ISREG(mode):  # never opened: a FIFO would block
            return None, False, f"{_kind(mode)}, not a regular file"
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return None, False, f"cannot be read: {exc.strerror or exc}"
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):  # swapped since the stat
            return None, False, f"{_kind(mode)}, not a regular file"
        chunks, left = [], max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 2**20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        return None, False, f"cannot be read: {exc.strerror or exc}"
    finally:
        os.close(fd)
    data = b"".join(chunks)
    cut = len(data) > max_bytes
    try:  # a cut in the middle of a character drops its first bytes (the decoder waits for the rest)
        text = codecs.getincrementaldecoder("utf-8")("strict").decode(data[:max_bytes], final=not cut)
    except UnicodeDecodeError as exc:
        return None, False, f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start:,})"
    return text.removeprefix("\ufeff"), cut, ""


def _listed(items: list[str]) -> str:
    more = f"; and {len(items) - _SHOWN:,} more" if len(items) > _SHOWN else ""
    return "; ".join(items[:_SHOWN]) + more


def load(pattern: str, max_bytes: int = MAX_FILE_BYTES) -> tuple[Document, ...]:
    """Every regular file the glob matches (:func:`match`), sorted by path, as a one-turn document of at most
    ``max_bytes`` bytes of its UTF-8 text (a BOM dropped).

    Directories and empty files are skipped; other non-regular files (FIFOs, devices), files that cannot be read
    and files that are not UTF-8 are skipped with a :class:`FilesWarning` naming each and why, and files over
    ``max_bytes`` are cut there with one naming them.

    Raises:
        TooManyFiles: as :func:`match`.
        NoFilesError: no non-empty text file is left (the message lists what was skipped).
    """
    docs, cut, skipped = [], [], []
    for p in match(pattern):
        text, was_cut, why = _read(p, max_bytes)
        if why:
            skipped.append(f"{p} ({why})")
        elif text is not None and text.strip():
            docs.append(Document(p, (("user", text),)))
            if was_cut:
                cut.append(p)
    if not docs:
        why = f" (skipped: {_listed(skipped)})" if skipped else ""
        raise NoFilesError(f"workload.files: the pattern {pattern!r} matches no non-empty text file{why}")
    if skipped:
        warnings.warn(FilesWarning(f"workload.files: skipped {len(skipped):,} of the files {pattern!r} matches: "
                                   f"{_listed(skipped)}"), stacklevel=2)
    if cut:
        warnings.warn(FilesWarning(f"workload.files: read only the first {max_bytes:,} bytes (what the longest "
                                   f"prompt needs) of {len(cut):,} longer files: {_listed(cut)}"), stacklevel=2)
    return tuple(docs)
