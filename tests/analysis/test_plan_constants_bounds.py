"""`kvbench plan --constants` reads its map.json as every input is read (kvbench.safe_read): a FIFO or /dev/zero
refused unread, 401-digit integers and 100,000-deep nesting refused with one line, a runs list of any length
counted rather than shown (a 2 MB one took 43-64 s), constants and prompt lengths bounded."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvbench.analysis.plan_break_even import measured_constants
from kvbench.cli import app
from kvbench.errors import BadValue


def _refused(args: list[str], message: str) -> None:
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    assert res.output.replace("\n", " ").strip().endswith(message), res.output


VALUES = {"overhead_s": 0.01, "prefill_s_per_token": 1e-4, "attention_s_per_token_pair": 1e-9,
          "restore_host_s_per_token": 1e-6, "decode_s": 0.02, "decode_s_per_context_token": 1e-7}


def _map_json(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "map.json"
    p.write_text(text)
    return p


@pytest.mark.parametrize("make, why", [
    (lambda d: os.mkfifo(d / "fifo.json") or d / "fifo.json", "not a regular file"),
    (lambda d: Path("/dev/zero"), "not a regular file"),
    (lambda d: _map_json(d, json.dumps({"constants": [{"values": {**VALUES, "decode_s": 10**400}}]})),
     "not a file kvbench reads: an integer of 401 digits (at most 300 are read): 100000000000..."),
    (lambda d: _map_json(d, '{"constants": ' + "[" * 5_000 + "]" * 5_000 + "}"),
     "not valid JSON (nested more than 100 levels deep)"),
    (lambda d: _map_json(d, '{"constants": ' + "[" * 100_000 + "]" * 100_000 + "}"),
     "not a file kvbench reads: 100,001 '{' and '[' (at most 65,536 lists and objects in a file of at most "
     "4,194,304 bytes)"),
    (lambda d: _map_json(d, '{"constants": [' + ",".join(['{"a":' * 96 + "1" + "}" * 96] * 4_000) + "]}"),
     "not a file kvbench reads: 384,002 '{' and '[' (at most 65,536 lists and objects in a file of at most "
     "4,194,304 bytes)"),  # 16 MiB of these took 39 s and 1.25 GB before it was refused
    (lambda d: _map_json(d, json.dumps({"constants": [{}] * 2_000_000})),
     "the file is over 4,194,304 bytes"),
    (lambda d: _map_json(d, json.dumps({"constants": [{"values": {**VALUES, "x" * 500: 1.0}}]})),
     f"constants[0].values.{'x' * 117}...: not a constant of kvbench map (its constants: overhead_s, "
     "prefill_s_per_token, attention_s_per_token_pair, restore_host_s_per_token, restore_disk_s_per_token, "
     "restore_cache_s_per_token, decode_s, decode_s_per_context_token)"),
    (lambda d: _map_json(d, json.dumps({"constants": [{"values": VALUES, "prompt_tokens": [2048, 2**40]}]})),
     "constants[0].prompt_tokens: must be [shortest, longest] prompt tokens, each 1 to 16,777,216, not "
     "[2048, 1099511627776]"),
    (lambda d: _map_json(d, json.dumps({"constants": [{"values": VALUES, "busy": "true"}]})),
     "constants[0].busy: must be true or false, not 'true'"),  # read as quiet before: used as measured
    (lambda d: _map_json(d, json.dumps({"constants": [{"values": VALUES, "busy": 1}]})),
     "constants[0].busy: must be true or false, not 1"),
])
def test_a_constants_file_is_read_bounded(tmp_path, make, why):
    path = make(tmp_path)
    with pytest.raises(BadValue) as exc:
        measured_constants(path)
    assert str(exc.value) == f"{path}: " + ("" if why.startswith("constants[") else "not a map.json of kvbench "
                                                                                    "map: ") + why


def test_a_fifo_given_to_plan_constants_is_one_line(tmp_path):
    os.mkfifo(tmp_path / "map.json")
    _refused(["plan", "smollm2-135m", "--gpu", "h100", "--gpu-price", "2", "--constants", str(tmp_path / "map.json")],
             f"error: {tmp_path / 'map.json'}: not a map.json of kvbench map: not a regular file")


def test_a_long_runs_list_is_counted_not_shown(tmp_path):
    runs = [f"results/run-{i:06d}" for i in range(100_000)] + ["r" * 1_000_000]
    path = _map_json(tmp_path, json.dumps({"constants": [{"group": "g" * 10_000, "mode_label": "m", "values": VALUES,
                                                          "runs": runs}]}))
    c = measured_constants(path)
    assert c.source["decode_s"] == (f"measured: {'g' * 117}... m, runs results/run-000000, results/run-000001, "
                                    "results/run-000002 and 99,998 more")
