"""The machine dimension of results (kvbench.results.load, kvbench.report.machines): a run measured on two placement
kinds is split into one group per machine, every comparison against `none` is made per machine, the report gains a
"Machines" section, and a trial retried after its worker was lost counts once, by its retry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import tiny_scenario
from kvbench.analysis.points import point_table
from kvbench.bench.summary import failure_lines, last_rows
from kvbench.cli import app
from kvbench.errors import ResultsError
from kvbench.report.machines import lost_lines, machine_findings, machine_groups, machine_sections, machine_table
from kvbench.results.identity import scenario_digest
from kvbench.results.load import load_results

SCENARIO = tiny_scenario(name="xm", modes=[{"kind": "none"}, {"kind": "full"}], prompt_tokens=[32, 96],
                         batch_sizes=[1], repeats=5, executor={"kind": "ray"},
                         placement=[{"name": "h100", "accelerator_type": "H100"},
                                    {"name": "l4", "accelerator_type": "L4"}])
#: TPOT of `none` per machine (seconds) and `full`'s ratio to it: repeat r is off the ratio by 0.02 × (r − 2), so
#: the 5 pair ratios are ratio − 0.04 … ratio + 0.04 and their median is the ratio.
NONE_TPOT = {"h100": 0.010, "l4": 0.020}
RATIO = {"h100": 1.6, "l4": 4.1}
#: Host and link (H2D, D2H GB/s) per machine and mode: h100's two hosts run one mode each.
WHERE = {("h100", "none"): ("gpu-a", 25.0, 24.0), ("h100", "full"): ("gpu-b", 25.2, 24.4),
         ("l4", "none"): ("l4-node", 12.0, 11.5), ("l4", "full"): ("l4-node", 12.0, 11.5)}
GPU = {"h100": ("NVIDIA H100 80GB HBM3", "550.54"), "l4": ("NVIDIA L4", "535.1")}
LOST = "worker lost (host l4-node): the actor died unexpectedly"


def env(cpu: str, gpu: str | None = None, h2d: float | None = None) -> dict:
    return {"cpu": cpu, "cpu_count": 16, "memory_total_bytes": 64 * 2**30,
            "gpus": [{"name": gpu}] if gpu else [],
            "link_bandwidth": {"h2d_pinned_gbps": h2d, "h2d_pageable_gbps": h2d / 2} if h2d else None}


def row(machine: str, prompt: int, mode: str, r: int, **over) -> dict:
    tpot = NONE_TPOT[machine] * (1 + 0.01 * r)
    if mode == "full":
        tpot *= RATIO[machine] + 0.02 * (r - 2)
    host, h2d, d2h = WHERE[(machine, mode)]
    out = {"trial_id": f"p{prompt}-b1-{mode}-r{r}@{machine}", "scenario": "xm", "mode": mode, "mode_label": mode,
           "mode_options": {}, "prompt_tokens": prompt, "batch_size": 1, "max_new_tokens": 3, "repeat": r,
           "scenario_digest": scenario_digest(SCENARIO), "status": "ok", "message": "", "device": "cuda:0",
           "dtype": "float32", "n_output_tokens": 3, "ttft_s": 0.05, "tpot_s": tpot, "e2e_s": 0.05 + 2 * tpot,
           "throughput_tokens_per_s": 3 / (0.05 + 2 * tpot),
           "kv_device_peak_bytes": prompt * 1000 if mode == "none" else 4000,
           "kv_host_peak_bytes": 0 if mode == "none" else prompt * 1000, "tokens_match": True,
           "machine_busy": False, "busy_threshold_percent": 25.0, "machine": machine, "host": host,
           "worker": f"actor-{host}", "attempt": 0, "gpu": GPU[machine][0], "gpu_driver": GPU[machine][1],
           "link_h2d_gbps": h2d, "link_d2h_gbps": d2h}
    out.update(over)
    return out


def rows_of_run() -> list[dict]:
    """Every trial of the two-machine run, in the order a sweep writes them (the modes of a repeat together)."""
    return [row(m, p, mode, r) for m in ("h100", "l4") for p in (32, 96) for r in range(5) for mode in ("none", "full")]


def write_run(root: Path, rows: list[dict], name: str = "run-a", machines: dict | None = None) -> Path:
    """A run directory (run.json with `executor` and `machines`, trials.jsonl of ``rows``) under ``root``."""
    run = root / name
    run.mkdir(parents=True)
    if machines is None:
        machines = {label: {"workers": [{"worker": "actor-1", "host": host, "gpu": GPU[label][0],
                                         "environment": env(f"{label} cpu", GPU[label][0], h2d)}]}
                    for label, host, h2d in (("h100", "gpu-a", 25.0), ("l4", "l4-node", 12.0))}
    meta = {"schema_version": 1, "status": "complete", "started_at": "2026-12-01T00:00:00Z", "scenario": SCENARIO,
            "environment": env("driver cpu"), "executor": {"kind": "ray", "address": "10.0.0.5:6379", "ray": "2.40.0"},
            "machines": machines}
    (run / "run.json").write_text(json.dumps(meta))
    (run / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


@pytest.fixture(scope="module")
def two_machines(tmp_path_factory):
    run = write_run(tmp_path_factory.mktemp("xm"), rows_of_run())
    results = load_results([run])
    return run, results, point_table(results.trials)


def point(table, group: str, prompt: int, mode: str):
    hit = table[(table["group"] == group) & (table["prompt_tokens"] == prompt) & (table["mode_label"] == mode)]
    assert len(hit) == 1
    return hit.iloc[0]


def test_a_run_on_two_machines_is_one_group_and_one_run_entry_per_machine(two_machines):
    run, results, _ = two_machines
    assert results.problems == [] and results.lost == []
    assert results.trials.groupby("group").size().to_dict() == {"xm @ h100": 20, "xm @ l4": 20}
    assert [(r["group"], r["machine"], r["base_group"], r["n_trials"], r["path"]) for r in results.runs] == [
        ("xm @ h100", "h100", "xm", 20, str(run)), ("xm @ l4", "l4", "xm", 20, str(run))]
    # each machine's environment is its first worker's, not the driver's
    assert [r["environment"]["gpus"][0]["name"] for r in results.runs] == ["NVIDIA H100 80GB HBM3", "NVIDIA L4"]
    assert [r["environment"]["link_bandwidth"]["h2d_pinned_gbps"] for r in results.runs] == [25.0, 12.0]
    assert results.runs[0]["executor"] == {"kind": "ray", "address": "10.0.0.5:6379", "ray": "2.40.0"}
    assert machine_groups(results) == {"xm": {"h100": "xm @ h100", "l4": "xm @ l4"}}


def test_one_machine_or_none_leaves_the_group_as_it_was(tmp_path):
    one = write_run(tmp_path, [r for r in rows_of_run() if r["machine"] == "h100"], "one")
    none = write_run(tmp_path, [dict(r, machine=None) for r in rows_of_run() if r["machine"] == "l4"], "none")
    for run in (one, none):
        results = load_results([run])
        assert set(results.trials["group"]) == {"xm"}
        assert len(results.runs) == 1 and "machine" not in results.runs[0]
        assert results.runs[0]["environment"]["cpu"] == "driver cpu"
        assert machine_sections(results, point_table(results.trials)) == {}


def test_a_machine_without_an_entry_in_run_json_keeps_the_run_environment(tmp_path):
    run = write_run(tmp_path, rows_of_run(), machines={"h100": {"workers": []}})
    assert [r["environment"]["cpu"] for r in load_results([run]).runs] == ["driver cpu", "driver cpu"]


def test_a_worker_environment_that_is_not_kvbenchs_is_refused_naming_its_key(tmp_path):
    bad = {"h100": {"workers": [{"environment": {"cpu_count": "16"}}]}}
    run = write_run(tmp_path, rows_of_run(), "a", machines=bad)
    with pytest.raises(ResultsError, match=r"^.*a/run\.json: machines\.h100\.workers\[0\]\.environment\.cpu_count: "
                                           r"must be a whole number, not '16'$"):
        load_results([run])
    run = write_run(tmp_path, rows_of_run(), "b", machines={"l4": {"workers": {"w": 1}}})
    with pytest.raises(ResultsError, match=r"b/run\.json: machines\.l4\.workers: must be a list, not dict$"):
        load_results([run])


def test_tpot_is_compared_with_none_on_the_same_machine(two_machines):
    _, _, table = two_machines
    for machine, prompt in (("h100", 32), ("h100", 96), ("l4", 32), ("l4", 96)):
        r = point(table, f"xm @ {machine}", prompt, "full")
        assert r["pairs"] == 5 and r["tpot_verdict"] == ""
        assert r["tpot_s_ratio"] == pytest.approx(RATIO[machine])
        assert r["tpot_s_ratio_ci_low"] == pytest.approx(RATIO[machine] - 0.04)
        assert r["tpot_s_ratio_ci_high"] == pytest.approx(RATIO[machine] + 0.04)
        assert r["memory_saving_pct"] == pytest.approx(100 * (1 - 4000 / (prompt * 1000)))


def test_the_machine_table_comes_from_the_rows(two_machines):
    _, results, _ = two_machines
    table = machine_table(results.trials, machine_groups(results)["xm"])
    assert table.to_dict("records") == [
        {"machine": "h100", "hosts": "gpu-a, gpu-b", "GPU": "NVIDIA H100 80GB HBM3", "driver": "550.54",
         "link H2D (GB/s)": "25.1", "link D2H (GB/s)": "24.2", "trials": "20 ok"},
        {"machine": "l4", "hosts": "l4-node", "GPU": "NVIDIA L4", "driver": "535.1", "link H2D (GB/s)": "12.0",
         "link D2H (GB/s)": "11.5", "trials": "20 ok"}]


def test_findings_give_each_machine_its_ratio_and_link(two_machines):
    _, results, table = two_machines
    lines = machine_findings(results.trials, table, machine_groups(results)["xm"])
    assert lines == [f"`full` at {p} tokens × batch 1, TPOT ÷ `none`'s: on h100 (link H2D 25.1 GB/s) 1.60 [1.56, 1.64] "
                     f"over 5 pairs; on l4 (link H2D 12.0 GB/s) 4.10 [4.06, 4.14] over 5 pairs" for p in (32, 96)]


def test_an_inconclusive_comparison_says_so_and_gives_no_ratio(tmp_path):
    busy = [dict(r, machine_busy=True) if (r["machine"], r["prompt_tokens"], r["mode"]) == ("l4", 96, "full") else r
            for r in rows_of_run()]
    few = [r for r in busy if not (r["machine"] == "h100" and r["prompt_tokens"] == 96 and r["repeat"] >= 3)]
    results = load_results([write_run(tmp_path, few)])
    lines = machine_findings(results.trials, point_table(results.trials), machine_groups(results)["xm"])
    assert lines[1] == ("`full` at 96 tokens × batch 1, TPOT ÷ `none`'s: on h100 (link H2D 25.1 GB/s) inconclusive "
                        "(3 pairs, need 5); on l4 (link H2D 12.0 GB/s) inconclusive (the machine was busy during 5 "
                        "of 10 trials)")
    assert "4.10" not in lines[1] and lines[0].endswith("4.10 [4.06, 4.14] over 5 pairs")


def test_a_machine_without_the_comparison_says_why(tmp_path):
    rows = [r for r in rows_of_run() if not (r["machine"] == "l4" and r["prompt_tokens"] == 32 and r["mode"] == "none")]
    rows = [dict(r, status="error", message="CUDA error", tpot_s=None)
            if (r["machine"], r["prompt_tokens"], r["mode"]) == ("h100", 96, "full") else r for r in rows]
    results = load_results([write_run(tmp_path, rows)])
    lines = machine_findings(results.trials, point_table(results.trials), machine_groups(results)["xm"])
    # at 32 l4 has no `none`; at 96 h100 measured nothing, so the point was measured on one machine only: no line
    assert lines == ["`full` at 32 tokens × batch 1, TPOT ÷ `none`'s: on h100 (link H2D 25.1 GB/s) 1.60 [1.56, 1.64] "
                     "over 5 pairs; on l4 (link H2D 12.0 GB/s) no pairs: no measured `none` here"]


def test_a_third_machine_that_measured_nothing_there_says_so(tmp_path):
    def cpu_node(r: dict) -> dict:  # a CPU machine (no link probe) where `full` failed and 96 tokens never ran
        failed = {"status": "error", "message": "killed", "tpot_s": None} if r["mode"] == "full" else {}
        return dict(r, trial_id=r["trial_id"].replace("@l4", "@cpu"), machine="cpu", host="cpu-1", gpu=None,
                    gpu_driver=None, link_h2d_gbps=None, link_d2h_gbps=None, **failed)

    third = [cpu_node(r) for r in rows_of_run() if r["machine"] == "l4" and r["prompt_tokens"] == 32]
    results = load_results([write_run(tmp_path, rows_of_run() + third)])
    groups = machine_groups(results)["xm"]
    assert list(groups) == ["h100", "l4", "cpu"]
    lines = machine_findings(results.trials, point_table(results.trials), groups)
    assert [line.split("; ")[-1] for line in lines] == ["on cpu (link not measured) not measured (5 error)",
                                                        "on cpu (link not measured) not run"]
    assert machine_table(results.trials, groups).iloc[2].to_dict() == {
        "machine": "cpu", "hosts": "cpu-1", "GPU": "-", "driver": "-", "link H2D (GB/s)": "-",
        "link D2H (GB/s)": "-", "trials": "5 ok, 5 error"}


def test_a_retried_trial_counts_once_by_its_retry_and_makes_no_problem(tmp_path):
    rows = rows_of_run()
    k = next(i for i, r in enumerate(rows) if r["trial_id"] == "p32-b1-full-r0@l4")
    retry = dict(rows[k], attempt=1, worker="actor-2")
    rows[k] = dict(rows[k], status="error", message=LOST, tpot_s=None, e2e_s=None)
    rows.append(retry)  # the retry is written later
    results = load_results([write_run(tmp_path, rows)])
    assert results.problems == []
    assert len(results.trials) == 40 and results.trials.groupby("group").size().to_dict() == {"xm @ h100": 20,
                                                                                              "xm @ l4": 20}
    kept = results.trials.set_index("trial_id").loc["p32-b1-full-r0@l4"]
    assert kept["status"] == "ok" and kept["attempt"] == 1 and kept["worker"] == "actor-2"
    assert [(r["trial_id"], r["message"], r["group"]) for r in results.lost] == [
        ("p32-b1-full-r0@l4", LOST, "xm @ l4")]
    assert lost_lines(results, "xm @ l4") == ["1 trial lost its worker and was retried (host l4-node); each counts "
                                              "by its retry"]
    assert lost_lines(results, "xm @ h100") == []
    assert point(point_table(results.trials), "xm @ l4", 32, "full")["n_ok"] == 5


def test_other_repeated_trial_ids_are_still_a_problem(tmp_path):
    rows = rows_of_run()
    lost = dict(rows[1], status="error", message=LOST)
    rows = [lost] + rows + [rows[0]]  # rows[1]'s retry is expected; rows[0] written twice is not
    run = write_run(tmp_path, rows)
    results = load_results([run])
    assert results.problems == [f"{run / 'trials.jsonl'}: 1 trial id(s) appear more than once (p32-b1-none-r0@h100, "
                                "...); the last of each is kept"]
    assert [r["trial_id"] for r in results.lost] == ["p32-b1-full-r0@h100"]


def test_failure_lines_count_each_trial_by_its_last_row():
    ok = row("l4", 32, "full", 0)
    lost = dict(ok, status="error", message=LOST)
    other = dict(row("l4", 32, "full", 1), status="error", message=LOST.replace("l4-node", "l4-b"), host=None)
    assert failure_lines([lost, dict(ok, attempt=1)]) == ["worker lost: 1 trial retried (host l4-node)"]
    twice = dict(lost, attempt=1)  # the retry lost its worker too: that trial is an error
    assert failure_lines([lost, other, twice, dict(other, attempt=1, status="ok", message="")]) == [
        f"full: error (1 trials): {LOST}", "worker lost: 2 trials retried (hosts l4-b, l4-node)"]
    assert failure_lines([ok]) == []  # (l4-b: a row without its host column is named by its message)


def test_last_rows_keeps_the_last_row_of_each_trial_in_first_seen_order():
    a, b = row("h100", 32, "none", 0), row("h100", 32, "full", 0)
    retry = dict(a, attempt=1)
    assert last_rows([dict(a, status="error", message=LOST), b, retry]) == [retry, b]


def test_the_report_has_a_machines_section_in_the_terminal_and_report_md(two_machines, tmp_path):
    run, _, _ = two_machines
    r = CliRunner().invoke(app, ["report", str(run), "--out", str(tmp_path / "rep")])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "xm: machines" in text and "gpu-a, gpu-b" in text and "NVIDIA H100 80GB HBM3" in text
    line = ("`full` at 32 tokens × batch 1, TPOT ÷ `none`'s: on h100 (link H2D 25.1 GB/s) 1.60 [1.56, 1.64] over 5 "
            "pairs; on l4 (link H2D 12.0 GB/s) 4.10 [4.06, 4.14] over 5 pairs")
    assert f"- {line}" in text
    # the per-point tables and the advice, one per machine, each against `none` on its own machine
    assert "`full` saved 96% of device KV memory (0.0 MiB left) for +60% [+56%, +64%] TPOT" in text
    assert "`full` saved 96% of device KV memory (0.0 MiB left) for +310% [+306%, +314%] TPOT" in text
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## Machines: xm" in md and "## xm @ h100" in md and "## xm @ l4" in md
    assert "| h100 | gpu-a, gpu-b | NVIDIA H100 80GB HBM3 | 550.54 | 25.1 | 24.2 | 20 ok |" in md
    assert f"- {line.replace('[', chr(92) + '[').replace(']', chr(92) + ']')}" in md
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "<h2>Machines: xm</h2>" in page and "<td>l4-node</td>" in page


def test_text_from_the_rows_is_escaped_in_every_output(tmp_path):
    evil = "[bold]l4</td>"
    rows = [dict(r, host=evil) if r["machine"] == "l4" else r for r in rows_of_run()]
    run = write_run(tmp_path, rows)
    r = CliRunner().invoke(app, ["report", str(run), "--out", str(tmp_path / "rep")])
    assert r.exit_code == 0, r.output
    assert evil in r.output
    assert "| l4 | \\[bold\\]l4\\</td\\> |" in (tmp_path / "rep" / "report.md").read_text()
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "<td>[bold]l4&lt;/td&gt;</td>" in page and "<td>[bold]l4</td>" not in page


def test_cost_is_given_per_machine(two_machines, tmp_path):
    run, _, _ = two_machines
    r = CliRunner().invoke(app, ["cost", "--gpu-price", "2", str(run), "--out", str(tmp_path / "cost")])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert text.count("│ xm @ h100 │") == 4 and text.count("│ xm @ l4 │") == 4  # 2 prompt lengths × 2 modes
