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
