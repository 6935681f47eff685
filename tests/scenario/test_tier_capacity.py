"""A tier scenario whose working set fits the device cache is warned about, with the token arithmetic; a tier mode
without its prefix-cache baseline is refused; the shipped GPU tier scenarios force their tier."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kvbench.errors import ScenarioError
from kvbench.scenario.checks import scenario_warnings
from kvbench.scenario.load import load_scenario
from kvbench.scenario.tier_capacity import tier_capacity_warnings, working_set
from kvbench.models import read_architecture

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
PRESETS = Path(__file__).resolve().parents[2] / "kvbench" / "models" / "presets"


def vllm_gpu(args: list[str], conversations: int = 8, modes: list | None = None) -> dict:
    return {"name": "t", "model": "smollm2-135m", "device": "cuda",
            "engine": {"kind": "vllm", "args": args},
            "workload": {"source": "sharegpt", "multi_turn": {"conversations": conversations, "turns": 3,
                                                              "min_prompt_tokens": 1024,
                                                              "max_prompt_tokens": 2048}},
            "max_new_tokens": 8,
            "modes": modes or [{"name": "none"}, {"name": "prefix-cache"}, {"name": "cpu-offload", "size": 4}]}


def tier_warnings(write_yaml, data: dict) -> list[tuple[str, str]]:
    s = load_scenario(write_yaml(data))
    return tier_capacity_warnings(s, read_architecture(s.model))


def test_a_vllm_gpu_scenario_whose_working_set_fits_the_gpu_cache_is_warned_with_the_arithmetic(write_yaml):
    got = tier_warnings(write_yaml, vllm_gpu(["--kv-cache-memory-bytes", str(2**30)]))
    # 1 GiB ÷ (2 × 30 layers × 3 kv heads × 64 × 2 B = 23,040 B per token in bf16) = 46,603 tokens; 8 × 2,048 fit
    assert got == [("modes[2]", "cpu-offload: the working set (8 conversations, 8,192–16,384 tokens) fits the "
                                "device cache (46,603 tokens: 1.00 GiB (--kv-cache-memory-bytes) ÷ 23,040 B per "
                                "token; 2.8 times the working set at most): the server never evicts, so its host tier is never read; make "
                                "the device cache smaller than the working set (--num-gpu-blocks-override or "
                                "--kv-cache-memory-bytes) or the working set larger")]
    blocks = tier_warnings(write_yaml, vllm_gpu(["--num-gpu-blocks-override", "2048"]))
    assert blocks[0][1].startswith("cpu-offload: the working set (8 conversations, 8,192–16,384 tokens) fits the "
                                   "device cache (32,768 tokens: 2,048 blocks (--num-gpu-blocks-override) × 16 tokens;")


def test_the_gpu_memory_arithmetic_is_said_where_only_the_utilization_is_given(write_yaml):
    got = tier_warnings(write_yaml, vllm_gpu(["--gpu-memory-utilization", "0.5"]))
    assert "at most 0.5 (--gpu-memory-utilization) × an 80 GiB GPU (an H100; no GPU answers here)" in got[0][1]


def test_a_working_set_larger_than_the_device_cache_gets_no_warning(write_yaml):
    assert tier_warnings(write_yaml, vllm_gpu(["--num-gpu-blocks-override", "256"], conversations=16)) == []


def test_llama_cpp_warns_where_the_documents_fit_the_slots(write_yaml):
    data = {"name": "t", "model": "smollm2-135m", "engine": {"kind": "llama.cpp"},
            "workload": {"source": "sharegpt", "doc_qa": {"documents": 4, "questions": 2, "doc_tokens": 256}},
            "max_new_tokens": 8, "load": {"profile": "concurrent", "concurrency": [1, 4]},
            "modes": [{"name": "none"}, {"name": "prefix-cache"}, {"name": "host-cache"}]}
    assert tier_warnings(write_yaml, data) == [
        ("modes[2]", "host-cache: the working set (4 documents, 1,024–2,048 tokens) fits 4 slots (one conversation "
                     "or document each, at concurrency 4): there its host tier is never read; use more documents "
                     "than slots (load.concurrency)")]
    data["load"]["concurrency"] = [1, 3]
    assert tier_warnings(write_yaml, data) == []
    s = load_scenario(write_yaml(data))
    assert working_set(s) == (4, 1024, 2048, "documents")


def test_a_tier_mode_without_its_prefix_cache_baseline_is_refused(write_yaml):
    with pytest.raises(ScenarioError) as exc:
        load_scenario(write_yaml(vllm_gpu([], modes=[{"name": "none"}, {"name": "cpu-offload"}])))
    assert str(exc.value).endswith(
        "modes[1]: cpu-offload adds a host tier on top of vllm's prefix cache; whether that tier pays is its saving "
        "against the same server with the tier off, so add {name: prefix-cache} to modes (its tier saving's "
        "baseline; `none` is the baseline of the reuse saving)")
    sg = {**vllm_gpu([]), "engine": {"kind": "sglang"}, "modes": [{"name": "none"}, {"name": "hicache"}]}
    with pytest.raises(ScenarioError, match=r"add \{name: radix\} to modes"):
        load_scenario(write_yaml(sg))


@pytest.mark.parametrize("name", ["vllm_offload.yaml", "sglang_hicache.yaml", "server_doc_qa.yaml",
                                  "server_multi_turn.yaml"])
def test_the_shipped_tier_scenarios_force_their_tier(name):
    s = load_scenario(SCENARIOS / name)
    assert [w for w in scenario_warnings(s) if "tier is never read" in w[1]] == []
    units, least, most, _ = working_set(s)
    assert units >= 5  # a verdict needs 5 independent units


def test_a_real_model_directory_subtracts_its_weights_and_tensor_parallelism_splits_them(write_yaml, tmp_path):
    """A Hugging Face model directory (here Llama-3.1-8B's config alone): the weights (8,030,261,248 parameters in
    bf16, 14.96 GiB) come off the GPU's memory; with --tensor-parallel-size 8 each GPU holds 1/8 of them and one
    of the 8 KV heads (16,384 B per token)."""
    model = tmp_path / "llama-3.1-8b"
    model.mkdir()
    shutil.copy(PRESETS / "llama-3.1-8b.json", model / "config.json")
    data = {**vllm_gpu(["--gpu-memory-utilization", "0.9"]), "model": str(model)}
    [(path, text)] = tier_warnings(write_yaml, data)
    # 0.9 × 80 GiB − 14.96 GiB = 57.04 GiB ÷ 131,072 B per token = 467,291.9 tokens
    assert path == "modes[2]" and ("fits the device cache (467,292 tokens: at most 0.9 (--gpu-memory-utilization) × "
                                   "an 80 GiB GPU (an H100; no GPU answers here) − 15.0 GiB of weights = 57.0 GiB ÷ "
                                   "131,072 B of KV per token;") in text
    data["engine"]["args"] += ["--tensor-parallel-size", "8"]
    [(_, text)] = tier_warnings(write_yaml, data)
    # per GPU: 72 GiB − 1.87 GiB = 70.13 GiB ÷ 16,384 B = 4,596,059.9 tokens
    assert ("fits the device cache (4,596,060 tokens: at most 0.9 (--gpu-memory-utilization) × an 80 GiB GPU (an "
            "H100; no GPU answers here) − 1.9 GiB of weights = 70.1 GiB ÷ 16,384 B of KV per token; per GPU of 8 "
            "(--tensor-parallel-size 8: weights and KV heads split);") in text


def test_validate_says_which_levels_cannot_reach_a_verdict_and_that_running_servers_begin_warm(write_yaml):
    from kvbench.scenario.server_verdicts import server_verdict_warnings

    data = {**vllm_gpu(["--num-gpu-blocks-override", "64"], conversations=16), "load": {
        "profile": "concurrent", "concurrency": [1, 4]}, "repeats": 3}
    assert server_verdict_warnings(load_scenario(write_yaml(data))) == [
        ("repeats", "3: at concurrency 4 requests overlap, so a repeat's whole load is one independent unit and a "
                    "verdict needs 5: those levels will be inconclusive (repeats: 5, or 5 runs given to `kvbench cost` "
                    "together)")]
    assert server_verdict_warnings(load_scenario(write_yaml({**data, "repeats": 5}))) == []
    openai = {**data, "engine": {"kind": "openai", "url": "http://127.0.0.1:8000"}, "repeats": 5,
              "modes": [{"name": "prefix-cache"}, {"name": "tier-on", "preset": "tier",
                                                   "url": "http://127.0.0.1:8001"}]}
    assert server_verdict_warnings(load_scenario(write_yaml(openai))) == [
        ("engine.cold", "kvbench starts nothing for kind openai: of each mode's 10 repeats and levels on a running "
                        "server only the first can begin cold, and the others get no verdict (a warm start); "
                        "restart the servers before each run with repeats: 1 and one level, and give all the runs "
                        "to `kvbench cost` together, or set cold: reset with the engine's reset_path")]
    once = {**openai, "repeats": 1, "load": {"profile": "concurrent", "concurrency": 4}}
    assert server_verdict_warnings(load_scenario(write_yaml(once))) == [
        ("repeats", "1: at concurrency 4 requests overlap, so a repeat's whole load is one independent unit and a "
                    "verdict needs 5: those levels will be inconclusive (repeats: 5, or 5 runs given to `kvbench cost` "
                    "together)")]


@pytest.mark.parametrize("args, tokens", [
    (["--kv-cache-memory-bytes", "1G"], 2**30 / 23_040),            # vLLM's human-readable sizes: G is 2^30
    (["--kv-cache-memory-bytes", "1g"], 1e9 / 23_040),              # and g is 10^9
    (["--kv-cache-memory-bytes", "1G", "--kv-cache-dtype", "fp8"], 2**30 / 11_520),
    (["--kv-cache-memory-bytes", "1G", "--dtype", "float32"], 2**30 / 46_080),
    (["--num-gpu-blocks-override", "64", "--block-size", "32"], 2_048),
    (["--num-gpu-blocks-override", "nan"], None), (["--num-gpu-blocks-override", "inf"], None),
    (["--num-gpu-blocks-override", "-5"], None), (["--num-gpu-blocks-override", "64", "--block-size", "0"], None),
    (["--kv-cache-memory-bytes", "0"], None), (["--kv-cache-memory-bytes", "1.5G"], None),
    (["--gpu-memory-utilization", "1.5"], None), (["--gpu-memory-utilization", "-0.5"], None),
])
def test_the_device_cache_is_read_as_vllm_reads_its_flags_and_never_from_nonsense(write_yaml, args, tokens):
    from kvbench.scenario.tier_capacity import device_tokens

    s = load_scenario(write_yaml(vllm_gpu(args)))
    got = device_tokens(s, s.modes[2], read_architecture(s.model))
    assert (got if got is None else got[0]) == (tokens if tokens is None else pytest.approx(tokens))


def test_a_tier_saving_that_would_not_be_the_tier_s_is_warned_about(write_yaml):
    from kvbench.scenario.server_verdicts import server_verdict_warnings

    llama = {"name": "t", "model": "smollm2-135m", "engine": {"kind": "llama.cpp"},
             "workload": {"source": "sharegpt", "doc_qa": {"documents": 6, "questions": 2, "doc_tokens": 256}},
             "max_new_tokens": 8, "repeats": 5,
             "modes": [{"name": "none"}, {"name": "prefix-cache", "request": {"cache_prompt": False}},
                       {"name": "host-cache", "args": ["--cache-ram", "0"]},
                       {"name": "pc2", "preset": "prefix-cache", "args": ["--cache-ram", "512"]}]}
    assert server_verdict_warnings(load_scenario(write_yaml(llama))) == [
        ("modes[1]", "prefix-cache is the tier saving's baseline (prefix caching, tier off) but turns prefix caching "
                     "off (cache_prompt: false): a tier saving against it is a reuse saving"),
        ("modes[2]", "host-cache is a host tier mode whose flags turn its tier off (--cache-ram 0: no host tier): its "
                     "tier saving would be prefix caching against itself")]
    llama["modes"][1] = {"name": "prefix-cache", "args": ["--cache-ram", "512"]}
    assert server_verdict_warnings(load_scenario(write_yaml(llama)))[0] == (
        "modes[1]", "prefix-cache is the tier saving's baseline (prefix caching, tier off) but has a host tier of its "
                    "own (--cache-ram 512 MiB): a tier saving against it is not one against prefix caching alone")
    # vLLM reads the last of --enable-prefix-caching / --no-enable-prefix-caching: the preset's comes after the
    # engine's flags, a mode's after the preset's
    on = vllm_gpu(["--no-enable-prefix-caching", "--num-gpu-blocks-override", "64"], conversations=16)
    assert server_verdict_warnings(load_scenario(write_yaml({**on, "repeats": 5}))) == []
    on["modes"][1] = {"name": "prefix-cache", "args": ["--no-enable-prefix-caching"]}
    assert [w[0] for w in server_verdict_warnings(load_scenario(write_yaml({**on, "repeats": 5})))] == ["modes[1]"]
    same = {**on, "repeats": 1, "engine": {"kind": "openai", "url": "http://127.0.0.1:8000"},
            "modes": [{"name": "prefix-cache"}, {"name": "t", "preset": "tier", "url": "http://127.0.0.1:8000/"}]}
    assert server_verdict_warnings(load_scenario(write_yaml(same))) == [
        ("modes[1].url", "http://127.0.0.1:8000 is engine.url: the tier mode would measure the same server as its "
                         "baseline; give the deployment with the tier on")]


def test_a_device_cache_flag_the_server_would_refuse_is_named(write_yaml):
    got = tier_warnings(write_yaml, vllm_gpu(["--num-gpu-blocks-override", "nan"]))
    assert got == [("modes[2]", "cpu-offload: --num-gpu-blocks-override nan: not a count above 0: the server would "
                                "refuse it, and the device cache cannot be sized against the working set")]
    got = tier_warnings(write_yaml, vllm_gpu(["--kv-cache-memory-bytes", "1.5G"]))
    assert got[0][1].startswith("cpu-offload: --kv-cache-memory-bytes 1.5G: not a size above 0 as vLLM reads it")
