"""Process-isolated adapters (--python): results over JSON lines, crashes and hangs become errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FIXTURES = str(Path(__file__).parent / "fixtures")


def run(*args):
    env = dict(os.environ, PYTHONPATH=FIXTURES + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "pgspec.conformance.cli", "run", "--python", sys.executable, *args],
                          capture_output=True, text=True, env=env, timeout=600)


def test_isolated_torch_matches_in_process(tmp_path):
    r = run("--formulas", "ratio.token", "--dtype", "float32", "--report", f"json:{tmp_path}/r.json")
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads((tmp_path / "r.json").read_text())
    # the expected-error cases are rejected by the backend in the worker, attributed there
    assert {x["outcome"] for x in data["results"] if x["category"] != "error"} == {"pass"}
    assert {x["outcome"] for x in data["results"] if x["category"] == "error"} == {"rejected"}
    assert data["version"].endswith("(isolated)")


def test_stdout_noise_from_the_framework_does_not_break_the_protocol():
    r = run("--adapter", "broken_adapters:noisy", "--formulas", "ratio.token/two-tokens", "--dtype", "float64")
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_crash_becomes_error_outcomes_and_the_run_goes_on(tmp_path):
    r = run("--adapter", "broken_adapters:dying", "--formulas", "ratio.token/two-tokens,ratio.sequence_product/two-tokens",
            "--dtype", "float64", "--report", f"json:{tmp_path}/r.json")
    assert r.returncode == 1
    results = {x["case_id"]: x for x in json.loads((tmp_path / "r.json").read_text())["results"]}
    assert results["ratio.token/two-tokens"]["outcome"] == "error"
    assert "exited with code 3" in results["ratio.token/two-tokens"]["message"]
    assert results["ratio.sequence_product/two-tokens"]["outcome"] == "pass"  # a fresh worker took over


def test_a_hang_times_out_into_an_error(tmp_path):
    r = run("--adapter", "broken_adapters:hanging", "--formulas", "ratio.token/two-tokens,ratio.sequence_product/two-tokens",
            "--dtype", "float64", "--case-timeout", "3", "--report", f"json:{tmp_path}/r.json")
    assert r.returncode == 1
    results = {x["case_id"]: x for x in json.loads((tmp_path / "r.json").read_text())["results"]}
    assert results["ratio.token/two-tokens"]["outcome"] == "error"
    assert "no answer within 3 s" in results["ratio.token/two-tokens"]["message"]
    assert results["ratio.sequence_product/two-tokens"]["outcome"] == "pass"


def test_missing_interpreter_is_a_usage_error():
    r = subprocess.run([sys.executable, "-m", "pgspec.conformance.cli", "run", "--python", "/nonexistent/python"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "does not exist" in r.stderr
