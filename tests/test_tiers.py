"""The tiers' check (tests/conftest.py): an unmarked test whose call takes over the limit fails, saying which markers
there are; a quick one, a marked one, one whose thread waited that long for a CPU, and one that fails on its own do
not get the check's failure."""

from __future__ import annotations

import re

TESTS = '''
import time

import pytest

import conftest


def test_quick():
    time.sleep(0.02)


def test_slow():
    time.sleep(0.4)


@pytest.mark.e2e
def test_slow_but_marked():
    time.sleep(0.4)


def test_slow_while_waiting_for_a_cpu(monkeypatch):
    """0.2 s queued on its own thread, and 0.2 s of its child's CPU time × 1 waiting as long again."""
    queued, worked = conftest.cpu_clocks()
    time.sleep(0.4)
    monkeypatch.setattr(conftest, "cpu_clocks", lambda: (queued + 0.2, worked + 0.2))
    monkeypatch.setattr(conftest, "contention", lambda: 1.0)


def test_failing_slowly():
    time.sleep(0.4)
    assert False, "its own failure"
'''


def test_an_unmarked_call_over_the_limit_fails_and_nothing_else_does(pytester, request):
    assert request.config.getini("unmarked_call_limit_s") == "5"
    pytester.makepyfile(test_check=TESTS)
    r = pytester.runpytest("-p", "conftest", "-p", "no:cacheprovider", "-o", "unmarked_call_limit_s=0.2",
                           "-o", "markers=e2e: a tier")
    r.assert_outcomes(passed=3, failed=2)
    failed = {rep.nodeid.split("::")[1]: rep.longreprtext for rep in r.reprec.getfailures()}
    assert sorted(failed) == ["test_failing_slowly", "test_slow"]
    assert re.fullmatch(r"this unmarked test's call took 0\.[45] s \(over 0\.2 s, not counting time spent waiting "
                        r"for a CPU\): mark what it needs \(model, server, vllm, ray, browser, e2e; pyproject\.toml "
                        r"says what each means\) or make it faster", failed["test_slow"]), failed["test_slow"]
    assert "AssertionError: its own failure" in failed["test_failing_slowly"]
    assert "unmarked" not in failed["test_failing_slowly"]
