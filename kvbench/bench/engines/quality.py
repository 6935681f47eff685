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
(llama-server's ``n_probs``): :func:`server_quality` compares a reply with ``none``'s on the same prompt by
:func:`topk_kl`, a lower bound of the KL, over the steps whose prefixes are still the same: a lossy preset's reply
(``kl_mean``, ``kl_max``), and a lossless reuse preset's (``floor_kl_mean``, ``floor_kl_max``: the server's cached
and recomputed prompts are not bit-identical, so this is the floor a lossy preset's KL is read against).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kvbench.bench.engines.decode import cache_keyword

__all__ = ["QUALITY_TOP_K", "REST_MIN", "ServerQuality", "agreement", "kl_divergence", "quality_fields",
           "server_quality", "step_logprobs", "topk_kl"]

#: The top-k log-probabilities a server run with a lossy preset asks of every reply (llama.cpp ``n_probs``).
#: llama-server takes any number and returns at most its vocabulary; measured on SmolLM2-135M (16 tokens after a
#: 200-token prompt, one thread): 1,000 cost no time beyond top-8's (1.15 s against 1.17 s a request, within the
#: spread) and 1.5 MB of stream; 10,000 +0.3 s and 15 MB; the whole vocabulary (49,152) +2.7 s and 75 MB, with
#: 4.7 MB lines (docs/engines.md).
QUALITY_TOP_K = 1000
#: Probability mass below which :func:`topk_kl`'s bin of unlisted tokens is float rounding, not measured (the
#: listed probabilities are float32: a sum of a thousand is exact to about 1e-6), and is merged into a listed bin.
REST_MIN = 1e-6


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
    """A lower bound of ``KL(ref ‖ other)`` in nats from two top-k log-probability maps (token id → log p): the
    KL of both distributions coarse-grained to the tokens both maps list (a bin each) plus one bin for every other
    token, whose mass is 1 less the listed ones on either side. Every bin's probability is known, and
    coarse-graining can only lower a KL (the data-processing inequality), so this is never above the full KL.
    Where either side's other-token bin holds less than :data:`REST_MIN` (float rounding: the maps cover the
    distribution), that bin is merged into ``ref``'s most probable listed one (a coarser partition, still a lower
    bound).

    Raises:
        ValueError: an empty map.
    """
    if not ref or not other:
        raise ValueError("top-k KL needs the log-probabilities of both distributions")
    common = sorted(ref.keys() & other.keys(), key=lambda t: -ref[t])
    p = [math.exp(ref[t]) for t in common]
    q = [math.exp(other[t]) for t in common]
    rest_p, rest_q = 1.0 - sum(p), 1.0 - sum(q)
    if rest_p >= REST_MIN and rest_q >= REST_MIN:
        p.append(rest_p)
        q.append(rest_q)
    elif p:
        p[0], q[0] = p[0] + max(rest_p, 0.0), q[0] + max(rest_q, 0.0)
    kl = sum(a * (math.log(a) - math.log(b)) for a, b in zip(p, q) if a > 0)
    return max(0.0, kl)


def server_quality(ref_ids: list[int], ref_top: list[dict[int, float]], ids: list[int],
                   top: list[dict[int, float]]) -> dict[str, Any]:
    """The quality columns of a server reply (``ids``, ``top``: its generated ids and each step's top-k
    log-probabilities) against ``none``'s on the same prompt: ``token_agreement`` and ``agreement_to_divergence``
    as :func:`agreement`; ``kl_mean``, ``kl_max`` of :func:`topk_kl` (lower bounds, nats) over the steps up to and
    including the first differing id (each conditioned on the same prefix; the later ones are not comparable).

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
    its top :data:`QUALITY_TOP_K` log-probabilities (:attr:`request`, ``none``'s included), ``none``'s replies are
    kept by prompt digest, and a lossy preset's reply gets :func:`server_quality` against the one to its prompt;
    a lossless reuse preset's reply gets the same KL as ``floor_kl_mean`` and ``floor_kl_max``."""

    #: What ``kl_method`` says of every KL this class gives.
    METHOD = (f"lower bound from the top-{QUALITY_TOP_K:,} log-probabilities (n_probs), steps up to the first "
              "differing id")

    def __init__(self, lossy_run: bool):
        self.request: dict[str, Any] = {"n_probs": QUALITY_TOP_K} if lossy_run else {}
        self.reference: dict[str, tuple[list[int], list[dict[int, float]]]] = {}

    def fields(self, digest: str, reference: bool, lossy: bool, ids: list[int] | None,
               top: list[dict[int, float]] | None, notes: dict[str, str], floor: bool = False) -> dict[str, Any]:
        """A reply's quality columns (lossy presets; ``floor_kl_*`` for a lossless reuse one; {} otherwise), or a
        note in ``notes`` why there are none.

        Args:
            digest: the prompt's digest. reference: the reply is ``none``'s, not contaminated by a cache.
            lossy: the reply's preset is lossy. ids, top: its generated ids and top-k log-probabilities.
            floor: the reply's preset reuses a cache losslessly (its KL is the floor of the lossy presets').
        """
        if not self.request:
            return {}
        usable = ids is not None and top is not None
        if reference and usable:
            self.reference[digest] = (ids, top)
        if not (lossy or floor):
            return {}
        key = "kl_mean" if lossy else "floor_kl_mean"
        ref = self.reference.get(digest)
        if ref is None or not usable:
            notes[key] = ("no top-k log-probabilities from the server for this reply" if not usable else
                          "no `none` reply to this prompt in this process (a resumed run) to compare with")
            return {}
        got = server_quality(ref[0], ref[1], ids, top)
        if floor and not lossy:
            got = {"floor_kl_mean": got["kl_mean"], "floor_kl_max": got["kl_max"]}
        return {**got, "kl_method": self.METHOD}
