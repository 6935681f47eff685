"""Every value `validate` accepts is one `run` can use: booleans are not numbers, whole numbers are bounded (the
bound in the message), byte sizes finite, names safe for the run directory, paths without NUL bytes."""

from __future__ import annotations

import pytest
import yaml

from conftest import tiny_scenario
from kvbench.scenario import ScenarioError, load_scenario

CASES = [
    # the values
    ({"budget": True}, "budget", "must be a number of bytes or a size such as 512MiB, not a boolean (got True)"),
    ({"seed": True}, "seed", "Input should be a valid integer (got True)"),
    ({"repeats": 10**12}, "repeats", "Input should be less than or equal to 1000 (got 1000000000000)"),
    ({"seed": 1e30}, "seed", "Input should be a valid integer (got 1e+30)"),
    ({"seed": 10**30}, "seed", "Input should be less than 4294967296 (got 1000000000000000000000000000000)"),
    ({"name": "a" * 300}, "name", "must be at most 100 characters (it names the run directory; got 300) (got "
                                  f"'{'a' * 79}… (302 characters))"),
    # the rest of the schema
    ({"name": ".hidden"}, "name", "must be letters, digits, '_', '.' and '-', starting with a letter, digit or '_' "
                                  "(it names the run directory) (got '.hidden')"),
    ({"seed": -1}, "seed", "Input should be greater than or equal to 0 (got -1)"),
    ({"warmup": 101}, "warmup", "Input should be less than or equal to 100 (got 101)"),
    ({"max_new_tokens": 2**24 + 1}, "max_new_tokens", "Input should be less than or equal to 16777216 (got 16777217)"),
    ({"prompt_tokens": [8, 2**30]}, "prompt_tokens[1]", "Input should be less than or equal to 16777216 (got "
                                                        "1073741824)"),
    ({"batch_sizes": [1, 10**8]}, "batch_sizes[1]", "Input should be less than or equal to 4096 (got 100000000)"),
    ({"budget": float("inf")}, "budget", "must be a finite number of bytes or a size such as 512MiB (got inf)"),
    ({"budget": float("nan")}, "budget", "must be a finite number of bytes or a size such as 512MiB (got nan)"),
    # from the re-attack: pydantic's ByteSize read only a prefix ('5.GiB' was 5 bytes, '1,5GiB' 1)
    ({"budget": "5.GiB"}, "budget", "'5.GiB' is not a size: give bytes or a number and a unit, such as 512MiB or "
                                    "1.5GB (got '5.GiB')"),
    ({"budget": "1,5GiB"}, "budget", "'1,5GiB' is not a size: give bytes or a number and a unit, such as 512MiB or "
                                     "1.5GB (got '1,5GiB')"),
    ({"budget": "1.5.5GiB"}, "budget", "'1.5.5GiB' is not a size: give bytes or a number and a unit, such as 512MiB "
                                       "or 1.5GB (got '1.5.5GiB')"),
    ({"budget": "١٠GB"}, "budget", "'١٠GB' is not a size: give bytes or a number and a unit, such "
                                             "as 512MiB or 1.5GB (got '١٠GB')"),  # Arabic-Indic 10
    ({"budget": "²GiB"}, "budget", "'²GiB' is not a size: give bytes or a number and a unit, such as 512MiB "
                                        "or 1.5GB (got '²GiB')"),
    ({"budget": 1.5}, "budget", "1.5: a number of bytes is whole; give a unit for a fraction, such as 1.5GiB "
                                "(got 1.5)"),
    ({"budget": 2**61}, "budget", "must be at most 1,152,921,504,606,846,976 bytes (1 EiB) (got 2305843009213693952)"),
    ({"description": "two\nlines"}, "description", "must be one line without control characters (it is printed by "
                                                   "`kvbench list scenarios`) (got 'two\\nlines')"),
    ({"disk_dir": "a\0b"}, "disk_dir", "a path cannot hold a NUL byte (got 'a\\x00b')"),
    ({"monitor": {"interval_ms": 10**9}}, "monitor.interval_ms", "Input should be less than or equal to 60000 (got "
                                                                 "1000000000)"),
    ({"monitor": {"alert_device_bytes": False}}, "monitor.alert_device_bytes",
     "must be a number of bytes or a size such as 512MiB, not a boolean (got False)"),
    ({"workload": {"source": "synthetic", "n_prompts": 10**8}}, "workload.n_prompts",
     "Input should be less than or equal to 10000 (got 100000000)"),
    ({"workload": {"source": "synthetic", "seed": True}}, "workload.seed", "Input should be a valid integer (got True)"),
    ({"model": {"preset": "tiny-llama", "weights": "random", "trust_remote_code": "yes"}}, "model.trust_remote_code",
     "Input should be a valid boolean (got 'yes')"),
    ({"modes": [{"kind": "hierarchical", "window": True}]}, "modes[0].window", "Input should be a valid integer (got "
                                                                              "True)"),
    ({"modes": [{"kind": "full", "host_max_tokens": 2**40}]}, "modes[0].host_max_tokens",
     "Input should be less than or equal to 4294967296 (got 1099511627776)"),
    ({"batch_sizes": "auto", "budget": "1MiB", "capacity": {"max": 10**6}}, "capacity",
     "max 1000000 is more than the largest batch, 4096"),
    ({"prompt_tokens": list(range(1, 101)), "batch_sizes": list(range(1, 101)), "repeats": 20}, "repeats",
     "100 prompt lengths × 100 batch sizes × 1 modes × 20 repeats is 200,000 trials, more than 100,000"),
]


@pytest.mark.parametrize("over,path,msg", CASES, ids=[c[1] + "-" + repr(next(iter(c[0].values())))[:20] for c in CASES])
def test_values_run_cannot_use_are_refused_naming_key_and_bound(write_yaml, over, path, msg):
    with pytest.raises(ScenarioError) as info:
        load_scenario(write_yaml(tiny_scenario(**over)))
    assert (path, msg) in info.value.problems


def test_doc_qa_ratio_is_bounded(write_yaml):
    wl = {"source": "files", "files": "*.txt", "doc_qa": {"hit_miss_ratio": "1:100000000"}}
    with pytest.raises(ScenarioError) as info:
        load_scenario(write_yaml(tiny_scenario(workload=wl, prompt_tokens=None, batch_sizes=None)))
    assert ("workload.doc_qa.hit_miss_ratio",
            "must be 'H:M' with whole numbers from 0 to 999, H ≥ 1, e.g. '3:1' (got '1:100000000')") in info.value.problems


def test_files_matching_only_a_device_are_refused(write_yaml):
    wl = {"source": "files", "files": "/dev/null"}
    with pytest.raises(ScenarioError) as info:
        load_scenario(write_yaml(tiny_scenario(workload=wl, model={"preset": "tiny-llama", "weights": "random",
                                                                    "tokenizer": "smollm2-135m"})))
    assert info.value.problems == [("workload.files", "the pattern '/dev/null' matches no regular file (only "
                                                      "/dev/null: give text files)")]


def test_the_bounds_themselves_are_accepted(write_yaml):
    s = load_scenario(write_yaml(tiny_scenario(seed=2**32 - 1, repeats=1000, warmup=100, name="a" * 100,
                                               budget=2**60, workload={"source": "synthetic", "n_prompts": 4,
                                                                       "seed": 0})))
    assert (s.seed, s.repeats, s.warmup, len(s.name), int(s.budget)) == (2**32 - 1, 1000, 100, 100, 2**60)


def test_plan_refuses_a_size_it_would_read_only_in_part():
    """`plan --gpu-mem 5.GiB` planned for a 5-byte GPU ('GPU 0.00 MiB', exit 0)."""
    from typer.testing import CliRunner

    from kvbench.cli import app

    r = CliRunner().invoke(app, ["plan", "llama-3.1-8b", "--gpu-mem", "5.GiB"])
    assert r.exit_code == 2 and "--gpu-mem '5.GiB': give bytes or a size such as 80GiB, 512GB" in r.output, r.output
    r = CliRunner().invoke(app, ["plan", "llama-3.1-8b", "--gpu-mem", "1.5"])  # 1 byte, it was
    assert r.exit_code == 2 and "--gpu-mem '1.5': give bytes" in r.output, r.output
    r = CliRunner().invoke(app, ["plan", "llama-3.1-8b", "--gpu-mem", "1.5GiB"])
    assert r.exit_code == 0 and "GPU 1.50 GiB" in r.output, r.output


def test_a_model_config_that_is_not_a_file_says_what_it_is(write_yaml, tmp_path):
    """From the re-attack: `model.config: '.'` (or '/', '/dev/zero') said '<dir>/. does not exist'."""
    for config, says in ((".", "is a directory: model.config is the config.json file (or give the directory as "
                               "model.name)"),
                         ("/dev/zero", "is not a regular file: model.config is a config.json file"),
                         ("nope.json", "does not exist")):
        path = write_yaml(tiny_scenario(model={"config": config, "weights": "random"}))
        with pytest.raises(ScenarioError) as caught:
            load_scenario(path)
        assert [k for k, _ in caught.value.problems] == ["model.config"], caught.value.problems
        assert says in caught.value.problems[0][1], caught.value.problems


def test_remote_code_needs_a_model_directory(write_yaml, tmp_path):
    """From the re-attack: `model: {config: DIR/config.json, weights: random, trust_remote_code: true}` passed
    validate, then `run --trust-remote-code` failed in transformers (HFValidationError about a repo id)."""
    config = tmp_path / "config.json"
    config.write_text("{}")
    path = write_yaml(tiny_scenario(model={"config": str(config), "weights": "random", "trust_remote_code": True}))
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert caught.value.problems == [("model", "trust_remote_code: a config brings no code of its own (transformers "
                                               "loads a model's code from its directory): give the directory as "
                                               "model.name, or set it false")]


def test_yaml_numbers_python_cannot_read_and_hostile_model_configs_are_scenario_errors(write_yaml, tmp_path):
    """From the second re-attack: a YAML integer of 4,400 digits (Python's int() limit) and a config.json nested
    100,000 deep gave tracebacks in validate and run; a 2 GB sparse config.json was read whole (4.2 GB)."""
    text = (tmp_path / "s.yaml")
    import yaml as _yaml

    text.write_text(_yaml.safe_dump(tiny_scenario()) + "description: 1" + "0" * 4400 + "\n")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(text)
    assert caught.value.problems[0][0] == "" and "invalid YAML: a value kvbench cannot read (Exceeds the limit " \
        "(4300 digits)" in caught.value.problems[0][1], caught.value.problems
    deep, big = tmp_path / "deep.json", tmp_path / "big.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with open(big, "wb") as f:
        f.truncate(2 << 30)
    for config, says in ((deep, "not valid JSON (nested more than 100 levels deep)"),
                         (big, "the file is over 16,777,216 bytes")):
        path = write_yaml(tiny_scenario(model={"config": str(config), "weights": "random"}))
        with pytest.raises(ScenarioError) as caught:
            load_scenario(path)
        assert caught.value.problems == [("model.config", f"cannot read the model's config: {config}: {says}")], \
            caught.value.problems


@pytest.mark.parametrize("over", [{"repeats": "HEX"}, {"prompt_tokens": [32, "HEX"]}, {"budget": "HEX"}])
def test_a_huge_hex_integer_is_echoed_by_its_size(write_yaml, over):
    """From the third re-attack: 0x followed by 5,000 digits is read by YAML, then repr() of it (more than 4,300
    decimal digits) raised a ValueError traceback while echoing the bad value."""
    text = yaml.safe_dump(tiny_scenario(**over)).replace("HEX", "0x" + "9" * 5000)
    path = write_yaml(text)
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    assert "<an integer of about 6,0" in str(caught.value), str(caught.value)
