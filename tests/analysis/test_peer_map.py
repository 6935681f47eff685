"""Issue 31 (the field's formats): `kvbench map` of other tools' shared-prefix runs. Real files: GuideLLM 0.8.1 and
AIPerf 0.13.0 sent 15 requests over 5 shared prefixes of 256 tokens to llama-server, prompt cache off and on
(tests/data/peers/map, `N=15 PREFIXES=5 TOOLS="guidellm aiperf" scripts/make_peer_fixtures.sh`); and the 6-request
single-prefix files of tests/data/peers."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvbench.analysis.cost import Prices
from kvbench.analysis.peer_map import cell_of, peer_map
from kvbench.cli import app
from kvbench.results.peers import load_peers

PEERS = Path(__file__).resolve().parents[1] / "data" / "peers"
MAP = [PEERS / "map" / "guidellm" / "nocache" / "benchmarks.json", PEERS / "map" / "guidellm" / "cache" /
       "benchmarks.json", PEERS / "map" / "aiperf" / "nocache", PEERS / "map" / "aiperf" / "cache"]


def test_each_tool_s_cache_pays_over_five_prefixes_drawn_by_prefix():
    unsaid = peer_map(load_peers(MAP), Prices(2.0))[0]
    assert unsaid["why"].tolist() == ["inconclusive: the files record no machine load (--assume-quiet if it was "
                                      "quiet)"] * 2 and unsaid["map_label"].tolist() == ["inconclusive"] * 2
    table, lines = peer_map(load_peers(MAP), Prices(2.0), assume_quiet=True)
    assert lines == []
    assert table["tool"].tolist() == ["guidellm", "aiperf"]
    for r in table.to_dict("records"):
        assert (r["shared_pct"], r["prefixes"], r["prefixes_seen"], r["pairs"]) == (80, 5, 5, 15)
        assert r["map_label"] == "pays" and r["saving_ci_low"] > 0
        assert r["restore_usd_per_million"] < r["recompute_usd_per_million"]
    assert table["prompt_tokens"].tolist() == [321, 320]  # as llama-server counted GuideLLM's and AIPerf's prompts
    # Σ restore ÷ Σ recompute TTFT over the 15 paired requests, as kvbench's own map (each prefix's first visit
    # finds nothing cached)
    runs = load_peers(MAP)
    for r, (off, on) in zip(table.to_dict("records"), ((runs[0], runs[1]), (runs[2], runs[3]))):
        both = off.requests.merge(on.requests, on="key", suffixes=("_off", "_on"))
        assert len(both) == 15 and r["ttft_ratio"] == pytest.approx(both["ttft_s_on"].sum() / both["ttft_s_off"].sum())
        assert 0.4 < r["ttft_ratio"] < 0.6


def test_one_prefix_is_one_observation_however_many_requests():
    runs = load_peers([PEERS / "guidellm" / "nocache" / "benchmarks.json", PEERS / "guidellm" / "cache" /
                       "benchmarks.json"])
    table, _ = peer_map(runs, Prices(2.0))
    (r,) = table.to_dict("records")
    assert (r["pairs"], r["prefixes_seen"], r["map_label"], r["why"]) == (6, 1, "inconclusive",
                                                                         "inconclusive: 1 prefix, need 5")


def test_files_without_a_prefix_or_a_partner_are_named_not_mapped():
    runs = load_peers([PEERS / "vllm" / "cache.json", PEERS / "aiperf" / "cache"])
    assert cell_of(runs[0]) == "vllm bench serve's file does not say its shared prefix"
    assert cell_of(runs[1]) == (320, 80, 1)
    table, lines = peer_map(runs, Prices(2.0))
    assert table.empty
    assert lines == ["peers/vllm/cache.json: not mapped: vllm bench serve's file does not say its shared prefix",
                     "peers/aiperf/cache: not mapped: the only file of its cell (320 tokens, 80% shared): give the "
                     "same workload without and with the cache"]


def test_the_cli_maps_peer_files_and_writes_its_files(tmp_path):
    r = CliRunner().invoke(app, ["map", *map(str, MAP), "--out", str(tmp_path), "--assume-quiet"],
                           terminal_width=200)
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert ("guidellm/cache/benchmarks.json (guidellm, 321 tokens, 80% shared): pays (the machine assumed quiet "
            "(--assume-quiet): their files do not record its load)") in text
    r = CliRunner().invoke(app, ["map", *map(str, MAP), "--host-price", "1"])
    assert r.exit_code == 2 and "--host-price applies to kvbench runs" in r.output
    cells = pd.read_csv(tmp_path / "map_peers.csv")
    assert cells["map_label"].tolist() == ["pays", "pays"]
    assert cells["saving_pct"].tolist() == pytest.approx(
        peer_map(load_peers(MAP), Prices(2.0), assume_quiet=True)[0]["saving_pct"].tolist())


def test_a_cache_first_order_and_a_prefix_as_long_as_the_prompt_decide_nothing():
    backwards = load_peers([MAP[1], MAP[0]])
    (r,) = peer_map(backwards, Prices(2.0))[0].to_dict("records")
    assert r["map_label"] == "inconclusive" and r["why"].startswith(
        "inconclusive: the recompute side guidellm/cache/benchmarks.json reused 2590 cached prompt tokens")
    long = load_peers([MAP[0]])[0]
    long.shared_prefix_tokens = 400
    assert cell_of(long) == "its shared prefix (400 tokens) is not shorter than its prompts (321)"


def test_a_peer_reference_of_zero_ttft_maps_with_no_ratio():
    runs = load_peers(MAP[:2])
    ref = runs[0]  # the recompute side
    ref.requests["ttft_s"] = 0.0
    table, lines = peer_map(runs, Prices(2.0), assume_quiet=True)
    zero = table[table["reference"] == ref.label]
    assert len(zero) and all(math.isnan(v) for v in zero["ttft_ratio"])
    assert f"{zero['label'].iloc[0]}: TTFT ÷ n/a: the recompute side {ref.label} has no paired request with a " \
           "TTFT above 0 s, so no ratio can be taken" in lines


def test_a_restore_file_without_generated_tokens_is_named_not_the_recompute_side():
    """From the hostile pass: a restore file whose requests generated no tokens was said to be the recompute side's
    fault ("the recompute side ... has no paired request with a TTFT above 0 s")."""
    runs = load_peers(MAP[:2])
    runs[1].requests["n_output_tokens"] = 0
    _, lines = peer_map(runs, Prices(2.0), assume_quiet=True)
    assert f"{runs[1].label}: TTFT ÷ n/a: no request of it pairs with one of {runs[0].label} (a pair needs a " \
           "request that generated tokens in each file), so no ratio can be taken" in lines
    assert not any("the recompute side" in line and "TTFT above 0 s" in line for line in lines)
