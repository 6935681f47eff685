"""The trial row, declared once: every column of a ``trials.jsonl`` line with its type, unit and meaning, the
statuses a trial ends with, and the names of the aggregate columns the per-point tables build from them.

A row is a JSON object. Units are in the names: ``_s`` seconds, ``_bytes`` bytes, ``_per_s`` per second,
``_percent`` percent of one CPU (or of the device), ``_tokens`` tokens. Columns marked for some modes are absent
from other modes' rows, and a trial that did not run (``skipped``, ``error``) has only the columns that say what
it was and why. The field table of docs/metrics.md ("What a trial measures") documents :data:`TRIAL_COLUMNS` in the same
order; ``tests/results/test_rows.py`` holds the two together.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum

import numpy as np


def ids_digest(ids: list[list[int]]) -> str:
    """The ``prompt_sha256`` and ``output_sha256`` of a row: sha256 hex of token ids ``[batch][steps]`` as int64
    in row-major order."""
    return hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()


class Status(StrEnum):
    """How a trial ended (a row's ``status``), in the order the tables count them. A ``str``: rows and frames
    hold the plain strings."""

    OK = "ok"
    #: measured to the end, but the device KV peak was above the scenario's budget
    OVER_BUDGET = "over_budget"
    #: not run: the mode cannot run here (e.g. ``hf-offloaded`` without CUDA, a host tier larger than the memory left)
    SKIPPED = "skipped"
    ERROR = "error"
    OOM = "oom"


#: Statuses of trials that ran to the end (an over-budget trial is measured, it just does not fit).
MEASURED = (Status.OK, Status.OVER_BUDGET)
#: Statuses of a capacity probe that mean "does not fit"; ``ok`` fits, anything else stops the search.
NO_FIT = (Status.OVER_BUDGET, Status.OOM)


class Kind(StrEnum):
    """What a column holds; every column may also be null unless :attr:`Column.required`."""

    #: required text, not empty
    NAME = "name"
    #: required whole number above 0
    SIZE = "size"
    #: required, one of :class:`Status`
    STATUS = "status"
    #: whole number ≥ 0 (at most 2**63 − 1)
    COUNT = "count"
    #: finite number
    NUMBER = "number"
    #: list of finite numbers
    NUMBERS = "numbers"
    TEXT = "text"
    FLAG = "flag"
    OBJECT = "object"
    LIST = "list"


@dataclass(frozen=True)
class Column:
    """One column of the trial row: ``name``, what it holds (``kind``), its ``unit`` (``bytes``, ``seconds``,
    ``tokens``, ``tokens/s``, ``bytes/s``, ``percent``, ``watts``; ``""`` for names, counts of things and
    ratios) and a one-line ``meaning``."""

    name: str
    kind: Kind
    unit: str
    meaning: str

    @property
    def required(self) -> bool:
        """Every row has it, whatever its status."""
        return self.kind in (Kind.NAME, Kind.SIZE, Kind.STATUS)


def _columns(*specs: tuple[str, Kind, str, str]) -> tuple[Column, ...]:
    return tuple(Column(*spec) for spec in specs)


K = Kind
#: The columns of the docs' field table (docs/metrics.md), in its order.
TRIAL_COLUMNS = _columns(
    ("trial_id", K.NAME, "", "p<N>-b<B>-<mode label>-r<repeat> (reuse: <request>-<label>-warm|cold-r<repeat>)"),
    ("scenario", K.TEXT, "", "the scenario's name"),
    ("mode", K.NAME, "", "the mode's kind (none, full, hierarchical, ...)"),
    ("mode_label", K.TEXT, "", "the mode's label in the scenario (its kind unless named)"),
    ("mode_options", K.OBJECT, "", "the mode's options (window, host_max_tokens, ...)"),
    ("prompt_tokens", K.SIZE, "tokens", "prompt length of every sequence"),
    ("batch_size", K.SIZE, "", "sequences in the batch"),
    ("max_new_tokens", K.COUNT, "tokens", "tokens asked of every sequence"),
    ("repeat", K.COUNT, "", "repeat index of the point (0-based)"),
    ("scenario_digest", K.TEXT, "", "16 hex digits of the SHA-256 of what shapes the trial in run.json's scenario"),
    ("tokens_match", K.FLAG, "", "generated ids equal those of `none` on the same prompts (null: none to compare)"),
    ("first_divergence_step", K.COUNT, "", "first decode step where the ids differ from `none`'s"),
    ("token_agreement", K.NUMBER, "", "lossy host formats: share of (sequence, step) ids equal to `none`'s (steps "
     "after a differing id follow another prefix)"),
    ("agreement_to_divergence", K.NUMBER, "", "lossy host formats: mean share of steps before a sequence's first "
     "differing id (the agreement kvbench shows and min_agreement gates)"),
    ("kl_mean", K.NUMBER, "", "lossy host formats: KL(none ‖ mode) of the next-token distributions in nats, "
     "teacher-forced on `none`'s ids, mean over steps and sequences"),
    ("kl_max", K.NUMBER, "", "lossy host formats: the largest of those KL divergences, nats"),
    ("kl_method", K.TEXT, "", "how kl_mean (or floor_kl_mean) was taken where not teacher-forced: on a server, a "
     "lower bound from its top-k log-probabilities over the steps up to the first differing id"),
    ("floor_kl_mean", K.NUMBER, "", "a server's lossless reuse preset (prefix-cache...) in a run with a lossy one: "
     "its KL(none ‖ mode) taken as a lossy preset's kl_mean (a lower bound, nats): the floor to read those against"),
    ("floor_kl_max", K.NUMBER, "", "the largest of those KL divergences, nats"),
    ("notes", K.OBJECT, "", "why a column is null, per column"),
    ("status", K.STATUS, "", "how the trial ended (Status)"),
    ("message", K.TEXT, "", "the reason for a status other than ok"),
    ("device", K.TEXT, "", "the torch device it ran on"),
    ("dtype", K.TEXT, "", "the model's dtype"),
    ("budget_bytes", K.COUNT, "bytes", "the scenario's device KV budget (null without one)"),
    ("n_output_tokens", K.COUNT, "tokens", "tokens generated per sequence"),
    ("started_at", K.TEXT, "", "UTC start, ISO 8601 with a Z"),
    ("ttft_s", K.NUMBER, "seconds", "time to first token: prefill + first token"),
    ("itl_s", K.NUMBERS, "seconds", "every inter-token gap (max_new_tokens − 1 of them; a server's: one per "
                                    "streamed chunk, as vLLM's)"),
    ("itl_p50_s", K.NUMBER, "seconds", "median inter-token gap (numpy's higher method)"),
    ("itl_p90_s", K.NUMBER, "seconds", "90th percentile inter-token gap"),
    ("itl_p99_s", K.NUMBER, "seconds", "99th percentile inter-token gap"),
    ("itl_max_s", K.NUMBER, "seconds", "longest inter-token gap"),
    ("tpot_s", K.NUMBER, "seconds", "time per output token: (e2e − TTFT) / (n_out − 1)"),
    ("ntpot_s", K.NUMBER, "seconds", "normalised time per output token: e2e / n_out (TTFT included)"),
    ("e2e_s", K.NUMBER, "seconds", "prefill start to last token"),
    ("prefill_tokens_per_s", K.NUMBER, "tokens/s", "batch × prompt / TTFT"),
    ("decode_tokens_per_s", K.NUMBER, "tokens/s", "batch × (n_out − 1) / (e2e − TTFT)"),
    ("throughput_tokens_per_s", K.NUMBER, "tokens/s", "batch × n_out / e2e"),
    ("kv_device_peak_bytes", K.COUNT, "bytes", "peak K and V held on the device (filled)"),
    ("kv_host_peak_bytes", K.COUNT, "bytes", "peak K and V held on the host (filled)"),
    ("kv_host_allocated_peak_bytes", K.COUNT, "bytes", "offload modes: peak capacity of the host buffers allocated"),
    ("kv_disk_peak_bytes", K.COUNT, "bytes", "offload modes: peak K and V in the disk tier"),
    ("kv_host_logical_peak_bytes", K.COUNT, "bytes", "offload modes: the host tier's peak as the model's dtype"),
    ("kv_disk_logical_peak_bytes", K.COUNT, "bytes", "offload modes: the disk tier's peak as the model's dtype"),
    ("kv_stored_peak_bytes", K.COUNT, "bytes", "peak K and V over all tiers, each token once"),
    ("h2d_bytes", K.COUNT, "bytes", "offload modes: bytes copied host→device"),
    ("d2h_bytes", K.COUNT, "bytes", "offload modes: bytes copied device→host"),
    ("h2d_logical_bytes", K.COUNT, "bytes", "offload modes: h2d_bytes as the model's dtype"),
    ("d2h_logical_bytes", K.COUNT, "bytes", "offload modes: d2h_bytes as the model's dtype"),
    ("h2d_count", K.COUNT, "", "offload modes: host→device copies"),
    ("d2h_count", K.COUNT, "", "offload modes: device→host copies"),
    ("pinned", K.FLAG, "", "offload modes: host buffers were page-locked"),
    ("h2d_bytes_per_s", K.NUMBER, "bytes/s", "offload modes: h2d_bytes / decode time (e2e − TTFT)"),
    ("disk_write_bytes", K.COUNT, "bytes", "offload modes: bytes written to the disk tier's files"),
    ("disk_read_bytes", K.COUNT, "bytes", "offload modes: bytes read from the disk tier's files"),
    ("disk_synced", K.FLAG, "", "disk tier: every write was synced to the device"),
    ("disk_page_cache_dropped", K.FLAG, "", "disk tier: written and read pages were dropped from the page cache"),
    ("disk_synced_bytes", K.COUNT, "bytes", "disk tier: bytes synced"),
    ("transfer_stalls", K.COUNT, "", "offload modes: times compute waited for an unfinished host→device copy"),
    ("window_events", K.LIST, "", "dynamic: every change of the window (step, old, new, reason)"),
    ("window_final", K.COUNT, "tokens", "dynamic: the window at the end"),
    ("kv_bytes_predicted", K.COUNT, "bytes", "the analytic KV the cache holds at the end, over all tiers"),
    ("peak_device_allocated_bytes", K.COUNT, "bytes", "CUDA: torch allocator peak (allocated) over its start level"),
    ("peak_device_reserved_bytes", K.COUNT, "bytes", "CUDA: torch allocator peak (reserved) over its start level"),
    ("weights_baseline_bytes", K.COUNT, "bytes", "CUDA: the allocator's level at the start (weights and the rest)"),
    ("nvml_process_peak_bytes", K.COUNT, "bytes", "CUDA: peak GPU memory of this process (NVML samples)"),
    ("nvml_device_peak_bytes", K.COUNT, "bytes", "CUDA: peak GPU memory of the whole device (NVML samples)"),
    ("rss_peak_bytes", K.COUNT, "bytes", "the process's peak resident memory during the trial"),
    ("rss_peak_source", K.TEXT, "", "where rss_peak_bytes comes from (kernel VmHWM, or the samples)"),
    ("rss_anon_peak_bytes", K.COUNT, "bytes", "peak anonymous resident memory (samples)"),
    ("rss_file_peak_bytes", K.COUNT, "bytes", "peak file-backed and shared resident memory (samples)"),
    ("rss_mean_bytes", K.NUMBER, "bytes", "mean resident memory (samples)"),
    ("cpu_percent_mean", K.NUMBER, "percent", "the process's mean CPU (100 = one core; samples)"),
    ("host_available_min_bytes", K.COUNT, "bytes", "the host's lowest available memory (samples)"),
    ("pinned_host_requested_peak_bytes", K.COUNT, "bytes", "CUDA: page-locked host buffers the cache asked for, peak"),
    ("pinned_host_allocated_peak_bytes", K.COUNT, "bytes", "CUDA: page-locked host blocks torch held, peak"),
    ("gpu_util_mean_percent", K.NUMBER, "percent", "CUDA: mean GPU utilisation (NVML samples)"),
    ("pcie_tx_mean_bytes_per_s", K.NUMBER, "bytes/s", "CUDA: mean PCIe transmit rate (NVML samples)"),
    ("pcie_rx_mean_bytes_per_s", K.NUMBER, "bytes/s", "CUDA: mean PCIe receive rate (NVML samples)"),
    ("power_mean_w", K.NUMBER, "watts", "CUDA: mean board power (NVML samples)"),
    ("n_samples", K.COUNT, "", "samples of the trial in samples.csv"),
    ("alerts", K.LIST, "", "alert events when monitor.alert_device_bytes was crossed"),
    ("sampler_cpu_s", K.NUMBER, "seconds", "CPU time the sampler thread used during the trial"),
    ("prompt_sha256", K.TEXT, "", "SHA-256 of the batch's prompt ids"),
    ("output_sha256", K.TEXT, "", "SHA-256 of the generated ids"),
    ("output_ids_head", K.LIST, "", "the first 16 generated ids of every sequence"),
    ("others_cpu_percent", K.NUMBER, "percent", "the machine's CPU used by others during the trial (of one CPU)"),
    ("steal_cpu_percent", K.NUMBER, "percent", "CPU the hypervisor gave to others during the trial (of one CPU)"),
    ("gpu_other_processes", K.COUNT, "", "CUDA: other processes on the GPU at the trial's end"),
    ("load_resolution_percent", K.NUMBER, "percent", "± resolution of others_cpu_percent (10 ms ticks)"),
    ("load_window_s", K.NUMBER, "seconds", "the window the load was measured over"),
    ("busy_threshold_percent", K.NUMBER, "percent", "others' CPU above which the machine is busy"),
    ("machine_busy", K.FLAG, "", "others' CPU clearly above the threshold, or another GPU process (null: unknown)"),
)
#: ``kvbench plan``'s prediction for the trial (docs/reports.md; null for modes plan does not model).
PLAN_COLUMNS = _columns(
    ("plan_kv_device_bytes", K.NUMBER, "bytes", "device KV of the batch under plan's placement"),
    ("plan_link_bytes_per_step", K.NUMBER, "bytes", "host KV copied to the device per decode step, mean"),
    ("plan_tpot_s", K.NUMBER, "seconds", "the decode-step roofline averaged over the trial's steps"),
)
#: Reuse workloads only (docs/scenarios.md): the request, its restore from the mode's KV store and the store after it.
REUSE_COLUMNS = _columns(
    ("request_id", K.TEXT, "", "c<conversation>-t<turn> or d<document>-q<question>"),
    ("document", K.TEXT, "", "the document or conversation the request belongs to"),
    ("turn_index", K.COUNT, "", "a conversation's turn, or a document's k-th question"),
    ("warm", K.FLAG, "", "the stored prefix was restored (else recomputed)"),
    ("tokens_restored", K.COUNT, "tokens", "prompt tokens restored from the store"),
    ("tokens_prefilled", K.COUNT, "tokens", "prompt tokens prefilled"),
    ("store_hit_rate", K.NUMBER, "", "chunks found ÷ whole chunks of the prompt (a server: cached ÷ reusable tokens)"),
    ("restore_host_bytes", K.COUNT, "bytes", "KV restored from the store's host tier"),
    ("restore_disk_bytes", K.COUNT, "bytes", "KV restored from the store's disk tier"),
    ("top2_logit_gap", K.NUMBER, "", "the reference's top-2 logit gap at the first divergence"),
    ("divergence_acceptable", K.FLAG, "", "a warm trial's divergence is a near tie (gap ≤ 1e-3)"),
    ("top2_logit_gaps", K.NUMBERS, "", "`none`: its top-2 logit gap at every step (kept for --resume)"),
    ("store_chunks", K.COUNT, "", "chunks in the mode's store after a warm trial"),
    ("store_host_bytes", K.COUNT, "bytes", "the store's host bytes after a warm trial"),
    ("store_disk_bytes", K.COUNT, "bytes", "the store's disk bytes after a warm trial (disk-slots: its slot files)"),
    ("store_evicted", K.COUNT, "", "chunks the store evicted so far"),
    ("store_corrupt", K.COUNT, "", "chunks the store found damaged so far"),
    ("shared_prefix_tokens", K.COUNT, "tokens", "shared_prefix: the prompt's prefix shared with its prefix's visits"),
    ("working_set_prompts", K.COUNT, "", "shared_prefix: the prefixes in rotation in the request's cell"),
    ("shared_pct", K.COUNT, "", "shared_prefix: the percent of the prompt its cell asks to be shared"),
    ("trace_index", K.COUNT, "", "trace: the request's position in the trace file (0-based)"),
    ("kv_budget_tokens", K.COUNT, "tokens", "the KV the engine keeps for reuse: the store's host tier (in-process), "
                                            "the slots' context and its host RAM tier (a server)"),
    ("share_unit_tokens", K.COUNT, "tokens", "shared_prefix: the units a shared prefix is held in (the store's "
                                             "chunk; 1 on a server; 0: every prompt held whole, llama.cpp)"),
    ("cell_kv_tokens", K.COUNT, "tokens", "shared_prefix: the KV the request's cell holds once its visits ran "
                                          "(shared units once, each visit's own rest and tail)"),
)
#: Server engines only (docs/engines.md): the request as the server saw it and the load it ran in.
SERVER_COLUMNS = _columns(
    ("engine", K.TEXT, "", "the serving engine (llama.cpp, vllm, sglang, openai)"),
    ("load_profile", K.TEXT, "", "how requests were sent (sequential, concurrent, poisson)"),
    ("concurrency", K.COUNT, "", "the server's parallel slots"),
    ("arrival_s", K.NUMBER, "seconds", "when the request was due, from the start of its mode's load"),
    ("start_s", K.NUMBER, "seconds", "when it was sent, from the start of its mode's load"),
    ("queue_s", K.NUMBER, "seconds", "start − arrival: the wait for a free slot or the previous turn"),
    ("cached_prompt_tokens", K.COUNT, "tokens", "prompt tokens the server reused (llama.cpp cache_n; OpenAI "
                                                "cached_tokens; null: not reported)"),
    ("cached_prompt_share", K.NUMBER, "", "cached_prompt_tokens ÷ prompt_tokens"),
    ("tier_hit_tokens", K.COUNT, "tokens", "cached prompt tokens the answering slot did not hold: served from a "
                                           "host or disk tier (llama.cpp --cache-ram, a restored slot file); "
                                           "null: not told per request (vLLM, SGLang: their /metrics by tier)"),
    ("reusable_prompt_tokens", K.COUNT, "tokens", "the longest start of the prompt an earlier request held (what a "
                                                  "cache could reuse)"),
    ("server_prompt_tokens", K.COUNT, "tokens", "the server's own count of the prompt"),
    ("server_tpot_s", K.NUMBER, "seconds", "the server's own time per output token (llama.cpp "
                                           "predicted_per_token_ms)"),
    ("server_prompt_s", K.NUMBER, "seconds", "the server's own prompt-processing time"),
    ("stop_reason", K.TEXT, "", "why the server stopped (llama.cpp stop_type; OpenAI finish_reason)"),
    ("tokens_per_chunk", K.NUMBER, "", "generated tokens ÷ the streamed chunks that carried them"),
    ("slot_restore_s", K.NUMBER, "seconds", "disk-slots: the client's time of the slot restore before the "
                                            "request (inside its TTFT and e2e)"),
    ("server_restore_s", K.NUMBER, "seconds", "disk-slots: the server's own time of that restore (restore_ms)"),
    ("slot_save_s", K.NUMBER, "seconds", "disk-slots: the client's time of the slot save after the request"),
    ("server_save_s", K.NUMBER, "seconds", "disk-slots: the server's own time of that save (save_ms)"),
    ("server_host_tier_bytes", K.COUNT, "bytes", "the host KV tier the server's flags configure (null: not known "
                                                 "from them)"),
    ("server_host_tier", K.TEXT, "", "where server_host_tier_bytes comes from (e.g. --cache-ram 256 MiB)"),
    ("server_rss_growth_bytes", K.COUNT, "bytes", "the server's resident memory after the request less before "
                                                  "its mode's first measured request"),
    ("contaminated", K.FLAG, "", "a cold mode's request reused cached tokens (never the reference)"),
    ("cold_verified", K.FLAG, "", "the first request of a fresh server reused 0 tokens (null: not the first)"),
)
#: Where a trial ran (docs/clusters.md): every row has them, whichever executor ran it.
PLACEMENT_COLUMNS = _columns(
    ("machine", K.TEXT, "", "the scenario's placement kind it ran on (null: no placement)"),
    ("host", K.TEXT, "", "the host name of the machine that ran it"),
    ("worker", K.TEXT, "", "the Ray actor that ran it (null: run in the driver's process)"),
    ("attempt", K.COUNT, "", "0; 1 for the retry of a trial whose worker was lost"),
    ("gpu", K.TEXT, "", "the CUDA device's name (null on CPU)"),
    ("gpu_driver", K.TEXT, "", "the NVIDIA driver's version (NVML; null without)"),
    ("link_h2d_gbps", K.NUMBER, "", "that machine's measured pinned host→device copy bandwidth, GB/s (null on CPU)"),
    ("link_d2h_gbps", K.NUMBER, "", "that machine's measured pinned device→host copy bandwidth, GB/s (null on CPU)"),
)
#: Every column kvbench writes; a row may hold others (a newer kvbench), kept as they are.
COLUMNS = TRIAL_COLUMNS + PLAN_COLUMNS + REUSE_COLUMNS + SERVER_COLUMNS + PLACEMENT_COLUMNS
#: Columns by name.
BY_NAME = {c.name: c for c in COLUMNS}

#: Columns the loader adds to every trial of a frame (:mod:`kvbench.results.frame`).
FRAME_COLUMNS = _columns(
    ("run", K.TEXT, "", "the run directory's name"),
    ("run_path", K.TEXT, "", "the run directory"),
    ("group", K.TEXT, "", "the scenario name, or name @ run when runs of one name differ"),
    ("repeats_planned", K.NUMBER, "", "the repeats the run's scenario asked for"),
    ("max_kl", K.NUMBER, "", "the run's quality.max_kl: the largest mean KL a lossy mode may have, nats"),
    ("max_server_kl", K.NUMBER, "", "the run's quality.max_server_kl: the largest lower bound of KL a server's "
     "lossy preset may have, nats"),
    ("min_agreement", K.NUMBER, "", "the run's quality.min_agreement: the smallest agreement_to_divergence a lossy "
     "mode may have"),
    ("bytes_moved_per_token", K.NUMBER, "bytes", "host↔device and disk bytes per generated token"),
    ("h2d_bytes_per_step", K.NUMBER, "bytes", "h2d_bytes per decode step"),
    ("kv_measured_bytes", K.NUMBER, "bytes", "a measured trial's KV over all tiers (kv_stored_peak_bytes)"),
    ("kv_check_error", K.NUMBER, "", "kv_measured_bytes / kv_bytes_predicted − 1"),
)

@dataclass(frozen=True)
class Metric:
    """One entry of the metric dictionary: a latency or throughput figure kvbench writes, under one name with
    one definition, and what the field's other tools call it (``"-"``: they report none such). Peers use one name
    for different things: GuideLLM's ``time_per_output_token_ms`` includes TTFT (it is an NTPOT), AIPerf's
    ``inter_token_latency`` is vLLM's TPOT, inference-perf's ``inter_token_latency`` gives the tokens of one chunk
    gaps of 0 s. Read in their sources: vLLM ``vllm/benchmarks/serve.py`` (``calculate_metrics``), GuideLLM
    ``guidellm/schemas/base/request_stats.py`` (0.8), AIPerf ``aiperf/metrics/types/``, inference-perf
    ``inference_perf/reportgen/base.py``."""

    name: str
    unit: str
    definition: str
    where: str
    vllm: str
    guidellm: str
    aiperf: str
    inference_perf: str


#: The metric dictionary (docs/metrics.md, held to it by ``tests/results/test_rows.py``): per-request columns of
#: the trial row, then a server run's per-mode figures (``server_load.csv``, ``goodput.csv``).
METRICS = (
    Metric("ttft_s", "seconds", "request sent (a slot restore before it included) → first generated token",
           "row", "ttft", "time_to_first_token_ms", "time_to_first_token", "time_to_first_token"),
    Metric("tpot_s", "seconds", "(e2e − TTFT) ÷ (n_out − 1): decode only", "row", "tpot",
           "inter_token_latency_ms", "inter_token_latency", "time_per_output_token"),
    Metric("itl_s", "seconds", "each gap between consecutive streamed chunks that carried tokens (one per chunk)",
           "row", "itl", "-", "inter_chunk_latency", "-"),
    Metric("ntpot_s", "seconds", "e2e ÷ n_out: TTFT included", "row", "-", "time_per_output_token_ms", "-",
           "normalized_time_per_output_token"),
    Metric("e2e_s", "seconds", "request sent → last generated token", "row", "e2el", "request_latency",
           "request_latency", "request_latency"),
    Metric("throughput_wall_tokens_per_s", "tokens/s", "generated tokens ÷ the load's wall-clock seconds",
           "server_load", "output_throughput", "output_tokens_per_second", "output_token_throughput",
           "output_tokens_per_sec"),
    Metric("throughput_busy_tokens_per_s", "tokens/s", "generated tokens ÷ the seconds at least one request was "
           "in flight (holds, slot saves and think time left out)", "server_load", "-", "-", "-", "-"),
    Metric("request_rate_wall_per_s", "requests/s", "measured requests ÷ the load's wall-clock seconds",
           "server_load", "request_throughput", "requests_per_second", "request_throughput", "requests_per_sec"),
    Metric("goodput_wall_per_s", "requests/s", "requests whose TTFT and TPOT meet the SLOs ÷ the load's "
           "wall-clock seconds", "server_load", "request_goodput", "request_goodput", "goodput", "request_goodput"),
    Metric("cached_token_share", "", "Σ cached prompt tokens ÷ Σ prompt tokens of a mode's requests "
           "(token-weighted hit rate)", "server_load", "-", "-",
           "overall_usage_prompt_cache_read_pct (percent; newer builds)",
           "prefix_cache_hit_percent (percent, from /metrics)"),
)

#: Statistics of a column over a point's trials, as :func:`agg` names them.
AGGREGATES = ("median", "min", "max", "ci_low", "ci_high")


#: How the message of a trial whose worker died under it starts (``error: worker lost (host …)``).
WORKER_LOST = "worker lost"


def retry_due(row: dict) -> bool:
    """Whether a row is a trial's first loss of its worker (status ``error``, message :data:`WORKER_LOST`,
    ``attempt`` 0 or absent): that trial runs once more, and its later row replaces this one."""
    return (row.get("status") == Status.ERROR and str(row.get("message") or "").startswith(WORKER_LOST)
            and not row.get("attempt"))


def agg(column: str, stat: str) -> str:
    """The name of the aggregate column of ``column`` for ``stat`` (one of :data:`AGGREGATES`: ``median``, ``min``,
    ``max``, and ``ci_low``/``ci_high`` for the 95% interval): ``agg("ttft_s", "median")`` is
    ``ttft_s_median``. ``column`` may be a trial column or a derived one (``ttft_ratio``).

    Raises:
        ValueError: ``stat`` is not one of :data:`AGGREGATES`.
    """
    if stat not in AGGREGATES:
        raise ValueError(f"no aggregate {stat!r}: one of {', '.join(AGGREGATES)}")
    return f"{column}_{stat}"


__all__ = ["AGGREGATES", "BY_NAME", "COLUMNS", "Column", "FRAME_COLUMNS", "Kind", "MEASURED", "METRICS", "Metric",
           "NO_FIT", "PLACEMENT_COLUMNS", "PLAN_COLUMNS", "REUSE_COLUMNS", "SERVER_COLUMNS", "Status", "TRIAL_COLUMNS",
           "WORKER_LOST", "agg", "retry_due"]
