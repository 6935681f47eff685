"""TTFT of a conversation's next turn when its history is restored from the KV store vs recomputed, per turn
(target: restore ÷ recompute ≤ 0.3 from turn 2 on), for one or more store chunkings side by side.

SmolLM2-135M on this machine's CPU, real ShareGPT conversations with at least --turns user turns whose last prompt
is --min-history to --max-history tokens. Turn k's prompt is turns 1..k through the chat template (the dataset's
assistant replies between them). Per turn, side by side:

- recompute: a fresh cache of --mode, prefill the whole prompt, --new greedy tokens;
- restore, once per --store (each its own KVStore): the store's longest stored prefix of the prompt loaded into a
  fresh cache of --mode, prefill the rest. Then, not timed, the assistant's reply that the conversation goes on with
  is fed through the model with that cache (as decoding it would have been: a server that generated the reply
  holds its KV), and the prompt and reply go into that store for the next turn.

A --store is ``N`` (whole chunks of N tokens only) or ``N+tail`` (whole chunks and the tail after the last one,
kvbench's default); give several to compare them in one run, e.g. ``--store 256 --store 256+tail --store 64``.

TTFT = from before the restore (or the prefill) to the first token, the device synchronised; "restore µs/token" is
the lookup and the copy into the cache alone, per restored token. The order of recompute and the restores rotates
per turn; the greedy ids of every restore must equal recompute's. Prints per turn and store the medians over the
conversations: prompt and history (what the previous turn held) tokens, restored tokens (and their share of the
history), both TTFTs, their ratio (of medians) and the restore time per token.

    python benchmarks/reuse_ttft.py [--conversations 3] [--turns 4] [--mode none] [--store 256+tail ...]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def store_option(text: str) -> tuple[int, bool]:
    """``N`` or ``N+tail`` as (chunk_tokens, tails); raises argparse.ArgumentTypeError otherwise."""
    m = re.fullmatch(r"([1-9]\d{0,5})(\+tail)?", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r}: give N or N+tail, e.g. 256 or 256+tail")
    return int(m.group(1)), bool(m.group(2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conversations", type=int, default=3)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--min-history", type=int, default=1500, help="tokens of the last turn's prompt, at least")
    ap.add_argument("--max-history", type=int, default=2500, help="tokens of the last turn's prompt, at most")
    ap.add_argument("--new", type=int, default=8, help="tokens generated per turn")
    ap.add_argument("--store", type=store_option, action="append", help="N or N+tail (repeatable; default: "
                    "256+tail, the store's default)")
    ap.add_argument("--mode", default="none", help="cache mode: none, full, hierarchical (window 512), dynamic")
    args = ap.parse_args()
    stores_wanted = args.store or [(256, True)]
    sys.path.insert(0, str(ROOT))
    from kvbench.models import load
    from kvbench.offload import make_cache
    from kvbench.offload.cache_kv import restore, sequence_kv
    from kvbench.offload.store import KVStore
    from kvbench.bench.engines.decode import Clock, greedy_decode
    from kvbench.scenario import ModelSpec
    from kvbench.workloads import sharegpt
    from kvbench.workloads.sessions import conversation_turns

    m = load(ModelSpec(name="smollm2-135m"), "cpu")
    clock = Clock(m.device)
    options = {"hierarchical": {"window": 512}, "dynamic": {"min_window": 512}}.get(args.mode, {})

    def fresh():
        return make_cache(args.mode, m.model.config, m.device, **options)

    def generate(ids: list[int], cache, cached: int, t0: float | None = None) -> tuple[list[int], float]:
        """Greedy ids and the time from ``t0`` (default: now) to the first token."""
        x = torch.tensor([ids[cached:]])
        t0 = clock() if t0 is None else t0
        out, _, times = greedy_decode(m.model, x, torch.ones((1, len(ids)), dtype=torch.long), cache, args.new,
                                      clock)
        return out[0].tolist(), times[0] - t0

    convs = []
    for doc in sharegpt.load():
        p = conversation_turns(m.tokenizer, doc, args.turns)
        if p and args.min_history <= len(p[-1][0]) <= args.max_history:
            convs.append(p)
            if len(convs) == args.conversations:
                break
    generate(convs[0][0][0][:256], fresh(), 0)  # warm-up, not measured
    names = [f"{c}{'+tail' if t else ''}" for c, t in stores_wanted]
    # per (turn, name): lists over conversations
    rec: dict[tuple[int, str], dict[str, list[float]]] = {}
    differ = 0
    for c, turns in enumerate(convs):
        stores = {n: KVStore(chunk, host_max_bytes=2**31, tails=tails) for n, (chunk, tails) in
                  zip(names, stores_wanted)}
        held_before = 0
        for k, (ids, replied) in enumerate(turns, start=1):

            def recompute():
                return generate(ids, fresh(), 0)

            def restored(name: str):
                store, cache = stores[name], fresh()
                t0 = clock()
                prefix = store.get(ids, max_tokens=len(ids) - 1)
                restore(cache, prefix, m.device, m.dtype)
                t_copy = clock() - t0
                out, ttft = generate(ids, cache, prefix.tokens, t0)  # the lookup and restore count
                # not timed: the reply the conversation goes on with, fed through the model as decoding it would
                # have been, so the store holds what a server holds after this turn (prompt and reply)
                cache.crop(-(args.new - 1))
                rest = torch.tensor([replied[len(ids):]])
                if rest.shape[1]:
                    greedy_decode(m.model, rest, torch.ones((1, len(replied)), dtype=torch.long), cache, 1, clock)
                store.put(replied, *sequence_kv(cache))
                return out, ttft, prefix.tokens, t_copy

            jobs = [("recompute", recompute)] + [(n, lambda n=n: restored(n)) for n in names]
            shift = (c + k) % len(jobs)
            results = {name: f() for name, f in jobs[shift:] + jobs[:shift]}
            ref_ids, ref_ttft = results["recompute"]
            for n in names:
                ids_r, ttft_r, n_restored, t_copy = results[n]
                if ids_r != ref_ids:
                    differ += 1
                    print(f"conversation {c} turn {k} store {n}: restored ids differ from recompute: {ids_r} vs "
                          f"{ref_ids}")
                t = rec.setdefault((k, n), {key: [] for key in ("recompute", "restore", "restored", "prompt",
                                                                "history", "share", "us_per_token")})
                t["recompute"].append(ref_ttft)
                t["restore"].append(ttft_r)
                t["restored"].append(n_restored)
                t["prompt"].append(len(ids))
                t["history"].append(held_before)
                if held_before:
                    t["share"].append(n_restored / held_before)
                if n_restored:
                    t["us_per_token"].append(t_copy / n_restored * 1e6)
            held_before = len(replied)
        for st in stores.values():
            st.close()
    print(f"SmolLM2-135M, cpu, mode {args.mode}, {len(convs)} conversations, stores {', '.join(names)}; medians "
          f"over conversations; greedy ids of restore and recompute "
          f"{'equal in every turn' if not differ else f'DIFFERENT in {differ} turns'}")
    print("| turn | store | prompt tokens | history tokens | restored tokens | restored ÷ history | recompute TTFT ms "
          "| restore TTFT ms | restore ÷ recompute | restore µs/token |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    med = statistics.median
    for (k, n), t in sorted(rec.items(), key=lambda kv: (kv[0][0], names.index(kv[0][1]))):
        a, b = med(t["recompute"]), med(t["restore"])
        share = f"{med(t['share']):.2f}" if t["share"] else "-"
        per = f"{med(t['us_per_token']):.1f}" if t["us_per_token"] else "-"
        print(f"| {k} | {n} | {med(t['prompt']):.0f} | {med(t['history']):.0f} | {med(t['restored']):.0f} | "
              f"{share} | {a * 1e3:,.0f} | {b * 1e3:,.0f} | {b / a:.2f} | {per} |")


if __name__ == "__main__":
    main()
