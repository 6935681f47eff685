"""The one mapping of errors to exit statuses (kvbench.cli.common.handle_errors): a user error exits 2 with its
message worded with the command's flags; anything else is a bug: a traceback, then a line asking to report it.
And the one table printer (kvbench.cli.common.show): no column squeezed to nothing, piped or in a terminal; and
`python -m kvbench` as the command."""

from __future__ import annotations

import io

import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

import kvbench.cli.common as common
from kvbench.cli import app
from kvbench.cli.common import BUG_LINE, render, show


def test_a_bug_shows_its_traceback_and_asks_to_report_it(monkeypatch):
    import kvbench.report.plan as rp

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(rp, "plan", broken)
    r = CliRunner().invoke(app, ["plan", "llama-3.1-8b"])
    assert r.exit_code == 1
    assert "Traceback" in r.stderr and "RuntimeError: boom" in r.stderr
    assert " ".join(r.stderr.split()).endswith(f"error: {BUG_LINE}")


def test_a_user_error_names_the_flag_not_the_argument():
    r = CliRunner().invoke(app, ["plan", "llama-3.1-8b", "--link-gbps", "0"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "error: --link-gbps must be a finite number of GB/s above 0, not 0.0" in r.output


FRAME = pd.DataFrame({"prompt": ["256"], "batch": ["1"], "mode": ["hierarchical(window=16,host_max_tokens=16)"],
                      "trials": ["5 over budget"], "TTFT ms": ["1,162"], "TPOT ms": ["319 [219–346]"],
                      "overhead %": ["+11 [−18, +28]"], "= none": ["yes"]})


def _shown(monkeypatch, width: int, terminal: bool, **kw) -> list[str]:
    buffer = io.StringIO()
    monkeypatch.setattr(common, "out", Console(file=buffer, width=width, force_terminal=terminal, soft_wrap=True,
                                               color_system=None))
    show(render(FRAME, "t", "cap"), **kw)
    return buffer.getvalue().splitlines()


@pytest.mark.parametrize("width", [80, 120])
def test_piped_tables_widen_to_what_they_need_and_lose_no_cell(monkeypatch, width):
    lines = _shown(monkeypatch, width, terminal=False)
    row = next(x for x in lines if "hierarchical" in x)
    # mode folds (at 28 characters or more), every other cell is whole on one line
    assert row.split("│")[3].strip().startswith("hierarchical(window=16,host_")
    assert [c.strip() for c in row.split("│")[4:9]] == [
        "5 over budget", "1,162", "319 [219–346]", "+11 [−18, +28]", "yes"]
    assert len(row) >= 113 and lines[-1] == "cap"  # wider than 80 columns where it needs to be


def test_a_narrow_terminal_drops_named_columns_first_and_says_which(monkeypatch):
    lines = _shown(monkeypatch, 80, terminal=True, first=("TTFT ms", "TPOT ms"))
    header = next(x for x in lines if "prompt" in x)
    # the two named go first, and mode folds at 16 characters: the rest fits
    assert [c.strip() for c in header.split("┃")[1:-1]] == ["prompt", "batch", "mode", "trials", "overhead %",
                                                            "= none"]
    assert lines[-1] == "cap; left out at 80 columns: TTFT ms, TPOT ms (a wider terminal shows them)"
    assert any(x.split("│")[3].strip() == "hierarchical(win" for x in lines if x.startswith("│"))
    assert max(len(x) for x in lines[:-1]) <= 80


@pytest.mark.e2e
@pytest.mark.parametrize("module", ["kvbench", "kvbench.cli"])
def test_python_dash_m_runs_the_command(module):
    """From the hostile pass: `python -m kvbench` said kvbench is a package that cannot be executed directly."""
    import subprocess
    import sys

    from kvbench.version import __version__

    r = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == f"kvbench {__version__}", (r.stdout, r.stderr)
