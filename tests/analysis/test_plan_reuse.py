"""kvbench plan's reuse tier, its machine (GPU presets, tensor parallelism, host memory) and the command on MoE and
MLA configs, against hand-computed values."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kvbench
from kvbench.analysis.plan_break_even import Constants
from kvbench.analysis.plan_reuse import break_even_share, reuse_table, ttft_recompute, ttft_restore
from kvbench.cli import app

DATA = Path(__file__).parent.parent / "data" / "plan"
MIXTRAL, DEEPSEEK = str(DATA / "mixtral-8x7b" / "config.json"), str(DATA / "deepseek-v3" / "config.json")


def constants(p: float, a: float, r: float) -> Constants:
    return Constants({"prefill_s_per_token": p, "attention_s_per_token_pair": a, "restore_host_s_per_token": r}, {})


def test_restore_against_recompute_by_hand():
    c = constants(1e-5, 1e-9, 2e-6)
    assert ttft_recompute(c, 4000) == pytest.approx(1e-5 * 4000 + 1e-9 * 4000**2 / 2)
    # 3,000 restored, 1,000 prefilled attending to 3,000 + their own half
    assert ttft_restore(c, 4000, 3000) == pytest.approx(2e-6 * 3000 + 1e-5 * 1000 + 1e-9 * 1000 * (3000 + 500))
    saving = ttft_recompute(c, 4000) - ttft_restore(c, 4000, 3000)
    assert saving == pytest.approx(3000 * (1e-5 - 2e-6) + 1e-9 * 3000**2 / 2)  # k (p − r) + a k²/2
    assert break_even_share(c, 4000) == 0.0  # restoring a token is cheaper than prefilling it
    slow = constants(1e-5, 1e-9, 2e-5)  # a tier slower than prefill: pays once attention outgrows the gap
    assert break_even_share(slow, 40_000) == pytest.approx(2 * (2e-5 - 1e-5) / (1e-9 * 40_000)) == 0.5
    assert ttft_restore(slow, 40_000, 20_000) == pytest.approx(ttft_recompute(slow, 40_000))
    assert break_even_share(slow, 10_000) is None  # would need 200% of the prompt
    grid = reuse_table(slow, [10_000, 40_000])
    assert math.isnan(grid[grid.prompt_tokens == 10_000].break_even_share.iloc[0])
    assert grid[(grid.prompt_tokens == 40_000) & (grid.shared_pct == 75)].restored_tokens.iloc[0] == 30_000


def test_plan_states_mixtral_and_deepseek_sizes_with_their_formulas():
    cli = CliRunner()
    r = cli.invoke(app, ["plan", MIXTRAL])
    assert r.exit_code == 0, r.output
    assert "parameters: 46.70 B = weights 86.99 GiB; 12.88 B active per token (2 of 8 routed experts in 32 layers)" \
        in r.output
    assert "KV: 131,072 bytes per token = 2 × 32 layers × 8 kv heads × 128 head_dim × 2 bytes" in r.output
    r = cli.invoke(app, ["plan", DEEPSEEK, "--gpu", "dgx-h200", "--tp", "8", "--dtype", "fp8"])
    assert r.exit_code == 0, r.output
    assert "parameters: 671.03 B = weights 624.94 GiB; 37.55 B active per token (8 of 256 routed experts in 58 " \
        "layers)" in r.output
    assert "latent attention (kv_lora_rank 512 + qk_rope_head_dim 64)" in r.output
    assert "KV: 35,136 bytes per token = 61 layers × (512 kv_lora_rank + 64 qk_rope_head_dim) × 1 bytes" in r.output
    assert "per GPU of 8: weights 78.12 GiB, KV 35,136 bytes per token (the latent, whole on every GPU)" in r.output
    r = cli.invoke(app, ["plan", DEEPSEEK])
    assert "KV: 70,272 bytes per token" in r.output


def test_tp_8_on_h100_splits_weights_and_kv_and_prices_what_tp_1_cannot():
    one = kvbench.plan(MIXTRAL, gpu="h100", prompt_tokens=4096, batch=8)
    assert all(m.max_batch == 0 and m.batch == 0 for m in one.modes)  # 86.99 GiB of weights on one 80 GiB GPU
    eight = kvbench.plan(MIXTRAL, gpu="h100", tp=8, prompt_tokens=4096, batch=8, gpu_price=2.0)
    total, active = 46_702_792_704, 12_879_925_248
    weights = -(-total // 8) * 2
    kv_seq = 4096 * 32 * 2 * 1 * 128 * 2  # one of the 8 KV heads per GPU
    none = {m.mode: m for m in eight.modes}["none"]
    assert none.device_bytes_per_seq == kv_seq and none.max_batch == int((80 * 2**30 * 0.9 - weights) // kv_seq)
    reached = 8 * (1 - 0.75**8)  # experts a batch of 8 reaches, per layer
    read = (total - 32 * (8 - reached) * 3 * 4096 * 14336) / 8 * 2
    assert none.memory_s == pytest.approx((read + 3 * 8 * kv_seq) / 3350e9, rel=1e-6)
    assert eight.costs[0] == pytest.approx(2.0 * 8 / (8 / none.step_s * 3600) * 1e6)  # 8 GPU-hours per hour
    flops = 989e12 * 0.5
    p, a = 2 * math.ceil(active / 8) / flops, 32 * 4 * 4 * 128 / flops  # 4 of 32 heads per GPU
    row = eight.reuse[(eight.reuse.prompt_tokens == 4096) & (eight.reuse.shared_pct == 50)].iloc[0]
    assert row.recompute_s == pytest.approx(p * 4096 + a * 4096**2 / 2)
    assert row.restore_s == pytest.approx(32 * 2 * 128 * 2 / 64e9 * 2048 + p * 2048 + a * 2048 * (2048 + 1024))
    assert eight.machine.host_bytes is None


def test_host_memory_is_given_or_the_node_s_never_this_machine_s(monkeypatch):
    import psutil

    monkeypatch.setattr(psutil, "virtual_memory", lambda: pytest.fail("plan read this machine's memory"))
    p = kvbench.plan("llama-3.1-8b", prompt_tokens=32768)
    assert p.machine.host_bytes is None and {m.mode: m.host_max_batch for m in p.modes}["full"] is None
    p = kvbench.plan("llama-3.1-8b", gpu="dgx-h100", tp=2)
    assert p.machine.host_bytes == 2 * 2**40 // 4  # 4 copies of the model on the node's 8 GPUs
    r = CliRunner().invoke(app, ["plan", "llama-3.1-8b", "--prompt-tokens", "32768"])
    text = " ".join(r.output.split())
    assert "host memory for KV: not given" in text and "│ not given │" in r.output
    assert "warning: host memory not given: the offload modes' max batch counts the device alone (--host-mem" in text


@pytest.mark.parametrize("args, message", [
    (["--gpu", "h1000"], "--gpu 'h1000': did you mean h100"),
    (["--gpu", "dgx-h100", "--tp", "16"], "--tp 16: 1 to 8 GPUs (a dgx-h100 node has 8 GPUs)"),
    (["--tp", "3"], "--tp 3: the model's 32 attention heads do not split over 3 GPUs"),
    (["--tflops", "0"], "--tflops must be a finite number of TFLOP/s above 0"),
])
def test_machine_flags_are_checked(args, message):
    r = CliRunner().invoke(app, ["plan", "llama-3.1-8b", *args])
    assert r.exit_code == 2 and message in " ".join(r.output.split()), r.output


def test_a_gpu_price_is_checked_per_gpu_and_named_by_its_flag():
    from typer.testing import CliRunner

    from kvbench.cli import app

    mixtral = str(Path(__file__).parent.parent / "data" / "plan" / "mixtral-8x7b" / "config.json")
    r = CliRunner().invoke(app, ["plan", mixtral, "--tp", "8", "--gpu-price", "200000"])
    assert r.exit_code == 0, r.output  # 8 × 200,000 USD per hour is beyond one price's bound, each GPU's is not
    r = CliRunner().invoke(app, ["plan", mixtral, "--tp", "8", "--gpu-price", "-1"])
    assert r.exit_code == 2 and "--gpu-price must be more than 0 and at most 1,000,000 USD per GPU-hour, not -1" in \
        " ".join(r.output.split())
