"""Reading files kvbench is given without trusting them: only regular files are read (a FIFO would block forever,
``/dev/zero`` would fill the memory), with bounded sizes, bounded nesting, bounded whole numbers (every integer
read converts to a float: one of 401 digits would not) and bounded trial-row lines, so that a parse
takes time in proportion to a bounded size. One reader of ``trials.jsonl`` (:func:`scan_rows`) serves ``report``,
``cost``, ``compare`` and ``run --resume`` alike, so that a line one of them skips is skipped, with the same
warning, by all of them. Folders are searched to a bounded depth (:func:`find_below`): ``Path.rglob`` recurses,
and a run 1,200 folders deep ended it in a ``RecursionError``."""

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
#: A ``trials.jsonl`` larger than this (bytes) is refused: kvbench writes 2-4 KB per trial, some 300,000 trials
#: (a sparse file of 4 GB took 16.8 s to scan before it was refused).
MAX_TRIALS_BYTES = 1 << 30
#: A ``run.json`` larger than this (bytes) is refused.
MAX_RUN_JSON_BYTES = 64 << 20
#: Deepest nesting of lists and objects accepted in run.json and in a trial row.
MAX_JSON_DEPTH = 100
#: Most digits of a JSON integer kvbench reads: every such integer converts to a float (the largest is about
#: 1.8e308; a tokenizer_config.json's ``model_max_length`` of 10^30 is read). Longer ones are refused unconverted.
MAX_INT_DIGITS = 300
#: Bytes per list or object, at least, of a JSON file :func:`read_json_file` reads: a file of ``limit`` bytes may
#: hold ``limit // JSON_BYTES_PER_CONTAINER`` of them (counted as its ``{`` and ``[`` bytes, before parsing). kvbench's
#: own files and the peers' hold hundreds of bytes per object; 16 MiB of ``{}`` would be 5.6 million dicts (over a
#: GiB, seconds to walk).
JSON_BYTES_PER_CONTAINER = 64
#: Deepest folder below a folder given that :func:`find_below` searches.
MAX_SEARCH_DEPTH = 32
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


class _LongInteger(ValueError):
    """A JSON integer of more than :data:`MAX_INT_DIGITS` digits."""


def _bounded_int(text: str) -> int:
    """``int(text)`` of a JSON integer literal of at most :data:`MAX_INT_DIGITS` digits (a sign aside).

    Raises:
        _LongInteger: it is longer.
    """
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _LongInteger(f"an integer of {len(text.lstrip('-')):,} digits (at most {MAX_INT_DIGITS} are read): "
                           f"{text[:12]}...")
    return int(text)


def read_json_file(path: str | Path, limit: int = MAX_RUN_JSON_BYTES) -> Any:
    """The JSON value in the regular file ``path`` (UTF-8, a BOM ignored), at most ``limit`` bytes, nested at most
    :data:`MAX_JSON_DEPTH` levels, with integers of at most :data:`MAX_INT_DIGITS` digits and at most one list or
    object per :data:`JSON_BYTES_PER_CONTAINER` bytes of ``limit``.

    Raises:
        BadFile: not a regular file, unreadable, too large, not UTF-8, not valid JSON, nested too deeply, holding
            a longer integer or more lists and objects.
    """
    raw = read_regular(path, limit)
    if len(raw) > limit:
        raise BadFile(f"{path}: the file is over {limit:,} bytes")
    most = max(1, limit // JSON_BYTES_PER_CONTAINER)
    if (n := raw.count(b"{") + raw.count(b"[")) > most:
        raise BadFile(f"{path}: not a file kvbench reads: {n:,} '{{' and '[' (at most {most:,} lists and objects in a "
                      f"file of at most {limit:,} bytes)")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BadFile(f"{path}: not UTF-8 text (byte {exc.start})") from None
    try:
        data = json.loads(text, parse_int=_bounded_int)
    except _LongInteger as exc:
        raise BadFile(f"{path}: not a file kvbench reads: {exc}") from None
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
        BadFile: ``path`` is not a regular file, cannot be read, or is over :data:`MAX_TRIALS_BYTES` (before
            anything is read, or once that much was read from a file that grew).
    """
    values: list[Any] = []
    lines: list[int] = []
    skipped: list[tuple[int, str]] = []
    loads = orjson.loads
    too_large = BadFile(f"{path}: the file is over {MAX_TRIALS_BYTES:,} bytes (kvbench writes 2-4 KB per trial)")
    with open_regular(path) as f:
        if os.fstat(f.fileno()).st_size > MAX_TRIALS_BYTES:
            raise too_large
        number = 0
        while True:
            line = f.readline(MAX_ROW_BYTES + 1)
            if not line:
                break
            if f.tell() > MAX_TRIALS_BYTES:
                raise too_large
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


def find_below(root: str | Path, name: str, depth: int = MAX_SEARCH_DEPTH) -> list[Path]:
    """The entries called ``name`` in the folder ``root`` and in its folders down to ``depth`` levels below it,
    sorted; folders reached through a symbolic link are not entered (as ``Path.rglob``). Searched without recursion.

    Raises:
        BadFile: ``root`` holds folders more than ``depth`` levels deep (naming the first one found): kvbench writes
            none, and a search of all of them would not end in bounded time.
    """
    root = Path(root)
    found: list[Path] = []
    stack = [(root, 0)]
    while stack:
        folder, level = stack.pop()
        try:
            with os.scandir(folder) as entries:
                listed = list(entries)
        except OSError:
            continue  # unreadable, or gone since: nothing of it to read (as rglob)
        for entry in listed:
            if entry.name == name:
                found.append(folder / entry.name)
            if entry.is_dir(follow_symlinks=False):
                if level + 1 > depth:
                    raise BadFile(f"{root}: folders nested more than {depth} levels deep below it (such as "
                                  f"{folder / entry.name}): give the run directory itself")
                stack.append((folder / entry.name, level + 1))
    return sorted(found)


def skipped_message(path: str | Path, line: int, why: str) -> str:
    """The one warning every reader gives for a skipped line of ``trials.jsonl``."""
    return f"{path}:{line}: {why}; skipped"


__all__ = ["BadFile", "MAX_INT_DIGITS", "MAX_JSON_DEPTH", "MAX_ROW_BYTES", "MAX_RUN_JSON_BYTES", "MAX_SEARCH_DEPTH",
           "find_below", "open_regular", "read_json_file", "read_regular", "scan_rows", "skipped_message",
           "too_deep"]
