"""A map cell's memory on a server is its own: on the fake llama-server, a ``shared_prefix`` run's rows count the
KV each cell holds (every visit's prompt whole: llama.cpp keeps whole prompt states), the KV a mode keeps for reuse
(its slots' context and its --cache-ram RAM cache), and charge each cell only its own slot files, in either order."""

from __future__ import annotations

import pytest

from kvbench.bench.engines.server.engine import CTX_MARGIN
from fake_servers import FAKE, fake_env, nothing_left_running, rows, run  # noqa: F401

pytestmark = pytest.mark.e2e

#: KV bytes of one SmolLM2 token at 4 bytes an element (30 layers × K and V × 3 kv heads × 64 × 4).
KV_BYTES_PER_TOKEN = 46_080


def _cells_run(tmp_path, lengths: list[int]) -> tuple[dict[tuple[str, int, str], dict], dict[int, int]]:
    """Rows of a run of two cells (``lengths`` tokens, 50% shared, 2 prefixes, 2 visits) by (mode, prompt length,
    the request within its cell), and per prompt length the bytes of its cell's slot files at the end."""
    tmp_path.mkdir()
    data = {"name": "cells", "model": "smollm2-135m", "engine": {"kind": "llama.cpp", "binary": str(FAKE)},
            "workload": {"source": "sharegpt", "seed": 0, "shared_prefix": {
                "prompt_tokens": lengths, "shared_pct": [50], "working_set": [2], "visits": 2}},
            "max_new_tokens": 4, "repeats": 1, "warmup": 0, "seed": 0,
            "modes": [{"name": "none"}, {"name": "prefix-cache"}, {"name": "ram", "preset": "host-cache", "size": 64},
                      {"name": "disk-slots"}]}
    with fake_env(tmp_path / "record.jsonl"):
        run_dir = run(tmp_path, data)
    slots = run_dir / "servers" / "disk-slots-r0.slots"
    files = {n: sum((slots / f"s{c}-p{j}.bin").stat().st_size for j in range(2)) for c, n in enumerate(lengths)}
    return {(r["mode_label"], r["prompt_tokens"], r["request_id"].split("-", 1)[1]): r
            for r in rows(run_dir).values()}, files


def test_a_server_cell_counts_its_whole_prompts_the_ram_cache_and_only_its_own_slot_files(tmp_path):
    """The slot files hold token ids as text, so their bytes follow the text each cell drew (which moves with the
    order): the last request of a cell is charged the bytes of its own two files, in either order."""
    ctx = 64 + 4 + CTX_MARGIN  # the longest prompt, the new tokens, the margin
    for lengths in ([48, 64], [64, 48]):
        got, files = _cells_run(tmp_path / "-".join(map(str, lengths)), lengths)
        assert all(r["status"] == "ok" for r in got.values()) and len(got) == 4 * 2 * 4
        for (mode, n, _), r in got.items():
            assert (r["share_unit_tokens"], r["cell_kv_tokens"]) == (0, 2 * 2 * n)  # 2 prefixes × 2 visits, whole
            # 64 MiB of RAM cache hold 2,912 tokens of f16 KV: 2 × 64 MiB ÷ 46,080 bytes
            assert r["kv_budget_tokens"] == ctx + (2 * 64 * 2**20 // KV_BYTES_PER_TOKEN if mode == "ram" else 0)
        for n in lengths:
            assert got[("disk-slots", n, "p1-v2")]["store_disk_bytes"] == files[n] > 0
