"""Flags whose type says what they take (a range with Typer's min and max, a choice with a Literal) are refused by
Typer before the command runs, naming the flag and what it takes, and their --help says it too; checks a type
cannot say (a finite number above 0, flags that go together) stay the command's, as one ``error:`` line."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from kvbench.cli import app


def _said(args: list[str]) -> tuple[int, str]:
    """Exit status and output of ``kvbench ARGS``, the error panel's borders and line breaks taken out."""
    r = CliRunner().invoke(app, args, terminal_width=200)
    return r.exit_code, " ".join(r.output.replace("│", " ").split())


@pytest.mark.parametrize("args, message", [
    (["plan", "llama-3.1-8b", "--visits", "1"], "Invalid value for '--visits': Input should be greater than or equal "
                                                "to 2"),
    (["plan", "llama-3.1-8b", "--visits", "101"], "Invalid value for '--visits': Input should be less than or equal "
                                                  "to 100"),
    (["plan", "llama-3.1-8b", "--new-tokens", "0"], "Invalid value for '--new-tokens': Input should be greater than "
                                                    "or equal to 1"),
    (["plan", "llama-3.1-8b", "--new-tokens", str(2**24 + 1)], "Invalid value for '--new-tokens': Input should be "
                                                               "less than or equal to 16777216"),
    (["report", "x", "--format", "csv"], "Invalid value for '--format': Value error, 'csv' is not one of 'kvbench', "
                                         "'llm-d'."),
])
def test_a_typed_flag_out_of_its_range_or_choices_is_refused_by_name(args, message):
    code, said = _said(args)
    assert code == 2 and message in said and "Traceback" not in said


def test_help_says_the_range_and_the_choices():
    plan = _said(["plan", "--help"])[1]
    assert "--visits <int range> [2<=x<=100]" in plan
    assert "--new-tokens <int range>" in plan and "[1<=x<=16777216]" in plan
    assert "--format <kvbench|llm-d>" in _said(["report", "--help"])[1]


def test_the_bounds_take_their_ends():
    code, said = _said(["plan", "llama-3.1-8b", "--break-even", "--visits", "100", "--new-tokens", "1"])
    assert code == 0 and "saving per request stream of 100 visits per prefix, 1 new tokens each" in said


@pytest.mark.parametrize("value", ["0", "-1", "inf", "nan"])
def test_an_slo_a_type_cannot_bound_is_the_commands_check(value, tmp_path):
    from golden_run import RUN

    code, said = _said(["cost", "--gpu-price", "2", str(RUN), "--max-ttft-ms", value, "--out", str(tmp_path)])
    assert code == 2 and said == f"error: --max-ttft-ms must be a finite number of milliseconds above 0, not " \
        f"{float(value)}"
