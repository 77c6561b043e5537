"""Every worked example in spec/*.md is checked against the reference, and every formula has one."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from mpmath import mp, mpf

from pgspec.reference import REGISTRY, evaluate

SPEC = Path(__file__).resolve().parent.parent / "spec"
BLOCK = re.compile(r"```\{code-block\} json\n:caption: worked example[^\n]*\n\n(.*?)\n```", re.S)


def examples():
    out = []
    for path in sorted(SPEC.glob("*.md")):
        for k, m in enumerate(BLOCK.finditer(path.read_text())):
            data = json.loads(m.group(1))
            out.append(pytest.param(data, id=f"{path.stem}-{data['id']}-{k}"))
    return out


def _flat(x, path=()):
    if isinstance(x, list):
        for k, item in enumerate(x):
            yield from _flat(item, path + (k,))
    else:
        yield path, x


def _matches(got, expected: str) -> bool:
    """``expected`` is a decimal shown to n significant digits: ``got`` must round to it
    (within half a unit of its last digit)."""
    if expected is None:
        return got is None
    if isinstance(got, bool) or isinstance(expected, bool):
        return got == expected
    want = mpf(expected)
    if want == 0:
        return abs(got) <= mpf(10) ** -40
    mantissa = expected.lower().split("e")[0].lstrip("+-").replace(".", "").lstrip("0")
    digits = max(len(mantissa), 1)
    unit = mpf(10) ** (mp.floor(mp.log10(abs(want))) - digits + 1)
    return abs(got - want) <= unit / 2 * (1 + mpf(10) ** -30)


@pytest.mark.parametrize("example", examples())
def test_worked_example(example):
    result = evaluate(example["id"], example["inputs"], example.get("params"))
    with mp.workdps(60):
        for key, expected in example["expect"].items():
            got = result["grad"][key[5:]] if key.startswith("grad.") else result[key]
            for (path, g), (_, e) in zip(_flat(got), _flat(expected)):
                assert _matches(g, e), f"{example['id']}: {key}{list(path)} = {mp.nstr(g, 20) if g is not None else g}, spec says {e}"
            assert len(list(_flat(got))) == len(list(_flat(expected))), f"{key}: shape differs from the spec's example"


def test_every_formula_has_a_spec_entry_and_worked_example():
    texts = {p.stem: p.read_text() for p in SPEC.glob("*.md")}
    with_example = set()
    for text in texts.values():
        for m in BLOCK.finditer(text):
            with_example.add(json.loads(m.group(1))["id"])
    problems = []
    for fid, f in sorted(REGISTRY.items()):
        page = texts.get(f.family)
        if page is None or f"({fid})=" not in page:
            problems.append(f"{fid}: no anchor ({fid})= in spec/{f.family}.md")
        if fid not in with_example:
            problems.append(f"{fid}: no worked example in spec/")
    assert not problems, "\n".join(problems)


def test_every_spec_anchor_is_a_registered_formula():
    anchors = []
    for path in SPEC.glob("*.md"):
        anchors += [(path.name, a) for a in re.findall(r"^\(([a-z0-9_.]+)\)=$", path.read_text(), re.M)]
    families = {f.family for f in REGISTRY.values()}
    stray = [f"{name}: ({a})=" for name, a in anchors
             if "." in a and a not in REGISTRY and not a.startswith("prop.") and a.split(".")[0] in families]
    assert not stray, "anchors with no formula in the registry:\n" + "\n".join(stray)
