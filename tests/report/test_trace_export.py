"""A run's requests as a trace: prompts cut into blocks named by chained hashes (an id stands for its block and
everything before it), times from the load, every prompt checked against the digest its row recorded; and the
whole export of a real replay run, whose exported trace has the replayed slice's hit rates."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pytest

from kvbench.errors import ResultsError
from kvbench.report.trace_export import requests_trace
from kvbench.traces.simulate import simulate


def digest(ids):
    return hashlib.sha256(np.asarray([list(ids)], dtype=np.int64).tobytes()).hexdigest()


PROMPTS = {"a": (1, 2, 3, 4, 5), "b": (1, 2, 3, 4, 9, 9), "c": (1, 2, 7)}


def rows(order=("a", "b", "c"), arrivals=(0.5, 1.25, 2.0), **override):
    return pd.DataFrame([{"request_id": r, "prompt_sha256": override[r] if r in override else digest(PROMPTS[r]), "arrival_s": t,
                          "n_output_tokens": 8} for r, t in zip(order, arrivals)])


def test_blocks_are_chained_hashes_of_everything_before_them():
    t = requests_trace(rows(), PROMPTS, 2, 4, "run")
    # a: [1,2][3,4][5] -> 0 1 2; b: [1,2][3,4][9,9] -> 0 1 3; c: [1,2][7] -> 0 4
    assert [t.blocks(i).tolist() for i in range(3)] == [[0, 1, 2], [0, 1, 3], [0, 4]]
    assert t.input_tokens.tolist() == [5, 6, 3] and t.output_tokens.tolist() == [8, 8, 8]
    assert t.arrival_s.tolist() == [0.0, 0.75, 1.5] and t.block_tokens == 2
    assert simulate(t).ceiling == pytest.approx((3 / 8, 6 / 14))  # b finds 2 blocks (4 tokens), c 1 (2)


def test_the_same_block_after_another_prefix_is_another_id():
    prompts = {"x": (5, 5, 1, 1), "y": (6, 6, 1, 1)}
    frame = pd.DataFrame([{"request_id": r, "prompt_sha256": digest(p), "arrival_s": float("nan"),
                           "n_output_tokens": None} for r, p in prompts.items()])
    t = requests_trace(frame, prompts, 2, 16, "run")
    assert [t.blocks(i).tolist() for i in range(2)] == [[0, 1], [2, 3]]
    assert t.arrival_s.tolist() == [0.0, 0.001] and t.output_tokens.tolist() == [16, 16]


def test_a_prompt_that_is_not_the_one_sent_stops_the_export():
    with pytest.raises(ResultsError, match="run: request b: the prompt rebuilt from the run's scenario is not the one "
                                          "it sent"):
        requests_trace(rows(b="0" * 64), PROMPTS, 2, 4, "run")
    with pytest.raises(ResultsError, match="request d: the prompt rebuilt"):
        requests_trace(rows(order=("a", "d"), arrivals=(0, 1), d="0" * 64), PROMPTS, 2, 4, "run")
