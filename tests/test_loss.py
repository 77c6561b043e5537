"""Tests of the loss family (composite recipes): gradients, precision, identities, the recipes against
the hand composition of the other families' primitives, an independent float64 implementation,
errors and masking."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from mpmath import mp, mpf

from helpers import bf16_round, check_gradient_fd, check_precision, random_logprobs, random_mask
from pgspec.reference import SpecError, evaluate

LP = [[-1.0, -2.5, -0.375, -4.0], [-0.5, -3.0, -1.25, -2.0], [-0.75, -1.5, -2.25, -0.25]]
OLD = [[-1.25, -2.0, -0.5, -3.5], [-0.5, -2.75, -1.0, -2.5], [-0.875, -1.5, -2.0, -0.5]]
MASK = [[True, True, True, False], [True, True, False, False], [True, True, True, True]]
A_SEQ = [0.75, -1.25, 0.5]
A_TOK = [[0.75, -0.5, 1.5, 9.0], [-1.25, 2.0, 7.0, 7.0], [0.5, 0.25, -1.0, 0.75]]
REF = [[-1.125, -2.25, -0.5, 0.0], [-0.75, -2.5, -1.0, 0.0], [-0.5, -1.75, -2.0, -0.375]]
SAMPLER = [[-1.0, -2.125, -0.5, 0.0], [-0.625, -2.5, -1.125, 0.0], [-1.0, -1.5, -2.0, -0.25]]
ENTROPY = [[0.5, 1.25, 2.0, 0.0], [0.25, 3.0, 1.0, 0.0], [1.5, 0.75, 2.5, 0.125]]
GROUPS = [0, 0, 1]
BASE = {"logprobs": LP, "old_logprobs": OLD, "mask": MASK, "advantages": A_SEQ}
U = 2.0 ** -53

ALL_IDS = ["loss.grpo", "loss.dapo", "loss.dr_grpo", "loss.bnpo", "loss.gspo", "loss.cispo", "loss.sapo",
           "loss.gmpo", "loss.luspo", "loss.vespo", "loss.minirl"]


def inputs_for(fid, base=BASE, **extra):
    """The inputs each recipe needs with its default parameters."""
    out = dict(base)
    if fid == "loss.grpo":
        out["ref_logprobs"] = REF
    if fid in ("loss.dapo", "loss.cispo"):
        out["group_ids"] = GROUPS
    if fid == "loss.minirl":
        out["sampler_logprobs"] = SAMPLER
    out.update(extra)
    return out


@pytest.fixture(autouse=True)
def _sixty_digits():
    """The tests' own mpf arithmetic (hand compositions, closed forms) at the reference's precision."""
    with mp.workdps(60):
        yield


def fl(x):
    return [[float(v) for v in row] for row in x]


# Gradients: finite differences where no stop-gradient applies ---------------------------------
FD_CASES = [
    ("loss.grpo", inputs_for("loss.grpo"), None),
    ("loss.grpo", inputs_for("loss.grpo", advantages=A_TOK), {"kl_estimator": "k3_unbiased", "eps_high": 0.28}),
    ("loss.grpo", inputs_for("loss.grpo", sampler_logprobs=SAMPLER, entropy=ENTROPY),
     {"is_level": "token", "opsm_delta": 0.0625, "entropy_quantile": 0.75, "kl_estimator": "k2"}),
    ("loss.dapo", inputs_for("loss.dapo"), None),
    ("loss.dapo", {**BASE}, {"aggregation": "token_mean"}),
    ("loss.dr_grpo", BASE, {"divisor": 8.0}),
    ("loss.bnpo", {**BASE, "ref_logprobs": REF}, {"beta": 0.5, "kl_estimator": "k1"}),
    ("loss.gspo", BASE, None),
    ("loss.gspo", {**BASE, "ref_logprobs": REF, "sampler_logprobs": SAMPLER},
     {"eps_low": 0.2, "eps_high": 0.2, "beta": 0.25, "is_level": "geometric"}),
    ("loss.sapo", BASE, None),
    ("loss.gmpo", BASE, None),
    ("loss.luspo", BASE, None),
    ("loss.luspo", BASE, {"ratio_level": "token", "eps_low": 0.2, "eps_high": 0.2}),
]


@pytest.mark.parametrize("fid,inputs,params", FD_CASES)
def test_gradient_matches_finite_difference(fid, inputs, params):
    assert check_gradient_fd(fid, inputs, params) == 9


def _agg_weights(mask, kind, groups=None, K=None):
    """d loss / d term_{i,t} of each aggregator, in float64 (independent of the reference)."""
    m = np.array(mask, dtype=float)
    L = m.sum(1)
    if kind == "sample_mean":
        n = (L > 0).sum()
        return m / np.maximum(L, 1)[:, None] / n
    if kind == "token_mean":
        return m / m.sum()
    if kind == "seq_mean_token_sum":
        return m / (L > 0).sum()
    if kind == "constant":
        return m / (K * len(mask))
    if kind == "prompt_mean":
        g = np.array(groups)
        D = {k: L[g == k].sum() for k in set(groups)}
        n = sum(1 for v in D.values() if v > 0)
        return m / np.array([D[k] for k in groups])[:, None] / n
    raise AssertionError(kind)


@pytest.mark.parametrize("fid,params", [
    ("loss.cispo", None), ("loss.cispo", {"cap_form": "absolute", "eps_high": 5.0, "aggregation": "token_mean"}),
    ("loss.minirl", None), ("loss.vespo", None),
])
def test_stop_gradient_recipes_have_the_closed_form_gradient(fid, params):
    """CISPO: -sg[w] A l;  MiniRL: -M sg[min(pi/mu, 5)] A l;  VESPO: -sg[phi] A l: gradient = -c w A."""
    inp = inputs_for(fid, **({"group_ids": None} if params and params.get("aggregation") == "token_mean" else {}))
    inp = {k: v for k, v in inp.items() if v is not None}
    res = evaluate(fid, inp, params)
    lp, old, a = np.array(LP), np.array(OLD), np.array(A_SEQ)[:, None]
    r = np.exp(lp - old)
    if fid == "loss.cispo":
        p = params or {}
        w = np.minimum(r, 5.0) if p.get("cap_form") == "absolute" else np.minimum(r, 1.2)
        c = _agg_weights(MASK, p.get("aggregation", "prompt_mean"), GROUPS)
    elif fid == "loss.minirl":
        keep = ~(((a > 0) & (r > 1.27)) | ((a < 0) & (r < 0.8)))
        w = np.minimum(np.exp(lp - np.array(SAMPLER)), 5.0) * keep
        c = _agg_weights(MASK, "seq_mean_token_sum")
    else:
        m = np.array(MASK)
        logw = np.clip(((lp - old) * m).sum(1), math.log(1e-8), 20.0)
        k = np.where(np.array(A_SEQ) >= 0, 2.0, 3.0)
        lam = np.where(np.array(A_SEQ) >= 0, 3.0, 2.0)
        w = np.exp(lam + k * logw - lam * np.exp(logw))[:, None] * np.ones_like(lp)
        c = _agg_weights(MASK, "token_mean")
    expected = -c * w * a
    got = np.array(fl(res["grad"]["logprobs"]))
    assert np.allclose(got, expected, rtol=32 * U, atol=0), (got, expected)


# Precision: 60 vs 100 digits, ordinary and extreme inputs ---------------------------------------
EXTREME = {
    "logprobs": [[-0.5, -200.5, -1.0, -20.25], [-3.0, -0.0078125, -1.0, -2.0]],
    "old_logprobs": [[-200.5, -0.5, -1.0 + 2.0 ** -20, -0.25], [-3.0 + 2.0 ** -20, -20.0078125, -1.0, -2.0]],
    "mask": [[True, True, True, True], [True, True, False, False]],
    "advantages": [1.5, -0.75],
}
EXTREME_REF = [[-0.5 + 2.0 ** -20, -0.5, -200.0, -0.25], [-23.0, -0.0078125, 0.0, 0.0]]
EXTREME_SAMPLER = [[-180.5, -0.5, -1.0, -0.25 - 2.0 ** -20], [-3.0, -0.0078125, 0.0, 0.0]]


def _extreme_inputs(fid):
    out = dict(EXTREME)
    if fid == "loss.grpo":
        out["ref_logprobs"] = EXTREME_REF
    if fid in ("loss.dapo", "loss.cispo"):
        out["group_ids"] = [3, 7]
    if fid == "loss.minirl":
        out["sampler_logprobs"] = EXTREME_SAMPLER
    return out


@pytest.mark.parametrize("fid", ALL_IDS)
def test_precision_ordinary_and_extreme(fid):
    check_precision(fid, inputs_for(fid))
    check_precision(fid, _extreme_inputs(fid))


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3", "abs", "k3_straight_through", "k3_unbiased"])
def test_precision_every_kl_estimator_with_every_option(estimator):
    inp = {**_extreme_inputs("loss.grpo"), "sampler_logprobs": EXTREME_SAMPLER, "entropy": [[1.0, 2.0, 0.5, 3.0], [0.0, 1.0, 0.0, 0.0]]}
    params = {"kl_estimator": estimator, "is_level": "sequence", "is_log_ratio_clamp": 20.0, "opsm_delta": 0.5,
              "entropy_quantile": 0.5, "kl_log_ratio_min": -20.0, "kl_log_ratio_max": 20.0}
    check_precision("loss.grpo", inp, params)


# Identities ---------------------------------------------------------------------------------------
def test_gspo_on_policy_equals_grpo_sample_mean_pg():
    """Ratio 1: GSPO's loss is -mean_i A_i and its gradient -(1/N)(1/L_i) A_i, as GRPO's PG term."""
    inp = {**BASE, "old_logprobs": LP}
    g = evaluate("loss.gspo", inp)
    r = evaluate("loss.grpo", inp, {"beta": 0})
    expected = -(mpf(0.75) - mpf(1.25) + mpf(0.5)) / 3
    assert abs(g["loss"] - expected) < mpf(10) ** -55 and abs(r["loss"] - expected) < mpf(10) ** -55
    L = [3, 2, 4]
    for i, row in enumerate(MASK):
        for t, m in enumerate(row):
            want = -mpf(A_SEQ[i]) / (3 * L[i]) if m else 0
            assert abs(g["grad"]["logprobs"][i][t] - want) < mpf(10) ** -55
            assert abs(r["grad"]["logprobs"][i][t] - want) < mpf(10) ** -55


def test_dapo_prompt_mean_and_token_mean():
    pm = evaluate("loss.dapo", inputs_for("loss.dapo"))
    tm = evaluate("loss.dapo", BASE, {"aggregation": "token_mean"})
    assert abs(pm["loss"] - tm["loss"]) > mpf("1e-3")  # groups of 5 and 4 tokens: they differ
    one = evaluate("loss.dapo", {**BASE, "group_ids": [4, 4, 4]})
    assert abs(one["loss"] - tm["loss"]) < mpf(10) ** -55
    for a, b in zip(one["grad"]["logprobs"], tm["grad"]["logprobs"]):
        assert all(abs(x - y) < mpf(10) ** -55 for x, y in zip(a, b))


def test_dr_grpo_constant_is_padding_invariant():
    pad = lambda x, v: [row + [v, v] for row in x]  # noqa: E731
    padded = {"logprobs": pad(LP, -9.0), "old_logprobs": pad(OLD, -1.0), "mask": pad(MASK, False), "advantages": A_SEQ}
    a = evaluate("loss.dr_grpo", BASE)
    b = evaluate("loss.dr_grpo", padded)
    assert a["loss"] == b["loss"]
    assert [row + [0, 0] for row in a["grad"]["logprobs"]] == b["grad"]["logprobs"]


def _compose(inp, pg_token, w, keep_seq, keep_tok, kl, beta, weights):
    """sum c (keep sg[w] pg + beta kl) and its gradient, from the primitives' own outputs."""
    loss, grad = mpf(0), []
    for i, row in enumerate(inp["mask"]):
        g_row = []
        for t, m in enumerate(row):
            if not m:
                g_row.append(mpf(0))
                continue
            f = (w[i][t] if w else 1) * (1 if keep_seq is None else keep_seq[i]) * (1 if keep_tok is None else keep_tok[i][t])
            loss += weights[i][t] * (f * pg_token["loss"][i][t] + (beta * kl["kl"][i][t] if kl else 0))
            g_row.append(weights[i][t] * (f * pg_token["grad"]["logprobs"][i][t] + (beta * kl["grad"]["logprobs"][i][t] if kl else 0)))
        grad.append(g_row)
    return loss, grad


def _weights(agg_id, mask, params=None, **extra):
    ones = [[1.0 if m else 0.0 for m in row] for row in mask]
    return evaluate(agg_id, {"values": ones, "mask": mask, **extra}, params)["grad"]["values"]


def _close(a, b, digits=50):
    return abs(a - b) <= mpf(10) ** -digits * max(1, abs(a), abs(b))


def test_grpo_equals_the_hand_composition_of_primitives():
    adv = [[0.75, -0.5, 1.5, 9.0], [-1.25, 0.5, 7.0, 7.0], [0.5, 0.25, -1.0, 0.75]]  # row 1: mean A < 0
    inp = inputs_for("loss.grpo", advantages=adv, sampler_logprobs=SAMPLER, entropy=ENTROPY)
    params = {"is_level": "token", "is_c_min": 0.5, "is_c_max": 1.125, "opsm_delta": 0.0625, "entropy_quantile": 0.75}
    got = evaluate("loss.grpo", inp, params)
    core = {"logprobs": LP, "old_logprobs": OLD, "mask": MASK}
    pg = evaluate("surrogate.ppo_clip", {**core, "advantages": adv})
    w = evaluate("is.token.truncate", {"old_logprobs": OLD, "sampler_logprobs": SAMPLER, "mask": MASK},
                 {"c_min": 0.5, "c_max": 1.125})["weight"]
    opsm = evaluate("mask.opsm", {"logprobs": LP, "sampler_logprobs": SAMPLER, "advantages": adv, "mask": MASK},
                    {"delta": 0.0625})["seq_keep"]
    ent = evaluate("mask.entropy_quantile", {"entropy": ENTROPY, "mask": MASK}, {"top_entropy_quantile": 0.75})["keep"]
    kl = evaluate("kl.k3", {"logprobs": LP, "ref_logprobs": REF, "mask": MASK})
    assert opsm == [True, False, True] and any(k is False for row in ent for k in row)  # both masks act here
    loss, grad = _compose(inp, pg, w, opsm, ent, kl, mpf(0.04), _weights("agg.sample_mean", MASK))
    assert _close(got["loss"], loss)
    assert all(_close(x, y) for a, b in zip(got["grad"]["logprobs"], grad) for x, y in zip(a, b))


def test_dapo_and_cispo_equal_the_hand_composition_of_primitives():
    core = {"logprobs": LP, "old_logprobs": OLD, "mask": MASK, "advantages": A_SEQ}
    weights = _weights("agg.prompt_mean", MASK, group_ids=GROUPS)
    got = evaluate("loss.dapo", {**core, "group_ids": GROUPS, "sampler_logprobs": SAMPLER},
                   {"is_level": "sequence", "is_mode": "mask", "is_c_min": 0.5, "is_c_max": 1.5})
    pg = evaluate("surrogate.ppo_clip", core, {"eps_high": 0.28})
    w = evaluate("is.sequence.mask", {"old_logprobs": OLD, "sampler_logprobs": SAMPLER, "mask": MASK},
                 {"c_min": 0.5, "c_max": 1.5})["weight"]
    loss, grad = _compose(core, pg, w, None, None, None, 0, weights)
    assert _close(got["loss"], loss) and all(_close(x, y) for a, b in zip(got["grad"]["logprobs"], grad) for x, y in zip(a, b))

    got = evaluate("loss.cispo", {**core, "group_ids": GROUPS, "ref_logprobs": REF},
                   {"cap_form": "absolute", "eps_high": 1.125, "beta": 0.5, "kl_estimator": "k3_unbiased"})
    pg = evaluate("surrogate.cispo", core, {"cap_form": "absolute", "eps_high": 1.125})
    kl = evaluate("kl.k3_unbiased", {"logprobs": LP, "old_logprobs": OLD, "ref_logprobs": REF, "mask": MASK})
    loss, grad = _compose(core, pg, None, None, None, kl, mpf("0.5"), weights)
    assert _close(got["loss"], loss) and all(_close(x, y) for a, b in zip(got["grad"]["logprobs"], grad) for x, y in zip(a, b))


def test_gspo_equals_the_hand_composition_of_primitives():
    """loss.gspo = (1/N) sum_i (1/L_i) sum_t (w_t l^GSPO_i + beta k3_t); d/dl_t through l^GSPO_i and k3_t."""
    core = {"logprobs": LP, "old_logprobs": OLD, "mask": MASK, "advantages": A_SEQ}
    params = {"eps_low": 0.2, "eps_high": 0.2}
    got = evaluate("loss.gspo", {**core, "sampler_logprobs": SAMPLER, "ref_logprobs": REF},
                   {**params, "is_level": "token", "beta": 0.25, "kl_estimator": "k3_straight_through"})
    seq = evaluate("surrogate.gspo", core, params)
    # d l^GSPO_i / d l_t for each t of sequence i: the gradient of the per-sequence loss itself
    w = evaluate("is.token.truncate", {"old_logprobs": OLD, "sampler_logprobs": SAMPLER, "mask": MASK})["weight"]
    kl = evaluate("kl.k3_straight_through", {"logprobs": LP, "ref_logprobs": REF, "mask": MASK})
    c = _weights("agg.sample_mean", MASK)
    loss = mpf(0)
    grad = [[mpf(0)] * 4 for _ in MASK]
    for i, row in enumerate(MASK):
        ts = [t for t, m in enumerate(row) if m]
        s = sum(c[i][t] * w[i][t] for t in ts)  # the weight of l^GSPO_i in the aggregate
        loss += s * seq["loss"][i] + sum(c[i][t] * mpf("0.25") * kl["kl"][i][t] for t in ts)
        for t in ts:
            grad[i][t] = s * seq["grad"]["logprobs"][i][t] + c[i][t] * mpf("0.25") * kl["grad"]["logprobs"][i][t]
    assert _close(got["loss"], loss)
    assert all(_close(x, y) for a, b in zip(got["grad"]["logprobs"], grad) for x, y in zip(a, b))


def test_opsm_masks_whole_sequences_and_not_the_kl():
    """slime#1917: the gate is the sequence's advantage (mean of per-token ones), every token of it is dropped;
    DeepSeek-V3.2 Eq. 8: the KL term stays."""
    adv = [[0.75, -0.5, 1.5, 0.0], [-1.25, 2.0, 0.0, 0.0], [0.5, 0.25, -1.0, 0.75]]  # row 1 mean -> 0.375 > 0
    adv[1] = [-2.0, 1.0, 0.0, 0.0]  # row 1: mean -0.5 < 0 although its second token has A > 0
    inp = inputs_for("loss.grpo", advantages=adv, sampler_logprobs=SAMPLER)
    on = evaluate("loss.grpo", inp, {"opsm_delta": 0.0625})
    kl = evaluate("kl.k3", {"logprobs": LP, "ref_logprobs": REF, "mask": MASK})
    for t in (0, 1):  # every token of sequence 1: the term is the KL alone
        assert on["terms"][1][t] == mpf(0.04) * kl["kl"][1][t]
        assert on["grad"]["logprobs"][1][t] == mpf(0.04) * kl["grad"]["logprobs"][1][t] / (2 * 3)
        assert on["grad"]["logprobs"][1][t] != 0
    off = evaluate("loss.grpo", inp, {"opsm_delta": 10.0})
    assert on["terms"][0] == off["terms"][0] and on["terms"][2] == off["terms"][2]
    assert off["terms"][1] != on["terms"][1]


def test_masked_tokens_stay_in_the_denominator():
    """IS mask, OPSM and entropy mask zero the policy term; the aggregator still counts the token."""
    inp = {**BASE, "sampler_logprobs": SAMPLER}
    params = {"aggregation": "token_mean", "is_level": "token", "is_mode": "mask", "is_c_min": 0.9, "is_c_max": 1.1}
    res = evaluate("loss.dapo", inp, params)
    dropped = [(i, t) for i, row in enumerate(MASK) for t, m in enumerate(row)
               if m and not (0.9 <= math.exp(OLD[i][t] - SAMPLER[i][t]) <= 1.1)]
    assert dropped and all(res["terms"][i][t] == 0 and res["grad"]["logprobs"][i][t] == 0 for i, t in dropped)
    total = sum(v for row in res["terms"] for v in row if v is not None)
    assert _close(res["loss"], total / 9)  # 9 unmasked tokens, dropped ones included
    ent = evaluate("loss.bnpo", {**BASE, "entropy": ENTROPY}, {"entropy_quantile": 0.25})
    assert _close(ent["loss"], sum(v for row in ent["terms"] for v in row if v is not None) / 9)
    assert sum(1 for row in ent["terms"] for v in row if v == 0) >= 6


def test_luspo_is_gspo_weighted_by_length():
    g = evaluate("surrogate.gspo", BASE)["loss"]
    res = evaluate("loss.luspo", BASE)
    assert _close(res["loss"], (3 * g[0] + 2 * g[1] + 4 * g[2]) / 3)


def test_worked_example_values_are_independent_of_terms_output():
    res = evaluate("loss.gspo", BASE)
    assert all(v is None for v in (res["terms"][0][3], res["terms"][1][2], res["terms"][1][3]))


# Independent float64 implementation -------------------------------------------------------------
def np_ppo(lp, old, a, el, eh):
    r = np.exp(lp - old)
    unc, clp = -a * r, -a * np.clip(r, 1 - el, 1 + eh)
    loss = np.maximum(unc, clp)
    active = ((r >= 1 - el) & (r <= 1 + eh)) | (unc > clp)
    return loss, np.where(active, -a * r, 0.0)


def np_gspo(lp, old, m, a, el, eh):
    L = m.sum(1)
    s = np.exp(((lp - old) * m).sum(1) / L)
    unc, clp = -a * s, -a * np.clip(s, 1 - el, 1 + eh)
    loss = np.maximum(unc, clp)
    active = ((s >= 1 - el) & (s <= 1 + eh)) | (unc > clp)
    dl = np.where(active, -a * s / L, 0.0)[:, None] * m
    return loss[:, None] * m, dl  # the per-token term (broadcast) and d loss_i / d l_t


def np_recipe(fid, lp, old, m, a, groups, ref=None):
    """(loss, grad) in float64 with each recipe's default parameters."""
    A = a[:, None] * np.ones_like(lp)
    if fid in ("loss.grpo", "loss.dapo", "loss.dapo.token", "loss.dr_grpo", "loss.bnpo"):
        term, dterm = np_ppo(lp, old, A, 0.2, 0.28 if fid.startswith("loss.dapo") else 0.2)
        if fid == "loss.grpo":
            x = ref - lp
            term = term + 0.04 * (np.expm1(x) - x)
            dterm = dterm - 0.04 * np.expm1(x)
        kind = {"loss.grpo": "sample_mean", "loss.dapo": "prompt_mean", "loss.dapo.token": "token_mean",
                "loss.dr_grpo": "constant", "loss.bnpo": "token_mean"}[fid]
        c = _agg_weights(m, kind, groups, K=3000.0)
        return (c * term * m).sum(), c * dterm * m
    if fid in ("loss.gspo", "loss.luspo"):
        el, eh = 3e-4, 4e-4
        term, dseq = np_gspo(lp, old, m, a, el, eh)
        c = _agg_weights(m, "sample_mean" if fid == "loss.gspo" else "seq_mean_token_sum")
        weight = (c * m).sum(1)  # the aggregate weight of each sequence's loss
        return (c * term).sum(), weight[:, None] * dseq
    if fid == "loss.cispo":
        r = np.exp(lp - old)
        w = np.minimum(r, 1.2)
        c = _agg_weights(m, "prompt_mean", groups)
        return (c * -w * A * lp * m).sum(), c * -w * A * m
    if fid == "loss.sapo":
        r = np.exp(lp - old)
        tau = np.where(A > 0, 1.0, 1.05)
        sig = 1 / (1 + np.exp(-tau * (r - 1)))
        c = _agg_weights(m, "sample_mean")
        return (c * -A * 4 / tau * sig * m).sum(), c * -A * 4 * sig * (1 - sig) * r * m
    if fid == "loss.gmpo":
        d = lp - old
        cl = np.clip(d, -0.4, 0.4)
        dd = np.where(A > 0, np.minimum(d, cl), np.maximum(d, cl))
        ddd = np.where(A > 0, np.where(d <= 0.4, 1.0, 0.0), np.where(d >= -0.4, 1.0, 0.0))
        L = m.sum(1)
        g = np.exp((dd * m).sum(1) / L)
        c = _agg_weights(m, "sample_mean")
        weight = (c * m).sum(1)
        return (weight * -a * g).sum(), (weight * -a * g / L)[:, None] * ddd * m
    raise AssertionError(fid)


NP_IDS = ["loss.grpo", "loss.dapo", "loss.dapo.token", "loss.dr_grpo", "loss.bnpo", "loss.gspo", "loss.luspo",
          "loss.cispo", "loss.sapo", "loss.gmpo"]


@pytest.mark.parametrize("fid", NP_IDS)
def test_independent_float64_implementation(fid):
    """Each value is a sum of at most 24 terms of at most ~8 correctly rounded operations (numpy's exp
    and expm1 err by < 1 ulp), so |error| <= (8 + 24) u sum|c term|: 64 u of that scale is safe.  Each
    gradient element is a product of at most ~6 rounded factors plus, for GSPO/GMPO, a mean of <= 6
    log-ratios inside exp: 64 u |g| + 64 u max|g| covers it."""
    rng = random.Random(hash(fid) % 1000)
    for _ in range(3):
        B, T = 4, 6
        lp = random_logprobs(rng, B, T)
        old = [[bf16_round(x + rng.gauss(0, 0.15)) for x in row] for row in lp]
        ref = [[bf16_round(x + rng.gauss(0, 0.3)) for x in row] for row in lp]
        mask = random_mask(rng, B, T)
        adv = [bf16_round(rng.uniform(-2, 2)) for _ in range(B)]
        groups = [0, 0, 1, 1]
        real = fid.replace(".token", "")
        inp = {"logprobs": lp, "old_logprobs": old, "mask": mask, "advantages": adv}
        params = None
        if real in ("loss.dapo", "loss.cispo") and fid != "loss.dapo.token":
            inp["group_ids"] = groups
        if fid == "loss.dapo.token":
            params = {"aggregation": "token_mean"}
        if real == "loss.grpo":
            inp["ref_logprobs"] = ref
        res = evaluate(real, inp, params)
        m = np.array(mask, dtype=float)
        loss, grad = np_recipe(fid, np.array(lp), np.array(old), m, np.array(adv), groups, np.array(ref))
        scale = float(sum(abs(float(v)) for row in res["terms"] for v in row if v is not None)) + abs(loss)
        assert abs(float(res["loss"]) - loss) <= 64 * U * scale, (fid, float(res["loss"]), loss)
        got = np.array(fl(res["grad"]["logprobs"]))
        assert np.all(np.abs(got - grad) <= 64 * U * (np.abs(grad) + np.abs(grad).max())), (fid, got, grad)


# Errors -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fid,inputs,params,needle", [
    ("loss.grpo", BASE, None, "ref_logprobs"),
    ("loss.dapo", BASE, None, "group_ids"),
    ("loss.cispo", BASE, None, "group_ids"),
    ("loss.gspo", BASE, {"is_level": "token"}, "sampler_logprobs"),
    ("loss.dapo", {**BASE, "group_ids": GROUPS}, {"opsm_delta": 0.5}, "sampler_logprobs"),
    ("loss.bnpo", BASE, {"entropy_quantile": 0.2}, "entropy"),
    ("loss.minirl", BASE, None, "sampler_logprobs"),
    ("loss.bnpo", {**BASE, "sampler_logprobs": SAMPLER}, None, "sampler_logprobs"),
    ("loss.bnpo", {**BASE, "ref_logprobs": REF}, None, "ref_logprobs"),
    ("loss.bnpo", {**BASE, "group_ids": GROUPS}, None, "group_ids"),
    ("loss.bnpo", {**BASE, "entropy": ENTROPY}, None, "entropy"),
    ("loss.dapo", {**BASE, "group_ids": GROUPS}, {"eps_low": 1.5}, "eps_low"),
    ("loss.bnpo", {**BASE, "sampler_logprobs": SAMPLER}, {"is_level": "token", "is_c_min": 3.0}, "is_c_min"),
    ("loss.bnpo", {**BASE, "sampler_logprobs": SAMPLER}, {"is_level": "token", "is_mode": "mask", "is_c_min": None,
                                                          "is_c_max": None}, "is_c_max"),
    ("loss.bnpo", {**BASE, "ref_logprobs": REF}, {"beta": 0.1, "kl_aggregation": "prompt_mean"}, "kl_aggregation"),
    ("loss.bnpo", {**BASE, "ref_logprobs": REF}, {"beta": 0.1, "kl_output_min": 1.0, "kl_output_max": 0.5}, "kl_output_min"),
    ("loss.bnpo", BASE, {"kl_estimator": "k4"}, "kl_estimator"),
    ("loss.vespo", {**BASE, "sampler_logprobs": SAMPLER}, {"is_level": "token"}, "is_level"),
    ("loss.gspo", {**BASE, "advantages": A_TOK}, None, "advantages"),
    ("loss.dr_grpo", BASE, {"divisor": 0}, "divisor"),
    ("loss.cispo", {**BASE, "group_ids": GROUPS}, {"cap_form": "absolute", "eps_low": 0.2}, "eps_low"),
    ("loss.bnpo", {**BASE, "entropy": [[-1.0] * 4] * 3}, {"entropy_quantile": 0.5}, "entropy"),
    ("loss.bnpo", {**BASE, "logprobs": [[-1.0, math.nan, -1.0, -1.0]] + LP[1:]}, None, "logprobs"),
])
def test_bad_input_raises_spec_error_naming_it(fid, inputs, params, needle):
    with pytest.raises(SpecError) as e:
        evaluate(fid, inputs, params)
    assert needle in str(e.value)


# Masked positions ---------------------------------------------------------------------------------
@pytest.mark.parametrize("fid", ALL_IDS)
def test_nan_and_inf_at_masked_positions_change_nothing(fid):
    inp = inputs_for(fid, sampler_logprobs=SAMPLER, ref_logprobs=REF, entropy=ENTROPY)
    params = {"entropy_quantile": 0.75, "beta": 0.04, "opsm_delta": 0.0625}
    if fid != "loss.vespo":
        params.update(is_level="token", is_c_min=0.5)

    def poison(x, v):
        return [[v if not MASK[i][t] else x[i][t] for t in range(4)] for i in range(3)]

    bad = dict(inp)
    for name, v in (("logprobs", math.nan), ("old_logprobs", math.inf), ("sampler_logprobs", -math.inf),
                    ("ref_logprobs", -math.inf), ("entropy", math.nan)):
        bad[name] = poison(inp[name], v)
    a, b = evaluate(fid, inp, params), evaluate(fid, bad, params)
    assert a["loss"] == b["loss"] and a["grad"] == b["grad"] and a["terms"] == b["terms"]
    assert all(b["grad"]["logprobs"][i][t] == 0 for i in range(3) for t in range(4) if not MASK[i][t])


def test_all_masked_batch_is_zero():
    inp = {**BASE, "mask": [[False] * 4] * 3}
    for fid in ALL_IDS:
        res = evaluate(fid, inputs_for(fid, inp))
        assert res["loss"] == 0 and all(g == 0 for row in res["grad"]["logprobs"] for g in row), fid


# The KL term's own aggregation (slime: --loss-aggregation changes only pg_loss) -------------------

def _kl_inputs(fid):
    inputs = {**BASE, "advantages": A_TOK if fid in ("loss.grpo", "loss.dapo", "loss.dr_grpo") else A_SEQ,
              "ref_logprobs": REF}
    if fid == "loss.dapo":
        inputs["group_ids"] = GROUPS
    return inputs


@pytest.mark.parametrize("fid,kl_agg", [("loss.dr_grpo", "sample_mean"), ("loss.dapo", "sample_mean"),
                                        ("loss.grpo", "token_mean"), ("loss.gspo", "token_mean")])
def test_separate_kl_aggregation_is_policy_part_plus_beta_times_the_kl_aggregate(fid, kl_agg):
    """Identity: loss(kl_aggregation=A) = loss(beta=0) + beta * agg.A(kl_{i,t}), gradients likewise."""
    inputs = _kl_inputs(fid)
    extra = {"divisor": 8} if fid == "loss.dr_grpo" else {}
    beta = "0.5"
    full = evaluate(fid, inputs, {**extra, "beta": beta, "kl_aggregation": kl_agg})
    pol = evaluate(fid, {k: v for k, v in inputs.items() if k != "ref_logprobs"}, {**extra, "beta": 0})
    kl = evaluate("kl.k3", {"logprobs": LP, "ref_logprobs": REF, "mask": MASK})
    agg = evaluate(f"agg.{kl_agg}", {"values": kl["kl"], "mask": MASK})
    with mp.workdps(60):
        assert abs(full["loss"] - (pol["loss"] + mpf(beta) * agg["value"])) <= mpf(10) ** -50
        for i, row in enumerate(MASK):
            for t, m in enumerate(row):
                if not m:
                    continue
                want = pol["grad"]["logprobs"][i][t] + mpf(beta) * agg["grad"]["values"][i][t] * kl["grad"]["logprobs"][i][t]
                assert abs(full["grad"]["logprobs"][i][t] - want) <= mpf(10) ** -50


@pytest.mark.parametrize("kl_agg", ["sample_mean", "token_mean"])
@pytest.mark.parametrize("fid", ["loss.dr_grpo", "loss.dapo", "loss.grpo"])
def test_kl_aggregator_takes_its_defaults_and_no_recipe_mask(fid, kl_agg):
    """spec/loss.md (loss-kl-aggregation): Agg_KL is agg.<kl_aggregation> with every parameter at its
    default, over the loss mask; the recipe's divisor, OPSM and counts never reach it. An empty row
    (counted only with count_empty_sequences, which is false by default) and a row that OPSM drops
    (advantage < 0, mean log-ratio beyond delta) make the difference visible."""
    empty = [[-1.0] * 4]
    mask = MASK + [[False] * 4]
    inputs = {"logprobs": LP + empty, "old_logprobs": OLD + empty, "sampler_logprobs": SAMPLER + empty,
              "mask": mask, "advantages": A_SEQ + [1.0]}
    if fid == "loss.dapo":
        inputs["group_ids"] = GROUPS + [1]
    params = {"beta": "0.25", "kl_aggregation": kl_agg, "opsm_delta": 0.01,
              **({"divisor": 7} if fid == "loss.dr_grpo" else {})}
    full = evaluate(fid, {**inputs, "ref_logprobs": REF + empty}, params)["loss"]
    pol = evaluate(fid, inputs, {**params, "beta": 0})["loss"]
    no_opsm = {k: v for k, v in inputs.items() if k != "sampler_logprobs"}
    assert pol != evaluate(fid, no_opsm, {**params, "beta": 0, "opsm_delta": None})["loss"]  # OPSM drops a row
    kl = evaluate("kl.k3", {"logprobs": LP + empty, "ref_logprobs": REF + empty, "mask": mask})["kl"]
    kl = [[0.0 if v is None else v for v in row] for row in kl]
    with mp.workdps(60):
        def gap(agg_params):
            agg = evaluate(f"agg.{kl_agg}", {"values": kl, "mask": mask}, agg_params)["value"]
            return abs(full - (pol + mpf("0.25") * agg))
        assert gap({}) <= mpf(10) ** -50
        # any other aggregator parameter gives another loss (so the identity above can fail)
        other = {"count_empty_sequences": True} if kl_agg == "sample_mean" else {"num_tokens": 20}
        assert gap(other) > mpf(10) ** -6


def test_kl_aggregation_policy_is_the_default_and_sample_mean_on_a_sample_mean_recipe_agrees():
    inputs = _kl_inputs("loss.grpo")
    default = evaluate("loss.grpo", inputs, {"beta": "0.25"})
    assert evaluate("loss.grpo", inputs, {"beta": "0.25", "kl_aggregation": "policy"}) == default
    sample = evaluate("loss.grpo", inputs, {"beta": "0.25", "kl_aggregation": "sample_mean"})
    with mp.workdps(60):
        assert abs(sample["loss"] - default["loss"]) <= mpf(10) ** -55
    assert sample["terms"] == default["terms"]
    no_kl = {k: v for k, v in inputs.items() if k != "ref_logprobs"}
    assert (evaluate("loss.grpo", no_kl, {"beta": 0, "kl_aggregation": "token_mean"})
            == evaluate("loss.grpo", no_kl, {"beta": 0}))


# The untruncated IS weight (NeMo-RL PR #2269 is_correction_level) --------------------------------

@pytest.mark.parametrize("level,fid", [("token", "is.token.truncate"), ("sequence", "is.sequence.truncate"),
                                       ("geometric", "is.geometric.truncate")])
def test_untruncated_is_level_multiplies_gspo_by_the_raw_weight(level, fid):
    """loss.gspo with both IS bounds null = sample mean of rho_{i,t} l^GSPO_i; equal to the c_min = 0 form."""
    inputs = {**BASE, "sampler_logprobs": SAMPLER}
    got = evaluate("loss.gspo", inputs, {"is_level": level, "is_c_min": None, "is_c_max": None})
    assert got == evaluate("loss.gspo", inputs, {"is_level": level, "is_c_min": 0, "is_c_max": None})
    w = evaluate(fid, {"old_logprobs": OLD, "sampler_logprobs": SAMPLER, "mask": MASK},
                 {"c_min": None, "c_max": None})["weight"]
    plain = evaluate("loss.gspo", BASE)["terms"]
    with mp.workdps(60):
        for i, row in enumerate(MASK):
            for t, m in enumerate(row):
                if m:
                    assert abs(got["terms"][i][t] - w[i][t] * plain[i][t]) <= mpf(10) ** -50


def test_is_mask_mode_still_needs_a_bound():
    with pytest.raises(SpecError, match="'is_c_min' and 'is_c_max' must be set when is_level='token' and is_mode='mask'"):
        evaluate("loss.grpo", {**BASE, "sampler_logprobs": SAMPLER},
                 {"beta": 0, "is_level": "token", "is_mode": "mask", "is_c_min": None, "is_c_max": None})


# Liger-Kernel fork PR #4 in loss.gspo -----------------------------------------------------------

def test_gspo_recipe_per_token_clamp_equals_the_surrogate():
    """loss.gspo (log_ratio_clamp k, one sequence each) = sample mean of surrogate.gspo(k)."""
    for k in (0.125, 0.5, 20):
        rec = evaluate("loss.gspo", BASE, {"log_ratio_clamp": k, "eps_low": "0.2", "eps_high": "0.2"})
        sur = evaluate("surrogate.gspo", BASE, {"log_ratio_clamp": k, "eps_low": "0.2", "eps_high": "0.2"})
        with mp.workdps(60):
            assert abs(rec["loss"] - mp.fsum(sur["loss"]) / 3) <= mpf(10) ** -50
    d30 = {"logprobs": [[0.0, -1.0]], "old_logprobs": [[-30.0, -1.0]], "mask": [[True, True]], "advantages": [-1.0]}
    assert check_gradient_fd("loss.gspo", d30, {"log_ratio_clamp": 20}) == 2


# opsm_advantage_gate: mask.opsm's advantage_gate inside the recipes -------------------------------

def test_opsm_token_gate_in_a_recipe_drops_exactly_mask_opsm_tokens():
    inputs = {**BASE, "advantages": A_TOK, "sampler_logprobs": SAMPLER}
    params = {"aggregation": "token_mean", "opsm_delta": 0.0625, "opsm_advantage_gate": "token"}
    got = evaluate("loss.dapo", inputs, params)
    plain = evaluate("loss.dapo", {**BASE, "advantages": A_TOK}, {"aggregation": "token_mean"})
    keep = evaluate("mask.opsm", {"logprobs": LP, "sampler_logprobs": SAMPLER, "advantages": A_TOK, "mask": MASK},
                    {"delta": 0.0625, "advantage_gate": "token"})["keep"]
    assert any(k is False for row in keep for k in row) and any(k is True for row in keep for k in row)
    for i, row in enumerate(MASK):
        for t, m in enumerate(row):
            if m:
                assert got["terms"][i][t] == (plain["terms"][i][t] if keep[i][t] else 0)
    seq_inputs = {**BASE, "sampler_logprobs": SAMPLER}   # [B] advantages: both gates agree
    assert (evaluate("loss.gspo", seq_inputs, {"opsm_delta": 0.0625, "opsm_advantage_gate": "token"})
            == evaluate("loss.gspo", seq_inputs, {"opsm_delta": 0.0625}))


@pytest.mark.parametrize("fid", ["loss.grpo", "loss.bnpo", "loss.dapo"])
def test_kl_output_clamp_bounds_the_kl_part_of_the_loss(fid):
    """spec/loss.md (loss-kl-output-bound): with output bounds c < d and a mean aggregator,
    beta c <= loss(beta) - loss(0) <= beta d, on batches whose reference log-probs lie up to 200 away
    (so the clamps bind); the Liger-Kernel fork PR #4's kl_output_clamp_value = 10 is (c, d) = (-10, 10)."""
    rng = random.Random(409)
    beta = mpf("0.5")
    exceeded = 0
    for k in range(12):
        B, T = 4, 3
        mask = random_mask(rng, B, T)
        mask[0][0] = True
        lp, old = random_logprobs(rng, B, T, lo=-3.0), random_logprobs(rng, B, T, lo=-3.0)
        ref = [[v + rng.choice([-200.0, -5.0, 0.5, 3.0, 200.0]) for v in row] for row in lp]
        inputs = {"logprobs": lp, "old_logprobs": old, "mask": mask, "advantages": [rng.choice([-1.0, 1.0]) for _ in
                                                                                    range(B)]}
        if fid == "loss.dapo":
            inputs["group_ids"] = [0, 0, 1, 1]
        c, d = [(-10, 10), (mpf("0.05"), mpf("0.3")), (-1, 2)][k % 3]
        est = ["k1", "k2", "k3"][k % 3]
        kl = {"kl_estimator": est, "kl_log_ratio_min": -20, "kl_log_ratio_max": 20}
        base = evaluate(fid, inputs, {"beta": 0})["loss"]
        full = evaluate(fid, {**inputs, "ref_logprobs": ref},
                        {"beta": beta, **kl, "kl_output_min": c, "kl_output_max": d})["loss"]
        with mp.workdps(60):
            tol = mpf(10) ** -40 * (1 + abs(base))
            assert beta * c - tol <= full - base <= beta * d + tol
            unclamped = evaluate(fid, {**inputs, "ref_logprobs": ref}, {"beta": beta, **kl})["loss"]
            exceeded += not (beta * c - tol <= unclamped - base <= beta * d + tol)
    assert exceeded >= 6   # without the output clamp the bound fails, so the check above can fail
