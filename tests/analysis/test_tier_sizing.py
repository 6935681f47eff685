"""The cost of each host tier size (kvbench.analysis.tier_sizing) against the module docstring's formulas: the
feature sums against a direct per-request LRU written here, USD per 1M by hand, intervals from draws, the knee,
the size grid and the refusals."""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import pytest

from kvbench.analysis.tier_sizing import (TERMS, SizingInput, feature_sums, host_size_grid, knee, no_cache_sums,
                                          size_table)
from kvbench.errors import BadValue
from kvbench.traces.simulate import simulate
from kvbench.traces.trace import Trace


def make_trace(prompts: list[list[int]], inputs: list[int], outputs: list[int], block: int) -> Trace:
    n = len(prompts)
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in prompts])]).astype(np.int64)
    return Trace("hand", "mooncake", block, np.arange(n, dtype=np.float64), np.array(inputs, dtype=np.int64),
                 np.array(outputs, dtype=np.int64), offsets, np.concatenate(prompts).astype(np.int64),
                 np.arange(n, dtype=np.int64))


def random_trace(seed: int, n: int = 120, block: int = 4) -> Trace:
    """Requests walking a random prefix tree (as tests/traces/test_simulate.py), random output lengths."""
    rng = np.random.default_rng(seed)
    prompts: list[list[int]] = []
    next_id = 0
    for _ in range(n):
        base = prompts[rng.integers(len(prompts))] if prompts and rng.random() < 0.7 else []
        ids = base[:rng.integers(1, len(base) + 1)] if base else []
        fresh = int(rng.integers(0 if ids else 1, 6))
        prompts.append(ids + list(range(next_id, next_id + fresh)))
        next_id += fresh
    counts = np.array([len(p) for p in prompts])
    inputs = counts * block - rng.integers(0, block, size=n)
    return make_trace(prompts, inputs.tolist(), rng.integers(0, 40, size=n).tolist(), block)


def lru_hits(t: Trace, capacity: int) -> list[int]:
    """Per request, the prompt tokens an LRU of ``capacity`` blocks finds (leading run, looked up first)."""
    lru: OrderedDict[int, None] = OrderedDict()
    out = []
    for i in range(t.n_requests):
        ids = t.blocks(i).tolist()
        hit = 0
        for b in ids:
            if b not in lru:
                break
            hit += 1
        out.append(min(hit * t.block_tokens, int(t.input_tokens[i])))
        for b in ids:
            lru[b] = None
            lru.move_to_end(b)
        while len(lru) > capacity:
            lru.popitem(last=False)
    return out


CONST = {"overhead_s": 0.01, "prefill_s_per_token": 1e-3, "attention_s_per_token_pair": 1e-6,
         "restore_host_s_per_token": 1e-4, "restore_disk_s_per_token": 3e-4, "decode_s": 0.02,
         "decode_s_per_context_token": 1e-5}


def gpu_seconds(p: int, o: int, d: int, h: int, s: int, c: dict, batch: int) -> float:
    """The module docstring's GPU-s of one request, written out."""
    k = d + h + s
    n = p - k
    ttft = (c["overhead_s"] + c["prefill_s_per_token"] * n + c["attention_s_per_token_pair"] * n * (k + n / 2)
            + c["restore_host_s_per_token"] * h + (c.get("restore_disk_s_per_token") or 0) * s)
    return ttft + max(o - 1, 0) * (c["decode_s"] / batch + c["decode_s_per_context_token"] * (p + o / 2))


@pytest.mark.parametrize("seed, device, host, disk, batch", [(0, 3, 5, 0, 1), (1, 2, 4, 6, 8), (2, 0, 0, 0, 3),
                                                             (3, 10, 0, 7, 2)])
def test_feature_sums_equal_a_direct_per_request_loop(seed, device, host, disk, batch):
    t = random_trace(seed)
    curve = simulate(t)
    dev, dev_host = lru_hits(t, device), lru_hits(t, device + host)
    total = lru_hits(t, device + host + disk)
    got = feature_sums(curve, device, host, disk, batch)
    sums = np.zeros(len(TERMS))
    for i in range(t.n_requests):
        p, o = int(t.input_tokens[i]), int(t.output_tokens[i])
        k, n, steps = total[i], p - total[i], max(o - 1, 0)
        sums += [1, n, n * (k + n / 2), dev_host[i] - dev[i], total[i] - dev_host[i], steps / batch,
                 steps * (p + o / 2)]
    assert got == pytest.approx(sums, rel=1e-12)
    assert sum(dev_host) - sum(dev) > 0 or host == 0  # the cases exercise the host tier where they have one
    # nothing cached: every prompt token prefilled, the decode terms unchanged
    none = no_cache_sums(curve, batch)
    p = t.input_tokens.astype(float)
    assert none == pytest.approx([t.n_requests, p.sum(), (p * p / 2).sum(), 0, 0, sums[5], sums[6]], rel=1e-12)


def sizing(draws=None, values=None, gpus=2, gpu=3.0, host=0.5, disk=0.0, block_bytes=2**28, batch=4):
    return SizingInput(dict(values or CONST), draws, gpus, gpu, host, disk, block_bytes, batch)


TWO = make_trace([[0, 1, 2], [0, 1, 3]], [10, 11], [5, 3], 4)


def test_usd_per_million_of_two_requests_by_hand():
    curve = simulate(TWO)
    # device 1 block, host 2: the second request finds its 2 leading blocks (8 tokens) only with device + host
    assert curve.per_request(1)[1].tolist() == [0, 0] and curve.per_request(3)[1].tolist() == [0, 8]
    table = size_table(curve, sizing(), 1, [0, 2])
    per = [gpu_seconds(10, 5, 0, 0, 0, CONST, 4), gpu_seconds(11, 3, 0, 8, 0, CONST, 4)]
    # request 2 by hand: TTFT 0.01 + 3e-3 + 1e-6 × 3 × 9.5 + 1e-4 × 8; 2 steps × (0.02 / 4 + 1e-5 × 12.5)
    assert per[1] == pytest.approx(0.01 + 3e-3 + 2.85e-5 + 8e-4 + 2 * (0.005 + 1.25e-4), rel=1e-12)
    hourly = 2 * 3.0 + 0.5 * 2 * 2**28 / 2**30  # 2 GPUs, 2 host blocks of 0.25 GiB
    usd = hourly * sum(per) / 3600 / 8 * 1e6  # 8 generated tokens
    row = table.iloc[1]
    assert row["usd_per_million"] == pytest.approx(usd, rel=1e-12)
    assert row["gpu_s"] == pytest.approx(2 * sum(per) / 2, rel=1e-12)
    assert row["ttft_s"] == pytest.approx((0.01 + 0.01 + 1e-6 * 10 * 5 + 0.01 + 3e-3 + 2.85e-5 + 8e-4) / 2, rel=1e-12)
    assert (row["host_blocks"], row["host_bytes"], row["disk_bytes"]) == (2, 2**29, 0)
    assert (row["hit_rate_device"], row["hit_rate_host"], row["hit_rate_disk"]) == (0.0, 8 / 21, 0.0)
    dev = 6.0 * (gpu_seconds(10, 5, 0, 0, 0, CONST, 4) + gpu_seconds(11, 3, 0, 0, 0, CONST, 4)) / 3600 / 8 * 1e6
    assert table.iloc[0]["usd_per_million"] == pytest.approx(dev, rel=1e-12)
    assert row["saving_vs_device_pct"] == pytest.approx(100 * (1 - usd / dev), rel=1e-12)
    # no cache and the device alone are the same here (the device finds nothing)
    assert row["saving_vs_none_pct"] == pytest.approx(row["saving_vs_device_pct"], rel=1e-12)
    assert table.iloc[0]["saving_vs_device_pct"] == 0.0
    assert math.isnan(row["usd_ci_low"]) and math.isnan(row["saving_vs_device_ci_high"])  # assumed: no interval


def test_the_batch_divides_only_the_decode_step():
    curve = simulate(TWO)
    one, many = size_table(curve, sizing(batch=1), 1, [2]).iloc[0], size_table(curve, sizing(batch=4), 1, [2]).iloc[0]
    # 4 + 2 decode steps of 0.02 s, of which a batch of 4 pays a quarter: (6 × 0.02 × 3 / 4) / 2 requests × 2 GPUs
    assert one["gpu_s"] - many["gpu_s"] == pytest.approx(6 * 0.02 * 0.75, rel=1e-9)
    assert one["ttft_s"] == many["ttft_s"]


def test_with_host_0_the_saving_against_the_device_is_exactly_0():
    t = random_trace(5)
    table = size_table(simulate(t), sizing(), 3, [0, 4, 16])
    assert table["saving_vs_device_pct"].iloc[0] == 0.0
    assert table["hit_rate_host"].iloc[0] == 0.0
    assert (table["saving_vs_device_pct"].iloc[1:] != 0).all()


def test_disk_tier_is_priced_in_its_rows_and_not_in_the_baselines():
    """The device alone and no cache hold no disk: neither pays for one."""
    curve = simulate(TWO)
    priced = size_table(curve, sizing(disk=10.0, host=0.0), 1, [0], disk_blocks=2).iloc[0]
    free = size_table(curve, sizing(disk=0.0, host=0.0), 1, [0], disk_blocks=2).iloc[0]
    # 1 + 2 blocks: the second request's 8 tokens come from the disk
    assert (priced["hit_rate_disk"], priced["disk_bytes"]) == (8 / 21, 2**29)
    base = 6.0 * (gpu_seconds(10, 5, 0, 0, 0, CONST, 4) + gpu_seconds(11, 3, 0, 0, 0, CONST, 4)) / 3600 / 8 * 1e6
    sums = gpu_seconds(10, 5, 0, 0, 0, CONST, 4) + gpu_seconds(11, 3, 0, 0, 8, CONST, 4)
    cost = (6.0 + 10.0 * 0.5) * sums / 3600 / 8 * 1e6
    assert priced["usd_per_million"] == pytest.approx(cost, rel=1e-12)
    assert priced["saving_vs_device_pct"] == pytest.approx(100 * (1 - cost / base), rel=1e-12)
    assert priced["saving_vs_none_pct"] == pytest.approx(100 * (1 - cost / base), rel=1e-12)
    assert free["saving_vs_none_pct"] > 0 > priced["saving_vs_none_pct"]


def test_equal_draws_give_the_point_as_interval_and_two_draws_span_theirs():
    curve = simulate(random_trace(7))
    same = {k: np.full(5, v) for k, v in CONST.items()}
    row = size_table(curve, sizing(same), 2, [6]).iloc[0]
    for name in ("usd", "saving_vs_device", "saving_vs_none"):
        point = row["usd_per_million" if name == "usd" else f"{name}_pct"]
        assert row[f"{name}_ci_low"] == pytest.approx(point, rel=1e-12)
        assert row[f"{name}_ci_high"] == pytest.approx(point, rel=1e-12)
    # two draws of the prefill: each alone gives a table; the interval spans the two
    low, high = dict(CONST, prefill_s_per_token=5e-4), dict(CONST, prefill_s_per_token=2e-3)
    two = size_table(curve, sizing({"prefill_s_per_token": np.array([5e-4, 2e-3])}), 2, [6]).iloc[0]
    a = size_table(curve, sizing(values=low), 2, [6]).iloc[0]["usd_per_million"]
    b = size_table(curve, sizing(values=high), 2, [6]).iloc[0]["usd_per_million"]
    assert a < b
    assert two["usd_ci_low"] == pytest.approx(a + 0.025 * (b - a), rel=1e-12)
    assert two["usd_ci_high"] == pytest.approx(a + 0.975 * (b - a), rel=1e-12)
    assert two["usd_ci_low"] < two["usd_per_million"] < two["usd_ci_high"]


def test_knee_priced_is_the_cheapest_and_unpriced_the_first_near_the_largest_saving():
    import pandas as pd

    t = pd.DataFrame({"usd_per_million": [5.0, 4.0, 3.5, 3.5, 3.6],
                      "saving_vs_device_pct": [0.0, 20.0, 29.8, 30.0, 30.0]})
    assert knee(t, host_priced=True) == 2  # the first of equals
    assert knee(t, host_priced=False) == 2  # 29.8 ≥ 0.99 × 30
    assert knee(t.assign(saving_vs_device_pct=[0.0, 20.0, 29.6, 30.0, 30.0]), host_priced=False) == 3
    assert knee(t.assign(saving_vs_device_pct=[0.0, -1.0, -2.0, -3.0, -4.0]), host_priced=False) == 0
    assert knee(t.iloc[:0], host_priced=True) is None
    assert knee(t.assign(usd_per_million=[5.0, math.nan, 3.0, 3.0, 3.0]), host_priced=False) is None
    # on a real table: the priced knee is the argmin of its USD
    table = size_table(simulate(random_trace(8)), sizing(host=40.0), 2, [0, 2, 4, 8, 16, 32])
    assert knee(table, True) == int(np.argmin(table["usd_per_million"].to_numpy()))


def test_host_size_grid_doubles_from_a_quarter_of_the_device_up_to_the_working_set():
    t = make_trace([list(range(600))], [2400], [1], 4)
    curve = simulate(t)
    assert curve.distinct_blocks == 600
    # 1 MiB blocks, device 100 blocks: a quarter is 25 MiB, the power of two above it 32 MiB; 500 blocks beyond it
    assert host_size_grid(curve, 100, 2**20) == [0, 32, 64, 128, 256, 512]
    # three sizes cannot reach it by doubling: the step grows to x16, so the last size still holds the working set
    assert host_size_grid(curve, 100, 2**20, most=3) == [0, 32, 512]
    # a block larger than a quarter of the device: from the block's own size
    assert host_size_grid(curve, 2, 3 * 2**20) == [0, 1, 2, 5, 10, 21, 42, 85, 170, 341, 682]
    # the device holds it all: 0 and one size
    assert host_size_grid(curve, 600, 2**20) == [0, 256]


def test_refusals_name_the_sizes_and_the_missing_restore_time():
    curve = simulate(TWO)
    for args in ((-1, [0], 0), (1, [0, -2], 0), (1, [0], -3)):
        with pytest.raises(BadValue) as e:
            size_table(curve, sizing(), *args)
        assert str(e.value) == "tier sizes must be 0 blocks or more"
    no_disk = dict(CONST, restore_disk_s_per_token=None)
    with pytest.raises(BadValue) as e:
        size_table(curve, sizing(values=no_disk), 1, [0, 2], disk_blocks=1234)
    assert str(e.value) == ("the constants have no restore time from a disk tier (restore_disk_s_per_token): no "
                            "cost for a disk tier of 1,234 blocks")
    no_host = {k: v for k, v in CONST.items() if k != "restore_host_s_per_token"}
    with pytest.raises(BadValue) as e:
        size_table(curve, sizing(values=no_host), 1, [0, 5])
    assert str(e.value) == ("the constants have no restore time from a host tier (restore_host_s_per_token): no "
                            "cost for a host tier of 5 blocks")
    # without a disk tier or a host tier the missing restore times are not needed
    assert len(size_table(curve, sizing(values=no_disk), 1, [0, 2])) == 2
    assert len(size_table(curve, sizing(values=no_host), 1, [0])) == 1
