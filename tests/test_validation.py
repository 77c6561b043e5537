"""Validation is its own axis (spec/verdicts.md, "Validation"): an expected-error case counts as
rejected only when the framework's own code raises, never for an adapter that returns nothing or
raises everywhere, never for anything pgspec prepares; and no rule applies to it."""

from __future__ import annotations

import pytest

from pgspec.adapters.base import Adapter
from pgspec.conformance.run import runner
from pgspec.conformance.verdicts.declarations import DeclarationError, parse

ERROR_CASES = [c for c in runner.select_cases("*") if c.get("expect_error")]


def _torch():
    return runner.load_adapter("torch")


def _like_torch(call, framework_modules=()):
    """An adapter that implements every formula the built-in backend does, through ``call``."""
    t = _torch()

    class Wrong(Adapter):
        pass

    Wrong.framework_modules = framework_modules
    return Wrong(name="wrong", framework="wrong", version="0", dtypes=("float64", "float32", "bfloat16"),
                 implementations={fid: (lambda inputs, params, fid=fid: call(fid, inputs, params))
                                  for fid in t.implementations})


def _validation(adapter, cases, dtype="float64"):
    return [runner.run_case(adapter, c, dtype, "cpu") for c in cases]


def test_the_corpus_has_expected_error_cases_of_every_family():
    families = {c["formula"].split(".")[0] for c in ERROR_CASES}
    assert len(ERROR_CASES) > 100 and {"kl", "ratio", "loss", "agg"} <= families


def _untensorable(case) -> bool:
    try:
        runner.case_tensors(case, "float64", "cpu")
    except Exception:  # noqa: BLE001 - a ragged row, a null id: no tensor holds it
        return True
    return False


def test_the_built_in_backend_rejects_every_invalid_input_in_its_own_code():
    results = _validation(_torch(), ERROR_CASES)
    by_id = {c["id"]: c for c in ERROR_CASES}
    # a case no tensor can hold is not applicable to a tensor implementation, and only such a case
    assert all(_untensorable(by_id[r.case_id]) for r in results if r.outcome == "not-applicable")
    run = [r for r in results if r.outcome != "not-applicable"]
    assert {r.outcome for r in run} == {"rejected"}, [(r.case_id, r.outcome, r.message) for r in run
                                                      if r.outcome != "rejected"][:5]
    assert all("by torch at " in r.message and r.exception["origin"] == "framework" for r in run)


def test_an_adapter_that_returns_none_rejects_nothing():
    results = _validation(_like_torch(lambda fid, inputs, params: None), ERROR_CASES)
    assert {r.outcome for r in results} <= {"not-rejected", "not-applicable"}
    assert sum(r.outcome == "not-rejected" for r in results) > 100
    # the case that used to "pass" because pgspec itself converted "abc" inside the adapter's try
    (r,) = [r for r in results if r.case_id == "kl.k3/error-log-ratio-min-not-a-number"]
    assert r.outcome == "not-rejected" and "returned NoneType" in r.message


def test_an_adapter_that_raises_everywhere_rejects_nothing():
    def boom(fid, inputs, params):
        raise ValueError("nothing works")

    results = _validation(_like_torch(boom), ERROR_CASES)
    assert {r.outcome for r in results} <= {"not-rejected", "not-applicable"}
    r = next(r for r in results if r.outcome == "not-rejected")
    assert "raised in the adapter's own code" in r.message and "test_validation.py" in r.message
    assert r.exception["origin"] == "adapter" and r.exception["type"] == "ValueError"


def test_a_framework_exception_is_a_rejection_and_its_frame_is_named():
    """The same raising function counts once its module is declared the framework's."""
    def boom(fid, inputs, params):
        raise ValueError("nothing works")

    adapter = _like_torch(boom, framework_modules=(__name__,))
    (r,) = _validation(adapter, ERROR_CASES[:1])
    assert r.outcome == "rejected" and f"test_validation.py:" in r.message


def test_torch_raising_inside_the_framework_is_the_frameworks_and_inside_the_adapter_is_not():
    import torch

    def via_torch(fid, inputs, params):
        return torch.cat([torch.zeros(2), torch.zeros(2, 2)])     # raises inside torch

    case = ERROR_CASES[:1]
    assert _validation(_like_torch(via_torch), case)[0].outcome == "not-rejected"
    assert _validation(_like_torch(via_torch, framework_modules=(__name__,)), case)[0].outcome == "rejected"


def test_an_exception_whose_str_fails_is_recorded():
    class Odd(Exception):
        def __str__(self):
            raise RuntimeError("no")

    def boom(fid, inputs, params):
        raise Odd()

    (r,) = _validation(_like_torch(boom), ERROR_CASES[:1])
    assert r.outcome == "not-rejected" and "Odd" in r.message


def test_a_declared_check_counts_an_adapter_rejection_only_for_its_exception():
    decl = parse({"check": [{"ids": ["kl.*/error-*"], "raises": "ValueError", "match": "must be finite",
                             "reason": "the framework's config rejects it before the loss",
                             "link": "https://example.org/fw/blob/v1/config.py#L10"}]}, "adapters/x/deviations.toml")

    def make(message):
        def boom(fid, inputs, params):
            raise ValueError(message)
        a = _like_torch(boom)
        a.deviations = decl
        return a

    kl = [c for c in ERROR_CASES if c["formula"].startswith("kl.")][:1]
    other = [c for c in ERROR_CASES if c["formula"].startswith("ratio.")][:1]
    (r,) = _validation(make("x must be finite"), kl)
    assert r.outcome == "rejected" and r.declaration["declaration"] == "check 1"
    assert _validation(make("another message"), kl)[0].outcome == "not-rejected"
    assert _validation(make("x must be finite"), other)[0].outcome == "not-rejected"


def test_no_rule_applies_to_an_expected_error_case():
    decl = parse({"rule": [{"ids": ["kl.*"], "kind": "convention", "cause": "formula-variant", "reason": "r",
                            "link": "https://example.org/a#L1"}]}, "adapters/x/deviations.toml")
    a = _like_torch(lambda fid, inputs, params: None)
    a.deviations = decl
    (r,) = _validation(a, [c for c in ERROR_CASES if c["formula"] == "kl.k3"][:1])
    assert r.outcome == "not-rejected" and r.declaration is None


def test_a_rule_that_matches_only_expected_error_cases_is_an_error_of_the_file():
    from pgspec.conformance.corpus import golden

    decl = parse({"rule": [{"ids": ["*/error-*"], "kind": "convention", "cause": "formula-variant", "reason": "r",
                            "link": "https://example.org/a#L1"}]}, "adapters/x/deviations.toml")
    with pytest.raises(DeclarationError, match="only expected-error cases"):
        decl.check_against_corpus(golden.load_all(), ("float64",))


def test_the_summary_gives_numeric_results_and_validation_apart():
    cases = [c for c in runner.select_cases("kl.k1") if c["category"] != "scale"]
    summary = runner.RunSummary([runner.run_case(_torch(), c, "float64", "cpu") for c in cases]).finalize()
    line = summary.summary_line("torch")
    n_err = sum(1 for c in cases if c.get("expect_error"))
    assert n_err and f"validation: rejects {n_err} of {n_err} invalid inputs" in line
    assert f"numeric: {len(cases) - n_err} of {len(cases) - n_err} applicable results pass" in line
    assert line.startswith("torch: no unexpected result;")
