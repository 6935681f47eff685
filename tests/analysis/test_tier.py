"""The tier question: a host/disk tier mode's tier saving against the same engine's prefix-cache mode, beside its
reuse saving against `none`, and a tier engaged only by its own counters."""

from __future__ import annotations

import pandas as pd
import pytest

from kvbench.analysis.cost import Prices
from kvbench.analysis.reuse_cost import reuse_cost
from kvbench.analysis.tier import baseline_label, capacity_text, tier_hits, tier_not_engaged, tier_of
from kvbench.results.frame import trials_frame

#: e2e seconds per request of each mode (4 generated tokens): none recomputes, prefix-cache keeps one slot's
#: conversation, host-cache restores the others from host RAM.
E2E = {"none": 2.0, "prefix-cache": 1.6, "host-cache": 1.0}


def server_rows(tier_hit: int | None = 300, modes: tuple[str, ...] = ("none", "prefix-cache", "host-cache"),
                level: int = 1) -> list[dict]:
    """Six conversations × turn 2, one repeat, a llama.cpp run at concurrency ``level`` (labels ``<mode>@c<level>``
    where ``level`` > 1): each mode's e2e from :data:`E2E`, slightly different per conversation."""
    rows = []
    for mode in modes:
        for k in range(6):
            label = f"{mode}@c{level}" if level > 1 else mode
            cached = 0 if mode == "none" else 512
            rows.append({"scenario": "s", "mode": mode, "mode_label": label, "engine": "llama.cpp",
                         "concurrency": level, "batch_size": 1, "status": "ok", "message": "", "repeat": 0, "run": "r1",
                         "trial_id": f"{label}-c{k}", "request_id": f"c{k}-t2", "document": f"c{k}",
                         "turn_index": 2, "warm": mode != "none", "prompt_tokens": 600, "n_output_tokens": 4,
                         "ttft_s": E2E[mode] - 0.5, "e2e_s": E2E[mode] + 0.01 * k, "start_s": 10.0 * k,
                         "tokens_restored": cached, "cached_prompt_tokens": cached,
                         "tier_hit_tokens": (tier_hit if mode == "host-cache" else 0) if tier_hit is not None
                         else None,
                         "machine_busy": False, "tokens_match": True, "server_host_tier_bytes":
                         2**30 if mode == "host-cache" else 0, "server_host_tier": "--cache-ram 1024 MiB"})
    return rows


def test_presets_name_their_tier_and_each_kind_its_baseline():
    assert [tier_of("llama.cpp", m) for m in ("host-cache", "disk-slots", "prefix-cache", "none")] == \
        ["host", "disk", None, None]
    assert [tier_of("vllm", m) for m in ("cpu-offload", "lmcache", "prefix-cache")] == ["host", "host", None]
    assert tier_of("sglang", "hicache") == "host" and tier_of(None, "full") is None
    frame = trials_frame(server_rows(level=4), "s")
    assert baseline_label(frame, frame[frame["mode"] == "host-cache"]) == "prefix-cache@c4"


def test_a_tier_mode_gets_its_tier_saving_against_prefix_cache_beside_its_reuse_saving():
    c = reuse_cost(trials_frame(server_rows(), "s"), Prices(3600.0))
    got = c[["mode_label", "baseline", "saving_kind"]].values.tolist()
    assert got == [["prefix-cache", "none", "reuse"], ["host-cache", "none", "reuse"],
                   ["host-cache", "prefix-cache", "tier"]]
    reuse, tier = c.iloc[1], c.iloc[2]
    # 4 tokens per request over Σ e2e (6 requests one at a time): the saving is one minus the ratio of e2e sums
    host, pref, none = (6 * E2E[m] + 0.15 for m in ("host-cache", "prefix-cache", "none"))
    assert reuse["saving_pct"] == pytest.approx(100 * (1 - host / none))
    assert tier["saving_pct"] == pytest.approx(100 * (1 - host / pref))
    assert tier["recompute_tokens_per_s"] == pytest.approx(24 / pref)
    assert (tier["pairs"], tier["units"], tier["unit"]) == (6, 6, "pairs")
    assert tier["saving_verdict"] == "" and tier["saving_ci_low"] > 0


def test_the_tier_saving_pays_for_the_host_memory_its_baseline_does_not_hold():
    c = reuse_cost(trials_frame(server_rows(), "s"), Prices(3600.0, host_per_gib_hour=3600.0))
    tier = c[c["saving_kind"] == "tier"].iloc[0]
    # host-cache holds 1 GiB at 1 USD per GiB-second: twice the GPU's price; prefix-cache (--cache-ram 0) nothing
    assert tier["restore_usd_per_million"] == pytest.approx(2 * 1e6 * (6 * 1.0 + 0.15) / 24)
    assert tier["recompute_usd_per_million"] == pytest.approx(1e6 * (6 * 1.6 + 0.15) / 24)
    assert tier["charged"] == "host 1.0 GiB"


def test_a_tier_whose_own_counters_did_not_move_is_not_engaged_with_the_arithmetic():
    servers = [{"mode_label": "host-cache", "repeat": 0, "working_set_tokens": 3_000,
                "device_cache_tokens": 8_448}]
    c = reuse_cost(trials_frame(server_rows(tier_hit=0), "s"), Prices(3600.0), servers=servers)
    reuse, tier = c.iloc[1], c.iloc[2]
    # its device hits still give it a reuse saving against none: the tier itself served nothing
    assert reuse["saving_verdict"] == ""
    assert tier["saving_verdict"] == ("not engaged: its tier served nothing (0 prompt tokens served by the tier over "
                                      "6 requests); the working set (3,000 tokens) fits the device cache (8,448 "
                                      "tokens)")
    unread = reuse_cost(trials_frame(server_rows(tier_hit=None), "s"), Prices(3600.0)).iloc[2]
    assert unread["saving_verdict"] == ("not measured: the tier's own counters were not read (no per-request tier "
                                        "hits, no tier counter in /metrics), so whether it served anything is "
                                        "unknown")


def test_vllm_and_sglang_tiers_engage_by_their_tier_counters_never_by_device_hits():
    warm = pd.DataFrame({"tier_hit_tokens": [None, None]})
    servers = [{"mode_label": "cpu-offload", "metrics_delta": {"prefix_cache_hits": 9_000.0,
                                                               "prompt_tokens_cached_host": 0.0,
                                                               "external_prefix_cache_hits": 0.0}},
               {"mode_label": "prefix-cache", "metrics_delta": {"prompt_tokens_cached_host": 5.0}}]
    assert tier_hits(warm, servers, "vllm", "cpu-offload") == (
        0.0, "prompt_tokens_cached_host 0, external_prefix_cache_hits 0")
    assert tier_not_engaged(warm, servers, "vllm", "cpu-offload").startswith("not engaged: its tier served nothing")
    servers[0]["metrics_delta"]["prompt_tokens_cached_host"] = 1_280.0
    assert tier_not_engaged(warm, servers, "vllm", "cpu-offload") == ""
    sg = [{"mode_label": "hicache", "metrics_delta": {"cached_tokens_device": 4e4, "cached_tokens_host": 0.0,
                                                      "cached_tokens_storage": 64.0}}]
    assert tier_hits(warm, sg, "sglang", "hicache") == (64.0, "cached_tokens_host 0, cached_tokens_storage 64")


def test_capacity_text_says_how_many_times_the_working_set_exceeds_the_device_cache():
    assert capacity_text([{"working_set_tokens": 9_000, "device_cache_tokens": 4_096},
                          {"working_set_tokens": 9_000, "device_cache_tokens": 4_500}]) == \
        "the working set (9,000 tokens) is 2.2x the device cache (4,096 tokens)"
    assert capacity_text([{"working_set_tokens": 9_000}]) == ""


def test_a_tier_mode_s_findings_give_its_ttft_against_prefix_cache_and_say_when_it_did_not_engage():
    from kvbench.analysis.tier import tier_later_turns
    from kvbench.report.server_findings import tier_lines

    t = tier_later_turns(trials_frame(server_rows(), "s"))
    assert t[["mode_label", "baseline", "pairs"]].values.tolist() == [["host-cache", "prefix-cache", 6]]
    # TTFT 0.5 s against prefix-cache's 1.1 s in every pair
    assert t["ttft_ratio"].iloc[0] == pytest.approx(0.5 / 1.1) and t["ttft_verdict"].iloc[0] == ""
    assert tier_lines(t, "s") == ["`host-cache`: its tier on top of prefix caching, TTFT ÷ `prefix-cache`'s (the same "
                                  "server, tier off) from turn 2 on: 0.45 [0.45, 0.45] over 6 request pairs: the "
                                  "tier is faster"]
    idle = tier_later_turns(trials_frame(server_rows(tier_hit=0), "s"))
    assert idle["ttft_verdict"].iloc[0].startswith("not engaged: its tier served nothing")
    assert tier_later_turns(trials_frame(server_rows(modes=("none", "prefix-cache")), "s")).empty


def test_a_server_that_began_warm_gets_no_verdict_and_no_none_means_no_reuse_saving():
    rows = server_rows()
    for r in rows:
        r["cold_verified"] = True if r["request_id"] == "c0-t2" else None
    first_tier = next(r for r in rows if r["mode"] == "host-cache")
    first_tier["cold_verified"] = False  # a running server kept what an earlier repeat left
    c = reuse_cost(trials_frame(rows, "s"), Prices(3600.0))
    assert list(c["saving_verdict"]) == [
        "", "inconclusive: 1 of 1 servers began warm (their first request reused cached tokens): not a cold start",
        "inconclusive: 1 of 2 servers began warm (their first request reused cached tokens): not a cold start"]
    # without `none` nothing recomputed every prompt: only the tier saving is taken
    c = reuse_cost(trials_frame(server_rows(modes=("prefix-cache", "host-cache")), "s"), Prices(3600.0))
    assert c[["mode_label", "baseline"]].values.tolist() == [["host-cache", "prefix-cache"]]
    # the tier row's prefill saved is what the tier itself served: 300 of 600 prompt tokens
    assert c["prefill_saved_pct"].iloc[0] == pytest.approx(50.0)


def test_a_tier_mode_whose_baseline_measured_nothing_says_so():
    rows = server_rows()
    for r in rows:
        if r["mode"] == "prefix-cache":
            r["status"], r["message"] = "error", "the server died"
    c = reuse_cost(trials_frame(rows, "s"), Prices(3600.0))
    tier = c[c["saving_kind"] == "tier"].iloc[0]
    assert (tier["baseline"], tier["pairs"]) == ("prefix-cache", 0)
    assert tier["saving_verdict"] == "no tier verdict: `prefix-cache` measured no request"
    assert capacity_text([{"working_set_tokens": 3_487, "device_cache_tokens": 3_486}]) == \
        "the working set (3,487 tokens) is 1.000x the device cache (3,486 tokens)"
