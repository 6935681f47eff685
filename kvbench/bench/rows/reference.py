"""The ``none`` reference: every trial's greedy ids are compared with those of the ``none`` trial on the same
prompts (``tokens_match``); in a reuse workload the reference is ``none`` recomputing the request (a cold trial),
whose top-2 logit gaps say how close greedy decoding was to another token at each step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvbench.bench.trial import ReuseTrial, TrialSpec
from kvbench.results.rows import MEASURED

#: A restored (warm) run may pick another token than recompute only where recompute's top-2 logits are this close.
ACCEPTABLE_GAP = 1e-3


def first_difference(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> int | None:
    """The first step (column) at which any sequence of ``a`` and ``b`` (both ``[batch][steps]``) differ, or
    None."""
    steps = min(len(row) for row in (*a, *b)) if a and b else 0
    return next((i for i in range(steps) if any(x[i] != y[i] for x, y in zip(a, b))), None)


class Reference:
    """The outputs of ``none`` trials, by prompt digest (sha256 hex): ``baseline_sha`` (the output digest),
    ``baseline_ids`` (``[batch][steps]`` ids, for where they first differ; only trials run by this process) and
    ``baseline_gaps`` (top-2 logit gaps per step, reuse workloads only)."""

    def __init__(self) -> None:
        self.baseline_sha: dict[str, str] = {}
        self.baseline_ids: dict[str, list[list[int]]] = {}
        self.baseline_gaps: dict[str, list[float]] = {}

    @staticmethod
    def is_reference(t: TrialSpec) -> bool:
        """Whether ``t``'s ids are the reference: a ``none`` trial that restores nothing (never a warm one)."""
        return t.mode.kind == "none" and not getattr(t, "warm", False)

    def wants_gaps(self, t: TrialSpec) -> bool:
        """Whether the engine should hand back ``t``'s top-2 logit gaps: the reference trials of a reuse
        workload."""
        return isinstance(t, ReuseTrial) and self.is_reference(t)

    def remember(self, rows: Sequence[dict[str, Any]]) -> None:
        """Take the ``none`` outputs of earlier rows (a resumed run) as baselines for ``tokens_match`` (in a reuse
        workload, those of cold trials, with their top-2 logit gaps; a server's cold request that reused cached
        tokens, ``contaminated``, never)."""
        for r in rows:
            # ok and over budget both ran to the end; a warm (restored) run is never the reference
            if r.get("mode") == "none" and r.get("status") in MEASURED and not r.get("warm") \
                    and not r.get("contaminated"):
                self.baseline_sha[r["prompt_sha256"]] = r["output_sha256"]
                if r.get("top2_logit_gaps") is not None:
                    self.baseline_gaps[r["prompt_sha256"]] = r["top2_logit_gaps"]

    def compare(self, t: TrialSpec, prompt_digest: str, ids: list[list[int]], digest: str,
                gaps: list[float] | None = None) -> dict[str, Any]:
        """``tokens_match``: generated ids equal those of the ``none`` trial on the same prompts (True for
        ``none`` itself, which becomes the reference; None when no such trial ran); ``first_divergence_step``:
        where they first differ. In a reuse workload a warm trial that differs gets ``top2_logit_gap``, the
        reference's gap at the first differing step, and ``divergence_acceptable`` = gap ≤ :data:`ACCEPTABLE_GAP`
        (restored KV was computed in another pass, so a near tie may flip; any other divergence is a bug).

        Args:
            prompt_digest, digest: sha256 hex of the trial's prompts and of its generated ids.
            ids: the generated ids, ``[batch][steps]``.
            gaps: the trial's top-2 logit gaps per step, when :meth:`wants_gaps`.
        """
        if self.is_reference(t):
            self.baseline_sha[prompt_digest] = digest
            self.baseline_ids[prompt_digest] = ids
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
            step = first_difference(self.baseline_ids[prompt_digest], ids)
        out: dict[str, Any] = {"tokens_match": False, "first_divergence_step": step}
        ref_gaps = self.baseline_gaps.get(prompt_digest)
        if isinstance(t, ReuseTrial) and ref_gaps is not None and step is not None:
            out["top2_logit_gap"] = ref_gaps[step]
            out["divergence_acceptable"] = bool(t.warm and ref_gaps[step] <= ACCEPTABLE_GAP)
        return out
