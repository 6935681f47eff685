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
from kvbench.models.sizes import read_model_sizes
from kvbench.offload.architecture import architecture_of


def arch(name: str):
    return architecture_of(AutoConfig.from_pretrained(preset_path(name)))


def test_capacity_and_roofline_by_hand():
    a = read_model_sizes(preset_path("llama-3.1-8b"))
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
    assert none.host_max_batch is None and none.batch == 8
    assert (full.device_bytes_per_seq, full.host_bytes_per_seq) == (2 * layer, seq)
    assert full.max_batch == min(int(room // (2 * layer)), 64 * gib // seq) == 16  # host-bound: 64 GiB / 4 GiB
    assert (full.device_max_batch, full.host_max_batch) == (int(room // (2 * layer)), 16)
    assert hier.device_bytes_per_seq == 32 * 512 * 4096 + 2 * (32768 - 512) * 4096
    # 3 passes over the KV a step: the cache's torch.cat reads the history and writes it, attention reads it
    assert none.memory_s == pytest.approx((weights + 3 * 8 * seq) / 2000e9)
    assert full.link_bytes_per_step == 8 * seq and full.link_s == pytest.approx(8 * seq / 50e9)
    assert full.step_s == full.link_s and full.bound == "link" and none.bound == "device memory"
    assert full.tokens_per_s == pytest.approx(8 / full.step_s)
    # the link bounds full from the first batch where b × seq / L > (weights + 3 × b × seq) / M: here batch 1
    assert full.link_bound_batch == 1 and 1 * seq / 50e9 > (weights + 3 * seq) / 2000e9
    # at 512 tokens: b × 64 MiB / 50 GB/s > (16.06 GB + 3 × b × 64 MiB) / 2000 GB/s from b = 8,030,261,248 × 2 /
    # 2000e9 ÷ (2^26 / 50e9 − 3 × 2^26 / 2000e9) = 6.21…, so batch 7
    short = {m.mode: m for m in plan_modes(a, 512, 1, 2, 80 * gib, None, 50e9, 2000e9, 512)}
    assert short["full"].link_bound_batch == 7 and short["none"].link_bound_batch is None


def test_a_mode_is_priced_only_at_a_batch_that_fits():
    """From the issue: plan priced `none` at a batch it said did not fit (the warning came after the tables)."""
    a = read_model_sizes(preset_path("llama-3.1-8b"))
    gib = 2**30
    modes = {m.mode: m for m in plan_modes(a, 32768, 64, 2, 80 * gib, 1024 * gib, 50e9, 2000e9, 512)}
    weights = 8_030_261_248 * 2
    none = modes["none"]
    assert none.max_batch == 14 and none.batch == 14  # not 64
    assert none.memory_s == pytest.approx((weights + 3 * 14 * 2**32) / 2000e9)
    assert modes["full"].batch == 64 and modes["full"].host_max_batch == 256
    cli = CliRunner()
    r = cli.invoke(app, ["plan", "llama-3.1-8b", "--prompt-tokens", "32768", "--batch", "64", "--host-mem", "1TiB"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    warning = "warning: batch 64 does not fit every mode: priced at the most that fits: none at 14"
    assert warning in text and text.index(warning) < text.index("reuse tier") < text.index("decode step at batch 64")
    assert "│ none │ 14 │" in " ".join(r.output.replace("  ", " ").split())


def test_plan_command_output_and_errors(tmp_path):
    cli = CliRunner()
    r = cli.invoke(app, ["plan", "llama-2-70b", "--prompt-tokens", "4096", "--dtype", "fp16"])
    assert r.exit_code == 0, r.output
    assert "KV: 327,680 bytes per token = 2 × 80 layers × 8 kv heads × 128 head_dim × 2 bytes" in r.output
    assert "1.25 GiB per sequence of 4,096 tokens" in r.output
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
    bad.write_text(json.dumps(json.loads(preset_path("llama-3.1-8b").read_text()) | {"model_type": "foo\x1b[2J"}))
    r = cli.invoke(app, ["plan", str(bad)])
    assert r.exit_code == 2 and f"{bad}: transformers cannot read this config: " in r.output
    said = " ".join(r.output.split())  # all its lines, the escape shown, not acted on
    assert "model type `foo\\x1b[2J` but Transformers does not recognize this architecture. This could be" in said
    assert "\x1b" not in r.output and said.endswith("...")
    gguf = tmp_path / "m.gguf"  # from the hostile pass: a GGUF was read as a config.json ("not valid JSON")
    gguf.write_bytes(b"GGUF" + bytes(60))
    r = cli.invoke(app, ["plan", str(gguf)])
    assert r.exit_code == 2 and f"{gguf}: a GGUF model: plan reads a config.json" in " ".join(r.output.split())
    r = cli.invoke(app, ["plan", "llama-2-70b", "--dtype", "fp16"])
    assert r.exit_code == 0 and "the weights (128.48 GiB) do not fit in 72.00 GiB of the GPU" in r.output
    assert "nothing is priced" in r.output and "decode step at" not in r.output and "reuse tier" not in r.output
    r = cli.invoke(app, ["plan", "llama-3.1-8b", "--gpu-price", "0"])
    assert r.exit_code == 2 and "--gpu-price must be more than 0 and at most 1,000,000 USD per GPU-hour, not 0" in \
        r.output
    r = cli.invoke(app, ["plan", "llama-3.1-8b", "--gpu-price", "1e308"])
    assert r.exit_code == 2 and "at most 1,000,000 USD per GPU-hour, not 1e+308" in r.output
    r = cli.invoke(app, ["plan", "llama-3.1-8b", "--gpu-mem", "lots"])
    assert r.exit_code == 2 and "--gpu-mem 'lots': give bytes or a size such as 80GiB" in r.output


def test_link_default_comes_from_the_preset_or_a_probe_of_the_same_gpu(tmp_path, monkeypatch):
    """The last `kvbench env` link counts only for the GPU it measured: an H200's probe is not an A100's link."""
    from kvbench.bench.telemetry.machine import LAST_PROBE, last_link_probe, save_link_probe

    monkeypatch.setenv("KVBENCH_CACHE_DIR", str(tmp_path / "cache"))
    cli = CliRunner()
    r = cli.invoke(app, ["plan", "llama-3.1-8b"])
    assert "link 64 GB/s per direction (PCIe Gen5 x16, theoretical)" in r.output
    assert save_link_probe({"link_bandwidth": None}) is None and last_link_probe() is None
    env = {"measured_at": "2026-11-30T04:00:00Z", "gpus": [{"name": "NVIDIA H200"}],
           "link_bandwidth": {"h2d_pinned_gbps": 52.5, "d2h_pinned_gbps": 50.1}}
    assert save_link_probe(env) == tmp_path / "cache" / LAST_PROBE
    assert last_link_probe() == (52.5, "measured by kvbench env 2026-11-30T04:00:00Z on NVIDIA H200")
    r = cli.invoke(app, ["plan", "llama-3.1-8b", "--gpu", "h200"])
    assert "link 52.5 GB/s per direction (measured by kvbench env 2026-11-30T04:00:00Z on NVIDIA H200)" in r.output
    for gpu in ("a100", "gh200"):  # GH200's name holds "H200": not the same GPU
        r = cli.invoke(app, ["plan", "llama-3.1-8b", "--gpu", gpu])
        assert "is another GPU's: not used" in " ".join(r.output.split()) and "52.5" not in r.output, r.output
    r = cli.invoke(app, ["plan", "llama-3.1-8b", "--link-gbps", "25", "--prompt-tokens", "32768", "--batch", "8",
                         "--host-mem", "20GiB"])
    assert "link 25 GB/s per direction (--link-gbps)" in r.output
    assert ("warning: batch 8 does not fit every mode: priced at the most that fits: full at 5, "
            "hierarchical(window=512) at 5") in " ".join(r.output.split())
    (tmp_path / "cache" / LAST_PROBE).write_text("{not json")
    with pytest.warns(UserWarning, match="ignored .*run kvbench env on a GPU"):
        assert last_link_probe() is None


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


def test_plan_says_the_device_kv_cache_in_tokens_a_tier_must_exceed():
    from kvbench.report.plan import plan, summary_lines

    lines = summary_lines(plan("llama-3.1-8b", gpu="dgx-h100"))
    # (80 GiB × 0.9 − 8,030,261,248 × 2 B) ÷ 131,072 B = 467,291.9; the node's 256 GiB per copy ÷ 131,072 B
    assert lines[-1] == ("device KV cache: 467,292 tokens = (80.00 GiB less 10% and the weights) ÷ 131,072 bytes per "
                         "token per GPU: a host or disk tier is read only for a working set beyond it; the host "
                         "memory holds 2,097,152 tokens")
    assert summary_lines(plan("llama-3.1-8b", gpu="h100", tp=8))[-1].startswith("device KV cache: 4,596,060 tokens")
