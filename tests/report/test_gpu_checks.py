"""`kvbench report` on the results file of benchmarks/gpu.sh (kvbench.report.gpu_checks): the committed file of a
dry run (`bash benchmarks/gpu.sh --dry-run`), a GPU run's machine made from it, and files it refuses."""

from __future__ import annotations

import copy
import json

import pytest
from typer.testing import CliRunner

from conftest import ROOT
from kvbench.cli import app
from kvbench.errors import BadFile
from kvbench.report.gpu_checks import gpu_check_tables, machine_table, read_gpu_checks, result_tables, steps_table

DRY_RUN = ROOT / "tests" / "data" / "gpu_checks" / "gpu-2026-12-06-cpu.json"


@pytest.fixture
def doc():
    return read_gpu_checks(DRY_RUN)


def rows(frame) -> dict[str, str]:
    return dict(zip(frame["what"], frame["value"]))


def test_the_machine_of_a_dry_run_says_what_was_not_measured(doc):
    m = rows(machine_table(doc))
    assert m["GPU"] == "NVML unavailable: NVML Shared Library Not Found" and m["PCIe link"] == "-"
    assert m["driver, CUDA"] == "-, -" and m["CPU"] == "AMD EPYC, 2 threads, 23.5 GiB"
    assert m["link"] == "no CUDA device: host↔device bandwidth not measured"
    assert m["memory bandwidth"] == "7.966 GB/s read + write"
    assert (m["python"], m["torch"], m["transformers"], m["kvbench"]) == ("3.11.7", "2.13.0+cpu", "5.25.0", "0.1.0")
    assert m["commit"] == "9ce2ea0b69de213a9bd1d5e5e46cf8e52baa4b85" and m["dry run"] == "yes"


def test_the_machine_of_a_gpu_run_gives_its_link(doc):
    run = copy.deepcopy(doc)
    run["dry_run"] = False
    run["machine"].update(gpu="NVIDIA H200", gpu_memory_bytes=150_754_820_096, pcie_gen=5, pcie_width=16,
                          pcie_gen_max=5, pcie_width_max=16, driver="570.86.15", cuda="12.8",
                          link_bandwidth_gbps={"h2d_pinned_gbps": 55.4, "d2h_pinned_gbps": 55.1,
                                               "h2d_pageable_gbps": 9.87})
    run["versions"].update(commit="0123abc", dirty=None)  # named by gpu.sh --commit: changes unknown
    m = rows(machine_table(run))
    assert m["GPU"] == "NVIDIA H200, 140.4 GiB" and m["PCIe link"] == "gen 5 x16 (max gen 5 x16)"
    assert m["driver, CUDA"] == "570.86.15, 12.8" and "link" not in m
    assert (m["link h2d pinned"], m["link d2h pinned"], m["link h2d pageable"]) == ("55.4 GB/s", "55.1 GB/s",
                                                                                  "9.870 GB/s")
    assert m["commit"] == "0123abc" and m["dry run"] == "no"
    assert gpu_check_tables(run, "gpu-x-h200.json")[0].caption == "GPU checks, measured"


def test_every_step_has_its_status_and_tests(doc):
    steps = steps_table(doc)
    assert steps.to_dict("records")[:4] == [
        {"step": "env", "status": "ok", "seconds": "7", "tests": "-", "note": "-"},
        {"step": "nvidia-smi", "status": "skipped", "seconds": "0", "tests": "-",
         "note": "needs an NVIDIA driver; kvbench env gives the GPU's name, memory, driver and PCIe link"},
        {"step": "cuda-exactness", "status": "skipped", "seconds": "8", "tests": "0 passed, 12 skipped",
         "note": "needs a CUDA device (benchmarks/gpu.sh runs it)"},
        {"step": "cpu-tests", "status": "collected only", "seconds": "9", "tests": "none run",
         "note": "collected, not run: the test suite runs them on the CPU"}]
    assert list(steps["status"][4:]) == ["ok", "ok", "ok"]


def test_each_benchmark_is_a_table_of_its_rows(doc):
    offload, sampler, tiers = result_tables(doc)
    assert offload.title == "offload-overhead: tiny-llama (random weights)"
    assert offload.caption.startswith("context 64: hf-offloaded skipped: hf-offloaded needs a CUDA device")
    assert list(offload.frame.columns) == ["context", "mode", "step_ms", "ratio", "ratio_min", "ratio_max",
                                           "h2d_mib_per_step", "h2d_per_history", "peak_device_kv_mib",
                                           "peak_per_two_layers"]
    none = offload.frame.iloc[0]
    assert (none["context"], none["mode"], none["ratio"], none["h2d_per_history"]) == ("64", "none", "1.000", "-")
    assert list(offload.frame["mode"][:4]) == ["none", "full", "hierarchical(window=16)", "dynamic(min_window=16)"]
    assert sampler.title == "sampler-overhead: tiny-llama (random weights)" and sampler.caption.startswith("target ≤")
    assert list(sampler.frame["n"]) == ["5", "5", "5", "5", "5"]
    assert list(tiers.frame["per_float32"]) == ["-", "1.000", "0.500", "0.312", "0.312", "0.312", "0.406"]


def test_kvbench_report_prints_the_tables_and_writes_nothing(tmp_path):
    path = tmp_path / DRY_RUN.name
    path.write_bytes(DRY_RUN.read_bytes())
    r = CliRunner().invoke(app, ["report", str(path)])
    assert r.exit_code == 0, r.output
    for title in ("machine", "steps", "offload-overhead: tiny-llama (random weights)",
                  "sampler-overhead: tiny-llama (random weights)", "host-tiers: tiny-llama (random weights)"):
        assert title in r.output
    assert "GPU checks, dry run on the CPU" in r.output and "0 passed, 12 skipped" in r.output
    assert [p.name for p in tmp_path.iterdir()] == [DRY_RUN.name]


@pytest.mark.parametrize("change,error", [
    (lambda d: d.update(kind="kvbench-run"), "not a file of kvbench's GPU checks (kind 'kvbench-gpu-checks')"),
    (lambda d: d.update(schema=2), "GPU checks of schema 2; this kvbench reads schema 1 to 1"),
    (lambda d: d.update(schema=True), "GPU checks of schema True"),
    (lambda d: d.pop("machine"), "'machine' is not an object"),
    (lambda d: d.update(steps={}), "'steps' is not a list"),
    (lambda d: d["steps"].append("env"), "a step is not an object"),
])
def test_a_file_that_is_not_the_gpu_checks_is_refused(doc, tmp_path, change, error):
    change(doc)
    path = tmp_path / "gpu-bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(BadFile, match=error.replace("(", r"\(").replace(")", r"\)")):
        read_gpu_checks(path)
    r = CliRunner().invoke(app, ["report", str(path)])
    assert r.exit_code == 2 and error in r.output


def test_only_files_named_as_gpu_sh_names_them_are_taken_for_gpu_checks(tmp_path):
    from kvbench.report.gpu_checks import is_gpu_checks

    assert is_gpu_checks(DRY_RUN) and is_gpu_checks(tmp_path / "gpu-2026-12-07-h100.json")
    assert not is_gpu_checks(ROOT / "tests" / "data" / "peers" / "vllm" / "cache.json")  # vllm bench serve's
    (tmp_path / "gpu-dir.json").mkdir()
    assert not is_gpu_checks(tmp_path / "gpu-dir.json") and not is_gpu_checks(tmp_path / "gpu-x.jsonl")


def test_odd_figures_are_shown_as_text_not_a_crash(doc, tmp_path):
    doc["machine"].update(gpu=["a", "list"], gpu_memory_bytes="lots", link_bandwidth_gbps={"h2d_pinned_gbps": None})
    doc["steps"][2]["tests"] = "twelve"
    doc["steps"][4]["result"]["rows"] = [{"mode": {"odd": 1}, "ratio": float("nan")}, "not a row"]
    for dirty in ([1], {}, "yes"):  # only true says the tree had changes; an unhashable value is no crash
        doc["versions"]["dirty"] = dirty
        assert "(with changes)" not in str(machine_table(doc).values.tolist())
    m = rows(machine_table(doc))
    assert m["GPU"] == "['a', 'list'], -" and m["link h2d pinned"] == "- GB/s"
    assert steps_table(doc)["tests"][2] == "-"
    assert result_tables(doc)[0].frame.to_dict("records") == [{"mode": "{'odd': 1}", "ratio": "-"}]


@pytest.mark.parametrize("args,error", [
    (["--out", "x"], "--out, --timeline and --format apply to runs: a file of GPU checks (.json) is only printed"),
    (["--format", "llm-d"], "--out, --timeline and --format apply to runs"),
    ([str(ROOT / "tests" / "data" / "golden")], "give files of GPU checks (.json) or runs, not both"),
])
def test_a_file_of_gpu_checks_is_only_printed_alone(args, error):
    r = CliRunner().invoke(app, ["report", str(DRY_RUN), *args])
    assert r.exit_code == 2 and error in r.output
