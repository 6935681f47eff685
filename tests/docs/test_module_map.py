"""The module map (docs/reference/modules.md): scripts/module_map.py makes it from the source tree, so a module
added, removed or re-described without running it fails here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "modules.md"
SCRIPT = ROOT / "scripts" / "module_map.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("module_map", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_the_page_is_what_the_tree_gives(script):
    assert PAGE.read_text(encoding="utf-8") == script.render(), "run `python scripts/module_map.py`"


def test_every_module_of_the_tree_is_on_the_page():
    page = PAGE.read_text(encoding="utf-8")
    for p in sorted((ROOT / "kvbench").rglob("*.py")):
        package = p.parent.relative_to(ROOT).as_posix()
        section = page.split(f"## `{package}/`", 1)[1].split("\n## ", 1)[0]
        assert f"| `{p.name}` | {len(p.read_text(encoding='utf-8').splitlines())} |" in section, p


def test_a_new_module_changes_the_page(script, tmp_path):
    pkg = tmp_path / "kvbench" / "tiers"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sizes.py").write_text('"""Tier sizes, e.g. 4 GiB. More text: | pipes too."""\nX = 1\n')
    (pkg / "bare.py").write_text("X = 1\n")
    page = script.render(tmp_path)
    assert "## `kvbench/tiers/`\n\n3 modules, 3 lines." in page
    assert "| `sizes.py` | 2 | Tier sizes, e.g. 4 GiB. |" in page  # one sentence, not cut at e.g.
    assert "| `__init__.py` | 0 | (empty: marks the package) |" in page
    assert "| `bare.py` | 1 | (no docstring) |" in page
    assert script.summary(pkg / "sizes.py") == "Tier sizes, e.g. 4 GiB."


def test_a_reference_reads_as_its_text_and_a_long_sentence_is_cut(script, tmp_path):
    f = tmp_path / "m.py"
    f.write_text('"""The :class:`~kvbench.bench.plans.plan.Plan` of ``x`` runs ' + "a" * 300 + '."""\n')
    text = script.summary(f)
    assert text.startswith("The kvbench.bench.plans.plan.Plan of `x` runs aaa")
    assert len(text) == script.MAX_SUMMARY and text.endswith("…")
