"""How requests reach a server: the ``load:`` key of a scenario (:class:`LoadSpec`), which the load runner
(:func:`kvbench.bench.engines.server.load.run_load`) takes as it is, one concurrency level at a time
(:meth:`LoadSpec.at_level`)."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import Field, model_validator

from kvbench.scenario.bounds import MAX_COUNT, Seed, Strict, number, optional
from kvbench.scenario.servers import MAX_TIMEOUT_S, Seconds

#: The load profiles, in the order the docs give them.
Profile = Literal["sequential", "concurrent", "poisson", "trace"]
PROFILES: tuple[str, ...] = get_args(Profile)
#: A Poisson or trace load's server slots when ``load.concurrency`` does not say.
POISSON_SLOTS = 4
#: The profiles whose arrivals do not wait for replies (no cap on requests in flight unless ``concurrency`` says).
OPEN_LOOP = ("poisson", "trace")
#: A concurrency level: requests in flight at most, and the server's parallel slots.
Slots = Annotated[int, Field(strict=True, ge=1, le=1024)]


class LoadSpec(Strict):
    """How requests reach a server: one at a time, a fixed number in flight, or Poisson arrivals."""

    profile: Profile = Field(
        "sequential", description="sequential: one request at a time; concurrent: `concurrency` in flight; "
        "poisson: arrivals at `rate` requests/s (seeded); trace: each request at its arrival time in "
        "workload.trace (open loop).")
    concurrency: Slots | Annotated[list[Slots], Field(min_length=1, max_length=16)] | None = optional(
        "Requests in flight at most (default 1; poisson and trace: no cap), and the server's parallel slots (poisson "
        f"and trace without it: {POISSON_SLOTS}); a list runs every mode at each level, e.g. [1, 4] (modes are then "
        "named <name>@c<level>).")
    rate: number(0, 1e6, above=True) | None = optional(
        "poisson: mean arrivals per second.")
    n_requests: Annotated[int, Field(strict=True, ge=1, le=MAX_COUNT)] | None = optional(
        "Send only the first n requests of the workload.")
    duration_s: Seconds | None = optional("Send no request later than this many seconds after the first.")
    think_time_s: number(0, MAX_TIMEOUT_S) = Field(
        0.0, description="A conversation's next turn is sent at least this long after the previous reply (seconds).")
    seed: Seed = Field(0, description="Seed of the Poisson arrivals.")

    @model_validator(mode="after")
    def _profile(self) -> LoadSpec:
        if self.profile == "poisson" and self.rate is None:
            raise ValueError("rate: required for profile poisson (requests per second)")
        if self.profile != "poisson" and self.rate is not None:
            raise ValueError(f"rate: only for profile poisson (this load is {self.profile})")
        if self.profile == "sequential" and self.levels != [1]:
            raise ValueError("concurrency: profile sequential sends one request at a time; use profile concurrent")
        if len(set(self.levels)) != len(self.levels):
            raise ValueError(f"concurrency: duplicate level(s) in {self.levels}")
        return self

    @property
    def levels(self) -> list[int]:
        """The concurrency levels each mode runs at (``[1]`` when not given; poisson: ``[POISSON_SLOTS]``)."""
        if self.concurrency is None:
            return [POISSON_SLOTS if self.profile in OPEN_LOOP else 1]
        return [self.concurrency] if isinstance(self.concurrency, int) else list(self.concurrency)

    def at_level(self, level: int) -> LoadSpec:
        """This load at one of its :attr:`levels`: ``concurrency`` is ``level`` (a Poisson load without
        ``concurrency`` stays uncapped; its servers still get ``level`` slots).

        Raises:
            ValueError: ``level`` is not one of :attr:`levels`.
        """
        if level not in self.levels:
            raise ValueError(f"concurrency {level} is not one of this load's levels {self.levels}")
        if self.profile in OPEN_LOOP and self.concurrency is None:
            return self
        return self.model_copy(update={"concurrency": level})

    @property
    def max_in_flight(self) -> int | None:
        """The most requests in flight at once at one level (None: no cap, a Poisson load without
        ``concurrency``).

        Raises:
            ValueError: the load has several levels (take one with :meth:`at_level` first).
        """
        if isinstance(self.concurrency, list):
            if len(self.concurrency) > 1:
                raise ValueError(f"a load at concurrency {self.concurrency}: take one level with at_level")
            return self.concurrency[0]
        if self.concurrency is not None:
            return self.concurrency
        return None if self.profile in OPEN_LOOP else 1
