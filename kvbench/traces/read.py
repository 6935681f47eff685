"""Reading a request trace without trusting it: Mooncake's JSONL (``timestamp`` in ms, ``input_length``,
``output_length``, ``hash_ids`` of 512-token blocks), Alibaba Bailian's JSONL (``chat_id``, ``parent_chat_id``,
``timestamp`` in seconds, ``turn``, ``type``, the lengths and ``hash_ids`` of 16-token blocks) and a CSV or JSONL of
Mooncake's four columns (a CSV's ``hash_ids`` as ids separated by spaces, or as a JSON list).

Only a regular file is read, at most ``max_bytes`` of it, a line at most :data:`MAX_LINE_BYTES`; every line is
checked (an object with exactly its format's keys; lengths, times and ids of the right kind; as many ids as
``ceil(input_length / block_tokens)``) and every fault becomes one line of the error, the first
:data:`MAX_PROBLEMS` listed. Times out of order are sorted (stably) and said in the trace's notes. Bailian's ids
are re-chained (:func:`~kvbench.traces.trace.rechained`): its format does not say whether an id names a block's
content or the block with everything before it.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import orjson

from kvbench.errors import BadFile, BadValue
from kvbench.safe_read import open_regular
from kvbench.traces.trace import Trace, rechained

#: A trace file larger than this (bytes) is refused unread unless the caller allows more (a million Mooncake-like
#: requests take about 220 MB).
MAX_TRACE_BYTES = 512 << 20
#: A line (one request) longer than this (bytes) is a fault: 4 MiB holds some 400,000 ids.
MAX_LINE_BYTES = 4 << 20
#: Faults listed in the error; the rest are counted.
MAX_PROBLEMS = 10
#: Tokens per hash block of each format unless the caller says otherwise.
DEFAULT_BLOCK_TOKENS = {"mooncake": 512, "bailian": 16, "columns": 512}
#: Seconds per unit of each format's ``timestamp``.
TIME_UNIT_S = {"mooncake": 1e-3, "bailian": 1.0, "columns": 1e-3}
#: The keys of a request, per format.
KEYS = {"mooncake": ("timestamp", "input_length", "output_length", "hash_ids"),
        "bailian": ("chat_id", "parent_chat_id", "timestamp", "input_length", "output_length", "type", "turn",
                    "hash_ids")}
KEYS["columns"] = KEYS["mooncake"]
FORMATS = ("auto", "mooncake", "bailian", "columns")
_INT64 = (-(1 << 63), (1 << 63) - 1)
#: Lines parsed before their ids become one numpy array (bounds the Python objects alive at once).
_CHUNK = 65536


class _Fault(ValueError):
    """One line's fault (the message, without the line number)."""


def _whole(value: Any, key: str, least: int) -> int:
    if type(value) is not int or value < least or value > _INT64[1]:
        raise _Fault(f"{key} must be a whole number of at least {least}, not {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    text = orjson.dumps(value).decode() if isinstance(value, (int, float, str, bool, type(None))) else type(
        value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def _time(value: Any) -> float:
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        raise _Fault(f"timestamp must be a number of at least 0, not {_shown(value)}")
    return float(value)


class _Reader:
    """The lines of one trace, parsed into growing arrays, its faults collected."""

    def __init__(self, path: Path, fmt: str | None):
        self.path = path
        self.fmt: str | None = None
        self.keys: frozenset[str] = frozenset()
        if fmt:
            self.set_format(fmt)
        self.times: list[float] = []
        self.inputs: list[int] = []
        self.outputs: list[int] = []
        self.counts: list[int] = []
        self.lines: list[int] = []
        self.ids: list[int] = []
        self.id_lines: list[int] = []
        self.id_chunks: list[np.ndarray] = []
        self.problems: list[tuple[int, str]] = []
        self.n_problems = 0

    def set_format(self, fmt: str) -> None:
        """Reads every later line as ``fmt``'s."""
        self.fmt, self.keys = fmt, frozenset(KEYS[fmt])

    def fault(self, line: int, why: str) -> None:
        """Counts a fault and keeps it if it is among the :data:`MAX_PROBLEMS` earliest in the file so far (faults
        are not found in line order: bad ids when a chunk is flushed, wrong lengths at the end)."""
        self.n_problems += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append((line, why))
            return
        latest = max(self.problems)
        if (line, why) < latest:
            self.problems[self.problems.index(latest)] = (line, why)

    def record(self, line: int, rec: Any) -> None:
        """Checks one request (a dict from JSON, or a CSV row turned into one) and keeps it."""
        try:
            if type(rec) is not dict:
                raise _Fault(f"not a JSON object but {_shown(rec)}")
            fmt = self.fmt or "mooncake"
            if rec.keys() != self.keys:
                missing = [k for k in KEYS[fmt] if k not in rec]
                extra = sorted(str(k) for k in rec if k not in self.keys)
                raise _Fault("; ".join(([f"missing {', '.join(missing)}"] if missing else [])
                                       + ([f"unknown key {', '.join(repr(k[:40]) for k in extra)}"] if extra else []))
                             + f" (a {fmt} request has exactly: {', '.join(KEYS[fmt])})")
            t = _time(rec["timestamp"])
            n_in = _whole(rec["input_length"], "input_length", 1)
            n_out = _whole(rec["output_length"], "output_length", 0)
            if fmt == "bailian":
                _whole(rec["chat_id"], "chat_id", 0)
                _whole(rec["parent_chat_id"], "parent_chat_id", -1)
                _whole(rec["turn"], "turn", 1)
                if type(rec["type"]) is not str:
                    raise _Fault(f"type must be a string, not {_shown(rec['type'])}")
            ids = rec["hash_ids"]
            if type(ids) is not list:
                raise _Fault(f"hash_ids must be a list of whole numbers, not {_shown(ids)}")
        except _Fault as exc:
            self.fault(line, str(exc))
            return
        self.times.append(t)
        self.inputs.append(n_in)
        self.outputs.append(n_out)
        self.counts.append(len(ids))
        self.lines.append(line)
        self.ids.extend(ids)
        self.id_lines.append(line)
        if len(self.id_lines) >= _CHUNK:
            self.flush_ids()

    def flush_ids(self) -> None:
        """The ids parsed since the last flush, checked and kept as one int64 array."""
        if not self.id_lines:
            return
        kinds = set(map(type, self.ids))
        arr = None
        if kinds <= {int}:
            try:
                arr = np.array(self.ids, dtype=np.int64)
            except OverflowError:
                arr = None
        if arr is None:
            self._find_bad_ids()
            arr = np.zeros(len(self.ids), dtype=np.int64)
        self.id_chunks.append(arr)
        self.ids, self.id_lines = [], []

    def _find_bad_ids(self) -> None:
        start = len(self.counts) - len(self.id_lines)
        at = 0
        for line, n in zip(self.id_lines, self.counts[start:]):
            for v in self.ids[at:at + n]:
                if type(v) is not int or not _INT64[0] <= v <= _INT64[1]:
                    self.fault(line, f"hash_ids must be whole numbers that fit in 64 bits, not {_shown(v)}")
                    break
            at += n


def _csv_record(fields: list[str], header: list[str]) -> dict[str, Any]:
    if len(fields) != len(header):
        raise _Fault(f"{len(fields)} fields, the header names {len(header)}")
    rec: dict[str, Any] = {}
    for key, text in zip(header, fields):
        text = text.strip()
        if key == "hash_ids":
            rec[key] = [_csv_number(p) for p in text.strip("[]").replace(",", " ").split()]
        else:
            rec[key] = _csv_number(text)
    return rec


def _csv_number(text: str) -> Any:
    """A CSV cell as the JSON value it spells (an int or a float), or the text itself (which the checks refuse)."""
    try:
        return orjson.loads(text) if text and text[0] in "-0123456789" else text
    except orjson.JSONDecodeError:
        return text


def _lines(f: BinaryIO, reader: _Reader) -> Iterator[tuple[int, bytes]]:
    """Yields ``(line number, bytes)`` of the non-blank lines, each at most :data:`MAX_LINE_BYTES` (a longer one is a
    fault, skipped unread)."""
    number = 0
    while True:
        raw = f.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        number += 1
        if len(raw) > MAX_LINE_BYTES:
            reader.fault(number, f"a line over {MAX_LINE_BYTES:,} bytes (not read)")
            while raw and not raw.endswith(b"\n"):
                raw = f.readline(MAX_LINE_BYTES + 1)
            continue
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if raw.strip():
            yield number, raw


def read_trace(path: str | Path, fmt: str = "auto", block_tokens: int | None = None,
               max_bytes: int = MAX_TRACE_BYTES) -> Trace:
    """The trace in ``path``, checked line by line.

    Args:
        path: a ``.jsonl`` (Mooncake or Bailian lines, told apart by ``chat_id`` in the first) or a ``.csv`` of
            Mooncake's columns under a header line (``columns``: a CSV, or a JSONL if its first line is an object).
        fmt: one of :data:`FORMATS`; ``auto`` decides by the file's name and first line.
        block_tokens: tokens per hash block; None: the format's (:data:`DEFAULT_BLOCK_TOKENS`).
        max_bytes: the largest file read.

    Raises:
        BadFile: not a regular file, over ``max_bytes``, no requests, or faulty lines (one line each, the first
            :data:`MAX_PROBLEMS`, then how many more).
        BadValue: ``fmt`` unknown, ``block_tokens`` below 1.
    """
    path = Path(path)
    if fmt not in FORMATS:
        raise BadValue(f"trace format {fmt!r} is not one of: {', '.join(FORMATS)}")
    if block_tokens is not None and (type(block_tokens) is not int or block_tokens < 1):
        raise BadValue(f"block_tokens must be a whole number of at least 1, not {block_tokens!r}")
    # a .csv is a CSV; a columns trace of another name is a CSV unless its first line is a JSON object (None: not
    # known before that line)
    named_csv = path.suffix.lower() == ".csv"
    csv_file: bool | None = (True if named_csv else None) if fmt == "columns" else fmt == "auto" and named_csv
    reader = _Reader(path, "columns" if csv_file is not False else None if fmt == "auto" else fmt)
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise BadFile(f"{path}: {size:,} bytes, over the {max_bytes:,} a trace may have (raise the cap: "
                          "max_bytes, --max-bytes on the command line)")
        header: list[str] | None = None
        for number, raw in _lines(f, reader):
            if csv_file is None:
                csv_file = not raw.lstrip().startswith(b"{")
            try:
                if csv_file:
                    fields = next(csv.reader([raw.decode("utf-8")]))
                    if header is None:
                        header = [h.strip() for h in fields]
                        if sorted(header) != sorted(KEYS["columns"]):
                            raise BadFile(f"{path}: line {number}: the header must name exactly the columns "
                                          f"{', '.join(KEYS['columns'])}, not {', '.join(h[:40] for h in header)}")
                        continue
                    rec = _csv_record(fields, header)
                else:
                    rec = orjson.loads(raw)
            except (orjson.JSONDecodeError, UnicodeDecodeError, csv.Error) as exc:
                reader.fault(number, f"not a valid {'CSV' if csv_file else 'JSON'} line ({str(exc)[:80]})")
                if not reader.lines and reader.n_problems >= MAX_PROBLEMS:  # not one request yet: not a trace
                    raise BadFile("\n".join([f"{path}: line {line}: {why}" for line, why in sorted(reader.problems)]
                                            + [f"{path}: not a trace: none of its first {MAX_PROBLEMS} lines is a "
                                               "request (read no further)"])) from None
                continue
            except _Fault as exc:
                reader.fault(number, str(exc))
                continue
            if reader.fmt is None:
                if type(rec) is not dict:
                    raise BadFile(f"{path}: line {number}: not a JSON object, so neither a Mooncake nor a Bailian "
                                  "request")
                reader.set_format("bailian" if "chat_id" in rec else "mooncake")
            reader.record(number, rec)
    reader.flush_ids()
    fmt_read = reader.fmt or "mooncake"
    return _build(reader, fmt_read, block_tokens or DEFAULT_BLOCK_TOKENS[fmt_read])


def _block_hint(counts: np.ndarray, inputs: np.ndarray, block: int, path: Path) -> list[str]:
    """A line naming the block size the file's own counts suggest, when most of its requests of several blocks
    disagree with ``block``, three at least (a block size given wrong reads as a fault on every line)."""
    full = counts > 1
    wrong = counts[full] != -(-inputs[full] // block)
    if wrong.sum() < 3 or wrong.mean() <= 0.5:
        return []
    guess = int(np.median(inputs[full] / counts[full]))
    size = 1 << max(0, round(np.log2(max(guess, 1))))
    if size == block:
        return []
    return [f"{path}: most requests disagree with {block} tokens per block; their lengths suggest about {size} "
            "(a file does not say its block size: give it, --block-tokens; in a scenario, "
            "workload.trace.source_block_tokens)"]


def _build(reader: _Reader, fmt: str, block: int) -> Trace:
    path = reader.path
    counts = np.array(reader.counts, dtype=np.int64)
    inputs = np.array(reader.inputs, dtype=np.int64)
    expected = -(-inputs // block)
    lines = np.array(reader.lines, dtype=np.int64)
    for at in np.flatnonzero(counts != expected)[:MAX_PROBLEMS]:
        reader.fault(int(lines[at]), f"{counts[at]} hash_ids for input_length {inputs[at]}: "
                                     f"ceil({inputs[at]} / {block}) = {expected[at]} expected")
    reader.n_problems += max(0, int((counts != expected).sum()) - MAX_PROBLEMS)
    if reader.n_problems:
        shown = sorted(reader.problems)[:MAX_PROBLEMS]
        more = reader.n_problems - len(shown)
        raise BadFile("\n".join([f"{path}: line {line}: {why}" for line, why in shown]
                                + ([f"{path}: ... and {more:,} more faults"] if more else [])
                                + _block_hint(counts, inputs, block, path)))
    if not len(inputs):
        raise BadFile(f"{path}: no requests (an empty file, or only blank lines)")
    times = np.array(reader.times, dtype=np.float64) * TIME_UNIT_S[fmt]
    order = np.argsort(times, kind="stable")
    notes: tuple[str, ...] = ()
    if (np.diff(times) < 0).any():
        first = int(np.flatnonzero(np.diff(times) < 0)[0])
        notes = (f"times not in order (line {lines[first + 1]} is earlier than line {lines[first]}): "
                 "requests sorted by time",)
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    trace = Trace(source=path.name, format=fmt, block_tokens=block, arrival_s=times - times.min(),
                  input_tokens=inputs, output_tokens=np.array(reader.outputs, dtype=np.int64), offsets=offsets,
                  block_ids=np.concatenate(reader.id_chunks) if reader.id_chunks else np.zeros(0, np.int64),
                  index=np.arange(len(counts), dtype=np.int64), notes=notes)
    if notes:
        trace = trace.take(order)
    return rechained(trace) if fmt == "bailian" else trace
