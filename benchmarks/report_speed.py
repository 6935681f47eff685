"""How long `kvbench report` takes on a large result set: N synthetic trials (default 20,000; target < 5 s).

The first copy of the committed golden run (tests/data/golden) is kept as it is; the others are its rows at other
prompt lengths with their latencies jittered, so every code path runs (bootstrap intervals, baselines, the charts,
and the memory timelines of the real run's largest point, from its samples.csv). Prints the wall time of the whole
command (a fresh process, imports included) and of loading + the per-point table alone, as the median [min–max]
of --rounds runs.

    python benchmarks/report_speed.py [--trials 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "golden"


def synthesise(out: Path, n_trials: int, seed: int = 0) -> Path:
    """A run directory with ``n_trials`` rows made from the golden run's rows; returns its path."""
    src = sorted(p for p in GOLDEN.iterdir() if (p / "trials.jsonl").is_file())[0]
    rows = [json.loads(line) for line in (src / "trials.jsonl").read_text().splitlines() if line.strip()]
    rng = random.Random(seed)
    run = out / "synthetic"
    run.mkdir(parents=True)
    shutil.copy(src / "run.json", run / "run.json")
    shutil.copy(src / "samples.csv", run / "samples.csv")
    written = 0
    with (run / "trials.jsonl").open("w") as f:
        length = 0
        while written < n_trials:
            length += 1
            for row in rows:
                if written == n_trials:
                    break
                # the first copy is the real run (its trials have samples: timelines are drawn from them)
                new = dict(row) if length == 1 else dict(row, prompt_tokens=row["prompt_tokens"] * 1000 + length,
                                                         trial_id=f"{row['trial_id']}-s{length}")
                for key in ("ttft_s", "tpot_s", "e2e_s", "throughput_tokens_per_s"):
                    if isinstance(new.get(key), float):
                        new[key] *= rng.uniform(0.9, 1.1)
                f.write(json.dumps(new) + "\n")
                written += 1
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from kvbench.analysis.points import point_table
    from kvbench.results.load import load_results

    with tempfile.TemporaryDirectory(prefix="kvbench-report-speed-") as tmp:
        run = synthesise(Path(tmp), args.trials)
        kvbench = Path(sys.executable).with_name("kvbench")
        # the memory timelines a report of the real run draws: every measured mode at its largest point
        real = [json.loads(line) for line in (run / "trials.jsonl").open() if "-s" not in json.loads(line)["trial_id"]]
        timelines = [x for r in real if r["trial_id"].startswith("p96-b2-") and r["trial_id"].endswith("-r0")
                     and r["status"] in ("ok", "over_budget") for x in ("--timeline", r["trial_id"])]
        whole, table = [], []
        for i in range(args.rounds):
            t0 = time.perf_counter()
            subprocess.run([str(kvbench), "report", str(run), "--out", str(Path(tmp) / f"report{i}"), *timelines],
                           check=True, stdout=subprocess.DEVNULL)
            whole.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            results = load_results([run])
            points = point_table(results.trials)
            table.append(time.perf_counter() - t0)
        print(f"{args.trials} trials, {len(points)} points, {args.rounds} rounds")
        print(f"kvbench report (whole command): median {statistics.median(whole):.2f} s "
              f"[{min(whole):.2f}–{max(whole):.2f}]  target < 5 s")
        print(f"load + point table alone:       median {statistics.median(table):.2f} s "
              f"[{min(table):.2f}–{max(table):.2f}]")


if __name__ == "__main__":
    main()
