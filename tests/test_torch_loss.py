"""The built-in torch backend on the loss golden cases, and the runner catching broken variants.

The torch recipes are composed from the other torch families (surrogate, is, mask, kl, agg) the way
a trainer composes them; the broken variants below are the classic composition mistakes: dropping a
token by multiplying with a 0/1 mask (inf * 0 = NaN), forgetting the .detach() of the IS weight or of
CISPO's weight, masking the KL together with the policy term, and removing dropped tokens from the
denominator.
"""

from __future__ import annotations

import torch

from pgspec.adapters.torch import loss as tl
from pgspec.adapters.torch import surrogate as ts
from helpers import family_cases, golden_case, torch_adapter_with
from pgspec.conformance.run import runner


def loss_cases():
    return family_cases("loss.*")


case = golden_case


adapter_with = torch_adapter_with


def outcome(adapter, case_id, dtype="float64"):
    return runner.run_case(adapter, case(case_id), dtype, "cpu").outcome


def test_every_recipe_has_cases_of_every_required_category():
    by_formula, examples = {}, {}
    for c in loss_cases():
        by_formula.setdefault(c["formula"], set()).add(c["category"])
        examples[c["formula"]] = examples.get(c["formula"], 0) + (c["category"] == "example")
    assert set(by_formula) == set(tl.IMPLEMENTATIONS)
    for fid, categories in by_formula.items():
        assert {"example", "edge", "random", "scale"} <= categories, fid
        assert examples[fid] >= 3, fid
    for fid in ("loss.grpo", "loss.cispo", "loss.bnpo", "loss.gspo", "loss.luspo"):
        assert "regression" in by_formula[fid], fid


def test_every_option_is_on_in_some_case_of_every_recipe():
    for fid in tl.IMPLEMENTATIONS:
        params = [c["params"] for c in loss_cases() if c["formula"] == fid]
        seen = {(p.get("is_level"), p.get("is_mode", "truncate")) for p in params if p.get("is_level")}
        if fid != "loss.vespo":
            assert {(lv, md) for lv in ("token", "sequence", "geometric") for md in ("truncate", "mask")} <= seen, fid
        assert any(p.get("opsm_delta") is not None for p in params), fid
        assert any(p.get("entropy_quantile") is not None for p in params), fid
        kl = {p.get("kl_estimator") for p in params if float(p.get("beta", 0)) > 0}
        assert {"k1", "k2", "k3", "abs", "k3_straight_through", "k3_unbiased"} <= kl, fid


def test_torch_backend_passes_every_loss_case_in_float64():
    adapter = runner.load_adapter("torch")
    results = [runner.run_case(adapter, c, "float64", "cpu") for c in loss_cases()]
    bad = [(r.case_id, r.outcome, r.message[:200]) for r in results if r.outcome != "pass"]
    assert not bad, bad
    assert len(results) >= 300


def test_torch_backend_passes_every_loss_case_in_float32():
    adapter = runner.load_adapter("torch")
    results = [runner.run_case(adapter, c, "float32", "cpu") for c in loss_cases()]
    bad = [(r.case_id, r.outcome, r.message[:200]) for r in results if r.outcome != "pass"]
    assert not bad, bad


# broken variants the runner must catch ------------------------------------------------------------

def _with_compose(fid, broken_compose):
    """The recipe ``fid`` with tl.compose replaced by ``broken_compose`` for the duration of the call."""
    impl = tl.IMPLEMENTATIONS[fid]

    def run(inputs, params):
        saved = tl.compose
        tl.compose = broken_compose
        try:
            return impl(inputs, params)
        finally:
            tl.compose = saved
    return run


def test_dropping_by_multiplying_with_the_mask_is_caught():
    """term = pg * keep: a policy term of +inf (e^200 in float32) on a dropped token gives inf * 0 = NaN."""
    def times_mask(fid, inputs, params, pg, aggregate, **kw):
        opts = tl._options(fid, params)
        keep = tl.opsm_keep(opts, inputs)
        term = pg * keep.to(pg.dtype) if keep is not None else pg
        return {"loss": aggregate(term, inputs["mask"]), "terms": term}

    adapter = adapter_with(loss__grpo=_with_compose("loss.grpo", times_mask))
    c = case("loss.grpo/opsm")
    assert runner.run_case(adapter, c, "float64", "cpu").outcome == "pass"   # harmless on finite inputs
    # a sequence with A < 0 dropped by OPSM whose ratio overflows float32
    inputs = {"logprobs": [[0.0, -1.0]], "old_logprobs": [[-200.0, -201.0]], "sampler_logprobs": [[1.0, 0.0]],
              "mask": [[True, True]], "advantages": [-1.0]}
    t = runner.to_tensors("loss.grpo", inputs, "float32", "cpu")
    good = tl.grpo(t, {"beta": 0, "opsm_delta": 0.5})["loss"]
    bad = adapter.call("loss.grpo", t, {"beta": 0, "opsm_delta": 0.5})["loss"]
    assert good.item() == 0 and torch.isnan(bad)


def test_multiply_by_input_mask_is_caught():
    """The policy term computed from (l - l_old) * mask: NaN at a masked position survives the product."""
    def broken(inputs, params):
        d = (inputs["logprobs"] - inputs["old_logprobs"]) * inputs["mask"]
        pg = ts.ppo_clip_loss(torch.exp(d), ts.token_advantages(inputs), 0.2, 0.2)
        return tl.compose("loss.bnpo", inputs, params, pg, tl._agg("agg.token_mean"))

    adapter = adapter_with(loss__bnpo=broken)
    assert outcome(adapter, "loss.bnpo/masked-nan-inf") == "fail"
    assert outcome(adapter, "loss.bnpo/worked-example") == "pass"


def test_missing_detach_of_the_is_weight_is_caught():
    """w^IS is a constant; a weight built from l (not l_old) and left attached changes the gradient."""
    def attached(fid, inputs, params, pg, aggregate, **kw):
        opts = tl._options(fid, params)
        w = torch.exp(inputs["logprobs"] - inputs["sampler_logprobs"])  # wrong numerator, not detached
        w = torch.where(inputs["mask"], w, torch.ones_like(w))
        term = pg * w if opts["is_level"] != "none" else pg
        return {"loss": aggregate(term, inputs["mask"]), "terms": term}

    adapter = adapter_with(loss__dapo=_with_compose("loss.dapo", attached))
    assert outcome(adapter, "loss.dapo/is-token-truncate") == "fail"


def test_cispo_without_the_detach_of_its_weight_is_caught():
    """-w A l with w = clip(r) left attached: the gradient gains -A l dw/dl."""
    def attached(inputs, params):
        r = torch.exp(ts.log_ratio(inputs))
        w = torch.clamp(r, max=1.2)
        pg = -w * ts.token_advantages(inputs) * ts._selected(inputs, "logprobs")
        return tl.compose("loss.cispo", inputs, params, pg, tl._agg("agg.prompt_mean", group_ids=inputs["group_ids"]),
                          needs_groups=True)

    adapter = adapter_with(loss__cispo=attached)
    assert outcome(adapter, "loss.cispo/worked-example") == "fail"


def test_masking_the_kl_with_the_policy_term_is_caught():
    """DeepSeek-V3.2 Eq. 8: OPSM drops the policy term only; dropping the KL too is caught."""
    real_compose = tl.compose

    def kl_masked(fid, inputs, params, pg, aggregate, **kw):
        terms = real_compose(fid, inputs, params, pg, aggregate, **kw)["terms"]
        keep = tl.opsm_keep(tl._options(fid, params), inputs)
        terms = torch.where(keep, terms, torch.zeros_like(terms))
        return {"loss": aggregate(terms, inputs["mask"]), "terms": terms}

    adapter = adapter_with(loss__grpo=_with_compose("loss.grpo", kl_masked))
    assert outcome(adapter, "loss.grpo/all-options") == "fail"     # OPSM drops sequence 1, beta = 0.125
    assert outcome(adapter, "loss.grpo/opsm") == "pass"            # beta = 0 there: nothing to tell apart


def test_removing_dropped_tokens_from_the_denominator_is_caught():
    """Dropped tokens keep their place in the denominator; aggregating over mask & keep is caught."""
    def shrunk(fid, inputs, params, pg, aggregate, **kw):
        opts = tl._options(fid, params)
        keep = tl.entropy_keep(opts, inputs)
        m = inputs["mask"] & keep
        return {"loss": aggregate(pg, m), "terms": pg}

    adapter = adapter_with(loss__bnpo=_with_compose("loss.bnpo", shrunk))
    assert outcome(adapter, "loss.bnpo/entropy-mask") == "fail"
