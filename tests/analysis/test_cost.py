"""kvbench cost: USD per 1M tokens from measurements or what-if figures, the paired saving and its verdict, host and
disk KV priced apart; its files written beside their place and moved onto it (a link there is replaced, never
written through), refused before any table when the report path is a file, naming the file it cannot write."""

from __future__ import annotations

import json
import shutil
import statistics

import pandas as pd
import pytest
from typer.testing import CliRunner

from conftest import ROOT, paired_rows
from kvbench.analysis.cost import Prices, cost_table
from kvbench.analysis.intervals import pct_interval
from kvbench.analysis.plan import cost_per_million
from kvbench.analysis.points import point_table
from kvbench.cli import app
from kvbench.results.frame import trials_frame


def test_cost_replaces_links_in_the_report_directory_and_never_writes_through_them(tmp_path):
    """From the re-attack: `cost` wrote cost.json, cost.csv and cost.png through links placed in report/ (a file
    outside the run changed). Each file is now written beside its place and moved onto it: the link is replaced."""
    golden = next(p for p in sorted((ROOT / "tests" / "data" / "golden").iterdir()) if p.is_dir())
    run = tmp_path / "run"
    shutil.copytree(golden, run)
    (run / "report").mkdir(exist_ok=True)
    canaries = {}
    for name in ("cost.json", "cost.csv", "cost.png"):
        canary = tmp_path / f"canary-{name}"
        canary.write_text("CANARY\n")
        (run / "report" / name).unlink(missing_ok=True)
        (run / "report" / name).symlink_to(canary)
        canaries[name] = canary
    r = CliRunner().invoke(app, ["cost", "--gpu-price", "2", str(run)])
    assert r.exit_code == 0, r.output
    for name, canary in canaries.items():
        assert canary.read_text() == "CANARY\n"
        assert (run / "report" / name).is_file() and not (run / "report" / name).is_symlink()
    assert json.loads((run / "report" / "cost.json").read_text())["prices"]["gpu_per_hour"] == 2.0
    assert oct((run / "report" / "cost.json").stat().st_mode & 0o777) == oct(0o644)
    assert not [p for p in (run / "report").iterdir() if p.name.startswith(".kvbench-")]


def test_cost_refuses_a_report_path_that_is_a_file_before_any_table_and_names_the_file_it_cannot_write(tmp_path):
    """From the second re-attack: with report/ a plain file, cost printed its whole table, then 'File exists'; with
    report/cost.json a directory, the error named report/, not cost.json."""
    golden = next(p for p in sorted((ROOT / "tests" / "data" / "golden").iterdir()) if p.is_dir())
    run = tmp_path / "run"
    shutil.copytree(golden, run)
    shutil.rmtree(run / "report", ignore_errors=True)
    (run / "report").write_text("not a directory")
    r = CliRunner().invoke(app, ["cost", "--gpu-price", "2", str(run)])
    assert r.exit_code == 2 and f"{run / 'report'} is not a directory" in r.stderr and r.stdout == "", r.stderr
    (run / "report").unlink()
    (run / "report" / "cost.json" / "x").mkdir(parents=True)
    r = CliRunner().invoke(app, ["cost", "--gpu-price", "2", str(run)])
    assert r.exit_code == 2 and f"cannot write {run / 'report' / 'cost.json'}: " in " ".join(r.stderr.split())
    assert not [p for p in (run / "report").iterdir() if p.name.startswith(".kvbench-")]


def test_cost_per_million_tokens_is_the_articles_what_if():
    assert cost_per_million(2.0, 10) == pytest.approx(55.56, abs=0.005)
    assert cost_per_million(2.0, 15) == pytest.approx(37.04, abs=0.005)
    with pytest.raises(ValueError, match=r"the price must be more than 0 and at most 1,000,000 USD per hour, not -1"):
        cost_per_million(-1, 10)
    with pytest.raises(ValueError, match=r"the throughput must be more than 0 tokens/s \(and finite\), not 0"):
        cost_per_million(2.0, 0)


def test_cost_what_if_and_bad_prices(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no results/ here
    cli = CliRunner()
    r = cli.invoke(app, ["cost", "--gpu-price", "2.0", "--base-throughput", "10", "--offload-throughput", "15"])
    assert r.exit_code == 0, r.output
    assert "55.56 → 37.04 USD (33.3% saving; 10 → 15 tokens/s)" in r.output
    r = cli.invoke(app, ["cost", "--gpu-price", "2.0", "--base-throughput", "10", "--offload-throughput", "15",
                         "--tokens-per-month", "1e9", "--engineering-cost", "5000"])
    assert "18,518.52 USD per month" in r.output and "payback of 5,000 USD: 0.3 months" in r.output
    price = "--gpu-price must be a finite number above 0 and at most 1,000,000 USD per hour, not "
    tput = "a throughput must be a finite number from 1e-06 to 1,000,000,000,000 tokens/s, not "
    for args, msg in ((["--gpu-price", "0"], price + "0"),
                      (["--gpu-price", "-2"], price + "-2"),
                      (["--gpu-price", "inf"], price + "inf"),
                      (["--gpu-price", "1e308", "--base-throughput", "1", "--offload-throughput", "2"],
                       price + "1e+308"),
                      (["--gpu-price", "2", "--host-price", "1e300"], "--host-price must be a finite number 0 or "
                       "more and at most 1,000,000 USD per GiB-hour, not 1e+300"),
                      (["--gpu-price", "2", "--tokens-per-month", "1e300"], "--tokens-per-month must be a finite "
                       "number above 0 and at most 1,000,000,000,000,000,000, not 1e+300"),
                      (["--gpu-price", "2", "--base-throughput", "0", "--offload-throughput", "5"], tput + "0"),
                      (["--gpu-price", "2", "--base-throughput", "1e-300", "--offload-throughput", "5"],
                       tput + "1e-300"),
                      (["--gpu-price", "2", "--base-throughput", "10", "--offload-throughput", "inf"], tput + "inf"),
                      (["--gpu-price", "2", "--engineering-cost", "5000", "--base-throughput", "1",
                        "--offload-throughput", "2"], "--engineering-cost needs --tokens-per-month"),
                      (["--gpu-price", "2", "--max-tpot-ms", "-5"], "--max-tpot-ms must be a finite number"),
                      (["--gpu-price", "2", "--base-throughput", "10"], "go together"),
                      (["--gpu-price", "2"], "no results given and no run under results/: give result "
                       "directories")):
        r = cli.invoke(app, ["cost", *args])
        assert r.exit_code == 2 and msg in r.output, (args, r.output)


def test_cost_from_results_where_none_never_fits(tmp_path):
    from pathlib import Path

    from kvbench.analysis.points import point_table
    from kvbench.results.load import load_results
    from kvbench.analysis.cost import Prices, cost_table
    from kvbench.report.cost import verdicts

    golden = next(p for p in sorted((Path(__file__).resolve().parents[1] / "data" / "golden").iterdir()) if p.is_dir())
    trials = load_results([golden]).trials
    table = point_table(trials)
    costs = cost_table(table, Prices(2.0, tokens_per_month=1e8), trials)
    none96 = costs[(costs.prompt_tokens == 96) & (costs["mode"] == "none")].iloc[0]
    assert none96["why"] == "over the budget at every batch size" and none96["usd_per_million"] != none96[
        "usd_per_million"]
    full96 = costs[(costs.prompt_tokens == 96) & (costs.mode_label == "full")].iloc[0]
    best = table[(table.prompt_tokens == 96) & (table.mode_label == "full")]["throughput_tokens_per_s_median"].max()
    assert full96["throughput_tokens_per_s"] == best
    assert full96["usd_per_million"] == pytest.approx(2.0 / (best * 3600) * 1e6)
    skipped = costs[costs["mode"] == "hf-offloaded"]["why"].unique().tolist()
    assert skipped == ["never measured (skipped)"]
    lines = verdicts(costs)["golden"]
    assert lines[1].startswith("at 96 tokens `none` has no cost (over the budget at every batch size); `")
    none32 = costs[(costs.prompt_tokens == 32) & (costs["mode"] == "none")].iloc[0]
    full32 = costs[(costs.prompt_tokens == 32) & (costs.mode_label == "full")].iloc[0]
    # the saving is paired: repeat r of `full` at its best batch against repeat r of `none` at none's, each trial
    # costed from its own throughput (GPU price only: cost ∝ 1 / tokens/s)
    def tput(mode, batch, r):
        return trials[(trials.prompt_tokens == 32) & (trials.mode_label == mode) & (trials.batch_size == batch)
                      & (trials.repeat == r)]["throughput_tokens_per_s"].iloc[0]

    fb, nb = int(full32["batch_size"]), int(none32["batch_size"])
    savings = [100 * (1 - tput("none", nb, r) / tput("full", fb, r)) for r in range(5)]
    assert full32["pairs"] == 5 and full32["saving_pct"] == pytest.approx(statistics.median(savings))
    assert (full32["saving_ci_low"], full32["saving_ci_high"]) == (pytest.approx(min(savings)),
                                                                   pytest.approx(max(savings)))
    assert full32["monthly_saving_usd"] == pytest.approx(
        none32["usd_per_million"] * full32["saving_pct"] / 100 * 100)  # 1e8 tokens = 100 × 1M
    # the golden run predates load recording: no verdict, and the line says why
    assert full32["cost_verdict"] == ("inconclusive: the machine's load is unknown for 10 of 10 trials (not "
                                                "recorded, or a window too short to tell)")
    r = CliRunner().invoke(app, ["cost", str(golden), "--gpu-price", "2", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cost.csv", "cost.json", "cost.png"]
    doc = json.loads((tmp_path / "cost.json").read_text())
    assert doc["prices"]["gpu_per_hour"] == 2.0 and doc["verdicts"]["golden"] == lines


def test_cost_verdicts_claim_only_what_the_pairs_decide():
    import pandas as pd

    from kvbench.report.cost import verdicts

    def row(mode, usd, prompt=256, batch=2, verdict="", pct=0.0, lo=0.0, hi=0.0, pairs=5):
        return {"group": "g", "prompt_tokens": prompt, "mode_label": mode, "mode": mode, "batch_size": batch,
                "usd_per_million": usd, "saving_pct": pct, "saving_ci_low": lo, "saving_ci_high": hi,
                "pairs": pairs, "cost_verdict": None if mode == "none" else verdict, "why": ""}

    costs = pd.DataFrame([
        row("none", 66.03), row("dynamic", 64.79, verdict="inconclusive: the interval includes no change", pct=1.9,
                                lo=-2.2, hi=4.0),
        row("none", 141.25, 1024), row("full", 154.98, 1024, pct=-9.7, lo=-12.0, hi=-6.5),
        row("none", 703.69, 2048, batch=1), row("hierarchical", 252.59, 2048, batch=1, pct=64.1, lo=55.0, hi=70.2,
                                                pairs=2, verdict="inconclusive: 2 pairs, need 5"),
        row("none", 90.0, 4096, batch=1), row("full", 60.0, 4096, batch=4, pct=33.3, lo=30.1, hi=35.9),
        # the two medians imply a 27% saving, the pairs 13%: the line prints the paired figure on both sides
        row("none", 100.0, 8192, batch=1), row("full", 73.0, 8192, batch=1, pct=13.0, lo=5.0, hi=20.0),
        # a window that held every token is `none` under another name, however cheap: not the one compared
        row("none", 50.0, 128, batch=1), row("full", 52.0, 128, batch=1, pct=-4.0, lo=-6.0, hi=-2.0),
        row("hierarchical", 49.0, 128, batch=1, pct=2.0, lo=-1.0, hi=3.0,
            verdict="not engaged: no KV left the device (host and disk peaks 0)"),
        row("none", 50.0, 64, batch=1), row("hierarchical", 49.0, 64, batch=1, pct=2.0, lo=-1.0, hi=3.0,
                                            verdict="not engaged: no KV left the device (host and disk peaks 0)"),
        # from the new-user pass: the medians put `hier` cheapest (99.14), its pairs at 99.45, `full` at 99.02:
        # "the cheapest offload mode" is the one whose line shows the lowest price
        row("none", 95.73, 32, batch=1), row("full", 99.55, 32, batch=1, pct=-3.44, lo=-5.0, hi=-1.0),
        row("hier", 99.14, 32, batch=1, pct=-3.89, lo=-6.0, hi=-0.3)])
    assert verdicts(costs)["g"] == [
        "at 256 tokens inconclusive: the interval includes no change: `dynamic` 64.78 vs `none` 66.03 USD per 1M "
        "tokens, paired saving +2% [−2%, +4%] (5 pairs, batch 2 vs none's 2)",
        "at 1024 tokens offload raises cost here: `none` 141.25 USD per 1M tokens, the cheapest offload mode `full` "
        "154.95 (paired cost +10% [+6%, +12%]; 5 pairs, batch 2 vs none's 2)",
        "at 2048 tokens inconclusive: 2 pairs, need 5: `hierarchical` 252.62 vs `none` 703.69 USD per 1M tokens, "
        "paired saving +64% [+55%, +70%] (2 pairs, batch 1 vs none's 1)",
        "at 4096 tokens `full` lowers cost to 60.03 USD per 1M tokens from none's 90.00 (paired saving +33% "
        "[+30%, +36%]; 5 pairs, batch 4 vs none's 1)",
        "at 8192 tokens `full` lowers cost to 87.00 USD per 1M tokens from none's 100.00 (paired saving +13% "
        "[+5%, +20%]; 5 pairs, batch 1 vs none's 1)",
        "at 128 tokens not engaged, so not compared: `hierarchical`",
        "at 128 tokens offload raises cost here: `none` 50.00 USD per 1M tokens, the cheapest offload mode `full` "
        "52.00 (paired cost +4% [+2%, +6%]; 5 pairs, batch 1 vs none's 1)",
        "at 64 tokens no offload mode engaged (`hierarchical`: no KV left the device): `none` 50.00 USD per 1M "
        "tokens",
        "at 32 tokens offload raises cost here: `none` 95.73 USD per 1M tokens, the cheapest offload mode `full` "
        "99.02 (paired cost +3% [+1%, +5%]; 5 pairs, batch 1 vs none's 1)",
        "at 32 tokens `hier` raises cost to 99.45 USD per 1M tokens from none's 95.73 (paired cost +4% [+0%, +6%]; "
        "5 pairs, batch 1 vs none's 1)"]


def test_cost_without_results_costs_the_newest_run_under_results(tmp_path, monkeypatch):
    import os
    import shutil
    from pathlib import Path

    golden = next(p for p in sorted((Path(__file__).resolve().parents[1] / "data" / "golden").iterdir()) if p.is_dir())
    monkeypatch.chdir(tmp_path)
    for name, started in (("old", "2026-01-01T00:00:00Z"), ("new", "2026-12-01T00:00:00Z"), ("mid", None)):
        dst = tmp_path / "results" / name
        shutil.copytree(golden, dst)
        meta = json.loads((dst / "run.json").read_text())
        meta["started_at"] = started
        (dst / "run.json").write_text(json.dumps(meta))  # mid: no started_at, its trials file's time (now) counts
    os.utime(tmp_path / "results" / "mid" / "trials.jsonl", (1.6e9, 1.6e9))  # 2020
    r = CliRunner().invoke(app, ["cost", "--gpu-price", "2.0"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("costing the newest run under results/: results/new\n")
    assert (tmp_path / "results" / "new" / "report" / "cost.json").is_file()
    assert not (tmp_path / "results" / "old" / "report").exists()


def test_points_never_compared_with_none_or_probed_once_are_not_cost_points():
    data = paired_rows({("none", 1): [0.1] * 5, ("full", 1): [0.1] * 5})
    for r in data:
        if r["mode"] == "full":
            r["tokens_match"] = None  # no `none` ran on its prompts
    trials = trials_frame(data, "g")
    costs = cost_table(point_table(trials), Prices(2.0), trials)
    assert costs[costs["mode"] == "full"]["usd_per_million"].isna().all()
    trials = trials_frame(paired_rows({("none", 1): [0.1], ("full", 1): [0.1]}), "g").assign(repeats_planned=5.0)
    costs = cost_table(point_table(trials), Prices(2.0), trials)
    assert costs["usd_per_million"].isna().all()  # one trial of a point whose scenario asked for 5


def test_cost_charges_the_host_memory_held_and_prices_disk_apart():
    """Host memory charged is what was held (pinned by torch, else the buffers' capacity), not the filled KV."""
    gib = 2**30
    data = paired_rows({("none", 1): [0.1] * 5, ("full", 1): [0.1] * 5})
    for r in data:
        if r["mode"] == "full":
            r.update(kv_host_peak_bytes=1 * gib, kv_host_allocated_peak_bytes=2 * gib, kv_disk_peak_bytes=3 * gib)
    trials = trials_frame(data, "g")
    prices = Prices(3600.0, host_per_gib_hour=3600.0, disk_per_gib_hour=7200.0)  # per second: 1 USD, 1, 2 per GiB
    full = cost_table(point_table(trials), prices, trials).set_index("mode").loc["full"]
    tput = 16 / (1.0 + 15 * 0.1)
    # (1 USD/s GPU + 2 GiB × 1 USD/s + 3 GiB × 2 USD/s) ÷ tokens/s × 10^6
    assert full["usd_per_million"] == pytest.approx((1 + 2 + 6) / tput * 1e6)
    assert (full["host_kv_bytes"], full["host_basis"], full["disk_kv_bytes"]) == (2 * gib, "allocated host buffers",
                                                                                  3 * gib)
    for r in data:
        if r["mode"] == "full":
            r["pinned_host_allocated_peak_bytes"] = 4 * gib  # CUDA: torch rounds pinned blocks up to powers of two
    trials = trials_frame(data, "g")
    full = cost_table(point_table(trials), prices, trials).set_index("mode").loc["full"]
    assert full["usd_per_million"] == pytest.approx((1 + 4 + 6) / tput * 1e6) and full["host_basis"] == (
        "pinned by torch")
    from kvbench.cli.common import PRICE_FLAGS  # the library names its argument; `kvbench cost` words it with its flag

    with pytest.raises(ValueError, match="disk_per_gib_hour must be a finite number") as exc:
        Prices(1.0, disk_per_gib_hour=-1)
    assert exc.value.worded(PRICE_FLAGS) == ("--disk-price must be a finite number 0 or more and at most 1,000,000 USD "
                                       "per GiB-hour, not -1")


def demo_costs():
    """The issue's demo: `dynamic` has the cheapest median but one busy trial (inconclusive), `hierarchical` a
    decided saving; `none` fits batch 1 only, both offload modes run batch 4."""
    none = [0.10, 0.11, 0.10, 0.12, 0.10]
    data = paired_rows({("none", 1): none, ("hierarchical", 4): [0.51, 0.52, 0.50, 0.515, 0.505],
                        ("dynamic", 4): [0.48, 0.47, 0.49, 0.475, 0.48]}, busy={("dynamic", 4, 2)})
    trials = trials_frame(data, "demo")
    return cost_table(point_table(trials), Prices(2.0), trials), data


def test_every_decided_saving_gets_a_line_before_an_undecided_cheaper_median():
    """From the issue: `cost` printed a line only for the cheapest median (`dynamic`, inconclusive: busy) while
    cost.csv held a decided saving for `hierarchical`. Every decided saving now has its line, first."""
    from kvbench.report.cost import verdicts

    costs, data = demo_costs()
    by = costs.set_index("mode")
    assert by.loc["dynamic", "usd_per_million"] < by.loc["hierarchical", "usd_per_million"]  # the cheaper median
    assert by.loc["hierarchical", "cost_verdict"] == "" and by.loc["hierarchical", "saving_pct"] > 0
    tput = {(r["mode"], r["repeat"]): r["throughput_tokens_per_s"] for r in data}
    savings = [100 * (1 - tput[("none", k)] / tput[("hierarchical", k)]) for k in range(5)]
    h = by.loc["hierarchical"]
    assert h["saving_pct"] == pytest.approx(statistics.median(savings)) == pytest.approx(15.0, abs=0.1)
    assert (h["saving_ci_low"], h["saving_ci_high"]) == (pytest.approx(min(savings)), pytest.approx(max(savings)))
    lines = verdicts(costs)["demo"]
    base = by.loc["none", "usd_per_million"]
    assert lines == [
        f"at 2048 tokens `hierarchical` lowers cost to {base * (1 - h['saving_pct'] / 100):,.2f} USD per 1M tokens "
        f"from none's {base:,.2f} (paired saving +15% [+14%, +22%]; 5 pairs, batch 4 vs none's 1)",
        f"at 2048 tokens inconclusive: the machine was busy during 1 of 10 trials: `dynamic` "
        f"{base * (1 - by.loc['dynamic', 'saving_pct'] / 100):,.2f} vs `none` {base:,.2f} USD per 1M tokens, paired "
        f"saving {pct_interval(*by.loc['dynamic', ['saving_pct', 'saving_ci_low', 'saving_ci_high']])} (5 pairs, "
        "batch 4 vs none's 1)"]


def test_the_cost_table_has_a_verdict_column():
    from kvbench.report.cost import cost_display

    costs, _ = demo_costs()
    shown = cost_display(costs).set_index("mode")
    assert list(shown.columns) == ["scenario", "prompt", "batch", "tokens/s", "USD/1M", "saving % vs none", "pairs",
                                   "verdict"]
    assert shown["verdict"].to_dict() == {"none": "ref", "hierarchical": "lowers cost",
                                          "dynamic": "inconclusive: busy in 1 of 10 trials"}
    assert shown.loc["hierarchical", "saving % vs none"] == "+15.0 [+13.5, +22.1]"


def reuse_rows(with_baseline: bool):
    """Rows as kvbench.analysis.reuse_cost.reuse_cost gives them: `host-cache` against `none` (reuse saving) and,
    with baselines, against `prefix-cache` too (tier saving)."""
    def row(mode, baseline, kind, pct, lo, hi, verdict, warm, cold):
        r = {"group": "srv", "mode_label": mode, "mode": mode, "engine": "llamacpp", "requests": 15,
             "recompute_tokens_per_s": 1e6 / cold / 3600, "restore_tokens_per_s": 1e6 / warm / 3600,
             "recompute_usd_per_million": cold, "restore_usd_per_million": warm, "saving_pct": pct,
             "saving_ci_low": lo, "saving_ci_high": hi, "pairs": 15, "units": 5, "unit": "conversations",
             "pairs_busy_trials": 0, "saving_verdict": verdict, "prefill_saved_pct": 80.0, "ttft_saved_s": 0.5,
             "tokens_match": True, "charged": "host 256.0 MiB", "charged_from": "host: --cache-ram 256 MiB, configured"}
        return {**r, "baseline": baseline, "saving_kind": kind} if with_baseline else r

    rows = [row("host-cache", "none", "reuse", 79.0, 68.0, 89.0, "", 45.11, 218.64)]
    if with_baseline:
        rows.append(row("host-cache", "prefix-cache", "tier", 12.0, 4.1, 19.8, "", 45.11, 51.26))
        rows.append(row("disk-cache", "prefix-cache", "tier", 3.0, -2.0, 8.0,
                        "inconclusive: the interval includes no change", 49.72, 51.26))
    return pd.DataFrame(rows)


def test_reuse_savings_name_their_baseline(tmp_path):
    """A tier mode has two savings (against `none` and against the prefix-cache mode): the table, the lines and
    reuse_cost.csv say which is which; rows of an older kvbench (no baseline column) are against `none`."""
    from kvbench.report.cost import reuse_cost_display, reuse_verdicts, write_costs

    cells, _ = reuse_cost_display(reuse_rows(True))
    assert cells[["mode", "vs", "saving %", "verdict"]].to_numpy().tolist() == [
        ["host-cache", "none", "+79.0 [+68.0, +89.0]", "lowers cost"],
        ["host-cache", "prefix-cache (tier)", "+12.0 [+4.1, +19.8]", "lowers cost"],
        ["disk-cache", "prefix-cache (tier)", "+3.0 [−2.0, +8.0]", "inconclusive: interval includes 0"]]
    held = "held beside the device: host 256.0 MiB (host: --cache-ram 256 MiB, configured)"
    assert reuse_verdicts(reuse_rows(True)) == [
        "srv: `host-cache` restoring stored KV lowers the cost to 45.11 USD per 1M tokens from recomputing's 218.64 "
        f"(reuse saving vs none: +79.0% [+68.0%, +89.0%], 15 request pairs from 5 conversations; {held})",
        "srv: `host-cache` its tier lowers the cost to 45.11 USD per 1M tokens from `prefix-cache`'s 51.26 (tier "
        f"saving vs prefix-cache: +12.0% [+4.1%, +19.8%], 15 request pairs from 5 conversations; {held})",
        "srv: `disk-cache` inconclusive: the interval includes no change: 49.72 vs `prefix-cache` 51.26 USD per 1M "
        "tokens (tier saving vs prefix-cache: +3.0% [−2.0%, +8.0%], 15 request pairs from 5 conversations; "
        f"{held})"]
    old = reuse_rows(False)
    assert reuse_cost_display(old)[0]["vs"].tolist() == ["none"]
    assert "(reuse saving vs none: +79.0%" in reuse_verdicts(old)[0]
    costs, _ = demo_costs()
    write_costs(costs, tmp_path, Prices(2.0), old)
    written = pd.read_csv(tmp_path / "reuse_cost.csv")
    assert written[["mode_label", "baseline", "saving_kind"]].to_numpy().tolist() == [["host-cache", "none", "reuse"]]
    assert set(pd.read_csv(tmp_path / "cost.csv")["baseline"]) == {"none"}
    doc = json.loads((tmp_path / "cost.json").read_text())
    assert doc["reuse_verdicts"] == reuse_verdicts(old) and doc["verdicts"]["demo"][0].startswith(
        "at 2048 tokens `hierarchical` lowers cost to ")
