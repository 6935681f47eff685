"""Strings from input that act instead of reading as text: escape sequences, control characters and bidirectional
overrides on the terminal, HTML and Markdown in report.md, ``$`` in charts, names that are not UTF-8, and mode
labels that give the same file name. Each goes through :mod:`kvbench.safe_text` wherever it is shown or written."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from analysis.test_break_even import base_scenario, synthetic_rows
from golden_run import copy_run
from kvbench.cli import app
from kvbench.scenario import parse_scenario

PEERS = Path(__file__).parent / "data" / "peers"
#: Clears the screen, reverses the text after it, and a C1 CSI (red).
ESCAPES = "x\x1b[2J\u202eq\x9b1m"
SHOWN = r"x\x1b[2J\u202eq\x9b1m"
#: An image whose error handler runs, a link to script, a code span and math text for matplotlib.
HTML = "<img src=x onerror=alert(1)>[a](javascript:alert(1))`c`$\\frac{a}{$"


def _cli(*args: str):
    r = CliRunner().invoke(app, list(args))
    raw = [c for c in r.output if c in "\x1b\x07\x9b\u202e" or 0xD800 <= ord(c) <= 0xDFFF]
    assert not raw, (raw, r.output)
    return r


def _labelled(tmp_path: Path, labels: dict[str, str], name: str = "b") -> Path:
    def edit(row):
        row["mode_label"] = labels.get(row["mode_label"], row["mode_label"])
        return row
    return copy_run(tmp_path, name, edit=edit)


def _break_even_run(tmp_path: Path, label: str) -> Path:
    from kvbench.results.run_dir import RunDir

    run = RunDir.create(tmp_path / "results", parse_scenario(base_scenario()).model_dump(mode="json"), {})
    for r in synthetic_rows(lengths=(128, 1024)):
        run.append({**r, "mode_label": label})
    return run.path


def _broken(*args):
    """A chart that cannot be drawn."""
    raise ValueError("cannot\ndraw this")


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:8]


# the one sanitiser

def test_visible_writes_each_control_bidi_and_undecodable_character_as_an_escape():
    from kvbench.safe_text import visible

    assert visible("a\x1b[2J\x00\x7f\x85\u202a\u2066\u2069\u200f\u2028b\udcff\ud800") == (
        r"a\x1b[2J\x00\x7f\x85\u202a\u2066\u2069\u200f\u2028b\xff\ud800")
    assert visible("tab\tand\nline, é, 漢字, $, <b>") == "tab\tand\nline, é, 漢字, $, <b>"


def test_file_names_from_labels_are_safe_and_never_the_same_for_different_labels():
    from kvbench.safe_text import file_stem, unique_stems

    assert file_stem("hierarchical(window=16)") == "hierarchical_window_16"
    assert file_stem("../../etc/passwd") == ".._.._etc_passwd"
    assert file_stem("..") == f"x-{_digest('..')}" and file_stem("") == "x"
    assert len(file_stem("a" * 300)) == 80 and file_stem("a" * 300).endswith(_digest("a" * 300))
    assert unique_stems(["none", "none?", "none!", "None?", "full"]) == [
        f"none-{_digest('none')}", f"none-{_digest('none?')}", f"none-{_digest('none!')}",
        f"None-{_digest('None?')}", "full"]
    assert unique_stems([("a_b", "c"), ("a", "b_c"), ("a", "b_c")]) == [
        f"a_b_c-{_digest('a_b', 'c')}", f"a_b_c-{_digest('a', 'b_c')}", f"a_b_c-{_digest('a', 'b_c')}"]
    planted = f"none-{_digest('none?')}"  # a label that is another's stem and digest
    assert unique_stems(["none?", "none!", planted]) == [planted, f"none-{_digest('none!')}", f"{planted}-2"]


# the terminal

def test_escapes_in_a_mode_label_are_shown_not_run_by_report_and_cost(tmp_path):
    run = _labelled(tmp_path, {"full": ESCAPES})
    r = _cli("report", str(run))
    assert r.exit_code == 0, r.output
    assert f"│ {SHOWN} " in r.output  # its table cell
    r = _cli("cost", str(run), "--gpu-price", "2")
    assert r.exit_code == 0, r.output
    assert f"│ {SHOWN} " in r.output  # its table cell


def test_escapes_in_a_folder_name_are_shown_in_an_error(tmp_path):
    where = tmp_path / "r\x1b]0;pwned\x07\u2066"  # sets the window title
    r = _cli("report", str(where))
    assert r.exit_code == 2
    assert f"error: {tmp_path}/r\\x1b]0;pwned\\x07\\u2066" in " ".join(r.output.split()), r.output


def test_bell_backspace_and_carriage_return_are_shown_not_dropped(tmp_path):
    """From the hostile pass: Rich drops BEL, BS and CR from a string it renders, so ``bogus\x07key\r\b`` was
    shown as ``boguskey``: a name that is not the one in the file."""
    (tmp_path / "s.yaml").write_text('name: x\nmodel: smollm2-135m\n"bogus\\akey\\r\\b": 1\n')
    r = _cli("validate", str(tmp_path / "s.yaml"))
    assert r.exit_code == 2 and "\x07" not in r.output and "\r" not in r.output and "\b" not in r.output
    assert "bogus\\x07key\\x0d\\x08: unknown key 'bogus\\x07key\\x0d\\x08'" in r.output, r.output


# report.md

def test_report_md_carries_no_html_link_or_code_from_a_mode_label_and_charts_draw_its_dollars(tmp_path):
    run = _break_even_run(tmp_path, HTML + "\x1b[2J")
    r = _cli("report", str(run), "--out", str(tmp_path / "rep"))
    assert r.exit_code == 0, r.output
    md = (tmp_path / "rep" / "report.md").read_text()
    assert not re.search(r"(?<!\\)<img|(?<!\\)\]\(javascript|\x1b", md)
    label = (r"\<img src=x onerror=alert(1)\>\[a\](javascript:alert(1))\`c\`$\\frac{a}{$\\x1b\[2J")
    assert (f"### Break-even map, {label} (restore vs recompute, USD per 1M tokens at 2 USD per GPU-hour, no "
            "memory charged: `kvbench map --gpu-price --host-price` prices it)") in md.splitlines()
    stem = "be_img_src_x_onerror_alert_1_a_javascript_alert_1_c_frac_a_2J"  # the ESC byte is one of the "_"
    assert (tmp_path / "rep" / f"break_even_{stem}.png").stat().st_size > 1000
    r = _cli("map", str(run), "--out", str(tmp_path / "map"))
    assert r.exit_code == 0, r.output
    assert sorted(os.listdir(tmp_path / "map")) == ["map.csv", "map.json", f"map_{stem}.png"]


def test_a_chart_that_fails_is_one_line_and_every_other_file_is_written(tmp_path, monkeypatch):
    from kvbench.report import break_even, charts

    monkeypatch.setattr(charts, "bytes_per_token", _broken)
    monkeypatch.setattr(break_even, "break_even_heatmap", _broken)
    r = _cli("report", str(copy_run(tmp_path)), "--out", str(tmp_path / "rep"))
    assert r.exit_code == 0, r.output
    line = "golden: bytes moved per generated token: chart not drawn (ValueError: cannot draw this)"
    assert f"  {line}" in r.output.splitlines()
    assert f"- {line}" in (tmp_path / "rep" / "report.md").read_text().splitlines()
    assert {"report.md", "report.html", "summary.csv", "saving_overhead_golden.png"} <= set(
        os.listdir(tmp_path / "rep"))
    r = _cli("map", str(_break_even_run(tmp_path, "none")), "--out", str(tmp_path / "map"))
    assert r.exit_code == 0, r.output
    assert "warning: map of be, none: chart not drawn (ValueError: cannot draw this)" in r.output
    assert sorted(os.listdir(tmp_path / "map")) == ["map.csv", "map.json"]


# names that are not UTF-8

def test_a_run_folder_that_is_not_utf8_is_reported_costed_and_exported_with_its_bytes_escaped(tmp_path):
    run = copy_run(tmp_path, os.fsdecode(b"run\xff\xfe"))
    shown = f"{tmp_path}/run\\xff\\xfe"
    r = _cli("report", str(run))
    assert r.exit_code == 0, r.output
    assert f"report: {shown}/report/report.html" in r.output
    assert "- run `run\\xff\\xfe` (complete, started 2026-11-30T01:13:02Z, 120 trials)" in (
        run / "report" / "report.md").read_text().splitlines()
    r = _cli("cost", str(run), "--gpu-price", "2")
    assert r.exit_code == 0 and f"cost: {shown}/report/cost.csv" in r.output, r.output
    r = _cli("report", "--format", "llm-d", str(run))
    assert r.exit_code == 0 and f"llm-d report: {shown}/report/llm-d/golden__none-p32-b1.json" in r.output
    doc = json.loads((run / "report" / "llm-d" / "golden__none-p32-b1.json").read_text())
    assert doc["run"]["eid"] == "run\\xff\\xfe"


def test_peer_files_whose_names_are_not_utf8_are_costed_with_their_bytes_escaped(tmp_path):
    a = tmp_path / os.fsdecode(b"nocache\xff.json")
    b = tmp_path / os.fsdecode(b"cache\xfe\x1b[2J.json")
    shutil.copy(PEERS / "vllm" / "nocache.json", a)
    shutil.copy(PEERS / "vllm" / "cache.json", b)
    r = _cli("cost", "--gpu-price", "2", str(a), str(b), "--out", str(tmp_path / "o"))
    assert r.exit_code == 0, r.output
    base = f"{tmp_path.parent.name}/{tmp_path.name}"  # a label: the last three parts of the path
    names = f"{base}/cache\\xfe\\x1b[2J.json against {base}/nocache\\xff.json"
    assert names in r.output, [line for line in r.output.splitlines() if "against" in line]
    assert names in (tmp_path / "o" / "peer_cost.json").read_text().replace("\\\\", "\\")


# llm-d file names

def test_llmd_reports_of_labels_that_clean_to_one_name_are_all_written_and_counted(tmp_path):
    run = _labelled(tmp_path, {"full": "none?", "hierarchical(window=16)": "none!"})
    r = _cli("report", "--format", "llm-d", str(run), "--out", str(tmp_path / "l"))
    assert r.exit_code == 0, r.output
    files = sorted(os.listdir(tmp_path / "l"))
    assert len(files) == 20 and "20 llm-d Benchmark Reports (v0.2.1)" in r.output
    assert r.output.count("llm-d report: ") == 20
    for p, b in ((32, 1), (32, 2), (96, 1), (96, 2)):
        point = f"-p{p}-b{b}"
        assert {f"golden__none{point}.json", f"golden__none_{point}-{_digest('golden', 'none?' + point)}.json",
                f"golden__none_{point}-{_digest('golden', 'none!' + point)}.json"} <= set(files)
    labels = {json.loads((tmp_path / "l" / f).read_text())["run"]["description"].rpartition("/")[2] for f in files}
    assert {"none?-p32-b1", "none!-p32-b1", "none-p32-b1"} <= labels
