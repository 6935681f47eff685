"""vLLM's OpenAI-compatible server (``vllm serve``), started by kvbench per mode on a Hugging Face model.

Flags from ``vllm serve --help`` (0.32); counters from ``vllm/v1/metrics/loggers.py`` and the offloading
connector's metrics (prometheus_client counters, so samples end in ``_total``; 0.8-era builds called the local
prefix cache ``gpu_prefix_cache_*``); the host tier is ``--kv-offloading-size`` (GiB).
"""

from __future__ import annotations

from kvbench.serving.kind import GIB, CounterSpec, Launch, Preset, ServerKind, counter, last_value, number, presets

NAME = "vllm"


def launch(at: Launch) -> tuple[list[str], list[str]]:
    """The model first (``vllm serve``'s positional word: ``engine.model``, else the scenario's model); kvbench's
    own flags: 127.0.0.1 and the port, the seed and the slots (``--max-num-seqs``)."""
    return [at.engine_model or at.scenario_model], ["--host", "127.0.0.1", "--port", str(at.port),
                                                    "--seed", str(at.seed), "--max-num-seqs", str(at.slots)]


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

KIND = ServerKind(
    name=NAME,
    meaning="vLLM's OpenAI-compatible server (vllm serve), started by kvbench per mode",
    presets=presets(
        NAME,
        Preset("none", "no prefix caching (--no-enable-prefix-caching)", ("--no-enable-prefix-caching",), cold=True),
        Preset("prefix-cache", "automatic prefix caching on the GPU (--enable-prefix-caching)",
               ("--enable-prefix-caching",)),
        Preset("cpu-offload", "prefix caching with a native CPU tier (--kv-offloading-backend native "
               "--kv-offloading-size GiB)", ("--enable-prefix-caching", "--kv-offloading-backend", "native",
                                             "--kv-offloading-size", "{size}"), size=("GiB", 8)),
        Preset("lmcache", "prefix caching with LMCache as the KV connector (needs the lmcache package)",
               ("--enable-prefix-caching", "--kv-transfer-config",
                '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}')),
    ),
    program=("vllm", "serve"),
    install_hint="pip install vllm on a GPU machine, or give engine.binary",
    reserved_flags=("--model", "--max-num-seqs", "--seed", "--uds"),
    reserved_why="",
    consent_flags=(
        "--config", "--download-dir", "--tokenizer", "--chat-template", "--ssl-keyfile", "--ssl-certfile",
        "--ssl-ca-certs", "--allowed-local-media-path", "--lora-modules", "--hf-token", "--hf-config-path",
        "--trust-remote-code", "--middleware", "--tool-parser-plugin", "--worker-cls", "--worker-extension-cls",
        "--speculative-config", "--kv-transfer-config", "--data-parallel-address", "--log-config-file"),
    argparse=True,
    launch=launch,
    model_format="hf",
    protocol="v1-completions",
    metrics_prefix="vllm:",
    counters=COUNTERS,
    hit_counts=hit_counts,
    host_tier=host_tier,
)
