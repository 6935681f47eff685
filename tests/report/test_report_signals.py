"""`kvbench report` stopped by SIGTERM or SIGKILL (issue 17 item 12): its chart workers die with it and its
private `.kvbench-report-*` folder does not outlive it (SIGTERM) or is swept by the next report (SIGKILL)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from conftest import kvbench_cmd
from kvbench.cli import app
from kvbench.report.scratch_dir import owner_prefix

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
RUN = next(p for p in sorted(GOLDEN.iterdir()) if (p / "run.json").is_file())

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: charts are drawn in-process")


def results_dir(tmp_path: Path, groups: int = 4) -> Path:
    """``groups`` copies of the golden run under other scenario names: a dozen charts, seconds to draw."""
    root = tmp_path / "results"
    for i in range(groups):
        dst = root / f"g{i}"
        shutil.copytree(RUN, dst)
        meta = json.loads((dst / "run.json").read_text())
        meta["scenario"]["name"] = f"g{i}"
        (dst / "run.json").write_text(json.dumps(meta))
        rows = [dict(json.loads(x), scenario=f"g{i}") for x in (dst / "trials.jsonl").read_text().splitlines()]
        (dst / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def start_report(root: Path, out: Path) -> tuple[subprocess.Popen, list[psutil.Process]]:
    """Start `kvbench report` and wait until its chart workers run and its scratch folder exists."""
    proc = subprocess.Popen([*kvbench_cmd(), "report", str(root), "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        workers = psutil.Process(proc.pid).children() if proc.poll() is None else []
        if len(workers) >= 2 and list(out.glob(".kvbench-report-*")):
            return proc, workers
        if proc.poll() is not None:
            pytest.fail(f"the report ended before its workers were seen: {proc.communicate()[0]}")
        time.sleep(0.01)
    proc.kill()
    pytest.fail("no chart workers within 60 s")


@pytest.fixture
def reaper():
    """Processes to kill after the test whatever happened (a failing test leaves no orphaned worker)."""
    procs: list[psutil.Process] = []
    yield procs
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()


def test_sigterm_stops_the_report_kills_its_workers_and_leaves_nothing(tmp_path, reaper):
    root, out = results_dir(tmp_path), tmp_path / "rep"
    proc, workers = start_report(root, out)
    reaper.extend(workers)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=30)[0]
    assert proc.returncode == 130, output
    assert f"interrupted: no report written to {out}" in output and "Traceback" not in output
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert alive == []
    assert not out.exists(), list(out.rglob("*"))  # it made the folder, so it removes it: no scratch folder, no empty report folder


def test_sigkill_takes_the_workers_along_and_the_next_report_sweeps_the_leftover(tmp_path, reaper):
    root, out = results_dir(tmp_path), tmp_path / "rep"
    proc, workers = start_report(root, out)
    reaper.extend(workers)
    proc.kill()
    proc.wait(timeout=30)
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert alive == []  # PR_SET_PDEATHSIG
    left = list(out.glob(".kvbench-report-*"))
    assert len(left) == 1 and f"-{proc.pid}-" in left[0].name
    # a scratch folder of a live report (this process) and one of an older kvbench are not provably dead
    (out / f"{owner_prefix()}live").mkdir()
    (out / ".kvbench-report-x1y2z3").mkdir()
    r = CliRunner().invoke(app, ["report", str(root / "g0"), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.glob(".kvbench-report-*")) == sorted([f"{owner_prefix()}live",
                                                                             ".kvbench-report-x1y2z3"])
    assert (out / "report.md").is_file()


def test_an_interrupt_as_the_scratch_folder_is_made_or_a_failing_stop_leaves_no_folder(tmp_path, monkeypatch):
    """From the second re-attack: Ctrl-C about 1 s into a report left its `.kvbench-report-*` folder in 13 of 18
    tries. The folder is now removed by its owner's name, also when the interrupt came as it was made (before its
    caller knew it) or when stopping the workers failed."""
    import kvbench.report.write as report
    from kvbench.report import scratch_dir
    from kvbench.results.load import load_results

    results = load_results([RUN])
    real_make = scratch_dir.make

    def made_then_interrupted(parent):
        real_make(parent)
        raise KeyboardInterrupt

    monkeypatch.setattr(scratch_dir, "make", made_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        report.write_report(results, tmp_path / "a")
    assert not (tmp_path / "a").exists()
    monkeypatch.setattr(scratch_dir, "make", real_make)

    class BrokenPool:
        def submit(self, fn, *args):
            raise KeyboardInterrupt

        def stop(self):
            raise OSError(9, "Bad file descriptor")

    (tmp_path / "b").mkdir()
    with pytest.raises(OSError, match="Bad file descriptor"):
        report.write_report(results, tmp_path / "b", pool=BrokenPool())
    assert list((tmp_path / "b").iterdir()) == []
