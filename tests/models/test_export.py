"""Exporting a GGUF model as a Hugging Face directory (kvbench.models.export, `kvbench models export`): the export
generates what the GGUF does, is reused by digest, refuses a folder it did not make, and leaves nothing behind
when it fails."""

from __future__ import annotations

import errno
import json

import pytest
from typer.testing import CliRunner

from kvbench.cli import app
from kvbench.errors import ModelLoadError, SymlinkRefused, UnwritableOutput
from kvbench.models import export as export_module
from kvbench.models.export import RECORD, export_gguf, file_sha256, hf_directory
from kvbench.models.locate import locate


def gguf_path():
    loc = locate("smollm2-135m")
    from pathlib import Path

    return Path(loc.path) / loc.gguf_file


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """SmolLM2's GGUF exported once for the module (about 20 s, 538 MB of float32 safetensors)."""
    return hf_directory("smollm2-135m", tmp_path_factory.mktemp("models"))


@pytest.mark.model
def test_the_export_generates_what_the_gguf_does(exported, smol_tokenizer):
    import torch

    from kvbench.models import load
    from kvbench.scenario import ModelSpec

    gguf = load(ModelSpec(name="smollm2-135m"), "cpu")
    hf = load(ModelSpec(name=str(exported.path)), "cpu")
    chat = [{"role": "user", "content": "What does a KV cache hold, and why does it grow with the context?"}]
    text = smol_tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert hf.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == text
    ids = torch.tensor([smol_tokenizer(text)["input_ids"]])
    assert hf.tokenizer(text)["input_ids"] == ids[0].tolist()
    outs = [m.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False)[0, ids.shape[1]:]
            for m in (gguf, hf)]
    assert outs[0].tolist() == outs[1].tolist() and len(outs[0]) == 24
    assert hf.shape == gguf.shape and hf.weights_bytes == gguf.weights_bytes


@pytest.mark.model
def test_the_exported_config_says_nothing_of_the_gguf_it_came_from(exported):
    config = json.loads((exported.path / "config.json").read_text())
    assert "quantization_config" not in config  # vLLM: "Unknown quantization method: gguf"
    assert (config["dtype"], config["num_hidden_layers"], config["num_key_value_heads"]) == ("float32", 30, 3)


@pytest.mark.model
def test_a_second_export_reuses_the_first_by_the_files_digest(exported):
    record = json.loads((exported.path / RECORD).read_text())
    assert exported.reused is False and record["sha256"] == exported.sha256 == file_sha256(gguf_path())
    assert exported.path.name == f"SmolLM2-135M-Instruct.Q4_1-{exported.sha256[:16]}-float32"
    stamp = (exported.path / "model.safetensors").stat().st_mtime_ns
    again = export_gguf(gguf_path(), exported.path.parent)
    assert again.reused is True and again.path == exported.path
    assert (exported.path / "model.safetensors").stat().st_mtime_ns == stamp
    assert sorted(p.name for p in exported.path.parent.iterdir()) == [exported.path.name]  # no temporary left


def test_a_folder_kvbench_did_not_make_is_refused_not_loaded(tmp_path):
    digest = file_sha256(gguf_path())
    foreign = tmp_path / f"SmolLM2-135M-Instruct.Q4_1-{digest[:16]}-float32"
    foreign.mkdir()
    (foreign / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match=r"is no kvbench export of this model \(it lacks model.safetensors, "
                                             r"tokenizer_config.json, kvbench-export.json\): remove it"):
        export_gguf(gguf_path(), tmp_path)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(SymlinkRefused):
        export_gguf(gguf_path(), link)
    assert not (tmp_path / "elsewhere").exists()


def test_a_failed_export_leaves_nothing_half_written(tmp_path, monkeypatch):
    def full_disk(gguf, out, dtype):
        out.mkdir()
        (out / "config.json").write_text("{}")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(export_module, "_write", full_disk)
    with pytest.raises(UnwritableOutput, match="cannot write the exported model to .*: No space left on device"):
        export_gguf(gguf_path(), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_command_prints_the_directory_and_refuses_a_bad_dtype(tmp_path):
    bad = CliRunner().invoke(app, ["models", "export", "smollm2-135m", "--dtype", "int8"])
    assert bad.exit_code == 2 and "error: --dtype must be float32, bfloat16, float16, not 'int8'" in bad.output
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    r = CliRunner().invoke(app, ["models", "export", str(model_dir)])
    assert r.exit_code == 0 and r.output.strip() == f"{model_dir} (already a Hugging Face directory)"


def test_an_out_folder_that_is_a_file_is_named_as_such(tmp_path):
    (tmp_path / "afile").write_text("")
    with pytest.raises(UnwritableOutput, match=r"cannot write the exported model to .*afile: it is a file, not a "
                                               r"folder$"):
        export_gguf(gguf_path(), tmp_path / "afile")
