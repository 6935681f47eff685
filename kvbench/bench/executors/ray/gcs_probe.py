"""Whether a ``HOST:PORT`` is a Ray GCS, asked in a bounded time before ``ray.init`` (which waits without end, deaf
to Ctrl-C, at a port that accepts connections but never answers as a GCS: a Ray dashboard, a Ray client server,
any other service).

The GCS is a gRPC server (HTTP/2 without TLS, unless ``RAY_USE_TLS`` is set). :func:`probe_gcs` opens one
connection and sends, through the HTTP/2 protocol library ``h2`` (python-hyper: framing and HPACK), the connection
preface and one gRPC call, ``ray.rpc.NodeInfoGcsService/GetClusterId`` (an empty request: what Ray's own client
asks first), and reads the first frames of the answer: a GCS answers that call (with the cluster id, or a refusal
such as a missing authentication token); another gRPC server answers ``UNIMPLEMENTED``; an HTTP/1 server answers
``HTTP/1.x``; a silent port answers nothing. At most :data:`MAX_ANSWER_BYTES` are read and only the call's
headers are looked at: nothing a port sends is executed or kept.
"""

from __future__ import annotations

import socket
import time
from typing import Literal

import h2.config
import h2.connection
import h2.events
import h2.exceptions

#: The call a GCS answers without a cluster id or a token check of its own.
GCS_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"
#: gRPC's status UNIMPLEMENTED: a gRPC server without the GCS's method.
_UNIMPLEMENTED = b"12"
#: Most bytes read from a port before it is judged.
MAX_ANSWER_BYTES = 64 * 1024

#: What a port turned out to be: ``gcs`` (it answered the GCS's call), ``grpc`` (a gRPC server without it),
#: ``http`` (an HTTP/1 server: a status line or a page), ``silent`` (no answer within the time), ``closed`` (it
#: closed the connection), or ``other`` (bytes that are neither HTTP/1 nor HTTP/2).
Answer = Literal["gcs", "grpc", "http", "silent", "closed", "other"]


class _Call:
    """One gRPC call of :data:`GCS_METHOD` on a new HTTP/2 connection, and what the bytes that came back say."""

    def __init__(self, authority: str):
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.h2.initiate_connection()
        self.h2.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":path", GCS_METHOD),
                                 (":authority", authority), ("content-type", "application/grpc"), ("te", "trailers")])
        self.h2.send_data(1, b"\x00\x00\x00\x00\x00", end_stream=True)  # not compressed, 0 bytes: an empty message
        self.read, self.settings = 0, False
        self.head: bytes | None = b""  # the answer's first bytes, held until they show whether it is HTTP/1

    def request(self) -> bytes:
        """The bytes to send: the preface, SETTINGS, the call's HEADERS and DATA."""
        return self.h2.data_to_send()

    def judge(self, chunk: bytes) -> Answer | None:
        """What the port is, given its next ``chunk`` (b"": no more will come: it closed, or the time is up); None
        while it cannot tell yet. An HTTP/2 server that sent its SETTINGS but not yet its answer when no more
        comes counts as a GCS (a busy one; ``ray.init`` decides)."""
        ended, self.read = not chunk, self.read + len(chunk)
        if self.head is not None:
            self.head += chunk
            if self.head.startswith(b"HTTP/") or self.head.lstrip()[:1] == b"<":  # a status line, an HTTP/0.9 page
                return "http"
            if not ended and (b"HTTP/".startswith(self.head) or not self.head.strip()):
                return None
            chunk, self.head = self.head, None
        try:
            events = self.h2.receive_data(chunk) if chunk else []
        except h2.exceptions.H2Error:  # not HTTP/2: a first frame that is no SETTINGS, a bad header block...
            return "other"
        for event in events:
            if isinstance(event, h2.events.RemoteSettingsChanged):
                self.settings = True
            elif not self.settings:
                return "other"  # a server's first frame is its SETTINGS (RFC 9113 §3.4)
            elif isinstance(event, (h2.events.ConnectionTerminated, h2.events.StreamReset)):
                return "other"
            elif isinstance(event, h2.events.ResponseReceived):  # with a status: trailers only, the call ended
                status = dict(event.headers).get(b"grpc-status")  # without: a reply goes on, the method exists
                return "grpc" if status == _UNIMPLEMENTED else "gcs"
            elif isinstance(event, h2.events.DataReceived):
                return "gcs"  # a reply message: the method exists
        if self.read >= MAX_ANSWER_BYTES:
            return "other"
        if not ended:
            return None
        if not self.read:
            return "closed"
        return "gcs" if self.settings else "other"


def probe_gcs(host: str, port: int, connect_s: float, answer_s: float) -> Answer:
    """Ask ``host:port`` whether it is a Ray GCS (see the module docstring).

    Args:
        connect_s: seconds to wait for the TCP connection.
        answer_s: seconds to wait, once connected, for the answer.

    Returns:
        What the port is (:data:`Answer`).

    Raises:
        OSError: the connection cannot be made (refused, unreachable, not within ``connect_s``, a name that does
            not resolve).
    """
    call = _Call(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    with socket.create_connection((host, port), timeout=connect_s) as sock:
        end = time.monotonic() + answer_s
        try:
            sock.settimeout(max(0.01, end - time.monotonic()))
            sock.sendall(call.request())
            while True:
                left = end - time.monotonic()
                if left <= 0:
                    return call.judge(b"") if call.read else "silent"
                sock.settimeout(left)
                found = call.judge(sock.recv(MAX_ANSWER_BYTES - call.read))
                if found is not None:
                    return found
        except TimeoutError:
            return call.judge(b"") if call.read else "silent"
        except OSError:  # reset by the peer (an HTTP/1 server that read the preface as garbage, say)
            return call.judge(b"")


__all__ = ["Answer", "GCS_METHOD", "MAX_ANSWER_BYTES", "probe_gcs"]
