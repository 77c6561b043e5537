"""Bad input to the isolated mode (``pgspec run --python``, issue 11): a wrong interpreter, a worker
that exits or hangs while loading the adapter, or a worker's traceback is one line (and where its
full output is saved), exit 2; malformed outputs and exits inside a case are that case's error.

The parent runs in-process (``cli.main``); each test that reaches a worker starts one, so there are
few of them."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from pgspec.conformance.cli import main
from pgspec.conformance.run.isolated import IsolatedAdapter
from pgspec.conformance.run.runner import RunError

FIXTURES = str(Path(__file__).parent / "fixtures")
KL = ["--formulas", "kl.k1/on-reference", "--dtype", "float64", "--no-properties"]


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([FIXTURES, str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("PGSPEC_LOG_DIR", str(tmp_path / "logs"))


def cli(capsys, *argv):
    code = main(["run", *argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def usage_line(capsys, *argv) -> str:
    code, out, err = cli(capsys, *argv)
    assert code == 2 and "pgspec conformance" not in out, (out, err)
    return err.splitlines()[-1]


def _script(tmp_path, name, text, mode=0o755):
    p = tmp_path / name
    p.write_text(text)
    p.chmod(mode)
    return str(p)


# the interpreter --------------------------------------------------------------------------------

def test_bin_true_is_not_a_python(capsys):
    assert usage_line(capsys, "--python", "/bin/true", *KL) == \
        "pgspec run: --python /bin/true: not a Python interpreter (running it with -c printed no version; exit code 0)"


def test_bin_false_is_not_a_python(capsys):
    assert usage_line(capsys, "--python", "/bin/false", *KL) == \
        "pgspec run: --python /bin/false: not a Python interpreter (running it with -c printed no version; exit code 1)"


def test_a_shell_script_is_not_a_python(capsys, tmp_path):
    path = _script(tmp_path, "fake-python", "#!/bin/sh\necho 'Python 3.12.0'\n")
    assert usage_line(capsys, "--python", path, *KL).startswith(f"pgspec run: --python {path}: not a Python interpreter")


def test_a_file_that_is_not_executable(capsys, tmp_path):
    path = _script(tmp_path, "python", "", mode=0o644)
    assert usage_line(capsys, "--python", path, *KL) == f"pgspec run: --python {path}: cannot run it: Permission denied"


def test_a_directory(capsys, tmp_path):
    assert usage_line(capsys, "--python", str(tmp_path), *KL) == (
        f"pgspec run: --python: {tmp_path} is a directory; give the interpreter, e.g. {tmp_path}/bin/python")


def test_a_missing_interpreter(capsys, tmp_path):
    assert usage_line(capsys, "--python", f"{tmp_path}/venv/bin/python", *KL) == \
        f"pgspec run: --python: {tmp_path}/venv/bin/python does not exist"


def test_an_old_python(capsys, tmp_path):
    path = _script(tmp_path, "python2", f"#!/bin/sh\necho 'pgspec-probe 2 7'\n")
    assert usage_line(capsys, "--python", path, *KL) == \
        f"pgspec run: --python {path}: Python 2.7; pgspec needs Python 3.11 or newer"


@pytest.mark.parametrize("kw,expected", [({"timeout": -1}, "--case-timeout must be a positive number of seconds, got -1"),
                                         ({"timeout": float("nan")}, "--case-timeout must be a positive number of seconds, got nan"),
                                         ({"startup_timeout": 0}, "--startup-timeout must be a positive number of seconds, got 0")])
def test_bad_timeouts_in_the_api(kw, expected):
    with pytest.raises(RunError, match=expected.replace("(", r"\(")):
        IsolatedAdapter(sys.executable, "torch", **kw)


def test_case_timeout_minus_one_on_the_command_line(capsys):
    code, out, err = cli(capsys, "--python", sys.executable, "--case-timeout", "-1", *KL)
    assert code == 2 and err.splitlines()[-1].endswith(
        "error: argument --case-timeout: must be a positive number of seconds, got '-1'")


# the worker's start-up -------------------------------------------------------------------------

def _saved(line: str, marker: str) -> str:
    path = line.split(marker)[1].split(")")[0].split(";")[0].strip()
    return Path(path).read_text()


def test_a_worker_that_exits_while_importing_the_adapter(capsys, tmp_path):
    (tmp_path / "dies_at_import.py").write_text("import os, sys\nprint('cannot find libcuda.so', file=sys.stderr, flush=True)\n"
                                                "os._exit(3)\n")
    line = usage_line(capsys, "--python", sys.executable, "--adapter", "dies_at_import:make", *KL)
    assert line.startswith(f"pgspec run: --python {sys.executable}: the worker for adapter 'dies_at_import:make' failed "
                           "while starting: the worker exited with code 3; its last line: cannot find libcuda.so; "
                           "its output is saved to ")
    assert "cannot find libcuda.so" in _saved(line, "its output is saved to ")


def test_an_adapter_module_that_calls_sys_exit_at_import(capsys, tmp_path):
    (tmp_path / "exits_at_import.py").write_text("import sys\nsys.exit(3)\n")
    line = usage_line(capsys, "--python", sys.executable, "--adapter", "exits_at_import:make", *KL)
    assert line.startswith(f"pgspec run: --python {sys.executable}: the worker could not load adapter 'exits_at_import:make': "
                           "adapter 'exits_at_import:make': importing 'exits_at_import' raised SystemExit (sys.exit(3)) "
                           "(the worker's traceback is saved to ")


def test_an_import_that_hangs_times_out_with_a_message(capsys, tmp_path):
    (tmp_path / "hangs_at_import.py").write_text("import time\ntime.sleep(600)\n")
    code, out, err = cli(capsys, "--python", sys.executable, "--adapter", "hangs_at_import:make", "--startup-timeout", "4", *KL)
    assert code == 2
    lines = err.splitlines()
    assert lines[0] == (f"pgspec run: starting the worker ({sys.executable}); it has 4 s (--startup-timeout) to load "
                        "adapter 'hangs_at_import:make'")
    assert lines[-1].startswith(f"pgspec run: --python {sys.executable}: the worker for adapter 'hangs_at_import:make' failed "
                                "while starting: no answer within 4 s: the worker was killed")
    assert lines[-1].endswith("(is importing the adapter hanging? --startup-timeout sets this limit)")


def test_a_factory_that_raises_in_the_worker_is_one_line_and_a_saved_traceback(capsys):
    line = usage_line(capsys, "--python", sys.executable, "--adapter", "bad_input_adapters:raising_factory", *KL)
    marker = "(the worker's traceback is saved to "
    assert line.startswith(f"pgspec run: --python {sys.executable}: the worker could not load adapter "
                           "'bad_input_adapters:raising_factory': adapter 'bad_input_adapters:raising_factory': the factory "
                           "raising_factory() raised ValueError: the config file adapter.yaml is missing " + marker)
    saved = _saved(line, marker)
    assert "Traceback (most recent call last)" in saved and "ValueError: the config file adapter.yaml is missing" in saved


# malformed results and crashes inside cases, in the worker ----------------------------------------

def test_wrong_shapes_and_exits_in_the_worker_are_case_errors(capsys, tmp_path):
    ids = ["kl.k1/on-reference", "kl.k2/on-reference", "kl.k3/on-reference", "kl.abs/on-reference",
           "kl.k3_unbiased/on-reference", "kl.k1/all-masked", "kl.k3_straight_through/on-reference"]
    code, out, err = cli(capsys, "--python", sys.executable, "--adapter", "bad_input_adapters:wrong_shapes",
                         "--formulas", ",".join(ids), "--dtype", "float64", "--no-properties",
                         "--report", f"json:{tmp_path}/r.json")
    assert code == 1 and "pgspec conformance: wrong-shapes" in out
    r = {x["case_id"]: x for x in json.loads((tmp_path / "r.json").read_text())["results"]}
    assert r["kl.k1/on-reference"]["outcome"] == "error"
    assert r["kl.k1/on-reference"]["message"].startswith("output 'kl' must have shape [")
    assert r["kl.k2/on-reference"]["message"].startswith("output 'kl' must have shape [")
    assert r["kl.k3/on-reference"]["message"].startswith("gradient 'grad.logprobs' must have shape [")
    assert r["kl.abs/on-reference"]["outcome"] == "error"
    assert r["kl.abs/on-reference"]["message"].strip().endswith("SystemExit: 5")
    assert r["kl.k3_unbiased/on-reference"]["outcome"] == "pass"
    assert r["kl.k1/all-masked"]["outcome"] == "error"  # the worker lived on after the exit
    # a worker that dies mid-case: one line, and where the worker's output is saved
    msg = r["kl.k3_straight_through/on-reference"]["message"]
    assert msg.startswith("the worker exited with code 3; its last line: about to die; its output is saved to ")
    assert "about to die" in Path(msg.split("saved to ")[1].strip()).read_text()
