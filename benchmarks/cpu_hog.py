"""A competing process for honesty checks: busy loops on every CPU (or ``--cpus N``) until ``--seconds`` pass or
it is interrupted. Run ``make demo`` beside it: kvbench must record the load per trial and give no verdict from
the trials it disturbed ("inconclusive: the machine was busy during …").

    python benchmarks/cpu_hog.py --seconds 900 &  make demo
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import time


def spin(until: float) -> None:
    """Keep one CPU busy until ``until`` (``time.monotonic``)."""
    x = 0
    try:
        while time.monotonic() < until:
            for _ in range(10_000):
                x += 1
    except KeyboardInterrupt:  # terminated (SIGTERM, see _stop) or Ctrl-C: just stop
        pass


def _stop(signum: int, frame: object) -> None:
    """`kill PID` (SIGTERM) stops the busy loops too, as Ctrl-C does."""
    raise KeyboardInterrupt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=600.0, help="how long to keep the CPUs busy (default 600)")
    p.add_argument("--cpus", type=int, default=os.cpu_count() or 1, help="busy loops (default: every CPU)")
    a = p.parse_args()
    if not (a.seconds > 0) or a.cpus < 1:
        p.error("--seconds must be above 0 and --cpus at least 1")
    until = time.monotonic() + a.seconds
    workers = [mp.Process(target=spin, args=(until,), daemon=True) for _ in range(a.cpus)]
    signal.signal(signal.SIGTERM, _stop)  # before the workers start: a kill at once still stops them
    try:
        for w in workers:
            w.start()
    except KeyboardInterrupt:
        for w in workers:
            if w.pid is not None:
                w.terminate()
        raise SystemExit(143) from None
    print(f"cpu_hog: {a.cpus} busy loop(s) for {a.seconds:g} s (pid {os.getpid()})", flush=True)
    try:
        for w in workers:
            w.join()
    except KeyboardInterrupt:
        pass
    finally:
        for w in workers:
            w.terminate()
            w.join()


if __name__ == "__main__":
    main()
