"""The built-in torch backend on the kl golden cases, and the runner catching broken variants."""

from __future__ import annotations

import pytest
import torch

from pgspec.adapters.torch import kl as tkl
from helpers import family_cases, golden_case, torch_adapter_with
from pgspec.conformance.run import runner


def kl_cases():
    return family_cases("kl.*")


case = golden_case


adapter_with = torch_adapter_with


def test_every_kl_formula_has_cases_of_every_required_category():
    by_formula = {}
    for c in kl_cases():
        by_formula.setdefault(c["formula"], set()).add(c["category"])
    assert set(by_formula) == set(tkl.IMPLEMENTATIONS)
    for fid, categories in by_formula.items():
        assert {"example", "edge", "random"} <= categories, fid
    assert "regression" in by_formula["kl.k3"] and "regression" in by_formula["kl.k3_unbiased"]


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16", "float16"])
def test_torch_backend_passes_every_kl_case(dtype):
    adapter = runner.load_adapter("torch")
    results = [runner.run_case(adapter, c, dtype, "cpu") for c in kl_cases()]
    # float16 holds golden inputs only within its exponent range (spec/golden-format.md)
    bad = [(r.case_id, r.outcome, r.message[:200]) for r in results
           if r.outcome != "pass" and not (dtype == "float16" and r.outcome == "not-applicable")]
    assert not bad, bad
    assert len(results) >= 100


def test_float32_overflow_at_x_200_is_an_overflow_pass_and_x_minus_200_is_finite():
    adapter = runner.load_adapter("torch")
    c = case("kl.k3/log-ratio-200")
    r = runner.run_case(adapter, c, "float32", "cpu")
    assert r.outcome == "pass"
    tensors = runner.to_tensors("kl.k3", runner.case_inputs(c), "float32", "cpu")
    y = adapter.call("kl.k3", tensors, {})["kl"]
    assert torch.isinf(y[0, 0]) and y[0, 0] > 0 and y[0, 1].item() == 199.0
    # e^88 fits float32, e^89 does not
    c = case("kl.k3/trl-3015-float32-overflow")
    tensors = runner.to_tensors("kl.k3", runner.case_inputs(c), "float32", "cpu")
    y = adapter.call("kl.k3", tensors, {})["kl"]
    assert torch.isfinite(y[0, 0]) and torch.isinf(y[0, 1])


@pytest.mark.parametrize("fid", ["kl.k3", "kl.k3_unbiased"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_token_held_by_the_output_clamp_has_gradient_0_even_where_its_estimate_overflowed(fid, dtype):
    """spec/kl.md: a value outside [c, d] has zero gradient.  At x = 199.5 (k3) or l - l_old = 200
    (k3_unbiased's weight) the estimate overflows float32, and torch.clamp's zero times the
    exponential's infinite derivative would be NaN; the backend gives 0, the value the bound."""
    l = torch.tensor([[-1.0, -200.0, 0.0]], dtype=dtype, requires_grad=True)
    inputs = {"logprobs": l, "ref_logprobs": torch.tensor([[-1.5, -0.5, -0.5]], dtype=dtype),
              "mask": torch.ones(1, 3, dtype=torch.bool)}
    if fid == "kl.k3_unbiased":
        inputs["old_logprobs"] = torch.tensor([[-1.0, -200.0, -200.0]], dtype=dtype)
    y = tkl.IMPLEMENTATIONS[fid](inputs, {"output_min": -10.0, "output_max": 10.0})["kl"]
    (g,) = torch.autograd.grad(y.sum(), l)
    held = [1, 2] if fid == "kl.k3_unbiased" else [1]
    assert [y[0, t].item() for t in held] == [10.0] * len(held)
    assert [g[0, t].item() for t in held] == [0.0] * len(held), g
    assert torch.isfinite(g).all() and g[0, 0].item() != 0


def test_naive_k3_passes_kl_k3_because_its_scale_is_that_of_exp_minus_1_minus_x():
    """spec/tolerance.md: S of k3 is that of exp(x) - 1 - x as usually written, so the direct form
    (which is exactly 0 in float32 at x = 2^-20) still conforms."""
    def naive(inputs, params):
        a, b, c, d = tkl._bounds("kl.k3", params)
        return {"kl": tkl.clamped_estimate(lambda x: torch.exp(x) - 1 - x, tkl.log_ratio(inputs), a, b, c, d)}

    adapter = adapter_with(kl__k3=naive)
    for dtype in ("float64", "float32"):
        for c in kl_cases():
            if c["formula"] == "kl.k3":
                assert runner.run_case(adapter, c, dtype, "cpu").outcome == "pass", (c["id"], dtype)


# broken variants the runner must catch ------------------------------------------------------------

def _fails(adapter, case_id, dtype="float64"):
    r = runner.run_case(adapter, case(case_id), dtype, "cpu")
    return r.outcome == "fail"


def test_multiply_by_mask_is_caught():
    """x * mask: NaN at a masked position reaches the gradient through expm1's backward (0 * NaN)."""
    def broken(inputs, params):
        x = (inputs["ref_logprobs"] - inputs["logprobs"]) * inputs["mask"]
        return {"kl": tkl.k3(x)}

    adapter = adapter_with(kl__k3=broken)
    assert _fails(adapter, "kl.k3/masked-nan-inf")
    assert not _fails(adapter, "kl.k3/two-tokens")  # harmless without non-finite masked inputs


def test_missing_detach_in_straight_through_is_caught():
    def broken(inputs, params):
        a, b, c, d = tkl._bounds("kl.k3_straight_through", params)
        x = tkl.log_ratio(inputs)
        score = tkl.k2(x)
        return {"kl": score - score.detach() + tkl.clamped_estimate(tkl.k3, x, a, b, c, d)}

    adapter = adapter_with(kl__k3_straight_through=broken)
    assert _fails(adapter, "kl.k3_straight_through/two-tokens")


def test_detached_importance_ratio_is_caught():
    """sg[w] k3(x): the gradient of KL(pi_ref || pi_theta), the bias DeepSeek-V3.2 removes."""
    def broken(inputs, params):
        w = torch.exp(inputs["logprobs"] - inputs["old_logprobs"]).detach()
        x = tkl.log_ratio(inputs)
        return {"kl": torch.where(inputs["mask"], w, torch.ones_like(w)) * tkl.k3(x)}

    adapter = adapter_with(kl__k3_unbiased=broken)
    assert _fails(adapter, "kl.k3_unbiased/deepseek-v32-two-tokens")


def test_term_by_term_autograd_of_the_weighted_k3_is_caught_at_x_20():
    """Autograd of w * (expm1(x) - x) adds w k3(x) = e^20 - 21 and -w (e^x - 1) = -(e^20 - 1), both
    about 4.85e8: in float32 (ulp 32 there) the difference -w x = -20 comes out as -32."""
    def broken(inputs, params):
        m = inputs["mask"]
        zero = torch.zeros_like(inputs["logprobs"])
        lp = torch.where(m, inputs["logprobs"], zero)
        w = torch.exp(lp - torch.where(m, inputs["old_logprobs"], zero))
        return {"kl": w * tkl.k3(torch.where(m, inputs["ref_logprobs"], zero) - lp)}

    adapter = adapter_with(kl__k3_unbiased=broken)
    assert not _fails(adapter, "kl.k3_unbiased/deepseek-v32-two-tokens")  # fine at modest x
    assert _fails(adapter, "kl.k3_unbiased/log-ratio-20", "float32")


def test_symmetric_input_clamp_instead_of_openrlhf_one_sided_is_caught():
    def broken(inputs, params):
        a, b, c, d = tkl._bounds("kl.k3", params)
        if b is not None and a is None:
            a = -b
        return {"kl": tkl.clamped_estimate(tkl.k3, tkl.log_ratio(inputs), a, b, c, d)}

    adapter = adapter_with(kl__k3=broken)
    assert _fails(adapter, "kl.k3/openrlhf-one-sided-input-clamp")
