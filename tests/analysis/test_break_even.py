"""The break-even map: the shared_prefix workload (exact lengths, shared prefixes, no other reuse), the roofline fit
on synthetic trials with known constants, the cell labels (never "pays" when the interval spans zero, busy cells
inconclusive), the model's filled cells, and `kvbench map`'s files."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from kvbench.analysis.break_even import break_even_map, label, measured_cells, map_rows, ratio_panel
from kvbench.analysis.break_even_fit import CellShape, fit_constants, predict_saving
from kvbench.analysis.cost import Prices
from kvbench.results.frame import trials_frame
from kvbench.scenario import ScenarioError, parse_scenario
from kvbench.scenario.workload import cell_kv_tokens, prefix_tokens
from kvbench.workloads.documents import Document
from kvbench.workloads.sessions import NotEnoughRequests
from kvbench.workloads.shared_prefix import shared_prefix

#: The constants synthetic trials are made with (seconds, seconds per token, per token pair).
TRUE = {"overhead_s": 0.02, "prefill_s_per_token": 4e-4, "attention_s_per_token_pair": 2e-7,
        "restore_host_s_per_token": 3e-5, "decode_s": 0.05, "decode_s_per_context_token": 1e-5}
TOKEN_BYTES = 46_080


def ttft(n: float, k: float) -> float:
    return (TRUE["overhead_s"] + TRUE["prefill_s_per_token"] * n + TRUE["attention_s_per_token_pair"] * n * (k + n / 2)
            + TRUE["restore_host_s_per_token"] * k)


def tpot(prompt: float, n_out: int) -> float:
    return TRUE["decode_s"] + TRUE["decode_s_per_context_token"] * (prompt + n_out / 2)


def synthetic_rows(noise: float = 0.003, busy: bool = False, shares=(0, 50, 95), lengths=(128, 512, 1024),
                   prefixes: int = 5, visits: int = 3, seed: int = 0, budget: int = 100_000, mode: str = "none",
                   restore_share: float = 1.0, unit: int | None = None) -> list[dict]:
    """Trials of a shared_prefix run made with :data:`TRUE`: per cell ``prefixes`` × ``visits`` requests, each
    cold (everything prefilled) and warm (a revisit restores ``restore_share`` of its prefix from the host);
    ``unit``: the store's chunk tokens, recorded with the KV each cell holds (else neither, as older runs)."""
    rng = np.random.default_rng(seed)
    rows, n_out = [], 4
    for c, (t, pct) in enumerate((t, pct) for t in lengths for pct in shares):
        p = prefix_tokens(t, pct)
        for v in range(1, visits + 1):
            for j in range(prefixes):
                rid = f"s{c}-p{j}-v{v}"
                for warm in (False, True):
                    k = int(p * restore_share) if warm and v > 1 else 0
                    first = ttft(t - k, k) + rng.normal(0, noise)
                    step = tpot(t, n_out) + rng.normal(0, noise / 10)
                    rows.append({
                        "scenario": "be", "mode": mode, "mode_label": mode, "batch_size": 1, "status": "ok",
                        "message": "", "prompt_tokens": t, "turn_index": v, "n_output_tokens": n_out,
                        "tokens_match": True, "store_host_bytes": 10 * 2**20, "store_disk_bytes": 0,
                        "request_id": rid, "document": f"s{c}-p{j}", "repeat": 0, "machine_busy": busy,
                        "trial_id": f"{rid}-{'warm' if warm else 'cold'}", "warm": warm, "ttft_s": first,
                        "tpot_s": step, "e2e_s": first + (n_out - 1) * step, "tokens_restored": k,
                        "store_hit_rate": 1.0 if k else None, "restore_host_bytes": k * TOKEN_BYTES,
                        "restore_disk_bytes": 0, "shared_prefix_tokens": p, "working_set_prompts": prefixes,
                        "kv_budget_tokens": budget, **({} if unit is None else {
                            "share_unit_tokens": unit,
                            "cell_kv_tokens": cell_kv_tokens(t, p, prefixes, visits, unit)})})
    return rows


# --------------------------------------------------------------------------- the workload


def docs(n: int = 40, words: int = 400) -> list[Document]:
    rng = np.random.default_rng(3)
    vocab = ["cache", "memory", "token", "layer", "tensor", "offload", "budget", "device", "host", "chunk", "prefix",
             "the", "a", "of", "and", "to", "is", "in", "for", "request"]
    return [Document.from_turns(f"d{i}", [("human", " ".join(rng.choice(vocab, words)))]) for i in range(n)]


def test_shared_prefix_requests_have_exact_lengths_and_share_only_their_prefix(smol_tokenizer):
    cells = [(64, 50, 2), (40, 0, 2), (100, 95, 3)]
    stream = shared_prefix(docs(), smol_tokenizer, cells=cells, visits=3)
    reqs = stream.requests
    assert [r.id for r in reqs[:6]] == ["s0-p0-v1", "s0-p1-v1", "s0-p0-v2", "s0-p1-v2", "s0-p0-v3", "s0-p1-v3"]
    assert len(reqs) == 3 * (2 + 2 + 3)
    by_cell = {}
    for r in reqs:
        by_cell.setdefault(r.id.split("-")[0], []).append(r)
    for (tokens, pct, w), (cell, part) in zip(cells, by_cell.items()):
        p = prefix_tokens(tokens, pct)
        assert {len(r.ids) for r in part} == {tokens} and {r.shared_prefix_tokens for r in part} == {p}
        assert {r.working_set for r in part} == {w} and {r.turn_index for r in part} == {1, 2, 3}
        for r in part:
            assert r.held == r.ids and r.document == r.id.rsplit("-", 1)[0]
            same = [q for q in part if q.document == r.document]
            assert {q.ids[:p] for q in same} == {r.ids[:p]}  # a prefix's visits share it
    assert prefix_tokens(64, 50) == 32 and prefix_tokens(100, 95) == 95 and prefix_tokens(10, 99) == 9
    # nothing else repeats: every span of ids after the prefix is new text
    suffixes = [r.ids[r.shared_prefix_tokens:] for r in reqs]
    assert len(set(suffixes)) == len(suffixes)
    prefixes = {r.ids[:r.shared_prefix_tokens] for r in reqs if r.shared_prefix_tokens}
    assert len(prefixes) == 2 + 3  # the 0% cell has none
    with pytest.raises(NotEnoughRequests, match=r"shared_prefix needs 1,200,000 tokens of text, the source gives"):
        shared_prefix(docs(3), smol_tokenizer, cells=[(1000, 0, 400)], visits=3)


def base_scenario(**workload):
    return {"name": "be", "model": "smollm2-135m", "workload": {"source": "sharegpt", "shared_prefix": workload},
            "max_new_tokens": 4, "modes": [{"kind": "none"}], "store": {"chunk_tokens": 16}}


@pytest.mark.parametrize("workload, message", [
    ({"shared_pct": [100]}, "workload.shared_prefix.shared_pct[0]: Input should be less than or equal to 99 (got 100)"),
    ({"visits": 1}, "workload.shared_prefix.visits: Input should be greater than or equal to 2 (got 1)"),
    ({"working_set": [5, 5]}, "workload.shared_prefix.working_set: values must be distinct (got [5, 5])"),
    ({"prompt_tokens": []}, "workload.shared_prefix.prompt_tokens: List should have at least 1 item"),
    ({"turns": 3}, "workload.shared_prefix.turns: unknown key 'turns'; allowed keys: prompt_tokens, shared_pct, "
                   "working_set, visits"),
])
def test_shared_prefix_scenario_errors_name_the_key(workload, message):
    with pytest.raises(ScenarioError) as e:
        parse_scenario(base_scenario(**workload))
    assert message in str(e.value)


def test_shared_prefix_scenario_summary_and_one_reuse_workload():
    from kvbench.scenario.summary import sweep_summary

    s = parse_scenario(base_scenario(prompt_tokens=[64, 128], shared_pct=[0, 90], working_set=[5], visits=2))
    assert s.workload.reuse == "shared_prefix" and s.workload.shared_prefix.requests == 2 * 2 * 5 * 2
    assert sweep_summary(s) == ("400 trials: shared_prefix: 4 cells (2 prompt lengths × 2 prefix shares × 1 working "
                                "set of 5 prefixes) × 2 visits per prefix = 40 requests × 1 mode × cold and warm × 5 repeats; "
                                "prompts are built from the data as it runs")
    data = base_scenario()
    data["workload"]["doc_qa"] = {}
    with pytest.raises(ScenarioError, match="give one reuse workload, not doc_qa and shared_prefix"):
        parse_scenario(data)


# --------------------------------------------------------------------------- the fit


def test_the_fit_recovers_known_constants_within_their_intervals():
    trials = trials_frame(synthetic_rows(), "be")
    fit = fit_constants(map_rows(trials))
    assert fit is not None and fit.tiers == ["host"] and fit.units == 45 and fit.trials == 270
    for name, truth in TRUE.items():
        assert fit.low[name] <= truth <= fit.high[name], (name, fit.low[name], truth, fit.high[name])
    assert fit.values["prefill_s_per_token"] == pytest.approx(TRUE["prefill_s_per_token"], rel=0.05)
    assert fit.values["decode_s"] == pytest.approx(TRUE["decode_s"], rel=0.02)
    bw, lo, hi = fit.bandwidth["host"]  # bytes per token ÷ seconds per token
    assert lo <= TOKEN_BYTES / TRUE["restore_host_s_per_token"] <= hi
    assert fit.residual_s == pytest.approx(0.003, rel=0.2)


def test_the_fit_keeps_every_constant_at_least_zero():
    rows = synthetic_rows(noise=0.0)
    for r in rows:  # a restored token takes 1 µs off: a free fit would put its constant at -1e-6 s
        r["ttft_s"] -= (TRUE["restore_host_s_per_token"] + 1e-6) * r["tokens_restored"]
        r["e2e_s"] -= (TRUE["restore_host_s_per_token"] + 1e-6) * r["tokens_restored"]
    fit = fit_constants(map_rows(trials_frame(rows, "be")))
    assert fit.values["restore_host_s_per_token"] == 0.0 and all(v >= 0 for v in fit.values.values())
    assert fit.bandwidth["host"][0] == float("inf")


def test_too_few_trials_or_one_prompt_length_give_no_fit():
    one_length = trials_frame(synthetic_rows(lengths=(512,)), "be")
    assert fit_constants(map_rows(one_length)) is None


def test_predicted_saving_follows_the_roofline():
    fit = fit_constants(map_rows(trials_frame(synthetic_rows(noise=0.0), "be")))
    shape = CellShape(1024, 973, 3, 5, 1.0, {"host": 1.0}, 4)
    value, lo, hi = predict_saving(fit, shape, 2.0)
    e2e_cold = ttft(1024, 0) + 3 * tpot(1024, 4)
    e2e_warm = ttft(51, 973) + 3 * tpot(1024, 4)
    assert value == pytest.approx(100 * (1 - (e2e_cold + 2 * e2e_warm) / (3 * e2e_cold)), rel=1e-3)
    assert lo <= value <= hi
    # memory charged beside the device lowers the saving: 1 GiB at 2 USD per GiB-hour doubles the hourly price
    charged = predict_saving(fit, CellShape(1024, 973, 3, 5, 1.0, {"host": 1.0}, 4, host_bytes=2**30), 2.0, 2.0)[0]
    assert charged == pytest.approx(100 * (1 - 2 * (e2e_cold + 2 * e2e_warm) / (3 * e2e_cold)), rel=1e-3)


# --------------------------------------------------------------------------- labels and cells


@pytest.mark.parametrize("verdict, saving, match, expected", [
    ("", 12.0, True, ("pays", "")),
    ("", -5.0, True, ("loses", "")),
    ("inconclusive: the interval includes no change", 30.0, True, ("inconclusive", "the interval includes no change")),
    ("inconclusive: the machine was busy during 3 of 30 trials", 30.0, True,
     ("inconclusive", "the machine was busy during 3 of 30 trials")),
    ("inconclusive: 4 prefixes, need 5", 30.0, True, ("inconclusive", "4 prefixes, need 5")),
    ("", 30.0, False, ("invalid", "restored ids differ from none's")),
    ("", 30.0, "near tie", ("pays", "")),
])
def test_labels_of_constructed_cells(verdict, saving, match, expected):
    assert label(verdict, saving, match) == expected


def test_ratio_panels():
    assert [ratio_panel(r) for r in (0.1, 0.5, 0.51, 1.0, 1.5, 2.0, 3.9, 4.0, 9.0)] == [
        "≤0.5×", "≤0.5×", "0.5–1×", "0.5–1×", "1–2×", "1–2×", "2–4×", "2–4×", ">4×"]
    assert ratio_panel(float("nan")) == "?"


def test_cells_pay_lose_or_stay_inconclusive():
    prices = Prices(2.0)
    cells = measured_cells(map_rows(trials_frame(synthetic_rows(), "be")), prices)
    by = {(r["prompt_tokens"], r["shared_pct"]): r for r in cells.to_dict("records")}
    assert len(by) == 9 and set(cells["panel"]) == {"≤0.5×"} and set(cells["source"]) == {"measured"}
    big = by[(1024, 95)]
    assert big["label"] == "pays" and big["saving_ci_low"] > 0 and big["pairs"] == 15 and big["units"] == 5
    cell = [r for r in synthetic_rows() if r["prompt_tokens"] == 1024 and r["request_id"].startswith("s8-")]
    ttft = {warm: sum(r["ttft_s"] for r in cell if r["warm"] is warm) for warm in (True, False)}
    assert big["delta_usd_per_million"] < 0 and big["delta_usd_ci_high"] < 0
    # Σ restore ÷ Σ recompute TTFT: each prefix's first visit (nothing stored yet) costs as much as recompute
    assert big["ttft_ratio"] == pytest.approx(ttft[True] / ttft[False]) and 0.4 < big["ttft_ratio"] < 0.45
    assert big["ttft_ratio_ci_low"] < big["ttft_ratio"] < big["ttft_ratio_ci_high"]
    assert big["tpot_ratio"] == pytest.approx(1.0, abs=0.02)
    zero = by[(512, 0)]
    assert zero["label"] == "inconclusive" and zero["why"].startswith("not engaged")
    for r in by.values():  # never "pays" when the interval spans zero
        spans = not (r["saving_ci_low"] > 0 or r["saving_ci_high"] < 0)
        assert not (spans and r["label"] == "pays")


def test_a_cell_whose_interval_spans_zero_never_pays():
    rows = synthetic_rows(noise=0.0, shares=(50,), lengths=(256,))
    rng = np.random.default_rng(1)
    for r in rows:  # noise far larger than what restoring saves
        r["e2e_s"] += float(rng.normal(0, 0.5)) ** 2
    cell = measured_cells(map_rows(trials_frame(rows, "be")), Prices(2.0)).iloc[0]
    assert cell["saving_ci_low"] < 0 < cell["saving_ci_high"]
    assert (cell["label"], cell["why"]) == ("inconclusive", "the interval includes no change")


def test_every_cell_measured_on_a_busy_machine_is_inconclusive():
    m = break_even_map(trials_frame(synthetic_rows(busy=True), "be"), Prices(2.0))
    measured = m.cells[m.cells["source"] == "measured"]
    assert len(measured) == 9 and set(measured["label"]) == {"inconclusive"}
    assert all("busy during 30 of 30 trials" in w or w.startswith("not engaged") for w in measured["why"])


def test_the_map_fills_unmeasured_cells_from_the_model():
    trials = trials_frame(synthetic_rows(shares=(0, 50, 95), lengths=(128, 1024)), "be")
    m = break_even_map(trials, Prices(2.0), shares=(0, 25, 50, 75, 95), contexts=(2048,))
    cells = m.cells.set_index(["prompt_tokens", "shared_pct"])
    assert len(cells) == 3 * 5 and (cells["source"] == "measured").sum() == 6
    filled = cells.loc[(2048, 75)]
    assert filled["source"] == "model" and filled["label"] == "model: pays"
    truth_cold, truth_warm = ttft(2048, 0) + 3 * tpot(2048, 4), ttft(512, 1536) + 3 * tpot(2048, 4)
    assert filled["predicted_saving_pct"] == pytest.approx(
        100 * (1 - (truth_cold + 2 * truth_warm) / (3 * truth_cold)), abs=3)
    assert cells.loc[(128, 0), "label"] == "inconclusive"  # measured: nothing to restore
    assert cells.loc[(1024, 95), "disagrees"] is False or cells.loc[(1024, 95), "disagrees"] == False  # noqa: E712
    assert set(m.fits) == {("be", "none")}


def test_the_ratio_counts_every_chunk_a_cell_holds():
    """5 prefixes × 3 visits, 16-token chunks, a budget of 2,000 tokens. At 95% shared a 256-token cell holds
    5 × (240 + 3 × 16) = 1,440 tokens (0.72×: 0.5–1×), a 128-token one 5 × (112 + 3 × 16) = 800 (0.4×: ≤0.5×);
    prefixes × prompt would say 0.64× and 0.32×."""
    trials = trials_frame(synthetic_rows(shares=(95,), lengths=(128, 256), budget=2000, unit=16), "be")
    assert map_rows(trials).groupby("prompt_tokens")["kv_ratio"].unique().map(list).to_dict() == {
        128: [0.4], 256: [0.72]}


def test_no_model_cell_fills_a_panel_the_run_s_prompts_cannot_reach():
    """The run of the test above: the model fills a panel only where a cell's own ratio falls, 128 tokens at 0%
    (5 × 3 × 128 = 1,920: 0.96×) and 50% (5 × (64 + 3 × 64) = 1,280: 0.64×) in 0.5–1×; never 1,024 tokens (at
    least 5 × (960 + 3 × 64) = 5,760: 2.88×). 14 of the 16 unmeasured cells stay empty, and the notes say so."""
    trials = trials_frame(synthetic_rows(shares=(95,), lengths=(128, 256), budget=2000, unit=16), "be")
    m = break_even_map(trials, Prices(2.0), shares=(0, 50, 95), contexts=(1024,))
    cells = {(r["panel"], r["prompt_tokens"], r["shared_pct"]): r["source"] for r in m.cells.to_dict("records")}
    assert cells == {("≤0.5×", 128, 95): "measured", ("0.5–1×", 128, 0): "model", ("0.5–1×", 128, 50): "model",
                     ("0.5–1×", 256, 95): "measured"}
    assert m.notes == [
        "be none: the model's cells at 1,024 tokens extrapolate beyond 2x the prompt lengths it was fitted to "
        "(128–256 tokens)",
        "be none: 14 cells left empty, the run's prompts cannot reach their panel (KV working set ÷ budget: 128 "
        "tokens at 95% shared 0.4×, not 0.5–1×; 256 tokens at 0% shared 1.92×, not 0.5–1×; 256 tokens at 50% "
        "shared 1.28×, not 0.5–1×; ...)"]


def test_map_files_and_cli(tmp_path, write_yaml):
    from typer.testing import CliRunner

    from kvbench.cli import app
    from kvbench.results.run_dir import RunDir

    run = RunDir.create(tmp_path / "results", parse_scenario(base_scenario()).model_dump(mode="json"), {})
    for r in synthetic_rows(lengths=(128, 1024)):
        run.append(r)
    res = CliRunner().invoke(app, ["map", str(run.path), "--shares", "0,50,95,75", "--out", str(tmp_path / "m")])
    assert res.exit_code == 0, res.output
    assert "be, none: saving of restore vs recompute, KV working set ≤0.5× the budget" in res.output
    assert "≈+" in res.output and " pays" in res.output  # a model-filled cell, a measured one that pays
    assert "fitted constants" in res.output and "host restore bandwidth" in res.output
    files = sorted(p.name for p in (tmp_path / "m").iterdir())
    assert files == ["map.csv", "map.json", "map_be_none.png"]
    doc = json.loads((tmp_path / "m" / "map.json").read_text())
    assert doc["constants"][0]["trials"] == 180 and len(doc["cells"]) == 2 * 4
    assert pd.read_csv(tmp_path / "m" / "map.csv")["label"].tolist().count("pays") >= 1
    bad = CliRunner().invoke(app, ["map", str(run.path), "--shares", "0,100"])
    assert bad.exit_code == 2 and "--shares '0,100': every value must be 0 to 99" in bad.output


def test_trials_that_generated_no_tokens_leave_their_cell_uncosted_and_say_so(tmp_path):
    """From the hostile pass: rows with n_output_tokens 0 ended `kvbench map` in "the throughput must be more than
    0 tokens/s" with no cell or file named, and nothing written."""
    from typer.testing import CliRunner

    from kvbench.cli import app
    from kvbench.results.run_dir import RunDir

    run = RunDir.create(tmp_path / "results", parse_scenario(base_scenario()).model_dump(mode="json"), {})
    for r in synthetic_rows(lengths=(128, 1024)):
        run.append({**r, "n_output_tokens": 0} if r["prompt_tokens"] == 128 else r)
    res = CliRunner().invoke(app, ["map", str(run.path), "--out", str(tmp_path / "m")])
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    for share in (50, 95):
        assert (f"128 tokens, {share}% shared, ≤0.5×: not costed: its trials record no generated tokens "
                "(n_output_tokens 0)") in said
    assert " pays" in said  # the 1,024-token cells are costed
    assert (tmp_path / "m" / "map.json").exists()


@pytest.mark.model
@pytest.mark.e2e
def test_a_run_beside_the_cpu_hog_maps_every_measured_cell_inconclusive(write_yaml, tmp_path):
    """benchmarks/cpu_hog.py keeps every CPU busy while a small shared_prefix scenario runs on the real model:
    each trial records the load, and `kvbench map` calls every measured cell inconclusive, the busy machine named."""
    import subprocess
    import sys

    from conftest import ROOT, kvbench_cmd

    data = base_scenario(prompt_tokens=[48, 96], shared_pct=[90], working_set=[5], visits=2)
    data.update(repeats=1, warmup=0)
    scenario = write_yaml(data)
    hog = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "cpu_hog.py"), "--seconds", "300"])
    try:
        r = subprocess.run([*kvbench_cmd(), "run", str(scenario), "--out", str(tmp_path / "res")],
                           capture_output=True, text=True, timeout=600)
    finally:
        hog.terminate()
        hog.wait(timeout=30)
    assert r.returncode == 0, r.stderr
    run = next((tmp_path / "res").iterdir())
    m = subprocess.run([*kvbench_cmd(), "map", str(run), "--out", str(tmp_path / "m")], capture_output=True,
                       text=True, timeout=300)
    assert m.returncode == 0, m.stderr
    cells = pd.read_csv(tmp_path / "m" / "map.csv")
    measured = cells[cells["source"] == "measured"]
    assert len(measured) == 2 and set(measured["label"]) == {"inconclusive"}
    assert all("the machine was busy during" in w for w in measured["why"]), list(measured["why"])


def test_map_refuses_what_it_cannot_map(tmp_path):
    from typer.testing import CliRunner

    from kvbench.cli import app
    from kvbench.results.run_dir import RunDir

    data = base_scenario()
    data["workload"] = {"source": "sharegpt", "doc_qa": {}}
    run = RunDir.create(tmp_path / "results", parse_scenario(data).model_dump(mode="json"), {})
    row = synthetic_rows(lengths=(128,), shares=(50,))[0]
    for k in ("shared_prefix_tokens", "working_set_prompts", "kv_budget_tokens"):
        row.pop(k)
    run.append(row)
    res = CliRunner().invoke(app, ["map", str(run.path), "--out", str(tmp_path / "m")])
    assert res.exit_code == 2 and "no shared_prefix trials in these results" in res.output
    assert not (tmp_path / "m").exists()
    for flags, message in ((["--contexts", "0"], "--contexts '0': every value must be 1 to 16,777,216"),
                           (["--shares", "a,b"], "--shares 'a,b': give whole numbers separated by commas"),
                           (["--gpu-price", "-1"], "--gpu-price must be a finite number above 0"),
                           (["--out", " "], "--out is empty")):
        res = CliRunner().invoke(app, ["map", str(run.path), *flags])
        assert res.exit_code == 2 and message in res.output, (flags, res.output)


def test_plan_break_even_assumed_and_measured_constants(tmp_path):
    from kvbench.analysis.plan_break_even import (assumed_constants, contexts_up_to, measured_constants,
                                                   plan_break_even)
    from kvbench.report.plan import plan

    arch = plan("llama-3.1-8b").arch
    c = assumed_constants(arch, 2, 989.0, 50e9, 4.8e12)
    flops = 989e12 * 0.5
    assert c.values["prefill_s_per_token"] == pytest.approx(2 * arch.parameters / flops)
    assert c.values["attention_s_per_token_pair"] == pytest.approx(4 * 32 * 32 * 128 / flops)
    assert c.values["restore_host_s_per_token"] == pytest.approx(131_072 / 50e9)
    assert c.source["restore_host_s_per_token"] == "assumed: 131,072 KV bytes per token ÷ 50 GB/s"
    assert contexts_up_to(8192) == [1024, 2048, 4096, 8192] and contexts_up_to(300) == [300]
    grid = plan_break_even(c, [1024, 8192], visits=3, new_tokens=128).set_index(["prompt_tokens", "shared_pct"])
    assert grid.loc[(1024, 0), "saving_pct"] == pytest.approx(0.0, abs=1e-9)
    assert grid.loc[(8192, 95), "saving_pct"] > grid.loc[(1024, 95), "saving_pct"] > 0
    # the measured constants of a map.json replace every assumed one, each said measured
    trials = trials_frame(synthetic_rows(), "be")
    m = break_even_map(trials, Prices(2.0))
    from kvbench.report.break_even import write_map

    write_map(m, tmp_path, Prices(2.0))
    measured = measured_constants(tmp_path / "map.json")
    assert measured.values["prefill_s_per_token"] == pytest.approx(m.fits[("be", "none")].values["prefill_s_per_token"])
    assert all(v.startswith("measured: be none, runs ") for v in measured.source.values())
    with pytest.raises(Exception, match="no fitted constants for x"):
        measured_constants(tmp_path / "map.json", scenario="x")


@pytest.mark.e2e
def test_a_shared_prefix_run_restores_exactly_its_prefix_and_reports_its_map(tiny_model, smol_tokenizer, tmp_path):
    """On the in-process engine: a revisit restores its whole shared prefix's chunks and nothing of another
    request, every trial's ids equal none's, rows carry their cell, and the report holds the map."""
    from kvbench.bench.engines.transformers import TransformersEngine
    from kvbench.bench.executors.local import LocalExecutor
    from kvbench.bench.plans.sweep import run_sweep
    from kvbench.results.load import load_results
    from kvbench.results.read import read_trials
    from kvbench.results.run_dir import RunDir
    from kvbench.report.write import write_report

    stream = shared_prefix(docs(), smol_tokenizer, cells=[(64, 50, 2), (64, 0, 2)], visits=2)
    data = base_scenario(prompt_tokens=[64], shared_pct=[50, 0], working_set=[2], visits=2)
    data.update(repeats=1, warmup=0, store={"chunk_tokens": 16, "host_max_bytes": "1MiB"})
    s = parse_scenario(data)
    engine = TransformersEngine(s, tiny_model, stream)
    run = RunDir.create(tmp_path, s.model_dump(mode="json"), {"test": True})
    run_sweep(s, run, LocalExecutor(s, engine))
    rows = read_trials(run.path / "trials.jsonl")
    assert len(rows) == 8 * 2 and all(r["status"] == "ok" and r["tokens_match"] is True for r in rows)
    warm = {r["request_id"]: r for r in rows if r["warm"]}
    assert {k: v["tokens_restored"] for k, v in warm.items()} == {
        "s0-p0-v1": 0, "s0-p1-v1": 0, "s0-p0-v2": 32, "s0-p1-v2": 32,
        "s1-p0-v1": 0, "s1-p1-v1": 0, "s1-p0-v2": 0, "s1-p1-v2": 0}
    assert {(r["shared_prefix_tokens"], r["working_set_prompts"]) for r in rows} == {(32, 2), (0, 2)}
    assert {r["kv_budget_tokens"] for r in rows} == {2**20 // engine.store_token_bytes}
    rep = write_report(load_results([run.path]), tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    assert "### Break-even map, none (restore vs recompute, USD per 1M tokens at 2 USD per GPU-hour" in md
    assert any(f.startswith("break-even map, `none`: of 2 measured cells 2 inconclusive") for f in rep.findings[s.name])
    assert (tmp_path / "report" / f"break_even_{s.name}_none.png").stat().st_size > 10_000
    assert "data:image/png;base64" in (tmp_path / "report" / "report.html").read_text()
    assert not (tmp_path / "report" / "map.csv").exists()  # kvbench map's files are its own


def test_the_library_call_writes_what_the_command_writes(tmp_path):
    import kvbench
    from kvbench.errors import BadParameter
    from kvbench.results.run_dir import RunDir

    run = RunDir.create(tmp_path / "results", parse_scenario(base_scenario()).model_dump(mode="json"), {})
    for r in synthetic_rows(lengths=(128, 1024)):
        run.append(r)
    m = kvbench.break_even_report(kvbench.load_results([run.path]), tmp_path / "m", kvbench.Prices(2.0))
    assert sorted(p.name for p in m.files) == ["map.csv", "map.json", "map_be_none.png"]
    assert set(m.cells["source"]) == {"measured", "model"} and m.fits[("be", "none")].trials == 180
    with pytest.raises(BadParameter, match=r"results must be kvbench.load_results\(...\), not str"):
        kvbench.break_even_report("results", tmp_path / "m", kvbench.Prices(2.0))


def test_a_shift_seen_with_nothing_to_reuse_is_not_a_saving():
    """The restore side 3% faster in every request, reuse or not (another server process): the 0% cells measure
    that shift, and a cell that saves no more than it stays inconclusive, saying so."""
    rows = synthetic_rows(noise=0.0005, shares=(0, 5, 95), lengths=(128, 1024))
    cold = {r["request_id"]: r for r in rows if not r["warm"]}
    for r in rows:
        if r["warm"]:
            if r["prompt_tokens"] == 128 and r["shared_prefix_tokens"] == 6:  # 5%: a few tokens, no real saving
                r["tokens_restored"] = min(r["tokens_restored"], 2)
                r["e2e_s"] = cold[r["request_id"]]["e2e_s"]
            r["e2e_s"] *= 0.97
    cells = measured_cells(map_rows(trials_frame(rows, "be")), Prices(2.0)).set_index(["prompt_tokens",
                                                                                         "shared_pct"])
    assert cells.loc[(128, 0), "saving_pct"] == pytest.approx(3.0, abs=0.5)
    small = cells.loc[(128, 5)]
    assert small["label"] == "inconclusive" and small["why"].startswith(
        "within the shift measured with nothing to reuse (0% shared: +")
    assert cells.loc[(1024, 95), "label"] == "pays" and cells.loc[(1024, 95), "control_high"] < 4


def test_hand_edited_inputs_give_one_line_errors(tmp_path):
    """What a new user's bad inputs did (a null working set crashed the map; map.json edits crashed the plan):
    rows that cannot be mapped are left out, map.json holds no Infinity, and each bad file or flag is one line."""
    import kvbench
    from typer.testing import CliRunner

    from kvbench.cli import app
    from kvbench.errors import BadParameter, BadValue, ResultsError
    from kvbench.analysis.plan_break_even import measured_constants
    from kvbench.results.run_dir import RunDir

    rows = synthetic_rows(lengths=(128, 1024), noise=0.0)
    for r in rows:  # restoring costs nothing (a free fit: -1e-6 s per token): an infinite bandwidth, written as null
        r["ttft_s"] -= (TRUE["restore_host_s_per_token"] + 1e-6) * r["tokens_restored"]
        r["e2e_s"] -= (TRUE["restore_host_s_per_token"] + 1e-6) * r["tokens_restored"]
    rows[0]["working_set_prompts"] = None
    rows[1]["shared_prefix_tokens"] = 5000  # longer than the prompt
    run = RunDir.create(tmp_path / "results", parse_scenario(base_scenario()).model_dump(mode="json"), {})
    for r in rows:
        run.append(r)
    results = kvbench.load_results([run.path])
    m = kvbench.break_even_report(results, tmp_path / "m", kvbench.Prices(2.0))
    assert m.fits[("be", "none")].trials == 178
    text = (tmp_path / "m" / "map.json").read_text()
    assert "Infinity" not in text and "NaN" not in text
    assert json.loads(text)["constants"][0]["bandwidth_bytes_per_s"]["host"][0] is None
    for kwargs, name in (({"shares": (100,)}, "shares"), ({"contexts": (0,)}, "contexts"),
                         ({"host_tier": "bogus"}, "host_tier"), ({"shares": "10,20"}, "shares")):
        with pytest.raises(BadParameter) as e:
            kvbench.break_even_report(results, tmp_path / "m", kvbench.Prices(2.0), **kwargs)
        assert e.value.param == name
    with pytest.raises(BadParameter, match="prices must be kvbench.Prices"):
        kvbench.break_even_report(results, tmp_path / "m", 2.0)
    empty = RunDir.create(tmp_path / "other", parse_scenario(base_scenario()).model_dump(mode="json"), {})
    row = dict(rows[5])
    for k in ("shared_prefix_tokens", "working_set_prompts", "kv_budget_tokens"):
        row.pop(k)
    empty.append(row)
    with pytest.raises(ResultsError, match="no shared_prefix trials in these results"):
        kvbench.break_even_report(kvbench.load_results([empty.path]), tmp_path / "m2", kvbench.Prices(2.0))
    runner = CliRunner()
    for flags, message in ((["--host-tier", "bogus"], "--host-tier must be one of configured, measured"),
                           (["--shares", "10,,20"], "--shares '10,,20': give whole numbers separated by commas"),
                           (["--out", str(tmp_path / "m" / "map.csv" / "sub")], "map.csv is not a directory")):
        res = runner.invoke(app, ["map", str(run.path), *flags])
        assert res.exit_code == 2 and message in res.output and "┏" not in res.output, (flags, res.output)
    doc = json.loads(text)
    for edit, message in ((lambda d: d.update(constants="x"), "constants: must be the list of fits"),
                          (lambda d: d["constants"][0].update(values=[1, 2]), "constants[0].values: must be a mapping"),
                          (lambda d: d["constants"][0]["values"].update(prefill_s_per_token="fast"),
                           "constants[0].values.prefill_s_per_token: must be a finite number of seconds, at least 0, "
                           "not 'fast'"),
                          (lambda d: d["constants"][0]["values"].update(prefill_s_per_token=-1), "not -1"),
                          (lambda d: d["constants"][0]["values"].pop("decode_s"), "decode_s missing")):
        bad = json.loads(text)
        edit(bad)
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        with pytest.raises(BadValue, match=message.replace("[", r"\[").replace("]", r"\]")):
            measured_constants(tmp_path / "bad.json")
    assert doc["constants"][0]["group"] == "be"
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(BadValue, match="bad.json: not a map.json of kvbench map"):
        measured_constants(tmp_path / "bad.json")
