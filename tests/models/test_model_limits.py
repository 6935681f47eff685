"""What a model's files may claim, and an export's way out when the disk fills: a shape past any published model is
refused before transformers builds it, a planted export record is read bounded, a GGUF that is no regular file is
never hashed, and a write that fails inside safetensors is one line naming the folder, with nothing left behind."""

from __future__ import annotations

import json
import re
import struct

import errno
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvbench.cli import app
from kvbench.errors import BadFile, ModelLoadError, ModelNotFound
from kvbench.models import export as export_module
from kvbench.models.config import read_architecture
from kvbench.models.export import NEEDED, RECORD, export_gguf, file_sha256
from kvbench.models.locate import locate
from kvbench.scenario import ModelSpec


def gguf_path() -> Path:
    loc = locate("smollm2-135m")
    return Path(loc.path) / loc.gguf_file


def small_gguf(path: Path, **keys: int) -> Path:
    """A GGUF header of SmolLM2's llama shape (no tensors) with ``keys`` (GGUFWriter ``add_<key>``) changed."""
    from gguf import GGUFWriter

    shape = {"block_count": 30, "embedding_length": 576, "head_count": 9, "head_count_kv": 3,
             "context_length": 8192, "vocab_size": 49152, "feed_forward_length": 1536, **keys}
    w = GGUFWriter(str(path), "llama")
    for key, value in shape.items():
        getattr(w, f"add_{key}")(value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _never_built(gguf, out, dtype):
    raise AssertionError("transformers was asked to build the model")


@pytest.mark.parametrize("key, value, shown", [("block_count", 200_000, "llama.block_count = 200,000: must be a "
                                                "whole number from 1 to 1,024"),
                                               ("head_count", 1 << 20, "llama.attention.head_count = 1,048,576: "
                                                "must be a whole number from 1 to 1,024"),
                                               ("vocab_size", 10**9, "llama.vocab_size = 1,000,000,000: must be a "
                                                "whole number from 1 to 2,097,152")])
def test_a_gguf_past_any_published_shape_is_refused_before_it_is_built(tmp_path, monkeypatch, key, value, shown):
    gguf = small_gguf(tmp_path / "huge.gguf", **{key: value})
    monkeypatch.setattr(export_module, "_write", _never_built)
    with pytest.raises(ModelLoadError) as exc:
        export_gguf(gguf, tmp_path / "models")
    assert str(exc.value) == f"{gguf}: {shown} (kvbench takes no larger model: no published one comes near)"
    assert not (tmp_path / "models").exists()
    read_architecture.cache_clear()
    with pytest.raises(ModelNotFound, match=f"cannot read the model's config: {gguf}: {shown}"):
        read_architecture(ModelSpec(name=str(gguf)))


def test_a_config_json_past_any_published_shape_is_refused(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama", "num_hidden_layers": 200000, '
                                          '"num_attention_heads": 4, "hidden_size": 256, '
                                          '"max_position_embeddings": 2048, "vocab_size": 1000}')
    read_architecture.cache_clear()
    with pytest.raises(ModelNotFound) as exc:
        read_architecture(ModelSpec(config=str(tmp_path / "config.json"), weights="random"))
    assert str(exc.value) == (f"cannot read the model's config: {tmp_path / 'config.json'}: num_hidden_layers = "
                              "200,000: must be a whole number from 1 to 1,024 (kvbench takes no larger model: no "
                              "published one comes near)")


@pytest.mark.parametrize("edit, shown", [
    ({"num_key_value_heads": 8}, "num_key_value_heads = 8: must divide num_attention_heads = 4 (each KV head serves "
                                 "a whole group of query heads)"),
    ({"num_key_value_heads": 3}, "num_key_value_heads = 3: must divide num_attention_heads = 4 (each KV head serves "
                                 "a whole group of query heads)"),
    ({"max_position_embeddings": 0}, "max_position_embeddings = 0: must be whole numbers above 0"),
])
def test_plan_refuses_a_config_no_model_can_have(tmp_path, edit, shown):
    """From the hostile pass: plan took 8 KV heads of 4 attention heads, and a context of 0 tokens."""
    config = {"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "hidden_size": 256, "intermediate_size": 512, "max_position_embeddings": 2048, "vocab_size": 1000,
              **edit}
    (tmp_path / "config.json").write_text(json.dumps(config))
    r = CliRunner().invoke(app, ["plan", str(tmp_path / "config.json"), "--prompt-tokens", "512"])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert shown in " ".join(r.output.split()), r.output


@pytest.mark.parametrize("body, said", [
    (struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 4) + b"arr_" + struct.pack("<I", 9)
     + struct.pack("<IQ", 4, 2**40) + bytes(16), "an array of 1,099,511,627,776 elements at byte 52, past the file's "
                                                 "68 bytes"),
    (struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 2**40) + bytes(16), "a key at byte 32, past the file's 48 "
                                                                           "bytes"),
    (struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 4) + b"str_" + struct.pack("<IQ", 8, 2**33) + bytes(16),
     "a string at byte 48, past the file's 64 bytes"),
    (struct.pack("<IQQ", 3, 2**50, 0) + bytes(16), "1,125,899,906,842,624 tensors at byte 24, past the file's 40 "
                                                   "bytes"),
    (struct.pack(">IQQ", 3, 0, 2**40) + bytes(16), "1,099,511,627,776 metadata entries at byte 24, past the file's 40 "
                                                   "bytes"),  # big-endian
])
def test_a_gguf_header_that_claims_more_than_its_file_is_refused_unread(tmp_path, body, said):
    """From the hostile pass: a 68-byte GGUF whose array claimed 2^40 elements drove validate and models export to
    8 GB in a minute (gguf's reader appends an empty read per claimed element)."""
    gguf = tmp_path / "bomb.gguf"
    gguf.write_bytes(b"GGUF" + body)
    read_architecture.cache_clear()
    with pytest.raises(ModelNotFound) as exc:
        read_architecture(ModelSpec(name=str(gguf)))
    assert str(exc.value).endswith(f"{gguf}: not a GGUF header kvbench can read: {said}"), str(exc.value)
    r = CliRunner().invoke(app, ["models", "export", str(gguf), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2 and said in " ".join(r.output.split()) and "Traceback" not in r.output, r.output
    assert not (tmp_path / "out").exists()


def test_a_planted_record_is_read_bounded(tmp_path):
    digest = file_sha256(gguf_path())
    folder = tmp_path / f"SmolLM2-135M-Instruct.Q4_1-{digest[:16]}-float32"
    folder.mkdir()
    for name in NEEDED:
        (folder / name).write_text("{}")
    with open(folder / RECORD, "wb") as f:  # 4 GB, sparse: read whole, a MemoryError
        f.truncate(4 << 30)
    tracemalloc.start()
    try:
        with pytest.raises(ModelLoadError) as exc:
            export_gguf(gguf_path(), tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(exc.value) == (f"{folder} is no kvbench export of this model (its record cannot be read: the file is "
                              "over 65,536 bytes): remove it and export again")
    assert peak < 16 << 20


def test_a_gguf_that_is_no_regular_file_is_never_read(tmp_path):
    os.mkfifo(tmp_path / "model.gguf")
    with pytest.raises(ModelLoadError, match=f"^{tmp_path / 'model.gguf'}: not a regular file$"):
        export_gguf(tmp_path / "model.gguf", tmp_path / "models")


def _disk_full(gguf, out, dtype):
    from safetensors import SafetensorError

    def save():
        (out / "model.safetensors").write_bytes(b"\0" * 1000)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    out.mkdir()
    export_module.save_files(save, out)


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(export_module, "_write", _disk_full)
    r = CliRunner().invoke(app, ["models", "export", "smollm2-135m", "--out", str(tmp_path)])
    digest = file_sha256(gguf_path())
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert r.output.replace("\n", "") == (f"error: cannot write the exported model to {tmp_path}/SmolLM2-135M-"
                                          f"Instruct.Q4_1-{digest[:16]}-float32: No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_safetensors_own_write_error_becomes_its_errno(tmp_path):
    """The real writer on a file size limit (EFBIG, as ENOSPC would be: an errno inside a SafetensorError)."""
    code = f"""
import resource, signal, torch
from pathlib import Path
from safetensors.torch import save_file
from kvbench.models.export import save_files
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
try:
    save_files(lambda: save_file({{"w": torch.zeros(1 << 20)}}, "{tmp_path}/w.safetensors"), Path("{tmp_path}"))
except OSError as exc:
    print(exc.errno, exc.strerror, exc.filename)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(export_module.__file__).parents[2])})
    assert done.stdout.strip() == f"{errno.EFBIG} File too large {tmp_path}", done.stderr


def test_heads_per_layer_are_bounded_entry_by_entry(tmp_path):
    from gguf import GGUFWriter

    from kvbench.errors import BadFile
    from kvbench.models.config import gguf_header

    def header(name: str, heads: list[int]) -> Path:
        w = GGUFWriter(str(tmp_path / name), "jamba")
        w.add_block_count(4)
        w.add_array("jamba.attention.head_count_kv", heads)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return tmp_path / name

    assert gguf_header(header("ok.gguf", [0, 8, 0, 8])) == ("jamba", {"num_hidden_layers": 4,
                                                                      "num_key_value_heads": [0, 8, 0, 8]})
    with pytest.raises(BadFile, match=r"jamba.attention.head_count_kv = \[0, 8, 2000000\]: must be a whole number "
                                      r"from 1 to 1,024"):
        gguf_header(header("big.gguf", [0, 8, 2_000_000]))


def _header(path: Path, entries: list[tuple[bytes, int, bytes]], version: int = 3, order: str = "<") -> Path:
    """A GGUF with no tensors and the metadata ``(key, value type, value bytes)``."""
    body = struct.pack(f"{order}IQQ", version, 0, len(entries))
    for key, kind, value in entries:
        body += struct.pack(f"{order}Q", len(key)) + key + struct.pack(f"{order}I", kind) + value
    path.write_bytes(b"GGUF" + body + bytes(16))
    return path


def test_gguf_headers_that_would_crash_or_swell_the_reader_are_refused(tmp_path):
    """From the second hostile pass: an architecture stored as a number ended validate in a TypeError traceback;
    an 8 MB file of 1,000,000 empty strings took gguf's reader to 1.64 GB; a header with no shape passed validate
    (transformers filled in its defaults); version 1 was read as 4,913,442,586,625 metadata entries."""
    from kvbench.models.config import gguf_header

    arch = _header(tmp_path / "a.gguf", [(b"general.architecture", 4, struct.pack("<I", 7))])
    strings = _header(tmp_path / "s.gguf", [(b"tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 1_100_000)
                                             + struct.pack("<Q", 0) * 1_100_000)])
    bare = _header(tmp_path / "b.gguf", [(b"general.architecture", 8, struct.pack("<Q", 4) + b"gpt2")])
    old = _header(tmp_path / "v1.gguf", [], version=1)
    for path, said in ((arch, "general.architecture is of value type 4, not a string"),
                       (strings, "its arrays hold more than 1,048,576 strings and arrays"),
                       (old, "GGUF version 1 (gguf reads 2 and 3)")):
        with pytest.raises(BadFile, match=re.escape(f"{path}: not a GGUF header kvbench can read: {said}")):
            gguf_header(path)
    with pytest.raises(BadFile, match=re.escape(f"{bare}: not a model's GGUF header: no gpt2.block_count")):
        gguf_header(bare)
    (tmp_path / "s.yaml").write_text(f"name: g\nmodel: {arch}\nworkload: {{source: synthetic}}\nprompt_tokens: [8]\n"
                                     "max_new_tokens: 2\nbatch_sizes: [1]\nmodes: [{kind: none}]\n")
    r = CliRunner().invoke(app, ["validate", str(tmp_path / "s.yaml")])
    assert r.exit_code == 2 and "Traceback" not in r.output and "not a string" in " ".join(r.output.split())
