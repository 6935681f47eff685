"""The sweep of a server run: per repeat, every mode (a server configuration; ``none`` first, the others rotating
from repeat to repeat) on a server of its own started cold, the workload's requests sent as ``load:`` says, one row
per request written as it finishes.

A cold start is verified, not assumed: the first request a fresh server answers must report 0 cached prompt
tokens (``cold_verified``), and every request of a cold preset (``none``) too; a cold request that reused tokens is
``contaminated`` and never becomes the reference. A request that fails (the server's reply, a timeout, the server
gone) is an ``error`` row with the reason and the sweep goes on; a server that does not start gives every request
of that mode an ``error`` row with the log's last lines. Resumed, a mode whose requests are all written is not
started again; one with requests missing is restarted and, before them, the conversations' earlier turns are sent
again unrecorded so the server holds what it held (the session's refill, as
:meth:`~kvbench.bench.engines.base.Session.refill` does in process).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Sequence
from typing import Any

import httpx

from kvbench.bench.telemetry.machine_load import LoadWindow
from kvbench.bench import load as load_profiles
from kvbench.bench.engines.server.engine import ServerEngine
from kvbench.bench.engines.server.session import Flight, ServerSession
from kvbench.bench.engines.server.process import ServerExited, ServerStartError
from kvbench.bench.engines.server.stream import ServerReplyError
from kvbench.bench.telemetry.server import ProcessTree, ServerWatch
from kvbench.bench.engines.server.tiers import files_bytes
from kvbench.bench.rows.row import base_row, measured_fields
from kvbench.bench.engines.server.client import Reply
from kvbench.bench.roles import Record
from kvbench.bench.trial import ServerTrial, reference_first
from kvbench.results.rows import Status
from kvbench.scenario import Scenario
from kvbench.serving import KINDS


def mode_order(modes: Sequence[Any], repeat: int) -> list[Any]:
    """``none`` first (the reference), then the other modes rotated by ``repeat`` (so no mode always runs right
    after ``none``)."""
    ordered = reference_first(modes)
    head = ordered[:1] if ordered and ordered[0].kind == "none" else []
    rest = ordered[len(head):]
    k = repeat % len(rest) if rest else 0
    return head + rest[k:] + rest[:k]


def at_level(mode: Any, level: int, levels: Sequence[int]) -> Any:
    """``mode`` as it runs at concurrency ``level``: itself when the load has one level, else named
    ``<name>@c<level>`` (its preset kept), so that each level is a configuration of its own in the tables."""
    if len(levels) == 1:
        return mode
    return mode.model_copy(update={"name": f"{mode.name}@c{level}", "preset": mode.kind})


def server_sweep(s: Scenario, record: Record, engine: ServerEngine) -> None:
    """Run (or, resuming, look up) every request of every mode, concurrency level and repeat; ``record`` is the
    run's :class:`~kvbench.bench.plans.sweep.Recorder` (rows written through
    :meth:`~kvbench.bench.plans.sweep.Recorder.write`). KeyboardInterrupt stops it after writing what finished (the
    server is stopped)."""
    requests = engine.source.requests[: s.load_spec.n_requests]
    levels = s.load_spec.levels
    engine.servers[:0] = record.run.meta.get("servers") or []  # a resumed run's earlier servers stay listed
    for c in levels:
        for r in range(s.repeats):
            for m in mode_order(s.modes, r):
                mode = at_level(m, c, levels)
                trials = engine.trials(mode, r, requests, c)
                todo = [t for t in trials if t.trial_id not in record.rows]
                if todo:
                    _run_mode(s, record, engine, mode, r, c, trials, todo)
    record.run.update(servers=engine.servers)


def _run_mode(s: Scenario, record: Record, engine: ServerEngine, mode: Any, repeat: int, level: int,
              trials: list[ServerTrial], todo: list[ServerTrial]) -> None:
    if record.on_status:
        record.on_status(f"starting the {engine.kind} server for {mode.label} (repeat {repeat})"
                         if KINDS[engine.kind].started else
                         f"{mode.label} (repeat {repeat}) on the running server at {mode.url or s.engine.url}")
    try:
        with engine.session(mode, repeat, level) as srv:
            record.run.update(servers=engine.servers)  # listed while it runs: a killed run still names it
            try:
                asyncio.run(_requests(s, record, engine, srv, level, trials, todo))
            except ServerReplyError as exc:  # before the load (reset, warm-up, refill): the server is no use
                if srv.process is not None and not srv.process.alive():
                    raise ServerReplyError(f"{exc}\nthe server exited; its log ends:\n"
                                           f"{srv.process.log_tail(10)}") from exc
                raise
    except ServerExited as exc:  # mid-mode: what was in flight is an error row, what was not sent stays to run
        engine.servers[-1]["exited"] = f"{exc}".splitlines()[0]
    except (ServerStartError, ServerReplyError) as exc:
        for t in todo:
            if t.trial_id not in record.rows:
                record.write({**request_row(s, engine, t, None, None),
                                 "status": Status.ERROR, "message": f"{type(exc).__name__}: {exc}"})
    finally:
        record.run.update(servers=engine.servers)


async def _requests(s: Scenario, record: Record, engine: ServerEngine, srv: ServerSession, level: int,
                    trials: list[ServerTrial], todo: list[ServerTrial]) -> None:
    limits = httpx.Limits(max_connections=level + 2)
    async with httpx.AsyncClient(limits=limits, timeout=s.engine.request_timeout_s, trust_env=engine.trust_env,
                                 follow_redirects=False, headers=srv.headers) as client:
        await srv.warm_up(client, s.warmup)
        # the first request a fresh server answers must reuse nothing (a resumed mode's refill fills the cache)
        first = {} if await srv.refill(client, trials, todo) else {"pending": True}
        srv.metrics_before = srv.metrics_text()  # the deltas count the measured requests (and their holds)
        writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kvbench-rows")
        written: list[concurrent.futures.Future] = []
        watch = ServerWatch(srv.pid, s.monitor.interval_ms / 1000, engine.nvml) if srv.pid else None
        tree = ProcessTree(srv.pid) if srv.pid else None
        own = tree.cpu_seconds if tree is not None else None
        rss_start = tree.rss_bytes() if tree is not None else None
        window = LoadWindow(also_own=own)
        if watch is not None:
            watch.start()
        flight = Flight()
        cell_of = {q.document: q.cell for q in engine.source.requests}

        def held(request: Any) -> dict[str, Any]:
            """What the mode holds now: its configured host tier, the server's RSS growth since its measured
            requests began, the slot files on disk of ``request``'s cell (a ``shared_prefix`` cell's own, so
            that it is not charged the files of cells before it; every file otherwise)."""
            rss = tree.rss_bytes() if tree is not None else None
            files = [f for d, f in srv.slot_files.items() if cell_of.get(d) == request.cell]
            return {"server_host_tier_bytes": srv.host_tier[0], "server_host_tier": srv.host_tier[1],
                    "server_rss_growth_bytes": max(0, rss - rss_start) if rss is not None and rss_start is not None
                    else None, **({"store_disk_bytes": files_bytes(srv.slot_dir, files)} if srv.preset.slots else {})}

        async def send(t: ServerTrial) -> Any:
            was_first = first.pop("pending", False)
            if record.on_start:  # a measured request (not a warm-up, hold or refill), before its restore
                record.on_start(t)
            with flight:
                reply, facts = await srv.run(client, t, own, flight)
            return reply, {**facts, **held(t.request)}, was_first

        def done(o: load_profiles.Outcome) -> None:
            """Build the row and hand it to the writer thread (the event loop keeps reading streams); a write
            that failed (disk full) stops the load."""
            for f in written:
                if f.done() and f.exception() is not None:
                    raise f.exception()
            t, error = o.request, o.error
            row = None
            if error is None:
                reply, facts, was_first = o.result
                try:
                    row = {**request_row(s, engine, t, reply, o, first=was_first), **facts}
                except RuntimeError as exc:  # the server generated another number of tokens
                    error = exc
            gone = row is None and srv.exited(2.0 if getattr(error, "lost", False) else 0.0)
            if row is None:
                why = f"{type(error).__name__}: {error}"
                if gone:
                    why += (f"\nthe server exited mid-mode; the requests not sent yet are left for `kvbench run "
                            f"--resume`; its log ends:\n{srv.process.log_tail(10)}")
                row = {**request_row(s, engine, t, None, o), "status": Status.ERROR, "message": why}
            written.append(writer.submit(record.write, row))
            if gone:
                srv.process.check_alive()  # raises ServerExited: the load stops, in-flight requests are cancelled

        given = s.load_spec
        spec = given.at_level(level)
        try:
            outcomes = await load_profiles.run_load(todo, send, spec, chain=_chain(s), on_done=done)
            sent = {o.request.trial_id for o in outcomes}
            for t in todo:  # past load.duration_s: not sent, and not to be sent by --resume either
                if t.trial_id not in sent:
                    written.append(writer.submit(record.write, {
                        **request_row(s, engine, t, None, None), "status": Status.SKIPPED,
                        "message": f"not sent: load.duration_s ({given.duration_s:g} s) had passed"}))
        finally:
            writer.shutdown(wait=True)
            load = window.stop()
            srv.info.update(load={"profile": spec.profile, "concurrency": spec.max_in_flight, **load,
                                  **(watch.stop() if watch is not None else {})})
        for f in written:  # the first row that could not be written (disk full...) stops the sweep
            f.result()


def request_row(s: Scenario, engine: ServerEngine, t: ServerTrial, reply: Reply | None,
                outcome: load_profiles.Outcome | None, first: bool = False) -> dict[str, Any]:
    """The row of request ``t``: the fields every row has (:func:`~kvbench.bench.rows.row.base_row` and the request's
    own, :meth:`ServerEngine.request_fields`), the load's (``outcome``, None when the request was never sent:
    :func:`~kvbench.bench.load.load_fields`), and with a ``reply`` what it measured, built by the row
    builder every engine's trials go through (:func:`~kvbench.bench.rows.row.measured_fields`, from
    :meth:`ServerEngine.output`; ``first``: the first request this server answered).

    Raises:
        RuntimeError: the server generated another number of tokens than ``max_new_tokens``.
    """
    row = {**base_row(s, t, engine.describe(t)), **engine.request_fields(t)}
    if outcome is not None:
        row.update(load_profiles.load_fields(s.load_spec.profile, outcome))
    if reply is not None:
        row.update(measured_fields(s, t, engine.output(t, reply, first), None, {}, {}, engine.reference))
    return row



def _chain(s: Scenario) -> Any:
    """A multi-turn conversation's turns go in order, each after the previous reply; other requests are
    independent."""
    if s.workload.multi_turn is not None:
        return lambda t: t.request.document
    return lambda t: None
