"""Trials: prefill then an explicit greedy decode loop over a cache object, with honest timers and memory peaks.

One trial = (prompt length, batch size, mode, repeat). The sweep runs warm-up trials of each shape first (not
recorded), interleaves modes within each repeat, writes every trial as it finishes, records failures with their
status and goes on, and stops cleanly on Ctrl-C.
"""

from __future__ import annotations

import gc
import hashlib
import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvbench.analysis.latency import itl_percentiles, latency_metrics, throughputs
from kvbench.bench.machine_load import LoadWindow, other_gpu_processes
from kvbench.models import LoadedModel
from kvbench.bench.monitor import Sampler, host_memory_available, summarise
from kvbench.offload.caches import DynamicOffloadCache, OffloadedCache, kv_bytes
from kvbench.offload.modes import ModeUnavailable, make_cache
from kvbench.offload.disk import NO_DROP_REASON
from kvbench.offload.modes import MODES
from kvbench.offload.store import restore, sequence_kv
from kvbench.offload.tiers import grown_capacity
from kvbench.results.run_dir import RunDir, utc_now
from kvbench.results.files import ResultsNotWritten, failure_reason
from kvbench.scenario import Scenario
from kvbench.workloads import PromptSource, TooLittleText

#: How many generated ids per sequence a trial row keeps (the full sequence is hashed).
IDS_KEPT = 16
#: A restored (warm) run may pick another token than recompute only where recompute's top-2 logits are this close.
ACCEPTABLE_GAP = 1e-3


# --------------------------------------------------------------------------- pure pieces


@dataclass(frozen=True)
class TrialSpec:
    """One point of the sweep. ``mode`` is a scenario mode (it has ``kind``, ``label`` and ``options``)."""

    prompt_tokens: int
    batch_size: int
    mode: Any
    repeat: int

    @property
    def trial_id(self) -> str:
        """Stable id, the key ``--resume`` uses: ``p<N>-b<B>-<mode label>-r<repeat>``."""
        return f"p{self.prompt_tokens}-b{self.batch_size}-{self.mode.label}-r{self.repeat}"

    @property
    def shape_key(self) -> tuple:
        """Trials with one key share their warm-up (run before the first of them)."""
        return (self.prompt_tokens, self.batch_size, self.mode.label)

    def warmup_spec(self) -> "TrialSpec":
        """The unrecorded warm-up trial run before the first trial of this shape."""
        return TrialSpec(self.prompt_tokens, self.batch_size, self.mode, 0)


@dataclass(frozen=True)
class ReuseTrial(TrialSpec):
    """One request of a reuse workload (batch 1) in one mode: ``warm`` restores the longest stored prefix of its
    prompt from the mode's KV store (:attr:`TrialRunner.stores`) and prefills the rest; cold recomputes it all.
    Build with :meth:`of`."""

    request: Any = None  # a kvbench.workloads.sessions.Request
    warm: bool = False

    @classmethod
    def of(cls, request: Any, mode: Any, repeat: int, warm: bool) -> "ReuseTrial":
        """The trial of ``request`` (a :class:`~kvbench.workloads.sessions.Request`) in ``mode``."""
        return cls(len(request.ids), 1, mode, repeat, request, warm)

    @property
    def trial_id(self) -> str:
        """``<request id>-<mode label>-warm|cold-r<repeat>``, e.g. ``c0-t2-full-warm-r0``."""
        return f"{self.request.id}-{self.mode.label}-{'warm' if self.warm else 'cold'}-r{self.repeat}"

    @property
    def shape_key(self) -> tuple:
        """One warm-up per mode: prompts of a reuse workload all differ in length."""
        return ("reuse", self.mode.label)

    def warmup_spec(self) -> "ReuseTrial":
        """A cold run of the same request (a warm one would change the store)."""
        return ReuseTrial.of(self.request, self.mode, 0, warm=False)


def plan_trials(s: Scenario) -> list[TrialSpec]:
    """Every recorded trial of a scenario, in run order: prompt length, batch size, repeat, then mode (so modes
    are interleaved and share the machine's conditions), ``none`` first so the others can be compared with it.

    Raises:
        ValueError: the scenario searches capacity (its trials depend on their outcomes) or is a reuse workload.
    """
    if s.searched is not None:
        raise ValueError(f"{s.name} searches {s.searched}: its trials are decided as it runs")
    if s.workload.reuse:
        raise ValueError(f"{s.name} is a {s.workload.reuse} workload: its requests are built from the data")
    modes = sorted(s.modes, key=lambda m: m.kind != "none")
    return [
        TrialSpec(n, b, m, r)
        for n in s.prompt_tokens
        for b in s.batch_sizes
        for r in range(s.repeats)
        for m in modes
    ]


def roofline_bandwidths(environment: dict[str, Any], device: torch.device) -> tuple[float, float] | None:
    """``(memory, link)`` bandwidths in bytes/s for the decode-step roofline, from a run's environment
    (:func:`kvbench.bench.machine.environment`): device memory = ``memory_bandwidth.memory_gbps``; the link = the
    pinned host→device rate on CUDA (``link_bandwidth.h2d_pinned_gbps``), on CPU the copy rate between host
    buffers (``memory_bandwidth.copy_gbps``). None when a figure was not measured."""
    mem = environment.get("memory_bandwidth") or {}
    if not mem.get("memory_gbps"):
        return None
    if device.type == "cuda":
        link = (environment.get("link_bandwidth") or {}).get("h2d_pinned_gbps")
    else:
        link = mem.get("copy_gbps")
    return (mem["memory_gbps"] * 1e9, link * 1e9) if link else None


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token-id lists into ``input_ids`` and ``attention_mask``, both ``[batch, max_len]`` int64."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if p:
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
    return ids, mask


def cache_keyword(model: Any) -> str:
    """``cache`` where the model's forward takes it (transformers ≥ 5.2x), else ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class Clock:
    """``perf_counter`` that first waits for the device's queued work (``torch.cuda.synchronize`` on CUDA)."""

    def __init__(self, device: torch.device):
        self.device = device

    def __call__(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


@torch.inference_mode()
def greedy_decode(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    cache: Any,
    max_new_tokens: int,
    clock: Callable[[], float],
    after_step: Callable[[], None] | None = None,
    on_phase: Callable[[str], None] | None = None,
    top2_gaps: list[float] | None = None,
) -> tuple[torch.Tensor, float, list[float]]:
    """Prefill, then exactly ``max_new_tokens`` greedy tokens (EOS does not stop it), one forward per token.

    Args:
        input_ids, attention_mask: ``[batch, prompt_len]`` on the model's device, left-padded; the mask may be
            longer, ``[batch, cached + prompt_len]``, when ``cache`` already holds the first tokens (a restored
            prefix): positions then continue from them.
        cache: the KV cache object passed to every forward.
        clock: returns seconds; must synchronise the device (see :class:`Clock`).
        after_step: called after each token's clock reading (e.g. to read the cache's bytes); its cost, microseconds
            for a sum of tensor sizes, falls inside the next inter-token gap.
        on_phase: called with ``"decode"`` once the first token (the prefill's) is out, after ``after_step``.
        top2_gaps: if given, each step appends the gap between the largest and second-largest logit (batch row 0,
            float32): how close greedy decoding was to another token there.

    Returns:
        ``(ids [batch, max_new_tokens], t_start, token_times)``.
    """
    kw = cache_keyword(model)
    # a mask longer than input_ids covers tokens already in the cache (a restored prefix): positions go on from them
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, -input_ids.shape[1]:]
    out_ids = torch.empty((input_ids.shape[0], max_new_tokens), dtype=torch.long, device=input_ids.device)
    times: list[float] = []
    t_start = clock()
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=True, logits_to_keep=1, **{kw: cache}).logits
    for step in range(max_new_tokens):
        nxt = logits[:, -1, :].argmax(dim=-1)
        out_ids[:, step] = nxt
        if top2_gaps is not None:
            top = logits[0, -1, :].float().topk(2).values
            top2_gaps.append(float(top[0] - top[1]))
        times.append(clock())
        if after_step is not None:
            after_step()
        if step == 0 and on_phase is not None:
            on_phase("decode")
        if step + 1 == max_new_tokens:
            break
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((attention_mask.shape[0], 1))], dim=-1)
        position_ids = position_ids[:, -1:] + 1
        logits = model(input_ids=nxt[:, None], attention_mask=attention_mask, position_ids=position_ids,
                       use_cache=True, logits_to_keep=1, **{kw: cache}).logits
    return out_ids, t_start, times


def release_device_memory(device: torch.device) -> None:
    """Give back what earlier trials left: ``gc.collect()``, then on CUDA ``torch.cuda.empty_cache()`` (the
    allocator's cached blocks go back to the driver). The sweep does it when a new shape starts, before its warm-up
    (see :class:`Recorder`), so the measured trials reuse the blocks their warm-up reserved instead of paying
    ``cudaMalloc`` again."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


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


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and ("out of memory" in str(exc) or "can't allocate memory" in str(exc))


def _ids_digest(ids: torch.Tensor) -> str:
    return hashlib.sha256(ids.to("cpu", torch.int64).contiguous().numpy().tobytes()).hexdigest()


# --------------------------------------------------------------------------- one trial


class TrialRunner:
    """Runs trials of one scenario on a loaded model and prompt source."""

    def __init__(self, scenario: Scenario, loaded: LoadedModel, source: PromptSource, sampler: Sampler | None = None,
                 environment: dict[str, Any] | None = None):
        self.s = scenario
        self.m = loaded
        self.source = source
        mon = scenario.monitor
        self.sampler = sampler or Sampler(
            loaded.device, mon.interval_ms,
            int(mon.alert_device_bytes) if mon.alert_device_bytes is not None else None)
        self.last_samples: list[dict[str, Any]] = []  # the timeline of the last trial, for samples.csv
        self.clock = Clock(loaded.device)
        self.cpu_count = (environment or {}).get("cpu_count")
        tok = loaded.tokenizer
        pad = getattr(tok, "pad_token_id", None) if tok is not None else None
        if pad is None and tok is not None:
            pad = tok.eos_token_id
        self.pad_id = int(pad) if pad is not None else 0
        #: bytes of one token in the reuse workloads' KV store: it keeps every layer's whole sequence
        self.store_token_bytes = loaded.shape.sequence_bytes_per_token(loaded.dtype.itemsize)
        self.bandwidths = roofline_bandwidths(environment or {}, loaded.device)
        #: plan_prediction's architecture: None where plan refuses the config (it gives no intermediate_size)
        self.arch = loaded.shape if loaded.shape.intermediate is not None else None
        self.baseline_sha: dict[str, str] = {}  # prompt hash → output hash of the `none` trial
        self.baseline_ids: dict[str, torch.Tensor] = {}
        self.baseline_gaps: dict[str, list[float]] = {}  # prompt hash → top-2 logit gaps of `none` (reuse only)
        #: reuse workloads: the KV store of each mode (by label), set by :func:`kvbench.bench.reuse.reuse_sweep`
        self.stores: dict[str, Any] = {}

    def kv_bytes_predicted(self, t: TrialSpec) -> int:
        """KV bytes the trial's cache holds at its end, over all tiers (each token once): Σ over layers of
        2 × kv_heads × head_dim × dtype bytes × tokens held × batch, tokens held = tokens cached in a
        full-attention layer, min(tokens cached, window − 1) in a sliding-window one
        (:meth:`kvbench.offload.architecture.Architecture.cached_kv_bytes`); tokens cached = prompt + new − 1 (the last generated
        token is never fed back)."""
        return self.m.shape.cached_kv_bytes(t.prompt_tokens + self.s.max_new_tokens - 1,
                                            self.m.dtype.itemsize) * t.batch_size

    @property
    def longest_prompt(self) -> int:
        """The model's longest prompt (tokens): max positions less the tokens generated."""
        return self.m.shape.max_positions - self.s.max_new_tokens

    def plan_prediction(self, t: TrialSpec) -> dict[str, Any]:
        """What ``kvbench plan`` predicts for this trial (:mod:`kvbench.analysis.plan`): ``plan_kv_device_bytes`` (device
        KV of the batch under the mode's placement at the tokens cached at the end, as the measured peak),
        ``plan_link_bytes_per_step`` (host KV the batch copies to the device per decode step, the mean over the
        trial's steps, as the measured ``h2d_bytes`` ÷ steps) and, where the run measured the bandwidths (see
        :func:`roofline_bandwidths`), ``plan_tpot_s``: the roofline's step time averaged over the same decode
        steps TPOT averages (:func:`kvbench.analysis.plan.mean_decode_step`; copies overlapped on CUDA, none on a CPU).
        None for modes plan does not model (``dynamic``, ``hf-offloaded``, a disk tier)."""
        from kvbench.analysis.plan import mean_decode_step, placement

        keys = ("plan_kv_device_bytes", "plan_link_bytes_per_step", "plan_tpot_s")
        kind, opts, arch = t.mode.kind, t.mode.options, self.arch
        if arch is None or kind not in ("none", "full", "hierarchical") or opts.get("host_max_tokens"):
            return dict.fromkeys(keys)
        tokens, itemsize = t.prompt_tokens + self.s.max_new_tokens - 1, self.m.dtype.itemsize
        window = opts.get("window") or 0
        dev, host = placement(arch, kind, tokens, itemsize, window)
        out = dict.fromkeys(keys)
        out["plan_kv_device_bytes"] = dev * t.batch_size
        # without measured bandwidths the mean H2D bytes per step (which need none) are still predicted: any memory
        # bandwidth will do for them, and the step time is not kept
        memory, link = self.bandwidths if self.bandwidths is not None else (1.0, None)
        cuda = self.m.device.type == "cuda"
        step_s, link_bytes = mean_decode_step(arch, kind, t.prompt_tokens, self.s.max_new_tokens, itemsize,
                                              self.m.weights_bytes, t.batch_size, memory, link if cuda else None,
                                              window)
        out["plan_link_bytes_per_step"] = link_bytes if link_bytes == link_bytes else host * t.batch_size
        if self.bandwidths is not None and step_s == step_s:
            out["plan_tpot_s"] = step_s
        return out

    def preflight(self) -> list[str]:
        """Build every batch the sweep will use (they are cached for the trials); the reasons any cannot be built,
        e.g. a source with too little text for a length. A capacity search checks its largest value (a source
        with enough text for it has enough for every smaller one). A reuse workload makes and closes one store
        (its caps against this model's chunk bytes, its disk directory)."""
        problems: list[str] = []
        if self.s.workload.reuse:  # its requests were built by prepare; its stores must be possible
            from kvbench.offload.tiers import DiskTierError
            from kvbench.bench.reuse import make_stores

            try:
                for st in make_stores(self.s, self.s.modes[:1], self.store_token_bytes).values():
                    st.close()
            except (ValueError, DiskTierError) as exc:
                problems.append(f"store: {exc}")
            return problems
        prompts, batches = self.s.prompt_tokens, self.s.batch_sizes
        if self.s.searched is not None:
            from kvbench.bench.capacity import bounds

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

    def remember(self, rows: Sequence[dict[str, Any]]) -> None:
        """Take the ``none`` outputs of earlier rows (a resumed run) as baselines for ``tokens_match`` (in a reuse
        workload, those of cold trials, with their top-2 logit gaps)."""
        for r in rows:
            # ok and over budget both ran to the end; a warm (restored) run is never the reference
            if r.get("mode") == "none" and r.get("status") in ("ok", "over_budget") and not r.get("warm"):
                self.baseline_sha[r["prompt_sha256"]] = r["output_sha256"]
                if r.get("top2_logit_gaps") is not None:
                    self.baseline_gaps[r["prompt_sha256"]] = r["top2_logit_gaps"]

    def _compare(self, t: TrialSpec, prompt_digest: str, ids: torch.Tensor, digest: str,
                 gaps: list[float] | None = None) -> dict[str, Any]:
        """``tokens_match``: generated ids equal those of the ``none`` trial on the same prompts (True for
        ``none`` itself; None when no such trial ran); and where they first differ. In a reuse workload the
        reference is ``none`` recomputing the request (a cold trial, whose top-2 logit ``gaps`` per step are
        kept): a warm trial that differs gets ``top2_logit_gap``, the reference's gap at the first differing step,
        and ``divergence_acceptable`` = gap ≤ :data:`ACCEPTABLE_GAP` (restored KV was computed in another pass, so
        a near tie may flip; any other divergence is a bug)."""
        if t.mode.kind == "none" and not getattr(t, "warm", False):
            self.baseline_sha[prompt_digest] = digest
            self.baseline_ids[prompt_digest] = ids.cpu()
            if gaps is not None:
                self.baseline_gaps[prompt_digest] = gaps
            return {"tokens_match": True, "first_divergence_step": None}
        ref = self.baseline_sha.get(prompt_digest)
        if ref is None:
            return {"tokens_match": None, "first_divergence_step": None}
        if ref == digest:
            return {"tokens_match": True, "first_divergence_step": None}
        step = None
        if prompt_digest in self.baseline_ids:
            diff = (self.baseline_ids[prompt_digest] != ids.cpu()).any(dim=0).nonzero()
            step = int(diff[0]) if len(diff) else None
        out: dict[str, Any] = {"tokens_match": False, "first_divergence_step": step}
        ref_gaps = self.baseline_gaps.get(prompt_digest)
        if isinstance(t, ReuseTrial) and ref_gaps is not None and step is not None:
            out["top2_logit_gap"] = ref_gaps[step]
            out["divergence_acceptable"] = bool(t.warm and ref_gaps[step] <= ACCEPTABLE_GAP)
        return out

    def base_row(self, t: TrialSpec) -> dict[str, Any]:
        """The fields every row has, whatever its status."""
        return {
            "trial_id": t.trial_id,
            "scenario": self.s.name,
            "mode": t.mode.kind,
            "mode_label": t.mode.label,
            "mode_options": t.mode.options,
            "prompt_tokens": t.prompt_tokens,
            "batch_size": t.batch_size,
            "max_new_tokens": self.s.max_new_tokens,
            "repeat": t.repeat,
            "status": "ok",
            "message": "",
            "device": str(self.m.device),
            "dtype": str(self.m.dtype).removeprefix("torch."),
            "kv_bytes_predicted": self.kv_bytes_predicted(t),
            **self.plan_prediction(t),
            "budget_bytes": int(self.s.budget) if self.s.budget is not None else None,
            "started_at": utc_now(),
        }

    def run(self, t: TrialSpec) -> dict[str, Any]:
        """Run one trial and return its row; failures become a row with ``status`` and ``message``. Afterwards
        (outside the timed window) ``gc.collect()``; device memory is released by the sweep, not here (see
        :meth:`release`).

        KeyboardInterrupt is not caught.
        """
        row = self.base_row(t)
        self.last_samples = []
        try:
            row.update(self._measure(t))
        except ModeUnavailable as exc:
            row.update(status="skipped", message=str(exc))
        except TooLittleText as exc:
            row.update(status="error", message=str(exc))
        except Exception as exc:  # noqa: BLE001 - every failure is recorded and the sweep goes on
            row.update(status="oom" if _is_oom(exc) else "error", message=f"{type(exc).__name__}: {exc}")
        finally:
            gc.collect()
        return row

    def release(self) -> None:
        """Release device memory before a new shape (:func:`release_device_memory` on the model's device)."""
        release_device_memory(self.m.device)

    def host_tier_bytes(self, t: TrialSpec) -> int:
        """Host memory the trial's host tier may allocate (bytes): per full-attention layer, the tokens it can hold
        (all cached tokens less the window, at most ``host_max_tokens``) rounded up to the buffers' geometric
        capacity (:func:`~kvbench.offload.tiers.grown_capacity`), × full layers × 2 × kv_heads × head_dim × dtype
        bytes × batch (:meth:`kvbench.offload.architecture.Architecture.host_bytes_per_token`: sliding-window layers never leave the
        device). 0 for modes without a host tier or models without a full-attention layer."""
        if not MODES[t.mode.kind].host_tier:
            return 0
        opts = t.mode.options
        tokens = max(0, t.prompt_tokens + self.s.max_new_tokens - 1 - (opts.get("window") or 0))
        if opts.get("host_max_tokens"):
            tokens = min(tokens, opts["host_max_tokens"])
        per_token = self.m.shape.host_bytes_per_token(self.m.dtype.itemsize)
        return grown_capacity(0, tokens) * per_token * t.batch_size if tokens else 0

    def _host_preflight(self, t: TrialSpec) -> None:
        """Refuse (ModeUnavailable → ``skipped``) a trial whose host tier cannot fit in the host memory left."""
        need = self.host_tier_bytes(t)
        if not need:
            return
        avail, source = host_memory_available()
        if need > avail:
            raise ModeUnavailable(f"refused before the trial: the host tier needs up to {need} bytes "
                                  f"({need / 2**30:.2f} GiB) but {avail} bytes ({avail / 2**30:.2f} GiB) are left "
                                  f"({source})")

    def _measure(self, t: TrialSpec) -> dict[str, Any]:
        self._host_preflight(t)
        cache = make_cache(t.mode.kind, self.m.model.config, self.m.device,
                           budget_bytes=int(self.s.budget) if self.s.budget is not None else None,
                           disk_dir=self.s.disk_dir, disk_page_cache=self.s.disk.page_cache, **t.mode.options)
        try:
            return self._generate(t, cache)
        finally:
            if isinstance(cache, OffloadedCache):
                cache.close()

    def _restore(self, t: ReuseTrial, cache: Any) -> dict[str, Any]:
        """Load the longest stored prefix of a warm trial's prompt (at most all but its last token, whose forward
        gives the first token) from the mode's store into ``cache``; the reuse fields of its row."""
        store = self.stores[t.mode.label]
        ids = list(t.request.ids)
        prefix = store.get(ids, max_tokens=len(ids) - 1)
        restore(cache, prefix, self.m.device, self.m.dtype)
        chunks = (len(ids) - 1) // store.chunk_tokens
        return {"tokens_restored": prefix.tokens, "tokens_prefilled": len(ids) - prefix.tokens,
                "store_hit_rate": prefix.tokens / store.chunk_tokens / chunks if chunks else None,
                "restore_host_bytes": prefix.host_bytes, "restore_disk_bytes": prefix.disk_bytes}

    def _hold(self, t: ReuseTrial, cache: Any, n_generated: int) -> None:
        """After a warm trial (not timed): what the server holds afterwards goes into the mode's store. The
        generated tokens are cropped and the rest of ``request.held`` (a conversation's reply as the dataset has
        it) is fed through the model with this cache, as decoding it would have."""
        cache.crop(-(n_generated - 1))  # the last generated token was never fed
        self._store_held(t, cache, len(t.request.ids))

    def refill(self, t: ReuseTrial) -> None:
        """Rebuild what a finished warm trial left in the store (a resumed run): prefill ``request.held`` in a
        fresh ``none`` cache and store it (not recorded)."""
        self._store_held(t, make_cache("none", self.m.model.config, self.m.device), 0)

    def _store_held(self, t: ReuseTrial, cache: Any, cached: int) -> None:
        """Feed ``request.held`` after its first ``cached`` tokens (already in ``cache``) through the model, then
        put the whole of it into the mode's store."""
        held = list(t.request.held)
        if held[cached:]:
            dev = self.m.device
            greedy_decode(self.m.model, torch.tensor([held[cached:]], device=dev),
                          torch.ones((1, len(held)), dtype=torch.long, device=dev), cache, 1, self.clock)
        self.stores[t.mode.label].put(held, *sequence_kv(cache))

    def _store_state(self, label: str) -> dict[str, Any]:
        st = self.stores[label]
        return {"store_chunks": len(st), "store_host_bytes": st.host_bytes, "store_disk_bytes": st.disk_bytes,
                "store_evicted": st.evicted, "store_corrupt": st.corrupt}

    def _generate(self, t: TrialSpec, cache: Any) -> dict[str, Any]:
        s, dev = self.s, self.m.device
        reuse = isinstance(t, ReuseTrial)
        if reuse:
            prompts = [list(t.request.ids)]
        else:
            prompts = self.source.batch(t.prompt_tokens, t.batch_size, t.repeat)
        input_ids, mask = left_pad(prompts, self.pad_id)
        input_ids, mask = input_ids.to(dev), mask.to(dev)
        prompt_digest = hashlib.sha256(input_ids.cpu().numpy().tobytes()).hexdigest()
        gaps = [] if reuse and t.mode.kind == "none" and not t.warm else None
        restored: dict[str, Any] = {}

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
        load = LoadWindow(self.cpu_count)
        with self.sampler.trial(t.trial_id, kv_probe=kv_now, pinned_probe=pinned_now) as timeline:
            try:
                if reuse and t.warm:  # TTFT counts the lookup and the restore
                    t_restore = self.clock()
                    restored = self._restore(t, cache)
                    input_ids = input_ids[:, restored["tokens_restored"]:]
                ids, t0, times = greedy_decode(self.m.model, input_ids, mask, cache, s.max_new_tokens, self.clock,
                                               after_step=None if own_accounting else read_kv,
                                               on_phase=self.sampler.mark, top2_gaps=gaps)
            finally:
                self.last_samples = timeline.samples
        nvml = self.sampler.nvml
        machine_load = load.stop(other_gpu_processes(nvml.raw().get("processes"), self.sampler.pid)
                                 if nvml is not None else None)
        n_out = ids.shape[1]
        if n_out != s.max_new_tokens or len(times) != s.max_new_tokens:
            raise RuntimeError(f"generated {n_out} tokens, expected exactly {s.max_new_tokens}")
        lat = latency_metrics(t_restore if restored else t0, times)
        out: dict[str, Any] = {
            "n_output_tokens": n_out,
            **lat,
            **itl_percentiles(lat["itl_s"]),
            **throughputs(t.prompt_tokens, t.batch_size, lat, n_out),
            **machine_load,
            "kv_device_peak_bytes": kv_peak["device"],
            "kv_host_peak_bytes": kv_peak["host"],
            "kv_stored_peak_bytes": kv_peak["stored"],
            **summarise(timeline.samples, timeline.peaks),
            "sampler_cpu_s": timeline.sampler_cpu_s,
            "alerts": timeline.alerts,
            "prompt_sha256": prompt_digest,
            "output_sha256": _ids_digest(ids),
            "output_ids_head": ids[:, :IDS_KEPT].tolist(),
        }
        out.update(self._compare(t, prompt_digest, ids, out["output_sha256"], gaps))
        if reuse:
            req = t.request
            out.update(request_id=req.id, document=req.document, turn_index=req.turn_index, warm=t.warm,
                       **(restored or {"tokens_restored": 0, "tokens_prefilled": len(req.ids), "store_hit_rate": None,
                                       "restore_host_bytes": 0, "restore_disk_bytes": 0}))
            if gaps is not None:  # the reference's closeness to another token, step by step (kept for --resume)
                out["top2_logit_gaps"] = gaps
        disk, disk_notes = disk_fields(cache)
        out.update(disk)
        if own_accounting:
            # the cache's own accounting also sees the transient K/V inside a forward, which per-step reads miss
            stats = cache.engine.stats
            out.update(kv_device_peak_bytes=cache.device_peak_bytes, kv_host_peak_bytes=cache.host_peak_bytes,
                       kv_disk_peak_bytes=cache.disk_peak_bytes, kv_stored_peak_bytes=cache.stored_peak_bytes,
                       kv_host_allocated_peak_bytes=cache.host_allocated_peak_bytes, h2d_bytes=stats.h2d_bytes,
                       d2h_bytes=stats.d2h_bytes, h2d_count=stats.h2d_count, d2h_count=stats.d2h_count,
                       disk_read_bytes=stats.disk_read_bytes, disk_write_bytes=stats.disk_write_bytes,
                       transfer_stalls=stats.stalls, pinned=cache.pinned,
                       # the decode steps' copy rate, to set against the link bandwidth in run.json
                       h2d_bytes_per_s=stats.h2d_bytes / decode_s if (decode_s := lat["e2e_s"] - lat["ttft_s"]) > 0
                       else None)
            if isinstance(cache, DynamicOffloadCache):
                out.update(window_events=cache.events, window_final=cache.window)
        if s.budget is not None and out["kv_device_peak_bytes"] > s.budget:
            # measured anyway (its ids are the reference for tokens_match), but it does not fit the budget
            out["status"] = "over_budget"
            out["message"] = (f"device KV peak {out['kv_device_peak_bytes']} bytes > budget {int(s.budget)} bytes")
        notes = {f"{k}_samples": v for k, v in self.sampler.notes.items()}
        notes.update(disk_notes)
        if cuda:
            out["weights_baseline_bytes"] = base_alloc
            out["peak_device_allocated_bytes"] = torch.cuda.max_memory_allocated(dev) - base_alloc
            out["peak_device_reserved_bytes"] = torch.cuda.max_memory_reserved(dev) - base_reserved
        else:
            out["weights_baseline_bytes"] = None
            out["peak_device_allocated_bytes"] = None
            out["peak_device_reserved_bytes"] = None
            reason = f"no allocator peak on a {dev.type} device (CUDA only)"
            notes.update(peak_device_allocated_bytes=reason, peak_device_reserved_bytes=reason,
                         weights_baseline_bytes=reason)
        out["notes"] = notes
        if reuse and t.warm:  # after every figure is read: feeding the reply changes the cache's peaks
            self._hold(t, cache, n_out)
            out.update(self._store_state(t.mode.label))
        return out


# --------------------------------------------------------------------------- the sweep


@dataclass
class SweepResult:
    """What a sweep did: trials written now, trials already there (resume), and whether Ctrl-C stopped it."""

    written: int
    skipped_done: int
    interrupted: bool


class Recorder:
    """Runs and writes the trials of one run: a trial already in the run (``--resume``) is looked up, not rerun;
    the first trial of each (prompt length, batch, mode) shape is preceded by a release of device memory
    (:meth:`TrialRunner.release`) and then the scenario's warm-up trials (not recorded; the rest of them are skipped
    once one does not end ``ok``, since they would fail alike). Nothing is released between a warm-up and the
    trials it prepares, nor between repeats of a shape."""

    def __init__(self, scenario: Scenario, run: RunDir, runner: TrialRunner,
                 on_trial: Callable[[dict[str, Any]], None] | None = None,
                 on_status: Callable[[str], None] | None = None):
        self.s, self.run, self.runner = scenario, run, runner
        self.on_trial, self.on_status = on_trial, on_status
        finished = run.finished_trials()
        runner.remember(finished)
        self.rows: dict[str, dict[str, Any]] = {r["trial_id"]: r for r in finished}
        self.already = len(self.rows)
        self.written = 0
        self.not_kept: str | None = None  # the trial whose files could not be written
        self._warmed: set[tuple] = set()

    def __call__(self, t: TrialSpec) -> dict[str, Any]:
        """The row of trial ``t``: the one already written, or a new one (run, then its samples and row written
        and fsynced: :meth:`RunDir.record_trial`).

        Raises:
            OSError: the trial's files could not be written; :attr:`not_kept` is its id.
        """
        if t.trial_id in self.rows:
            return self.rows[t.trial_id]
        key = t.shape_key
        if key not in self._warmed:
            self._warmed.add(key)
            self.runner.release()
            for w in range(self.s.warmup):
                if self.on_status:
                    self.on_status(f"warm-up {w + 1}/{self.s.warmup}: {t.mode.label} p{t.prompt_tokens} "
                                   f"b{t.batch_size}")
                if self.runner.run(t.warmup_spec())["status"] != "ok":
                    break
        if self.on_status:
            self.on_status(t.trial_id)
        row = self.runner.run(t)
        try:
            self.run.record_trial(row, self.runner.last_samples)
        except OSError:
            self.not_kept = t.trial_id
            raise
        self.rows[t.trial_id] = row
        self.written += 1
        if self.on_trial:
            self.on_trial(row)
        return row


def run_sweep(
    scenario: Scenario,
    run: RunDir,
    runner: TrialRunner,
    on_trial: Callable[[dict[str, Any]], None] | None = None,
    on_status: Callable[[str], None] | None = None,
) -> SweepResult:
    """Run every trial not yet in ``run``'s trials file: the planned sweep (:func:`plan_trials`); for a scenario
    with ``batch_sizes: auto`` / ``prompt_tokens: auto`` the capacity search (:mod:`kvbench.bench.capacity`), whose
    results go into run.json as ``capacity``; for a reuse workload its requests warm and cold
    (:mod:`kvbench.bench.reuse`).

    Each row is appended (and fsynced) as soon as its trial ends, under :meth:`RunDir.lock`. Ctrl-C stops after
    writing what finished and marks run.json ``interrupted``; a finished sweep marks it ``complete``.

    Raises:
        ResultsNotWritten: the run's files could not be written (disk full...): run.json is marked
            ``interrupted`` with a ``reason`` where it can be; the trials written before are kept.
        RunDirError: another process holds the run's lock; kvbench.results.identity.ForeignRow: a row there was
            written under another scenario.
    """
    with run.lock():
        return _sweep_locked(scenario, run, runner, on_trial, on_status)


def _sweep_locked(scenario: Scenario, run: RunDir, runner: TrialRunner,
                  on_trial: Callable[[dict[str, Any]], None] | None,
                  on_status: Callable[[str], None] | None) -> SweepResult:
    record = Recorder(scenario, run, runner, on_trial, on_status)
    run.meta.pop("reason", None)  # an earlier stop's: this sweep's end writes its own status
    try:
        if scenario.workload.reuse:
            from kvbench.bench.reuse import reuse_sweep

            stream = runner.source
            run.update(workload_notes=stream.notes, requests=[
                {"id": q.id, "document": q.document, "turn_index": q.turn_index, "prompt_tokens": len(q.ids),
                 "held_tokens": len(q.held)} for q in stream.requests])
            reuse_sweep(scenario, record, runner)
        elif scenario.searched is None:
            for t in plan_trials(scenario):
                record(t)
        else:
            from kvbench.bench.capacity import search_sweep

            search_sweep(scenario, record, TrialSpec, runner.longest_prompt,
                         on_capacity=lambda found: run.update(capacity=found))
        run.update(status="complete", finished_at=utc_now())
    except KeyboardInterrupt:
        run.update(status="interrupted", interrupted_at=utc_now())
        return SweepResult(record.written, record.already, interrupted=True)
    except OSError as exc:  # writing the results: disk full, quota, a removed directory
        try:
            run.update(status="interrupted", reason=failure_reason(exc), interrupted_at=utc_now())
            status_error = None
        except OSError as again:
            status_error = again.strerror or str(again)
        raise ResultsNotWritten(exc, run.path, record.not_kept, status_error) from exc
    return SweepResult(record.written, record.already, interrupted=False)


def prepare(scenario: Scenario, environment: dict[str, Any] | None = None) -> TrialRunner:
    """Load the scenario's model and prompt source and return a runner for its trials; ``environment`` (the
    run's, with its measured bandwidths) lets each trial carry plan's predicted step time.

    Raises:
        kvbench.errors.ModelNotFound, kvbench.errors.ModelLoadError (anything else that stops the model
        loading, e.g. a pickled checkpoint torch refuses), ValueError (a reuse workload's source with too few
        texts: :class:`~kvbench.workloads.sessions.NotEnoughRequests`), ModuleNotFoundError (data package missing).
    """
    from kvbench.models.load import load_model
    from kvbench.workloads import make_source, make_stream

    loaded = load_model(scenario.model, scenario.device, scenario.seed)
    if scenario.workload.reuse:
        source = make_stream(scenario.workload, loaded.tokenizer,
                             loaded.shape.max_positions - scenario.max_new_tokens)
    else:
        source = make_source(scenario.workload, loaded.tokenizer, loaded.shape.vocab_size,
                             loaded.shape.max_positions - scenario.max_new_tokens)
    return TrialRunner(scenario, loaded, source, environment=environment)
