"""A server run's mode, behind the seam: :func:`run_mode` starts ``mode``'s server cold (a session of
:meth:`ServerEngine.session <kvbench.bench.engines.server.engine.ServerEngine.session>`), sends its requests as
``load:`` says (:func:`~kvbench.bench.engines.server.load.run_load`), hands each row to the run as its request ends
(on a writer thread, so that the event loop keeps reading streams) and decides what a server's failure means for
the requests: one that does not start, or fails before the load (its reset, warm-up or refill), makes each
request an ``error`` row with the reason; one that exits mid-mode makes the requests in flight ``error`` rows and
leaves those not sent for ``kvbench run --resume``; requests past ``load.duration_s`` are ``skipped``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Hashable
from typing import Any

import httpx

from kvbench.bench.engines.base import RowSink
from kvbench.bench.engines.server.engine import ServerEngine
from kvbench.bench.engines.server.load import Outcome, run_load
from kvbench.bench.engines.server.process import ServerExited, ServerStartError
from kvbench.bench.engines.server.rows import request_row
from kvbench.bench.engines.server.session import Flight, ServerSession
from kvbench.bench.engines.server.stream import ServerReplyError
from kvbench.bench.engines.server.tiers import files_bytes
from kvbench.bench.telemetry.machine_load import LoadWindow
from kvbench.bench.telemetry.server import ProcessTree, ServerWatch
from kvbench.bench.trial import ServerTrial
from kvbench.results.rows import Status
from kvbench.scenario import Scenario


def run_mode(engine: ServerEngine, record: RowSink, mode: Any, repeat: int, level: int,
             trials: list[ServerTrial], todo: list[ServerTrial]) -> None:
    """Run ``todo`` (those of ``trials``, ``mode``'s requests at concurrency ``level`` in ``repeat``, not written
    yet) on a server of ``mode`` started cold for them, each row written through ``record`` as its request ends;
    the server is stopped on every exit path. run.json's ``servers`` lists the server while it runs (a killed run
    still names it) and, once it stopped, with its ``/metrics`` deltas; a resumed run's earlier servers stay
    listed first. KeyboardInterrupt stops it after writing what finished.

    Raises:
        OSError: a row could not be written (disk full...): the load stops.
    """
    if not engine.launches:  # a resumed run's earlier servers stay listed
        engine.launches.extend(record.run.meta.get("servers") or [])
    if record.on_status:
        record.on_status(f"starting the {engine.kind} server for {mode.label} (repeat {repeat})"
                         if engine.kind_spec.started else
                         f"{mode.label} (repeat {repeat}) on the running server at {mode.url or engine.s.engine.url}")
    try:
        with engine.session(mode, repeat, level) as srv:
            record.run.update(servers=engine.launches)
            try:
                asyncio.run(_ModeLoad(engine, record, srv, level).run(trials, todo))
            except ServerReplyError as exc:  # before the load (reset, warm-up, refill): the server is no use
                if srv.process is not None and not srv.process.alive():
                    raise ServerReplyError(f"{exc}\nthe server exited; its log ends:\n"
                                           f"{srv.process.log_tail(10)}") from exc
                raise
    except ServerExited as exc:  # mid-mode: what was in flight is an error row, what was not sent stays to run
        engine.launches[-1]["exited"] = f"{exc}".splitlines()[0]
    except (ServerStartError, ServerReplyError) as exc:
        for t in todo:
            if t.trial_id not in record.rows:
                record.write({**request_row(engine, t, None, None),
                              "status": Status.ERROR, "message": f"{type(exc).__name__}: {exc}"})
    finally:
        record.run.update(servers=engine.launches)


class _ModeLoad:
    """The measured load of one mode's server ``srv`` at concurrency ``level``: its samplers (the server's process
    tree, the machine's load), the first request's cold check, the writer thread rows go through."""

    def __init__(self, engine: ServerEngine, record: RowSink, srv: ServerSession, level: int):
        self.engine, self.record, self.srv, self.level = engine, record, srv, level
        self.tree: ProcessTree | None = None
        self.own: Callable[[], float] | None = None
        self.rss_start: int | None = None
        self.first_pending = False
        self.flight = Flight()
        self.written: list[concurrent.futures.Future[Any]] = []
        self.writer: concurrent.futures.ThreadPoolExecutor | None = None
        self.cell_of = {q.document: q.cell for q in engine.source.requests}

    async def run(self, trials: list[ServerTrial], todo: list[ServerTrial]) -> None:
        """Warm the server up, refill a resumed mode's conversations, then send ``todo`` under the load profile
        (:func:`~kvbench.bench.engines.server.load.run_load`); requests not sent by ``load.duration_s`` are
        ``skipped`` rows. The first row that could not be written raises its OSError after the load."""
        s, srv = self.engine.s, self.srv
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=self.level + 2),
                                     timeout=s.engine.request_timeout_s, trust_env=self.engine.trust_env,
                                     follow_redirects=False, headers=srv.headers) as client:
            await srv.warm_up(client, s.warmup)
            # the first request a fresh server answers must reuse nothing (a resumed mode's refill fills the cache)
            self.first_pending = not await srv.refill(client, trials, todo)
            srv.metrics_before = srv.metrics_text()  # the deltas count the measured requests (and their holds)
            self.writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kvbench-rows")
            watch = ServerWatch(srv.pid, s.monitor.interval_ms / 1000, self.engine.nvml) if srv.pid else None
            if srv.pid:
                self.tree = ProcessTree(srv.pid)
                self.own, self.rss_start = self.tree.cpu_seconds, self.tree.rss_bytes()
            window = LoadWindow(also_own=self.own)
            if watch is not None:
                watch.start()
            spec = s.load_spec.at_level(self.level)
            try:
                outcomes = await run_load(todo, lambda t: self._send(client, t), spec, chain=_chain(s),
                                          on_done=self._done, arrival=lambda t: t.request.arrival_s or 0.0)
                sent = {o.request.trial_id for o in outcomes}
                for t in todo:  # past load.duration_s: not sent, and not to be sent by --resume either
                    if t.trial_id not in sent:
                        self._hand({**request_row(self.engine, t, None, None), "status": Status.SKIPPED,
                                    "message": f"not sent: load.duration_s ({s.load_spec.duration_s:g} s) had passed"})
            finally:
                self.writer.shutdown(wait=True)
                load = window.stop()
                srv.info.update(load={"profile": spec.profile, "concurrency": spec.max_in_flight, **load,
                                      **(watch.stop() if watch is not None else {})})
        for f in self.written:  # the first row that could not be written (disk full...) stops the sweep
            f.result()

    async def _send(self, client: httpx.AsyncClient, t: ServerTrial) -> tuple[Any, dict[str, Any], bool]:
        """Send measured request ``t`` (:meth:`ServerSession.run
        <kvbench.bench.engines.server.session.ServerSession.run>`): its reply, its facts with what the mode holds
        after it (:meth:`_held`), and whether it was the first this server answered."""
        was_first, self.first_pending = self.first_pending, False
        if self.record.on_start:  # a measured request (not a warm-up, hold or refill), before its restore
            self.record.on_start(t)
        with self.flight:
            reply, facts = await self.srv.run(client, t, self.own, self.flight)
        return reply, {**facts, **self._held(t.request)}, was_first

    def _held(self, request: Any) -> dict[str, Any]:
        """What the mode holds now: its configured host tier, the server's RSS growth since its measured requests
        began, the slot files on disk of ``request``'s cell (a ``shared_prefix`` cell's own, so that it is not
        charged the files of cells before it; every file otherwise)."""
        srv = self.srv
        rss = self.tree.rss_bytes() if self.tree is not None else None
        files = [f for d, f in srv.slot_files.items() if self.cell_of.get(d) == request.cell]
        return {"server_host_tier_bytes": srv.host_tier[0], "server_host_tier": srv.host_tier[1],
                "server_rss_growth_bytes": max(0, rss - self.rss_start) if rss is not None and self.rss_start
                is not None else None,
                **({"store_disk_bytes": files_bytes(srv.slot_dir, files)} if srv.preset.slots else {})}

    def _done(self, o: Outcome) -> None:
        """Build the row of a finished request and hand it to the writer; a write that failed (disk full) stops
        the load, and so does a server that exited (ServerExited: the requests in flight are cancelled)."""
        for f in self.written:
            if f.done() and f.exception() is not None:
                raise f.exception()  # type: ignore[misc]
        t, error = o.request, o.error
        row = None
        if error is None:
            reply, facts, was_first = o.result
            try:
                row = {**request_row(self.engine, t, reply, o, first=was_first), **facts}
            except RuntimeError as exc:  # the server generated another number of tokens
                error = exc
        gone = row is None and self.srv.exited(2.0 if getattr(error, "lost", False) else 0.0)
        if row is None:
            why = f"{type(error).__name__}: {error}"
            if gone:
                why += (f"\nthe server exited mid-mode; the requests not sent yet are left for `kvbench run "
                        f"--resume`; its log ends:\n{self.srv.process.log_tail(10)}")
            row = {**request_row(self.engine, t, None, o), "status": Status.ERROR, "message": why}
        self._hand(row)
        if gone:
            self.srv.process.check_alive()  # raises ServerExited

    def _hand(self, row: dict[str, Any]) -> None:
        """Write ``row`` on the writer thread (:meth:`RowSink.write <kvbench.bench.engines.base.RowSink.write>`)."""
        assert self.writer is not None
        self.written.append(self.writer.submit(self.record.write, row))


def _chain(s: Scenario) -> Callable[[ServerTrial], Hashable | None]:
    """A multi-turn conversation's turns go in order, each after the previous reply; other requests are
    independent."""
    if s.workload.multi_turn is not None:
        return lambda t: t.request.document
    return lambda t: None
