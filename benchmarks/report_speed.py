"""How long `kvbench report` takes on a large result set: N synthetic trials (default 20,000; target < 5 s).

The first copy of the committed golden run (tests/data/golden) is kept as it is; the others are its rows at other
prompt lengths with their latencies jittered, so every code path runs (bootstrap intervals, baselines, the charts,
and the memory timelines of the real run's largest point, from its samples.csv). Prints the wall time of the whole
command (a fresh process, imports included) and of loading + the per-point table alone, as the median [min–max]
of --rounds runs. With --pool, each round runs the command twice, side by side in alternating order: with its
chart pool (forked workers, as kvbench runs it) and with the charts drawn in its own process; it prints both and
the paired ratio (in-process ÷ pool) per round.

    python benchmarks/report_speed.py [--trials 20000] [--rounds 3] [--pool]
"""

from __future__ import annotations

import argparse
import json
import os
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


#: ``kvbench`` with its chart pool replaced by the in-process stand-in (the charts drawn in the report's process).
IN_PROCESS = ("import kvbench.report.chart_pool as c; c.chart_pool = c._InProcess; "
              "from kvbench.cli import app; app(prog_name='kvbench')")


def spread(label: str, seconds: list[float]) -> str:
    """``label: median M s [min–max]``."""
    return f"{label}median {statistics.median(seconds):.2f} s [{min(seconds):.2f}–{max(seconds):.2f}]"


def compare_pool(run: Path, tmp: Path, timelines: list[str], rounds: int) -> None:
    """Time the whole command with its chart pool and in-process, alternating which goes first each round."""
    commands = {"pool": [str(Path(sys.executable).with_name("kvbench"))],
                "in-process": [sys.executable, "-c", IN_PROCESS]}
    times: dict[str, list[float]] = {k: [] for k in commands}
    for i in range(rounds):
        for name in (("pool", "in-process") if i % 2 == 0 else ("in-process", "pool")):
            t0 = time.perf_counter()
            subprocess.run([*commands[name], "report", str(run), "--out", str(tmp / f"{name}{i}"), *timelines],
                           check=True, stdout=subprocess.DEVNULL)
            times[name].append(time.perf_counter() - t0)
    ratios = [b / a for a, b in zip(times["pool"], times["in-process"])]
    print(spread("with the chart pool:   ", times["pool"]))
    print(spread("charts in-process:     ", times["in-process"]))
    print(f"in-process / pool:      median {statistics.median(ratios):.3f} [{min(ratios):.3f}–{max(ratios):.3f}] "
          f"(per round: {', '.join(f'{r:.3f}' for r in ratios)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pool", action="store_true", help="the command with and without its chart pool, side by side")
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
        if args.pool:
            print(f"{args.trials} trials, {args.rounds} rounds, {os.cpu_count()} CPUs")
            compare_pool(run, Path(tmp), timelines, args.rounds)
            return
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
