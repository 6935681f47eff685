"""kvbench.traces.read.read_trace on real values (Mooncake and Bailian JSONL, a CSV of Mooncake's columns, the
committed Mooncake trace) and on hostile files: each fault one exact line naming the file, the line and what is
wrong, raised as a UserError (never a traceback); a file too large, a FIFO or a directory refused before reading."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

import kvbench.traces.read as read
from kvbench.errors import BadFile, BadValue, UserError
from kvbench.traces.read import read_trace

ROOT = Path(__file__).resolve().parents[2]
MOONCAKE = ROOT / "traces" / "mooncake" / "conversation_trace.jsonl"
KEYS = "timestamp, input_length, output_length, hash_ids"
BAILIAN_KEYS = "chat_id, parent_chat_id, timestamp, input_length, output_length, type, turn, hash_ids"
HEADER = "timestamp,input_length,output_length,hash_ids\n"


def mc(t: object = 0, n: object = 1000, ids: str = "[1, 2]", out: object = 5) -> str:
    """One Mooncake line (``t`` in ms, ``ids`` as JSON text)."""
    return f'{{"timestamp": {t}, "input_length": {n}, "output_length": {out}, "hash_ids": {ids}}}\n'


def bl(chat: int, parent: int, t: str, n: int, turn: int, ids: str, kind: str = '"text"') -> str:
    """One Bailian line (``t`` in seconds, as JSON text)."""
    return (f'{{"chat_id": {chat}, "parent_chat_id": {parent}, "timestamp": {t}, "input_length": {n}, '
            f'"output_length": 7, "type": {kind}, "turn": {turn}, "hash_ids": {ids}}}\n')


def put(tmp_path: Path, name: str, data: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def refusal(path: Path, **kw) -> str:
    """The message of the BadFile reading ``path`` raises."""
    with pytest.raises(BadFile) as info:
        read_trace(path, **kw)
    return str(info.value)


# --- real values -------------------------------------------------------------------------------------------------


def test_mooncake_lines_become_arrays_in_seconds_and_blocks(tmp_path):
    path = put(tmp_path, "m.jsonl", mc(0, 1000, "[7, 8]", 3) + "\n" + mc(1500, 512, "[7]", 0) + mc(2250, 1025,
                                                                                                  "[7, 8, 9]", 11))
    t = read_trace(path)
    assert (t.source, t.format, t.block_tokens, t.n_requests, t.n_visits) == ("m.jsonl", "mooncake", 512, 3, 6)
    assert t.arrival_s.tolist() == [0.0, 1.5, 2.25]
    assert t.input_tokens.tolist() == [1000, 512, 1025] and t.output_tokens.tolist() == [3, 0, 11]
    assert t.offsets.tolist() == [0, 2, 3, 6] and t.block_ids.tolist() == [7, 8, 7, 7, 8, 9]
    assert t.blocks(2).tolist() == [7, 8, 9] and t.index.tolist() == [0, 1, 2] and t.notes == ()
    # the partial last block weighs what is left of the prompt
    assert t.block_weights().tolist() == [512, 488, 512, 512, 512, 1]
    assert t.block_ids.dtype == np.int64 and t.arrival_s.dtype == np.float64


def test_arrival_times_start_at_the_first_request(tmp_path):
    t = read_trace(put(tmp_path, "late.jsonl", mc(5000) + mc(6000)))
    assert t.arrival_s.tolist() == [0.0, 1.0]


def test_bailian_lines_are_told_apart_by_chat_id_and_read_in_seconds_of_16_token_blocks(tmp_path):
    path = put(tmp_path, "b.jsonl", bl(0, -1, "100.5", 40, 1, "[10, 11, 12]") + bl(1, 0, "102.25", 33, 2,
                                                                                    "[10, 11, 13]"))
    t = read_trace(path)
    assert (t.format, t.block_tokens, t.n_requests) == ("bailian", 16, 2)
    assert t.arrival_s.tolist() == [0.0, 1.75]
    assert t.input_tokens.tolist() == [40, 33] and t.output_tokens.tolist() == [7, 7]
    assert t.block_ids.tolist() == [0, 1, 2, 0, 1, 3]  # re-chained: (id before, id) pairs in order of first use
    assert t.block_weights().tolist() == [16, 16, 8, 16, 16, 1]


def test_csv_ids_space_separated_or_a_quoted_json_list(tmp_path):
    path = put(tmp_path, "c.csv", HEADER + "0,1000,5,1 2\n250,600,3,\"[1, 3]\"\n500, 20 ,0,\"[4]\"\n")
    t = read_trace(path)
    assert (t.format, t.block_tokens, t.n_requests) == ("columns", 512, 3)
    assert t.arrival_s.tolist() == [0.0, 0.25, 0.5]
    assert t.input_tokens.tolist() == [1000, 600, 20] and t.block_ids.tolist() == [1, 2, 1, 3, 4]


def test_csv_columns_in_any_order(tmp_path):
    t = read_trace(put(tmp_path, "c.csv", "hash_ids,output_length,timestamp,input_length\n5 6,9,3000,1024\n"))
    assert t.block_ids.tolist() == [5, 6] and t.output_tokens.tolist() == [9] and t.input_tokens.tolist() == [1024]


def test_columns_format_reads_a_jsonl_of_the_columns(tmp_path):
    """The docstrings (read, Trace.format, the CLI's help) say ``columns`` is a CSV *or JSONL* of Mooncake's
    columns; a JSONL read as ``--format columns`` was parsed as a CSV and refused for its 'header'."""
    t = read_trace(put(tmp_path, "c.jsonl", mc(0) + mc(1000)), fmt="columns")
    assert (t.format, t.n_requests, t.arrival_s.tolist()) == ("columns", 2, [0.0, 1.0])
    t = read_trace(put(tmp_path, "c.txt", "\n" + HEADER + "0,1000,5,1 2\n"), fmt="columns")  # a CSV by another name
    assert (t.format, t.block_ids.tolist()) == ("columns", [1, 2])
    # the other formats read as before: auto by the name, mooncake always JSON
    assert read_trace(put(tmp_path, "c.csv", HEADER + "0,1000,5,1 2\n")).format == "columns"
    assert refusal(put(tmp_path, "m.csv", HEADER), fmt="mooncake").startswith(
        f"{tmp_path / 'm.csv'}: line 1: not a valid JSON line (")


def test_block_tokens_and_format_given(tmp_path):
    t = read_trace(put(tmp_path, "m.txt", mc(0, 100, "[1, 2, 3, 4]")), fmt="mooncake", block_tokens=32)
    assert (t.format, t.block_tokens, t.n_visits) == ("mooncake", 32, 4)


def test_a_bom_before_the_first_line_is_skipped(tmp_path):
    assert read_trace(put(tmp_path, "b.jsonl", b"\xef\xbb\xbf" + mc().encode())).n_requests == 1
    assert read_trace(put(tmp_path, "b.csv", b"\xef\xbb\xbf" + (HEADER + "0,1000,5,1 2\n").encode())).n_visits == 2
    # elsewhere it is no JSON
    assert refusal(put(tmp_path, "b2.jsonl", mc() + "\ufeff" + mc())).startswith(
        f"{tmp_path / 'b2.jsonl'}: line 2: not a valid JSON line (")


def test_the_committed_mooncake_trace():
    t = read_trace(MOONCAKE)
    assert (t.n_requests, t.n_visits, len(np.unique(t.block_ids))) == (12_031, 288_500, 182_790)
    assert round(float(t.input_tokens.mean())) == 12_035 and round(float(t.output_tokens.mean())) == 343
    assert t.blocks(0).tolist() == list(range(14)) and t.input_tokens[0] == 6758 and t.output_tokens[0] == 500
    assert t.arrival_s[-1] == pytest.approx(3536.999) and t.notes == ()


def test_times_out_of_order_are_sorted_stably_and_noted(tmp_path):
    path = put(tmp_path, "u.jsonl", mc(0, ids="[1, 2]") + mc(3000, ids="[3, 4]") + mc(1000, ids="[5, 6]")
               + mc(2000, ids="[7, 8]") + mc(1000, ids="[9, 10]"))
    t = read_trace(path)
    assert t.notes == ("times not in order (line 3 is earlier than line 2): requests sorted by time",)
    assert t.arrival_s.tolist() == [0.0, 1.0, 1.0, 2.0, 3.0]
    assert t.index.tolist() == [0, 2, 4, 3, 1]  # the two at 1 s keep their file order
    assert t.block_ids.tolist() == [1, 2, 5, 6, 9, 10, 7, 8, 3, 4]


# --- hostile files: one exact line per fault -------------------------------------------------------------------


def test_wrong_number_of_ids_for_the_prompt(tmp_path):
    path = put(tmp_path, "w.jsonl", mc(0, 1025, "[1, 2]") + mc(1, 1024, "[1, 2]") + mc(2, 1, "[]"))
    assert refusal(path) == (f"{path}: line 1: 2 hash_ids for input_length 1025: ceil(1025 / 512) = 3 expected\n"
                             f"{path}: line 3: 0 hash_ids for input_length 1: ceil(1 / 512) = 1 expected")
    assert refusal(put(tmp_path, "m.jsonl", mc()), block_tokens=1000) == (
        f"{tmp_path / 'm.jsonl'}: line 1: 2 hash_ids for input_length 1000: ceil(1000 / 1000) = 1 expected")


BAD_LINES = [
    (mc(ids="[1, 2.0]"), "hash_ids must be whole numbers that fit in 64 bits, not 2.0"),
    (mc(ids='[1, "2"]'), 'hash_ids must be whole numbers that fit in 64 bits, not "2"'),
    (mc(ids="[1, true]"), "hash_ids must be whole numbers that fit in 64 bits, not true"),
    (mc(ids="[1, 9223372036854775808]"), "hash_ids must be whole numbers that fit in 64 bits, not "
                                         "9223372036854775808"),
    (mc(ids="[1, [2]]"), "hash_ids must be whole numbers that fit in 64 bits, not list"),
    (mc(ids="[1, null]"), "hash_ids must be whole numbers that fit in 64 bits, not null"),
    (mc(ids="3"), "hash_ids must be a list of whole numbers, not 3"),
    (mc(t=-1), "timestamp must be a number of at least 0, not -1"),
    (mc(t=-0.5), "timestamp must be a number of at least 0, not -0.5"),
    (mc(t='"NaN"'), 'timestamp must be a number of at least 0, not "NaN"'),
    (mc(t="true"), "timestamp must be a number of at least 0, not true"),
    (mc(t="NaN"), "not a valid JSON line (unexpected character, expected a JSON value: line 1 column 15 (char 14))"),
    (mc(t="1e400"), "not a valid JSON line (number is infinity when parsed as double: line 1 column 15 (char 14))"),
    (mc(n=0, ids="[]"), "input_length must be a whole number of at least 1, not 0"),
    (mc(n=1000.0), "input_length must be a whole number of at least 1, not 1000.0"),
    (mc(n=9223372036854775808), "input_length must be a whole number of at least 1, not 9223372036854775808"),
    (mc(out=-1), "output_length must be a whole number of at least 0, not -1"),
    ('{"timestamp": 0, "input_length": 1000, "hash_ids": [1, 2]}\n',
     f"missing output_length (a mooncake request has exactly: {KEYS})"),
    (mc().replace("}\n", ', "x": 1, "a": 2}\n'), f"unknown key 'a', 'x' (a mooncake request has exactly: {KEYS})"),
    ('{"timestamp": 0, "input_length": 1000, "output_len": 5, "hash_ids": [1, 2]}\n',
     f"missing output_length; unknown key 'output_len' (a mooncake request has exactly: {KEYS})"),
    ('{"timestamp": 0, \n', "not a valid JSON line (unexpected end of data: line 2 column 1 (char 18))"),
    ("[1, 2]\n", "not a JSON object but list"),
    ('"text"\n', 'not a JSON object but "text"'),
]


@pytest.mark.parametrize(("line", "why"), BAD_LINES)
def test_a_faulty_line_is_one_exact_line_of_the_error(tmp_path, line, why):
    path = put(tmp_path, "t.jsonl", mc() + "\n" + line + mc(5))
    assert refusal(path) == f"{path}: line 3: {why}"


@pytest.mark.parametrize(("line", "why"), [
    (bl(0, -2, "0.5", 40, 1, "[1, 2, 3]"), "parent_chat_id must be a whole number of at least -1, not -2"),
    (bl(0, -1, "0.5", 40, 0, "[1, 2, 3]"), "turn must be a whole number of at least 1, not 0"),
    (bl(-1, -1, "0.5", 40, 1, "[1, 2, 3]"), "chat_id must be a whole number of at least 0, not -1"),
    (bl(0, -1, "0.5", 40, 1, "[1, 2, 3]", kind="5"), "type must be a string, not 5"),
    (bl(0, -1, "-0.5", 40, 1, "[1, 2, 3]"), "timestamp must be a number of at least 0, not -0.5"),
    (mc(), f"missing chat_id, parent_chat_id, type, turn (a bailian request has exactly: {BAILIAN_KEYS})"),
])
def test_faulty_bailian_lines(tmp_path, line, why):
    path = put(tmp_path, "b.jsonl", bl(0, -1, "0", 16, 1, "[1]") + line)
    assert refusal(path) == f"{path}: line 2: {why}"


def test_a_first_line_that_is_no_object_says_neither_format(tmp_path):
    path = put(tmp_path, "l.jsonl", "[1, 2]\n" + mc())
    assert refusal(path) == f"{path}: line 1: not a JSON object, so neither a Mooncake nor a Bailian request"


def test_a_line_over_the_limit_is_skipped_unread_and_later_lines_keep_their_numbers(tmp_path, monkeypatch):
    monkeypatch.setattr(read, "MAX_LINE_BYTES", 100)
    long = mc(ids="[1, 2]" + " " * 300)
    path = put(tmp_path, "long.jsonl", mc() + long + mc(t=-1) + mc())
    assert refusal(path) == (f"{path}: line 2: a line over 100 bytes (not read)\n"
                             f"{path}: line 3: timestamp must be a number of at least 0, not -1")
    # a line of exactly the limit is read
    exact = mc(ids="[1, 2]").rstrip("\n")
    exact = exact[:-1] + " " * (99 - len(exact)) + "}\n"
    assert len(exact) == 100 and read_trace(put(tmp_path, "ok.jsonl", exact)).n_requests == 1


def test_invalid_utf8(tmp_path):
    path = put(tmp_path, "u.jsonl", mc().encode() + b'{"timestamp": 0, "\xff": 1}\n')
    assert refusal(path) == (f"{path}: line 2: not a valid JSON line (str is not valid UTF-8: surrogates not "
                             "allowed: line 1 column 1 (char 0))")
    path = put(tmp_path, "u.csv", (HEADER + "0,1000,5,1 ").encode() + b"\xff\n")
    assert refusal(path) == (f"{path}: line 2: not a valid CSV line ('utf-8' codec can't decode byte 0xff in "
                             "position 11: invalid start byte)")


@pytest.mark.parametrize("data", ["", "\n", "\n  \n\t\n"])
def test_no_requests(tmp_path, data):
    path = put(tmp_path, "e.jsonl", data)
    assert refusal(path) == f"{path}: no requests (an empty file, or only blank lines)"


def test_a_csv_with_only_its_header_has_no_requests(tmp_path):
    path = put(tmp_path, "e.csv", HEADER + "\n")
    assert refusal(path) == f"{path}: no requests (an empty file, or only blank lines)"


def test_csv_faults(tmp_path):
    path = put(tmp_path, "h.csv", "timestamp,input,output_length,hash_ids\n0,1000,5,1 2\n")
    assert refusal(path) == (f"{path}: line 1: the header must name exactly the columns {KEYS}, not timestamp, "
                             "input, output_length, hash_ids")
    path = put(tmp_path, "f.csv", HEADER + "0,1000,5,1 2\n0,1000,5\n0,1000,5,1 2,9\n0,1000,5,1 x\n-5,1000,5,1 2\n"
               "NaN,1000,5,1 2\n0,1000,5,1 2.5\n0,1000,5,\"[1, [2]]\"\n")
    assert refusal(path).splitlines() == [
        f"{path}: line 3: 3 fields, the header names 4",
        f"{path}: line 4: 5 fields, the header names 4",
        f'{path}: line 5: hash_ids must be whole numbers that fit in 64 bits, not "x"',
        f"{path}: line 6: timestamp must be a number of at least 0, not -5",
        f'{path}: line 7: timestamp must be a number of at least 0, not "NaN"',
        f"{path}: line 8: hash_ids must be whole numbers that fit in 64 bits, not 2.5",
        f'{path}: line 9: hash_ids must be whole numbers that fit in 64 bits, not "[2"']


def test_many_faulty_lines_list_the_first_ten_and_count_the_rest(tmp_path):
    path = put(tmp_path, "many.jsonl", mc() + mc(t=-1) * 25)
    lines = refusal(path).splitlines()
    assert lines == ([f"{path}: line {i}: timestamp must be a number of at least 0, not -1" for i in range(2, 12)]
                     + [f"{path}: ... and 15 more faults"])


def test_the_first_faulty_lines_are_listed_whatever_their_fault(tmp_path):
    """Bad ids are checked when a chunk of lines is flushed and wrong lengths at the end: a file whose first line
    had one of those, then ten lines of other faults, listed lines 2-11 and hid line 1 in "... and 1 more"."""
    path = put(tmp_path, "ids.jsonl", mc(ids='[1, "x"]') + mc(t=-1) * 10)
    lines = refusal(path).splitlines()
    assert lines[0] == f'{path}: line 1: hash_ids must be whole numbers that fit in 64 bits, not "x"'
    assert lines[9] == f"{path}: line 10: timestamp must be a number of at least 0, not -1"
    assert lines[10] == f"{path}: ... and 1 more faults" and len(lines) == 11
    path = put(tmp_path, "len.jsonl", mc(n=2000) + mc(t=-1) * 10)
    assert refusal(path).splitlines()[0] == (f"{path}: line 1: 2 hash_ids for input_length 2000: "
                                             "ceil(2000 / 512) = 4 expected")


def test_a_file_over_max_bytes_is_refused_from_its_size_unread(tmp_path):
    path = tmp_path / "huge.jsonl"
    path.touch()
    os.truncate(path, (1 << 30) + 1)  # sparse: no disk used, and reading it would take seconds
    start = time.perf_counter()
    message = refusal(path, max_bytes=1 << 30)
    assert time.perf_counter() - start < 0.5
    assert message == (f"{path}: 1,073,741,825 bytes, over the 1,073,741,824 a trace may have (raise the cap: "
                       "max_bytes, --max-bytes on the command line)")
    path = put(tmp_path, "small.jsonl", mc())
    assert refusal(path, max_bytes=10).startswith(f"{path}: {len(mc())} bytes, over the 10 a trace may have")


def test_a_fifo_and_a_directory_are_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)  # no writer: opening it for a blocking read would wait forever
    assert refusal(fifo) == f"{fifo}: not a regular file"
    folder = tmp_path / "dir.jsonl"
    folder.mkdir()
    assert refusal(folder) == f"{folder}: not a regular file"
    assert refusal(tmp_path / "absent.jsonl") == f"{tmp_path / 'absent.jsonl'}: cannot read the file: No such file " \
                                                  "or directory"


def test_bad_arguments_are_bad_values(tmp_path):
    path = put(tmp_path, "m.jsonl", mc())
    with pytest.raises(BadValue, match=r"^trace format 'x' is not one of: auto, mooncake, bailian, columns$"):
        read_trace(path, fmt="x")
    with pytest.raises(BadValue, match=r"^block_tokens must be a whole number of at least 1, not 0$"):
        read_trace(path, block_tokens=0)


def test_every_hostile_file_is_a_user_error(tmp_path):
    """Whatever the bytes, reading ends in a trace or in a UserError (the CLI's exit 2), never another exception."""
    rng = np.random.default_rng(7)
    good = (mc() + mc(1000, 1025, "[1, 2, 3]")).encode()
    for i in range(200):
        data = bytearray(good)
        for _ in range(int(rng.integers(1, 6))):
            data[int(rng.integers(len(data)))] = int(rng.choice(list(b'{}[]",:0123456789-.e \n\xff')))
        path = put(tmp_path, f"f{i}.jsonl", bytes(data))
        try:
            read_trace(path)
        except UserError as exc:
            assert all(line.startswith(f"{path}: ") for line in str(exc).splitlines()), str(exc)


def test_a_block_size_given_wrong_is_named_once(tmp_path):
    path = put(tmp_path, "mc.jsonl", "".join(mc(n=n * 512 - 100, ids=str(list(range(k, k + n))))
                                             for k, n in ((0, 3), (10, 5), (20, 4))))
    lines = refusal(path, block_tokens=16).splitlines()
    assert lines[0] == f"{path}: line 1: 3 hash_ids for input_length 1436: ceil(1436 / 16) = 90 expected"
    assert lines[-1] == (f"{path}: most requests disagree with 16 tokens per block; their lengths suggest about 512 "
                         "(a file does not say its block size: give it, --block-tokens; in a scenario, "
                         "workload.trace.source_block_tokens)")


def test_a_file_that_is_no_trace_is_refused_after_its_first_ten_lines(tmp_path):
    path = put(tmp_path, "notes.jsonl", "".join(f"just text {i}\n" for i in range(500)))
    lines = refusal(path).splitlines()
    assert len(lines) == 11 and lines[0].startswith(f"{path}: line 1: not a valid JSON line (")
    assert lines[-1] == f"{path}: not a trace: none of its first 10 lines is a request (read no further)"
