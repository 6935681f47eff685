"""The one architecture model (:mod:`kvbench.offload.architecture`): KV bytes per token, layer windows and
parameter counts of the shipped presets against their published configs (/work/shared/model-facts.md), and the
same model from every reader (plan's config.json, the scenario checks' light read, a loaded model)."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoConfig

from kvbench.models import preset_names, preset_path, read_architecture
from kvbench.models.config import read_config_file
from kvbench.offload.architecture import Architecture, architecture_of


def arch(name: str) -> Architecture:
    return architecture_of(AutoConfig.from_pretrained(preset_path(name)))


def test_llama_3_1_8b_takes_131072_bytes_of_kv_per_token_in_bf16():
    a = arch("llama-3.1-8b")
    assert (a.layers, a.full_layers, a.kv_heads, a.head_dim, a.heads) == (32, 32, 8, 128, 32)
    assert (a.hidden, a.intermediate, a.vocab_size, a.max_positions) == (4096, 14336, 128256, 131072)
    assert (a.model_type, a.tied, a.qkv_bias, a.norms_per_layer) == ("llama", False, False, 2)
    assert a.token_layer_bytes(2) == 2 * 8 * 128 * 2 == 4096
    # 32 layers × 2 (K, V) × 8 kv heads × 128 × 2 bytes, whichever way a token is counted
    assert a.sequence_bytes_per_token(2) == a.host_bytes_per_token(2) == a.kv_bytes(1, 2) == 131_072
    assert a.cached_kv_bytes(4096, 2) == a.kv_bytes(4096, 2) == 4096 * 131_072  # 512 MiB at 4K tokens
    assert a.sliding_kv_bytes(4096, 2) == 0


@pytest.mark.parametrize("name, dtype_bytes, per_token", [
    ("llama-2-7b", 2, 2 * 32 * 32 * 128 * 2),     # 524,288: the article's "0.5 MB per token", for the 7B
    ("llama-2-70b", 2, 2 * 80 * 8 * 128 * 2),     # 327,680: grouped-query attention, 8 kv heads
    ("llama-3.1-8b", 2, 2 * 32 * 8 * 128 * 2),    # 131,072
    ("qwen2.5-7b", 2, 2 * 28 * 4 * 128 * 2),      # 57,344
    ("smollm2-135m", 2, 2 * 30 * 3 * 64 * 2),     # 23,040
    ("smollm2-135m", 4, 2 * 30 * 3 * 64 * 4),     # 46,080: float32, as the CPU runs use
])
def test_kv_bytes_per_token_of_full_attention_presets(name, dtype_bytes, per_token):
    assert arch(name).kv_bytes(4096, dtype_bytes) == 4096 * per_token


def test_sliding_window_layers_are_capped_at_their_window():
    gemma = arch("gemma-2-9b")  # 42 layers, every other one slides over 4,096 tokens
    per = 2 * 8 * 256 * 2
    assert gemma.kv_bytes(4096, 2) == 42 * per * 4096
    assert gemma.kv_bytes(8192, 2) == 21 * per * 8192 + 21 * per * 4096  # 258,048 B per token at 8K
    mistral = arch("mistral-7b")  # v0.1: every layer slides over 4,096
    assert mistral.kv_bytes(32768, 2) == mistral.kv_bytes(4096, 2) == 32 * 2 * 8 * 128 * 2 * 4096
    assert mistral.full_layers == 0


@pytest.mark.parametrize("name, parameters", [
    ("llama-2-7b", 6_738_415_616), ("llama-3.1-8b", 8_030_261_248), ("qwen2.5-7b", 7_615_616_512),
    ("gemma-2-9b", 9_241_705_984), ("smollm2-135m", 134_515_008)])
def test_parameter_counts_equal_the_published_ones(name, parameters):
    assert arch(name).parameters == parameters


@pytest.mark.parametrize("name, windows", [
    ("mistral-7b", (4096,) * 32),  # v0.1: sliding_window 4096 and no layer_types: every layer slides
    ("gemma-2-9b", (4096, None) * 21),  # Gemma2Config alternates from layer 0: sliding, full, ...
    ("llama-3.1-8b", (None,) * 32),
])
def test_layer_windows_of_the_presets_are_transformers_layer_types(name, windows):
    from transformers.cache_utils import get_layer_types_and_kwargs

    from kvbench.offload.layer_types import layer_windows

    config = AutoConfig.from_pretrained(preset_path(name))
    assert layer_windows(config) == windows == arch(name).windows
    # the layer classes DynamicCache(config=...) builds, and their windows
    types, kwargs = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    assert tuple(kw.get("sliding_window") for kw in kwargs) == windows
    assert {t for t, w in zip(types, windows) if w is None} <= {"full_attention"}


@pytest.mark.parametrize("use_sliding_window, windows", [
    (False, (None,) * 6),  # Qwen2Config sets sliding_window None unless use_sliding_window
    (True, (None,) * 4 + (8, 8)),  # then layers i >= max_window_layers (4) slide
])
def test_layer_windows_of_qwen2_follow_use_sliding_window_and_max_window_layers(use_sliding_window, windows):
    from transformers import Qwen2Config

    from kvbench.offload.layer_types import layer_windows

    config = Qwen2Config(num_hidden_layers=6, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=256, use_sliding_window=use_sliding_window,
                         sliding_window=8, max_window_layers=4)
    assert layer_windows(config) == windows
    assert architecture_of(config).windows == windows


def test_layer_windows_refuse_layers_without_a_token_cache():
    from types import SimpleNamespace

    from kvbench.offload.layer_types import layer_windows

    hybrid = SimpleNamespace(num_hidden_layers=2, layer_types=["full_attention", "linear_attention"])
    with pytest.raises(ValueError, match="layer 1 is 'linear_attention': kvbench models the K/V of full-attention"):
        layer_windows(hybrid)
    no_window = SimpleNamespace(num_hidden_layers=1, layer_types=["sliding_attention"], sliding_window=None)
    with pytest.raises(ValueError, match="layer 0 is sliding_attention but the config's sliding_window is None"):
        layer_windows(no_window)
    chunked = SimpleNamespace(num_hidden_layers=2, sliding_window=None, attention_chunk_size=16)
    assert layer_windows(chunked) == (16, 16)  # DynamicCache gives chunked layers a DynamicSlidingWindowLayer


@pytest.mark.parametrize("window", [None, 1, 2, 8])
def test_tokens_held_is_what_transformers_sliding_layer_keeps(window):
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    from kvbench.offload.layer_types import tokens_held

    layer = DynamicLayer() if window is None else DynamicSlidingWindowLayer(sliding_window=window)
    fed = 0
    for n in (12, 1, 1, 3, 1):  # a prefill, then decode steps (and a step of 3, as a restored prefix's rest)
        layer.update(torch.zeros(1, 1, n, 2), torch.zeros(1, 1, n, 2))
        fed += n
        assert layer.keys.shape[-2] == tokens_held(fed, window)
    # 18 tokens fed: every one (full), the last window - 1 (1 when the window is 2, 7 for 8); a window of 1
    # keeps them all (transformers slices from -1 + 1 = 0)
    assert tokens_held(18, window) == {None: 18, 1: 18, 2: 1, 8: 7}[window]


def test_cached_kv_bytes_count_window_minus_one_in_sliding_layers():
    gemma, mistral = arch("gemma-2-9b"), arch("mistral-7b")
    per = 2 * 8 * 256 * 2  # 8,192 B per token and layer (bf16)
    assert gemma.cached_kv_bytes(8192, 2) == 21 * per * 8192 + 21 * per * 4095
    assert mistral.cached_kv_bytes(32768, 2) == 32 * 2 * 8 * 128 * 2 * 4095
    assert gemma.cached_kv_bytes(100, 2) == gemma.kv_bytes(100, 2) == 42 * per * 100  # short of every window
    assert gemma.host_bytes_per_token(2) == 21 * per and mistral.host_bytes_per_token(2) == 0
    assert gemma.sequence_bytes_per_token(2) == 42 * per


def test_a_sliding_window_model_keeps_its_windows_on_the_device():
    """Gemma-2-9B: 42 layers, the even ones slide over 4,096 tokens; only the 21 full layers reach the host."""
    g = arch("gemma-2-9b")
    assert g.windows == (4096, None) * 21 and (g.layers, g.full_layers) == (42, 21)
    per = g.token_layer_bytes(2)
    assert per == 2 * 8 * 256 * 2
    assert g.sliding_kv_bytes(10_000, 2) == 21 * per * 4096
    assert g.host_bytes_per_token(2) == 21 * per and g.sequence_bytes_per_token(2) == 42 * per
    assert (g.tied, g.norms_per_layer) == (True, 4)
    assert arch("qwen2.5-7b").qkv_bias and arch("qwen2.5-7b").sequence_bytes_per_token(2) == 57_344


@pytest.mark.parametrize("name", preset_names())
def test_every_reader_gives_the_one_architecture(name):
    """plan's config.json reader, the scenario checks' light read (no transformers for Llama configs) and
    transformers' own config build equal architectures."""
    from kvbench.scenario import ModelSpec

    assert architecture_of(read_config_file(preset_path(name))) == arch(name) \
        == read_architecture(ModelSpec(preset=name, weights="random"))


def test_a_loaded_model_carries_the_architecture_of_its_config(tiny_model):
    """``tiny_model`` is the tiny-llama preset with random weights: its loaded config gives the preset's."""
    a = tiny_model.shape
    assert a == arch("tiny-llama")
    assert a.cached_kv_bytes(10, 4) == 10 * a.layers * 2 * a.kv_heads * a.head_dim * 4


def test_the_architecture_is_frozen_and_says_what_it_lacks():
    a = arch("llama-3.1-8b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.kv_heads = 1  # type: ignore[misc]
    no_mlp = dataclasses.replace(a, intermediate=None)  # GPT-2 style configs name it otherwise
    with pytest.raises(ValueError, match="the config has no intermediate_size: the parameter count needs it"):
        _ = no_mlp.parameters
    assert no_mlp.kv_bytes(8, 2) == a.kv_bytes(8, 2)  # the KV formulas need no MLP size
    with pytest.raises(ValueError, match="the config has no num_attention_heads, hidden_size"):
        architecture_of(SimpleNamespace(num_hidden_layers=2, vocab_size=10))
    with pytest.raises(ValueError, match="negative|>= 0"):
        a.cached_kv_bytes(-1, 2)


def test_defaults_follow_transformers_attention():
    """kv heads default to the heads (multi-head attention) and head_dim to hidden ÷ heads."""
    mha = architecture_of(SimpleNamespace(num_hidden_layers=3, num_attention_heads=4, hidden_size=64,
                                          vocab_size=100, max_position_embeddings=128))
    assert (mha.kv_heads, mha.head_dim, mha.windows, mha.model_type) == (4, 16, (None,) * 3, "")
    assert (mha.intermediate, mha.tied, mha.qkv_bias, mha.norms_per_layer) == (None, False, False, 2)


def test_plan_reader_treats_a_null_size_as_missing(tmp_path):
    from kvbench.errors import BadFile

    cfg = json.loads(preset_path("llama-3.1-8b").read_text()) | {"intermediate_size": None}
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    with pytest.raises(BadFile, match=f"^{f}: the config has no intermediate_size$"):
        read_config_file(f)
