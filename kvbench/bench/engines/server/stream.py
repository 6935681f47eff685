"""Server-sent events (the ``text/event-stream`` bodies of llama-server, vLLM and SGLang) read as JSON events.

Every serving engine kvbench drives streams one event per ``data:`` line: a JSON object, and (OpenAI endpoints)
a final ``data: [DONE]``. :func:`iter_events` turns the lines of such a body into ``(line number, event)`` pairs
as each line arrives, so that the caller can read its clock right after each event. Nothing read from a server
is ever executed or interpreted: a JSON object is data, and text quoted in an error message is made printable
(:func:`printable`) and cut, never rendered as markup.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import orjson

from kvbench.errors import UserError

DONE = "[DONE]"
"""The data of the OpenAI endpoints' last event (``data: [DONE]``)."""

#: The longest line of a stream kvbench holds (bytes): a longer one fails the request (a server's biggest event,
#: llama-server's last chunk with its settings and timings, is a few KiB; a prompt's text in it some 100 KiB).
MAX_LINE_BYTES = 4 * 2**20
#: The line ends of server-sent events (the WHATWG grammar): CRLF, CR or LF, never a Unicode line separator
#: (U+2028, U+2029, U+0085), which JSON writers leave raw inside strings.
_LINE_END = re.compile(rb"\r\n|\r|\n")

#: SSE fields a server may send that carry nothing kvbench reads (``event:`` names, ``id:`` and ``retry:``).
_IGNORED_FIELDS = frozenset(("event", "id", "retry"))


class ServerReplyError(UserError, RuntimeError):
    """A serving engine's reply that kvbench cannot use: an HTTP error status, no reply in time, a connection
    refused or lost, a malformed or truncated stream, an error reported in the stream, or a wrong number of
    generated tokens. The message is complete and names the URL and the cause; ``url`` is the URL ("" where the
    caller did not give one); ``lost``: the connection was refused, closed or reset."""

    def __init__(self, message: str, url: str = "", lost: bool = False):
        super().__init__(message)
        self.url = url
        #: the connection was refused, closed or reset (the server may be exiting)
        self.lost = lost


class StreamError(ServerReplyError):
    """A stream that breaks the server-sent-events format: a line that is no SSE field, a ``data:`` line that is
    not one JSON object. ``line`` is the body's line number (1-based), ``excerpt`` the line's first 200
    characters (made printable)."""

    def __init__(self, source: str, line: int, why: str, excerpt: str):
        super().__init__(f"{source}: line {line} of the stream {why}: {excerpt!r}", source)
        self.line, self.excerpt = line, excerpt


def printable(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters (an ellipsis "…" marks a cut) with every control character other than
    a newline or a tab replaced by U+FFFD, so that quoting a server's words cannot move a terminal's cursor or
    change its colours. Brackets and angle brackets are kept as they are: callers print the result as plain
    text, never as markup. Raises nothing."""
    cut = text[:limit]
    clean = "".join(c if c.isprintable() or c in "\n\t" else "\ufffd" for c in cut)
    return clean + "…" if len(text) > limit else clean


async def sse_lines(chunks: AsyncIterator[bytes], *, source: str = "the server",
                    max_line_bytes: int = MAX_LINE_BYTES) -> AsyncIterator[str]:
    """The lines of a server-sent-events body arriving as byte ``chunks`` (``httpx.Response.aiter_bytes()``),
    without their line ends, each decoded as UTF-8 (an invalid byte becomes U+FFFD), as soon as its end has
    arrived. A line ends at CRLF, CR or LF only, as the SSE grammar says: a token's text may hold U+2028, U+2029
    or U+0085, which ``str.splitlines`` (and so httpx's ``aiter_lines``) would take for line ends. A CR at the end
    of a chunk waits for the next chunk (it may be half of a CRLF).

    Raises :class:`StreamError` (``source`` starts its message) as soon as more than ``max_line_bytes`` bytes
    arrive without a line end: nothing a server sends makes kvbench hold more than that in one line."""
    buf, number, scanned = bytearray(), 0, 0  # scanned: bytes of buf searched for a line end already
    async for chunk in chunks:
        buf += chunk
        pos = 0
        while (m := _LINE_END.search(buf, max(pos, scanned))) is not None and not (
                m.group() == b"\r" and m.end() == len(buf)):
            if m.start() - pos > max_line_bytes:
                break
            number += 1
            yield buf[pos:m.start()].decode("utf-8", errors="replace")
            pos = scanned = m.end()
        del buf[:pos]
        scanned = max(0, len(buf) - 1)  # a CR at the end may start a CRLF
        if len(buf) > max_line_bytes:
            raise StreamError(source, number + 1, f"is longer than {max_line_bytes:,} bytes (a server-sent event "
                              "is far shorter; kvbench reads no further)",
                              printable(bytes(buf[:200]).decode("utf-8", errors="replace"), 200))
    if buf:
        yield bytes(buf.rstrip(b"\r")).decode("utf-8", errors="replace")


async def iter_events(lines: AsyncIterator[str], *,
                      source: str = "the server") -> AsyncIterator[tuple[int, dict | str]]:
    """The events of a server-sent-events body, as ``(line number, event)``: ``event`` is the parsed JSON object
    of one ``data:`` line, or the string :data:`DONE` for ``data: [DONE]``. Line numbers count from 1 over every
    line of ``lines`` (blank lines and comments included), so they match the body as recorded.

    ``lines`` yields the body's lines without their line ends (:func:`sse_lines`). Blank lines,
    comments (lines starting with ``:``, e.g. llama-server's keep-alive pings) and the ``event:``, ``id:`` and
    ``retry:`` fields are skipped. Each ``data:`` line is parsed as it arrives (one event per line, the way
    llama-server, vLLM and SGLang write them; an event spread over several ``data:`` lines is not supported).
    ``source`` (the URL) starts every error message.

    Raises :class:`StreamError` for a line that is no SSE field (e.g. a plain JSON body: the server did not
    stream), a ``data:`` line that is not JSON, or JSON that is not an object; the message gives the line
    number and the line's first 200 characters.
    """
    number = 0
    async for line in lines:
        number += 1
        if line.startswith("data:"):
            data = line[6:] if line.startswith("data: ") else line[5:]
            if data == DONE:
                yield number, DONE
                continue
            try:
                event = orjson.loads(data)
            except orjson.JSONDecodeError as e:
                raise StreamError(source, number, f"is not JSON ({e})", printable(line, 200)) from None
            if not isinstance(event, dict):
                raise StreamError(source, number, "is JSON but not an object", printable(line, 200))
            yield number, event
        elif not line or line.startswith(":") or line.partition(":")[0] in _IGNORED_FIELDS:
            continue
        else:
            raise StreamError(source, number, "is no server-sent-event field (the server did not stream?)",
                              printable(line, 200))
