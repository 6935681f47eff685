"""What a quantized host tier saves on the link and costs in quality: `full` with each host format, side by side.

Two parts, in one run on the same model:

1. **Speed and bytes** (as `offload_overhead.py`: the context is prefilled once with a DynamicCache, each mode's
   cache is seeded with that K/V and decodes `--steps` tokens, modes interleaved over `--rounds` rounds in
   alternating order): the median decode step and its ratio to `none` (the median of the per-round ratios, with
   their min–max), host→device bytes per step as the link moved them (physical: the format's parts, scales
   included) and as the model's dtype (logical), and the physical bytes ÷ those of the float32 and the bfloat16
   host tiers (issue 33's targets: int8 ≤ 0.3× float32, ≤ 0.55× bfloat16).
2. **Quality** against `none` on real prompts (ShareGPT, `--quality-prompts` of `--quality-tokens` tokens,
   `--quality-steps` greedy tokens each), as the trial rows report it (`kvbench.bench.engines.quality`): the share
   of ids equal to `none`'s, the share of steps before the first difference, and KL(none ‖ mode) of the next-token
   distributions teacher-forced on `none`'s ids (mean and max, nats).

    python benchmarks/host_tiers.py                                  # SmolLM2-135M on CPU, 2K context
    python benchmarks/host_tiers.py --contexts 512 --steps 4 --rounds 2 --quality-prompts 2 --quality-steps 8
    python benchmarks/host_tiers.py --device cuda --preset llama-3.1-8b --dtype bfloat16 --contexts 8192 --batch 8 \\
        --no-quality                                                 # random weights: quality means nothing
"""

from __future__ import annotations

import os

os.environ.setdefault("TQDM_DISABLE", "1")  # before transformers: its GGUF loader draws a progress bar

import argparse  # noqa: E402
import statistics  # noqa: E402

import torch  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from kvbench.bench.engines.decode import Clock, left_pad  # noqa: E402
from kvbench.bench.engines.quality import quality_fields, step_logprobs  # noqa: E402
from kvbench.offload.caches import OffloadedCache  # noqa: E402
from kvbench.offload.modes import make_cache  # noqa: E402
from kvbench.scenario.workload import WorkloadSpec  # noqa: E402
from kvbench.workloads import make_source  # noqa: E402
from offload_overhead import label, load_model, prefill, seeded, step_times  # noqa: E402
from bench_json import write_result  # noqa: E402

#: The host formats compared, as `full`'s options; the first two are the byte references.
FORMATS: list[dict] = [{"host_dtype": "float32"}, {"host_dtype": "bfloat16"}, {"host_dtype": "fp8"},
                       {"host_dtype": "int8"}, {"host_dtype": "int8", "hadamard": True},
                       {"k_dtype": "bfloat16", "v_dtype": "int8"}]


def speed(m, args, clock) -> list[dict]:
    """Part 1: step time ÷ none and H2D bytes per step of every format, per context; printed, and returned as rows
    (ratios, KiB per step physical and logical, physical ÷ float32's and ÷ bfloat16's)."""
    rows: list[dict] = []
    modes = [("none", {})] + [("full", f) for f in FORMATS]
    print(f"{'context':>8} {'mode':<44} {'step ms':>8} {'ratio':>6} {'min–max':>11} {'H2D KiB/step':>12} "
          f"{'logical KiB':>11} {'÷ fp32':>6} {'÷ bf16':>6}")
    for ctx in args.contexts:
        prefilled, first = prefill(m, ctx, args.batch)
        per_round: dict[str, list[float]] = {}
        moved: dict[str, tuple[float, float]] = {}
        for r in range(args.rounds):
            for kind, options in (modes if r % 2 == 0 else modes[::-1]):  # alternate the order: no mode always first
                name = label(kind, options)
                cache = seeded(kind, options, m.model, m.device, prefilled)
                t, _ = step_times(m.model, cache, first, ctx, args.steps, clock)
                per_round.setdefault(name, []).append(statistics.median(t[1:] if len(t) > 1 else t))
                if isinstance(cache, OffloadedCache):
                    stats = cache.engine.stats
                    moved[name] = (stats.h2d_bytes / args.steps, stats.h2d_logical_bytes / args.steps)
                    cache.close()
                del cache
        del prefilled
        fp32, bf16 = (moved[label("full", f)][0] for f in FORMATS[:2])
        for name, rounds in per_round.items():
            ratios = [t / b for t, b in zip(rounds, per_round["none"])]  # pairwise, round by round
            phys, logical = moved.get(name, (None, None))
            rows.append({"context": ctx, "mode": name, "step_ms": statistics.median(rounds) * 1e3,
                         "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                         "h2d_kib_per_step": phys / 1024 if phys is not None else None,
                         "logical_kib_per_step": logical / 1024 if phys is not None else None,
                         "per_float32": phys / fp32 if phys is not None else None,
                         "per_bfloat16": phys / bf16 if phys is not None else None})
            link = (f"{phys / 1024:>12.1f} {logical / 1024:>11.1f} {phys / fp32:>6.3f} {phys / bf16:>6.3f}"
                    if phys is not None else f"{'n/a':>12} {'':>11} {'':>6} {'':>6}")
            print(f"{ctx:>8} {name:<44} {statistics.median(rounds) * 1e3:>8.2f} {statistics.median(ratios):>6.3f} "
                  f"{min(ratios):>5.2f}–{max(ratios):<5.2f} {link}")
    return rows


def quality(m, args) -> None:
    """Part 2: agreement and teacher-forced KL against none of every format on real prompts."""
    source = make_source(WorkloadSpec(source="sharegpt"), m.tokenizer, m.shape.vocab_size)
    prompts = source.batch(args.quality_tokens, args.quality_prompts, 0)
    pad = m.tokenizer.pad_token_id if m.tokenizer.pad_token_id is not None else m.tokenizer.eos_token_id
    ids, mask = (x.to(m.device) for x in left_pad(prompts, int(pad or 0)))
    print(f"\nquality against none: {len(prompts)} ShareGPT prompts of {args.quality_tokens} tokens, "
          f"{args.quality_steps} greedy steps each")
    print(f"{'mode':<44} {'token_agreement':>15} {'to divergence':>13} {'kl_mean nats':>12} {'kl_max nats':>11}")
    reference = step_logprobs(m.model, ids, mask, DynamicCache(config=m.model.config), args.quality_steps)
    for options in FORMATS:
        def fresh(options=options):
            return make_cache("full", m.model.config, m.device, **options)

        own, _ = step_logprobs(m.model, ids, mask, fresh(), args.quality_steps)  # the mode's own greedy run
        q = quality_fields(m.model, ids, mask, own.tolist(), fresh, reference)
        print(f"{label('full', options):<44} {q['token_agreement']:>15.4f} {q['agreement_to_divergence']:>13.4f} "
              f"{q['kl_mean']:>12.2e} {q['kl_max']:>11.2e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", type=int, nargs="+", default=[2048])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--quality-prompts", type=int, default=8)
    ap.add_argument("--quality-tokens", type=int, default=512)
    ap.add_argument("--quality-steps", type=int, default=64)
    ap.add_argument("--no-quality", action="store_true", help="skip part 2 (random weights, no tokenizer)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    ap.add_argument("--preset", default=None, help="random-weight preset instead of the SmolLM2 GGUF")
    ap.add_argument("--json", metavar="PATH", help="also write part 1's figures to PATH (benchmarks/gpu.sh)")
    args = ap.parse_args()
    for flag, values in (("--contexts", args.contexts), ("--steps", [args.steps]), ("--rounds", [args.rounds]),
                         ("--batch", [args.batch]), ("--quality-prompts", [args.quality_prompts]),
                         ("--quality-tokens", [args.quality_tokens]), ("--quality-steps", [args.quality_steps])):
        if min(values) < 1:
            ap.error(f"{flag} must be >= 1, got {min(values)}")
    spec, m = load_model(args)
    if not args.no_quality and m.tokenizer is None:
        raise SystemExit(f"{spec.label} has no tokenizer for the quality part: pass --no-quality")
    print(f"model {spec.label}, {m.device}, {str(m.dtype).removeprefix('torch.')}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; batch {args.batch}; {args.steps} decode steps × {args.rounds} rounds "
          f"per mode; head_dim {m.shape.head_dim}")
    rows = speed(m, args, Clock(m.device))
    if not args.no_quality:
        quality(m, args)
    if args.json:
        write_result(args.json, "host_tiers", args, spec.label, rows, [])


if __name__ == "__main__":
    main()
