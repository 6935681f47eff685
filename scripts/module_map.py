"""Make the module map of the documentation from the source tree: never by hand.

    .venv/bin/python scripts/module_map.py [--check] [--out docs/reference/modules.md]

Reads every module of ``kvbench/`` without importing it (``ast``: its docstring) and writes one table per package:
each module's path, its lines, and the first sentence of its docstring. ``--check`` writes nothing: it exits 1,
with a diff, when the file differs from what the tree gives.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "reference" / "modules.md"
#: Characters of a module's first sentence shown at most.
MAX_SUMMARY = 200

HEADER = """# Module map

Every module of `kvbench/`, by package: its lines and the first sentence of its docstring. Generated from the
source by `python scripts/module_map.py` (a test fails when this page is stale); the layering that holds between
the packages is in [Contributing](../contributing.md#development).
"""


def summary(path: Path) -> str:
    """The first sentence of ``path``'s module docstring, on one line (a ``:role:`text``` reference as its text),
    at most :data:`MAX_SUMMARY` characters; what the file is without one (an empty package marker)."""
    source = path.read_text(encoding="utf-8")
    doc = ast.get_docstring(ast.parse(source))
    if not doc:
        return "(empty: marks the package)" if not source.strip() else "(no docstring)"
    text = " ".join(doc.split())
    text = re.sub(r":\w+:`~?([^`<]*?)(?: <[^>]*>)?`", r"\1", text)
    text = text.replace("``", "`")
    end = re.search(r"(?<!e\.g\.)(?<!i\.e\.)(?<=\.)\s", text)
    first = text[: end.start()] if end else text
    return first if len(first) <= MAX_SUMMARY else first[: MAX_SUMMARY - 1].rstrip() + "…"


def render(root: Path = ROOT) -> str:
    """The page: one section per package (``kvbench`` first, then each subpackage in path order)."""
    modules = sorted(p for p in (root / "kvbench").rglob("*.py") if "__pycache__" not in p.parts)
    packages: dict[str, list[Path]] = {}
    for p in modules:
        packages.setdefault(p.parent.relative_to(root).as_posix(), []).append(p)
    out = [HEADER]
    for package in sorted(packages):
        lines = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in packages[package])
        out += [f"\n## `{package}/`\n", f"{len(packages[package])} modules, {lines:,} lines.\n",
                "| module | lines | what it is |", "|---|---:|---|"]
        for p in packages[package]:
            n = len(p.read_text(encoding="utf-8").splitlines())
            cell = summary(p).replace("|", r"\|")
            out.append(f"| `{p.name}` | {n} | {cell} |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 with a diff when the page is stale")
    ap.add_argument("--out", type=Path, default=OUT, help=f"the page to write (default {OUT.relative_to(ROOT)})")
    args = ap.parse_args()
    page = render()
    if args.check:
        old = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if old != page:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), page.splitlines(True), str(args.out),
                                                       "generated"))
            sys.exit(1)
        return
    args.out.write_text(page, encoding="utf-8")


if __name__ == "__main__":
    main()
