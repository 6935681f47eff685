"""A model's own code (config.json ``auto_map``) never runs during validation, and `run` imports it only with
both the scenario's ``model.trust_remote_code: true`` and the ``--trust-remote-code`` flag."""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from conftest import ROOT, kvbench_cmd, tiny_scenario

pytestmark = pytest.mark.e2e

#: config.json with an auto_map to marker_config.py, which writes $KVBENCH_MARKER when imported.
MODEL = ROOT / "tests" / "data" / "hostile" / "remote_code_model"


def _scenario(tmp_path) -> tuple:
    path = tmp_path / "remote.yaml"
    data = tiny_scenario(model={"name": str(MODEL), "trust_remote_code": True})
    path.write_text(yaml.safe_dump(data))
    marker = tmp_path / "model-code-ran"
    env = {**os.environ, "KVBENCH_MARKER": str(marker), "HF_MODULES_CACHE": str(tmp_path / "modules")}
    return path, marker, env


def test_validate_never_imports_the_models_code(tmp_path):
    path, marker, env = _scenario(tmp_path)
    r = subprocess.run([*kvbench_cmd(), "validate", str(path)], capture_output=True, text=True, env=env, timeout=120)
    assert not marker.exists(), "validate imported the model's auto_map module"
    assert r.returncode == 0, r.stderr
    assert f"{path}: ok (8 trials" in r.stdout


def test_run_without_the_flag_refuses_naming_the_module(tmp_path):
    path, marker, env = _scenario(tmp_path)
    out = tmp_path / "results"
    r = subprocess.run([*kvbench_cmd(), "run", str(path), "--out", str(out)], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 2
    assert " ".join(r.stderr.split()) == (
        f"error: {path}: model.trust_remote_code: true runs the model's own code (marker_config.py); pass "
        "--trust-remote-code to allow it, or set it to false")
    assert "Traceback" not in r.stderr
    assert not marker.exists() and not out.exists()


def test_run_with_the_flag_warns_naming_the_module_then_runs_it(tmp_path):
    path, marker, env = _scenario(tmp_path)
    r = subprocess.run([*kvbench_cmd(), "run", str(path), "--out", str(tmp_path / "results"), "--trust-remote-code"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert (f"warning: {path}: model.trust_remote_code: {MODEL} runs its own code: marker_config.py"
            in " ".join(r.stderr.split()))
    assert marker.read_text() == "model code ran\n"  # asked for twice, so it ran (and then stopped the load)
    assert r.returncode == 2 and "marker_config: this model's code stops here" in r.stderr


def test_the_flag_alone_runs_no_model_code(tmp_path):
    """--trust-remote-code without the scenario's trust_remote_code: true changes nothing: the load refuses the
    auto_map (transformers' own check), the module is never imported."""
    path, marker, env = _scenario(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["model"]["trust_remote_code"] = False
    path.write_text(yaml.safe_dump(data))
    r = subprocess.run([*kvbench_cmd(), "run", str(path), "--out", str(tmp_path / "results"), "--trust-remote-code"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert not marker.exists()
    assert r.returncode == 2 and "runs its own code" not in r.stderr
