"""Local text files as documents: each file is one user turn."""

from __future__ import annotations

import glob
from pathlib import Path

from kvbench.workloads.documents import Document


class NoFilesError(FileNotFoundError):
    """A glob that matches no readable text file."""


def load(pattern: str) -> tuple[Document, ...]:
    """Every file the glob matches (``**`` allowed), sorted by path, as a one-turn document.

    Undecodable bytes are replaced (U+FFFD); empty files are skipped. Raises NoFilesError when nothing is left.
    """
    paths = sorted(p for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
    docs = []
    for p in paths:
        text = Path(p).read_text(encoding="utf-8", errors="replace")
        if text.strip():
            docs.append(Document(p, (("user", text),)))
    if not docs:
        raise NoFilesError(f"workload.files: the pattern {pattern!r} matches no non-empty file")
    return tuple(docs)
