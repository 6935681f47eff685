"""A server request's row: the fields every row of the request has (:func:`request_fields`), what its reply
measured as the row builder takes it (:func:`reply_output`) and the row itself (:func:`request_row`), built by the
row builder every engine's trials go through (:func:`kvbench.bench.rows.row.measured_fields`)."""

from __future__ import annotations

from typing import Any

from kvbench.bench.engines.server.client import Reply
from kvbench.bench.engines.server.engine import ServerEngine
from kvbench.bench.engines.server.load import Outcome, load_fields
from kvbench.bench.engines.server.tiers import tier_tokens
from kvbench.bench.rows.row import base_row, measured_fields
from kvbench.results.rows import ids_digest
from kvbench.bench.trial import ServerTrial, TrialOutput


def request_row(engine: ServerEngine, t: ServerTrial, reply: Reply | None, outcome: Outcome | None,
                first: bool = False) -> dict[str, Any]:
    """The row of request ``t``: the fields every row has (:func:`~kvbench.bench.rows.row.base_row` and the
    request's own, :func:`request_fields`), the load's (``outcome``, None when the request was never sent:
    :func:`~kvbench.bench.engines.server.load.load_fields`), and with a ``reply`` what it measured
    (:func:`~kvbench.bench.rows.row.measured_fields` of :func:`reply_output`; ``first``: the first request this
    server answered).

    Raises:
        RuntimeError: the server generated another number of tokens than ``max_new_tokens``.
    """
    s = engine.s
    row = {**base_row(s, t, engine.describe(t)), **request_fields(engine, t)}
    if outcome is not None:
        row.update(load_fields(s.load_spec.profile, outcome))
    if reply is not None:
        row.update(measured_fields(s, t, reply_output(engine, t, reply, first), None, {}, {}, engine.reference))
    return row


def request_fields(engine: ServerEngine, t: ServerTrial) -> dict[str, Any]:
    """The request's own fields every row of ``t`` has: its id, conversation, turn, whether it may reuse, its
    shared prefix, working set, share unit and cell's KV in tokens (``shared_prefix``), its position in a replayed
    trace (``trace_index``), the KV it keeps for
    reuse in tokens (``kv_budget_tokens``: the slots' context and the host tier its mode's server was started
    with, :func:`~kvbench.bench.engines.server.tiers.tier_tokens`), the engine, the load profile and level, the
    prompt tokens an earlier request held (``reusable_prompt_tokens``) and the prompt's digest."""
    req = t.request
    return {
        "request_id": req.id, "document": req.document, "turn_index": req.turn_index, "warm": t.warm,
        "shared_prefix_tokens": req.shared_prefix_tokens, "working_set_prompts": req.working_set,
        "shared_pct": req.shared_pct, "trace_index": req.trace_index,
        "cell_kv_tokens": engine.cell_tokens.get(req.cell),
        "share_unit_tokens": engine.share_unit if req.cell is not None else None,
        "kv_budget_tokens": engine.ctx_per_slot * t.concurrency
        + tier_tokens(engine.host_tiers.get(t.mode.label), engine.kv_bytes_per_token),
        "engine": engine.kind, "load_profile": engine.s.load_spec.profile, "concurrency": t.concurrency,
        "reusable_prompt_tokens": engine.reusable.get(req.id), "prompt_sha256": ids_digest([list(req.ids)])}

def reply_output(engine: ServerEngine, t: ServerTrial, reply: Reply, first: bool = False) -> TrialOutput:
    """A server's reply to request ``t`` as the row builder takes it (:func:`kvbench.bench.rows.row.measured_fields`):
    its timestamps (per token and per chunk), its ids where the server returned them, its text's digest (the
    output every request of a server run is compared by), the cached prompt tokens it reported as the reuse
    reading, and the server's own fields. ``first``: the first request this server answered, whose cached
    tokens must be 0 (``cold_verified``). A cold preset's request that reused tokens is ``contaminated`` and
    is neither compared with nor taken as the reference."""
    req = t.request
    cached, reusable = reply.cached_tokens, engine.reusable.get(req.id)
    kept = reply.slot_kept
    contaminated = bool(engine.preset(t.mode).cold and cached)
    notes = {}
    if cached is None:
        notes["cached_prompt_tokens"] = "the server does not report cached prompt tokens"
    if reply.prompt_tokens is not None and reply.prompt_tokens != len(req.ids):
        notes["server_prompt_tokens"] = (f"the server counted {reply.prompt_tokens} prompt tokens, kvbench sent "
                                         f"{len(req.ids)}")
    preset, digest = engine.preset(t.mode), ids_digest([list(req.ids)])
    fields = engine.quality.fields(digest, preset.cold and not contaminated, preset.lossy, reply.ids,
                                 reply.top_logprobs, notes, floor=not preset.cold)
    return TrialOutput(
        t_start=reply.t_sent, token_times=reply.token_times, chunk_times=reply.chunk_times,
        ids=[reply.ids] if reply.ids is not None else None, prompt_sha256=digest,
        output_sha256=reply.text_sha256, memory={},
        reuse={"tokens_restored": cached, "tokens_prefilled": len(req.ids) - cached if cached is not None else None,
               "store_hit_rate": min(1.0, cached / reusable) if cached is not None and reusable else None},
        fields={"cached_prompt_tokens": cached, "server_prompt_tokens": reply.prompt_tokens,
                "tier_hit_tokens": max(0, cached - kept) if cached is not None and kept is not None else None,
                "cached_prompt_share": cached / len(req.ids) if cached is not None and req.ids else None,
                "server_tpot_s": reply.server_timings.get("per_token_s"),
                "server_prompt_s": reply.server_timings.get("prompt_s"), "stop_reason": reply.stop_reason,
                "contaminated": contaminated,
                "cold_verified": (cached == 0) if first and cached is not None else None, **fields},
        notes=notes,
        not_compared=(f"a cold mode's request reused {cached} cached prompt tokens: not taken as the reference"
                      if contaminated else None))
