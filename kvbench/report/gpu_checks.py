"""The file of kvbench's GPU checks (``benchmarks/gpu.sh`` writes ``gpu-<date>-<device>.json``: the machine, the
versions, and each step's status, test counts and figures), read back as tables of text cells for ``kvbench
report``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from kvbench.errors import BadFile
from kvbench.report.format import GIB
from kvbench.safe_read import read_json_file

#: The ``kind`` of the file, and the newest ``schema`` this reader knows.
KIND = "kvbench-gpu-checks"
SCHEMA = 1
#: A file of GPU checks larger than this (bytes) is refused: a real one holds a few dozen rows (some 20 KB).
MAX_BYTES = 4 << 20


#: Columns of labels rather than figures: left-aligned, and those of sentences may wrap.
LABELS = ("what", "value", "step", "status", "tests", "note", "context", "mode")
WRAPPING = ("value", "note", "mode")


@dataclass
class CheckTable:
    """One table of the GPU checks: ``title``, ``caption`` (notes of the step, may be empty) and ``frame`` of text
    cells; its columns named in :data:`LABELS` are labels, the others figures."""

    title: str
    caption: str
    frame: pd.DataFrame


def is_gpu_checks(path: Path) -> bool:
    """Whether ``path`` names a file of GPU checks rather than a run: a ``gpu-*.json`` file, as ``gpu.sh`` names
    them (runs are folders or ``trials.jsonl`` files; other tools' ``.json`` results are refused by the run
    loader, which names the tool and the commands that read them)."""
    return path.name.startswith("gpu-") and path.suffix == ".json" and not path.is_dir()


def read_gpu_checks(path: Path) -> dict[str, Any]:
    """The GPU checks in ``path``.

    Raises:
        BadFile: unreadable or not JSON (:func:`kvbench.safe_read.read_json_file`), not of :data:`KIND`, of a newer
            schema than :data:`SCHEMA`, or without its ``machine``, ``versions`` and ``steps``.
    """
    doc = read_json_file(path, MAX_BYTES)
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise BadFile(f"{path}: not a file of kvbench's GPU checks (kind {KIND!r}): kvbench report reads those, run "
                      "folders and trials.jsonl files")
    schema = doc.get("schema")
    if isinstance(schema, bool) or not isinstance(schema, int) or not 1 <= schema <= SCHEMA:
        raise BadFile(f"{path}: GPU checks of schema {schema!r}; this kvbench reads schema 1 to {SCHEMA}")
    for key, kind in (("machine", dict), ("versions", dict), ("steps", list)):
        if not isinstance(doc.get(key), kind):
            raise BadFile(f"{path}: {key!r} is not a{'n object' if kind is dict else ' list'}")
    if not all(isinstance(s, dict) for s in doc["steps"]):
        raise BadFile(f"{path}: a step is not an object")
    return doc


def cell(v: Any) -> str:
    """A figure as text: ``-`` for None and NaN, yes/no, whole numbers with thousands separators, other numbers
    with three decimals below 10 and one from there."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.1f}"
    return str(v)


def _gib(v: Any) -> str:
    return f"{v / GIB:,.1f} GiB" if isinstance(v, (int, float)) and not isinstance(v, bool) else "-"


def machine_table(doc: dict[str, Any]) -> pd.DataFrame:
    """``what``/``value`` rows: the GPU with its memory and PCIe link (current, and the most it can do), driver,
    CUDA, CPU, host memory, measured link bandwidths (or why none), the device's memory bandwidth, the versions
    and commit, the date and whether it was a dry run."""
    m, v = doc["machine"], doc["versions"]
    link = m.get("link_bandwidth_gbps")
    pcie = (f"gen {m.get('pcie_gen')} x{m.get('pcie_width')} (max gen {m.get('pcie_gen_max')} "
            f"x{m.get('pcie_width_max')})" if m.get("pcie_gen") else "-")
    gpu = f"{cell(m.get('gpu'))}, {_gib(m.get('gpu_memory_bytes'))}" if m.get("gpu") else cell(m.get("gpu_note"))
    rows = [("GPU", gpu), ("PCIe link", pcie), ("driver, CUDA", f"{cell(m.get('driver'))}, {cell(m.get('cuda'))}"),
            ("CPU", f"{cell(m.get('cpu'))}, {cell(m.get('cpu_count'))} threads, {_gib(m.get('memory_bytes'))}"),
            ("platform", cell(m.get("platform")))]
    if isinstance(link, dict) and link:
        rows += [(f"link {k.removesuffix('_gbps').replace('_', ' ')}", f"{cell(g)} GB/s") for k, g in link.items()]
    else:
        rows.append(("link", cell(m.get("link_note"))))
    rows.append(("memory bandwidth", f"{cell(m.get('memory_bandwidth_gbps'))} GB/s read + write"))
    rows += [(k, cell(v.get(k))) for k in ("python", "torch", "transformers", "kvbench")]
    dirty = " (with changes)" if v.get("dirty") is True else ""
    rows += [("commit", f"{cell(v.get('commit'))}{dirty}"), ("date", cell(doc.get("date"))),
             ("dry run", cell(bool(doc.get("dry_run"))))]
    return pd.DataFrame(rows, columns=["what", "value"])


def _tests(counts: Any) -> str:
    if not isinstance(counts, dict):
        return "-"
    passed = counts.get("passed")
    parts = [f"{cell(counts.get(k))} {word}" for k, word in (("failures", "failed"), ("errors", "errors"),
                                                               ("skipped", "skipped")) if counts.get(k)]
    return ", ".join([f"{cell(passed)} passed", *parts]) if passed or parts else "none run"


def steps_table(doc: dict[str, Any]) -> pd.DataFrame:
    """One row per step: its name, status (ok, failed, timed out, skipped, collected only), seconds, the tests
    pytest counted and the note (why it was skipped, or what the dry run did instead)."""
    return pd.DataFrame([(cell(s.get("name")), cell(s.get("status")), cell(s.get("seconds")), _tests(s.get("tests")),
                          cell(s.get("note"))) for s in doc["steps"]],
                        columns=["step", "status", "seconds", "tests", "note"])


def result_tables(doc: dict[str, Any]) -> list[CheckTable]:
    """One table per step that wrote figures: its rows as the benchmark wrote them, titled by the step and model,
    captioned by its notes."""
    out = []
    for s in doc["steps"]:
        result = s.get("result")
        if not isinstance(result, dict) or not isinstance(result.get("rows"), list) or not result["rows"]:
            continue
        rows = [r for r in result["rows"] if isinstance(r, dict)]
        frame = pd.DataFrame(rows).astype(object).map(cell) if rows else pd.DataFrame()
        notes = result.get("notes") if isinstance(result.get("notes"), list) else []
        out.append(CheckTable(f"{cell(s.get('name'))}: {cell(result.get('model'))}", "; ".join(map(cell, notes)),
                              frame))
    return out


def gpu_check_tables(doc: dict[str, Any], name: str) -> list[CheckTable]:
    """Every table of a file of GPU checks called ``name``: the machine, the steps, then each step's figures."""
    kind = "dry run on the CPU" if doc.get("dry_run") else "measured"
    return [CheckTable(f"{name}: machine", f"GPU checks, {kind}", machine_table(doc)),
            CheckTable(f"{name}: steps", "", steps_table(doc)), *result_tables(doc)]


__all__ = ["KIND", "LABELS", "SCHEMA", "WRAPPING", "CheckTable", "cell", "gpu_check_tables", "is_gpu_checks",
           "machine_table", "read_gpu_checks", "result_tables", "steps_table"]
