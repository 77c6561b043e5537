"""A rule absorbs only what it declares (spec/verdicts.md, "Rules"): the outputs its mismatch may be
in, the error ratio it accepts, the exception an error rule expects; and a declarations file whose
domains or capabilities cannot mean what they say is an error naming the line."""

from __future__ import annotations

import pytest
import torch

from pgspec.adapters.base import Adapter
from pgspec.conformance.corpus import golden
from pgspec.conformance.run import runner
from pgspec.conformance.verdicts.declarations import DeclarationError, load, parse

LINK = "https://example.org/fw/blob/v1/loss.py#L1"
CASES = runner.select_cases("kl.k1/empty-sequence")     # values and gradient non-zero, one row empty


from pgspec.adapters.base import current_cotangent  # noqa: E402


def _adapter(spoil_value=1.0, spoil_grad=1.0, raise_with=None, rules=()):
    good = runner.load_adapter("torch").implementations["kl.k1"]

    def impl(inputs, params):
        if raise_with is not None:
            raise raise_with
        out = good(inputs, params)
        kl = out["kl"].detach()
        c = current_cotangent(like=out["kl"])     # its own gradient: the VJP with the case's cotangent
        g, = torch.autograd.grad((out["kl"] * c)[inputs["mask"]].sum(), inputs["logprobs"])
        return {"kl": kl * spoil_value, "grad": {"logprobs": g * spoil_grad}}

    a = Adapter("scoped", "test", "0", implementations={"kl.k1": impl})
    a.deviations = parse({"rule": [dict(r) for r in rules]}, "adapters/x/deviations.toml")
    return a


def _rule(**kw):
    kind = kw.get("kind", "bug")
    return {"ids": ["kl.k1"], "kind": kind, "cause": "wrong-formula" if kind == "bug" else "formula-variant",
            "reason": "r", "link": LINK, **kw}


def _run(adapter):
    (case,) = CASES
    return runner.run_case(adapter, case, "float64", "cpu")


def test_the_case_exists_and_the_spoiled_outputs_fail_where_spoiled():
    r = _run(_adapter(spoil_grad=2.0))
    assert r.outcome == "fail" and r.failed_outputs == ["grad.logprobs"]
    r = _run(_adapter(spoil_value=2.0, spoil_grad=2.0))
    assert r.outcome == "fail" and r.failed_outputs == ["kl", "grad.logprobs"]


def test_a_rule_absorbs_a_mismatch_in_its_outputs_only():
    assert _run(_adapter(spoil_grad=2.0, rules=[_rule(outputs=["grad.*"])])).outcome == "bug"
    r = _run(_adapter(spoil_value=2.0, spoil_grad=2.0, rules=[_rule(outputs=["grad.*"])]))
    assert r.outcome == "fail" and "kl fails too" in r.message
    # without outputs, any output (the form the policy test forbids for a mismatch rule)
    assert _run(_adapter(spoil_value=2.0, rules=[_rule()])).outcome == "bug"


def test_a_rule_absorbs_an_error_ratio_within_its_bound_only():
    small = _run(_adapter(spoil_grad=1 + 1e-12))
    assert small.outcome == "fail" and 1 < small.error_ratio < 1e6
    assert _run(_adapter(spoil_grad=1 + 1e-12, rules=[_rule(max_ratio=1e6)])).outcome == "bug"
    r = _run(_adapter(spoil_grad=2.0, rules=[_rule(max_ratio=1e6)]))
    assert r.outcome == "fail" and "error ratio up to 1e+06" in r.message


def test_an_error_rule_absorbs_its_exception_only():
    rule = _rule(expect="error", raises="ZeroDivisionError", match="division by zero")
    assert _run(_adapter(raise_with=ZeroDivisionError("float division by zero"), rules=[rule])).outcome == "bug"
    r = _run(_adapter(raise_with=ModuleNotFoundError("No module named 'fast_llm'"), rules=[rule]))
    assert r.outcome == "error" and "expects ZeroDivisionError" in r.message
    r = _run(_adapter(raise_with=ZeroDivisionError("integer modulo by zero"), rules=[rule]))
    assert r.outcome == "error" and "matching" in r.message


def test_a_mismatch_rule_never_absorbs_an_error_nor_an_error_rule_a_mismatch():
    r = _run(_adapter(raise_with=ZeroDivisionError("x"), rules=[_rule()]))
    assert r.outcome == "error"
    r = _run(_adapter(spoil_grad=2.0, rules=[_rule(expect="error", raises="ZeroDivisionError")]))
    assert r.outcome == "fail"


@pytest.mark.parametrize("entry, message", [
    (_rule(expect="error"), "raises must name the exception type"),
    (_rule(expect="error", raises="Zero Division"), "raises must name the exception type"),
    (_rule(expect="error", raises="ValueError", match="("), "not a valid regular expression"),
    (_rule(expect="error", raises="ValueError", outputs=["loss"]), "belong to a mismatch rule"),
    (_rule(raises="ValueError"), "belong to an error rule"),
    (_rule(max_ratio=1), "max_ratio must be a number above 1"),
    (_rule(max_ratio="big"), "max_ratio must be a number above 1"),
    (_rule(outputs=["loss value"]), "is not an output name or glob"),
    (_rule(when={"params": {"eps": []}}), "empty list of values"),
    (_rule(when={"params": {"eps": {"min": 5, "max": -5}}}), "empty range"),
])
def test_a_malformed_rule_is_an_error_of_the_file(entry, message):
    if "when" in entry:
        entry = {**entry, "ids": ["adv.group_normalized"]}
    with pytest.raises(DeclarationError, match=message):
        parse({"rule": [entry]}, "adapters/x/deviations.toml")


def _capability(params):
    return {"capability": [{"formulas": ["kl.k3"], "params": params, "reason": "r", "link": LINK}]}


def test_a_capability_with_an_empty_domain_is_an_error_naming_its_line(tmp_path):
    path = tmp_path / "adapters" / "x" / "deviations.toml"
    path.parent.mkdir(parents=True)
    path.write_text('# header\n\n[[capability]]\nformulas = ["kl.k3"]\nparams = { output_min = { min = 5, max = -5 } }\n'
                    f'reason = "r"\nlink = "{LINK}"\n')
    with pytest.raises(DeclarationError, match=r"line 3.*empty range"):
        load(path)


def test_a_capability_that_leaves_a_formula_no_case_is_an_error_of_the_file():
    corpus = golden.load_all()
    # a domain no case of kl.k3 takes (every case has output_min null or a number below 1e300)
    decl = parse(_capability({"output_min": [1e300]}), "adapters/x/deviations.toml")
    with pytest.raises(DeclarationError, match="admits none of the .* numeric cases of kl.k3"):
        decl.check_against_corpus(corpus, ("float64",), implemented={"kl.k3"})
    # not an error for a formula the adapter does not implement
    decl.check_against_corpus(corpus, ("float64",), implemented={"kl.k1"})
    # two capabilities, each admitting some case of kl.k3 (unclamped ones, clamped ones), together none
    both = parse({"capability": [
        {"formulas": ["kl.k3"], "params": {"output_min": ["null"]}, "reason": "r", "link": LINK},
        {"formulas": ["kl.k3"], "params": {"output_min": {"min": -1e300, "max": 1e300}}, "reason": "r",
         "link": LINK}]}, "adapters/x/deviations.toml")
    with pytest.raises(DeclarationError, match="together admit none"):
        both.check_against_corpus(corpus, ("float64",), implemented={"kl.k3"})


def test_a_parameter_the_formula_does_not_have_is_an_error():
    with pytest.raises(DeclarationError, match="unknown parameter 'eps_high'"):
        parse(_capability({"eps_high": [0.2]}), "adapters/x/deviations.toml")


def test_the_first_matching_rule_that_explains_a_result_classifies_it():
    """A float64 rule written for the value does not take a gradient failure that a later rule
    explains (Liger's masked-NaN gradient was a convention in float64 under its float32 rule)."""
    value_rule = _rule(kind="convention", outputs=["kl"], reason="float32 value")
    grad_rule = _rule(kind="bug", outputs=["grad.*"], reason="NaN gradient")
    r = _run(_adapter(spoil_grad=2.0, rules=[value_rule, grad_rule]))
    assert r.outcome == "bug" and r.declaration["declaration"] == "rule 2"
    r = _run(_adapter(spoil_value=2.0, rules=[value_rule, grad_rule]))
    assert r.outcome == "convention" and r.declaration["declaration"] == "rule 1"
    # two root causes in one result: each output explained by its own rule; a bug among them makes a bug
    r = _run(_adapter(spoil_value=2.0, spoil_grad=2.0, rules=[value_rule, grad_rule]))
    assert r.outcome == "bug" and r.declaration["declaration"] == "rule 2" and "two or more root causes" in r.message
    r = _run(_adapter(spoil_value=2.0, spoil_grad=2.0, rules=[value_rule]))
    assert r.outcome == "fail" and "grad.logprobs fails too" in r.message
    # a max_ratio rule covers its output only within its bound, also together with another rule
    bounded = _rule(kind="convention", outputs=["kl"], reason="float32 value", max_ratio=1e6)
    r = _run(_adapter(spoil_value=2.0, spoil_grad=2.0, rules=[bounded, grad_rule]))
    assert r.outcome == "fail"


def test_a_rule_holds_for_the_property_rows_it_names_whatever_its_when():
    """A property row has no golden case for ``when`` to read: named in ``ids`` it is declared (one
    root cause, one rule, its property rows included); a formula glob never reaches it."""
    rule = _rule(ids=["surrogate.ppo_clip", "prop.clamp/surrogate.*"], outputs=["loss"],
                 when={"inputs": ["policy_log_ratio_beyond_20"]})
    d = parse({"rule": [rule]}, "adapters/x/deviations.toml")
    assert d.rules_for("prop.clamp/surrogate.ppo_clip", "prop.clamp", "float32", None)
    assert not d.rules_for("prop.padding/surrogate.ppo_clip", "prop.padding", "float32", None)
    (case,) = runner.select_cases("surrogate.ppo_clip/padded-batch")
    assert not d.rules_for(case["id"], case["formula"], "float32", case)      # the predicate still binds a case
