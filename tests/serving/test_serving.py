"""The registry of server kinds (kvbench.serving): each kind declared once, in its own module, and every table
the rest of kvbench reads derived from it."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import kvbench
from kvbench.bench.engines.server.metrics import COUNTERS, ENGINES
from kvbench.scenario.server_flags import CONSENT_FLAGS, RESERVED_FLAGS
from kvbench.scenario.servers import PRESETS, STARTED_KINDS
from kvbench.serving import KINDS, METRICS_FALLBACK, metrics_kind
from kvbench.serving.kind import Launch

ROOT = Path(kvbench.__file__).parent
METRICS = Path(__file__).resolve().parents[1] / "data" / "metrics"


def test_the_registry_holds_the_four_kinds_in_order():
    assert list(KINDS) == ["llama.cpp", "vllm", "sglang", "openai"]
    assert [k.name for k in KINDS.values()] == list(KINDS)
    assert "did you mean 'llama.cpp'?" in KINDS.unknown("llama-cpp")


def test_every_table_is_derived_from_the_registry():
    assert STARTED_KINDS == ("llama.cpp", "vllm", "sglang")
    assert PRESETS == {k: KINDS[k].presets for k in KINDS}
    assert {k: (KINDS[k].program, KINDS[k].python_module, KINDS[k].own_env) for k in STARTED_KINDS} == {
        "llama.cpp": (("llama-server",), None, None),
        "vllm": (("vllm", "serve"), "vllm.entrypoints.openai.api_server", "vllm"),
        "sglang": ((), "sglang.launch_server", None)}
    assert set(RESERVED_FLAGS) == {"", *STARTED_KINDS} and RESERVED_FLAGS["vllm"] == KINDS["vllm"].reserved_flags
    assert CONSENT_FLAGS == {k: KINDS[k].consent_flags for k in STARTED_KINDS}
    assert ENGINES == ("llama.cpp", "vllm", "sglang") and COUNTERS["sglang"] == KINDS["sglang"].counters


def _kind_names_outside_serving() -> list[str]:
    names = set(KINDS)
    out = []
    for p in ROOT.rglob("*.py"):
        if p.relative_to(ROOT).parts[0] == "serving":
            continue
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in names:
                out.append(f"{p.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    return out


def test_no_module_outside_serving_names_a_kind_in_code():
    """A kind's name as a value (a comparison, a table key) appears only in kvbench/serving/: code elsewhere asks
    the kind's declaration (docstrings and messages may still mention kinds as prose)."""
    assert _kind_names_outside_serving() == []


@pytest.mark.parametrize("name", [k for k in KINDS if KINDS[k].started])
def test_a_started_kind_declares_how_it_starts(name):
    kind = KINDS[name]
    assert (kind.program or kind.python_module) and kind.install_hint and kind.model_format in ("gguf", "hf")
    head, own = kind.launch(Launch("/m/model", "smollm2-135m", 4242, 3, 100, 7))
    argv = [*head, *own]
    assert "/m/model" in argv and "127.0.0.1" in argv and "4242" in argv and "7" in argv
    assert set(RESERVED_FLAGS[""]) <= {a for a in own if a.startswith("-")}  # where it listens is kvbench's
    assert all(f in kind.reserved_flags for f in own if f.startswith("-") and f not in RESERVED_FLAGS[""])


@pytest.mark.parametrize("name", [k for k in KINDS if KINDS[k].counters])
def test_a_kind_with_counters_has_a_recorded_metrics_fixture(name):
    kind = KINDS[name]
    assert kind.metrics_prefix and kind.hit_counts is not None
    assert all(src.startswith(kind.metrics_prefix) for c in kind.counters for src in c.sources)
    stem = kind.metrics_prefix.rstrip(":")
    for side in ("before", "after"):
        assert metrics_kind((METRICS / f"{stem}_{side}.txt").read_text()) == name


def test_metrics_of_no_known_kind_are_read_with_the_fallback_names():
    assert metrics_kind("# nothing\nup 1\n") == METRICS_FALLBACK == "vllm"


def test_the_guide_s_example_kind_is_a_working_declaration():
    """docs/adding-an-engine.md's module runs and declares a kind kvbench can start and read."""
    text = (ROOT.parent / "docs" / "adding-an-engine.md").read_text(encoding="utf-8")
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    space: dict = {}
    exec(compile(code, "docs/adding-an-engine.md", "exec"), space)  # noqa: S102 - our own docs
    kind = space["KIND"]
    head, own = kind.launch(Launch(None, "org/model", 4242, 2, 100, 0))
    assert head == [] and own[:2] == ["--model", "org/model"] and "127.0.0.1" in own
    assert all(f in kind.reserved_flags for f in own if f.startswith("-") and f not in RESERVED_FLAGS[""])
    assert kind.hit_counts({"cached_tokens": 30.0, "prompt_tokens": 120.0}) == (30.0, 120.0)
    assert [p.name for p in kind.presets.values() if p.cold] == ["none"]


def test_vllm_s_cpu_kv_space_gives_way_to_the_scenario_s_kv_cache_memory_bytes():
    from kvbench.serving.vllm import environment

    at = Launch("/m", "smollm2-135m", 4242, 1, 600, 0, device="cpu", kv_bytes=2**20)
    assert environment(at)["VLLM_CPU_KVCACHE_SPACE"] == "1"
    for flags in (("--kv-cache-memory-bytes", "70778880"), ("--kv-cache-memory-bytes=70778880",)):
        assert "VLLM_CPU_KVCACHE_SPACE" not in environment(dataclasses.replace(at, flags=flags))
