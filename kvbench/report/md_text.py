"""Text from files (scenario names and descriptions, mode labels, messages, model names, paths) made inert in
Markdown: it reads as the same characters and can open no HTML, link, image or table cell.

First its control characters, bidirectional controls and undecodable bytes become readable escapes
(:func:`kvbench.safe_text.visible`: ESC is ``\\x1b``) and line breaks become spaces (no new block can start). Then
each of ``\\ ` * [ ] < > | &`` gets a backslash (CommonMark: any ASCII punctuation may have one), and so do the
``:`` of ``://`` and the ``.`` of ``www.`` (GitHub's bare autolinks).
"""

from __future__ import annotations

import re

from kvbench.safe_text import visible

_META = re.compile(r"([\\`*\[\]<>|&])")
_AUTOLINK = re.compile(r"(?i)(?<=[a-z0-9])(:)(?=//)|(?<![a-z0-9])(www)(\.)")
_CODE = re.compile(r"`([^`\r\n]+)`")


def _flat(text: object) -> str:
    return visible(re.sub(r"[\r\n]+", " ", str(text)))


def _escape(flat: str) -> str:
    escaped = _META.sub(r"\\\1", flat)
    return _AUTOLINK.sub(lambda m: "\\:" if m.group(1) else f"{m.group(2)}\\.", escaped)


def md_escape(text: object) -> str:
    """``text`` (``str()`` of it) as literal Markdown inline text: see the module docstring."""
    return _escape(_flat(text))


def md_line(text: object) -> str:
    """A plain-language line for Markdown: its `code` spans kept as they are (their content is literal in
    Markdown, and they are code in report.html too), the rest through :func:`md_escape`. A span that holds a
    ``<`` (a tag from input, brought in by a label's own backticks) is escaped as text instead, backticks and all,
    so that no tag is left in the file even as code."""
    flat = _flat(text)
    out, at = [], 0
    for m in _CODE.finditer(flat):
        code = m.group(0) if "<" not in m.group(1) else _escape(m.group(0))
        out += [_escape(flat[at:m.start()]), code]
        at = m.end()
    return "".join(out + [_escape(flat[at:])])


__all__ = ["md_escape", "md_line"]
