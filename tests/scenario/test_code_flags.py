"""Server flags that make vLLM or SGLang import, load or evaluate code: refused without --trust-server-config in
every spelling their parsers accept (vLLM's ``--a_b``, ``--a=b``, JSON, dotted ``--a.key`` and ``-x.key=v``, unique
prefixes; older vLLM's ``-O`` alias of --compilation-config), each refusal one line naming the flag, what it loads
and the consent; every such flag listed in the docs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from kvbench.cli import app
from kvbench.scenario.server_flags import consent_reasons
from kvbench.serving import KINDS

DOCS = Path(__file__).resolve().parents[2] / "docs" / "engines.md"
PASSES = '{"inductor_passes":{"zen":"this.x"}}'  # vLLM 0.32 imports `this` as it parses any of these
COMPILE = ("--compilation-config", "makes the server run code (imports the modules its inductor_passes name (as it "
           "parses the flag), resolves a backend by its qualified name, passes Inductor settings that name compilers)")
OLD_O = ("-O", "makes the server run code (older vLLM read -O as --compilation-config; 0.32 takes a level 0-3 here)")


def said(word: str, flag: str, why: str) -> list[str]:
    return [f"{word}: {flag} {why}"]


@pytest.mark.parametrize("args", [
    ["--compilation-config", PASSES], ["--compilation_config", PASSES], ["--compilation-config=" + PASSES],
    ["--compilation-config.inductor_passes.zen", "this.x"], ["--compilation-config.inductor_passes.zen=this.x"],
    ["--compilation_config.inductor_passes.zen=this.x"], ["--compilation-conf", PASSES],
    ["--compilation-conf.inductor_passes.zen=this.x"],
])
def test_vllm_s_compilation_config_is_refused_in_every_long_spelling(args):
    assert consent_reasons("vllm", args) == said(args[0], *COMPILE)


@pytest.mark.parametrize("args, flag", [
    (["-cc", PASSES], "-cc"), (["-cc=" + PASSES], "-cc"), (["-cc.inductor_passes.zen=this.x"], "-cc"),
    (["-cc.inductor_passes.zen", "this.x"], "-cc"), (["-c", PASSES], "-cc"),  # argparse takes -c for -cc
])
def test_vllm_s_compilation_config_is_refused_in_every_short_spelling(args, flag):
    assert consent_reasons("vllm", args) == said(args[0], flag, COMPILE[1])


@pytest.mark.parametrize("args", [["-O.inductor_passes.zen=this.x"], ["-O", PASSES], ["-O" + PASSES],
                                  ["-O.level=3"], ["-O=" + PASSES]])
def test_vllm_s_o_with_anything_but_a_level_is_refused(args):
    assert consent_reasons("vllm", args) == said(args[0], *OLD_O)


@pytest.mark.parametrize("args", [["-O3"], ["-O", "3"], ["-O=0"], ["-O", "2", "--max-num-batched-tokens", "512"]])
def test_vllm_s_optimization_level_needs_no_consent(args):
    assert consent_reasons("vllm", args) == []


@pytest.mark.parametrize("args, flag, loads", [
    (["--worker_cls=mod.W"], "--worker-cls", "imports the worker class it names"),
    (["--worker-c", "mod.W"], "--worker-cls", "imports the worker class it names"),
    (["--worker-extension-cls", "mod.E"], "--worker-extension-cls", "imports the worker extension class it names"),
    (["--structured-outputs-config.reasoning_parser_plugin=x.py"], "--structured-outputs-config",
     "imports the Python file its reasoning_parser_plugin names"),
    (["--ec-manager-config.encoder_cache_manager_cls=mod.M"], "--ec-manager-config",
     "imports the class its encoder_cache_manager_cls names"),
    (["-sc", '{"method":"custom_class","model":"mod.P"}'], "-sc",
     "method custom_class imports the class its model names; a draft model is fetched"),
    (["--spec-method=custom_class"], "--spec-method", "custom_class imports the class --spec-model names"),
    (["--kv-transfer-config.kv_connector_module_path", "mod"], "--kv-transfer-config",
     "imports the KV connector module its kv_connector_module_path (and its offloading spec) names"),
    (["--logits-processors", "mod.L"], "--logits-processors", "imports the logits processor classes it names"),
    (["--middleware=mod.app"], "--middleware", "imports the ASGI middleware it names"),
    (["--tool-parser-plugin", "p.py"], "--tool-parser-plugin", "imports the Python file it names"),
    (["--distributed-executor-backend", "mod.Ex"], "--distributed-executor-backend",
     "imports the executor class a qualified name names"),
    (["--logging_config.pylogging_config_file=l.json"], "--logging-config",
     'a logging configuration whose factories ("()") call any importable callable'),
    (["--trust-request-chat-template"], "--trust-request-chat-template",
     "renders the Jinja chat template any client sends"),
])
def test_vllm_flags_that_import_code_are_refused_naming_what_they_load(args, flag, loads):
    assert consent_reasons("vllm", args) == said(args[0], flag, f"makes the server run code ({loads})")


@pytest.mark.parametrize("args, flag, loads", [
    (["--enable-custom-logit-processor"], "--enable-custom-logit-processor",
     "runs the dill-pickled logit processor any client sends in a request"),
    (["--enable-custom-logit"], "--enable-custom-logit-processor",
     "runs the dill-pickled logit processor any client sends in a request"),
    (["--custom-weight-loader", "mod.load"], "--custom-weight-loader", "imports the functions it names"),
    (["--forward-hooks=[]"], "--forward-hooks", "imports the hook factories its JSON names"),
    (["--hicache-storage-backend-extra-config", '{"module_path":"m"}'], "--hicache-storage-backend-extra-config",
     "the module_path and class_name a dynamic storage backend imports, or an @file it reads"),
    (["--unified-cache-external-linker-config", "{}"], "--unified-cache-external-linker-config",
     "imports the module its linker_module_path names"),
    (["--trust-remote-code"], "--trust-remote-code", "runs the model folder's own Python code"),
])
def test_sglang_flags_that_run_code_are_refused_naming_what_they_load(args, flag, loads):
    assert consent_reasons("sglang", args) == said(args[0], flag, f"makes the server run code ({loads})")


def test_a_code_flag_s_value_is_not_taken_for_a_flag():
    assert consent_reasons("vllm", ["--middleware", "-cc"]) == said(
        "--middleware", "--middleware", "makes the server run code (imports the ASGI middleware it names)")


def test_kvbench_run_refuses_a_code_flag_in_one_line_naming_it_and_the_consent(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "code", "model": "smollm2-135m", "engine": {"kind": "vllm"}, "max_new_tokens": 4,
        "workload": {"source": "sharegpt", "multi_turn": {"conversations": 2, "turns": 2, "min_prompt_tokens": 200,
                                                          "max_prompt_tokens": 600}},
        "modes": [{"name": "none"}, {"name": "prefix-cache", "args": ["-cc.inductor_passes.zen=this.x"]}]}))
    r = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "res")])
    lines = [ln for ln in r.output.splitlines() if "-cc.inductor_passes" in ln]
    assert r.exit_code == 2 and not (tmp_path / "res").exists(), r.output
    text = " ".join(r.output.split())
    assert (f"modes[1].args: -cc.inductor_passes.zen=this.x: -cc {COMPILE[1]}" in text
            and "unless you pass --trust-server-config" in text), r.output
    assert lines and r.output.count("error:") == 1


def test_the_docs_list_every_code_flag_with_its_source_file():
    from kvbench.scenario.server_flags import CODE_FLAGS

    text = DOCS.read_text()
    for kind, flags in CODE_FLAGS.items():
        for name, code in flags.items():
            row = re.search(rf"^\| {re.escape(kind)} \| [^|\n]*`{re.escape(name)}`[^\n]*$", text, re.MULTILINE)
            assert row is not None and f"`{code.source}`" in row.group(0), (kind, name)
    assert {k for k, v in CODE_FLAGS.items() if v} == {"vllm", "sglang"} and KINDS["vllm"].code_flags
