"""Text from files (scenario names and descriptions, mode labels, messages, model names, paths) made inert in
Markdown: it reads as the same characters and can open no HTML, link, image or table cell.

Escaped with a backslash (CommonMark: any ASCII punctuation may be): ``\\ ` * [ ] < > | &``; the ``:`` of ``://``
and the ``.`` of ``www.`` (GitHub's bare autolinks); line breaks become spaces (no new block can start).
"""

from __future__ import annotations

import re

_META = re.compile(r"([\\`*\[\]<>|&])")
_AUTOLINK = re.compile(r"(?i)(?<=[a-z0-9])(:)(?=//)|(?<![a-z0-9])(www)(\.)")
_CODE = re.compile(r"`([^`\r\n]+)`")


def md_escape(text: object) -> str:
    """``text`` (``str()`` of it) as literal Markdown inline text: see the module docstring."""
    flat = re.sub(r"[\r\n]+", " ", str(text))
    escaped = _META.sub(r"\\\1", flat)
    return _AUTOLINK.sub(lambda m: "\\:" if m.group(1) else f"{m.group(2)}\\.", escaped)


def md_line(text: object) -> str:
    """A plain-language line for Markdown: its `code` spans kept as they are (their content is literal in
    Markdown, and they are code in report.html too), the rest through :func:`md_escape`."""
    flat = re.sub(r"[\r\n]+", " ", str(text))
    out, at = [], 0
    for m in _CODE.finditer(flat):
        out += [md_escape(flat[at:m.start()]), m.group(0)]
        at = m.end()
    return "".join(out + [md_escape(flat[at:])])


__all__ = ["md_escape", "md_line"]
