"""A trace written as a file: Mooncake's JSONL (``timestamp`` in whole milliseconds, ``input_length``,
``output_length``, ``hash_ids``), the format every replay tool of the field reads, so that a trace kvbench made
(``kvbench trace synthesize``) feeds ``kvbench simulate``, AIPerf, GuideLLM or vLLM's benchmark alike."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson

from kvbench.errors import UnwritableOutput, UserError
from kvbench.report.cost import replacing
from kvbench.results.run_dir import refuse_symlink_dir
from kvbench.traces.trace import Trace


def write_trace(trace: Trace, path: str | Path) -> Path:
    """``trace`` as Mooncake JSONL at ``path`` (its folder created), written beside it and moved onto it (a
    symbolic link at ``path`` is replaced, never written through); returns ``path``. Arrival times are rounded to
    whole milliseconds; the block size is not in the format (say it when the file is read: ``--block-tokens``).

    Raises:
        kvbench.errors.SymlinkRefused: the folder is a symbolic link.
        kvbench.errors.UnwritableOutput: the file cannot be written.
    """
    path = Path(path)
    refuse_symlink_dir(path.parent)
    ms = np.rint(trace.arrival_s * 1000).astype(np.int64).tolist()
    inputs, outputs = trace.input_tokens.tolist(), trace.output_tokens.tolist()
    offsets, ids = trace.offsets.tolist(), trace.block_ids

    def write(tmp: Path) -> Path:
        with open(tmp, "wb") as f:
            for i in range(trace.n_requests):
                f.write(orjson.dumps({"timestamp": ms[i], "input_length": inputs[i], "output_length": outputs[i],
                                      "hash_ids": ids[offsets[i]:offsets[i + 1]]},
                                     option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE))
        return tmp

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        written = replacing(path, write)
    except OSError as exc:
        if isinstance(exc, UserError):
            raise
        raise UnwritableOutput(exc.filename or path, exc.strerror or str(exc)) from exc
    return written or path


def trace_lines(trace: Trace) -> list[str]:
    """What a trace holds, in a few lines: its requests, span, lengths, blocks and notes."""
    span = float(trace.arrival_s[-1]) if trace.n_requests else 0.0
    distinct = len(np.unique(trace.block_ids))
    rate = f" ({trace.n_requests / span:,.2f} per s)" if span else ""
    lines = [f"{trace.source}: {trace.format}, {trace.block_tokens} tokens per block",
             f"{trace.n_requests:,} request{'s' if trace.n_requests != 1 else ''} over {span:,.1f} s{rate}",
             f"prompt tokens: mean {trace.input_tokens.mean():,.0f}, max {trace.input_tokens.max():,}; output tokens: "
             f"mean {trace.output_tokens.mean():,.0f}, max {trace.output_tokens.max():,}",
             f"{trace.n_visits:,} block visits, {distinct:,} distinct blocks ({distinct * trace.block_tokens:,} "
             "tokens of KV if all were kept)"]
    return lines + [f"note: {n}" for n in trace.notes]
