"""Tests of the mask family: the OPSM regression anchor and identity, precision, errors, float64 check."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from mpmath import mp, mpf

from helpers import check_precision, random_logprobs, random_mask
from pgspec.reference import REGISTRY, SpecError, evaluate

IDS = ["mask.geometric_sequence", "mask.opsm", "mask.entropy_quantile"]
EPS = 2.0 ** -52

LP = [[-1.0, -2.5, -0.375, -4.0], [-0.5, -3.0, -1.25, -2.0]]
OLD = [[-1.25, -2.0, -0.5, -3.5], [-0.5, -2.75, -1.0, -2.5]]
MU = [[-1.0, -2.25, -0.5, -3.0], [-0.25, -3.0, -1.0, -2.0]]
MASK = [[True, True, True, False], [True, True, False, False]]
GEO = {"old_logprobs": OLD, "sampler_logprobs": MU, "mask": MASK}
OPSM = {"logprobs": LP, "sampler_logprobs": MU, "advantages": [-1.0, 0.5], "mask": MASK}
ENT = {"entropy": [[0.5, 1.0, 2.0, 3.0], [0.25, 1.5, 7.0, 0.0]], "mask": MASK}


@pytest.mark.parametrize("fid", IDS)
def test_no_differentiable_input_and_no_gradient(fid):
    f = REGISTRY[fid]
    assert f.differentiable == () and f.grad_of is None
    inputs = {"mask.geometric_sequence": GEO, "mask.opsm": OPSM, "mask.entropy_quantile": ENT}[fid]
    assert evaluate(fid, inputs)["grad"] == {}


# OPSM -------------------------------------------------------------------------------------------

SLIME_1917 = {"logprobs": [[0.0, 0.0, 0.0]], "sampler_logprobs": [[1.0, 1.0, 1.0]],
              "advantages": [[-0.5, 0.25, -0.25]], "mask": [[True, True, True]]}


def test_opsm_slime_1917_masks_the_whole_sequence():
    r = evaluate("mask.opsm", SLIME_1917, {"delta": 0.1})
    assert r["seq_keep"] == [False] and r["keep"] == [[False, False, False]]
    assert r["seq_stat"] == [1]
    with mp.workdps(60):
        assert abs(r["seq_advantage"][0] + mpf(1) / 6) < mpf(10) ** -55
    # the per-token reading (slime before #1917) keeps the positive-advantage middle token ...
    adv, kappa = SLIME_1917["advantages"][0], 1.0
    buggy = [not (a < 0 and kappa > 0.1) for a in adv]
    assert buggy == [False, True, False]
    # ... and reduces to the loss the issue reports: sum_t keep * (-A_t e^(l - l_old)) / 3 with l_old = 1
    buggy_loss = sum(-a * math.exp(-1.0) for a, k in zip(adv, buggy) if k) / 3
    assert buggy_loss == pytest.approx(-0.0306566, abs=5e-8)
    assert -0.25 * math.exp(-1.0) == pytest.approx(-0.0919699, abs=5e-8)
    # the spec's mask leaves no policy term at all
    assert sum(-a * math.exp(-1.0) for a, k in zip(adv, r["keep"][0]) if k) == 0


def test_opsm_is_advantage_gated_negated_geometric_sequence_masking():
    """keep_i = 1[A_i >= 0] or keep_i(mask.geometric_sequence; numerator = logprobs, lower = e^-delta, upper = null)."""
    rng = random.Random(3)
    seen = set()
    for trial in range(60):
        B, T = rng.randint(1, 4), rng.randint(1, 10)
        lp = random_logprobs(rng, B, T)
        mu = [[x + rng.choice([-1, 1]) * rng.choice([0.0, 0.0625, 0.25, 1.0]) for x in row] for row in lp]
        mask = random_mask(rng, B, T)
        adv = ([[rng.choice([-1.0, -0.25, 0.0, 0.5]) for _ in range(T)] for _ in range(B)] if trial % 2
               else [rng.choice([-1.0, -0.25, 0.0, 0.5]) for _ in range(B)])
        delta = rng.choice([0.0, 0.01, 0.1, 0.5])
        o = evaluate("mask.opsm", {"logprobs": lp, "sampler_logprobs": mu, "advantages": adv, "mask": mask},
                     {"delta": delta})
        with mp.workdps(60):
            lower = mp.exp(-mpf(delta))
        g = evaluate("mask.geometric_sequence", {"logprobs": lp, "sampler_logprobs": mu, "mask": mask},
                     {"numerator": "logprobs", "lower": lower, "upper": None})
        for i in range(B):
            expected = (o["seq_advantage"][i] >= 0) or g["seq_keep"][i]
            assert o["seq_keep"][i] == expected
            with mp.workdps(60):
                assert abs(g["seq_ratio"][i] - mp.exp(-o["seq_stat"][i])) <= mpf(10) ** -55 * g["seq_ratio"][i]
            seen.add((o["seq_advantage"][i] < 0, o["seq_keep"][i]))
        assert o["keep"] == [[o["seq_keep"][i] if m else None for m in row] for i, row in enumerate(mask)]
    assert seen == {(True, True), (True, False), (False, True)}  # never drops a non-negative advantage


def test_opsm_sequence_advantages_equal_constant_token_advantages():
    seq = evaluate("mask.opsm", OPSM, {"delta": 0.1})
    tok = evaluate("mask.opsm", {**OPSM, "advantages": [[-1.0] * 4, [0.5] * 4]}, {"delta": 0.1})
    assert seq == tok


def test_opsm_edge_cases():
    base = {"logprobs": [[0.0, -1.0]], "sampler_logprobs": [[0.5, -0.5]], "mask": [[True, True]]}
    # kappa = 0.5 exactly: kept at delta = 0.5 (strict >), dropped below
    assert evaluate("mask.opsm", {**base, "advantages": [-1.0]}, {"delta": 0.5})["seq_keep"] == [True]
    assert evaluate("mask.opsm", {**base, "advantages": [-1.0]}, {"delta": 0.25})["seq_keep"] == [False]
    assert evaluate("mask.opsm", {**base, "advantages": [0.0]}, {"delta": 0.0})["seq_keep"] == [True]
    empty = {"logprobs": [[0.0, -1.0]], "sampler_logprobs": [[9.0, 9.0]], "advantages": [[-1.0, -1.0]],
             "mask": [[False, False]]}
    r = evaluate("mask.opsm", empty, {"delta": 0.0})
    assert r["seq_keep"] == [True] and r["seq_stat"] == [0] and r["seq_advantage"] == [0] and r["keep"] == [[None, None]]


# Geometric sequence masking ---------------------------------------------------------------------

def test_geometric_sequence_is_length_invariant_where_the_product_is_not():
    old, mu = [-1.0, -2.0, -0.5], [-1.0078125, -2.0, -0.5]
    one = {"old_logprobs": [old], "sampler_logprobs": [mu], "mask": [[True] * 3]}
    many = {"old_logprobs": [old * 200], "sampler_logprobs": [mu * 200], "mask": [[True] * 600]}
    a, b = evaluate("mask.geometric_sequence", one), evaluate("mask.geometric_sequence", many)
    with mp.workdps(60):
        assert abs(a["seq_ratio"][0] - b["seq_ratio"][0]) <= mpf(10) ** -55
        assert abs(a["seq_ratio"][0] - mp.exp(mpf("0.0078125") / 3)) <= mpf(10) ** -55
    assert a["seq_keep"] == b["seq_keep"] == [True]
    # the product of the same ratios over 600 tokens is e^1.5625 = 4.77, outside [0.5, 2]
    assert evaluate("is.sequence.mask", many, {"c_min": 0.5, "c_max": 2})["seq_keep"] == [False]


def test_geometric_sequence_numerator_choice():
    cur = evaluate("mask.geometric_sequence", {"logprobs": LP, "sampler_logprobs": MU, "mask": MASK},
                   {"numerator": "logprobs", "lower": 0.9, "upper": 1.1})
    same = evaluate("mask.geometric_sequence", {"old_logprobs": LP, "sampler_logprobs": MU, "mask": MASK},
                    {"lower": 0.9, "upper": 1.1})
    assert cur == same


def test_geometric_sequence_empty_sequence_has_ratio_one():
    inputs = {"old_logprobs": [[-1.0, 3.0]], "sampler_logprobs": [[5.0, -3.0]], "mask": [[False, False]]}
    r = evaluate("mask.geometric_sequence", inputs)
    assert r["seq_ratio"] == [1] and r["seq_keep"] == [True] and r["keep"] == [[None, None]]
    assert evaluate("mask.geometric_sequence", inputs, {"lower": 1.5, "upper": None})["seq_keep"] == [False]


# Entropy quantile -------------------------------------------------------------------------------

def test_entropy_quantile_linear_interpolation_and_ties():
    r = evaluate("mask.entropy_quantile", ENT, {"top_entropy_quantile": "0.3"})
    # 5 unmasked values sorted (0.25, 0.5, 1, 1.5, 2), level 0.7, h = 2.8: q = 1 + 0.8 (1.5 - 1) = 1.4
    with mp.workdps(60):
        assert abs(r["threshold"] - mpf("1.4")) < mpf(10) ** -55
    assert r["keep"] == [[False, False, True, None], [False, True, None, None]]
    # the binary double 0.3 moves a non-integer position by ~1e-17: q shifts, no decision does
    b = evaluate("mask.entropy_quantile", ENT, {"top_entropy_quantile": 0.3})
    assert b["keep"] == r["keep"] and 0 < abs(b["threshold"] - r["threshold"]) < mpf(10) ** -16
    ties = evaluate("mask.entropy_quantile", {"entropy": [[1.0, 1.0, 1.0, 2.0]], "mask": [[True] * 4]},
                    {"top_entropy_quantile": 0.5})
    assert ties["threshold"] == 1 and ties["keep"] == [[True, True, True, True]]  # ties with q are kept


def test_entropy_quantile_position_is_that_of_the_decimal_parameter():
    # rho = 0.3 as a binary double: (1 - rho) * 10 = 7.000000000000000111..., taken as 7
    ent = [[float(k) for k in range(11)]]
    r = evaluate("mask.entropy_quantile", {"entropy": ent, "mask": [[True] * 11]}, {"top_entropy_quantile": 0.3})
    assert r["threshold"] == 7 and r["keep"][0] == [k >= 7 for k in range(11)]
    s = evaluate("mask.entropy_quantile", {"entropy": ent, "mask": [[True] * 11]}, {"top_entropy_quantile": "0.3"})
    assert s == r


def test_entropy_quantile_extremes():
    inputs = {"entropy": [[0.5, 2.0, 2.0], [1.0, 0.0, 9.0]], "mask": [[True, True, True], [True, True, False]]}
    assert evaluate("mask.entropy_quantile", inputs, {"top_entropy_quantile": 1})["keep"] == \
        [[True, True, True], [True, True, None]]
    r0 = evaluate("mask.entropy_quantile", inputs, {"top_entropy_quantile": 0})
    assert r0["threshold"] == 2 and r0["keep"] == [[False, True, True], [False, False, None]]
    single = evaluate("mask.entropy_quantile", {"entropy": [[3.0, 1.0]], "mask": [[False, True]]})
    assert single["threshold"] == 1 and single["keep"] == [[None, True]]
    none = evaluate("mask.entropy_quantile", {"entropy": [[3.0, 1.0]], "mask": [[False, False]]})
    assert none["threshold"] is None and none["keep"] == [[None, None]]


# Precision, NaN at masked positions, errors --------------------------------------------------------

def test_precision_60_vs_100_digits():
    extreme_geo = {"old_logprobs": [[0.0, -200.0, 2.0 ** -20], [-20.0, 0.0, -1.0]],
                   "sampler_logprobs": [[-200.0, 0.0, 0.0], [0.0, -20.0, -1.0 + 2.0 ** -20]],
                   "mask": [[True, True, True], [True, True, False]]}
    for inputs in (GEO, extreme_geo):
        for params in ({}, {"lower": None, "upper": 1e80}, {"lower": 1e-80, "upper": None}):
            check_precision("mask.geometric_sequence", inputs, params)
    extreme_opsm = {"logprobs": extreme_geo["old_logprobs"], "sampler_logprobs": extreme_geo["sampler_logprobs"],
                    "advantages": [[-1.0, 2.0 ** -20, -3.0], [-1e-30, 0.0, 5.0]], "mask": extreme_geo["mask"]}
    for inputs in (OPSM, extreme_opsm):
        for delta in (0.0, 0.1, 0.5, 100.0):
            check_precision("mask.opsm", inputs, {"delta": delta})
    tiny = {"entropy": [[1.0, 1.0 + 2.0 ** -40, 1e-30, 200.0]], "mask": [[True] * 4]}
    for inputs in (ENT, tiny):
        for rho in (0.0, 0.2, 0.3, 0.55, 1.0):
            check_precision("mask.entropy_quantile", inputs, {"top_entropy_quantile": rho})


def test_nan_and_inf_at_masked_positions_never_reach_results():
    nan, inf = float("nan"), float("inf")
    m = [[True, False, False], [True, True, False]]
    dirty_lp, clean_lp = [[-1.0, nan, inf], [-0.5, -2.0, -inf]], [[-1.0, 0.0, 0.0], [-0.5, -2.0, 0.0]]
    dirty_mu, clean_mu = [[-2.0, -inf, nan], [-0.25, -1.0, inf]], [[-2.0, 0.0, 0.0], [-0.25, -1.0, 0.0]]
    assert evaluate("mask.geometric_sequence", {"old_logprobs": dirty_lp, "sampler_logprobs": dirty_mu, "mask": m}) == \
        evaluate("mask.geometric_sequence", {"old_logprobs": clean_lp, "sampler_logprobs": clean_mu, "mask": m})
    dirty_adv, clean_adv = [[-1.0, nan, inf], [0.5, -3.0, nan]], [[-1.0, 0.0, 0.0], [0.5, -3.0, 0.0]]
    p = {"delta": 0.1}
    assert evaluate("mask.opsm", {"logprobs": dirty_lp, "sampler_logprobs": dirty_mu, "advantages": dirty_adv,
                                  "mask": m}, p) == \
        evaluate("mask.opsm", {"logprobs": clean_lp, "sampler_logprobs": clean_mu, "advantages": clean_adv,
                               "mask": m}, p)
    assert evaluate("mask.entropy_quantile", {"entropy": [[0.5, nan, -inf], [1.0, 2.0, inf]], "mask": m}) == \
        evaluate("mask.entropy_quantile", {"entropy": [[0.5, 0.0, 0.0], [1.0, 2.0, 0.0]], "mask": m})


def test_errors_name_the_argument():
    with pytest.raises(SpecError, match="missing input 'logprobs'.*numerator='logprobs'"):
        evaluate("mask.geometric_sequence", GEO, {"numerator": "logprobs"})
    with pytest.raises(SpecError, match="input 'logprobs' was given but parameter numerator='old_logprobs'"):
        evaluate("mask.geometric_sequence", {**GEO, "logprobs": LP})
    with pytest.raises(SpecError, match="missing input 'old_logprobs'"):
        evaluate("mask.geometric_sequence", {"sampler_logprobs": MU, "mask": MASK})
    with pytest.raises(SpecError, match="'lower' must be <= 'upper', got lower=1.5 and upper=1.25"):
        evaluate("mask.geometric_sequence", GEO, {"lower": 1.5, "upper": 1.25})
    with pytest.raises(SpecError, match="at least one of the parameters 'lower' and 'upper'"):
        evaluate("mask.geometric_sequence", GEO, {"lower": None, "upper": None})
    with pytest.raises(SpecError, match="parameter 'numerator' must be one of"):
        evaluate("mask.geometric_sequence", GEO, {"numerator": "ref_logprobs"})
    with pytest.raises(SpecError, match="parameter 'delta' must be real in \\[0, \\+inf\\)"):
        evaluate("mask.opsm", OPSM, {"delta": -0.1})
    with pytest.raises(SpecError, match="input 'advantages' must have shape \\[B\\] or \\[B,T\\]"):
        evaluate("mask.opsm", {**OPSM, "advantages": [-1.0, 0.5, 2.0]})
    with pytest.raises(SpecError, match="advantages\\[1\\]\\[0\\] must be finite"):
        evaluate("mask.opsm", {**OPSM, "advantages": [[0.0] * 4, [float("nan"), 0.0, 0.0, 0.0]]})
    with pytest.raises(SpecError, match="parameter 'top_entropy_quantile' must be real in \\[0, 1\\]"):
        evaluate("mask.entropy_quantile", ENT, {"top_entropy_quantile": 1.5})
    with pytest.raises(SpecError, match="entropy\\[0\\]\\[1\\] must be >= 0"):
        evaluate("mask.entropy_quantile", {"entropy": [[0.5, -0.25, 1.0, 0.0]], "mask": [[True] * 4]})
    with pytest.raises(SpecError, match="mask\\[0\\]\\[0\\] must be a bool"):
        evaluate("mask.entropy_quantile", {"entropy": [[0.5]], "mask": [[1]]})


# An independent float64 implementation, written from the spec text alone -------------------

def test_agrees_with_independent_float64_numpy():
    rng = random.Random(77)
    for _ in range(30):
        B, T = rng.randint(1, 5), rng.randint(1, 12)
        lp, mask = random_logprobs(rng, B, T), random_mask(rng, B, T)
        mu = [[x + rng.choice([-1, 1]) * rng.choice([0.0, 2.0 ** -8, 2.0 ** -5, 0.25, 1.0]) for x in row] for row in lp]
        m = np.asarray(mask)
        L = m.sum(1)
        d = np.where(m, np.asarray(lp) - np.asarray(mu), 0.0)        # exact (bf16 grid)
        mean = np.where(L > 0, d.sum(1) / np.maximum(L, 1), 0.0)    # one rounding: rel EPS/2
        g = np.exp(mean)                                            # plus <= 1 ulp from exp
        g_tol = 2 * EPS + np.abs(mean) * EPS / 2
        lower, upper = rng.choice([(0.99, 1.01), (0.9, None), (None, 1.05), (0.5, 2.0)])
        r = evaluate("mask.geometric_sequence", {"old_logprobs": lp, "sampler_logprobs": mu, "mask": mask},
                     {"lower": lower, "upper": upper})
        for i in range(B):
            assert math.isclose(float(r["seq_ratio"][i]), g[i], rel_tol=g_tol[i], abs_tol=0)
            bounds = [b for b in (lower, upper) if b is not None]
            if all(abs(g[i] - b) > g_tol[i] * g[i] for b in bounds):
                assert r["seq_keep"][i] == ((lower is None or g[i] >= lower) and (upper is None or g[i] <= upper))
        # OPSM: kappa = mean(l_mu - l) = -mean;  A_i = given, or the masked mean of token advantages
        tok_adv = rng.random() < 0.5
        adv = (np.asarray([[rng.choice([-1.0, -0.5, 0.0, 0.25]) for _ in range(T)] for _ in range(B)]) if tok_adv
               else np.asarray([rng.choice([-1.0, 0.0, 0.5]) for _ in range(B)]))
        A = np.where(L > 0, np.where(m, adv, 0.0).sum(1) / np.maximum(L, 1), 0.0) if tok_adv else adv
        delta = rng.choice([0.0, 0.01, 0.1, 0.5])
        o = evaluate("mask.opsm", {"logprobs": lp, "sampler_logprobs": mu, "advantages": adv.tolist(), "mask": mask},
                     {"delta": delta})
        for i in range(B):
            kappa = -mean[i]
            assert math.isclose(float(o["seq_stat"][i]), kappa, rel_tol=EPS, abs_tol=0)
            assert float(o["seq_advantage"][i]) == pytest.approx(A[i], rel=2 * EPS, abs=0)
            if abs(kappa - delta) > EPS * abs(kappa) and A[i] != 0:
                assert o["seq_keep"][i] == (not (A[i] < 0 and kappa > delta))
        # entropy quantile: numpy's 'linear' method is the same Hyndman-Fan type 7 quantile
        ent = [[abs(x) for x in row] for row in random_logprobs(rng, B, T, -4.0, 0.0)]
        rho = rng.choice([0.1, 0.2, 0.25, 0.5, 0.8, 1.0])
        vals = np.asarray(ent)[m]
        re = evaluate("mask.entropy_quantile", {"entropy": ent, "mask": mask}, {"top_entropy_quantile": rho})
        q = np.quantile(vals, 1 - rho, method="linear")
        # q is an interpolation between two entropies <= 4: a few roundings of size <= 4 EPS
        q_tol = 16 * EPS
        assert abs(float(re["threshold"]) - q) <= q_tol
        for i in range(B):
            for t in range(T):
                if mask[i][t] and abs(ent[i][t] - q) > q_tol:
                    assert re["keep"][i][t] == (ent[i][t] >= q)


# mask.opsm advantage_gate (DeepSeek-V3.2 Eq. 9 read per token) -----------------------------------

def test_opsm_token_gate_equals_sequence_gate_for_sequence_advantages():
    rng = random.Random(904)
    for _ in range(20):
        B, T = 4, 6
        mask = random_mask(rng, B, T)
        lp, mu = random_logprobs(rng, B, T), random_logprobs(rng, B, T)
        adv = [rng.choice([-1.0, -0.25, 0.0, 0.5]) for _ in range(B)]
        inputs = {"logprobs": lp, "sampler_logprobs": mu, "advantages": adv, "mask": mask}
        delta = rng.choice([0, 0.125, 0.5])
        seq = evaluate("mask.opsm", inputs, {"delta": delta})
        tok = evaluate("mask.opsm", inputs, {"delta": delta, "advantage_gate": "token"})
        assert seq["keep"] == tok["keep"] and seq["seq_keep"] == tok["seq_keep"]


def test_opsm_token_gate_is_the_per_token_equation():
    """keep_{i,t} = not (A_{i,t} < 0 and kappa_i > delta); seq_keep = every unmasked token kept."""
    rng = random.Random(905)
    for _ in range(20):
        B, T = 4, 6
        mask = random_mask(rng, B, T)
        lp, mu = random_logprobs(rng, B, T), random_logprobs(rng, B, T)
        adv = [[rng.choice([-1.0, -0.25, 0.0, 0.5]) for _ in range(T)] for _ in range(B)]
        delta = rng.choice([0, 0.125, 0.5])
        out = evaluate("mask.opsm", {"logprobs": lp, "sampler_logprobs": mu, "advantages": adv, "mask": mask},
                       {"delta": delta, "advantage_gate": "token"})
        for i in range(B):
            kappa = out["seq_stat"][i]
            want = [(not (adv[i][t] < 0 and kappa > delta)) if mask[i][t] else None for t in range(T)]
            assert out["keep"][i] == want
            assert out["seq_keep"][i] == all(k for k in want if k is not None)


def test_opsm_token_gate_keeps_the_positive_token_of_slime_1917():
    inputs = {"logprobs": [[0.0, 0.0, 0.0]], "sampler_logprobs": [[1.0, 1.0, 1.0]],
              "advantages": [[-0.5, 0.25, -0.25]], "mask": [[True, True, True]]}
    assert evaluate("mask.opsm", inputs, {"delta": "0.1"})["keep"] == [[False, False, False]]
    tok = evaluate("mask.opsm", inputs, {"delta": "0.1", "advantage_gate": "token"})
    assert tok["keep"] == [[False, True, False]] and tok["seq_keep"] == [False]
    with pytest.raises(SpecError, match="parameter 'advantage_gate'"):
        evaluate("mask.opsm", inputs, {"advantage_gate": "sequence"})
