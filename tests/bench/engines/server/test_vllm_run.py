"""The server engine on the real vLLM: PyPI's CPU build in .venv/vllm (`make vllm`), serving SmolLM2 exported from
its GGUF. One run for the module (2 conversations × 2 turns, none against prefix-cache, a warm-up, about 2
minutes), checked for cold starts (each fresh server's first request), no development or LoRA endpoint another
process could use, block-granular reuse, the /metrics deltas, outputs equal to none's, and no vLLM process left; and
presets vLLM's CPU build cannot run refused before any server starts."""

from __future__ import annotations

import os

import httpx
import psutil
import pytest
import yaml

import kvbench
from kvbench.bench.run import RunProgress
from conftest import llama_multi_turn
from kvbench.errors import ScenarioError
from kvbench.scenario.programs import own_python
from kvbench.serving.vllm import CPU_OFFLOAD_REFUSED

PYTHON = own_python("vllm")

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(PYTHON is None, reason="vLLM's CPU build is not installed in .venv/vllm: `make vllm` "
                                              "installs it (about 3 minutes)"),
]


def vllm_processes(before: set[int]) -> list[str]:
    """Live processes started since ``before`` (a set of pids) whose name or command line is vLLM's (its API
    server, its engine core ``VLLM::EngineCore``, its workers)."""
    out = []
    for p in psutil.process_iter(["pid", "name", "cmdline", "status"]):
        words = " ".join([p.info["name"] or "", *(p.info["cmdline"] or [])])
        if p.info["pid"] not in before and p.info["status"] != psutil.STATUS_ZOMBIE and "vllm" in words.lower():
            out.append(f"{p.info['pid']}: {words[:120]}")
    return out


def vllm_scenario(**over) -> dict:
    return llama_multi_turn(name="real_vllm", engine={"kind": "vllm"}, warmup=1, **over)


#: Endpoints that vLLM opens with VLLM_SERVER_DEV_MODE=1 (a process POSTing ``save_sharded_state`` to
#: /collective_rpc has had the server overwrite a file of its choice) and with VLLM_ALLOW_RUNTIME_LORA_UPDATING.
CLOSED_ENDPOINTS = ("/collective_rpc", "/reset_prefix_cache", "/sleep", "/wake_up", "/v1/load_lora_adapter")


class KnockOnce(RunProgress):
    """After the first measured request, POST to each of :data:`CLOSED_ENDPOINTS` of the vLLM server kvbench
    started (its ``--port``, a child of this process), as another process of the machine would."""

    def __init__(self):
        self.answers: dict[str, int] = {}

    def trial_done(self, row):
        if self.answers:
            return
        argvs = [k.cmdline() for k in psutil.Process(os.getpid()).children()]
        ports = {a[a.index("--port") + 1] for a in argvs if "vllm.entrypoints.openai.api_server" in a}
        for port in ports:
            for path in CLOSED_ENDPOINTS:
                r = httpx.post(f"http://127.0.0.1:{port}{path}", json={"method": "save_sharded_state"}, timeout=30)
                self.answers[f"{port}{path}"] = r.status_code


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The module's one run on the real vLLM, the status codes its endpoints answered another process, and the
    vLLM processes left after it."""
    tmp = tmp_path_factory.mktemp("vllm")
    (tmp / "s.yaml").write_text(yaml.safe_dump(vllm_scenario()))
    before = {p.pid for p in psutil.process_iter()}
    knock = KnockOnce()
    res = kvbench.run_scenario(tmp / "s.yaml", out=tmp / "res", progress=knock)
    return res, kvbench.load_results(res.run_dir).runs[0]["servers"], vllm_processes(before), knock.answers


def test_every_request_ran_and_nothing_of_vllm_is_left(run):
    res, servers, left, _ = run
    rows = res.rows
    assert len(rows) == 8 and all(r["status"] == "ok" for r in rows), [r.get("message") for r in rows]
    assert left == []
    for r in rows:
        assert r["n_output_tokens"] == 4 and r["engine"] == "vllm"
        assert r["server_prompt_tokens"] == r["prompt_tokens"]
    assert [s["mode_label"] for s in servers] == ["none", "prefix-cache"]
    for s in servers:
        assert s["argv"][:4] == [str(PYTHON), "-I", "-m", "vllm.entrypoints.openai.api_server"]
        assert s["argv"][s["argv"].index("--host") + 1] == "127.0.0.1" and s["version"] == "0.32.0"
        assert s["environment"]["VLLM_HOST_IP"] == s["environment"]["VLLM_LOOPBACK_IP"] == "127.0.0.1"
        assert s["environment"]["VLLM_NO_USAGE_STATS"] == "1" and s["environment"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
        assert s["environment"]["HF_HUB_OFFLINE"] == "1"  # the exported model is on this machine
        assert s["environment"]["VLLM_SERVER_DEV_MODE"] == s["environment"]["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "0"


def test_no_endpoint_another_process_could_use_to_write_files_or_run_code_is_open(run):
    answers = run[3]
    assert len(answers) == len(CLOSED_ENDPOINTS), answers  # one server listening, every endpoint asked
    assert set(answers.values()) == {404}, answers


def test_every_fresh_server_is_verified_cold_by_its_first_request_without_any_reset(run):
    res, servers, _, _ = run
    assert all("cold_probe" not in s and "reset" not in s for s in servers)  # no reset endpoint is called
    first = [r for r in res.rows if r["request_id"] == "c0-t1"]  # the prompt none's server already processed
    assert [r["cold_verified"] for r in first] == [True, True]
    assert [r["cached_prompt_tokens"] for r in first] == [0, 0]
    none = [r for r in res.rows if r["mode"] == "none"]
    assert len(none) == 4 and all(r["cached_prompt_tokens"] == 0 and r["contaminated"] is False for r in none)


def test_prefix_cache_reuses_the_history_in_whole_blocks_and_outputs_equal_none(run):
    res, servers, _, _ = run
    block = servers[1]["cache_block_tokens"]
    assert block == 128 == servers[0]["cache_block_tokens"]
    prefix = [r for r in res.rows if r["mode"] == "prefix-cache"]
    turn2 = [r for r in prefix if r["turn_index"] == 2]
    assert len(turn2) == 2
    for r in turn2:  # the history (the previous turn's prompt and reply, held) in whole blocks, the last block's
        assert r["reusable_prompt_tokens"] > 2 * block  # tail recomputed
        assert r["cached_prompt_tokens"] % block == 0
        assert r["reusable_prompt_tokens"] - block < r["cached_prompt_tokens"] <= r["reusable_prompt_tokens"], r
    assert all(r["cached_prompt_tokens"] == 0 for r in prefix if r["turn_index"] == 1)
    assert all(r["tokens_match"] is True for r in prefix)  # greedy outputs equal none's, reuse or not


def test_the_metrics_deltas_are_the_measured_requests_own(run):
    res, servers, _, _ = run
    prefix = [r for r in res.rows if r["mode"] == "prefix-cache"]
    none_delta, delta = servers[0]["metrics_delta"], servers[1]["metrics_delta"]
    assert none_delta["prefix_cache_queries"] == 0 and none_delta["prompt_tokens_cached"] == 0
    assert servers[1]["metrics_holds"] == {"sent": 2, "separated": 2}
    assert delta["prompt_tokens_cached"] == delta["prefix_cache_hits"] == sum(r["cached_prompt_tokens"]
                                                                              for r in prefix)
    assert delta["prompt_tokens"] == delta["prefix_cache_queries"] == sum(r["prompt_tokens"] for r in prefix)
    assert delta["generation_tokens"] == 4 * 4 and delta["prompt_tokens_cached_host"] == 0


@pytest.mark.parametrize("preset", ["cpu-offload", "lmcache"])
def test_a_gpu_preset_is_refused_on_a_cpu_before_any_server_starts(tmp_path, preset):
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(vllm_scenario(modes=[{"name": "none"}, {"name": "prefix-cache"},
                                                                         {"name": preset}])))
    before = {p.pid for p in psutil.process_iter()}
    with pytest.raises(ScenarioError) as e:
        kvbench.run_scenario(tmp_path / "s.yaml", out=tmp_path / "res")
    assert f"modes[2]: preset {preset} of vllm cannot run on a CPU" in str(e.value)
    assert CPU_OFFLOAD_REFUSED in str(e.value) and "run it on a GPU machine (device: cuda)" in str(e.value)
    assert not list(tmp_path.glob("res/*/servers")) and vllm_processes(before) == []


def test_the_report_names_the_cold_starts_and_the_block_size(run, tmp_path):
    from typer.testing import CliRunner

    from kvbench.cli import app

    res, _, _, _ = run
    r = CliRunner().invoke(app, ["report", str(res.run_dir), "--out", str(tmp_path / "report")])
    text = " ".join(r.output.split())
    assert r.exit_code == 0, r.output
    assert "cache resets" not in text
    assert "cached prompt tokens come in whole KV blocks of 128 tokens" in text
    assert "cold starts: 2 of 2 mode starts answered their first request with 0 cached tokens" in text
