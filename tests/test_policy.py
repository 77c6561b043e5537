"""One classification policy, enforced (spec/verdicts.md, "Cause classes"): every rule of every
declarations file pgspec ships names its cause class, the class decides its kind, one class has one
kind in every framework, and every mismatch rule names the outputs it absorbs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pgspec.conformance.verdicts.declarations import CAUSES, DeclarationError, load, parse

ROOT = Path(__file__).resolve().parent.parent
FILES = sorted(p for p in (ROOT / "adapters").glob("*/*.toml"))
LINK = "https://example.org/fw/blob/v1/loss.py#L1"


def _spec_classes() -> dict:
    text = (ROOT / "spec" / "verdicts.md").read_text()
    section = text[text.index("### Cause classes"):text.index("## Verdicts per formula")]
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| `([a-z0-9-]+)` \| (bug|convention) \|", section, re.M)}


def test_the_classes_in_the_code_are_the_specs():
    assert _spec_classes() == CAUSES
    assert set(CAUSES.values()) == {"bug", "convention"}


def test_every_shipped_file_is_found():
    names = {p.parent.name for p in FILES}
    assert {"torch", "trl", "liger", "verl", "openrlhf", "skyrl", "areal", "nemo_rl", "slime", "fast_llm",
            "megatron"} <= names


@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}/{p.name}" for p in FILES])
def test_every_rule_has_a_class_of_its_kind_and_scoped_outputs(path):
    decl = load(path)
    for rule in decl.rules:
        assert rule.cause in CAUSES, (path, rule.label)
        assert rule.kind == CAUSES[rule.cause], (path, rule.label, rule.cause, rule.kind)
        if rule.expect == "error":
            assert rule.raises, (path, rule.label)
        elif not all(g.startswith("prop.") for g in rule.ids):
            # a property row has no outputs of its own; a golden case does
            assert rule.outputs, f"{path.name} {rule.label} ({rule.reason[:60]}...) names no outputs"


def test_one_class_has_one_kind_across_frameworks():
    kinds: dict = {}
    for path in FILES:
        for rule in load(path).rules:
            kinds.setdefault(rule.cause, set()).add(rule.kind)
    assert all(len(k) == 1 for k in kinds.values()), kinds
    # the classes the shipped files use, each with rules of more than one framework where it is shared
    assert {"masked-nonfinite", "exp-overflow", "float32-compute", "always-on-clamp"} <= set(kinds)


def test_a_rule_without_a_class_or_of_the_other_kind_is_an_error_of_the_file():
    rule = {"ids": ["kl.k3"], "kind": "convention", "reason": "r", "link": LINK}
    with pytest.raises(DeclarationError, match="lacks cause"):
        parse({"rule": [rule]}, "adapters/x/deviations.toml")
    with pytest.raises(DeclarationError, match="cause must be one of"):
        parse({"rule": [{**rule, "cause": "surprise"}]}, "adapters/x/deviations.toml")
    with pytest.raises(DeclarationError, match="'masked-nonfinite' root cause is a bug"):
        parse({"rule": [{**rule, "cause": "masked-nonfinite"}]}, "adapters/x/deviations.toml")
    parse({"rule": [{**rule, "cause": "always-on-clamp"}]}, "adapters/x/deviations.toml")
