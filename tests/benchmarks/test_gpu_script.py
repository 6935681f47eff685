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

import torch
import transformers

from conftest import ROOT
from kvbench.report.gpu_checks import KIND, SCHEMA

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
