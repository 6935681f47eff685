"""What a valid scenario will run, in one line: the trials of its sweep, or the shape of its search or reuse
workload (what ``kvbench validate`` says of a file that is ok)."""

from __future__ import annotations

from pathlib import Path

from kvbench.errors import UserError
from kvbench.scenario.schema import Scenario
from kvbench.scenario.trace_checks import trace_shape
from kvbench.scenario.workload import extra_documents


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _reuse_shape(s: Scenario) -> tuple[str, int]:
    """(``multi_turn: 3 conversations × 4 turns``, ``doc_qa: 3 documents × 4 questions ...``, ``shared_prefix:
    6 cells ...`` or ``trace: 64 requests of ...``, requests)."""
    mt, dq, sp = s.workload.multi_turn, s.workload.doc_qa, s.workload.shared_prefix
    if sp is not None:
        return (f"shared_prefix: {_count(len(sp.cells), 'cell')} ({_count(len(sp.prompt_tokens), 'prompt length')} × "
                f"{len(sp.shared_pct)} prefix shares × {_count(len(sp.working_set), 'working set')} of "
                f"{', '.join(map(str, sp.working_set))} prefixes) × {_count(sp.visits, 'visit')} per prefix",
                sp.requests)
    if mt is not None:
        return (f"multi_turn: {_count(mt.conversations, 'conversation')} × {_count(mt.turns, 'turn')}",
                mt.conversations * mt.turns)
    if s.workload.trace is not None:
        tr = s.workload.trace
        try:
            shape = trace_shape(tr)
            n, span = shape.requests, f" arriving over {shape.span_s:,.1f} s"
        except UserError:  # said by check_scenario
            n, span = tr.max_requests, ""
        return (f"trace: {_count(n, 'request')} of {Path(tr.path).name}{span}, {tr.block_tokens} tokens per block",
                n)
    extra = extra_documents(dq.documents, dq.questions, dq.ratio)
    more = f" + {_count(extra, 'single-question document')} for hit:miss {dq.hit_miss_ratio}" if extra else ""
    return (f"doc_qa: {_count(dq.documents, 'document')} × {_count(dq.questions, 'question')}{more}",
            dq.documents * dq.questions + extra)


def sweep_summary(s: Scenario) -> str:
    """The trials ``s`` plans, e.g. ``12 trials: 2 prompt lengths × 1 batch size × 2 modes × 3 repeats``; for a
    capacity search the searched field, its bound and what it varies, for a reuse workload its requests; then,
    for the Ray executor, ``; on Ray`` and the placement kinds (each runs every trial)."""
    what = _what(s)
    if s.executor.kind == "local":
        return what
    kinds = s.machines
    if len(kinds) > 1:  # every trial once per kind (a capacity search and a server engine take one kind)
        n, _, rest = what.partition(" trials: ")
        return (f"{int(n) * len(kinds)} trials: {rest} × {len(kinds)} machine kinds ({', '.join(kinds)}); on Ray"
                if rest else f"{what}; on Ray, on each of {', '.join(kinds)}")
    return f"{what}; on Ray" + (f", on {kinds[0]}" if kinds else "")


def _what(s: Scenario) -> str:
    if s.searched is not None:
        cap = s.capacity
        fixed = s.prompt_tokens if s.searched == "batch_size" else s.batch_sizes
        noun = "prompt length" if s.searched == "batch_size" else "batch size"
        limit = cap.max if cap and cap.max else (s.largest_batch if s.searched == "batch_size"
                                                 else "the model's longest prompt")
        return (f"capacity search of {s.searched} up to {limit}: {_count(len(fixed), noun)} × "
                f"{_count(len(s.modes), 'mode')}; trials are decided as it runs")
    if s.run_kind == "server":
        if s.workload.reuse:
            shape, requests = _reuse_shape(s)
            shape += f" = {_count(requests, 'request')}"
        else:
            requests = len(s.prompt_tokens) * s.workload.n_prompts
            shape = (f"{_count(len(s.prompt_tokens), 'prompt length')} × {_count(s.workload.n_prompts, 'prompt')} = "
                     f"{_count(requests, 'request')}")
        if s.load_spec.n_requests is not None and s.load_spec.n_requests < requests:
            requests = s.load_spec.n_requests
            shape += f", the first {requests} sent"
        load = s.load_spec
        levels = load.levels
        how = ("one at a time" if load.profile == "sequential" else f"Poisson at {load.rate:g}/s"
               if load.profile == "poisson" else "concurrency " + ", ".join(map(str, levels)))
        per = f" × {_count(len(levels), 'concurrency level')}" if len(levels) > 1 else ""
        from kvbench.serving import KINDS

        own = sorted({m.url for m in s.modes if getattr(m, "url", None) and m.url != s.engine.url})
        per_run = ("one server start per mode, level and repeat" if KINDS[s.engine.kind].started else
                   f"the running server at {s.engine.url} serves every mode, level and repeat (kvbench starts "
                   "nothing)" if not own else
                   f"the running servers at {', '.join([s.engine.url, *own])} serve their modes (kvbench starts "
                   "nothing)")
        return (f"{requests * len(s.modes) * s.repeats * len(levels)} requests on {s.engine.kind}: {shape} × "
                f"{_count(len(s.modes), 'mode')}{per} × {_count(s.repeats, 'repeat')}, {how}; {per_run}")
    if s.workload.reuse:
        shape, requests = _reuse_shape(s)
        n = requests * len(s.modes) * 2 * s.repeats
        return (f"{n} trials: {shape} = {_count(requests, 'request')} × {_count(len(s.modes), 'mode')} × cold and "
                f"warm × {_count(s.repeats, 'repeat')}; prompts are built from the data as it runs")
    n = len(s.prompt_tokens) * len(s.batch_sizes) * len(s.modes) * s.repeats
    return (f"{n} trials: {_count(len(s.prompt_tokens), 'prompt length')} × "
            f"{_count(len(s.batch_sizes), 'batch size')} × {_count(len(s.modes), 'mode')} × "
            f"{_count(s.repeats, 'repeat')}")
