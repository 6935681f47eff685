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

A server cannot be teacher-forced through its completion API and gives only its top-k log-probabilities
(llama-server's ``n_probs``): :func:`server_quality` compares a lossy preset's reply with ``none``'s on the same
prompt by :func:`topk_kl`, over the steps whose prefixes are still the same.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kvbench.bench.engines.decode import cache_keyword

__all__ = ["QUALITY_TOP_K", "ServerQuality", "agreement", "kl_divergence", "quality_fields", "server_quality",
           "step_logprobs", "topk_kl"]

#: The top-k log-probabilities a server run with a lossy preset asks of every reply (llama.cpp ``n_probs``).
QUALITY_TOP_K = 8


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
                   make_cache: Any, reference: tuple[torch.Tensor, torch.Tensor]) -> dict[str, Any]:
    """The quality columns of a lossy trial whose greedy ids were ``ids`` (``[batch][steps]``): the mode's
    teacher-forced pass on ``make_cache()`` (a fresh cache of the mode, closed afterwards) against ``reference``,
    ``none``'s free pass on the same prompts (:func:`step_logprobs` on a fresh ``DynamicCache``, as many steps):
    ``token_agreement``, ``agreement_to_divergence``, ``kl_mean``, ``kl_max``."""
    steps = len(ids[0])
    ref_ids, ref_logp = reference
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


def topk_kl(ref: dict[int, float], other: dict[int, float]) -> float:
    """Approximate ``KL(ref ‖ other)`` in nats from two top-k log-probability maps (token id → log p): the KL of
    both distributions coarse-grained to ``ref``'s top-k tokens plus one bin for every other token. A token of
    ``ref``'s top-k missing from ``other``'s is given ``other``'s smallest listed probability (its own is at most
    that). Coarse-graining can only lower a KL (the data-processing inequality), so with ``other``'s
    probabilities known this is a lower bound of the full KL; the stand-in for a missing token makes it an
    estimate.

    Raises:
        ValueError: an empty map.
    """
    if not ref or not other:
        raise ValueError("top-k KL needs the log-probabilities of both distributions")
    floor = min(other.values())
    p = {t: math.exp(lp) for t, lp in ref.items()}
    q = {t: math.exp(other.get(t, floor)) for t in ref}
    kl = sum(p[t] * (math.log(p[t]) - math.log(q[t])) for t in ref if p[t] > 0)
    rest_p, rest_q = max(0.0, 1.0 - sum(p.values())), max(0.0, 1.0 - sum(q.values()))
    if rest_p > 0:
        kl += rest_p * (math.log(rest_p) - math.log(rest_q)) if rest_q > 0 else math.inf
    return max(0.0, kl)


def server_quality(ref_ids: list[int], ref_top: list[dict[int, float]], ids: list[int],
                   top: list[dict[int, float]]) -> dict[str, Any]:
    """The quality columns of a server reply (``ids``, ``top``: its generated ids and each step's top-k
    log-probabilities) against ``none``'s on the same prompt: ``token_agreement`` and ``agreement_to_divergence``
    as :func:`agreement`; ``kl_mean``, ``kl_max`` of :func:`topk_kl` over the steps up to and including the first
    differing id (each conditioned on the same prefix; the later ones are not comparable).

    Raises:
        ValueError: replies of other lengths.
    """
    if not (len(ref_ids) == len(ref_top) == len(ids) == len(top)):
        raise ValueError(f"replies of {len(ref_ids)} and {len(ids)} ids with {len(ref_top)} and {len(top)} "
                         "distributions cannot be compared")
    agree, until = agreement([ref_ids], [ids])
    same = next((i for i, (a, b) in enumerate(zip(ref_ids, ids)) if a != b), len(ids) - 1)
    kl = [topk_kl(r, o) for r, o in zip(ref_top[:same + 1], top[:same + 1])]
    return {"token_agreement": agree, "agreement_to_divergence": until, "kl_mean": sum(kl) / len(kl) if kl else None,
            "kl_max": max(kl) if kl else None}


class ServerQuality:
    """The quality of a server run's lossy presets: with one in the run (``lossy_run``), every request asks for
    its top-k log-probabilities (:attr:`request`, ``none``'s included), ``none``'s replies are kept by prompt
    digest, and a lossy preset's reply gets :func:`server_quality` against the one to its prompt."""

    def __init__(self, lossy_run: bool):
        self.request: dict[str, Any] = {"n_probs": QUALITY_TOP_K} if lossy_run else {}
        self.reference: dict[str, tuple[list[int], list[dict[int, float]]]] = {}

    def fields(self, digest: str, reference: bool, lossy: bool, ids: list[int] | None,
               top: list[dict[int, float]] | None, notes: dict[str, str]) -> dict[str, Any]:
        """A reply's quality columns (lossy presets only; {} otherwise), or a note in ``notes`` why there are none.

        Args:
            digest: the prompt's digest. reference: the reply is ``none``'s, not contaminated by a cache.
            lossy: the reply's preset is lossy. ids, top: its generated ids and top-k log-probabilities.
        """
        if not self.request:
            return {}
        usable = ids is not None and top is not None
        if reference and usable:
            self.reference[digest] = (ids, top)
        if not lossy:
            return {}
        ref = self.reference.get(digest)
        if ref is None or not usable:
            notes["kl_mean"] = ("no top-k log-probabilities from the server for this reply" if not usable else
                                "no `none` reply to this prompt in this process (a resumed run) to compare with")
            return {}
        return {**server_quality(ref[0], ref[1], ids, top),
                "kl_method": f"top-{QUALITY_TOP_K} (n_probs), steps up to the first differing id"}
