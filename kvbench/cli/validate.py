"""``kvbench validate``: check scenario files without running them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from kvbench.cli.common import _count, _print_warnings, err, out


def _reuse_shape(s: Any) -> tuple[str, int]:
    """(``multi_turn: 3 conversations × 4 turns`` or ``doc_qa: 3 documents × 4 questions ...``, requests)."""
    from kvbench.workloads.sessions import extra_documents

    mt, dq = s.workload.multi_turn, s.workload.doc_qa
    if mt is not None:
        return (f"multi_turn: {_count(mt.conversations, 'conversation')} × {_count(mt.turns, 'turn')}",
                mt.conversations * mt.turns)
    extra = extra_documents(dq.documents, dq.questions, dq.ratio)
    more = f" + {_count(extra, 'single-question document')} for hit:miss {dq.hit_miss_ratio}" if extra else ""
    return (f"doc_qa: {_count(dq.documents, 'document')} × {_count(dq.questions, 'question')}{more}",
            dq.documents * dq.questions + extra)


def validate(files: list[Path] = typer.Argument(..., help="Scenario YAML files.")) -> None:
    """Check scenario files without loading any model weights (reads the model's config for its context limit);
    warn about configurations that run but mislead. Exit 2 when a file is invalid (each is reported), as `run`."""
    from kvbench.scenario import ScenarioError, load_scenario

    bad = 0
    for f in files:
        try:
            s = load_scenario(f)
        except ScenarioError as exc:
            bad += 1
            err.print(str(exc), highlight=False, markup=False)
        else:
            _print_warnings(f, s)
            if s.searched is not None:
                cap = s.capacity
                fixed = s.prompt_tokens if s.searched == "batch_size" else s.batch_sizes
                noun = "prompt length" if s.searched == "batch_size" else "batch size"
                limit = cap.max if cap and cap.max else (s.largest_batch if s.searched == "batch_size"
                                                         else "the model's longest prompt")
                out.print(f"{f}: ok (capacity search of {s.searched} up to {limit}: {_count(len(fixed), noun)} × "
                          f"{_count(len(s.modes), 'mode')}; trials are decided as it runs)",
                          highlight=False, markup=False)
                continue
            if s.workload.reuse:
                shape, requests = _reuse_shape(s)
                n = requests * len(s.modes) * 2 * s.repeats
                out.print(f"{f}: ok ({n} trials: {shape} = {_count(requests, 'request')} × "
                          f"{_count(len(s.modes), 'mode')} × cold and warm × {_count(s.repeats, 'repeat')}; prompts "
                          "are built from the data as it runs)", highlight=False, markup=False)
                continue
            n = len(s.prompt_tokens) * len(s.batch_sizes) * len(s.modes) * s.repeats
            out.print(f"{f}: ok ({n} trials: {_count(len(s.prompt_tokens), 'prompt length')} × "
                      f"{_count(len(s.batch_sizes), 'batch size')} × {_count(len(s.modes), 'mode')} × "
                      f"{_count(s.repeats, 'repeat')})", highlight=False, markup=False)
    if bad:
        raise typer.Exit(2)  # bad input, as `run` says of the same file
