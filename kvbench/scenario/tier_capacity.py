"""Will a tier mode's tier ever be read? The device KV capacity a server configuration's flags give, in tokens,
against the working set its workload revisits, before anything starts.

A host/disk tier (:attr:`kvbench.serving.kind.Preset.tier`) serves a prompt only after the device cache evicted it:
when the workload's working set fits the device cache, the tier is never read and its run answers nothing about
it. The arithmetic, per kind, from the flags the server would get (the engine's, then the mode's; the last wins):

- vLLM: ``--num-gpu-blocks-override`` × ``--block-size`` (default 16 on a GPU, 128 on vLLM's CPU build); else
  ``--kv-cache-memory-bytes`` ÷ KV bytes per token; else, on a GPU, ``--gpu-memory-utilization`` (default 0.9) ×
  the GPU's memory − the weights (an upper bound: vLLM also reserves activation memory), ÷ KV bytes per token.
- SGLang: ``--max-total-tokens``; else ``--mem-fraction-static`` × the GPU's memory − the weights (upper bound).
- llama.cpp: its slots (the load's concurrency level) each hold one conversation or document, at most.

KV bytes per token in the model's dtype (bf16 on a GPU, float32 on a CPU: what kvbench gives vLLM there); with
tensor parallelism (vLLM ``--tensor-parallel-size``, SGLang ``--tp-size``) per GPU: its share of the weights and of
the KV heads. The GPU's memory is NVML's where a GPU answers, else an 80 GiB GPU (an H100), said in the message.
"""

from __future__ import annotations

import functools
from typing import Any

from kvbench.scenario.schema import Scenario
from kvbench.scenario.servers import preset_of
from kvbench.serving import KINDS
from kvbench.serving.kind import GIB, KvSizing, last_value, number

#: The GPU memory assumed where no GPU answers here (bytes): an H100's 80 GiB.
ASSUMED_GPU_BYTES = 80 * GIB
#: Tokens a document-QA request adds to its document (the question and the chat template), at most.
DOC_QA_EXTRA_TOKENS = 256


def working_set(s: Scenario) -> tuple[int, int, int, str] | None:
    """``(units, least tokens, most tokens, what)`` of a reuse workload: the conversations (documents, prefixes)
    it revisits and the bounds of the distinct prompt tokens they hold, from the workload's keys (a conversation's
    last turn has ``min_prompt_tokens`` to ``max_prompt_tokens``; a document ``doc_tokens`` plus a question); None
    for a workload that revisits nothing."""
    w = s.workload
    if w.multi_turn is not None:
        mt = w.multi_turn
        most = mt.max_prompt_tokens or mt.min_prompt_tokens * 4
        return mt.conversations, mt.conversations * mt.min_prompt_tokens, mt.conversations * most, "conversations"
    if w.doc_qa is not None:
        d = w.doc_qa
        return d.documents, d.documents * d.doc_tokens, d.documents * (d.doc_tokens + DOC_QA_EXTRA_TOKENS), \
            "documents"
    if w.shared_prefix is not None:
        sp = w.shared_prefix
        n = max(sp.working_set)
        longest = max(sp.prompt_tokens) * max(sp.shared_pct) // 100
        return n, n * min(sp.prompt_tokens) * min(sp.shared_pct) // 100, n * longest, "shared prefixes"
    if w.trace is not None:
        from kvbench.errors import UserError
        from kvbench.scenario.trace_checks import trace_shape

        try:
            shape = trace_shape(w.trace)
        except UserError:  # said by check_scenario
            return None
        return shape.distinct_blocks, shape.working_set_tokens, shape.working_set_tokens, "distinct trace blocks"
    return None


@functools.lru_cache(maxsize=1)
def _gpu_bytes() -> tuple[int, str]:
    """The GPU's memory in bytes and how it is known: NVML's first GPU, else :data:`ASSUMED_GPU_BYTES` (asked once
    per process, not once per mode)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            total = int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total)
        finally:
            pynvml.nvmlShutdown()
        return total, f"this machine's {total / GIB:.0f} GiB GPU"
    except Exception:  # no NVML, no GPU, no driver: nothing to read here
        return ASSUMED_GPU_BYTES, "an 80 GiB GPU (an H100; no GPU answers here)"


#: Bytes per KV element by the value of ``--kv-cache-dtype`` (a prefix) or ``--dtype`` (vLLM's and SGLang's names).
_DTYPE_BYTES = (("fp8", 1), ("float32", 4), ("float", 4), ("float16", 2), ("half", 2), ("bfloat16", 2), ("fp4", 0.5))


def _element_bytes(argv: list[str], default: float) -> float:
    """Bytes per KV element a server started with ``argv`` stores: ``--kv-cache-dtype`` (``fp8*``: 1), else
    ``--dtype`` (``float32``: 4; ``float16``, ``bfloat16``: 2), else ``default`` (the model's dtype on the device)."""
    for flag in ("--kv-cache-dtype", "--dtype"):
        value = (last_value(argv, (flag,)) or "").lower()
        for name, size in _DTYPE_BYTES:
            if value == name or (flag == "--kv-cache-dtype" and value.startswith(name)):
                return size
    return default


def device_tokens(s: Scenario, mode: Any, arch: Any) -> tuple[float | None, str] | None:
    """``(tokens, arithmetic)``: the KV tokens the server of ``mode`` keeps on its device as its flags say (the
    kind's :attr:`~kvbench.serving.kind.ServerKind.device_cache_from_flags`; see the module docstring), and how
    that figure was reached; ``(None, why)`` for a value the server would refuse; None where the flags do not
    tell."""
    kind = KINDS[s.engine.kind]
    if kind.device_cache_from_flags is None:
        return None
    preset = preset_of(s.engine.kind, mode)
    argv = [*s.engine.args, *preset.args, *mode.args]
    gpu = s.device.startswith("cuda")
    elem = _element_bytes(argv, 2 if gpu else 4)
    given = number(last_value(argv, kind.tp_flags)) if kind.tp_flags else None
    tp = int(given) if given is not None and given >= 1 and given == int(given) else 1
    try:  # the weights in the model's dtype (a KV-only fp8 leaves them as they are)
        weights: float | None = arch.parameters * _element_bytes(
            [a for a in argv if not a.startswith("--kv-cache-dtype")], 2 if gpu else 4) / tp
    except ValueError:  # a config without the sizes the count needs (a GGUF's): an upper bound all the same
        weights = None
    # each GPU holds its share of the KV heads (all of them replicated where there are fewer heads than GPUs)
    per_token = int(arch.kv_bytes(1, 4) * elem / 4) // min(tp, max(1, arch.kv_heads))
    found = kind.device_cache_from_flags(argv, KvSizing(gpu, per_token, weights, _gpu_bytes() if gpu else (0, "")))
    if found is None or found[0] is None or tp == 1:
        return found
    return found[0], f"{found[1]}; per GPU of {tp} ({kind.tp_flags[0]} {tp}: weights and KV heads split)"


def tier_capacity_warnings(s: Scenario, arch: Any) -> list[tuple[str, str]]:
    """``(key path, message)`` for each tier mode of a server scenario whose workload's working set fits the
    device cache (:func:`device_tokens`; a kind whose slots hold one conversation each: no more of them than
    slots), so that its tier would never be read, with the arithmetic and what to change."""
    kind = KINDS.get(s.engine.kind)
    ws = working_set(s) if kind is not None else None
    out: list[tuple[str, str]] = []
    if ws is None:
        return out
    units, least, most, what = ws
    for i, m in enumerate(s.modes):
        tier = preset_of(s.engine.kind, m).tier
        if tier is None:
            continue
        one = {"conversations": "conversation", "documents": "document", "shared prefixes": "shared prefix"}
        have = f"the working set ({units} {one[what] if units == 1 else what}, {least:,}–{most:,} tokens)"
        if kind.slot_per_unit:
            slots = max(s.load_spec.levels)
            if units <= slots:
                out.append((f"modes[{i}]", f"{m.name}: {have} fits {slots} slot{'s' if slots > 1 else ''} (one "
                            f"conversation or document each, at concurrency {slots}): there its {tier} tier is "
                            f"never read; use more {what} than slots (load.concurrency)"))
            continue
        cap = device_tokens(s, m, arch)
        if cap is not None and cap[0] is None:
            out.append((f"modes[{i}]", f"{m.name}: {cap[1]}: the server would refuse it, and the device cache "
                                       "cannot be sized against the working set"))
            continue
        if cap is None or most > cap[0]:
            continue
        out.append((f"modes[{i}]", f"{m.name}: {have} fits the device cache ({cap[0]:,.0f} tokens: {cap[1]}; "
                    f"{cap[0] / most:,.1f} times the working set at most): the server never evicts, so its {tier} "
                    "tier is never read; make "
                    f"the device cache smaller than the working set ({kind.device_cache_hint}) or the working set "
                    f"larger"))
    return out


__all__ = ["ASSUMED_GPU_BYTES", "device_tokens", "tier_capacity_warnings", "working_set"]
