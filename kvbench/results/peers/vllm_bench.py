"""``vllm bench serve --save-result`` (with ``--save-detailed``: the per-request lists) read as one
:class:`~kvbench.results.peers.common.PeerRun`.

Read in vLLM 0.32's ``vllm/benchmarks/serve.py`` (``calculate_metrics``): ``ttfts`` and ``latencies`` in seconds
from before the request was sent to the first and the last chunk that carried ``choices``; ``itls`` the gaps
between those chunks; ``tpot`` = (latency − TTFT) ÷ (output tokens − 1), as kvbench's. The file keeps no prompt
and no request id: requests pair with another file's by their index, which is the same request only when both
runs drew the same dataset with the same seed (said in the notes). Aggregates ``median_<m>_ms``... are in ms.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvbench.results.peers.common import Doc, PeerRun, check_requests, requests_frame, scaled, short_label, tpot

TOOL = "vllm bench serve"


def is_vllm_bench(data: Any) -> bool:
    """A parsed document is a ``vllm bench serve`` result."""
    return (isinstance(data, dict) and "backend" in data and "num_prompts" in data
            and ("median_ttft_ms" in data or "latencies" in data or "ttfts" in data))


def read_vllm_bench(path: Path, data: Any) -> PeerRun:
    """The run of the ``vllm bench serve`` result ``data`` (parsed from ``path``).

    Raises:
        kvbench.errors.ResultsError: a key vLLM writes that is missing or of another type, or per-request lists of
            different lengths (naming the file and the key).
    """
    doc = Doc(path, data)
    lists = {k: doc.at(k, optional=True) for k in ("ttfts", "latencies", "input_lens", "output_lens", "itls",
                                                     "start_times", "errors")}
    rows = []
    notes = []
    if lists["ttfts"] is not None and lists["latencies"] is not None:
        ttfts, lats = lists["ttfts"].numbers(), lists["latencies"].numbers()
        n = len(ttfts)
        for k, v in lists.items():
            if v is not None and len(v.items()) != n:
                raise doc._fail(k, f"holds {len(v.items())} values where ttfts holds {n}")
        ins = lists["input_lens"].items() if lists["input_lens"] else [None] * n
        outs = lists["output_lens"].items() if lists["output_lens"] else [None] * n
        itls = lists["itls"].items() if lists["itls"] else [None] * n
        starts = lists["start_times"].numbers() if lists["start_times"] else [None] * n
        errors = lists["errors"].items() if lists["errors"] else [None] * n
        for i in range(n):
            out = outs[i].count() if outs[i] is not None else None
            failed = bool(errors[i] is not None and errors[i].data) or not out
            rows.append({"key": f"#{i}", "prompt_head": None,
                         "prompt_tokens": ins[i].count() if ins[i] is not None else None,
                         "n_output_tokens": out, "ttft_s": ttfts[i], "tpot_s": tpot(lats[i], ttfts[i], out),
                         "ntpot_s": lats[i] / out if out else None, "e2e_s": lats[i],
                         "itl_s": itls[i].numbers() if itls[i] is not None else None, "start_s": starts[i],
                         "cached_prompt_tokens": None, "ok": not failed})
        check_requests(path, rows, "request {i} (ttfts, latencies, itls)")
        notes += ["vLLM's file keeps no prompts: requests are paired by index (the same request only when both "
                  "runs drew the same dataset with the same --seed)",
                  "vLLM's output_lens are its tokenizer's count of the text where the server's usage was not read "
                  "(llama-server's /v1/completions): TPOT divides by that count"]
    else:
        notes.append("no per-request lists (run without --save-detailed): aggregates only")
    aggregates = {}
    for name, metric in (("ttft_s", "ttft"), ("tpot_s", "tpot"), ("itl_s", "itl"), ("e2e_s", "e2el")):
        values = scaled({k: doc.number(f"{key}_{metric}_ms", optional=True, least=0) for k, key in (
            ("p50", "median"), ("mean", "mean"), ("p90", "p90"), ("p99", "p99"))}, 1e-3)
        if values:
            aggregates[name] = values
    conc = doc.count("max_concurrency", optional=True)
    return PeerRun(path=path, tool=TOOL, tool_version=None, label=short_label(path),
                   requests=requests_frame(rows), aggregates=aggregates,
                   output_tokens_per_s=doc.number("output_throughput", optional=True, least=0), concurrency=conc,
                   pairing="request index" if rows else "", notes=notes)


__all__ = ["TOOL", "is_vllm_bench", "read_vllm_bench"]
