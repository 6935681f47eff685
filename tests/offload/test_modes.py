"""The mode registry (offload/modes.py) and the generic Registry (offload/registry.py)."""

from __future__ import annotations

import typing

import pytest

from kvbench.offload.modes import MODES, placement
from kvbench.offload.registry import Registry
from kvbench.scenario.schema import Mode


def test_registry_words_an_unknown_name_once_for_every_use():
    r = Registry("preset", {"llama-3.1-8b": 1, "llama-3.1-70b": 2, "gemma-2-9b": 3})
    assert r.names() == ["llama-3.1-8b", "llama-3.1-70b", "gemma-2-9b"] and r["gemma-2-9b"] == 3
    assert r.unknown("lama-3.1-8b") == ("unknown preset 'lama-3.1-8b'; did you mean 'llama-3.1-8b'? available: "
                                        "llama-3.1-8b, llama-3.1-70b, gemma-2-9b")
    assert r.did_you_mean("lama-3.1-8b", n=3, quote=False) == "did you mean llama-3.1-8b, llama-3.1-70b? "
    assert r.did_you_mean("zzz") == "" and "zzz" not in r
    with pytest.raises(KeyError):
        r["zzz"]


def test_every_mode_is_in_the_scenario_union_with_its_defaults_once():
    union = typing.get_args(typing.get_args(Mode)[0])
    assert [m.options for m in MODES.values()] == list(union)
    assert MODES.names() == ["none", "hf-offloaded", "full", "hierarchical", "dynamic"]
    host = {"host_dtype": None, "k_dtype": None, "v_dtype": None, "hadamard": None}
    assert MODES["dynamic"].defaults == {**host, "min_window": 512, "max_window": None, "host_max_tokens": None}
    assert MODES["hierarchical"].defaults == {**host, "host_max_tokens": None}  # window must be given
    assert [k for k, m in MODES.items() if m.needs_cuda] == ["hf-offloaded"]


def test_placement_rules_and_the_modes_without_one():
    from kvbench.offload.architecture import Architecture

    kv = Architecture(windows=(None, None, None, 8), kv_heads=2, head_dim=4, heads=2, hidden=8, intermediate=16,
                      vocab_size=32, max_positions=128, model_type="llama", tied=False, qkv_bias=False,
                      norms_per_layer=2)  # 3 full layers, 1 sliding; 32 B/token
    per = 2 * 2 * 4 * 2
    assert placement(kv, "none", 100, 2) == (kv.kv_bytes(100, 2), 0)
    assert placement(kv, "full", 100, 2) == (8 * per + 2 * per * 100, 3 * per * 100)
    assert placement(kv, "hierarchical", 100, 2, 10) == (8 * per + 3 * per * 10 + 2 * per * 90, 3 * per * 90)
    for kind in ("dynamic", "hf-offloaded", "nonee"):
        with pytest.raises(ValueError, match=r"no placement model for mode .* \(only none, full, hierarchical\)"):
            placement(kv, kind, 100, 2)
