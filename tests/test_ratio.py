"""Tests of the ratio family: identities, gradients, precision and an independent float64 check."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from mpmath import mp, mpf

from helpers import check_gradient_fd, check_precision, random_logprobs, random_mask
from pgspec.reference import SpecError, evaluate

LP = [[-1.0, -2.5, -0.375, -4.0], [-0.5, -3.0, -1.25, -2.0]]
OLD = [[-1.25, -2.0, -0.5, -3.5], [-0.5, -2.75, -1.0, -2.5]]
MASK = [[True, True, True, False], [True, True, False, False]]
BASE = {"logprobs": LP, "old_logprobs": OLD, "mask": MASK}
IDS = ["ratio.token", "ratio.sequence_product", "ratio.sequence_geometric", "ratio.gspo_token"]


@pytest.mark.parametrize("fid", ["ratio.token", "ratio.sequence_product", "ratio.sequence_geometric"])
def test_gradient_matches_finite_difference(fid):
    assert check_gradient_fd(fid, BASE) == 5


@pytest.mark.parametrize("fid", IDS)
def test_precision_60_vs_100_digits(fid):
    check_precision(fid, BASE)
    check_precision(fid, BASE, {"log_ratio_max": "0.125"} if "g" in fid.split(".")[1][:1] else None)


def test_on_policy_geometric_ratio_is_exactly_one():
    r = evaluate("ratio.sequence_geometric", {"logprobs": LP, "old_logprobs": LP, "mask": MASK})
    assert r["ratio"] == [1, 1]


def test_geometric_mean_is_length_independent_but_product_collapses():
    row_lp, row_old = [-1.0, -2.0, -0.5], [-0.5, -1.75, -0.25]
    single = {"logprobs": [row_lp], "old_logprobs": [row_old], "mask": [[True] * 3]}
    repeated = {"logprobs": [row_lp * 50], "old_logprobs": [row_old * 50], "mask": [[True] * 150]}
    g1 = evaluate("ratio.sequence_geometric", single)["ratio"][0]
    g50 = evaluate("ratio.sequence_geometric", repeated)["ratio"][0]
    assert abs(g1 - g50) < mpf(10) ** -55
    p1 = evaluate("ratio.sequence_product", single)["ratio"][0]
    p50 = evaluate("ratio.sequence_product", repeated)["ratio"][0]
    with mp.workdps(60):
        assert abs(p50 - p1 ** 50) < p1 ** 50 * mpf(10) ** -55
    assert p50 < mpf(10) ** -10 < g50  # exp(-1 * 50/ ...) collapses, the geometric mean does not


def test_gspo_token_value_is_sequence_ratio_and_gradient_is_per_token():
    seq = evaluate("ratio.sequence_geometric", BASE)
    tok = evaluate("ratio.gspo_token", BASE)
    for i, row in enumerate(MASK):
        for t, m in enumerate(row):
            if m:
                assert tok["ratio"][i][t] == seq["ratio"][i]
                assert tok["grad"]["logprobs"][i][t] == seq["ratio"][i]
                # the geometric ratio's own gradient is s_i / L_i
                with mp.workdps(60):
                    assert abs(seq["grad"]["logprobs"][i][t] * sum(row) - seq["ratio"][i]) < mpf(10) ** -55
            else:
                assert tok["ratio"][i][t] is None
                assert tok["grad"]["logprobs"][i][t] == 0


def test_clamp_bounds_and_zero_gradient_on_clamped_side():
    lp = [[0.0, -300.0, -1.0]]
    old = [[-200.0, 0.0, -1.0]]
    r = evaluate("ratio.token", {"logprobs": lp, "old_logprobs": old, "mask": [[True] * 3]}, {"log_ratio_clamp": 20})
    with mp.workdps(60):
        assert r["ratio"][0][0] == mp.exp(20) and r["ratio"][0][1] == mp.exp(-20)
    assert r["grad"]["logprobs"][0][:2] == [0, 0] and r["grad"]["logprobs"][0][2] == 1
    unclamped = evaluate("ratio.token", {"logprobs": lp, "old_logprobs": old, "mask": [[True] * 3]})
    with mp.workdps(60):
        assert abs(unclamped["ratio"][0][0] / mp.exp(200) - 1) < mpf(10) ** -55


def test_nan_and_inf_at_masked_positions_never_reach_results():
    lp = [[-1.0, float("nan"), float("inf")]]
    old = [[-2.0, float("-inf"), float("nan")]]
    mask = [[True, False, False]]
    for fid in IDS:
        r = evaluate(fid, {"logprobs": lp, "old_logprobs": old, "mask": mask})
        clean = evaluate(fid, {"logprobs": [[-1.0, 0.0, 0.0]], "old_logprobs": [[-2.0, 0.0, 0.0]], "mask": mask})
        assert r == clean


def test_empty_sequence_has_ratio_one():
    for fid in ("ratio.sequence_product", "ratio.sequence_geometric"):
        r = evaluate(fid, {"logprobs": [[-1.0, -2.0]], "old_logprobs": [[-3.0, 0.0]], "mask": [[False, False]]})
        assert r["ratio"] == [1] and r["grad"]["logprobs"] == [[0, 0]]


def test_errors_name_the_argument():
    with pytest.raises(SpecError, match="old_logprobs.*shape"):
        evaluate("ratio.token", {"logprobs": [[-1.0]], "old_logprobs": [[-1.0, 0.0]], "mask": [[True]]})
    with pytest.raises(SpecError, match="mask\\[0\\]\\[0\\] must be a bool"):
        evaluate("ratio.token", {"logprobs": [[-1.0]], "old_logprobs": [[-1.0]], "mask": [[1]]})
    with pytest.raises(SpecError, match="log_ratio_clamp"):
        evaluate("ratio.token", BASE, {"log_ratio_clamp": 0})
    with pytest.raises(SpecError, match="missing input 'old_logprobs'"):
        evaluate("ratio.token", {"logprobs": LP, "mask": MASK})
    with pytest.raises(SpecError, match="ragged"):
        evaluate("ratio.token", {"logprobs": [[-1.0], [-1.0, -2.0]], "old_logprobs": LP, "mask": MASK})
    with pytest.raises(SpecError, match="unknown formula ID 'ratio.nope'"):
        evaluate("ratio.nope", BASE)
    with pytest.raises(SpecError, match="logprobs\\[0\\]\\[0\\] must be finite"):
        evaluate("ratio.token", {"logprobs": [[float("nan")]], "old_logprobs": [[0.0]], "mask": [[True]]})


# An independent float64 implementation, written from the spec text alone -------------------
def np_ratios(lp, old, mask):
    lp, old, m = np.asarray(lp), np.asarray(old), np.asarray(mask)
    d = np.where(m, lp - old, 0.0)
    L = m.sum(1)
    token = np.exp(d)
    product = np.exp(d.sum(1))
    geometric = np.exp(np.where(L > 0, d.sum(1) / np.maximum(L, 1), 0.0))
    return token, product, geometric, L


def test_agrees_with_independent_float64_numpy():
    rng = random.Random(1234)
    for _ in range(20):
        B, T = rng.randint(1, 4), rng.randint(1, 12)
        lp, old = random_logprobs(rng, B, T), random_logprobs(rng, B, T)
        mask = random_mask(rng, B, T)
        token, product, geometric, L = np_ratios(lp, old, mask)
        inputs = {"logprobs": lp, "old_logprobs": old, "mask": mask}
        rt = evaluate("ratio.token", inputs)
        rp = evaluate("ratio.sequence_product", inputs)
        rg = evaluate("ratio.sequence_geometric", inputs)
        for i in range(B):
            # product: relative error of exp(sum of L terms) grows like L * eps * |sum|
            assert math.isclose(float(rp["ratio"][i]), product[i], rel_tol=4e-16 * (1 + T * 8))
            assert math.isclose(float(rg["ratio"][i]), geometric[i], rel_tol=4e-16 * (1 + T * 8))
            for t in range(T):
                if mask[i][t]:
                    assert math.isclose(float(rt["ratio"][i][t]), token[i, t], rel_tol=4e-16 * 8)


# The two placements of a log-ratio bound (Liger-Kernel fork PR #4; spec/ratio.md) ---------------

D30 = {"logprobs": [[0.0, -1.0]], "old_logprobs": [[-30.0, -1.0]], "mask": [[True, True]]}


def test_per_token_clamp_before_the_mean_keeps_the_unclamped_tokens_gradient():
    """d = (30, 0), k = 20: s = e^10 with gradient (0, e^10/2); the mean cap gives e^15 or a zero gradient."""
    per_token = evaluate("ratio.sequence_geometric", D30, {"log_ratio_clamp": 20})
    with mp.workdps(60):
        e10 = mp.exp(10)
        assert abs(per_token["ratio"][0] - e10) <= e10 * mpf(10) ** -55
        g = per_token["grad"]["logprobs"][0]
        assert g[0] == 0 and abs(g[1] - e10 / 2) <= e10 * mpf(10) ** -55
        cap20 = evaluate("ratio.sequence_geometric", D30, {"log_ratio_max": 20})
        assert abs(cap20["ratio"][0] - mp.exp(15)) <= mp.exp(15) * mpf(10) ** -55
        assert all(abs(x - mp.exp(15) / 2) <= mp.exp(15) * mpf(10) ** -55 for x in cap20["grad"]["logprobs"][0])
        cap10 = evaluate("ratio.sequence_geometric", D30, {"log_ratio_max": 10})
        assert abs(cap10["ratio"][0] - e10) <= e10 * mpf(10) ** -55
        assert cap10["grad"]["logprobs"] == [[0, 0]]


def test_per_token_clamp_equals_the_ratio_of_clamped_log_ratios():
    """Identity: s(l, l_old; k) = s(l, l - clip(l - l_old, -k, k)) in value, on random inputs."""
    rng = random.Random(901)
    for _ in range(20):
        B, T, k = 3, 6, rng.choice([0.25, 0.5, 1.0, 2.0])
        mask = random_mask(rng, B, T)
        lp = [[rng.uniform(-4, 0) for _ in range(T)] for _ in range(B)]
        old = [[rng.uniform(-4, 0) for _ in range(T)] for _ in range(B)]
        got = evaluate("ratio.sequence_geometric", {"logprobs": lp, "old_logprobs": old, "mask": mask},
                       {"log_ratio_clamp": k})["ratio"]
        with mp.workdps(80):
            shifted = [[mpf(lp[i][t]) - max(-mpf(k), min(mpf(k), mpf(lp[i][t]) - mpf(old[i][t]))) for t in range(T)]
                       for i in range(B)]
        want = evaluate("ratio.sequence_geometric", {"logprobs": lp, "old_logprobs": shifted, "mask": mask})["ratio"]
        for a, b in zip(got, want):
            assert abs(a - b) <= abs(b) * mpf(10) ** -50


def test_per_token_clamp_that_never_binds_changes_nothing():
    free = evaluate("ratio.sequence_geometric", BASE)
    clamped = evaluate("ratio.sequence_geometric", BASE, {"log_ratio_clamp": 20})
    assert free == clamped
    assert check_gradient_fd("ratio.sequence_geometric", D30, {"log_ratio_clamp": 20}) == 2


def test_per_token_clamp_must_be_positive():
    with pytest.raises(SpecError, match="parameter 'log_ratio_clamp'"):
        evaluate("ratio.sequence_geometric", BASE, {"log_ratio_clamp": 0})
