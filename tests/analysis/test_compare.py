"""kvbench compare on the committed golden run and edited copies of it: ratios B/A, the --fail-on gate, errors."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from golden_run import DYN, FULL, HIER, RUN, copy_run
from kvbench.analysis.compare import compare_points, parse_threshold, violations
from kvbench.results.load import load_results
from kvbench.cli import app


def scaled(col: str, factor: float, mode: str = FULL):
    def edit(r):
        if r["mode_label"] == mode and isinstance(r.get(col), (int, float)):
            r = dict(r, **{col: r[col] * factor})
        return r
    return edit


def test_compare_ratios_and_fail_on(tmp_path):
    slower = copy_run(tmp_path, "slower", edit=scaled("tpot_s", 1.3))
    frame, only_a, only_b = compare_points(load_results([RUN]), load_results([slower]))
    assert len(frame) == 20 and only_a == only_b == []  # hf-offloaded was never measured
    full = frame[frame.mode_label == FULL]
    assert full["tpot_s_ratio"].to_numpy() == pytest.approx([1.3] * 4)
    assert (frame[frame.mode_label != FULL]["tpot_s_ratio"] == 1).all()
    lines = violations(frame, [parse_threshold("tpot_s:20")])
    assert len(lines) == 4 and lines[0].startswith("tpot_s worse by 30.0% (limit 20%) at golden p")

    cli = CliRunner()
    r = cli.invoke(app, ["compare", str(RUN), str(slower), "--fail-on", "tpot_s:20"])
    assert r.exit_code == 1
    assert "fail: tpot_s worse by 30.0% (limit 20%) at golden p" in r.output and "(and 3 more)" in r.output
    r = cli.invoke(app, ["compare", str(RUN), str(slower), "--fail-on", "tpot_s:31", "--fail-on", "ttft_s:0"])
    assert r.exit_code == 0 and "pass: no matched point worse than tpot_s 31%, ttft_s 0%" in r.output

    halved = copy_run(tmp_path, "halved", edit=scaled("throughput_tokens_per_s", 0.5))
    r = cli.invoke(app, ["compare", str(RUN), str(halved), "--fail-on", "throughput_tokens_per_s:40"])
    assert r.exit_code == 1 and "fail: throughput_tokens_per_s worse by 50.0% (limit 40%)" in r.output
    r = cli.invoke(app, ["compare", str(halved), str(RUN), "--fail-on", "throughput_tokens_per_s:40"])
    assert r.exit_code == 0  # higher is better: B doubled


def test_compare_errors(tmp_path):
    cli = CliRunner()
    r = cli.invoke(app, ["compare", str(RUN), str(RUN), "--fail-on", "tpot:10"])
    assert r.exit_code == 2 and "unknown metric 'tpot'; known: ttft_s, tpot_s" in r.output
    r = cli.invoke(app, ["compare", str(RUN), str(RUN), "--fail-on", "tpot_s=10"])
    assert r.exit_code == 2 and "expected METRIC:PCT" in r.output
    r = cli.invoke(app, ["compare", str(RUN), str(RUN), "--fail-on", "tpot_s:1" + "0" * 5000])  # inf: never fails
    assert r.exit_code == 2 and "PCT must be at most 100,000,000" in r.output, r.output
    other = copy_run(tmp_path, "other", edit=lambda r: dict(r, batch_size=r["batch_size"] + 10))
    r = cli.invoke(app, ["compare", str(RUN), str(other)])
    assert r.exit_code == 2 and "no point measured in both" in r.output
    r = cli.invoke(app, ["compare", str(RUN), str(tmp_path / "missing")])
    assert r.exit_code == 2 and "missing: no such file or directory" in r.output


def test_compare_gate_fails_on_lost_or_broken_points(tmp_path):
    def broken(r):
        if r["mode_label"] == FULL:
            return dict(r, status="error", message="RuntimeError: boom")
        if r["mode_label"] == HIER:
            return dict(r, tokens_match=False, first_divergence_step=2)
        if r["mode_label"] == DYN and r["prompt_tokens"] == 32:
            return dict(r, status="over_budget")
        return r

    b = copy_run(tmp_path, "broken", edit=broken)
    r = CliRunner().invoke(app, ["compare", str(RUN), str(b), "--fail-on", "tpot_s:50"])
    assert r.exit_code == 1
    assert "regression: golden p32 b1 full: measured in A, not in B" in r.output
    assert "regression: golden p32 b1 hierarchical(window=16): generated ids no longer match none's" in r.output
    assert ("regression: golden p32 b1 dynamic(min_window=16,max_window=48): 5 of 5 trials no longer end ok"
            in r.output)
    assert "fail: golden p32 b1 full: measured in A, not in B (and 9 more)" in r.output  # 4 + 4 + 2
    r = CliRunner().invoke(app, ["compare", str(RUN), str(b)])
    assert r.exit_code == 0 and "regression:" in r.output  # without a gate: shown, not failed
    r = CliRunner().invoke(app, ["compare", str(RUN), str(RUN), "--fail-on", "peak_device_allocated_bytes:10"])
    assert r.exit_code == 2 and "no matched point has peak_device_allocated_bytes in both runs" in r.output
