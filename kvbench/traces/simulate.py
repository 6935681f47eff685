"""Hit rates of a trace's prefix cache at every capacity, from one pass (kvbench.traces.stack), and their split
over the device, host and disk tiers.

Definitions (as in the Mooncake trace's README; a request's hit is its leading run of blocks found in the cache,
looked up before the request touches any block, the first miss ending it):

- *hit rate of blocks* = hit blocks ÷ all block visits, over every request;
- *hit rate of tokens* = Σ min(hit blocks × block_tokens, input_tokens) ÷ Σ input_tokens (a prompt's partial last
  block counts its own tokens);
- *capacity* in distinct blocks held (× block_tokens for tokens, × the model's KV bytes per token for bytes);
- the *ceiling*: an unlimited cache, every block ever seen kept.

Tiers are exclusive and cascade as one LRU of device + host + disk blocks (what a tier evicts falls to the next):
the hits of a device of D blocks are the curve at D, the host's of H blocks the curve at D + H less the device's,
the disk's of S blocks the curve at D + H + S less both (a block counts for the smallest cascade that finds the
prompt's prefix up to it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvbench.errors import BadParameter, BadValue
from kvbench.traces.stack import needed_capacity
from kvbench.traces.trace import Trace

#: The policies one pass simulates at every capacity: LRU with a request's blocks made most recent in prompt
#: order (``lru``, the definition the trace's published figures use), or tail first (``lru-tail-first``: vLLM frees
#: a request's blocks in reverse so that the tail of a prompt goes first).
POLICIES = ("lru", "lru-tail-first")


@dataclass(frozen=True)
class HitCurve:
    """A trace's hits against capacity under one policy.

    Attributes:
        trace: the trace simulated.
        policy: one of :data:`POLICIES`.
        need: int32 ``(n_visits,)``: per block visit the smallest capacity (distinct blocks) at which it hits;
            0 where it misses at every capacity.
        steps: int64 ``(k,)``, ascending: the capacities (blocks) where the curve rises.
        hit_blocks, hit_tokens: int64 ``(k,)``: block visits and tokens that hit at each step's capacity.
        distinct_blocks: distinct hash ids in the trace.
        total_blocks, total_tokens: block visits and prompt tokens of the whole trace.
    """

    trace: Trace
    policy: str
    need: np.ndarray
    steps: np.ndarray
    hit_blocks: np.ndarray
    hit_tokens: np.ndarray
    distinct_blocks: int
    total_blocks: int
    total_tokens: int

    def hits(self, capacity_blocks: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
        """Block visits and tokens that hit at each capacity (distinct blocks): int64 arrays shaped as
        ``capacity_blocks``."""
        at = np.searchsorted(self.steps, np.asarray(capacity_blocks), side="right") - 1
        ok = at >= 0
        clipped = np.maximum(at, 0)
        return (np.where(ok, self.hit_blocks[clipped], 0) if len(self.steps) else np.zeros_like(at),
                np.where(ok, self.hit_tokens[clipped], 0) if len(self.steps) else np.zeros_like(at))

    def rates(self, capacity_blocks: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
        """Hit rate of blocks and of tokens (0 to 1) at each capacity (distinct blocks)."""
        blocks, tokens = self.hits(capacity_blocks)
        return blocks / max(self.total_blocks, 1), tokens / max(self.total_tokens, 1)

    @property
    def ceiling(self) -> tuple[float, float]:
        """Hit rate of blocks and of tokens of an unlimited cache."""
        blocks, tokens = self.rates(self.distinct_blocks)
        return float(blocks), float(tokens)

    def per_request(self, capacity_blocks: int) -> tuple[np.ndarray, np.ndarray]:
        """Per request, the blocks and prompt tokens that hit at ``capacity_blocks``: int64 ``(n_requests,)`` each."""
        hit = (self.need > 0) & (self.need <= capacity_blocks)
        starts = self.trace.offsets[:-1]
        blocks = np.add.reduceat(hit.astype(np.int64), starts) if len(hit) else np.zeros(0, np.int64)
        tokens = np.minimum(blocks * self.trace.block_tokens, self.trace.input_tokens)
        return blocks, tokens


def simulate(trace: Trace, policy: str = "lru") -> HitCurve:
    """The hit curve of ``trace`` under ``policy``, every capacity from one pass (:mod:`kvbench.traces.stack`):
    O(N log N) for N block visits.

    Raises:
        BadParameter: ``policy`` is not one of :data:`POLICIES` (``param`` ``policy``).
    """
    if policy not in POLICIES:
        raise BadParameter(f"{{policy}} {policy!r} is not one of: {', '.join(POLICIES)}", "policy")
    need, distinct = needed_capacity(trace.offsets, trace.block_ids, tail_first=policy == "lru-tail-first")
    weights = trace.block_weights()
    counts = np.bincount(need, minlength=distinct + 1)[1:]
    tokens = np.bincount(need, weights=weights, minlength=distinct + 1)[1:]
    steps = np.flatnonzero(counts) + 1
    return HitCurve(trace=trace, policy=policy, need=need, steps=steps.astype(np.int64),
                    hit_blocks=np.cumsum(counts)[steps - 1].astype(np.int64),
                    hit_tokens=np.rint(np.cumsum(tokens)[steps - 1]).astype(np.int64),
                    distinct_blocks=distinct, total_blocks=trace.n_visits,
                    total_tokens=int(trace.input_tokens.sum()))


def capacity_grid(curve: HitCurve, points: int = 120) -> np.ndarray:
    """Capacities (distinct blocks) to show a curve at: ``points`` spaced evenly on a log scale from 1 block to the
    trace's distinct blocks (the ceiling), each once, ascending."""
    top = max(curve.distinct_blocks, 1)
    return np.unique(np.rint(np.geomspace(1, top, num=max(2, points))).astype(np.int64))


@dataclass(frozen=True)
class TierHits:
    """Hits per tier of one cascade: ``blocks`` and ``tokens`` per tier (``device``, ``host``, ``disk``, in that
    order; absent tiers hold 0) and the same as rates of all block visits and prompt tokens."""

    capacity_blocks: dict[str, int]
    blocks: dict[str, int]
    tokens: dict[str, int]
    block_rate: dict[str, float]
    token_rate: dict[str, float]


def tier_hits(curve: HitCurve, device_blocks: int, host_blocks: int = 0, disk_blocks: int = 0) -> TierHits:
    """The hits of a device of ``device_blocks`` blocks with a host tier of ``host_blocks`` and a disk tier of
    ``disk_blocks`` under it, exclusive tiers cascading as one LRU (the module's docstring).

    Raises:
        BadValue: a negative capacity.
    """
    sizes = {"device": device_blocks, "host": host_blocks, "disk": disk_blocks}
    if any(v < 0 for v in sizes.values()):
        raise BadValue(f"tier capacities must be 0 blocks or more, not {sizes}")
    edges = np.cumsum(list(sizes.values()))
    blocks, tokens = curve.hits(edges)
    gained_b = np.diff(np.concatenate([[0], blocks]))
    gained_t = np.diff(np.concatenate([[0], tokens]))
    names = list(sizes)
    return TierHits(capacity_blocks=sizes, blocks={n: int(v) for n, v in zip(names, gained_b)},
                    tokens={n: int(v) for n, v in zip(names, gained_t)},
                    block_rate={n: float(v) / max(curve.total_blocks, 1) for n, v in zip(names, gained_b)},
                    token_rate={n: float(v) / max(curve.total_tokens, 1) for n, v in zip(names, gained_t)})
