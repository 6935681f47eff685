"""Decode-step time of each offload mode divided by `none`'s, measured side by side in one process.

For each context length the prompt is prefilled once with a DynamicCache; each mode's cache is then seeded with
that K/V (the same `update` calls a prefill makes) and decodes `--steps` tokens. Modes are interleaved over
`--rounds` rounds so they share the machine's conditions. Prints the median step time per mode and its ratio to
`none`, with the min–max of the per-round medians. Target on CPU (issue 3): `full` ≤ 1.15× `none` at 4K.

    python benchmarks/offload_overhead.py                       # SmolLM2-135M on CPU, 1K/4K/8K context
    python benchmarks/offload_overhead.py --contexts 512 --steps 8 --rounds 2 --preset tiny-llama
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch
from transformers import DynamicCache

from kvbench.models import load
from kvbench.offload.caches import make_cache
from kvbench.runner import Clock, cache_keyword
from kvbench.scenario import ModelSpec


os.environ.setdefault("TQDM_DISABLE", "1")  # transformers' GGUF loader draws a progress bar


def label(kind: str, options: dict) -> str:
    """``hierarchical(window=512)``-style name of a mode."""
    return f"{kind}({','.join(f'{k}={v}' for k, v in options.items())})" if options else kind


def seeded(kind: str, options: dict, model, device, prefilled: DynamicCache):
    """A fresh cache of a mode holding the prefilled K/V of every layer."""
    cache = make_cache(kind, model.config, device, **options)
    for i, layer in enumerate(prefilled.layers):
        cache.update(layer.keys.clone(), layer.values.clone(), i)
    return cache


@torch.inference_mode()
def step_times(model, cache, first_token: torch.Tensor, start: int, steps: int, clock) -> list[float]:
    """Seconds per decode step over ``steps`` greedy steps from position ``start``."""
    kw = cache_keyword(model)
    tok, times = first_token, []
    for i in range(steps):
        t0 = clock()
        logits = model(input_ids=tok, position_ids=torch.tensor([[start + i]], device=tok.device),
                       use_cache=True, logits_to_keep=1, **{kw: cache}).logits
        tok = logits[:, -1:].argmax(-1)
        times.append(clock() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 8064])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=int, default=512, help="hierarchical window (tokens)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--preset", default=None, help="random-weight preset instead of the SmolLM2 GGUF")
    args = ap.parse_args()

    spec = ModelSpec(preset=args.preset, weights="random") if args.preset else ModelSpec(name="smollm2-135m")
    m = load(spec, args.device)
    clock = Clock(m.device)
    modes = [("none", {}), ("full", {}), ("hierarchical", {"window": args.window})]
    print(f"model {spec.label}, {m.device}, {str(m.dtype).removeprefix('torch.')}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; {args.steps} decode steps × {args.rounds} rounds per mode")
    print(f"{'context':>8} {'mode':<26} {'step ms (median)':>17} {'min–max of rounds':>20} {'ratio':>7}")
    for ctx in args.contexts:
        g = torch.Generator().manual_seed(ctx)
        ids = torch.randint(20, m.shape.vocab_size, (1, ctx), generator=g).to(m.device)
        prefilled = DynamicCache(config=m.model.config)
        with torch.inference_mode():
            logits = m.model(input_ids=ids, use_cache=True, logits_to_keep=1,
                             **{cache_keyword(m.model): prefilled}).logits
        first = logits[:, -1:].argmax(-1)
        per_round: dict[str, list[float]] = {label(k, o): [] for k, o in modes}
        for _ in range(args.rounds):
            for kind, options in modes:
                cache = seeded(kind, options, m.model, m.device, prefilled)
                t = step_times(m.model, cache, first, ctx, args.steps, clock)
                per_round[label(kind, options)].append(statistics.median(t[1:] if len(t) > 1 else t))
                del cache
        base = statistics.median(per_round["none"])
        for name, rounds in per_round.items():
            med = statistics.median(rounds)
            print(f"{ctx:>8} {name:<26} {med * 1e3:>17.2f} {min(rounds) * 1e3:>9.2f}–{max(rounds) * 1e3:<9.2f} "
                  f"{med / base:>7.3f}")


if __name__ == "__main__":
    main()
