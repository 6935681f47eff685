"""Reuse side by side in three engines: per conversation turn, the TTFT of restoring the history ÷ recomputing it,
for kvbench's own KV store, llama-server's two reuse tiers and vLLM's prefix cache, on the same real ShareGPT
conversations and the same weights (SmolLM2-135M: the GGUF, exported once as a Hugging Face directory for vLLM), in
one run.

Four scenarios are built in code (YAML in a temporary directory) and run one after another with
``kvbench.run_scenario``; their rows are read back with ``kvbench.load_results``:

- **kvbench store**: the in-process transformers engine, mode ``none``, the multi_turn workload: each request runs
  cold (the whole prompt prefilled) and warm (the longest prefix its store holds restored, the rest prefilled); the
  store (the default chunking, 2 GiB of host memory) holds every conversation at once. Ratio: warm ÷ cold TTFT.
- **llama-server prompt cache**: modes ``prefix-cache`` and ``none`` with ``interleave: sequential`` and one slot,
  so a conversation's turns follow one another and the slot still holds the previous turn. Ratio: prefix-cache ÷
  none TTFT.
- **llama-server ``--cache-ram``**: modes ``host-cache`` (256 MiB) and ``none`` with ``interleave: round_robin`` and
  one slot, so another conversation takes the slot between two turns and only the host-RAM cache can restore.
  Ratio: host-cache ÷ none TTFT.
- **vLLM prefix cache** (its CPU build, `make vllm`; left out with a note when it is not installed): modes
  ``prefix-cache`` and ``none`` with ``interleave: sequential`` and one sequence at a time (``--max-num-seqs 1``).
  Ratio: prefix-cache ÷ none TTFT. vLLM reuses whole KV blocks (128 tokens on a CPU), so a turn's last partial
  block is recomputed.

The workloads select the same conversations (same seed, turns and prompt bounds; the interleave only orders
them), checked by the prompts' digests. Every ratio is paired per request and repeat (the same prompt in both
modes), then the median per turn over conversations and repeats, with the number of pairs. Tokens restored (kvbench:
``tokens_restored``) and cached (llama-server: ``cached_prompt_tokens``) are medians per turn; "= ids" counts the
requests whose greedy output equals recompute's.

llama-server runs with ``-t 1`` (its threads spin-wait; the client keeps the other core); vLLM with its own
threads (it does not spin). Run it on an otherwise idle machine: it prints the load average before and after.

    python benchmarks/reuse_engines.py [--conversations 3] [--turns 3] [--new 8] [--repeats 2] [--out DIR]
"""

from __future__ import annotations

import os

os.environ.setdefault("TQDM_DISABLE", "1")  # before transformers: its GGUF loader draws a progress bar

import argparse  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import pandas as pd  # noqa: E402
import yaml  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import kvbench  # noqa: E402
from kvbench.errors import UserError  # noqa: E402
from kvbench.scenario.programs import own_python  # noqa: E402

#: The last turn's prompt, in tokens (the workloads' min_prompt_tokens and max_prompt_tokens).
PROMPT_BOUNDS = (400, 1200)


def scenarios(conversations: int, turns: int, new: int, repeats: int, vllm: bool) -> dict[str, tuple[dict, str]]:
    """The scenarios as dicts, by column name, each with the mode whose TTFT is the reuse's: ``kvbench``
    (transformers engine, its store: warm rows), ``llama prefix`` and ``llama ram`` (llama-server), ``vllm prefix``
    (with ``vllm``); a server's with its ``none`` reference."""

    def workload(interleave: str) -> dict:
        return {"source": "sharegpt", "seed": 0, "multi_turn": {
            "conversations": conversations, "turns": turns, "interleave": interleave,
            "min_prompt_tokens": PROMPT_BOUNDS[0], "max_prompt_tokens": PROMPT_BOUNDS[1]}}

    common = {"model": "smollm2-135m", "max_new_tokens": new, "repeats": repeats, "warmup": 1, "seed": 0}
    llama = {"kind": "llama.cpp", "args": ["-t", "1"]}
    out = {
        "kvbench": ({"name": "reuse_engines-kvbench", "device": "cpu", "workload": workload("round_robin"),
                     "modes": [{"kind": "none"}], "store": {"host_max_bytes": "2GiB"}, **common}, "none"),
        "llama prefix": ({"name": "reuse_engines-llama-prefix", "engine": llama, "workload": workload("sequential"),
                          "modes": [{"name": "none"}, {"name": "prefix-cache"}], "load": {"profile": "sequential"},
                          **common}, "prefix-cache"),
        "llama ram": ({"name": "reuse_engines-llama-ram", "engine": llama, "workload": workload("round_robin"),
                       "modes": [{"name": "none"}, {"name": "host-cache", "size": 256}],
                       "load": {"profile": "sequential"}, **common}, "host-cache"),
    }
    if vllm:
        out["vllm prefix"] = ({"name": "reuse_engines-vllm-prefix", "engine": {"kind": "vllm"},
                               "workload": workload("sequential"), "modes": [{"name": "none"}, {"name": "prefix-cache"}],
                               "load": {"profile": "sequential"}, **common}, "prefix-cache")
    return out


def paired(trials: pd.DataFrame, column: str, mode: str) -> pd.DataFrame:
    """Per request and repeat of one run: ``turn``, ``ratio`` (TTFT of reuse ÷ TTFT of recompute), ``reused``
    (tokens restored or cached) and ``same`` (the reuse's greedy output equals recompute's). kvbench's rows pair
    warm with cold; a server's pair the reuse mode (``mode``) with ``none``."""
    ok = trials[trials["status"] == "ok"]
    if column == "kvbench":
        reuse, base, reused = ok[ok["warm"] == True], ok[ok["warm"] == False], "tokens_restored"  # noqa: E712
    else:
        reuse, base, reused = ok[ok["mode_label"] == mode], ok[ok["mode_label"] == "none"], "cached_prompt_tokens"
    key = ["request_id", "repeat"]
    both = reuse[key + ["turn_index", "ttft_s", reused, "tokens_match"]].merge(
        base[key + ["ttft_s"]], on=key, suffixes=("", "_base"))
    return pd.DataFrame({"turn": both["turn_index"].astype(int), "ratio": both["ttft_s"] / both["ttft_s_base"],
                         "reused": both[reused].astype(float), "same": both["tokens_match"] == True})  # noqa: E712


def same_prompts(frames: dict[str, pd.DataFrame]) -> None:
    """Raise RuntimeError unless every run sent the same prompt for each request id."""
    digests = {name: dict(zip(df["request_id"], df["prompt_sha256"])) for name, df in frames.items()}
    first, *rest = digests.items()
    for name, d in rest:
        if d != first[1]:
            raise RuntimeError(f"the {name} run's prompts differ from the {first[0]} run's: the workloads did not "
                               "select the same conversations")


def table(pairs: dict[str, pd.DataFrame], prompts: pd.Series) -> list[str]:
    """The Markdown table: per turn, the median prompt tokens and per column the median reused tokens, the median
    ratio and the pair count."""
    head = "| turn | prompt tokens |" + "".join(f" {c} reused | {c} ÷ | pairs |" for c in pairs)
    lines = [head, "|" + "---|" * (2 + 3 * len(pairs))]
    for turn in sorted(set().union(*(set(p["turn"]) for p in pairs.values()))):
        cells = [str(turn), f"{prompts.get(turn, float('nan')):.0f}"]
        for p in pairs.values():
            t = p[p["turn"] == turn]
            cells += [f"{t['reused'].median():.0f}", f"{t['ratio'].median():.2f}", str(len(t))] if len(t) else \
                ["-", "-", "0"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _terminated(signum, frame):
    """SIGTERM stops a run as Ctrl-C does (its server stopped, finished trials kept), then the temporary runs go."""
    raise KeyboardInterrupt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conversations", type=int, default=3)
    ap.add_argument("--turns", type=int, default=3, help="user turns per conversation (≥ 2)")
    ap.add_argument("--new", type=int, default=8, help="tokens generated per request")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, help="keep the runs here (default: a temporary directory, removed)")
    args = ap.parse_args()
    if args.conversations < 1 or args.turns < 2 or args.new < 1 or args.repeats < 1:
        ap.error("--conversations, --new and --repeats must be ≥ 1, --turns ≥ 2")
    signal.signal(signal.SIGTERM, _terminated)
    out = args.out or Path(tempfile.mkdtemp(prefix="kvbench-reuse-engines-"))
    load_before = os.getloadavg()
    frames: dict[str, pd.DataFrame] = {}
    vllm = own_python("vllm") is not None
    if not vllm:
        print("vLLM's CPU build is not in .venv/vllm (`make vllm`): its column is left out", file=sys.stderr)
    runs = scenarios(args.conversations, args.turns, args.new, args.repeats, vllm)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for column, (data, _) in runs.items():
            path = out / f"{data['name']}.yaml"
            path.write_text(yaml.safe_dump(data, sort_keys=False))
            print(f"running {column} ({path.name}) ...", file=sys.stderr, flush=True)
            run = kvbench.run_scenario(path, out=out)
            if run.interrupted or run.run_dir is None:
                print(f"{column}: interrupted", file=sys.stderr)
                return 130
            for line in run.failures:
                print(f"{column}: {line}", file=sys.stderr)
            frames[column] = kvbench.load_results(run.run_dir).trials
        same_prompts(frames)
    except UserError as exc:  # a scenario, the model, the data or a server: the message says which and why
        print(exc, file=sys.stderr)
        return 2
    finally:
        if args.out is None:
            shutil.rmtree(out, ignore_errors=True)
    load_after = os.getloadavg()
    pairs = {c: paired(df, c, runs[c][1]) for c, df in frames.items()}
    ok = frames["kvbench"][frames["kvbench"]["status"] == "ok"]
    prompts = ok.groupby("turn_index")["prompt_tokens"].median()
    print(f"SmolLM2-135M, {args.conversations} ShareGPT conversations × {args.turns} turns (last prompt "
          f"{PROMPT_BOUNDS[0]}-{PROMPT_BOUNDS[1]} tokens), {args.new} new tokens, {args.repeats} repeats; TTFT of "
          "reuse ÷ recompute paired per request, median per turn; load average (1 min) "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after")
    print("kvbench = its own store (transformers, mode none, warm ÷ cold); llama prefix = llama-server's slot "
          "prompt cache (sequential, 1 slot); llama ram = llama-server --cache-ram (round robin, 1 slot); vllm "
          "prefix = vLLM's prefix cache (CPU build, sequential, 1 sequence, blocks of 128 tokens)")
    print("\n".join(table(pairs, prompts)))
    for c, p in pairs.items():
        print(f"{c}: greedy output = recompute's in {int(p['same'].sum())} of {len(p)} pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
