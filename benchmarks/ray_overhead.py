"""Per-trial overhead of the Ray executor against the local one: wall time per trial on Ray ÷ the same on the local
executor, for the same scenario's trials, measured side by side in one run of this script.

Both executors run one scenario (default: built in here, the tiny-llama preset with random weights on CPU, a
synthetic workload, prompt_tokens [16, 32] × batch_sizes [1, 2] × modes none and full, --max-new-tokens 16,
--repeats 3, warmup 1: 24 trials; --scenario FILE runs a real one instead). The script starts one local Ray
instance (``ray.init(num_cpus=2)``) that :func:`kvbench.run_scenario` then uses, and the Ray side asks for ONE
worker (``executor: {kind: ray, workers: 1}``), so both sides run the trials one at a time on this machine: what
differs is only where a trial runs (an actor process streaming its rows back to the driver, which writes them)
and, per unit of work, a remote call. No speed-up is possible here; the overhead is what is measured.

Both sides compute with ``--threads`` torch threads (default 1): the local runs through ``torch.set_num_threads``
in this process, the worker by holding that many Ray CPUs (Ray sets an actor's ``OMP_NUM_THREADS``, hence torch's
threads, to its CPUs; kvbench's default worker holds 1). One thread is the default because on a shared 2-core
machine a 2-thread trial's time swings by 2-2.5× with other processes' load (measured here: 0.35 to 0.90 s per trial
of the built-in scenario, locally, minutes apart), which would swamp the executor's overhead.

Per run, timed with ``time.perf_counter`` through :class:`kvbench.bench.run.RunProgress`:

- sweep s / trial = (exit − entry of the ``RunProgress.sweep`` context) ÷ trials written; the sweep includes
  each shape's warm-up trial (not written) on both sides alike;
- e2e s / trial = the mean of the rows' ``e2e_s`` (the trial's own prefill start → last token, timed in the
  process that runs it), and outside e2e = s/trial − e2e s/trial: what a trial costs besides its decode (warm-up,
  sampling, writing its row, and on Ray the streaming back);
- preparation = run start (the call of ``run_scenario``) → sweep entry: locally the machine probe and the model
  load; on Ray the driver's probe, the worker starting, probing its machine and loading the model.

``--pairs N`` pairs of runs alternate their order (local then ray, ray then local, ...), each into its own temporary
results directory (removed at the end on every exit path, as the Ray instance is shut down). Per pair:
ratio = ray s/trial ÷ local s/trial and overhead = (ray s/trial − local s/trial) × 1000 ms; then the median ratio
(with its min–max over pairs) and the median overhead. The load average (1 min) is printed before and after: the
trials load the machine themselves, so a value above 0.5 *before* means other work shared it (noisy ratios).

    python benchmarks/ray_overhead.py                          # 3 pairs, built-in tiny scenario
    python benchmarks/ray_overhead.py --pairs 2 --max-new-tokens 32 --repeats 2
    python benchmarks/ray_overhead.py --scenario scenarios/quick.yaml --pairs 1
"""

from __future__ import annotations

import os

os.environ.setdefault("TQDM_DISABLE", "1")  # before transformers: its GGUF loader draws a progress bar

import argparse  # noqa: E402
import contextlib  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import yaml  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import kvbench.bench.engines.transformers  # noqa: E402,F401 - imported before timing: no run pays the import
from kvbench.bench.executors.ray.connect import import_ray  # noqa: E402
from kvbench.bench.run import RunProgress, run_scenario  # noqa: E402
from kvbench.errors import ScenarioError, UserError  # noqa: E402
from kvbench.scenario import load_scenario  # noqa: E402

#: CPUs of the local Ray instance (the machine's 2 cores).
RAY_CPUS = 2
#: Longest wait for the Ray worker to start and load the model (seconds): a stuck schedule fails, never hangs.
STARTUP_TIMEOUT_S = 120.0
#: A 1-minute load average above this before the runs means other work shared the machine.
QUIET_LOAD = 0.5


def builtin_scenario(max_new_tokens: int, repeats: int) -> dict[str, Any]:
    """The default scenario (a dict as a scenario file holds it): tiny-llama, random weights, CPU, synthetic
    prompts of 16 and 32 tokens, batches 1 and 2, modes none and full, warm-up 1."""
    return {"name": "ray-overhead", "description": "benchmarks/ray_overhead.py: local vs Ray executor",
            "model": {"preset": "tiny-llama", "weights": "random"}, "device": "cpu",
            "workload": {"source": "synthetic", "n_prompts": 4, "seed": 0}, "prompt_tokens": [16, 32],
            "max_new_tokens": max_new_tokens, "batch_sizes": [1, 2], "modes": [{"kind": "none"}, {"kind": "full"}],
            "repeats": repeats, "warmup": 1, "seed": 0}


def file_scenario(path: Path, max_new_tokens: int | None, repeats: int | None) -> dict[str, Any]:
    """The scenario of ``path`` as a dict (its relative paths made absolute, so the copy runs from anywhere),
    ``max_new_tokens`` and ``repeats`` replaced where given.

    Raises:
        ScenarioError: the file is no valid scenario, or it has a ``placement`` (this compares one machine).
    """
    sc = load_scenario(path)
    if sc.placement:
        raise ScenarioError(path, [("placement", "this benchmark compares the executors on this one machine: "
                                                 "remove the placement")])
    data = sc.model_dump(mode="json")
    data.update({k: v for k, v in (("max_new_tokens", max_new_tokens), ("repeats", repeats)) if v is not None})
    return data


class Timing(RunProgress):
    """Times the sweep of one run (``sweep_start``/``sweep_end``: ``time.perf_counter`` seconds at the entry and
    exit of :meth:`RunProgress.sweep`) and keeps the run's warnings (``warnings``, each once)."""

    def __init__(self) -> None:
        self.sweep_start: float | None = None
        self.sweep_end: float | None = None
        self.warnings: list[str] = []

    def warning(self, text: str) -> None:
        """Keep ``text`` (printed once after the runs)."""
        if text not in self.warnings:
            self.warnings.append(text)

    @contextlib.contextmanager
    def sweep(self, name: str, total: int | None, done: int) -> Iterator[None]:
        """Mark the sweep's entry and exit (the exit also when the sweep raises)."""
        self.sweep_start = time.perf_counter()
        try:
            yield
        finally:
            self.sweep_end = time.perf_counter()


@dataclass
class Run:
    """One timed run: ``executor`` (local | ray), ``trials`` written, ``prepare_s`` (run start → sweep entry),
    ``sweep_s`` (sweep entry → exit), their trial ids and statuses (``statuses``: trial id → status) and
    ``e2e_s``, the mean of the rows' ``e2e_s`` (each trial's own prefill start → last token, seconds; None when no
    row has one)."""

    executor: str
    trials: int
    prepare_s: float
    sweep_s: float
    statuses: dict[str, str]
    e2e_s: float | None

    @property
    def per_trial_s(self) -> float:
        """Sweep seconds per trial written."""
        return self.sweep_s / self.trials


def timed_run(scenario: Path, out: Path, executor: str, warnings: list[str]) -> Run:
    """Run ``scenario`` once on ``executor`` into a new run under ``out``; the run's warnings go to ``warnings``.

    Raises:
        UserError: the run cannot be prepared or written (the library's message).
        KeyboardInterrupt: Ctrl-C stopped the run.
        SystemExit: a trial did not end ``ok`` (its failures named), or nothing was written.
    """
    timing = Timing()
    t0 = time.perf_counter()
    res = run_scenario(scenario, out=out, executor=executor, progress=timing)
    warnings += [w for w in timing.warnings if w not in warnings]
    if res.interrupted:
        raise KeyboardInterrupt
    if timing.sweep_start is None or timing.sweep_end is None or not res.written:
        raise SystemExit(f"{executor}: the sweep wrote no trial")
    bad = [r for r in res.rows if r["status"] != "ok"]
    if bad:
        raise SystemExit(f"{executor}: {len(bad)} trials did not end ok: " + "; ".join(res.failures))
    e2e = [r["e2e_s"] for r in res.rows if r.get("e2e_s") is not None]
    return Run(executor, res.written, timing.sweep_start - t0, timing.sweep_end - timing.sweep_start,
               {r["trial_id"]: r["status"] for r in res.rows}, statistics.fmean(e2e) if e2e else None)


def order(pair: int) -> tuple[str, str]:
    """The executors of pair ``pair`` (0-based) in the order they run: local first in even pairs, ray first in odd
    ones."""
    return ("local", "ray") if pair % 2 == 0 else ("ray", "local")


def spread(values: list[float], fmt: str) -> str:
    """``median (min–max)`` of ``values``, each formatted with ``fmt``."""
    return f"{statistics.median(values):{fmt}} (min–max {min(values):{fmt}}–{max(values):{fmt}})"


def _terminated(signum, frame):  # SIGTERM's default skips the finally blocks: turn it into SystemExit
    raise SystemExit(128 + signum)


def positive_int(text: str) -> int:
    """argparse type: an integer ≥ 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=positive_int, default=3, help="pairs of runs (local + ray), order alternating")
    ap.add_argument("--max-new-tokens", type=positive_int, default=None, help="tokens per trial (built-in: 16)")
    ap.add_argument("--repeats", type=positive_int, default=None, help="repeats per point and mode (built-in: 3)")
    ap.add_argument("--scenario", type=Path, default=None, help="a scenario file instead of the built-in one")
    ap.add_argument("--threads", type=positive_int, default=1,
                    help=f"torch threads of both sides (the worker's Ray CPUs), at most {RAY_CPUS}")
    args = ap.parse_args()
    if args.threads > RAY_CPUS:
        ap.error(f"--threads must be at most {RAY_CPUS} (the Ray instance's CPUs), got {args.threads}")
    signal.signal(signal.SIGTERM, _terminated)
    try:
        ray = import_ray()
        data = (file_scenario(args.scenario, args.max_new_tokens, args.repeats) if args.scenario else
                builtin_scenario(args.max_new_tokens or 16, args.repeats or 3))
    except UserError as exc:
        print(exc, file=sys.stderr)
        return 2
    data["executor"] = {"kind": "ray", "workers": 1, "cpus_per_worker": float(args.threads),
                        "startup_timeout_s": STARTUP_TIMEOUT_S}  # the local runs pass executor="local"
    torch.set_num_threads(args.threads)  # the local runs' threads; the worker's are its Ray CPUs
    load_before = os.getloadavg()
    runs: list[list[Run]] = []
    warnings: list[str] = []
    with tempfile.TemporaryDirectory(prefix="kvbench-ray-overhead-") as tmp:
        path = Path(tmp) / "scenario.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        ray.init(num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        try:
            print(f"scenario {data['name']}: model {data['model'].get('name') or data['model'].get('preset')}, "
                  f"device {data['device']}; ray {ray.__version__}, local instance of {RAY_CPUS} CPUs, 1 worker of "
                  f"{args.threads} CPU(s); torch threads {args.threads} on both sides")
            print(f"{'pair':>4} {'executor':<8} {'trials':>6} {'prepare s':>9} {'sweep s':>8} {'s/trial':>8} "
                  f"{'e2e s/trial':>11} {'outside e2e':>11}")
            for p in range(args.pairs):
                pair = []
                for executor in order(p):
                    run = timed_run(path, Path(tmp) / f"{p}-{executor}", executor, warnings)
                    pair.append(run)
                    e2e = (f"{run.e2e_s:>11.4f} {run.per_trial_s - run.e2e_s:>11.4f}" if run.e2e_s is not None
                           else f"{'n/a':>11} {'n/a':>11}")
                    print(f"{p:>4} {executor:<8} {run.trials:>6} {run.prepare_s:>9.2f} {run.sweep_s:>8.2f} "
                          f"{run.per_trial_s:>8.4f} {e2e}", flush=True)
                runs.append(sorted(pair, key=lambda r: r.executor))  # (local, ray)
        except UserError as exc:
            print(exc, file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        finally:
            ray.shutdown()
    load_after = os.getloadavg()
    for w in warnings:
        print(f"warning: {w}")
    same = all(local.statuses == on_ray.statuses for local, on_ray in runs)
    print(f"same trial ids and statuses on both executors in every pair: {'yes' if same else 'NO'}")
    ratios, overheads = [], []
    print(f"{'pair':>4} {'ray ÷ local s/trial':>19} {'overhead ms/trial':>17} {'ray ÷ local e2e':>15} "
          f"{'prepare ray − local s':>21}")
    for p, (local, on_ray) in enumerate(runs):
        ratios.append(on_ray.per_trial_s / local.per_trial_s)
        overheads.append((on_ray.per_trial_s - local.per_trial_s) * 1e3)
        e2e = (f"{on_ray.e2e_s / local.e2e_s:>15.3f}" if on_ray.e2e_s is not None and local.e2e_s is not None
               else f"{'n/a':>15}")
        print(f"{p:>4} {ratios[-1]:>19.3f} {overheads[-1]:>17.1f} {e2e} {on_ray.prepare_s - local.prepare_s:>21.2f}")
    print(f"median ray ÷ local wall time per trial: {spread(ratios, '.3f')} over {len(ratios)} pairs")
    print(f"median per-trial overhead: {spread(overheads, '.1f')} ms")
    noisy = load_before[0] > QUIET_LOAD
    print(f"load average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after"
          + (f": above {QUIET_LOAD} before the runs, other work shared the machine (noisy ratios)" if noisy else ""))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
