"""Cost of the background sampler: the same trial with sampling every 10 ms and with sampling off, interleaved.

"Off" still reads once at the start, at the prefill/decode mark and at the end (a handful of psutil calls); "on"
adds the sampler thread. Prints the median e2e time of each (with min–max over rounds) and the ratio on/off, both
as the ratio of medians and as the median of each round's back-to-back pair (which cancels drift between rounds),
with a distribution-free 95% confidence interval of that median (order statistics of the pairs, binomial ranks;
Conover, *Practical Nonparametric Statistics*, 3rd ed., §3.2). Then the cost of one sample, timed directly (the
median of 2,000 calls of the reading the thread makes, less the trial's KV probe: a few µs more), and what that many samples per trial take of the trial's
wall time: the sampler's own CPU share, free of the trial-to-trial noise the ratio carries. Target (issue 4): ≤ 1.02.

    python benchmarks/sampler_overhead.py                     # SmolLM2-135M, CPU, 512-token prompt, 32 new tokens
    python benchmarks/sampler_overhead.py --preset tiny-llama --rounds 4
"""

from __future__ import annotations

import os

os.environ.setdefault("TQDM_DISABLE", "1")  # before transformers: its GGUF loader draws a progress bar

import argparse  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

from kvbench.models import load  # noqa: E402
from kvbench.monitor import Sampler, TrialTimeline  # noqa: E402
from kvbench.runner import TrialRunner, TrialSpec  # noqa: E402
from kvbench.scenario import parse_scenario  # noqa: E402
from kvbench.workloads import SyntheticSource  # noqa: E402


def median_ci(values: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """Distribution-free confidence interval of the median of ``values``: the order statistics at binomial(n, ½)
    ranks k and n+1−k, the widest k whose two-sided tail is ≤ 1 − ``level`` (None when n is too small, n < 6 at
    95%)."""
    n, xs = len(values), sorted(values)
    tail, k = 0.0, 0
    while True:  # grow k while P(Bin(n, ½) ≤ k) stays within half the allowed error
        nxt = tail + math.comb(n, k) / 2**n
        if 2 * nxt > 1 - level:
            break
        tail, k = nxt, k + 1
    return None if k == 0 else (xs[k - 1], xs[n - k])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--interval-ms", type=int, default=10)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--preset", default=None, help="random-weight preset instead of the SmolLM2 GGUF")
    args = ap.parse_args()

    model = {"preset": args.preset, "weights": "random"} if args.preset else "smollm2-135m"
    s = parse_scenario({"name": "sampler-overhead", "model": model, "device": args.device,
                        "workload": {"source": "synthetic", "n_prompts": 1}, "prompt_tokens": [args.prompt_tokens],
                        "max_new_tokens": args.new_tokens, "batch_sizes": [1], "modes": [{"kind": "none"}],
                        "repeats": 1, "warmup": 0})
    spec = s.model
    m = load(spec, args.device)
    source = SyntheticSource(m.shape.vocab_size, seed=0, n_prompts=1)
    samplers = {"on": Sampler(m.device, args.interval_ms), "off": Sampler(m.device, 0)}
    runners = {k: TrialRunner(s, m, source, sampler=v) for k, v in samplers.items()}
    trial = TrialSpec(args.prompt_tokens, 1, s.modes[0], 0)
    runners["off"].run(trial)  # warm-up, not counted
    e2e: dict[str, list[float]] = {"on": [], "off": []}
    n_samples = []
    for r in range(args.rounds):
        for k in (("on", "off") if r % 2 == 0 else ("off", "on")):  # alternate who goes first
            row = runners[k].run(trial)
            assert row["status"] == "ok", row["message"]
            e2e[k].append(row["e2e_s"])
            if k == "on":
                n_samples.append(row["n_samples"])
    print(f"model {spec.label}, {m.device}; prompt {args.prompt_tokens} tokens, {args.new_tokens} new; "
          f"{args.rounds} rounds, interleaved; sampler every {args.interval_ms} ms "
          f"({statistics.median(n_samples):.0f} samples per trial)")
    for k in ("off", "on"):
        print(f"sampling {k:<3}  e2e {statistics.median(e2e[k]) * 1e3:9.1f} ms  "
              f"(min–max {min(e2e[k]) * 1e3:.1f}–{max(e2e[k]) * 1e3:.1f})")
    # each round's on and off ran back to back: their ratio cancels the machine's drift between rounds
    paired = sorted(a / b for a, b in zip(e2e["on"], e2e["off"]))
    ci = median_ci(paired)
    ci_text = f"95% CI {ci[0]:.3f}–{ci[1]:.3f}" if ci else "too few rounds for a 95% CI"
    print(f"ratio on/off: {statistics.median(e2e['on']) / statistics.median(e2e['off']):.3f} of medians, "
          f"{statistics.median(paired):.3f} median of per-round pairs ({ci_text}; min–max "
          f"{paired[0]:.3f}–{paired[-1]:.3f})  (target ≤ 1.02)")
    # the sampler's own cost: the reading its thread makes, timed directly, outside any trial
    sampler, timeline = samplers["on"], TrialTimeline("cost", [], [])
    t0, costs = time.perf_counter(), []
    for _ in range(2000):
        a = time.perf_counter()
        sampler.read(timeline, t0)
        costs.append(time.perf_counter() - a)
    per_sample = statistics.median(costs)
    share = per_sample * statistics.median(n_samples) / statistics.median(e2e["off"])
    print(f"one sample: {per_sample * 1e6:.1f} µs (median of 2000); × {statistics.median(n_samples):.0f} samples "
          f"per trial = {share * 100:.2f}% of the trial's wall time on one core: what the sampler's own work "
          "adds, before any contention for the GIL")


if __name__ == "__main__":
    main()
