"""The run's table adds up to its last line: each column's sum over the formulas is the count the
line gives, validation included, and the formulas an adapter lacks are one line, not a row each."""

from __future__ import annotations

import re
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
