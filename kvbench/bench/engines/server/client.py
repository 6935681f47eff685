"""One streamed completion request to a serving engine, timed token by token.

:func:`complete_llamacpp` speaks llama-server's own ``POST /completion``; :func:`complete_openai` the OpenAI
``POST /v1/completions`` of vLLM, SGLang and llama-server. Both send token ids, ask for greedy decoding of
exactly the requested number of tokens (``ignore_eos``), read the stream line by line as it arrives and return a
:class:`Reply`: one clock reading per generated token, the generated ids (or a digest of the text), and what the
server says about its prompt cache and its own timings. Every way a reply can be unusable raises
:class:`ServerReplyError` (the message names the URL and the cause); nothing in a reply is executed or
interpreted as markup.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from kvbench.bench.engines.server.stream import DONE, ServerReplyError, StreamError, iter_events, printable, sse_lines
from kvbench.errors import BadValue

__all__ = ["BadRequest", "Reply", "ServerReplyError", "StreamError", "complete_llamacpp", "complete_openai"]

#: llama-server's ``timings`` (milliseconds) and the names kvbench gives them in :attr:`Reply.server_timings`.
_TIMINGS_MS = {"prompt_ms": "prompt_s", "prompt_per_token_ms": "prompt_per_token_s",
               "predicted_ms": "predicted_s", "predicted_per_token_ms": "per_token_s"}


class BadRequest(BadValue):
    """A request kvbench will not send: a negative token count, or per-request options that would replace what
    the request is for (its prompt, its length, streaming)."""


@dataclass
class Reply:
    """One streamed completion as measured by the client.

    ``t_sent`` is the clock reading (seconds) just before the request was sent; ``token_times`` one clock reading
    per generated token, taken when the chunk carrying it had been parsed (a chunk with k tokens gives k equal
    readings), so ``len(token_times)`` is the number of generated tokens; ``chunk_times`` one reading per chunk
    that carried at least one token (the ITL's gaps are between them, one per chunk, as vLLM's benchmark takes
    them). ``ids`` are the generated ids where the
    server returns all of them (llama.cpp ``return_tokens``; vLLM ``return_token_ids``), else None; ``text`` the
    generated text and ``text_sha256`` the sha256 hex digest of its UTF-8 bytes (the output digest where ``ids``
    is None). ``prompt_tokens`` is the server's count of prompt tokens (llama.cpp ``timings.prompt_n +
    cache_n``; OpenAI ``usage.prompt_tokens``), ``cached_tokens`` the prompt tokens it reused (llama.cpp
    ``timings.cache_n``; OpenAI ``usage.prompt_tokens_details.cached_tokens``); None = not reported.
    ``server_timings`` holds the server's own figures in seconds (``prompt_s``, ``prompt_per_token_s``,
    ``predicted_s``, ``per_token_s``; llama-server divides ``predicted_ms`` by the n-1 steps after the first token),
    {} where it sends none; ``stop_reason`` is llama.cpp's ``stop_type`` or
    the OpenAI ``finish_reason``. ``top_logprobs`` is, per generated token, its step's top-k log-probabilities
    (token id → natural log; llama.cpp ``n_probs``), or None where the stream did not carry one for every
    token. ``slot`` is the server slot that answered (llama.cpp ``id_slot``), else None; ``slot_kept`` the prompt
    tokens that slot already held (the common prefix of the prompt with what the slot held after its previous
    request on the same server), set by the session that tracks them
    (:meth:`~kvbench.bench.engines.server.session.ServerSession.send`), else None."""

    t_sent: float
    token_times: list[float]
    chunk_times: list[float]
    ids: list[int] | None
    text: str
    text_sha256: str
    prompt_tokens: int | None
    cached_tokens: int | None
    server_timings: dict[str, float]
    stop_reason: str | None
    top_logprobs: list[dict[int, float]] | None = None
    slot: int | None = None
    slot_kept: int | None = None


@dataclass
class _Acc:
    """What the events of one stream have said so far (the per-chunk state of a request)."""

    url: str
    times: list[float] = field(default_factory=list)
    chunks: list[float] = field(default_factory=list)  # one reading per chunk that carried tokens
    ids: list[int] = field(default_factory=list)
    has_ids: bool = False
    parts: list[str] = field(default_factory=list)
    generated: int | None = None          # the server's own count of generated tokens, once reported
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    timings: dict[str, float] = field(default_factory=dict)
    stop_reason: str | None = None
    usage_tokens: int | None = None       # completion_tokens of the last usage seen (OpenAI)
    top: list[dict[int, float]] = field(default_factory=list)  # llama.cpp n_probs: each token's top-k
    slot: int | None = None               # llama.cpp id_slot of the final chunk

    def tick(self, now: float, k: int) -> None:
        """A chunk carrying ``k`` tokens was parsed at clock ``now``."""
        if k > 0:
            self.times.extend([now] * k)
            self.chunks.append(now)

    def fault(self, line: int, why: str) -> ServerReplyError:
        """The error for a field of the event on ``line`` that does not hold what the server's API says."""
        return ServerReplyError(f"{self.url}: line {line} of the stream: {why}", self.url)


def _count(value: Any) -> int | None:
    """``value`` if it is a non-negative int (not a bool), else None."""
    return value if type(value) is int and value >= 0 else None


def _raise_if_error(acc: _Acc, line: int, event: dict) -> None:
    """Raises :class:`ServerReplyError` if ``event`` is an error object (``{"error": ...}`` as llama-server,
    vLLM and SGLang send mid-stream, or vLLM's older ``{"object": "error", "message": ...}``)."""
    err = event.get("error")
    if err is None and event.get("object") != "error":
        return
    detail = err if err is not None else event
    message = detail.get("message", detail) if isinstance(detail, dict) else detail
    raise ServerReplyError(f"{acc.url}: the server reported an error in its stream (line {line}): "
                           f"{printable(str(message), 500)}", acc.url)


def _read_timings(acc: _Acc, timings: Any, counts: bool = True) -> None:
    """Takes llama-server's ``timings`` object: the milliseconds of :data:`_TIMINGS_MS`, stored in seconds, and
    (``counts``) the token counts ``cache_n``, ``prompt_n`` and ``predicted_n``."""
    if not isinstance(timings, dict):
        return
    for key, name in _TIMINGS_MS.items():
        value = timings.get(key)
        if type(value) in (int, float):
            acc.timings[name] = value / 1000.0
    if not counts:
        return
    cache_n, prompt_n = _count(timings.get("cache_n")), _count(timings.get("prompt_n"))
    if cache_n is not None:
        acc.cached_tokens = cache_n
        if prompt_n is not None:
            acc.prompt_tokens = prompt_n + cache_n
    if acc.generated is None:
        acc.generated = _count(timings.get("predicted_n"))


def _read_probabilities(acc: _Acc, probs: Any) -> None:
    """Takes llama-server's ``completion_probabilities`` (``n_probs``): per token, ``top_logprobs``, a list of
    ``{"id", "logprob"}``. An entry that is not so is skipped: the reply then has no ``top_logprobs``."""
    if not isinstance(probs, list):
        return
    for entry in probs:
        top = entry.get("top_logprobs") if isinstance(entry, dict) else None
        if isinstance(top, list) and top and all(
                isinstance(c, dict) and type(c.get("id")) is int and type(c.get("logprob")) in (int, float)
                and math.isfinite(c["logprob"]) and c["logprob"] <= 0 for c in top):
            acc.top.append({c["id"]: float(c["logprob"]) for c in top})


def _take_llamacpp(acc: _Acc, line: int, event: dict, now: float) -> bool:
    """Takes one ``/completion`` chunk read at clock ``now``; True for the final one (``"stop": true``). The
    chunk's token count is the growth of ``tokens_predicted`` (which also counts a token whose text the server
    held back, e.g. half a UTF-8 character, and whose id it never streams), else the length of ``tokens``."""
    _raise_if_error(acc, line, event)
    if "prompt_progress" in event:      # return_progress events: no token (their `tokens` holds no real id)
        return False
    content, tokens = event.get("content", ""), event.get("tokens")
    if not isinstance(content, str):
        raise acc.fault(line, f"content is a {type(content).__name__}, not text")
    if tokens is not None:
        if not isinstance(tokens, list) or any(type(t) is not int for t in tokens):
            raise acc.fault(line, "tokens is not a list of token ids")
        acc.ids.extend(tokens)
        acc.has_ids = acc.has_ids or bool(tokens)
    _read_probabilities(acc, event.get("completion_probabilities"))
    predicted = _count(event.get("tokens_predicted"))
    k = predicted - len(acc.times) if predicted is not None else len(tokens or ())
    if k < 0:
        raise acc.fault(line, f"tokens_predicted fell to {predicted} after {len(acc.times)} tokens")
    acc.tick(now, k)
    if content:
        acc.parts.append(content)
    if event.get("stop") is not True:
        return False
    acc.generated = predicted
    _read_timings(acc, event.get("timings"))
    if acc.prompt_tokens is None:
        acc.prompt_tokens = _count(event.get("tokens_evaluated"))
    stop = event.get("stop_type")
    acc.stop_reason = stop if isinstance(stop, str) else None
    acc.slot = _count(event.get("id_slot"))
    return True


def _take_openai(acc: _Acc, line: int, event: dict | str, now: float) -> bool:
    """Takes one ``/v1/completions`` event read at clock ``now``; True for ``[DONE]``. A chunk's token count is
    the length of its ``token_ids`` (vLLM ``return_token_ids``), else the growth of ``usage.completion_tokens``
    where the server sends usage on every chunk (``continuous_usage_stats``), else 1 for a chunk that carries
    text or is not the last (``finish_reason`` null)."""
    if event == DONE:
        return True
    _raise_if_error(acc, line, event)
    usage = event.get("usage")
    used = _count(usage.get("completion_tokens")) if isinstance(usage, dict) else None
    choices = event.get("choices")
    if not isinstance(choices, list):
        raise acc.fault(line, "choices is not a list")
    if choices and "prompt_progress" not in event:
        choice = choices[0]
        if not isinstance(choice, dict) or not isinstance(choice.get("text", ""), str):
            raise acc.fault(line, "the first choice has no text")
        text, token_ids, finish = choice.get("text", ""), choice.get("token_ids"), choice.get("finish_reason")
        if isinstance(token_ids, list):
            if any(type(t) is not int for t in token_ids):
                raise acc.fault(line, "token_ids is not a list of token ids")
            acc.ids.extend(token_ids)
            acc.has_ids, k = True, len(token_ids)
        elif used is not None and acc.usage_tokens is not None:
            k = used - acc.usage_tokens
        elif used is not None and (finish is None or not acc.times):  # the first usage counts from 0
            k = used
        else:
            k = 1 if text or finish is None else 0
        if k < 0:
            raise acc.fault(line, f"usage.completion_tokens fell to {used}")
        acc.tick(now, k)
        if text:
            acc.parts.append(text)
        if isinstance(finish, str):
            acc.stop_reason = finish
    if used is not None:
        acc.usage_tokens = acc.generated = used
        acc.prompt_tokens = _count(usage.get("prompt_tokens"))
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and _count(details.get("cached_tokens")) is not None:
            acc.cached_tokens = details["cached_tokens"]
    if "timings" in event:              # llama-server adds its own timings to the last chunk
        _read_timings(acc, event["timings"], counts=False)
    return False


async def _stream(client: httpx.AsyncClient, url: str, body: dict, timeout_s: float, clock: Callable[[], float],
                  take: Callable[[_Acc, int, Any, float], bool], final: str, asked: int,
                  deadline_s: float | None) -> tuple[float, _Acc]:
    """POSTs ``body`` to ``url`` and feeds each event to ``take`` with the clock reading taken right after it was
    parsed, until ``take`` says it was the final one. Returns (the reading just before sending, the state).
    Raises :class:`ServerReplyError` for every failure (see :func:`complete_llamacpp`), and as soon as the stream
    carries more than ``asked`` tokens or the whole reply has taken ``deadline_s`` seconds."""
    acc = _Acc(url)
    timeout = httpx.Timeout(timeout_s)
    try:
        async with asyncio.timeout(deadline_s):
            t_sent = clock()
            async with client.stream("POST", url, json=body, timeout=timeout) as response:
                if response.status_code >= 400:
                    raw = (await _head(response)).decode("utf-8", errors="replace")
                    raise ServerReplyError(f"{url}: HTTP {response.status_code} {response.reason_phrase}: "
                                           f"{printable(raw, 500) or '(empty body)'}", url)
                async for line, event in iter_events(sse_lines(response.aiter_bytes(), source=url), source=url):
                    now = clock()
                    if event == DONE and final != DONE:
                        raise acc.fault(line, "data: [DONE] in a stream that ends with a \"stop\": true chunk")
                    finished = take(acc, line, event, now)
                    if len(acc.times) > asked:
                        raise acc.fault(line, f"the stream carries {len(acc.times)} tokens, more than the {asked} "
                                              "asked for (kvbench reads no further)")
                    if finished:
                        return t_sent, acc
    except TimeoutError:
        raise ServerReplyError(f"{url}: the reply did not end within {deadline_s:g} s (engine.reply_timeout_s; "
                               f"{len(acc.times)} of {asked} tokens had come)", url) from None
    except httpx.TimeoutException as e:
        raise ServerReplyError(f"{url}: no reply within {timeout_s:g} s ({type(e).__name__}: the server sent "
                               "nothing for that long)", url) from None
    except httpx.ConnectError as e:
        raise ServerReplyError(f"{url}: cannot connect: the server is not listening or has gone "
                               f"({printable(str(e), 200)})", url, lost=True) from None
    except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError) as e:
        raise ServerReplyError(f"{url}: the connection was lost mid-reply (the server closed or reset it: "
                               f"{printable(str(e), 200) or type(e).__name__})", url, lost=True) from None
    except httpx.TransportError as e:
        raise ServerReplyError(f"{url}: cannot send the request: {printable(str(e), 200)}", url) from None
    raise ServerReplyError(f"{url}: the stream ended without its final event ({final}): the reply is truncated "
                           f"after {len(acc.times)} tokens", url)


#: The most of an error reply's body kvbench reads (bytes): its first 500 characters are quoted.
_ERROR_BODY_BYTES = 64 * 1024


async def _head(response: httpx.Response, limit: int = _ERROR_BODY_BYTES) -> bytes:
    """The first ``limit`` bytes of ``response``'s body (the rest is not read)."""
    got = bytearray()
    async for chunk in response.aiter_bytes():
        got += chunk
        if len(got) >= limit:
            break
    return bytes(got[:limit])


def _reply(acc: _Acc, t_sent: float, asked: int) -> Reply:
    """The :class:`Reply` of a finished stream; raises :class:`ServerReplyError` unless the server generated
    exactly ``asked`` tokens and the stream carried a reading for each of them."""
    generated = acc.generated if acc.generated is not None else len(acc.times)
    if generated != asked:
        raise ServerReplyError(f"{acc.url}: asked for {asked} tokens, the server generated {generated} "
                               f"(stop reason: {acc.stop_reason})", acc.url)
    if len(acc.times) != generated:
        raise ServerReplyError(f"{acc.url}: the server generated {generated} tokens but its stream carried "
                               f"{len(acc.times)}: the time of each token cannot be read from it", acc.url)
    text = "".join(acc.parts)
    ids = acc.ids if acc.has_ids and len(acc.ids) == generated else None
    return Reply(t_sent=t_sent, token_times=acc.times, chunk_times=acc.chunks, ids=ids, text=text,
                 text_sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(), prompt_tokens=acc.prompt_tokens,
                 cached_tokens=acc.cached_tokens, server_timings=acc.timings, stop_reason=acc.stop_reason,
                 top_logprobs=acc.top if len(acc.top) == generated else None, slot=acc.slot)


def _body(defaults: dict, options: Mapping[str, Any], fixed: tuple[str, ...], asked: int) -> dict:
    """``defaults`` updated with ``options``; raises :class:`BadRequest` for a negative ``asked`` or options
    that set one of ``fixed``."""
    if type(asked) is not int or asked < 0:
        raise BadRequest(f"the number of tokens to generate must be a whole number >= 0, not {asked!r}")
    clash = sorted(set(fixed) & set(options))
    if clash:
        raise BadRequest(f"per-request options may not set {', '.join(clash)}: kvbench sets "
                         f"{', '.join(fixed)} itself")
    return {**defaults, **options}


async def complete_llamacpp(client: httpx.AsyncClient, base_url: str, prompt_ids: Sequence[int], n_predict: int,
                            options: Mapping[str, Any] = {}, *, seed: int = 0, timeout_s: float = 300.0,
                            deadline_s: float | None = None,
                            clock: Callable[[], float] = time.perf_counter) -> Reply:
    """Streams one greedy completion of exactly ``n_predict`` tokens from llama-server's ``POST
    {base_url}/completion`` for the token ids ``prompt_ids``, and times it with ``clock`` (seconds): once just
    before sending, then once right after each event is parsed.

    The body is ``{"prompt": ids, "n_predict", "stream": true, "return_tokens": true, "ignore_eos": true,
    "temperature": 0, "top_k": 1, "seed", "cache_prompt": true}`` updated with ``options`` (e.g.
    ``{"cache_prompt": false}``, ``{"id_slot": 0}``). ``timeout_s`` bounds each wait: connecting, sending, and
    every gap between two pieces of the reply; ``deadline_s`` (None: none) the whole reply, keep-alive comments
    and all. The body is read as server-sent events split at CRLF, CR and LF only (:func:`sse_lines`). ``ids``
    of the reply is None if the stream left out the id of a token (llama-server does for a token that ends
    inside a UTF-8 character); ``token_times`` still counts it.

    Raises :class:`BadRequest` for ``n_predict < 0`` or ``options`` that set ``prompt``, ``n_predict`` or
    ``stream``; :class:`ServerReplyError` (message naming the URL) for an HTTP 4xx/5xx status (with the body's
    first 500 characters), no reply within ``timeout_s``, a connection refused or lost, a malformed event
    (:class:`StreamError`: line number and first 200 characters), a stream that ends before its ``"stop": true``
    chunk ("truncated"), an ``error`` object in the stream, and a wrong number of generated tokens ("asked for N
    tokens, the server generated M"), a stream carrying more tokens than asked (as soon as it does), a reply
    not ended within ``deadline_s``, and a line longer than :data:`~kvbench.bench.engines.server.stream.MAX_LINE_BYTES`.
    """
    defaults = {"prompt": [int(i) for i in prompt_ids], "n_predict": n_predict, "stream": True,
                "return_tokens": True, "ignore_eos": True, "temperature": 0, "top_k": 1, "seed": seed,
                "cache_prompt": True}
    body = _body(defaults, options, ("prompt", "n_predict", "stream"), n_predict)
    url = base_url.rstrip("/") + "/completion"
    t_sent, acc = await _stream(client, url, body, timeout_s, clock, _take_llamacpp, '"stop": true', n_predict,
                                deadline_s)
    return _reply(acc, t_sent, n_predict)


async def complete_openai(client: httpx.AsyncClient, base_url: str, model: str, prompt_ids: Sequence[int],
                          max_tokens: int, options: Mapping[str, Any] = {}, *, seed: int = 0,
                          timeout_s: float = 300.0, deadline_s: float | None = None,
                          clock: Callable[[], float] = time.perf_counter) -> Reply:
    """Streams one greedy completion of exactly ``max_tokens`` tokens from the OpenAI ``POST
    {base_url}/v1/completions`` (vLLM, SGLang, llama-server) of the model ``model`` for the token ids
    ``prompt_ids``, timed like :func:`complete_llamacpp`.

    The body is ``{"model", "prompt": ids, "max_tokens", "stream": true, "stream_options": {"include_usage":
    true, "continuous_usage_stats": true}, "temperature": 0, "seed", "ignore_eos": true}`` updated with
    ``options`` (e.g. ``{"return_token_ids": true}`` for vLLM's ids). Continuous usage statistics (vLLM, SGLang)
    give the number of tokens in each chunk, which a server under load may merge; without them a chunk counts
    as one token, and a reply whose usage then disagrees with the chunks raises instead of mistiming tokens.

    Raises :class:`BadRequest` for ``max_tokens < 0`` or ``options`` that set ``model``, ``prompt``,
    ``max_tokens`` or ``stream``; :class:`ServerReplyError` as :func:`complete_llamacpp` does, the final event
    being ``data: [DONE]``.
    """
    defaults = {"model": model, "prompt": [int(i) for i in prompt_ids], "max_tokens": max_tokens, "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True}, "temperature": 0,
                "seed": seed, "ignore_eos": True}
    body = _body(defaults, options, ("model", "prompt", "max_tokens", "stream"), max_tokens)
    url = base_url.rstrip("/") + "/v1/completions"
    t_sent, acc = await _stream(client, url, body, timeout_s, clock, _take_openai, DONE, max_tokens, deadline_s)
    return _reply(acc, t_sent, max_tokens)
