"""How kvbench talks HTTP to a server it measures: never through a proxy the environment names (``HTTP_PROXY``,
``ALL_PROXY``...: a proxy would see every prompt and add its latency to every TTFT) unless an ``openai`` engine
opts in, no redirects followed, and no page held past :data:`MAX_PAGE_BYTES`."""

from __future__ import annotations

import httpx
import orjson

from kvbench.bench.engines.server.stream import printable

#: The most of a ``/metrics`` page or a ``/v1/models`` reply kvbench reads (bytes); a longer one counts as not
#: read (vLLM's page is some 100 KiB).
MAX_PAGE_BYTES = 16 * 2**20


def server_client(trust_env: bool = False, headers: dict[str, str] | None = None) -> httpx.Client:
    """A client for one server: environment proxies only with ``trust_env``, no redirects followed, ``headers``
    on every request (the key a server kvbench started checks)."""
    return httpx.Client(trust_env=trust_env, follow_redirects=False, headers=headers)


def _grow(got: bytearray, chunk: bytes) -> bool:
    """Add ``chunk`` to ``got``; False once ``got`` is past :data:`MAX_PAGE_BYTES`."""
    got += chunk
    return len(got) <= MAX_PAGE_BYTES


def get_page(url: str, trust_env: bool = False, timeout_s: float = 10.0,
             headers: dict[str, str] | None = None) -> str | None:
    """The text of ``GET url`` (UTF-8, an invalid byte as U+FFFD) sent with ``headers``, or None for a status
    other than 200, a body over :data:`MAX_PAGE_BYTES`, or no reply within ``timeout_s`` seconds per wait.
    Raises nothing."""
    try:
        with server_client(trust_env, headers) as c, c.stream("GET", url, timeout=timeout_s) as r:
            got = bytearray()
            if r.status_code != 200 or not all(_grow(got, chunk) for chunk in r.iter_bytes()):
                return None
            return got.decode("utf-8", errors="replace")
    except httpx.HTTPError:
        return None


async def get_page_async(client: httpx.AsyncClient, url: str, timeout_s: float = 10.0) -> str | None:
    """:func:`get_page` on an open async ``client`` (whose proxy setting applies)."""
    try:
        async with client.stream("GET", url, timeout=timeout_s) as r:
            got = bytearray()
            if r.status_code != 200:
                return None
            async for chunk in r.aiter_bytes():
                if not _grow(got, chunk):
                    return None
            return got.decode("utf-8", errors="replace")
    except httpx.HTTPError:
        return None


def unreachable(url: str, trust_env: bool = False, timeout_s: float = 10.0) -> str | None:
    """Why nothing answers ``GET url`` (the error's name and first 200 characters), or None when something does,
    whatever its status; the body is not read. Raises nothing."""
    try:
        with server_client(trust_env) as c, c.stream("GET", url, timeout=timeout_s):
            return None
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {printable(str(exc), 200)}"


def served_model(text: str | None) -> str | None:
    """The first model id of an OpenAI ``/v1/models`` reply's text (``data[0].id``), or None."""
    try:
        return str(orjson.loads(text or "")["data"][0]["id"])
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return None


def served_version(text: str | None) -> str | None:
    """The ``version`` of a server's version endpoint's JSON text (vLLM ``/version``), or None."""
    try:
        return printable(str(orjson.loads(text or "")["version"]), 200)
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
