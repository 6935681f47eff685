"""Folders searched for runs (`map`, `report`, `cost`, `compare`, the newest run under results/) are searched to a
bounded depth without recursion: a run 1,200 folders deep ended `Path.rglob` in a RecursionError; now it is one
line naming the folder (exit 2)."""

from __future__ import annotations

import os
import shutil

import pytest
from golden_run import RUN
from typer.testing import CliRunner

from kvbench.cli import app


@pytest.fixture
def deep(tmp_path):
    """The golden run 1,200 folders down; made and removed level by level (os.makedirs and shutil.rmtree
    recurse too)."""
    bottom = tmp_path / "deep"
    bottom.mkdir()
    for _ in range(1200):
        bottom = bottom / "d"
        bottom.mkdir()
    shutil.copytree(RUN, bottom / "run")
    yield tmp_path / "deep"
    for f in (bottom / "run").iterdir():
        f.unlink()
    (bottom / "run").rmdir()
    while bottom != tmp_path / "deep":
        bottom.rmdir()
        bottom = bottom.parent


@pytest.mark.parametrize("command", [["map"], ["report"], ["cost", "--gpu-price", "2"], ["report", "--format",
                                                                                         "llm-d"]])
def test_a_run_nested_past_any_search_is_one_line(deep, command):
    res = CliRunner().invoke(app, [*command, str(deep)])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    shown = os.path.join(str(deep), *["d"] * 33)
    assert res.output.replace("\n", "").strip() == (f"error: {deep}: folders nested more than 32 levels deep below "
                                                    f"it (such as {shown}): give the run directory itself")


def test_the_newest_run_is_searched_bounded_too(deep, monkeypatch):
    monkeypatch.chdir(deep.parent)
    (deep.parent / "deep").rename(deep.parent / "results")
    try:
        res = CliRunner().invoke(app, ["cost", "--gpu-price", "2"])
    finally:
        (deep.parent / "results").rename(deep)
    assert res.exit_code == 2 and res.output.replace("\n", "").startswith(
        "error: results: folders nested more than 32 levels deep below it"), res.output


def test_a_search_within_bounds_finds_what_rglob_finds(tmp_path):
    from kvbench.safe_read import find_below

    for sub in ("a/b/c", "a/x", "z"):
        (tmp_path / sub).mkdir(parents=True)
        (tmp_path / sub / "trials.jsonl").write_text("")
    (tmp_path / "link").symlink_to(tmp_path / "a", target_is_directory=True)  # not entered, as rglob
    assert find_below(tmp_path, "trials.jsonl") == sorted(tmp_path.rglob("trials.jsonl"))
