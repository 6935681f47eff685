"""Issue 31 (the field's formats), import, on real files: GuideLLM 0.8.1, AIPerf 0.13.0 and vLLM 0.32's `vllm bench
serve` each ran the same 6-request shared-prefix workload against llama-server with its prompt cache off and on
(tests/data/peers/README.md: versions, commands, scripts/make_peer_fixtures.sh). Each file becomes requests in
kvbench's definitions; the tools agree with each other on the same server; the cache's saving is paired."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvbench.analysis.cost import Prices
from kvbench.analysis.peer_cost import compare, medians, peer_cost_table
from kvbench.cli import app
from kvbench.report.peer_cost import peer_verdicts
from kvbench.results.peers import load_peers

PEERS = Path(__file__).resolve().parents[1] / "data" / "peers"
FILES = {"guidellm": "guidellm/{}/benchmarks.json", "aiperf": "aiperf/{}", "vllm": "vllm/{}.json"}


def one(tool: str, cache: str):
    (run,) = load_peers([PEERS / FILES[tool].format(cache)])
    return run


@pytest.mark.parametrize("tool", FILES)
def test_every_file_holds_its_six_requests_with_prompts_that_pair(tool):
    off, on = one(tool, "nocache"), one(tool, "cache")
    for run in (off, on):
        assert len(run.requests) == 6 and run.requests["ok"].all() and run.concurrency == 1
        assert run.requests["prompt_tokens"].between(320, 321).all()
    c = compare(off, on)
    assert c["pairs"] == 6 and c["comparison"] == f"paired by {off.pairing}"
    assert off.pairing == ("request index" if tool == "vllm" else "prompt text")


def test_guidellm_s_tpot_is_read_as_ntpot_and_its_itl_as_tpot():
    doc = json.loads((PEERS / FILES["guidellm"].format("nocache")).read_text())
    first = doc["benchmarks"][0]["requests"]["successful"][0]
    t = first["info"]["timings"]
    # their "time per output token" × tokens is the time from the request's start to its last token: TTFT inside
    assert first["time_per_output_token_ms"] * first["output_tokens"] == pytest.approx(
        (t["last_token_iteration"] - t["request_start"]) * 1e3)
    row = one("guidellm", "nocache").requests.iloc[0]
    assert row["ntpot_s"] == pytest.approx(first["time_per_output_token_ms"] / 1e3)
    assert row["tpot_s"] == pytest.approx(first["inter_token_latency_ms"] / 1e3)
    assert row["tpot_s"] == pytest.approx((row["e2e_s"] - row["ttft_s"]) / 15)
    assert row["itl_s"] is None and row["e2e_s"] == pytest.approx(t["last_token_iteration"] - t["request_start"])


def test_aiperf_records_are_read_in_seconds_with_their_chunk_gaps():
    line = json.loads((PEERS / "aiperf" / "nocache" / "profile_export.jsonl").read_text().splitlines()[0])
    row = one("aiperf", "nocache").requests.iloc[0]
    m = line["metrics"]
    assert row["ttft_s"] == pytest.approx(m["time_to_first_token"]["value"] / 1e3)
    assert row["e2e_s"] == pytest.approx(m["request_latency"]["value"] / 1e3)
    assert row["tpot_s"] == pytest.approx(m["inter_token_latency"]["value"] / 1e3)
    assert row["itl_s"] == pytest.approx([v / 1e3 for v in m["inter_chunk_latency"]["value"]])


def test_the_three_tools_agree_on_the_same_server_within_five_percent():
    """Recomputed prompts (nocache) take the same time whichever tool sent them, and decode does whatever the
    cache; cached TTFTs differ more (GuideLLM's prompts and its 259 cached tokens are not AIPerf's)."""
    for cache, metrics in (("nocache", ("ttft_s_p50", "tpot_s_p50")), ("cache", ("tpot_s_p50",))):
        got = {tool: medians(one(tool, cache)) for tool in FILES}
        for metric in metrics:
            values = [m[metric] for m in got.values()]
            assert max(values) / min(values) < 1.05, (cache, metric, values)
    nocache = {tool: medians(one(tool, "nocache")) for tool in FILES}
    assert all(1.6 < m["ttft_s_p50"] < 1.9 and 0.017 < m["tpot_s_p50"] < 0.021 for m in nocache.values())


def test_the_cache_saving_is_paired_and_the_cached_share_is_the_files():
    table = peer_cost_table([one("guidellm", "nocache"), one("guidellm", "cache")], Prices(2.0))
    on = table.iloc[1]
    # one shared prefix (the files say so): 6 pairs of one unit decide nothing, as kvbench map says
    assert on["pairs"] == 6 and on["prefixes"] == 1 and on["verdict"] == "inconclusive: 1 prefix, need 5"
    assert on["saving_pct"] > 0 and on["saving_ci_low"] != on["saving_ci_low"]  # no interval from one unit
    quiet = peer_cost_table([one("guidellm", "nocache"), one("guidellm", "cache")], Prices(2.0), assume_quiet=True)
    assert quiet.iloc[1]["verdict"] == "inconclusive: 1 prefix, need 5"
    assert table.iloc[0]["cached_token_share"] == 0
    assert on["cached_token_share"] == pytest.approx(5 * 259 / (6 * 321))
    aiperf = peer_cost_table([one("aiperf", "nocache"), one("aiperf", "cache")], Prices(2.0)).iloc[1]
    assert aiperf["cached_token_share"] == pytest.approx(5 * 256 / (6 * 320))


def test_peer_files_decide_only_when_the_user_says_the_machine_was_quiet():
    runs = [one("vllm", "nocache"), one("vllm", "cache")]  # no declared prefix: 6 pairs by request index
    on = peer_cost_table(runs, Prices(2.0)).iloc[1]
    assert on["pairs"] == 6 and pd.isna(on["prefixes"]) and not on["assumed_quiet"]
    assert on["verdict"] == "inconclusive: the files record no machine load (--assume-quiet if it was quiet)"
    quiet = peer_cost_table(runs, Prices(2.0), assume_quiet=True).iloc[1]
    assert quiet["assumed_quiet"] and quiet["verdict"] == "" and quiet["saving_ci_low"] > 0
    line = peer_verdicts(peer_cost_table(runs, Prices(2.0), assume_quiet=True))[0]
    assert line.endswith("cheaper (the machine assumed quiet (--assume-quiet): their files do not record its load)")


def test_peer_medians_are_numpys_linear_ones():
    run = one("vllm", "nocache")
    ttfts = sorted(run.requests.loc[run.requests["ok"], "ttft_s"])  # 6 requests: between the 3rd and 4th
    assert medians(run)["ttft_s_p50"] == pytest.approx((ttfts[2] + ttfts[3]) / 2)


def test_kvbench_cost_prices_a_guidellm_result():
    path = PEERS / FILES["guidellm"].format("nocache")
    run = one("guidellm", "nocache")
    usd = 2.0 / (run.output_tokens_per_s * 3600) * 1e6
    r = CliRunner().invoke(app, ["cost", "--gpu-price", "2.0", str(path), "--out", "/dev/null/x"])
    assert r.exit_code == 2  # the cost files cannot go there, refused before any table
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        r = CliRunner().invoke(app, ["cost", "--gpu-price", "2.0", str(path), "--out", tmp], terminal_width=200)
        assert r.exit_code == 0, r.output
        assert f"{usd:,.2f}" in r.output and "guidellm" in r.output
        assert "GuideLLM's time_per_output_token_ms includes TTFT" in " ".join(r.output.split())
