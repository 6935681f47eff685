"""Reuse workloads: every request of a multi-turn or document-QA stream, per mode, recomputed from scratch (cold)
and restored from what the engine keeps for the mode (warm), side by side (their tables:
:mod:`kvbench.analysis.reuse`).

Per repeat each mode starts afresh (a session of its own, :meth:`~kvbench.bench.engines.base.SessionEngine.session`: the
transformers engine makes a new :class:`~kvbench.offload.store.KVStore` per mode, as ``store:`` says, its disk tier
under the scenario's ``disk_dir``); a ``shared_prefix`` workload's cells each get fresh sessions too, so what a cell's
store holds, spills and is charged for is its own requests' KV, whatever cells ran before it. Requests arrive in the
workload's order; per request, ``none`` runs cold first (the reference every trial's ids are compared with), then warm;
the other modes alternate warm-first and cold-first from request to request, so neither side always runs right after the
other. After a warm trial, what a server would hold (the prompt and, in a conversation, the reply it goes on with) is
kept in the mode's store for the later requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack

from kvbench.bench.engines.base import RunRecord, Session
from kvbench.bench.roles import Record
from kvbench.bench.trial import ReuseTrial, reference_first
from kvbench.results.rows import MEASURED
from kvbench.scenario import Scenario, ScenarioMode
from kvbench.workloads.sessions import Request, Stream


def reuse_sweep(s: Scenario, record: Record, requests: Sequence[Request]) -> None:
    """Run (or, resuming, look up) every trial of a reuse workload, whose stream's requests are ``requests``;
    ``record`` is a :class:`~kvbench.bench.plans.sweep.Recorder` (its
    ``rows`` are the trials already written). Per repeat every mode has a session of its own
    (:meth:`~kvbench.bench.engines.base.SessionEngine.session`, opened through ``record``), open for the whole repeat
    (the modes interleave request by request; a ``shared_prefix`` workload: for one cell, :func:`cell_parts`) and closed
    (disk files removed) on every exit path. A warm trial already recorded is not rerun, but what it left for later
    requests is rebuilt (:meth:`~kvbench.bench.engines.base.Session.refill`), so later turns see the same store."""
    modes = reference_first(s.modes)
    for r in range(s.repeats):
        i = 0  # the request's place in the workload: which side of a pair runs first
        for part in cell_parts(requests):
            with ExitStack() as stack:
                sessions = {m.label: stack.enter_context(record.session(m, r)) for m in modes}
                for req in part:
                    _request(record, modes, sessions, req, r, i)
                    i += 1


def _request(record: Record, modes: Sequence[ScenarioMode], sessions: dict[str, Session], req: Request, r: int,
             i: int) -> None:
    """Run (or, resuming, look up and refill) the cold and warm trials of request ``req`` (the workload's
    ``i``-th) in every mode of repeat ``r``, each in its mode's session of ``sessions``."""
    for m in modes:
        cold, warm = ReuseTrial.of(req, m, r, False), ReuseTrial.of(req, m, r, True)
        for t in [cold, warm] if m.kind == "none" or (i + r) % 2 == 0 else [warm, cold]:
            done = record.rows.get(t.trial_id)
            if done is not None:
                if t.warm and done.get("status") in MEASURED:
                    sessions[m.label].refill(t)
                continue
            record(t)


def cell_parts(requests: Sequence[Request]) -> list[list[Request]]:
    """``requests`` cut where their ``cell`` changes (a ``shared_prefix`` workload's cells, in order); one part
    of them all for a workload without cells."""
    parts: list[list[Request]] = []
    for q in requests:
        if not parts or parts[-1][-1].cell != q.cell:
            parts.append([])
        parts[-1].append(q)
    return parts


def note_requests(run: RunRecord, stream: Stream) -> None:
    """Put a request stream's requests (id, document, turn, prompt and held tokens) and notes into ``run``'s
    run.json (``requests``, ``workload_notes``): a reuse workload's or a server run's."""
    run.update(workload_notes=stream.notes, requests=[
        {"id": q.id, "document": q.document, "turn_index": q.turn_index, "prompt_tokens": len(q.ids),
         "held_tokens": len(q.held), **({"trace_index": q.trace_index, "arrival_s": q.arrival_s}
                                        if q.trace_index is not None else {})} for q in stream.requests])
