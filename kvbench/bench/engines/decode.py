"""The in-process decode loop: left-padding prompts, a device-synchronising clock, prefill then an explicit
greedy decode over a cache object (one forward per token), and releasing device memory between shapes."""

from __future__ import annotations

import gc
import inspect
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch


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
    (see :class:`kvbench.bench.plans.sweep.Recorder`), so the measured trials reuse the blocks their warm-up reserved
    instead of paying ``cudaMalloc`` again."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
