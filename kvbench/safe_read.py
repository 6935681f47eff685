"""Reading files kvbench is given without trusting them: only regular files are read (a FIFO would block forever,
``/dev/zero`` would fill the memory), with bounded sizes, bounded nesting and bounded trial-row lines. One reader of
``trials.jsonl`` (:func:`scan_rows`) serves ``report``, ``cost``, ``compare`` and ``run --resume`` alike, so that a
line one of them skips is skipped, with the same warning, by all of them."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from kvbench.errors import BadFile

#: A trial row (one line of ``trials.jsonl``) longer than this (bytes) is skipped unread.
MAX_ROW_BYTES = 16 << 20
#: A ``run.json`` larger than this (bytes) is refused.
MAX_RUN_JSON_BYTES = 64 << 20
#: Deepest nesting of lists and objects accepted in run.json and in a trial row.
MAX_JSON_DEPTH = 100
_BOM = b"\xef\xbb\xbf"


def open_regular(path: str | Path) -> BinaryIO:
    """``path`` opened for reading in binary, refused unless it is a regular file: opened with ``O_NONBLOCK`` (a FIFO
    opens at once instead of waiting for a writer) and checked with ``fstat`` before anything is read.

    Raises:
        BadFile: ``<path>: not a regular file`` (a FIFO, a device such as ``/dev/zero``, a directory...), or the
            file cannot be opened (naming why).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise BadFile(f"{path}: cannot read the file: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BadFile(f"{path}: not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | Path, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of the regular file ``path`` (more than ``limit`` means it is too large).

    Raises:
        BadFile: see :func:`open_regular`; or reading failed.
    """
    with open_regular(path) as f:
        try:
            return f.read(limit + 1)
        except OSError as exc:
            raise BadFile(f"{path}: cannot read the file: {exc.strerror or exc}") from None


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether lists and objects nest more than ``limit`` levels in ``value`` (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (list, dict)):
            if depth > limit:
                return True
            stack.extend((c, depth + 1) for c in (v.values() if isinstance(v, dict) else v)
                         if isinstance(c, (list, dict)))
    return False


def read_json_file(path: str | Path, limit: int = MAX_RUN_JSON_BYTES) -> Any:
    """The JSON value in the regular file ``path`` (UTF-8, a BOM ignored), at most ``limit`` bytes and nested at most
    :data:`MAX_JSON_DEPTH` levels.

    Raises:
        BadFile: not a regular file, unreadable, too large, not UTF-8, not valid JSON or nested too deeply.
    """
    raw = read_regular(path, limit)
    if len(raw) > limit:
        raise BadFile(f"{path}: the file is over {limit:,} bytes")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BadFile(f"{path}: not UTF-8 text (byte {exc.start})") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise BadFile(f"{path}: not valid JSON (nested more than {MAX_JSON_DEPTH} levels deep)") from None
    except ValueError as exc:
        raise BadFile(f"{path}: not valid JSON ({exc})") from None
    if too_deep(data):
        raise BadFile(f"{path}: not valid JSON (nested more than {MAX_JSON_DEPTH} levels deep)")
    return data


def scan_rows(path: str | Path) -> tuple[list[Any], list[int], list[tuple[int, str]]]:
    """The parsed lines of a ``trials.jsonl``: ``(values, their line numbers, skipped)``, where ``skipped`` holds
    ``(line, why)`` for each line that is not a row kvbench can read: not valid JSON (a run killed mid-write), not
    UTF-8, nested more than :data:`MAX_JSON_DEPTH` levels, or longer than :data:`MAX_ROW_BYTES` (never read whole).
    A UTF-8 BOM before the first line is ignored; blank lines are left out. Whether each value is a trial row is
    :func:`kvbench.results.record.check_rows`'s to say.

    Raises:
        BadFile: ``path`` is not a regular file or cannot be read.
    """
    values: list[Any] = []
    lines: list[int] = []
    skipped: list[tuple[int, str]] = []
    loads = orjson.loads
    with open_regular(path) as f:
        number = 0
        while True:
            line = f.readline(MAX_ROW_BYTES + 1)
            if not line:
                break
            number += 1
            if len(line) > MAX_ROW_BYTES and not line.endswith(b"\n"):
                while line and not line.endswith(b"\n"):  # the rest of the line, a bounded piece at a time
                    line = f.readline(MAX_ROW_BYTES + 1)
                skipped.append((number, f"a line over {MAX_ROW_BYTES:,} bytes"))
                continue
            if number == 1 and line.startswith(_BOM):
                line = line[len(_BOM):]
            if not line.strip():
                continue
            try:
                value = loads(line)
            except ValueError as exc:  # orjson.JSONDecodeError: also invalid UTF-8 and too deep for orjson
                cut = "" if line.endswith(b"\n") else " (cut off: a run killed mid-write?)"
                skipped.append((number, f"not valid JSON{cut}: {str(exc).splitlines()[0]}"))
                continue
            if line.count(b"[") + line.count(b"{") > MAX_JSON_DEPTH and too_deep(value):
                skipped.append((number, f"not valid JSON: nested more than {MAX_JSON_DEPTH} levels deep"))
                continue
            values.append(value)
            lines.append(number)
    return values, lines, skipped


def skipped_message(path: str | Path, line: int, why: str) -> str:
    """The one warning every reader gives for a skipped line of ``trials.jsonl``."""
    return f"{path}:{line}: {why}; skipped"


__all__ = ["BadFile", "MAX_JSON_DEPTH", "MAX_ROW_BYTES", "MAX_RUN_JSON_BYTES", "open_regular", "read_json_file",
           "read_regular", "scan_rows", "skipped_message", "too_deep"]
