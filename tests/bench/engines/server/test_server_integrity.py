"""The numbers of a server run, end to end on the fake llama-server with a prefill cost and a slow slot restore:
the restore inside TTFT and the cost (its sign decides the verdict), each mode charged for the host tier and the
slot files it holds, /metrics deltas of the measured requests only, and no verdict for a mode that never reused a
token."""

from __future__ import annotations

import pandas as pd
import pytest
from typer.testing import CliRunner

import kvbench
from kvbench.analysis.cost import Prices
from kvbench.analysis.reuse_cost import reuse_cost
from kvbench.cli import app
from fake_servers import FAKE, events, fake_env, meta, nothing_left_running, rows, run  # noqa: F401

pytestmark = pytest.mark.e2e

MODES = ("none", "prefix-cache", "ram", "disk-slots", "off")
#: The fake's slot restore (seconds), prefill cost per processed prompt token and time per generated token
#: (seconds): every request lasts over half a second, long enough for its machine-load window to tell busy or not.
RESTORE_S, PROMPT_S, TOKEN_S = 0.3, 2e-4, 0.15


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    """5 conversations × 2 turns, one after another, in none, prefix-cache, host-cache (256 MiB), disk-slots and
    a prefix-cache that sends cache_prompt false (never reuses): (run directory, tmp dir, the fake's events)."""
    tmp = tmp_path_factory.mktemp("slow")
    data = {"name": "slow", "model": "smollm2-135m", "engine": {"kind": "llama.cpp", "binary": str(FAKE)},
            "workload": {"source": "sharegpt", "seed": 0, "multi_turn": {
                "conversations": 5, "turns": 2, "interleave": "sequential", "min_prompt_tokens": 300,
                "max_prompt_tokens": 700}},
            "max_new_tokens": 4, "repeats": 1, "warmup": 0, "seed": 0,
            "modes": [{"name": "none"}, {"name": "prefix-cache"}, {"name": "ram", "preset": "host-cache", "size": 256},
                      {"name": "disk-slots"}, {"name": "off", "preset": "prefix-cache",
                                               "request": {"cache_prompt": False}}]}
    with fake_env(tmp / "record.jsonl"):
        run_dir = run(tmp, data, FAKE_RESTORE_DELAY_S=RESTORE_S, FAKE_PROMPT_S_PER_TOKEN=PROMPT_S,
                      FAKE_TOKEN_DELAY_S=TOKEN_S)
    return run_dir, tmp, events(tmp / "record.jsonl")


def by_mode(run_dir) -> dict[str, list[dict]]:
    got = rows(run_dir).values()
    return {m: [r for r in got if r["mode_label"] == m] for m in MODES}


def test_a_slot_restore_is_timed_inside_ttft_with_the_server_s_own_restore_beside(slow):
    run_dir, _, evs = slow
    got = by_mode(run_dir)
    assert all(r["status"] == "ok" for part in got.values() for r in part)
    restored = [r for r in got["disk-slots"] if r["turn_index"] > 1]
    assert len(restored) == 5 and len([e for e in evs if e["event"] == "restore"]) == 5
    for r in restored:
        assert RESTORE_S <= r["server_restore_s"] <= r["slot_restore_s"] < r["ttft_s"] <= r["e2e_s"]
        assert r["slot_save_s"] >= 0 and r["server_save_s"] >= 0
    for r in got["disk-slots"]:
        if r["turn_index"] == 1:
            assert "slot_restore_s" not in r and r["ttft_s"] < RESTORE_S + TOKEN_S
    assert not any("slot_restore_s" in r or "slot_save_s" in r for r in got["prefix-cache"])
    # the restore of a later turn costs more than recomputing its 300-700 prompt tokens (60-140 ms of prefill)
    none = {r["request_id"]: r for r in got["none"]}
    assert all(r["ttft_s"] > none[r["request_id"]]["ttft_s"] for r in restored)


def test_the_restore_s_cost_flips_the_disk_slots_saving_and_every_tier_is_charged(slow):
    run_dir, _, _ = slow
    trials = kvbench.load_results(run_dir).trials
    prices = Prices(gpu_per_hour=2.0, host_per_gib_hour=0.5, disk_per_gib_hour=0.1)
    every = reuse_cost(trials, prices).to_dict("records")
    costs = {r["mode_label"]: r for r in every if r["saving_kind"] == "reuse"}
    assert list(costs) == ["prefix-cache", "ram", "disk-slots", "off"]
    # each conversation's turns run one after another on the one slot: the slot still holds the conversation, so
    # neither tier serves a token the slot did not keep, and neither gets a tier verdict
    tiers = {r["mode_label"]: r["saving_verdict"] for r in every if r["saving_kind"] == "tier"}
    assert tiers == {m: "not engaged: its tier served nothing (0 prompt tokens served by the tier over 10 requests)"
                     for m in ("ram", "disk-slots")}
    disk = costs["disk-slots"]
    assert disk["pairs"] == 10 and disk["saving_pct"] < 0
    if disk["pairs_busy_trials"] == 0:
        assert disk["saving_ci_high"] < 0
    else:  # busy pairs never set an interval's end: the quiet pairs' interval, none with fewer than 5 of them
        assert disk["saving_ci_high"] < 0 or disk["saving_ci_high"] != disk["saving_ci_high"]
    assert (disk["units"], disk["unit"]) == (5, "conversations")
    assert disk["saving_verdict"] in ("", "inconclusive: the machine was busy during "
                                          f"{disk['pairs_busy_trials']} of 20 trials")
    assert costs["prefix-cache"]["saving_pct"] > 0
    # what each mode holds, charged at its price and named
    ram = costs["ram"]
    assert ram["store_host_bytes"] == 256 * 2**20 and ram["store_disk_bytes"] == 0
    assert (ram["charged"], ram["charged_from"]) == ("host 256.0 MiB", "host: --cache-ram 256 MiB, configured")
    tps = ram["restore_tokens_per_s"]
    assert ram["restore_usd_per_million"] == pytest.approx(prices.per_million(tps, 256 * 2**20, 0), rel=1e-12)
    assert ram["restore_usd_per_million"] > Prices(2.0).per_million(tps)
    assert costs["prefix-cache"]["store_host_bytes"] == 0
    assert (costs["prefix-cache"]["charged"], costs["prefix-cache"]["charged_from"]) == ("none", "")
    slot_files = sorted((run_dir / "servers" / "disk-slots-r0.slots").iterdir())
    documents = {r["document"] for r in by_mode(run_dir)["disk-slots"]}
    assert [p.name for p in slot_files] == sorted(f"{d}.bin" for d in documents) and len(documents) == 5
    held = [r["store_disk_bytes"] for r in by_mode(run_dir)["disk-slots"]]
    assert held[-1] == sum(p.stat().st_size for p in slot_files) and held == sorted(held)
    assert disk["store_disk_bytes"] == pd.Series(held).median() > 0
    assert disk["charged"] == f"disk {disk['store_disk_bytes'] / 2**10:,.1f} KiB"
    assert disk["charged_from"] == "disk: slot files"
    measured = {r["mode_label"]: r for r in reuse_cost(trials, prices, host_tier="measured").to_dict("records")}
    assert measured["ram"]["charged_from"].startswith("host: RSS +")
    assert measured["ram"]["charged_from"].endswith(", measured")
    assert measured["ram"]["store_host_bytes"] >= 0


def test_a_mode_that_never_reused_a_token_gets_no_verdict(slow):
    run_dir, _, _ = slow
    off = by_mode(run_dir)["off"]
    assert [r["cached_prompt_tokens"] for r in off] == [0] * 10
    (c,) = [r for r in reuse_cost(kvbench.load_results(run_dir).trials, Prices(2.0)).to_dict("records")
            if r["mode_label"] == "off"]
    assert c["saving_verdict"] == "not engaged: 0 cached prompt tokens over 10 requests"


def test_counter_deltas_are_the_measured_requests_own_and_the_holds_are_told_apart(slow):
    run_dir, _, _ = slow
    got = by_mode(run_dir)
    servers = {s["mode_label"]: s for s in meta(run_dir)["servers"]}
    for mode in ("prefix-cache", "ram", "off"):
        s, part = servers[mode], got[mode]
        assert s["metrics_holds"] == {"sent": 5, "separated": 5}  # turn 1 of 5 conversations, one at a time
        assert s["metrics_delta"]["prompt_tokens_cached"] == sum(r["cached_prompt_tokens"] for r in part)
        assert s["metrics_delta"]["prompt_tokens"] == sum(r["prompt_tokens"] - r["cached_prompt_tokens"] for r in part)
        assert s["metrics_delta"]["tokens_predicted"] == 4 * 10 and s["metrics_delta_holds"]["tokens_predicted"] == 5
    assert servers["none"]["metrics_holds"] == {"sent": 0, "separated": 0}  # a cold mode keeps nothing: no holds
    r = CliRunner().invoke(app, ["report", str(run_dir), "--out", str(run_dir / "report")])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "`prefix-cache` /metrics deltas of its measured requests over its servers: prompt_tokens " in text
    assert "; its 5 unrecorded holds: prompt_tokens " in text


def test_cost_writes_goodput_and_the_load_table(slow):
    run_dir, tmp, _ = slow
    r = CliRunner().invoke(app, ["cost", "--gpu-price", "2", "--host-price", "0.5", "--max-ttft-ms", "250",
                                 str(run_dir), "--out", str(tmp / "cost")])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "slow: `off` not engaged: 0 cached prompt tokens over 10 requests: restore " in text
    reuse = pd.read_csv(tmp / "cost" / "reuse_cost.csv")
    charged = reuse[reuse["baseline"] == "none"].set_index("mode_label")["charged"]
    assert (charged["ram"], charged["prefix-cache"]) == ("host 256.0 MiB", "none")
    assert "; held beside the device: host 256.0 MiB (host: --cache-ram 256 MiB, configured))" in text
    goodput = pd.read_csv(tmp / "cost" / "goodput.csv")
    assert list(goodput["mode_label"]) == list(MODES)
    assert (goodput["goodput_wall_per_s"] <= goodput["goodput_busy_per_s"]).all()
    assert (goodput["in_flight_max"] == 1).all() and (goodput["ttft_n"] == 10).all()
    import json

    doc = json.loads((tmp / "cost" / "cost.json").read_text())
    assert [r["mode_label"] for r in doc["server_load"]] == list(MODES)
    assert [(r["mode_label"], r["baseline"]) for r in doc["reuse"]] == [
        ("prefix-cache", "none"), ("ram", "none"), ("ram", "prefix-cache"), ("disk-slots", "none"),
        ("disk-slots", "prefix-cache"), ("off", "none")]
