"""The in-process engine: a transformers model in this process, kvbench's own offload caches (one per trial, as
the mode says), an explicit greedy decode loop (:mod:`kvbench.bench.engines.decode`) and, for reuse workloads, a KV
store per mode (:class:`~kvbench.offload.store.KVStore`) that warm trials restore from."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from kvbench.bench.engines.decode import Clock, greedy_decode, left_pad, release_device_memory
from kvbench.bench.engines.base import Capabilities, Watch
from kvbench.bench.telemetry.host_memory import host_memory_available
from kvbench.bench.engines.predict import Predictor
from kvbench.bench.rows.reference import Reference
from kvbench.results.rows import ids_digest
from kvbench.bench.trial import ReuseTrial, TrialOutput, TrialSpec, bounds
from kvbench.models import LoadedModel
from kvbench.offload.caches import DynamicOffloadCache, OffloadedCache, kv_bytes
from kvbench.offload.modes import ModeUnavailable, host_formats, make_cache
from kvbench.bench.engines.quality import quality_fields, step_logprobs
from kvbench.offload.disk import NO_DROP_REASON
from kvbench.offload.cache_kv import restore, sequence_kv
from kvbench.offload.store import KVStore
from kvbench.bench.engines.stores import make_store, store_token_bytes
from kvbench.scenario import Scenario
from kvbench.workloads.sessions import Stream
from kvbench.workloads import PromptSource, TooLittleText
from kvbench.workloads.shared_prefix import cell_tokens


def is_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is torch (or the host allocator) running out of memory."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and ("out of memory" in str(exc) or "can't allocate memory" in str(exc))


def disk_fields(cache: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """The row fields on how honest a trial's disk tier was, and notes for them: ``disk_synced`` (every write
    synced to the device), ``disk_page_cache_dropped`` (writes and reads dropped from the page cache, so reads come
    from the device), ``disk_synced_bytes`` (bytes synced); all None for a cache without a disk tier."""
    tier = cache.disk if isinstance(cache, OffloadedCache) else None
    if tier is None:
        return dict.fromkeys(("disk_synced", "disk_page_cache_dropped", "disk_synced_bytes")), {}
    notes = {}
    if tier.page_cache:
        notes["disk_page_cache_dropped"] = ("scenario disk.page_cache: true: writes are not synced and reads come "
                                            "from the page cache (disk timings measure RAM)")
    elif not tier.drops:
        notes["disk_page_cache_dropped"] = NO_DROP_REASON
    return {"disk_synced": tier.syncs, "disk_page_cache_dropped": tier.drops,
            "disk_synced_bytes": tier.synced_bytes}, notes


#: What the in-process engine has: its own device memory, OOM told apart.
CAPABILITIES = Capabilities(releases_memory=True, tells_oom=True)


class TransformersSession:
    """One mode's state for one repeat (see :class:`~kvbench.bench.engines.base.Session`): for a reuse workload
    the mode's KV store (``store``), which warm trials restore from and hold their replies in; None otherwise
    (each trial makes its own cache and keeps nothing)."""

    def __init__(self, engine: TransformersEngine, mode: Any, store: KVStore | None):
        self.engine, self.mode, self.store = engine, mode, store

    def run(self, t: TrialSpec, watch: Watch, keep_gaps: bool) -> TrialOutput:
        """Refuse a host tier that cannot fit, make the mode's cache, run the trial, close the cache; a warm
        trial's fields get the store's :meth:`facts` after its hold.

        Raises:
            ModeUnavailable: the host memory left cannot hold the host tier, or the mode cannot run here.
        """
        out = self.engine.run_trial(t, watch, keep_gaps, self.store)
        if isinstance(t, ReuseTrial) and t.warm:  # after the hold: what the store keeps for later requests
            out.fields.update(self.facts())
        return out

    def refill(self, t: ReuseTrial) -> None:
        """Rebuild what a finished warm trial left in the store (a resumed run): prefill ``request.held`` in a
        fresh ``none`` cache and store it (not recorded)."""
        e = self.engine
        e._store_held(t, make_cache("none", e.m.model.config, e.device), 0, self.store)

    def facts(self) -> dict[str, Any]:
        """The store's statistics as row fields: ``store_chunks``, ``store_host_bytes``, ``store_disk_bytes``
        (bytes), ``store_evicted``, ``store_corrupt`` (chunks); {} without a store."""
        st = self.store
        if st is None:
            return {}
        return {"store_chunks": len(st), "store_host_bytes": st.host_bytes, "store_disk_bytes": st.disk_bytes,
                "store_evicted": st.evicted, "store_corrupt": st.corrupt}


class TransformersEngine:
    """Runs trials of one scenario on a loaded model and prompt source, in this process (see
    :class:`~kvbench.bench.engines.base.Engine`). ``environment``: the run's, with its measured bandwidths, so
    that each row carries plan's predicted step time."""

    def __init__(self, scenario: Scenario, loaded: LoadedModel, source: PromptSource | Stream,
                 environment: dict[str, Any] | None = None):
        self.s, self.m = scenario, loaded
        self.source: PromptSource | Stream = source
        self.device = loaded.device
        self.pid = os.getpid()
        self.longest_prompt = loaded.shape.max_positions - scenario.max_new_tokens
        self.clock = Clock(loaded.device)
        tok = loaded.tokenizer
        pad = getattr(tok, "pad_token_id", None) if tok is not None else None
        if pad is None and tok is not None:
            pad = tok.eos_token_id
        self.pad_id = int(pad) if pad is not None else 0
        #: bytes of one token in the reuse workloads' KV store: it keeps every layer's whole sequence
        self.store_token_bytes = store_token_bytes(loaded.shape, loaded.dtype)
        self.predict = Predictor(scenario, loaded.shape, loaded.dtype.itemsize, loaded.weights_bytes, loaded.device,
                                 environment)
        #: reuse workloads: the KV store of each open session's mode (by label)
        self.stores: dict[str, KVStore] = {}
        #: shared_prefix: the KV tokens each cell's store holds once the cell ran (by cell index)
        self.cell_tokens = cell_tokens(getattr(source, "requests", ()), scenario.store_spec.chunk_tokens)
        self.capabilities = CAPABILITIES
        self.weights_bytes = loaded.weights_bytes
        #: the ``none`` outputs every trial is compared with
        self.reference = Reference()
        #: ((prompt digest, steps), none's ids and log-probabilities): the last reference of the quality columns
        self._reference_pass: tuple[Any, Any] | None = None

    def describe(self, t: TrialSpec) -> dict[str, Any]:
        """``device``, ``dtype``, ``kv_bytes_predicted`` and the plan predictions of ``t``; for a reuse workload
        ``kv_budget_tokens``, the tokens of KV the store's host tier holds; for a ``shared_prefix`` cell's request
        ``share_unit_tokens`` (the store's chunk) and ``cell_kv_tokens`` (what the cell's store holds once it ran)."""
        budget = {"kv_budget_tokens": int(self.s.store_spec.host_max_bytes)
                  // store_token_bytes(self.m.shape, self.m.dtype, t.mode.options)} if self.s.workload.reuse else {}
        if isinstance(t, ReuseTrial) and t.request.cell is not None:
            budget.update(share_unit_tokens=self.s.store_spec.chunk_tokens,
                          cell_kv_tokens=self.cell_tokens[t.request.cell])
        return {"device": str(self.device), "dtype": str(self.m.dtype).removeprefix("torch."),
                "kv_bytes_predicted": self.predict.kv_bytes_predicted(t), **self.predict.plan_prediction(t), **budget}

    def preflight(self) -> list[str]:
        """Build every batch the sweep will use (they are cached for the trials); the reasons any cannot be built,
        e.g. a source with too little text for a length. A capacity search checks its largest value (a source
        with enough text for it has enough for every smaller one). A reuse workload makes and closes one store
        (its caps against this model's chunk bytes, its disk directory)."""
        problems: list[str] = []
        if self.s.workload.reuse:  # its requests were built by prepare; its stores must be possible
            from kvbench.offload.tiers import DiskTierError

            try:
                make_store(self.s, self.m.shape, self.m.dtype).close()
            except (ValueError, DiskTierError) as exc:
                problems.append(f"store: {exc}")
            return problems
        prompts, batches = self.s.prompt_tokens, self.s.batch_sizes
        if self.s.searched is not None:
            limit = bounds(self.s, self.longest_prompt)[1]
            prompts, batches = (prompts, [limit]) if self.s.searched == "batch_size" else ([limit], batches)
        for n in prompts:
            for b in batches:
                try:
                    for r in range(self.s.repeats):
                        self.source.batch(n, b, r)
                except TooLittleText as exc:
                    problems.append(f"prompt_tokens {n}, batch {b}: {exc}")
        return problems

    def is_oom(self, exc: BaseException) -> bool:
        """See :func:`is_oom`."""
        return is_oom(exc)

    def release(self) -> None:
        """Release device memory before a new shape (:func:`~kvbench.bench.engines.decode.release_device_memory`)."""
        release_device_memory(self.device)

    @contextmanager
    def session(self, mode: Any, repeat: int, slots: int = 1) -> Iterator[TransformersSession]:
        """``mode``'s session for ``repeat``: for a reuse workload a fresh KV store (:func:`make_store`), closed
        (its disk files removed) on every exit path; ``slots``: 1 (this engine runs one trial at a time).

        Raises:
            ValueError: ``slots`` is not 1; or the store's caps (:func:`make_store`).
        """
        if slots != 1:
            raise ValueError(f"the transformers engine runs one request at a time, not {slots}")
        store = make_store(self.s, self.m.shape, self.m.dtype, mode.options) if self.s.workload.reuse else None
        if store is not None:
            self.stores[mode.label] = store
        try:
            yield TransformersSession(self, mode, store)
        finally:
            if store is not None:
                store.close()
                self.stores.pop(mode.label, None)

    def run_trial(self, t: TrialSpec, watch: Watch, keep_gaps: bool, store: KVStore | None = None) -> TrialOutput:
        """Refuse a host tier that cannot fit, make the mode's cache, run the trial (a warm one restoring from
        and holding into ``store``), close the cache.

        Raises:
            ModeUnavailable: the host memory left cannot hold the host tier, or the mode cannot run here.
            ValueError: a warm trial without a store (it runs in its mode's :meth:`session`).
        """
        if isinstance(t, ReuseTrial) and t.warm and store is None:
            raise ValueError(f"{t.trial_id}: a warm trial restores from its mode's store: run it in a session")
        self._host_preflight(t)
        cache = self._cache(t)
        try:
            out = self._generate(t, cache, watch, keep_gaps, store)
        finally:
            if isinstance(cache, OffloadedCache):
                cache.close()
        if self.lossy(t) and not isinstance(t, ReuseTrial):  # outside the trial's clock and its watch window
            prompts = self.source.batch(t.prompt_tokens, t.batch_size, t.repeat)
            ids, mask = (x.to(self.device) for x in left_pad(prompts, self.pad_id))
            out.fields.update(quality_fields(self.m.model, ids, mask, out.ids, lambda: self._cache(t),
                                             self._none_pass(ids, mask, len(out.ids[0]))))
        return out

    def _none_pass(self, ids: Any, mask: Any, steps: int) -> tuple[Any, Any]:
        """``none``'s free pass on these prompts (:func:`~kvbench.bench.engines.quality.step_logprobs`), computed
        once for all the lossy modes that follow one another on the same prompts (the last one is kept)."""
        key = (ids_digest(ids.tolist()), ids_digest(mask.tolist()), steps)
        if self._reference_pass is None or self._reference_pass[0] != key:
            cache = make_cache("none", self.m.model.config, self.device)
            self._reference_pass = (key, step_logprobs(self.m.model, ids, mask, cache, steps))
        return self._reference_pass[1]

    def _cache(self, t: TrialSpec) -> Any:
        """A fresh cache of ``t``'s mode."""
        return make_cache(t.mode.kind, self.m.model.config, self.device,
                          budget_bytes=int(self.s.budget) if self.s.budget is not None else None,
                          disk_dir=self.s.disk_dir, disk_page_cache=self.s.disk.page_cache, **t.mode.options)

    def lossy(self, t: TrialSpec) -> bool:
        """Whether ``t``'s mode holds K or V off the device in a format that rounds them for this model's dtype
        (its trials then get the quality columns: :mod:`kvbench.bench.engines.quality`)."""
        formats = host_formats(t.mode.options)
        return formats is not None and not all(f.lossless(self.m.dtype) for f in formats)

    def _host_preflight(self, t: TrialSpec) -> None:
        """Refuse (ModeUnavailable → ``skipped``) a trial whose host tier cannot fit in the host memory left."""
        need = self.predict.host_tier_bytes(t)
        if not need:
            return
        avail, source = host_memory_available()
        if need > avail:
            raise ModeUnavailable(f"refused before the trial: the host tier needs up to {need} bytes "
                                  f"({need / 2**30:.2f} GiB) but {avail} bytes ({avail / 2**30:.2f} GiB) are left "
                                  f"({source})")

    def _restore(self, t: ReuseTrial, cache: Any, store: KVStore) -> dict[str, Any]:
        """Load the longest stored prefix of a warm trial's prompt (at most all but its last token, whose forward
        gives the first token) from the mode's ``store`` into ``cache``; the reuse fields of its row."""
        ids = list(t.request.ids)
        prefix = store.get(ids, max_tokens=len(ids) - 1)
        restore(cache, prefix, self.device, self.m.dtype)
        chunks = (len(ids) - 1) // store.chunk_tokens
        found = (prefix.tokens - prefix.tail_tokens) // store.chunk_tokens  # whole chunks (a tail is not one)
        return {"tokens_restored": prefix.tokens, "tokens_prefilled": len(ids) - prefix.tokens,
                "store_hit_rate": found / chunks if chunks else None,
                "restore_host_bytes": prefix.host_bytes, "restore_disk_bytes": prefix.disk_bytes}

    def _hold(self, t: ReuseTrial, cache: Any, n_generated: int, store: KVStore) -> None:
        """After a warm trial (not timed): what a server would hold afterwards goes into the mode's store. The
        generated tokens are cropped and the rest of ``request.held`` (a conversation's reply as the dataset has
        it) is fed through the model with this cache, as decoding it would have."""
        cache.crop(-(n_generated - 1))  # the last generated token was never fed
        self._store_held(t, cache, len(t.request.ids), store)

    def _store_held(self, t: ReuseTrial, cache: Any, cached: int, store: KVStore) -> None:
        """Feed ``request.held`` after its first ``cached`` tokens (already in ``cache``) through the model, then
        put the whole of it into the mode's ``store``."""
        held = list(t.request.held)
        if held[cached:]:
            dev = self.device
            greedy_decode(self.m.model, torch.tensor([held[cached:]], device=dev),
                          torch.ones((1, len(held)), dtype=torch.long, device=dev), cache, 1, self.clock)
        store.put(held, *sequence_kv(cache))

    def _generate(self, t: TrialSpec, cache: Any, watch: Watch, keep_gaps: bool,
                  store: KVStore | None) -> TrialOutput:
        """Run trial ``t`` on ``cache`` (the mode's cache object) and return what it measured, in five steps:

        1. the prompts (a reuse trial's request, else the source's batch), left-padded on the device, and their
           digest (the ``none`` reference's key);
        2. the KV probes: kvbench's own caches account their bytes themselves (read on the sampler thread);
           transformers' caches are summed once a step (``read_kv``), since summing on the sampler thread would
           hold the GIL; on CUDA the allocator's peaks are reset after a synchronize;
        3. inside ``watch.window`` (the timed part): a warm reuse trial's restore from ``store`` (TTFT counts
           the lookup and the restore), then greedy decoding of ``max_new_tokens``;
        4. the memory peaks and the cache's own fields (transfers, disk tier, the decode steps' copy rate), the
           allocator's peaks on CUDA (a note naming why they are None elsewhere);
        5. a warm trial's prompt and reply held in ``store`` for later requests, after every figure is read.
        """
        dev = self.device
        reuse = isinstance(t, ReuseTrial)
        prompts = [list(t.request.ids)] if reuse else self.source.batch(t.prompt_tokens, t.batch_size, t.repeat)
        input_ids, mask = left_pad(prompts, self.pad_id)
        input_ids, mask = input_ids.to(dev), mask.to(dev)
        prompt_digest = hashlib.sha256(input_ids.cpu().numpy().tobytes()).hexdigest()
        gaps: list[float] | None = [] if keep_gaps else None
        restored: dict[str, Any] | None = None
        kv_peak = {"device": 0, "host": 0, "stored": 0}
        kv_last = (0, 0, 0)  # transformers' caches: (device, host, disk) bytes after the last step

        def read_kv() -> None:
            nonlocal kv_last
            d, h = kv_bytes(cache, dev)
            kv_last = (d, h, 0)
            kv_peak["device"] = max(kv_peak["device"], d)
            kv_peak["host"] = max(kv_peak["host"], h)
            kv_peak["stored"] = max(kv_peak["stored"], d + h)

        cuda = dev.type == "cuda"
        if cuda:
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            base_alloc = torch.cuda.memory_allocated(dev)
            base_reserved = torch.cuda.memory_reserved(dev)
        own_accounting = isinstance(cache, OffloadedCache)

        def kv_now() -> tuple[int, int, int]:
            # read on the sampler thread, so it must be cheap: summing a 30-layer cache's tensors took 12 µs of
            # GIL-held time a sample; transformers' caches are read once a step (read_kv) and that reading repeated
            if own_accounting:
                return cache.device_bytes, cache.host_bytes, cache.disk_bytes
            return kv_last

        pinned_now = (lambda: cache.pinned_host_peak_bytes) if own_accounting else None
        with watch.window(t.trial_id, kv_probe=kv_now, pinned_probe=pinned_now):
            if reuse and t.warm:  # TTFT counts the lookup and the restore
                t_restore = self.clock()
                restored = self._restore(t, cache, store)
                input_ids = input_ids[:, restored["tokens_restored"]:]
            ids, t0, times = greedy_decode(self.m.model, input_ids, mask, cache, self.s.max_new_tokens, self.clock,
                                           after_step=None if own_accounting else read_kv,
                                           on_phase=watch.mark, top2_gaps=gaps)
        memory = {"kv_device_peak_bytes": kv_peak["device"], "kv_host_peak_bytes": kv_peak["host"],
                  "kv_stored_peak_bytes": kv_peak["stored"]}
        fields, notes = disk_fields(cache)
        if own_accounting:
            # the cache's own accounting also sees the transient K/V inside a forward, which per-step reads miss
            stats = cache.engine.stats
            memory.update(kv_device_peak_bytes=cache.device_peak_bytes, kv_host_peak_bytes=cache.host_peak_bytes,
                          kv_stored_peak_bytes=cache.stored_peak_bytes)
            start = t_restore if restored else t0
            decode_s = (times[-1] - start) - (times[0] - start)  # e2e − TTFT, as the row's latencies
            fields.update(kv_disk_peak_bytes=cache.disk_peak_bytes,
                          kv_host_logical_peak_bytes=cache.host_logical_peak_bytes,
                          kv_disk_logical_peak_bytes=cache.disk_logical_peak_bytes,
                          kv_host_allocated_peak_bytes=cache.host_allocated_peak_bytes, h2d_bytes=stats.h2d_bytes,
                          d2h_bytes=stats.d2h_bytes, h2d_logical_bytes=stats.h2d_logical_bytes,
                          d2h_logical_bytes=stats.d2h_logical_bytes, h2d_count=stats.h2d_count,
                          d2h_count=stats.d2h_count,
                          disk_read_bytes=stats.disk_read_bytes, disk_write_bytes=stats.disk_write_bytes,
                          transfer_stalls=stats.stalls, pinned=cache.pinned,
                          # the decode steps' copy rate, to set against the link bandwidth in run.json
                          h2d_bytes_per_s=stats.h2d_bytes / decode_s if decode_s > 0 else None)
            if isinstance(cache, DynamicOffloadCache):
                fields.update(window_events=cache.events, window_final=cache.window)
        if cuda:
            fields["weights_baseline_bytes"] = base_alloc
            fields["peak_device_allocated_bytes"] = torch.cuda.max_memory_allocated(dev) - base_alloc
            fields["peak_device_reserved_bytes"] = torch.cuda.max_memory_reserved(dev) - base_reserved
        else:
            reason = f"no allocator peak on a {dev.type} device (CUDA only)"
            for key in ("weights_baseline_bytes", "peak_device_allocated_bytes", "peak_device_reserved_bytes"):
                fields[key] = None
            notes.update(peak_device_allocated_bytes=reason, peak_device_reserved_bytes=reason,
                         weights_baseline_bytes=reason)
        if reuse and t.warm:  # after every figure is read: feeding the reply changes the cache's peaks
            self._hold(t, cache, ids.shape[1], store)
        return TrialOutput(t_restore if restored else t0, times, ids.cpu().tolist(), prompt_digest, memory,
                           reuse=restored, top2_gaps=gaps, fields=fields, notes=notes)


def load_engine(scenario: Scenario, environment: dict[str, Any] | None = None) -> TransformersEngine:
    """Load the scenario's model and prompt source and return the engine for its trials; ``environment`` (the
    run's, with its measured bandwidths) lets each trial carry plan's predicted step time.

    Raises:
        kvbench.errors.ModelNotFound, kvbench.errors.ModelLoadError (anything else that stops the model loading,
        e.g. a pickled checkpoint torch refuses), kvbench.errors.NotEnoughRequests (a reuse workload's source with
        too few texts), ModuleNotFoundError (a data package missing).
    """
    from kvbench.models.load import load_model
    from kvbench.workloads import make_source, make_stream

    loaded = load_model(scenario.model, scenario.device, scenario.seed)
    if scenario.workload.reuse:
        source = make_stream(scenario.workload, loaded.tokenizer,
                             loaded.shape.max_positions - scenario.max_new_tokens, loaded.shape.vocab_size)
    else:
        source = make_source(scenario.workload, loaded.tokenizer, loaded.shape.vocab_size,
                             loaded.shape.max_positions - scenario.max_new_tokens)
    return TransformersEngine(scenario, loaded, source, environment=environment)
