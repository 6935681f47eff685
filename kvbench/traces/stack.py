"""The one-pass kernel of the hit-rate simulator: for every block visit of a trace, the smallest LRU capacity (in
distinct blocks) at which it hits under prefix matching, for all capacities at once.

Mattson's stack algorithm (Mattson, Gecsei, Slutz and Traiger, "Evaluation techniques for storage hierarchies",
IBM Systems Journal 9(2), 1970): under LRU a cache of C blocks holds exactly the C most recently used distinct blocks,
so a block hits at capacity C when its *stack distance* (its rank by recency) is at most C, and one pass gives the
hits of every capacity. The ranks are counted with a Fenwick tree over the clock of last uses (Bennett and Kruskal,
"LRU stack processing", IBM J. Res. Dev. 19(4), 1975; Almási, Caşcaval and Padua, "Calculating stack distances
efficiently", MSP 2002): O(log N) per visit, O(N log N) for a trace of N visits.

Prefix matching as vLLM and SGLang do it: a request's blocks are looked up before it touches any (ranks against
the stack as the request found it), a leading run of blocks hits and the first miss ends it, so a visit hits at C
when every block up to it in its prompt has rank at most C (the running maximum of the ranks), then every block of
the prompt becomes most recent, in prompt order (``tail_first``: in reverse, as vLLM frees a request's blocks so
that its tail is evicted first).

Compiled with numba (a pure-Python Fenwick tree took minutes on a million-request trace).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=False, nogil=True)
def _needed(offsets: np.ndarray, dense: np.ndarray, n_distinct: int, tail_first: bool) -> np.ndarray:
    n = dense.shape[0]
    tree = np.zeros(n + 1, np.int32)
    last = np.zeros(n_distinct, np.int64)
    need = np.zeros(n, np.int32)
    live = 0
    clock = 0
    for r in range(offsets.shape[0] - 1):
        s = offsets[r]
        e = offsets[r + 1]
        run = 1
        for k in range(s, e):
            p = last[dense[k]]
            if p == 0:
                break
            i = p - 1
            older = 0
            while i > 0:
                older += tree[i]
                i -= i & -i
            rank = live - older
            if rank > run:
                run = rank
            need[k] = run
        for j in range(e - s):
            k = e - 1 - j if tail_first else s + j
            b = dense[k]
            p = last[b]
            if p > 0:
                i = p
                while i <= n:
                    tree[i] -= 1
                    i += i & -i
            else:
                live += 1
            clock += 1
            i = clock
            while i <= n:
                tree[i] += 1
                i += i & -i
            last[b] = clock
    return need


def needed_capacity(offsets: np.ndarray, block_ids: np.ndarray, tail_first: bool = False) -> tuple[np.ndarray, int]:
    """Per block visit, the smallest LRU capacity (distinct blocks) at which it hits; and the trace's distinct blocks.

    Args:
        offsets: int64 ``(n + 1,)``, request ``i``'s visits are ``block_ids[offsets[i]:offsets[i + 1]]``.
        block_ids: int64 ``(N,)``, hash ids in request then prompt order.
        tail_first: a request's blocks become most recent tail first (vLLM's order) instead of in prompt order.

    Returns:
        ``(need, distinct)``: need int32 ``(N,)``, 0 where the visit misses at every capacity (the block was never
        seen, or an earlier block of its prompt misses everywhere); ``distinct`` the number of distinct ids.
    """
    ids, dense = np.unique(block_ids, return_inverse=True)
    return _needed(offsets.astype(np.int64), dense.astype(np.int32).ravel(), len(ids), tail_first), len(ids)
