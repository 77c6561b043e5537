"""`pgspec check --formula loss.grpo --vocab V` (conformance/check/head_loss.py): the composite oracle
against reference._ad on the same composite, and the check on heads built from the torch backend."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pgspec.adapters.base import Adapter
from pgspec.conformance import check
from pgspec.conformance.check import head_loss as check_head_loss, logprob as check_logprob
from pgspec.conformance.run import runner
from pgspec.reference import REGISTRY


def _reference(arrays, old, adv, params, formula="loss.grpo", ref=None, sampler=None):
    """(loss, E(loss), dloss/dX [N, H], S(dloss/dX) [N, H]) of l = log_softmax_at(total_h(X_h W_vh)) into
    the reference's ``formula``, by reference._ad (old log-probs, advantages and the KL term's reference
    log-probs ``ref`` tracked as exact inputs, as the generator tracks every real input)."""
    from mpmath import mp, mpf

    from pgspec.reference import _ad
    from pgspec.reference._evaluate import DEFAULT_DPS, check_params
    from pgspec.reference.logprob import log_softmax_at

    f = REGISTRY[formula]
    X, W, y, m = arrays["hidden"], arrays["weight"], arrays["targets"], arrays["mask"]
    B, T, H = X.shape
    with mp.workdps(DEFAULT_DPS):
        xs = [[[_ad.Var(mpf(float(v))) for v in X[b, t]] if m[b, t] else None for t in range(T)] for b in range(B)]
        ls = [[log_softmax_at([_ad.total(xs[b][t][h] * mpf(float(W[v, h])) for h in range(H)) for v in range(W.shape[0])],
                              int(y[b, t]), mpf(1), mpf(1)) if m[b, t] else None for t in range(T)] for b in range(B)]
        olds = [[_ad.Var(mpf(float(old[b, t]))) if m[b, t] else None for t in range(T)] for b in range(B)]
        advs = [_ad.Var(mpf(float(a))) for a in adv]
        refs = None if ref is None else \
            [[_ad.Var(mpf(float(ref[b, t]))) if m[b, t] else None for t in range(T)] for b in range(B)]
        mus = None if sampler is None else \
            [[_ad.Var(mpf(float(sampler[b, t]))) if m[b, t] else None for t in range(T)] for b in range(B)]
        raw = f.func(logprobs=ls, old_logprobs=olds, mask=m.tolist(), advantages=advs, sampler_logprobs=mus,
                     ref_logprobs=refs, group_ids=None, entropy=None, **check_params(f, params))
        leaves = [x for b in range(B) for t in range(T) if m[b, t] for x in xs[b][t]]
        E, S = _ad.error_scales(raw["loss"], leaves)
        d = _ad.backward(raw["loss"])
        grad = np.zeros((B * T, H))
        scale = np.zeros((B * T, H))
        for b in range(B):
            for t in range(T):
                if m[b, t]:
                    for h in range(H):
                        grad[b * T + t, h] = float(d.get(id(xs[b][t][h]), 0))
                        scale[b * T + t, h] = float(S[id(xs[b][t][h])])
        return float(raw["loss"].value), float(E), grad, scale


@pytest.mark.parametrize("formula, given", [
    ("loss.grpo", {"eps_low": 0.2, "eps_high": 0.2}), ("loss.grpo", {"eps_low": 0.1, "eps_high": 0.28}),
    ("loss.bnpo", {"eps_low": 0.2, "eps_high": 0.28}), ("loss.dr_grpo", {"divisor": 7, "eps_high": 0.28}),
    ("loss.dapo", {"aggregation": "token_mean"}), ("loss.cispo", {"aggregation": "token_mean", "eps_high": 0.2}),
    ("loss.cispo", {"aggregation": "token_mean", "eps_low": 0.2, "eps_high": 0.2, "log_ratio_clamp": 0.3}),
    ("loss.grpo", {"log_ratio_clamp": 0.3})])
def test_composite_scales_equal_reference_ad(formula, given):
    """Values and every scale of the composite oracle equal reference._ad's on a batch with masked
    positions, clipped (or truncated) and unclipped tokens of both advantage signs, and a target at the
    argmax."""
    arrays = check_logprob.seeded_head(3, 4, 11, 5, seed=6)
    arrays["targets"][0, 0] = int(np.argmax(arrays["hidden"][0, 0] @ arrays["weight"].T))
    adv = np.array([0.75, -0.5, 1.25])
    params = check.oracle_params(formula, {"beta": 0.0, **given}, head=True)
    o = check_head_loss.oracle(arrays, adv, params, seed=3, formula=formula)
    old = o["old_logprobs"].numpy()
    lp = next(iter(check_logprob.oracle_chunks(arrays, {"temperature": 1, "logit_scale": 1, "softcap": None})))[1]
    ratio = np.exp(lp.numpy().reshape(3, 4) - old)[arrays["mask"]]
    eps_low, eps_high, _ = check.draws.clip_kinks(params)
    assert (ratio < 1 - eps_low).any() or eps_low == 1
    assert (ratio > 1 + eps_high).any() and ((ratio > 1 - eps_low) & (ratio < 1 + eps_high)).any()
    assert not arrays["mask"].all()
    loss, E, grad, scale = _reference(arrays, old, adv, {"beta": 0.0, **given}, formula)
    assert float(o["loss"]) == pytest.approx(loss, rel=1e-13)
    assert float(o["E(loss)"]) == pytest.approx(E, rel=1e-9)
    assert o["grad.hidden"].numpy() == pytest.approx(grad, rel=1e-12, abs=1e-300)
    assert o["S(grad.hidden)"].numpy() == pytest.approx(scale, rel=1e-9, abs=1e-300)


@pytest.mark.parametrize("formula, given", [
    ("loss.grpo", {"beta": 0.04}),
    ("loss.bnpo", {"beta": 0.1, "kl_estimator": "k1"}),
    ("loss.dr_grpo", {"beta": 0.1, "kl_estimator": "k2", "divisor": 7}),
    ("loss.grpo", {"beta": 0.5, "kl_estimator": "abs"}),
    ("loss.grpo", {"beta": 0.1, "kl_estimator": "k3", "kl_log_ratio_min": -0.4, "kl_log_ratio_max": 0.3,
                   "kl_output_max": 0.05}),
    ("loss.grpo", {"beta": 0.1, "kl_estimator": "k3_straight_through", "kl_output_max": 0.05}),
    ("loss.dapo", {"beta": 0.2, "kl_estimator": "k3_unbiased", "aggregation": "token_mean"}),
    ("loss.grpo", {"beta": 0.2, "kl_estimator": "k3_unbiased", "kl_log_ratio_max": 0.3,
                   "kl_sg_ratio_where_clamped": False}),
    ("loss.grpo", {"beta": 0.2, "kl_estimator": "k3_unbiased", "kl_log_ratio_max": 0.3}),
    ("loss.cispo", {"beta": 0.1, "aggregation": "token_mean", "kl_aggregation": "token_mean"}),
    ("loss.grpo", {"beta": 0.1, "kl_estimator": "k1", "kl_aggregation": "sample_mean"})])
def test_composite_scales_with_the_kl_term_equal_reference_ad(formula, given):
    """With the KL term, l reaches the loss by two paths (the policy's term and the KL's): the composite's
    values and every scale equal reference._ad's, for each estimator, with clamps on either side of
    their kinks, the stop-gradient switch of k3_unbiased, and the KL aggregated inside the policy's
    aggregation or separately."""
    arrays = check_logprob.seeded_head(3, 5, 11, 5, seed=6)
    adv = np.array([0.75, -0.5, 1.25])
    params = check.oracle_params(formula, given, head=True)
    o = check_head_loss.oracle(arrays, adv, params, seed=3, formula=formula)
    old, ref = o["old_logprobs"].numpy(), o["ref_logprobs"].numpy()
    assert (ref == ref.astype(np.float32)).all() and (ref[~arrays["mask"]] == 0).all()
    assert not arrays["mask"].all()
    loss, E, grad, scale = _reference(arrays, old, adv, given, formula, ref)
    assert float(o["loss"]) == pytest.approx(loss, rel=1e-13)
    assert float(o["E(loss)"]) == pytest.approx(E, rel=1e-9)
    assert o["grad.hidden"].numpy() == pytest.approx(grad, rel=1e-12, abs=1e-300)
    assert o["S(grad.hidden)"].numpy() == pytest.approx(scale, rel=1e-9, abs=1e-300)


@pytest.mark.parametrize("formula, given", [
    ("loss.gspo", {}), ("loss.gspo", {"eps_low": 0.1, "eps_high": 0.15, "beta": 0.1}),
    ("loss.gspo", {"log_ratio_max": 0.1}), ("loss.gspo", {"log_ratio_clamp": 1.0, "beta": 0.04}),
    # rows of 4 tokens (2 clamped), the even ones unclipped: their mean's sum node has a residue (5 terms)
    ("loss.gspo", {"log_ratio_clamp": 1.0, "T": 4}),
    ("loss.luspo", {}), ("loss.luspo", {"ratio_level": "token", "beta": 0.05, "kl_estimator": "k3_unbiased"}),
    ("loss.sapo", {}), ("loss.sapo", {"log_ratio_clamp": 0.5, "beta": 0.2, "kl_estimator": "k2"}),
    ("loss.vespo", {}), ("loss.vespo", {"k_neg": 3.0, "lambda_pos": 0.5, "beta": 0.1})])
def test_composite_scales_of_the_sequence_losses_and_sapo_equal_reference_ad(formula, given):
    """GSPO's and LUSPO's sequence ratio (its mean log-ratio a node with an edge of 1/L to each l_t, the
    rows placed below, inside and above the clip range and beyond GSPO's cap) and SAPO's gate (l - l_old
    an edge of +1; clamped tokens with no path): the composite's values and every scale equal
    reference._ad's, with and without the KL term."""
    given = dict(given)
    arrays = check_logprob.seeded_head(4, given.pop("T", 5), 11, 5, seed=7)
    adv = np.array([0.75, -0.5, 1.25, -1.0])
    params = check.oracle_params(formula, {"beta": 0.0, **given}, head=True)
    o = check_head_loss.oracle(arrays, adv, params, seed=3, formula=formula)
    old = o["old_logprobs"].numpy()
    ref = o["ref_logprobs"].numpy() if "ref_logprobs" in o else None
    assert (old == old.astype(np.float32)).all() and not arrays["mask"].all()
    loss, E, grad, scale = _reference(arrays, old, adv, {"beta": 0.0, **given}, formula, ref)
    assert float(o["loss"]) == pytest.approx(loss, rel=1e-13)
    assert float(o["E(loss)"]) == pytest.approx(E, rel=1e-9)
    assert o["grad.hidden"].numpy() == pytest.approx(grad, rel=1e-12, abs=1e-300)
    assert o["S(grad.hidden)"].numpy() == pytest.approx(scale, rel=1e-9, abs=1e-300)


def _torch_head(scale=1.0, formulas=("loss.grpo",), kl_params=None, drop_sampler=False):
    """A head made of the torch backend's own formulas in the run's dtype: logits X W^T, logprob.token, the loss
    (``scale`` multiplies the loss, to make a wrong one; ``kl_params`` replace the check's parameters, to make a
    wrong KL term; ``drop_sampler``: VESPO's sampler log-probs taken and not folded into phi, a wrong one)."""
    torch_adapter = runner.load_adapter("torch")

    def make(fid):
        def head(hidden, weight, targets, mask, old_logprobs, advantages, params, ref_logprobs=None,
                 sampler_logprobs=None):
            x = hidden.detach().requires_grad_(True)
            inputs = {"old_logprobs": old_logprobs, "advantages": advantages, "mask": mask}
            if ref_logprobs is not None:
                inputs["ref_logprobs"] = ref_logprobs.to(hidden.dtype)
            if sampler_logprobs is not None and not drop_sampler:
                inputs["sampler_logprobs"] = sampler_logprobs
            with torch.enable_grad():
                l = torch_adapter.call("logprob.token", {"logits": x @ weight.T, "targets": targets, "mask": mask},
                                       {})["logprobs"]
                loss = torch_adapter.call(fid, {"logprobs": l, **inputs}, {**params, **(kl_params or {})})["loss"] * scale
                (g,) = torch.autograd.grad(loss, [x])
            return {"loss": loss.detach(), "grad": {"hidden": g}}
        return head

    a = Adapter(f"torch-head-{scale}", "test", "0", implementations={})
    a.heads = {fid: make(fid) for fid in formulas}
    return a


@pytest.mark.parametrize("formula, params", [("loss.bnpo", {}), ("loss.dr_grpo", {"divisor": 512}),
                                             ("loss.dapo", {"aggregation": "token_mean"}),
                                             ("loss.cispo", {"aggregation": "token_mean"}),
                                             ("loss.gspo", {}), ("loss.luspo", {}), ("loss.sapo", {"beta": 0.1}),
                                             ("loss.vespo", {})])
def test_every_head_loss_passes_a_correct_head_and_catches_a_wrong_one(formula, params):
    results = check.run_checks(_torch_head(formulas=(formula,)), formula, 3, 40, dtypes=["bfloat16", "float32"],
                               vocab=700, hidden=16, params=params)
    assert [(r.dtype, r.outcome, r.path) for r in results] == [("bfloat16", "pass", "head"), ("float32", "pass", "head")]
    assert all(0 < r.outputs[1].worst_ratio < 1 for r in results)
    (r,) = check.run_checks(_torch_head(1 + 1e-3, formulas=(formula,)), formula, 3, 40, dtypes=["float32"], vocab=700,
                            hidden=16, params=params)
    assert r.outcome == "fail" and r.outputs[1].failures > 0


def test_check_passes_a_correct_head_and_catches_a_wrong_one():
    results = check.run_checks(_torch_head(), "loss.grpo", 3, 40, dtypes=["bfloat16", "float32"], vocab=700, hidden=16,
                               params={"beta": 0.0})
    assert [(r.dtype, r.outcome, r.path) for r in results] == [("bfloat16", "pass", "head"), ("float32", "pass", "head")]
    for r in results:
        assert [(o.output, o.compared) for o in r.outputs] == [("loss", 1), ("grad.hidden", 3 * 40 * 16)]
        assert 0 < r.outputs[0].worst_ratio < 1 and 0 < r.outputs[1].worst_ratio < 1
    (r,) = check.run_checks(_torch_head(1 + 1e-3), "loss.grpo", 3, 40, dtypes=["float32"], vocab=700, hidden=16,
                            params={"beta": 0.0})
    assert r.outcome == "fail" and r.message.startswith("loss") and r.outputs[1].failures > 0


@pytest.mark.parametrize("params", [{"eps_low": 1.0}, {"eps_low": 0.0, "eps_high": 0.0}, {"log_ratio_clamp": 0.5},
                                    {"log_ratio_clamp": 0.3}])
def test_a_correct_head_passes_at_the_clip_ranges_edges_and_with_a_clamp(params):
    """eps_low = 1 (no lower clip) was an internal error, eps = 0 drew tokens on the kink (a correct
    head failed), and a clamp's kink could sit inside a band of log-ratios."""
    results = check.run_checks(_torch_head(), "loss.grpo", 3, 40, dtypes=["bfloat16", "float32"], vocab=700, hidden=16,
                               params={"beta": 0.0, **params})
    assert [r.outcome for r in results] == ["pass", "pass"], [r.message for r in results]


def test_usage_and_unsupported():
    torch_adapter = runner.load_adapter("torch")
    (r,) = check.run_checks(torch_adapter, "loss.grpo", 2, 8, vocab=50, params={"beta": 0.0})
    assert r.outcome == "unsupported" and "no fused head for loss.grpo" in r.message
    with pytest.raises(check.CheckError, match=r"options off \(is_level='token'\).*--param is_level=none"):
        check.run_checks(_torch_head(), "loss.grpo", 2, 8, vocab=50, params={"is_level": "token"})
    with pytest.raises(check.CheckError, match=r"options off \(opsm_delta=0.1\).*--param opsm_delta=null"):
        check.run_checks(_torch_head(), "loss.grpo", 2, 8, vocab=50, params={"opsm_delta": 0.1})
    with pytest.raises(check.CheckError, match="--vocab applies to"):
        check.run_checks(torch_adapter, "loss.gmpo", 2, 8, vocab=50)
    with pytest.raises(check.CheckError, match=r"batch-pooled token mean .*give --param aggregation=token_mean"):
        check.run_checks(_torch_head(formulas=("loss.dapo",)), "loss.dapo", 2, 8, vocab=50)


@pytest.mark.parametrize("eps_low,eps_high", [(0.2, 0.2), (0.2, 0.28), (0.1, 0.1)])
def test_old_logprobs_keep_every_ratio_away_from_the_clip(eps_low, eps_high):
    """A third of the tokens on each side of the clip range and a third inside it, every log-ratio at
    least 0.15 from a log-bound (or at the range's midpoint when it is narrower than 0.3), exact in float32."""
    rng = np.random.default_rng(0)
    lp = -rng.uniform(0, 20, size=(8, 500))
    mask = np.ones_like(lp, dtype=bool)
    mask[:, 450:] = False
    old = check_head_loss.old_logprobs(lp, mask, 5, eps_low, eps_high)
    assert (old == old.astype(np.float32)).all() and (old[~mask] == 0).all()
    rho = (lp - old)[mask]
    lo, hi = np.log1p(-eps_low), np.log1p(eps_high)
    below, above = rho < lo, rho > hi
    inside = ~below & ~above
    for part in (below, above, inside):
        assert 0.3 < part.mean() < 0.37
    assert (rho[below] <= lo - 0.25 + 1e-5).all() and (rho[above] >= hi + 0.25 - 1e-5).all()
    d = np.minimum(rho[inside] - lo, hi - rho[inside])
    assert (d >= min(0.15, (hi - lo) / 2) - 1e-5).all()


@pytest.mark.parametrize("formula, params, wrong", [
    ("loss.grpo", {"beta": 0.04}, {"kl_estimator": "k2"}),
    ("loss.grpo", {"beta": 0.1, "kl_log_ratio_min": -0.3, "kl_log_ratio_max": 0.3}, {"kl_log_ratio_min": None}),
    ("loss.dapo", {"beta": 0.1, "kl_estimator": "k3_unbiased", "aggregation": "token_mean"}, {"kl_estimator": "k3"}),
    ("loss.bnpo", {"beta": 0.1, "kl_aggregation": "sample_mean"}, {"kl_aggregation": "policy"})])
def test_a_head_with_the_kl_term_passes_and_a_wrong_kl_term_is_caught(formula, params, wrong):
    """beta > 0: the head gets the KL term's reference log-probs (exact in bfloat16, passed in float32 in a
    bfloat16 run) and is judged on its loss and gradient; the same head with another estimator, without
    a clamp, or aggregating the KL elsewhere fails in float32."""
    results = check.run_checks(_torch_head(formulas=(formula,)), formula, 3, 40, dtypes=["bfloat16", "float32"],
                               vocab=700, hidden=16, params=params)
    assert [(r.dtype, r.outcome) for r in results] == [("bfloat16", "pass"), ("float32", "pass")], \
        [r.message for r in results]
    (r,) = check.run_checks(_torch_head(formulas=(formula,), kl_params=wrong), formula, 3, 40, dtypes=["float32"],
                            vocab=700, hidden=16, params=params)
    assert r.outcome == "fail" and r.outputs[1].failures > 0


def test_a_head_without_ref_logprobs_is_unsupported_with_the_kl_term():
    def head(hidden, weight, targets, mask, old_logprobs, advantages, params):
        raise AssertionError("not called")

    a = Adapter("no-kl-head", "test", "0", implementations={})
    a.heads = {"loss.grpo": head}
    (r,) = check.run_checks(a, "loss.grpo", 2, 8, vocab=50, params={"beta": 0.04})
    assert r.outcome == "unsupported" and "takes no ref_logprobs" in r.message


@pytest.mark.parametrize("given", [{}, {"max_log_weight": 3.0, "min_weight": 0.9, "beta": 0.1},
                                   {"log_ratio_clamp": 0.05, "max_log_weight": 1.0, "min_weight": 0.2},
                                   {"T": 4}])    # rows of 4 tokens: 8 terms and l's residue, a depth of 4, not 3
def test_composite_scales_of_vespo_with_the_sampler_folded_equal_reference_ad(given):
    """VESPO with the sampler's log-probs (--sampler) from hidden states: its row's log-weight sums the
    clipped l_old - l_sampler of each token beside l's log-ratios (a sum node of 2 L terms, with l's
    residue); values and every scale equal reference._ad's, with tokens' sampler terms clipped."""
    given = dict(given)
    arrays = check_logprob.seeded_head(4, given.pop("T", 6), 11, 5, seed=7)
    adv = np.array([0.75, -0.5, 1.25, -1.0])
    params = check.oracle_params("loss.vespo", {"beta": 0.0, **given}, head=True)
    o = check_head_loss.oracle(arrays, adv, params, seed=3, formula="loss.vespo", sampler=True)
    old, sampler = o["old_logprobs"].numpy(), o["sampler_logprobs"].numpy()
    ref = o["ref_logprobs"].numpy() if "ref_logprobs" in o else None
    assert (sampler == sampler.astype(np.float32)).all() and (sampler[~arrays["mask"]] == 0).all()
    loss, E, grad, scale = _reference(arrays, old, adv, {"beta": 0.0, **given}, "loss.vespo", ref, sampler)
    assert float(o["loss"]) == pytest.approx(loss, rel=1e-13)
    assert float(o["E(loss)"]) == pytest.approx(E, rel=1e-9)
    assert o["grad.hidden"].numpy() == pytest.approx(grad, rel=1e-12, abs=1e-300)
    assert o["S(grad.hidden)"].numpy() == pytest.approx(scale, rel=1e-9, abs=1e-300)


def test_a_vespo_head_that_folds_the_sampler_passes_and_one_that_drops_it_fails():
    """--sampler --vocab: the head gets sampler_logprobs (exact in bfloat16, float32 in a bfloat16 run); a
    head that folds them into phi passes in both dtypes, one that drops them fails in float32, and one
    without the keyword is unsupported."""
    results = check.run_checks(_torch_head(formulas=("loss.vespo",)), "loss.vespo", 3, 40,
                               dtypes=["bfloat16", "float32"], vocab=700, hidden=16, sampler=True)
    assert [(r.dtype, r.outcome) for r in results] == [("bfloat16", "pass"), ("float32", "pass")], \
        [r.message for r in results]
    assert "sampler log-ratio clip" in [b["name"] for b in results[0].branches]
    (r,) = check.run_checks(_torch_head(formulas=("loss.vespo",), drop_sampler=True), "loss.vespo", 3, 40,
                            dtypes=["float32"], vocab=700, hidden=16, sampler=True)
    assert r.outcome == "fail" and r.outputs[1].failures > 0

    def head(hidden, weight, targets, mask, old_logprobs, advantages, params):
        raise AssertionError("not called")

    a = Adapter("no-sampler-head", "test", "0", implementations={})
    a.heads = {"loss.vespo": head}
    (r,) = check.run_checks(a, "loss.vespo", 2, 8, vocab=50, sampler=True)
    assert r.outcome == "unsupported" and "takes no sampler_logprobs" in r.message
