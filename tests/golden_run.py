"""The committed golden run (a real `kvbench run tests/data/golden.yaml`) and copies of it edited for a test."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

GOLDEN = Path(__file__).parent / "data" / "golden"
RUN = next(p for p in sorted(GOLDEN.iterdir()) if (p / "run.json").is_file())
PER_TOKEN = 2 * 30 * 3 * 64 * 4  # SmolLM2-135M, float32: K and V × layers × kv heads × head_dim × bytes
FULL, HIER, DISK = "full", "hierarchical(window=16)", "hierarchical(window=16,host_max_tokens=16)"
DYN = "dynamic(min_window=16,max_window=48)"


def rows_of(run: Path = RUN) -> list[dict]:
    return [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines()]


def copy_run(tmp_path: Path, name: str = "b", edit=None, edit_meta=None) -> Path:
    """A copy of the golden run, its rows (and run.json) passed through the edit functions."""
    dst = tmp_path / name
    shutil.copytree(RUN, dst)
    if edit is not None:
        rows = [r for r in map(edit, rows_of(dst)) if r is not None]
        (dst / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if edit_meta is not None:
        meta = json.loads((dst / "run.json").read_text())
        edit_meta(meta)
        (dst / "run.json").write_text(json.dumps(meta))
    return dst
