"""Issue 31 (the field's formats), import: other tools' result files that are not what those tools write are
refused with the file and the key path; the comparison of two files is paired, unpaired or inconclusive as the
files allow; the numbers are kvbench's definitions whatever a tool calls them. Real files of the tools are in
tests/results/test_peer_fixtures.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvbench.analysis.cost import Prices
from kvbench.analysis.peer_cost import compare, medians, peer_cost_table
from kvbench.cli import app
from kvbench.errors import ResultsError
from kvbench.results.peers import is_kvbench_run, load_peers, peer_files, peer_runs
from kvbench.results.peers.common import PeerRun, requests_frame


def vllm_doc(ttfts, latencies, outs, **over) -> dict:
    """A ``vllm bench serve --save-detailed`` result of these requests (seconds, tokens)."""
    n = len(ttfts)
    doc = {"backend": "openai", "num_prompts": n, "max_concurrency": 1, "output_throughput": 10.0,
           "median_ttft_ms": 1000 * sorted(ttfts)[n // 2], "ttfts": ttfts, "latencies": latencies,
           "input_lens": [100] * n, "output_lens": outs, "itls": [[0.01] * (o - 1) for o in outs],
           "start_times": [float(k) for k in range(n)], "errors": [""] * n}
    return {**doc, **over}


def write(path: Path, doc) -> Path:
    path.write_text(json.dumps(doc))
    return path


def run_of(e2e: list[float], tokens: int = 10, keys=None, pairing="prompt text", concurrency=1) -> PeerRun:
    rows = [{"key": (keys[k] if keys else f"p{k}"), "prompt_tokens": 100, "n_output_tokens": tokens, "ttft_s": 0.1,
             "tpot_s": None, "ntpot_s": None, "e2e_s": v, "itl_s": None, "start_s": float(k),
             "cached_prompt_tokens": None, "ok": True} for k, v in enumerate(e2e)]
    return PeerRun(Path("x.json"), "test", None, "x", requests_frame(rows), output_tokens_per_s=tokens / e2e[0],
                   concurrency=concurrency, pairing=pairing)


def test_a_vllm_file_becomes_requests_in_kvbench_definitions(tmp_path):
    f = write(tmp_path / "v.json", vllm_doc([0.5, 0.3, 0.4], [1.5, 1.3, 1.4], [11, 11, 11]))
    (run,) = load_peers([f])
    assert run.tool == "vllm bench serve" and run.pairing == "request index" and run.concurrency == 1
    r = run.requests
    assert list(r["key"]) == ["#0", "#1", "#2"] and list(r["start_s"]) == [0.0, 1.0, 2.0]
    assert r["tpot_s"].tolist() == pytest.approx([0.1, 0.1, 0.1])  # (e2e − TTFT) ÷ (n − 1)
    assert r["ntpot_s"].tolist() == pytest.approx([1.5 / 11, 1.3 / 11, 1.4 / 11])
    m = medians(run)
    assert (m["ttft_s_p50"], m["e2e_s_p50"], m["itl_s_p50"], m["median_source"]) == (0.4, 1.4, 0.01, "requests")
    assert run.aggregates["ttft_s"]["p50"] == pytest.approx(0.4)


@pytest.mark.parametrize("edit, message", [
    ({"ttfts": [0.5, "x"]}, "v.json: ttfts[1]: must be a number, not 'x'"),
    ({"latencies": [1.0]}, "v.json: latencies: holds 1 values where ttfts holds 2"),
    ({"output_lens": [3, 2.5]}, "v.json: output_lens[1]: must be a whole number, not 2.5"),
    ({"ttfts": {"a": 1}}, "v.json: ttfts: must be a list, not dict"),
    ({"output_throughput": float("inf")}, None),
])
def test_a_vllm_file_that_is_not_what_vllm_writes_is_refused_naming_the_key(tmp_path, edit, message):
    doc = {**vllm_doc([0.5, 0.3], [1.5, 1.3], [3, 3]), **edit}
    f = tmp_path / "v.json"
    f.write_text(json.dumps(doc).replace("Infinity", "1e999"))
    if message is None:  # a tool's non-finite figure is left out, not taken
        assert load_peers([f])[0].output_tokens_per_s is None
        return
    with pytest.raises(ResultsError) as e:
        load_peers([f])
    assert str(e.value) == f"{tmp_path}/{message}"


def test_files_that_are_no_peer_result_are_named_and_a_kvbench_run_is_not_taken_for_one(tmp_path):
    f = write(tmp_path / "other.json", {"hello": 1})
    assert peer_runs(f) is None
    with pytest.raises(ResultsError, match=r"other.json: not a result file kvbench imports \(GuideLLM"):
        load_peers([f])
    with pytest.raises(ResultsError, match="nope.json: no such file or directory"):
        load_peers([tmp_path / "nope.json"])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "trials.jsonl").write_text("")
    assert peer_runs(tmp_path / "run") is None
    (tmp_path / "bad.yaml").write_text("a: [1, 2\n")
    with pytest.raises(ResultsError, match=r"bad.yaml: not valid YAML"):
        peer_runs(tmp_path / "bad.yaml")
    (tmp_path / "tag.yaml").write_text("!!python/object/apply:os.system ['true']\n")
    with pytest.raises(ResultsError, match="tag.yaml: not valid YAML"):
        peer_runs(tmp_path / "tag.yaml")


def test_an_llmd_report_with_a_unit_its_field_cannot_have_is_refused(tmp_path):
    doc = {"version": "0.2.1", "run": {"uid": "u"}, "results": {"request_performance": {"aggregate": {
        "requests": {"total": 1}, "latency": {"time_to_first_token": {"units": "tokens/s", "mean": 1.0}}}}}}
    with pytest.raises(ResultsError) as e:
        load_peers([write(tmp_path / "r.json", doc)])
    assert str(e.value) == (f"{tmp_path}/r.json: results.request_performance.aggregate.latency.time_to_first_token"
                            ".units: 'tokens/s' is not a unit this field can have (ms, s)")


def test_an_llmd_report_of_guidellm_reads_its_tpot_as_ntpot(tmp_path):
    doc = {"version": "0.2", "run": {"uid": "u"}, "scenario": {"load": {"standardized": {
        "tool": "guidellm", "tool_version": "0.8.1", "source": "random",
        "input_seq_len": {"distribution": "fixed", "value": 10}}, "metadata": {}, "native": {}}},
        "results": {"request_performance": {"aggregate": {"requests": {"total": 1}, "latency": {
            "time_to_first_token": {"units": "ms", "mean": 100, "p50": 90},
            "time_per_output_token": {"units": "ms/token", "mean": 30, "p50": 25},
            "inter_token_latency": {"units": "ms/token", "mean": 20, "p50": 19}},
            "throughput": {"output_token_rate": {"units": "tokens/s", "mean": 40}}}}}}
    (run,) = load_peers([write(tmp_path / "g.json", doc)])
    m = medians(run)
    assert (m["ttft_s_p50"], m["ntpot_s_p50"], m["tpot_s_p50"]) == pytest.approx((0.09, 0.025, 0.019))
    assert math.isnan(m["itl_s_p50"]) and m["median_source"] == "file"
    assert any("includes TTFT" in n for n in run.notes) and run.tool_version == "guidellm 0.8.1"


def test_paired_files_give_an_interval_over_the_pairs():
    ref = run_of([2.0, 2.2, 1.8, 2.1, 1.9, 2.0])
    cached = run_of([1.0, 1.1, 0.9, 1.05, 0.95, 1.0])
    c = compare(ref, cached, assume_quiet=True)
    assert c["comparison"] == "paired by prompt text" and c["pairs"] == 6
    assert c["saving_pct"] == pytest.approx(50.0) and 45 < c["saving_ci_low"] <= 50 <= c["saving_ci_high"] < 55
    assert c["verdict"] == "" and c["assumed_quiet"]
    assert compare(ref, cached)["verdict"] == ("inconclusive: the files record no machine load (--assume-quiet if "
                                               "it was quiet)")


def test_files_whose_requests_do_not_match_are_compared_unpaired_and_few_requests_decide_nothing():
    ref = run_of([2.0] * 6, keys=list("abcdef"))
    other = run_of([1.0] * 4, keys=list("uvwx"))
    c = compare(ref, other)
    assert (c["comparison"], c["pairs"], c["saving_pct"]) == ("unpaired", 4, 50.0)
    assert c["verdict"] == "inconclusive: 4 pairs, need 5"
    assert compare(ref, run_of([1.0] * 6, concurrency=4))["verdict"] == "inconclusive: concurrency 4 vs 1"
    noise = compare(run_of([1.0, 2.0, 1.0, 2.0, 1.0, 2.0]), run_of([2.0, 1.0, 2.0, 1.0, 2.0, 1.0]), assume_quiet=True)
    assert noise["verdict"] == "inconclusive: the interval includes no change"


def test_the_cli_costs_peer_files_and_refuses_a_mix_with_kvbench_runs(tmp_path):
    from golden_run import RUN

    a = write(tmp_path / "a.json", vllm_doc([0.5] * 6, [2.0, 2.1, 1.9, 2.0, 2.2, 1.8], [11] * 6,
                                          output_throughput=5.0))
    b = write(tmp_path / "b.json", vllm_doc([0.1] * 6, [1.0, 1.05, 0.95, 1.0, 1.1, 0.9], [11] * 6,
                                          output_throughput=10.0))
    r = CliRunner().invoke(app, ["cost", "--gpu-price", "2", str(a), str(b), "--out", str(tmp_path / "o")],
                           terminal_width=200)
    assert r.exit_code == 0, r.output
    assert "(6 pairs, paired by request index): inconclusive: the files record no machine load" in " ".join(
        r.output.split())
    r = CliRunner().invoke(app, ["cost", "--gpu-price", "2", str(a), str(b), "--out", str(tmp_path / "o"),
                                 "--assume-quiet"], terminal_width=200)
    assert r.exit_code == 0, r.output
    assert "111.11" in r.output and "55.56" in r.output  # 2 USD ÷ (5 tokens/s × 3600) × 1e6; at 10 tokens/s
    assert "b.json against tmp" not in r.output
    assert ("b.json against " in r.output and "+50% [" in r.output and "(6 pairs, paired by request index): cheaper "
            "(the machine assumed quiet (--assume-quiet): their files do not record its load)"
            in " ".join(r.output.split()))
    r = CliRunner().invoke(app, ["cost", "--gpu-price", "2", str(RUN), "--assume-quiet"])
    assert r.exit_code == 2 and "--assume-quiet is for other tools' files: kvbench's runs record the machine's load" \
        in " ".join(r.output.split())
    table = pd.read_csv(tmp_path / "o" / "peer_cost.csv")
    assert table["usd_per_million"].round(2).tolist() == [111.11, 55.56]
    r = CliRunner().invoke(app, ["cost", "--gpu-price", "2", str(a), str(RUN)])
    assert r.exit_code == 2 and "give kvbench runs or other tools' result files, not both: " in r.output
    for flags in (["--max-ttft-ms", "100"], ["--host-price", "1"], ["--host-tier", "measured"]):
        r = CliRunner().invoke(app, ["cost", "--gpu-price", "2", str(a), *flags])
        assert r.exit_code == 2 and f"{flags[0]} applies to kvbench runs" in r.output, flags
    r = CliRunner().invoke(app, ["cost", "--gpu-price", "2", str(a), str(tmp_path / "nope.json")])
    assert r.exit_code == 2 and "nope.json: no such file or directory" in r.output
    assert peer_cost_table(load_peers([a]), Prices(2.0))["reference"].tolist() == [True]


def test_peer_files_decides_which_kind_of_files_a_command_was_given(tmp_path):
    from golden_run import RUN

    a = write(tmp_path / "a.json", vllm_doc([0.5] * 6, [2.0] * 6, [11] * 6))
    nested = tmp_path / "runs" / "x" / "y"
    nested.mkdir(parents=True)
    (nested / "trials.jsonl").write_text("")
    assert is_kvbench_run(RUN) and is_kvbench_run(RUN / "trials.jsonl") and is_kvbench_run(tmp_path / "runs")
    assert not is_kvbench_run(a) and not is_kvbench_run(tmp_path / "nope")
    assert peer_files([RUN]) is None and peer_files([tmp_path / "nope"]) is None  # kvbench's: load_results says
    runs = peer_files([a, a])
    assert [r.tool for r in runs] == ["vllm bench serve"] * 2 and runs[0].label == runs[1].label == str(a)
    assert runs[1].notes[-1] == f"{a} was given more than once"
    for kvbench_run in (RUN, tmp_path / "runs"):
        with pytest.raises(ResultsError) as caught:
            peer_files([a, kvbench_run])
        assert str(caught.value) == f"give kvbench runs or other tools' result files, not both: {kvbench_run} is a " \
            "kvbench run"
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ResultsError, match=r"notes.txt: not a result file kvbench imports \(GuideLLM JSON/YAML"):
        peer_files([tmp_path / "notes.txt", a])
    with pytest.raises(ResultsError, match=r"nope.json: no such file or directory$"):
        peer_files([a, tmp_path / "nope.json"])


def test_report_says_a_peer_file_is_for_cost_and_map_says_what_it_lacks():
    peers = Path(__file__).resolve().parents[1] / "data" / "peers"
    r = CliRunner().invoke(app, ["report", str(peers / "vllm" / "cache.json")])
    assert r.exit_code == 2 and " ".join(r.output.split()).endswith(
        "cache.json: not a trials.jsonl file or a run directory; it is vllm bench serve's result: kvbench cost and "
        "kvbench map read it")
    r = CliRunner().invoke(app, ["report", str(peers / "aiperf" / "cache" / "profile_export.jsonl")])
    assert r.exit_code == 2 and "it is aiperf's result: kvbench cost and kvbench map read it" in " ".join(
        r.output.split())
    r = CliRunner().invoke(app, ["map", str(peers / "vllm" / "cache.json")])
    assert r.exit_code == 2 and " ".join(r.output.split()) == (
        "error: nothing to map: peers/vllm/cache.json: not mapped: vllm bench serve's file does not say its shared "
        "prefix")


def test_a_yaml_alias_bomb_is_refused_before_it_expands(tmp_path):
    text, prev = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n', "a"
    for name in "bcdefghi":
        text += f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]\n"
        prev = name
    (tmp_path / "bomb.yaml").write_text(text + 'version: "0.2.1"\nrun: {}\nresults: {x: *i}\n')
    with pytest.raises(ResultsError, match="expands to more than 5,000,000 values through its aliases"):
        peer_runs(tmp_path / "bomb.yaml")


@pytest.mark.parametrize("edit, message", [
    ({"output_lens": [10**400, 3]}, "not a file kvbench reads: an integer of 401 digits (at most 300 are read): "
                                    "100000000000..."),  # refused by the reader, before any key is looked at
    ({"latencies": [-1.5, 1.3]}, "request 0 (ttfts, latencies, itls): E2E -1.5 s is negative"),
    ({"latencies": [0.4, 1.3]}, "request 0 (ttfts, latencies, itls): e2e 0.4 s is shorter than its TTFT 0.5 s"),
    # from the hostile pass: 0-second requests gave a divide-by-zero warning and "+100% saving"
    ({"ttfts": [0.0, 0.3], "latencies": [0.0, 1.3]}, "request 0 (ttfts, latencies, itls): e2e 0 s for 3 generated "
                                                     "tokens: no request takes no time"),
    ({"output_throughput": -5.0}, "output_throughput: must be at least 0, not -5"),
    ({"median_ttft_ms": -3.0}, "median_ttft_ms: must be at least 0, not -3"),
])
def test_impossible_figures_are_refused_naming_the_request_or_key(tmp_path, edit, message):
    doc = {**vllm_doc([0.5, 0.3], [1.5, 1.3], [3, 3]), **edit}
    f = tmp_path / "v.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(ResultsError) as e:
        load_peers([f])
    assert str(e.value) == f"{f}: {message}"


def test_a_guidellm_report_without_benchmarks_and_an_old_llmd_report_are_named(tmp_path):
    peers = Path(__file__).resolve().parents[1] / "data" / "peers"
    doc = json.loads((peers / "guidellm" / "cache" / "benchmarks.json").read_text())
    with pytest.raises(ResultsError, match=r"g.json: benchmarks: empty: GuideLLM ran no benchmark"):
        load_peers([write(tmp_path / "g.json", {**doc, "benchmarks": []})])
    with pytest.raises(ResultsError, match=r"old.json: an llm-d Benchmark Report of version 0.1: kvbench reads "
                                           r"versions 0.2 and 0.2.1"):
        load_peers([write(tmp_path / "old.json", {"version": "0.1", "run": {}, "results": {}})])


def test_files_of_one_name_are_told_apart_and_a_file_given_twice_is_said(tmp_path):
    for d in ("r1", "r2"):
        (tmp_path / d / "x").mkdir(parents=True)
        write(tmp_path / d / "x" / "v.json", vllm_doc([0.5] * 2, [1.5] * 2, [3, 3]))
    runs = load_peers([tmp_path / "r1" / "x" / "v.json", tmp_path / "r2" / "x" / "v.json"])
    assert [r.label for r in runs] == ["r1/x/v.json", "r2/x/v.json"]
    (tmp_path / "r3").mkdir()
    write(tmp_path / "r3" / "v.json", vllm_doc([0.5] * 2, [1.5] * 2, [3, 3]))
    (tmp_path / "r4").mkdir()
    write(tmp_path / "r4" / "v.json", vllm_doc([0.5] * 2, [1.5] * 2, [3, 3]))
    runs = load_peers([tmp_path / "r3" / "v.json", tmp_path / "r3" / "v.json"])
    assert runs[0].label == str(tmp_path / "r3" / "v.json")
    assert f"{tmp_path / 'r3' / 'v.json'} was given more than once" in runs[0].notes


def test_a_file_that_does_not_say_its_concurrency_is_compared_by_throughput_only(tmp_path):
    a = write(tmp_path / "a.json", vllm_doc([0.5] * 6, [2.0] * 6, [11] * 6, output_throughput=5.0))
    burst = vllm_doc([1.5] * 6, [6.0] * 6, [11] * 6, output_throughput=15.0)
    b = write(tmp_path / "b.json", {k: v for k, v in burst.items() if k != "max_concurrency"})
    c = compare(*load_peers([a, b]))
    assert c["comparison"] == "throughputs only" and c["saving_pct"] == pytest.approx(100 * (1 - 5 / 15))
    assert c["verdict"].startswith("inconclusive: the concurrency of ") and "b.json is not in its file" in c["verdict"]


def test_a_sampled_guidellm_report_prices_all_its_tokens_and_says_so(tmp_path):
    peers = Path(__file__).resolve().parents[1] / "data" / "peers"
    doc = json.loads((peers / "guidellm" / "cache" / "benchmarks.json").read_text())
    full = load_peers([peers / "guidellm" / "cache" / "benchmarks.json"])[0]
    doc["benchmarks"][0]["requests"]["successful"] = doc["benchmarks"][0]["requests"]["successful"][:3]
    (sampled,) = load_peers([write(tmp_path / "s.json", doc)])
    assert len(sampled.requests) == 3 and sampled.output_tokens_per_s == pytest.approx(full.output_tokens_per_s)
    assert any("3 of its 6 successful requests kept" in n for n in sampled.notes)


def test_a_guidellm_sweep_names_each_benchmark_by_its_load(tmp_path):
    peers = Path(__file__).resolve().parents[1] / "data" / "peers"
    doc = json.loads((peers / "guidellm" / "cache" / "benchmarks.json").read_text())
    second = json.loads(json.dumps(doc["benchmarks"][0]))
    second["config"]["strategy"] = {"type_": "concurrent", "streams": 2}
    doc["benchmarks"].append(second)
    runs = load_peers([write(tmp_path / "sweep.json", doc)])
    assert [r.label.split(" ", 1)[1] for r in runs] == ["[synchronous]", "[concurrent 2]"]
    assert [r.concurrency for r in runs] == [1, 2]


@pytest.mark.parametrize("request_args", ['{"body": [1]}', '"x"', "5", "[" * 5000 + "]" * 5000])
def test_guidellm_request_args_of_another_shape_leave_the_request_unpaired(tmp_path, request_args):
    peers = Path(__file__).resolve().parents[1] / "data" / "peers"
    doc = json.loads((peers / "guidellm" / "cache" / "benchmarks.json").read_text())
    doc["benchmarks"][0]["requests"]["successful"][0]["request_args"] = request_args
    (run,) = load_peers([write(tmp_path / "g.json", doc)])
    assert run.requests["key"].isna().tolist() == [True, False, False, False, False, False]


def test_a_deeply_nested_first_line_is_no_peer_file_and_no_traceback(tmp_path):
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 200_000 + "]" * 200_000 + "\n")
    assert peer_runs(deep) is None
    r = CliRunner().invoke(app, ["report", str(deep)])
    assert r.exit_code == 2 and "Traceback" not in r.output


@pytest.mark.parametrize("edit, message", [
    ({"results": {"observability": {"components": [{"component_label": "x", "aggregate": {
        "cache_hit_rate": {"units": "fraction", "mean": 67}}}]}}}, "a hit rate above 100%"),
    ({"results": {"observability": {"components": [{"component_label": "x", "aggregate": {
        "cache_hit_rate": {"units": "bananas", "mean": 0.5}}}]}}}, "'bananas': a hit rate is 'percent' or 'fraction'"),
    ({"results": {"request_performance": {"aggregate": {"requests": {"total": 30, "failures": 99}}}}},
     "failures: 99 failures of 30 requests"),
    ({"scenario": {"load": {"standardized": {"concurrency": True}}}}, "must be a number, not bool"),
    ({"scenario": {"load": {"standardized": {"concurrency": -3}}}}, "must be at least 0, not -3"),
])
def test_an_llmd_report_with_impossible_figures_is_refused(tmp_path, edit, message):
    doc = {"version": "0.2.1", "run": {"uid": "u"}, "results": {}, **edit}
    with pytest.raises(ResultsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_peers([write(tmp_path / "r.json", doc)])
