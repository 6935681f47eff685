"""``workload.files``: globs through link loops, huge, special, unreadable and non-UTF-8 files."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from kvbench.errors import NoFilesError
from kvbench.scenario import WorkloadSpec, paths
from kvbench.workloads import files, make_source
from kvbench.workloads.files import FilesWarning

HOSTILE = Path(__file__).resolve().parents[1] / "data" / "hostile"


@pytest.fixture
def deadline():
    """Fail (instead of hanging) a call that takes over 10 s."""
    def expired(*_):
        raise TimeoutError("still running after 10 s")

    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def test_a_glob_through_a_symlink_loop_finishes_with_each_file_once(tmp_path, deadline):
    d = tmp_path / "docs"
    (d / "sub").mkdir(parents=True)
    for name in ("a.txt", "b.txt", "sub/c.txt", ".hidden.txt"):
        (d / name).write_text(f"text of {name}")
    (d / "l1").symlink_to(".")
    (d / "l2").symlink_to(".")
    (d / "sub" / "up").symlink_to("..")
    t0 = time.perf_counter()
    got = paths.match(f"{d}/**/*.txt")
    assert got == [f"{d}/a.txt", f"{d}/b.txt", f"{d}/sub/c.txt"]  # no l1/l2/... paths, no hidden file
    assert [doc.id for doc in files.load(f"{d}/**/*.txt")] == got
    assert time.perf_counter() - t0 < 2
    assert paths.match(f"{d}/l1/*.txt") == [f"{d}/l1/a.txt", f"{d}/l1/b.txt"]  # a link named in the pattern
    assert paths.match(f"{d}/.*.txt") == [f"{d}/.hidden.txt"]
    assert paths.match(f"{d}/a.txt") == [f"{d}/a.txt"] and paths.match(f"{d}/none.txt") == []


def test_validate_names_a_glob_with_too_many_matches(write_yaml, tmp_path):
    from kvbench.scenario import ScenarioError, load_scenario
    from tests.conftest import tiny_scenario

    d = tmp_path / "many"
    d.mkdir()
    for i in range(paths.MAX_MATCHES + 1):
        os.close(os.open(d / f"{i}.txt", os.O_CREAT | os.O_WRONLY, 0o600))
    scenario = tiny_scenario(workload={"source": "files", "files": "many/*.txt"},
                             model={"preset": "tiny-llama", "weights": "random", "tokenizer": "smollm2-135m"})
    with pytest.raises(ScenarioError) as info:
        load_scenario(write_yaml(scenario))
    assert info.value.problems == [("workload.files", f"the pattern '{d}/*.txt' matches more than 10,000 paths "
                                                      "(the limit): narrow it")]


def test_a_huge_file_is_read_only_up_to_what_the_longest_prompt_needs(tmp_path, deadline):
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.write(b"caf\xc3\xa9 " * 1000)  # 6,000 bytes, a 2-byte character every 6
        f.truncate(300_000_000)  # sparse: 300 MB that take no disk
    (tmp_path / "small.txt").write_text("a small file")
    with pytest.warns(FilesWarning) as caught:
        docs = files.load(f"{tmp_path}/*.txt", max_bytes=4000)
    assert [str(w.message) for w in caught] == [f"workload.files: read only the first 4,000 bytes (what the longest "
                                                f"prompt needs) of 1 longer files: {big}"]
    text = docs[0].turns[0][1]
    assert docs[0].id == str(big) and text == ("café " * 666) + "caf"  # 3,999 bytes: the cut 'é' is dropped
    assert len(text.encode()) == 3999 and docs[1].turns[0][1] == "a small file"
    assert files.read_limit(8192) == 8192 * 64 and files.read_limit(10**9) == files.read_limit(None) == 8 * 2**20
    # through the workload: the longest prompt of 100 tokens reads 6,400 bytes
    spec = WorkloadSpec(source="files", files=str(big))
    with pytest.warns(FilesWarning, match="first 6,400 bytes"):
        pool = make_source(spec, None, 0, longest_prompt=100)
    assert [d.turns[0][1] for d in pool._docs] == ["café " * 1000 + "\0" * 400]  # 6,000 + 400 bytes


def test_special_files_are_never_opened_and_unusable_ones_are_named(tmp_path, monkeypatch, deadline):
    d = tmp_path / "docs"
    d.mkdir()
    (d / "good.txt").write_text("fine text")
    os.mkfifo(d / "fifo.txt")  # opening it for reading would block
    (d / "dir.txt").mkdir()
    (d / "empty.txt").write_text("  \n")
    shutil.copy(HOSTILE / "latin1.txt", d / "latin1.txt")
    (d / "secret.txt").write_text("unreadable")
    (d / "bom.txt").write_bytes(b"\xef\xbb\xbfwith a BOM")
    real_open = os.open

    def no_permission(path, *args, **kwargs):  # tests run as root, which chmod 000 does not stop
        if str(path) == str(d / "secret.txt"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(files.os, "open", no_permission)
    with pytest.warns(FilesWarning) as caught:
        docs = files.load(f"{d}/*.txt")
    assert [(doc.id, doc.turns[0][1]) for doc in docs] == [(f"{d}/bom.txt", "with a BOM"),
                                                           (f"{d}/good.txt", "fine text")]
    assert [str(w.message) for w in caught] == [
        f"workload.files: skipped 3 of the files '{d}/*.txt' matches: {d}/fifo.txt (a FIFO, not a regular file); "
        f"{d}/latin1.txt (not UTF-8 text (byte 0xe9 at offset 19)); {d}/secret.txt (cannot be read: Permission "
        "denied)"]


def test_a_glob_of_only_unusable_files_says_what_it_skipped(tmp_path):
    with pytest.raises(NoFilesError) as info:
        files.load("/dev/null")
    assert str(info.value) == ("workload.files: the pattern '/dev/null' matches no non-empty text file (skipped: "
                               "/dev/null (a character device, not a regular file))")
    (tmp_path / "d").mkdir()
    with pytest.raises(NoFilesError, match=r"matches no non-empty text file$"):
        files.load(f"{tmp_path}/*")  # a directory alone: nothing to say about it
