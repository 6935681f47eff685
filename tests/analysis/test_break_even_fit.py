"""What a break-even fit rests on: trials measured on a busy machine are left out of it (or, where only those
exist, the fit is marked busy and `kvbench plan --constants` refuses it unless --allow-busy-fit), and the prompt
lengths it was fitted to travel with it, so that a plan or a map beyond 2x of them says it extrapolates; the
constants are the least squares with every constant at least 0."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from kvbench.analysis.break_even import break_even_map
from kvbench.analysis.break_even_fit import fit_constants
from kvbench.analysis.cost import Prices
from kvbench.analysis.plan_break_even import measured_constants
from kvbench.cli import app
from kvbench.errors import BadParameter
from kvbench.report.break_even import constant_lines, write_map
from kvbench.results.frame import trials_frame
from test_break_even import TRUE, synthetic_rows

#: How much slower a busy trial runs than a quiet one here.
SLOWER = 20


def busy_prefix_rows(prefixes: tuple[str, ...] = ("p0",), lengths=(128, 512, 1024)) -> list[dict]:
    """The synthetic trials of :func:`synthetic_rows`, those of the named prefixes measured on a busy machine:
    flagged ``machine_busy`` and :data:`SLOWER` times slower."""
    rows = synthetic_rows(lengths=lengths)
    for r in rows:
        if r["document"].rsplit("-", 1)[1] in prefixes:
            r["machine_busy"] = True
            for k in ("ttft_s", "tpot_s", "e2e_s"):
                r[k] *= SLOWER
    return rows


def test_busy_trials_are_left_out_of_the_fit_and_counted():
    m = break_even_map(trials_frame(busy_prefix_rows(), "be"), Prices(2.0))
    fit = m.fits[("be", "none")]
    # all 270 trials fitted read prefill 1,912 µs/token and decode 240 ms; the 216 quiet ones give the truth
    assert fit.values["prefill_s_per_token"] == pytest.approx(TRUE["prefill_s_per_token"], rel=0.05)
    assert fit.values["decode_s"] == pytest.approx(TRUE["decode_s"], rel=0.02)
    # 9 cells × 1 busy prefix × 3 visits × cold and warm = 54 of 270 trials left out
    assert (fit.trials, fit.busy_left_out, fit.busy, fit.load_unknown) == (216, 54, False, 0)
    assert fit.prompt_tokens == (128, 1024)
    assert "be none: 54 trials measured on a busy machine left out of the fit" in m.notes
    line = constant_lines(m)[0]
    assert "prompts of 128–1,024 tokens, 54 busy trials left out" in line


def test_a_fit_of_busy_trials_only_is_saved_busy_and_refused_by_plan_unless_forced(tmp_path):
    every = ("p0", "p1", "p2", "p3", "p4")
    m = break_even_map(trials_frame(busy_prefix_rows(every, lengths=(128, 256)), "be"), Prices(2.0),
                       contexts=(4096,))
    model = m.cells[m.cells["source"] == "model"]
    assert len(model) and set(model["label"]) == {"model: inconclusive"}
    assert set(model["why"]) == {"fitted to trials on a busy machine"}
    fit = m.fits[("be", "none")]
    assert fit.busy and fit.trials == 180 and fit.busy_left_out == 0
    assert any("fitted to trials measured on a busy machine only (180)" in n for n in m.notes)
    assert "BUSY: trials measured on a busy machine" in constant_lines(m)[0]
    write_map(m, tmp_path, Prices(2.0))
    saved = json.loads((tmp_path / "map.json").read_text())["constants"][0]
    assert (saved["busy"], saved["busy_trials_left_out"], saved["prompt_tokens"]) == (True, 0, [128, 256])
    with pytest.raises(BadParameter) as e:
        measured_constants(tmp_path / "map.json")
    assert e.value.param == "allow_busy" and "fitted to 180 trials measured on a busy machine" in str(e.value)
    forced = measured_constants(tmp_path / "map.json", allow_busy=True)
    assert forced.busy and all(v.startswith("measured on a busy machine: be none") for v in forced.source.values())
    runner = CliRunner()
    refused = runner.invoke(app, ["plan", "llama-3.1-8b", "--break-even", "--constants", str(tmp_path / "map.json")])
    assert refused.exit_code == 2 and "pass --allow-busy-fit to use them anyway" in refused.output
    used = runner.invoke(app, ["plan", "llama-3.1-8b", "--prompt-tokens", "512", "--constants",
                               str(tmp_path / "map.json"), "--allow-busy-fit"])
    assert used.exit_code == 0, used.output
    assert "warning: the measured constants were fitted to trials on a busy machine" in used.output


def test_plan_warns_where_it_extrapolates_beyond_twice_the_fitted_prompt_lengths(tmp_path):
    m = break_even_map(trials_frame(synthetic_rows(lengths=(128, 256)), "be"), Prices(2.0), contexts=(4096,))
    assert ("be none: the model's cells at 4,096 tokens extrapolate beyond 2x the prompt lengths it was fitted to "
            "(128–256 tokens)") in m.notes
    assert m.fits[("be", "none")].prompt_tokens == (128, 256)
    write_map(m, tmp_path, Prices(2.0))
    runner = CliRunner()
    far = runner.invoke(app, ["plan", "llama-3.1-8b", "--prompt-tokens", "4096", "--constants",
                              str(tmp_path / "map.json")])
    assert far.exit_code == 0, far.output
    assert ("warning: the measured constants were fitted to prompts of 128–256 tokens; the savings at 1,024, 2,048, "
            "4,096 tokens extrapolate beyond 2x of that range (64–512 tokens)") in " ".join(far.output.split())
    near = runner.invoke(app, ["plan", "llama-3.1-8b", "--prompt-tokens", "512", "--constants",
                               str(tmp_path / "map.json")])
    assert near.exit_code == 0 and "extrapolate" not in near.output


@pytest.mark.parametrize("span, lengths, far", [((128, 256), [64, 512, 513, 4096], [513, 4096]),
                                                ((128, 256), [63, 100], [63]), ((0, 0), [10**6], [])])
def test_beyond_range_is_more_than_twice_outside(span, lengths, far):
    from kvbench.analysis.break_even_fit import beyond_range

    assert beyond_range(span, lengths) == far


def test_the_fit_recovers_exact_constants_from_noiseless_trials():
    fit = fit_constants(trials_frame(synthetic_rows(noise=0.0), "be"), n_boot=20)
    assert fit.tiers == ["host"]
    for name, truth in TRUE.items():
        assert fit.values[name] == pytest.approx(truth, rel=1e-9), name
    assert fit.residual_s == pytest.approx(0.0, abs=1e-12)


def test_the_fit_keeps_a_constant_that_dropping_the_most_negative_one_would_lose():
    # Concave TTFTs (prefill per token falls as prompts grow): the free fit of 1, n, n²/2 is overhead -10 ms,
    # 500 µs/token, -2e-7 s/pair. Fixing the most negative number at 0 for good drops the overhead (its -0.01 s
    # outweighs -2e-7 s/pair only by its unit) and then the attention: prefill alone, 391 µs/token, RMS 6.9 ms.
    # The least squares with every constant >= 0 have attention 0 and the overhead back: the straight line
    # through the points, 8.5 ms + 380 µs/token, RMS 4.3 ms.
    n = np.array([128, 256, 1024] * 2)
    ttft = -0.01 + 5e-4 * n - 1e-7 * n.astype(float) ** 2
    rows = pd.DataFrame({"prompt_tokens": n, "tokens_restored": 0, "ttft_s": ttft, "tpot_s": 0.05,
                         "n_output_tokens": 4, "e2e_s": ttft + 3 * 0.05, "document": [f"d{i}" for i in range(6)],
                         "request_id": [f"r{i}" for i in range(6)]})
    fit = fit_constants(rows, n_boot=20)
    slope, intercept = np.polyfit(n, ttft, 1)
    assert fit.values["attention_s_per_token_pair"] == 0.0
    assert intercept == pytest.approx(8.48e-3, rel=1e-3)
    assert fit.values["overhead_s"] == pytest.approx(intercept, rel=1e-9)
    assert fit.values["prefill_s_per_token"] == pytest.approx(slope, rel=1e-9)
    assert fit.residual_s == pytest.approx(4.284e-3, rel=1e-3)
