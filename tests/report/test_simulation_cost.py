"""``kvbench simulate``'s cost (kvbench.report.simulation_cost) on the committed Mooncake conversation trace: the
device cache from the GPU preset, assumed and measured constants (with the draws a map.json keeps, and their
intervals), the refusals, the advice and simulation.json's part; and the draws' round trip through write_map and
measured_constants."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvbench.analysis.break_even import BreakEvenMap
from kvbench.analysis.break_even_fit import Fit
from kvbench.analysis.cost import Prices
from kvbench.analysis.plan_break_even import measured_constants
from kvbench.analysis.tier_sizing import host_size_grid
from kvbench.errors import BadParameter, BadValue
from kvbench.report.break_even import write_map
from kvbench.report.simulation import simulate_trace
from kvbench.report.simulation_cost import advice, check_prices, size_tiers, sizing_basis, sizing_cells, sizing_doc

ROOT = Path(__file__).resolve().parents[2]
MOONCAKE = ROOT / "traces" / "mooncake" / "conversation_trace.jsonl"
#: A fit as kvbench map writes it: the values and, per constant, its bootstrap draws.
VALUES = {"overhead_s": 0.02, "prefill_s_per_token": 4e-5, "attention_s_per_token_pair": 2e-9,
          "restore_host_s_per_token": 3e-6, "decode_s": 0.006, "decode_s_per_context_token": 2e-7}


@pytest.fixture(scope="module")
def sim():
    return simulate_trace(MOONCAKE, model="llama-3.1-8b", window_args={"max_requests": 2000})


def map_json(tmp_path: Path, fit: dict, name: str = "map.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps({"constants": [{"group": "be", "mode_label": "cpu", "runs": ["r1"], **fit}]}))
    return p


def with_draws(n: int = 40, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {k: [float(v * x) for x in rng.uniform(0.8, 1.2, n)] for k, v in VALUES.items()}


def test_assumed_constants_size_the_device_from_the_gpu_preset(sim):
    s = size_tiers(sim, 2.0)
    # 80 GiB × 0.9 less 8,030,261,248 bf16 weights, ÷ 131,072 KV bytes per token = 467,291.9 tokens: 912 blocks
    assert sim.kv_bytes_per_token == 131_072 and sim.block_bytes() == 64 * 2**20
    assert int((80 * 2**30 * 0.9 - 8_030_261_248 * 2) / 131_072) == 467_291
    assert s.device_blocks == 912 and s.device_blocks * 512 == 466_944
    assert s.device_source == "1× h100's memory less 10% and the weights"
    assert (s.gpu, s.gpus, s.disk_blocks, s.decode_batch) == ("h100", 1, 0, 1)
    assert all(v.startswith("assumed") for v in s.constants.source.values())
    t = s.table
    assert t["host_blocks"].tolist() == host_size_grid(sim.curve, 912, 64 * 2**20)
    assert t["host_blocks"].tolist() == [0, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]
    assert t.iloc[0]["host_blocks"] == 0 and t.iloc[0]["saving_vs_device_pct"] == 0.0
    assert t.iloc[1]["host_bytes"] == 16 * 2**30
    assert t["usd_ci_low"].isna().all() and t["saving_vs_none_ci_high"].isna().all()  # assumed: no interval
    # unpriced host memory: the knee is the first size within 1% of the largest saving
    top = t["saving_vs_device_pct"].max()
    assert s.knee == int(np.flatnonzero(t["saving_vs_device_pct"] >= 0.99 * top)[0]) == 8
    cells = sizing_cells(sim, s)
    assert cells.iloc[0]["host tier"] == "none" and cells.iloc[1]["tokens"] == "131,072"
    assert cells[""].tolist() == [""] * 8 + ["knee", ""]


def test_advice_says_what_to_buy_and_on_which_constants(sim):
    s = size_tiers(sim, 2.0)
    text = advice(sim, s)
    assert text.startswith("Buy a host tier of about 2,048.00 GiB per copy of the model: on "
                           "conversation_trace.jsonl (2,000 requests), llama-3.1-8b on 1× h100 with a device prefix "
                           "cache of 466,944 tokens (1× h100's memory less 10% and the weights; hit rate of tokens ")
    assert text.endswith("Assumed constants (no interval: nothing was measured); requests served one at a time at "
                         "2 USD per GPU-hour; the hits are a lru simulation of the trace, exact for that policy.")
    priced = size_tiers(sim, 2.0, host_price=0.01, decode_batch=16)
    assert priced.knee == 0
    assert advice(sim, priced).startswith("Buy no host tier: on conversation_trace.jsonl (2,000 requests)")
    assert "prefills one at a time, decodes in batches of 16 at 2 USD per GPU-hour" in advice(sim, priced)


def test_sizing_doc_is_json(sim):
    s = size_tiers(sim, 2.0, host_tokens=[0, 1_000_000])
    doc = sizing_doc(s, advice(sim, s))
    back = json.loads(json.dumps(doc, allow_nan=False))["cost"]
    assert [r["host_blocks"] for r in back["rows"]] == [0, 1953]  # 1,000,000 tokens: 1,953 whole blocks
    assert back["rows"][0]["usd_ci_low"] is None
    assert back["knee_host_bytes"] == 1953 * 64 * 2**20
    assert back["constants"]["prefill_s_per_token"]["source"].startswith("assumed: 2 × active parameters")
    assert (back["gpu"], back["device_blocks"], back["gpu_per_hour"]) == ("h100", 912, 2.0)
    assert back["advice"].startswith("Buy")


def test_measured_constants_with_draws_give_finite_intervals(sim, tmp_path):
    path = map_json(tmp_path, {"values": VALUES, "draws": with_draws(), "prompt_tokens": [128, 8192]})
    s = size_tiers(sim, 2.0, basis=sizing_basis("llama-3.1-8b", constants_path=path, device_tokens=466_944))
    assert (s.device_blocks, s.device_source, s.gpu, s.gpus) == (912, "given", None, 1)
    assert set(s.constants.draws) == set(VALUES) and len(s.constants.draws["decode_s"]) == 40
    t = s.table
    for name in ("usd", "saving_vs_device", "saving_vs_none"):
        assert np.isfinite(t[f"{name}_ci_low"]).all() and np.isfinite(t[f"{name}_ci_high"]).all()
    assert (t["usd_ci_low"] < t["usd_per_million"]).all() and (t["usd_per_million"] < t["usd_ci_high"]).all()
    assert (t["usd_ci_high"] - t["usd_ci_low"] > 0.1 * t["usd_per_million"]).all()  # ±20% draws: a wide interval
    text = advice(sim, s)
    assert "on the engine the constants were measured on (1 GPU priced)" in text
    assert "Measured constants (intervals: 95% over their bootstrap draws)" in text
    r = t.iloc[s.knee]
    assert f"{r['usd_per_million']:.4g} USD per 1M generated tokens [{r['usd_ci_low']:.4g}, " in text
    assert json.dumps(sizing_doc(s, text), allow_nan=False)
    # the same fit without draws: no interval
    bare = size_tiers(sim, 2.0, basis=sizing_basis("llama-3.1-8b", constants_path=map_json(
        tmp_path, {"values": VALUES}, "bare.json"), device_tokens=466_944))
    assert bare.constants.draws is None and bare.table["usd_ci_low"].isna().all()
    assert bare.table["usd_per_million"].to_numpy() == pytest.approx(t["usd_per_million"].to_numpy(), rel=1e-12)
    assert "Measured constants without draws (no interval)" in advice(sim, bare)


def test_measured_constants_need_the_device_cache(sim, tmp_path):
    path = map_json(tmp_path, {"values": VALUES})
    with pytest.raises(BadParameter) as e:
        sizing_basis("llama-3.1-8b", constants_path=path)
    assert str(e.value) == ("measured constants (constants_path) need device_tokens: the KV tokens the measured "
                            "engine keeps on its device")
    assert e.value.params == ("device_tokens", "constants_path")
    no_model = simulate_trace(MOONCAKE, window_args={"max_requests": 10})
    with pytest.raises(BadParameter) as e:
        size_tiers(no_model, 2.0)
    assert e.value.param == "model" and str(e.value).startswith("the cost needs model: its KV bytes")
    for batch in (0, 4097, 1.5, True):
        with pytest.raises(BadParameter) as e:
            size_tiers(sim, 2.0, decode_batch=batch)
        assert str(e.value) == f"decode_batch must be a whole number from 1 to 4,096, not {batch!r}"


@pytest.mark.parametrize("prices, param, shown", [
    ((0.0,), "gpu_price", "above 0", ), ((-1.0,), "gpu_price", "above 0"), ((20_000.0,), "gpu_price", "above 0"),
    ((math.nan,), "gpu_price", "above 0"), (("2",), "gpu_price", "above 0"), ((2.0, -0.5), "host_price", "0 or more"),
    ((2.0, math.inf), "host_price", "0 or more"), ((2.0, 0.0, -1e-9), "disk_price", "0 or more"),
    ((2.0, 0.0, 10_001), "disk_price", "0 or more")])
def test_check_prices_refuses_each_price_out_of_range(prices, param, shown):
    with pytest.raises(BadParameter) as e:
        check_prices(*prices)
    bad = prices[-1]
    assert e.value.param == param
    assert str(e.value) == f"{param} must be a finite number {shown} and at most 10,000 USD, not {bad!r}"


def test_check_prices_takes_the_bounds():
    check_prices(10_000, 0, 0)
    check_prices(1e-6, 10_000.0, 10_000)


def hand_map(draws: dict[str, np.ndarray], values: dict[str, float] | None = None) -> BreakEvenMap:
    """A map of one fit made by hand (no cells), as break_even_map would hold it."""
    vals = dict(values or VALUES)
    tiers = [n.split("_")[1] for n in vals if n.startswith("restore_")]
    fit = Fit(vals, dict(vals), dict(vals), tiers, draws, prompt_tokens=(128, 4096), trials=30, units=10,
              runs=["run-a"])
    cells = pd.DataFrame(columns=["group", "mode_label", "source"])
    return BreakEvenMap(cells, {("be", "cpu"): fit})


def test_write_map_keeps_the_draws_that_measured_constants_reads(tmp_path):
    rng = np.random.default_rng(3)
    draws = {k: v * rng.uniform(0.5, 1.5, 25) for k, v in VALUES.items()}
    write_map(hand_map(draws), tmp_path, Prices(2.0))
    saved = json.loads((tmp_path / "map.json").read_text())["constants"][0]
    assert sorted(saved["draws"]) == sorted(VALUES) and len(saved["draws"]["decode_s"]) == 25
    c = measured_constants(tmp_path / "map.json")
    assert c.values == VALUES and c.prompt_tokens == (128, 4096)
    assert sorted(c.draws) == sorted(VALUES)
    for k, v in draws.items():
        assert c.draws[k] == pytest.approx(v, rel=1e-5)  # 6 significant digits
        assert c.draws[k].tolist() == [float(f"{x:.6g}") for x in v]


def test_a_draw_that_is_not_finite_is_not_written(tmp_path):
    draws = {k: np.full(4, v) for k, v in VALUES.items()} | {"decode_s": np.array([0.1, math.nan, 0.1, 0.1])}
    write_map(hand_map(draws), tmp_path, Prices(2.0))
    c = measured_constants(tmp_path / "map.json")
    assert "decode_s" not in c.draws and len(c.draws["overhead_s"]) == 4


def test_a_server_fit_s_cache_draws_stand_for_the_host_tier_s(tmp_path):
    """A server's fit restores from ``cache``: its value and its draws price the host tier."""
    values = {k: v for k, v in VALUES.items() if k != "restore_host_s_per_token"} | {"restore_cache_s_per_token": 5e-6}
    draws = {k: np.array([v, 2 * v]) for k, v in values.items()}
    write_map(hand_map(draws, values), tmp_path, Prices(2.0))
    c = measured_constants(tmp_path / "map.json")
    assert c.values["restore_host_s_per_token"] == 5e-6
    assert c.draws["restore_host_s_per_token"].tolist() == [5e-6, 1e-5]


@pytest.mark.parametrize("draws, why", [
    ({"decode_s": [0.1, 0.2], "overhead_s": [0.1]}, "every constant must have as many draws"),
    ({"decode_s": [0.1, -0.2]}, "decode_s: must be a list of finite numbers of seconds, at least 0"),
    ({"decode_s": [0.1, True]}, "decode_s: must be a list of finite numbers of seconds, at least 0"),
    ({"decode_s": []}, "decode_s: must be a list of finite numbers of seconds, at least 0"),
    ({"decode_s": 0.1}, "decode_s: must be a list of finite numbers of seconds, at least 0"),
    ({"restore_disk_s_per_token": [0.1]}, "restore_disk_s_per_token: not a constant of this fit (its constants: "
     "overhead_s, prefill_s_per_token, attention_s_per_token_pair, restore_host_s_per_token, decode_s, "
     "decode_s_per_context_token)"),
    ({}, "must map each constant to its bootstrap values"),
    ([0.1], "must map each constant to its bootstrap values")])
def test_draws_that_are_not_a_fit_s_are_refused_naming_the_key(tmp_path, draws, why):
    path = map_json(tmp_path, {"values": VALUES, "draws": draws})
    with pytest.raises(BadValue) as e:
        measured_constants(path)
    sep = "." if not why.startswith(("every", "must")) else ": "
    assert str(e.value) == f"{path}: constants[0].draws{sep}{why}"


def test_weights_that_fill_the_gpu_leave_no_device_cache_and_are_refused():
    with pytest.raises(BadParameter) as e:
        sizing_basis("qwen2.5-72b", gpu="h100")
    assert str(e.value) == ("qwen2.5-72b's weights fill 1× h100 (no room for a KV cache): give more GPUs (tp) or the "
                            "device cache (device_tokens)")
    assert sizing_basis("qwen2.5-72b", tp=4).device_tokens > 0


def test_host_sizes_given_are_priced_sorted_once_with_none_first(sim):
    s = size_tiers(sim, 2.0, host_tokens=[8_388_608, 1_048_576, 1_048_576])
    assert s.table["host_blocks"].tolist() == [0, 2048, 16384]
