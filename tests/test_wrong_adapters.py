"""Proof that the checks catch bugs: each deliberately wrong adapter (tests/fixtures/wrong_adapters.py,
one real bug class each) is reported failing by its property and/or its formula's golden cases,
and the same checks pass on the correct torch backend."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pgspec.conformance.run import properties as P
from pgspec.conformance.run import runner

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))
import wrong_adapters  # noqa: E402

WRONG = wrong_adapters.WRONG_ADAPTERS
IDS = [w.name for w in WRONG]


def _golden(adapter, formula, dtype="float32"):
    cases = [c for c in runner.select_cases(formula) if c["category"] not in ("scale", "error")]
    return [runner.run_case(adapter, c, dtype, "cpu") for c in cases]


@pytest.mark.parametrize("wrong", [w for w in WRONG if w.catch_property], ids=[w.name for w in WRONG if w.catch_property])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_property_reports_the_wrong_adapter(wrong, dtype):
    results = P.run_properties(wrong.adapter(), dtype, "cpu", wrong.formula, properties=wrong.catch_property)
    assert results, f"{wrong.catch_property} does not apply to {wrong.formula}"
    (res,) = results
    assert res.outcome == "fail", f"{wrong.name} ({wrong.bug}) not caught by {wrong.catch_property}: {res.outcome}"
    assert res.property == wrong.catch_property and res.message.startswith(wrong.catch_property)
    assert res.example is not None and res.repro


@pytest.mark.parametrize("wrong", [w for w in WRONG if w.catch_cases], ids=[w.name for w in WRONG if w.catch_cases])
def test_golden_cases_report_the_wrong_adapter(wrong):
    results = _golden(wrong.adapter(), wrong.catch_cases)
    failing = [r.case_id for r in results if r.outcome in ("fail", "error")]
    assert failing, f"{wrong.name} ({wrong.bug}) passes every golden case of {wrong.catch_cases}"


@pytest.mark.parametrize("wrong", WRONG, ids=IDS)
def test_the_correct_backend_passes_the_same_checks(wrong):
    torch_adapter = runner.load_adapter("torch")
    if wrong.catch_property:
        (res,) = P.run_properties(torch_adapter, "float32", "cpu", wrong.formula, properties=wrong.catch_property)
        assert res.outcome == "pass", res.message
    if wrong.catch_cases:
        bad = [r.case_id for r in _golden(torch_adapter, wrong.catch_cases) if r.outcome != "pass"]
        assert not bad, bad


def test_every_wrong_adapter_is_caught_somewhere_and_each_has_one_bug():
    for w in WRONG:
        assert w.catch_property or w.catch_cases, w.name
        assert w.formula in w.implementations or w.formula.startswith("agg."), w.name
    assert len({w.name for w in WRONG}) == len(WRONG) >= 7
