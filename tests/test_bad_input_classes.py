"""Bad input by class (issue 39's principles): whatever an adapter declares is checked where it is
read and is the adapter's fault (exit 2, naming the attribute), never an internal error; a formula
glob that matches nothing is never dropped silently."""

from __future__ import annotations

import re

import pytest

from pgspec.adapters.base import Adapter
from pgspec.conformance.run import runner


def _module(tmp_path, monkeypatch, body: str) -> str:
    (tmp_path / "protomod.py").write_text("from pgspec.adapters.base import Adapter\n"
                                          "import pgspec.adapters.torch as _t\n"
                                          "IMPL = {'kl.k1': _t.implementations()['kl.k1']}\n" + body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "protomod", raising=False)
    return "protomod:adapter"


@pytest.mark.parametrize("body, message", [
    ("class A(Adapter):\n    def available(self):\n        return True\nadapter = A('a', 'f', '0', implementations=IMPL)",
     r"available\(\) must return \(ok: bool, why: str\), got True"),
    ("class A(Adapter):\n    def available(self):\n        return (True, 5)\nadapter = A('a', 'f', '0', implementations=IMPL)",
     r"available\(\) must return \(ok: bool, why: str\), got \(True, 5\)"),
    ("class A(Adapter):\n    def capabilities(self):\n        return None\nadapter = A('a', 'f', '0', implementations=IMPL)",
     r"capabilities\(\) must return a set of formula IDs, got None"),
    ("class A(Adapter):\n    def capabilities(self):\n        return {1, 2}\nadapter = A('a', 'f', '0', implementations=IMPL)",
     r"capabilities\(\) must return a set of formula IDs"),
    ("adapter = Adapter(5, 'f', '0', implementations=IMPL)", "name must be a non-empty string, got 5"),
    ("adapter = Adapter('  ', 'f', '0', implementations=IMPL)", "name must be a non-empty string"),
    ("adapter = Adapter('a', 'f', None, implementations=IMPL)", "version must be a non-empty string, got None"),
    ("adapter = Adapter('a', 'f', '0', dtypes=('float64', 'fp128'), implementations=IMPL)",
     r"dtypes must be among .*got \['fp128'\]"),
    ("adapter = Adapter('a', 'f', '0', dtypes='float64', implementations=IMPL)", "dtypes must be a non-empty tuple"),
    ("adapter = Adapter('a', 'f', '0', devices=(), implementations=IMPL)", "devices must be a non-empty tuple"),
    ("adapter = Adapter('a', 'f', '0', implementations=[('kl.k1', None)])", "implementations must be a dict"),
])
def test_a_protocol_violation_is_the_adapters_error_naming_the_attribute(tmp_path, monkeypatch, body, message):
    spec = _module(tmp_path, monkeypatch, body)
    with pytest.raises(runner.RunError, match=message) as e:
        runner.load_adapter(spec)
    assert "protomod:adapter" in str(e.value)


def test_a_raising_available_is_left_to_where_it_is_asked(tmp_path, monkeypatch):
    spec = _module(tmp_path, monkeypatch, "class A(Adapter):\n    def available(self):\n        raise OSError('x')\n"
                                          "adapter = A('a', 'f', '0', implementations=IMPL)")
    assert runner.load_adapter(spec).name == "a"


@pytest.mark.parametrize("globs, dead", [("kl.k3,loss.gpro", "'loss.gpro'"), ("kl.k3,kl.k3/no-such-case", "'kl.k3/no-such-case'"),
                                         ("ratio.*, kl.k9 ,kl.k1", "'kl.k9'")])
def test_a_glob_that_matches_nothing_beside_one_that_does_is_refused(globs, dead):
    with pytest.raises(runner.RunError, match=f"--formulas: {dead}.* matches no formula or case ID"):
        runner.select_cases(globs)


def test_globs_that_all_match_select_their_union():
    both = runner.select_cases("kl.k3,kl.k1/empty-sequence")
    assert {c["formula"] for c in both} == {"kl.k3", "kl.k1"}
    assert [c["id"] for c in both if c["formula"] == "kl.k1"] == ["kl.k1/empty-sequence"]


@pytest.mark.parametrize("damage, message", [
    (b'\n[[preset]]\nconfig = "x"\nrecipe = "loss.grpo"\nparams = { eps_low = "abc" }\nlink = "l"\n',
     r"verl\.toml: \[\[preset\]\] #\d+: loss\.grpo: parameter 'eps_low' must be real"),
    (b"\n[[preset]\n", r"verl\.toml: not valid TOML"),
    (b"\xff\xfe", r"verl\.toml, line \d+, column \d+: not UTF-8 text"),
    (b'\n[[preset]]\nconfig = "x"\nrecipe = "loss.nope"\nlink = "l"\n', r"recipe 'loss\.nope' is not a loss\.\* recipe"),
    (b'\nsurprise = 1\n', r"verl\.toml: .*unknown key"),
])
def test_a_malformed_presets_file_is_a_usage_error_naming_it(tmp_path, monkeypatch, capsys, damage, message):
    """A contributor's presets file is checked where it is read: exit 2 naming the file and the preset,
    never exit 3 'internal error'."""
    import shutil

    from pgspec.conformance import cli
    from pgspec.conformance.corpus import namemap

    presets = tmp_path / "presets"
    shutil.copytree(namemap.PRESETS_DIR, presets)
    with open(presets / "verl.toml", "ab") as f:
        f.write(damage)
    monkeypatch.setattr(namemap, "PRESETS_DIR", presets)
    monkeypatch.setenv("PGSPEC_JOBS", "1")
    code = cli.main(["golden", "verify"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert re.search(message, err), err
    assert "internal error" not in err
