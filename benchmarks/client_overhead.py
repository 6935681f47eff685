"""Overhead of kvbench's llama-server client: the inter-token latency the client measures ÷ the server's own time per
generated token, per request and as the median over requests (target: median ≤ 1.05 at concurrency 1).

Starts llama-server (kvbench.bench.engines.server.process.ServerProcess, 127.0.0.1 at a free port) on the SmolLM2-135M GGUF
with ``-t --threads`` (default 1: the client keeps the other core of a 2-core machine), one slot and no host cache,
and sends --requests sequential streamed requests through kvbench.bench.engines.server.client.complete_llamacpp: each a
distinct seeded prompt of exactly --prompt-tokens token ids, --new greedy tokens (ignore_eos), cache_prompt false.
One unrecorded request first warms the server up. Per request:

- client ITL = the mean of the gaps between consecutive streamed tokens after the first, i.e. (time of the last
  token − time of the first) ÷ (n − 1), read by the client as each event is parsed;
- server per token = ``timings.predicted_per_token_ms`` of the final event (``Reply.server_timings["per_token_s"]``):
  llama-server's time from the first generated token to the last, over the same n − 1 steps;
- their ratio (1.00 = the client adds nothing to a token's latency), and the client's TTFT.

The server is stopped on every exit path (an error, Ctrl-C, SIGTERM). llama-server's threads spin-wait: run this on
an otherwise idle machine (it prints the load average before and after).

    python benchmarks/client_overhead.py [--requests 20] [--prompt-tokens 128] [--new 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvbench.bench.engines.server.client import Reply, complete_llamacpp  # noqa: E402
from kvbench.bench.engines.server.engine import gguf_file  # noqa: E402
from kvbench.bench.engines.server.process import ServerProcess, free_port  # noqa: E402
from kvbench.errors import UserError  # noqa: E402
from kvbench.scenario.programs import server_program  # noqa: E402
from kvbench.scenario.servers import EngineSpec  # noqa: E402

#: First token id of the seeded prompts (clear of SmolLM2's special tokens) and the end of their range.
LOW_ID, HIGH_ID = 100, 40_000


def prompts(n: int, tokens: int, seed: int) -> list[list[int]]:
    """``n`` seeded prompts of exactly ``tokens`` token ids each, no two starting alike."""
    rng = np.random.default_rng(seed)
    out = [[int(x) for x in rng.integers(LOW_ID, HIGH_ID, tokens)] for _ in range(n)]
    for i, p in enumerate(out):
        p[0] = LOW_ID + i  # distinct first ids: nothing a request could share with another
    return out


def itl_ratio(reply: Reply) -> tuple[float, float, float]:
    """(client ITL s, server per-token s, client ÷ server) of one reply of at least 2 tokens.

    Raises:
        ValueError: fewer than 2 tokens, or no positive ``per_token_s`` in the server's timings.
    """
    if len(reply.token_times) < 2:
        raise ValueError(f"{len(reply.token_times)} tokens: an inter-token latency needs at least 2")
    server = reply.server_timings.get("per_token_s")
    if not server or server <= 0:
        raise ValueError(f"the server reported no time per token (timings: {reply.server_timings})")
    client = float(np.diff(reply.token_times).mean())
    return client, server, client / server


async def measure(url: str, batch: list[list[int]], new: int) -> list[Reply]:
    """One warm-up request, then one streamed request per prompt of ``batch``, each after the previous reply."""
    options = {"cache_prompt": False}
    async with httpx.AsyncClient(timeout=300) as client:
        await complete_llamacpp(client, url, [LOW_ID - 1, *batch[0][1:]], new, options)
        return [await complete_llamacpp(client, url, ids, new, options) for ids in batch]


def _terminated(signum, frame):  # SIGTERM's default skips the with-block's exit: turn it into SystemExit
    raise SystemExit(128 + signum)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20, help="sequential requests measured")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="token ids per prompt")
    ap.add_argument("--new", type=int, default=64, help="tokens generated per request (at least 2)")
    ap.add_argument("--threads", type=int, default=1, help="llama-server -t")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.requests < 1 or args.new < 2 or args.prompt_tokens < 1 or args.threads < 1:
        ap.error("--requests, --prompt-tokens and --threads must be ≥ 1, --new ≥ 2")
    signal.signal(signal.SIGTERM, _terminated)
    program = server_program(EngineSpec(kind="llama.cpp"))
    if program is None:
        print("llama-server not found in this environment or on PATH (build it: make llama-server)", file=sys.stderr)
        return 2
    model = gguf_file("smollm2-135m")
    batch = prompts(args.requests, args.prompt_tokens, args.seed)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="kvbench-client-overhead-") as tmp:
        port = free_port()
        argv = [*program, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(args.threads),
                "-np", "1", "-c", str(args.prompt_tokens + args.new + 16), "--cache-ram", "0", "--seed",
                str(args.seed)]
        try:
            with ServerProcess(argv, Path(tmp) / "llama-server.log", port=port) as server:
                replies = asyncio.run(measure(server.url, batch, args.new))
        except UserError as exc:  # the server did not start, or a reply was unusable: the message says why
            print(exc, file=sys.stderr)
            return 2
    load_after = os.getloadavg()
    print(f"llama-server -t {args.threads}, SmolLM2-135M Q4_1, {args.requests} sequential requests of "
          f"{args.prompt_tokens} prompt tokens + {args.new} new, cache_prompt false, concurrency 1; "
          f"load average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after")
    print("| request | client TTFT ms | client ITL ms | server ms/token | client ÷ server |")
    print("|---|---|---|---|---|")
    ratios = []
    for i, reply in enumerate(replies):
        client, server, ratio = itl_ratio(reply)
        ratios.append(ratio)
        ttft = (reply.token_times[0] - reply.t_sent) * 1e3
        print(f"| {i} | {ttft:,.1f} | {client * 1e3:.2f} | {server * 1e3:.2f} | {ratio:.3f} |")
    med = statistics.median(ratios)
    print(f"median client ITL ÷ server per-token time: {med:.3f} over {len(ratios)} requests (min {min(ratios):.3f}, "
          f"max {max(ratios):.3f}); target ≤ 1.05: {'met' if med <= 1.05 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
