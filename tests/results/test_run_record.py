"""Hostile run.json files and trial rows (issue 17 item 15): report, cost, compare and run --resume refuse them with
exit 2 and one line naming the file, the line (rows) and the key path; nothing is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvbench.cli import app
from kvbench.errors import RecordError, ResultsError
from kvbench.results.run_dir import RunDir, RunDirError
from kvbench.results.identity import scenario_digest
from kvbench.results.load import load_results
from kvbench.results.record import check_rows

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
RUN = next(p for p in sorted(GOLDEN.iterdir()) if (p / "run.json").is_file())


def _meta(**over):
    def edit(text: str) -> str:
        meta = json.loads(text)
        meta.update(over)
        return json.dumps(meta)
    return edit


def _row(line: int, value):
    """Replace row ``line`` (1-based) of trials.jsonl by ``value`` (a dict merged into the row, or any JSON)."""
    def edit(text: str) -> str:
        lines = text.splitlines()
        old = json.loads(lines[line - 1])
        lines[line - 1] = json.dumps({**old, **value} if isinstance(value, dict) else value)
        return "\n".join(lines) + "\n"
    return edit


def _scenario_field(key, value):
    def edit(text: str) -> str:
        meta = json.loads(text)
        meta["scenario"][key] = value
        return json.dumps(meta)
    return edit


#: (file edited, edit, the message after the file name)
CASES = {
    "environment x": ("run.json", _meta(environment="x"), "environment: must be an object, not 'x'"),
    "scenario a list": ("run.json", _meta(scenario=["tiny"]), "scenario: must be an object, not ['tiny']"),
    "capacity junk": ("run.json", _meta(capacity="junk"), "capacity: must be a list, not 'junk'"),
    "capacity of strings": ("run.json", _meta(capacity=["junk"]), "capacity[0]: must be an object, not 'junk'"),
    "status unknown": ("run.json", _meta(status="done"),
                       "status: must be one of 'running', 'interrupted' or 'complete', not 'done'"),
    "cpu_count text": ("run.json", _meta(environment={"cpu_count": "2"}),
                       "environment.cpu_count: must be a whole number, not '2'"),
    "scenario key": ("run.json", _scenario_field("max_new_tokens", True), "scenario.max_new_tokens: "),
    "truncated": ("run.json", lambda text: text[:200], "not valid JSON"),
    "row 42": ("trials.jsonl", _row(3, 42), ":3: not a trial row (a JSON object was expected, not 42)"),
    "trial_id 5": ("trials.jsonl", _row(2, {"trial_id": 5}), ":2: trial_id: must be text, not 5"),
    "NaN string": ("trials.jsonl", _row(7, {"ttft_s": "NaN"}), ":7: ttft_s: must be a finite number, not 'NaN'"),
    "nested list": ("trials.jsonl", _row(4, {"itl_s": [[0.1]]}), ":4: itl_s[0]: must be a number, not [0.1]"),
    "status bogus": ("trials.jsonl", _row(5, {"status": "fine"}),
                     ":5: status: must be one of 'ok', 'over_budget', 'skipped', 'error' or 'oom', not 'fine'"),
    "batch true": ("trials.jsonl", _row(6, {"batch_size": True}), ":6: batch_size: must be a whole number, not True"),
}


def hostile_run(tmp_path: Path, case: str) -> tuple[Path, Path, str]:
    name, edit, message = CASES[case]
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    f = run / name
    f.write_text(edit(f.read_text()))
    return run, f, message


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_run_files_exit_2_naming_file_line_and_key(tmp_path, case):
    run, f, message = hostile_run(tmp_path, case)
    for args in (["report", str(run)], ["cost", str(run), "--gpu-price", "2"], ["compare", str(RUN), str(run)],
                 ["run", "--resume", str(run)]):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        line = r.output.strip().replace("\n", " ")
        assert line.startswith(f"error: {f}") and message in line, (args, r.output)
        assert "Traceback" not in r.output
    assert not (run / "report").exists()  # nothing written, no empty report directory


def test_rows_of_a_newer_kvbench_keep_their_extra_keys(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    rows = [json.loads(x) for x in (run / "trials.jsonl").read_text().splitlines()]
    digest = scenario_digest(json.loads((run / "run.json").read_text())["scenario"])  # another one is refused
    rows = [dict(r, scenario="golden", scenario_digest=digest, new_column=[{"x": 1}]) for r in rows]
    (run / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    trials = load_results([run]).trials
    assert len(trials) == 120 and set(trials["scenario_digest"]) == {digest}
    assert trials["new_column"].iloc[0] == [{"x": 1}]


def test_library_errors_name_the_line_and_key(tmp_path):
    run, f, _ = hostile_run(tmp_path, "trial_id 5")
    with pytest.raises(ResultsError, match=f"^{f}:2: trial_id: must be text, not 5$"):
        load_results([run])
    with pytest.raises(RunDirError, match=f"^{f}:2: trial_id: must be text, not 5$"):
        RunDir.open(run)
    with pytest.raises(RecordError) as info:
        check_rows([{"trial_id": "a", "status": "ok", "mode": "none", "prompt_tokens": 8, "batch_size": 1,
                     "kv_host_peak_bytes": -1}], [9], "t.jsonl")
    assert str(info.value) == "t.jsonl:9: kv_host_peak_bytes: must be a whole number of at least 0, not -1"
    assert (info.value.line, info.value.key) == (9, "kv_host_peak_bytes")
