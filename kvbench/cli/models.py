"""``kvbench models export``: a model as the Hugging Face directory the servers that need one (vLLM, SGLang) load."""

from __future__ import annotations

from pathlib import Path

import typer

from kvbench.cli.common import Command, Group, handle_errors, out

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Models as the engines load them.", cls=Group)


@app.command("export", cls=Command)
def export(
    model: str = typer.Argument(..., metavar="model", help="An alias (smollm2-135m), a .gguf file or a directory "
                                "holding one."),
    out_dir: Path = typer.Option(None, "--out", metavar="<dir>", help="Folder the export goes in (default: models/ "
                                 "in kvbench's cache folder, $KVBENCH_CACHE_DIR or ~/.cache/kvbench)."),
    dtype: str = typer.Option("float32", "--dtype", metavar="float32|bfloat16|float16",
                              help="Dtype of the exported weights."),
) -> None:
    """Dequantize a GGUF model into a Hugging Face directory (config, safetensors weights, tokenizer and chat
    template), cached by the file's sha256 and reused; print the directory. A model that already is a directory is
    printed as it is. Give the directory as a vLLM or SGLang engine's engine.model."""
    with handle_errors({"dtype": "--dtype"}):
        from kvbench.models.export import hf_directory

        done = hf_directory(model, out_dir, dtype)
        how = ("already a Hugging Face directory" if done.sha256 is None else
               f"reused the export of sha256 {done.sha256[:16]}" if done.reused else
               f"exported from sha256 {done.sha256[:16]}")
        out.print(f"{done.path} ({how})", highlight=False, markup=False)
