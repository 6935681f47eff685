#!/usr/bin/env python3
"""A stand-in for SGLang's server (``python -m sglang.launch_server``) in kvbench's tests of the keys it gives
SGLang (standard library only: it runs under whichever ``python3`` is first on PATH; no model).

Command line: SGLang's flags kvbench gives (``--model-path M --host H --port P --enable-metrics --random-seed N``,
``--disable-radix-cache``, ``--config FILE``); others are ignored; ``--version`` prints ``fake sglang 0.0.0``.
``--config`` reads a YAML file of ``key: value`` lines as SGLang does (its settings come first, the command line
wins). Keys are checked by SGLang 0.5.23's rules (``sglang/srt/utils/auth.py``): ``/health*``, ``/ready*`` and
``/metrics*`` are open; the admin endpoints (``/start_profile``, ``/flush_cache``, ``/update_weights_from_disk``,
``/configure_logging``) want ``Authorization: Bearer <admin-api-key>`` where one is set, else the api-key, else
nothing; every other endpoint wants the api-key where one is set; a refusal is HTTP 401 ``{"error":
"Unauthorized"}``. Endpoints: ``GET /v1/models`` (the model path); ``GET /server_info`` (the settings, keys
included, as SGLang's answers them); ``POST /start_profile`` writes ``fake-profile.json`` into the ``output_dir``
its JSON body names; ``POST /v1/completions``: SSE, one chunk per token (text " t<id>", step k's id
(sum(prompt) + k) % 1000, ``usage`` on every chunk), a usage chunk with ``prompt_tokens_details.cached_tokens``
(the longest common prefix with an earlier prompt, 0 with ``--disable-radix-cache``), then ``data: [DONE]``;
``GET /metrics``: ``sglang:prompt_tokens_total``, ``sglang:generation_tokens_total`` and
``sglang:cached_tokens_total{cache_source="device"}``. ``FAKE_RECORD=PATH`` gets one JSON line per request:
method, path, status.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import sys
import threading
from pathlib import Path

ADMIN = ("/start_profile", "/flush_cache", "/update_weights_from_disk", "/configure_logging")
OPEN = ("/health", "/ready", "/metrics")


def settings(argv: list[str]) -> argparse.Namespace:
    """The command line over the ``--config`` file's settings (SGLang: config first, the command line wins)."""
    ap = argparse.ArgumentParser()
    for flag in ("--model-path", "--host", "--config", "--api-key", "--admin-api-key"):
        ap.add_argument(flag)
    ap.add_argument("--port", type=int)
    ap.add_argument("--random-seed", type=int, default=0)
    ap.add_argument("--disable-radix-cache", action="store_true")
    args, _ = ap.parse_known_args(argv)
    if args.config:
        words = []
        for line in Path(args.config).read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition(":")
            words += [f"--{key.strip()}", value.strip().strip("'\"")]
        args, _ = ap.parse_known_args(words + argv)
    return args


class State:
    def __init__(self, args: argparse.Namespace):
        self.args, self.lock = args, threading.Lock()
        self.prompts: list[list[int]] = []
        self.prompt_tokens = self.generated = self.cached = 0


def allowed(path: str, header: str | None, args: argparse.Namespace) -> bool:
    """SGLang's decision for one request (see the module's text)."""
    if path.startswith(OPEN):
        return True
    want = args.admin_api_key or args.api_key if path in ADMIN else args.api_key
    return want is None or header == f"Bearer {want}"


def handler(state: State) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *a):
            print(fmt % a, flush=True)

        def reply(self, status: int, body: object, kind: str = "application/json") -> None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            if os.environ.get("FAKE_RECORD"):
                with open(os.environ["FAKE_RECORD"], "a", encoding="utf-8") as f:
                    f.write(json.dumps({"method": self.command, "path": self.path, "status": status}) + "\n")

        def body(self) -> dict:
            n = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(n) or b"{}")

        def do_GET(self):
            a = state.args
            if not allowed(self.path, self.headers.get("Authorization"), a):
                return self.reply(401, {"error": "Unauthorized"})
            if self.path == "/health":
                return self.reply(200, {})
            if self.path == "/v1/models":
                return self.reply(200, {"object": "list", "data": [{"id": a.model_path, "object": "model"}]})
            if self.path == "/server_info":
                return self.reply(200, {"model_path": a.model_path, "api_key": a.api_key,
                                        "admin_api_key": a.admin_api_key})
            if self.path == "/metrics":
                label = f'model_name="{a.model_path}"'
                return self.reply(200, "".join((
                    f"sglang:prompt_tokens_total{{{label}}} {state.prompt_tokens:.1f}\n",
                    f"sglang:generation_tokens_total{{{label}}} {state.generated:.1f}\n",
                    f'sglang:cached_tokens_total{{cache_source="device",{label}}} {state.cached:.1f}\n')),
                    "text/plain")
            return self.reply(404, {"detail": "Not Found"})

        def do_POST(self):
            if not allowed(self.path, self.headers.get("Authorization"), state.args):
                return self.reply(401, {"error": "Unauthorized"})
            body = self.body()
            if self.path == "/start_profile":
                (Path(body["output_dir"]) / "fake-profile.json").write_text("{}")
                return self.reply(200, "Start profiling.\n", "text/plain")
            if self.path != "/v1/completions":
                return self.reply(404, {"detail": "Not Found"})
            prompt, n = [int(t) for t in body["prompt"]], int(body["max_tokens"])
            with state.lock:
                cached = 0 if state.args.disable_radix_cache else max(
                    (next((i for i, (x, y) in enumerate(zip(p, prompt)) if x != y), min(len(p), len(prompt)))
                     for p in state.prompts), default=0)
                cached = min(cached, len(prompt) - 1)
                state.prompts.append(prompt)
                state.prompt_tokens += len(prompt)
                state.cached += cached
                state.generated += n
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            base = sum(prompt)
            for k in range(n):
                chunk = {"choices": [{"index": 0, "text": f" t{(base + k) % 1000}",
                                      "finish_reason": "length" if k == n - 1 else None}],
                         "usage": {"prompt_tokens": len(prompt), "completion_tokens": k + 1}}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            usage = {"choices": [], "usage": {"prompt_tokens": len(prompt), "completion_tokens": n,
                                              "prompt_tokens_details": {"cached_tokens": cached}}}
            self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
            self.wfile.flush()
            self.close_connection = True
            if os.environ.get("FAKE_RECORD"):
                with open(os.environ["FAKE_RECORD"], "a", encoding="utf-8") as f:
                    f.write(json.dumps({"method": "POST", "path": self.path, "status": 200}) + "\n")

    return Handler


def main() -> int:
    if "--version" in sys.argv[1:]:
        print("fake sglang 0.0.0")
        return 0
    args = settings(sys.argv[1:])
    server = http.server.ThreadingHTTPServer((args.host, args.port), handler(State(args)))
    print(f"fake_sglang_server: listening on {args.host}:{args.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
