"""SGLang's server (``python -m sglang.launch_server``), started by kvbench per mode on a Hugging Face model.

Flags from ``sglang.launch_server --help``; the CPU refusal from a probe here (2026-12-03: ``pip install
sglang==0.5.23`` into a virtual environment, 3 min 15 s and 11 GB, then ``SGLANG_USE_CPU_ENGINE=1 python -m
sglang.launch_server --device cpu --attention-backend torch_native`` on SmolLM2); counters from
``python/sglang/srt/metrics/collector.py`` (builds before the HiCache breakdown report ``sglang:cached_tokens_total``
without a ``cache_source`` label: ``cached_tokens``, all sources, reads both); the host tier is ``--hicache-size`` GB or
``--hicache-ratio``.
"""

from __future__ import annotations

from kvbench.serving.kind import (CodeFlag, CounterSpec, KvSizing, Launch, Preset, PrivateKeys, ServerKind, counter,
                                  fraction_capacity, last_value, number, positive, presets)

NAME = "sglang"
#: Why PyPI's SGLang cannot serve on a CPU (measured on 0.5.23 with sglang-kernel 0.4.10).
CPU_REFUSAL = ("PyPI's sglang 0.5.23 pulls sglang-kernel 0.4.10, whose wheel carries CUDA kernels only (sm90, sm100): "
               "with SGLANG_USE_CPU_ENGINE=1 and --device cpu its server ends at import with \"[sgl_kernel] "
               "CRITICAL: Could not load any common_ops library!\" (libcuda.so.1: cannot open shared object file); "
               "SGLang's CPU backend needs sgl-kernel built from source for Intel Xeon CPUs with AMX (SGLang's "
               "\"CPU Servers\" guide)")


def launch(at: Launch) -> tuple[list[str], list[str]]:
    """No words before the flags; kvbench's own: the model (``engine.model``, else the scenario's model),
    127.0.0.1 and the port, metrics on, the seed."""
    return [], ["--model-path", at.engine_model or at.scenario_model, "--host", "127.0.0.1", "--port",
                str(at.port), "--enable-metrics", "--random-seed", str(at.seed)]


def flag_capacity(argv: list[str], at: KvSizing) -> tuple[float | None, str] | None:
    """The device pool in tokens from SGLang's flags: ``--max-total-tokens``, else ``--mem-fraction-static`` of the
    GPU's memory (:func:`~kvbench.serving.kind.fraction_capacity`); None without either (SGLang's default
    fraction depends on the GPU); ``(None, why)`` for a value SGLang would refuse."""
    given = last_value(argv, ("--max-total-tokens",))
    if given is not None:
        most = positive(number(given))
        return (most, "--max-total-tokens") if most is not None and most == int(most) else (
            None, f"--max-total-tokens {given}: not a whole number above 0")
    return fraction_capacity(argv, "--mem-fraction-static", None, at)


def host_tier(argv: list[str]) -> tuple[int | None, str]:
    """``--hicache-size`` GB; a ``--hicache-ratio`` is a multiple of the device pool, not known from flags."""
    if "--enable-hierarchical-cache" not in argv:
        return 0, "no --enable-hierarchical-cache: no host tier"
    gb = number(last_value(argv, ("--hicache-size",)))
    if gb:
        return int(gb * 1e9), f"--hicache-size {gb:g} GB"
    ratio = last_value(argv, ("--hicache-ratio",))
    return None, f"--hicache-ratio {ratio}: a multiple of the device pool, not known from the flags"


def hit_counts(d: dict[str, float | None]) -> tuple[float | None, float | None]:
    """Tokens served from any cache tier, over the requests' prompt tokens (cached ones included)."""
    return d["cached_tokens"], d["prompt_tokens"]


COUNTERS: tuple[CounterSpec, ...] = (
    counter("prompt_tokens", "sglang:prompt_tokens_total",
            "prompt tokens of the requests, cached ones included (tokens)"),
    counter("generation_tokens", "sglang:generation_tokens_total", "generated tokens (tokens)"),
    counter("cached_tokens", "sglang:cached_tokens_total", "prompt tokens served from any cache tier (tokens)"),
    counter("cached_tokens_device", "sglang:cached_tokens_total", "prompt tokens served from the device radix cache "
            "(tokens)", tier="device", cache_source="device"),
    counter("cached_tokens_host", "sglang:cached_tokens_total", "prompt tokens served from HiCache host memory "
            "(tokens)", tier="host", cache_source="host"),
    counter("cached_tokens_storage", "sglang:cached_tokens_total", "prompt tokens served from HiCache storage "
            "(tokens)", tier="storage", cache_source="storage*"),
)

#: SGLang's flags that import, load or evaluate code, read from its parser (0.5.23: plain argparse over the fields
#: of ``sglang/srt/arg_groups/fields/*.py``, which takes ``--a=b`` and unique prefixes).
CODE_FLAGS = (
    CodeFlag(("--trust-remote-code",), "runs the model folder's own Python code",
             "sglang/srt/arg_groups/fields/model.py"),
    CodeFlag(("--enable-custom-logit-processor",), "runs the dill-pickled logit processor any client sends in a "
             "request", "sglang/srt/sampling/custom_logit_processor.py"),
    CodeFlag(("--custom-weight-loader",), "imports the functions it names", "sglang/srt/arg_groups/fields/model.py"),
    CodeFlag(("--forward-hooks",), "imports the hook factories its JSON names",
             "sglang/srt/model_executor/hook_manager.py"),
    CodeFlag(("--hicache-storage-backend",), "dynamic imports the backend class --hicache-storage-backend-extra-config "
             "names", "sglang/srt/mem_cache/storage/backend_factory.py"),
    CodeFlag(("--hicache-storage-backend-extra-config",), "the module_path and class_name a dynamic storage backend "
             "imports, or an @file it reads", "sglang/srt/mem_cache/storage/backend_factory.py"),
    CodeFlag(("--unified-cache-external-linker-config",), "imports the module its linker_module_path names",
             "sglang/srt/mem_cache/unified_cache/linker_config.py"),
    CodeFlag(("--modelopt-checkpoint-restore-path",), "unpickles a ModelOpt checkpoint (mto.restore)",
             "sglang/srt/model_loader/loader.py"),
    CodeFlag(("--sidecar",), "imports the module it names and runs its main()", "sglang/srt/entrypoints/sidecar.py"),
)

#: The keys kvbench gives SGLang (0.5.23, ``sglang/srt/utils/auth.py``): with ``--api-key`` every endpoint but
#: ``/health*``, ``/ready*`` and ``/metrics*`` wants it (``/server_info`` answers the keys themselves, so it must
#: be closed too); with ``--admin-api-key`` the admin ones (``/start_profile`` writes a trace to the
#: ``output_dir`` a request names, ``/update_weights_from_disk``, ``/load_lora_adapter``, ``/configure_logging``,
#: ``/hicache/storage-backend``...) want that key and take no other. kvbench sends the first and never the
#: second. SGLang checks keys only in its HTTP server with one tokenizer worker (``launch_server``); its legacy
#: gRPC mode serves ``/start_profile`` with no key: those flags are kvbench's (:data:`RESERVED`).
KEYS = PrivateKeys(config_flag="--config", request_key="api-key", admin_keys=("admin-api-key",))
#: Flags kvbench sets itself or keeps off, so that no other process can use the server's endpoints (:data:`KEYS`).
RESERVED = ("--model-path", "--model", "--random-seed", "--enable-metrics", "--config", "--api-key",
            "--admin-api-key", "--tokenizer-worker-num", "--smg-grpc-mode", "--grpc-mode")

KIND = ServerKind(
    name=NAME,
    meaning="SGLang's server (python -m sglang.launch_server), started by kvbench per mode",
    presets=presets(
        NAME,
        Preset("none", "no radix cache (--disable-radix-cache)", ("--disable-radix-cache",), cold=True),
        Preset("radix", "the radix prefix cache on the GPU (the default)", ()),
        Preset("hicache", "radix cache with a host tier (--enable-hierarchical-cache --hicache-ratio R)",
               ("--enable-hierarchical-cache", "--hicache-ratio", "{size}"), size=("× the GPU cache", 2.0),
               tier="host"),
    ),
    python_module="sglang.launch_server",
    install_hint="pip install sglang on a GPU machine, or give engine.binary",
    reserved_flags=RESERVED,
    reserved_why=("; it gives the server fresh keys in its own --config file (--api-key, which its requests send, "
                  "and --admin-api-key, which nobody has: SGLang's admin endpoints stay closed) and keeps one "
                  "tokenizer worker and the HTTP server, the only setup where SGLang checks them"),
    private_keys=KEYS,
    consent_flags=(
        "--tokenizer-path", "--download-dir", "--chat-template", "--ssl-keyfile", "--ssl-certfile",
        "--lora-paths", "--dist-init-addr", "--speculative-draft-model-path", "--lmcache-config-file",
        "--flexkv-config-file", "--speculative-ngram-external-corpus-path", "--decrypted-config-file",
        "--decrypted-draft-config-file"),
    code_flags=CODE_FLAGS,
    argparse=True,
    launch=launch,
    model_format="hf",
    protocol="v1-completions",
    metrics_prefix="sglang:",
    counters=COUNTERS,
    hit_counts=hit_counts,
    host_tier=host_tier,
    cpu_refusal=CPU_REFUSAL,
    prefix_preset="radix",
    cache_policy="lru-tail-first",
    tier_counters=("cached_tokens_host", "cached_tokens_storage"),
    device_cache_from_flags=flag_capacity,
    tp_flags=("--tp-size", "--tp"),
    device_cache_hint="--max-total-tokens",
)
