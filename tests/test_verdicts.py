"""Declarations (spec/verdicts.md): capabilities, rules, the classification order, stale rules, the
per-formula verdicts and the summary line; every adapter's declarations file against the corpus."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

from pgspec.adapters.base import Adapter
from pgspec.adapters.torch import ratio as good
from pgspec.conformance.run import runner
from pgspec.conformance.verdicts.declarations import MAX_DECLARATIONS, DeclarationError, load, parse
from pgspec.conformance.verdicts.cells import formula_verdicts

HERE = Path(__file__).parent
ADAPTERS = HERE.parent / "adapters"
LINK = "https://example.invalid/source#L1"


def decl(text: str):
    return parse(tomllib.loads(text), "test.toml")


def _crash(inputs, params):
    raise RuntimeError("boom: the framework crashed")


def _exp_of_sum(inputs, params):
    import torch

    return {"ratio": torch.exp(good.masked_log_ratio(inputs).sum(-1))}


def adapter(impls, text=""):
    return Adapter("t", "test", "0", implementations=impls, deviations=decl(text))


def run(a, formulas, dtype="float64", errors=False):
    """The cases of ``formulas`` (expected-error cases only with ``errors``, or when named)."""
    cases = [c for c in runner.select_cases(formulas)
             if errors or c["category"] != "error" or "/error-" in formulas]
    results = [runner.run_case(a, c, dtype, "cpu") for c in cases]
    return runner.RunSummary(results).finalize()


def test_a_mismatch_rule_does_not_hide_a_crash():
    a = adapter({"ratio.token": _crash}, f"""
[[rule]]
ids = ["ratio.token"]
kind = "bug"
cause = "wrong-formula"
reason = "thought to differ"
link = "{LINK}"
""")
    summary = run(a, "ratio.token")
    assert {r.outcome for r in summary.results} == {"error"}
    assert all("expects a mismatch" in r.message and "boom" in r.message for r in summary.results)
    assert summary.exit_code() == 1


def test_an_error_rule_declares_an_expected_crash():
    a = adapter({"ratio.token": _crash}, f"""
[[rule]]
ids = ["ratio.token"]
kind = "bug"
cause = "wrong-formula"
expect = "error"
raises = "RuntimeError"
match = "^boom"
reason = "raises on every input"
link = "{LINK}"
""")
    summary = run(a, "ratio.token")
    assert {r.outcome for r in summary.results} == {"bug"}
    assert summary.exit_code() == 0


def test_an_error_rule_does_not_absorb_a_wrong_number():
    a = adapter({"ratio.sequence_geometric": _exp_of_sum}, f"""
[[rule]]
ids = ["ratio.sequence_geometric"]
kind = "bug"
cause = "wrong-formula"
expect = "error"
raises = "RuntimeError"
reason = "expected to raise"
link = "{LINK}"
""")
    outcomes = {r.outcome for r in run(a, "ratio.sequence_geometric").results}
    assert "fail" in outcomes and "bug" not in outcomes


def test_a_case_outside_a_declared_domain_is_not_applicable_and_never_called():
    calls = []

    def spy(inputs, params):
        calls.append(params)
        return good.token(inputs, params)

    text = f"""
[[capability]]
formulas = ["ratio.token"]
params = {{ log_ratio_clamp = ["null"] }}
reason = "the framework has no log-ratio clamp"
link = "{LINK}"
"""
    summary = run(adapter({"ratio.token": spy}, text), "ratio.token")
    na = [r for r in summary.results if r.outcome == "not-applicable"]
    applicable = [r for r in summary.results if r.outcome != "not-applicable"]
    assert na and applicable
    assert all(r.message == "the framework has no log-ratio clamp" for r in na)
    assert all(p.get("log_ratio_clamp") is None for p in calls)
    assert len(calls) == len(applicable)
    assert {r.outcome for r in applicable} == {"pass"}
    line = summary.summary_line("t")
    assert line == (f"t: no unexpected result; numeric: {len(applicable)} of {len(applicable)} applicable results "
                    f"pass, 0 known bugs (0 root causes), 0 conventions, {len(na)} not applicable; validation: rejects "
                    f"0 of 0 invalid inputs; {len(summary.results)} results in all")


def test_input_predicates_in_capabilities_and_rules():
    text = f"""
[[capability]]
formulas = ["ratio.token"]
inputs = ["not nonfinite_masked"]
reason = "the framework's inputs are always finite"
link = "{LINK}"
"""
    summary = run(adapter({"ratio.token": good.token}, text), "ratio.token")
    by_id = {r.case_id: r for r in summary.results}
    assert by_id["ratio.token/masked-nan-inf"].outcome == "not-applicable"
    assert by_id["ratio.token/two-tokens"].outcome == "pass"


def test_a_rule_when_clause_selects_cases_by_parameters():
    # exp(sum) agrees with exp(mean) only on one-token sequences; the rule covers every case of the formula
    text = f"""
[[rule]]
ids = ["ratio.sequence_geometric"]
when = {{ inputs = ["not all_masked"] }}
kind = "bug"
cause = "wrong-formula"
reason = "exp(sum) where exp(mean) is specified"
link = "{LINK}"
"""
    summary = run(adapter({"ratio.sequence_geometric": _exp_of_sum}, text), "ratio.sequence_geometric")
    assert "fail" not in {r.outcome for r in summary.results}
    assert summary.exit_code() == 0
    v = formula_verdicts([r.to_json() for r in summary.results])["ratio.sequence_geometric"]
    assert v["verdict"] == "bug" and v["rules"][0]["reason"] == "exp(sum) where exp(mean) is specified"


def test_a_rule_whose_cases_all_pass_is_stale():
    text = f"""
[[rule]]
ids = ["ratio.token/two-tokens"]
kind = "convention"
cause = "formula-variant"
reason = "thought to differ"
link = "{LINK}"
"""
    summary = run(adapter({"ratio.token": good.token}, text), "ratio.token")
    by_id = {r.case_id: r for r in summary.results}
    assert by_id["ratio.token/two-tokens"].outcome == "stale-deviation"
    assert "no longer reproduces" in by_id["ratio.token/two-tokens"].message
    assert summary.exit_code() == 1


def test_a_rule_matching_nothing_is_an_error_of_the_file():
    from pgspec.conformance.corpus import golden

    d = decl(f"""
[[rule]]
ids = ["ratio.token/no-such-case"]
kind = "bug"
cause = "wrong-formula"
reason = "nothing"
link = "{LINK}"
""")
    with pytest.raises(DeclarationError, match=r"\[\[rule\]\] #1 .*matches no numeric case of the corpus"):
        d.check_against_corpus(golden.load_all(), ("float64",))
    a = Adapter("t", "test", "0", implementations={"ratio.token": good.token}, deviations=d)
    with pytest.raises(runner.RunError, match="declarations file error"):
        runner.check_declarations(a)


def test_a_rule_whose_conditions_never_hold_is_an_error_of_the_file():
    from pgspec.conformance.corpus import golden

    d = decl(f"""
[[rule]]
ids = ["ratio.token"]
when = {{ inputs = ["packed_documents"] }}
kind = "bug"
cause = "wrong-formula"
reason = "never"
link = "{LINK}"
""")
    with pytest.raises(DeclarationError, match="matches no numeric case"):
        d.check_against_corpus(golden.load_all(), ("float64",))


@pytest.mark.parametrize("text, message", [
    ('[[rule]]\nids = ["kl.k3"]\nkind = "bogus"\nreason = "r"\nlink = "l"', "kind must be one of bug, convention"),
    ('[[rule]]\nids = ["kl.k3"]\nkind = "bug"\ncause = "wrong-formula"\nexpect = "crash"\nreason = "r"\nlink = "l"', "expect must be one of"),
    ('[[rule]]\nids = ["kl.k3"]\nkind = "bug"\ncause = "wrong-formula"\nreason = "r"', "lacks link"),
    ('[[rule]]\nids = ["kl.k3"]\nkind = "bug"\ncause = "wrong-formula"\nreason = "r"\nlink = "l"\nid = "x"', "unknown key(s) id"),
    ('[[rule]]\nids = ["kl.k3"]\nkind = "bug"\ncause = "wrong-formula"\nreason = "r"\nlink = "l"\ndtypes = ["float8"]', "unknown dtype"),
    ('[[rule]]\nids = ["kl.k3"]\nkind = "bug"\ncause = "wrong-formula"\nreason = "r"\nlink = "l"\nwhen = { inputs = ["purple"] }',
     "unknown input predicate 'purple'"),
    ('[[capability]]\nformulas = ["kl.k3"]\nparams = { nope = [1] }\nreason = "r"\nlink = "l"',
     "unknown parameter 'nope'"),
    ('[[capability]]\nformulas = ["kl.k3"]\nreason = "r"\nlink = "l"', "restricts 'params' and/or 'inputs'"),
    ('[[deviation]]\nid = "kl.k3"', "unknown table(s) deviation"),
])
def test_a_malformed_file_names_the_declaration_and_the_key(text, message):
    with pytest.raises(DeclarationError) as e:
        decl(text)
    assert message in str(e.value) and "test.toml" in str(e.value)


def test_a_malformed_declaration_is_named_by_its_line(tmp_path):
    path = tmp_path / "deviations.toml"
    path.write_text(f'[[rule]]\nids = ["kl.k3"]\nkind = "bug"\ncause = "wrong-formula"\nreason = "r"\nlink = "{LINK}"\n\n'
                    '[[rule]]\nids = ["kl.k3"]\nkind = "oops"\nreason = "r"\nlink = "l"\n')
    with pytest.raises(DeclarationError, match=r"deviations.toml, line 8: \[\[rule\]\] #2: kind must be one of"):
        load(path)


def test_too_many_declarations_is_an_error():
    one = '[[unsupported]]\nformulas = ["kl.k3"]\nreason = "r"\nlink = "l"\n'
    with pytest.raises(DeclarationError, match=f"at most {MAX_DECLARATIONS}"):
        decl(one * (MAX_DECLARATIONS + 1))


def test_unsupported_formulas_carry_their_reason():
    text = f"""
[[unsupported]]
formulas = ["ratio.sequence_*"]
reason = "the framework has token ratios only"
link = "{LINK}"
"""
    summary = run(adapter({"ratio.token": good.token}, text), "ratio.*")
    un = [r for r in summary.results if r.formula.startswith("ratio.sequence_")]
    assert un and {r.outcome for r in un} == {"unsupported"}
    assert {r.message for r in un} == {"the framework has token ratios only"}
    assert summary.exit_code() == 0


@pytest.mark.parametrize("name", sorted(p.name for p in ADAPTERS.iterdir() if (p / "deviations.toml").exists()))
def test_every_adapters_declarations_file_is_valid_against_the_corpus(name):
    from pgspec.conformance.corpus import golden
    from pgspec.conformance.run.properties import PROPERTIES

    path = ADAPTERS / name / "deviations.toml"
    d = load(path)
    assert len(d) <= MAX_DECLARATIONS
    props = [f"{pid}/{fid}" for pid, prop in PROPERTIES.items() for fid in prop.formulas]
    # the dtypes the adapter declares: the framework adapters' three (their frameworks are not
    # installed here), the built-in backend's own list (float16 too)
    dtypes = runner.load_adapter("torch").dtypes if name == "torch" else ("float64", "float32", "bfloat16")
    d.check_against_corpus(golden.load_all(), dtypes, props)
    for x in d.all():
        assert x.reason and x.link


def test_markdown_report_regenerates_byte_identically(tmp_path):
    from pgspec.conformance import report

    a = runner.load_adapter("torch")
    texts = []
    for _ in range(2):
        summary = run(a, "ratio.token")
        texts.append(report.to_markdown(summary, a, "cpu", ["float64"]))
    assert texts[0] == texts[1]
    assert "date" not in texts[0]


def test_matrix_is_per_formula(tmp_path):
    from pgspec.conformance.verdicts import matrix
    from pgspec.conformance import report

    a = runner.load_adapter("torch")
    summary = run(a, "ratio.token,kl.k1")
    rep = report.to_json(summary, a, "cpu", ["float64"])
    text = matrix.render([rep])
    assert "| formula | torch |" in text
    assert "| `ratio.token` | [pass" in text and "| `kl.k1` | [pass" in text
    data = matrix.verdicts_json([rep])
    assert data["formulas"]["kl.k1"]["torch"]["verdict"] == "pass"
    sys.modules.pop("broken_adapters", None)


def test_expected_error_cases_are_rejected_by_raising_and_not_by_returning():
    from pgspec.adapters.torch import implementations

    impl = implementations()["kl.k3"]
    raw = next(c for c in runner.select_cases("kl.k3") if c["id"] == "kl.k3/error-output-min-above-output-max")
    assert raw["category"] == "error" and raw["expect_error"]["argument"] == "output_min"
    strict_adapter = adapter({"kl.k3": impl})
    # the backend's code raising is an adapter's, not a framework's, until its modules are declared
    assert {r.outcome for r in run(strict_adapter, "kl.k3/error-*").results} <= {"not-rejected", "not-applicable"}
    strict_adapter.framework_modules = ("pgspec.adapters.torch", "pgspec.reference")
    strict = run(strict_adapter, "kl.k3/error-*")
    assert {r.outcome for r in strict.results} <= {"rejected", "not-applicable"}
    assert strict.exit_code() == 0 and strict.validation()[0] == strict.validation()[1] > 0

    import torch

    def lax(inputs, params):   # computes whatever it is given
        return {"kl": torch.zeros_like(inputs["logprobs"])}

    loose = run(adapter({"kl.k3": lax}), "kl.k3/error-*")
    accepted = [r for r in loose.results if r.outcome == "not-rejected"]
    assert accepted and all("the spec rejects this input" in r.message for r in accepted)
    one = next(r for r in accepted if r.case_id == "kl.k3/error-output-min-above-output-max")
    assert "output_min: must be less than output_max" in one.message
    # validation never fails a run and is never a declared deviation: it is reported as "rejects R of E"
    assert loose.exit_code() == 0 and loose.validation() == (0, len(accepted))
    v = formula_verdicts([r.to_json() for r in loose.results])["kl.k3"]
    assert v["validation"] == {"not-rejected": len(accepted)} and not v["counts"]


def test_the_torch_backend_rejects_every_expected_error_case():
    torch_adapter = runner.load_adapter("torch")
    cases = [c for c in runner.select_cases("*") if c["category"] == "error"]
    assert len(cases) > 500
    results = [runner.run_case(torch_adapter, c, "float64", "cpu") for c in cases]

    def untensorable(case):
        """spec/golden-format.md: a case whose inputs no tensor can hold (a ragged row, a null group id)
        is not applicable to a tensor implementation."""
        try:
            runner.case_tensors(case, "float64", "cpu")
        except Exception:  # noqa: BLE001 - any failure to build the tensors
            return True
        return False

    by_id = {c["id"]: c for c in cases}
    bad = [(r.case_id, r.outcome, r.message[:200]) for r in results
           if r.outcome != "rejected" and not (r.outcome == "not-applicable" and untensorable(by_id[r.case_id]))]
    assert not bad, bad
    not_applicable = {r.case_id for r in results if r.outcome == "not-applicable"}
    assert "agg.prompt_mean/error-group-ids-null" in not_applicable
    assert any("/error-ragged-" in i for i in not_applicable)


def _rule_by_scan(d, case, dtype):
    """rule_for as a plain scan of the rules (what the memoized lookup must give)."""
    for x in d.rules:
        if (not x.dtypes or dtype in x.dtypes) and x.matches_id(case["id"], case["formula"]) \
                and x.conditions_hold(case, dtype):
            return x
    return None


def test_rule_lookup_agrees_with_a_plain_scan_and_sees_a_new_rule():
    from pgspec.conformance.corpus import golden

    cases = golden.load_all()
    files = sorted(p / "deviations.toml" for p in ADAPTERS.iterdir() if (p / "deviations.toml").exists())
    matched = 0
    for path in files:
        d = load(path)
        for dtype in ("float64", "float32", "bfloat16"):
            for case in cases:
                got = d.rule_for(case["id"], case["formula"], dtype, case)
                assert got is _rule_by_scan(d, case, dtype), (path, case["id"], dtype)
                matched += got is not None
    assert matched > 100
    # a rule added after lookups is found: the remembered matches follow the rule list
    d = decl('[[rule]]\nids = ["ratio.token/*"]\nkind = "convention"\ncause = "formula-variant"\nreason = "r"\nlink = "https://x"\n')
    case = next(c for c in cases if c["formula"] == "ratio.token")
    first = d.rule_for(case["id"], case["formula"], "float64", case)
    extra = decl('[[rule]]\nids = ["ratio.*"]\nkind = "bug"\ncause = "wrong-formula"\nreason = "s"\nlink = "https://y"\n').rules[0]
    d.rules.insert(0, extra)
    assert first is not None and d.rule_for(case["id"], case["formula"], "float64", case) is extra
    d.rules[0] = first                      # and a rule replaced in place
    assert d.rule_for(case["id"], case["formula"], "float64", case) is first


def test_rule_globs_match_exactly_as_fnmatchcase():
    """A rule's ID globs are matched through one compiled pattern: for every rule of every shipped
    declarations file, every case and formula ID of the corpus and every property row, with a few
    globs of special characters, the same answer as fnmatch.fnmatchcase glob by glob."""
    import fnmatch
    from pathlib import Path

    from pgspec.conformance.corpus import golden
    from pgspec.conformance.verdicts.declarations import Declaration, load
    from pgspec.conformance.run.properties import PROPERTIES

    root = Path(__file__).resolve().parents[1] / "adapters"
    rules = [d for path in sorted(root.glob("*/deviations*.toml")) for d in load(path).rules]
    assert len(rules) > 50
    special = ("[!s]*", "*/s[!c]*", "kl.k?", "loss.*/[a-c]*", "*", "a|b", "(x)", "+", "loss.grpo")
    rules += [Declaration("rule", 1, "t", (g,), "r", "l", "bug") for g in special]
    names = [(c["id"], c["formula"]) for c in golden.load_all()]
    names += [(f"{pid}/{fid}", pid) for pid, p in PROPERTIES.items() for fid in p.formulas]
    names += [("a|b", "(x)"), ("+", ""), ("", "x")]
    for d in rules:
        for case_id, formula_id in names:
            want = any(fnmatch.fnmatchcase(case_id, g) or fnmatch.fnmatchcase(formula_id, g) for g in d.ids)
            assert d.matches_id(case_id, formula_id) == want, (d.ids, case_id, formula_id)


def test_the_tables_rows_give_the_verdicts_the_json_rows_give():
    """The terminal table reads each result's fields in place (report._verdict_rows); the verdicts
    are those of the JSON rows (report._rows): bugs with their rules, errors, infinite ratios,
    expected-error cases, unsupported formulas."""
    from pgspec.conformance import report

    text = f"""
[[rule]]
ids = ["ratio.sequence_geometric"]
kind = "bug"
cause = "wrong-formula"
reason = "exp(sum) where exp(mean) is specified"
link = "{LINK}"
"""
    a = adapter({"ratio.sequence_geometric": _exp_of_sum, "ratio.token": _crash}, text)
    summary = run(a, "ratio.sequence_geometric,ratio.token,kl.k3", errors=True)
    assert {r.outcome for r in summary.results} >= {"bug", "error", "unsupported"}
    assert any(r.error_ratio is not None and r.error_ratio == float("inf") for r in summary.results)
    assert formula_verdicts(report._verdict_rows(summary)) == formula_verdicts(report._rows(summary))


def test_a_declared_deviation_never_reads_as_the_formulas_worst_ratio():
    """The per-formula cells (matrix, docs site): worst over pass/fail/stale; declared apart."""
    def row(outcome, ratio):
        return {"formula": "kl.k3", "outcome": outcome, "error_ratio": ratio, "category": "numeric"}

    v = formula_verdicts([row("pass", 0.25), row("convention", 150.0), row("bug", "inf"), row("pass", 0.5)])["kl.k3"]
    assert v["worst_ratio"] == 0.5 and v["declared_worst_ratio"] == float("inf")
    only_declared = formula_verdicts([row("convention", 3.0)])["kl.k3"]
    assert only_declared["worst_ratio"] is None and only_declared["declared_worst_ratio"] == 3.0
