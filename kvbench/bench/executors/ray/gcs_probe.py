"""Whether a ``HOST:PORT`` is a Ray GCS, asked in a bounded time before ``ray.init`` (which waits without end, deaf
to Ctrl-C, at a port that accepts connections but never answers as a GCS: a Ray dashboard, a Ray client server,
any other service).

The GCS is a gRPC server (HTTP/2 without TLS, unless ``RAY_USE_TLS`` is set). :func:`probe_gcs` opens one
connection and sends the HTTP/2 preface and one gRPC call, ``ray.rpc.NodeInfoGcsService/GetClusterId`` (an empty
request: what Ray's own client asks first), and reads the first frames of the answer: a GCS answers that call (with
the cluster id, or a refusal such as a missing authentication token); another gRPC server answers
``UNIMPLEMENTED``; an HTTP/1 server answers ``HTTP/1.x``; a silent port answers nothing. Only frame headers and
the call's own status are read: nothing a port sends is executed or kept.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Literal

#: HTTP/2's connection preface (RFC 9113 §3.4).
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
#: The call a GCS answers without a cluster id or a token check of its own.
GCS_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"
#: Frame types (RFC 9113 §6) the probe reads.
_DATA, _HEADERS, _SETTINGS, _GOAWAY = 0x0, 0x1, 0x4, 0x7
#: gRPC's status UNIMPLEMENTED: a gRPC server without the GCS's method.
_UNIMPLEMENTED = b"12"
#: Most bytes read from a port before it is judged.
MAX_ANSWER_BYTES = 64 * 1024

#: What a port turned out to be: ``gcs`` (it answered the GCS's call), ``grpc`` (a gRPC server without it),
#: ``http`` (an HTTP/1 server: a status line or a page), ``silent`` (no answer within the time), ``closed`` (it closed the connection), or
#: ``other`` (bytes that are neither HTTP/1 nor HTTP/2).
Answer = Literal["gcs", "grpc", "http", "silent", "closed", "other"]


def _frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _literal(name: str | int, value: str) -> bytes:
    """An HPACK literal header field without indexing (RFC 7541 §6.2.2), no Huffman coding: ``name`` an index of
    the static table or a new name. Values here are shorter than 127 bytes."""
    v = value.encode()
    head = bytes([name]) if isinstance(name, int) else b"\x00" + bytes([len(name)]) + name.encode()
    return head + bytes([len(v)]) + v


def _request(authority: str) -> bytes:
    """The preface, an empty SETTINGS frame and one gRPC call of :data:`GCS_METHOD` on stream 1."""
    headers = (b"\x83\x86"  # :method POST, :scheme http (static table 3 and 6)
               + _literal(4, GCS_METHOD) + _literal(1, authority[:120])  # :path, :authority
               + _literal("content-type", "application/grpc") + _literal("te", "trailers"))
    message = b"\x00" + struct.pack(">I", 0)  # gRPC framing: not compressed, 0 bytes (an empty protobuf)
    return (_PREFACE + _frame(_SETTINGS, 0, 0, b"") + _frame(_HEADERS, 0x4, 1, headers)
            + _frame(_DATA, 0x1, 1, message))


def _judge(data: bytes, ended: bool) -> Answer | None:
    """What ``data`` (all bytes read so far) says the port is; None while it cannot tell yet. ``ended``: no more
    bytes will come (the port closed the connection, or the time is up): an HTTP/2 server that sent its SETTINGS
    but not yet its answer then counts as a GCS (a busy one; ``ray.init`` decides)."""
    if not ended and len(data) < 5 and b"HTTP/".startswith(data):
        return None
    if data.startswith(b"HTTP/") or data.lstrip()[:1] == b"<":  # a status line, or an HTTP/0.9 page
        return "http"
    pos = 0
    while len(data) - pos >= 9:
        n, kind = int.from_bytes(data[pos:pos + 3], "big"), data[pos + 3]
        stream = int.from_bytes(data[pos + 5:pos + 9], "big") & 0x7FFFFFFF
        if pos == 0 and (kind != _SETTINGS or stream != 0 or n % 6):
            return "other"  # a server's first frame is its SETTINGS (RFC 9113 §3.4)
        if len(data) - pos - 9 < n:
            break
        payload = data[pos + 9:pos + 9 + n]
        pos += 9 + n
        if kind == _GOAWAY:
            return "other"
        if stream == 1 and kind == _DATA:
            return "gcs"  # a reply message: the method exists
        if stream == 1 and kind == _HEADERS:
            at = payload.find(b"grpc-status")
            if at < 0 or at + 11 >= len(payload):
                return "gcs"  # the headers of a reply that goes on: the method exists
            value = payload[at + 12:at + 12 + payload[at + 11]]  # trailers only: the call ended with this status
            return "grpc" if value == _UNIMPLEMENTED else "gcs"
    if len(data) >= MAX_ANSWER_BYTES:
        return "other"
    if not ended:
        return None
    if not data:
        return "closed"
    return "gcs" if pos > 0 else "other"


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
    with socket.create_connection((host, port), timeout=connect_s) as sock:
        end = time.monotonic() + answer_s
        data = b""
        try:
            sock.settimeout(max(0.01, end - time.monotonic()))
            sock.sendall(_request(f"[{host}]:{port}" if ":" in host else f"{host}:{port}"))
            while True:
                left = end - time.monotonic()
                if left <= 0:
                    return _judge(data, True) if data else "silent"
                sock.settimeout(left)
                chunk = sock.recv(MAX_ANSWER_BYTES - len(data))
                data += chunk
                found = _judge(data, not chunk)
                if found is not None:
                    return found
        except TimeoutError:
            return _judge(data, True) if data else "silent"
        except OSError:  # reset by the peer (an HTTP/1 server that read the preface as garbage, say)
            return _judge(data, True)


__all__ = ["Answer", "GCS_METHOD", "MAX_ANSWER_BYTES", "probe_gcs"]
