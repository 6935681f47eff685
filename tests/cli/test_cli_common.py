"""The one mapping of errors to exit statuses (kvbench.cli.common.handle_errors): a user error exits 2 with its
message worded with the command's flags; anything else is a bug: a traceback, then a line asking to report it."""

from __future__ import annotations

from typer.testing import CliRunner

from kvbench.cli import app
from kvbench.cli.common import BUG_LINE


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
