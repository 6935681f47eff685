"""Reuse workloads: every request of a multi-turn or document-QA stream, per mode, recomputed from scratch (cold)
and restored from the mode's KV store (warm), side by side
(their tables: :mod:`kvbench.analysis.reuse`).

Per repeat each mode gets a fresh :class:`~kvbench.offload.store.KVStore` (``store:`` settings, disk tier under the
scenario's ``disk_dir``). Requests arrive in the workload's order; per request, ``none`` runs cold first (the
reference every trial's ids are compared with), then warm; the other modes alternate warm-first and cold-first
from request to request, so neither side always runs right after the other. After a warm trial, what the server
holds (the prompt and, in a conversation, the reply it goes on with) goes into that mode's store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvbench.results.rows import MEASURED

if TYPE_CHECKING:  # torch-bound: imported where used, so that `kvbench report` reads tables without torch
    from kvbench.offload.store import KVStore
    from kvbench.bench.runner import Recorder, TrialRunner
    from kvbench.scenario import Scenario


def make_stores(s: "Scenario", modes: list[Any], token_bytes: int) -> dict[str, "KVStore"]:
    """A fresh store per mode label, as ``s.store_spec`` says.

    Raises:
        ValueError: a cap smaller than one chunk of ``token_bytes`` × ``chunk_tokens``.
        kvbench.offload.tiers.DiskTierError: the disk tier's directory cannot be made.
    """
    from kvbench.offload.store import KVStore

    spec = s.store_spec
    stores: dict[str, KVStore] = {}
    try:
        for m in modes:
            stores[m.label] = KVStore(spec.chunk_tokens, int(spec.host_max_bytes), int(spec.disk_max_bytes),
                                      s.disk_dir, token_bytes=token_bytes, page_cache=s.disk.page_cache)
    except Exception:
        for st in stores.values():
            st.close()
        raise
    return stores


def reuse_sweep(s: "Scenario", record: "Recorder", runner: "TrialRunner") -> None:
    """Run (or, resuming, look up) every trial of a reuse workload; ``runner.source`` is its
    :class:`~kvbench.workloads.sessions.Stream`. A warm trial already recorded is not rerun, but what it left in
    the store is rebuilt (:meth:`~kvbench.bench.runner.TrialRunner.refill`), so later turns see the same store. Stores
    are closed (disk files removed) on every exit path."""
    from kvbench.bench.runner import ReuseTrial

    modes = sorted(s.modes, key=lambda m: m.kind != "none")
    requests = runner.source.requests
    for r in range(s.repeats):
        runner.stores = make_stores(s, modes, runner.store_token_bytes)
        try:
            for i, req in enumerate(requests):
                for m in modes:
                    cold, warm = ReuseTrial.of(req, m, r, False), ReuseTrial.of(req, m, r, True)
                    for t in [cold, warm] if m.kind == "none" or (i + r) % 2 == 0 else [warm, cold]:
                        done = record.rows.get(t.trial_id)
                        if done is not None:
                            if t.warm and done.get("status") in MEASURED:
                                runner.refill(t)
                            continue
                        record(t)
        finally:
            for st in runner.stores.values():
                st.close()
            runner.stores = {}


#: Bootstrap resamples of the restore ÷ recompute interval.
