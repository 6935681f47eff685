"""Check that vLLM's server starts here on kvbench's own command line (``make vllm`` runs this after installing).

    python scripts/check_vllm.py .venv/vllm/bin/python

exports the scenario model (SmolLM2's GGUF) as a Hugging Face directory once (kvbench's cache folder), starts
``python -I -m vllm.entrypoints.openai.api_server`` with the words, flags and environment kvbench gives it
(:mod:`kvbench.serving.vllm`) and prefix caching on, waits for ``/health``, sends one prompt twice and prints the
start time and the cached prompt tokens of the second request, then stops the server and every child. Exit status
1 with the log's last lines when it does not start or reuses nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

from kvbench.bench.engines.server.client import complete_openai
from kvbench.bench.engines.server.process import ServerProcess, ServerStartError, free_port
from kvbench.models.export import hf_directory
from kvbench.scenario.programs import module_program
from kvbench.serving import KINDS
from kvbench.serving.kind import Launch

#: Prompt tokens of the check (two blocks of 128 and a bit).
PROMPT = 300


async def _twice(url: str, model: str) -> list[int | None]:
    ids = [100 + (37 * i) % 40_000 for i in range(PROMPT)]
    async with httpx.AsyncClient(trust_env=False) as client:
        return [(await complete_openai(client, url, model, ids, 4, {"return_token_ids": True})).cached_tokens
                for _ in range(2)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("python", help="the Python of the environment vLLM is installed in")
    python = ap.parse_args().python
    kind = KINDS["vllm"]
    model = str(hf_directory("smollm2-135m").path)
    port = free_port()
    at = Launch(None, model, port, 1, 512, 0, module=True, device="cpu", kv_bytes=0)
    head, own = kind.launch(at)
    argv = [*module_program("vllm", python).argv, *head, "--enable-prefix-caching", *own]
    with tempfile.TemporaryDirectory(prefix="kvbench-vllm-check-") as tmp:
        log = Path(tmp) / "vllm.log"
        t0 = time.monotonic()
        try:
            with ServerProcess(argv, log, port=port, startup_timeout_s=900,
                               env={**os.environ, **kind.environment(at)}) as server:
                started = time.monotonic() - t0
                cached = asyncio.run(_twice(server.url, model))
                tail = server.log_tail()
        except ServerStartError as exc:
            print(f"vLLM did not start: {exc}", file=sys.stderr)
            return 1
    if cached[0] != 0 or not cached[1]:
        print(f"vLLM started in {started:.0f} s but its prefix cache did not behave: cached prompt tokens "
              f"{cached} (expected 0, then > 0)\n{tail}", file=sys.stderr)
        return 1
    print(f"vLLM started in {started:.0f} s on {python}; the same {PROMPT}-token prompt twice: cached prompt "
          f"tokens {cached[0]}, then {cached[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
