"""The pytest plugin as a user runs it from their own repository: unimplemented formulas are
deselected (one summary line), not skipped one by one; a failing test's printed node id reruns it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from test_cli import MYMOD, user_env

PYTEST = str(Path(sys.executable).parent / "pytest")


def pytest_run(*args, cwd):
    return subprocess.run([PYTEST, "-p", "no:cacheprovider", "-rfEs", *args], capture_output=True, text=True,
                          cwd=cwd, env=user_env(120))


@pytest.fixture
def user_repo(tmp_path):
    (tmp_path / "mymod.py").write_text(MYMOD)
    return tmp_path


def test_unimplemented_formulas_are_deselected_with_one_summary_line(user_repo):
    from pgspec.conformance.run import runner

    r = pytest_run("--pgspec-adapter", "mymod:adapter", "--pgspec-formulas", "ratio.*", "--pgspec-dtype",
                   "float64", cwd=user_repo)
    assert r.returncode == 0, r.stdout + r.stderr
    cases = runner.select_cases("ratio.*")
    implemented = [c for c in cases if c["formula"] == "ratio.token"]
    others = len(cases) - len(implemented)
    formulas = len({c["formula"] for c in cases}) - 1
    assert others > 0
    assert f"{len(implemented)} passed, {others} deselected" in r.stdout, r.stdout[-1500:]
    assert "skipped" not in r.stdout and "SKIPPED" not in r.stdout
    summary = [line for line in r.stdout.splitlines() if line.startswith("pgspec: ")]
    assert summary == [f"pgspec: {len(implemented)} tests against mine (0.1); deselected {others} tests of "
                       f"{formulas} formulas that mine does not implement"], r.stdout[:2000]
    assert f"collected {len(cases)} items / {others} deselected / {len(implemented)} selected" in r.stdout


def test_under_xdist_the_controller_prints_the_deselection_line(user_repo):
    """With ``pytest -n 2`` the workers collect and deselect; the line that says how many tests were
    deselected, and why, still reaches the user (from the controller, in its closing summary)."""
    pytest.importorskip("xdist")
    args = ("--pgspec-adapter", "mymod:adapter", "--pgspec-formulas", "ratio.*", "--pgspec-dtype", "float64")
    serial = pytest_run(*args, cwd=user_repo)
    line = next(ln for ln in serial.stdout.splitlines() if ln.startswith("pgspec: "))
    assert "deselected" in line, line
    r = pytest_run("-n", "2", *args, cwd=user_repo)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 workers" in r.stdout, r.stdout[-1500:]
    assert [ln for ln in r.stdout.splitlines() if ln.startswith("pgspec: ")] == [line], r.stdout[-1500:]


def test_a_failing_tests_printed_id_reruns_it(user_repo):
    r = pytest_run("--pgspec-adapter", "mymod:broken", "--pgspec-formulas", "ratio.token", "--pgspec-dtype",
                   "float64,float32", cwd=user_repo)
    assert r.returncode == 1, r.stdout + r.stderr
    failed = re.findall(r"^FAILED (\S+)", r.stdout, re.M)
    assert failed and all(f.startswith("pgspec::ratio.token/") for f in failed), r.stdout[-2000:]
    nodeid = failed[0]
    assert f"pytest --pgspec-adapter mymod:broken '{nodeid}'" in r.stdout  # the failure says how to rerun it
    again = pytest_run("--pgspec-adapter", "mymod:broken", nodeid, cwd=user_repo)
    assert again.returncode == 1
    assert re.findall(r"^FAILED (\S+)", again.stdout, re.M) == [nodeid], again.stdout[-2000:]
    assert re.search(r"\b1 failed, \d+ deselected", again.stdout), again.stdout[-500:]
    # a prefix of an id selects every test under it; an id of a passing test passes
    case = nodeid.split("::")[1].split("[")[0]
    prefix = pytest_run("--pgspec-adapter", "mymod:broken", "--pgspec-dtype", "float64,float32",
                        f"pgspec::{case}", cwd=user_repo)
    assert sorted(re.findall(r"^FAILED (\S+)", prefix.stdout, re.M)) == sorted(
        f"pgspec::{case}[{d}]" for d in ("float64", "float32")), prefix.stdout[-2000:]
    ok = pytest_run("--pgspec-adapter", "mymod:adapter", nodeid, cwd=user_repo)
    assert ok.returncode == 0 and re.search(r"\b1 passed, \d+ deselected", ok.stdout), ok.stdout[-800:]


def test_node_ids_without_an_adapter_are_a_usage_error(user_repo):
    r = pytest_run("pgspec::ratio.token/two-tokens[float64]", cwd=user_repo)
    assert r.returncode != 0
    assert "--pgspec-adapter" in r.stdout + r.stderr


def test_plugin_options_state_their_defaults(tmp_path):
    r = pytest_run("--help", cwd=tmp_path)
    text = re.sub(r"\s+", " ", r.stdout)
    for opt in ("--pgspec-adapter", "--pgspec-device", "--pgspec-dtype", "--pgspec-formulas"):
        help_text = text[text.index(opt):][:400]
        assert "(default: " in help_text, help_text


def test_the_header_says_what_runs_and_what_pgspec_run_adds(user_repo):
    """The plugin runs the golden cases in pgspec run's dtypes, not the property checks: it says so."""
    r = pytest_run("--pgspec-adapter", "mymod:adapter", "--pgspec-formulas", "ratio.token", cwd=user_repo)
    assert r.returncode == 0, r.stdout + r.stderr
    [header] = [ln for ln in r.stdout.splitlines() if ln.startswith("pgspec plugin: ")]
    assert "in float64, float32, bfloat16" in header, header
    assert "not the property checks" in header and "`pgspec run --adapter mymod:adapter`" in header, header
    assert "[bfloat16]" in pytest_run("--pgspec-adapter", "mymod:adapter", "--pgspec-formulas", "ratio.token",
                                      "--collect-only", "-q", cwd=user_repo).stdout


def test_the_default_dtypes_are_pgspec_runs_and_the_aliases_work(user_repo):
    from pgspec.conformance import cli, pytest_plugin

    run = next(a for a in cli.build_parser()._subparsers._group_actions[0].choices["run"]._actions
               if a.dest == "dtype")
    assert pytest_plugin.DEFAULT_DTYPES == run.default
    r = pytest_run("--pgspec-adapter", "mymod:adapter", "--pgspec-formulas", "ratio.token", "--pgspec-dtype",
                   "fp64,bf16", "--collect-only", "-q", cwd=user_repo)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[float64]" in r.stdout and "[bfloat16]" in r.stdout and "[float32]" not in r.stdout, r.stdout
