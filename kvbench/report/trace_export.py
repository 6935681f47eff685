"""``kvbench trace export``: a run's requests as a trace, so that a recorded workload feeds the simulator (and
every replay tool that reads Mooncake's format).

The prompts are rebuilt from the run's own scenario (its workload is deterministic: the same data, seed and
tokenizer give the same token ids) and each is checked against the digest the run recorded for it
(``prompt_sha256``): a prompt that differs (another dataset version or tokenizer) stops the export rather than
give a trace of requests that were never sent. Each prompt is cut into blocks of ``block_tokens`` tokens, the last
one partial, and each block gets the id of its tokens *and everything before them* (a chained hash, numbered in
order of first appearance), as in Mooncake's traces. Times are the requests' arrivals in the load (``arrival_s``,
a server run) or their order (in-process runs: one request a millisecond).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kvbench.errors import BadParameter, ResultsError
from kvbench.results.load import load_results
from kvbench.results.rows import ids_digest
from kvbench.scenario.load import parse_scenario
from kvbench.traces.trace import Trace


def _rows(run: str | Path, mode: str | None, repeat: int) -> tuple[pd.DataFrame, dict[str, object]]:
    res = load_results(run)
    scenario = res.runs[0].get("scenario") if res.runs else None
    rows = res.trials
    if not isinstance(scenario, dict) or "request_id" not in rows or rows["request_id"].isna().all():
        raise ResultsError(f"{run}: no requests to export: only a run of a request stream (a reuse workload, a "
                           "trace replay or a server run) holds requests")
    labels = list(dict.fromkeys(rows["mode_label"].astype(str)))
    label = mode if mode is not None else labels[0]
    if label not in labels:
        raise BadParameter(f"{{mode}} {label!r} is not a mode of {run}: {', '.join(labels)}", "mode")
    part = rows[(rows["mode_label"].astype(str) == label) & (rows["repeat"] == repeat)]
    part = part.dropna(subset=["request_id"]).drop_duplicates("request_id")  # in-process: a cold and a warm row
    if part.empty:
        raise BadParameter(f"{{repeat}} {repeat}: no request of mode {label} in {run} at that repeat", "repeat")
    if "arrival_s" in part and part["arrival_s"].notna().all():
        part = part.sort_values("arrival_s", kind="stable")
    return part, scenario


def export_trace(run: str | Path, block_tokens: int = 16, mode: str | None = None, repeat: int = 0,
                 trust_remote_code: bool = False) -> Trace:
    """The requests mode ``mode`` (default: the run's first) sent in repeat ``repeat`` of ``run``, as a trace of
    ``block_tokens``-token blocks (the module's docstring).

    Raises:
        kvbench.errors.ResultsError: not a run of a request stream, or a rebuilt prompt whose digest differs from
            the one the run recorded.
        kvbench.errors.BadParameter: an unknown ``mode``, a ``repeat`` with no request, ``block_tokens`` below 1,
            or a model whose code would run without ``trust_remote_code``.
        kvbench.errors.ModelNotFound: the run's tokenizer is not on this machine.
    """
    from kvbench.models import read_architecture
    from kvbench.models.load import load_tokenizer
    from kvbench.workloads import scenario_stream

    if type(block_tokens) is not int or block_tokens < 1:
        raise BadParameter(f"{{block_tokens}} must be a whole number of at least 1, not {block_tokens!r}",
                           "block_tokens")
    part, raw = _rows(run, mode, repeat)
    s = parse_scenario(raw, Path(run) / "run.json")
    if s.model.trust_remote_code and not trust_remote_code:
        raise BadParameter(f"{run}: its model's tokenizer runs code from the model's files: pass "
                           "{trust_remote_code} to rebuild its prompts", "trust_remote_code")
    arch = read_architecture(s.model)
    tokenizer = load_tokenizer(s.model.tokenizer or s.model.name, s.model.trust_remote_code)
    longest = arch.max_positions - s.max_new_tokens
    stream = scenario_stream(s, tokenizer, arch.vocab_size, longest)
    return requests_trace(part, {q.id: q.ids for q in stream.requests}, block_tokens, s.max_new_tokens,
                          f"{Path(run).name} ({part['mode_label'].iloc[0]}, repeat {repeat})")


def requests_trace(rows: pd.DataFrame, prompts: dict[str, tuple[int, ...]], block_tokens: int, max_new_tokens: int,
                   source: str) -> Trace:
    """``rows`` (in the order the requests arrived: ``request_id``, ``prompt_sha256``, ``arrival_s`` where known,
    ``n_output_tokens``) as a trace of ``block_tokens``-token blocks, each request's prompt taken from ``prompts``
    (request id → token ids) and checked against its row's digest.

    Raises:
        kvbench.errors.ResultsError: a request whose prompt is missing or whose digest differs from its row's.
    """
    chain: dict[tuple[int, tuple[int, ...]], int] = {}
    counts, ids, inputs, outputs, times = [], [], [], [], []
    for k, r in enumerate(rows.to_dict("records")):
        prompt = prompts.get(str(r["request_id"]))
        if prompt is None or ids_digest([list(prompt)]) != r.get("prompt_sha256"):
            raise ResultsError(f"{source}: request {r['request_id']}: the prompt rebuilt from the run's scenario is "
                               "not the one it sent (its digest differs: another dataset or tokenizer here)")
        parent = -1
        for start in range(0, len(prompt), block_tokens):
            parent = chain.setdefault((parent, prompt[start:start + block_tokens]), len(chain))
            ids.append(parent)
        counts.append(-(-len(prompt) // block_tokens))
        inputs.append(len(prompt))
        n_out = r.get("n_output_tokens")
        outputs.append(int(n_out) if n_out == n_out and n_out is not None else max_new_tokens)
        arrival = r.get("arrival_s")
        times.append(float(arrival) if arrival == arrival and arrival is not None else k / 1000)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    arrival_s = np.asarray(times, dtype=np.float64)
    return Trace(source, "mooncake", block_tokens, arrival_s - arrival_s.min(), np.asarray(inputs, dtype=np.int64),
                 np.asarray(outputs, dtype=np.int64), offsets, np.asarray(ids, dtype=np.int64),
                 np.arange(len(counts), dtype=np.int64))
