"""kvbench plan's model sizes and GPU presets: Mixtral-8x7B and DeepSeek-V3 (fixtures written from their published
config.json values, tests/data/plan/) counted by hand from the formulas of kvbench/models/sizes.py, against the
published 46.7 B / 12.9 B and 671 B / 37 B; refusals name the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbench.errors import BadFile, BadParameter
from kvbench.models import preset_path
from kvbench.models.gpus import GPUS, gpu_preset, measured_here
from kvbench.models.sizes import read_model_sizes
from kvbench.offload.architecture import Architecture

DATA = Path(__file__).parent.parent / "data" / "plan"
MIXTRAL, DEEPSEEK = DATA / "mixtral-8x7b" / "config.json", DATA / "deepseek-v3" / "config.json"


def test_mixtral_counts_every_expert_and_the_two_a_token_uses():
    s = read_model_sizes(MIXTRAL)
    h, inter, layers, vocab = 4096, 14336, 32, 32000
    attention = 2 * h * 32 * 128 + 2 * h * 8 * 128  # q, o; k, v (8 kv heads)
    expert = 3 * h * inter
    outer = 2 * vocab * h + h  # embeddings, untied LM head, final norm
    total = outer + layers * (attention + 2 * h + 8 * expert + 8 * h)  # + norms, 8 experts, router
    active = outer + layers * (attention + 2 * h + 2 * expert + 8 * h)
    assert (s.parameters, s.active_parameters) == (total, active) == (46_702_792_704, 12_879_925_248)
    assert round(total / 1e9, 1) == 46.7 and round(active / 1e9, 1) == 12.9  # published
    assert s.sequence_bytes_per_token(2) == 2 * 32 * 8 * 128 * 2 == 131_072
    assert s.kv_formula(2) == "2 × 32 layers × 8 kv heads × 128 head_dim × 2 bytes"
    # a decode step of one token reads the active weights; of many, nearly every expert
    assert s.weights_read(1) == pytest.approx(active)
    # two tokens reach 8 × (1 − (6/8)²) = 3.5 of the 8 experts on average (uniform routing)
    assert s.weights_read(2) == pytest.approx(total - 32 * (8 - 3.5) * expert)
    assert s.weights_read(10_000) == pytest.approx(total)


def test_deepseek_v3_counts_latent_attention_shared_and_routed_experts():
    s = read_model_sizes(DEEPSEEK)
    h, heads, q_rank, kv_rank, rope, nope, v = 7168, 128, 1536, 512, 64, 128, 128
    attention = (h * q_rank + q_rank + q_rank * heads * (nope + rope)  # q_a, its norm, q_b
                 + h * (kv_rank + rope) + kv_rank + kv_rank * heads * (nope + v)  # kv_a, its norm, kv_b
                 + heads * v * h)  # o
    expert, router = 3 * h * 2048, h * 256
    outer = 2 * 129280 * h + h
    base = outer + 61 * (attention + 2 * h) + 3 * 3 * h * 18432  # 3 dense layers (first_k_dense_replace)
    total = base + 58 * ((256 + 1) * expert + router)
    active = base + 58 * ((8 + 1) * expert + router)
    assert (s.parameters, s.active_parameters) == (total, active) == (671_026_404_352, 37_552_282_624)
    assert round(total / 1e9) == 671 and round(active / 1e9) == 38  # published: 671 B, 37 B
    assert s.sequence_bytes_per_token(2) == 61 * (512 + 64) * 2 == 70_272  # not 2 × 61 × 128 × 64 × 2 = 1,998,848
    assert s.kv_formula(2) == "61 layers × (512 kv_lora_rank + 64 qk_rope_head_dim) × 2 bytes"
    assert s.attention_flops_per_token_pair == 61 * 2 * 128 * (128 + 64 + 128)
    # tensor parallelism splits the weights but every GPU holds the whole latent
    t = s.split(8)
    assert t.parameters == -(-total // 8) and t.sequence_bytes_per_token(2) == 70_272


def test_dense_presets_count_as_before():
    for name in ("llama-3.1-8b", "qwen2.5-7b", "gemma-2-9b", "smollm2-135m"):
        s = read_model_sizes(preset_path(name))
        assert s.parameters == s.active_parameters == Architecture.parameters.fget(s), name
        assert s.weights_read(7) == s.parameters and not s.latent_kv
    assert read_model_sizes(preset_path("llama-3.1-8b")).parameters == 8_030_261_248


def test_tensor_parallel_splits_kv_heads_or_repeats_them():
    s = read_model_sizes(preset_path("llama-2-70b"))  # 64 heads, 8 kv heads
    assert s.split(8).sequence_bytes_per_token(2) == 80 * 2 * 1 * 128 * 2
    assert s.split(16).kv_heads == 1 and s.split(16).sequence_bytes_per_token(2) == 80 * 2 * 128 * 2  # repeated
    assert s.split(4).kv_heads == 2 and s.split(4).heads == 16
    with pytest.raises(BadParameter, match="the model's 64 attention heads do not split over 3 GPUs"):
        s.split(3)
    with pytest.raises(BadParameter, match="at least 1"):
        s.split(0)


@pytest.mark.parametrize("change, field", [
    ({"num_experts": 128, "moe_intermediate_size": 768}, "num_experts, moe_intermediate_size"),  # Qwen3-MoE
    ({"num_local_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1}, "n_shared_experts"),
])
def test_experts_of_another_kind_are_refused_by_name(tmp_path, change, field):
    cfg = json.loads(preset_path("llama-3.1-8b").read_text()) | change
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(BadFile, match=f"plan cannot count the experts this config describes \\({field}\\)"):
        read_model_sizes(tmp_path / "config.json")


@pytest.mark.parametrize("drop, message", [
    ("qk_rope_head_dim", "has kv_lora_rank \\(multi-head latent attention\\) but no qk_rope_head_dim"),
    ("first_k_dense_replace", "has n_routed_experts but no first_k_dense_replace"),
    # never priced as a dense model with 128 heads (1,998,848 B per token, 28x the latent)
    ("kv_lora_rank", "has qk_rope_head_dim, qk_nope_head_dim, v_head_dim \\(multi-head latent attention\\) but no "
                     "kv_lora_rank"),
])
def test_deepseek_config_missing_a_field_is_refused_by_name(tmp_path, drop, message):
    cfg = json.loads(DEEPSEEK.read_text())
    del cfg[drop]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(BadFile, match=message):
        read_model_sizes(tmp_path / "config.json")


def test_gpu_presets_carry_datasheet_figures_and_sources():
    figures = {n: (g.hbm_gib, g.hbm_tbps, g.bf16_tflops, g.link_gbps) for n, g in GPUS.items()
               if g.gpus_per_node == 1}
    assert figures == {"h100": (80, 3.35, 989, 64), "h100-pcie": (80, 2.0, 756, 64), "h200": (141, 4.8, 989, 64),
                       "a100": (80, 2.039, 312, 32), "l40s": (48, 0.864, 362, 32), "gh200": (96, 4.0, 989, 450),
                       "b200": (180, 8.0, 2250, 64)}
    assert all("datasheet" in g.source for g in GPUS.values())
    assert gpu_preset("DGX-H100").host_gib == 2048 and gpu_preset("dgx-h100").gpus_per_node == 8
    assert gpu_preset("h100").host_gib is None and gpu_preset("gh200").host_gib == 480
    with pytest.raises(BadParameter, match="did you mean h100"):
        gpu_preset("h1000")
    assert measured_here(gpu_preset("h200"), "measured on NVIDIA H200")
    assert not measured_here(gpu_preset("h200"), "measured on NVIDIA GH200 480GB")
    assert measured_here(gpu_preset("h100"), "NVIDIA H100 80GB HBM3") and not measured_here(gpu_preset("h100"),
                                                                                            "NVIDIA H100 PCIe")


def test_a_model_over_several_gh200s_has_the_host_memory_of_each():
    from kvbench.analysis.plan_machine import machine

    m = machine("gh200", 2, None, None, None, None, None)
    assert m.host_bytes == 2 * 480 * 2**30 and m.sources["host_mem"].endswith(", × 2 of them for the model's 2 GPUs")


def test_a_null_text_config_is_refused_in_one_line(tmp_path):
    (tmp_path / "config.json").write_text('{"text_config": null}')
    with pytest.raises(BadFile, match="text_config is null, not an object of the language model's fields"):
        read_model_sizes(tmp_path / "config.json")
