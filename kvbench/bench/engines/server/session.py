"""A server engine's mode session (run by :func:`~kvbench.bench.engines.server.mode_run.run_mode`): the server of one
mode and repeat, started cold by
:meth:`ServerEngine.session <kvbench.bench.engines.server.engine.ServerEngine.session>`, and what the mode does around
each request: its requests streamed, a conversation's slot restored before a turn and saved after it (llama.cpp's disk
slots), the reply the dataset has held after a turn, a resumed mode's earlier turns sent again, ``/metrics`` read."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from kvbench.bench.engines.server.client import Reply, complete_llamacpp, complete_openai
from kvbench.bench.engines.server.http import get_page, get_page_async, server_client
from kvbench.bench.engines.server.process import ServerProcess
from kvbench.bench.engines.server.stream import ServerReplyError, printable
from kvbench.bench.telemetry.machine_load import LoadWindow
from kvbench.bench.trial import ServerTrial
from kvbench.scenario.servers import Preset


@dataclass
class Holds:
    """The unrecorded hold requests of one server (:meth:`ServerSession.hold`): how many were sent, and the
    ``/metrics`` scrapes just before and after each one that ran alone (no other request in flight from its first
    scrape to its last), whose difference is that hold's own share of the counters."""

    sent: int = 0
    scrapes: list[tuple[str | None, str | None]] = field(default_factory=list)


class Flight:
    """The requests of one load in flight (a context per request), and how many have begun so far: a hold that
    began and ended with only its own request in flight, and no other begun in between, ran alone."""

    def __init__(self) -> None:
        self.now = self.begun = 0

    def __enter__(self) -> Flight:
        self.now += 1
        self.begun += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self.now -= 1


class ServerSession:
    """The server of one mode and repeat: ``url``, ``pid`` (None for ``openai``), its ``process``, what goes into
    run.json (``info``: :meth:`facts`), the ``/metrics`` text before the measured requests (``metrics_before``),
    the conversations' slot files (``slot_files`` in ``slot_dir``), its configured host tier (``host_tier``: bytes
    and where the figure comes from, :func:`kvbench.bench.engines.server.tiers.host_tier`), its :class:`Holds` and the
    HTTP ``headers`` its requests send (the key a started server checks, :mod:`kvbench.bench.engines.server.keys`).
    ``engine`` is the :class:`~kvbench.bench.engines.server.engine.ServerEngine` that started it (its scenario,
    kind, proxies and the conversations' followed requests)."""

    def __init__(self, engine: Any, mode: Any, url: str, process: ServerProcess | None, preset: Preset,
                 info: dict[str, Any], slot_dir: Path | None = None, host_tier: tuple[int | None, str] = (None, "")):
        self.engine, self.mode, self.url, self.process, self.preset = engine, mode, url, process, preset
        self.info, self.slot_dir, self.host_tier = info, slot_dir, host_tier
        self.pid: int | None = None
        self.metrics_before: str | None = None
        self.slot_files: dict[str, str] = {}
        self.holds = Holds()
        self.slot_tokens: dict[int, list[int]] = {}
        self.headers: dict[str, str] = {}

    def facts(self) -> dict[str, Any]:
        """The run.json ``servers`` entry of this server (command line, version, log, slots, host tier and, once
        it stops, the ``/metrics`` deltas)."""
        return self.info

    def post(self, path: str) -> None:
        """``POST`` to ``path`` of a server kvbench did not start (``engine.reset_path`` with ``cold: reset``).

        Raises:
            ServerReplyError: it failed or answered an HTTP error.
        """
        try:
            with server_client(self.engine.trust_env) as c:
                r = c.post(self.url + path, timeout=self.engine.s.engine.request_timeout_s)
        except httpx.HTTPError as exc:
            raise ServerReplyError(f"{self.url}{path}: POST failed: {type(exc).__name__}: {exc}", self.url) from exc
        if r.status_code >= 400:
            raise ServerReplyError(f"{self.url}{path}: POST answered HTTP {r.status_code}: "
                                   f"{printable(r.text, 300)!r}", self.url)

    def metrics_text(self) -> str | None:
        """The server's ``/metrics`` text, or None where it has none (or cannot be read now, or is over
        :data:`~kvbench.bench.engines.server.http.MAX_PAGE_BYTES`)."""
        return get_page(self.url + "/metrics", self.engine.trust_env, headers=self.headers)

    async def scrape(self, client: httpx.AsyncClient) -> str | None:
        """:meth:`metrics_text` without blocking the event loop (between requests of a load)."""
        return await get_page_async(client, self.url + "/metrics")

    async def send(self, client: httpx.AsyncClient, ids: Sequence[int], n_tokens: int) -> Reply:
        """One streamed, greedy request of exactly ``n_tokens`` new tokens for prompt ``ids``, with the preset's
        and the mode's request options, on the kind's protocol. Where the reply names its slot (llama.cpp), its
        ``slot_kept`` is the common prefix of ``ids`` with what that slot held after its previous request (prompt
        and generated ids; none yet: 0), and the slot then holds this request's: cached tokens beyond
        ``slot_kept`` came from elsewhere (llama.cpp's ``--cache-ram`` host cache, or a restored slot file)."""
        e = self.engine
        options = {**self.engine.quality.request, **self.preset.request, **self.mode.request}
        timeout, deadline = e.s.engine.request_timeout_s, e.s.engine.reply_timeout_s
        if e.kind_spec.protocol == "completion":
            reply = await complete_llamacpp(client, self.url, ids, n_tokens, options, seed=e.s.seed,
                                            timeout_s=timeout, deadline_s=deadline)
            if reply.slot is None:
                return reply
            kept = common_prefix(self.slot_tokens.get(reply.slot, []), ids)
            self.slot_tokens[reply.slot] = [*ids, *(reply.ids or [])]
            return dataclasses.replace(reply, slot_kept=kept)
        return await complete_openai(client, self.url, e.model_name(self.url, self.headers), ids, n_tokens,
                                     options, seed=e.s.seed, timeout_s=timeout, deadline_s=deadline)

    async def slot_action(self, client: httpx.AsyncClient, action: str, filename: str,
                          slot: int = 0) -> dict[str, Any]:
        """llama.cpp's slot save/restore (``POST /slots/{slot}?action=save|restore``, file ``filename`` in the
        mode's ``--slot-save-path``): its reply (``n_written``/``save_ms``, ``n_restored``/``restore_ms``).

        Raises:
            ServerReplyError: the server refused it (the body in the message).
        """
        try:
            r = await client.post(f"{self.url}/slots/{slot}", params={"action": action},
                                  json={"filename": filename}, timeout=self.engine.s.engine.request_timeout_s)
        except httpx.HTTPError as exc:
            raise ServerReplyError(f"{self.url}/slots/{slot}: {action} failed: {type(exc).__name__}: {exc}",
                                   self.url) from exc
        if r.status_code >= 400:
            raise ServerReplyError(f"{self.url}/slots/{slot}: {action} answered HTTP {r.status_code}: "
                                   f"{r.text[:300]!r}", self.url)
        try:
            return dict(r.json())
        except ValueError:
            return {}

    async def warm_up(self, client: httpx.AsyncClient, n: int) -> None:
        """Send ``n`` unrecorded warm-up requests (:meth:`ServerEngine.warmup_ids
        <kvbench.bench.engines.server.engine.ServerEngine.warmup_ids>`: they share no prefix with any request, so
        what they leave in the cache is nothing a request could reuse). No cache reset follows: each mode's server
        starts fresh, and its first measured request's cached prompt tokens say whether it began cold
        (``cold_verified``)."""
        for _ in range(n):
            await self.send(client, self.engine.warmup_ids(), self.engine.s.max_new_tokens)

    async def run(self, client: httpx.AsyncClient, t: ServerTrial, own: Any,
                  flight: Flight | None = None) -> tuple[Reply, dict[str, Any]]:
        """One measured request: for a conversation's later turn on a mode with slot files, the restore of its
        slot first (timed inside TTFT: the user waits for restore + prefill of the rest + the first token), the
        request, its hold and the save of its slot. Returns the reply (its ``t_sent`` before the restore) and the
        request's facts: the machine's load over it (``own``: this process's CPU seconds, left out),
        ``slot_restore_s``/``server_restore_s`` (the client's and the server's own ``restore_ms``),
        ``slot_save_s``/``server_save_s``."""
        facts: dict[str, Any] = {}
        request_load = LoadWindow(also_own=own)
        t0 = time.perf_counter()
        restoring = self.preset.slots and t.request.turn_index > 1 and t.request.document in self.slot_files
        if restoring:
            done = await self.slot_action(client, "restore", self.slot_files[t.request.document])
            facts.update(slot_restore_s=time.perf_counter() - t0, server_restore_s=_server_s(done, "restore_ms"))
        reply = await self.send(client, t.request.ids, self.engine.s.max_new_tokens)
        if restoring:
            reply = dataclasses.replace(reply, t_sent=t0)
        facts.update(request_load.stop())
        await self.hold(client, t, flight)
        if self.preset.slots:
            name = f"{t.request.document}.bin".replace("/", "_")
            t1 = time.perf_counter()
            done = await self.slot_action(client, "save", name)
            facts.update(slot_save_s=time.perf_counter() - t1, server_save_s=_server_s(done, "save_ms"))
            self.slot_files[t.request.document] = name
        return reply, facts

    async def hold(self, client: httpx.AsyncClient, t: ServerTrial, flight: Flight | None = None) -> None:
        """After a conversation turn, what the server would hold had it generated the whole reply: the turn's
        prompt and the dataset's reply (``held``), sent unrecorded for one token so that the server computes (and,
        in a mode that caches, keeps) their KV, as it would after decoding the reply itself. kvbench generates
        only ``max_new_tokens`` of each reply; the next turn's prompt carries the dataset's. Not in a cold mode,
        which keeps nothing. With ``flight`` (a measured load), the hold is counted in :attr:`holds`, and when its
        request is the only one in flight ``/metrics`` is read just before and after it, so that its own share of
        the counters can be taken out of the mode's."""
        req = t.request
        if len(req.held) <= len(req.ids) or req.id not in self.engine.followed or self.preset.cold:
            return
        if flight is None:
            await self.send(client, req.held, 1)
            return
        self.holds.sent += 1
        alone, begun = flight.now == 1, flight.begun
        before = await self.scrape(client) if alone else None
        await self.send(client, req.held, 1)
        if alone and flight.now == 1 and flight.begun == begun:
            self.holds.scrapes.append((before, await self.scrape(client)))

    async def refill(self, client: httpx.AsyncClient, trials: Sequence[ServerTrial],
                     todo: Sequence[ServerTrial]) -> int:
        """Resumed mid-mode: send again, unrecorded, the written turns of conversations with turns still to run
        (each with its hold), so that the server holds what it held; how many were sent."""
        if self.engine.s.workload.multi_turn is None:
            return 0
        pending = {t.request.document for t in todo}
        missing = {t.trial_id for t in todo}
        sent = 0
        for t in trials:
            if t.trial_id not in missing and t.request.document in pending:
                await self.send(client, t.request.ids, self.engine.s.max_new_tokens)
                await self.hold(client, t)
                sent += 1
        return sent

    def exited(self, wait_s: float) -> bool:
        """Whether the server has exited: a server that is dying drops its connections before its process ends,
        so after a lost connection this waits up to ``wait_s`` seconds for the exit (a failure path: the streams
        in flight wait with it). False for a server kvbench did not start."""
        if self.process is None:
            return False
        end = time.monotonic() + wait_s
        while self.process.alive():
            if time.monotonic() > end:
                return False
            time.sleep(0.05)
        return True


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n


def _server_s(reply: dict[str, Any], key: str) -> float | None:
    """A slot action's own time (llama-server's ``timings.<key>``, milliseconds) in seconds, or None."""
    v = (reply.get("timings") or {}).get(key) if isinstance(reply.get("timings"), dict) else None
    return v / 1000 if type(v) in (int, float) and v >= 0 else None
