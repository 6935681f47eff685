"""Gathers what ``benchmarks/gpu.sh`` measured so far into one file, ``gpu-<date>-<device>.json``, and prints its
path. gpu.sh runs it after every step, so that a run stopped midway keeps the steps it finished.

    python benchmarks/gpu_results.py WORK OUT [--dry-run] [--commit SHA]

WORK holds the steps' own files: ``steps.tsv`` (one step a line: name, exit status or ``skipped``, seconds, the
command, a note: why it was skipped, or what it did instead), ``env.json`` (``kvbench env --json``),
``<step>.xml`` (pytest's JUnit XML) and ``<step>.json`` (a benchmark's ``--json``). The file goes into OUT, named by the day (UTC) and the GPU
(``h100``, ``h200``: the GPU preset whose NVML names match, else the name's own slug; ``cpu`` for a dry run), with
``-2``, ``-3``... where that name is taken; the name chosen is kept in ``WORK/file`` and rewritten by later calls.
Exits 1 after writing it when a step failed or timed out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from kvbench.models.gpus import GPUS, measured_here
from kvbench.report.gpu_checks import KIND, SCHEMA

#: Exit statuses of ``timeout`` when it stopped the command (TERM, then KILL).
TIMED_OUT = {124, 137}


def device_slug(env: dict, dry_run: bool) -> str:
    """``cpu`` for a dry run; else ``h200`` for an NVIDIA H200: the single-GPU preset whose NVML names match the
    CUDA device ``kvbench env`` measured, else its name in lower case with runs of other characters as ``-``
    (without ``nvidia``); ``unknown-gpu`` where ``kvbench env`` measured none."""
    name = env.get("cuda_device_name")
    if dry_run or not name:
        return "cpu" if dry_run else "unknown-gpu"
    for preset in GPUS.values():
        if preset.gpus_per_node == 1 and measured_here(preset, name):
            return preset.name
    return re.sub(r"[^a-z0-9]+", "-", name.lower().removeprefix("nvidia")).strip("-") or "gpu"


def machine(env: dict) -> dict:
    """The machine of ``kvbench env --json``: the first GPU (name, memory, PCIe link as NVML reports it), driver,
    CUDA, CPU, host memory, platform, and the measured link and memory bandwidths (None where not measured, with
    the reason)."""
    gpu = (env.get("gpus") or [{}])[0]
    memory = env.get("memory_bandwidth") or {}
    return {"gpu": env.get("cuda_device_name") or gpu.get("name"), "gpu_memory_bytes": gpu.get("memory_total_bytes"),
            "pcie_gen": gpu.get("pcie_gen"), "pcie_width": gpu.get("pcie_width"),
            "pcie_gen_max": gpu.get("pcie_gen_max"), "pcie_width_max": gpu.get("pcie_width_max"),
            "driver": env.get("driver"), "cuda": env.get("cuda"), "gpu_note": env.get("note"),
            "cpu": env.get("cpu"), "cpu_count": env.get("cpu_count"), "memory_bytes": env.get("memory_total_bytes"),
            "platform": env.get("platform"), "link_bandwidth_gbps": env.get("link_bandwidth"),
            "link_note": env.get("link_bandwidth_note"), "memory_bandwidth_gbps": memory.get("memory_gbps")}


def versions(env: dict, commit: str | None) -> dict:
    """Python, torch, transformers and kvbench with its commit: the checkout's (and whether it had changes), else
    ``commit`` as given (``dirty`` then unknown)."""
    git = env.get("git") or {}
    return {"python": env.get("python"), "torch": env.get("torch"), "transformers": env.get("transformers"),
            "kvbench": env.get("kvbench"), "commit": git.get("commit") or commit,
            "dirty": git.get("dirty") if git.get("commit") else None}


def junit_counts(xml: Path) -> tuple[dict, str | None] | None:
    """``{tests, failures, errors, skipped, passed}`` of pytest's JUnit XML file and the first skip's reason; None
    where pytest left no whole file (stopped while writing it)."""
    try:
        suite = ET.parse(xml).getroot().find("testsuite")
    except (OSError, ET.ParseError):
        return None
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    skip = suite.find("testcase/skipped")
    return counts, skip.get("message") if skip is not None else None


def step(work: Path, name: str, status: str, seconds: str, command: str, note: str) -> dict:
    """One step of ``steps.tsv`` with what it left in ``work``: pytest's counts (``tests``) or a benchmark's rows
    (``result``; left out where its file is not whole JSON). Its status: ``skipped`` (not run, or every test
    skipped: the note says why), ``timed out``, ``failed``, ``collected only`` (pytest listed the tests without
    running them), else ``ok``."""
    skipped = status == "skipped"
    entry: dict = {"name": name, "status": "skipped" if skipped else "ok",
                   "exit_status": None if skipped else int(status), "seconds": int(seconds),
                   "command": command or None, "note": note or None}
    if skipped:
        return entry
    if entry["exit_status"] in TIMED_OUT:
        entry["status"] = "timed out"
    elif entry["exit_status"]:
        entry["status"] = "failed"
    if (work / f"{name}.xml").is_file() and (junit := junit_counts(work / f"{name}.xml")):
        entry["tests"], skip = junit
        if entry["status"] == "ok" and entry["tests"]["tests"] == 0:
            entry["status"] = "collected only"
        elif entry["status"] == "ok" and entry["tests"]["skipped"] == entry["tests"]["tests"]:
            entry["status"], entry["note"] = "skipped", skip
    if (work / f"{name}.json").is_file():
        try:
            entry["result"] = json.loads((work / f"{name}.json").read_text())
        except (OSError, ValueError):
            entry["note"] = f"{name}.json is not whole JSON: its figures are lost"
    return entry


def gather(work: Path, dry_run: bool, commit: str | None) -> dict:
    """The whole file: kind and schema, whether it is a dry run, the day (UTC, of ``kvbench env``'s measurement
    where there is one), the device, machine, versions, steps. Without a readable ``env.json`` (its step failed)
    the machine and versions are unknown (None)."""
    try:
        env = json.loads((work / "env.json").read_text())
    except (OSError, ValueError):
        env = {}
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    lines = (work / "steps.tsv").read_text().splitlines()
    steps = [step(work, *line.split("\t")) for line in lines]
    return {"kind": KIND, "schema": SCHEMA, "dry_run": dry_run,
            "date": (env.get("measured_at") or now)[:10], "device": device_slug(env, dry_run),
            "machine": machine(env), "versions": versions(env, commit), "steps": steps}


def target(work: Path, out: Path, doc: dict) -> Path:
    """The file named in ``work/file``; else ``out/gpu-<date>-<device>.json``, or ``-2``, ``-3``... before
    ``.json`` where that file exists, named there for the next calls."""
    chosen = work / "file"
    if chosen.is_file():
        return Path(chosen.read_text())
    stem = f"gpu-{doc['date']}-{doc['device']}"
    path, n = out / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = out / f"{stem}-{n}.json"
    chosen.write_text(str(path))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--dry-run", action="store_true", help="mark the file a dry run (refused into benchmarks/results)")
    ap.add_argument("--commit", help="kvbench's commit where the tree is no git checkout")
    args = ap.parse_args()
    if args.dry_run and args.out.resolve() == (Path(__file__).resolve().parent / "results"):
        ap.error("a dry run's figures never go into benchmarks/results: give another --out")
    doc = gather(args.work, args.dry_run, args.commit)
    args.out.mkdir(parents=True, exist_ok=True)
    path = target(args.work, args.out, doc)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n")
    os.replace(partial, path)  # never half a file, even when the run is killed while writing
    print(path)
    if any(s["status"] in ("failed", "timed out") for s in doc["steps"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
