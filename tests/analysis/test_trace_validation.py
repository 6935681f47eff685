"""A replay's measured cached tokens against the simulator's (kvbench.analysis.trace_validation.check_replay) on
hand-made rows of a four-request trace whose hits are worked out by hand under both policies; and the mode's
summary line (kvbench.report.replay_check.summary_line)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from kvbench.analysis.trace_validation import check_replay
from kvbench.errors import BadValue
from kvbench.report.replay_check import ModeCheck, summary_line
from kvbench.traces.trace import Trace

#: Four requests of 16-token blocks at file positions 10 to 13: [0 1 2] (40 tokens), [0 1 3] (48), [0 1 2 4] (60),
#: [5] (10); replayed at 4 tokens per block their prompts are 10, 12, 15 and 3 tokens.
TRACE = Trace("hand", "mooncake", 16, np.arange(4, dtype=np.float64), np.array([40, 48, 60, 10]),
              np.ones(4, dtype=np.int64), np.array([0, 3, 6, 10, 11]),
              np.array([0, 1, 2, 0, 1, 3, 0, 1, 2, 4, 5]), np.arange(10, 14))
PROMPTS = {10: 10, 11: 12, 12: 15, 13: 3}


def rows(*r: tuple) -> pd.DataFrame:
    return pd.DataFrame(r, columns=["trace_index", "repeat", "prompt_tokens", "cached_prompt_tokens"])


MEASURED = rows((10, 0, 10, 0), (11, 0, 12, 4), (12, 0, 15, 0), (13, 0, 3, math.nan), (11, 1, 12, 8),
                (99, 0, 7, 4), (math.nan, 0, 5, 0))


def test_predicted_hits_per_request_difference_and_flags():
    # LRU of 3 blocks (13 tokens ÷ 4): request 11 finds ids 0, 1 (request 10 touched 0, 1, 2 since), request 12
    # finds 0, 1 but not 2 (ids 2, 0, 1, 3 touched since: 4 blocks); unlimited, request 12 finds all three
    c = check_replay(MEASURED, TRACE, 4, 13)
    assert (c.capacity_blocks, c.policy) == (3, "lru")
    t = c.table
    assert t.columns.tolist() == ["repeat", "trace_index", "prompt_tokens", "reusable_tokens", "predicted_tokens",
                                  "measured_tokens", "difference_tokens", "flagged"]
    assert t.values.tolist() == [[0, 10, 10, 0, 0, 0, 0, False],
                                 [0, 11, 12, 8, 8, 4, -4, False],  # 4 off: one block, not flagged
                                 [0, 12, 15, 12, 8, 0, -8, True],  # 8 off: beyond one block
                                 [1, 11, 12, 8, 8, 8, 0, False]]
    # the NaN cached count, the unknown position and the row without one are left out; 13 was never measured
    assert (c.predicted, c.measured, c.unlimited, c.flagged, c.missing) == (24, 12, 28, 1, 1)


def test_an_engine_block_sets_the_gap_that_is_flagged():
    c = check_replay(MEASURED, TRACE, 4, 13, engine_block_tokens=8)
    assert c.table["flagged"].tolist() == [False, False, False, False] and c.flagged == 0
    c = check_replay(MEASURED, TRACE, 4, 13, engine_block_tokens=3)
    assert c.table["flagged"].tolist() == [False, True, True, False] and c.flagged == 2


def test_the_prediction_is_capped_at_the_prompt():
    # unlimited capacity: request 12 finds 3 blocks = 12 of its 15 tokens; a prompt of 10 caps it at 10
    c = check_replay(rows((12, 0, 10, 10)), TRACE, 4, 10**6)
    assert c.table[["reusable_tokens", "predicted_tokens", "difference_tokens"]].values.tolist() == [[10, 10, 0]]
    assert c.capacity_blocks == 250_000 and c.missing == 3


@pytest.mark.parametrize("policy, predicted", [("lru", [0, 0, 0, 0]), ("lru-tail-first", [0, 8, 8, 0])])
def test_the_policy_decides_a_small_cache_s_hits(policy, predicted):
    # 2 blocks: tail first, request 10 leaves 0 most recent, so request 11 finds 0, 1 (and request 12 likewise);
    # in prompt order 2 is the most recent and id 0 is gone
    all_rows = rows(*[(ix, 0, n, 0) for ix, n in PROMPTS.items()])
    c = check_replay(all_rows, TRACE, 4, 8, policy)
    assert c.table["predicted_tokens"].tolist() == predicted and c.policy == policy and c.missing == 0
    assert c.table["difference_tokens"].tolist() == [-p for p in predicted]


def test_no_comparable_row_gives_an_empty_table_and_every_request_missing():
    c = check_replay(rows((10, 0, 10, math.nan)), TRACE, 4, 13)
    assert c.table.empty and (c.predicted, c.measured, c.unlimited, c.flagged, c.missing) == (0, 0, 0, 0, 4)


def test_an_unknown_policy_is_refused():
    with pytest.raises(BadValue) as e:
        check_replay(MEASURED, TRACE, 4, 13, "fifo")
    assert str(e.value) == "policy 'fifo' is not one of: lru, lru-tail-first, lfu, prompt-lru"


def test_summary_line_says_the_overall_difference():
    c = check_replay(MEASURED, TRACE, 4, 13)
    line = summary_line(ModeCheck("prefix@c1", "vllm", 13, "given", c))
    assert line == ("prefix@c1 (vllm): 4 requests; cached prompt tokens measured 12, simulated 24 (lru at 3 blocks = "
                    "13 tokens, given): difference -12 (-50.0%); an unlimited cache 28; 1 requests off by more than "
                    "a block; 1 requests of the slice not measured")
