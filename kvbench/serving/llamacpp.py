"""llama.cpp's ``llama-server``, started by kvbench per mode on the scenario's GGUF file.

Flags from llama-server's ``--help`` (build 11434); counters from ``tools/server/server-task.cpp`` (``to_metrics``);
the host tier is ``--cache-ram`` (MiB; its default from ``common/common.h``).
"""

from __future__ import annotations

import re
from pathlib import Path

from kvbench.serving.kind import (MIB, CounterSpec, Launch, Preset, PrivateKeys, ServerKind, counter, last_value,
                                  number, presets)

NAME = "llama.cpp"
#: llama-server's ``--cache-ram`` when the command line does not set it (MiB; ``common/common.h``).
LLAMA_CACHE_RAM_DEFAULT_MIB = 8192


def gguf_file(model_name: str) -> str:
    """The GGUF file llama-server loads for a scenario's model name (the alias ``smollm2-135m`` included).

    Raises:
        PrepareError: the model is not a GGUF file.
    """
    from kvbench.errors import PrepareError
    from kvbench.models.locate import locate

    loc = locate(model_name)
    if loc.gguf_file is None:
        raise PrepareError(f"llama.cpp loads a GGUF file; {model_name} is not one (give engine.model: a .gguf path)")
    return str(Path(loc.path) / loc.gguf_file)


def launch(at: Launch) -> tuple[list[str], list[str]]:
    """No words before the flags; kvbench's own: the model (``engine.model``, else the scenario's model's GGUF
    file: :func:`gguf_file`), 127.0.0.1 and the port, metrics on, the context of
    every slot (llama-server splits ``-c`` among its ``-np`` slots) and the seed."""
    model = at.engine_model or gguf_file(at.scenario_model)
    return [], ["-m", model, "--host", "127.0.0.1", "--port", str(at.port), "--metrics",
                "-c", str(at.ctx_per_slot * at.slots), "-np", str(at.slots), "--seed", str(at.seed)]


def host_tier(argv: list[str]) -> tuple[int | None, str]:
    """``--cache-ram`` MiB (llama-server's default where not given; 0: no host tier; negative: no limit)."""
    given = last_value(argv, ("--cache-ram", "-cram"))
    mib = number(given) if given is not None else float(LLAMA_CACHE_RAM_DEFAULT_MIB)
    if mib is None:
        return None, f"--cache-ram {given}: not a number of MiB, the size is not known from the flags"
    if mib < 0:
        return None, f"--cache-ram {given}: no limit, the size is not known from the flags"
    default = "" if given is not None else " (llama-server's default)"
    return (int(mib * MIB), f"--cache-ram {mib:g} MiB{default}") if mib else (0, "--cache-ram 0: no host tier")


def hit_counts(d: dict[str, float | None]) -> tuple[float | None, float | None]:
    """Cached and all prompt tokens: its ``prompt_tokens`` exclude the cached ones."""
    cached, processed = d["prompt_tokens_cached"], d["prompt_tokens"]
    return cached, None if cached is None or processed is None else cached + processed


#: The KV cache types that need no flash attention (llama.cpp ``common/arg.cpp``: every other is quantized).
PLAIN_CACHE_TYPES = ("f32", "f16", "bf16")
#: What llama.cpp reads as "off" (``common/arg.cpp`` ``is_falsey``, lower-cased).
FALSEY = ("off", "0", "false", "disabled")


def flag_problem(argv: list[str]) -> str | None:
    """Why llama-server would end at start with these flags, every trial of the mode failing: a ``--flag=value``
    word (it takes none: "invalid argument"), or a quantized V cache (``--cache-type-v``/``-ctv`` q8_0, q4_0...)
    with flash attention off (``-fa``/``--flash-attn`` :data:`FALSEY`; ``--a_b`` read as ``--a-b``): "quantized V
    cache requires flash_attn to be enabled" (``src/llama-context.cpp``)."""
    joined = next((a for a in argv if a.startswith("--") and "=" in a), None)
    if joined is not None:
        return (f"{joined}: llama-server takes no --flag=value (it ends at start with \"invalid argument\"): give "
                "the flag and its value as two words")
    argv = [a.replace("_", "-") if a.startswith("--") else a for a in argv]  # llama.cpp reads --a_b as --a-b
    v = last_value(argv, ("-ctv", "--cache-type-v"))
    fa = last_value(argv, ("-fa", "--flash-attn"))
    if v is not None and v not in PLAIN_CACHE_TYPES and fa is not None and fa.lower() in FALSEY:
        return (f"--cache-type-v {v} with flash attention {fa}: llama-server refuses a quantized V cache without "
                "flash attention (\"quantized V cache requires flash_attn to be enabled\"); leave -fa at auto or "
                "give on")
    return None


#: The key kvbench gives llama-server (``--api-key-file``: one key per line): with it every endpoint but ``/health``
#: and ``/v1/health`` wants ``Authorization: Bearer <key>`` (``/metrics`` and ``/slots`` too: measured on build
#: 11434), so no other process of the machine can save or restore its slots, change or read what it holds.
KEYS = PrivateKeys(config_flag="--api-key-file", request_key="api-key", file_format="lines")

#: llama-server --metrics: unlabelled counters.
COUNTERS: tuple[CounterSpec, ...] = (
    counter("prompt_tokens", "llamacpp:prompt_tokens_total", "prompt tokens evaluated, excluding cached ones (tokens)"),
    counter("prompt_tokens_cached", "llamacpp:prompt_tokens_cached_total",
            "prompt tokens reused from a slot's cache (tokens); absent in older builds"),
    counter("tokens_predicted", "llamacpp:tokens_predicted_total", "generated tokens (tokens)"),
    counter("prompt_seconds", "llamacpp:prompt_seconds_total", "time spent evaluating prompts (seconds)"),
    counter("tokens_predicted_seconds", "llamacpp:tokens_predicted_seconds_total",
            "time spent generating tokens (seconds)"),
    counter("n_decode", "llamacpp:n_decode_total",
            "llama_decode() calls, speculative and multimodal ones excluded (calls)"),
)

KIND = ServerKind(
    name=NAME,
    meaning="llama.cpp's llama-server, started by kvbench per mode",
    presets=presets(
        NAME,
        Preset("none", "no reuse: cache_prompt false, no host cache (--cache-ram 0)", ("--cache-ram", "0"),
               {"cache_prompt": False}, cold=True),
        Preset("prefix-cache", "a slot reuses its common prefix (cache_prompt), no host cache", ("--cache-ram", "0"),
               {"cache_prompt": True}),
        Preset("host-cache", "slot states kept in host RAM (--cache-ram MiB) and prefix reuse",
               ("--cache-ram", "{size}"), {"cache_prompt": True}, size=("MiB", 1024), whole_size=True, tier="host"),
        Preset("disk-slots", "kvbench saves a conversation's slot to disk after each turn and restores it before "
               "the next (--slot-save-path)", ("--cache-ram", "0", "--slot-save-path", "{slot_dir}"),
               {"cache_prompt": True}, slots=True, tier="disk"),
        Preset("kv-on-host", "KV cache in host memory, computed on the GPU (-nkvo)", ("-nkvo",),
               {"cache_prompt": True}, needs_gpu=True),
        Preset("kv-q8_0", "prefix reuse, K and V cached as q8_0 (--cache-type-k/-v q8_0): lossy, with quality "
               "columns", ("--cache-ram", "0", "--cache-type-k", "q8_0", "--cache-type-v", "q8_0"),
               {"cache_prompt": True}, lossy=True),
        Preset("kv-q4_0", "prefix reuse, K and V cached as q4_0 (--cache-type-k/-v q4_0): lossy, with quality "
               "columns", ("--cache-ram", "0", "--cache-type-k", "q4_0", "--cache-type-v", "q4_0"),
               {"cache_prompt": True}, lossy=True),
    ),
    program=("llama-server",),
    install_hint="build it with `make llama-server` (into .venv/bin) or give engine.binary",
    reserved_flags=("--metrics", "-m", "--model", "-c", "--ctx-size", "-np", "--parallel", "-s", "--seed",
                    "--kv-unified-per-slot", "-fit", "--fit", "-fitc", "--fit-ctx", "-fitt", "--fit-target",
                    "--api-key", "--api-key-file"),
    reserved_why=(" (llama.cpp's --fit and --kv-unified-per-slot would change them), and gives the server a fresh "
                  "key in a file of its own (--api-key-file) that its requests send, so that no other process can "
                  "use its endpoints"),
    private_keys=KEYS,
    consent_flags=(
        "--path", "--log-file", "--slot-save-path", "-hf", "-hfr", "--hf-repo", "-hfd", "-hfrd", "--hf-repo-draft",
        "-hff", "--hf-file", "-hfv", "-hfrv", "--hf-repo-v", "-hffv", "--hf-file-v", "-hft", "--hf-token", "-mu",
        "--model-url", "-dr", "--docker-repo", "-mm", "--mmproj", "-mmu", "--mmproj-url", "-md", "--model-draft",
        "--rpc", "--lora", "--lora-scaled", "--control-vector", "--control-vector-scaled", "-f", "--file", "-bf",
        "--binary-file", "--grammar-file", "-jf", "--json-schema-file", "--chat-template-file",
        "--ssl-key-file", "--ssl-cert-file", "-lcs", "--lookup-cache-static", "-lcd", "--lookup-cache-dynamic",
        "--models-dir", "--models-preset", "--media-path", "--webui-config-file", "--ui-config-file",
        "--spec-draft-hf", "--spec-draft-model", "--video-ffmpeg-dir", "--log-prompts-dir", "--tools",
        "--tools-runtime", "--mcp-servers-config", "--mcp-servers-json", "-ag", "--agent", "--ui-mcp-proxy",
        "--webui-mcp-proxy"),
    # its hub presets (--fim-qwen-7b-default, --gpt-oss-20b-default...) "can download weights from the internet"
    consent_pattern=(re.compile(r"--[a-z0-9.-]+-(default|spec)"), "a llama.cpp hub preset downloads weights"),
    launch=launch,
    model_format="gguf",
    protocol="completion",
    metrics_prefix="llamacpp:",
    counters=COUNTERS,
    hit_counts=hit_counts,
    host_tier=host_tier,
    prefix_preset="prefix-cache",
    cache_policy="prompt-lru",
    slot_per_unit=True,
    kv_element_bytes=2,  # f16 K and V unless --cache-type-k/-v say otherwise (kv-q8_0, kv-q4_0)
    flag_problem=flag_problem,
)
