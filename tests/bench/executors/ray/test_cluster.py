"""The Ray executor (``kvbench run --executor ray``) on a local Ray instance of 2 CPUs: the same trials as a local
run, a worker killed mid-trial (one ``error`` row and a successful retry), Ctrl-C then ``--resume`` (nothing lost or
repeated), placements refused before any trial, two machine kinds in one run, and the worker planning."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter

import pytest
import yaml

from conftest import ROOT, kvbench_cmd, llama_multi_turn, tiny_scenario
from kvbench.bench.executors.ray.connect import connect, import_ray
from kvbench.bench.executors.ray.placement import unit_count, worker_kinds
from kvbench.bench.run import RunProgress, run_scenario
from kvbench.errors import ClusterError, ScenarioError
from kvbench.results.load import load_results
from kvbench.results.read import read_rows
from kvbench.scenario import parse_scenario

ray = pytest.importorskip("ray", reason="the Ray executor's tests need the kvbench[ray] extra")

#: A trial of about a second on the tiny model: long enough to kill its worker in the middle of it.
SLOW = {"model": {"preset": "tiny-llama", "weights": "random"}, "prompt_tokens": [16], "max_new_tokens": 60,
        "batch_sizes": [1, 2], "modes": [{"kind": "none"}, {"kind": "full"}], "repeats": 2}


@pytest.fixture(scope="module")
def cluster():
    """A local Ray instance: 2 CPUs and one of each custom resource ``kind_a`` and ``kind_b``, its workers at
    nice 0."""
    was = os.environ.get("RAY_worker_niceness")
    os.environ["RAY_worker_niceness"] = "0"
    ray.init(address="local", num_cpus=2, resources={"kind_a": 1, "kind_b": 1}, include_dashboard=False,
             log_to_driver=False, logging_level="ERROR")
    yield ray
    ray.shutdown()
    if was is None:
        os.environ.pop("RAY_worker_niceness")
    else:
        os.environ["RAY_worker_niceness"] = was


def write(tmp_path, data, name="s.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def rows_of(run_dir):
    return read_rows(run_dir / "trials.jsonl")[0]


class Killer(RunProgress):
    """Kills (SIGKILL) the worker that starts ``target``, once, and keeps the status lines."""

    def __init__(self, target):
        self.target, self.killed, self.lines = target, None, []

    def status(self, text):
        self.lines.append(text)
        m = re.match(r".* pid (\d+): (\S+)$", text)
        if m and m.group(2) == self.target and self.killed is None:
            self.killed = int(m.group(1))
            time.sleep(0.2)  # inside the trial's decode
            os.kill(self.killed, signal.SIGKILL)


@pytest.mark.ray
@pytest.mark.model
@pytest.mark.e2e
def test_smoke_on_ray_has_the_trial_ids_and_statuses_of_a_local_run(tmp_path, cluster):
    smoke = ROOT / "scenarios" / "smoke.yaml"
    local = run_scenario(smoke, out=tmp_path / "local")
    on_ray = run_scenario(smoke, out=tmp_path / "ray", executor="ray")
    statuses = lambda res: {r["trial_id"]: r["status"] for r in rows_of(res.run_dir)}  # noqa: E731
    assert len(rows_of(on_ray.run_dir)) == len(rows_of(local.run_dir)) == 48
    assert statuses(on_ray) == statuses(local)
    assert Counter(statuses(on_ray).values()) == Counter(statuses(local).values())
    ray_rows = rows_of(on_ray.run_dir)
    assert {r["host"] for r in ray_rows} == {socket.gethostname()}
    assert len({r["worker"] for r in ray_rows}) == 2 and all(r["attempt"] == 0 for r in ray_rows)
    assert {r["worker"] for r in rows_of(local.run_dir)} == {None}
    # every mode's greedy ids equal none's on the workers too
    assert all(r["tokens_match"] is True for r in ray_rows if r["status"] == "ok")
    meta = json.loads((on_ray.run_dir / "run.json").read_text())
    assert meta["executor"]["kind"] == "ray" and meta["status"] == "complete"
    assert [w["host"] for w in meta["machines"][""]["workers"]] == [socket.gethostname()] * 2


@pytest.mark.ray
def test_a_worker_killed_mid_trial_gives_one_error_row_and_a_retry_elsewhere(tmp_path, cluster):
    killer = Killer("p16-b1-full-r0")
    res = run_scenario(write(tmp_path, tiny_scenario(**SLOW)), out=tmp_path, executor="ray", progress=killer)
    assert killer.killed is not None
    rows = rows_of(res.run_dir)
    ids = Counter(r["trial_id"] for r in rows)
    assert len(ids) == 8 and ids.most_common(1) == [("p16-b1-full-r0", 2)] and sum(ids.values()) == 9
    lost, retry = [r for r in rows if r["trial_id"] == "p16-b1-full-r0"]
    assert lost["status"] == "error" and lost["attempt"] == 0
    assert lost["message"].startswith(f"worker lost (host {socket.gethostname()}, pid {killer.killed}): ")
    assert retry["status"] == "ok" and retry["attempt"] == 1 and retry["tokens_match"] is True
    assert retry["worker"] != lost["worker"]
    assert all(r["status"] == "ok" and r["attempt"] == 0 for r in rows if r["trial_id"] != "p16-b1-full-r0")
    assert res.n_errors == 0 and len(res.rows) == 8
    assert f"worker lost: 1 trial retried (host {socket.gethostname()})" in res.failures
    assert json.loads((res.run_dir / "run.json").read_text())["status"] == "complete"
    assert load_results(res.run_dir).problems == []  # the retry replaces the lost row without a complaint
    [gone] = json.loads((res.run_dir / "run.json").read_text())["lost_workers"]
    assert (gone["pid"], gone["trial_id"], gone["worker"]) == (killer.killed, "p16-b1-full-r0", lost["worker"])
    assert res.written == 8  # trials finished: the lost row is not one


@pytest.mark.ray
@pytest.mark.e2e
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_then_resume_loses_and_repeats_nothing(tmp_path, sig):
    """A real SIGINT (or a scheduler's SIGTERM, which Ray's own handler must not take over) to ``kvbench run
    --executor ray`` (its own local Ray instance), then ``--resume``."""
    path = write(tmp_path, tiny_scenario(**SLOW))
    p = subprocess.Popen([*kvbench_cmd(), "run", str(path), "--out", str(tmp_path / "out"), "--executor", "ray"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    trials = None
    while time.monotonic() < deadline and p.poll() is None:
        found = list((tmp_path / "out").glob("*/trials.jsonl"))
        if found and len(found[0].read_text().splitlines()) >= 3:
            trials = found[0]
            break
        time.sleep(0.1)
    assert trials is not None, p.communicate()
    p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130 and "--resume" in err, err
    before = rows_of(trials.parent)
    assert 3 <= len(before) < 8, err
    assert json.loads((trials.parent / "run.json").read_text())["status"] == "interrupted"
    r = subprocess.run([*kvbench_cmd(), "run", "--resume", str(trials.parent)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    after = rows_of(trials.parent)
    assert [x["trial_id"] for x in after[:len(before)]] == [x["trial_id"] for x in before]
    assert [x["started_at"] for x in after[:len(before)]] == [x["started_at"] for x in before]
    assert sorted(Counter(x["trial_id"] for x in after).values()) == [1] * 8
    assert {x["status"] for x in after} == {"ok"}


@pytest.mark.ray
@pytest.mark.parametrize("placement, fragment", [
    ([{"accelerator_type": "H100"}], "placement[0] (H100): no node of the Ray cluster can hold a worker (CPU 1 "
                                     "(executor.cpus_per_worker), accelerator_type:H100 0.001); the cluster has: "),
    ([{"resources": {"kind_c": 1}}], "placement[0] (kind_c): no node of the Ray cluster can hold a worker (CPU 1 "
                                     "(executor.cpus_per_worker), kind_c 1); the cluster has: "),
])
def test_a_placement_no_node_satisfies_is_refused_before_any_trial(tmp_path, cluster, placement, fragment):
    path = write(tmp_path, tiny_scenario(placement=placement, executor={"kind": "ray"}))
    with pytest.raises(ClusterError) as err:
        run_scenario(path, out=tmp_path / "out")
    assert fragment in str(err.value) and "2 CPU, 0 GPU" in str(err.value) and "kind_a" in str(err.value)
    assert not list((tmp_path / "out").glob("*"))  # no run directory is left


@pytest.mark.ray
def test_two_machine_kinds_run_every_trial_on_each_and_report_per_machine(tmp_path, cluster):
    data = tiny_scenario(prompt_tokens=[8], placement=[{"resources": {"kind_a": 1}}, {"resources": {"kind_b": 1}}])
    res = run_scenario(write(tmp_path, data), out=tmp_path, executor="ray")
    rows = rows_of(res.run_dir)
    assert sorted(r["trial_id"] for r in rows) == sorted(
        f"p8-b{b}-none-r{k}@{m}" for b in (1, 2) for k in (0, 1) for m in ("kind_a", "kind_b"))
    assert {r["trial_id"].split("@")[1] for r in rows} == {r["machine"] for r in rows} == {"kind_a", "kind_b"}
    meta = json.loads((res.run_dir / "run.json").read_text())
    assert sorted(meta["machines"]) == ["kind_a", "kind_b"]
    assert sorted(load_results(res.run_dir).trials["group"].unique()) == ["tiny @ kind_a", "tiny @ kind_b"]
    with (res.run_dir / "samples.csv").open() as f:  # each machine's samples under its own trial id
        assert {line.split(",")[0] for line in list(f)[1:]} == {r["trial_id"] for r in rows}
    assert list(res.summary["group"].unique()) == ["tiny @ kind_a", "tiny @ kind_b"]  # the run's own summary too


def test_a_missing_ray_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ClusterError, match=re.escape("pip install 'kvbench[ray]'")):
        import_ray()
    with pytest.raises(ClusterError, match="the Ray executor needs Ray"):
        run_scenario(write(tmp_path, tiny_scenario()), out=tmp_path / "out", executor="ray")
    assert not list((tmp_path / "out").glob("*"))


def test_an_unreachable_address_is_refused_at_once(monkeypatch):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    with pytest.raises(ClusterError, match=rf"cannot reach the Ray cluster at 127\.0\.0\.1:{port}: "):
        connect(f"127.0.0.1:{port}")
    # auto that finds a cluster which is gone (RAY_ADDRESS, or a stale file of an earlier `ray start`)
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=rf"cannot reach the Ray cluster at \S+:{port} \(found by auto"):
        connect("auto")
    assert time.monotonic() - t0 < 10


@pytest.mark.ray
def test_a_run_resumed_on_the_other_executor_says_which_ran_what(tmp_path, cluster):
    class StopAfter(RunProgress):
        def __init__(self, n):
            self.n = n

        def trial_done(self, row):
            self.n -= 1
            if self.n == 0:
                raise KeyboardInterrupt

    path = write(tmp_path, tiny_scenario(prompt_tokens=[8], batch_sizes=[1, 2]))
    first = run_scenario(path, out=tmp_path, executor="ray", progress=StopAfter(2))
    assert first.interrupted
    done = {r["trial_id"] for r in rows_of(first.run_dir)}
    res = run_scenario(resume=first.run_dir, executor="local")
    rows = rows_of(res.run_dir)
    assert sorted(Counter(r["trial_id"] for r in rows).values()) == [1] * 4
    assert {r["trial_id"] for r in rows if r["worker"] is not None} == done
    meta = json.loads((res.run_dir / "run.json").read_text())
    assert [e["kind"] for e in meta["executors"]] == ["ray", "local"] and meta["executor"] == {"kind": "local"}


def node(host, cpus, gpus=0, **extra):
    return {"Alive": True, "NodeManagerHostname": host,
            "Resources": {"CPU": cpus, "GPU": gpus, "memory": 1e9, f"node:{host}": 1, **extra}}


def test_workers_per_kind_follow_the_nodes_resources():
    nodes = [node("a", 16, 2, **{"accelerator_type:H100": 1}), node("b", 8, 1, **{"accelerator_type:L4": 1}),
             node("c", 64, 4, **{"accelerator_type:H100": 1}), {**node("d", 8, 8), "Alive": False}]
    s = parse_scenario(tiny_scenario(device="cuda", prompt_tokens=[8, 16, 32], batch_sizes=[1, 2],
                                     executor={"kind": "ray"},
                                     placement=[{"accelerator_type": "H100"}, {"accelerator_type": "L4", "name": "l4"}]))
    kinds = worker_kinds(s, nodes)
    assert [(k.label, k.count, k.gpu) for k in kinds] == [("H100", 6, True), ("l4", 1, True)]
    assert kinds[0].options == {"num_cpus": 1.0, "num_gpus": 1, "resources": {"accelerator_type:H100": 0.001}}
    assert unit_count(s) == 6
    few = parse_scenario(tiny_scenario(device="cuda", executor={"kind": "ray", "workers": 2}))
    assert [k.count for k in worker_kinds(few, nodes)] == [2]  # 7 GPUs, 4 units, at most 2
    cpu = parse_scenario(tiny_scenario(device="auto", executor={"kind": "ray", "cpus_per_worker": 3}))
    assert [(k.count, k.gpu) for k in worker_kinds(cpu, [node("x", 8), node("y", 4)])] == [(3, False)]
    with pytest.raises(ClusterError, match=r"device: cuda:1 names one GPU of one machine"):
        worker_kinds(parse_scenario(tiny_scenario(device="cuda:1")), nodes)  # --executor ray on a local scenario
    with pytest.raises(ScenarioError, match=r"device: cuda:1 names one GPU of one machine; with executor.kind: ray"):
        parse_scenario(tiny_scenario(device="cuda:1", executor={"kind": "ray"}))
    with pytest.raises(ClusterError, match=r"device cuda: no node of the Ray cluster can hold a worker \(CPU 1 "
                                           r"\(executor.cpus_per_worker\), GPU 1\); the cluster has: x: 8 CPU, 0 GPU"):
        worker_kinds(parse_scenario(tiny_scenario(device="cuda", executor={"kind": "ray"})), [node("x", 8)])


LLAMA_SERVER = os.path.join(sys.prefix, "bin", "llama-server")


@pytest.mark.ray
@pytest.mark.server
@pytest.mark.skipif(not os.access(LLAMA_SERVER, os.X_OK),
                    reason=f"llama-server is not built at {LLAMA_SERVER}: `make llama-server` builds it there (about 5 "
                           "minutes on two cores; `make test` does it first)")
def test_a_server_engine_runs_its_servers_in_the_worker_and_the_driver_keeps_their_logs(tmp_path, cluster):
    import tempfile

    import psutil

    before = set(os.listdir(tempfile.gettempdir()))
    res = run_scenario(write(tmp_path, llama_multi_turn(name="ray_server", executor={"kind": "ray"})), out=tmp_path)
    rows = rows_of(res.run_dir)
    assert len(rows) == 8 and {r["status"] for r in rows} == {"ok"}, [r["message"] for r in rows]
    assert len({r["worker"] for r in rows}) == 1  # one unit: one worker started every server
    turn2 = [r for r in rows if r["mode"] == "prefix-cache" and r["turn_index"] == 2]
    assert all(r["cached_prompt_tokens"] > 200 for r in turn2)
    servers = json.loads((res.run_dir / "run.json").read_text())["servers"]
    assert [s["mode_label"] for s in servers] == ["none", "prefix-cache"]
    for s in servers:
        assert "llama" in (res.run_dir / s["log"]).read_text().lower()
    assert not [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [""])[0] == LLAMA_SERVER]
    assert not {n for n in set(os.listdir(tempfile.gettempdir())) - before if n.startswith("kvbench-worker-")}
