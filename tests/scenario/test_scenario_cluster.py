"""The scenario keys `executor:` and `placement:` (kvbench/scenario/cluster.py) through the real loader, the
identity of a scenario across executors, and the `kvbench run` flags --executor and --address."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from conftest import tiny_scenario
from kvbench.cli import app
from kvbench.errors import BadParameter, ScenarioError
from kvbench.results.identity import scenario_digest
from kvbench.scenario import load_scenario
from kvbench.scenario.cluster import ExecutorSpec, PlacementSpec, override_executor


def problems_of(write_yaml, **over) -> list[tuple[str, str]]:
    with pytest.raises(ScenarioError) as info:
        load_scenario(write_yaml(tiny_scenario(**over)))
    return info.value.problems


def two_kinds(**over) -> dict:
    return {"placement": [{"accelerator_type": "H100"}, {"accelerator_type": "L4"}], **over}


def test_defaults_are_local_without_placement(write_yaml):
    s = load_scenario(write_yaml(tiny_scenario()))
    assert s.executor == ExecutorSpec() and s.executor.kind == "local" and s.executor.address is None
    assert (s.executor.cpus_per_worker, s.executor.workers, s.executor.startup_timeout_s) == (1.0, None, 600.0)
    assert s.placement is None and s.machines == []


def test_a_ray_executor_and_two_kinds_load(write_yaml):
    s = load_scenario(write_yaml(tiny_scenario(
        executor={"kind": "ray", "address": "10.0.0.5:6379", "workers": 2, "cpus_per_worker": 0.5,
                  "startup_timeout_s": 90},
        placement=[{"accelerator_type": "H100"}, {"name": "pcie4-l4", "accelerator_type": "L4"},
                   {"resources": {"gh200": 1}}, {"name": "big", "resources": {"ssd": 1, "ram_tb": 0.25}}])))
    assert (s.executor.kind, s.executor.address, s.executor.workers, s.executor.cpus_per_worker,
            s.executor.startup_timeout_s) == ("ray", "10.0.0.5:6379", 2, 0.5, 90.0)
    assert s.machines == ["H100", "pcie4-l4", "gh200", "big"]
    assert [p.ray_resources() for p in s.placement] == [
        {"accelerator_type:H100": 0.001}, {"accelerator_type:L4": 0.001}, {"gh200": 1.0}, {"ssd": 1.0, "ram_tb": 0.25}]


@pytest.mark.parametrize("address", ["auto", "head-node.cluster.local:6379", "[::1]:6379", "127.0.0.1:1",
                                     "h:65535"])
def test_good_addresses(write_yaml, address):
    assert load_scenario(write_yaml(tiny_scenario(executor={"kind": "ray", "address": address}))).executor.address \
        == address


@pytest.mark.parametrize("address, message", [
    ("ray://head:10001", "give HOST:PORT without a scheme (ray://): the address of the cluster's head"),
    ("http://head:6379", "give HOST:PORT without a scheme (http://)"),
    ("head", "must be auto or HOST:PORT, e.g. 10.0.0.5:6379"),
    ("head:port", "must be auto or HOST:PORT, e.g. 10.0.0.5:6379"),
    (":6379", "the host before ':' is empty"),
    ("head:0", "port 0 is not from 1 to 65535"),
    ("head:70000", "port 70000 is not from 1 to 65535"),
    ("::1:6379", "'::1' is not a host name or IP address (an IPv6 address goes in brackets: [::1]:6379)"),
    ("a b:6379", "'a b' is not a host name or IP address"),
    ("h" * 400 + ":1", "is 402 characters long; an address has at most 300"),
])
def test_bad_address_shapes_name_the_key(write_yaml, address, message):
    [(path, msg)] = problems_of(write_yaml, executor={"kind": "ray", "address": address})
    assert path == "executor.address" and msg.startswith(message)


def test_unknown_keys_say_did_you_mean_and_list_the_allowed(write_yaml):
    path = write_yaml(tiny_scenario(executor={"kind": "ray", "adress": "auto"}))
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert str(info.value) == (f"{path}: executor.adress: unknown key 'adress'; did you mean 'address'? allowed "
                               "keys: kind, address, cpus_per_worker, workers, startup_timeout_s")
    assert problems_of(write_yaml, placement=[{"acelerator_type": "H100"}]) == [
        ("placement[0].acelerator_type", "unknown key 'acelerator_type'; did you mean 'accelerator_type'? allowed "
                                         "keys: name, accelerator_type, resources")]
    [(top, msg)] = problems_of(write_yaml, executer={"kind": "ray"})
    assert top == "executer" and msg.startswith("unknown key 'executer'; did you mean 'executor'? allowed keys: name,")
    assert msg.endswith(", seed, executor, placement")
    path = write_yaml(tiny_scenario(executor={"kind": "ray", "adress": "auto"}), "validated.yaml")
    r = CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "300"})
    assert r.exit_code == 2
    assert f"{path}: executor.adress: unknown key 'adress'; did you mean 'address'?" in " ".join(r.output.split())


@pytest.mark.parametrize("key, value", [("address", "auto"), ("workers", 2), ("cpus_per_worker", 2),
                                        ("startup_timeout_s", 60)])
def test_ray_settings_with_kind_local_are_refused(write_yaml, key, value):
    for executor in ({key: value}, {"kind": "local", key: value}):
        assert problems_of(write_yaml, executor=executor) == [
            (f"executor.{key}", "applies to kind ray (this executor is local): remove it, or set kind: ray")]


@pytest.mark.parametrize("executor, path, message", [
    ({"kind": "slurm"}, "executor.kind", "got 'slurm'; input should be 'local' or 'ray'"),
    ({"kind": "ray", "workers": 0}, "executor.workers", "Input should be greater than 0 (got 0)"),
    ({"kind": "ray", "workers": 1.5}, "executor.workers", "Input should be a valid integer (got 1.5)"),
    ({"kind": "ray", "cpus_per_worker": 0}, "executor.cpus_per_worker", "Input should be greater than 0 (got 0)"),
    ({"kind": "ray", "cpus_per_worker": True}, "executor.cpus_per_worker", "Input should be a valid number (got True)"),
    ({"kind": "ray", "startup_timeout_s": -1}, "executor.startup_timeout_s", "Input should be greater than 0 (got -1)"),
])
def test_bad_executor_values(write_yaml, executor, path, message):
    assert problems_of(write_yaml, executor=executor) == [(path, message)]


@pytest.mark.parametrize("entry, path, message", [
    ({"accelerator_type": "H100", "resources": {"x": 1}}, "placement[0]",
     "give exactly one of accelerator_type, resources (got accelerator_type and resources)"),
    ({"name": "a"}, "placement[0]", "give exactly one of accelerator_type, resources (got none)"),
    ({"resources": {"ssd": 1, "nvlink": 1}}, "placement[0]",
     "give a name: the kind asks for 2 resources, so none of them labels it"),
    ({"resources": {"node:10.0.0.5": 0.5}}, "placement[0]",
     "give a name: 'node:10.0.0.5' cannot label the kind: it must be 1 to 32 letters, digits"),
    ({"resources": {}}, "placement[0].resources", "is empty: name at least one resource"),
    ({"resources": {"GPU": 1}}, "placement[0].resources", "GPU: kvbench asks for CPUs and GPUs itself"),
    ({"resources": {"ssd": 0.00001}}, "placement[0].resources",
     "ssd: 1e-05 is less than 0.0001, the step in which Ray counts resources"),
    ({"resources": {"ssd": 0}}, "placement[0].resources.ssd", "Input should be greater than 0 (got 0)"),
    ({"name": ".hidden", "accelerator_type": "H100"}, "placement[0].name", "must be 1 to 32 letters, digits, '_'"),
    ({"name": "x" * 33, "accelerator_type": "H100"}, "placement[0].name", "must be 1 to 32 letters"),
    ({"accelerator_type": "H100 PCIe"}, "placement[0].accelerator_type", "must be 1 to 100 letters, digits"),
])
def test_bad_placement_entries(write_yaml, entry, path, message):
    [(got_path, msg)] = problems_of(write_yaml, placement=[entry])
    assert got_path == path and msg.startswith(message), msg


def test_placement_labels_are_unique_and_the_list_not_empty(write_yaml):
    assert problems_of(write_yaml, placement=[{"accelerator_type": "H100"}, {"accelerator_type": "L4"},
                                              {"name": "h100", "resources": {"pcie5": 1}}]) == [
        ("placement", "[0] and [2] have the same label 'h100' (labels must differ in more than case): give each kind "
                      "its own name")]
    assert problems_of(write_yaml, placement=[]) == [
        ("placement", "List should have at least 1 item after validation, not 0 (got [])")]


def test_two_kinds_are_refused_for_a_capacity_search_and_a_server_engine(write_yaml):
    assert problems_of(write_yaml, **two_kinds(batch_sizes="auto", budget="1MiB")) == [
        ("placement", "lists 2 kinds; a capacity search runs on one kind per run: give one")]
    server = {"engine": {"kind": "llama.cpp"}, "model": {"name": "smollm2-135m"}, "batch_sizes": None,
              "modes": [{"name": "none"}, {"name": "prefix-cache"}]}
    assert problems_of(write_yaml, **two_kinds(**server)) == [
        ("placement", "lists 2 kinds; a server engine (llama.cpp) runs on one kind per run: give one")]
    one = load_scenario(write_yaml(tiny_scenario(batch_sizes="auto", budget="1MiB",
                                                 placement=[{"accelerator_type": "H100"}])))
    assert one.searched == "batch_size" and one.machines == ["H100"]


def test_placement_with_a_local_executor_is_no_schema_error(write_yaml):
    s = load_scenario(write_yaml(tiny_scenario(**two_kinds())))
    assert s.executor.kind == "local" and s.machines == ["H100", "L4"]


def test_the_executor_does_not_change_the_scenario_digest(write_yaml):
    local = load_scenario(write_yaml(tiny_scenario())).model_dump(mode="json")
    ray = load_scenario(write_yaml(tiny_scenario(executor={"kind": "ray", "address": "auto", "workers": 3})))
    assert ray.model_dump(mode="json")["executor"]["workers"] == 3
    assert scenario_digest(ray.model_dump(mode="json")) == scenario_digest(local)
    placed = load_scenario(write_yaml(tiny_scenario(placement=[{"accelerator_type": "L4"}]))).model_dump(mode="json")
    assert scenario_digest(placed) != scenario_digest(local)  # the machine kind shapes what a trial measures


def test_override_executor():
    ray = ExecutorSpec(kind="ray", address="auto", workers=2)
    assert override_executor(ray) is ray
    assert override_executor(ray, "local") == ExecutorSpec()  # the Ray settings go with the kind
    assert override_executor(ExecutorSpec(), "ray") == ExecutorSpec(kind="ray")
    moved = override_executor(ray, address="10.0.0.5:6379")
    assert (moved.kind, moved.address, moved.workers) == ("ray", "10.0.0.5:6379", 2)
    assert override_executor(ExecutorSpec(), None, "auto") == ExecutorSpec(kind="ray", address="auto")
    for args, template in (((ray, "slurm"), "{executor} 'slurm': must be local or ray"),
                           ((ray, "local", "auto"), "{address} applies to the ray executor; {executor} is local"),
                           ((ray, None, "ray://h:1"), "{address} 'ray://h:1': give HOST:PORT without a scheme")):
        with pytest.raises(BadParameter) as info:
            override_executor(*args)
        assert info.value.template.startswith(template)


def test_placement_spec_label_and_resources():
    assert PlacementSpec(accelerator_type="A100").label == "A100"
    assert PlacementSpec(name="a100-80g", accelerator_type="A100").label == "a100-80g"
    assert PlacementSpec(resources={"pcie5": 2}).label == "pcie5"
    assert PlacementSpec(resources={"pcie5": 2}).ray_resources() == {"pcie5": 2.0}


@pytest.fixture
def recorded(monkeypatch) -> list[dict]:
    """run_scenario replaced by one that records its keyword arguments and stops before any trial (as an
    interrupt would)."""
    calls: list[dict] = []

    def fake(scenario, **kwargs):
        calls.append({"scenario": scenario, **{k: v for k, v in kwargs.items() if k != "progress"}})
        override_executor(ExecutorSpec(), kwargs["executor"], kwargs["address"])  # as the library checks them
        return SimpleNamespace(interrupted=True, swept=False, run_dir=None, scenario=None)

    monkeypatch.setattr("kvbench.bench.run.run_scenario", fake)
    return calls


@pytest.mark.parametrize("flags, executor, address", [
    ([], None, None),
    (["--executor", "ray"], "ray", None),
    (["--executor", "LOCAL"], "local", None),
    (["--address", "auto"], None, "auto"),
    (["--executor", "ray", "--address", "10.0.0.5:6379"], "ray", "10.0.0.5:6379"),
])
def test_run_passes_the_executor_flags(recorded, tmp_path, flags, executor, address):
    r = CliRunner().invoke(app, ["run", str(tmp_path / "s.yaml"), *flags])
    assert r.exit_code == 130 and "interrupted before the first trial" in r.output
    assert recorded == [{"scenario": tmp_path / "s.yaml", "out": None, "resume": None, "trust_remote_code": False,
                         "trust_server_config": False, "executor": executor, "address": address}]


def test_run_flag_errors_are_worded_with_the_flags(recorded, tmp_path):
    r = CliRunner().invoke(app, ["run", str(tmp_path / "s.yaml"), "--executor", "local", "--address", "auto"])
    assert r.exit_code == 2 and "error: --address applies to the ray executor; --executor is local" in r.output
    r = CliRunner().invoke(app, ["run", str(tmp_path / "s.yaml"), "--address", "ray://h:10001"],
                           env={"COLUMNS": "300"})
    assert r.exit_code == 2 and "error: --address 'ray://h:10001': give HOST:PORT without a scheme" in r.output
    r = CliRunner().invoke(app, ["run", str(tmp_path / "s.yaml"), "--executor", "slurm"], env={"COLUMNS": "300"})
    assert r.exit_code == 2 and "'slurm' is not one of 'local', 'ray'" in r.output and len(recorded) == 2
    help_text = " ".join(CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "300"}).output.split())
    assert ("ray (Ray actors, one per GPU; needs kvbench[ray]). Default: the scenario's executor.kind (local when it "
            "has none).") in help_text
    assert "implies --executor ray. Default: the scenario's executor.address" in help_text
