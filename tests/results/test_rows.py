"""The trial row's declaration (kvbench.results.rows): the docs' field table (docs/metrics.md) documents it, its units follow the
names, the schema check covers every declared column, and the runner writes no column it does not declare."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import ROOT, tiny_scenario
from kvbench.errors import RecordError
from kvbench.results.record import ROW_KEYS, ROW_STATUSES, check_rows
from kvbench.results.rows import (AGGREGATES, BY_NAME, COLUMNS, FRAME_COLUMNS, MEASURED, METRICS, NO_FIT, PLAN_COLUMNS,
                                  REUSE_COLUMNS, SERVER_COLUMNS, TRIAL_COLUMNS, Kind, Status, agg)
from kvbench.results.samples import SAMPLE_COLUMNS

METRICS_PAGE = (ROOT / "docs" / "metrics.md").read_text()  # "What a trial measures" and the metric dictionary
DOCS = "\n".join(p.read_text() for p in sorted((ROOT / "docs").rglob("*.md")))
#: Units a documented meaning may name, as the declaration spells them.
UNIT_WORDS = {"seconds": "seconds", "bytes": "bytes", "percent": "percent"}
#: Columns whose unit is not in their name.
UNIT_NOT_IN_NAME = {"window_final": "tokens", "tokens_restored": "tokens", "tokens_prefilled": "tokens"}


def field_table() -> list[tuple[list[str], str]]:
    """The rows of the docs' field table ("What a trial measures"): (the columns a row names, its meaning)."""
    section = METRICS_PAGE[METRICS_PAGE.index("# What a trial measures"):]
    lines = section[section.index("| field | meaning |"):].splitlines()[2:]
    out = []
    for line in lines:
        if not line.startswith("|"):
            break
        fields, meaning = line.strip("|").split(" | ", 1)
        out.append((re.findall(r"`([a-z0-9_]+)`", fields), meaning))
    return out


def unit_in_name(name: str) -> str:
    """The unit a column's name says (docs/metrics.md: units are in the names)."""
    if name in UNIT_NOT_IN_NAME:
        return UNIT_NOT_IN_NAME[name]
    if name.endswith("_bytes_per_s"):
        return "bytes/s"
    if name.endswith("_tokens_per_s"):
        return "tokens/s"
    if "_bytes" in name or name.startswith("bytes_"):
        return "bytes"
    if name.endswith("_s"):
        return "seconds"
    if "percent" in name:
        return "percent"
    if name.endswith("_w"):
        return "watts"
    if name.endswith("_tokens"):
        return "tokens"
    return ""


def test_the_docs_field_table_names_the_trial_columns_in_their_order():
    named = [name for names, _ in field_table() for name in names]
    assert named == [c.name for c in TRIAL_COLUMNS]


def metric_table() -> list[str]:
    """The docs' metric dictionary as :data:`kvbench.results.rows.METRICS` declares it, one line per metric."""
    def name(v: str) -> str:
        return "-" if v == "-" else f"`{v.split(' (')[0]}`" + (f" ({v.split(' (', 1)[1]}" if " (" in v else "")
    return [f"| `{m.name}` | {m.unit or '-'} | {m.definition} | {name(m.vllm)} | {name(m.guidellm)} | "
            f"{name(m.aiperf)} | {name(m.inference_perf)} |" for m in METRICS]


def test_the_docs_metric_dictionary_is_the_declared_one():
    section = METRICS_PAGE[METRICS_PAGE.index("## Metric dictionary"):]
    lines = section[section.index("| kvbench |"):].splitlines()[2:]
    assert lines[:len(METRICS)] == metric_table()
    assert not lines[len(METRICS)].startswith("|")
    row_metrics = [m.name for m in METRICS if m.where == "row"]
    assert all(n in BY_NAME for n in row_metrics) and [BY_NAME[n].unit for n in row_metrics] == ["seconds"] * 5


def test_the_docs_name_every_other_column():
    missing = [c.name for c in PLAN_COLUMNS + REUSE_COLUMNS + SERVER_COLUMNS if f"`{c.name}`" not in DOCS]
    assert missing == []


def test_the_docs_samples_paragraph_names_every_samples_column():
    section = METRICS_PAGE[METRICS_PAGE.index("`samples.csv` has one row"):]
    paragraph = section[:section.index("\n\n")]
    assert [c for c in SAMPLE_COLUMNS if f"`{c}`" not in paragraph] == []


def test_units_follow_the_names_and_the_docs():
    assert [(c.name, c.unit) for c in COLUMNS + FRAME_COLUMNS if c.unit != unit_in_name(c.name)] == []
    for names, meaning in field_table():
        for word, unit in UNIT_WORDS.items():
            if re.search(rf"\b{word}\b", meaning):
                assert unit in {BY_NAME[n].unit for n in names}, (names, word)


def test_columns_are_declared_once_with_a_meaning():
    names = [c.name for c in COLUMNS + FRAME_COLUMNS]
    assert len(names) == len(set(names))
    assert all(c.meaning and "\n" not in c.meaning for c in COLUMNS + FRAME_COLUMNS)
    assert {c.name for c in COLUMNS if c.required} == {"trial_id", "status", "mode", "prompt_tokens", "batch_size"}


def test_statuses_are_the_docs_and_plain_strings():
    status_row = next(meaning for names, meaning in field_table() if "status" in names)
    assert {s.value for s in Status} <= set(re.findall(r"`([a-z_]+)`", status_row))
    assert ROW_STATUSES == ("ok", "over_budget", "skipped", "error", "oom")
    assert MEASURED == ("ok", "over_budget") and NO_FIT == ("over_budget", "oom")
    assert isinstance(Status.OK, str) and f"{Status.OVER_BUDGET}" == "over_budget"


def test_agg_names_the_aggregate_columns():
    assert agg("ttft_s", "median") == "ttft_s_median"
    assert [agg("tpot_s_ratio", s) for s in AGGREGATES[3:]] == ["tpot_s_ratio_ci_low", "tpot_s_ratio_ci_high"]
    with pytest.raises(ValueError, match="no aggregate 'mean'"):
        agg("ttft_s", "mean")


#: A value of each kind that the schema check refuses, and what it says.
BAD = {Kind.NAME: ("", "must be not empty, not ''"), Kind.SIZE: (0, "must be a whole number above 0, not 0"),
       Kind.STATUS: ("fine", "must be one of 'ok', 'over_budget', 'skipped', 'error' or 'oom', not 'fine'"),
       Kind.COUNT: (-1, "must be a whole number of at least 0, not -1"),
       Kind.NUMBER: ([1], "must be a number, not [1]"), Kind.NUMBERS: ([[1]], "must be a number, not [1]"),
       Kind.TEXT: (5, "must be text, not 5"), Kind.FLAG: ("yes", "must be true or false, not 'yes'"),
       Kind.OBJECT: (5, "must be an object, not 5"), Kind.LIST: (5, "must be a list, not 5")}


@pytest.mark.parametrize("column", COLUMNS, ids=lambda c: c.name)
def test_the_schema_check_covers_every_declared_column(column):
    assert set(ROW_KEYS) == set(BY_NAME)
    row = {"trial_id": "a", "status": "ok", "mode": "none", "prompt_tokens": 8, "batch_size": 1}
    assert check_rows([{**row, column.name: None}] if not column.required else [row], [1], "t.jsonl")
    value, why = BAD[column.kind]
    with pytest.raises(RecordError) as info:
        check_rows([{**row, column.name: value}], [3], "t.jsonl")
    key = f"{column.name}[0]" if column.kind == Kind.NUMBERS else column.name
    assert str(info.value) == f"t.jsonl:3: {key}: {why}"


def test_the_runner_writes_only_declared_columns(tiny_model, tmp_path):
    from kvbench.bench.engines.transformers import TransformersEngine
    from kvbench.bench.executors.local import LocalExecutor
    from kvbench.bench.trial import TrialSpec
    from kvbench.scenario import parse_scenario
    from kvbench.workloads import SyntheticSource

    modes = [{"kind": "none"}, {"kind": "full", "host_max_tokens": 16}, {"kind": "hierarchical", "window": 8},
             {"kind": "dynamic", "min_window": 8}, {"kind": "hf-offloaded"}]
    s = parse_scenario(tiny_scenario(modes=modes, disk_dir=str(tmp_path), budget="12KiB"))
    runner = LocalExecutor(s, TransformersEngine(s, tiny_model,
                                                 SyntheticSource(tiny_model.shape.vocab_size, seed=0, n_prompts=4)))
    rows = [runner.run(TrialSpec(16, 2, m, 0)) for m in s.modes]
    assert {r["status"] for r in rows} == {"ok", "over_budget", "skipped"}, [r["message"] for r in rows]
    assert sorted({k for r in rows for k in r} - set(BY_NAME)) == []
    assert check_rows(rows, list(range(1, len(rows) + 1)), Path("t.jsonl")) == rows
