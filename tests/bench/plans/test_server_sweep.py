"""The pieces of a server run that need no server: the command line, the mode order, the reusable prefixes, the
request row's cache truth, and the reading side (recompute pairs with `none`, cost over the time in flight, the
findings)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from kvbench.analysis.reuse import recompute_side
from kvbench.analysis.reuse_cost import busy_seconds
from kvbench.bench.engines.server.client import Reply
from kvbench.bench.engines.server.engine import ServerEngine
from kvbench.bench.engines.server.launch import server_argv
from kvbench.bench.engines.server.requests import reusable_tokens
from kvbench.bench.engines.server.session import common_prefix
from kvbench.bench.engines.server.rows import request_row
from kvbench.bench.plans.server import at_level, mode_order
from kvbench.report.server_findings import server_findings
from kvbench.scenario import parse_scenario
from kvbench.scenario.servers import preset_of
from kvbench.workloads.sessions import Request, Stream


def scenario(**over):
    data = {"name": "srv", "model": "smollm2-135m", "engine": {"kind": "llama.cpp", "binary": "/bin/sh",
                                                                "args": ["-t", "1"]},
            "workload": {"source": "sharegpt", "multi_turn": {"conversations": 2, "turns": 2}},
            "max_new_tokens": 3, "repeats": 1,
            "modes": [{"name": "none"}, {"name": "prefix-cache"}, {"name": "ram", "preset": "host-cache", "size": 64}]}
    data.update(over)
    return parse_scenario(data, "s.yaml")


REQUESTS = [Request("c0-t1", "c0", 1, (1, 2, 3), (1, 2, 3, 9, 9)), Request("c1-t1", "c1", 1, (1, 2, 7), (1, 2, 7)),
            Request("c0-t2", "c0", 2, (1, 2, 3, 9, 9, 4), (1, 2, 3, 9, 9, 4))]


def engine(s=None) -> ServerEngine:
    return ServerEngine(s or scenario(), Stream(REQUESTS), Path("/nonexistent"), max_positions=64)


def test_the_command_line_puts_the_scenario_s_flags_first_and_kvbench_s_last():
    s = scenario()
    ram = s.modes[2]
    argv, _ = server_argv(s, preset_of("llama.cpp", ram), ram, 4242, 2, 40, Path("/run/slots"))
    assert argv[:5] == ["/bin/sh", "-t", "1", "--cache-ram", "64"]  # engine's, preset's, then the mode's
    gguf = argv[6]
    assert gguf.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert argv[5:] == ["-m", gguf, "--host", "127.0.0.1", "--port", "4242", "--metrics", "-c", "80", "-np", "2",
                        "--seed", "0"]  # last, so that no earlier word can change where it listens


def test_the_reusable_prefix_is_what_an_earlier_request_held():
    assert common_prefix((1, 2, 3), (1, 2, 4, 5)) == 2 and common_prefix((), (1,)) == 0
    assert common_prefix((1, 2), (1, 2, 3)) == 2
    assert reusable_tokens(REQUESTS) == {"c0-t1": 0, "c1-t1": 2, "c0-t2": 5}
    e = engine()
    assert e.followed == {"c0-t1"}  # the last turn of each conversation holds nothing anyone needs
    assert e.ctx_per_slot == 6 + 3 + 16  # the longest prompt (or held ids of a followed turn), new tokens, margin


def test_none_runs_first_and_the_others_rotate_by_repeat():
    s = scenario()
    assert [m.label for m in mode_order(s.modes, 0)] == ["none", "prefix-cache", "ram"]
    assert [m.label for m in mode_order(s.modes, 1)] == ["none", "ram", "prefix-cache"]
    assert [m.label for m in mode_order(s.modes, 2)] == ["none", "prefix-cache", "ram"]


def test_a_level_of_several_renames_the_mode_and_keeps_its_preset():
    ram = scenario().modes[2]
    assert at_level(ram, 4, [4]) is ram
    named = at_level(ram, 4, [1, 4])
    assert (named.label, named.kind, named.size) == ("ram@c4", "host-cache", 64)


def reply(cached: int | None, ids=(5, 6, 7), text="abc") -> Reply:
    return Reply(t_sent=10.0, token_times=[10.5, 10.6, 10.8], chunk_times=[10.5, 10.6, 10.8], ids=list(ids), text=text,
                 text_sha256=f"sha-{text}", prompt_tokens=6, cached_tokens=cached,
                 server_timings={"per_token_s": 0.1, "prompt_s": 0.4}, stop_reason="limit")


def test_a_request_row_carries_the_server_s_cache_truth_and_verifies_a_cold_start():
    s = scenario()
    e = engine(s)
    outcome = SimpleNamespace(arrival_s=1.0, start_s=1.5)
    none = e.trials(s.modes[0], 0, REQUESTS)[2]
    row = request_row(e, none, reply(0), outcome, first=True)
    assert (row["trial_id"], row["warm"], row["cached_prompt_tokens"], row["cold_verified"]) == (
        "c0-t2-none-r0", False, 0, True)
    assert (row["ttft_s"], row["reusable_prompt_tokens"], row["tokens_match"]) == (0.5, 5, True)
    assert (row["arrival_s"], row["queue_s"]) == (1.5, 0.0)  # one at a time: a request arrives when it is sent
    c = scenario(load={"profile": "concurrent", "concurrency": 2})
    assert request_row(engine(c), engine(c).trials(c.modes[0], 0, REQUESTS)[2], reply(0), outcome)["queue_s"] \
        == 0.5
    assert row["itl_s"] == pytest.approx([0.1, 0.2]) and row["server_tpot_s"] == 0.1
    warm = e.trials(s.modes[1], 0, REQUESTS)[2]
    row = request_row(e, warm, reply(5, text="abd"), outcome)
    assert (row["tokens_restored"], row["tokens_prefilled"], row["store_hit_rate"]) == (5, 1, 1.0)
    assert (row["tokens_match"], row["cold_verified"]) == (False, None)


def test_a_cold_mode_that_hit_is_contaminated_and_never_the_reference():
    s = scenario()
    e = engine(s)
    none = e.trials(s.modes[0], 0, REQUESTS)[2]
    row = request_row(e, none, reply(4), None, first=True)
    assert (row["contaminated"], row["cold_verified"], row["tokens_match"]) == (True, False, None)
    assert "not taken as the reference" in row["notes"]["tokens_match"]
    warm = e.trials(s.modes[1], 0, REQUESTS)[2]
    assert request_row(e, warm, reply(5), None)["tokens_match"] is None  # nothing to compare with


def test_a_reply_of_another_length_is_refused():
    s = scenario(max_new_tokens=4)
    e = engine(s)
    with pytest.raises(RuntimeError, match="generated 3 tokens, expected exactly 4"):
        request_row(e, e.trials(s.modes[0], 0, REQUESTS)[0], reply(0), None)


def frame(rows: list[dict]) -> pd.DataFrame:
    base = {"group": "g", "run": "r", "run_path": "/r", "repeat": 0, "status": "ok", "engine": "llama.cpp",
            "contaminated": False}
    return pd.DataFrame([{**base, **r} for r in rows])


def test_a_server_mode_s_recompute_side_is_none_at_the_same_concurrency():
    t = frame([{"mode": "none", "mode_label": "none@c1", "warm": False, "concurrency": 1, "request_id": "a"},
               {"mode": "none", "mode_label": "none@c4", "warm": False, "concurrency": 4, "request_id": "a"},
               {"mode": "none", "mode_label": "none@c4", "warm": False, "concurrency": 4, "request_id": "b",
                "contaminated": True},
               {"mode": "prefix-cache", "mode_label": "prefix-cache@c4", "warm": True, "concurrency": 4,
                "request_id": "a"}])
    side = recompute_side(t, t[t["mode_label"] == "prefix-cache@c4"], "g")
    assert side["mode_label"].tolist() == ["none@c4"] and side["request_id"].tolist() == ["a"]


def test_cost_time_counts_requests_in_flight_together_once():
    t = pd.DataFrame({"run": "r", "repeat": [0, 0, 0, 1], "start_s": [0.0, 1.0, 5.0, 0.0],
                      "e2e_s": [2.0, 2.0, 1.0, 3.0]})
    assert busy_seconds(t) == 3.0 + 1.0 + 3.0  # [0, 3] and [5, 6] in repeat 0, [0, 3] in repeat 1


def test_server_findings_name_the_history_reused_the_divergences_and_the_cold_starts():
    t = frame([{"mode": "none", "mode_label": "none", "warm": False, "turn_index": 2, "cached_prompt_tokens": 0,
                "reusable_prompt_tokens": 100, "prompt_tokens": 120, "tokens_match": True, "cold_verified": True,
                "first_divergence_step": None},
               {"mode": "prefix-cache", "mode_label": "prefix-cache", "warm": True, "turn_index": 2,
                "cached_prompt_tokens": 95, "reusable_prompt_tokens": 100, "prompt_tokens": 120,
                "tokens_match": False, "first_divergence_step": 3, "cold_verified": True}])
    servers = [{"mode_label": "prefix-cache", "metrics_delta": {"prompt_tokens": 25.0, "prompt_tokens_cached": None},
                "metrics_delta_holds": {"prompt_tokens": 10.0, "prompt_tokens_cached": 90.0},
                "metrics_holds": {"sent": 1, "separated": 1}}]
    lines = server_findings(t, "g", None, servers)
    assert lines == [
        "`none`: 0 cached prompt tokens on every one of 1 requests (checked)",
        "`prefix-cache`: from turn 2 on reused 95% of what earlier turns held (1 requests; the least 95%); 79% of all "
        "prompt tokens came from the cache",
        "`prefix-cache`: 1 of 1 requests generated other ids than `none` (first differing token at step 3): the server's "
        "cached and recomputed prompts are not bit-identical, a finding about the engine, not an error of kvbench",
        "cold starts: 2 of 2 mode starts answered their first request with 0 cached tokens",
        "`prefix-cache` /metrics deltas of its measured requests over its servers: prompt_tokens 25, "
        "prompt_tokens_cached not reported; its 1 unrecorded holds: prompt_tokens 10, prompt_tokens_cached 90"]
    servers[0].update(metrics_delta_holds=None, metrics_holds={"sent": 3, "separated": 1})  # 2 overlapped others
    assert server_findings(t, "g", None, servers)[-1] == (
        "`prefix-cache` /metrics deltas over its servers, including 2 of its 3 unrecorded holds (sent while other "
        "requests were in flight, so their share cannot be taken out): prompt_tokens 25, prompt_tokens_cached not "
        "reported")
    del servers[0]["metrics_holds"]  # a run of a kvbench before the holds were read apart
    assert server_findings(t, "g", None, servers)[-1] == (
        "`prefix-cache` /metrics deltas over its servers, its unrecorded holds included (a run of an older kvbench, "
        "which did not read them apart): prompt_tokens 25, prompt_tokens_cached not reported")
    t.loc[t["mode"] == "prefix-cache", "cached_prompt_tokens"] = 110  # the server matched more than the turns held
    assert server_findings(t, "g", None, servers)[1] == (
        "`prefix-cache`: from turn 2 on reused 110% of what earlier turns held (1 requests; the least 110%); 92% of "
        "all prompt tokens came from the cache; over 100%: the server also matched tokens the conversation's earlier "
        "turns did not send (another conversation's or an earlier mode's prompt with the same start: see the "
        "cold-start check)")


def test_hit_rate_up_latency_flat_is_a_finding_only_when_ttft_hardly_moved():
    t = frame([{"mode": "prefix-cache", "mode_label": "pc", "warm": True, "turn_index": 2, "cached_prompt_tokens": 90,
                "reusable_prompt_tokens": 100, "prompt_tokens": 100, "tokens_match": True,
                "first_divergence_step": None, "cold_verified": None}])

    def later(ratio: float) -> pd.DataFrame:
        return pd.DataFrame([{"group": "g", "mode_label": "pc", "ttft_ratio": ratio, "ttft_ratio_ci_low": ratio - 0.1,
                              "ttft_ratio_ci_high": ratio + 0.2, "pairs": 6, "ttft_verdict": ""}])

    flat = [line for line in server_findings(t, "g", later(0.95), []) if "latency flat" in line]
    assert flat == ["`pc`: hit rate up, latency flat: 90% of the history came from the cache but TTFT did not clearly "
                    "drop (prefill is not what limits TTFT here, or the restore costs what recompute does)"]
    assert not [line for line in server_findings(t, "g", later(0.3), []) if "latency flat" in line]
    assert "`pc`: TTFT ÷ `none`'s from turn 2 on: 0.30 [0.20, 0.50] over 6 request pairs" in server_findings(
        t, "g", later(0.3), [])


def test_the_server_watch_reads_the_gpu_memory_of_the_server_s_processes_only():
    import os

    from kvbench.bench.telemetry.server import ServerWatch

    class FakeNvml:
        def __init__(self):
            self.n = 0

        def raw(self):
            self.n += 1
            return {"processes": [(os.getpid(), 1000 * self.n), (1, 10**9)], "memory": (5000 + self.n, 8000),
                    "util": 50, "power_mw": 200_000}

    watch = ServerWatch(os.getpid(), 10.0, FakeNvml()).start()
    fields = watch.stop()  # one sample at the start, one at the stop
    assert fields["nvml_process_peak_bytes"] == 2000 and fields["nvml_device_peak_bytes"] == 5002
    assert (fields["gpu_util_mean_percent"], fields["power_mean_w"], fields["n_samples"]) == (50, 200.0, 2)
    assert fields["rss_peak_bytes"] > 10**6 and fields["rss_peak_source"] == "server samples"


def test_a_server_mode_s_cost_saving_lies_in_its_interval_when_requests_overlap():
    from kvbench.analysis.cost import Prices
    from kvbench.analysis.reuse_cost import reuse_cost

    rows = []
    for k in range(8):  # `none` one at a time; prefix-cache two in flight: its busy time is half of its Σ e2e
        for mode, e2e, start in (("none", 2.0 + 0.1 * k, 2.5 * k), ("prefix-cache", 1.0 + 0.05 * k, 2.0 * (k // 2))):
            rows.append({"mode": mode, "mode_label": mode, "warm": mode != "none", "request_id": f"q{k}",
                         "start_s": start, "e2e_s": e2e, "ttft_s": e2e / 2, "n_output_tokens": 8,
                         "batch_size": 1, "prompt_tokens": 100, "tokens_restored": 50 if mode != "none" else 0,
                         "cached_prompt_tokens": 50 if mode != "none" else 0,
                         "tokens_match": True, "machine_busy": False, "concurrency": 2})
    costs = reuse_cost(frame(rows), Prices(gpu_per_hour=2.0))
    (r,) = costs.to_dict("records")  # `none` is the other modes' recompute side, not a row of its own
    assert (r["mode_label"], r["engine"], r["pairs"]) == ("prefix-cache", "llama.cpp", 8)
    # the 8 pairs come from one load of requests in flight together: one independent observation, no interval
    # (a resampling of one unit printed a zero-width one)
    assert r["saving_ci_low"] != r["saving_ci_low"] and r["saving_ci_high"] != r["saving_ci_high"]
    assert (r["units"], r["unit"]) == (1, "concurrent loads")
    assert r["saving_verdict"] == "inconclusive: 1 concurrent load, need 5"
    assert r["recompute_tokens_per_s"] == pytest.approx(64 / busy_seconds(frame(rows)[lambda f: f["mode"] == "none"]))


def test_the_load_table_gives_throughput_over_the_time_in_flight_percentiles_and_goodput():
    from kvbench.analysis.server_load import server_load_table

    rows = [{"mode": "none", "mode_label": "none", "warm": False, "request_id": f"q{k}", "concurrency": 2,
             "start_s": [0.0, 0.0, 2.0, 2.0][k], "e2e_s": 2.0, "ttft_s": [0.5, 1.0, 1.5, 3.0][k],
             "tpot_s": [0.1, 0.1, 0.2, 0.1][k], "itl_s": [0.1, 0.1], "n_output_tokens": 3} for k in range(4)]
    rows.append({**rows[0], "request_id": "q4", "status": "error"})
    t = server_load_table(frame(rows), max_ttft_s=1.5, max_tpot_s=0.15)
    (r,) = t.to_dict("records")
    assert (r["requests"], r["failed"], r["busy_s"], r["throughput_busy_tokens_per_s"]) == (4, 1, 4.0, 3.0)
    assert (r["ttft_p50_s"], r["ttft_p90_s"], r["ttft_p99_s"]) == (1.5, 3.0, 3.0)  # numpy's higher method
    assert (r["itl_p50_s"], r["tpot_p99_s"]) == (0.1, 0.2)
    assert (r["slo_met_pct"], r["goodput_busy_per_s"]) == (50.0, 0.5)  # q0 and q1 meet both: 2 requests in 4 s
    assert "slo_met_pct" not in server_load_table(frame(rows)).columns
    # achieved concurrency and the wall clock: 2 in flight at once, for the whole 4 s the load lasted
    assert (r["concurrency"], r["in_flight_max"], r["in_flight_mean"], r["wall_s"]) == (2, 2, 2.0, 4.0)
    assert (r["ttft_n"], r["tpot_n"], r["itl_n"], r["goodput_wall_per_s"]) == (4, 4, 8, 0.5)


def test_the_load_table_says_what_concurrency_was_reached_and_divides_by_the_wall_clock_too():
    from kvbench.analysis.server_load import server_load_table
    from kvbench.report.server_load import concurrency_lines, server_load_display

    # asked for 4 in flight; two requests one after another with a 1 s pause: 1 in flight, 2 s of 3
    rows = [{"mode": "prefix-cache", "mode_label": "prefix-cache@c4", "warm": True, "request_id": f"q{k}",
             "concurrency": 4, "start_s": [0.0, 2.0][k], "e2e_s": 1.0, "ttft_s": 0.5, "tpot_s": 0.25, "ntpot_s": 0.5,
             "itl_s": [0.25], "n_output_tokens": 3, "prompt_tokens": 100, "cached_prompt_tokens": [0, 80][k]}
            for k in range(2)]
    (r,) = server_load_table(frame(rows)).to_dict("records")
    assert (r["in_flight_max"], r["in_flight_mean"], r["busy_s"], r["wall_s"]) == (1, 1.0, 2.0, 3.0)
    assert (r["throughput_busy_tokens_per_s"], r["throughput_wall_tokens_per_s"]) == (3.0, 2.0)
    assert (r["request_rate_busy_per_s"], r["request_rate_wall_per_s"]) == (1.0, pytest.approx(2 / 3))
    assert r["cached_token_share"] == 0.4 and r["ntpot_p50_s"] == 0.5  # 80 of 200 prompt tokens
    cells = server_load_display(server_load_table(frame(rows))).iloc[0]
    assert cells["in flight"] == "4: max 1, mean 1.0" and cells["tok/s busy / wall"] == "3.00 / 2.00"
    assert cells["TTFT ms p50/p90/p99"] == "max 500 / max 500 / max 500"
    assert cells["ITL ms p50/p90/p99"] == "max 250 / max 250 / max 250 (n 2)" and cells["hit %"] == "40"
    assert concurrency_lines(server_load_table(frame(rows))) == [
        "`prefix-cache@c4`: asked for 4 requests in flight, at most 1 were (mean 1.0 while any was): the workload "
        "cannot fill that level (a conversation's turns go one after another)"]
