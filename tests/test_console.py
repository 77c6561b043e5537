"""The run's table adds up to its last line: each column's sum over the formulas is the count the
line gives, validation included, and the formulas an adapter lacks are one line, not a row each.  The
progress bar on a terminal counts what the line counts: its total is the line's "N results in all"."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest

from test_cli import MYMOD, user_env

SCRIPT = str(Path(sys.executable).parent / "pgspec")

# an adapter with three formulas: one correct, one wrong (a failure), one raising on every call
# (an error row, and no rejection: the exceptions come from this module, not a declared framework)
THREE = MYMOD + '''

import pgspec.adapters.torch as _t

_impl = _t.implementations()


def k1_scaled(inputs, params):
    return {"kl": _impl["kl.k1"](inputs, params)["kl"] * 1.5}


def k2_raising(inputs, params):
    raise RuntimeError("no k2 here")


three = Adapter("three", "my-framework", "0.1", implementations={
    "ratio.token": token_ratio, "kl.k1": k1_scaled, "kl.k2": k2_raising})
three.framework_modules = ("mymod",)
'''


def _run(tmp_path, *args):
    (tmp_path / "mymod.py").write_text(THREE)
    return subprocess.run([SCRIPT, "run", *args], capture_output=True, text=True, cwd=tmp_path,
                          env=user_env(columns=200))


def _table(stdout: str):
    lines = stdout.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("┃ formula"))
    names = [c.strip() for c in lines[head].strip("┃").split("┃")]
    rows = []
    for ln in lines[head + 2:]:
        if not ln.startswith("│"):
            break
        rows.append(dict(zip(names, (c.strip() for c in ln.strip("│").split("│")))))
    return names, rows


def _sum(rows, name):
    return sum(int(r[name] or 0) for r in rows)


@pytest.mark.parametrize("adapter", ["mymod:three", "torch"])
def test_the_columns_add_up_to_the_last_line(tmp_path, adapter):
    r = _run(tmp_path, "--adapter", adapter, "--formulas", "ratio.*,kl.k1,kl.k2,kl.k3", "--dtype", "float64,bf16",
             "--no-properties")
    assert r.returncode in (0, 1), r.stdout + r.stderr
    names, rows = _table(r.stdout)
    line = r.stdout.strip().splitlines()[-1]
    m = re.search(r"numeric: (\d+) of (\d+) applicable results pass, (\d+) known bugs? \(\d+ root causes?\), "
                  r"(\d+) conventions?, (\d+) not applicable", line)
    assert m, line
    passed, applicable, bugs, conventions, na = map(int, m.groups())
    assert _sum(rows, "pass") == passed
    assert sum(_sum(rows, k) for k in ("pass", "fail", "err", "stale", "bug", "conv") if k in names) == applicable
    for name, total in (("bug", bugs), ("conv", conventions), ("n/a", na)):
        assert (_sum(rows, name) if name in names else 0) == total, (name, line)
    for name, word in (("fail", "fail"), ("err", "error")):
        k = re.search(rf"(\d+) {word}[;:]", line.split("numeric:")[0])
        assert (_sum(rows, name) if name in names else 0) == (int(k.group(1)) if k else 0), (name, line)
    _in_all(line)       # and the line's counts add up to its total, the expected-error cases included
    v = re.search(r"validation: rejects (\d+) of (\d+) invalid inputs", line)
    rej = [tuple(map(int, x["rejects"].split("/"))) for x in rows if x["rejects"]]
    assert (sum(a for a, _ in rej), sum(b for _, b in rej)) == tuple(map(int, v.groups()))
    if adapter == "mymod:three":
        assert re.match(r"three: \d+ fail; \d+ error; numeric: ", line), line
        # the unimplemented formulas are one line, not a row each
        formulas = {x["formula"] for x in rows}
        assert formulas == {"ratio.token", "kl.k1", "kl.k2"}
        lacking = [ln for ln in r.stdout.splitlines() if ln.startswith("not implemented by three")]
        assert len(lacking) == 1 and "kl.k3" in lacking[0] and "ratio.sequence_product" in lacking[0]
        # kl.k2 raises everywhere, in the module declared the framework's: every invalid input "rejected"
        (k2,) = [x for x in rows if x["formula"] == "kl.k2"]
        assert k2["verdict"].startswith("ERROR") and re.fullmatch(r"([1-9]\d*)/\1", k2["rejects"])


def test_every_failure_line_has_a_rerun_command_that_reruns_it(tmp_path):
    r = _run(tmp_path, "--adapter", "mymod:three", "--formulas", "kl.k1", "--dtype", "float32", "--no-properties")
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    fails = [i for i, ln in enumerate(lines) if ln.startswith("fail ")]
    assert fails
    for i in fails:
        case_id = lines[i].split()[1]
        assert lines[i + 1] == (f"  rerun: pgspec run --adapter mymod:three --formulas {case_id} --dtype float32 "
                                "--no-properties")
    cmd = lines[fails[0] + 1].split("rerun: ", 1)[1].split()
    again = subprocess.run([SCRIPT, *cmd[1:]], capture_output=True, text=True, cwd=tmp_path, env=user_env(200))
    assert again.returncode == 1 and f"fail {lines[fails[0]].split()[1]} (float32)" in again.stdout


def test_the_repro_snippet_builds_the_inputs_and_calls_the_implementation(tmp_path):
    (tmp_path / "mymod.py").write_text(THREE)
    r = subprocess.run([SCRIPT, "run", "--adapter", "mymod:three", "--formulas", "kl.k1/empty-sequence", "--dtype",
                        "float64", "--no-properties", "--report", "json:r.json"], capture_output=True, text=True,
                       cwd=tmp_path, env=user_env(200))
    import json

    (row,) = [x for x in json.loads((tmp_path / "r.json").read_text())["results"] if x["outcome"] == "fail"]
    script = row["repro"] + "print('kl' in out, sorted(inputs), params)\n"
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path,
                         env={**user_env(200), "PYTHONPATH": str(tmp_path)})
    assert run.returncode == 0, run.stderr
    assert "outcome='fail'" in run.stdout and "True ['logprobs', 'mask', 'ref_logprobs'] {}" in run.stdout


def _in_all(line: str) -> int:
    """The line's total, checked to be the sum of every count it gives (numeric, then validation)."""
    m = re.search(r"numeric: \d+ of (\d+) applicable results pass, .*?, (\d+) not applicable(?:, (\d+) unsupported)?; "
                  r"validation: rejects \d+ of (\d+) invalid inputs(?: \((?:(\d+) not applicable)?(?:, )?"
                  r"(?:(\d+) unsupported)?\))?; (\d+) results in all$", line)
    assert m, line
    *parts, total = (int(x or 0) for x in m.groups())
    assert sum(parts) == total, line
    return total


def _run_on_a_terminal(tmp_path, *args):
    """`pgspec run` with its stderr on a pseudo-terminal (so the bar is drawn) and its stdout piped:
    (the run, everything the terminal received, ANSI sequences removed)."""
    import pty

    (tmp_path / "mymod.py").write_text(THREE)
    main, side = pty.openpty()
    env = {**user_env(columns=200), "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    p = subprocess.Popen([SCRIPT, "run", *args], stdout=subprocess.PIPE, stderr=side, cwd=tmp_path, env=env)
    os.close(side)
    seen = b""
    while True:
        if select.select([main], [], [], 0.5)[0]:
            try:
                chunk = os.read(main, 1 << 16)
            except OSError:         # the run ended and closed its side
                chunk = b""
            if not chunk:
                break
            seen += chunk
        elif p.poll() is not None:
            break
    out = p.stdout.read().decode()
    p.wait(timeout=60)
    os.close(main)
    return p.returncode, out, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen.decode(errors="replace"))


@pytest.mark.parametrize("adapter", ["mymod:three", "torch"])
def test_the_progress_bar_counts_what_the_last_line_counts(tmp_path, adapter):
    code, out, terminal = _run_on_a_terminal(tmp_path, "--adapter", adapter, "--formulas", "ratio.token,kl.k1,kl.k2",
                                             "--dtype", "float64,bf16")
    assert code in (0, 1), out + terminal
    total = _in_all(out.strip().splitlines()[-1])
    frames = re.findall(r"(golden cases|property checks), (float64|bfloat16) \((\d) of 2 dtypes\)[^\r\n]*?"
                        r"(\d+)/(\d+) ", terminal)
    assert frames, terminal[-2000:]
    # one total from the first frame to the last, and the bar ends there, on the property checks
    assert {int(f[4]) for f in frames} == {total}, (frames, total)
    assert frames[-1][:3] == ("property checks", "bfloat16", "2") and int(frames[-1][3]) == total
    assert {f[0] for f in frames} == {"golden cases", "property checks"}
    # without the property checks the bar counts the golden cases alone, as the line then does
    code, out, terminal = _run_on_a_terminal(tmp_path, "--adapter", adapter, "--formulas", "ratio.token,kl.k1,kl.k2",
                                             "--dtype", "float64,bf16", "--no-properties")
    fewer = _in_all(out.strip().splitlines()[-1])
    frames = re.findall(r"(\d+)/(\d+) ", terminal)
    assert fewer < total and frames and {int(b) for _, b in frames} == {fewer} and int(frames[-1][0]) == fewer
