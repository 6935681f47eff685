"""Scenario schema: every error names the file, the key path, the bad value and what is allowed."""

from __future__ import annotations

import subprocess

import pytest
from typer.testing import CliRunner

from conftest import ROOT, kvbench_cmd, tiny_scenario
from kvbench.cli import app
from kvbench.scenario import ScenarioError, load_scenario, parse_scenario


def error_of(write_yaml, data) -> ScenarioError:
    path = write_yaml(data)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    return info.value


def test_valid_tiny_scenario_loads(write_yaml):
    s = load_scenario(write_yaml(tiny_scenario(budget="2GiB")))
    assert s.budget == 2 * 2**30
    assert s.model.preset == "tiny-llama" and s.workload.source == "synthetic"
    assert [m.label for m in s.modes] == ["none"]


def test_unknown_top_level_key_names_file_key_and_allowed_keys(write_yaml):
    data = tiny_scenario()
    data["prompt_tokenz"] = [8]
    err = error_of(write_yaml, data)
    assert str(err) == (
        f"{err.file}: prompt_tokenz: unknown key 'prompt_tokenz'; did you mean 'prompt_tokens'? allowed keys: name, "
        "description, model, device, engine, load, workload, prompt_tokens, max_new_tokens, batch_sizes, modes, "
        "repeats, warmup, budget, capacity, quality, store, monitor, disk_dir, disk, seed, executor, placement"
    )
    assert err.file.endswith("scenario.yaml")


def test_disk_key_is_strict_and_keeps_the_page_cache_only_when_asked(write_yaml):
    assert parse_scenario(tiny_scenario()).disk.page_cache is False  # honest by default
    assert load_scenario(write_yaml(tiny_scenario(disk={"page_cache": True}))).disk.page_cache is True
    err = error_of(write_yaml, tiny_scenario(disk={"page_cahce": True}))
    assert str(err) == f"{err.file}: disk.page_cahce: unknown key 'page_cahce'; did you mean 'page_cache'? allowed keys: page_cache"
    err = error_of(write_yaml, tiny_scenario(disk={"page_cache": "sometimes"}))
    assert err.problems == [("disk.page_cache", "Input should be a valid boolean (got 'sometimes')")]
    for lax in ("yes", 1):  # strict: a YAML true or false only
        err = error_of(write_yaml, tiny_scenario(disk={"page_cache": lax}))
        assert err.problems == [("disk.page_cache", f"Input should be a valid boolean (got {lax!r})")]


def test_unknown_key_inside_a_mode_lists_that_modes_keys(write_yaml):
    err = error_of(write_yaml, tiny_scenario(modes=[{"kind": "none"}, {"kind": "hierarchical", "windw": 64}]))
    assert ("modes[1].windw", "unknown key 'windw'; did you mean 'window'? allowed keys: kind, host_dtype, k_dtype, "
            "v_dtype, hadamard, window, host_max_tokens") in err.problems
    assert ("modes[1].window", "required key is missing") in err.problems


def test_negative_window_names_the_path_and_value(write_yaml):
    err = error_of(write_yaml, tiny_scenario(modes=[{"kind": "none"}, {"kind": "hierarchical", "window": -5}]))
    assert err.problems == [("modes[1].window", "Input should be greater than or equal to 0 (got -5)")]


def test_non_numeric_window(write_yaml):
    err = error_of(write_yaml, tiny_scenario(modes=[{"kind": "hierarchical", "window": "big"}]))
    assert err.problems == [
        ("modes[0].window", "Input should be a valid integer (got 'big')")
    ]


def test_unknown_mode_suggests_the_closest_name(write_yaml):
    err = error_of(write_yaml, tiny_scenario(modes=[{"kind": "none"}, {"kind": "nonee"}]))
    assert err.problems == [("modes[1]", "unknown mode 'nonee'; did you mean 'none'? "
                                       "available: none, hf-offloaded, full, hierarchical, dynamic")]


def test_dynamic_mode_bounds(write_yaml):
    s = load_scenario(write_yaml(tiny_scenario(modes=[{"kind": "dynamic"}])))
    assert s.modes[0].options == {"host_dtype": None, "k_dtype": None, "v_dtype": None, "hadamard": None,
                                  "min_window": 512, "max_window": None, "host_max_tokens": None}
    assert s.modes[0].label == "dynamic(min_window=512)"
    err = error_of(write_yaml, tiny_scenario(modes=[{"kind": "dynamic", "min_window": 600, "max_window": 500}]))
    assert err.problems == [("modes[0]", "min_window 600 is larger than max_window 500")]


def test_duplicate_modes_and_lengths(write_yaml):
    err = error_of(write_yaml, tiny_scenario(modes=[{"kind": "none"}, {"kind": "none"}], prompt_tokens=[8, 8]))
    assert ("modes", "duplicate mode(s) ['none']") in err.problems
    assert ("prompt_tokens", "duplicate value(s) [8] (got [8, 8])") in err.problems


def test_batch_larger_than_the_prompt_pool(write_yaml):
    err = error_of(write_yaml, tiny_scenario(batch_sizes=[1, 8]))
    assert err.problems == [("workload.n_prompts", "4 distinct prompts cannot fill a batch of 8; "
                                                   "set n_prompts to at least 8")]


RANDOM_WITH_TOKENIZER = {"preset": "tiny-llama", "weights": "random", "tokenizer": "smollm2-135m"}


def test_unknown_language_is_refused_before_scanning(write_yaml):
    err = error_of(write_yaml, tiny_scenario(workload={"source": "sharegpt", "language": "xx"},
                                             model=RANDOM_WITH_TOKENIZER))
    assert len(err.problems) == 1 and err.problems[0][0] == "workload.language"
    assert err.problems[0][1].startswith("'xx' is not a language langdetect can detect; known: af, ar, bg, bn,")


def test_a_language_without_langdetect_names_the_extra_that_installs_it(write_yaml, monkeypatch):
    import importlib.util

    from typer.testing import CliRunner

    from kvbench.cli import app

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "langdetect" else real(name, *a))
    path = write_yaml(tiny_scenario(workload={"source": "sharegpt", "language": "de"}, model=RANDOM_WITH_TOKENIZER))
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    says = ("needs langdetect, which is not installed: it is kvbench's optional 'lang' extra, pip install "
            "'kvbench[lang]' (in a checkout of kvbench: pip install -e '.[lang]')")
    assert info.value.problems == [("workload.language", says)]
    r = CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "400"})
    assert r.exit_code == 2 and "workload.language" in r.output and says in " ".join(r.output.split()), r.output


def test_booleans_strings_and_zero_budget_are_not_numbers(write_yaml):
    err = error_of(write_yaml, tiny_scenario(prompt_tokens=[True], max_new_tokens="4", budget=0))
    assert ("prompt_tokens[0]", "Input should be a valid integer (got True)") in err.problems
    assert ("max_new_tokens", "Input should be a valid integer (got '4')") in err.problems
    assert ("budget", "must be more than 0 bytes (got 0)") in err.problems
    err = error_of(write_yaml, tiny_scenario(budget=-1))
    assert err.problems == [("budget", "must be more than 0 bytes (got -1)")]


def test_duplicate_yaml_key_and_empty_file(write_yaml):
    path = write_yaml("name: a\nname: b\n")
    with pytest.raises(ScenarioError, match=r"line 2, column 1: invalid YAML: duplicate key 'name'"):
        load_scenario(path)
    with pytest.raises(ScenarioError, match=r"the file is empty; a scenario needs at least name, model"):
        load_scenario(write_yaml(""))


def test_new_tokens_alone_exceeding_the_context(write_yaml):
    err = error_of(write_yaml, tiny_scenario(max_new_tokens=3000))
    assert err.problems == [("max_new_tokens",
                             "3000 new tokens alone reach the model's max_position_embeddings 2048")]


def test_disk_tier_options(write_yaml, tmp_path, monkeypatch):
    err = error_of(write_yaml, tiny_scenario(modes=[{"kind": "full", "host_max_tokens": 4}]))
    assert err.problems == [("modes[0].host_max_tokens", "4 tokens is less than one disk block; the host tier "
                                                         "must hold at least 16 tokens")]
    modes = [{"kind": "hierarchical", "window": 8, "host_max_tokens": 16}]
    (tmp_path / "afile").write_text("x")
    err = error_of(write_yaml, tiny_scenario(modes=modes, disk_dir="afile"))
    assert err.problems == [("disk_dir", f"{tmp_path / 'afile'} is not a directory")]
    err = error_of(write_yaml, tiny_scenario(modes=modes, disk_dir="nope"))
    assert err.problems == [("disk_dir", f"{tmp_path / 'nope'} does not exist")]
    (tmp_path / "kv").mkdir()
    s = load_scenario(write_yaml(tiny_scenario(modes=modes, disk_dir="kv")))  # relative to the scenario file
    assert s.disk_dir == str(tmp_path / "kv")
    assert list((tmp_path / "kv").iterdir()) == []  # the check's trial directory is gone
    monkeypatch.setenv("HOME", str(tmp_path))
    assert load_scenario(write_yaml(tiny_scenario(modes=modes, disk_dir="~/kv"))).disk_dir == str(tmp_path / "kv")
    # a directory no file can be made in, even by root (os.access says yes): checked by making one
    err = error_of(write_yaml, tiny_scenario(modes=modes, disk_dir="/proc"))
    [(key, why)] = err.problems  # the reason is the system's (ENOENT as root, EACCES otherwise)
    assert key == "disk_dir" and why.startswith("/proc is not writable: ")


def test_validate_warns_about_the_articles_bad_configs(write_yaml):
    import psutil

    too_many = psutil.virtual_memory().total // (2 * 2 * 2 * 16 * 4) + 1  # tiny-llama: 256 B of KV per token
    path = write_yaml(tiny_scenario(modes=[{"kind": "hierarchical", "window": 64},
                                           {"kind": "dynamic", "min_window": 0, "max_window": 128},
                                           {"kind": "full", "host_max_tokens": too_many}]))
    r = CliRunner().invoke(app, ["validate", str(path)])
    assert r.exit_code == 0, r.stderr
    lines = [" ".join(x.split()) for x in r.stderr.split("warning:")[1:]]
    assert lines[0] == (f"{path}: modes[0].window: 64 tokens is under 256: most of the history crosses the host "
                        "link every step (transfer churn)")
    assert lines[1].startswith(f"{path}: modes[2].host_max_tokens: {too_many} tokens × batch 2 is ")
    assert lines[1].endswith("of memory: host memory runs out before the disk tier is used")
    assert len(lines) == 2
    # tiny-llama: one layer's K and V = 256 B per token; 16 + 3 - 1 tokens × batch 2 = 9216 B > 1000
    path = write_yaml(tiny_scenario(budget=1000, modes=[{"kind": "none"}, {"kind": "full"}]), "small.yaml")
    r = CliRunner().invoke(app, ["validate", str(path)])
    assert " ".join(r.stderr.split()) == (
        f"warning: {path}: budget: 1000 bytes is less than even full offload holds on the device at 16 prompt tokens "
        "× batch 2 (one layer's K and V: 9216 bytes): those trials will be over budget")


def test_empty_model_mapping(write_yaml):
    err = error_of(write_yaml, tiny_scenario(model=None))
    assert err.problems == [("model", "expected a mapping of keys (got None)")]


def test_bad_budget_says_what_a_size_looks_like(write_yaml):
    err = error_of(write_yaml, tiny_scenario(budget="2 gigs"))
    assert err.problems == [
        ("budget", "could not interpret byte unit: gigs (got '2 gigs'); give bytes or a size such as 2GiB, 512MiB, 1.5GB")
    ]


def test_bad_device(write_yaml):
    err = error_of(write_yaml, tiny_scenario(device="gpu"))
    assert err.problems == [("device", "must be auto, cpu, cuda or cuda:N (got 'gpu')")]


def test_missing_key_and_bad_literal(write_yaml):
    data = tiny_scenario(workload={"source": "reddit"})
    del data["max_new_tokens"]
    err = error_of(write_yaml, data)
    assert ("max_new_tokens", "required key is missing") in err.problems
    assert ("workload.source", "got 'reddit'; input should be 'sharegpt', 'files' or 'synthetic'") in err.problems


def test_prompt_longer_than_the_context_is_refused_before_any_trial(write_yaml):
    # tiny-llama has max_position_embeddings 2048
    err = error_of(write_yaml, tiny_scenario(prompt_tokens=[8, 2040], max_new_tokens=16))
    assert err.problems == [
        ("prompt_tokens[1]", "2040 tokens + max_new_tokens 16 exceeds the model's max_position_embeddings 2048; "
                             "the longest prompt allowed is 2032")
    ]


def test_model_errors(write_yaml):
    err = error_of(write_yaml, tiny_scenario(model={"preset": "llama-3-8b", "weights": "random"}))
    assert err.problems[0][0] == "model"
    assert err.problems[0][1].startswith("unknown preset 'llama-3-8b'; did you mean 'llama-3.1-8b'? available: gemma-2-9b")
    err = error_of(write_yaml, tiny_scenario(model={"preset": "tiny-llama"}))
    assert err.problems == [("model", "a preset has no weights: set weights: random")]
    err = error_of(write_yaml, tiny_scenario(model="no/such-model"))
    assert err.problems == [
        ("model.name", "the hub id 'no/such-model' is not in the local cache; kvbench never downloads at run time")
    ]


def test_random_weights_with_text_workload_needs_a_tokenizer(write_yaml):
    err = error_of(write_yaml, tiny_scenario(workload={"source": "sharegpt"}))
    assert err.problems == [
        ("model.tokenizer", "a random-weights model has no tokenizer: set model.tokenizer (e.g. smollm2-135m) "
                            "or use workload.source: synthetic")
    ]


def test_files_glob_matching_nothing(write_yaml):
    err = error_of(write_yaml, tiny_scenario(workload={"source": "files", "files": "nothing/*.txt"},
                                             model=RANDOM_WITH_TOKENIZER))
    assert len(err.problems) == 1 and err.problems[0][0] == "workload.files"
    assert err.problems[0][1].endswith("nothing/*.txt' matches no file")


def test_yaml_syntax_error_names_line_and_column(write_yaml):
    path = write_yaml("name: x\nmodes: [\n  {kind: none\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert str(info.value).startswith(f"{path}: line 4, column 1: invalid YAML:")


def test_not_a_mapping_and_missing_file(tmp_path, write_yaml):
    with pytest.raises(ScenarioError, match=r"the file must hold a mapping of keys, not list"):
        load_scenario(write_yaml("- 1\n- 2\n"))
    with pytest.raises(ScenarioError, match=r"nope.yaml: cannot read the file: No such file or directory"):
        load_scenario(tmp_path / "nope.yaml")


def test_shipped_scenarios_are_valid():
    for name in ("smoke", "quick", "dialogue", "mid_doc", "long_doc"):
        s = load_scenario(ROOT / "scenarios" / f"{name}.yaml")
        assert s.name == name and s.model.name == "smollm2-135m"
    assert parse_scenario(tiny_scenario()).repeats == 2


def test_validate_command_reports_every_bad_file(write_yaml, tmp_path):
    good = write_yaml(tiny_scenario(), "good.yaml")
    bad = write_yaml(tiny_scenario(device="tpu"), "bad.yaml")
    r = CliRunner().invoke(app, ["validate", str(good), str(bad)])
    assert r.exit_code == 2  # bad input, as `run` exits for the same file
    assert f"{good}: ok (8 trials: 2 prompt lengths × 2 batch sizes × 1 mode × 2 repeats)" in r.stdout
    assert f"{bad}: device: must be auto, cpu, cuda or cuda:N (got 'tpu')" in r.stderr


@pytest.mark.e2e
def test_help_does_not_import_torch():
    code = ("import sys\nfrom kvbench.cli import app\n"
            "try:\n    app(['--help'])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'torch imported'\nprint('no torch')")
    r = subprocess.run([kvbench_cmd()[0], "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("no torch")


HOSTILE = ROOT / "tests" / "data" / "hostile"


@pytest.mark.e2e
def test_a_yaml_alias_bomb_is_refused_at_once():
    """A 450-byte "billion laughs" (9⁹ values once its aliases expand): refused in well under a second, echoing
    nothing of the expanded value, by validate and by run (exit 2, no run directory)."""
    import time

    from kvbench.scenario import read_yaml

    t0 = time.monotonic()
    with pytest.raises(ScenarioError) as info:
        read_yaml(HOSTILE / "billion_laughs.yaml")
    assert time.monotonic() - t0 < 2
    assert info.value.problems == [("", "the file expands to more than 100,000 values through its aliases (*name): "
                                        "not a scenario")]
    r = subprocess.run([*kvbench_cmd(), "validate", str(HOSTILE / "billion_laughs.yaml")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "expands to more than 100,000 values" in r.stderr + r.stdout
    assert len(r.stderr + r.stdout) < 500


def test_text_encodings_utf8_utf16_with_bom_and_others_refused(write_yaml, tmp_path):
    import yaml

    from kvbench.scenario import read_yaml

    with pytest.raises(ScenarioError) as info:
        read_yaml(HOSTILE / "latin1.yaml")  # "café" in Latin-1
    assert info.value.problems == [("", "not UTF-8 text (byte 28: b'\\xe9'): save the file as UTF-8")]
    text = yaml.safe_dump(tiny_scenario(description="café"), allow_unicode=True)
    for codec in ("utf-16", "utf-8-sig"):  # Python's utf-16 writes a BOM
        p = tmp_path / f"{codec}.yaml"
        p.write_bytes(text.encode(codec))
        assert load_scenario(p).description == "café"
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (1 << 20) + b"\nname: x\n")
    with pytest.raises(ScenarioError, match=r"the file is over 1,048,576 bytes: not a scenario"):
        read_yaml(big)


def test_echoed_values_are_cut_short(write_yaml):
    err = error_of(write_yaml, tiny_scenario(max_new_tokens="x" * 5000))
    (where, msg), = err.problems
    assert where == "max_new_tokens" and len(msg) < 200 and msg.endswith("… (5,002 characters))")


def test_validate_reads_the_models_config_without_torch(tmp_path, write_yaml):
    """A preset (config.json) and the smollm2-135m GGUF are read by kvbench itself: no torch, no transformers."""
    tiny = write_yaml(tiny_scenario())
    code = ("import sys\nfrom kvbench.scenario import load_scenario\n"
            f"print(load_scenario({str(tiny)!r}).name, load_scenario({str(ROOT / 'scenarios' / 'smoke.yaml')!r}).name)\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    r = subprocess.run([kvbench_cmd()[0], "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["tiny smoke", "[]"]


def test_version_option_shows_no_metavar():
    r = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "100"})
    line = next(x for x in r.stdout.splitlines() if "--version" in x)
    assert line.split() == ["│", "--version", "Print", "the", "version.", "│"]


@pytest.mark.parametrize("command", [[], ["run"], ["report"], ["list"], ["models"], ["models", "export"]])
def test_help_options_show_no_metavar(command):
    r = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "100"})
    line = next(x for x in r.stdout.splitlines() if "--help" in x)
    assert line.split() == ["│", "--help", "Show", "this", "message", "and", "exit.", "│"]


def test_list_scenarios_elsewhere_points_to_dir_and_the_shipped_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["list", "scenarios"])
    assert r.exit_code == 2
    assert " ".join(r.stderr.split()) == (f"error: no scenario files (*.yaml) in {tmp_path.resolve() / 'scenarios'}: "
                                          f"pass --dir DIR; kvbench's own are in {ROOT / 'scenarios'}")
