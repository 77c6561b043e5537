"""The command line as a user meets it: an adapter in the current folder, repro snippets that
rerun what was run, failure lines with their dtype, comma lists of globs, tables readable at 80
columns and when piped, install commands whole, --version, every option's default in its help."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from pgspec.conformance import cli

SCRIPT = str(Path(sys.executable).parent / "pgspec")

# A user's adapter module, as they would write it in their own repository: one correct formula
# and one with a real bug (masking by multiplication lets a masked inf become NaN).
MYMOD = '''
import torch
from pgspec.adapters.base import Adapter


def token_ratio(inputs, params):
    c = params.get("log_ratio_clamp")
    if set(params) - {"log_ratio_clamp"} or (c is not None and not c > 0):
        raise ValueError(f"bad parameters {params}")
    for name, t in inputs.items():  # the spec's expected-error cases: reject what it rejects
        if t.shape != inputs["mask"].shape or not torch.isfinite(t[inputs["mask"]].float()).all():
            raise ValueError(f"bad input {name}")
    x = torch.where(inputs["mask"], inputs["logprobs"] - inputs["old_logprobs"], 0.0)
    return {"ratio": torch.exp(x if c is None else x.clamp(-c, c))}


def token_ratio_masked_by_multiplication(inputs, params):
    return {"ratio": torch.exp((inputs["logprobs"] - inputs["old_logprobs"]) * inputs["mask"])}


adapter = Adapter("mine", "my-framework", "0.1", implementations={"ratio.token": token_ratio})
broken = Adapter("mine-broken", "my-framework", "0.1",
                 implementations={"ratio.token": token_ratio_masked_by_multiplication})
# the framework is this module: its exceptions are its rejections of invalid input
adapter.framework_modules = broken.framework_modules = (__name__,)
'''


def user_env(columns=80):
    """The environment of a user's shell: no PYTHONPATH, a terminal width, output piped."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    env["COLUMNS"] = str(columns)
    return env


def pgspec(*args, cwd=None, columns=80):
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, cwd=cwd, env=user_env(columns))


@pytest.fixture
def user_repo(tmp_path):
    (tmp_path / "mymod.py").write_text(MYMOD)
    return tmp_path


def test_a_module_object_adapter_imports_from_the_current_folder(user_repo):
    r = pgspec("run", "--adapter", "mymod:adapter", "--formulas", "ratio.token", "--dtype", "float64",
               "--no-properties", cwd=user_repo)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "No module named" not in r.stdout + r.stderr
    assert re.search(r"mine: no unexpected result; numeric: (\d+) of \1 applicable results pass", r.stdout), r.stdout


def test_failure_lines_keep_the_dtype_and_repro_reruns_the_same_spec(user_repo):
    r = pgspec("run", "--adapter", "mymod:broken", "--formulas", "ratio.token", "--dtype", "float64,float32",
               "--no-properties", "--report", "json:out.json", cwd=user_repo)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = [line for line in r.stdout.splitlines() if line.startswith("fail ")]
    assert any("(float64)" in line for line in lines) and any("(float32)" in line for line in lines), r.stdout
    assert len(set(lines)) == len(lines), "the same failure in two dtypes printed as identical lines"
    failed = [x for x in json.loads((user_repo / "out.json").read_text())["results"] if x["outcome"] == "fail"]
    assert failed
    repro = failed[0]["repro"]
    assert "load_adapter('mymod:broken')" in repro
    # the snippet, run from the same folder, reruns that case and reproduces the failure
    rerun = subprocess.run([sys.executable, "-c", repro], capture_output=True, text=True, cwd=user_repo,
                           env=user_env())
    assert rerun.returncode == 0, rerun.stderr
    assert "outcome='fail'" in rerun.stdout and failed[0]["case_id"] in rerun.stdout


def test_formulas_takes_a_comma_list_of_globs_everywhere():
    r = pgspec("formulas", "--json", "--formulas", "kl.k1, ratio.*")
    assert r.returncode == 0, r.stderr
    ids = {f["id"] for f in json.loads(r.stdout)}
    assert "kl.k1" in ids and "ratio.token" in ids and "ratio.sequence_geometric" in ids
    assert not any(i.startswith("kl.") and i != "kl.k1" for i in ids)
    table = pgspec("formulas", "--formulas", "kl.k1,ratio.token")
    assert table.returncode == 0 and "kl.k1" in table.stdout and "ratio.token" in table.stdout
    assert pgspec("formulas", "--formulas", "nothing.*,nada").returncode == 2


@pytest.mark.parametrize("columns", [80, 200])
def test_formulas_table_never_splits_an_id_at_80_columns_or_piped(columns):
    from pgspec.reference import REGISTRY

    r = pgspec("formulas", columns=columns)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert max(len(line) for line in lines) <= columns
    words = set(re.findall(r"[\w.]+\*?\??", r.stdout))
    for fid, f in REGISTRY.items():
        assert fid in words, f"{fid} is split or missing"
        for p in f.params:
            assert re.search(rf"\b{re.escape(p.name)}=", r.stdout), p.name


@pytest.mark.parametrize("columns", [80, 200])
def test_formulas_table_lists_outputs_and_its_legend_whole_when_piped(columns):
    """The legend was a rich caption cut to the table's width: piped, 'pgspec formulas --json'
    lost letters ('pgsp' ... 'formulas'). The table names each formula's outputs."""
    from pgspec.reference import REGISTRY

    r = pgspec("formulas", columns=columns)
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert ("* differentiable input (the corpus has its gradient); ? optional input; -> output, a name the "
            "adapter returns (pgspec formulas --json has their shapes") in text, r.stdout[-600:]
    rows = re.split(r"\n\s*\n", r.stdout)
    for fid, f in REGISTRY.items():
        [row] = [row for row in rows if re.search(rf"^\s+{re.escape(fid)}\s", row, re.M)]
        for o in f.outputs:
            assert re.search(rf"-> {re.escape(o.name)}\b", row), (fid, o.name, row)


@pytest.mark.parametrize("argv", [["formulas", "--json"], ["formulas"], ["adapters"], ["check", "--list"], [],
                                  ["run", "--help"],
                                  ["run", "--formulas", "kl.k1", "--dtype", "float64", "--no-properties"]])
def test_a_reader_that_closes_stdout_early_gets_silence_and_the_exit_code(argv):
    """`pgspec formulas --json | head -1` said 'pgspec formulas: Broken pipe' and exited 2, and rich's
    tables exited 1: the rest of the output is dropped silently and the exit code is the command's."""
    read, write = os.pipe()
    os.close(read)      # the reader is gone before the first write: every write breaks the pipe
    try:
        r = subprocess.run([SCRIPT, *argv], stdout=write, stderr=subprocess.PIPE, text=True, env=user_env())
    finally:
        os.close(write)
    assert r.returncode == (2 if argv == [] else 0), r.stderr
    assert r.stderr == "", r.stderr


def test_formulas_json_into_head_exits_0_silently():
    r = subprocess.run(["bash", "-c", f"set -o pipefail; '{SCRIPT}' formulas --json | head -1"],
                       capture_output=True, text=True, env=user_env())
    assert (r.returncode, r.stdout, r.stderr) == (0, "[\n", ""), r


def test_run_matrix_and_failures_readable_at_80_columns(user_repo):
    r = pgspec("run", "--adapter", "mymod:broken", "--formulas", "ratio.token", "--dtype", "float64,float32,bfloat16",
               "--no-properties", cwd=user_repo)
    matrix = r.stdout.split("\nfail ")[0]
    assert max(len(line) for line in matrix.splitlines()) <= 80
    fail = [line for line in r.stdout.splitlines() if line.startswith("fail ")]
    # one failure per line, never wrapped into a second line (grep-able when piped)
    assert all(re.match(r"fail ratio\.token/\S+ \((float64|float32|bfloat16)\): ", line) for line in fail), fail


def test_adapters_shows_install_commands_whole():
    from pgspec.conformance.run import runner

    r = pgspec("adapters")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "torch" in out
    checked = 0
    for name in runner.BUILTIN_ADAPTERS:
        try:
            ok, why = runner.load_adapter(name).available()
        except Exception as e:  # noqa: BLE001
            ok, why = False, str(e)
        if not ok:
            assert f"  {name}: {why}" in out.splitlines(), f"{name}: the reason is not printed whole"
            checked += 1
    table = out.split("(1) not available")[0]
    assert max(len(line) for line in table.splitlines()) <= 80
    if checked == 0:
        pytest.skip("every adapter is installed here: no install command to show")



def test_an_adapter_whose_framework_is_missing_still_lists_its_formulas(monkeypatch):
    """`pgspec adapters` said TRL implements 0 formulas where TRL is not installed (Liger, verl and the
    others list theirs): its adapter left its tables out.  They import without TRL."""
    from pgspec.adapters import trl as adapter_module
    from pgspec.adapters.trl import gmpo, impls, recipes

    monkeypatch.setattr(adapter_module, "_framework_version", lambda: None)
    a = adapter_module.make_adapter()
    assert a.version == "not installed" and not a.available()[0]
    assert a.capabilities() == {*impls.IMPLEMENTATIONS, *recipes.IMPLEMENTATIONS, *gmpo.IMPLEMENTATIONS} != set()

def test_version():
    r = pgspec("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"pgspec {version('pgspec')}"


def _options(parser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from ((f"{name} {opt}", act, sub) for opt, act, _ in _options(sub))
        elif action.option_strings and action.dest not in ("help", "version"):
            yield action.option_strings[-1], action, parser


def test_every_option_has_help_that_states_its_default_once():
    """argparse's ArgumentDefaultsHelpFormatter printed '(default: None)' after texts that state their
    own default ('required, no default'): each default is stated once, never as None, [] or False."""
    options = list(_options(cli.build_parser()))
    assert len(options) >= 9
    for name, action, parser in options:
        assert action.help and action.help.strip(), f"{name} has no help"
        formatted = parser._get_formatter()._expand_help(action) if action.help else ""
        assert formatted.lower().count("default") == 1, f"{name}: help states its default not once: {formatted!r}"
        for noise in ("(default: None)", "(default: [])", "(default: False)", "(default: True)"):
            assert noise not in formatted, f"{name}: {formatted!r}"
    # and as printed
    r = pgspec("run", "--help", columns=200)
    paragraphs = re.split(r"\n(?=  -)", r.stdout.split("options:")[1])
    for opt in ("--adapter", "--device", "--dtype", "--formulas", "--properties", "--case-timeout"):
        [para] = [p for p in paragraphs if p.strip().startswith(opt)]
        assert "(default: " in para, para
    check = pgspec("check", "--help", columns=200).stdout
    assert "(default: None)" not in check and "no default" in check


SUBCOMMANDS = ("formulas", "golden", "run", "adapters", "check", "fuzz")


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_has_a_description_and_two_examples(command):
    r = pgspec(command, "--help", columns=100)
    assert r.returncode == 0, r.stderr
    usage, description = r.stdout.split("\n\n")[:2]
    assert usage.startswith(f"usage: pgspec {command}") and len(description.split()) >= 10, r.stdout
    examples = r.stdout.split("\nexamples:\n")[1].splitlines()
    assert sum(line.startswith(f"  pgspec ") for line in examples) >= 2, r.stdout


def test_a_bare_pgspec_prints_the_help_and_exits_2():
    """Typing `pgspec` alone shows what it can do (not 'error: the following arguments are required');
    as a usage error (exit 2), so that a script's empty command never passes for a success."""
    r = pgspec()
    assert r.returncode == 2 and r.stderr == "", r.stderr
    assert r.stdout.startswith("usage: pgspec") and "commands:" in r.stdout and "examples:" in r.stdout
    for command in SUBCOMMANDS:
        assert f"    {command} " in r.stdout, command


@pytest.mark.parametrize("argv,hint", [
    (["runn"], "did you mean 'run'?"),
    (["formula"], "did you mean 'formulas'?"),
    (["golden", "verfy"], "did you mean 'verify'?"),
    (["run", "--dtpe", "float32"], "--dtpe: did you mean '--dtype'?"),
    (["check", "--formla=loss.grpo"], "--formla: did you mean '--formula'?"),
    (["run", "--device", "cdua"], "did you mean 'cuda'?"),
    (["run", "--adapter", "trll", "--formulas", "kl.k1"], "did you mean 'trl'?"),
    (["run", "--formulas", "kll.*"], "'kll.*': did you mean 'kl.*'"),
    (["run", "--formulas", "ratio.tokn"], "'ratio.tokn': did you mean 'ratio.token'"),
    (["formulas", "--formulas", "surrogate.ppo_clp"], "did you mean 'surrogate.ppo_clip'"),
    (["check", "--formula", "loss.grop", "--shape", "2x8"], "did you mean 'loss.grpo'"),
])
def test_a_mistyped_name_gets_did_you_mean(argv, hint):
    r = pgspec(*argv, columns=300)
    assert r.returncode == 2, r.stdout + r.stderr
    assert hint in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_run_gives_back_to_the_garbage_collector_what_it_froze(capsys, monkeypatch):
    """`pgspec run` pauses the cyclic collector while it loads, exempts the loaded corpus from it for
    the run (gc.freeze) with a higher young-generation threshold, and gives everything back at its
    end: nothing frozen, the thresholds and the enabled state as before."""
    import gc

    from pgspec.adapters.base import Adapter
    from pgspec.conformance.run import runner
    from pgspec.conformance.base.gcpause import RunCollector

    froze, seen = [], []
    real_freeze, real_call = gc.freeze, Adapter.call
    monkeypatch.setattr(gc, "freeze", lambda: (froze.append(1), real_freeze())[1])

    def call(self, *a, **k):
        seen.append((gc.isenabled(), gc.get_threshold()[0]))
        return real_call(self, *a, **k)

    monkeypatch.setattr(Adapter, "call", call)
    real_load = runner.load_adapter
    loading = []
    monkeypatch.setattr(runner, "load_adapter", lambda spec: (loading.append(gc.isenabled()), real_load(spec))[1])
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0 and gc.isenabled()
    code = cli.main(["run", "--formulas", "kl.k1", "--dtype", "float64,float32", "--no-properties"])
    capsys.readouterr()
    assert code == 0 and len(froze) == 3          # before the cases, and after each dtype's cases
    assert loading == [False]      # loaded once, with the collector paused while it and its framework load
    assert seen and set(seen) == {(True, RunCollector.RUN_THRESHOLD)}
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before and gc.isenabled()


def test_a_failed_run_gives_back_the_garbage_collector_too(capsys):
    """A run that stops on a bad argument, or with the collector disabled by its caller, leaves the
    collector as it found it."""
    import gc

    before = gc.get_threshold()
    assert cli.main(["run", "--adapter", "no.such.module:adapter", "--formulas", "kl.k1"]) == 2
    assert gc.isenabled() and gc.get_threshold() == before and gc.get_freeze_count() == 0
    gc.disable()
    try:
        assert cli.main(["run", "--formulas", "kl.k1", "--dtype", "float64", "--no-properties"]) == 0
        assert not gc.isenabled() and gc.get_threshold() == before and gc.get_freeze_count() == 0
    finally:
        gc.enable()
    capsys.readouterr()


INSTALL = re.compile(r'pip install -c constraints\.txt -e "\.\[(torch|trl|liger|verl)\]"')


def test_without_torch_a_run_says_how_to_install_it_in_one_line(tmp_path):
    """`pip install pgspec` without the torch extra, then `pgspec run`, said only "No module named 'torch'"."""
    blocker = tmp_path / "sitecustomize.py"     # this interpreter, as if torch were not installed
    blocker.write_text("import sys\nsys.modules['torch'] = None\n")
    env = {**user_env(), "PYTHONPATH": str(tmp_path)}
    for argv in (["run", "--formulas", "kl.k1"], ["check", "--formula", "agg.token_mean", "--shape", "2x8"]):
        r = subprocess.run([SCRIPT, *argv], capture_output=True, text=True, env=env)
        assert r.returncode == 2, r.stderr
        [line] = r.stderr.splitlines()
        assert "PyTorch is not installed" in line and INSTALL.search(line).group(1) == "torch", line


def test_install_hints_name_the_checkout_command_and_no_temporary_path():
    """One install instruction, from a checkout (pgspec is on no index): the adapters that install as
    extras say `pip install -c constraints.txt -e ".[X]"`; no message points at a /tmp venv."""
    from pgspec.conformance.run import runner

    root = Path(__file__).resolve().parent.parent
    for path in [*root.glob("adapters/**/*.py"), *root.glob("conformance/**/*.py")]:
        text = path.read_text()
        assert "/tmp/venv" not in text, path
        assert not re.search(r"pip install (trl|liger-kernel|verl)==", text), path
    assert 'pip install "pgspec[' not in (root / "README.md").read_text()
    for name in ("trl", "liger", "verl"):
        try:
            ok, why = runner.load_adapter(name).available()
        except runner.RunError as e:
            ok, why = False, str(e)
        if not ok:
            assert INSTALL.search(why) and INSTALL.search(why).group(1) == name, why
    r = pgspec("adapters")
    assert "/tmp/" not in r.stdout
