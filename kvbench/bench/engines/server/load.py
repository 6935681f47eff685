"""When each request of a server run is sent: the sequential, concurrent and Poisson load profiles.

Pure asyncio, no HTTP: :func:`run_load` decides when each request of a stream goes, awaits the caller's ``send``
for it and collects what that returns (or raises) as :class:`Outcome` rows. Time is read from an injectable
``clock`` and waited out with an injectable ``sleep``, so tests run on virtual time.

Times in an :class:`Outcome` are seconds from the load's start (the ``clock`` reading when :func:`run_load` began).

Conversations: ``chain(request)`` gives a key; requests with the same key are sent in stream order, each only
after the previous one of its chain has finished plus the spec's ``think_time_s``. ``None`` = independent.

- ``sequential``: one request at a time, strictly in stream order (a turn waiting out its think time holds back
  the requests after it).
- ``concurrent``: up to ``concurrency`` in flight; when a slot frees, the first eligible request in
  stream order goes (one blocked by its chain does not hold back later independent ones).
- ``poisson``: request *i* is due at arrival *i* of :func:`poisson_arrivals` (or later, when its chain is not
  ready); at most ``concurrency`` in flight when given (None: no cap).
- ``trace``: request *i* is due at its own arrival time (``arrival(request)``: a replayed trace's, seconds from
  the first request sent); otherwise as ``poisson`` (open loop: a late reply never delays the next arrival, and
  ``queue_s`` is the achieved lag behind the trace).
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvbench.scenario.load_spec import LoadSpec


@dataclass
class Outcome:
    """One request of a load, sent and finished.

    ``request``: the request as given. ``arrival_s``: when it became due, seconds from the load's start (poisson:
    its arrival time, or later when its chain was not ready then; otherwise when its chain let it go, 0 for an
    independent request). ``start_s`` / ``end_s``: when ``send`` was called and when it returned or raised.
    ``result``: what ``send`` returned; ``error``: the :class:`Exception` it raised (``result`` is then None).
    """

    request: Any
    arrival_s: float
    start_s: float
    end_s: float
    result: Any = None
    error: BaseException | None = None


def load_fields(profile: str, outcome: Outcome) -> dict[str, float]:
    """A sent request's row fields of the load: ``arrival_s`` and ``start_s`` (seconds from the load's start) and
    ``queue_s`` (start − arrival). One at a time (``sequential``) a request arrives when it is sent: it never
    queues."""
    arrival = outcome.start_s if profile == "sequential" else outcome.arrival_s
    return {"arrival_s": arrival, "start_s": outcome.start_s, "queue_s": max(0.0, outcome.start_s - arrival)}


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """The first ``n`` arrival times (seconds from the start, increasing, the first > 0) of a Poisson process of
    ``rate`` requests per second: cumulative sums of exponential gaps drawn from ``numpy.random.default_rng(seed)``,
    so the same seed gives the same times. ``rate`` and ``seed`` are a :class:`~kvbench.scenario.load_spec.LoadSpec`'s,
    which checked them (rate > 0 and finite, seed ≥ 0)."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)
    return [float(x) for x in np.cumsum(gaps)]


async def run_load(requests: Sequence[Any], send: Callable[[Any], Awaitable[Any]], spec: LoadSpec, *,
                   chain: Callable[[Any], Hashable | None] = lambda r: None,
                   on_done: Callable[[Outcome], None] | None = None,
                   arrival: Callable[[Any], float] = lambda r: 0.0,
                   clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> list[Outcome]:
    """Send ``requests`` (a stream, in order) through ``send`` as ``spec`` says; return one :class:`Outcome`
    per request sent, in the order they were sent.

    ``chain(request)`` gives each request's conversation key (None: independent); ``arrival(request)`` its
    arrival time under the ``trace`` profile (seconds; times are taken from the first request's, so a resumed
    load's remaining requests start at once); ``on_done`` is called with each
    outcome as it finishes (several finishing together: by end time, then in the order sent). ``clock`` returns
    seconds (any origin); ``sleep(seconds)`` waits that long on the same clock. A ``send`` that raises an
    :class:`Exception` gives an outcome with ``error`` and the load goes on (the next turn of its chain is still
    sent). Requests past ``spec.n_requests``, or not yet sent when ``spec.duration_s`` is
    reached, are not sent (and give no outcome).

    ``spec`` is validated where it is built (pydantic); one of several concurrency levels is taken with
    :meth:`LoadSpec.at_level <kvbench.scenario.load_spec.LoadSpec.at_level>` (a spec of several levels raises
    ValueError before anything is sent). On cancellation,
    ``KeyboardInterrupt`` or an error from ``on_done``, ``chain`` or ``sleep``, the in-flight sends are cancelled
    (they give no outcome) and the exception is re-raised.
    """
    cap, in_order = spec.max_in_flight, spec.profile == "sequential"
    stream = list(requests if spec.n_requests is None else requests[: spec.n_requests])
    keys = [chain(r) for r in stream]
    if spec.profile == "poisson":
        base = poisson_arrivals(len(stream), spec.rate, spec.seed)
    elif spec.profile == "trace" and stream:
        times = [float(arrival(r)) for r in stream]
        base = [t - times[0] for t in times]
    else:
        base = [0.0] * len(stream)
    horizon = math.inf if spec.duration_s is None else float(spec.duration_s)
    think = float(spec.think_time_s)

    chains: dict[Hashable, deque[int]] = {}  # per conversation: its requests not yet sent, in stream order
    waiting: list[tuple[float, int]] = []  # (due time, index): requests free of their chain, not yet due
    for i, key in enumerate(keys):
        if key is None:
            waiting.append((base[i], i))
            continue
        queue = chains.setdefault(key, deque())
        if not queue:
            waiting.append((base[i], i))
        queue.append(i)
    heapq.heapify(waiting)
    ready: list[int] = []  # indices that are due, by stream order
    due: dict[int, float] = {}
    sent: list[Outcome | None] = []
    inflight: dict[asyncio.Task, tuple[int, int]] = {}  # task -> (index, its place in `sent`)
    next_index = 0  # sequential: the index that must go next
    sleeper: asyncio.Future | None = None
    sleeper_wake: float | None = None
    t0 = clock()

    async def one(i: int) -> Outcome:
        start = clock() - t0
        try:
            result = await send(stream[i])
        except Exception as exc:
            return Outcome(stream[i], due[i], start, clock() - t0, None, exc)
        return Outcome(stream[i], due[i], start, clock() - t0, result)

    try:
        while True:
            now = clock() - t0
            while waiting and waiting[0][0] <= now:
                when, i = heapq.heappop(waiting)
                due[i] = when
                heapq.heappush(ready, i)
            is_open = now < horizon
            while (is_open and ready and (cap is None or len(inflight) < cap)
                   and (not in_order or ready[0] == next_index)):
                i = heapq.heappop(ready)
                if keys[i] is not None:
                    chains[keys[i]].popleft()
                inflight[asyncio.ensure_future(one(i))] = (i, len(sent))
                sent.append(None)
                next_index = i + 1
            wake = waiting[0][0] if is_open and waiting and waiting[0][0] < horizon else None
            if cap is not None and len(inflight) >= cap:
                wake = None  # nothing can go before a slot frees
            if sleeper is not None and sleeper_wake != wake:
                sleeper.cancel()
                sleeper = None
            if not inflight and wake is None:
                break
            if wake is not None and sleeper is None:  # one sleep per wake-up time, kept across completions
                sleeper, sleeper_wake = asyncio.ensure_future(sleep(max(0.0, wake - now))), wake
            waits: set[asyncio.Future] = set(inflight) | ({sleeper} if sleeper is not None else set())
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if sleeper in done:
                sleeper.result()  # a failed sleep is re-raised here
                sleeper = None
            finished = []
            for task in done:
                if task in inflight:
                    i, place = inflight.pop(task)
                    finished.append((task.result(), place, i))  # only a BaseException escapes `one`
            finished.sort(key=lambda item: (item[0].end_s, item[1]))
            for outcome, place, i in finished:
                sent[place] = outcome
                queue = chains.get(keys[i]) if keys[i] is not None else None
                if queue:  # the conversation's next turn may go after the think time
                    j = queue[0]
                    heapq.heappush(waiting, (max(base[j], outcome.end_s + think), j))
            for outcome, _place, _i in finished:
                if on_done is not None:
                    on_done(outcome)
    except BaseException:
        if sleeper is not None:
            sleeper.cancel()
        for task in inflight:
            task.cancel()
        if inflight:
            await asyncio.wait(set(inflight))
        raise
    return [outcome for outcome in sent if outcome is not None]
