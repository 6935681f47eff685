"""The paths a scenario names: a ``files:`` glob within its limit (scenario/paths.py)."""

from __future__ import annotations

import pytest

from kvbench.errors import TooManyFiles
from kvbench.scenario import paths


def test_a_glob_matching_more_than_the_limit_is_refused_naming_pattern_and_limit(tmp_path):
    for i in range(6):
        (tmp_path / f"{i}.txt").write_text("x")
    assert len(paths.match(f"{tmp_path}/*.txt", limit=6)) == 6
    with pytest.raises(TooManyFiles) as info:
        paths.match(f"{tmp_path}/*.txt", limit=5)
    assert str(info.value) == (f"workload.files: the pattern '{tmp_path}/*.txt' matches more than 5 paths (the "
                               "limit): narrow it")
    assert paths.MAX_MATCHES == 10_000
