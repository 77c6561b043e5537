"""A gradient is judged at its own scale (spec/tolerance.md, "The scale S"): its bound comes from the
running error bound of the backward evaluation, never from the size of the values, so a zero
gradient fails wherever the reference gradient is non-zero, and an output detached from an input is
an error of its own ("not connected"), not a zero gradient that a loose bound might pass."""

from __future__ import annotations

import pytest
import torch
from mpmath import mpf

from pgspec.adapters.base import Adapter
from pgspec.conformance.judge import compare
from pgspec.conformance.corpus import golden
from pgspec.conformance.run import runner
from pgspec.conformance.judge.tolerance import FLOOR

CASES = [c for c in golden.load_all() if not c.get("expect_error") and c.get("grad")]


def _above(ref, floor) -> bool:
    """Whether a reference gradient has an element that the dtype can hold as non-zero."""
    if isinstance(ref, list):
        return any(_above(x, floor) for x in ref)
    return ref is not None and abs(mpf(ref)) > floor


def _zero_gradient_passes(case, dtype) -> bool:
    inputs = golden.case_inputs(case)
    for name, ref in case["grad"].items():
        zeros = torch.zeros(torch.as_tensor(inputs[name], dtype=torch.float64).shape, dtype=torch.float64)
        if compare.compare_output(case, f"grad.{name}", ref, zeros, case["family"], dtype).failure is not None:
            return False
    return True


def test_a_zero_gradient_fails_every_case_whose_reference_gradient_is_not_zero():
    judged = [c for c in CASES if any(_above(r, FLOOR["float64"]) for r in c["grad"].values())]
    assert len(judged) > 1000
    passing = [c["id"] for c in judged if _zero_gradient_passes(c, "float64")]
    assert passing == []


def test_the_cancellation_case_bounds_its_gradient_by_the_gradients_own_error():
    """The token mean of values near +-1.15e18: the value's scale is about 1.2e18, the gradient's
    (1/n per token, rounded once, times the case's cotangent c) 3|c|/n, so a zero gradient fails in
    every dtype, bfloat16 included."""
    case = next(c for c in CASES if c["id"] == "agg.token_mean/cancellation")
    assert float(mpf(case["scale"]["value"])) > 1e18
    c = abs(float(case["cotangent"]))       # the scalar value's one cotangent: the bound starts from |c|
    assert c != 1
    assert [float(mpf(s)) for s in case["scale"]["grad.values"][0]] == [0.75 * c] * 4
    for dtype in ("float64", "float32", "bfloat16"):
        assert not _zero_gradient_passes(case, dtype), dtype


def _detaching(formulas):
    """The built-in backend, with the differentiated output detached from its inputs."""
    t = runner.load_adapter("torch")

    def call(fid, inputs, params):
        out = dict(t.implementations[fid](inputs, params))
        key = runner.REGISTRY[fid].grad_of
        out[key] = out[key].detach()
        return out

    return Adapter(name="detached", framework="detached", version="0", dtypes=("float64", "float32"),
                   implementations={fid: (lambda inputs, params, fid=fid: call(fid, inputs, params))
                                    for fid in formulas})


@pytest.mark.parametrize("pattern", ["ratio.*", "agg.token_mean", "kl.k3", "loss.grpo"])
def test_a_detached_output_is_not_connected_on_every_case_with_a_non_zero_gradient(pattern):
    cases = [c for c in runner.select_cases(pattern) if not c.get("expect_error") and c.get("grad")]
    adapter = _detaching({c["formula"] for c in cases})
    assert cases
    for case in cases:   # a zero reference gradient too: an output that cannot be differentiated at all
        result = runner.run_case(adapter, case, "float64", "cpu")
        assert result.outcome == "error" and "not connected" in result.message, (case["id"], result.message)
        assert repr(runner.REGISTRY[case["formula"]].grad_of) in result.message


def test_an_output_connected_by_a_zero_path_is_judged_by_its_gradient_not_called_unconnected():
    """An output that keeps an autograd path to its input (here a product with 0) but not the right one
    has a gradient, zeros: that is a failure of grad.values, not a 'not connected' error."""
    t = runner.load_adapter("torch")

    def half(inputs, params):    # the value of the first row only, still a graph on 'values'
        out = dict(t.implementations["agg.token_mean"](inputs, params))
        out["value"] = out["value"] * 0 + inputs["values"][:1].sum() * 0 + out["value"].detach()
        return out

    adapter = Adapter(name="half", framework="half", version="0", dtypes=("float64",),
                      implementations={"agg.token_mean": half})
    case = next(c for c in runner.select_cases("agg.token_mean") if c["id"] == "agg.token_mean/cancellation")
    result = runner.run_case(adapter, case, "float64", "cpu")
    assert result.outcome == "fail" and "grad.values" in result.message, result.message


@pytest.mark.parametrize("formula", ["loss.bnpo", "loss.gspo", "agg.token_mean"])
def test_pgspec_check_calls_a_detached_output_not_connected(formula):
    from pgspec.conformance import check

    adapter = _detaching([formula])
    res = check.run_check(adapter, formula, 2, 64, "float32")
    assert res.outcome == "error" and res.message.startswith("not connected"), res.message
    assert check.run_check(runner.load_adapter("torch"), formula, 2, 64, "float32").outcome == "pass"
