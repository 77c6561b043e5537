"""The runner, CLI, reports and pytest plugin, against the torch backend and broken adapters."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pgspec.conformance.run import runner

HERE = Path(__file__).parent
ENV_PATH = str(HERE / "fixtures")


def pgspec(*args, env_path=True):
    import os

    env = dict(os.environ)
    if env_path:
        env["PYTHONPATH"] = ENV_PATH + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "pgspec.conformance.cli", *args], capture_output=True,
                          text=True, env=env)


def run(adapter, formulas, dtype="float64"):
    """The numeric cases of ``formulas`` (expected-error cases are tested in test_verdicts.py)."""
    a = runner.load_adapter(adapter) if isinstance(adapter, str) else adapter
    return [runner.run_case(a, c, dtype, "cpu") for c in runner.select_cases(formulas) if c["category"] != "error"]


def test_torch_backend_passes_ratio_family_in_every_dtype():
    for dtype in ("float64", "float32", "bfloat16"):
        results = run("torch", "ratio.*", dtype)
        bad = [(r.case_id, r.message) for r in results if r.outcome != "pass"]
        assert not bad, (dtype, bad)
        assert all(r.compared > 0 for r in results)


def test_torch_backend_float16_run_has_no_unexpected_outcome(tmp_path):
    """The built-in backend declares float16: `pgspec run --dtype float16` (cases and property
    checks) exits 0, and what fails is exactly the float16 limits its declarations name (GSPO's clip
    range finer than float16's spacing near 1, ratios beyond 65504), each with its rule."""
    r = pgspec("run", "--adapter", "torch", "--dtype", "float16", "--report", f"json:{tmp_path / 'r.json'}",
               env_path=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    results = json.loads((tmp_path / "r.json").read_text())["results"]
    outcomes = {x["outcome"] for x in results}
    assert outcomes <= {"pass", "convention", "not-applicable", "rejected"}, outcomes
    conventions = {x["case_id"]: x["message"] for x in results if x["outcome"] == "convention"}
    assert "loss.dr_grpo/log-ratio-20" in conventions and "mask.geometric_sequence/log-ratio-200" in conventions
    assert all(c.startswith(("loss.gspo/", "loss.luspo/", "loss.dr_grpo/", "mask.geometric_sequence/"))
               for c in conventions), conventions
    assert sum(x["outcome"] == "pass" for x in results) > 1500 and sum(x["outcome"] == "rejected" for x in results) > 500


def test_exp_of_sum_where_mean_is_specified_fails():
    sys.path.insert(0, ENV_PATH)
    import broken_adapters

    results = run(broken_adapters.exp_of_sum(), "ratio.sequence_geometric")
    failing = [r for r in results if r.outcome == "fail"]
    assert len(failing) >= len(results) // 2
    assert any(r.case_id == "ratio.sequence_geometric/padded-batch" for r in failing)
    r = failing[0]
    assert r.first_failure and r.error_ratio > 1 and "load_case" in r.repro


def test_masked_inf_times_zero_fails_on_the_nan_case():
    sys.path.insert(0, ENV_PATH)
    import broken_adapters

    results = {r.case_id: r for r in run(broken_adapters.multiply_by_mask(), "ratio.token")}
    assert results["ratio.token/masked-nan-inf"].outcome == "fail"
    assert results["ratio.token/two-tokens"].outcome == "pass"


def test_crash_is_an_error_outcome_and_the_run_goes_on():
    sys.path.insert(0, ENV_PATH)
    import broken_adapters

    results = run(broken_adapters.crashing(), "ratio.*")
    assert {r.outcome for r in results if r.formula == "ratio.token"} == {"error"}
    assert "boom" in results[0].message or any("boom" in r.message for r in results)
    assert {r.outcome for r in results if r.formula != "ratio.token"} == {"unsupported"}


def test_declared_deviation_and_stale_deviation():
    sys.path.insert(0, ENV_PATH)
    import broken_adapters

    results = run(broken_adapters.with_deviations(), "ratio.sequence_geometric,ratio.token")
    outcomes = {r.formula: {x.outcome for x in results if x.formula == r.formula} for r in results}
    assert "bug" in outcomes["ratio.sequence_geometric"]
    assert "fail" not in outcomes["ratio.sequence_geometric"]
    assert outcomes["ratio.token"] == {"pass"}   # stale only once the whole run is seen
    summary = runner.RunSummary(results).finalize()
    assert {r.outcome for r in results if r.formula == "ratio.token"} == {"stale-deviation"}
    assert summary.exit_code() == 1  # a stale deviation must be cleaned up


def test_cli_exit_codes_and_reports(tmp_path):
    ok = pgspec("run", "--formulas", "ratio.token", "--report", f"json:{tmp_path}/r.json",
                "--report", f"md:{tmp_path}/r.md", "--report", f"html:{tmp_path}/r.html")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "ratio" in ok.stdout and "pass" in ok.stdout
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["adapter"] == "torch" and data["results"]
    rec = data["results"][0]
    for key in ("adapter", "version", "device", "dtype", "case_id", "outcome", "error", "bound", "error_ratio",
                "first_failure", "repro"):
        assert key in rec
    md = (tmp_path / "r.md").read_text()
    assert "| ratio |" in md and "| `ratio.token` | pass" in md and "torch: " in md
    html = (tmp_path / "r.html").read_text()
    assert "<table>" in html and "data:image/png;base64," in html

    bad = pgspec("run", "--adapter", "broken_adapters:exp_of_sum", "--formulas", "ratio.sequence_geometric",
                 "--report", f"md:{tmp_path}/bad.md")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    text = (tmp_path / "bad.md").read_text()
    assert "fail" in text and "load_case('ratio.sequence_geometric/" in text


def test_cli_usage_errors_exit_2_with_a_message():
    r = pgspec("run", "--adapter", "nope")
    assert r.returncode == 2 and "unknown adapter 'nope'" in r.stderr and "torch" in r.stderr
    r = pgspec("run", "--formulas", "nothing.*")
    assert r.returncode == 2 and "no formula or case matches" in r.stderr
    r = pgspec("run", "--dtype", "float8")
    assert r.returncode == 2 and "unknown dtype" in r.stderr
    r = pgspec("run", "--report", "pdf:x.pdf")
    assert r.returncode == 2 and "--report" in r.stderr
    import torch

    if not torch.cuda.is_available():
        r = pgspec("run", "--device", "cuda")
        assert r.returncode == 2 and "no CUDA device" in r.stderr
    for r in (pgspec("run", "--adapter", "nope"), pgspec("run", "--formulas", "nothing.*")):
        assert "Traceback" not in r.stderr


def test_adapters_command_lists_torch():
    r = pgspec("adapters")
    assert r.returncode == 0 and "torch" in r.stdout and "yes" in r.stdout


def test_pytest_plugin_runs_the_corpus(tmp_path):
    import os

    env = dict(os.environ, PYTHONPATH=ENV_PATH + os.pathsep + os.environ.get("PYTHONPATH", ""))
    ok = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pgspec-adapter", "torch",
                         "--pgspec-formulas", "ratio.token", "--collect-only"], cwd=tmp_path, capture_output=True,
                        text=True, env=env)
    assert "ratio.token/two-tokens[float32]" in ok.stdout, ok.stdout + ok.stderr
    # the whole corpus through the plugin (float32: the torch backend declares no float32 deviation)
    ok = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pgspec-adapter", "torch",
                         "--pgspec-dtype", "float32"], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-3000:]
    from pgspec.conformance.corpus import golden

    import re

    passed = int(re.search(r"(\d+) passed", ok.stdout).group(1))
    deselected = int(re.search(r"(\d+) deselected", ok.stdout).group(1))
    assert "failed" not in ok.stdout and passed > 1500, ok.stdout[-500:]
    # every case runs but the expected-error cases whose inputs no tensor can hold (ragged, a null group id)
    assert passed + deselected == len(golden.load_all()), ok.stdout[-500:]
    assert 0 < deselected <= sum(1 for c in golden.load_all()
                                 if "/error-ragged-" in c["id"] or c["id"].endswith("/error-group-ids-null"))
    bad = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pgspec-adapter",
                          "broken_adapters:exp_of_sum", "--pgspec-formulas", "ratio.sequence_geometric"],
                         cwd=tmp_path, capture_output=True, text=True, env=env)
    assert bad.returncode == 1 and "failed" in bad.stdout and "Reproduce" in bad.stdout, bad.stdout
