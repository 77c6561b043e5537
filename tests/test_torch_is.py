"""The built-in torch backend on the is family's golden cases, and broken variants the runner must catch."""

from __future__ import annotations

import pytest
import torch

from pgspec.adapters.base import Adapter
from pgspec.adapters.torch import is_ as good
from pgspec.conformance.run import runner


@pytest.fixture(scope="module")
def cases():
    """The family's golden cases, loaded (checksum and schema checked) once for the module."""
    return [c for c in runner.select_cases("is.*") if c["category"] != "error"]   # expected errors: test_verdicts.py


def run(adapter, cases, dtype, *ids):
    """Run the given case IDs (all when none is given) and return their results."""
    chosen = [c for c in cases if not ids or c["id"] in ids]
    assert not ids or len(chosen) == len(ids), "a named case is missing from the golden corpus"
    return [runner.run_case(adapter, c, dtype, "cpu") for c in chosen]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_torch_backend_passes_every_is_case(cases, dtype):
    results = run(runner.load_adapter("torch"), cases, dtype)
    bad = [(r.case_id, r.outcome, r.message[:300]) for r in results if r.outcome != "pass"]
    assert not bad, bad
    assert len(results) > 100 and all(r.compared > 0 for r in results if not r.case_id.endswith("/all-masked"))
    assert {r.formula for r in results} == {"is.token.truncate", "is.token.mask", "is.sequence.truncate",
                                            "is.sequence.mask", "is.geometric.truncate", "is.geometric.mask",
                                            "is.reject"}


def test_bfloat16_differs_only_on_the_named_near_bound_cases(cases):
    results = run(runner.load_adapter("torch"), cases, "bfloat16")
    failing = {r.case_id for r in results if r.outcome != "pass"}
    assert failing <= {f"{fid}/near-bound-bf16" for fid in ("is.token.mask", "is.sequence.mask", "is.geometric.mask")}
    assert "is.token.mask/near-bound-bf16" in failing


def _multiply_by_mask(inputs, params):
    """is.sequence.mask with the mask multiplied in: a masked NaN or inf poisons the sum."""
    x = (inputs["old_logprobs"] - inputs["sampler_logprobs"]) * inputs["mask"]
    rho = torch.exp(x.sum(-1))
    keep = good.in_band(rho, *good._bounds("is.sequence.mask", params)[:2])
    w = good.mask_weight(rho, keep)
    m = inputs["mask"]
    return {"weight": good._broadcast(w, m), "keep": good._broadcast(keep, m), "seq_weight": w, "seq_keep": keep,
            "seq_ratio": rho}


def _mean_over_padded_length(inputs, params):
    """is.reject whose seq_mean divides by the padded length T instead of the sequence's L_i."""
    out = good.reject(inputs, params)
    if params.get("level", "seq_mean") == "seq_mean":
        m = inputs["mask"]
        out["seq_stat"] = torch.where(m, out["token_stat"], torch.zeros_like(out["token_stat"])).sum(-1) / m.shape[-1]
        out["seq_keep"] = good.in_band(out["seq_stat"], None, float(params.get("upper", 0.01)))
        out["keep"] = good._broadcast(out["seq_keep"], m)
    return out


def _open_band(inputs, params):
    """is.token.mask with an open band (rho < C_max): drops a ratio sitting exactly on a bound."""
    lo, hi, c = good._bounds("is.token.mask", params)
    rho = torch.exp(good.clamp_log_weight(good.mismatch_log_ratio(inputs), c))
    keep = torch.ones_like(rho, dtype=torch.bool)
    if lo is not None:
        keep &= rho > lo
    if hi is not None:
        keep &= rho < hi
    return {"weight": good.mask_weight(rho, keep), "keep": keep, "ratio": rho}


def test_multiplying_by_the_mask_fails_on_the_nan_case(cases):
    adapter = Adapter("multiply-by-mask", "test", "0", implementations={"is.sequence.mask": _multiply_by_mask})
    results = {r.case_id: r for r in run(adapter, cases, "float64",
                                         "is.sequence.mask/masked-nan-inf",
                                         "is.sequence.mask/spec-example")}
    assert results["is.sequence.mask/masked-nan-inf"].outcome == "fail"
    assert results["is.sequence.mask/spec-example"].outcome == "pass"


def test_mean_over_the_padded_length_fails(cases):
    adapter = Adapter("mean-over-T", "test", "0", implementations={"is.reject": _mean_over_padded_length})
    results = {r.case_id: r for r in run(adapter, cases, "float64",
                                         "is.reject/spec-example",
                                         "is.reject/on-policy")}
    r = results["is.reject/spec-example"]
    assert r.outcome == "fail" and r.first_failure["output"] in ("seq_stat", "keep")
    assert results["is.reject/on-policy"].outcome == "pass"


def test_open_band_fails_on_the_boundary_case(cases):
    adapter = Adapter("open-band", "test", "0", implementations={"is.token.mask": _open_band})
    results = {r.case_id: r for r in run(adapter, cases, "float64",
                                         "is.token.mask/boundary-band-of-one",
                                         "is.token.mask/padded-batch")}
    assert results["is.token.mask/boundary-band-of-one"].outcome == "fail"
    assert results["is.token.mask/padded-batch"].outcome == "pass"


def test_expm1_minus_x_is_accurate_across_branches():
    """The k3 helper stays within 4 units of roundoff of e^u - 1 - u (the tolerance of the is family)."""
    from mpmath import mp, mpf

    u = torch.tensor([-30.0, -2.5, -1.0, -0.999, -0.5, -2.0 ** -20, 0.0, 2.0 ** -20, 0.5, 1.0, 1.999, 2.0, 2.001,
                      5.0, 30.0], dtype=torch.float64)
    for dtype, unit in ((torch.float64, 2.0 ** -53), (torch.float32, 2.0 ** -24)):
        got = good.expm1_minus_x(u.to(dtype)).double().tolist()
        with mp.workdps(40):
            for x, g in zip(u.to(dtype).double().tolist(), got):
                ref = mp.expm1(mpf(x)) - mpf(x)
                assert abs(mpf(g) - ref) <= 4 * unit * abs(ref), (dtype, x, g)
