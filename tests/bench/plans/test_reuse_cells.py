"""A map cell's memory is its own: a ``shared_prefix`` run on the real (tiny) model gives every cell fresh stores,
so the host and disk bytes it is charged do not depend on the cells run before it, and its working-set ratio
counts every chunk its visits hold."""

from __future__ import annotations

import numpy as np
import pytest

from kvbench.workloads.documents import Document

#: The two cells (prompt tokens, shared percent, prefixes): 2 whole chunks of 16 shared, or 2 shared and a tail.
CELL_A, CELL_B = (64, 50, 2), (72, 50, 2)
#: Bytes of one token in the tiny model's store (2 layers × K and V × 2 kv heads × 16 × 4 bytes).
TOKEN_BYTES = 512


def _docs() -> list[Document]:
    rng = np.random.default_rng(3)
    vocab = ["cache", "memory", "token", "layer", "tensor", "offload", "budget", "device", "host", "chunk"]
    return [Document.from_turns(f"d{i}", [("human", " ".join(rng.choice(vocab, 300)))]) for i in range(12)]


def _run(cells, tiny_model, tokenizer, path):
    """Rows (by request id, cell named by its prompt length) and map cells of one run of ``cells``."""
    from kvbench.analysis.break_even import break_even_map
    from kvbench.analysis.cost import Prices
    from kvbench.bench.engines.transformers import TransformersEngine
    from kvbench.bench.executors.local import LocalExecutor
    from kvbench.bench.plans.sweep import run_sweep
    from kvbench.results.frame import trials_frame
    from kvbench.results.read import read_trials
    from kvbench.results.run_dir import RunDir
    from kvbench.scenario import parse_scenario
    from kvbench.workloads.shared_prefix import shared_prefix

    stream = shared_prefix(_docs(), tokenizer, cells=cells, visits=2)
    s = parse_scenario({
        "name": "cells", "model": {"preset": "tiny-llama", "weights": "random"}, "device": "cpu",
        "workload": {"source": "sharegpt", "shared_prefix": {
            "prompt_tokens": [c[0] for c in cells], "shared_pct": [50], "working_set": [2], "visits": 2}},
        "max_new_tokens": 3, "modes": [{"kind": "none"}], "repeats": 1, "warmup": 0,
        # 8 chunks of host memory: each cell spills to disk, so both tiers carry what a cell holds
        "store": {"chunk_tokens": 16, "host_max_bytes": 128 * TOKEN_BYTES, "disk_max_bytes": "1MiB"},
        "disk_dir": str(path / "disk")})
    (path / "disk").mkdir(parents=True)
    engine = TransformersEngine(s, tiny_model, stream)
    assert engine.store_token_bytes == TOKEN_BYTES
    run = RunDir.create(path, s.model_dump(mode="json"), {"test": True})
    run_sweep(s, run, LocalExecutor(s, engine))
    rows = read_trials(run.path / "trials.jsonl")
    assert all(r["status"] == "ok" and r["tokens_match"] is True for r in rows)
    warm = {(r["prompt_tokens"], r["request_id"].split("-", 1)[1]): r for r in rows if r["warm"]}
    m = break_even_map(trials_frame(rows, "cells"), Prices(2.0, host_per_gib_hour=5.0, disk_per_gib_hour=1.0))
    cells = m.cells[m.cells["source"] == "measured"].set_index("prompt_tokens")
    return warm, cells


@pytest.mark.e2e
def test_a_cell_is_charged_only_its_own_chunks_in_either_order(tiny_model, smol_tokenizer, tmp_path):
    """Cell A (64 tokens, 32 shared: 2 whole chunks) holds 2 × (32 + 2 visits × 32) = 192 tokens; cell B (72
    tokens, 36 shared: 2 whole chunks, the rest of each visit 2 chunks and an 8-token tail) 2 × (32 + 2 × 40) =
    224. The host tier holds 128 tokens, the rest spills to disk (least recently used chunks first, a tail as one).
    After each warm trial the store holds the cell's visits so far and nothing of the other cell, whichever ran
    first, so the charges (medians over the warm trials) are the cell's own, equal in both orders."""
    runs = [_run(order, tiny_model, smol_tokenizer, tmp_path / name)
            for name, order in (("ab", [CELL_A, CELL_B]), ("ba", [CELL_B, CELL_A]))]
    charges = [cells[["store_host_bytes", "store_disk_bytes"]].sort_index().to_dict("index") for _, cells in runs]
    assert charges[0] == charges[1] == {  # bytes: 128 and 16 tokens; 120 (a whole chunk spilled) and 44 tokens
        64: {"store_host_bytes": 128 * TOKEN_BYTES, "store_disk_bytes": 16 * TOKEN_BYTES},  # of 0, 0, 32, 64
        72: {"store_host_bytes": 120 * TOKEN_BYTES, "store_disk_bytes": 44 * TOKEN_BYTES}}  # of 0, 24, 64, 104
    for warm, cells in runs:
        # what a cell holds once it ran, all of it on the host or disk at its last warm trial: 192 and 224 tokens
        # against 128 of host store (prefixes × prompt tokens would say 1.0× and 1.125×)
        assert {(n, r["share_unit_tokens"], r["cell_kv_tokens"]) for (n, _), r in warm.items()} == {
            (64, 16, 192), (72, 16, 224)}
        assert cells[["kv_ratio", "panel"]].sort_index().to_dict("index") == {
            64: {"kv_ratio": 1.5, "panel": "1–2×"}, 72: {"kv_ratio": 1.75, "panel": "1–2×"}}
        held = {(n, rid): (r["store_host_bytes"] // TOKEN_BYTES, r["store_disk_bytes"] // TOKEN_BYTES)
                for (n, rid), r in warm.items()}
        assert held == {  # tokens on the host, on disk, after each warm trial (visit 1 of both, then visit 2)
            (64, "p0-v1"): (64, 0), (64, "p1-v1"): (128, 0), (64, "p0-v2"): (128, 32), (64, "p1-v2"): (128, 64),
            (72, "p0-v1"): (72, 0), (72, "p1-v1"): (120, 24), (72, "p0-v2"): (120, 64), (72, "p1-v2"): (120, 104)}
