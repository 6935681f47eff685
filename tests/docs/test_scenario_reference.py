"""The scenario-key reference (docs/reference/scenario.md): scripts/scenario_reference.py makes it from the pydantic
schema, the committed page is what it makes, and every key of the schema and of every shipped scenario is in it.

The keys are found here by a walk of the models of our own (not the script's), so a renderer that drops a key fails.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Annotated, Union, get_args, get_origin

import pytest
import yaml
from pydantic import BaseModel

from kvbench.offload.modes import MODES
from kvbench.scenario import Scenario
from kvbench.scenario.workload import MultiTurnSpec, StoreSpec

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "scenario.md"
SCRIPT = ROOT / "scripts" / "scenario_reference.py"
FIX = "run `python scripts/scenario_reference.py`"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("scenario_reference", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def page() -> str:
    return PAGE.read_text(encoding="utf-8")


def inside(tp) -> list[tuple[type[BaseModel], bool]]:
    """The models a value of type ``tp`` can hold, each with whether it sits in a list."""
    if get_origin(tp) is Annotated:
        return inside(get_args(tp)[0])
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [(tp, False)]
    if get_origin(tp) is list:
        return [(m, True) for m, _ in inside(get_args(tp)[0])]
    if get_origin(tp) in (Union, types.UnionType, dict):
        return [x for a in get_args(tp) for x in inside(a)]
    return []


def free_form(tp) -> bool:
    """A mapping whose keys are the user's (request options, Ray resources), not the schema's."""
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    if get_origin(tp) in (Union, types.UnionType):
        return any(free_form(a) for a in get_args(tp))
    return get_origin(tp) is dict


def schema_keys(model=Scenario, path: str = "") -> list[tuple[str, type[BaseModel], bool]]:
    """Every key path of ``model`` and the models inside it: (path, the model it belongs to, free-form mapping)."""
    out = []
    for name, f in model.model_fields.items():
        p = f"{path}.{name}" if path else name
        out.append((p, model, free_form(f.annotation)))
        for sub, listed in inside(f.annotation):
            out += schema_keys(sub, p + "[]" if listed else p)
    return out


def sections(text: str) -> list[tuple[str, set[str]]]:
    """(heading, the key paths of its table's rows) of every heading of the page."""
    out = []
    for chunk in re.split(r"^(?=#{1,6} )", text, flags=re.M):
        heading = chunk.splitlines()[0] if chunk else ""
        out.append((heading, set(re.findall(r"^\| `([^`]+)` \|", chunk, flags=re.M))))
    return out


def yaml_keys(data, path: str = "", stop: frozenset = frozenset()) -> set[str]:
    """The key paths a parsed YAML document uses (``[]`` for a list entry); below a path in ``stop`` nothing."""
    if path in stop:
        return set()
    if isinstance(data, dict):
        out = set()
        for k, v in data.items():
            p = f"{path}.{k}" if path else str(k)
            out |= {p} | yaml_keys(v, p, stop)
        return out
    if isinstance(data, list):
        return set().union(*(yaml_keys(v, path + "[]", stop) for v in data))
    return set()


def test_the_committed_page_is_what_the_schema_gives(script, page):
    assert page == script.render(), f"docs/reference/scenario.md is stale: {FIX}"


def test_every_key_of_the_schema_is_in_the_page(page):
    keys = schema_keys()
    assert len({p for p, _, _ in keys}) >= 90, len(keys)  # the walk found the models
    missing = sorted({p for p, _, _ in keys if f"| `{p}` |" not in page})
    assert missing == [], f"keys missing from docs/reference/scenario.md ({FIX}): {missing}"


def test_every_model_has_a_table_of_exactly_its_keys(page):
    tables = [rows for _, rows in sections(page) if rows]
    models: dict[type[BaseModel], set[str]] = {}
    for p, model, _ in schema_keys():
        models.setdefault(model, set()).add(p)
    for model, paths in models.items():
        assert paths in tables, f"{model.__name__}: no table of exactly {sorted(paths)}"


def test_every_offload_mode_of_the_registry_has_its_section_with_its_options(page):
    by_heading = dict(sections(page))
    for kind, info in MODES.items():
        heading = next((h for h in by_heading if h.startswith("#") and f"`{kind}`" in h), None)
        assert heading is not None, f"no section for mode {kind}"
        assert by_heading[heading] == {f"modes[].{k}" for k in info.options.model_fields}, kind


def test_every_key_of_every_shipped_scenario_is_in_the_page(page):
    stop = frozenset(p for p, _, free in schema_keys() if free)
    assert {"modes[].request", "placement[].resources"} <= stop
    files = sorted((ROOT / "scenarios").glob("*.yaml"))
    assert len(files) >= 10
    missing = {}
    for f in files:
        keys = yaml_keys(yaml.safe_load(f.read_text(encoding="utf-8")), stop=stop)
        assert "modes[].kind" in keys or "modes[].name" in keys, f.name
        if lost := sorted(k for k in keys if f"| `{k}` |" not in page):
            missing[f.name] = lost
    assert missing == {}, f"keys used in scenarios/ that the reference lacks: {missing}"


def test_known_rows_give_the_schemas_defaults_and_bounds(page):
    assert MultiTurnSpec.model_fields["turns"].default == 4
    assert ("| `workload.multi_turn.turns` | integer | `4` | 2 to 10,000 | User turns used per conversation (≥ 2). |"
            in page.splitlines())
    host = next(line for line in page.splitlines() if line.startswith("| `store.host_max_bytes` |"))
    assert f"| size | `{int(StoreSpec().host_max_bytes)}` (2 GiB) |" in host
    mode = next(line for line in page.splitlines() if line.startswith("| `modes[].window` |"))
    assert "| integer | required | 0 to 16,777,216 |" in mode
    assert "| `device` | string | `auto` | auto, cpu, cuda or cuda:N |" in page
    assert "| `engine.kind` | string | `transformers` | `transformers`, `llama.cpp`, `vllm`, `sglang`, `openai` |" \
        in page


def test_every_table_row_has_its_cells_and_schema_text_is_escaped(page):
    rows = [line for line in page.splitlines() if line.startswith("| ")]
    assert len(rows) > 100
    for line in rows:
        plain = re.sub(r"\[code\]\(#[\w-]+\)", "link", re.sub(r"`[^`]*`", "code", line))
        assert not re.search(r"(?<!\\)[<>*_\[\]]", plain), line  # outside code spans, nothing Markdown reads
        assert len(re.findall(r"(?<!\\)\|", plain)) in (5, 6), line  # 4 or 5 cells: no `|` splits one
    row = next(line for line in rows if line.startswith("| `device` |"))
    assert "auto \\| cpu \\| cuda \\| cuda:N" in row
    assert "&lt;name&gt;@c&lt;level&gt;" in page and "<name>" not in page


def test_check_exits_1_with_a_diff_on_a_stale_page_and_0_on_a_fresh_one(tmp_path, script):
    stale = tmp_path / "scenario.md"
    stale.write_text(script.render().replace("| `load.seed` |", "| `load.sed` |"), encoding="utf-8")
    r = subprocess.run([sys.executable, str(SCRIPT), "--check", "--out", str(stale)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and "run `python scripts/scenario_reference.py`" in r.stderr, r.stdout + r.stderr
    assert "-| `load.sed` |" in r.stdout and "+| `load.seed` |" in r.stdout
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(stale)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and f"{stale}: " in r.stdout and " keys" in r.stdout, r.stdout + r.stderr
    assert subprocess.run([sys.executable, str(SCRIPT), "--check", "--out", str(stale)],
                          timeout=120).returncode == 0
