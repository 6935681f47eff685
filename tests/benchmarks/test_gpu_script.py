"""benchmarks/gpu.sh: its dry run takes every step of the GPU checks on the CPU with tiny shapes (the same flags as
on a GPU) and writes the results file, which this checks key by key; and the script's refusals."""

from __future__ import annotations

import json
import math
import os
import platform
import re
import subprocess
import sys

import pytest
import torch
import transformers

from conftest import ROOT
from kvbench.report.gpu_checks import KIND, SCHEMA

pytestmark = pytest.mark.e2e  # the script, and kvbench's benchmarks in subprocesses (1 to 2 minutes)

SCRIPT = ROOT / "benchmarks" / "gpu.sh"
RESULTS = ROOT / "benchmarks" / "results"
STATUSES = {"env": "ok", "nvidia-smi": "skipped", "cuda-exactness": "skipped", "cpu-tests": "collected only",
            "offload-overhead": "ok", "sampler-overhead": "ok", "host-tiers": "ok"}


def run(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env={**os.environ, "PY": sys.executable},
                          capture_output=True, text=True, timeout=timeout)


def finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def listing(folder):
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_the_dry_run_takes_every_step_on_the_cpu_and_writes_every_ratio(tmp_path):
    before = listing(RESULTS)
    r = run("--dry-run", "--out", str(tmp_path))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert listing(RESULTS) == before  # a dry run never writes into benchmarks/results
    (path,) = tmp_path.iterdir()
    doc = json.loads(path.read_text())
    assert path.name == f"gpu-{doc['date']}-cpu.json" and re.fullmatch(r"\d{4}-\d\d-\d\d", doc["date"])
    assert (doc["kind"], doc["schema"], doc["dry_run"], doc["device"]) == (KIND, SCHEMA, True, "cpu")
    assert f"gpu.sh: {path}" in r.stdout and f"{path.name}: machine" in r.stdout  # kvbench report printed it

    m, v = doc["machine"], doc["versions"]
    assert m["link_bandwidth_gbps"] is None and "no CUDA device" in m["link_note"]  # CUDA hidden, even on a GPU
    assert m["cpu_count"] >= 1 and m["memory_bytes"] > 2**30 and finite(m["memory_bandwidth_gbps"])
    assert (v["python"], v["torch"], v["transformers"]) == (platform.python_version(), torch.__version__,
                                                            transformers.__version__)
    if (ROOT / ".git").exists():  # the checkout's commit; elsewhere gpu.sh --commit names it
        assert re.fullmatch(r"[0-9a-f]{40}", v["commit"]) and isinstance(v["dirty"], bool)

    steps = {s["name"]: s for s in doc["steps"]}
    assert {k: s["status"] for k, s in steps.items()} == STATUSES
    assert all(s["exit_status"] == 0 for s in doc["steps"] if s["name"] != "nvidia-smi")
    cuda = steps["cuda-exactness"]
    assert cuda["tests"]["tests"] == cuda["tests"]["skipped"] > 0 and cuda["note"].startswith("needs a CUDA device")
    assert steps["cpu-tests"]["tests"]["tests"] == 0 and "--collect-only" in steps["cpu-tests"]["command"]
    assert "--json $WORK/offload-overhead.json" in steps["offload-overhead"]["command"]

    offload = steps["offload-overhead"]["result"]
    assert offload["model"] == "tiny-llama (random weights)" and offload["args"]["contexts"] == [64, 128]
    assert [(r["context"], r["mode"]) for r in offload["rows"]] == [
        (c, m) for c in (64, 128) for m in ("none", "full", "hierarchical(window=16)", "dynamic(min_window=16)")]
    for row in offload["rows"]:
        assert all(finite(row[k]) and row[k] > 0 for k in ("step_ms", "ratio", "ratio_min", "ratio_max",
                                                          "peak_device_kv_mib", "peak_per_two_layers"))
        assert row["ratio_min"] <= row["ratio"] <= row["ratio_max"]
        moved = row["h2d_per_history"]
        assert moved is None if row["mode"] == "none" else finite(moved) and 0 < moved < 1.1
    assert all(r["ratio"] == 1.0 for r in offload["rows"] if r["mode"] == "none")
    assert [n.split(":")[0] for n in offload["notes"]] == ["context 64", "context 128"]  # hf-offloaded needs CUDA
    assert all("hf-offloaded skipped" in n for n in offload["notes"])

    sampler = steps["sampler-overhead"]["result"]
    assert [r["what"].split(":")[0] for r in sampler["rows"]] == ["trials", "trials", "trials",
                                                                   "sampler thread CPU, % of the trial's wall time",
                                                                   "steps"]
    for row in sampler["rows"]:
        assert all(finite(row[k]) for k in ("median", "ci_low", "ci_high", "min", "max")) and row["n"] >= 5
        assert row["min"] <= row["ci_low"] <= row["median"] <= row["ci_high"] <= row["max"]
    assert sampler["notes"][0].startswith("target ≤ 1.02: ")

    tiers = {r["mode"]: r for r in steps["host-tiers"]["result"]["rows"]}
    assert list(tiers) == ["none", "full(host_dtype=float32)", "full(host_dtype=bfloat16)", "full(host_dtype=fp8)",
                           "full(host_dtype=int8)", "full(host_dtype=int8,hadamard=True)",
                           "full(k_dtype=bfloat16,v_dtype=int8)"]
    assert all(finite(r["ratio"]) and r["ratio"] > 0 for r in tiers.values()) and tiers["none"]["ratio"] == 1.0
    # bytes are exact: tiny-llama's head_dim 16 in int8 plus one float32 scale per row is 20 bytes against 64
    assert [tiers[k]["per_float32"] for k in list(tiers)[1:]] == [1.0, 0.5, 0.3125, 0.3125, 0.3125, 0.40625]
    assert tiers["full(host_dtype=bfloat16)"]["per_bfloat16"] == 1.0


def test_the_script_refuses_what_it_cannot_run(tmp_path):
    r = run("--dry", timeout=60)
    assert r.returncode == 2 and "unknown argument --dry (--dry-run, --out DIR, --commit SHA, --help)" in r.stderr
    r = run("--help", timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("kvbench's GPU checks") and "--dry-run" in r.stdout
    if not torch.cuda.is_available():
        r = run("--out", str(tmp_path), timeout=120)
        assert r.returncode == 2 and "torch sees no CUDA device; bash benchmarks/gpu.sh --dry-run" in r.stderr
        assert listing(tmp_path) == []


def test_the_results_of_a_dry_run_never_go_into_benchmarks_results(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_results.py"), str(tmp_path), str(RESULTS),
                        "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and "a dry run's figures never go into benchmarks/results" in r.stderr


def gather(work, out, *flags):
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_results.py"), str(work), str(out), *flags],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_gpu_run_stopped_midway_keeps_each_step_it_finished(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    (work / "steps.tsv").write_text(
        "env\t0\t6\tpython -m kvbench.cli env --device cuda --json\t\n"
        "nvidia-smi\t127\t0\tnvidia-smi --format=csv\t\n"
        "cuda-exactness\t1\t20\tpython -m pytest -q tests/offload/test_offload.py -k cuda\t\n"
        "offload-overhead\t124\t420\ttimeout 420 python benchmarks/offload_overhead.py\t\n"
        "host-tiers\t0\t31\tpython benchmarks/host_tiers.py\t\n")
    (work / "env.json").write_text(json.dumps({
        "cuda_device_name": "NVIDIA H200", "measured_at": "2026-12-01T10:00:00Z", "driver": "570.86.15",
        "gpus": [{"name": "NVIDIA H200", "memory_total_bytes": 150_754_820_096, "pcie_gen": 5, "pcie_width": 16}],
        "git": {"commit": None, "dirty": None, "note": "not a git checkout"},
        "link_bandwidth": {"h2d_pinned_gbps": 55.4, "d2h_pinned_gbps": 55.1}}))
    (work / "cuda-exactness.xml").write_text('<?xml version="1.0"?><testsuites><testsuite tests="12"')  # cut off
    (work / "host-tiers.json").write_text('{"rows": [{"mode": "none", ')  # cut off
    r = gather(work, out, "--commit", "0123abc")
    assert r.returncode == 1 and r.stdout == f"{out / 'gpu-2026-12-01-h200.json'}\n"  # written, then exit 1
    doc = json.loads((out / "gpu-2026-12-01-h200.json").read_text())
    assert (doc["dry_run"], doc["date"], doc["device"]) == (False, "2026-12-01", "h200")
    assert doc["versions"]["commit"] == "0123abc" and doc["versions"]["dirty"] is None
    assert doc["machine"]["gpu"] == "NVIDIA H200" and doc["machine"]["pcie_gen"] == 5
    assert doc["machine"]["link_bandwidth_gbps"] == {"h2d_pinned_gbps": 55.4, "d2h_pinned_gbps": 55.1}
    assert [(s["name"], s["status"], s["exit_status"], s["seconds"]) for s in doc["steps"]] == [
        ("env", "ok", 0, 6), ("nvidia-smi", "failed", 127, 0), ("cuda-exactness", "failed", 1, 20),
        ("offload-overhead", "timed out", 124, 420), ("host-tiers", "ok", 0, 31)]
    assert "tests" not in doc["steps"][2] and "result" not in doc["steps"][4]
    assert doc["steps"][4]["note"] == "host-tiers.json is not whole JSON: its figures are lost"
    assert gather(work, out).stdout == r.stdout  # the next step's call rewrites the same file
    again = tmp_path / "again"
    again.mkdir()
    (again / "steps.tsv").write_text("env\t0\t6\tpython -m kvbench.cli env\t\n")
    (again / "env.json").write_text((work / "env.json").read_text())
    r = gather(again, out)
    assert r.returncode == 0 and r.stdout == f"{out / 'gpu-2026-12-01-h200-2.json'}\n"  # a second run that day
