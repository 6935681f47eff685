"""Strings from input made safe for where kvbench puts them: a terminal, a chart, a file name, a Markdown or HTML
document.

Input is anything kvbench did not write itself this run: a scenario's name and mode labels, the rows of a
``trials.jsonl``, a ``map.json``, another tool's result files (strategy names, labels), file and folder names. Such
a string may hold bytes that act instead of reading as text: an escape sequence (ESC ``\\x1b`` … clears the
screen, sets the window title), another C0 or C1 control character, a bidirectional override (U+202A–U+202E,
U+2066–U+2069: text shown in another order than it is stored), or, from a file name that is not UTF-8, a lone
surrogate (Python's ``surrogateescape``: byte 0xff is ``"\\udcff"``, which no UTF-8 stream can write).

:func:`visible` writes each of them as an escape that can be read (``\\x1b``, ``\\u202e``, ``\\xff`` for the
undecodable byte 0xff) and leaves every other character as it is; every other function here starts from it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

#: Characters written as escapes: C0 controls but tab and line feed, DEL, C1 controls, the bidirectional marks,
#: embeddings, overrides and isolates, the line and paragraph separators, and lone surrogates.
_HIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
                     "\ud800-\udfff]")
#: What a file name keeps: letters, digits, ``.``, ``-``, ``_`` and ``@``; any run of other characters is one ``_``.
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9._@-]+")
#: The longest stem :func:`file_stem` gives (file systems take 255 bytes for a whole name).
STEM_MAX = 80


def _escape(m: re.Match) -> str:
    c = ord(m.group(0))
    if 0xDC80 <= c <= 0xDCFF:  # a byte that was not UTF-8, as surrogateescape carries it
        return f"\\x{c - 0xDC00:02x}"
    return f"\\x{c:02x}" if c <= 0xFF else f"\\u{c:04x}"


def visible(text: object) -> str:
    """``str(text)`` with every control character (but tab and line feed), bidirectional control and lone surrogate
    as a readable escape: ``"a\\x1b[2J"`` → ``a\\x1b[2J`` (ESC as the four characters ``\\x1b``), ``"\\u202e"`` →
    ``\\u202e``, ``"run\\udcff"`` (a folder named with the byte 0xff) → ``run\\xff``."""
    return _HIDDEN.sub(_escape, str(text))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def file_stem(text: object) -> str:
    """A file-name-safe form of ``text`` (a scenario, group or mode name): every run of characters other than
    letters, digits, ``.``, ``-``, ``_`` and ``@`` as one ``_``, without ``_`` at the ends (``x`` when nothing is
    left) and never a name of its own (``.``, ``..``); longer than :data:`STEM_MAX` characters, cut and ended by
    a digest of the whole text (8 hex digits), so that two long names that share a beginning stay apart."""
    s = str(text)
    stem = _NOT_IN_NAME.sub("_", s).strip("_") or "x"
    if stem.strip("."):
        stem = stem if len(stem) <= STEM_MAX else f"{stem[:STEM_MAX - 9]}-{_digest(s)}"
    else:
        stem = f"x-{_digest(s)}"
    return stem


def unique_stems(keys: Sequence[str | tuple[str, ...]], sep: str = "_") -> list[str]:
    """File-name stems of ``keys``, told apart. A key is a text or a tuple of texts (e.g. a scenario and a mode);
    its stem is the :func:`file_stem` of each part, joined by ``sep``. Where different keys give the same stem
    (``none?`` and ``none!`` both give ``none``; letter case aside, as on macOS and Windows), each of them gets
    ``-<digest>``, 8 hex digits of its own key (``none-04713f71``), so that its name does not depend on the other
    names; a clash that is still left (a key whose stem is another's stem and digest) gets ``-2``, ``-3``… in
    order. Equal keys get equal stems."""
    texts = ["\0".join(k) if isinstance(k, tuple) else str(k) for k in keys]
    stems = [sep.join(file_stem(p) for p in t.split("\0")) for t in texts]
    owners: dict[str, set[str]] = {}
    for t, s in zip(texts, stems):
        owners.setdefault(s.casefold(), set()).add(t)
    stems = [f"{s}-{_digest(t)}" if len(owners[s.casefold()]) > 1 else s for t, s in zip(texts, stems)]
    taken: dict[str, str] = {}
    out = []
    for t, s in zip(texts, stems):
        name, n = s, 1
        while taken.setdefault(name.casefold(), t) != t:
            n += 1
            name = f"{s}-{n}"
        out.append(name)
    return out


__all__ = ["STEM_MAX", "file_stem", "unique_stems", "visible"]
