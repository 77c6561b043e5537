"""Bad input to ``pgspec`` (issue 11), run in-process through ``cli.main``: every user error exits 2
with one line naming the argument and no traceback; a case's crash never stops the run; reports are
checked before the run and written atomically; a corrupted golden file is reported once and the
intact families still run; an internal error says so and saves its traceback to a file."""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from pgspec.conformance.corpus import golden
from pgspec.conformance import report
from pgspec.conformance.cli import main

FIXTURES = str(Path(__file__).parent / "fixtures")
BASE = ["run", "--formulas", "kl.k1", "--dtype", "float64", "--no-properties"]


_LOAD_ALL = golden.load_all
_CORPUS: list = []


def _load_all_once(directory=golden.GOLDEN_DIR, problems=None):
    """The intact committed corpus is parsed once for this module (each run would parse it twice,
    which only costs time here); any other directory, the corrupted copies below, loads as usual."""
    if Path(directory) != golden.GOLDEN_DIR:
        return _LOAD_ALL(directory, problems=problems)
    if not _CORPUS:
        _CORPUS.extend(_LOAD_ALL(directory))
    return [dict(c) for c in _CORPUS]


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(FIXTURES)
    monkeypatch.setenv("PGSPEC_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setattr(golden, "load_all", _load_all_once)


def cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def usage_error(capsys, *argv) -> str:
    """Exit 2, nothing run (no table), and the stderr line that says why."""
    code, out, err = cli(capsys, *argv)
    assert code == 2, (out, err)
    assert "pgspec conformance" not in out  # no run happened
    lines = [x for x in err.splitlines() if x.strip()]
    return lines[-1]


# --dtype, --formulas, --adapter, options --------------------------------------------------------

@pytest.mark.parametrize("dtype", ["", ",", " , ", ",,"])
def test_no_dtype_is_a_usage_error(capsys, dtype):
    line = usage_error(capsys, "run", "--formulas", "kl.k1", "--dtype", dtype, "--no-properties")
    assert line == (f"pgspec run: --dtype: no dtype given (got {dtype!r}); choose from float64 (fp64), float32 (fp32), bfloat16 (bf16), float16 (fp16, half)")


@pytest.mark.parametrize("dtype,bad,hint", [("float128", ["float128"], "; did you mean 'float32' or 'float16'"),
                                            ("float64,Float32", ["Float32"], "; did you mean 'float32'"),
                                            ("float", ["float"], "; 'float' is ambiguous (float32 in torch, float64 in Python"),
                                            ("bf61", ["bf61"], "; did you mean 'bf16'?"),
                                            ("float64;float32", ["float64;float32"], "; did you mean 'float64'"),
                                            ("int8", ["int8"], "")])
def test_unknown_dtype_is_a_usage_error(capsys, dtype, bad, hint):
    line = usage_error(capsys, "run", "--formulas", "kl.k1", "--dtype", dtype, "--no-properties")
    assert line.startswith(f"pgspec run: --dtype: unknown dtype(s) {bad}; choose from float64 (fp64), float32 (fp32), bfloat16 (bf16), float16 (fp16, half){hint}"), line
    assert hint or "did you mean" not in line, line


def test_a_repeated_dtype_runs_once(capsys, tmp_path):
    code, _, _ = cli(capsys, *BASE[:-2], "float64,float64", "--no-properties", "--report", f"json:{tmp_path}/r.json")
    assert code == 0
    results = json.loads((tmp_path / "r.json").read_text())["results"]
    assert len(results) == len({r["case_id"] for r in results}) > 0


@pytest.mark.parametrize("formulas,expected", [
    ("", "pgspec run: --formulas: no glob given (got ''); e.g. --formulas 'kl.*'"),
    ("kl.k9", "pgspec run: no formula or case matches 'kl.k9'; formula IDs: adv.batch_normalized"),
    ("KL.K1", "pgspec run: no formula or case matches 'KL.K1'"),
])
def test_bad_formula_selection(capsys, formulas, expected):
    line = usage_error(capsys, "run", "--formulas", formulas, "--dtype", "float64", "--no-properties")
    assert line.startswith(expected)


@pytest.mark.parametrize("adapter,expected", [
    (":", "adapter ':': expected module:object with both parts"),
    ("nope", "unknown adapter 'nope'; built-in adapters:"),
    ("no_such_mod:x", "adapter 'no_such_mod:x': cannot import 'no_such_mod': No module named 'no_such_mod'"),
    ("bad_input_adapters:raising_factory", "the factory raising_factory() raised ValueError: the config file adapter.yaml is missing"),
    ("bad_input_adapters:exiting_factory", "the factory exiting_factory() raised SystemExit (sys.exit(4))"),
    ("bad_input_adapters:half_adapter", "gave Half, which is not an adapter"),
    ("bad_input_adapters:broken_available", "adapter 'bad_input_adapters:broken_available': its available() raised "
                                            "RuntimeError: cannot query the GPU driver"),
    ("bad_input_adapters:broken_capabilities", "its capabilities() raised RuntimeError: capabilities broke"),
])
def test_bad_adapter(capsys, adapter, expected):
    line = usage_error(capsys, *BASE, "--adapter", adapter)
    assert line.startswith("pgspec run: ") and expected in line


def test_syntax_error_in_the_adapter_module(capsys, tmp_path, monkeypatch):
    (tmp_path / "syntaxmod.py").write_text("def make_adapter(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    line = usage_error(capsys, *BASE, "--adapter", "syntaxmod:make_adapter")
    assert line.startswith("pgspec run: adapter 'syntaxmod:make_adapter': cannot import 'syntaxmod': syntax error in ")
    assert "syntaxmod.py, line 1" in line


@pytest.mark.parametrize("argv,expected", [
    (["--case-timeout", "-1"], "argument --case-timeout: must be a positive number of seconds, got '-1'"),
    (["--case-timeout", "0"], "argument --case-timeout: must be a positive number of seconds, got '0'"),
    (["--case-timeout", "nan"], "argument --case-timeout: must be a positive number of seconds, got 'nan'"),
    (["--case-timeout", "inf"], "argument --case-timeout: must be a positive number of seconds, got 'inf'"),
    (["--case-timeout", "soon"], "argument --case-timeout: must be a number of seconds, got 'soon'"),
    (["--startup-timeout", "-5"], "argument --startup-timeout: must be a positive number of seconds, got '-5'"),
    (["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_option_values_are_argparse_usage_errors(capsys, argv, expected):
    code, out, err = cli(capsys, *BASE, *argv)
    assert code == 2 and expected in err.splitlines()[-1]


@pytest.mark.parametrize("argv,expected", [
    (["golden", "regenerate"], "argument action: invalid choice: 'regenerate'"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_bad_commands(capsys, argv, expected):
    code, _, err = cli(capsys, *argv)
    assert code == 2 and expected in err


def test_no_command_prints_the_help_as_a_usage_error(capsys):
    """Not 'the following arguments are required: command': the help itself (test_cli has the console script)."""
    code, out, err = cli(capsys)
    assert code == 2 and out.startswith("usage: pgspec") and "commands:" in out and err == ""


@pytest.mark.parametrize("name,value,argv,expected", [
    ("PGSPEC_COMPARE", "bogus", BASE, "PGSPEC_COMPARE must be 'fast' (the default) or 'exact'"),
    ("PGSPEC_COMPARE", "", BASE, "got ''"),
    ("PGSPEC_JOBS", "abc", ["golden", "verify"], "PGSPEC_JOBS must be an integer from 1 to 256"),
    ("PGSPEC_JOBS", "0", ["golden", "verify"], "got '0'"),
    ("PGSPEC_JOBS", "-2", ["golden", "generate"], "got '-2'"),
])
def test_bad_environment_settings_are_usage_errors(capsys, monkeypatch, name, value, argv, expected):
    """Once an internal error (PGSPEC_JOBS=abc), a silent 1 (PGSPEC_JOBS=0) or a traceback at import
    (PGSPEC_COMPARE=bogus): one line naming the variable, before any work."""
    monkeypatch.setenv(name, value)
    monkeypatch.setattr(golden, "write_all", lambda *a, **k: pytest.fail("generate ran"), raising=False)
    line = usage_error(capsys, *argv)
    assert name in line and expected in line, line


def test_formulas_command_with_no_match(capsys):
    code, _, err = cli(capsys, "formulas", "--formulas", "zz.*")
    assert code == 2 and err.startswith("pgspec: no formula matches 'zz.*'; known IDs: ")


# runs that run nothing -------------------------------------------------------------------------

@pytest.mark.parametrize("argv,expected", [
    (["--adapter", "bad_input_adapters:k1_only", "--formulas", "kl.k2", "--dtype", "float64"],
     "pgspec run: nothing to run: adapter 'k1-only' implements none of the {n} selected cases' formulas (kl.k2)"),
    (["--adapter", "bad_input_adapters:float64_only", "--formulas", "kl.k1", "--dtype", "float32,bfloat16"],
     "pgspec run: nothing to run: adapter 'f64-only' supports dtypes float64, none of float32, bfloat16"),
])
def test_a_run_that_would_run_nothing_is_a_usage_error(capsys, argv, expected):
    from pgspec.conformance.run.runner import select_cases

    n = len(select_cases("kl.k2"))
    assert usage_error(capsys, "run", *argv, "--no-properties") == expected.format(n=n)


def test_a_run_where_every_case_is_not_applicable_fails(capsys, tmp_path):
    code, out, err = cli(capsys, "run", "--formulas", "kl.k1/tiny-log-ratio", "--dtype", "float16", "--no-properties",
                         "--report", f"json:{tmp_path}/r.json")
    assert code == 2
    assert err.splitlines()[-1] == ("pgspec run: nothing was run: all 1 (case, dtype) pairs are unsupported or not "
                                    "applicable (see the table)")
    (r,) = json.loads((tmp_path / "r.json").read_text())["results"]
    assert r["outcome"] == "not-applicable" and "float16" in r["message"]


# a crash in one case never stops the run ----------------------------------------------------------

def test_sys_exit_in_an_adapter_is_one_case_error_and_the_run_goes_on(capsys, tmp_path):
    code, out, err = cli(capsys, "run", "--adapter", "bad_input_adapters:exits", "--formulas", "kl.k1,kl.k2",
                         "--dtype", "float64", "--no-properties", "--report", f"json:{tmp_path}/r.json")
    assert code == 1
    assert "pgspec conformance: raising-sys-exit-3" in out  # the table was printed
    results = json.loads((tmp_path / "r.json").read_text())["results"]
    k1 = [r for r in results if r["formula"] == "kl.k1"]
    k2 = [r for r in results if r["formula"] == "kl.k2"]
    assert k1 and all(r["outcome"] == "error" and r["message"].strip().endswith("SystemExit: 3") for r in k1)
    # kl.k2 is correct: its numeric cases pass; its invalid inputs are raised by the built-in backend's code,
    # which this adapter does not declare its framework's (no framework_modules): not rejections
    assert k2 and all(r["outcome"] == ("not-rejected" if r["category"] == "error" else "pass") for r in k2)


def test_sys_exit_in_the_property_checks_does_not_stop_the_run(capsys, tmp_path):
    code, out, err = cli(capsys, "run", "--adapter", "bad_input_adapters:exits", "--formulas", "kl.k1",
                         "--dtype", "float64", "--report", f"json:{tmp_path}/r.json")
    assert code == 1 and "pgspec conformance" in out
    results = json.loads((tmp_path / "r.json").read_text())["results"]
    (prop,) = [r for r in results if r["category"] == "property"]  # the property checks' crash: one error row
    assert prop["case_id"] == "prop.all/*" and prop["outcome"] == "error"
    assert prop["message"].startswith("SystemExit (sys.exit(3)); the traceback is saved to ")
    assert [r["outcome"] for r in results if r["category"] != "property"] == ["error"] * (len(results) - 1)


def test_keyboard_interrupt_stops_the_run_with_130(capsys):
    code, out, err = cli(capsys, "run", "--adapter", "bad_input_adapters:interrupting", "--formulas", "kl.k1",
                         "--dtype", "float64", "--no-properties")
    assert code == 130 and err.splitlines()[-1] == "pgspec run: interrupted"


@pytest.mark.parametrize("kind", ["extra-column", "1BT", "scalar", "int64"])
def test_wrong_shape_outputs_are_case_errors_in_a_cli_run(capsys, tmp_path, kind):
    code, out, err = cli(capsys, "run", "--adapter", f"bad_input_adapters:spoiled_{kind.replace('-', '_')}",
                         "--formulas", "kl.k1", "--dtype", "float64", "--no-properties", "--report", f"json:{tmp_path}/r.json")
    assert code == 1 and "pgspec conformance" in out
    results = [r for r in json.loads((tmp_path / "r.json").read_text())["results"] if r["category"] != "error"]
    assert results and all(r["outcome"] == "error" and r["message"].startswith("output 'kl' must ") for r in results)


# report paths ----------------------------------------------------------------------------------

@pytest.mark.parametrize("spec,expected", [
    ("xml:r.xml", "pgspec run: --report takes json:PATH, md:PATH or html:PATH, got 'xml:r.xml'"),
    ("json:", "pgspec run: --report takes json:PATH, md:PATH or html:PATH, got 'json:'"),
    ("r.json", "pgspec run: --report takes json:PATH, md:PATH or html:PATH, got 'r.json'"),
    ("json:/sys/r.json", "pgspec run: --report 'json:/sys/r.json': cannot write in /sys: Permission denied"),
    ("json:/etc/hostname/r.json", "pgspec run: --report 'json:/etc/hostname/r.json': /etc/hostname is not a directory"),
    ("md:/etc/hostname/a/b/r.md", "pgspec run: --report 'md:/etc/hostname/a/b/r.md': /etc/hostname is not a directory"),
    ("json:/dev/null", "pgspec run: --report 'json:/dev/null': /dev/null exists and is not a regular file"),
    ("html:/dev/full", "pgspec run: --report 'html:/dev/full': /dev/full exists and is not a regular file"),
])
def test_bad_report_path_is_refused_before_the_run(capsys, spec, expected):
    assert usage_error(capsys, *BASE, "--report", spec) == expected


def test_a_directory_as_report_path(capsys, tmp_path):
    assert usage_error(capsys, *BASE, "--report", f"json:{tmp_path}") == \
        f"pgspec run: --report 'json:{tmp_path}': {tmp_path} is a directory; give a file path"


def test_the_same_report_path_twice(capsys, tmp_path):
    line = usage_error(capsys, *BASE, "--report", f"json:{tmp_path}/r", "--report", f"md:{tmp_path}/r")
    assert line == f"pgspec run: --report 'md:{tmp_path}/r': {tmp_path}/r is given twice"


def test_a_full_device_is_refused_before_the_run(capsys, tmp_path, monkeypatch):
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=512))
    assert usage_error(capsys, *BASE, "--report", f"json:{tmp_path}/r.json") == \
        f"pgspec run: --report 'json:{tmp_path}/r.json': the device holding {tmp_path} is full (512 bytes free)"


def test_report_directories_are_created(capsys, tmp_path):
    code, _, err = cli(capsys, *BASE, "--report", f"md:{tmp_path}/a/b/r.md")
    assert code == 0 and (tmp_path / "a/b/r.md").read_text().startswith("# pgspec conformance: torch")


def test_a_failed_write_leaves_the_old_report_intact_and_writes_the_others(capsys, tmp_path, monkeypatch):
    """Reports are written to a temporary file and renamed: a full disk mid-write leaves the
    previous report whole, no temporary file behind, and the other reports are still written."""
    old = tmp_path / "r.json"
    old.write_text("previous report\n")
    real_fsync = os.fsync
    calls = []

    def fsync(fd):
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    code, out, err = cli(capsys, *BASE, "--report", f"json:{old}", "--report", f"md:{tmp_path}/r.md")
    assert code == 2
    assert f"pgspec run: cannot write the json report to {old}: No space left on device (nothing was written there)" in err
    assert old.read_text() == "previous report\n"
    assert (tmp_path / "r.md").read_text().startswith("# pgspec conformance")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "logs") == ["r.json", "r.md"]


def test_write_atomic_replaces_whole_files(tmp_path):
    p = tmp_path / "r.md"
    report.write_atomic(p, "one\n")
    report.write_atomic(p, "two\n")
    assert p.read_text() == "two\n" and [x.name for x in tmp_path.iterdir()] == ["r.md"]
    assert oct(p.stat().st_mode & 0o777) != oct(0o600)  # readable like any file the user writes


# golden files ----------------------------------------------------------------------------------

@pytest.fixture
def corpus(tmp_path, monkeypatch):
    """A copy of the kl and ratio golden files (and a MANIFEST for them) that the run loads."""
    d = tmp_path / "golden"
    d.mkdir()
    manifest = json.loads((golden.GOLDEN_DIR / "MANIFEST").read_text())
    manifest["files"] = {k: v for k, v in manifest["files"].items() if k in ("kl.json", "ratio.json")}
    for name in manifest["files"]:
        shutil.copy(golden.GOLDEN_DIR / name, d / name)
    (d / "MANIFEST").write_text(json.dumps(manifest, indent=1))
    monkeypatch.setattr(golden, "load_all", functools.partial(_LOAD_ALL, d))
    return d


def _rehash(d, name):
    m = json.loads((d / "MANIFEST").read_text())
    m["files"][name] = hashlib.sha256((d / name).read_bytes()).hexdigest()
    (d / "MANIFEST").write_text(json.dumps(m, indent=1))


def _edit(d, fn, rehash=True):
    doc = json.loads((d / "kl.json").read_text())
    fn(doc)
    (d / "kl.json").write_text(json.dumps(doc, indent=1))
    if rehash:
        _rehash(d, "kl.json")


def _set_first_output(doc, value):
    doc["cases"][0]["outputs"]["kl"][0][0] = value


CORRUPTIONS = {
    "value-changed": (lambda d: _edit(d, lambda doc: _set_first_output(doc, "0.5"), rehash=False),
                      "kl.json: sha256 {sha} does not match the MANIFEST", "`pgspec golden verify` names the case and field that differ"),
    "value-not-a-number": (lambda d: _edit(d, lambda doc: _set_first_output(doc, "abc"), rehash=False),
                           "kl.json: sha256 {sha} does not match the MANIFEST", "at cases/0 (case 'kl.k1/on-reference') field outputs.kl[0][0]: 'abc'"),
    "truncated": (lambda d: (d / "kl.json").write_bytes((d / "kl.json").read_bytes()[:1000]),
                  "kl.json: sha256 {sha} does not match the MANIFEST", "it is not valid JSON"),
    "deleted": (lambda d: (d / "kl.json").unlink(), "kl.json: no golden file for family 'kl'", ""),
    "bad-category": (lambda d: _edit(d, lambda doc: doc["cases"][1].update(category="bogus")),
                     "kl.json: does not match schema.json at cases/1 (case 'kl.k1/",
                     "') field category: 'bogus' is not one of"),
    "unknown-field": (lambda d: _edit(d, lambda doc: doc["cases"][2].update(extra=1)),
                      "kl.json: does not match schema.json at cases/2 (case 'kl.k1/", "'): Additional properties"),
    "unknown-formula": (lambda d: _edit(d, lambda doc: doc["cases"][0].update(formula="kl.k9")),
                        "kl.json: cases/0 (case 'kl.k1/on-reference') field formula: unknown formula ID 'kl.k9'", ""),
    "wrong-family": (lambda d: _edit(d, lambda doc: doc.update(family="ratio")),
                     "kl.json: field family is 'ratio', expected 'kl' (the file name)", ""),
    "unknown-input": (lambda d: _edit(d, lambda doc: doc["cases"][0]["inputs"].update(logits=[["0.0"]])),
                      "kl.json: cases/0 (case 'kl.k1/on-reference') field inputs: unknown input(s) ['logits']", ""),
    "missing-output": (lambda d: _edit(d, lambda doc: doc["cases"][0]["outputs"].clear()),
                       "kl.json: cases/0 (case 'kl.k1/on-reference') field outputs: has [], kl.k1 declares ['kl']", ""),
    "grad-of-a-mask": (lambda d: _edit(d, lambda doc: doc["cases"][0]["grad"].update(mask=[[True]])),
                       "kl.json: cases/0 (case 'kl.k1/on-reference') field grad: ['mask'] are not differentiable", ""),
    "id-of-another-formula": (lambda d: _edit(d, lambda doc: doc["cases"][0].update(id="kl.k2/x")),
                              "kl.json: cases/0 (case 'kl.k2/x') field id: must start with the formula ID 'kl.k1'", ""),
    "bad-format": (lambda d: _edit(d, lambda doc: doc.update(format="pgspec-golden/3")),
                   "kl.json: field format is 'pgspec-golden/3'; this pgspec reads 'pgspec-golden/2'", ""),
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_a_corrupted_family_is_reported_once_and_the_others_run(capsys, tmp_path, corpus, name):
    corrupt, first, second = CORRUPTIONS[name]
    corrupt(corpus)
    sha = hashlib.sha256((corpus / "kl.json").read_bytes()).hexdigest() if (corpus / "kl.json").exists() else ""
    code, out, err = cli(capsys, "run", "--formulas", "kl.k1,ratio.token", "--dtype", "float64", "--no-properties",
                         "--report", f"json:{tmp_path}/r.json")
    assert code == 2
    problems = [x for x in err.splitlines() if x.startswith("pgspec run: golden file problem")]
    assert len(problems) == 1  # once
    assert f"{corpus}/{first.format(sha=sha)}" in problems[0] and second in problems[0]
    assert err.splitlines()[-1] == "pgspec run: 1 golden file(s) are corrupted (above); the run fails"
    results = json.loads((tmp_path / "r.json").read_text())["results"]
    assert results and {r["formula"] for r in results} == {"ratio.token"}  # the intact family ran
    assert all(r["outcome"] in ("pass", "rejected") for r in results)


def test_a_corrupted_family_alone_runs_nothing(capsys, corpus):
    CORRUPTIONS["truncated"][0](corpus)
    code, out, err = cli(capsys, "run", "--formulas", "kl.k1", "--dtype", "float64", "--no-properties")
    assert code == 2 and "pgspec conformance" not in out
    assert err.splitlines()[-1] == "pgspec run: nothing to run: every golden file the selection needs is corrupted (above)"


@pytest.mark.parametrize("content,expected", [
    ("{not json", "MANIFEST: not valid JSON"),
    ("[]", "MANIFEST: field 'files' (file name -> sha256) is missing or not an object"),
    ('{"files": 3}', "MANIFEST: field 'files' (file name -> sha256) is missing or not an object"),
    (None, "MANIFEST: missing; run `pgspec golden generate`"),
])
def test_a_bad_manifest_is_one_line(capsys, corpus, content, expected):
    if content is None:
        (corpus / "MANIFEST").unlink()
    else:
        (corpus / "MANIFEST").write_text(content)
    line = usage_error(capsys, *BASE)
    assert line.startswith(f"pgspec run: golden corpus: {corpus}/{expected}")


def test_load_all_without_problems_still_raises(corpus):
    CORRUPTIONS["truncated"][0](corpus)
    with pytest.raises(golden.GoldenError, match="kl.json: sha256"):
        _LOAD_ALL(corpus)


# internal errors -------------------------------------------------------------------------------

def test_an_internal_error_says_so_and_saves_the_traceback(capsys, tmp_path, monkeypatch):
    def broken(*a, **k):
        raise ZeroDivisionError("a bug in the matrix")

    monkeypatch.setattr(report, "print_matrix", broken)
    code, out, err = cli(capsys, *BASE)
    assert code == 3
    lines = err.splitlines()
    assert lines[-2] == "pgspec run: internal error (a bug in pgspec, not in your input): ZeroDivisionError: a bug in the matrix"
    assert lines[-1].startswith(f"the traceback is saved to {tmp_path}/logs/internal-error-")
    assert lines[-1].endswith(".log; please report it to the pgspec issue tracker with that file")
    saved = Path(lines[-1].split("saved to ")[1].split(";")[0]).read_text()
    assert "Traceback (most recent call last)" in saved and "ZeroDivisionError: a bug in the matrix" in saved


def test_a_crash_of_pgspec_inside_one_case_is_that_case_error(capsys, tmp_path, monkeypatch):
    """Even a pgspec bug in one case (here: the runner's own steps raising) does not stop the run."""
    from pgspec.conformance.run import runner

    real = runner.start_case

    def flaky(adapter, case, dtype, device, **known):
        if case["id"] == "kl.k1/on-reference":
            raise IndexError("pgspec bug")
        return real(adapter, case, dtype, device, **known)

    monkeypatch.setattr(runner, "start_case", flaky)
    code, out, err = cli(capsys, *BASE, "--report", f"json:{tmp_path}/r.json")
    assert code == 1
    results = {r["case_id"]: r for r in json.loads((tmp_path / "r.json").read_text())["results"]}
    bad = results.pop("kl.k1/on-reference")
    assert bad["outcome"] == "error" and bad["message"].startswith("IndexError: pgspec bug; the traceback is saved to ")
    assert results and all(r["outcome"] in ("pass", "rejected") for r in results.values())


def test_a_crash_while_gathering_one_case_is_that_case_error(capsys, tmp_path, monkeypatch):
    """Results are gathered a few hundred cases at a time after their calls; a crash there is the
    case's error row too, reported once."""
    from pgspec.conformance.judge import compare

    real = compare.gather_case
    crashes = []

    def flaky(case, checks):
        if case["id"] == "kl.k1/on-reference":
            crashes.append(1)
            raise IndexError("pgspec bug")
        return real(case, checks)

    monkeypatch.setattr(compare, "gather_case", flaky)
    code, out, err = cli(capsys, *BASE, "--report", f"json:{tmp_path}/r.json")
    assert code == 1 and crashes == [1]
    results = {r["case_id"]: r for r in json.loads((tmp_path / "r.json").read_text())["results"]}
    bad = results.pop("kl.k1/on-reference")
    assert bad["outcome"] == "error" and bad["message"].startswith("IndexError: pgspec bug; the traceback is saved to ")
    assert results and all(r["outcome"] in ("pass", "rejected") for r in results.values())


def test_a_crash_in_the_comparison_of_one_case_is_that_case_error(capsys, tmp_path, monkeypatch):
    """The comparisons of a dtype's cases are made together; when that raises, each case is compared
    on its own, so a comparison bug that one case triggers is that case's error row."""
    from pgspec.conformance.judge import compare
    from pgspec.conformance.run import runner

    real_batch, real_one = compare.compare_cases, runner._compare_pending
    calls = []

    def batch(items, dtype):
        calls.append(len(items))
        if len(items) > 1:
            raise IndexError("pgspec bug in the batch")
        return real_batch(items, dtype)

    def flaky(step):
        if step.case["id"] == "kl.k1/on-reference":
            raise IndexError("pgspec bug")
        return real_one(step)

    monkeypatch.setattr(compare, "compare_cases", batch)
    monkeypatch.setattr(runner, "_compare_pending", flaky)
    code, out, err = cli(capsys, *BASE, "--report", f"json:{tmp_path}/r.json")
    assert code == 1 and calls[0] > 1 and set(calls[1:]) == {1}
    results = {r["case_id"]: r for r in json.loads((tmp_path / "r.json").read_text())["results"]}
    bad = results.pop("kl.k1/on-reference")
    assert bad["outcome"] == "error" and bad["message"].startswith("IndexError: pgspec bug; the traceback is saved to ")
    assert results and all(r["outcome"] in ("pass", "rejected") for r in results.values())


def test_no_python_module_traceback_reaches_a_user_even_from_the_entry_point(tmp_path):
    """The console script: one subprocess, to see what a user's terminal sees."""
    import subprocess

    r = subprocess.run([sys.executable, "-m", "pgspec.conformance.cli", "run", "--dtype", "", "--formulas", "kl.k1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == "pgspec run: --dtype: no dtype given (got ''); choose from float64 (fp64), float32 (fp32), bfloat16 (bf16), float16 (fp16, half)\n"


@pytest.mark.parametrize("alias,dtype", [("fp64", "float64"), ("double", "float64"), ("fp32", "float32"),
                                         ("bf16", "bfloat16"), ("fp16", "float16"), ("half", "float16")])
def test_the_dtype_aliases_name_the_canonical_dtype(alias, dtype):
    from pgspec.conformance.judge.tolerance import parse_dtypes

    assert parse_dtypes(f"{alias},{dtype}") == [dtype]
    assert parse_dtypes(alias, option="--pgspec-dtype") == [dtype]


def test_run_and_check_take_the_dtype_aliases(capsys, tmp_path):
    code, _, err = cli(capsys, "run", "--formulas", "kl.k1", "--dtype", "fp32,bf16", "--no-properties",
                       "--report", f"json:{tmp_path}/r.json")
    assert code == 0, err
    assert {r["dtype"] for r in json.loads((tmp_path / "r.json").read_text())["results"]} == {"float32", "bfloat16"}
    code, out, err = cli(capsys, "check", "--formula", "agg.token_mean", "--shape", "2x8", "--dtype", "bf16")
    assert code == 0, err
    assert "agg.token_mean bfloat16" in out, out
