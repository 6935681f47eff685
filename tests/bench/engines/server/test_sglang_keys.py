"""SGLang started by kvbench checks fresh keys that no other process of the machine has: a run on the fake SGLang
(``tests/data/fake_sglang_server.py``, SGLang 0.5.23's key rules) while another process knocks on its endpoints."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

import kvbench
from kvbench.bench.engines.server.keys import keys_file, server_keys, sweep_keys
from kvbench.bench.run import RunProgress
from kvbench.errors import UnwritableOutput
from kvbench.scenario.server_flags import reserved_flag_problems
from kvbench.serving.sglang import KEYS

FAKE = Path(__file__).resolve().parents[3] / "data" / "fake_sglang_server.py"


class Knock(RunProgress):
    """After the first measured request, as another process of the machine would: read the server's command line,
    its key file, and ask its endpoints without a key."""

    def __init__(self, out: Path):
        self.out, self.answers, self.cmdline, self.config = out, {}, [], None

    def trial_done(self, row):
        if self.answers:
            return
        server = next(p for p in psutil.Process(os.getpid()).children(recursive=True)
                      if any("fake_sglang_server.py" in a for a in p.cmdline()))
        self.cmdline = server.cmdline()
        path = Path(self.cmdline[self.cmdline.index("--config") + 1])
        self.config = (stat.S_IMODE(path.stat().st_mode), yaml.safe_load(path.read_text()))
        url = f"http://127.0.0.1:{self.cmdline[self.cmdline.index('--port') + 1]}"
        for method, path, body in (("POST", "/start_profile", {"output_dir": str(self.out)}),
                                   ("POST", "/flush_cache", {}), ("GET", "/server_info", None),
                                   ("POST", "/v1/completions", {"prompt": [1, 2], "max_tokens": 1}),
                                   ("GET", "/metrics", None)):
            self.answers[path] = httpx.request(method, url + path, json=body, timeout=10).status_code


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sglang")
    data = {"name": "keys", "model": "smollm2-135m", "engine": {"kind": "sglang", "binary": str(FAKE)},
            "workload": {"source": "sharegpt", "seed": 0, "multi_turn": {
                "conversations": 2, "turns": 2, "min_prompt_tokens": 300, "max_prompt_tokens": 600}},
            "max_new_tokens": 4, "modes": [{"name": "none"}, {"name": "radix"}], "repeats": 1, "warmup": 0,
            "seed": 0}
    (tmp / "s.yaml").write_text(yaml.safe_dump(data))
    (tmp / "knocked").mkdir()
    knock = Knock(tmp / "knocked")
    res = kvbench.run_scenario(tmp / "s.yaml", out=tmp / "res", progress=knock, trust_server_config=True)
    return res, knock, tmp


@pytest.mark.e2e
def test_every_request_ran_with_the_key_and_no_other_process_gets_in(run):
    res, knock, tmp = run
    assert len(res.rows) == 8 and all(r["status"] == "ok" for r in res.rows), [r.get("message") for r in res.rows]
    radix = {r["request_id"]: r["cached_prompt_tokens"] for r in res.rows if r["mode"] == "radix"}
    assert radix["c0-t1"] == 0 and radix["c0-t2"] > 300 and radix["c1-t2"] > 300, radix
    assert knock.answers == {"/start_profile": 401, "/flush_cache": 401, "/server_info": 401,
                             "/v1/completions": 401, "/metrics": 200}
    assert list((tmp / "knocked").iterdir()) == []  # no trace written where the knock asked
    mode, keys = knock.config
    assert mode == 0o600 and sorted(keys) == ["admin-api-key", "api-key"]
    assert len({*keys.values()}) == 2 and all(len(k) >= 43 for k in keys.values())
    assert not any(k in " ".join(knock.cmdline) for k in keys.values())  # /proc/<pid>/cmdline holds no key


@pytest.mark.e2e
def test_the_key_files_are_gone_and_nothing_records_a_key(run):
    res, knock, _ = run
    _, keys = knock.config
    servers = res.run_dir / "servers"
    assert sorted(p.suffix for p in servers.iterdir()) == [".log", ".log"]
    for log in servers.iterdir():
        assert stat.S_IMODE(log.stat().st_mode) == 0o600  # a server logs its settings, SGLang its keys
    run_json = (res.run_dir / "run.json").read_text()
    assert not any(k in run_json for k in keys.values())
    argvs = [s["argv"] for s in json.loads(run_json)["servers"]]
    assert all(a[-2] == "--config" and a[-1].endswith(".yaml") for a in argvs)


@pytest.mark.parametrize("flag", ["--config", "--api-key", "--admin-api-key", "--tokenizer-worker-num",
                                  "--smg-grpc-mode", "--grpc-mode", "--admin-api"])
def test_a_scenario_cannot_give_the_flags_that_open_sglang(flag):
    [problem] = reserved_flag_problems("sglang", [flag, "2"])
    assert problem.startswith(f"{flag}") and "kvbench sets this itself" in problem
    assert "fresh keys in its own --config file" in problem and "SGLang's admin endpoints stay closed" in problem


def test_the_key_file_is_made_anew_readable_by_its_owner_alone_and_removed(tmp_path):
    keys = server_keys(KEYS, tmp_path, "radix-r0")
    assert keys.argv == ("--config", str(keys.path)) and keys.path.parent == tmp_path
    assert keys.headers == {"Authorization": f"Bearer {keys.settings['api-key']}"}
    with pytest.raises(RuntimeError), keys_file(keys):
        assert stat.S_IMODE(keys.path.stat().st_mode) == 0o600
        assert yaml.safe_load(keys.path.read_text()) == keys.settings
        raise RuntimeError("the server failed")
    assert not keys.path.exists()
    target = tmp_path / "victim"
    target.write_text("kept")
    keys.path.symlink_to(target)  # planted at the name
    with pytest.raises(UnwritableOutput, match="File exists"), keys_file(keys):
        raise AssertionError("the keys were written through the planted link")
    assert target.read_text() == "kept" and keys.path.is_symlink()
    assert server_keys(None, tmp_path, "x") is None


@pytest.mark.e2e
def test_a_killed_run_s_key_files_are_removed_when_it_resumes_and_nothing_else(run, tmp_path):
    """From the hostile pass: after kill -9 of kvbench, servers/none-r0.<hex>.yaml (the keys of a server gone with
    it) stayed, and --resume finished the run without removing it."""
    res, _, _ = run
    servers = res.run_dir / "servers"
    stale = servers / "none-r0.0123456789abcdef.yaml"
    stale.write_text("api-key: k\n")
    stale.chmod(0o600)
    outside = tmp_path / "outside.yaml"
    outside.write_text("kept")
    outside.chmod(0o600)
    other = {servers / "none-r0.0123456789abcdef.keys": "link", servers / "radix-r0.fedcba9876543210.yaml": 0o644,
             servers / "notes.yaml": 0o600, servers / "notes.0123456789abcdef.yaml": 0o600,  # no mode's name
             servers / "radix-r1.dddddddddddddddd.yaml": "hard link"}
    for path, how in other.items():
        if how == "link":
            path.symlink_to(tmp_path / "elsewhere")
        elif how == "hard link":
            os.link(outside, path)
        else:
            path.write_text("x")
            path.chmod(how)
    kvbench.run_scenario(resume=res.run_dir, progress=RunProgress(), trust_server_config=True)
    assert not stale.exists() and all(p.is_symlink() or p.exists() for p in other)
    assert outside.read_text() == "kept"
    assert sweep_keys(servers, ["none", "radix"]) == []
