"""The built-in torch backend on the mask family's golden cases, and broken variants the runner must catch."""

from __future__ import annotations

import pytest
import torch

from pgspec.adapters.base import Adapter
from pgspec.adapters.torch import mask as good
from pgspec.conformance.run import runner


@pytest.fixture(scope="module")
def cases():
    """The family's golden cases, loaded (checksum and schema checked) once for the module."""
    return [c for c in runner.select_cases("mask.*") if c["category"] != "error"]   # expected errors: test_verdicts.py


def run(adapter, cases, dtype, *ids):
    """Run the given case IDs (all when none is given) and return their results."""
    chosen = [c for c in cases if not ids or c["id"] in ids]
    assert not ids or len(chosen) == len(ids), "a named case is missing from the golden corpus"
    return [runner.run_case(adapter, c, dtype, "cpu") for c in chosen]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_torch_backend_passes_every_mask_case(cases, dtype):
    results = run(runner.load_adapter("torch"), cases, dtype)
    bad = [(r.case_id, r.outcome, r.message[:300]) for r in results if r.outcome != "pass"]
    assert not bad, bad
    assert len(results) > 30
    assert {r.formula for r in results} == {"mask.geometric_sequence", "mask.opsm", "mask.entropy_quantile"}


def test_bfloat16_differs_only_on_the_named_near_bound_cases(cases):
    results = run(runner.load_adapter("torch"), cases, "bfloat16")
    assert {r.case_id for r in results if r.outcome != "pass"} == {"mask.geometric_sequence/near-bound-bf16"}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_the_entropy_threshold_is_compared_exactly_in_every_dtype(dtype):
    """Found by `pgspec fuzz`: rho = 1/6 - 6.6e-14 over seven tokens (0 five times, 1/32, 1/16) puts the
    threshold 1.2e-14 above 1/32, which float32 and bfloat16 round to 1/32: compared in the input's dtype
    the token of entropy 1/32 would be kept, which the spec drops."""
    from pgspec.adapters.torch.mask import entropy_quantile

    H = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.03125, 0.0625, 0.0]], dtype=dtype)
    m = torch.tensor([[True] * 5, [False, False, True, True, False]])
    out = entropy_quantile({"entropy": H, "mask": m}, {"top_entropy_quantile": 0.16666666666660035})
    assert out["keep"].tolist() == [[False] * 5, [False, False, False, True, False]]
    # the threshold output is the exact one rounded to the dtype: 1/32 but in float64
    assert out["threshold"].dtype == dtype
    assert (float(out["threshold"]) == 0.03125) == (dtype != torch.float64)


def _torch_quantile(inputs, params):
    """mask.entropy_quantile with torch.quantile as is: its position h = (1 - rho)(n - 1) is not snapped."""
    H, m = inputs["entropy"], inputs["mask"]
    rho = float(params.get("top_entropy_quantile", 0.2))
    values = H[m]
    if values.numel() == 0:
        return {"keep": torch.zeros_like(m), "threshold": torch.full((), float("nan"), dtype=H.dtype)}
    q = torch.quantile(values, 1 - rho)
    return {"keep": (H >= q) & m, "threshold": q}


def _per_token_opsm(inputs, params):
    """mask.opsm gated by each token's own advantage (slime before #1917)."""
    out = good.opsm(inputs, params)
    m, adv = inputs["mask"], inputs["advantages"]
    if adv.dim() == 2:
        drop = (adv < 0) & (out["seq_stat"] > float(params.get("delta", 0.5))).unsqueeze(-1)
        out["keep"] = ~drop & m
    return out


def test_unsnapped_torch_quantile_fails_on_the_binary_rho_boundary(cases):
    """In float64, torch.quantile's h = 0.30000000000000004 * 10 puts q one ulp above x_3 (in float32 the
    interpolation weight 4e-16 is lost in the rounding and the naive form happens to agree)."""
    adapter = Adapter("torch-quantile", "test", "0", implementations={"mask.entropy_quantile": _torch_quantile})
    results = {r.case_id: r for r in run(adapter, cases, "float64",
                                         "mask.entropy_quantile/boundary-binary-rho-0.7",
                                         "mask.entropy_quantile/median")}
    assert results["mask.entropy_quantile/boundary-binary-rho-0.7"].outcome == "fail"
    assert results["mask.entropy_quantile/median"].outcome == "pass"


def test_per_token_advantage_gate_fails_on_slime_1917(cases):
    adapter = Adapter("per-token-opsm", "test", "0", implementations={"mask.opsm": _per_token_opsm})
    results = {r.case_id: r for r in run(adapter, cases, "float64",
                                         "mask.opsm/slime-1917",
                                         "mask.opsm/sequence-advantages")}
    r = results["mask.opsm/slime-1917"]
    assert r.outcome == "fail" and r.first_failure["output"] == "keep" and r.first_failure["index"] == [0, 1]
    assert results["mask.opsm/sequence-advantages"].outcome == "pass"


def test_quantile_position_snaps_like_the_reference():
    from fractions import Fraction

    from pgspec.reference.mask import quantile_position as ref_position

    from mpmath import mp, mpf

    for rho in (0.3, 0.7, 0.2, "0.37", 0.25, 1, 0):
        for n in (1, 2, 6, 11, 26, 557, 40001):
            j, frac = good.quantile_position(1 - good._exact(rho), n)
            with mp.workdps(60):
                h = ref_position(1 - mpf(rho), n)
                assert j == int(mp.floor(h)) and abs(mpf(frac.numerator) / frac.denominator - (h - j)) < mpf(10) ** -40
    assert good.quantile_position(1 - Fraction(0.3), 11) == (7, 0)
