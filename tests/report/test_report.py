"""kvbench report on the committed golden run (a real `kvbench run tests/data/golden.yaml`)."""

from __future__ import annotations

import re
import statistics

import pandas as pd
import pytest
from typer.testing import CliRunner

from conftest import headless_chromium
from golden_run import DISK, DYN, FULL, PER_TOKEN, RUN, copy_run, rows_of
from kvbench.analysis.points import point_table
from kvbench.errors import ResultsError
from kvbench.results.load import load_results
from kvbench.cli import app
from kvbench.report.md_text import md_line
from kvbench.report.advice import diagnoses, findings, recommendation
from kvbench.report.write import write_report


@pytest.fixture(scope="module")
def golden():
    results = load_results([RUN])
    return results, point_table(results.trials)


def point(table: pd.DataFrame, p: int, b: int, mode: str) -> pd.Series:
    hit = table[(table.prompt_tokens == p) & (table.batch_size == b) & (table.mode_label == mode)]
    assert len(hit) == 1
    return hit.iloc[0]


def test_golden_run_loads_into_one_frame(golden):
    results, table = golden
    assert len(results.trials) == 120 and results.problems == []
    assert set(results.trials["group"]) == {"golden"} and results.runs[0]["status"] == "complete"
    assert len(table) == 2 * 2 * 6 and list(table["trials"].unique()) == [5]


def test_point_table_values_equal_the_rows(golden):
    _, table = golden
    rows = rows_of()
    for p, b, mode in [(32, 1, "none"), (96, 2, FULL), (96, 1, DYN)]:
        mine = [r for r in rows if (r["prompt_tokens"], r["batch_size"], r["mode_label"]) == (p, b, mode)]
        r = point(table, p, b, mode)
        for col in ("ttft_s", "tpot_s", "e2e_s", "throughput_tokens_per_s"):
            vals = [x[col] for x in mine]
            assert r[f"{col}_median"] == pytest.approx(statistics.median(vals))
            assert (r[f"{col}_min"], r[f"{col}_max"]) == (min(vals), max(vals))
            # 95% bootstrap interval of the median (5 repeats): inside the range, around the median
            assert min(vals) <= r[f"{col}_ci_low"] <= r[f"{col}_median"] <= r[f"{col}_ci_high"] <= max(vals)
    # KV figures are exact: none holds every token on the device, (32 + 6 - 1) tokens × batch 1
    assert point(table, 32, 1, "none")["kv_device_peak_bytes_median"] == 37 * PER_TOKEN
    # full keeps one layer's K/V on the device during its attention: 1/30 of none's
    assert point(table, 96, 2, FULL)["memory_saving_pct"] == pytest.approx(100 * (1 - 1 / 30))
    none, full = point(table, 96, 2, "none"), point(table, 96, 2, FULL)
    # comparisons are paired: repeat r of `full` ÷ repeat r of `none` (they ran back to back), median over pairs
    by_repeat = {(x["mode_label"], x["repeat"]): x for x in rows if (x["prompt_tokens"], x["batch_size"]) == (96, 2)}
    tpot = [by_repeat[(FULL, k)]["tpot_s"] / by_repeat[("none", k)]["tpot_s"] for k in range(5)]
    tput = [by_repeat[(FULL, k)]["throughput_tokens_per_s"] / by_repeat[("none", k)]["throughput_tokens_per_s"]
            for k in range(5)]
    assert full["pairs"] == 5 and none["pairs"] == 0
    assert full["time_overhead_pct"] == pytest.approx(100 * (statistics.median(tpot) - 1))
    assert full["throughput_ratio"] == pytest.approx(statistics.median(tput))
    # 5 pairs: the 95% bootstrap interval of the median is the range of the pair ratios
    assert (full["time_overhead_ci_low"], full["time_overhead_ci_high"]) == pytest.approx(
        (100 * (min(tpot) - 1), 100 * (max(tpot) - 1)))
    # the golden run predates load recording: no verdict
    assert full["tpot_verdict"] == ("inconclusive: the machine's load is unknown for 10 of 10 trials (not "
                                                "recorded, or a window too short to tell)")
    assert pd.isna(none["tpot_verdict"])
    assert (table["kv_check_flagged"] == 0).all()  # every mode's KV accounting equals the prediction


def test_failed_skipped_and_over_budget_points_are_kept(golden):
    _, table = golden
    hf = point(table, 32, 1, "hf-offloaded")
    assert (hf["status"], hf["n_skipped"], hf["measured"]) == ("skipped", 5, 0)
    assert "needs a CUDA device" in hf["message"] and pd.isna(hf["memory_saving_pct"])
    over = point(table, 96, 1, "none")
    assert (over["status"], over["n_over_budget"], over["measured"]) == ("over_budget", 5, 5)
    assert over["kv_device_peak_bytes_median"] == 101 * PER_TOKEN > 4 * 2**20
    assert point(table, 32, 2, "none")["status"] == "ok"
    assert (table[table["mode"] != "hf-offloaded"]["tokens_match"] == True).all()  # noqa: E712


def test_findings_and_recommendation_come_from_the_table(golden):
    _, table = golden
    lines = findings(table, "golden")
    assert len(lines) == 8  # 4 measured offload modes × 2 batch sizes at the longest prompt
    r = point(table, 96, 2, FULL)
    assert (f"at 96 tokens × batch 2, `full` saved 97% of device KV memory "
            f"({r['kv_device_peak_bytes_median'] / 2**20:,.1f} MiB left) for") in "\n".join(lines)
    rec = recommendation(table, "golden")
    here = table[(table.prompt_tokens == 96) & (table.batch_size == 2) & (table["mode"] != "none")
                 & (table.n_ok == 5)]
    best = here.sort_values("tpot_s_median").iloc[0]
    assert rec.startswith("`none` does not fit the budget from 96 tokens × batch 1 (over budget); "
                          f"at 96 tokens × batch 2 use `{best['mode_label']}`: it fits with the least TPOT")


def test_report_files_charts_and_diagnoses(golden, tmp_path):
    results, _ = golden
    rep = write_report(results, tmp_path)
    assert [(title, p.name) for title, p in rep.charts] == [
        ("golden: memory saving and time overhead vs prompt length", "saving_overhead_golden.png"),
        ("golden: throughput and device KV vs batch size", "throughput_batch_golden.png"),
        ("golden: bytes moved per generated token", "bytes_per_token_golden.png"),
        ("memory timelines: golden", "timelines_golden.png")]  # one panel per measured mode at 96 × 2
    for _, png in rep.charts:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert len(summary) == 24 and "memory_saving_pct" in summary
    md = (tmp_path / "report.md").read_text()
    assert f"**Recommendation:** {md_line(rep.recommendations['golden'])}" in md and "![" in md
    assert re.search(r"\| golden +\| +96 \| +2 \| full +\| 5 ok +\|", (tmp_path / "summary.md").read_text())
    page = (tmp_path / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == len(rep.charts) and "http" not in page.replace(
        "http-equiv", "")
    assert rep.diagnoses["golden"] == [
        "savings invisible: the largest KV here is 8.9 MiB next to 513 MiB of weights (2%); offloading it cannot free "
        "more than 2% of device memory (activations not counted)",  # 101 tokens × batch 2 × 46,080 B
        "no host↔device link bandwidth was measured (no CUDA device: host↔device bandwidth not measured): the link "
        "diagnoses need a CUDA run"]


@pytest.mark.browser
def test_html_report_loads_in_headless_chromium(golden, tmp_path):
    rep = write_report(golden[0], tmp_path / "report")
    browser = headless_chromium(tmp_path / "profile", log_console=True)
    try:
        browser.get(rep.files["report.html"].resolve().as_uri())
        images = browser.execute_script(
            "return Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight])")
        console = browser.get_log("browser")
    finally:
        browser.quit()
    assert len(images) == len(rep.charts) == 4
    assert all(done and w > 0 and h > 0 for done, w, h in images), images
    assert [m for m in console if m["level"] in ("SEVERE", "WARNING")] == []


def test_corrupt_lines_are_reported_and_skipped(tmp_path):
    run = copy_run(tmp_path)
    lines = (run / "trials.jsonl").read_text().splitlines(keepends=True)
    lines.insert(3, '{"trial_id": "p32-b1-full-r0", "sta\n')
    lines.append(lines[0])  # the first trial written twice
    (run / "trials.jsonl").write_text("".join(lines) + '{"trial_id": "cut')
    results = load_results([run])
    assert len(results.trials) == 120
    f = run / "trials.jsonl"
    p = results.problems  # the JSON parser's own reason sits between the prefix and "; skipped"
    assert len(p) == 3 and p[0].startswith(f"{f}:4: not valid JSON: ") and p[0].endswith("; skipped")
    assert p[1].startswith(f"{f}:123: not valid JSON (cut off: a run killed mid-write?): ")
    assert p[2] == f"{f}: 1 trial id(s) appear more than once (p32-b1-none-r0, ...); the last of each is kept"
    r = CliRunner().invoke(app, ["report", str(run), "--out", str(tmp_path / "rep")])
    assert r.exit_code == 0, r.output
    assert "3 problems while loading" in r.output and ":123: not valid JSON (cut off" in r.output


def test_bad_paths_and_schema_versions_are_clear_errors(tmp_path):
    with pytest.raises(ResultsError, match=f"^{tmp_path / 'nope'}: no such file or directory$"):
        load_results([tmp_path / "nope"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ResultsError, match="empty: no kvbench runs here"):
        load_results([tmp_path / "empty"])
    newer = copy_run(tmp_path, "newer", edit_meta=lambda m: m.update(schema_version=99))
    with pytest.raises(ResultsError, match=r"newer/run.json: schema_version 99 is newer than this kvbench reads \(1\)"):
        load_results([newer])
    r = CliRunner().invoke(app, ["report", str(tmp_path / "empty")])
    assert r.exit_code == 2 and "no kvbench runs here" in r.output
    r = CliRunner().invoke(app, ["report", str(RUN), "--out", str(tmp_path / "r"), "--timeline", "p1-b1-none-r9"])
    assert r.exit_code == 2 and "no trial 'p1-b1-none-r9' in these results" in r.output


def test_no_baseline_gives_na_with_a_note(tmp_path):
    run = copy_run(tmp_path, edit=lambda r: None if r["mode"] == "none" else r)
    results = load_results([run])
    table = point_table(results.trials)
    assert table["memory_saving_pct"].isna().all() and table["time_overhead_pct"].isna().all()
    assert findings(table, "golden") == ["no measured `none` baseline in golden: savings and overheads are n/a"]
    assert recommendation(table, "golden") == "no measured `none` baseline in golden: no recommendation"


def test_a_run_where_nothing_was_measured_still_reports(tmp_path):
    run = copy_run(tmp_path, edit=lambda r: r if r["mode"] == "hf-offloaded" else None)  # CPU: all skipped
    r = CliRunner().invoke(app, ["report", str(run), "--out", str(tmp_path / "rep")])
    assert r.exit_code == 0, r.output
    assert "no measured `none` baseline in golden: no recommendation" in r.output
    assert "5 skipped" in r.output and "0 charts" in r.output
    assert (tmp_path / "rep" / "report.html").is_file()


def test_runs_of_different_scenarios_are_grouped_not_pooled(tmp_path):
    same = copy_run(tmp_path, "same")
    pooled = load_results([RUN, same])
    assert set(pooled.trials["group"]) == {"golden"}
    assert set(point_table(pooled.trials)["trials"]) == {10}  # the same scenario and machine: repeats pooled

    def rename(meta):
        meta["scenario"]["name"] = "other"

    other = copy_run(tmp_path, "other", edit=lambda r: dict(r, scenario="other"), edit_meta=rename)
    changed = copy_run(tmp_path, "changed", edit=lambda r: dict(r, max_new_tokens=7),
                       edit_meta=lambda m: m["scenario"].update(max_new_tokens=7))
    mixed = load_results([RUN, other, changed])
    table = point_table(mixed.trials)
    assert set(table["group"]) == {f"golden @ {RUN.name}", "other", "golden @ changed"}
    assert set(table["trials"]) == {5}


def test_the_median_interval_is_the_interpolated_order_statistics():
    import numpy as np

    from kvbench.analysis.intervals import median_interval, order_statistic_rank

    assert order_statistic_rank(5) == (1, 0.0)  # the range: 93.75%, the most 5 values give
    k, lam = order_statistic_rank(10)  # γ_2 = 1 − 2 × 11/1024 = 97.85%, γ_3 = 1 − 2 × 56/1024 = 89.06%
    share = (0.978515625 - 0.95) / (0.978515625 - 0.890625)
    assert k == 2 and lam == pytest.approx(8 * share / (2 + 6 * share))
    values = np.array([[float(i) for i in range(1, 11)], [3.0] * 10])
    lo, hi = median_interval(values)
    assert lo[0] == pytest.approx(2 + lam) and hi[0] == pytest.approx(9 - lam)
    assert lo[1] == hi[1] == 3.0  # all equal
    with pytest.raises(ValueError, match="needs 2 values or more, not 1"):
        order_statistic_rank(1)


def test_link_diagnoses_use_the_measured_bandwidth(tmp_path):
    def link(gbps):
        def edit(meta):
            meta["environment"]["link_bandwidth"] = {"h2d_pinned_gbps": gbps, "h2d_pageable_gbps": gbps / 2,
                                                     "d2h_pinned_gbps": gbps, "d2h_pageable_gbps": gbps / 2}
        return edit

    slow = load_results([copy_run(tmp_path, "slow", edit_meta=link(1e-4))])  # 100 kB/s: every copy is link-bound
    lines = [d for d in diagnoses(slow, point_table(slow.trials), "golden") if d.startswith("link-bound")]
    rate = point(point_table(slow.trials), 96, 2, FULL)["h2d_bytes_per_s_median"]
    assert len(lines) == 16  # 4 offload modes × 4 points
    assert f"link-bound: `full` at 96 tokens × batch 2 copies {rate / 1e9:.1f} GB/s host→device, {rate / 1e5:.0%} " \
           "of the measured 0.0 GB/s" in "\n".join(lines)
    fast = load_results([copy_run(tmp_path, "fast", edit_meta=link(1e4))])  # copies take no time at 10 TB/s
    table = point_table(fast.trials)
    lines = [d for d in diagnoses(fast, table, "golden") if d.startswith("slower than the link explains")]
    none = table[table["mode"] == "none"].set_index(["prompt_tokens", "batch_size"])["tpot_s_median"]
    expected = [r for _, r in table[(table["mode"] != "none") & table["h2d_bytes_per_s_median"].notna()].iterrows()
                if r["tpot_s_median"] - none[(r["prompt_tokens"], r["batch_size"])] > 1e-3]
    assert len(lines) == len(expected) > 0  # every offload point more than 1 ms per token slower than none
    assert all("transfers are not overlapped with compute, or the host side is slow" in d for d in lines)
    assert not any(d.startswith("no host↔device link") for d in diagnoses(fast, table, "golden"))


def test_a_disk_tier_kept_in_the_page_cache_is_diagnosed(golden):
    results, table = golden
    trials = results.trials.copy()
    disk = trials["mode_label"] == DISK
    trials["disk_page_cache_dropped"] = None
    trials.loc[disk, "disk_page_cache_dropped"] = False  # as rows of a scenario with disk: {page_cache: true}
    kept = type(results)(trials, results.runs, results.problems)
    lines = [d for d in diagnoses(kept, table, "golden") if d.startswith("disk timings measure RAM")]
    assert lines == [f"disk timings measure RAM: `{DISK}` kept its disk tier in the page cache in {int(disk.sum())} "
                     "trial(s) (scenario disk: {page_cache: true}, or posix_fadvise missing): its disk reads came "
                     "from memory, not the device"]
    assert not [d for d in diagnoses(results, table, "golden") if d.startswith("disk timings")]


EVIL = "<img src=https://evil/x.png> ![x](https://evil/y.png) [a](javascript:alert(1)) www.evil.example"


def test_report_md_carries_no_html_links_or_images_from_files(tmp_path):
    from markdown_it import MarkdownIt

    def edit(r):
        return dict(r, mode_label=f"full {EVIL}", message=EVIL) if r["mode_label"] == FULL else r

    run = copy_run(tmp_path, edit=edit, edit_meta=lambda m: m["scenario"].update(description=EVIL))
    rep = write_report(load_results([run]), tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "\\<img src=https\\://evil/x.png\\> !\\[x\\](https\\://evil/y.png) \\[a\\](javascript:alert(1)) " \
           "www\\.evil.example" in md
    page = MarkdownIt("commonmark").enable("table").render(md)  # raw HTML on, as GitHub and most viewers
    images = re.findall(r"<img [^>]*>", page)
    assert len(images) == len(rep.charts) and all('src="https://' not in i for i in images)
    assert "<a " not in page and "evil/y.png" in page
    assert "&lt;img src=https://evil/x.png&gt; ![x](https://evil/y.png) [a](javascript:alert(1))" in page


def test_a_samples_file_that_is_not_kvbenchs_costs_the_timelines_only(tmp_path):
    """From the second re-attack: a samples.csv without trial_id gave a KeyError traceback, and one whose values
    were text a TypeError in the chart. Now the report is written without timelines from that file, and says why;
    text in a numeric column draws nothing."""
    from typer.testing import CliRunner

    from kvbench.cli import app

    run = copy_run(tmp_path, "nocols")
    (run / "samples.csv").write_text("a,b\n1,2\n")
    r = CliRunner().invoke(app, ["report", str(run)])
    assert r.exit_code == 0, r.output
    assert f"{run / 'samples.csv'}: unreadable (no trial_id, phase, t_s column: not a kvbench samples file); no " \
           "timelines from it" in " ".join(r.output.split())
    run = copy_run(tmp_path, "text")
    lines = (run / "samples.csv").read_text().splitlines()
    header = lines[0].split(",")
    keep = {header.index(c) for c in ("trial_id", "phase", "t_s")}
    (run / "samples.csv").write_text("\n".join([lines[0]] + [",".join(v if i in keep else "x" for i, v in
                                                                  enumerate(x.split(","))) for x in lines[1:]]))
    r = CliRunner().invoke(app, ["report", str(run)])
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output


def test_timelines_asked_many_times_are_drawn_once_and_at_most_64(tmp_path):
    """From the hostile pass: 5,000 copies of one --timeline ran past 60 s and wrote nothing; any number of ids
    was taken."""
    results = load_results([RUN])
    tid = str(results.trials["trial_id"].iloc[0])
    rep = write_report(results, tmp_path / "once", timelines=[tid] * 5000)
    assert [t for t, _ in rep.charts if t.startswith("memory timelines")] == ["memory timelines: selected trials"]
    r = CliRunner().invoke(app, ["report", str(RUN), "--out", str(tmp_path / "r")]
                           + [a for i in range(65) for a in ("--timeline", f"t{i}\x1b[2J")])
    assert r.exit_code == 2 and "65 trial ids: at most 64 timelines are drawn (8 figures of 8 panels)" in r.output
    assert not (tmp_path / "r").exists()
    r = CliRunner().invoke(app, ["report", str(RUN), "--out", str(tmp_path / "r")]
                           + [a for i in range(7) for a in ("--timeline", f"t{i}\x1b[2J")])
    assert r.exit_code == 2 and "\x1b" not in r.output
    assert "no trial 't0\\x1b[2J', 't1\\x1b[2J', 't2\\x1b[2J', 't3\\x1b[2J', 't4\\x1b[2J' and 2 more" in r.output


def test_a_finding_whose_figure_comes_from_its_quiet_pairs_says_how_many(tmp_path):
    """From the new-user pass: "+8% TPOT (…; 5 pairs with none)" came from the one quiet pair of five."""
    longest = max(r["prompt_tokens"] for r in rows_of(RUN))

    def edit(r):
        busy = r["mode_label"] == "full" and r["prompt_tokens"] == longest and r["repeat"] < 4
        return {**r, "machine_busy": busy}

    results = load_results([copy_run(tmp_path, edit=edit)])
    said = [f for f in findings(point_table(results.trials), results.trials["group"].iloc[0]) if "`full`" in f]
    assert said and all("5 pairs with none, the figure from 1 quiet pair): inconclusive: the machine was busy "
                        "during 4 of 10 trials" in f for f in said), said
    others = [f for f in findings(point_table(results.trials), results.trials["group"].iloc[0]) if "`full`" not in f]
    assert others and all("5 pairs with none)" in f for f in others), others
