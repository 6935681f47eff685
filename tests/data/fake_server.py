"""A stand-in for a serving engine in tests of :mod:`kvbench.bench.engines.server.process`.

Listens with Python's http.server on ``--host``/``--port``; GET /health answers 503 for ``--loading-s`` seconds
after start, then 200 ``{"status":"ok"}``. ``--fail MSG`` prints MSG on stderr and exits with status 3 at once;
``--hang`` never becomes healthy (503 forever); ``--ignore-term`` ignores SIGTERM; ``--child`` spawns one child
process that sleeps for an hour (its pid is printed on stderr as ``child pid N``). A port that cannot be bound
prints ``fake_server: cannot bind HOST:PORT: <the system's words>`` on stderr and exits with status 1.
"""

from __future__ import annotations

import argparse
import http.server
import json
import signal
import subprocess
import sys
import time


def main() -> int:
    """Parse the options and serve until killed; returns the exit status for the early exits."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--loading-s", type=float, default=0.0)
    ap.add_argument("--fail", default=None)
    ap.add_argument("--hang", action="store_true")
    ap.add_argument("--ignore-term", action="store_true")
    ap.add_argument("--child", action="store_true")
    args = ap.parse_args()
    if args.fail is not None:
        print(args.fail, file=sys.stderr, flush=True)
        return 3
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.child:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
        print(f"child pid {child.pid}", file=sys.stderr, flush=True)
    ready_at = float("inf") if args.hang else time.monotonic() + args.loading_s

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path != "/health":
                self._reply(404, {"error": "not found"})
            elif time.monotonic() < ready_at:
                self._reply(503, {"error": {"code": 503, "message": "Loading model"}})
            else:
                self._reply(200, {"status": "ok"})

        def _reply(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    try:
        server = http.server.ThreadingHTTPServer((args.host, args.port), Handler)
    except OSError as e:
        print(f"fake_server: cannot bind {args.host}:{args.port}: {e}", file=sys.stderr, flush=True)
        return 1
    print(f"fake_server: listening on {args.host}:{args.port}", file=sys.stderr, flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
