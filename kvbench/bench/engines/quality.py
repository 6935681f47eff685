"""What a lossy mode (a host format that rounds K or V: int8, fp8, a narrower float, a Hadamard rotation) costs in
quality against ``none``, measured after the trial and outside its clock:

- **agreement** of the trial's greedy ids with ``none``'s on the same prompts: ``token_agreement``, the share of
  (sequence, step) ids equal to ``none``'s; ``agreement_to_divergence``, the mean over sequences of the share of
  steps before its first differing id (1.0 when it never differs);
- **KL divergence** of the next-token distributions, ``KL(none ‖ mode) = Σ_v p_none(v) (log p_none(v) − log
  p_mode(v))`` in nats, **teacher-forced**: the mode's cache is fed ``none``'s ids, so that one early divergence
  does not make every later distribution differ (as in llama.cpp's ``perplexity --kl-divergence``):
  ``kl_mean`` over steps and sequences, ``kl_max`` the largest.

``none``'s ids and distributions come from a free-running greedy pass with transformers' ``DynamicCache`` on the
same prompts (greedy decoding is deterministic, so its ids are the reference trial's).
"""

from __future__ import annotations

from typing import Any

import torch

from kvbench.bench.engines.decode import cache_keyword

__all__ = ["agreement", "kl_divergence", "quality_fields", "step_logprobs"]


@torch.inference_mode()
def step_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, cache: Any, steps: int,
                  forced: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill, then ``steps`` next-token distributions: each step feeds ``forced[:, step]`` (teacher forcing) or,
    without ``forced``, the greedy id (the argmax), as :func:`~kvbench.bench.engines.decode.greedy_decode` does.

    Args:
        input_ids, attention_mask: ``[batch, prompt_len]``, left-padded, on the model's device.
        forced: ``[batch, steps]`` ids to feed, or None.

    Returns:
        ``(ids [batch, steps], log-probabilities [batch, steps, vocab] float32 on the CPU)``: the greedy id at each
        step (the argmax of its distribution) and the distribution.
    """
    kw = cache_keyword(model)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True,
                   logits_to_keep=1, **{kw: cache}).logits
    ids, logps = [], []
    for step in range(steps):
        last = logits[:, -1, :].float()
        ids.append(last.argmax(-1))
        logps.append(torch.log_softmax(last, dim=-1).cpu())
        if step + 1 == steps:
            break
        feed = ids[-1] if forced is None else forced[:, step].to(last.device)
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((attention_mask.shape[0], 1))], dim=-1)
        position_ids = position_ids[:, -1:] + 1
        logits = model(input_ids=feed[:, None], attention_mask=attention_mask, position_ids=position_ids,
                       use_cache=True, logits_to_keep=1, **{kw: cache}).logits
    return torch.stack(ids, 1).cpu(), torch.stack(logps, 1)


def kl_divergence(ref_logp: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """``KL(ref ‖ other)`` in nats per position: ``Σ_v exp(ref) (ref − other)`` over the last axis of two
    log-probability tensors of the same shape (``[..., vocab]``); a token ``other`` gives probability 0 where ``ref``
    gives more makes it infinite."""
    p = ref_logp.exp()
    return (p * (ref_logp - logp)).where(p > 0, torch.zeros((), dtype=p.dtype)).sum(-1)


def agreement(ref_ids: list[list[int]], ids: list[list[int]]) -> tuple[float, float]:
    """(share of positions whose ids equal ``ref_ids``', mean over sequences of the share of steps before the first
    differing id), both ``[batch][steps]``."""
    equal = [[a == b for a, b in zip(r, x)] for r, x in zip(ref_ids, ids)]
    positions = sum(len(e) for e in equal)
    until = [next((i for i, same in enumerate(e) if not same), len(e)) / len(e) for e in equal if e]
    return sum(map(sum, equal)) / positions, sum(until) / len(until)


def quality_fields(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, ids: list[list[int]],
                   make_cache: Any, reference_cache: Any) -> dict[str, Any]:
    """The quality columns of a lossy trial whose greedy ids were ``ids`` (``[batch][steps]``): ``none``'s pass on
    ``reference_cache`` (a fresh ``DynamicCache``), then the mode's teacher-forced pass on ``make_cache()`` (a fresh
    cache of the mode, closed afterwards): ``token_agreement``, ``agreement_to_divergence``, ``kl_mean``,
    ``kl_max``."""
    steps = len(ids[0])
    ref_ids, ref_logp = step_logprobs(model, input_ids, attention_mask, reference_cache, steps)
    cache = make_cache()
    try:
        _, logp = step_logprobs(model, input_ids, attention_mask, cache, steps, forced=ref_ids)
    finally:
        close = getattr(cache, "close", None)
        if close is not None:
            close()
    kl = kl_divergence(ref_logp, logp).clamp(min=0)  # float rounding can make a near-zero KL negative
    agree, until = agreement(ref_ids.tolist(), ids)
    return {"token_agreement": agree, "agreement_to_divergence": until, "kl_mean": float(kl.mean()),
            "kl_max": float(kl.max())}
