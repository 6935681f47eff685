"""The server engine on the real llama-server (built by `make llama-server` into kvbench's environment) with the
SmolLM2 GGUF: a multi-turn run, none against prefix-cache, checked for cold starts, cache reuse and cleanup."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

import kvbench
from conftest import llama_multi_turn
from kvbench.bench.run import RunProgress

LLAMA_SERVER = Path(sys.prefix) / "bin" / "llama-server"

pytestmark = [
    pytest.mark.server,
    pytest.mark.skipif(not os.access(LLAMA_SERVER, os.X_OK),
                       reason=f"llama-server is not built at {LLAMA_SERVER}: `make llama-server` builds it there "
                              "(about 5 minutes on two cores)"),
]


def llama_servers(ports: set[int]) -> list[psutil.Process]:
    """Running llama-server processes listening on one of ``ports`` (by their command line)."""
    found = []
    for p in psutil.process_iter(["exe", "cmdline", "status"]):
        argv = p.info["cmdline"] or []
        if (p.info["exe"] == str(LLAMA_SERVER) or argv[:1] == [str(LLAMA_SERVER)]) and p.info["status"] != "zombie":
            if "--port" in argv[:-1] and int(argv[argv.index("--port") + 1]) in ports:
                found.append(p)
    return found


class Knock(RunProgress):
    """After the first measured request, as another process of the machine would: the server's command line, and
    its endpoints asked without a key."""

    def __init__(self):
        self.argv, self.answers = [], {}

    def trial_done(self, row):
        if self.answers:
            return
        self.argv = next(p.cmdline() for p in psutil.Process(os.getpid()).children(recursive=True)
                         if p.cmdline()[:1] == [str(LLAMA_SERVER)])
        url = f"http://127.0.0.1:{self.argv[self.argv.index('--port') + 1]}"
        for method, path in (("GET", "/health"), ("GET", "/metrics"), ("GET", "/slots"), ("GET", "/props"),
                             ("POST", "/slots/0?action=save"), ("POST", "/completion")):
            self.answers[path] = httpx.request(method, url + path, json={"filename": "x.bin", "prompt": [1]},
                                               timeout=30).status_code


def test_multi_turn_on_the_real_llama_server(tmp_path):
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(llama_multi_turn()))
    knock = Knock()
    res = kvbench.run_scenario(tmp_path / "s.yaml", out=tmp_path / "res", progress=knock)
    # kvbench's requests carry the server's key; no other process gets past /health
    assert knock.answers == {"/health": 200, "/metrics": 401, "/slots": 401, "/props": 401,
                             "/slots/0?action=save": 401, "/completion": 401}
    assert knock.argv[-2] == "--api-key-file" and not (Path(knock.argv[-1])).exists()
    rows = {r["trial_id"]: r for r in res.rows}
    assert len(rows) == 8 and all(r["status"] == "ok" for r in rows.values()), [r.get("message") for r in rows.values()]
    for r in rows.values():
        assert r["n_output_tokens"] == 4 and isinstance(r["tokens_match"], bool)
        assert r["server_prompt_tokens"] == r["prompt_tokens"]
    none = [r for r in rows.values() if r["mode"] == "none"]
    assert len(none) == 4 and all(r["cached_prompt_tokens"] == 0 and r["contaminated"] is False for r in none)
    turn2 = [r for r in rows.values() if r["mode"] == "prefix-cache" and r["turn_index"] == 2]
    assert len(turn2) == 2
    for r in turn2:  # the turn's prompt starts with the previous turn's prompt and reply, which the slot holds
        assert r["reusable_prompt_tokens"] > 200
        assert r["cached_prompt_tokens"] >= 0.9 * r["reusable_prompt_tokens"], r
    assert [r["cold_verified"] for r in rows.values() if r["request_id"] == "c0-t1"] == [True, True]
    servers = kvbench.load_results(res.run_dir).runs[0]["servers"]
    assert [s["mode_label"] for s in servers] == ["none", "prefix-cache"]
    for s in servers:
        assert s["version"].startswith("version:") and s["argv"][0] == str(LLAMA_SERVER)
        assert s["argv"][s["argv"].index("--host") + 1] == "127.0.0.1"
    assert servers[0]["metrics_delta"]["prompt_tokens_cached"] == 0
    # the deltas are the measured requests' own: each hold (one at a time, alone) read around and taken out
    prefix = [r for r in rows.values() if r["mode"] == "prefix-cache"]
    assert servers[1]["metrics_holds"] == {"sent": 2, "separated": 2}
    assert servers[1]["metrics_delta"]["prompt_tokens_cached"] == sum(r["cached_prompt_tokens"] for r in prefix)
    assert servers[1]["metrics_delta"]["prompt_tokens"] == sum(r["prompt_tokens"] - r["cached_prompt_tokens"]
                                                               for r in prefix)
    assert servers[1]["metrics_delta"]["tokens_predicted"] == 4 * 4
    assert servers[1]["metrics_delta_holds"]["tokens_predicted"] == 2
    ports = {int(s["argv"][s["argv"].index("--port") + 1]) for s in servers}
    assert not llama_servers(ports)


def test_kind_openai_measures_a_running_server_and_checks_its_cold_start(tmp_path):
    """kind openai: kvbench starts nothing, sends /v1/completions to the running server (here a llama-server this
    test starts) and reads usage.prompt_tokens_details.cached_tokens; without a restart or a reset, a mode that
    follows another on the same server is reported as not cold."""
    from kvbench.serving.llamacpp import gguf_file
    from kvbench.bench.engines.server.process import ServerProcess, free_port

    port = free_port()
    gguf = gguf_file("smollm2-135m")
    argv = [str(LLAMA_SERVER), "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-c", "2048", "-t", "1"]
    with ServerProcess(argv, tmp_path / "server.log", port=port, startup_timeout_s=120) as server:
        data = {
            "name": "openai_server", "model": "smollm2-135m", "engine": {"kind": "openai", "url": server.url},
            "workload": {"source": "sharegpt", "seed": 0, "doc_qa": {"documents": 1, "questions": 2,
                                                                     "doc_tokens": 300}},
            "max_new_tokens": 4, "repeats": 1, "warmup": 0, "seed": 0,
            "modes": [{"name": "none", "request": {"cache_prompt": False}}, {"name": "prefix-cache"}],
        }
        (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
        res = kvbench.run_scenario(tmp_path / "s.yaml", out=tmp_path / "res")
    rows = {r["trial_id"]: r for r in res.rows}
    assert sorted(rows) == ["d0-q1-none-r0", "d0-q1-prefix-cache-r0", "d0-q2-none-r0", "d0-q2-prefix-cache-r0"]
    assert all(r["status"] == "ok" and r["engine"] == "openai" for r in rows.values()), rows
    assert [rows[f"d0-q{q}-none-r0"]["cached_prompt_tokens"] for q in (1, 2)] == [0, 0]
    # the second question starts with the document the first one left in the slot
    assert rows["d0-q2-prefix-cache-r0"]["cached_prompt_tokens"] >= 300
    # none's last prompt (question 2) shares the document with prefix-cache's first: not a cold start
    assert rows["d0-q1-prefix-cache-r0"]["cold_verified"] is False
    servers = kvbench.load_results(res.run_dir).runs[0]["servers"]
    assert [(s["mode_label"], "argv" in s) for s in servers] == [("none", False), ("prefix-cache", False)]
    # the server listens on this machine: its process is found, its memory sampled and its CPU the trial's own
    assert [s["pid"] for s in servers] == [server.pid, server.pid]
    assert all(r["server_rss_growth_bytes"] is not None for r in rows.values())
    # the server is gone: resuming the finished run prints its summary without asking it (or reading ShareGPT)
    again = kvbench.run_scenario(resume=res.run_dir)
    assert not again.swept and again.already == 4 and sorted(r["trial_id"] for r in again.rows) == sorted(rows)
    assert list(again.reuse["mode_label"].unique()) == ["none", "prefix-cache"]


def test_kind_openai_measures_a_tier_mode_on_its_own_running_server(tmp_path):
    """kind openai with two running servers: the tier preset's mode goes to its own url (a llama-server with a host
    cache), the others to engine.url; its tier saving is taken against prefix-cache, and since neither the OpenAI
    reply nor llama.cpp's /metrics says what a tier served, it is not measured: no tier verdict from cached
    tokens."""
    from kvbench.analysis.cost import Prices
    from kvbench.analysis.reuse_cost import reuse_cost
    from kvbench.bench.engines.server.process import ServerProcess, free_port
    from kvbench.serving.llamacpp import gguf_file

    gguf = gguf_file("smollm2-135m")

    def server(port: int, ram: str, log: str) -> ServerProcess:
        argv = [str(LLAMA_SERVER), "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-c", "2048", "-t", "1",
                "--cache-ram", ram, "--metrics"]
        return ServerProcess(argv, tmp_path / log, port=port, startup_timeout_s=120)

    with server(free_port(), "0", "off.log") as off, server(free_port(), "256", "tier.log") as tier:
        data = {
            "name": "two_servers", "model": "smollm2-135m", "engine": {"kind": "openai", "url": off.url},
            "workload": {"source": "sharegpt", "seed": 0, "doc_qa": {"documents": 1, "questions": 2,
                                                                     "doc_tokens": 300}},
            "max_new_tokens": 4, "repeats": 1, "warmup": 0, "seed": 0,
            "modes": [{"name": "none", "request": {"cache_prompt": False}}, {"name": "prefix-cache"},
                      {"name": "cpu-tier", "preset": "tier", "url": tier.url}],
        }
        (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
        res = kvbench.run_scenario(tmp_path / "s.yaml", out=tmp_path / "res")
        pids = (off.pid, tier.pid)
    results = kvbench.load_results(res.run_dir)
    assert [(s["mode_label"], s["url"], s["pid"]) for s in results.servers] == [
        ("none", off.url, pids[0]), ("prefix-cache", off.url, pids[0]), ("cpu-tier", tier.url, pids[1])]
    rows = {r["trial_id"]: r for r in res.rows}
    assert all(r["status"] == "ok" for r in rows.values()), rows
    assert rows["d0-q2-cpu-tier-r0"]["cached_prompt_tokens"] >= 300
    costs = reuse_cost(results.trials, Prices(2.0), servers=results.servers)
    tier_row = costs[costs["saving_kind"] == "tier"].iloc[0]
    assert (tier_row["mode_label"], tier_row["baseline"]) == ("cpu-tier", "prefix-cache")
    assert tier_row["saving_verdict"] == ("not measured: the tier's own counters were not read (no per-request tier "
                                          "hits, no tier counter in /metrics), so whether it served anything is "
                                          "unknown")


def test_a_q8_0_kv_cache_gets_quality_columns_from_the_servers_top_logprobs(tmp_path):
    """kv-q8_0 is lossy by design: its replies are measured against none's (agreement, a KL lower bound from the
    top-1,000 log-probabilities) and none's requests ask for them too; prefix-cache (lossless reuse) gets its own
    KL as the floor; the server starts with the cache types."""
    data = {"name": "q8", "model": "smollm2-135m", "engine": {"kind": "llama.cpp"},
            "workload": {"source": "sharegpt", "seed": 0, "n_prompts": 2}, "prompt_tokens": [200],
            "max_new_tokens": 12, "repeats": 1, "warmup": 0, "seed": 0,
            "modes": [{"name": "none"}, {"name": "kv-q8_0"}, {"name": "prefix-cache"}]}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    res = kvbench.run_scenario(tmp_path / "s.yaml", out=tmp_path / "res")
    rows = {r["trial_id"]: r for r in res.rows}
    assert len(rows) == 6 and all(r["status"] == "ok" for r in rows.values()), rows
    method = "lower bound from the top-1,000 log-probabilities (n_probs), steps up to the first differing id"
    for r in rows.values():
        if r["mode"] == "none":
            assert r.get("kl_mean") is None and r.get("floor_kl_mean") is None and r["tokens_match"] is True
        elif r["mode"] == "prefix-cache":
            assert r.get("kl_mean") is None and 0 <= r["floor_kl_mean"] <= r["floor_kl_max"] < 1.0
            assert r["kl_method"] == method
        else:
            assert 0 <= r["kl_mean"] <= r["kl_max"] < 1.0 and 0 <= r["token_agreement"] <= 1
            assert r["kl_method"] == method and r.get("floor_kl_mean") is None
    servers = kvbench.load_results(res.run_dir).runs[0]["servers"]
    argv = servers[1]["argv"]
    assert argv[argv.index("--cache-type-k") + 1] == argv[argv.index("--cache-type-v") + 1] == "q8_0"
    assert "--cache-type-k" not in servers[0]["argv"]
