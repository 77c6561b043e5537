"""Tests of the surrogate family: gradients, precision, identities and published anchors, an
independent float64 implementation, errors and masking."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from mpmath import mp, mpf

from helpers import bf16_round, check_gradient_fd, check_precision, random_logprobs, random_mask
from pgspec.reference import SpecError, evaluate

LP = [[-1.0, -2.5, -0.375, -4.0], [-0.5, -3.0, -1.25, -2.0]]
OLD = [[-1.25, -2.0, -0.5, -3.5], [-0.5, -2.75, -1.0, -2.5]]
MASK = [[True, True, True, False], [True, True, False, False]]
A_SEQ = [0.75, -1.25]
A_TOK = [[0.75, -0.5, 1.5, 9.0], [-1.25, 2.0, 7.0, 7.0]]
BASE = {"logprobs": LP, "old_logprobs": OLD, "mask": MASK, "advantages": A_SEQ}
BASE_TOK = {**BASE, "advantages": A_TOK}
ON_POLICY_TOK = {k: v for k, v in BASE_TOK.items() if k != "old_logprobs"}

TOKEN_IDS = ["surrogate.pg", "surrogate.ppo_clip", "surrogate.dual_clip", "surrogate.trl_delta",
             "surrogate.cispo", "surrogate.sapo"]
SEQ_IDS = ["surrogate.gspo", "surrogate.gmpo", "surrogate.vespo"]
ALL_IDS = TOKEN_IDS + SEQ_IDS
U = 2.0 ** -53  # float64 unit roundoff


def d(x, digits=30):
    return mp.nstr(x, digits)


# Gradients ------------------------------------------------------------------------------------
FD_CASES = [
    ("surrogate.pg", BASE_TOK, None),
    ("surrogate.pg", ON_POLICY_TOK, {"form": "logprob"}),
    ("surrogate.pg", BASE_TOK, {"log_ratio_clamp": 0.375}),
    ("surrogate.ppo_clip", BASE_TOK, None),
    ("surrogate.ppo_clip", BASE_TOK, {"eps_low": 0.1, "eps_high": 0.28}),
    ("surrogate.dual_clip", BASE_TOK, {"c": 1.125}),
    ("surrogate.trl_delta", BASE_TOK, {"delta": 1.25}),
    ("surrogate.trl_delta", BASE_TOK, {"delta": 0.75}),
    ("surrogate.gspo", BASE, {"eps_low": 0.2, "eps_high": 0.2}),
    ("surrogate.gspo", BASE, None),
    ("surrogate.gmpo", BASE, None),
    ("surrogate.gmpo", BASE, {"eps_low": 0.1, "eps_high": 0.15}),
    ("surrogate.sapo", BASE_TOK, None),
    ("surrogate.sapo", BASE_TOK, {"tau_pos": 0.5, "tau_neg": 2.0, "log_ratio_clamp": 0.375}),
]


@pytest.mark.parametrize("fid,inputs,params", FD_CASES)
def test_gradient_matches_finite_difference(fid, inputs, params):
    assert check_gradient_fd(fid, inputs, params) == 5


def _closed_form_grad(fid, inputs, params, expected):
    """grad.logprobs equals expected(i, t) at unmasked positions and 0 elsewhere (to 50 digits)."""
    g = evaluate(fid, inputs, params)["grad"]["logprobs"]
    with mp.workdps(60):
        for i, row in enumerate(inputs["mask"]):
            for t, m in enumerate(row):
                want = expected(i, t) if m else 0
                assert abs(g[i][t] - want) <= mpf(10) ** -50 * max(1, abs(want)), (fid, i, t, d(g[i][t]), d(want))


@pytest.mark.parametrize("cap_form,eps_low,eps_high", [("relative", None, 0.2), ("relative", 0.1, 0.28),
                                                      ("absolute", None, 1.125), ("absolute", None, 5.0)])
def test_cispo_gradient_is_minus_stopped_weight_times_advantage(cap_form, eps_low, eps_high):
    params = {"cap_form": cap_form, "eps_low": eps_low, "eps_high": eps_high}
    out = evaluate("surrogate.cispo", BASE_TOK, params)

    def weight(i, t):
        with mp.workdps(60):
            r = mp.exp(mpf(LP[i][t]) - mpf(OLD[i][t]))
            if cap_form == "absolute":
                return min(r, mpf(eps_high))
            lo = -mp.inf if eps_low is None else 1 - mpf(eps_low)
            return min(max(r, lo), 1 + mpf(eps_high))

    with mp.workdps(60):
        for i, row in enumerate(MASK):
            for t, m in enumerate(row):
                if m:
                    w = weight(i, t)
                    assert abs(out["weight"][i][t] - w) < mpf(10) ** -55
                    assert abs(out["loss"][i][t] - (-w * A_TOK[i][t] * mpf(LP[i][t]))) < mpf(10) ** -55
    _closed_form_grad("surrogate.cispo", BASE_TOK, params, lambda i, t: -weight(i, t) * A_TOK[i][t])


def test_cispo_same_number_means_different_caps():
    # r = 2 (l = ln 0.5, l_old = ln 0.25), A = 1: verl's [0.8, 1.2] caps at 1.2, SkyRL's default
    # relative (eps_low 0, eps_high 5) = [1, 6] keeps 2; TRL's absolute cap 5 keeps 2, absolute 1.5 caps.
    lp, old = math.log(0.5), math.log(0.25)
    inputs = {"logprobs": [[lp]], "old_logprobs": [[old]], "mask": [[True]], "advantages": [1.0]}
    verl = evaluate("surrogate.cispo", inputs, {"eps_low": 0.2, "eps_high": 0.2})
    skyrl = evaluate("surrogate.cispo", inputs, {"eps_low": 0.0, "eps_high": 5.0})
    trl = evaluate("surrogate.cispo", inputs, {"cap_form": "absolute", "eps_high": 1.5})
    assert mp.nstr(verl["loss"][0][0], 5) == "0.83178" and mp.nstr(skyrl["loss"][0][0], 5) == "1.3863"
    with mp.workdps(60):
        assert verl["grad"]["logprobs"][0][0] == -(1 + mpf(0.2))
    assert abs(skyrl["weight"][0][0] - 2) < mpf(10) ** -15  # exp(ln 0.5 - ln 0.25) with float inputs
    assert trl["weight"][0][0] == mpf(1.5) and trl["grad"]["logprobs"][0][0] == -mpf(1.5)


def test_vespo_gradient_is_minus_stopped_phi_times_advantage():
    sampler = [[-1.0, -2.25, -0.5, 0.0], [-0.75, -2.75, 0.0, 0.0]]
    for extra in ({}, {"sampler_logprobs": sampler}):
        inputs = {**BASE, **extra}
        out = evaluate("surrogate.vespo", inputs)
        for i, row in enumerate(MASK):
            with mp.workdps(60):
                ts = [t for t, m in enumerate(row) if m]
                log_w = mp.fsum(mpf(LP[i][t]) - mpf(OLD[i][t]) for t in ts)
                if extra:
                    log_w += mp.fsum(mpf(OLD[i][t]) - mpf(sampler[i][t]) for t in ts)
                k, lam = (2, 3) if A_SEQ[i] >= 0 else (3, 2)
                phi = mp.exp(lam + k * log_w - lam * mp.exp(log_w))
                assert abs(out["phi"][i] - phi) < mpf(10) ** -55
        _closed_form_grad("surrogate.vespo", inputs, None, lambda i, t: -out["phi"][i] * A_SEQ[i])


def test_pg_on_policy_ratio_gradient_equals_reinforce_gradient():
    on_policy = {k: v for k, v in BASE_TOK.items() if k != "old_logprobs"}
    ratio = evaluate("surrogate.pg", on_policy)
    reinforce = evaluate("surrogate.pg", on_policy, {"form": "logprob"})
    for i, row in enumerate(MASK):
        for t, m in enumerate(row):
            if m:
                assert ratio["loss"][i][t] == -A_TOK[i][t]  # r = exp(l - sg[l]) = 1
                assert reinforce["loss"][i][t] == -A_TOK[i][t] * mpf(LP[i][t])
    assert ratio["grad"] == reinforce["grad"]
    _closed_form_grad("surrogate.pg", on_policy, None, lambda i, t: -A_TOK[i][t])


# Precision --------------------------------------------------------------------------------------
EXTREME = {
    "logprobs": [[0.0, -200.0, -1.0, -20.0], [-3.0, 0.0, -1.0, -7.0]],
    "old_logprobs": [[-200.0, 0.0, -1.0 + 2.0 ** -20, 0.0], [-23.0, -20.0, -1.0 - 2.0 ** -20, -7.0 + 2.0 ** -18]],
    "mask": [[True] * 4, [True] * 4],
}
EXTREME_SEQ = {**EXTREME, "advantages": [1.5, -0.75]}
EXTREME_TOK = {**EXTREME, "advantages": [[1.5, -0.75, 2.0, -1.0], [-2.0, 1.0, -0.5, 0.25]]}
PRECISION_PARAMS = {
    "surrogate.pg": [None, {"form": "logprob"}, {"log_ratio_clamp": 20}],
    "surrogate.ppo_clip": [None, {"eps_low": 0.2, "eps_high": 0.28}],
    "surrogate.dual_clip": [None],
    "surrogate.trl_delta": [None],
    "surrogate.cispo": [None, {"cap_form": "absolute", "eps_high": 5.0}],
    "surrogate.sapo": [None, {"log_ratio_clamp": 20}],
    "surrogate.gspo": [None, {"log_ratio_max": 10}],
    "surrogate.gmpo": [None],
    "surrogate.vespo": [None, {"log_ratio_clamp": None, "max_log_weight": 250.0}],
}


@pytest.mark.parametrize("fid", ALL_IDS)
def test_precision_60_vs_100_digits(fid):
    for params in PRECISION_PARAMS[fid]:
        cases = [BASE, EXTREME_SEQ] + ([BASE_TOK, EXTREME_TOK] if fid in TOKEN_IDS else [])
        if params and params.get("form") == "logprob":  # no ratio: old_logprobs is not an input
            cases = [{k: v for k, v in c.items() if k != "old_logprobs"} for c in cases]
        for inputs in cases:
            check_precision(fid, inputs, params)


def test_vespo_sampler_precision_and_extreme_weights():
    sampler = [[-190.0, 0.0, -1.0, -20.0], [-23.0, -40.0, -1.0, 0.0]]
    for params in (None, {"log_ratio_clamp": None, "max_log_weight": 250.0}):
        check_precision("surrogate.vespo", {**EXTREME_SEQ, "sampler_logprobs": sampler}, params)


def test_sapo_gradient_at_huge_ratio_is_tiny_and_exact():
    # log r = 200: x = tau (e^200 - 1) ~ 7e86, gradient 4 sigma(x) sigma(-x) r A ~ e^{-7e86}: nonzero
    # and correct to working precision (checked against 200 digits above every magnitude).
    inputs = {"logprobs": [[0.0]], "old_logprobs": [[-200.0]], "mask": [[True]], "advantages": [1.0]}
    g = evaluate("surrogate.sapo", inputs)["grad"]["logprobs"][0][0]
    with mp.workdps(400):
        x = mp.expm1(200)
        want = -4 * mp.exp(-x) / (1 + mp.exp(-x)) ** 2 * mp.exp(200)
        assert g < 0 and abs(g / want - 1) < mpf(10) ** -55


# Identities and anchors -------------------------------------------------------------------------
def test_sapo_gate_value_and_slope_at_ratio_one():
    on_policy = {**BASE_TOK, "old_logprobs": LP}
    for tau_pos, tau_neg in ((1.0, 1.05), (0.5, 3.0)):
        out = evaluate("surrogate.sapo", on_policy, {"tau_pos": tau_pos, "tau_neg": tau_neg})
        with mp.workdps(60):
            for i, row in enumerate(MASK):
                for t, m in enumerate(row):
                    if m:
                        a = A_TOK[i][t]
                        tau = mpf(tau_pos if a > 0 else tau_neg)
                        assert abs(out["loss"][i][t] - (-a * 2 / tau)) < mpf(10) ** -55  # f(1) = 2/tau
                        assert out["grad"]["logprobs"][i][t] == -a  # f'(1) * r = 4 p (1-p) r = 1


def test_sapo_gradient_weight_is_four_p_one_minus_p_r():
    out = evaluate("surrogate.sapo", BASE_TOK)
    with mp.workdps(60):
        for i, row in enumerate(MASK):
            for t, m in enumerate(row):
                if m:
                    a = A_TOK[i][t]
                    tau = mpf(1.0 if a > 0 else 1.05)
                    r = mp.exp(mpf(LP[i][t]) - mpf(OLD[i][t]))
                    p = 1 / (1 + mp.exp(-tau * (r - 1)))
                    assert abs(out["grad"]["logprobs"][i][t] - (-a * 4 * p * (1 - p) * r)) < mpf(10) ** -55


def test_gmpo_default_bounds_are_e_to_the_minus_and_plus_0_4():
    one = {"mask": [[True]]}
    hi = evaluate("surrogate.gmpo", {**one, "logprobs": [[0.0]], "old_logprobs": [[-1.0]], "advantages": [1.0]})
    lo = evaluate("surrogate.gmpo", {**one, "logprobs": [[-1.0]], "old_logprobs": [[0.0]], "advantages": [-1.0]})
    assert mp.nstr(-hi["loss"][0], 11) == "1.4918246976"   # e^{0.4}
    assert mp.nstr(lo["loss"][0], 10) == "0.670320046"     # e^{-0.4} = 0.6703200460
    assert hi["grad"]["logprobs"] == [[0]] and lo["grad"]["logprobs"] == [[0]]  # clipped side
    # the unclipped sides: A > 0 with a falling ratio and A < 0 with a rising ratio pass through
    down = evaluate("surrogate.gmpo", {**one, "logprobs": [[-1.0]], "old_logprobs": [[0.0]], "advantages": [1.0]})
    up = evaluate("surrogate.gmpo", {**one, "logprobs": [[0.0]], "old_logprobs": [[-1.0]], "advantages": [-1.0]})
    with mp.workdps(60):
        assert down["loss"][0] == -mp.exp(-1) and up["loss"][0] == mp.exp(1)


def test_gmpo_on_policy_gradient_is_sample_mean_pg():
    out = evaluate("surrogate.gmpo", {**BASE, "old_logprobs": LP})
    assert out["loss"] == [-mpf(A_SEQ[0]), -mpf(A_SEQ[1])]
    _closed_form_grad("surrogate.gmpo", {**BASE, "old_logprobs": LP}, None,
                      lambda i, t: -mpf(A_SEQ[i]) / sum(MASK[i]))


def test_gspo_on_policy_is_sample_mean_pg():
    inputs = {**BASE, "old_logprobs": LP}
    out = evaluate("surrogate.gspo", inputs)
    assert out["loss"] == [-mpf(A_SEQ[0]), -mpf(A_SEQ[1])]  # s_i = 1 exactly
    _closed_form_grad("surrogate.gspo", inputs, None, lambda i, t: -mpf(A_SEQ[i]) / sum(MASK[i]))


def test_gspo_token_composition_has_gspo_value_and_gradient():
    """GSPO-token (ratio.gspo_token + ppo_clip_loss per token, sample mean) == GSPO for A_{i,t} = A_i."""
    from pgspec.reference import _ad
    from pgspec.reference.ratio import gspo_token_ratio
    from pgspec.reference.surrogate import ppo_clip_loss

    for eps in (0.2, 0.03):
        params = {"eps_low": eps, "eps_high": eps}
        ref = evaluate("surrogate.gspo", BASE, params)
        with mp.workdps(60):
            leaves = [[_ad.Var(mpf(x)) if m else None for x, m in zip(row, mrow)] for row, mrow in zip(LP, MASK)]
            old = [[mpf(x) for x in row] for row in OLD]
            s_tok = gspo_token_ratio(leaves, old, MASK, log_ratio_max=None)["ratio"]
            e = mpf(eps)
            seq = [_ad.total(ppo_clip_loss(s_tok[i][t], mpf(A_SEQ[i]), e, e) for t, m in enumerate(MASK[i]) if m)
                   / sum(MASK[i]) for i in range(2)]
            grads = _ad.backward(seq)
            for i in range(2):
                assert abs(_ad.value_of(seq[i]) - ref["loss"][i]) < mpf(10) ** -55
                for t, m in enumerate(MASK[i]):
                    g = grads.get(id(leaves[i][t]), 0) if m else 0
                    assert abs(g - ref["grad"]["logprobs"][i][t]) < mpf(10) ** -55


def test_ppo_clip_ratio_one_and_zero_gradient_on_clipped_side():
    on_policy = evaluate("surrogate.ppo_clip", {**BASE_TOK, "old_logprobs": LP})
    for i, row in enumerate(MASK):
        for t, m in enumerate(row):
            if m:
                assert on_policy["loss"][i][t] == -A_TOK[i][t]
                assert on_policy["grad"]["logprobs"][i][t] == -A_TOK[i][t]  # tie: half + half
    # log-ratios +-0.5 (r = 1.65, 0.61) with A = +-1, eps 0.2
    lp, old = [[0.0, -0.5, 0.0, -0.5]], [[-0.5, 0.0, -0.5, 0.0]]
    out = evaluate("surrogate.ppo_clip", {"logprobs": lp, "old_logprobs": old, "mask": [[True] * 4],
                                          "advantages": [[1.0, -1.0, -1.0, 1.0]]})
    with mp.workdps(60):
        r_hi, r_lo = mp.exp(0.5), mp.exp(-0.5)
        assert out["loss"][0][0] == -(1 + mpf(0.2)) and out["grad"]["logprobs"][0][0] == 0  # A>0, r>1+eps
        assert out["loss"][0][1] == 1 - mpf(0.2) and out["grad"]["logprobs"][0][1] == 0       # A<0, r<1-eps
        assert out["loss"][0][2] == r_hi and out["grad"]["logprobs"][0][2] == r_hi        # A<0, r>1+eps
        assert out["loss"][0][3] == -r_lo and out["grad"]["logprobs"][0][3] == -r_lo      # A>0, r<1-eps


def test_dual_clip_bounds_loss_at_minus_c_a():
    # verl anchor: l_old = 0, l = ln 5, A = -1, eps 0.2: PPO clip loss 5, dual clip c = 3 gives 3
    inputs = {"logprobs": [[math.log(5.0)]], "old_logprobs": [[0.0]], "mask": [[True]], "advantages": [-1.0]}
    assert mp.nstr(evaluate("surrogate.ppo_clip", inputs)["loss"][0][0], 12) == "5.0"
    out = evaluate("surrogate.dual_clip", inputs)
    assert out["loss"][0][0] == 3 and out["grad"]["logprobs"][0][0] == 0
    # slime tests/test_policy_loss.py: r = [2, 2, 0.5], A = [2, -2, 2], eps 0.2, c = 1.5 -> [-2.4, 3.0, -1.0]
    ln2 = math.log(2.0)
    slime = evaluate("surrogate.dual_clip", {"logprobs": [[ln2, ln2, -ln2]], "old_logprobs": [[0.0] * 3],
                                             "mask": [[True] * 3], "advantages": [[2.0, -2.0, 2.0]]}, {"c": 1.5})
    assert [mp.nstr(x, 12) for x in slime["loss"][0]] == ["-2.4", "3.0", "-1.0"]
    # A >= 0 is never touched; for A < 0 the loss never exceeds -c A
    big = evaluate("surrogate.dual_clip", {**EXTREME_TOK})
    plain = evaluate("surrogate.ppo_clip", {**EXTREME_TOK})
    for i in range(2):
        for t in range(4):
            a = EXTREME_TOK["advantages"][i][t]
            if a >= 0:
                assert big["loss"][i][t] == plain["loss"][i][t]
            else:
                assert big["loss"][i][t] == min(plain["loss"][i][t], -3 * mpf(a))


def test_trl_delta_caps_the_unclipped_branch():
    lp = [[math.log(3.0), math.log(6.0), math.log(6.0), 0.5]]
    inputs = {"logprobs": lp, "old_logprobs": [[0.0] * 4], "mask": [[True] * 4], "advantages": [[-1.0, -1.0, 2.0, 1.0]]}
    out = evaluate("surrogate.trl_delta", inputs)  # delta 4, eps 0.2
    with mp.workdps(60):
        r0 = mp.exp(mpf(lp[0][0]))
        assert out["loss"][0][0] == r0 and out["grad"]["logprobs"][0][0] == r0   # 1.2 < r = 3 < delta
        assert out["loss"][0][1] == 4 and out["grad"]["logprobs"][0][1] == 0     # r = 6 > delta: capped at delta |A|
        assert out["loss"][0][2] == -2 * (1 + mpf(0.2)) and out["grad"]["logprobs"][0][2] == 0  # A > 0: the clip binds
    # for delta >= 1 + eps_high it is dual clip with c = delta where A < 0 and PPO clip where A > 0
    rng = random.Random(7)
    for _ in range(5):
        case = _random_case(rng, token_adv=True, spread=2.0)
        a = evaluate("surrogate.trl_delta", case, {"delta": 2.5})
        b = evaluate("surrogate.dual_clip", case, {"c": 2.5})
        assert a == b
    # delta below 1 + eps_high also caps A > 0
    small = evaluate("surrogate.trl_delta", {**inputs, "advantages": [[1.0] * 4]}, {"delta": 1.125})
    assert small["loss"][0][3] == -mpf(1.125) and small["grad"]["logprobs"][0][3] == 0


def test_empty_sequences():
    inputs = {"logprobs": [[-1.0, -2.0], [-1.0, -2.0]], "old_logprobs": [[-3.0, 0.0], [-1.5, -2.0]],
              "mask": [[False, False], [True, True]], "advantages": [2.0, 1.0]}
    for fid in ("surrogate.gspo", "surrogate.gmpo"):
        out = evaluate(fid, inputs)
        assert out["loss"][0] == 0 and out["grad"]["logprobs"][0] == [0, 0]
    v = evaluate("surrogate.vespo", inputs)
    assert v["phi"][0] == 1 and v["loss"][0] == [None, None]


def test_vespo_phi_is_one_on_policy_and_clamps_apply():
    out = evaluate("surrogate.vespo", {**BASE, "old_logprobs": LP})
    assert out["phi"] == [1, 1]
    # A = 0 takes the positive branch (k_pos, lambda_pos): phi differs although the loss is 0
    zero = evaluate("surrogate.vespo", {**BASE, "advantages": [0.0, 0.0]}, {"k_neg": 7.0, "lambda_neg": 9.0})
    pos = evaluate("surrogate.vespo", {**BASE, "advantages": [1.0, 1.0]}, {"k_neg": 7.0, "lambda_neg": 9.0})
    assert zero["phi"] == pos["phi"]
    # log w = 30 is clamped to 20: phi = exp(lambda + 20 k - lambda e^20) (A >= 0: k 2, lambda 3)
    inputs = {"logprobs": [[0.0, 0.0]], "old_logprobs": [[-15.0, -15.0]], "mask": [[True, True]], "advantages": [1.0]}
    with mp.workdps(60):
        want = mp.exp(3 + 40 - 3 * mp.exp(20))
        assert abs(evaluate("surrogate.vespo", inputs)["phi"][0] / want - 1) < mpf(10) ** -50
        # log w = -30 is floored at ln 1e-8 (float 1e-8, as TRL's math.log(1e-8)); A < 0: k 3, lambda 2
        down = evaluate("surrogate.vespo", {**inputs, "logprobs": [[-30.0, -30.0]], "advantages": [-1.0]})
        lw = mp.log(mpf(1e-8))
        assert abs(down["phi"][0] / mp.exp(2 + 3 * lw - 2 * mpf(1e-8)) - 1) < mpf(10) ** -50
        # token log-ratio clamp 20: a single token of log-ratio 30 counts as 20 before the sum
        one = evaluate("surrogate.vespo", {"logprobs": [[0.0, 0.0]], "old_logprobs": [[-30.0, 1.0]],
                                           "mask": [[True, True]], "advantages": [1.0]})
        assert abs(one["phi"][0] / mp.exp(3 + 2 * 19 - 3 * mp.exp(19)) - 1) < mpf(10) ** -50


# Errors and masking ------------------------------------------------------------------------------
def test_errors_name_the_argument():
    with pytest.raises(SpecError, match="'c' must be real in \\(1"):
        evaluate("surrogate.dual_clip", BASE, {"c": 1.0})
    with pytest.raises(SpecError, match="'eps_low' must be real in \\[0, 1\\]"):
        evaluate("surrogate.ppo_clip", BASE, {"eps_low": 1.5})
    with pytest.raises(SpecError, match="'eps_high'"):
        evaluate("surrogate.gspo", BASE, {"eps_high": -0.1})
    with pytest.raises(SpecError, match="'tau_neg'"):
        evaluate("surrogate.sapo", BASE, {"tau_neg": 0})
    with pytest.raises(SpecError, match="'cap_form' must be one of 'relative', 'absolute'"):
        evaluate("surrogate.cispo", BASE, {"cap_form": "1+eps"})
    with pytest.raises(SpecError, match="'eps_low' applies only to cap_form='relative'"):
        evaluate("surrogate.cispo", BASE, {"cap_form": "absolute", "eps_low": 0.2, "eps_high": 5.0})
    with pytest.raises(SpecError, match="'old_logprobs' is not read by form='logprob'"):
        evaluate("surrogate.pg", BASE, {"form": "logprob"})
    with pytest.raises(SpecError, match="'log_ratio_clamp' has no meaning for form='logprob'"):
        evaluate("surrogate.pg", {k: v for k, v in BASE.items() if k != "old_logprobs"},
                 {"form": "logprob", "log_ratio_clamp": 20})
    with pytest.raises(SpecError, match="'advantages' must have shape \\[B\\]"):
        evaluate("surrogate.gspo", BASE_TOK)
    with pytest.raises(SpecError, match="missing input 'old_logprobs'"):
        evaluate("surrogate.ppo_clip", {k: v for k, v in BASE.items() if k != "old_logprobs"})
    with pytest.raises(SpecError, match="'delta'"):
        evaluate("surrogate.trl_delta", BASE, {"delta": 0})
    with pytest.raises(SpecError, match="'min_weight'"):
        evaluate("surrogate.vespo", BASE, {"min_weight": 0})
    with pytest.raises(SpecError, match="advantages\\[1\\]\\[0\\] must be finite"):
        evaluate("surrogate.sapo", {**BASE_TOK, "advantages": [[1.0] * 4, [float("nan")] * 4]})
    with pytest.raises(SpecError, match="sampler_logprobs.*shape"):
        evaluate("surrogate.vespo", {**BASE, "sampler_logprobs": [[0.0]]})


def test_nan_and_inf_at_masked_positions_never_reach_results():
    mask = [[True, True, False], [True, False, False]]
    nan, inf = float("nan"), float("inf")
    clean = {"logprobs": [[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], "old_logprobs": [[-1.5, -1.75, 0.0], [-1.0, 0.0, 0.0]],
             "sampler_logprobs": [[-1.25, -2.0, 0.0], [-1.0, 0.0, 0.0]], "mask": mask}
    dirty = {"logprobs": [[-1.0, -2.0, nan], [-0.5, inf, nan]], "old_logprobs": [[-1.5, -1.75, -inf], [-1.0, nan, inf]],
             "sampler_logprobs": [[-1.25, -2.0, inf], [-1.0, -inf, nan]], "mask": mask}
    for fid in ALL_IDS:
        if fid in SEQ_IDS:
            adv_clean = adv_dirty = [1.0, -0.5]
        else:
            adv_clean = [[1.0, -0.5, 0.0], [-0.5, 0.0, 0.0]]
            adv_dirty = [[1.0, -0.5, nan], [-0.5, inf, -inf]]
        drop = () if fid == "surrogate.vespo" else ("sampler_logprobs",)
        a = evaluate(fid, {**{k: v for k, v in dirty.items() if k not in drop}, "advantages": adv_dirty})
        b = evaluate(fid, {**{k: v for k, v in clean.items() if k not in drop}, "advantages": adv_clean})
        assert a == b, fid


# An independent float64 implementation, written from the spec text alone ------------------------
def sig(x):
    return np.where(x >= 0, 1 / (1 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1 + np.exp(-np.abs(x))))


def np_token(fid, lp, old, adv, p):
    """(loss, dloss/dl) elementwise for the token formulas."""
    dlt = lp - old
    r = np.exp(dlt)
    A = adv
    if fid == "surrogate.pg":
        return -A * r, -A * r
    if fid in ("surrogate.ppo_clip", "surrogate.dual_clip"):
        lo, hi = 1 - p.get("eps_low", 0.2), 1 + p.get("eps_high", 0.2)
        loss = np.maximum(-A * r, -A * np.clip(r, lo, hi))
        grad = np.where(((A > 0) & (r > hi)) | ((A < 0) & (r < lo)), 0.0, -A * r)
        if fid == "surrogate.dual_clip":
            c = p.get("c", 3.0)
            capped = (A < 0) & (loss > -c * A)
            loss = np.where(capped, -c * A, loss)
            grad = np.where(capped, 0.0, grad)
        return loss, grad
    if fid == "surrogate.trl_delta":
        lo, hi, delta = 0.8, 1.2, p.get("delta", 4.0)
        capped = np.minimum(r, delta)
        loss = np.maximum(-A * capped, -A * np.clip(r, lo, hi))
        unclipped_wins = -A * capped >= -A * np.clip(r, lo, hi)
        grad = np.where(unclipped_wins & (r <= delta), -A * r, 0.0)
        return loss, grad
    if fid == "surrogate.cispo":
        w = np.clip(r, -np.inf, 1 + p.get("eps_high", 0.2)) if p.get("cap_form", "relative") == "relative" \
            else np.minimum(r, p["eps_high"])
        return -w * A * lp, -w * A
    if fid == "surrogate.sapo":
        tau = np.where(A > 0, p.get("tau_pos", 1.0), p.get("tau_neg", 1.05))
        x = tau * np.expm1(dlt)
        return -A * 4 / tau * sig(x), -A * 4 * sig(x) * sig(-x) * r
    raise KeyError(fid)


def np_sequence(fid, lp, old, m, adv, p, sampler=None):
    """(loss, dloss/dl) for the sequence formulas; loss is [B] (gspo, gmpo) or [B,T] (vespo)."""
    L = m.sum(1)
    dlt = np.where(m, lp - old, 0.0)
    A = adv
    if fid == "surrogate.gspo":
        s = np.exp(dlt.sum(1) / np.maximum(L, 1))
        lo, hi = 1 - p.get("eps_low", 3e-4), 1 + p.get("eps_high", 4e-4)
        loss = np.where(L > 0, np.maximum(-A * s, -A * np.clip(s, lo, hi)), 0.0)
        live = ~(((A > 0) & (s > hi)) | ((A < 0) & (s < lo)))
        grad = np.where(m & live[:, None], (-A * s / np.maximum(L, 1))[:, None], 0.0)
        return loss, grad
    if fid == "surrogate.gmpo":
        lo, hi = -p.get("eps_low", 0.4), p.get("eps_high", 0.4)
        c = np.clip(dlt, lo, hi)
        pos = (A > 0)[:, None]
        dt = np.where(pos, np.minimum(dlt, c), np.maximum(dlt, c))
        g = np.exp(np.where(m, dt, 0.0).sum(1) / np.maximum(L, 1))
        live = np.where(pos, dlt <= hi, dlt >= lo)
        loss = np.where(L > 0, -A * g, 0.0)
        grad = np.where(m & live, (-A * g / np.maximum(L, 1))[:, None], 0.0)
        return loss, grad
    if fid == "surrogate.vespo":
        lw = np.clip(dlt, -20, 20).sum(1)
        if sampler is not None:
            lw += np.where(m, np.clip(old - sampler, np.log(1e-8), 20), 0.0).sum(1)
        lw = np.clip(lw, np.log(1e-8), 20)
        k = np.where(A >= 0, 2.0, 3.0)
        lam = np.where(A >= 0, 3.0, 2.0)
        phi = np.exp(lam + k * lw - lam * np.exp(lw))
        return -(phi * A)[:, None] * lp, np.where(m, -(phi * A)[:, None], 0.0), phi, lw
    raise KeyError(fid)


def _random_case(rng, token_adv, spread=0.5):
    B, T = rng.randint(1, 4), rng.randint(1, 10)
    lp = random_logprobs(rng, B, T)
    old = [[bf16_round(x + rng.uniform(-spread, spread)) for x in row] for row in lp]
    mask = random_mask(rng, B, T)
    if token_adv:
        adv = [[bf16_round(rng.uniform(-2, 2)) for _ in range(T)] for _ in range(B)]
    else:
        adv = [bf16_round(rng.uniform(-2, 2)) for _ in range(B)]
    return {"logprobs": lp, "old_logprobs": old, "mask": mask, "advantages": adv}


def _close(ref, got, rel, scale):
    assert math.isclose(float(ref), float(got), rel_tol=rel, abs_tol=rel * scale), (float(ref), float(got), rel)


TOKEN_NP_PARAMS = [
    ("surrogate.pg", {}), ("surrogate.ppo_clip", {}), ("surrogate.ppo_clip", {"eps_low": 0.1, "eps_high": 0.28}),
    ("surrogate.dual_clip", {"c": 1.5}), ("surrogate.trl_delta", {"delta": 1.5}), ("surrogate.cispo", {}),
    ("surrogate.cispo", {"cap_form": "absolute", "eps_high": 1.25}), ("surrogate.sapo", {}),
]


@pytest.mark.parametrize("fid,params", TOKEN_NP_PARAMS)
def test_token_formulas_agree_with_independent_float64_numpy(fid, params):
    # Each float64 value or gradient is a chain of at most 6 correctly rounded or faithfully rounded
    # (exp, expm1) operations on exact inputs (bf16 differences are exact in float64), each within
    # 2u relative; the sigmoid of SAPO adds exp, 1 + e and a division.  Hence 16u relative; the
    # absolute part covers terms that cancel to 0 (A r vs A clip(r) at a tie), at the same scale.
    rng = random.Random(hash(fid) % 1000 + 17)
    for _ in range(12):
        case = _random_case(rng, token_adv=True)
        ref = evaluate(fid, case, params)
        lp, old, adv = (np.asarray(case[k], dtype=float) for k in ("logprobs", "old_logprobs", "advantages"))
        loss, grad = np_token(fid, lp, old, adv, params)
        for i, row in enumerate(case["mask"]):
            for t, m in enumerate(row):
                if m:
                    scale = abs(adv[i, t]) * (np.exp(lp[i, t] - old[i, t]) + 1) * (1 + abs(lp[i, t]))
                    _close(ref["loss"][i][t], loss[i, t], 16 * U, scale)
                    _close(ref["grad"]["logprobs"][i][t], grad[i, t], 16 * U, scale)
                else:
                    assert ref["loss"][i][t] is None and ref["grad"]["logprobs"][i][t] == 0


@pytest.mark.parametrize("fid,params", [("surrogate.gspo", {}), ("surrogate.gspo", {"eps_low": 0.05, "eps_high": 0.05}),
                                        ("surrogate.gmpo", {}), ("surrogate.gmpo", {"eps_low": 0.1, "eps_high": 0.05})])
def test_sequence_formulas_agree_with_independent_float64_numpy(fid, params):
    # s_i or g_i = exp(sum / L): the sum of at most T exact bf16 differences is exact in float64
    # (their bits span < 53 places), the division and exp add 1 + 2 roundings, times A one more,
    # and the gradient's / L one more: 12u relative covers it.
    rng = random.Random(hash(fid) % 1000 + 99)
    for _ in range(15):
        case = _random_case(rng, token_adv=False)
        ref = evaluate(fid, case, params)
        m = np.asarray(case["mask"])
        loss, grad = np_sequence(fid, np.asarray(case["logprobs"]), np.asarray(case["old_logprobs"]), m,
                                 np.asarray(case["advantages"]), params)
        for i in range(m.shape[0]):
            _close(ref["loss"][i], loss[i], 12 * U, abs(case["advantages"][i]))
            for t in range(m.shape[1]):
                _close(ref["grad"]["logprobs"][i][t], grad[i, t], 12 * U, abs(case["advantages"][i]))


def test_vespo_agrees_with_independent_float64_numpy():
    # phi = exp(lambda + k lw - lambda e^lw): lw is an exact float64 sum (bf16 differences) up to the
    # rounding of ln(1e-8) where it is clamped, e^lw errs by 2u, so the exponent errs by
    # u (4 lambda e^lw + 2 k |lw| + 4) and phi by that plus 2u; the loss multiplies by A and l.
    rng = random.Random(2024)
    for n in range(12):
        case = _random_case(rng, token_adv=False, spread=1.5 if n % 2 else 0.3)
        sampler = [[bf16_round(x + rng.uniform(-0.5, 0.5)) for x in row] for row in case["old_logprobs"]]
        for extra in ({}, {"sampler_logprobs": sampler}):
            ref = evaluate("surrogate.vespo", {**case, **extra})
            m = np.asarray(case["mask"])
            lp = np.asarray(case["logprobs"])
            loss, grad, phi, lw = np_sequence("surrogate.vespo", lp, np.asarray(case["old_logprobs"]), m,
                                              np.asarray(case["advantages"]), {},
                                              np.asarray(sampler) if extra else None)
            for i in range(m.shape[0]):
                a = case["advantages"][i]
                k, lam = (2, 3) if a >= 0 else (3, 2)
                rel = U * (4 * lam * math.exp(lw[i]) + 2 * k * abs(lw[i]) + 8)
                _close(ref["phi"][i], phi[i], rel, 0)
                for t in range(m.shape[1]):
                    if m[i, t]:
                        _close(ref["loss"][i][t], loss[i, t], rel + 4 * U, 0)
                        _close(ref["grad"]["logprobs"][i][t], grad[i, t], rel + 2 * U, 0)


# Liger-Kernel fork PR #4: the per-token clamp before GSPO's sequence mean -------------------------

def test_gspo_per_token_clamp_is_the_ppo_clip_of_the_clamped_sequence_ratio():
    """Identity: surrogate.gspo(k) = max(-A s, -A clip(s, ...)) with s = ratio.sequence_geometric(k)."""
    rng = random.Random(902)
    for _ in range(10):
        B, T = 3, 5
        mask = random_mask(rng, B, T)
        lp, old = random_logprobs(rng, B, T, lo=-8.0), random_logprobs(rng, B, T, lo=-8.0)
        adv = [rng.choice([-1.5, -0.5, 0.5, 2.0]) for _ in range(B)]
        k = rng.choice([0.125, 0.5, 2.0])
        params = {"log_ratio_clamp": k, "eps_low": "0.2", "eps_high": "0.2"}
        loss = evaluate("surrogate.gspo", {"logprobs": lp, "old_logprobs": old, "mask": mask, "advantages": adv},
                        params)["loss"]
        s = evaluate("ratio.sequence_geometric", {"logprobs": lp, "old_logprobs": old, "mask": mask},
                     {"log_ratio_clamp": k})["ratio"]
        with mp.workdps(60):
            for i in range(B):
                want = max(-adv[i] * s[i], -adv[i] * min(max(s[i], mpf("0.8")), mpf("1.2"))) if any(mask[i]) else 0
                assert abs(loss[i] - want) <= mpf(10) ** -50


def test_gspo_per_token_clamp_gradient_30_0():
    d30 = {"logprobs": [[0.0, -1.0]], "old_logprobs": [[-30.0, -1.0]], "mask": [[True, True]], "advantages": [-1.0]}
    out = evaluate("surrogate.gspo", d30, {"log_ratio_clamp": 20})
    with mp.workdps(60):
        assert abs(out["loss"][0] - mp.exp(10)) <= mp.exp(10) * mpf(10) ** -55
        g = out["grad"]["logprobs"][0]
        assert g[0] == 0 and abs(g[1] - mp.exp(10) / 2) <= mp.exp(10) * mpf(10) ** -55
    assert check_gradient_fd("surrogate.gspo", d30, {"log_ratio_clamp": 20}) == 2


# surrogate.gspo_document (Fast-LLM PR #502: GSPO over packed documents) ---------------------------

def test_gspo_document_with_one_document_per_row_is_gspo_times_the_length():
    rng = random.Random(907)
    for _ in range(10):
        B, T = 3, 6
        mask = random_mask(rng, B, T)
        lp, old = random_logprobs(rng, B, T, lo=-3.0), random_logprobs(rng, B, T, lo=-3.0)
        adv = [rng.choice([-1.5, -0.5, 0.5, 2.0]) for _ in range(B)]
        base = {"logprobs": lp, "old_logprobs": old, "mask": mask, "advantages": adv}
        eps = {"eps_low": "0.2", "eps_high": "0.2"}
        doc = evaluate("surrogate.gspo_document", {**base, "document_ids": [[10 + i] * T for i in range(B)]}, eps)
        seq = evaluate("surrogate.gspo", base, eps)
        assert doc["segment_ids"] == [10 + i for i in range(B)]
        with mp.workdps(60):
            for i in range(B):
                L = sum(mask[i])
                assert doc["token_count"][i] == L
                assert abs(doc["loss"][i] - seq["loss"][i]) <= mpf(10) ** -50
                assert abs(doc["weighted_loss"][i] - L * seq["loss"][i]) <= mpf(10) ** -50
                for t in range(T):   # Fast-LLM's uniform gradient: L_i times GSPO's (-A s / L_i)
                    if mask[i][t]:
                        assert abs(doc["grad"]["logprobs"][i][t] - L * seq["grad"]["logprobs"][i][t]) <= mpf(10) ** -48


def test_gspo_document_gradient_is_uniform_per_document_and_the_ratio_is_sdp_segment():
    """d(sum_s N_s l_s)/dl_t = -A_s R_s (or 0 where clipped) at every token of s, across rows; R_s = dist.sdp_segment."""
    rng = random.Random(908)
    for _ in range(10):
        B, T = 3, 6
        mask = random_mask(rng, B, T)
        lp, old = random_logprobs(rng, B, T, lo=-2.0), random_logprobs(rng, B, T, lo=-2.0)
        adv = [[rng.choice([-1.0, 0.5, 1.5]) for _ in range(T)] for _ in range(B)]
        docs = [[rng.randint(0, 3) for _ in range(T)] for _ in range(B)]
        inputs = {"logprobs": lp, "old_logprobs": old, "mask": mask, "advantages": adv, "document_ids": docs}
        out = evaluate("surrogate.gspo_document", inputs)
        seg = evaluate("dist.sdp_segment", {"logprobs": lp, "old_logprobs": old, "mask": mask, "document_ids": docs},
                       {"sdp_size": 2})
        assert out["segment_ids"] == seg["segment_ids"]
        with mp.workdps(60):
            for k, s in enumerate(out["segment_ids"]):
                assert abs(out["ratio"][k] - seg["ratio"][k]) <= out["ratio"][k] * mpf(10) ** -50
                r, a = out["ratio"][k], out["advantage"][k]
                clipped = (a > 0 and r > mpf("1.2")) or (a < 0 and r < mpf("0.8"))
                want = 0 if clipped else -a * r
                for i in range(B):
                    for t in range(T):
                        if mask[i][t] and docs[i][t] == s:
                            assert abs(out["grad"]["logprobs"][i][t] - want) <= mpf(10) ** -48
    assert check_gradient_fd("surrogate.gspo_document", inputs) == sum(map(sum, mask))


def test_gspo_document_on_policy_is_the_document_mean_of_pg():
    """On-policy (old = current) every R_s = 1, so L_s = -A_s is the document mean of surrogate.pg's token
    loss -A_{i,t} r_{i,t} (r = 1), weighted_loss_s their document sum, and the gradient at each token of s
    is -A_s, the document mean of pg's gradient (spec/surrogate.md, surrogate.gspo_document edge cases)."""
    rng = random.Random(909)
    for _ in range(10):
        B, T = 3, 6
        mask = random_mask(rng, B, T)
        lp = random_logprobs(rng, B, T, lo=-3.0)
        adv = [[rng.choice([-1.5, -0.5, 0.25, 2.0]) for _ in range(T)] for _ in range(B)]
        docs = [[rng.randint(0, 3) for _ in range(T)] for _ in range(B)]
        base = {"logprobs": lp, "old_logprobs": lp, "mask": mask, "advantages": adv}
        doc = evaluate("surrogate.gspo_document", {**base, "document_ids": docs})
        pg = evaluate("surrogate.pg", base)
        with mp.workdps(60):
            for k, s in enumerate(doc["segment_ids"]):
                tokens = [(i, t) for i in range(B) for t in range(T) if mask[i][t] and docs[i][t] == s]
                pg_sum = sum(pg["loss"][i][t] for i, t in tokens)
                pg_grad = sum(pg["grad"]["logprobs"][i][t] for i, t in tokens) / len(tokens)
                assert doc["ratio"][k] == 1
                assert abs(doc["weighted_loss"][k] - pg_sum) <= mpf(10) ** -50
                assert abs(doc["loss"][k] - pg_sum / len(tokens)) <= mpf(10) ** -50
                for i, t in tokens:
                    assert abs(doc["grad"]["logprobs"][i][t] - pg_grad) <= mpf(10) ** -50
        # off-policy the identity fails (so the check above can fail)
        old = random_logprobs(rng, B, T, lo=-3.0)
        off = evaluate("surrogate.gspo_document", {**base, "old_logprobs": old, "document_ids": docs})
        off_pg = evaluate("surrogate.pg", {**base, "old_logprobs": old})
        with mp.workdps(60):
            assert any(abs(off["weighted_loss"][k] - sum(off_pg["loss"][i][t] for i in range(B) for t in range(T)
                                                         if mask[i][t] and docs[i][t] == s)) > mpf(10) ** -6
                       for k, s in enumerate(off["segment_ids"]))
