"""The built-in torch backend on the surrogate golden cases, and the runner catching broken variants.

Several broken variants are the literal framework code: plain torch.exp under a PPO clip gives a
NaN gradient in float32 where the ratio overflows on the clipped side, and SAPO differentiated
through torch.sigmoid loses digits of 1 - sigma(x); the golden cases catch both.
"""

from __future__ import annotations

import torch

from pgspec.adapters.torch import surrogate as ts
from helpers import family_cases, golden_case, torch_adapter_with
from pgspec.conformance.run import runner


def surrogate_cases():
    return family_cases("surrogate.*")


case = golden_case


adapter_with = torch_adapter_with


def outcome(adapter, case_id, dtype="float64"):
    return runner.run_case(adapter, case(case_id), dtype, "cpu").outcome


def test_every_surrogate_formula_has_cases_of_every_required_category():
    by_formula, examples = {}, {}
    for c in surrogate_cases():
        by_formula.setdefault(c["formula"], set()).add(c["category"])
        examples[c["formula"]] = examples.get(c["formula"], 0) + (c["category"] == "example")
    assert set(by_formula) == set(ts.IMPLEMENTATIONS)
    for fid, categories in by_formula.items():
        assert {"example", "edge", "random"} <= categories, fid
        assert examples[fid] >= 3, fid
    for fid in ("surrogate.sapo", "surrogate.gmpo", "surrogate.cispo", "surrogate.trl_delta"):
        assert "regression" in by_formula[fid], fid
    assert "scale" in by_formula["surrogate.gspo"] and "scale" in by_formula["surrogate.ppo_clip"]


def test_torch_backend_passes_every_surrogate_case_in_float64():
    adapter = runner.load_adapter("torch")
    results = [runner.run_case(adapter, c, "float64", "cpu") for c in surrogate_cases()]
    bad = [(r.case_id, r.outcome, r.message[:200]) for r in results if r.outcome != "pass"]
    assert not bad, bad
    assert len(results) >= 150


def test_torch_backend_passes_every_surrogate_case_in_float32():
    adapter = runner.load_adapter("torch")
    results = [runner.run_case(adapter, c, "float32", "cpu") for c in surrogate_cases()]
    bad = [(r.case_id, r.outcome, r.message[:200]) for r in results if r.outcome != "pass"]
    assert not bad, bad


def test_float32_overflow_of_e_200_is_an_overflow_pass_with_a_zero_gradient_on_the_clipped_side():
    adapter = runner.load_adapter("torch")
    c = case("surrogate.ppo_clip/log-ratio-200")
    assert runner.run_case(adapter, c, "float32", "cpu").outcome == "pass"
    t = runner.to_tensors("surrogate.ppo_clip", runner.case_inputs(c), "float32", "cpu")
    loss = adapter.call("surrogate.ppo_clip", t, {})["loss"]
    assert torch.isinf(loss[0, 0]) and loss[0, 0] > 0          # -A e^200 with A = -1
    c = case("surrogate.ppo_clip/log-ratio-200-clipped-side")
    t = runner.to_tensors("surrogate.ppo_clip", runner.case_inputs(c), "float32", "cpu")
    loss = adapter.call("surrogate.ppo_clip", t, {})["loss"]
    (g,) = torch.autograd.grad(loss.sum(), [t["logprobs"]])
    assert loss.tolist() == [[-1.2000000476837158, 0.800000011920929]] and g.tolist() == [[0.0, 0.0]]


# broken variants the runner must catch ------------------------------------------------------------

def test_multiply_by_mask_is_caught():
    """(l - l_old) * mask: NaN at a masked position survives the product (NaN * 0 = NaN)."""
    def broken(inputs, params):
        d = (inputs["logprobs"] - inputs["old_logprobs"]) * inputs["mask"]
        return {"loss": ts.ppo_clip_loss(torch.exp(d), ts.token_advantages(inputs), 0.2, 0.2)}

    adapter = adapter_with(surrogate__ppo_clip=broken)
    assert outcome(adapter, "surrogate.ppo_clip/masked-nan-inf") == "fail"
    assert outcome(adapter, "surrogate.ppo_clip/four-regions") == "pass"   # harmless on clean inputs


def test_plain_exp_gives_nan_gradient_on_the_clipped_side_in_float32():
    """The literal max(-A r, -A clip(r)) with torch.exp: at d = 200, A > 0 the clipped branch wins and the
    unclipped branch's zero cotangent meets e^200 = inf in exp's backward: 0 * inf = NaN (float64 is fine)."""
    def literal(inputs, params):
        r = torch.exp(ts.log_ratio(inputs))
        return {"loss": ts.ppo_clip_loss(r, ts.token_advantages(inputs), 0.2, 0.2)}

    adapter = adapter_with(surrogate__ppo_clip=literal)
    assert outcome(adapter, "surrogate.ppo_clip/log-ratio-200-clipped-side", "float64") == "pass"
    assert outcome(adapter, "surrogate.ppo_clip/log-ratio-200-clipped-side", "float32") == "fail"
    assert outcome(adapter, "surrogate.ppo_clip/log-ratio-200", "float32") == "pass"   # the overflow itself is fine


def test_sapo_through_torch_sigmoid_conforms_but_its_nan_is_caught():
    """torch.sigmoid's backward is s (1 - s) from the rounded s: 1 - s loses its digits as the gate
    saturates, at the accuracy of torch's own primitive, which conforms (spec/surrogate.md, spec/verdicts.md);
    the NaN it makes at a log-ratio of 200 (0 * inf) is caught."""
    def literal(inputs, params):
        a = ts.token_advantages(inputs)
        tau = ts._choose(a > 0, 1.0, 1.05, a)
        r = torch.exp(ts.log_ratio(inputs))
        return {"loss": -a * torch.sigmoid(tau * (r - 1)) * 4 / tau}

    adapter = adapter_with(surrogate__sapo=literal)
    assert outcome(adapter, "surrogate.sapo/two-tokens", "float32") == "pass"
    assert outcome(adapter, "surrogate.sapo/saturating-gate", "float32") == "pass"
    assert outcome(adapter, "surrogate.sapo/log-ratio-200", "float32") == "fail"   # 0 * inf = NaN

    def gate_off_by_one_percent(inputs, params):
        return {"loss": literal(inputs, params)["loss"] * 1.01}

    assert outcome(adapter_with(surrogate__sapo=gate_off_by_one_percent), "surrogate.sapo/saturating-gate",
                   "float32") == "fail"


def test_cispo_weight_without_detach_is_caught():
    def broken(inputs, params):
        r = torch.exp(ts.log_ratio(inputs))
        w = torch.clamp(r, max=1.2)   # not detached: the gradient picks up -A l dw/dl
        return {"loss": -w * ts.token_advantages(inputs) * ts._selected(inputs, "logprobs"), "weight": w}

    adapter = adapter_with(surrogate__cispo=broken)
    assert outcome(adapter, "surrogate.cispo/relative") == "fail"


def test_dual_clip_bound_for_positive_advantages_is_caught():
    def broken(inputs, params):
        a = ts.token_advantages(inputs)
        loss = ts.ppo_clip_loss(ts.exp_(ts.log_ratio(inputs)), a, 0.2, 0.2)
        return {"loss": torch.minimum(loss, -params.get("c", 3.0) * a)}   # bound applied whatever the sign of A

    adapter = adapter_with(surrogate__dual_clip=broken)
    assert outcome(adapter, "surrogate.dual_clip/positive-advantage-untouched") == "fail"
    assert outcome(adapter, "surrogate.dual_clip/bound-binds") == "pass"


def test_gspo_empty_sequence_with_value_minus_a_is_caught():
    """A masked token mean of the per-token loss is 0 for an empty row; exp(0) * -A is not."""
    def broken(inputs, params):
        log_s = ts._mean_log_ratio(ts.log_ratio(inputs), inputs["mask"])
        return {"loss": ts.ppo_clip_loss(ts.exp_(log_s), inputs["advantages"], 3e-4, 4e-4)}

    adapter = adapter_with(surrogate__gspo=broken)
    assert outcome(adapter, "surrogate.gspo/empty-sequence") == "fail"
    assert outcome(adapter, "surrogate.gspo/two-sequences") == "pass"


def test_gmpo_clip_on_the_wrong_side_is_caught():
    """Clipping both sides (a plain clip of d) instead of GMPO's sign-aware one."""
    def broken(inputs, params):
        m = inputs["mask"]
        d = torch.clamp(ts.log_ratio(inputs), -0.4, 0.4)
        a = ts.sequence_advantages(inputs)
        return {"loss": torch.where(m.any(-1), -a * ts.exp_(ts._mean_log_ratio(d, m)), torch.zeros_like(a))}

    adapter = adapter_with(surrogate__gmpo=broken)
    assert outcome(adapter, "surrogate.gmpo/unclipped-sides") == "fail"
    assert outcome(adapter, "surrogate.gmpo/delta-0.4-upper-bound") == "pass"


def test_vespo_weight_with_the_is_ratio_multiplied_in_again_is_caught():
    """TRL folds the train/inference ratio into phi; multiplying the loss by it again is wrong."""
    def broken(inputs, params):
        out = ts.vespo(inputs, params)
        rho = torch.exp(ts._selected(inputs, "old_logprobs") - ts._selected(inputs, "sampler_logprobs"))
        return {"loss": out["loss"] * rho, "phi": out["phi"]}

    adapter = adapter_with(surrogate__vespo=broken)
    assert outcome(adapter, "surrogate.vespo/with-sampler") == "fail"
