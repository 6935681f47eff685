"""kvbench plan: capacity and the roofline, against hand-computed values (the architecture's KV bytes, windows and
parameter counts: test_architecture.py)."""

from __future__ import annotations

import json

import pytest
from transformers import AutoConfig
from typer.testing import CliRunner

from kvbench.cli import app
from kvbench.analysis.plan import plan_modes
from kvbench.models import preset_path
from kvbench.offload.architecture import architecture_of


def arch(name: str):
    return architecture_of(AutoConfig.from_pretrained(preset_path(name)))


def test_capacity_and_roofline_by_hand():
    a = arch("llama-3.1-8b")
    gib = 2**30
    modes = {m.mode: m for m in plan_modes(a, tokens=32768, batch=8, dtype_bytes=2, gpu_bytes=80 * gib,
                                           host_bytes=64 * gib, link_bytes_per_s=50e9, hbm_bytes_per_s=2000e9,
                                           window=512)}
    weights = 8_030_261_248 * 2
    room = 80 * gib * 0.9 - weights
    seq = 32768 * 131_072  # 4 GiB
    layer = seq // 32
    none, full, hier = modes["none"], modes["full"], modes["hierarchical(window=512)"]
    assert (none.device_bytes_per_seq, none.host_bytes_per_seq, none.max_batch) == (seq, 0, int(room // seq))
    assert (full.device_bytes_per_seq, full.host_bytes_per_seq) == (2 * layer, seq)
    assert full.max_batch == min(int(room // (2 * layer)), 64 * gib // seq) == 16  # host-bound: 64 GiB / 4 GiB
    assert hier.device_bytes_per_seq == 32 * 512 * 4096 + 2 * (32768 - 512) * 4096
    # 3 passes over the KV a step: the cache's torch.cat reads the history and writes it, attention reads it
    assert none.memory_s == pytest.approx((weights + 3 * 8 * seq) / 2000e9)
    assert full.link_bytes_per_step == 8 * seq and full.link_s == pytest.approx(8 * seq / 50e9)
    assert full.step_s == full.link_s and full.bound == "link" and none.bound == "device memory"
    assert full.tokens_per_s == pytest.approx(8 / full.step_s)
    # the link bounds full from the batch where b × seq / L > (weights + b × seq) / M
    b = full.link_bound_batch
    assert b * seq / 50e9 == pytest.approx((weights + 3 * b * seq) / 2000e9)


def test_plan_command_output_and_errors(tmp_path):
    cli = CliRunner()
    r = cli.invoke(app, ["plan", "llama-2-70b", "--prompt-tokens", "4096", "--dtype", "fp16"])
    assert r.exit_code == 0, r.output
    assert "KV: 327,680 bytes per token at 4,096 tokens" in r.output and "1.25 GiB per sequence" in r.output
    r = cli.invoke(app, ["plan", "lama-3.1-8b"])
    assert r.exit_code == 2 and "unknown model 'lama-3.1-8b': did you mean llama-3.1-8b" in r.output
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    r = cli.invoke(app, ["plan", str(tmp_path)])
    assert r.exit_code == 2 and "the config has no" in r.output
    for field, value, msg in (("num_hidden_layers", "32", "num_hidden_layers = '32': must be whole numbers above 0"),
                              ("num_attention_heads", 0, "num_attention_heads = 0: must be whole numbers above 0"),
                              ("sliding_window", -5, "sliding_window = -5: must be whole numbers above 0")):
        cfg = json.loads(preset_path("llama-3.1-8b").read_text()) | {field: value}
        bad.write_text(json.dumps(cfg))
        r = cli.invoke(app, ["plan", str(bad)])
        assert r.exit_code == 2 and msg in r.output, r.output
    for field, value in (("num_hidden_layers", 10**30), ("vocab_size", 2**26 + 1), ("head_dim", 10**6)):
        cfg = json.loads(preset_path("llama-3.1-8b").read_text()) | {field: value}
        bad.write_text(json.dumps(cfg))
        r = cli.invoke(app, ["plan", str(bad)])
        limit = {"num_hidden_layers": "100,000", "vocab_size": "67,108,864", "head_dim": "65,536"}[field]
        assert r.exit_code == 2 and f"{bad}: {field} = {value:,} is above {limit}: plan takes sizes up to " \
            "these" in r.output, r.output
    for args, msg in ((["--prompt-tokens", str(10**23)], "context tokens must be a finite number above 0 and at "
                       "most 4,294,967,296, not 100,000,000,000,000,000,000,000"),
                      (["--batch", str(2**40)], "batch must be a finite number above 0 and at most 16,777,216"),
                      (["--hbm-gbps", "1e300"], "HBM bandwidth (bytes/s) must be a finite number above 0 and at "
                       "most 1,000,000,000,000,000"),
                      (["--gpu-mem", "1000000EiB"], "GPU memory (bytes) must be a finite number above 0 and at "
                       "most 1,152,921,504,606,846,976")):
        r = cli.invoke(app, ["plan", "llama-3.1-8b", *args])
        assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output, (args, r.output)
    bad.write_text(json.dumps(json.loads(preset_path("llama-3.1-8b").read_text()) | {"model_type": "foo"}))
    r = cli.invoke(app, ["plan", str(bad)])
    assert r.exit_code == 2 and f"{bad}: transformers cannot read this config: " in r.output
    r = cli.invoke(app, ["plan", "llama-2-70b", "--dtype", "fp16"])
    assert r.exit_code == 0 and "the weights (128.48 GiB) do not fit in 72.00 GiB of the GPU" in r.output
    r = cli.invoke(app, ["plan", "llama-3.1-8b", "--gpu-price", "0"])
    assert r.exit_code == 2 and "the price must be more than 0 and at most 1,000,000 USD per hour, not 0" in r.output
    r = cli.invoke(app, ["plan", "llama-3.1-8b", "--gpu-price", "1e308"])
    assert r.exit_code == 2 and "at most 1,000,000 USD per hour, not 1e+308" in r.output
    r = cli.invoke(app, ["plan", "llama-3.1-8b", "--gpu-mem", "lots"])
    assert r.exit_code == 2 and "--gpu-mem 'lots': give bytes or a size such as 80GiB" in r.output


def test_link_default_comes_from_the_last_env_probe(tmp_path, monkeypatch):
    from kvbench.bench.telemetry.machine import LAST_PROBE, last_link_probe, save_link_probe

    monkeypatch.setenv("KVBENCH_CACHE_DIR", str(tmp_path / "cache"))
    cli = CliRunner()
    r = cli.invoke(app, ["plan", "llama-3.1-8b"])
    assert "link 50 GB/s (default; measure it with kvbench env on a GPU)" in r.output
    assert save_link_probe({"link_bandwidth": None}) is None and last_link_probe() is None
    env = {"measured_at": "2026-11-30T04:00:00Z", "gpus": [{"name": "NVIDIA H200"}],
           "link_bandwidth": {"h2d_pinned_gbps": 52.5, "d2h_pinned_gbps": 50.1}}
    assert save_link_probe(env) == tmp_path / "cache" / LAST_PROBE
    assert last_link_probe() == (52.5, "measured by kvbench env 2026-11-30T04:00:00Z on NVIDIA H200")
    r = cli.invoke(app, ["plan", "llama-3.1-8b"])
    assert "link 52.5 GB/s (measured by kvbench env 2026-11-30T04:00:00Z on NVIDIA H200)" in r.output
    r = cli.invoke(app, ["plan", "llama-3.1-8b", "--link-gbps", "25", "--prompt-tokens", "32768", "--batch", "8",
                         "--host-mem", "20GiB"])
    assert "link 25 GB/s (--link-gbps)" in r.output
    assert ("warning: batch 8 does not fit every mode (max batch: full (5), hierarchical(window=512) (5)); the decode "
            "step above is for batch 8 anyway") in r.output
    (tmp_path / "cache" / LAST_PROBE).write_text("{not json")
    with pytest.warns(UserWarning, match="ignored .*run kvbench env on a GPU"):
        assert last_link_probe() is None
    save_link_probe({"link_bandwidth": {"h2d_pinned_gbps": True}})
    with pytest.warns(UserWarning, match="h2d_pinned_gbps is True, not a number of GB/s above 0"):
        assert last_link_probe() is None
    save_link_probe({"link_bandwidth": {"h2d_pinned_gbps": 25}})
    assert last_link_probe() == (25.0, "measured by kvbench env on a GPU")


def test_mean_decode_step_compares_like_with_like():
    """A measured TPOT averages the decode steps of a growing context: the roofline is averaged the same way; on
    CUDA copies overlap (max), on a CPU there is no link and nothing overlaps."""
    from kvbench.analysis.plan import mean_decode_step, step_time

    a = arch("llama-3.1-8b")
    layer = 2 * 8 * 128 * 2  # bytes per token and layer (bf16)
    w = 16e9
    step, link = mean_decode_step(a, "full", 1000, 5, 2, w, 2, 2000e9, 50e9)
    # steps 1..4: attention over 1001..1004 tokens, history copied 1000..1003 tokens, batch 2
    expected = [max((w + 3 * 2 * 32 * layer * (1000 + k)) / 2000e9, 2 * 32 * layer * (999 + k) / 50e9)
                for k in range(1, 5)]
    assert step == pytest.approx(sum(expected) / 4) and link == 2 * 32 * layer * 1001.5
    cpu, _ = mean_decode_step(a, "full", 1000, 5, 2, w, 2, 2000e9, None)
    none, _ = mean_decode_step(a, "none", 1000, 5, 2, w, 2, 2000e9, None)
    assert cpu == none  # on a CPU the host tier is the device's memory: offload costs no link time in the plan
    assert step_time(1.0, 2.0) == 2.0 and step_time(1.0, 2.0, overlapped=False) == 3.0
    import math

    assert all(math.isnan(v) for v in mean_decode_step(a, "full", 1000, 1, 2, w, 2, 2000e9, 50e9))  # no decode step


def test_plan_never_runs_or_offers_to_run_a_models_own_code(tmp_path):
    """From the re-attack: `plan DIR` on a config whose auto_map names the directory's own code made transformers
    ask on the terminal whether to run it (and with `y` it imported it). Plan refuses an architecture transformers
    does not ship, naming the code; a shipped one with an auto_map is read without it."""
    marker = tmp_path / "CANARY"
    (tmp_path / "pkg_cfg.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    config = {"model_type": "evilarch", "auto_map": {"AutoConfig": "pkg_cfg.EvilConfig"}, "hidden_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
              "max_position_embeddings": 128, "intermediate_size": 128}
    (tmp_path / "config.json").write_text(json.dumps(config))
    r = CliRunner().invoke(app, ["plan", str(tmp_path)], input="y\n")
    assert r.exit_code == 2, r.output
    assert "the config's auto_map names the model's own code (pkg_cfg.py) (model_type 'evilarch'); plan never " \
           "runs model code" in " ".join(r.output.split())
    assert "[y/N]" not in r.output and not marker.exists()
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    r = CliRunner().invoke(app, ["plan", str(tmp_path)], input="y\n")
    assert r.exit_code == 0, r.output
    assert "2 layers" in r.output and "[y/N]" not in r.output and not marker.exists()
    (tmp_path / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    r = CliRunner().invoke(app, ["plan", str(tmp_path)])
    assert r.exit_code == 2 and "not valid JSON (nested more than 100 levels deep)" in r.output, r.output
