"""TTFT of a conversation's next turn when its history is restored from the KV store vs recomputed, per turn
(target: restore ÷ recompute ≤ 0.3 from turn 2 on).

SmolLM2-135M on this machine's CPU, real ShareGPT conversations with at least --turns user turns whose last prompt
is --min-history to --max-history tokens. Turn k's prompt is turns 1..k through the chat template (the dataset's
assistant replies between them). Per turn, side by side:

- recompute: a fresh cache of --mode, prefill the whole prompt, --new greedy tokens;
- restore: the store's longest stored prefix of the prompt (whole chunks of --chunk tokens) loaded into a fresh
  cache of --mode, prefill the rest. Then, not timed, the assistant's reply that the conversation goes on with is
  fed through the model with that cache (as decoding it would have been: a server that generated the reply holds
  its KV), and the prompt and reply go into the store for the next turn.

TTFT = from before the restore (or the prefill) to the first token, the device synchronised. The order of the two
alternates per turn; the greedy ids of both must be equal. Prints per turn the median TTFT of each over the
conversations, the ratio of medians, and tokens restored.

    python benchmarks/reuse_ttft.py [--conversations 3] [--turns 4] [--mode none]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conversations", type=int, default=3)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--min-history", type=int, default=1500, help="tokens of the last turn's prompt, at least")
    ap.add_argument("--max-history", type=int, default=2500, help="tokens of the last turn's prompt, at most")
    ap.add_argument("--new", type=int, default=8, help="tokens generated per turn")
    ap.add_argument("--chunk", type=int, default=256, help="the store's chunk_tokens")
    ap.add_argument("--mode", default="none", help="cache mode: none, full, hierarchical (window 512), dynamic")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from kvbench.models import load
    from kvbench.offload import make_cache
    from kvbench.offload.store import KVStore, restore, sequence_kv
    from kvbench.bench.decode import Clock, greedy_decode
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
    per_turn: dict[int, dict[str, list[float]]] = {}
    differ = 0
    for c, turns in enumerate(convs):
        store = KVStore(args.chunk, host_max_bytes=2**31)
        for k, (ids, replied) in enumerate(turns, start=1):
            t = per_turn.setdefault(k, {"recompute": [], "restore": [], "restored": [], "prompt": []})

            def recompute():
                return generate(ids, fresh(), 0)

            def restored():
                cache = fresh()
                t0 = clock()
                prefix = store.get(ids, max_tokens=len(ids) - 1)
                restore(cache, prefix, m.device, m.dtype)
                out, ttft = generate(ids, cache, prefix.tokens, t0)  # the lookup and restore count
                # not timed: the reply the conversation goes on with, fed through the model as decoding it would
                # have been, so the store holds what a server holds after this turn (prompt and reply)
                cache.crop(-(args.new - 1))
                rest = torch.tensor([replied[len(ids):]])
                if rest.shape[1]:
                    greedy_decode(m.model, rest, torch.ones((1, len(replied)), dtype=torch.long), cache, 1, clock)
                store.put(replied, *sequence_kv(cache))
                return out, ttft, prefix.tokens

            order = [recompute, restored] if (c + k) % 2 else [restored, recompute]
            results = {f.__name__: f() for f in order}
            ref_ids, ref_ttft = results["recompute"]
            ids_r, ttft_r, n_restored = results["restored"]
            if ids_r != ref_ids:
                differ += 1
                print(f"conversation {c} turn {k}: restored ids differ from recompute: {ids_r} vs {ref_ids}")
            t["recompute"].append(ref_ttft)
            t["restore"].append(ttft_r)
            t["restored"].append(n_restored)
            t["prompt"].append(len(ids))
        store.close()
    print(f"SmolLM2-135M, cpu, mode {args.mode}, {len(convs)} conversations, chunk {args.chunk} tokens; "
          f"TTFT medians over conversations; greedy ids of restore and recompute "
          f"{'equal in every turn' if not differ else f'DIFFERENT in {differ} turns'}")
    print("| turn | prompt tokens | restored tokens | recompute TTFT ms | restore TTFT ms | restore ÷ recompute |")
    print("|---|---|---|---|---|---|")
    for k, t in per_turn.items():
        a, b = statistics.median(t["recompute"]), statistics.median(t["restore"])
        print(f"| {k} | {statistics.median(t['prompt']):.0f} | {statistics.median(t['restored']):.0f} | "
              f"{a * 1e3:,.0f} | {b * 1e3:,.0f} | {b / a:.2f} |")


if __name__ == "__main__":
    main()
