"""Values validation used to let through: `hadamard: true` on a model whose head_dim has no Hadamard matrix. It is
refused by `kvbench validate` with one line naming the file, the key path and what is allowed."""

from __future__ import annotations

import json

from conftest import tiny_scenario
from typer.testing import CliRunner

from kvbench.cli import app


def _validate(path) -> tuple[int, str]:
    r = CliRunner().invoke(app, ["validate", str(path)])
    return r.exit_code, r.output


def _config(tmp_path, head_dim: int):
    heads, folder = 4, tmp_path / f"head_dim_{head_dim}"  # a path of its own: architectures are cached by spec
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": heads, "num_key_value_heads": 2,
        "hidden_size": heads * head_dim, "intermediate_size": 128, "max_position_embeddings": 512,
        "vocab_size": 1000}))
    return {"config": str(folder / "config.json"), "weights": "random", "tokenizer": "smollm2-135m"}


def test_hadamard_needs_a_head_dim_that_is_a_power_of_two(tmp_path, write_yaml):
    modes = [{"kind": "none"}, {"kind": "full", "host_dtype": "int8", "hadamard": True}]
    path = write_yaml(tiny_scenario(model=_config(tmp_path, 24), modes=modes))
    code, output = _validate(path)
    assert code == 2 and output.replace("\n", "") == (
        f"{path}: modes[1].hadamard: true needs a head_dim that is a power of two (a head_dim × head_dim Hadamard "
        "matrix); this model's head_dim is 24: leave hadamard out"), output
    assert _validate(write_yaml(tiny_scenario(model=_config(tmp_path, 32), modes=modes), "ok.yaml"))[0] == 0
