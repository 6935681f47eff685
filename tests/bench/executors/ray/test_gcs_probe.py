"""The Ray GCS probe's verdicts on what a port sends back (no Ray needed): gRPC servers whose headers are
HPACK-coded as grpc-go's and grpc-java's are (Huffman strings, indexed names), replies, and frames out of order."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import hpack
import pytest
from hyperframe.frame import DataFrame, HeadersFrame, SettingsFrame

from kvbench.bench.executors.ray.gcs_probe import probe_gcs


@contextlib.contextmanager
def answering(answer: bytes) -> Iterator[int]:
    """A port on 127.0.0.1 that reads what one client sends, answers ``answer`` and closes; its port."""
    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(answer)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1]
    finally:
        t.join(5)
        srv.close()


def settings() -> bytes:
    """A server's preface: its SETTINGS (max concurrent streams 100), and the ACK of the client's."""
    return SettingsFrame(0, {SettingsFrame.MAX_CONCURRENT_STREAMS: 100}).serialize() + \
        SettingsFrame(0, flags=["ACK"]).serialize()


def headers(fields: list[tuple[str, str]], end_stream: bool) -> bytes:
    """A HEADERS frame on stream 1, its block HPACK-coded with Huffman strings (as grpc-go and netty send)."""
    block = hpack.Encoder().encode(fields, huffman=True)
    assert b"grpc-status" not in block  # the name is not there as plain bytes
    return HeadersFrame(1, block, flags=["END_HEADERS", *(["END_STREAM"] if end_stream else [])]).serialize()


GRPC = [(":status", "200"), ("content-type", "application/grpc")]


@pytest.mark.parametrize(("answer", "verdict"), [
    # trailers only, UNIMPLEMENTED: another gRPC server (the GCS's method unknown to it)
    (settings() + headers([*GRPC, ("grpc-status", "12"), ("grpc-message", "unknown service")], True), "grpc"),
    # trailers only, UNAUTHENTICATED: a GCS that wants a token knows the method
    (settings() + headers([*GRPC, ("grpc-status", "16")], True), "gcs"),
    # a reply: headers, then a message
    (settings() + headers(GRPC, False) + DataFrame(1, b"\x00\x00\x00\x00\x02\x0a\x00").serialize(), "gcs"),
    # the answer's HEADERS before any SETTINGS: no HTTP/2 server's preface
    (headers([*GRPC, ("grpc-status", "0")], True), "other"),
    # SETTINGS, then the connection closed before the call's answer: an HTTP/2 server, judged by ray.init
    (settings(), "gcs"),
], ids=["unimplemented", "unauthenticated", "reply", "headers-first", "settings-then-closed"])
def test_the_probe_reads_the_call_s_status_whatever_its_hpack_coding(answer, verdict):
    with answering(answer) as port:
        assert probe_gcs("127.0.0.1", port, 2.0, 5.0) == verdict
