"""The flags of a server kvbench starts: which it sets itself (a scenario may not), and which make the server act
beyond serving the scenario's model (read or write files, fetch weights or code, run code, reach another machine),
so that kvbench runs them only with ``kvbench run --trust-server-config``."""

from __future__ import annotations

import re

#: Flags kvbench sets on every server it starts: where it listens (127.0.0.1 at a free port, never another
#: interface), and per kind what it loads, its slots, context, seed and metrics. A flag that names one of these, or
#: a prefix of one (argparse, which vLLM and SGLang parse with, takes ``--hos`` for ``--host``), is refused.
RESERVED_FLAGS: dict[str, tuple[str, ...]] = {
    "": ("--host", "--port"),
    "llama.cpp": ("--metrics", "-m", "--model", "-c", "--ctx-size", "-np", "--parallel", "-s", "--seed",
                  "--kv-unified-per-slot", "-fit", "--fit", "-fitc", "--fit-ctx", "-fitt", "--fit-target"),
    "vllm": ("--model", "--max-num-seqs", "--seed", "--uds"),
    "sglang": ("--model-path", "--model", "--random-seed", "--enable-metrics"),
}

#: Server flags that make a server read or write files, fetch weights or code, run code, or send data elsewhere:
#: kvbench runs a scenario that gives one (in ``engine.args`` or a mode's ``args``) only with
#: ``--trust-server-config``; so is any flag or value that holds a "/" (a path or a URL). From the ``--help`` of
#: llama-server (build 11434), ``vllm serve`` (0.32) and ``sglang.launch_server``.
CONSENT_FLAGS: dict[str, tuple[str, ...]] = {
    "llama.cpp": (
        "--path", "--log-file", "--slot-save-path", "-hf", "-hfr", "--hf-repo", "-hfd", "-hfrd", "--hf-repo-draft",
        "-hff", "--hf-file", "-hfv", "-hfrv", "--hf-repo-v", "-hffv", "--hf-file-v", "-hft", "--hf-token", "-mu",
        "--model-url", "-dr", "--docker-repo", "-mm", "--mmproj", "-mmu", "--mmproj-url", "-md", "--model-draft",
        "--rpc", "--lora", "--lora-scaled", "--control-vector", "--control-vector-scaled", "-f", "--file", "-bf",
        "--binary-file", "--grammar-file", "-jf", "--json-schema-file", "--chat-template-file", "--api-key-file",
        "--ssl-key-file", "--ssl-cert-file", "-lcs", "--lookup-cache-static", "-lcd", "--lookup-cache-dynamic",
        "--models-dir", "--models-preset", "--media-path", "--webui-config-file", "--ui-config-file",
        "--spec-draft-hf", "--spec-draft-model", "--video-ffmpeg-dir", "--log-prompts-dir", "--tools",
        "--tools-runtime", "--mcp-servers-config", "--mcp-servers-json", "-ag", "--agent", "--ui-mcp-proxy",
        "--webui-mcp-proxy"),
    "vllm": (
        "--config", "--download-dir", "--tokenizer", "--chat-template", "--ssl-keyfile", "--ssl-certfile",
        "--ssl-ca-certs", "--allowed-local-media-path", "--lora-modules", "--hf-token", "--hf-config-path",
        "--trust-remote-code", "--middleware", "--tool-parser-plugin", "--worker-cls", "--worker-extension-cls",
        "--speculative-config", "--kv-transfer-config", "--data-parallel-address", "--log-config-file"),
    "sglang": (
        "--config", "--tokenizer-path", "--download-dir", "--chat-template", "--ssl-keyfile", "--ssl-certfile",
        "--trust-remote-code", "--lora-paths", "--dist-init-addr", "--hicache-storage-backend",
        "--speculative-draft-model-path"),
}
#: llama.cpp's hub presets (``--fim-qwen-7b-default``, ``--fim-qwen-7b-spec``, ``--gpt-oss-20b-default``...)
#: download weights (its ``--help``: "can download weights from the internet").
_HUB_PRESET = re.compile(r"--[a-z0-9.-]+-(default|spec)")
#: The kinds whose servers parse flags with argparse (a unique prefix of a long flag is taken for it).
_ARGPARSE_KINDS = ("vllm", "sglang")


def _flag_name(arg: str) -> str:
    """A command-line word as the flag it sets: before any ``=``, underscores as dashes (vLLM takes
    ``--max_num_seqs`` for ``--max-num-seqs``)."""
    name = arg.split("=", 1)[0]
    return name.replace("_", "-") if name.startswith("--") else name


def _names(arg: str, flags: tuple[str, ...]) -> str | None:
    """The flag of ``flags`` that ``arg`` sets: equal, or a long flag it abbreviates (a prefix of 3 or more
    characters after ``--``); None if none."""
    name = _flag_name(arg)
    if name in flags:
        return name
    if name.startswith("--") and len(name) > 2:
        return next((f for f in flags if f.startswith("--") and f.startswith(name)), None)
    return None


def reserved_flag_problems(kind: str, args: list[str]) -> list[str]:
    """Why kvbench refuses words of ``args`` for a ``kind`` server (one message each): a flag kvbench sets itself
    (:data:`RESERVED_FLAGS`, or a prefix of one), a bare ``--`` (after it the flags kvbench puts last would be
    taken as positional words)."""
    reserved = RESERVED_FLAGS[""] + (RESERVED_FLAGS.get(kind, ()) if kind else ())
    out = []
    for a in args:
        if a == "--":
            out.append("--: would end the server's options, and kvbench's own flags come after it")
        elif (hit := _names(a, reserved)) is not None:
            what = f"{a} (a prefix of {hit}, which argparse takes for it)" if _flag_name(a) != hit else a
            why = ("a server it starts listens on 127.0.0.1 at a free port, never another interface"
                   if hit in RESERVED_FLAGS[""] else "it loads the scenario's model with its own slots, context, "
                   "seed and metrics (llama.cpp's --fit and --kv-unified-per-slot would change them)")
            out.append(f"{what}: kvbench sets this itself: {why} (kvbench's: {', '.join(reserved)})")
    return out


def consent_reasons(kind: str, args: list[str]) -> list[str]:
    """The words of ``args`` that a ``kind`` server would act on beyond serving the scenario's model (one reason
    each): a flag of :data:`CONSENT_FLAGS` (or its prefix, for argparse kinds), a llama.cpp hub preset, a word
    that holds a "/" (a path the server would read or write, or a URL it would fetch). kvbench runs them only
    with ``--trust-server-config``."""
    flags = CONSENT_FLAGS.get(kind, ())
    out, value = [], False  # value: this word is the value of the flag before it, already named
    for a in args:
        name = _flag_name(a)
        hit = name if name in flags else _names(a, flags) if kind in _ARGPARSE_KINDS else None
        if hit is not None:
            out.append(f"{a}: {hit} makes the server read or write files, fetch weights or code, run code or "
                       "reach another machine")
        elif kind == "llama.cpp" and _HUB_PRESET.fullmatch(name):
            out.append(f"{a}: a llama.cpp hub preset downloads weights")
        elif "/" in a and not value:
            out.append(f"{a!r}: names a path or a URL the server would read, write or fetch")
        value = hit is not None and "=" not in a
    return out
