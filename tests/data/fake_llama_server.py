#!/usr/bin/env python3
"""A stand-in for llama.cpp's ``llama-server`` in kvbench's end-to-end server tests (standard library only: it
runs under whichever ``python3`` is first on PATH).

Command line: kvbench's (``-m PATH --host H --port P --metrics -c N -np N --seed N``, ``--cache-ram MiB``,
``--slot-save-path DIR``, ``-t N``, ``--api-key-file FILE``: keys one per line, ``#`` comments; with them every
endpoint but ``/health`` answers 401 without ``Authorization: Bearer <key>``); other flags are ignored, but ``--bad-flag`` prints ``error: invalid argument:
--bad-flag`` and exits 1 as llama-server does; ``--version`` prints ``version: 0.0.0 (fake llama-server)`` on
stderr; a missing model file or slot directory exits 1. Endpoints, with llama-server's (build 11434) JSON fields:
``GET /health``; ``GET /metrics`` (with ``--metrics``; ``llamacpp:prompt_tokens_total`` excludes cached tokens);
``POST /completion``: SSE, one ``data:`` chunk per token (``content`` " t<id>", ``tokens`` [id], ``stop`` false,
``tokens_predicted``), then one with ``stop`` true, ``stop_type`` "limit" and ``timings`` (``cache_n``,
``prompt_n``, ``prompt_ms``, ``predicted_n``, ``predicted_ms``, ``predicted_per_token_ms``). Step k's id is
(sum(prompt) + k) % 1000. Each of the ``-np`` slots keeps its last prompt; with ``cache_prompt`` true (the
default) a request reuses the common prefix of its prompt with its slot's, less one when that is the whole prompt
(llama.cpp recomputes the last token). A request takes slot ``id_slot`` if given, else the idle slot sharing the
longest prefix, then the least recently used; it waits while none is idle. A prompt that does not fit a slot's
context (``-c`` / ``-np``) with ``n_predict`` gets 400. ``POST /slots/<id>?action=save|restore|erase`` (with
``--slot-save-path``; body ``{"filename": NAME}``) saves / restores the slot's tokens (replies: ``n_saved``,
``n_written``, ``timings.save_ms``; ``n_restored``, ``n_read``, ``timings.restore_ms``).

Environment, read at start (N counts this server's /completion requests from 1): ``FAKE_CRASH_AFTER=N`` exits
(status 1) right after the N-th completion; ``FAKE_HTTP_500=N`` answers the N-th with HTTP 500 and a JSON body;
``FAKE_TRUNCATE=N`` ends the N-th stream after one token without its ``stop`` chunk; ``FAKE_HANG=N`` never answers
the N-th; ``FAKE_CACHED_COLD=1`` reports ``cache_n`` ≥ 16 even with ``cache_prompt`` false; ``FAKE_CACHE_SHIFT=1``
adds 1 to the ids of a request that reused cached tokens; ``FAKE_SEPARATORS=1`` puts U+2028, U+2029 and U+0085 raw
(as llama-server's JSON writer leaves them) in every token's text; the N-th stream of ``FAKE_ENDLESS=N`` sends
tokens past ``n_predict`` for ever, of ``FAKE_PINGS=N`` only ``: ping`` comments for ever, of
``FAKE_GIANT_LINE=N`` one line of 17 MiB without a line end (then waits); ``FAKE_GIANT_METRICS=1`` makes
``/metrics`` a page of 17 MiB; ``FAKE_TOKEN_DELAY_S`` (default 0.002) is the seconds
per token, ``FAKE_PROMPT_S_PER_TOKEN`` (default 2e-5) per processed prompt token, ``FAKE_RESTORE_DELAY_S``
(default 0) the seconds a slot restore takes (reported as its ``restore_ms``); ``FAKE_RECORD=PATH`` gets one JSON
line per completion and slot action (port, prompt ids, ``cache_n``, times). Every request is logged on stdout.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import sys
import threading
import time
import urllib.parse
from pathlib import Path

VERSION = "version: 0.0.0 (fake llama-server)"
#: Seconds per processed (not cached) prompt token.
PROMPT_S_PER_TOKEN = float(os.environ.get("FAKE_PROMPT_S_PER_TOKEN") or 2e-5)
#: Seconds a slot restore takes.
RESTORE_DELAY_S = float(os.environ.get("FAKE_RESTORE_DELAY_S") or 0)
#: The least cache_n reported under FAKE_CACHED_COLD.
COLD_CACHED = 16
COUNTERS = (  # (name, type, help) as llama-server's /metrics has them
    ("prompt_tokens_total", "counter", "Number of prompt tokens processed, excluding cached tokens"),
    ("prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache"),
    ("prompt_seconds_total", "counter", "Total time spent processing prompts"),
    ("tokens_predicted_total", "counter", "Number of generation tokens processed"),
    ("tokens_predicted_seconds_total", "counter", "Total time spent generating tokens"),
    ("n_decode_total", "counter", "Total number of llama_decode() calls"),
)


#: The behaviours set in the environment (see the module docstring), read at start.
ENV = {name: int(os.environ.get(name) or 0) for name in ("FAKE_CRASH_AFTER", "FAKE_HTTP_500", "FAKE_TRUNCATE",
                                                         "FAKE_HANG", "FAKE_CACHED_COLD", "FAKE_CACHE_SHIFT",
                                                         "FAKE_SEPARATORS", "FAKE_ENDLESS", "FAKE_PINGS",
                                                         "FAKE_GIANT_LINE", "FAKE_GIANT_METRICS")}
#: The bytes of FAKE_GIANT_LINE's line and FAKE_GIANT_METRICS's page.
GIANT_BYTES = 17 * 2**20
TOKEN_DELAY_S = float(os.environ.get("FAKE_TOKEN_DELAY_S") or 0.002)


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading ids ``a`` and ``b`` share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


class State:
    """The server's slots (their tokens, busy flags, last use), counters and the record file, under one lock."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.cond = args, threading.Condition()
        self.tokens: list[list[int]] = [[] for _ in range(args.parallel)]
        self.busy, self.used = [False] * args.parallel, [0.0] * args.parallel
        self.received = self.finished = 0
        self.metrics = {name: 0.0 for name, _, _ in COUNTERS}
        self.record_path = os.environ.get("FAKE_RECORD")

    def record(self, event: dict) -> None:
        """Append ``event`` (with the port) to the FAKE_RECORD file, if one was given."""
        if self.record_path:
            with self.cond, open(self.record_path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"port": self.args.port, **event}) + "\n")

    def take_slot(self, prompt: list[int], wanted: int, reuse: bool) -> int:
        """Wait for an idle slot (``wanted`` if ≥ 0, else the one sharing the longest prefix when ``reuse``, then
        the least recently used), mark it busy and return its index."""
        with self.cond:
            while True:
                idle = [i for i in range(len(self.busy)) if not self.busy[i] and wanted in (-1, i)]
                if idle:
                    best = max(idle, key=lambda i: (common_prefix(self.tokens[i], prompt) if reuse else 0,
                                                    -self.used[i]))
                    self.busy[best] = True
                    return best
                self.cond.wait()

    def free_slot(self, slot: int, tokens: list[int] | None) -> None:
        """Mark ``slot`` idle, holding ``tokens`` when given."""
        with self.cond:
            if tokens is not None:
                self.tokens[slot] = tokens
            self.busy[slot], self.used[slot] = False, time.monotonic()
            self.cond.notify_all()


_SAY = threading.Lock()


def say(text: str) -> None:
    """One line of the server's log (stdout), whole even when handler threads log at once."""
    with _SAY:
        sys.stdout.write(f"fake llama-server: {text}\n")
        sys.stdout.flush()


class Handler(http.server.BaseHTTPRequestHandler):
    """llama-server's endpoints over HTTP/1.1 (keep-alive; streams chunked)."""

    protocol_version = "HTTP/1.1"
    state: State
    slot: int | None = None  # the slot the request being answered holds

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (http.server's name)
        """Quiet: the server logs its own lines."""

    def _json(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, code: int, kind: str, message: str) -> None:
        self._json(code, {"error": {"code": code, "message": message, "type": kind}})

    def _body(self) -> dict:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return {}
        return body if isinstance(body, dict) else {}

    def _refused(self) -> bool:
        """llama-server's key check: with keys, every endpoint but /health wants ``Bearer <key>`` (401 else)."""
        given = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
        if not self.state.args.keys or urllib.parse.urlsplit(self.path).path == "/health" or \
                given in self.state.args.keys:
            return False
        self._error(401, "authentication_error", "Invalid API Key")
        return True

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        """/health and /metrics."""
        path = urllib.parse.urlsplit(self.path).path
        if self._refused():
            return
        if path == "/health":
            self._json(200, {"status": "ok"})
        elif path == "/metrics":
            if not self.state.args.metrics:
                self._error(501, "not_supported_error", "This server does not support metrics endpoint. Start it "
                            "with `--metrics`")
                return
            with self.state.cond:
                lines = [f"# HELP llamacpp:{n} {h}\n# TYPE llamacpp:{n} {t}\nllamacpp:{n} {self.state.metrics[n]:g}"
                         for n, t, h in COUNTERS]
            data = ("\n".join(lines) + "\n").encode()
            if ENV["FAKE_GIANT_METRICS"]:
                data += b"# " + b"x" * GIANT_BYTES + b"\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self._error(404, "not_found_error", "File Not Found")

    def do_POST(self) -> None:  # noqa: N802
        """/completion and /slots/<id>."""
        url = urllib.parse.urlsplit(self.path)
        body = self._body()
        if self._refused():
            return
        if url.path == "/completion":
            self._completion(body)
        elif url.path.startswith("/slots/"):
            self._slot_action(url.path.removeprefix("/slots/"), urllib.parse.parse_qs(url.query), body)
        else:
            self._error(404, "not_found_error", "File Not Found")

    def _chunk(self, event: dict) -> None:
        data = f"data: {json.dumps(event, ensure_ascii=not ENV['FAKE_SEPARATORS'])}\n\n".encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _completion(self, body: dict) -> None:
        st, args = self.state, self.state.args
        with st.cond:
            st.received += 1
            k = st.received
        prompt, n_predict = body.get("prompt"), body.get("n_predict", -1)
        reuse = body.get("cache_prompt", True) is not False
        say(f"request {k}: /completion of {len(prompt) if isinstance(prompt, list) else '?'} prompt tokens, "
            f"n_predict {n_predict}, cache_prompt {str(reuse).lower()}")
        if k == ENV["FAKE_HANG"]:
            say(f"request {k}: hanging (FAKE_HANG)")
            threading.Event().wait()
        if k == ENV["FAKE_HTTP_500"]:
            self._error(500, "server_error", f"fake failure of completion request {k} (FAKE_HTTP_500)")
            return
        if not isinstance(prompt, list) or not all(type(t) is int for t in prompt) or type(n_predict) is not int \
                or n_predict < 1:
            self._error(400, "invalid_request_error", "prompt must be a list of token ids and n_predict >= 1")
            return
        n_ctx = args.ctx_size // args.parallel
        if len(prompt) + n_predict > n_ctx:
            self._error(400, "exceed_context_size_error", f"the request exceeds the available context size "
                        f"({len(prompt)} prompt tokens + {n_predict} > {n_ctx} per slot)")
            return
        t_start = time.time()
        self.slot = slot = st.take_slot(prompt, int(body.get("id_slot", -1)), reuse)
        try:
            self._generate(k, slot, prompt, n_predict, reuse, t_start)
        finally:
            self._release(prompt)  # where the stream was cut or the client went away

    def _release(self, tokens: list[int]) -> None:
        """Free the slot this request holds (once), holding ``tokens``."""
        if self.slot is not None:
            self.state.free_slot(self.slot, tokens)
            self.slot = None

    def _generate(self, k: int, slot: int, prompt: list[int], n_predict: int, reuse: bool, t_start: float) -> None:
        """Stream the reply of request ``k`` from ``slot``. The counters, the record and the slot are updated
        before the last chunk goes out, so that whatever the client does next sees them."""
        st = self.state
        n = len(prompt)
        lcp = common_prefix(st.tokens[slot], prompt)
        cache_n = min(lcp, n - 1) if reuse else min(n - 1, max(lcp, COLD_CACHED)) if ENV["FAKE_CACHED_COLD"] \
            else 0
        prompt_s = (n - cache_n) * PROMPT_S_PER_TOKEN
        time.sleep(prompt_s)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        shift = 1 if cache_n and ENV["FAKE_CACHE_SHIFT"] else 0
        ids = [(sum(prompt) + step + shift) % 1000 for step in range(n_predict)]
        t0 = time.monotonic()
        try:
            self._hostile(k, n_predict)
            for step, tid in enumerate(ids):
                time.sleep(TOKEN_DELAY_S)
                text = f" t{tid}\u2028\u2029\u0085" if ENV["FAKE_SEPARATORS"] else f" t{tid}"
                self._chunk({"index": 0, "content": text, "tokens": [tid], "stop": False, "id_slot": -1,
                             "tokens_predicted": step + 1, "tokens_evaluated": n})
                if k == ENV["FAKE_TRUNCATE"]:
                    say(f"request {k}: stream cut after {step + 1} tokens (FAKE_TRUNCATE)")
                    self.wfile.write(b"0\r\n\r\n")
                    return
            predicted_s = time.monotonic() - t0
            with st.cond:
                st.finished += 1
                done = st.finished
                for name, v in zip(st.metrics, (n - cache_n, cache_n, prompt_s, n_predict, predicted_s, n_predict)):
                    st.metrics[name] += v
            st.record({"event": "completion", "request": k, "slot": slot, "prompt": prompt, "n_predict": n_predict,
                       "cache_prompt": reuse, "cache_n": cache_n, "ids": ids, "start": t_start, "end": time.time()})
            say(f"request {k}: slot {slot}, prompt {n} tokens, cache_n {cache_n}, predicted {n_predict}")
            self._release(prompt)
            self._chunk({"index": 0, "content": "", "tokens": [], "id_slot": slot, "stop": True,
                         "model": st.args.model, "tokens_predicted": n_predict, "tokens_evaluated": n,
                         "stop_type": "limit", "stopping_word": "", "tokens_cached": n + n_predict - 1,
                         "timings": {"cache_n": cache_n, "prompt_n": n - cache_n, "prompt_ms": 1000 * prompt_s,
                                     "prompt_per_token_ms": 1000 * PROMPT_S_PER_TOKEN,
                                     "predicted_n": n_predict, "predicted_ms": 1000 * predicted_s,
                                     "predicted_per_token_ms": 1000 * predicted_s / n_predict}})
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            say(f"request {k}: the client went away")
            return
        if done == ENV["FAKE_CRASH_AFTER"]:
            say(f"exiting after {done} completions (FAKE_CRASH_AFTER)")
            os._exit(1)

    def _hostile(self, k: int, n_predict: int) -> None:
        """The never-ending streams of request ``k`` (FAKE_ENDLESS, FAKE_PINGS, FAKE_GIANT_LINE): they return only
        when the client goes away (BrokenPipeError)."""
        if k == ENV["FAKE_ENDLESS"]:
            say(f"request {k}: tokens for ever (FAKE_ENDLESS)")
            step = 0
            while True:
                step += 1
                time.sleep(TOKEN_DELAY_S)
                self._chunk({"index": 0, "content": " t1", "tokens": [1], "stop": False, "tokens_predicted": step})
        if k == ENV["FAKE_PINGS"]:
            say(f"request {k}: keep-alive comments for ever (FAKE_PINGS)")
            while True:
                time.sleep(0.05)
                self.wfile.write(b"8\r\n: ping\n\n\r\n")
                self.wfile.flush()
        if k == ENV["FAKE_GIANT_LINE"]:
            say(f"request {k}: a line of {GIANT_BYTES} bytes (FAKE_GIANT_LINE)")
            data = b"data: " + b"x" * GIANT_BYTES
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()
            while True:
                time.sleep(0.05)
                self.wfile.write(b"1\r\nx\r\n")
                self.wfile.flush()

    def _slot_action(self, slot_text: str, query: dict, body: dict) -> None:
        st, args = self.state, self.state.args
        if args.slot_save_path is None:
            self._error(501, "not_supported_error", "This server does not support slots action. Start it with "
                        "`--slot-save-path`")
            return
        action, name = (query.get("action") or [""])[0], body.get("filename")
        if not slot_text.isdigit() or int(slot_text) >= args.parallel:
            self._error(400, "invalid_request_error", "Invalid slot ID")
            return
        if action not in ("save", "restore"):
            self._error(400, "invalid_request_error", "Invalid action")
            return
        if not isinstance(name, str) or not name.strip() or name != name.strip() or "/" in name or "\\" in name \
                or name.endswith("."):
            self._error(400, "invalid_request_error", "Invalid filename")
            return
        slot, path, t0 = int(slot_text), Path(args.slot_save_path) / name, time.monotonic()
        if action == "restore" and not path.is_file():
            self._error(400, "invalid_request_error", f"Failed to restore slot: no file {name}")
            return
        st.take_slot([], slot, False)
        if action == "save":
            tokens, data = None, json.dumps(st.tokens[slot]).encode()
            path.write_bytes(data)
            n, reply = len(st.tokens[slot]), {"n_saved": len(st.tokens[slot]), "n_written": len(data),
                                              "timings": {"save_ms": 1000 * (time.monotonic() - t0)}}
        else:
            data = path.read_bytes()
            tokens = json.loads(data)
            time.sleep(RESTORE_DELAY_S)
            n, reply = len(tokens), {"n_restored": len(tokens), "n_read": len(data),
                                     "timings": {"restore_ms": 1000 * (time.monotonic() - t0)}}
        st.free_slot(slot, tokens)
        st.record({"event": action, "slot": slot, "filename": name, "n": n, "time": time.time()})
        say(f"slot {slot}: {action} {name} ({n} tokens)")
        self._json(200, {"id_slot": slot, "filename": name, **reply})


def parse(argv: list[str]) -> argparse.Namespace:
    """The options kvbench passes (others are ignored); exits for ``--version``, ``--bad-flag``, a missing model
    file or slot directory."""
    if "--version" in argv:
        print(VERSION, file=sys.stderr)
        sys.exit(0)
    if "--bad-flag" in argv:
        print("error: invalid argument: --bad-flag", file=sys.stderr)
        sys.exit(1)
    ap = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--metrics", action="store_true")
    ap.add_argument("--slot-save-path", default=None)
    ap.add_argument("--api-key-file", default=None)
    for flags, default in ((("--port",), 8080), (("-c", "--ctx-size"), 4096), (("-np", "--parallel"), 1),
                           (("--seed",), -1), (("--cache-ram",), 8192), (("-t", "--threads"), 1)):
        ap.add_argument(*flags, type=int, default=default)
    args, ignored = ap.parse_known_args(argv)
    if not Path(args.model).is_file():
        print(f"error: failed to open model file {args.model}", file=sys.stderr)
        sys.exit(1)
    if args.slot_save_path is not None and not Path(args.slot_save_path).is_dir():
        print(f'error while handling argument "--slot-save-path": not a directory: {args.slot_save_path}',
              file=sys.stderr)
        sys.exit(1)
    if ignored:
        say(f"ignoring arguments {' '.join(ignored)}")
    args.keys = ({k.strip() for k in Path(args.api_key_file).read_text().splitlines() if k.strip()[:1] not in ("", "#")}
                 if args.api_key_file else set())
    return args


def main() -> int:
    """Serve until killed (SIGTERM's default action ends the process)."""
    args = parse(sys.argv[1:])
    Handler.state = State(args)
    server = http.server.ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    say(f"listening on http://{args.host}:{args.port}, {args.parallel} slots of {args.ctx_size // args.parallel} "
        f"tokens, cache-ram {args.cache_ram} MiB, threads {args.threads}, seed {args.seed}")
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
