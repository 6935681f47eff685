"""What a started server loads: a kind that takes a Hugging Face directory (vLLM, SGLang) without engine.model
gets the scenario's model exported (kvbench.models.export), so that it runs the weights kvbench tokenizes with;
engine.model, when given, is what it loads; a GGUF kind (llama.cpp) is never exported for."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from kvbench.bench.engines.server.engine import load_server_engine
from kvbench.bench.engines.server.launch import server_argv
from kvbench.models import export
from kvbench.scenario import parse_scenario


def scenario(**engine) -> dict:
    return {"name": "srv", "model": "smollm2-135m", "engine": engine,
            "workload": {"source": "sharegpt", "multi_turn": {"conversations": 2, "turns": 2,
                                                              "min_prompt_tokens": 200, "max_prompt_tokens": 600}},
            "max_new_tokens": 4, "modes": [{"name": "none"}], "repeats": 1}


@pytest.fixture
def exports(tmp_path, monkeypatch, smol_tokenizer):
    """The models asked for, with a stand-in export (the real one: tests/models/test_export.py); the engine gets
    the session's SmolLM2 tokenizer rather than loading it again from the GGUF (seconds, each time)."""
    asked: list[str] = []
    monkeypatch.setattr(importlib.import_module("kvbench.models.load"), "load_tokenizer",
                        lambda name, trust_remote_code=False: smol_tokenizer)

    def fake(name: str, root: Path | None = None, dtype: str = "float32") -> export.Exported:
        asked.append(name)
        return export.Exported(tmp_path / "exported", "ab" * 32, False)

    monkeypatch.setattr(export, "hf_directory", fake)
    return asked


def argv_of(s, engine, tmp_path) -> list[str]:
    mode = s.modes[0]
    return server_argv(s, engine.preset(mode), mode, 4242, 1, 64, tmp_path, engine.model_dir)[0]


@pytest.mark.parametrize("kind, before", [("vllm", "serve"), ("sglang", "--model-path")])
def test_a_hugging_face_kind_without_engine_model_loads_the_scenario_s_model_exported(kind, before, exports,
                                                                                       tmp_path):
    s = parse_scenario(scenario(kind=kind, binary="/bin/sh"))
    engine = load_server_engine(s, tmp_path)
    assert exports == ["smollm2-135m"] and engine.model_dir == str(tmp_path / "exported")
    argv = argv_of(s, engine, tmp_path)
    at = argv.index(str(tmp_path / "exported"))
    assert argv.count(str(tmp_path / "exported")) == 1 and "smollm2-135m" not in argv
    assert argv[at - 1] == before  # vllm: `vllm serve MODEL`, its positional word


def test_engine_model_is_what_the_server_loads_and_a_gguf_kind_is_never_exported_for(exports, tmp_path):
    s = parse_scenario(scenario(kind="vllm", binary="/bin/sh", model="HuggingFaceTB/SmolLM2-135M-Instruct"))
    engine = load_server_engine(s, tmp_path)
    argv = argv_of(s, engine, tmp_path)
    assert engine.model_dir is None and argv[argv.index("serve") + 1] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    llama = load_server_engine(parse_scenario(scenario(kind="llama.cpp")), tmp_path)
    assert llama.model_dir is None and exports == []
