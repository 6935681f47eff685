"""Issue 31 (the field's formats), export: `kvbench report --format llm-d` writes one llm-d Benchmark Report v0.2.1
per mode, each valid against the schema llm-d-benchmark publishes (tests/data/llmd/, with its source and commit)
and against the unit groups its pydantic model checks, with kvbench's medians in it and kvbench's own figures
under results.observability.kvbench; read back, the files give the same TTFT and TPOT medians."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from golden_run import RUN as GOLDEN, copy_run
from kvbench.analysis.cost import Prices
from kvbench.analysis.peer_cost import peer_cost_table
from kvbench.analysis.reuse_cost import reuse_cost
from kvbench.analysis.server_load import server_load_table
from kvbench.cli import app
from kvbench.errors import SymlinkRefused
from kvbench.report.llmd import llmd_reports, statistics, write_llmd
from kvbench.results.load import load_results
from kvbench.results.peers import load_peers
from fake_servers import fake_env, nothing_left_running, run, scenario  # noqa: F401

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "data" / "llmd" / "br_v0_2_1_json_schema.json")
                    .read_text())
#: The unit groups llm-d's pydantic model (schema_v0_2.py, base.py) checks per field and the JSON schema does not.
TIME, GEN_LATENCY, QUANTITY = {"ms", "s"}, {"ms/token", "s/token"}, {"count", "pixels"}
UNIT_GROUPS = {"time_to_first_token": TIME, "request_latency": TIME, "time_per_output_token": GEN_LATENCY,
               "normalized_time_per_output_token": GEN_LATENCY, "inter_token_latency": GEN_LATENCY,
               "input_length": QUANTITY, "output_length": QUANTITY, "input_token_rate": {"tokens/s"},
               "output_token_rate": {"tokens/s"}, "total_token_rate": {"tokens/s"}, "request_rate": {"queries/s"},
               "cache_hit_rate": {"percent", "fraction"}, "cpu_memory_usage": {"bytes", "MiB", "GiB"},
               "session_duration": TIME, "session_rate": {"queries/s"}, "events_per_session": QUANTITY,
               "input_tokens_per_session": QUANTITY, "output_tokens_per_session": QUANTITY}


def units_of(node, path=""):
    """Every (field, units) pair below ``node``: a Statistics object's field name and its units."""
    if isinstance(node, dict):
        if "units" in node and "mean" in node:
            yield path.rsplit(".", 1)[-1], node["units"]
        for k, v in node.items():
            if k not in ("native", "kvbench"):
                yield from units_of(v, f"{path}.{k}" if path else k)
    elif isinstance(node, list):
        for v in node:
            yield from units_of(v, path)


@pytest.fixture(scope="module")
def server_run(tmp_path_factory) -> Path:
    """2 conversations × 2 turns on the fake llama-server: none and prefix-cache."""
    tmp = tmp_path_factory.mktemp("llmd")
    with fake_env(tmp / "record.jsonl"):
        return run(tmp, scenario())


def test_statistics_gives_the_higher_percentiles_of_the_values_it_has():
    s = statistics([4.0, 1.0, None, 3.0, float("nan"), 2.0], "s", scale=10)
    assert s == {"units": "s", "mean": 25.0, "stddev": pytest.approx(11.1803, abs=1e-4), "min": 10.0, "max": 40.0,
                 "p10": 20.0, "p25": 20.0, "p50": 30.0, "p75": 40.0, "p90": 40.0, "p95": 40.0, "p99": 40.0}
    assert statistics([None], "s") is None


@pytest.mark.e2e
def test_every_report_of_a_server_run_is_valid_v0_2_1_with_the_field_units(server_run):
    reports = llmd_reports(load_results(server_run))
    assert [name for name, _ in reports] == ["fake/none", "fake/prefix-cache"]
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for name, doc in reports:
        assert not list(validator.iter_errors(doc)), name
        seen = dict(units_of(doc["results"]))
        assert {"time_to_first_token", "time_per_output_token", "inter_token_latency", "request_latency",
                "output_token_rate", "session_duration", "cache_hit_rate"} <= set(seen), name
        for field, units in seen.items():
            assert units in UNIT_GROUPS[field], (name, field, units)
        assert doc["version"] == "0.2.1"
        engine = doc["scenario"]["stack"][0]
        assert engine["standardized"]["kind"] == "inference_engine" and engine["standardized"]["tool"] == "llama.cpp"
        assert engine["native"]["config"]["argv"][0].endswith("fake_llama_server.py")


@pytest.mark.e2e
def test_a_report_holds_kvbench_s_figures_and_counts(server_run):
    results = load_results(server_run)
    reports = dict(llmd_reports(results, Prices(3.0)))
    none, cache = reports["fake/none"], reports["fake/prefix-cache"]
    agg = none["results"]["request_performance"]["aggregate"]
    assert agg["requests"]["total"] == 4 and agg["requests"]["failures"] == 0
    assert agg["requests"]["output_length"]["p50"] == 4
    sessions = none["results"]["session_performance"]["sessions"]
    assert (sessions["total"], sessions["succeeded"], sessions["total_events"]) == (2, 2, 4)
    assert sessions["events_per_session"]["mean"] == 2
    load = none["scenario"]["load"]["standardized"]
    assert load["tool"] == "kvbench" and load["source"] == "sampled" and load["concurrency"] == 1
    assert load["output_seq_len"] == {"distribution": "fixed", "value": 4}
    ext = cache["results"]["observability"]["kvbench"]
    trials = results.trials[results.trials["mode_label"] == "prefix-cache"]
    assert ext["mode"] == {"label": "prefix-cache", "kind": "prefix-cache", "options": {}}
    assert ext["cache"] == {"cached_prompt_tokens": int(trials["cached_prompt_tokens"].sum()),
                            "prompt_tokens": int(trials["prompt_tokens"].sum())}
    assert ext["exactness"]["compared"] == 4
    # the figure kvbench cost gives each side: Σ tokens ÷ Σ e2e of its requests, one at a time
    served = reuse_cost(results.trials, Prices(3.0), servers=results.servers).set_index("mode_label")
    own = {m: 3.0 / (float((t["n_output_tokens"] * t["batch_size"]).sum() / t["e2e_s"].sum()) * 3600) * 1e6
           for m, t in results.trials.groupby("mode_label")}
    none_cost = none["results"]["observability"]["kvbench"]["cost"]
    assert ext["cost"]["usd_per_million_output_tokens"] == pytest.approx(served.loc["prefix-cache",
                                                                                   "restore_usd_per_million"])
    assert none_cost["usd_per_million_output_tokens"] == pytest.approx(served.loc["prefix-cache",
                                                                                  "recompute_usd_per_million"])
    if not results.trials["machine_busy"].fillna(False).astype(bool).any():  # else cost leaves busy pairs out
        assert ext["cost"]["usd_per_million_output_tokens"] == pytest.approx(own["prefix-cache"])
        assert none_cost["usd_per_million_output_tokens"] == pytest.approx(own["none"])
    rate = cache["results"]["request_performance"]["aggregate"]["throughput"]["output_token_rate"]["mean"]
    assert 3.0 / (rate * 3600) * 1e6 > own["prefix-cache"]  # the report's own rate: wall clock, gaps too
    hit = cache["results"]["observability"]["components"][0]["aggregate"]["cache_hit_rate"]
    assert hit == {"units": "fraction", "mean": pytest.approx(ext["cache"]["cached_prompt_tokens"]
                                                              / ext["cache"]["prompt_tokens"])}


@pytest.mark.e2e
def test_exported_reports_read_back_with_kvbench_s_medians(server_run, tmp_path):
    results = load_results(server_run)
    files = write_llmd(results, tmp_path / "llmd")
    assert [f.name for f in files] == ["fake__none.json", "fake__prefix-cache.json"]
    load = server_load_table(results.trials).set_index("mode_label")
    table = peer_cost_table(load_peers(files), Prices(2.0)).set_index("label")
    for f, mode in zip(files, ("none", "prefix-cache")):
        row = table.loc[f.name]
        assert row["median_source"] == "file"
        assert row["ttft_s_p50"] == load.loc[mode, "ttft_p50_s"]
        assert row["tpot_s_p50"] == load.loc[mode, "tpot_p50_s"]
        assert row["itl_s_p50"] == load.loc[mode, "itl_p50_s"]
        assert row["output_tokens_per_s"] == pytest.approx(load.loc[mode, "throughput_wall_tokens_per_s"])


def test_an_in_process_run_gives_one_report_per_point_that_ran():
    reports = llmd_reports(load_results(GOLDEN))
    names = [n for n, _ in reports]
    assert len(names) == 20 and all("-p" in n and "-b" in n for n in names)
    assert not [n for n in names if "hf-offloaded" in n]  # skipped: it needs CUDA, nothing ran here
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for name, doc in reports:
        assert not list(validator.iter_errors(doc)), name
        assert doc["scenario"]["stack"][0]["standardized"]["tool"] == "kvbench-transformers"


@pytest.mark.e2e
def test_the_cli_writes_the_reports_and_refuses_a_symlinked_folder(server_run, tmp_path):
    r = CliRunner().invoke(app, ["report", str(server_run), "--format", "llm-d", "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["fake__none.json", "fake__prefix-cache.json"]
    assert "2 llm-d Benchmark Reports (v0.2.1) in" in r.output
    r = CliRunner().invoke(app, ["report", str(server_run), "--format", "csv"])
    assert r.exit_code == 2 and "Invalid value for '--format': Value error, 'csv' is not one of 'kvbench', 'llm-d'." \
        in " ".join(r.output.replace("│", "").split())
    os.symlink(tmp_path / "elsewhere", tmp_path / "link")
    with pytest.raises(SymlinkRefused):
        write_llmd(load_results(server_run), tmp_path / "link")
    assert not (tmp_path / "elsewhere").exists()


def test_requests_and_failures_count_sequences_at_batch_two(tmp_path):
    failed = iter(range(2))

    def edit(row):
        if row["mode_label"] == "full" and row["prompt_tokens"] == 32 and row["batch_size"] == 2 and \
                next(failed, None) is not None:
            return {k: row[k] for k in ("trial_id", "scenario", "mode", "mode_label", "mode_options", "prompt_tokens",
                                        "batch_size", "max_new_tokens", "repeat") if k in row} | {
                "status": "error", "message": "boom"}
        return row

    reports = dict(llmd_reports(load_results(copy_run(tmp_path, edit=edit))))
    doc = reports["golden/full-p32-b2"]
    requests = doc["results"]["request_performance"]["aggregate"]["requests"]
    assert (requests["total"], requests["failures"]) == (10, 4)
    assert doc["results"]["observability"]["kvbench"]["failed_requests"] == 4
    state = doc["results"]["observability"]["kvbench"]["status"]
    assert (state["result"], state["trials"]) == ("partly_failed", {"ok": 3, "error": 2})
    assert "status:partly_failed" in doc["run"]["keywords"]


def busy_slow_trial(row):
    """A golden row with its load recorded: quiet, but for the 23.6 s trial of `full` at 32 tokens × batch 2
    (repeat 0; its other repeats ran in 1.1–3.9 s), busy."""
    slow = row["mode_label"] == "full" and row["prompt_tokens"] == 32 and row["batch_size"] == 2 \
        and row["repeat"] == 0
    return row | {"machine_busy": slow, "busy_threshold_percent": 50.0}


def test_the_extension_s_cost_is_kvbench_cost_s_for_the_same_point(tmp_path):
    """Today's cost pooled the busy 23.6 s trial into Σ tokens ÷ Σ seconds: 286.91 USD per 1M against
    `kvbench cost`'s 56.08 (the median trial's throughput)."""
    from kvbench.report.cost import compute_costs

    results = load_results(copy_run(tmp_path, edit=busy_slow_trial))
    prices = Prices(2.0, host_per_gib_hour=5.0)
    reports = dict(llmd_reports(results, prices))
    costs = compute_costs(results, prices).table.set_index(["prompt_tokens", "mode_label"])
    full = reports["golden/full-p32-b2"]["results"]["observability"]["kvbench"]
    assert costs.loc[(32, "full"), "batch_size"] == 2
    assert full["cost"]["usd_per_million_output_tokens"] == pytest.approx(costs.loc[(32, "full"), "usd_per_million"],
                                                                           rel=1e-12)
    # 9.906 tokens/s, the median trial's: 56.08 USD per 1M of GPU + 0.45 for its 3.25 MiB of host KV at 5 USD/GiB-h
    assert full["cost"]["usd_per_million_output_tokens"] == pytest.approx(56.53, abs=0.01)
    assert full["cost"]["host_kv_bytes"] == 3_409_920
    assert full["cost"]["usd_ci"] == pytest.approx([costs.loc[(32, "full"), "usd_ci_low"],
                                                    costs.loc[(32, "full"), "usd_ci_high"]])
    assert full["status"] == {"result": "busy", "trials": {"ok": 5}, "busy_trials": 1, "load_unknown_trials": 0,
                              "why": ""}
    quiet = reports["golden/full-p32-b1"]["results"]["observability"]["kvbench"]["status"]
    assert quiet["result"] == "ok" and quiet["busy_trials"] == 0


def test_a_point_over_the_budget_is_exported_with_its_status_and_no_cost():
    reports = dict(llmd_reports(load_results(GOLDEN)))
    doc = reports["golden/none-p96-b2"]
    ext = doc["results"]["observability"]["kvbench"]
    assert ext["cost"]["usd_per_million_output_tokens"] is None  # was 105.47, an ordinary result
    assert (ext["status"]["result"], ext["status"]["trials"], ext["status"]["why"]) == (
        "over_budget", {"over_budget": 5}, "over the budget")
    assert "status:over_budget" in doc["run"]["keywords"]
    assert not list(jsonschema.Draft202012Validator(SCHEMA).iter_errors(doc))


@pytest.mark.e2e
def test_an_in_process_run_and_a_server_run_export_together(server_run, tmp_path):
    both = tmp_path / "both"
    both.mkdir()
    shutil.copytree(GOLDEN, both / "a")
    shutil.copytree(server_run, both / "b")
    files = write_llmd(load_results(both), tmp_path / "o")
    names = [f.name for f in files]
    assert "fake__none.json" in names and "golden__none-p32-b1.json" in names and len(names) == 22
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for f in files:
        assert not list(validator.iter_errors(json.loads(f.read_text()))), f.name


def test_two_runs_of_one_scenario_give_a_report_each(tmp_path):
    one, two = copy_run(tmp_path, "one"), copy_run(tmp_path, "two")
    names = [n for n, _ in llmd_reports(load_results([one, two]))]
    assert "golden@one/full-p32-b1" in names and "golden@two/full-p32-b1" in names and len(names) == 40


@pytest.mark.e2e
def test_a_symlinked_report_folder_and_a_file_in_the_way_are_refused(server_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(server_run, run)
    shutil.rmtree(run / "report", ignore_errors=True)
    (tmp_path / "else").mkdir()
    os.symlink(tmp_path / "else", run / "report")
    r = CliRunner().invoke(app, ["report", str(run), "--format", "llm-d"])
    assert r.exit_code == 2 and "is a symbolic link" in r.output
    assert list((tmp_path / "else").iterdir()) == []
    (tmp_path / "afile").write_text("")
    r = CliRunner().invoke(app, ["report", str(run), "--format", "llm-d", "--out", str(tmp_path / "afile")])
    assert r.exit_code == 2 and "afile is not a directory: the llm-d reports go in a directory" in r.output


@pytest.mark.e2e
def test_a_folder_of_exported_reports_reads_back_with_counts_and_hit_rate(server_run, tmp_path):
    write_llmd(load_results(server_run), tmp_path / "llmd")
    table = peer_cost_table(load_peers([tmp_path / "llmd"]), Prices(2.0)).set_index("label")
    trials = load_results(server_run).trials
    cache = trials[trials["mode_label"] == "prefix-cache"]
    row = table.loc["fake__prefix-cache.json"]
    assert row["requests"] == 4
    assert row["cached_token_share"] == pytest.approx(
        cache["cached_prompt_tokens"].sum() / cache["prompt_tokens"].sum())


@pytest.mark.e2e
def test_odd_server_records_and_runs_in_folders_of_one_name_still_export(server_run, tmp_path):
    for d in ("x", "y"):
        shutil.copytree(server_run, tmp_path / d / "run")
    meta = json.loads((tmp_path / "x" / "run" / "run.json").read_text())
    meta["servers"][0]["environment"], meta["servers"][0]["argv"] = "FOO=1", "llama-server -t 1"
    (tmp_path / "x" / "run" / "run.json").write_text(json.dumps(meta))
    reports = llmd_reports(load_results([tmp_path / "x" / "run", tmp_path / "y" / "run"]))
    names = [n for n, _ in reports]
    assert len(names) == len(set(names)) == 4 and len({d["run"]["uid"] for _, d in reports}) == 4
    native = reports[0][1]["scenario"]["stack"][0]["native"]
    assert native["args"] == {} and native["envars"] == {}


@pytest.mark.e2e
def test_a_server_run_without_its_servers_still_names_its_engine(server_run, tmp_path):
    shutil.copytree(server_run, tmp_path / "run")
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    meta["servers"] = []
    (tmp_path / "run" / "run.json").write_text(json.dumps(meta))
    (_, doc), *_ = llmd_reports(load_results(tmp_path / "run"))
    engine = doc["scenario"]["stack"][0]["standardized"]
    assert engine["tool"] == "llama.cpp" and engine["tool_version"].startswith("unknown")


def test_a_run_none_of_whose_trials_ran_exports_nothing(tmp_path):
    skipped = copy_run(tmp_path, edit=lambda r: r if r["status"] == "skipped" else None)
    r = CliRunner().invoke(app, ["report", str(skipped), "--format", "llm-d", "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "nothing to export: no trial of these runs ran" in r.output
    assert not (tmp_path / "o").exists()
    r = CliRunner().invoke(app, ["report", str(skipped), "--format", "llm-d", "--timeline", "x"])
    assert r.exit_code == 2 and "--format llm-d writes no chart" in r.output
