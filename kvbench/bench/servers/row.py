"""A server request's row: the columns of the in-process engine's reuse trials (latencies from the same
functions, ``tokens_match`` against ``none``) and the server's own (cached prompt tokens, its timings, the load)."""

from __future__ import annotations

from typing import Any

from kvbench.analysis.latency import itl_percentiles, latency_metrics, throughputs
from kvbench.bench.row import IDS_KEPT, base_row, ids_digest
from kvbench.bench.servers.client import Reply
from kvbench.bench.servers.engine import ServerEngine
from kvbench.bench.trial import ServerTrial
from kvbench.scenario import Scenario


def request_row(s: Scenario, engine: ServerEngine, t: ServerTrial, reply: Reply | None, outcome: Any,
                first: bool = False) -> dict[str, Any]:
    """The row of request ``t``: the fields every row has, and with a ``reply`` what it measured.

    ``outcome`` (a :class:`kvbench.bench.servers.load.Outcome`, or None when the request was never sent) gives
    ``arrival_s``/``start_s`` (seconds from the load's start) and ``queue_s`` (start − arrival; 0 one at a time,
    where a request arrives when it is sent). ``first``: the
    first request this server answered, whose cached tokens must be 0 (``cold_verified``). A cold preset's
    request that reused tokens is ``contaminated`` and is not taken as the reference (``tokens_match`` null).

    Raises:
        RuntimeError: the server generated another number of tokens than ``max_new_tokens``.
    """
    req = t.request
    preset = engine.preset(t.mode)
    reusable = engine.reusable.get(req.id)
    row = base_row(s, t, {"device": engine.device_name, "dtype": None, "kv_bytes_predicted": None})
    row.update(request_id=req.id, document=req.document, turn_index=req.turn_index, warm=t.warm,
               engine=engine.kind, load_profile=s.load_spec.profile, concurrency=t.concurrency,
               reusable_prompt_tokens=reusable, prompt_sha256=(p_sha := ids_digest([list(req.ids)])))
    if outcome is not None:  # one at a time, a request arrives when it is sent: it never queues
        arrival = outcome.start_s if s.load_spec.profile == "sequential" else outcome.arrival_s
        row.update(arrival_s=arrival, start_s=outcome.start_s, queue_s=max(0.0, outcome.start_s - arrival))
    if reply is None:
        return row
    n_out = len(reply.token_times)
    if n_out != s.max_new_tokens:
        raise RuntimeError(f"generated {n_out} tokens, expected exactly {s.max_new_tokens}")
    lat = latency_metrics(reply.t_sent, reply.token_times, reply.chunk_times)
    ids = [reply.ids] if reply.ids is not None else None
    # the text's digest, never the ids': a server may withhold the id of a token that ends inside a UTF-8
    # character, and every request of a server run must be compared the same way
    digest = reply.text_sha256
    cached = reply.cached_tokens
    contaminated = bool(preset.cold and cached)
    row.update(n_output_tokens=n_out, **lat, **itl_percentiles(lat["itl_s"]),
               **throughputs(t.prompt_tokens, 1, lat, n_out),
               output_sha256=digest,
               output_ids_head=[seq[:IDS_KEPT] for seq in ids] if ids is not None else None,
               cached_prompt_tokens=cached, server_prompt_tokens=reply.prompt_tokens,
               cached_prompt_share=cached / len(req.ids) if cached is not None and req.ids else None,
               tokens_restored=cached if cached is not None else None,
               tokens_prefilled=len(req.ids) - cached if cached is not None else None,
               store_hit_rate=min(1.0, cached / reusable) if cached is not None and reusable else None,
               server_tpot_s=reply.server_timings.get("per_token_s"),
               server_prompt_s=reply.server_timings.get("prompt_s"), stop_reason=reply.stop_reason,
               contaminated=contaminated, cold_verified=(cached == 0) if first and cached is not None else None)
    notes = {}
    if contaminated:
        row.update(tokens_match=None, first_divergence_step=None)
        notes["tokens_match"] = (f"a cold mode's request reused {cached} cached prompt tokens: not taken as the "
                                 "reference")
    else:
        row.update(engine.reference.compare(t, p_sha, ids or [[]], digest))
    if cached is None:
        notes["cached_prompt_tokens"] = "the server does not report cached prompt tokens"
    if reply.prompt_tokens is not None and reply.prompt_tokens != len(req.ids):
        notes["server_prompt_tokens"] = (f"the server counted {reply.prompt_tokens} prompt tokens, kvbench sent "
                                         f"{len(req.ids)}")
    row["notes"] = notes
    return row
