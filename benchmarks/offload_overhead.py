"""Decode-step time of each offload mode divided by `none`'s, measured side by side in one process.

For each context length the prompt is prefilled once with a DynamicCache; each mode's cache is then seeded with
that K/V (the same `update` calls a prefill makes) and decodes `--steps` tokens. Modes are interleaved over
`--rounds` rounds, in reverse order every other round, so they share the machine's conditions. Prints per mode:
the median step time (median over rounds of each round's median step, with their min–max) and its ratio to `none`,
taken pairwise: in each round the mode's median step ÷ `none`'s in the same round, then the median of those ratios
with their min–max (a slow drift of a shared machine cancels within a round); host→device bytes per step against
the history's KV bytes, and the peak device KV during the decode steps. Targets (issue 3): on CPU `full` ≤ 1.15× `none` at 4K context;
on CUDA `full` faster than `hf-offloaded`, H2D per step ≤ the history's KV, peak device KV ≤ 2 layers + new tokens.

    python benchmarks/offload_overhead.py                       # SmolLM2-135M on CPU, 1K/4K/8K context
    python benchmarks/offload_overhead.py --contexts 512 --steps 8 --rounds 2 --preset tiny-llama
    python benchmarks/offload_overhead.py --device cuda --preset llama-3.1-8b --dtype bfloat16 \\
        --contexts 8192 32768 --batch 8 --modes none hf-offloaded full hierarchical   # benchmarks/gpu.sh
"""

from __future__ import annotations

import os

os.environ.setdefault("TQDM_DISABLE", "1")  # before transformers: its GGUF loader draws a progress bar

import argparse  # noqa: E402
import statistics  # noqa: E402

import torch  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from kvbench.models import load  # noqa: E402
from kvbench.offload.caches import OffloadedCache, kv_bytes  # noqa: E402
from kvbench.offload.disk import DISK_BLOCK_TOKENS  # noqa: E402
from kvbench.offload.modes import MODES, ModeUnavailable, make_cache  # noqa: E402
from kvbench.bench.engines.decode import Clock, cache_keyword  # noqa: E402
from kvbench.scenario import ModelSpec  # noqa: E402
from bench_json import write_result  # noqa: E402


def label(kind: str, options: dict) -> str:
    """``hierarchical(window=512)``-style name of a mode."""
    return f"{kind}({','.join(f'{k}={v}' for k, v in options.items())})" if options else kind


def seeded(kind: str, options: dict, model, device, prefilled: DynamicCache):
    """A fresh cache of a mode holding the prefilled K/V of every layer, its peak and transfer counters reset."""
    cache = make_cache(kind, model.config, device, **options)
    for i, layer in enumerate(prefilled.layers):
        cache.update(layer.keys.clone(), layer.values.clone(), i)
    if isinstance(cache, OffloadedCache):
        cache.engine.drain()
        cache.device_peak_bytes = cache.device_bytes
        cache.engine.stats = type(cache.engine.stats)()
    return cache


def load_model(args: argparse.Namespace):
    """(spec, loaded model) of ``--preset`` (random weights) or the SmolLM2 GGUF in ``--dtype`` on ``--device``;
    exits when ``--contexts`` + ``--steps`` pass the model's positions."""
    spec = (ModelSpec(preset=args.preset, weights="random", dtype=args.dtype) if args.preset
            else ModelSpec(name="smollm2-135m", dtype=args.dtype))
    m = load(spec, args.device)
    if max(args.contexts) + args.steps > m.shape.max_positions:
        raise SystemExit(f"--contexts {max(args.contexts)} + --steps {args.steps} tokens is beyond {spec.label}'s "
                         f"{m.shape.max_positions} positions")
    return spec, m


@torch.inference_mode()
def prefill(m, ctx: int, batch: int) -> tuple[DynamicCache, torch.Tensor]:
    """A DynamicCache holding the K/V of ``batch`` random prompts of ``ctx`` tokens (seeded by ``ctx``), and the
    greedy next token of each (``[batch, 1]``)."""
    g = torch.Generator().manual_seed(ctx)
    ids = torch.randint(20, m.shape.vocab_size, (batch, ctx), generator=g).to(m.device)
    prefilled = DynamicCache(config=m.model.config)
    logits = m.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{cache_keyword(m.model): prefilled}).logits
    return prefilled, logits[:, -1:].argmax(-1)


@torch.inference_mode()
def step_times(model, cache, first_token: torch.Tensor, start: int, steps: int, clock) -> tuple[list[float], int]:
    """Seconds per decode step over ``steps`` greedy steps from position ``start``, and the peak device KV bytes
    (the cache's accounting for kvbench caches, else the K/V tensors on the device read after every step)."""
    kw = cache_keyword(model)
    tok, times, peak = first_token, [], 0
    batch = first_token.shape[0]
    for i in range(steps):
        t0 = clock()
        pos = torch.full((batch, 1), start + i, device=tok.device)
        logits = model(input_ids=tok, position_ids=pos, use_cache=True, logits_to_keep=1, **{kw: cache}).logits
        tok = logits[:, -1:].argmax(-1)
        times.append(clock() - t0)
        if not isinstance(cache, OffloadedCache):
            peak = max(peak, kv_bytes(cache, tok.device)[0])
    return times, cache.device_peak_bytes if isinstance(cache, OffloadedCache) else peak


def parse_modes(names: list[str], window: int, host_max_tokens: int | None) -> list[tuple[str, dict]]:
    """Mode names → (kind, options); `hierarchical` takes --window, `dynamic` --window as min_window; with
    --host-max-tokens a `full` mode with the disk tier is added."""
    out = []
    for n in names:
        opts = {"window": window} if n == "hierarchical" else {"min_window": window} if n == "dynamic" else {}
        out.append((n, opts))
    if host_max_tokens:
        out.append(("full", {"host_max_tokens": host_max_tokens}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 8064])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--window", type=int, default=512, help="hierarchical window / dynamic min_window (tokens)")
    ap.add_argument("--host-max-tokens", type=int, default=None, help="also run `full` with this host cap (disk)")
    ap.add_argument("--modes", nargs="+", default=["none", "full", "hierarchical"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    ap.add_argument("--preset", default=None, help="random-weight preset instead of the SmolLM2 GGUF")
    ap.add_argument("--json", metavar="PATH", help="also write the table's figures to PATH (benchmarks/gpu.sh)")
    args = ap.parse_args()
    for name in args.modes:
        if name not in MODES:
            ap.error(f"--modes: {MODES.unknown(name)}")
    for flag, values, least in (("--contexts", args.contexts, 1), ("--steps", [args.steps], 1),
                                ("--rounds", [args.rounds], 1), ("--batch", [args.batch], 1),
                                ("--window", [args.window], 0)):
        if min(values) < least:
            ap.error(f"{flag} must be >= {least}, got {min(values)}")
    if args.host_max_tokens is not None and args.host_max_tokens < DISK_BLOCK_TOKENS:
        ap.error(f"--host-max-tokens must hold at least one disk block of {DISK_BLOCK_TOKENS} tokens, "
                 f"got {args.host_max_tokens}")

    spec, m = load_model(args)
    clock = Clock(m.device)
    modes = parse_modes(args.modes, args.window, args.host_max_tokens)
    if modes[0][0] != "none":
        raise SystemExit("the first mode must be none: every ratio is taken against it")
    token_bytes = m.shape.sequence_bytes_per_token(m.dtype.itemsize) * args.batch  # K and V, all layers, whole batch
    layer_token_bytes = m.shape.token_layer_bytes(m.dtype.itemsize) * args.batch
    print(f"model {spec.label}, {m.device}, {str(m.dtype).removeprefix('torch.')}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; batch {args.batch}; {args.steps} decode steps × {args.rounds} rounds "
          f"per mode; KV {token_bytes} B per token")
    print(f"{'context':>8} {'mode':<30} {'step ms':>9} {'min–max of rounds':>19} {'ratio':>6} {'min–max':>11} "
          f"{'H2D MiB/step':>12} {'÷ history':>9} {'peak dev KV MiB':>15} {'÷ 2 layers':>10}")
    rows: list[dict] = []
    notes: list[str] = []
    for ctx in args.contexts:
        prefilled, first = prefill(m, ctx, args.batch)
        per_round: dict[str, list[float]] = {}
        h2d: dict[str, float] = {}
        peaks: dict[str, int] = {}
        skipped: dict[str, str] = {}
        for r in range(args.rounds):
            for kind, options in (modes if r % 2 == 0 else modes[::-1]):  # alternate the order: no mode always first
                name = label(kind, options)
                try:
                    cache = seeded(kind, options, m.model, m.device, prefilled)
                except ModeUnavailable as exc:
                    skipped[name] = str(exc)
                    continue
                t, peak = step_times(m.model, cache, first, ctx, args.steps, clock)
                per_round.setdefault(name, []).append(statistics.median(t[1:] if len(t) > 1 else t))
                peaks[name] = max(peaks.get(name, 0), peak)
                if isinstance(cache, OffloadedCache):
                    h2d[name] = cache.engine.stats.h2d_bytes / args.steps
                    cache.close()
                del cache
        del prefilled
        history = ctx * token_bytes  # the KV of the whole context
        two_layers = 2 * (ctx + args.steps) * layer_token_bytes + args.steps * token_bytes
        for name, rounds in per_round.items():
            med = statistics.median(rounds)
            ratios = [t / b for t, b in zip(rounds, per_round["none"])]  # pairwise, round by round
            rows.append({"context": ctx, "mode": name, "step_ms": med * 1e3, "ratio": statistics.median(ratios),
                         "ratio_min": min(ratios), "ratio_max": max(ratios),
                         "h2d_mib_per_step": h2d[name] / 2**20 if name in h2d else None,
                         "h2d_per_history": h2d[name] / history if name in h2d else None,
                         "peak_device_kv_mib": peaks[name] / 2**20, "peak_per_two_layers": peaks[name] / two_layers})
            moved = f"{h2d[name] / 2**20:>12.1f} {h2d[name] / history:>9.2f}" if name in h2d else f"{'n/a':>12} {'':>9}"
            print(f"{ctx:>8} {name:<30} {med * 1e3:>9.2f} {min(rounds) * 1e3:>9.2f}–{max(rounds) * 1e3:<9.2f} "
                  f"{statistics.median(ratios):>6.3f} {min(ratios):>5.2f}–{max(ratios):<5.2f} {moved} "
                  f"{peaks[name] / 2**20:>15.1f} {peaks[name] / two_layers:>10.2f}")
        for name, why in skipped.items():
            print(f"{ctx:>8} {name:<30} skipped: {why}")
            notes.append(f"context {ctx}: {name} skipped: {why}")
    if args.json:
        write_result(args.json, "offload_overhead", args, spec.label, rows, notes)


if __name__ == "__main__":
    main()
