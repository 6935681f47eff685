"""Cost of the background sampler at 10 ms, measured two ways side by side. Target (issue 4): ≤ 1.02.

1. **Trials.** The same trial with sampling every 10 ms ("on") and with sampling off, interleaved: each round runs
   both back to back, the order alternating round by round, and the ratio on/off is taken within the round, which
   cancels the machine's drift between rounds. "Off" still reads once at the start and once at the end (the
   prefill/decode mark reads nothing). On a shared VM e2e times vary by ±25% from trial to trial, so the interval
   is several % wide.
2. **Steps.** Inside longer trials (sampler running) the sampler is paused and resumed between decode steps in an
   on, off, off, on, ... pattern, and each pair of adjacent steps gives one ratio on/off. Adjacent steps share the
   machine's state far more closely than trials do, so this interval is much narrower. It slightly understates the
   cost: a step "off" still holds one wake-up of the thread (the sleep under way when it was paused, which ends
   without a reading) against about one per interval in a step "on".

Each ratio is summarised by its median and a distribution-free 95% confidence interval (order statistics at
binomial ranks; Conover, *Practical Nonparametric Statistics*, 3rd ed., §3.2). Also printed: the sampler thread's
own CPU time in the "on" trials (``time.thread_time``: wake-ups, readings, the KV probe) as a share of the trial's
wall time, which is what sampling takes from a trial that keeps every core busy.

    python benchmarks/sampler_overhead.py                     # SmolLM2-135M, CPU: 128-token prompt; 16 and 64 new
    python benchmarks/sampler_overhead.py --preset tiny-llama --rounds 6 --step-trials 2
"""

from __future__ import annotations

import os

os.environ.setdefault("TQDM_DISABLE", "1")  # before transformers: its GGUF loader draws a progress bar

import argparse  # noqa: E402
import statistics  # noqa: E402

import numpy as np  # noqa: E402

from kvbench.analysis.intervals import MIN_INTERVAL_VALUES, median_interval  # noqa: E402
from kvbench.models import LoadedModel, load  # noqa: E402
from kvbench.bench.telemetry.monitor import Sampler  # noqa: E402
from kvbench.offload.modes import make_cache  # noqa: E402
from kvbench.bench.engines.decode import Clock, greedy_decode, left_pad  # noqa: E402
from kvbench.bench.engines.transformers import TransformersEngine  # noqa: E402
from kvbench.bench.executors.local import LocalExecutor  # noqa: E402
from kvbench.bench.trial import TrialSpec  # noqa: E402
from kvbench.scenario import ScenarioError, parse_scenario  # noqa: E402
from kvbench.workloads import SyntheticSource  # noqa: E402
from bench_json import write_result  # noqa: E402

TARGET = 1.02
#: Sampler state for decode forwards 1, 2, 3, ...: pairs (1, 2), (3, 4), ... alternate on-off and off-on, so a
#: steady drift along the trial cancels out.
STEP_PATTERN = (True, False, False, True)


def median_ci(values: list[float]) -> tuple[float, float] | None:
    """95% interval of the median of ``values``: kvbench's own (interpolated order statistics,
    :func:`kvbench.analysis.intervals.median_interval`); None with fewer than 5 values."""
    if len(values) < MIN_INTERVAL_VALUES:
        return None
    lo, hi = median_interval(np.sort(np.asarray(values, dtype=float))[None, :])
    return float(lo[0]), float(hi[0])


def figures(what: str, values: list[float]) -> dict:
    """One row of the ``--json`` file: ``what`` with the median of ``values``, its 95% interval (None with too
    few values), min, max and count."""
    ci = median_ci(values)
    return {"what": what, "median": statistics.median(values), "ci_low": ci[0] if ci else None,
            "ci_high": ci[1] if ci else None, "min": min(values), "max": max(values), "n": len(values)}


def summary(values: list[float], fmt: str = ".3f") -> str:
    """``median (95% CI lo–hi; min–max)`` of ``values``, each formatted with ``fmt``."""
    f = figures("", values)
    ci_text = (f"95% CI {f['ci_low']:{fmt}}–{f['ci_high']:{fmt}}" if f["ci_low"] is not None
               else "too few for a 95% CI")
    return f"{f['median']:{fmt}} ({ci_text}; min–max {f['min']:{fmt}}–{f['max']:{fmt}})"


def positive_int(text: str) -> int:
    """argparse type: an integer ≥ 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def interleaved_trials(runners: dict[str, LocalExecutor], trial: TrialSpec, rounds: int) -> dict[str, list[dict]]:
    """Rows of ``rounds`` interleaved trials per runner ("on", "off"), the order alternating each round."""
    runners["off"].run(trial)  # warm-up, not counted
    rows: dict[str, list[dict]] = {"off": [], "on": []}
    for r in range(rounds):
        for k in (("on", "off") if r % 2 == 0 else ("off", "on")):
            row = runners[k].run(trial)
            if row["status"] != "ok":
                raise SystemExit(f"trial failed ({row['status']}): {row['message']}")
            rows[k].append(row)
    return rows


def step_ratios(m: LoadedModel, source: SyntheticSource, sampler: Sampler, prompt_tokens: int, new_tokens: int,
                trials: int) -> list[float]:
    """Ratios on/off of adjacent decode steps (inter-token gaps, seconds) with the sampler resumed or paused
    before each forward as :data:`STEP_PATTERN` says; ``trials`` greedy decodes of ``new_tokens`` tokens."""
    clock = Clock(m.device)
    ratios: list[float] = []
    for rep in range(-1, trials):  # rep -1: warm-up, not counted
        input_ids, mask = left_pad(source.batch(prompt_tokens, 1, 0), 0)
        cache = make_cache("none", m.model.config, m.device)
        calls = iter(range(new_tokens))

        def before_next_forward() -> None:  # called after token k; forward k + 1 follows
            k = next(calls)
            (sampler.resume if STEP_PATTERN[k % len(STEP_PATTERN)] else sampler.pause)()

        with sampler.trial(f"steps-{rep}"):
            _, _, times = greedy_decode(m.model, input_ids.to(m.device), mask.to(m.device), cache, new_tokens,
                                        clock, after_step=before_next_forward)
        if rep < 0:
            continue
        gaps = [b - a for a, b in zip(times, times[1:])]  # gaps[j - 1]: forward j
        for j in range(1, len(gaps), 2):  # forwards j, j + 1 (1-based)
            first, second = gaps[j - 1], gaps[j]
            on_first = STEP_PATTERN[(j - 1) % len(STEP_PATTERN)]
            ratios.append(first / second if on_first else second / first)
    return ratios


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-tokens", type=positive_int, default=128)
    ap.add_argument("--new-tokens", type=positive_int, default=16, help="per trial of the trial comparison")
    ap.add_argument("--rounds", type=positive_int, default=40, help="rounds of the trial comparison")
    ap.add_argument("--step-tokens", type=positive_int, default=64, help="per trial of the step comparison")
    ap.add_argument("--step-trials", type=positive_int, default=30, help="trials of the step comparison")
    ap.add_argument("--interval-ms", type=positive_int, default=10)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--preset", default=None, help="random-weight preset instead of the SmolLM2 GGUF")
    ap.add_argument("--json", metavar="PATH", help="also write the ratios to PATH (benchmarks/gpu.sh)")
    args = ap.parse_args()
    if args.step_tokens < 3:
        ap.error("--step-tokens must be at least 3 (two decode steps make one pair)")
    if args.new_tokens < 2:
        ap.error("--new-tokens must be at least 2 (a trial needs a decode step after the prefill's token)")

    model = {"preset": args.preset, "weights": "random"} if args.preset else "smollm2-135m"
    try:
        s = parse_scenario({"name": "sampler-overhead", "model": model, "device": args.device,
                            "workload": {"source": "synthetic", "n_prompts": 1},
                            "prompt_tokens": [args.prompt_tokens], "max_new_tokens": args.new_tokens,
                            "batch_sizes": [1], "modes": [{"kind": "none"}], "repeats": 1, "warmup": 0})
        m = load(s.model, args.device)
    except (ScenarioError, ValueError) as exc:
        ap.error(str(exc))
    longest = args.prompt_tokens + max(args.new_tokens, args.step_tokens)
    if longest > m.shape.max_positions:
        ap.error(f"--prompt-tokens {args.prompt_tokens} + {max(args.new_tokens, args.step_tokens)} new tokens is "
                 f"beyond {s.model.label}'s {m.shape.max_positions} positions")
    source = SyntheticSource(m.shape.vocab_size, seed=0, n_prompts=1)
    samplers = {"off": Sampler(m.device, 0), "on": Sampler(m.device, args.interval_ms)}
    runners = {k: LocalExecutor(s, TransformersEngine(s, m, source), sampler=v) for k, v in samplers.items()}
    rows = interleaved_trials(runners, TrialSpec(args.prompt_tokens, 1, s.modes[0], 0), args.rounds)
    steps = step_ratios(m, source, samplers["on"], args.prompt_tokens, args.step_tokens, args.step_trials)

    print(f"model {s.model.label}, {m.device}; batch 1, {args.prompt_tokens}-token prompt; sampler every "
          f"{args.interval_ms} ms")
    print(f"1. trials ({args.new_tokens} new tokens), {args.rounds} rounds of on and off, interleaved:")
    for k in ("off", "on"):
        e2e = [row["e2e_s"] for row in rows[k]]
        print(f"   sampling {k:<3}  e2e {statistics.median(e2e) * 1e3:8.1f} ms (min–max {min(e2e) * 1e3:.1f}–"
              f"{max(e2e) * 1e3:.1f}), {statistics.median(row['n_samples'] for row in rows[k]):.0f} samples a trial")
    trials = [a["e2e_s"] / b["e2e_s"] for a, b in zip(rows["on"], rows["off"])]
    print(f"   ratio on/off: {summary(trials)}")
    ttft = [a["ttft_s"] / b["ttft_s"] for a, b in zip(rows["on"], rows["off"])]
    decode = [(a["e2e_s"] - a["ttft_s"]) / (b["e2e_s"] - b["ttft_s"]) for a, b in zip(rows["on"], rows["off"])]
    print(f"   of which prefill (TTFT): {summary(ttft)}; decode (e2e − TTFT): {summary(decode)}")
    share = [row["sampler_cpu_s"] / row["e2e_s"] * 100 for row in rows["on"]]
    # the thread's samples: all but the two the main thread takes (start, end)
    per_sample = [row["sampler_cpu_s"] / (row["n_samples"] - 2) for row in rows["on"] if row["n_samples"] > 2]
    print(f"   sampler thread CPU, % of the trial's wall time: {summary(share, '.2f')}"
          + (f"; {statistics.median(per_sample) * 1e6:.0f} µs a sample" if per_sample else ""))
    print(f"2. steps ({args.step_trials} trials of {args.step_tokens} new tokens, sampler paused every other "
          f"step), {len(steps)} pairs of adjacent steps:")
    print(f"   ratio on/off: {summary(steps)}")

    medians = {"trials": statistics.median(trials), "steps": statistics.median(steps)}
    above = [k for k, v in medians.items() if v > TARGET]
    median_text = ("medians at or below it" if not above else f"median of {' and '.join(above)} above it") + (
        f" (trials {medians['trials']:.3f}, steps {medians['steps']:.3f})")
    trials_ci, steps_ci = median_ci(trials), median_ci(steps)
    if trials_ci is None or steps_ci is None:
        confidence = "too few rounds or steps for a 95% CI"
    elif trials_ci[0] > TARGET or steps_ci[0] > TARGET:
        confidence = "a 95% CI lies above it"
    elif steps_ci[1] <= TARGET:
        confidence = "the steps' 95% CI lies at or below it and the trials' does not lie above it"
    else:
        confidence = f"not shown at 95% (the steps' CI reaches {steps_ci[1]:.3f})"
    print(f"target ≤ {TARGET}: {median_text}; {confidence}")
    if args.json:
        rows = [figures("trials: e2e on/off", trials), figures("trials: prefill (TTFT) on/off", ttft),
                figures("trials: decode (e2e − TTFT) on/off", decode),
                figures("sampler thread CPU, % of the trial's wall time", share),
                figures("steps: adjacent decode steps on/off", steps)]
        write_result(args.json, "sampler_overhead", args, s.model.label, rows,
                     [f"target ≤ {TARGET}: {median_text}; {confidence}"])


if __name__ == "__main__":
    main()
