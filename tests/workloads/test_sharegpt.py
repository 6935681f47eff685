"""The ShareGPT reader: streams a JSON file cut mid-record, yields every complete record, warns once."""

from __future__ import annotations

import io
import json
import warnings

import pytest

from kvbench.workloads import sharegpt
from kvbench.workloads.documents import Document

RECORDS = [
    {"id": "a", "conversations": [{"from": "human", "value": "Hi there"}, {"from": "gpt", "value": "Hello!"}]},
    {"id": "b", "conversations": [{"from": "gpt", "value": "stray"}, {"from": "human", "value": "Q1"},
                                  {"from": "human", "value": "Q1b"}, {"from": "gpt", "value": "A1"}]},
    {"id": "c", "conversations": [{"from": "human", "value": "third"}]},
]


def truncated_bytes(cut_inside: int) -> bytes:
    """The three records as a JSON array, cut ``cut_inside`` bytes into the last record."""
    full = json.dumps(RECORDS, indent=2).encode()
    start_of_last = full.index(b'"id": "c"')
    return full[: start_of_last + cut_inside]


@pytest.mark.parametrize("cut", [0, 3, 11, 40])
def test_truncated_stream_yields_complete_records_and_warns_once(cut):
    with pytest.warns(sharegpt.TruncatedFileWarning) as caught:
        recs = list(sharegpt.iter_records(io.BytesIO(truncated_bytes(cut)), "fixture.json"))
    assert [r["id"] for r in recs] == ["a", "b"]
    assert len(caught) == 1
    assert str(caught[0].message).startswith("fixture.json ends early (")
    assert str(caught[0].message).endswith("read the 2 complete records before the cut")


def test_complete_file_reads_without_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        recs = list(sharegpt.iter_records(io.BytesIO(json.dumps(RECORDS).encode())))
    assert [r["id"] for r in recs] == ["a", "b", "c"]


def test_records_become_alternating_chat_turns():
    docs = [sharegpt.to_document(r) for r in RECORDS]
    assert docs[0] == Document("a", (("user", "Hi there"), ("assistant", "Hello!")))
    # a leading assistant turn is dropped and consecutive user turns merge
    assert docs[1].turns == (("user", "Q1\n\nQ1b"), ("assistant", "A1"))


def test_load_reads_a_truncated_file_once(tmp_path):
    p = tmp_path / "cut.json"
    p.write_bytes(truncated_bytes(5))
    sharegpt.load.cache_clear()
    with pytest.warns(sharegpt.TruncatedFileWarning):
        first = sharegpt.load(str(p))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second read, so no second warning
        again = sharegpt.load(str(p))
    assert again is first and [d.id for d in first] == ["a", "b"]


def test_real_package_file_has_17671_complete_conversations():
    path = sharegpt.default_path()
    assert path.stat().st_size == 125_509_632
    with path.open("rb") as fp, pytest.warns(sharegpt.TruncatedFileWarning) as caught:
        n = sum(1 for _ in sharegpt.iter_records(fp, str(path)))
    assert n == 17_671
    assert len(caught) == 1 and "read the 17671 complete records" in str(caught[0].message)
