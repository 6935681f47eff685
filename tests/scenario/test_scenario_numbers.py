"""Values validation used to let through: `quality:` and `load:` numbers given as true or as quoted text, and
`hadamard: true` on a model whose head_dim has no Hadamard matrix. Each is refused by `kvbench validate` with one
line naming the file, the key path and what is allowed."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_scenario
from typer.testing import CliRunner

from kvbench.cli import app


def _validate(path) -> tuple[int, str]:
    r = CliRunner().invoke(app, ["validate", str(path)])
    return r.exit_code, r.output


@pytest.mark.parametrize("quality, line", [
    ({"max_kl": True}, "quality.max_kl: must be a number of at least 0, not true or false (got True)"),
    ({"max_server_kl": False}, "quality.max_server_kl: must be a number of at least 0, not true or false (got False)"),
    ({"min_agreement": "0.9"}, "quality.min_agreement: must be a number from 0 to 1, not text (write a number without "
                               "quotes) (got '0.9')"),
    ({"max_kl": "1e-3"}, "quality.max_kl: must be a number of at least 0, not text (YAML reads 1e-3 as text: write "
                         "1.0e-3 or 0.001) (got '1e-3')"),
    ({"min_agreement": 10**400}, "quality.min_agreement: must be a number from 0 to 1 (got 1000000000000"),
])
def test_quality_takes_numbers_only(write_yaml, quality, line):
    path = write_yaml(tiny_scenario(quality=quality))
    code, output = _validate(path)
    assert code == 2 and output.replace("\n", "").startswith(f"{path}: {line}"), output


def test_quality_and_load_keep_real_numbers(write_yaml):
    path = write_yaml(tiny_scenario(quality={"max_kl": 0.001, "max_server_kl": 1, "min_agreement": 0.5}))
    assert _validate(path)[0] == 0
    bad = write_yaml(tiny_scenario(load={"profile": "poisson", "rate": True}), "load.yaml")
    code, output = _validate(bad)
    assert code == 2 and f"{bad}: load.rate: must be a number above 0, at most 1,000,000, not true or false" in \
        output.replace("\n", ""), output


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
