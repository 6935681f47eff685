"""A trial's row, built from what its engine handed back (:class:`~kvbench.bench.trial.TrialOutput`), what
the samplers saw and the ``none`` reference: the same columns whichever engine ran it."""

from __future__ import annotations

from typing import Any


from kvbench.analysis.latency import itl_percentiles, latency_metrics, throughputs
from kvbench.bench.trial import TrialOutput
from kvbench.bench.telemetry.monitor import TrialTimeline, summarise
from kvbench.bench.rows.reference import Reference
from kvbench.bench.trial import ReuseTrial, TrialSpec
from kvbench.results.run_dir import utc_now
from kvbench.scenario import Scenario
from kvbench.results.rows import Status, ids_digest

#: How many generated ids per sequence a trial row keeps (the full sequence is hashed).
IDS_KEPT = 16


def base_row(s: Scenario, t: TrialSpec, described: dict[str, Any]) -> dict[str, Any]:
    """The fields every row has, whatever its status (``ok`` until the trial says otherwise); ``described``: the
    engine's fields for ``t`` (:meth:`~kvbench.bench.engines.base.Engine.describe`)."""
    return {
        "trial_id": t.trial_id,
        "scenario": s.name,
        "mode": t.mode.kind,
        "mode_label": t.mode.label,
        "mode_options": t.mode.options,
        "prompt_tokens": t.prompt_tokens,
        "batch_size": t.batch_size,
        "max_new_tokens": s.max_new_tokens,
        "repeat": t.repeat,
        "status": Status.OK,
        "message": "",
        **described,
        "budget_bytes": int(s.budget) if s.budget is not None else None,
        "started_at": utc_now(),
    }


def measured_fields(s: Scenario, t: TrialSpec, out: TrialOutput, timeline: TrialTimeline | None,
                    machine_load: dict[str, Any], sampler_notes: dict[str, str],
                    reference: Reference) -> dict[str, Any]:
    """The fields of a trial that ran to the end, whichever engine ran it: latencies and throughputs from its
    token (and chunk) timestamps, the machine's load, KV peaks, the samplers' summary (``timeline``; None where
    the engine's process is sampled per mode, not per trial: a server), digests, the comparison with the ``none``
    reference (unless :attr:`TrialOutput.not_compared`), a reuse trial's restore, the engine's own fields, and
    ``status`` ``over_budget`` when the device KV peak exceeds the budget (measured anyway: its ids are the
    reference for ``tokens_match``).

    Raises:
        RuntimeError: the engine generated another number of tokens than ``max_new_tokens``.
    """
    n_out = len(out.ids[0]) if out.ids else len(out.token_times)
    if n_out != s.max_new_tokens or len(out.token_times) != s.max_new_tokens:
        raise RuntimeError(f"generated {n_out} tokens, expected exactly {s.max_new_tokens}")
    lat = latency_metrics(out.t_start, out.token_times, out.chunk_times)
    row: dict[str, Any] = {
        "n_output_tokens": n_out,
        **lat,
        **itl_percentiles(lat["itl_s"]),
        **throughputs(t.prompt_tokens, t.batch_size, lat, n_out),
        **machine_load,
        **out.memory,
    }
    if timeline is not None:
        row.update(**summarise(timeline.samples, timeline.peaks), sampler_cpu_s=timeline.sampler_cpu_s,
                   alerts=timeline.alerts)
    row.update(prompt_sha256=out.prompt_sha256,
               output_sha256=out.output_sha256 if out.output_sha256 is not None else ids_digest(out.ids or [[]]),
               output_ids_head=[seq[:IDS_KEPT] for seq in out.ids] if out.ids is not None else None)
    notes = dict(out.notes)
    if out.not_compared is not None:
        row.update(tokens_match=None, first_divergence_step=None)
        notes = {"tokens_match": out.not_compared, **notes}
    else:
        row.update(reference.compare(t, out.prompt_sha256, out.ids or [[]], row["output_sha256"], out.top2_gaps))
    if isinstance(t, ReuseTrial):
        req = t.request
        row.update(request_id=req.id, document=req.document, turn_index=req.turn_index, warm=t.warm,
                   shared_prefix_tokens=req.shared_prefix_tokens, working_set_prompts=req.working_set,
                   shared_pct=req.shared_pct, trace_index=req.trace_index,
                   **(out.reuse or {"tokens_restored": 0, "tokens_prefilled": len(req.ids), "store_hit_rate": None,
                                    "restore_host_bytes": 0, "restore_disk_bytes": 0}))
        if out.top2_gaps is not None:  # the reference's closeness to another token, step by step (kept for resume)
            row["top2_logit_gaps"] = out.top2_gaps
    row.update(out.fields)
    if s.budget is not None and row["kv_device_peak_bytes"] > s.budget:
        row["status"] = Status.OVER_BUDGET
        row["message"] = f"device KV peak {row['kv_device_peak_bytes']} bytes > budget {int(s.budget)} bytes"
    row["notes"] = {**{f"{k}_samples": v for k, v in sampler_notes.items()}, **notes}
    return row
