"""Load profiles of a server run (kvbench.bench.engines.server.load) on virtual time: exact send times, chains, think
time, Poisson schedules, cut-offs, failures and cancellation."""

from __future__ import annotations

import asyncio
import selectors
from dataclasses import dataclass

import numpy as np
import pytest

from pydantic import ValidationError

from kvbench.bench.engines.server.load import Outcome, load_fields, poisson_arrivals, run_load
from kvbench.scenario.load_spec import PROFILES, LoadSpec


class _VirtualSelector(selectors.DefaultSelector):
    """Serves real (self-pipe) events at once; when the loop would block for ``timeout`` seconds, advances the
    loop's virtual clock by that much instead: time moves only when every task waits."""

    def __init__(self, loop_clock: list[float]):
        super().__init__()
        self._clock = loop_clock

    def select(self, timeout=None):
        events = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None:
            raise RuntimeError("virtual time: every task waits and no timer is set (a deadlock)")
        self._clock[0] += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose ``time()`` starts at 0.0 and jumps to the next timer whenever all tasks wait."""

    def __init__(self):
        self._virtual = [0.0]
        super().__init__(_VirtualSelector(self._virtual))

    def time(self) -> float:
        return self._virtual[0]


def virtual(coro_fn):
    """Run ``coro_fn()`` to completion on a fresh virtual-time loop; return its result."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(coro_fn())


@dataclass(frozen=True)
class Req:
    id: str
    takes_s: float
    conv: str | None = None
    fails: bool = False


class FakeServer:
    """``send`` takes each request's ``takes_s`` of (virtual) time; records starts, in-flight peaks, cancels."""

    def __init__(self):
        self.started: list[tuple[str, float]] = []
        self.cancelled: list[str] = []
        self.in_flight = 0
        self.peak = 0

    async def send(self, r: Req) -> str:
        self.started.append((r.id, asyncio.get_running_loop().time()))
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(r.takes_s)
        except asyncio.CancelledError:
            self.cancelled.append(r.id)
            raise
        finally:
            self.in_flight -= 1
        if r.fails:
            raise ValueError(f"boom {r.id}")
        return f"reply {r.id}"


def load(reqs, spec, server=None, done=None, **kw):
    """Run ``reqs`` through a FakeServer on virtual time, chained by ``Req.conv``; return the outcomes."""
    server = server or FakeServer()

    async def main():
        return await run_load(reqs, server.send, spec, chain=lambda r: r.conv,
                              on_done=None if done is None else done.append,
                              clock=asyncio.get_running_loop().time, **kw)

    return virtual(main)


def table(outcomes):
    return [(o.request.id, o.arrival_s, o.start_s, o.end_s) for o in outcomes]


def test_sequential_sends_one_at_a_time_in_stream_order():
    done: list[Outcome] = []
    reqs = [Req("a", 1.0), Req("b", 2.5), Req("c", 0.5)]
    out = load(reqs, LoadSpec(), done=done)
    assert table(out) == [("a", 0.0, 0.0, 1.0), ("b", 0.0, 1.0, 3.5), ("c", 0.0, 3.5, 4.0)]
    assert [o.result for o in out] == ["reply a", "reply b", "reply c"]
    assert [o.request.id for o in done] == ["a", "b", "c"]
    assert all(o.error is None for o in out)


def test_concurrency_two_with_three_conversations_of_two_turns():
    reqs = [Req("A1", 1.0, "A"), Req("B1", 2.0, "B"), Req("C1", 0.5, "C"),
            Req("A2", 1.0, "A"), Req("B2", 2.0, "B"), Req("C2", 0.5, "C")]
    server = FakeServer()
    out = load(reqs, LoadSpec(profile="concurrent", concurrency=2), server=server)
    # t=1: A1 ends; C1 (stream index 2) goes before A2 (3). t=1.5: C1 ends; A2 goes. t=2: B1 ends; B2 (4) goes
    # before C2 (5). t=2.5: A2 ends; C2 goes.
    assert table(out) == [("A1", 0.0, 0.0, 1.0), ("B1", 0.0, 0.0, 2.0), ("C1", 0.0, 1.0, 1.5),
                          ("A2", 1.0, 1.5, 2.5), ("B2", 2.0, 2.0, 4.0), ("C2", 1.5, 2.5, 3.0)]
    assert server.peak == 2


def test_a_request_blocked_by_its_chain_does_not_block_independent_ones():
    reqs = [Req("A1", 3.0, "A"), Req("A2", 1.0, "A"), Req("x", 1.0), Req("y", 1.0)]
    done: list[Outcome] = []
    out = load(reqs, LoadSpec(profile="concurrent", concurrency=2), done=done)
    # returned in the order sent; on_done in the order finished
    assert table(out) == [("A1", 0.0, 0.0, 3.0), ("x", 0.0, 0.0, 1.0), ("y", 0.0, 1.0, 2.0), ("A2", 3.0, 3.0, 4.0)]
    assert [o.request.id for o in done] == ["x", "y", "A1", "A2"]


def test_outcomes_finishing_together_reach_on_done_in_the_order_sent():
    done: list[Outcome] = []
    reqs = [Req(f"r{i}", 2.0) for i in range(12)]
    out = load(reqs, LoadSpec(profile="concurrent", concurrency=12), done=done)
    assert [o.request.id for o in done] == [o.request.id for o in out] == [f"r{i}" for i in range(12)]
    assert {o.end_s for o in out} == {2.0}


def test_think_time_delays_the_next_turn_exactly():
    reqs = [Req("A1", 1.0, "A"), Req("A2", 1.0, "A"), Req("A3", 0.5, "A")]
    out = load(reqs, LoadSpec(profile="concurrent", concurrency=4, think_time_s=0.75))
    assert table(out) == [("A1", 0.0, 0.0, 1.0), ("A2", 1.75, 1.75, 2.75), ("A3", 3.5, 3.5, 4.0)]
    # sequential keeps stream order: the independent "x" waits behind A2's think time
    reqs = [Req("A1", 1.0, "A"), Req("A2", 1.0, "A"), Req("x", 1.0)]
    out = load(reqs, LoadSpec(think_time_s=2.0))
    assert table(out) == [("A1", 0.0, 0.0, 1.0), ("A2", 3.0, 3.0, 4.0), ("x", 0.0, 4.0, 5.0)]
    # independent requests never wait for think time
    out = load([Req("p", 1.0), Req("q", 1.0)], LoadSpec(think_time_s=5.0))
    assert [o.start_s for o in out] == [0.0, 1.0]


def test_poisson_arrival_times_follow_the_seed():
    reqs = [Req(str(i), 0.01) for i in range(6)]
    spec = LoadSpec(profile="poisson", rate=4.0, seed=7)
    first, again = load(reqs, spec), load(reqs, spec)
    expected = poisson_arrivals(6, 4.0, 7)
    assert [o.arrival_s for o in first] == pytest.approx(expected, abs=1e-9)
    assert [o.start_s for o in first] == pytest.approx(expected, abs=1e-9)  # no cap: each goes when due
    assert table(first) == table(again)
    other = load(reqs, LoadSpec(profile="poisson", rate=4.0, seed=8))
    assert [o.arrival_s for o in other] == pytest.approx(poisson_arrivals(6, 4.0, 8), abs=1e-9)
    assert [o.arrival_s for o in other] != pytest.approx(expected, abs=1e-3)


def test_poisson_arrivals_are_reproducible_exponential_gaps():
    a = poisson_arrivals(20_000, 5.0, 3)
    assert a == poisson_arrivals(20_000, 5.0, 3)
    assert a != poisson_arrivals(20_000, 5.0, 4)
    gaps = np.diff([0.0] + a)
    assert gaps.min() > 0
    assert gaps.mean() == pytest.approx(0.2, rel=0.03)  # 1 / rate seconds
    assert gaps.std() == pytest.approx(0.2, rel=0.05)  # exponential: std = mean
    assert poisson_arrivals(0, 5.0, 3) == []
    for bad in ({"rate": 0}, {"rate": float("inf")}, {"rate": 1.0, "seed": -1}):  # the spec checks what it draws
        with pytest.raises(ValidationError):
            LoadSpec(profile="poisson", **bad)


def test_poisson_with_a_cap_and_with_chains_sends_later_than_due():
    arr = poisson_arrivals(4, 2.0, 11)
    out = load([Req(str(i), 10.0) for i in range(4)], LoadSpec(profile="poisson", rate=2.0, seed=11, concurrency=1))
    starts = [arr[0]]
    for a in arr[1:]:
        starts.append(max(a, starts[-1] + 10.0))
    assert [o.arrival_s for o in out] == pytest.approx(arr, abs=1e-9)
    assert [o.start_s for o in out] == pytest.approx(starts, abs=1e-9)
    # a conversation's second turn is due at max(its arrival, previous end + think time)
    reqs = [Req("A1", 5.0, "A"), Req("A2", 0.1, "A"), Req("x", 0.1)]
    out = {o.request.id: o for o in load(reqs, LoadSpec(profile="poisson", rate=2.0, seed=11, think_time_s=0.5))}
    assert out["A2"].arrival_s == pytest.approx(arr[0] + 5.5, abs=1e-9)
    assert out["A2"].start_s == pytest.approx(arr[0] + 5.5, abs=1e-9)
    assert out["x"].start_s == pytest.approx(arr[2], abs=1e-9)
    # ... and at its own arrival when the previous turn ended well before it
    out = load([Req("A1", 0.01, "A"), Req("A2", 0.01, "A")], LoadSpec(profile="poisson", rate=2.0, seed=11))
    assert [o.arrival_s for o in out] == pytest.approx(arr[:2], abs=1e-9)


def test_n_requests_and_duration_cut_offs():
    reqs = [Req(str(i), 1.0) for i in range(5)]
    assert [o.request.id for o in load(reqs, LoadSpec(n_requests=3))] == ["0", "1", "2"]
    out = load(reqs, LoadSpec(duration_s=2.5))  # sent at 0, 1, 2; the one sent at 2 finishes at 3
    assert table(out) == [("0", 0.0, 0.0, 1.0), ("1", 0.0, 1.0, 2.0), ("2", 0.0, 2.0, 3.0)]
    assert len(load(reqs, LoadSpec(duration_s=2.0))) == 2  # none is sent at (or after) the end
    assert len(load(reqs, LoadSpec(n_requests=2, duration_s=10.0))) == 2
    assert len(load(reqs, LoadSpec(n_requests=4, duration_s=1.5))) == 2
    arr = poisson_arrivals(40, 10.0, 5)
    out = load([Req(str(i), 0.01) for i in range(40)], LoadSpec(profile="poisson", rate=10.0, seed=5,
                                                                 duration_s=1.0))
    assert len(out) == sum(a < 1.0 for a in arr) > 0
    # a turn whose chain frees after the end is not sent
    out = load([Req("A1", 3.0, "A"), Req("A2", 1.0, "A")], LoadSpec(profile="concurrent", duration_s=2.0))
    assert table(out) == [("A1", 0.0, 0.0, 3.0)]


def test_a_failing_send_is_recorded_and_the_load_goes_on():
    done: list[Outcome] = []
    reqs = [Req("A1", 1.0, "A", fails=True), Req("A2", 1.0, "A"), Req("b", 0.5)]
    out = load(reqs, LoadSpec(profile="concurrent", concurrency=2), done=done)
    assert table(out) == [("A1", 0.0, 0.0, 1.0), ("b", 0.0, 0.0, 0.5), ("A2", 1.0, 1.0, 2.0)]
    assert isinstance(out[0].error, ValueError) and str(out[0].error) == "boom A1"
    assert out[0].result is None
    assert out[2].result == "reply A2" and out[2].error is None
    assert [o.request.id for o in done] == ["b", "A1", "A2"]


def test_cancellation_cancels_in_flight_sends_and_raises():
    server, done = FakeServer(), []
    reqs = [Req("a", 1.0), Req("b", 10.0), Req("c", 10.0), Req("d", 10.0)]

    async def main():
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(run_load(reqs, server.send, LoadSpec(profile="concurrent", concurrency=2),
                                              on_done=done.append, clock=loop.time))
        await asyncio.sleep(5.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return loop.time()

    assert virtual(main) == 5.0
    assert server.started == [("a", 0.0), ("b", 0.0), ("c", 1.0)]
    assert sorted(server.cancelled) == ["b", "c"]
    assert [o.request.id for o in done] == ["a"]


def test_keyboard_interrupt_cancels_in_flight_sends_and_is_re_raised():
    server = FakeServer()

    def on_done(outcome):
        raise KeyboardInterrupt

    async def main():
        await run_load([Req("a", 1.0), Req("b", 10.0)], server.send, LoadSpec(profile="concurrent", concurrency=2),
                       on_done=on_done, clock=asyncio.get_running_loop().time)

    with pytest.raises(KeyboardInterrupt):
        virtual(main)
    assert server.cancelled == ["b"]


def test_the_injected_sleep_waits_out_the_poisson_gaps():
    slept: list[float] = []

    async def sleep(seconds):
        slept.append(seconds)
        await asyncio.sleep(seconds)

    load([Req(str(i), 0.01) for i in range(3)], LoadSpec(profile="poisson", rate=1.0, seed=2), sleep=sleep)
    arr = poisson_arrivals(3, 1.0, 2)
    assert slept == pytest.approx([arr[0], arr[1] - arr[0], arr[2] - arr[1]], abs=1e-9)  # one sleep per gap


def test_real_clock_defaults_overlap_concurrent_sends():
    async def send(r):
        await asyncio.sleep(0.05)
        return r

    out = asyncio.run(run_load(["p", "q"], send, LoadSpec(profile="concurrent", concurrency=2)))
    assert [o.result for o in out] == ["p", "q"]
    assert out[1].start_s < out[0].end_s and out[0].end_s >= 0.05


@pytest.mark.parametrize("given, param, fragment", [
    (dict(profile="bursty"), "profile", "Input should be 'sequential', 'concurrent', 'poisson' or 'trace'"),
    (dict(profile="poisson"), "", "rate: required for profile poisson (requests per second)"),
    (dict(profile="poisson", rate=-2.0), "rate", "must be a number above 0, at most 1,000,000"),
    (dict(profile="poisson", rate=float("inf")), "rate", "must be a number above 0, at most 1,000,000"),
    (dict(profile="concurrent", rate=3.0), "", "rate: only for profile poisson (this load is concurrent)"),
    (dict(profile="concurrent", concurrency=0), "concurrency", "Input should be greater than or equal to 1"),
    (dict(profile="concurrent", concurrency=True), "concurrency", "Input should be a valid integer"),
    (dict(concurrency=3), "", "concurrency: profile sequential sends one request at a time; use profile concurrent"),
    (dict(n_requests=0), "n_requests", "Input should be greater than or equal to 1"),
    (dict(duration_s=0.0), "duration_s", "must be a number above 0, at most 3,600"),
    (dict(think_time_s=-1.0), "think_time_s", "must be a number from 0 to 3,600"),
    (dict(seed=-1), "seed", "Input should be greater than or equal to 0"),
])
def test_a_load_spec_is_checked_where_it_is_built(given, param, fragment):
    with pytest.raises(ValidationError) as info:
        LoadSpec(**given)
    first = info.value.errors()[0]
    assert fragment in first["msg"]
    assert ".".join(str(k) for k in first["loc"]).startswith(param)


def test_valid_specs_and_their_caps():
    assert PROFILES == ("sequential", "concurrent", "poisson", "trace")
    for spec, cap in [(LoadSpec(), 1), (LoadSpec(profile="concurrent"), 1),
                      (LoadSpec(profile="concurrent", concurrency=8), 8),
                      (LoadSpec(profile="poisson", rate=0.5), None),
                      (LoadSpec(profile="poisson", rate=0.5, concurrency=3, n_requests=9, duration_s=60.0), 3),
                      (LoadSpec(profile="trace"), None), (LoadSpec(profile="trace", concurrency=2), 2)]:
        assert spec.max_in_flight == cap


def test_a_spec_of_several_levels_sends_nothing():
    server = FakeServer()
    with pytest.raises(ValueError, match=r"a load at concurrency \[1, 2\]: take one level with at_level"):
        load([Req("a", 1.0)], LoadSpec(profile="concurrent", concurrency=[1, 2]), server=server)
    assert server.started == []
    assert load([Req("a", 1.0)], LoadSpec(profile="concurrent", concurrency=[1, 2]).at_level(2), server=server)
    assert LoadSpec(profile="poisson", rate=1.0).at_level(4).max_in_flight is None  # uncapped, 4 slots
    with pytest.raises(ValueError, match=r"concurrency 3 is not one of this load's levels \[1, 2\]"):
        LoadSpec(profile="concurrent", concurrency=[1, 2]).at_level(3)


def test_trace_sends_each_request_at_its_own_arrival_open_loop():
    """Arrivals 10, 11, 11.5, 30 s (from the first request's 10): a slow reply never delays the next arrival; with
    a cap of 1 the third waits for a slot and its queue_s is its lag behind the trace."""
    arrivals = {"a": 10.0, "b": 11.0, "c": 11.5, "d": 30.0}
    reqs = [Req("a", 3.0), Req("b", 1.0), Req("c", 1.0), Req("d", 1.0)]
    out = load(reqs, LoadSpec(profile="trace"), arrival=lambda r: arrivals[r.id])
    assert table(out) == [("a", 0.0, 0.0, 3.0), ("b", 1.0, 1.0, 2.0), ("c", 1.5, 1.5, 2.5), ("d", 20.0, 20.0, 21.0)]
    capped = load(reqs, LoadSpec(profile="trace", concurrency=1), arrival=lambda r: arrivals[r.id])
    assert table(capped) == [("a", 0.0, 0.0, 3.0), ("b", 1.0, 3.0, 4.0), ("c", 1.5, 4.0, 5.0),
                             ("d", 20.0, 20.0, 21.0)]
    assert [load_fields("trace", o)["queue_s"] for o in capped] == [0.0, 2.0, 2.5, 0.0]
