"""kvbench cost's files: written beside their place and moved onto it (a link there is replaced, never written
through), refused before any table when the report path is a file, and naming the file it cannot write."""

from __future__ import annotations

import json
import shutil

from typer.testing import CliRunner

from conftest import ROOT
from kvbench.cli import app


def test_cost_replaces_links_in_the_report_directory_and_never_writes_through_them(tmp_path):
    """From the re-attack: `cost` wrote cost.json, cost.csv and cost.png through links placed in report/ (a file
    outside the run changed). Each file is now written beside its place and moved onto it: the link is replaced."""
    golden = next(p for p in sorted((ROOT / "tests" / "data" / "golden").iterdir()) if p.is_dir())
    run = tmp_path / "run"
    shutil.copytree(golden, run)
    (run / "report").mkdir(exist_ok=True)
    canaries = {}
    for name in ("cost.json", "cost.csv", "cost.png"):
        canary = tmp_path / f"canary-{name}"
        canary.write_text("CANARY\n")
        (run / "report" / name).unlink(missing_ok=True)
        (run / "report" / name).symlink_to(canary)
        canaries[name] = canary
    r = CliRunner().invoke(app, ["cost", "--gpu-price", "2", str(run)])
    assert r.exit_code == 0, r.output
    for name, canary in canaries.items():
        assert canary.read_text() == "CANARY\n"
        assert (run / "report" / name).is_file() and not (run / "report" / name).is_symlink()
    assert json.loads((run / "report" / "cost.json").read_text())["prices"]["gpu_per_hour"] == 2.0
    assert oct((run / "report" / "cost.json").stat().st_mode & 0o777) == oct(0o644)
    assert not [p for p in (run / "report").iterdir() if p.name.startswith(".kvbench-cost-")]


def test_cost_refuses_a_report_path_that_is_a_file_before_any_table_and_names_the_file_it_cannot_write(tmp_path):
    """From the second re-attack: with report/ a plain file, cost printed its whole table, then 'File exists'; with
    report/cost.json a directory, the error named report/, not cost.json."""
    golden = next(p for p in sorted((ROOT / "tests" / "data" / "golden").iterdir()) if p.is_dir())
    run = tmp_path / "run"
    shutil.copytree(golden, run)
    shutil.rmtree(run / "report", ignore_errors=True)
    (run / "report").write_text("not a directory")
    r = CliRunner().invoke(app, ["cost", "--gpu-price", "2", str(run)])
    assert r.exit_code == 2 and f"{run / 'report'} is not a directory" in r.stderr and r.stdout == "", r.stderr
    (run / "report").unlink()
    (run / "report" / "cost.json" / "x").mkdir(parents=True)
    r = CliRunner().invoke(app, ["cost", "--gpu-price", "2", str(run)])
    assert r.exit_code == 2 and f"cannot write {run / 'report' / 'cost.json'}: " in " ".join(r.stderr.split())
    assert not [p for p in (run / "report").iterdir() if p.name.startswith(".kvbench-cost-")]
