"""`kvbench simulate` and `kvbench trace check|synthesize` as a user runs them: the Mooncake trace's published
figures in the text and in simulation.json/.csv/.png, the cost table with its knee and advice, a faulty trace's
error (exit 2, one line per fault, no traceback), flags that need a partner, and outputs never written through a
symbolic link; a synthesized trace the same for the same seed, and read back by `trace check`."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvbench.cli import app

ROOT = Path(__file__).resolve().parents[2]
MOONCAKE = ROOT / "traces" / "mooncake" / "conversation_trace.jsonl"


def cli(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def mc(t: int = 0, n: int = 1000, ids: str = "[1, 2]") -> str:
    return f'{{"timestamp": {t}, "input_length": {n}, "output_length": 5, "hash_ids": {ids}}}\n'


def rows(text: str) -> dict[str, list[str]]:
    """A table's body rows by their first cell."""
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]
    return {c[0]: c[1:] for c in cells if c}


def user_error(r) -> list[str]:
    """The lines of a user error (exit 2, no traceback): from the line starting ``error:`` (its prefix taken off)
    to the end."""
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and "please report" not in r.output
    lines = r.output.strip().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("error: "))
    return [lines[at].removeprefix("error: ")] + lines[at + 1:]


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    out = tmp_path_factory.mktemp("sim") / "out"
    return cli("simulate", MOONCAKE, "--out", out), out


@pytest.fixture(scope="module")
def costed(tmp_path_factory):
    out = tmp_path_factory.mktemp("cost") / "out"
    return cli("simulate", MOONCAKE, "--model", "llama-3.1-8b", "--gpu-price", "2", "--host-price", "0.001",
               "--out", out), out


def test_simulate_prints_the_ceiling_and_the_published_rows(simulated):
    r, out = simulated
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0] == ("trace: conversation_trace.jsonl (mooncake, 512 tokens per block): 12,031 requests over "
                        "3,537 s, mean prompt 12,035 tokens, mean output 343; 288,500 block visits, 182,790 "
                        "distinct blocks (93,588,480 tokens)")
    assert "unlimited cache (lru): hit rate of blocks 0.366, of tokens 0.374" in lines
    table = rows(r.output)
    assert table["10,000"] == ["5,120,000", "0.211", "0.215"]
    assert table["100,000"] == ["51,200,000", "0.364", "0.371"]
    assert table["182,790"] == ["93,588,480", "0.366", "0.374"]  # the unlimited cache closes the table
    assert lines[-1] == f"simulation: {out}/simulation.csv, {out}/simulation.json, {out}/simulation.png"


def test_simulate_writes_the_curve_as_json_csv_and_png(simulated):
    _, out = simulated
    doc = json.loads((out / "simulation.json").read_text())
    assert set(doc) == {"trace", "policy", "definitions", "model", "tp", "dtype", "kv_bytes_per_token", "ceiling",
                        "tiers", "curve"}
    assert doc["trace"] | {"duration_s": round(doc["trace"]["duration_s"], 3)} == {
        "source": "conversation_trace.jsonl", "format": "mooncake", "block_tokens": 512, "requests": 12_031,
        "duration_s": 3536.999, "block_visits": 288_500, "distinct_blocks": 182_790, "prompt_tokens": 144_793_823,
        "output_tokens": 4_122_048, "notes": []}
    assert (doc["policy"], doc["model"], doc["kv_bytes_per_token"], doc["tiers"]) == ("lru", None, None, [])
    assert doc["ceiling"]["hit_rate_blocks"] == pytest.approx(0.366, abs=5e-4)
    assert doc["ceiling"]["hit_rate_tokens"] == pytest.approx(0.374, abs=5e-4)
    curve = doc["curve"]
    assert set(curve[0]) == {"capacity_blocks", "capacity_tokens", "capacity_bytes", "hit_rate_blocks",
                             "hit_rate_tokens", "hit_blocks", "hit_tokens"}
    caps = [row["capacity_blocks"] for row in curve]
    assert caps == sorted(set(caps)) and caps[0] == 1 and caps[-1] == 182_790
    assert all(row["capacity_tokens"] == 512 * row["capacity_blocks"] and row["capacity_bytes"] is None
               for row in curve)
    rates = [row["hit_rate_blocks"] for row in curve]
    assert rates == sorted(rates)  # LRU is a stack algorithm: more capacity never hits less
    last = curve[-1]
    assert (last["hit_rate_blocks"], last["hit_rate_tokens"]) == pytest.approx(
        (doc["ceiling"]["hit_rate_blocks"], doc["ceiling"]["hit_rate_tokens"]), abs=1e-9)
    assert last["hit_blocks"] == round(last["hit_rate_blocks"] * 288_500)
    with open(out / "simulation.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [int(row["capacity_blocks"]) for row in table] == caps
    assert float(table[-1]["hit_rate_tokens"]) == pytest.approx(last["hit_rate_tokens"])
    assert (out / "simulation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_with_prices_shows_the_cost_table_its_knee_and_advice(costed):
    r, out = costed
    assert r.exit_code == 0, r.output
    table = rows(r.output.split("cost per host tier size at 2 USD per GPU-hour, host 0.001 and disk 0 USD per "
                                "GiB-hour")[1])
    assert list(table)[0] == "none"
    knees = [size for size, cells in table.items() if cells[-1] == "knee"]
    assert len(knees) == 1
    assert "16.00 GiB" in table and table["16.00 GiB"][0] == "131,072"  # 16 GiB of llama-3.1-8b's bf16 KV
    advice = [line for line in r.output.splitlines() if line.startswith("Buy")]
    assert len(advice) == 1 and "conversation_trace.jsonl (12,031 requests), llama-3.1-8b on 1× h100" in advice[0]
    doc = json.loads((out / "simulation.json").read_text())
    cost = doc["cost"]
    assert (doc["kv_bytes_per_token"], cost["gpu_per_hour"], cost["host_per_gib_hour"]) == (131_072, 2.0, 0.001)
    assert cost["advice"] == advice[0] and len(cost["rows"]) == len(table)
    knee_row = [row for row in cost["rows"] if row["host_bytes"] == cost["knee_host_bytes"]]
    assert len(knee_row) == 1
    assert doc["curve"][0]["capacity_bytes"] == 512 * 131_072


def test_gpu_price_without_a_model_fails_before_anything_is_read(tmp_path):
    r = cli("simulate", MOONCAKE, "--gpu-price", "2", "--out", tmp_path / "out")
    assert r.output.startswith("error: ")
    assert user_error(r) == ["--gpu-price needs --model: the cost is the model's time and its KV's memory"]
    assert not (tmp_path / "out").exists()


def test_a_faulty_trace_exits_2_with_one_line_per_fault(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(mc() + mc(-1) + "{nope\n" + mc(n=5000) + mc(ids='[1, "2"]'))
    r = cli("simulate", bad, "--out", tmp_path / "out")
    assert user_error(r) == [
        f"{bad}: line 2: timestamp must be a number of at least 0, not -1",
        f"{bad}: line 3: not a valid JSON line (unexpected character, expected a string key: line 1 column 2 (char 1))",
        f"{bad}: line 4: 2 hash_ids for input_length 5000: ceil(5000 / 512) = 10 expected",
        f'{bad}: line 5: hash_ids must be whole numbers that fit in 64 bits, not "2"']
    assert not (tmp_path / "out").exists()
    assert user_error(cli("trace", "check", bad))[0] == f"{bad}: line 2: timestamp must be a number of at least 0, " \
                                                        "not -1"


def test_a_folder_and_a_missing_file_are_user_errors(tmp_path):
    assert user_error(cli("simulate", tmp_path, "--out", tmp_path / "o")) == [f"{tmp_path}: not a regular file"]
    missing = tmp_path / "absent.jsonl"
    assert user_error(cli("trace", "check", missing)) == [f"{missing}: cannot read the file: No such file or "
                                                          "directory"]


def test_simulate_refuses_an_out_folder_that_is_a_symbolic_link(tmp_path):
    trace, target, link = tmp_path / "t.jsonl", tmp_path / "target", tmp_path / "link"
    trace.write_text(mc() + mc(10))
    target.mkdir()
    link.symlink_to(target)
    r = cli("simulate", trace, "--out", link)
    assert user_error(r)[-1] == (f"{link} is a symbolic link: kvbench writes, truncates and locks only files it "
                                 "made; remove the link (or copy what it points to in its place)")
    assert list(target.iterdir()) == []


def test_synthesize_is_the_same_for_the_same_seed_and_reads_back(tmp_path):
    first, second = tmp_path / "a.jsonl", tmp_path / "b" / "b.jsonl"
    for path in (first, second):
        r = cli("trace", "synthesize", MOONCAKE, "--requests", 500, "--seed", 3, "--out", path)
        assert r.exit_code == 0, r.output
        assert r.output.splitlines()[0] == ("synthesized from conversation_trace.jsonl (seed 3, copies 1, speedup "
                                            "1): mooncake, 512 tokens per block")
        assert r.output.splitlines()[-1] == f"trace: {path}"
    assert first.read_bytes() == second.read_bytes()
    other = tmp_path / "c.jsonl"
    assert cli("trace", "synthesize", MOONCAKE, "--requests", 500, "--seed", 4, "--out", other).exit_code == 0
    assert other.read_bytes() != first.read_bytes()
    r = cli("trace", "check", first)
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0] == "a.jsonl: mooncake, 512 tokens per block"
    assert lines[1].startswith("500 requests over ")
    assert len(first.read_text().splitlines()) == 500


def test_synthesize_replaces_a_link_at_out_and_refuses_a_linked_folder(tmp_path):
    """write_trace's docstring: a link at the file is replaced (never written through); a linked folder refused."""
    source, kept = tmp_path / "t.jsonl", tmp_path / "kept.txt"
    source.write_text(mc() + mc(10, ids="[1, 3]"))
    kept.write_text("not yours\n")
    link = tmp_path / "out.jsonl"
    link.symlink_to(kept)
    assert cli("trace", "synthesize", source, "--requests", 3, "--out", link).exit_code == 0
    assert kept.read_text() == "not yours\n" and not link.is_symlink() and len(link.read_text().splitlines()) == 3
    folder, target = tmp_path / "folder", tmp_path / "target"
    target.mkdir()
    folder.symlink_to(target)
    r = cli("trace", "synthesize", source, "--requests", 3, "--out", folder / "s.jsonl")
    assert user_error(r)[-1].startswith(f"{folder} is a symbolic link: ")
    assert list(target.iterdir()) == []


def test_synthesize_takes_64_bit_hash_ids(tmp_path):
    """Ids spanning more than 2^63 (hashes) ended in an OverflowError traceback: ids are now renumbered."""
    source = tmp_path / "hashed.jsonl"
    big, low = 9_000_000_000_000_000_000, -9_000_000_000_000_000_000
    source.write_text(mc(0, ids=f"[{big}, 5]") + mc(10, ids=f"[{big}, {low}]") + mc(20, ids=f"[{big}, 7]"))
    out = tmp_path / "s.jsonl"
    r = cli("trace", "synthesize", source, "--requests", 40, "--copies", 3, "--seed", 1, "--out", out)
    assert r.exit_code == 0, r.output
    made = [json.loads(line)["hash_ids"] for line in out.read_text().splitlines()]
    heads, tails = {ids[0] for ids in made}, [ids[1] for ids in made]
    assert 1 < len(heads) <= 3  # the shared first block, one id per copy
    assert len(set(tails)) == 40 and not heads & set(tails)  # every unique tail fresh


def test_report_of_a_simulation_prints_its_trace_ceiling_and_advice(simulated, costed):
    plain, priced = cli("report", simulated[1]), cli("report", costed[1] / "simulation.json")
    assert plain.exit_code == 0 and priced.exit_code == 0, plain.output + priced.output
    assert plain.output.splitlines()[:2] == [
        "trace conversation_trace.jsonl: 12,031 requests, 288,500 block visits, 182,790 distinct blocks of 512 "
        "tokens", "unlimited cache (lru): hit rate of blocks 0.366, of tokens 0.374"]
    assert plain.output.splitlines()[-1].startswith("not priced: kvbench simulate --model M --gpu-price P")
    assert priced.output.splitlines()[-1].startswith("Buy ")
    mixed = cli("report", simulated[1], "--out", simulated[1] / "x")
    assert mixed.exit_code == 2 and "a simulation (simulation.json) is only printed" in mixed.output
    (simulated[1] / "broken").mkdir(exist_ok=True)
    (simulated[1] / "broken" / "simulation.json").write_text('{"trace": 1}')
    broken = cli("report", simulated[1] / "broken")
    assert broken.exit_code == 2 and "not a simulation.json of kvbench simulate (no trace and ceiling)" in broken.output
