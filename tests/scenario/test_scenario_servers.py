"""The scenario keys of a server run (kvbench.scenario.servers): engine, load, server configurations and their
presets; every wrong key names its path, the value and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import ROOT
from kvbench.cli import app
from kvbench.scenario import ScenarioError, load_scenario
from kvbench.scenario.load_spec import LoadSpec
from kvbench.scenario.servers import PRESETS, preset_of
from kvbench.scenario.summary import sweep_summary


def server_scenario(**over) -> dict:
    """A valid llama.cpp scenario (the fake-free minimum: validation reads the model's config only)."""
    data = {"name": "srv", "model": "smollm2-135m", "engine": {"kind": "llama.cpp"},
            "workload": {"source": "sharegpt", "multi_turn": {"conversations": 2, "turns": 2,
                                                              "min_prompt_tokens": 200, "max_prompt_tokens": 600}},
            "max_new_tokens": 4, "modes": [{"name": "none"}, {"name": "prefix-cache"}], "repeats": 1}
    data.update(over)
    return data


def problems_of(write_yaml, data) -> list[tuple[str, str]]:
    with pytest.raises(ScenarioError) as info:
        load_scenario(write_yaml(data))
    return info.value.problems


def test_a_server_scenario_loads_with_its_presets_and_load(write_yaml):
    s = load_scenario(write_yaml(server_scenario(
        modes=[{"name": "none"}, {"name": "prefix-cache"},
               {"name": "ram", "preset": "host-cache", "size": 256, "args": ["--no-cache-idle-slots"],
                "request": {"cache_prompt": True}}],
        load={"profile": "concurrent", "concurrency": [1, 4]})))
    assert s.engine.server and s.engine.kind == "llama.cpp"
    assert [(m.kind, m.label) for m in s.modes] == [("none", "none"), ("prefix-cache", "prefix-cache"),
                                                    ("host-cache", "ram")]
    assert s.modes[2].options == {"args": ["--no-cache-idle-slots"], "request": {"cache_prompt": True}, "size": 256.0}
    assert preset_of("llama.cpp", s.modes[2]).args == ("--cache-ram", "{size}")
    assert s.load_spec.levels == [1, 4]
    assert sweep_summary(s) == ("24 requests on llama.cpp: multi_turn: 2 conversations × 2 turns = 4 requests × 3 "
                                "modes × 2 concurrency levels × 1 repeat, concurrency 1, 4; one server start per "
                                "mode, level and repeat")


def test_the_default_engine_is_transformers_and_takes_no_server_keys(write_yaml):
    data = server_scenario(engine={"binary": "/bin/true"})
    assert problems_of(write_yaml, data) == [("engine.binary", "only for a server engine (kind llama.cpp, vllm, "
                                                               "sglang or openai); the transformers engine runs in kvbench")]


@pytest.mark.parametrize("engine, path, message", [
    ({"kind": "llamacpp"}, "engine.kind", "unknown engine 'llamacpp'; did you mean 'llama.cpp'? available: "
                                          "transformers, llama.cpp, vllm, sglang, openai (got 'llamacpp')"),
    ({"kind": "openai"}, "engine.url", "required for kind openai (the running server's base URL)"),
    ({"kind": "llama.cpp", "url": "http://127.0.0.1:8000"}, "engine.url",
     "kvbench starts llama.cpp itself on 127.0.0.1; use kind openai for a server already running"),
    ({"kind": "openai", "url": "http://h:1", "cold": "restart"}, "engine.cold",
     "restart is impossible for kind openai (kvbench did not start the server): use cold: reset with "
     "reset_path, or cold: check"),
    ({"kind": "openai", "url": "file:///etc/passwd", "cold": "reset", "reset_path": "/r"}, "engine.url",
     "must be an http:// or https:// URL such as http://127.0.0.1:8000 (no query, no spaces) (got "
     "'file:///etc/passwd')"),
    ({"kind": "vllm", "cold": "reset"}, "engine.reset_path",
     "required with cold: reset (the engine's cache-reset endpoint)"),
    ({"kind": "llama.cpp", "args": ["-t\n1"]}, "engine.args[0]",
     "a server flag cannot hold a NUL byte or a line break (got '-t\\n1')"),
])
def test_engine_keys_are_checked(write_yaml, engine, path, message):
    assert problems_of(write_yaml, server_scenario(engine=engine)) == [(path, message)]


@pytest.mark.parametrize("modes, path, message", [
    ([{"name": "none"}, {"name": "prefix-cach"}], "modes[1]",
     "preset: unknown llama.cpp preset 'prefix-cach'; did you mean 'prefix-cache'? available: none, prefix-cache, "
     "host-cache, disk-slots, kv-on-host, kv-q8_0, kv-q4_0"),
    ([{"kind": "none"}], "modes[0]", "engine llama.cpp takes server configurations ({name: none}, {name: "
                                     "prefix-cache}, ...), not the offload mode kind none"),
    ([{"name": "none", "size": 5}], "modes[0]", "size: preset none of llama.cpp has no size"),
    ([{"name": "x", "preset": "none", "request": {"n_predict": 3}}], "modes[0].request",
     "n_predict: kvbench sets this on every request (reserved: ignore_eos, max_tokens, model, n_predict, n_probs, "
     "prompt, return_tokens, seed, stream, stream_options, temperature, top_k)"),
    ([{"name": "none", "window": 5}], "modes[0].window",
     "unknown key 'window'; allowed keys: name, preset, args, request, size, url"),
    ([{"window": 5}], "modes[0]", "each mode needs a `kind` (an offload mode: none, hf-offloaded, full, hierarchical, "
                                  "dynamic) or, for a server engine, a `name` (a server configuration)"),
    ([{"name": "none"}, {"name": "none"}], "modes", "duplicate mode(s) ['none']"),
])
def test_server_modes_are_checked(write_yaml, modes, path, message):
    assert problems_of(write_yaml, server_scenario(modes=modes)) == [(path, message)]


def test_offload_modes_need_the_transformers_engine_and_server_modes_a_server(write_yaml):
    data = server_scenario(engine={"kind": "transformers"})
    assert problems_of(write_yaml, data) == [
        ("modes[0]", "a server configuration (none) needs a server engine (engine.kind llama.cpp, vllm, sglang or "
                     "openai); the transformers engine takes offload modes with `kind`")]


@pytest.mark.parametrize("over, path, message", [
    ({"batch_sizes": [1]}, "batch_sizes", "does not apply to engine llama.cpp (a server keeps its own KV; requests "
                                          "arrive as load: says); remove it"),
    ({"budget": "1GiB"}, "budget", "does not apply to engine llama.cpp (a server keeps its own KV; requests arrive "
                                   "as load: says); remove it"),
    ({"load": {"profile": "sequential", "concurrency": 2}}, "load.concurrency",
     "profile sequential sends one request at a time; use profile concurrent"),
    ({"load": {"profile": "poisson"}}, "load.rate", "required for profile poisson (requests per second)"),
    ({"load": {"profile": "concurrent", "rate": 2.0}}, "load.rate", "only for profile poisson (this load is "
                                                                    "concurrent)"),
    ({"load": {"profile": "concurrent", "concurrency": [2, 2]}}, "load.concurrency", "duplicate level(s) in [2, 2]"),
    ({"load": {"profile": "concurrent", "concurrency": -1}}, "load.concurrency",
     "Input should be greater than or equal to 1 (got -1)"),
    ({"load": {"profile": "concurrent", "concurrency": [1, -2]}}, "load.concurrency[1]",
     "Input should be greater than or equal to 1 (got -2)"),
    ({"load": {"profile": "concurrent", "concurrency": "lots"}}, "load.concurrency",
     "must be a whole number or a list of whole numbers (got 'lots')"),
    ({"modes": [{"name": "none"}, {"name": "prefix-cache"}, {"name": "disk-slots"}],
      "load": {"profile": "concurrent", "concurrency": 2}},
     "modes[2]", "preset disk-slots saves and restores slot 0 around each turn: it runs one request at a time "
                 "(load.concurrency 1)"),
])
def test_server_scenario_shape_is_checked(write_yaml, over, path, message):
    assert problems_of(write_yaml, server_scenario(**over)) == [(path, message)]


def test_load_levels_default_to_one_and_poisson_to_four_slots():
    assert LoadSpec().levels == [1]
    assert LoadSpec(profile="poisson", rate=2.0).levels == [4]
    assert LoadSpec(profile="concurrent", concurrency=3).levels == [3]


def test_every_preset_names_its_flags_and_only_cold_presets_are_cold():
    cold = {(k, p.name) for k, reg in PRESETS.items() for p in reg.values() if p.cold}
    assert cold == {("llama.cpp", "none"), ("vllm", "none"), ("sglang", "none"), ("openai", "none")}
    assert PRESETS["llama.cpp"]["none"].request == {"cache_prompt": False}
    assert PRESETS["vllm"]["cpu-offload"].args[-2:] == ("--kv-offloading-size", "{size}")
    assert PRESETS["sglang"]["hicache"].size == ("× the GPU cache", 2.0)


@pytest.mark.parametrize("name", ["server_multi_turn", "server_doc_qa", "vllm_cpu", "vllm_doc_qa", "vllm_offload",
                                  "sglang_hicache"])
def test_the_shipped_server_scenarios_validate(name):
    from kvbench.scenario.programs import own_python

    r = CliRunner().invoke(app, ["validate", str(ROOT / "scenarios" / f"{name}.yaml")])
    assert r.exit_code == 0, r.output
    assert f"{name}.yaml: ok (" in r.stdout
    if name == "sglang_hicache" or (name.startswith("vllm") and own_python("vllm") is None):
        # a program that is not here (`make vllm` installs vLLM's CPU build): a warning, not an error
        assert "not found in kvbench's environment or on PATH" in r.stderr


LOOPBACK = "a server it starts listens on 127.0.0.1 at a free port, never another interface"
MODEL = ("it loads the scenario's model with its own slots, context, seed and metrics (llama.cpp's --fit and "
         "--kv-unified-per-slot would change them), and gives the server a fresh key in a file of its own "
         "(--api-key-file) that its requests send, so that no other process can use its endpoints")
LLAMA_OWN = ("--host, --port, --metrics, -m, --model, -c, --ctx-size, -np, --parallel, -s, --seed, "
             "--kv-unified-per-slot, -fit, --fit, -fitc, --fit-ctx, -fitt, --fit-target, --api-key, --api-key-file")


@pytest.mark.parametrize("where", ["engine", "mode"])
@pytest.mark.parametrize("flag, says", [
    (["--host", "0.0.0.0"], f"--host: kvbench sets this itself: {LOOPBACK}"),
    (["--port=80"], f"--port=80: kvbench sets this itself: {LOOPBACK}"),
    (["--hos", "0.0.0.0"], f"--hos (a prefix of --host, which argparse takes for it): kvbench sets this itself: "
                           f"{LOOPBACK}"),
    (["--po=80"], f"--po=80 (a prefix of --port, which argparse takes for it): kvbench sets this itself: {LOOPBACK}"),
    (["--"], "--: would end the server's options, and kvbench's own flags come after it"),
    (["--metrics"], f"--metrics: kvbench sets this itself: {MODEL} (kvbench's: {LLAMA_OWN})"),
    (["-np", "1024"], f"-np: kvbench sets this itself: {MODEL} (kvbench's: {LLAMA_OWN})"),
    (["--ctx_size=99"], f"--ctx_size=99: kvbench sets this itself: {MODEL} (kvbench's: {LLAMA_OWN}"),
    (["--kv-unified-per-slot", "100000"], f"--kv-unified-per-slot: kvbench sets this itself: {MODEL}"),
    (["-fit", "on"], f"-fit: kvbench sets this itself: {MODEL}"),
    (["--api-key", "k"], f"--api-key: kvbench sets this itself: {MODEL}"),
    (["--api-key-file", "k"], f"--api-key-file: kvbench sets this itself: {MODEL}")])
def test_flags_that_would_move_the_server_off_loopback_or_off_kvbench_s_settings_are_refused(write_yaml, where,
                                                                                            flag, says):
    data = (server_scenario(engine={"kind": "llama.cpp", "args": flag}) if where == "engine" else
            server_scenario(modes=[{"name": "none", "args": flag}]))
    (path, message), = problems_of(write_yaml, data)
    assert path == ("engine.args" if where == "engine" else "modes[0].args")
    assert message.startswith(says), message


@pytest.mark.parametrize("flag", [["--hos", "0.0.0.0"], ["--max_num_seq", "9"], ["--max-num", "9"], ["--se=1"]])
def test_an_argparse_server_s_abbreviations_of_kvbench_s_flags_are_refused(write_yaml, flag):
    (path, message), = problems_of(write_yaml, server_scenario(engine={"kind": "vllm", "args": flag}))
    assert path == "engine.args" and "a prefix of --" in message and "kvbench sets this itself" in message


def test_the_flags_kvbench_sets_come_last_in_every_kind_s_command_line():
    from kvbench.bench.engines.server.launch import server_argv
    from kvbench.scenario import parse_scenario
    from kvbench.scenario.servers import preset_of

    for kind, tail in (("vllm", ["--host", "127.0.0.1", "--port", "4242", "--seed", "0", "--max-num-seqs", "2"]),
                       ("sglang", ["--model-path", "HuggingFaceTB/SmolLM2-135M-Instruct", "--host", "127.0.0.1",
                                   "--port", "4242", "--enable-metrics", "--random-seed", "0"])):
        s = parse_scenario(server_scenario(engine={"kind": kind, "binary": "/bin/sh", "args": ["--x", "1"]},
                                           model="HuggingFaceTB/SmolLM2-135M-Instruct",
                                           modes=[{"name": "none", "args": ["--y"]}]), "s.yaml")
        argv, _ = server_argv(s, preset_of(kind, s.modes[0]), s.modes[0], 4242, 2, 40, Path("/slots"))
        assert argv[-len(tail):] == tail and argv[-len(tail) - 1] == "--y"


def test_a_llama_cpp_model_must_be_a_gguf_file(write_yaml, tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    for model, message in (("/nonexistent/m.gguf", "/nonexistent/m.gguf is not a file (llama.cpp loads a .gguf "
                                                    "file)"),
                           (str(tmp_path / "notes.txt"), f"{tmp_path / 'notes.txt'} is not a GGUF file (it does not "
                                                         "start with GGUF): llama.cpp loads GGUF")):
        assert problems_of(write_yaml, server_scenario(engine={"kind": "llama.cpp", "model": model})) == [
            ("engine.model", message)]


def test_a_quantized_v_cache_without_flash_attention_is_refused_before_llama_server_starts(write_yaml):
    """From the hostile pass: validate said ok, and llama-server ended at start in every trial of the mode."""
    why = ("--cache-type-v {v} with flash attention {fa}: llama-server refuses a quantized V cache without flash "
           "attention (\"quantized V cache requires flash_attn to be enabled\"); leave -fa at auto or give on")
    modes = [{"name": "none"}, {"name": "kv-q4_0", "args": ["-fa", "off"]},
             {"name": "q", "preset": "prefix-cache", "args": ["--cache-type-v", "q5_1", "--flash-attn", "0"]},
             {"name": "ok", "preset": "kv-q8_0", "args": ["-fa", "off", "--flash-attn", "on"]},
             {"name": "k", "preset": "prefix-cache", "args": ["-ctk", "q8_0", "-fa", "off"]}]
    assert problems_of(write_yaml, server_scenario(modes=modes)) == [
        ("modes[1]", why.format(v="q4_0", fa="off")), ("modes[2]", why.format(v="q5_1", fa="0"))]
    assert problems_of(write_yaml, server_scenario(engine={"kind": "llama.cpp", "args": ["-fa", "false"]},
                                                   modes=[{"name": "kv-q8_0"}])) == [
        ("modes[0]", why.format(v="q8_0", fa="false"))]
    # from the second hostile pass: llama.cpp also reads "disabled" as off, and --a_b as --a-b
    modes = [{"name": "kv-q8_0", "args": ["-fa", "disabled"]}, {"name": "kv-q4_0", "args": ["--flash_attn", "off"]},
             {"name": "x", "preset": "prefix-cache", "args": ["--cache_type_v", "q8_0", "-fa", "off"]}]
    assert problems_of(write_yaml, server_scenario(modes=modes)) == [
        ("modes[0]", why.format(v="q8_0", fa="disabled")), ("modes[1]", why.format(v="q4_0", fa="off")),
        ("modes[2]", why.format(v="q8_0", fa="off"))]
    assert problems_of(write_yaml, server_scenario(modes=[{"name": "kv-q8_0", "args": ["--flash-attn=on"]}])) == [
        ("modes[0]", "--flash-attn=on: llama-server takes no --flag=value (it ends at start with \"invalid "
                     "argument\"): give the flag and its value as two words")]


def test_sizes_are_whole_where_the_flag_is_and_never_written_with_an_exponent(write_yaml):
    from kvbench.scenario.servers import size_text

    data = server_scenario(modes=[{"name": "none"}, {"name": "ram", "preset": "host-cache", "size": 0.5}])
    assert problems_of(write_yaml, data) == [("modes[1]", "size: 0.5 MiB: preset host-cache of llama.cpp takes a "
                                                          "whole number")]
    assert [size_text(v) for v in (1048576.0, 0.5, 2.25, 16)] == ["1048576", "0.5", "2.25", "16"]


def test_a_concurrency_level_the_conversations_cannot_fill_is_a_warning(write_yaml):
    from kvbench.scenario.checks import scenario_warnings

    s = load_scenario(write_yaml(server_scenario(load={"profile": "concurrent", "concurrency": [1, 4]})))
    assert [w for w in scenario_warnings(s) if w[0] == "load.concurrency"] == [
        ("load.concurrency", "level 4 is more than the workload's 2 conversations, whose turns go one after another: "
                             "at most 2 requests will be in flight (the report shows the concurrency each level "
                             "reached)")]
    s = load_scenario(write_yaml(server_scenario(load={"profile": "concurrent", "concurrency": 2})))
    assert [w for w in scenario_warnings(s) if w[0] == "load.concurrency"] == []


def test_a_hugging_face_kind_refuses_a_gguf_engine_model_and_says_what_to_give(write_yaml):
    for kind in ("vllm", "sglang"):
        for model in ("smollm2-135m", "/models/m.gguf"):
            data = server_scenario(engine={"kind": kind, "binary": "/bin/sh", "model": model},
                                   modes=[{"name": "none"}])
            assert problems_of(write_yaml, data) == [("engine.model", (
                f"{model} is a GGUF model and {kind} loads a Hugging Face directory: leave engine.model out "
                f"(kvbench then exports the scenario's model) or give the directory `kvbench models export {model}` "
                "prints"))]


# --- vLLM's program, its environment and what its CPU build cannot run --------------------------------------------

def test_engine_python_runs_the_engine_s_module_and_needs_consent(write_yaml):
    import sys

    from kvbench.bench.engines.server.launch import server_argv
    from kvbench.scenario.programs import Program, consent_needed, own_python, server_program

    s = load_scenario(write_yaml(server_scenario(engine={"kind": "vllm", "python": sys.executable,
                                                         "model": "HuggingFaceTB/SmolLM2-135M-Instruct"})))
    assert server_program(s.engine) == Program((sys.executable, "-I", "-m", "vllm.entrypoints.openai.api_server"),
                                               True)
    argv, env = server_argv(s, preset_of("vllm", s.modes[0]), s.modes[0], 4242, 2, 640, Path("/slots"),
                            kv_bytes=3 * 2**30 + 1)
    assert argv[:4] == [sys.executable, "-I", "-m", "vllm.entrypoints.openai.api_server"] and "serve" not in argv
    assert argv[4:10] == ["--max-model-len", "640", "--enable-prompt-tokens-details", "--dtype", "float32",
                         "--enforce-eager"]
    assert argv[-11:] == ["--no-enable-prefix-caching", "--model", "HuggingFaceTB/SmolLM2-135M-Instruct", "--host",
                          "127.0.0.1", "--port", "4242", "--seed", "0", "--max-num-seqs", "2"]
    assert env == {"VLLM_HOST_IP": "127.0.0.1", "VLLM_LOOPBACK_IP": "127.0.0.1", "VLLM_NO_USAGE_STATS": "1",
                   "DO_NOT_TRACK": "1", "VLLM_SERVER_DEV_MODE": "0", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "0",
                   "VLLM_ALLOW_INSECURE_SERIALIZATION": "0", "VLLM_CPU_KVCACHE_SPACE": "4",
                   "VLLM_CPU_OMP_THREADS_BIND": "nobind"}  # a hub id: no HF_HUB_OFFLINE, and consent needed
    assert consent_needed(s) == [
        ("engine.python", f"{sys.executable} is not a program kvbench picks itself for vllm ("
         f"{' '.join(map(str, server_program(s.engine.model_copy(update={'python': None})).argv))}): kvbench "
         "would run this program") if own_python("vllm") else
        ("engine.python", f"{sys.executable} is not a program kvbench picks itself for vllm (none found here): "
         "kvbench would run this program"),
        ("engine.model", "HuggingFaceTB/SmolLM2-135M-Instruct is no folder here: the vllm server would fetch it "
         "from the Hugging Face hub (leave engine.model out to serve the scenario's model)")]


def test_engine_python_is_for_a_python_module_kind_and_never_beside_binary(write_yaml):
    assert problems_of(write_yaml, server_scenario(engine={"kind": "llama.cpp", "python": "/usr/bin/python3"})) == [
        ("engine.python", "kind llama.cpp is a program, not a Python module; give engine.binary")]
    assert problems_of(write_yaml, server_scenario(engine={"kind": "vllm", "python": "/usr/bin/python3",
                                                           "binary": "/usr/bin/vllm"})) == [
        ("engine.binary", "not with engine.python (python runs the engine's module, binary is its program): give one")]


@pytest.mark.parametrize("device, refused", [("cpu", ["modes[2]", "modes[3]"]), ("cuda", [])])
def test_presets_vllm_s_cpu_build_cannot_run_are_refused_on_a_cpu(write_yaml, device, refused):
    from kvbench.scenario.programs import cpu_refusals
    from kvbench.serving.vllm import CPU_OFFLOAD_REFUSED

    s = load_scenario(write_yaml(server_scenario(engine={"kind": "vllm"}, modes=[
        {"name": "none"}, {"name": "prefix-cache"}, {"name": "cpu-offload", "size": 2}, {"name": "lmcache"}])))
    found = cpu_refusals(s, device)
    assert [p for p, _ in found] == refused
    if found:
        assert found[0][1] == (f"preset cpu-offload of vllm cannot run on a CPU: vLLM's CPU build ends at start with "
                               f"\"{CPU_OFFLOAD_REFUSED}\"; run it on a GPU machine (device: cuda)")


def test_pypi_s_sglang_is_refused_on_a_cpu_unless_another_build_is_named(write_yaml):
    from kvbench.scenario.programs import cpu_refusals

    data = server_scenario(engine={"kind": "sglang"}, modes=[{"name": "none"}, {"name": "radix"}])
    [(path, why)] = cpu_refusals(load_scenario(write_yaml(data)), "cpu")
    assert path == "engine.kind" and why.startswith("sglang cannot serve on a CPU here: PyPI's sglang 0.5.23 pulls "
                                                    "sglang-kernel 0.4.10, whose wheel carries CUDA kernels only")
    assert "Could not load any common_ops library!" in why and why.endswith(
        "give engine.python for a CPU build of your own")
    assert cpu_refusals(load_scenario(write_yaml(data)), "cuda") == []
    own = server_scenario(engine={"kind": "sglang", "python": "/usr/bin/python3"}, modes=[{"name": "none"}])
    assert cpu_refusals(load_scenario(write_yaml(own)), "cpu") == []


@pytest.mark.parametrize("args, named", [
    (["--tool-server", "example.com:80"], "--tool-server"),
    (["--otlp-traces-endpoint", "example.com:4317"], "--otlp-traces-endpoint"),
    (["--generation-config", "gen"], "--generation-config"),
    (["-dpa", "10.0.0.2"], "-dpa"),
])
def test_vllm_flags_that_reach_out_need_consent_in_every_spelling(args, named):
    from kvbench.scenario.server_flags import consent_reasons

    assert consent_reasons("vllm", args) == [
        f"{args[0]}: {named} makes the server read or write files, fetch weights or code, run code or reach "
        "another machine"]


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_cold_reset_is_refused_for_a_server_kvbench_starts_fresh_per_mode(write_yaml, kind):
    engine = {"kind": kind, "cold": "reset", "reset_path": "/reset_prefix_cache"}
    assert problems_of(write_yaml, server_scenario(engine=engine)) == [
        ("engine.cold", f"reset is for a server already running (kind openai): kvbench starts a fresh {kind} server "
                        "per mode (cold: restart) and opens no reset endpoint on it")]


def test_a_missing_engine_python_is_refused_as_missing_not_as_a_consent_question(write_yaml):
    from kvbench.scenario.programs import consent_needed, server_problems

    s = load_scenario(write_yaml(server_scenario(engine={"kind": "vllm", "python": "/nonexistent/python"})))
    assert consent_needed(s) == []
    assert server_problems(s) == [("engine.python", "/nonexistent/python is not an executable file or a program on "
                                                    "PATH")]


def test_an_engine_model_path_that_is_no_folder_is_refused_for_a_hugging_face_kind(write_yaml):
    assert problems_of(write_yaml, server_scenario(engine={"kind": "vllm", "model": "/nonexistent/dir"})) == [
        ("engine.model", "/nonexistent/dir is not a folder: vllm loads a Hugging Face model directory (or a hub id "
                         "such as HuggingFaceTB/SmolLM2-135M-Instruct)")]


def test_every_python_of_kvbench_s_own_vllm_environment_is_its_own(write_yaml):
    from kvbench.scenario.programs import consent_needed, own_python

    if own_python("vllm") is None:
        pytest.skip("vLLM's CPU build is not installed in .venv/vllm, so there is no environment of kvbench's own "
                    "to compare with: `make vllm` installs it (about 3 minutes; `make test` does it first)")
    for name in ("python", "python3"):
        s = load_scenario(write_yaml(server_scenario(engine={"kind": "vllm",
                                                             "python": str(own_python("vllm").parent / name)})))
        assert consent_needed(s) == []


def test_an_openai_mode_may_name_its_own_running_server_and_the_tier_preset_must(write_yaml):
    from kvbench.scenario.programs import server_notices
    from kvbench.scenario.summary import sweep_summary

    openai = {"kind": "openai", "url": "http://127.0.0.1:8000"}
    modes = [{"name": "none"}, {"name": "prefix-cache"},
             {"name": "offload", "preset": "tier", "url": "http://10.0.0.7:8001"}]
    s = load_scenario(write_yaml(server_scenario(engine=openai, modes=modes)))
    assert s.modes[2].url == "http://10.0.0.7:8001" and s.modes[2].options == {"url": "http://10.0.0.7:8001"}
    assert sweep_summary(s).endswith("the running servers at http://127.0.0.1:8000, http://10.0.0.7:8001 serve "
                                     "their modes (kvbench starts nothing)")
    assert server_notices(s) == [("modes[2].url", "http://10.0.0.7:8001 is another machine over plain http: every "
                                                  "prompt and reply crosses the network unencrypted (use https:// "
                                                  "or a tunnel)")]
    assert problems_of(write_yaml, server_scenario(engine=openai, modes=modes[:2] + [
        {"name": "offload", "preset": "tier"}])) == [
        ("modes[2]", "url: preset tier measures the deployment with its tier on, another server than engine.url "
                     "(the tier off): give that server's base URL")]
    assert problems_of(write_yaml, server_scenario(engine=openai, modes=modes[:2] + [
        {"name": "offload", "preset": "tier", "url": "http://127.0.0.1:8001/v1"}])) == [
        ("modes[2]", "url: http://127.0.0.1:8001/v1 ends in /v1: give the server's base URL (http://127.0.0.1:8001); "
                     "kvbench adds /v1/completions, /v1/models and /metrics itself")]
    assert problems_of(write_yaml, server_scenario(modes=[{"name": "none", "url": "http://127.0.0.1:8001"}])) == [
        ("modes[0]", "url: kvbench starts llama.cpp itself for every mode; a mode's url is for kind openai (a server "
                     "already running)")]


def test_a_mode_named_after_another_preset_is_refused(write_yaml):
    modes = [{"name": "none", "preset": "prefix-cache"}, {"name": "host-cache"}]
    assert problems_of(write_yaml, server_scenario(modes=modes)) == [
        ("modes[0]", "name: none is llama.cpp's preset none, but this mode runs preset prefix-cache: a mode named "
                     "after a preset runs that preset; give this one another name")]
    load_scenario(write_yaml(server_scenario(modes=[{"name": "none"}, {"name": "prefix-cache", "preset":
                                                                       "prefix-cache"}])))


@pytest.mark.parametrize("engine, modes, path, message", [
    ({"kind": "llama.cpp", "reply_timeout_s": True}, None, "engine.reply_timeout_s",
     "must be a number above 0, at most 3,600, not true or false (got True)"),
    ({"kind": "llama.cpp", "startup_timeout_s": "30"}, None, "engine.startup_timeout_s",
     "must be a number above 0, at most 3,600, not text (write a number without quotes) (got '30')"),
    ({"kind": "openai", "url": "http://127.0.0.1:8000", "use_env_proxy": "yes"}, [{"name": "none"}],
     "engine.use_env_proxy", "Input should be a valid boolean (got 'yes')"),
    ({"kind": "llama.cpp"}, [{"name": "none"}, {"name": "host-cache", "size": True}], "modes[1].size",
     "must be a number above 0, at most 1,048,576, not true or false (got True)"),
])
def test_server_numbers_and_switches_take_no_text_or_booleans(write_yaml, engine, modes, path, message):
    over = {"engine": engine} | ({"modes": modes} if modes else {})
    assert problems_of(write_yaml, server_scenario(**over)) == [(path, message)]
