"""Bad input to the pytest plugin (issue 11): usage errors (pytest exit code 4, one "ERROR:" line),
never INTERNALERROR; a corrupted golden file is one failing test and the intact families still run."""

from __future__ import annotations

import functools
import json
import shutil
import sys
from pathlib import Path

import pytest

import pgspec.adapters.torch  # noqa: F401 - imported once here: pytester's in-process runs must not re-import torch
from pgspec.conformance.corpus import golden  # noqa: F401
from pgspec.conformance.run import runner  # noqa: F401

pytest_plugins = ["pytester"]

FIXTURES = str(Path(__file__).parent / "fixtures")
sys.path.insert(0, FIXTURES)
import bad_input_adapters  # noqa: E402,F401


def run(pytester, monkeypatch, *args):
    monkeypatch.syspath_prepend(FIXTURES)
    pytester.makepyfile(test_nothing="")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q", *args)
    text = "\n".join(result.outlines + result.errlines)
    assert "INTERNALERROR" not in text and "Traceback" not in text
    return result, text


@pytest.mark.parametrize("args,expected", [
    (["--pgspec-adapter", "torch", "--pgspec-formulas", "zz.*"],
     "ERROR: --pgspec-formulas: no formula or case matches 'zz.*'; formula IDs: adv.batch_normalized"),
    (["--pgspec-adapter", "torch", "--pgspec-formulas", ""], "ERROR: --pgspec-formulas: --formulas: no glob given"),
    (["--pgspec-adapter", "bad_input_adapters:raising_factory"],
     "ERROR: --pgspec-adapter: adapter 'bad_input_adapters:raising_factory': the factory raising_factory() raised "
     "ValueError: the config file adapter.yaml is missing"),
    (["--pgspec-adapter", "bad_input_adapters:exiting_factory"],
     "ERROR: --pgspec-adapter: adapter 'bad_input_adapters:exiting_factory': the factory exiting_factory() raised "
     "SystemExit (sys.exit(4))"),
    (["--pgspec-adapter", ":"], "ERROR: --pgspec-adapter: adapter ':': expected module:object with both parts"),
    (["--pgspec-adapter", "nope"], "ERROR: --pgspec-adapter: unknown adapter 'nope'"),
    (["--pgspec-adapter", "bad_input_adapters:broken_available"],
     "ERROR: --pgspec-adapter: adapter 'bad_input_adapters:broken_available': RuntimeError: cannot query the GPU driver"),
    (["--pgspec-adapter", "torch", "--pgspec-dtype", ""], "ERROR: --pgspec-dtype: no dtype given (got ''); choose from float64"),
    (["--pgspec-adapter", "torch", "--pgspec-dtype", "float8"], "ERROR: --pgspec-dtype: unknown dtype(s) ['float8']"),
])
def test_usage_errors(pytester, monkeypatch, args, expected):
    result, text = run(pytester, monkeypatch, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert any(line.startswith(expected) for line in result.errlines), result.errlines


def test_a_corrupted_family_is_one_failing_test_and_the_others_run(pytester, monkeypatch, tmp_path):
    d = tmp_path / "golden"
    d.mkdir()
    manifest = json.loads((golden.GOLDEN_DIR / "MANIFEST").read_text())
    manifest["files"] = {k: v for k, v in manifest["files"].items() if k in ("kl.json", "ratio.json")}
    for name in manifest["files"]:
        shutil.copy(golden.GOLDEN_DIR / name, d / name)
    (d / "MANIFEST").write_text(json.dumps(manifest))
    (d / "kl.json").write_bytes((d / "kl.json").read_bytes()[:500])
    monkeypatch.setattr(golden, "load_all", functools.partial(golden.load_all, d))
    result, text = run(pytester, monkeypatch, "--pgspec-adapter", "torch", "--pgspec-formulas", "kl.k1,ratio.token/two-tokens",
                       "--pgspec-dtype", "float64")
    outcomes = result.parseoutcomes()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert outcomes["failed"] == 1 and outcomes["passed"] == 1  # ratio.token/two-tokens [float64]
    assert f"golden file problem (its family is not run): {d}/kl.json: sha256 " in text


# a case's time limit (issue 39): --pgspec-case-timeout, or the ini setting pgspec_case_timeout ------

@pytest.mark.parametrize("value, expected", [
    ("0", "must be a positive number of seconds, got '0'"),
    ("-1", "must be a positive number of seconds, got '-1'"),
    ("nan", "must be a positive number of seconds, got 'nan'"),
    ("inf", "must be a positive number of seconds, got 'inf'"),
    ("soon", "must be a number of seconds, got 'soon'"),
    ("604801", "must be at most 604800 seconds (7 days), got '604801'"),
])
@pytest.mark.parametrize("where", ["option", "ini"])
def test_a_bad_case_timeout_is_a_usage_error(pytester, monkeypatch, value, expected, where):
    """The range of `pgspec run --case-timeout`, the option or ini setting named in one line."""
    if where == "option":
        args, name = ["--pgspec-case-timeout", value], "--pgspec-case-timeout"
    else:
        pytester.makeini(f"[pytest]\npgspec_case_timeout = {value}\n")
        args, name = [], "pgspec_case_timeout (ini)"
    result, text = run(pytester, monkeypatch, "--pgspec-adapter", "torch", "--pgspec-formulas", "kl.k1", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"ERROR: {name}: {expected}" in result.errlines, result.errlines


# kl.k1 never returns (a sleep; a loop that swallows every Exception); kl.k2 is correct.  The
# expected-error case is called too (an invalid input may hang a framework as well).
HANGING = "kl.k1/on-reference,kl.k1/error-unknown-parameter,kl.k2/on-reference"


@pytest.mark.parametrize("factory, name", [("hangs_in_k1", "hangs"), ("hangs_swallowing", "hangs-swallowing")])
@pytest.mark.parametrize("where", ["option", "ini"])
def test_a_case_that_hangs_fails_within_the_time_limit(pytester, monkeypatch, factory, name, where):
    import time

    if where == "option":
        args, option = ["--pgspec-case-timeout", "0.5"], "--pgspec-case-timeout"
    else:
        pytester.makeini("[pytest]\npgspec_case_timeout = 0.5\n")
        args, option = [], "pgspec_case_timeout (ini)"
    start = time.monotonic()
    result, text = run(pytester, monkeypatch, "--pgspec-adapter", f"bad_input_adapters:{factory}", "--pgspec-formulas",
                       HANGING, "--pgspec-dtype", "float64", *args, "-rA")
    assert time.monotonic() - start < 60
    outcomes = result.parseoutcomes()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert outcomes["failed"] == 2 and outcomes["passed"] == 1, text
    message = f"adapter {name!r} did not return within 0.5 s ({option}): its call was interrupted"
    # once in each failure's section (the short summary under -rA repeats it whole when CI is set:
    # pytest does not truncate it there)
    failures = text.split("short test summary info")[0]
    assert failures.count(f"error: kl.k1/on-reference [float64]\n{message}") == 1, text
    assert failures.count(f"error: kl.k1/error-unknown-parameter [float64]\n{message}") == 1, text
    rerun = f"pytest --pgspec-adapter bad_input_adapters:{factory}{' --pgspec-case-timeout 0.5' if args else ''} "
    assert f"{rerun}'pgspec::kl.k1/on-reference[float64]'" in text
    import signal

    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)     # the timer is off after the run


@pytest.mark.parametrize("args, expected", [([], "no time limit (--pgspec-case-timeout)"),
                                           (["--pgspec-case-timeout", "2.5"], "at most 2.5 s a case (--pgspec-case-timeout)")])
def test_the_header_says_what_the_time_limit_is(pytester, monkeypatch, args, expected):
    monkeypatch.syspath_prepend(FIXTURES)
    pytester.makepyfile(test_nothing="")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--pgspec-adapter", "torch", "--pgspec-formulas",
                                          "kl.k1/on-reference", "--pgspec-dtype", "float64", *args)
    assert result.ret == pytest.ExitCode.OK
    (header,) = [ln for ln in result.outlines if ln.startswith("pgspec plugin: ")]
    assert expected in header, header
