"""The sizes ``kvbench plan`` prices a model by, from its config.json alone: parameters (all of them, and those one
token passes through), KV bytes per token and attention FLOPs, for dense models, mixtures of experts (Mixtral's
``num_local_experts``, DeepSeek's ``n_routed_experts``) and multi-head latent attention (DeepSeek-V2/V3's
``kv_lora_rank``). A config with expert or latent fields of a kind counted here in part, or of another kind, is
refused naming the field: a count that silently ignores them is the 7.24 B a dense count gives Mixtral-8x7B.

Formulas (elements; bytes = elements × dtype bytes):

- Attention per layer, grouped-query (Llama; GQA: J. Ainslie et al., "GQA", EMNLP 2023): q and o projections
  hidden × heads × head_dim each, k and v hidden × kv_heads × head_dim each (+ their biases in Qwen2 or with
  ``attention_bias``). KV per token and layer = 2 × kv_heads × head_dim (K and V).
- Attention per layer, multi-head latent (DeepSeek-AI, "DeepSeek-V2", 2024, §2.1.2-2.1.3, and transformers'
  ``DeepseekV3Attention``): q = hidden × q_lora_rank + q_lora_rank (its norm) + q_lora_rank × heads ×
  (qk_nope_head_dim + qk_rope_head_dim), or hidden × heads × (qk_nope_head_dim + qk_rope_head_dim) without
  ``q_lora_rank``; kv = hidden × (kv_lora_rank + qk_rope_head_dim) + kv_lora_rank (its norm) + kv_lora_rank ×
  heads × (qk_nope_head_dim + v_head_dim); o = heads × v_head_dim × hidden. The cache holds the compressed latent
  and the shared rope key: KV per token and layer = kv_lora_rank + qk_rope_head_dim (one vector, no separate V:
  61 × 576 × 2 = 70,272 bytes per token for DeepSeek-V3 in bf16, as vLLM's and SGLang's MLA caches hold it).
- MLP per layer: a gated MLP (gate, up, down) = 3 × hidden × intermediate. A mixture-of-experts layer (Mixtral:
  A. Q. Jiang et al., "Mixtral of Experts", 2024; DeepSeekMoE: D. Dai et al., 2024) holds ``experts`` routed
  experts and ``n_shared_experts`` shared ones, each a gated MLP of its intermediate size (Mixtral's
  ``intermediate_size``, DeepSeek's ``moe_intermediate_size``), and a router of hidden × experts; a token passes
  through ``num_experts_per_tok`` routed experts and every shared one. DeepSeek's first ``first_k_dense_replace``
  layers are dense MLPs of ``intermediate_size``.
- Per layer 2 RMSNorms of hidden (4 in Gemma-2/3); embeddings vocab × hidden, the LM head as many unless tied, a
  final norm of hidden. Biases of the router (DeepSeek-V3's 256 per layer) and the multi-token-prediction module
  (``num_nextn_predict_layers``, 14 B of DeepSeek-V3's checkpoint, not in its published 671 B) are left out.
- Checks: Mixtral-8x7B 46.70 B total, 12.88 B active (published: 46.7 B, 12.9 B); DeepSeek-V3 671.0 B total,
  37.5 B active (published: 671 B, 37 B); Llama-3.1-8B 8,030,261,248 (published 8.03 B).
- Attention FLOPs per pair of tokens (a query and a key it attends to), per layer: a multiply-add per element of
  QKᵀ and of AV per head: 4 × heads × head_dim, or 2 × heads × (qk_nope_head_dim + qk_rope_head_dim +
  v_head_dim) for latent attention computed as multi-head attention (its prefill).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvbench.errors import BadFile, BadParameter
from kvbench.models.config import MAX_CONFIG_BYTES, read_config_file
from kvbench.offload.architecture import Architecture, architecture_of
from kvbench.safe_read import read_json_file

#: Config fields of a Mixtral-style mixture of experts (every layer's MLP is routed).
MIXTRAL_FIELDS = ("num_local_experts", "num_experts_per_tok")
#: Config fields of a DeepSeek-style mixture of experts (shared experts, dense first layers).
DEEPSEEK_FIELDS = ("n_routed_experts", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size",
                   "first_k_dense_replace")
#: Config fields of multi-head latent attention (``q_lora_rank`` may be null: no low-rank query).
MLA_FIELDS = ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "q_lora_rank")


@dataclass(frozen=True)
class ModelSizes(Architecture):
    """An :class:`~kvbench.offload.architecture.Architecture` with what a mixture of experts and latent attention
    change: its KV bytes (:meth:`token_layer_bytes`, so every placement rule counts them) and :attr:`parameters`
    (all of them) follow the model, not a dense GQA model of the same config.

    Attributes:
        kv_elements: KV elements per token and layer (2 × kv_heads × head_dim, or kv_lora_rank +
            qk_rope_head_dim).
        latent_kv: the KV is multi-head latent attention's one latent vector per token (every tensor-parallel rank
            holds all of it).
        total_parameters: every parameter; active_parameters: those one token passes through.
        routed_experts, experts_per_token: routed experts per MoE layer and per token (0, 0: dense);
        moe_layers: layers with routed experts; expert_parameters: one routed expert's parameters.
        attention_flops_per_token_pair: attention FLOPs per (query, key) pair over all layers.
        kv_lora_rank, qk_rope_head_dim: the latent's sizes (0 without latent attention).
    """

    kv_elements: int
    latent_kv: bool
    total_parameters: int
    active_parameters: int
    routed_experts: int
    experts_per_token: int
    moe_layers: int
    expert_parameters: int
    attention_flops_per_token_pair: int
    kv_lora_rank: int
    qk_rope_head_dim: int

    @property
    def parameters(self) -> int:  # type: ignore[override]
        """Every parameter (the weights a GPU holds)."""
        return self.total_parameters

    def token_layer_bytes(self, dtype_bytes: int) -> int:
        """KV bytes of one token in one layer: :attr:`kv_elements` × dtype bytes."""
        return self.kv_elements * dtype_bytes

    def weights_read(self, batch: int) -> float:
        """Parameters one decode step of ``batch`` tokens reads: all but the routed experts, plus per MoE layer the
        experts the batch reaches, expected E × (1 − (1 − k/E)^batch) for E routed experts, k per token, routing
        uniform and independent (each expert is missed by one token with probability 1 − k/E). All of them for
        a dense model.

        Raises:
            ValueError: ``batch`` below 1.
        """
        if batch < 1:
            raise ValueError(f"batch must be at least 1, not {batch}")
        if not self.routed_experts:
            return float(self.total_parameters)
        e, k = self.routed_experts, self.experts_per_token
        reached = e * (1 - (1 - k / e) ** batch)
        return self.total_parameters - self.moe_layers * (e - reached) * self.expert_parameters

    def kv_formula(self, dtype_bytes: int) -> str:
        """How :meth:`sequence_bytes_per_token` is computed, with this model's numbers."""
        if self.latent_kv:
            return (f"{self.layers} layers × ({self.kv_lora_rank} kv_lora_rank + {self.qk_rope_head_dim} "
                    f"qk_rope_head_dim) × {dtype_bytes} bytes")
        return f"2 × {self.layers} layers × {self.kv_heads} kv heads × {self.head_dim} head_dim × {dtype_bytes} bytes"

    def split(self, tp: int) -> ModelSizes:
        """One GPU's share under ``tp``-way tensor parallelism (Megatron-LM's split, as vLLM and SGLang apply it):
        the query heads and every weight matrix divided by ``tp`` (parameters rounded up; norms counted whole on
        each GPU are under 0.01% of a model), the KV heads divided too, or each kept whole on ``tp ÷ kv_heads``
        GPUs when there are fewer KV heads than GPUs; latent attention's KV is one vector per token, kept whole
        on every GPU.

        Raises:
            BadParameter: ``tp`` below 1, or not dividing the query heads, or neither dividing nor a multiple of the
                KV heads (``tp``).
        """
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
            raise BadParameter(f"{{tp}} must be a whole number of GPUs, at least 1, not {tp!r}", "tp")
        if tp == 1:
            return self
        if self.heads % tp:
            raise BadParameter(f"{{tp}} {tp}: the model's {self.heads} attention heads do not split over {tp} GPUs",
                               "tp")
        kv_heads, kv_elements = self.kv_heads, self.kv_elements
        if not self.latent_kv:
            if self.kv_heads % tp and tp % self.kv_heads:
                raise BadParameter(f"{{tp}} {tp}: the model's {self.kv_heads} KV heads neither split over {tp} GPUs "
                                   "nor repeat evenly on them", "tp")
            kv_heads = max(1, self.kv_heads // tp)
            kv_elements = 2 * kv_heads * self.head_dim
        return replace(self, heads=self.heads // tp, kv_heads=kv_heads, kv_elements=kv_elements,
                       total_parameters=math.ceil(self.total_parameters / tp),
                       active_parameters=math.ceil(self.active_parameters / tp),
                       expert_parameters=math.ceil(self.expert_parameters / tp),
                       attention_flops_per_token_pair=math.ceil(self.attention_flops_per_token_pair / tp))


def _whole(fields: dict[str, Any], key: str, where: str, least: int = 1) -> int:
    """``fields[key]`` as a whole number of at least ``least``. Raises BadFile naming the field."""
    v = fields.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < least or v > 2**26:
        raise BadFile(f"{where}: {key} = {v!r}: plan needs a whole number from {least} to {2**26:,}")
    return v


def _refuse_unread(fields: dict[str, Any], read: tuple[str, ...], where: str) -> None:
    """Refuse a config field about experts (a name with ``expert`` or starting ``moe_``) the count does not read.
    Raises BadFile naming them."""
    unread = [k for k, v in fields.items() if ("expert" in k or k.startswith("moe_")) and k not in read
              and v not in (None, 0, False, [], {}) and not (k == "moe_layer_freq" and v == 1)]
    if unread:
        raise BadFile(f"{where}: plan cannot count the experts this config describes ({', '.join(unread)}): it "
                      f"counts Mixtral's ({', '.join(MIXTRAL_FIELDS)}) and DeepSeek's "
                      f"({', '.join(DEEPSEEK_FIELDS)}, moe_layer_freq 1)")


def _attention(a: Architecture, fields: dict[str, Any], where: str) -> tuple[int, int, int, int, int]:
    """``(attention parameters per layer, KV elements per token and layer, attention FLOPs per token pair and
    layer, kv_lora_rank, qk_rope_head_dim)`` (the module docstring's formulas). Raises BadFile naming a missing
    or unusable latent-attention field."""
    if fields.get("kv_lora_rank") is None:
        latent = [k for k in MLA_FIELDS[1:4] if fields.get(k) is not None]
        if latent:  # transformers would default kv_lora_rank (DeepSeek's 512): a guess, never a count
            raise BadFile(f"{where}: the config has {', '.join(latent)} (multi-head latent attention) but no "
                          "kv_lora_rank: plan needs it for the KV per token")
        q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
        params = 2 * a.hidden * q + 2 * a.hidden * kv + ((q + 2 * kv) if a.qkv_bias else 0)
        return params, 2 * kv, 4 * a.heads * a.head_dim, 0, 0
    missing = [k for k in MLA_FIELDS if k not in fields]
    if missing:
        raise BadFile(f"{where}: the config has kv_lora_rank (multi-head latent attention) but no "
                      f"{', '.join(missing)}: plan needs it for the parameters and the KV per token")
    if fields.get("attention_bias"):
        raise BadFile(f"{where}: attention_bias true with multi-head latent attention: plan cannot count its biases")
    rank, rope, nope, v = (_whole(fields, k, where) for k in MLA_FIELDS[:4])
    q_rank = None if fields["q_lora_rank"] is None else _whole(fields, "q_lora_rank", where)
    h, qk = a.heads, nope + rope
    q = a.hidden * h * qk if q_rank is None else a.hidden * q_rank + q_rank + q_rank * h * qk
    kv = a.hidden * (rank + rope) + rank + rank * h * (nope + v)
    return q + kv + h * v * a.hidden, rank + rope, 2 * h * (qk + v), rank, rope


def model_sizes(config: Any, fields: dict[str, Any], where: str) -> ModelSizes:
    """The :class:`ModelSizes` of a transformers ``config`` whose config.json (its text config for a multimodal
    one) holds ``fields``; ``where`` names it in errors. Expert and latent fields are read from ``fields``, never
    from transformers' defaults.

    Raises:
        BadFile: expert or latent-attention fields missing, out of range or of a kind not counted (named).
        ValueError: a config :func:`~kvbench.offload.architecture.architecture_of` cannot model.
    """
    a = architecture_of(config)
    attention, kv_elements, flops_pair, rank, rope = _attention(a, fields, where)
    norms = a.norms_per_layer * a.hidden
    outer = a.vocab_size * a.hidden * (1 if a.tied else 2) + a.hidden
    dense_mlp = 3 * a.hidden * _whole(fields, "intermediate_size", where)
    experts = per_token = moe_layers = expert = shared = router = 0
    if fields.get("num_local_experts"):
        _refuse_unread(fields, MIXTRAL_FIELDS, where)
        experts, per_token = (_whole(fields, k, where) for k in MIXTRAL_FIELDS)
        moe_layers, expert = a.layers, dense_mlp
    elif fields.get("n_routed_experts"):
        _refuse_unread(fields, DEEPSEEK_FIELDS, where)
        missing = [k for k in DEEPSEEK_FIELDS if k not in fields]
        if missing:
            raise BadFile(f"{where}: the config has n_routed_experts but no {', '.join(missing)}: plan needs it to "
                          "count the experts")
        experts, per_token = _whole(fields, "n_routed_experts", where), _whole(fields, "num_experts_per_tok", where)
        shared = 0 if fields["n_shared_experts"] is None else _whole(fields, "n_shared_experts", where, 0)
        dense_first = _whole(fields, "first_k_dense_replace", where, 0)
        moe_layers = max(0, a.layers - dense_first)
        expert = 3 * a.hidden * _whole(fields, "moe_intermediate_size", where)
    else:
        _refuse_unread(fields, (), where)
    if per_token > experts:
        raise BadFile(f"{where}: num_experts_per_tok = {per_token} is above the {experts} experts")
    router = a.hidden * experts
    moe_total = (experts + shared) * expert + router
    moe_active = (per_token + shared) * expert + router
    dense_layers = a.layers - moe_layers
    base = outer + a.layers * (attention + norms) + dense_layers * dense_mlp
    return ModelSizes(**{f: getattr(a, f) for f in Architecture.__dataclass_fields__},
                      kv_elements=kv_elements, latent_kv=rank > 0,
                      total_parameters=base + moe_layers * moe_total, active_parameters=base + moe_layers * moe_active,
                      routed_experts=experts, experts_per_token=per_token, moe_layers=moe_layers,
                      expert_parameters=expert, attention_flops_per_token_pair=a.layers * flops_pair,
                      kv_lora_rank=rank, qk_rope_head_dim=rope)


def read_model_sizes(path: str | Path) -> ModelSizes:
    """The :class:`ModelSizes` of the config.json at ``path``, checked by
    :func:`~kvbench.models.config.read_config_file` (never running model code).

    Raises:
        BadFile: a config read_config_file refuses, or expert or latent fields :func:`model_sizes` refuses.
        ValueError: a config :func:`~kvbench.offload.architecture.architecture_of` cannot model.
    """
    config = read_config_file(path)
    raw = read_json_file(Path(path), MAX_CONFIG_BYTES)
    fields = raw.get("text_config", raw)
    return model_sizes(config, fields, str(path))


__all__ = ["DEEPSEEK_FIELDS", "MIXTRAL_FIELDS", "MLA_FIELDS", "ModelSizes", "model_sizes", "read_model_sizes"]
