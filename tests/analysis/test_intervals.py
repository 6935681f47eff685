"""Paired comparisons and verdicts: pairs by repeat, intervals over pairs, and "inconclusive" under noise."""

import statistics
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from kvbench.analysis.points import point_table
from kvbench.analysis.cost import Prices, cost_table
from kvbench.report.cost import verdicts
from kvbench.analysis.intervals import judge
from kvbench.analysis.latency import higher_percentile, itl_percentiles
from kvbench.bench.telemetry.machine_load import LoadWindow, busy_threshold_percent, other_gpu_processes
from kvbench.results.frame import trials_frame
from conftest import paired_rows


def point(table, mode, batch=1):
    return table[(table.mode_label == mode) & (table.batch_size == batch)].iloc[0]


def test_tpot_overhead_is_paired_by_repeat_with_an_interval_over_pairs():
    none = [0.100, 0.200, 0.100, 0.150, 0.100]  # the machine's speed drifts between repeats...
    full = [0.110, 0.230, 0.105, 0.180, 0.103]  # ...and `full` drifts with it: every pair is slower
    t = point_table(trials_frame(paired_rows({("none", 1): none, ("full", 1): full}), "g"))
    ratios = [f / n for f, n in zip(full, none)]
    r = point(t, "full")
    assert r["pairs"] == 5 and r["time_overhead_pct"] == pytest.approx(100 * (statistics.median(ratios) - 1))
    assert (r["time_overhead_ci_low"], r["time_overhead_ci_high"]) == pytest.approx(
        (100 * (min(ratios) - 1), 100 * (max(ratios) - 1)))
    assert r["tpot_verdict"] == ""  # decided: +10% [+3%, +20%] over 5 pairs on a quiet machine
    # unpaired, the medians (0.105 vs 0.100 s… and the ranges overlapping) would not have shown it
    assert min(full) < max(none)


def test_a_busy_machine_or_too_few_pairs_give_inconclusive():
    none, full = [0.1] * 5, [0.12] * 5
    t = point_table(trials_frame(paired_rows({("none", 1): none, ("full", 1): full},
                                      busy={("none", 1, 0), ("full", 1, 3), ("none", 1, 3)}), "g"))
    assert point(t, "full")["tpot_verdict"] == "inconclusive: the machine was busy during 3 of 10 trials"
    assert point(t, "full")["n_busy"] == 1 and point(t, "none")["n_busy"] == 2
    t = point_table(trials_frame(paired_rows({("none", 1): none[:2], ("full", 1): full[:2]}), "g"))
    assert point(t, "full")["tpot_verdict"] == "inconclusive: 2 pairs, need 5"


def test_an_offload_mode_faster_than_none_is_implausible():
    t = point_table(trials_frame(paired_rows({("none", 1): [0.2] * 5, ("hierarchical", 1): [0.1, 0.11, 0.09, 0.1, 0.12]}),
                                 "g"))
    assert point(t, "hierarchical")["tpot_verdict"] == "implausible against the plan: check for noise"


def test_judge_rules_in_order():
    assert judge(4, 0, 0, 1.1, 1.2) == "inconclusive: 4 pairs, need 5"
    assert judge(1, 0, 0, 1.1, 1.2) == "inconclusive: 1 pair, need 5"
    assert judge(5, 2, 0, 1.1, 1.2) == "inconclusive: the machine was busy during 2 of 10 trials"
    assert judge(6, 0, 3, 1.1, 1.2) == ("inconclusive: the machine's load is unknown for 3 of 12 trials (not recorded, "
                                        "or a window too short to tell)")
    assert judge(5, 0, 0, float("nan"), float("nan")) == "inconclusive: no interval"
    assert judge(5, 0, 0, 0.9, 1.2) == "inconclusive: the interval includes no change"
    assert judge(5, 0, 0, -3.0, 4.0, no_change=0.0) == "inconclusive: the interval includes no change"
    assert judge(5, 0, 0, 1.1, 1.2, implausible=True) == "implausible against the plan: check for noise"
    assert judge(5, 0, 0, 1.1, 1.2) == ""


def test_the_seed_headline_cannot_come_from_noise():
    """The issue's case: batch 1 on a CPU, `hierarchical` 64% cheaper than `none` on a busy machine."""
    none = [0.40, 0.45, 0.38, 0.50, 0.42]
    hier = [0.14, 0.15, 0.16, 0.13, 0.14]  # noise: a competing process slowed every `none` trial
    trials = trials_frame(paired_rows({("none", 1): none, ("hierarchical", 1): hier}, busy={("none", 1, r) for r in range(5)}),
                          "dialogue")
    costs = cost_table(point_table(trials), Prices(2.0), trials)
    h = costs[costs["mode"] == "hierarchical"].iloc[0]
    assert h["saving_pct"] > 50 and h["cost_verdict"] == "inconclusive: the machine was busy during 5 of 10 trials"
    line = verdicts(costs)["dialogue"][0]
    assert line.startswith("at 2048 tokens inconclusive: the machine was busy during 5 of 10 trials: "
                           "`hierarchical` ") and "lowers" not in line
    # quiet, the same figures at the same batch are implausible against the plan, not a saving
    trials = trials_frame(paired_rows({("none", 1): none, ("hierarchical", 1): hier}), "dialogue")
    costs = cost_table(point_table(trials), Prices(2.0), trials)
    assert costs[costs["mode"] == "hierarchical"]["cost_verdict"].iloc[0] == (
        "implausible against the plan: check for noise")


def test_a_saving_at_a_larger_batch_is_decided():
    """`none` fits batch 1 only (batch 4 over budget); `full` runs batch 4: more tokens/s per GPU-hour."""
    data = paired_rows({("none", 1): [0.10, 0.11, 0.10, 0.12, 0.10], ("none", 4): [0.2] * 5,
                 ("full", 4): [0.13, 0.14, 0.13, 0.15, 0.13]})
    for r in data:
        if r["mode"] == "none" and r["batch_size"] == 4:
            r["status"] = "over_budget"
    trials = trials_frame(data, "g")
    costs = cost_table(point_table(trials), Prices(2.0), trials)
    f = costs[costs["mode"] == "full"].iloc[0]
    tput = {(r["mode"], r["batch_size"], r["repeat"]): r["throughput_tokens_per_s"] for r in data}
    savings = [100 * (1 - tput[("none", 1, k)] / tput[("full", 4, k)]) for k in range(5)]
    assert f["pairs"] == 5 and f["saving_pct"] == pytest.approx(statistics.median(savings))
    assert f["cost_verdict"] == ""
    assert verdicts(costs)["g"][0].startswith("at 2048 tokens `full` lowers cost to ")
    assert "5 pairs, batch 4 vs none's 1" in verdicts(costs)["g"][0]


def test_itl_percentiles_per_trial_and_pooled_per_point():
    gaps = [0.10] * 18 + [0.50, 2.00]  # one stall, a TPOT median hides it
    assert itl_percentiles(gaps) == {"itl_p50_s": 0.10, "itl_p90_s": 0.50, "itl_p99_s": 2.00, "itl_max_s": 2.00}
    assert itl_percentiles([0.1, 0.2, 0.3, 0.4, 0.5]) == {"itl_p50_s": 0.3, "itl_p90_s": 0.5, "itl_p99_s": 0.5,
                                                           "itl_max_s": 0.5}
    assert itl_percentiles([]) == dict.fromkeys(["itl_p50_s", "itl_p90_s", "itl_p99_s", "itl_max_s"])
    data = paired_rows({("none", 1): [0.1] * 5})
    data[2]["itl_s"] = [0.1] * 14 + [3.0]
    r = point(point_table(trials_frame(data, "g")), "none")
    assert (r["itl_p50_s"], r["itl_max_s"]) == (0.1, 3.0)


def test_higher_percentile_is_the_value_at_rank_ceil_n_minus_1_times_p():
    values = [5, 1, 4, 2, 3, 9, 8, 7, 6, 10, 11]  # 11 values: rank ⌈10·p/100⌉ of 1..11
    assert [higher_percentile(values, p) for p in (0, 10, 11, 50, 90, 91, 99, 100)] == [1, 2, 3, 6, 10, 11, 11, 11]
    assert higher_percentile([0.25, 4.0], 1) == 4.0 and type(higher_percentile([1, 2], 50)) is float
    assert higher_percentile([], 99) is None and higher_percentile((), 50) is None
    with pytest.raises(ValueError, match="Percentiles must be in the range"):
        higher_percentile([1.0], 101)


def test_load_window_arithmetic(monkeypatch):
    """others = Δ machine busy − Δ own CPU over Δ wall, in percent of one CPU; steal apart; the counters' 10 ms
    ticks give a resolution of ± CPUs × tick ÷ wall, and a window that cannot tell is neither busy nor quiet."""
    import kvbench.bench.telemetry.machine_load as ml

    monkeypatch.setattr(ml, "_tick_s", lambda: 0.01)
    monkeypatch.setattr(ml, "_recent", ml.deque(maxlen=256))

    def window(*readings, gpu_others=None):
        it = iter(readings)
        monkeypatch.setattr(ml, "_read", lambda: next(it))
        return LoadWindow(cpu_count=2).stop(gpu_others=gpu_others)

    R = ml._Reading
    # 2 s: 3.5 CPU-s busy (0.4 stolen), this process 2.5 → others 50% ± 1% (2 CPUs × 10 ms ÷ 2 s): busy
    got = window(R(100.0, 50.0, 1.0, 10.0), R(102.0, 53.5, 1.4, 12.5), gpu_others=0)
    assert got == {"others_cpu_percent": pytest.approx(50.0), "steal_cpu_percent": pytest.approx(20.0),
                   "load_resolution_percent": pytest.approx(1.0), "load_window_s": pytest.approx(2.0),
                   "gpu_other_processes": 0, "busy_threshold_percent": 25.0, "machine_busy": True}
    # quiet: 1 tick of others in 2 s (0.5%) is below 25% by more than the resolution
    assert window(R(200.0, 60.0, 1.0, 20.0), R(202.0, 60.51, 1.0, 20.5))["machine_busy"] is False
    # a 40 ms window with one other tick (25%) ± 50% cannot tell: with nothing earlier to widen it back over (a
    # run's first trial), it waits out the rest of 0.5 s after the trial and reads again (1 tick in 0.5 s: quiet)
    monkeypatch.setattr(ml, "_recent", ml.deque(maxlen=256))
    slept = []
    monkeypatch.setattr(ml.time, "sleep", slept.append)
    short = window(R(300.0, 70.0, 1.0, 30.0), R(300.04, 70.05, 1.0, 30.04), R(300.5, 70.51, 1.0, 30.5))
    assert slept == [pytest.approx(0.46)] and short["load_window_s"] == pytest.approx(0.5)
    assert short["others_cpu_percent"] == pytest.approx(2.0) and short["load_resolution_percent"] == pytest.approx(4)
    assert short["machine_busy"] is False
    # a window that cannot tell: others 25% ± 4% at 0.5 s
    monkeypatch.setattr(ml, "_recent", ml.deque(maxlen=256))
    assert window(R(300.0, 70.0, 1.0, 30.0), R(300.5, 70.625, 1.0, 30.5))["machine_busy"] is None
    # the same short trial after earlier readings: widened back to the one ≥ 0.5 s before its end (0.6 s, 1 other
    # tick in all: 1.7% ± 3.3%): quiet
    monkeypatch.setattr(ml, "_recent", ml.deque([R(299.44, 69.99, 1.0, 29.45)], maxlen=256))
    widened = window(R(300.0, 70.0, 1.0, 30.0), R(300.04, 70.05, 1.0, 30.04))
    assert widened["load_window_s"] == pytest.approx(0.6) and widened["machine_busy"] is False
    assert window(R(400.0, 80.0, 1.0, 40.0), R(402.0, 80.0, 1.0, 42.0), gpu_others=1)["machine_busy"] is True
    assert busy_threshold_percent(2) == 25.0 and busy_threshold_percent(16) == 160.0
    assert other_gpu_processes([(7, 100), (9, 50)], 7) == 1
    assert other_gpu_processes([(9, 50)], 7) is None  # this process not listed: another PID namespace
    assert other_gpu_processes([], 7) == 0 and other_gpu_processes(None, 7) is None


def test_a_busy_flag_that_is_not_a_boolean_is_unknown_not_quiet():
    data = paired_rows({("none", 1): [0.1] * 5, ("full", 1): [0.12] * 5})
    data[0]["machine_busy"] = "true"  # a hand-edited row: not a quiet machine
    t = point_table(trials_frame(data, "g"))
    assert point(t, "full")["tpot_verdict"] == ("inconclusive: the machine's load is unknown for 1 of 10 trials "
                                                "(not recorded, or a window too short to tell)")
    assert point(t, "none")["n_busy"] == 0


def test_load_window_sees_a_competing_process():
    hog = subprocess.Popen([sys.executable, "-c", "import time\nt = time.monotonic()\n"
                            "while time.monotonic() - t < 3: pass"])
    try:
        time.sleep(0.3)
        w = LoadWindow(cpu_count=2)
        time.sleep(1.0)
        other = w.stop()
    finally:
        hog.kill()
        hog.wait()
    assert other["others_cpu_percent"] > 60 and other["machine_busy"] is True


def test_rows_with_a_null_repeat_pair_with_nothing():
    """Pooling an older run (rows without a repeat index) with a newer one: the old rows must not all pair with one
    `none` trial (pandas merges null keys with each other)."""
    old = paired_rows({("none", 1): [0.1] * 5, ("full", 1): [0.12] * 5})
    for r in old:
        r["repeat"] = None
    new = paired_rows({("none", 1): [0.1] * 5, ("full", 1): [0.12] * 5})
    t = point_table(trials_frame([{**r, "run_path": "old"} for r in old] + [{**r, "run_path": "new"} for r in new], "g"))
    assert point(t, "full")["pairs"] == 5  # the newer run's five, none of the old rows
    t = point_table(trials_frame(old, "g"))
    assert point(t, "full")["pairs"] == 0 and point(t, "full")["tpot_verdict"] == "inconclusive: 0 pairs, need 5"
    trials = trials_frame(old, "g")
    costs = cost_table(point_table(trials), Prices(2.0), trials)
    assert costs[costs["mode"] == "full"]["pairs"].iloc[0] == 0


def test_the_jackknife_over_units_treats_a_unit_as_one_observation():
    import math

    from kvbench.analysis.intervals import cluster_draws, jackknife_interval, ratio_interval, unit_sums

    # one value per unit: the jackknife of a mean is the t interval, mean ± t(K−1) × s/√K
    v = pd.Series([1.0, 2.0, 4.0, 7.0, 11.0])
    est, lo, hi = jackknife_interval(unit_sums(pd.Series(range(5)), [v, np.ones(5)]), lambda t: t[..., 0] / t[..., 1])
    half = 2.7764451051977987 * v.std() / math.sqrt(5)
    assert est == 5.0 and (lo, hi) == (pytest.approx(5.0 - half), pytest.approx(5.0 + half))
    # three visits of one unit are one observation: the same interval as each unit's mean once
    visits = pd.Series(np.repeat(v.to_numpy(), 3) + np.tile([-0.5, 0.0, 0.5], 5))
    assert jackknife_interval(unit_sums(pd.Series(np.repeat(range(5), 3)), [visits, np.ones(15)]),
                              lambda t: t[..., 0] / t[..., 1]) == pytest.approx((5.0, lo, hi))
    # a ratio of sums, its interval on the log scale; one unit, or fewer than 5 pairs, give no interval
    num, den = pd.Series([1.0, 2.0, 1.5, 1.0, 3.0, 0.5]), pd.Series([2.0, 4.0, 2.0, 2.0, 5.0, 1.0])
    est, lo, hi = ratio_interval(num, den, pd.Series([0, 0, 1, 1, 2, 2]))
    assert est == pytest.approx(9 / 16) and lo < est < hi
    assert ratio_interval(num, den, pd.Series([0] * 6))[1:] == (pytest.approx(np.nan, nan_ok=True),) * 2
    assert ratio_interval(num[:4], den[:4], pd.Series(range(4)))[1:] == (pytest.approx(np.nan, nan_ok=True),) * 2
    clusters = pd.Series(list("aabbbcdddeef"))
    counts, index = cluster_draws(clusters, 500, 1)
    assert counts.shape == (500, 6) and (counts.sum(axis=1) == 6).all() and list(index[:5]) == [0, 0, 1, 1, 1]


def test_an_offload_mode_that_held_nothing_off_the_device_is_not_engaged():
    data = paired_rows({("none", 1): [0.10] * 5, ("hierarchical", 1): [0.10] * 5})
    for r in data:
        r["kv_host_peak_bytes"] = r["kv_disk_peak_bytes"] = 0  # a window that holds every token
    t = point_table(trials_frame(data, "g"))
    assert point(t, "hierarchical")["tpot_verdict"] == (
        "not engaged: no KV left the device (host and disk peaks 0)")


def test_pairs_from_too_few_independent_units_carry_no_verdict():
    assert judge(12, 0, 0, 0.1, 0.3, units=(3, "conversations")) == "inconclusive: 3 conversations, need 5"
    assert judge(18, 0, 0, 0.1, 0.3, units=(1, "concurrent loads")) == "inconclusive: 1 concurrent load, need 5"
    assert judge(4, 0, 0, 0.1, 0.3, units=(3, "conversations")) == "inconclusive: 4 pairs, need 5"
    assert judge(10, 0, 0, 0.1, 0.3, units=(5, "documents")) == ""


def test_a_busy_pair_is_counted_but_never_sets_a_figure_or_an_interval_end():
    # 6 repeats: the 6th pair's offload trial ran on a busy machine, 10x slower
    data = paired_rows({("none", 1): [0.10] * 6, ("full", 1): [0.11, 0.12, 0.11, 0.12, 0.11, 1.1]},
                       busy={("full", 1, 5)})
    trials = trials_frame(data, "g")
    full = point(point_table(trials), "full")
    assert full["pairs"] == 6 and full["pairs_busy_trials"] == 1
    assert full["tpot_verdict"] == "inconclusive: the machine was busy during 1 of 12 trials"
    assert full["tpot_s_ratio"] == pytest.approx(1.1)  # the 5 quiet pairs' median, not 1.15 with the busy one
    assert full["tpot_s_ratio_ci_high"] == pytest.approx(1.2)  # the quiet range: 5 pairs, not 11 from the busy one
    costs = cost_table(point_table(trials), Prices(2.0), trials)
    saving = costs[costs["mode"] == "full"].iloc[0]
    quiet = [100 * (1 - (1 + 15 * t) / (1 + 15 * 0.10)) for t in (0.11, 0.12)]  # −6% and −12%
    assert saving["saving_ci_low"] == pytest.approx(min(quiet)) and saving["pairs_busy_trials"] == 1
    every = paired_rows({("none", 1): [0.10] * 5, ("full", 1): [0.11] * 5}, busy={("full", 1, r) for r in range(5)})
    alone = point(point_table(trials_frame(every, "g")), "full")
    assert alone["tpot_s_ratio"] == pytest.approx(1.1) and alone["tpot_s_ratio_ci_low"] != alone[
        "tpot_s_ratio_ci_low"]  # every pair busy: the figure, with no interval
