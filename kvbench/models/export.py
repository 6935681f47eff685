"""A model as a Hugging Face directory, for the servers that load one (vLLM, SGLang), so that every engine of a
comparison runs the same weights: a GGUF's tensors dequantized by transformers' GGUF loader into a fresh model of
the same config (``save_pretrained`` refuses the GGUF-loaded model itself), saved as safetensors with its
tokenizer and chat template. The export is cached by the GGUF's sha256 under kvbench's cache folder
(``models/``), written into a temporary folder and renamed into place, and reused while its record matches.

What the GGUF says of its shape is checked before transformers builds anything from it
(:func:`kvbench.models.config.gguf_header`); the record is read bounded (:func:`kvbench.safe_read.read_json_file`);
a disk that fills while the weights are written (safetensors' own error, not an ``OSError``) is said as such."""

from __future__ import annotations

import copy
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbench.cache_dir import cache_dir
from kvbench.errors import BadFile, BadParameter, ModelLoadError, SymlinkRefused, UnwritableOutput, UserError
from kvbench.models.config import gguf_header
from kvbench.models.locate import locate
from kvbench.safe_read import open_regular, read_json_file

#: Bumped when what an export holds changes: an older export is then made again, not reused.
EXPORT_FORMAT = 2
#: The record an export folder holds (source, digest, dtype, versions).
RECORD = "kvbench-export.json"
#: The dtypes an export's weights may have.
DTYPES = ("float32", "bfloat16", "float16")
#: Files every export has; a folder without them is not a finished export.
NEEDED = ("config.json", "model.safetensors", "tokenizer_config.json", RECORD)
#: The largest export record read (bytes): kvbench writes about 200.
MAX_RECORD_BYTES = 64 << 10


@dataclass(frozen=True)
class Exported:
    """A model as a Hugging Face directory.

    Attributes:
        path: the directory (config.json, model.safetensors, the tokenizer files).
        sha256: the source GGUF's sha256 (hex); None when the model already was a directory (nothing exported).
        reused: the directory was there already (an earlier export, or the model's own).
    """

    path: Path
    sha256: str | None
    reused: bool


def file_sha256(path: Path) -> str:
    """sha256 (hex) of the regular file at ``path``, read in 4 MiB blocks.

    Raises:
        ModelLoadError: it is not a regular file (a FIFO, ``/dev/zero``: never read) or cannot be read.
    """
    h = hashlib.sha256()
    try:
        with open_regular(path) as fh:
            while block := fh.read(4 << 20):
                h.update(block)
    except BadFile as exc:
        raise ModelLoadError(str(exc)) from None
    return h.hexdigest()


def hf_directory(name: str, root: Path | None = None, dtype: str = "float32") -> Exported:
    """The Hugging Face directory of the model ``name`` (an alias, a GGUF file, a model directory or a cached hub
    id): a directory or hub id as it is; a GGUF exported (:func:`export_gguf`) or its earlier export reused.

    Raises:
        BadParameter: ``dtype`` is none of :data:`DTYPES`.
        ModelNotFound: no such model. ModelLoadError, SymlinkRefused, UnwritableOutput: as :func:`export_gguf`.
    """
    _check_dtype(dtype)
    loc = locate(name)
    if loc.gguf_file is None:
        return Exported(Path(loc.path), None, True)
    return export_gguf(Path(loc.path) / loc.gguf_file, root, dtype)


def export_gguf(gguf: Path, root: Path | None = None, dtype: str = "float32") -> Exported:
    """Export the GGUF file ``gguf`` as a Hugging Face directory ``<root>/<file stem>-<sha256[:16]>-<dtype>``
    (``root``: by default ``models/`` in kvbench's cache folder), or reuse the one an earlier call made from the
    same bytes. Weights in ``dtype`` (float32 on these CPUs; the GGUF's quantized values are dequantized, so the
    export computes what the GGUF does, up to the dtype's rounding).

    Raises:
        BadParameter: ``dtype`` is none of :data:`DTYPES`.
        SymlinkRefused: ``root`` or the export's folder is a symbolic link kvbench did not make.
        ModelLoadError: the GGUF is not a regular file, its header cannot be read or gives a shape past
            :data:`kvbench.models.config.SHAPE_LIMITS` (checked before anything is built), transformers cannot read
            it, or a folder in the export's place is no export of it.
        UnwritableOutput: the folder cannot be written (disk full, no permission): nothing is left half-written.
    """
    _check_dtype(dtype)
    gguf = Path(gguf)
    digest = file_sha256(gguf)
    root = Path(root) if root is not None else cache_dir() / "models"
    final = root / f"{gguf.stem}-{digest[:16]}-{dtype}"
    for p in (root, final):
        if p.is_symlink():
            raise SymlinkRefused(p)
    if root.exists() and not root.is_dir():
        raise UnwritableOutput(root, "it is a file, not a folder", "the exported model")
    if final.exists():
        return Exported(final, digest, _check_record(final, digest, dtype))
    try:  # before transformers builds a model of the shape the header claims
        gguf_header(gguf)
    except BadFile as exc:
        raise ModelLoadError(str(exc)) from None
    tmp = root / f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        _write(gguf, tmp, dtype)
        (tmp / RECORD).write_text(json.dumps(_record(gguf, digest, dtype), indent=2) + "\n")
        try:
            tmp.rename(final)
        except OSError:
            if not final.is_dir():  # not another process's export that won the race
                raise
            return Exported(final, digest, _check_record(final, digest, dtype))
    except OSError as exc:
        if isinstance(exc, UserError):
            raise
        raise UnwritableOutput(final, exc.strerror or str(exc), "the exported model") from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return Exported(final, digest, False)


def _check_dtype(dtype: str) -> None:
    """Raises BadParameter unless ``dtype`` is one of :data:`DTYPES`."""
    if dtype not in DTYPES:
        raise BadParameter(f"{{dtype}} must be {', '.join(DTYPES)}, not {dtype!r}", "dtype")


def _record(gguf: Path, digest: str, dtype: str) -> dict[str, Any]:
    import transformers

    from kvbench.version import __version__

    return {"format": EXPORT_FORMAT, "source": gguf.name, "sha256": digest, "dtype": dtype,
            "transformers": transformers.__version__, "kvbench": __version__}


def _check_record(folder: Path, digest: str, dtype: str) -> bool:
    """True when ``folder`` is a finished export of ``digest`` in ``dtype`` (its record says so).

    Raises:
        ModelLoadError: it is not (another folder in its place, or an export of an older format).
    """
    missing = [f for f in NEEDED if not (folder / f).is_file()]
    why = f"it lacks {', '.join(missing)}" if missing else "its record is of another source, dtype or format"
    try:
        rec = read_json_file(folder / RECORD, MAX_RECORD_BYTES) if not missing else {}
    except BadFile as exc:  # a planted record: too large, not JSON, not a regular file
        rec, why = {}, f"its record cannot be read: {str(exc).removeprefix(f'{folder / RECORD}: ')}"
    if not isinstance(rec, dict) or missing or rec.get("sha256") != digest or rec.get("dtype") != dtype or \
            rec.get("format") != EXPORT_FORMAT:
        raise ModelLoadError(f"{folder} is no kvbench export of this model ({why}): remove it and export again")
    return True


def _write(gguf: Path, out: Path, dtype: str) -> None:
    """Dequantize ``gguf`` into ``out`` (a new folder): config, safetensors weights, generation config, tokenizer
    and its chat template.

    Raises:
        ModelLoadError: transformers cannot read it, or the fresh model does not take every tensor.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch_dtype = getattr(torch, dtype)
    kw: dict[str, Any] = {"gguf_file": gguf.name, "local_files_only": True}
    try:
        src = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch_dtype, **kw)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **kw)
    except Exception as exc:
        raise ModelLoadError(f"{gguf}: transformers cannot read it: {type(exc).__name__}: {exc}") from exc
    config = copy.deepcopy(src.config)
    if hasattr(config, "quantization_config"):  # the GGUF loader's {"quant_method": "gguf"}: vLLM refuses it
        delattr(config, "quantization_config")
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    result = fresh.load_state_dict(src.state_dict(), strict=False)
    tied = set(getattr(fresh, "_tied_weights_keys", None) or ())
    missing = [k for k in result.missing_keys if k not in tied]
    if missing or result.unexpected_keys:
        raise ModelLoadError(f"{gguf}: the dequantized tensors do not fit its config (missing {missing[:3]}, "
                             f"unexpected {list(result.unexpected_keys)[:3]})")
    fresh.tie_weights()
    out.mkdir()
    save_files(lambda: (fresh.save_pretrained(out, safe_serialization=True), tokenizer.save_pretrained(out)), out)


#: The errno in safetensors' error text: ``I/O error: No space left on device (os error 28)`` (its Debug form:
#: ``Os { code: 28, ... }``).
_OS_CODE = re.compile(r"\(os error (\d+)\)|Os \{ code: (\d+)")


def save_files(save: Any, out: Path) -> None:
    """Run ``save()`` (writing into ``out``), with safetensors' own error for a failed write (a
    ``SafetensorError``, not an ``OSError``: a full disk ended in a traceback) raised as the ``OSError`` it
    holds.

    Raises:
        OSError: the write failed: the errno safetensors names (ENOSPC for a full disk), else EIO, with ``out``.
    """
    from safetensors import SafetensorError

    try:
        save()
    except SafetensorError as exc:
        code = _OS_CODE.search(str(exc))
        number = int(code[1] or code[2]) if code else errno.EIO
        raise OSError(number, os.strerror(number) if code else f"safetensors: {str(exc)[:200]}", str(out)) from exc
