"""How fast and how lean `kvbench simulate`'s one pass is (targets: the Mooncake conversation trace's whole curve
in under 5 s on one core; a 1,000,000-request trace in under 60 s and under 2 GiB of RAM).

Each measurement runs in a fresh process pinned to one CPU core (imports, reading the file and numba's compile
included) and prints its wall time, its peak resident memory and its rates. Side by side, on the same trace and
core, it times a direct simulation of one capacity (an ordered-dict LRU, the definition itself) and checks that
the one pass gives the same hit rates at those capacities: the ratio says what one pass over every capacity costs
against simulating a single one.

    python benchmarks/trace_sim.py [--trace PATH] [--requests 1000000] [--seed 1] [--copies 80]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = Path(os.environ.get("KVBENCH_TRACE", ROOT.parent / "shared" / "data" / "mooncake" / "conversation_trace.jsonl"))

#: What the child runs: one pass (every capacity), or a direct LRU at the capacities given; prints one JSON line.
CHILD = r"""
import json, os, resource, sys, time
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
start = time.perf_counter()
from collections import OrderedDict
from kvbench.traces.read import read_trace
from kvbench.traces.simulate import simulate
path, kind, caps = sys.argv[1], sys.argv[2], [int(c) for c in sys.argv[3].split(",")]
trace = read_trace(path, max_bytes=1 << 30)
read_s = time.perf_counter() - start
if kind == "one-pass":
    curve = simulate(trace)
    blocks = [float(b) for b in curve.rates(caps)[0]]
else:
    blocks = []
    for cap in caps:
        lru, hit = OrderedDict(), 0
        for i in range(trace.n_requests):
            ids = trace.block_ids[trace.offsets[i]:trace.offsets[i + 1]].tolist()
            for b in ids:
                if b not in lru:
                    break
                hit += 1
            for b in ids:
                lru[b] = None
                lru.move_to_end(b)
            while len(lru) > cap:
                lru.popitem(last=False)
        blocks.append(hit / trace.n_visits)
print(json.dumps({"wall_s": time.perf_counter() - start, "read_s": read_s, "requests": trace.n_requests,
                  "visits": trace.n_visits, "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "hit_rate_blocks": blocks}))
"""


def measure(path: Path, kind: str, caps: list[int]) -> dict:
    """One child process's figures (see :data:`CHILD`)."""
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), kind, ",".join(map(str, caps))], cwd=ROOT,
                          capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return json.loads(done.stdout.strip().splitlines()[-1])


def line(name: str, r: dict) -> str:
    return (f"{name}: {r['wall_s']:.2f} s wall ({r['read_s']:.2f} s reading and imports), peak RSS "
            f"{r['rss_mib']:,.0f} MiB; {r['requests']:,} requests, {r['visits']:,} block visits: "
            f"{r['visits'] / r['wall_s'] / 1e6:.2f} M visits/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--copies", type=int, default=80)
    args = ap.parse_args()
    caps = [10_000, 100_000]
    print(f"one core of {os.cpu_count()} (pinned); each figure a fresh process, imports and numba's compile in it")
    fast = measure(args.trace, "one-pass", caps)
    slow = measure(args.trace, "direct", caps)
    print(line("one pass, every capacity", fast))
    print(line(f"direct LRU at {len(caps)} capacities", slow))
    same = all(abs(a - b) < 1e-12 for a, b in zip(fast["hit_rate_blocks"], slow["hit_rate_blocks"]))
    print(f"hit rate of blocks at {caps}: one pass {fast['hit_rate_blocks']}, direct {slow['hit_rate_blocks']}: "
          f"{'equal' if same else 'DIFFERENT'}")
    print(f"ratio: every capacity in one pass / {len(caps)} capacities simulated directly = "
          f"{fast['wall_s'] / slow['wall_s']:.2f}; target under 5 s: {fast['wall_s']:.2f} s "
          f"({'met' if fast['wall_s'] < 5 else 'NOT met'})")
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "big.jsonl"
        subprocess.run([sys.executable, "-m", "kvbench", "trace", "synthesize", str(args.trace), "--requests",
                        str(args.requests), "--copies", str(args.copies), "--seed", str(args.seed), "--out",
                        str(big)], cwd=ROOT, check=True, capture_output=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
        print(f"synthesized: {args.requests:,} requests, seed {args.seed}, {args.copies} copies, "
              f"{big.stat().st_size / 2**20:,.0f} MiB of JSONL")
        r = measure(big, "one-pass", caps)
    print(line("one pass over the synthesized trace", r))
    print(f"targets: under 60 s ({r['wall_s']:.1f} s: {'met' if r['wall_s'] < 60 else 'NOT met'}), under 2 GiB "
          f"({r['rss_mib']:,.0f} MiB: {'met' if r['rss_mib'] < 2048 else 'NOT met'})")


if __name__ == "__main__":
    main()
