"""Hostile inputs (issue 17, second round): files that are not regular files, NUL bytes, deep nesting, huge
numbers, bad UTF-8, a BOM, over-long rows and rows of another scenario. Each is refused with exit 2 (validate too)
and a message naming the file (and line and key), or, for a row kvbench cannot read,
skipped with the one warning every reader gives; never a hang, a traceback or a merge."""

from __future__ import annotations

import json
import os
import time
import shutil
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvbench import safe_read
from kvbench.cli import app
from kvbench.results.load import load_results
from kvbench.results.run_dir import RunDir, RunDirError
from kvbench.results.identity import scenario_digest
from kvbench.scenario import ScenarioError, read_yaml

GOLDEN = Path(__file__).parent / "data" / "golden"
RUN = next(p for p in sorted(GOLDEN.iterdir()) if (p / "run.json").is_file())
READERS = ("report", "cost", "compare", "resume")


def _args(reader: str, run: Path) -> list[str]:
    return {"report": ["report", str(run)], "cost": ["cost", str(run), "--gpu-price", "2"],
            "compare": ["compare", str(RUN), str(run)], "resume": ["run", "--resume", str(run)]}[reader]


def _copy(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    return run


def _refused(args: list[str], fragment: str) -> str:
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, (args, r.output)
    assert "Traceback" not in r.output and fragment in r.output.replace("\n", " "), (args, r.output)
    return r.output


def _lines(run: Path) -> list[str]:
    return (run / "trials.jsonl").read_text().splitlines()


def _write_lines(run: Path, lines: list[str]) -> None:
    (run / "trials.jsonl").write_text("".join(x + "\n" for x in lines))


# A. files that are not regular files

@pytest.mark.parametrize("name", ["run.json", "trials.jsonl"])
@pytest.mark.parametrize("reader", READERS)
def test_a_fifo_in_a_run_is_refused_not_read(tmp_path, name, reader):
    run = _copy(tmp_path)
    (run / name).unlink()
    os.mkfifo(run / name)
    _refused(_args(reader, run), f"{run / name}: not a regular file")


@pytest.mark.parametrize("reader", ["report", "cost", "compare"])
def test_trials_linked_to_dev_zero_is_refused(tmp_path, reader):
    run = _copy(tmp_path)
    (run / "trials.jsonl").unlink()
    (run / "trials.jsonl").symlink_to("/dev/zero")
    _refused(_args(reader, run), f"{run / 'trials.jsonl'}: not a regular file")


def test_a_fifo_scenario_is_refused(tmp_path):
    f = tmp_path / "a.yaml"
    os.mkfifo(f)
    _refused(["validate", str(f)], f"{f}: not a regular file")
    _refused(["run", str(f)], f"{f}: not a regular file")
    with pytest.raises(ScenarioError, match="not a regular file"):
        read_yaml("/dev/zero")


def test_list_scenarios_shows_each_bad_file_and_lists_the_others(tmp_path):
    shutil.copy(Path(__file__).parent.parent / "scenarios" / "quick.yaml", tmp_path / "quick.yaml")
    os.mkfifo(tmp_path / "fifo.yaml")
    (tmp_path / "nul.yaml").write_bytes(b"name: a\x00\n")
    (tmp_path / "deep.yaml").write_text("[" * 100_000 + "]" * 100_000)
    r = CliRunner().invoke(app, ["list", "scenarios", "--dir", str(tmp_path)])
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    text = " ".join(r.output.split())
    assert "quick" in text and "not a regular file" in text and "#x0000" in text and "100 levels" in text


def test_an_overlong_row_is_skipped_without_reading_it_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(safe_read, "MAX_ROW_BYTES", 10_000)  # the golden rows are shorter
    run = _copy(tmp_path)
    lines = _lines(run)
    assert max(map(len, lines)) < 10_000
    _write_lines(run, lines[:2] + ['{"pad": "' + "x" * 50_000 + '"}'] + lines[2:])
    results = load_results([run])
    assert len(results.trials) == len(lines)
    assert any(p.startswith(f"{run / 'trials.jsonl'}:3: a line over 10,000 bytes; skipped") for p in results.problems)
    with pytest.warns(UserWarning, match=r"trials.jsonl:3: a line over 10,000 bytes; skipped"):
        assert len(RunDir.open(run).finished_trials()) == len(lines)


# B. tracebacks on bad input

@pytest.mark.parametrize("content, fragment", [
    (b"name: a\x00\n", "character #x0000"),
    ("name: x\nmodel: tiny\n".encode("utf-16-le"), "character #x0000"),  # UTF-16LE without a BOM
    (("[" * 100_000 + "]" * 100_000).encode(), "nested more than 100 levels deep"),
    (("{a: " * 5000 + "1" + "}" * 5000).encode(), "nested more than 100 levels deep"),
])
def test_unreadable_yaml_is_a_scenario_error(tmp_path, content, fragment):
    f = tmp_path / "s.yaml"
    f.write_bytes(content)
    _refused(["validate", str(f)], fragment)
    _refused(["run", str(f)], f"{f}: ")
    with pytest.raises(ScenarioError, match=fragment):
        read_yaml(f)


def test_proc_environ_is_a_scenario_error():
    with pytest.raises(ScenarioError, match="character #x0000"):
        read_yaml("/proc/self/environ")


def test_yaml_at_the_depth_bound_is_read(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("[" * 100 + "]" * 100)
    assert read_yaml(f) is not None


@pytest.mark.parametrize("reader", READERS)
def test_a_deeply_nested_run_json_is_refused(tmp_path, reader):
    run = _copy(tmp_path)
    (run / "run.json").write_text("[" * 100_000 + "]" * 100_000)
    _refused(_args(reader, run), f"{run / 'run.json'}: not valid JSON (nested more than 100 levels deep)")


@pytest.mark.parametrize("row, why", [
    ("[" * 100_000 + "]" * 100_000, "not valid JSON: "),
    ('{"trial_id": "x", "n": ' + "9" * 5000 + "}", "not valid JSON: "),  # an integer no table holds
    (b'{"trial_id": "caf\xe9"}'.decode("latin-1"), "not valid JSON: "),  # a raw \xe9 byte: not UTF-8
    ('{"a": ' + "[" * 500 + "]" * 500 + "}", "not valid JSON: nested more than 100 levels deep"),
])
def test_unreadable_rows_are_skipped_alike_by_every_reader(tmp_path, row, why):
    run = _copy(tmp_path)
    lines = _lines(run)
    data = "".join(x + "\n" for x in lines[:1] + [row] + lines[1:]).encode("latin-1" if "\xe9" in row else "utf-8")
    (run / "trials.jsonl").write_bytes(data)
    results = load_results([run])
    expected = f"{run / 'trials.jsonl'}:2: {why}"
    assert len(results.trials) == len(lines)
    assert [p for p in results.problems if p.startswith(expected) and p.endswith("; skipped")], results.problems
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert len(RunDir.open(run).finished_trials()) == len(lines)
    report_message = next(p for p in results.problems if p.startswith(expected))
    assert [str(w.message) for w in caught] == [report_message]  # the same warning as report's


@pytest.mark.parametrize("value, fragment", [
    (10**30, ":3: batch_size: must be a whole number, not 1e+30"),
    (2**63, ":3: batch_size: must be a whole number of at most 9223372036854775807"),
])
@pytest.mark.parametrize("reader", READERS)
def test_huge_whole_numbers_are_refused(tmp_path, reader, value, fragment):
    run = _copy(tmp_path)
    lines = _lines(run)
    lines[2] = lines[2].replace('"batch_size": 1,', f'"batch_size": {value},', 1)
    assert str(value) in lines[2]
    _write_lines(run, lines)
    _refused(_args(reader, run), f"{run / 'trials.jsonl'}{fragment}")


def test_a_bom_before_the_first_row_is_ignored(tmp_path):
    run = _copy(tmp_path)
    lines = _lines(run)
    (run / "trials.jsonl").write_bytes(b"\xef\xbb\xbf" + "".join(x + "\n" for x in lines).encode())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rows = RunDir.open(run).finished_trials()
    assert rows[0]["trial_id"] == json.loads(lines[0])["trial_id"] and len(rows) == len(lines)
    results = load_results([run])
    assert len(results.trials) == len(lines) and not results.problems


def test_a_bom_before_run_json_is_ignored(tmp_path):
    run = _copy(tmp_path)
    (run / "run.json").write_bytes(b"\xef\xbb\xbf" + (run / "run.json").read_bytes())
    assert RunDir.open(run).meta["schema_version"] == 1
    assert len(load_results([run]).trials) == len(_lines(run))


# C. rows of another scenario

@pytest.mark.parametrize("edit, fragment", [
    ({"scenario": "other"}, "scenario 'other' (run.json: 'golden')"),
    ({"scenario_digest": "0123456789abcdef"}, "scenario_digest '0123456789abcdef' (run.json's scenario: "),
])
@pytest.mark.parametrize("reader", READERS)
def test_rows_of_another_scenario_are_refused_by_every_reader(tmp_path, reader, edit, fragment):
    run = _copy(tmp_path)
    lines = _lines(run)
    lines[3] = json.dumps({**json.loads(lines[3]), **edit})
    _write_lines(run, lines)
    out = _refused(_args(reader, run), f"{run / 'trials.jsonl'}:4: trial ")
    assert fragment in out.replace("\n", " ") and "was written under another scenario" in out.replace("\n", " ")


def test_rows_of_the_run_s_own_scenario_are_read(tmp_path):
    run = _copy(tmp_path)
    digest = scenario_digest(json.loads((run / "run.json").read_text())["scenario"])
    _write_lines(run, [json.dumps({**json.loads(x), "scenario_digest": digest}) for x in _lines(run)])
    assert len(load_results([run]).trials) == len(_lines(run))


def test_library_reader_names_a_fifo(tmp_path):
    os.mkfifo(tmp_path / "t.jsonl")
    with pytest.raises(safe_read.BadFile, match="t.jsonl: not a regular file"):
        safe_read.scan_rows(tmp_path / "t.jsonl")
    with pytest.raises(RunDirError, match="not a regular file"):
        from kvbench.results.read import read_trials
        read_trials(tmp_path / "t.jsonl")


def test_a_deeply_nested_plan_config_is_a_value_error(tmp_path):
    from kvbench.models.config import read_config_file

    f = tmp_path / "config.json"
    f.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=f"^{f}: not valid JSON"):
        read_config_file(f)


@pytest.mark.parametrize("reader", ["report", "cost", "compare", "resume"])
def test_a_trials_file_over_a_gib_is_refused_unread(tmp_path, reader):
    """From the hostile pass: a 4 GB sparse trials.jsonl took 16.8 s to scan before it was refused."""
    run = _copy(tmp_path)
    with open(run / "trials.jsonl", "r+b") as f:
        f.truncate(4 << 30)
    t = time.monotonic()
    _refused(_args(reader, run), f"{run / 'trials.jsonl'}: the file is over 1,073,741,824 bytes (kvbench writes "
                                 "2-4 KB per trial)")
    assert time.monotonic() - t < 10


def test_a_trials_file_that_grows_past_a_gib_while_read_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(safe_read, "MAX_TRIALS_BYTES", 4096)
    (tmp_path / "t.jsonl").write_text('{"a": 1}\n' * 1000)  # 9,000 bytes; fstat is asked before a read
    monkeypatch.setattr(safe_read.os, "fstat", lambda fd: os.stat_result((0o100644, 0, 0, 1, 0, 0, 0, 0, 0, 0)))
    with pytest.raises(safe_read.BadFile, match="t.jsonl: the file is over 4,096 bytes"):
        safe_read.scan_rows(tmp_path / "t.jsonl")
