"""Tests of the is family: anchors, identities, precision, errors and an independent float64 check."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from mpmath import mp, mpf

from helpers import check_precision, random_logprobs, random_mask
from pgspec.reference import REGISTRY, SpecError, evaluate

OLD = [[-1.0, -2.5, -0.375, -4.0], [-0.5, -3.0, -1.25, -2.0]]
MU = [[-1.25, -2.0, -0.5, -3.5], [-0.5, -2.75, -1.0, -2.5]]
MASK = [[True, True, True, False], [True, True, False, False]]
BASE = {"old_logprobs": OLD, "sampler_logprobs": MU, "mask": MASK}
WEIGHT_IDS = ["is.token.truncate", "is.token.mask", "is.sequence.truncate", "is.sequence.mask",
              "is.geometric.truncate", "is.geometric.mask"]
IDS = WEIGHT_IDS + ["is.reject"]
EPS = 2.0 ** -52  # float64 machine epsilon; one rounding has relative error <= EPS / 2


def inputs_from_ratios(ratios):
    """One sequence whose token ratios pi_old/mu are exactly ``ratios`` at 60 digits (l^mu = 0)."""
    with mp.workdps(80):
        old = [[mp.log(mpf(r)) for r in ratios]]
    return {"old_logprobs": old, "sampler_logprobs": [[0] * len(ratios)], "mask": [[True] * len(ratios)]}


def close(a, b, digits=50):
    """|a - b| <= 10^-digits max(|a|, |b|, 1), evaluated at 100 digits (b may be a decimal string)."""
    with mp.workdps(100):
        b = mpf(b)
        return abs(a - b) <= mpf(10) ** -digits * max(abs(a), abs(b), 1)


# Declarations ---------------------------------------------------------------------------------

@pytest.mark.parametrize("fid", IDS)
def test_no_differentiable_input_and_no_gradient(fid):
    f = REGISTRY[fid]
    assert f.differentiable == () and f.grad_of is None and f.stop_gradients == ()
    assert evaluate(fid, BASE)["grad"] == {}


# Precision -------------------------------------------------------------------------------------

EXTREME = {
    "old_logprobs": [[0.0, -200.0, -1.0, 2.0 ** -20], [-20.0, 0.0, -3.0, -1.0]],
    "sampler_logprobs": [[-200.0, 0.0, -1.0 - 2.0 ** -20, 0.0], [0.0, -20.0, -3.0 + 2.0 ** -20, -1.0]],
    "mask": [[True, True, True, True], [True, True, True, False]],
}
TINY = {  # differences of 2^-20: k3 ~ 2^-41 must not cancel
    "old_logprobs": [[-1.0, -2.0, -3.0]], "sampler_logprobs": [[-1.0 - 2.0 ** -20, -2.0 + 2.0 ** -20, -3.0]],
    "mask": [[True, True, True]],
}


@pytest.mark.parametrize("fid", WEIGHT_IDS)
def test_precision_60_vs_100_digits(fid):
    mode_params = [{}, {"c_min": 0.25}, {"log_ratio_clamp": 20}, {"c_min": None, "c_max": 1e30}]
    for inputs in (BASE, EXTREME, TINY):
        for params in mode_params:
            check_precision(fid, inputs, params)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
@pytest.mark.parametrize("level", ["token", "seq_sum", "seq_mean", "seq_max"])
def test_reject_precision_60_vs_100_digits(estimator, level):
    for inputs in (BASE, EXTREME, TINY):
        for direction in ("mu_old", "old_mu"):
            for clamp in (None, 20):
                check_precision("is.reject", inputs, {"estimator": estimator, "level": level, "direction": direction,
                                                      "lower": -1, "upper": 1, "log_ratio_clamp": clamp})


def test_k3_has_no_cancellation_at_tiny_log_ratios():
    r = evaluate("is.reject", TINY, {"level": "token", "upper": 1})
    with mp.workdps(60):
        u = mpf(2) ** -20
        assert close(r["token_stat"][0][0], mp.exp(u) - 1 - u, 55)   # mp.exp at 60 digits: ~20 digits lost, 35 left
        assert r["token_stat"][0][0] > 0 and abs(r["token_stat"][0][0] / (u * u / 2) - 1) < mpf(2) ** -19


# Published and hand-checked anchors ------------------------------------------------------------

def test_research_anchor_ratios_3_1_04_12():
    """verl weights for pi_old/mu = (3, 1, 0.4, 1.2): TIS 2 -> (2, 1, 0.4, 1.2); IcePop 0.5_2.0 -> (0, 1, 0, 1.2);
    sequence -> 1.44 at every token; geometric (AReaL) 1.44^(1/4) = 1.0954451150103321..."""
    inputs = inputs_from_ratios(["3", "1", "0.4", "1.2"])
    tis = evaluate("is.token.truncate", inputs, {"c_max": 2})["weight"][0]
    assert all(close(w, e, 55) for w, e in zip(tis, ["2", "1", "0.4", "1.2"]))
    ice = evaluate("is.token.mask", inputs, {"c_min": 0.5, "c_max": 2})
    assert ice["keep"][0] == [False, True, False, True]
    assert ice["weight"][0][0] == 0 and ice["weight"][0][2] == 0
    assert close(ice["weight"][0][1], "1", 55) and close(ice["weight"][0][3], "1.2", 55)
    seq = evaluate("is.sequence.truncate", inputs, {"c_max": 2})
    assert all(close(w, "1.44", 55) for w in seq["weight"][0])
    geo = evaluate("is.geometric.mask", inputs, {"c_max": 2})
    with mp.workdps(60):
        assert close(geo["seq_weight"][0], mp.root(mpf("1.44"), 4), 55)
    assert mp.nstr(geo["seq_weight"][0], 5) == "1.0954"


@pytest.mark.parametrize("fid", ["is.token.truncate", "is.sequence.truncate", "is.geometric.truncate"])
def test_truncated_weight_never_exceeds_c_max_and_never_falls_below_c_min(fid):
    rng = random.Random(7)
    for _ in range(30):
        B, T = rng.randint(1, 3), rng.randint(1, 8)
        inputs = {"old_logprobs": random_logprobs(rng, B, T), "sampler_logprobs": random_logprobs(rng, B, T),
                  "mask": random_mask(rng, B, T)}
        c_max = rng.choice([0.5, 1.0, 1.5, 2.0, 5.0])
        c_min = rng.choice([None, 0.0, 0.25, 0.5])
        r = evaluate(fid, inputs, {"c_min": c_min, "c_max": c_max})
        for i, row in enumerate(inputs["mask"]):
            for t, m in enumerate(row):
                if m:
                    w = r["weight"][i][t]
                    assert w <= c_max and (c_min is None or w >= c_min)
                    raw = r["ratio"][i][t] if "ratio" in r else r["seq_ratio"][i]
                    assert w == raw or w == c_max or w == c_min  # either untouched or exactly a bound


@pytest.mark.parametrize("fid", ["is.token.mask", "is.sequence.mask", "is.geometric.mask"])
def test_mask_mode_zeroes_outliers_exactly_and_keeps_raw_survivors(fid):
    rng = random.Random(11)
    for _ in range(30):
        B, T = rng.randint(1, 3), rng.randint(1, 8)
        inputs = {"old_logprobs": random_logprobs(rng, B, T, -3, -0.01),
                  "sampler_logprobs": random_logprobs(rng, B, T, -3, -0.01), "mask": random_mask(rng, B, T)}
        params = {"c_min": rng.choice([None, 0.5, 0.8]), "c_max": rng.choice([1.25, 2.0, 5.0])}
        r = evaluate(fid, inputs, params)
        for i, row in enumerate(inputs["mask"]):
            for t, m in enumerate(row):
                if not m:
                    assert r["weight"][i][t] is None and r["keep"][i][t] is None
                    continue
                raw = r["ratio"][i][t] if "ratio" in r else r["seq_ratio"][i]
                inside = (params["c_min"] is None or raw >= params["c_min"]) and raw <= params["c_max"]
                assert r["keep"][i][t] is inside
                assert r["weight"][i][t] == (raw if inside else 0)  # exact: 0 or the raw ratio, nothing else


def test_mask_band_is_closed():
    one = {"old_logprobs": [[0.0]], "sampler_logprobs": [[0.0]], "mask": [[True]]}
    r = evaluate("is.token.mask", one, {"c_min": 1, "c_max": 1})
    assert r["keep"] == [[True]] and r["weight"] == [[1]]  # rho = 1 exactly on both bounds: kept
    half = {"old_logprobs": [[0.5]], "sampler_logprobs": [[0.0]], "mask": [[True]]}
    rho = evaluate("is.token.mask", half)["ratio"][0][0]
    assert evaluate("is.token.mask", half, {"c_min": None, "c_max": rho})["keep"] == [[True]]
    assert evaluate("is.token.mask", half, {"c_min": rho, "c_max": 2})["keep"] == [[True]]
    with mp.workdps(60):
        below = rho * (1 - mpf(10) ** -50)
    assert evaluate("is.token.mask", half, {"c_min": None, "c_max": below})["keep"] == [[False]]


def test_geometric_weight_unchanged_when_sequence_repeated_but_product_collapses():
    old, mu = [-1.0, -2.0, -0.5], [-0.75, -1.875, -0.25]  # x = (-0.25, -0.125, -0.25)
    one = {"old_logprobs": [old], "sampler_logprobs": [mu], "mask": [[True] * 3]}
    many = {"old_logprobs": [old * 60], "sampler_logprobs": [mu * 60], "mask": [[True] * 180]}
    params = {"c_min": None, "c_max": 1e300}
    g1 = evaluate("is.geometric.truncate", one, params)["seq_weight"][0]
    g60 = evaluate("is.geometric.truncate", many, params)["seq_weight"][0]
    assert close(g1, g60, 55)
    p1 = evaluate("is.sequence.truncate", one, params)["seq_weight"][0]
    p60 = evaluate("is.sequence.truncate", many, params)["seq_weight"][0]
    with mp.workdps(60):
        assert close(p60, p1 ** 60, 50)
        assert close(p60, mp.exp(-37.5), 50)   # sum of 180 log-ratios = -37.5
    assert p60 < mpf(10) ** -16 and g1 > mpf("0.8")
    # with the default mask band [0.5, 5] the product drops the long sequence, the geometric mean keeps it
    assert evaluate("is.sequence.mask", many)["seq_keep"] == [False]
    assert evaluate("is.geometric.mask", many)["seq_keep"] == [True]


def test_log_ratio_clamp_applies_to_the_level_log_weight():
    inputs = {"old_logprobs": [[0.0, 0.0]], "sampler_logprobs": [[-15.0, -15.0]], "mask": [[True, True]]}
    tok = evaluate("is.token.mask", inputs, {"c_min": None, "c_max": 1e300, "log_ratio_clamp": 20})
    seq = evaluate("is.sequence.mask", inputs, {"c_min": None, "c_max": 1e300, "log_ratio_clamp": 20})
    with mp.workdps(60):
        assert tok["ratio"][0] == [mp.exp(15), mp.exp(15)]   # each token inside the clamp
        assert seq["seq_ratio"][0] == mp.exp(20)             # the sum 30 is clamped to 20
    trunc = evaluate("is.sequence.truncate", inputs, {"log_ratio_clamp": 20})
    assert trunc["seq_weight"] == [2]


def test_empty_sequence_has_weight_of_ratio_one():
    inputs = {"old_logprobs": [[-1.0, -2.0], [-1.0, 0.0]], "sampler_logprobs": [[-3.0, 0.0], [-2.0, 0.0]],
              "mask": [[False, False], [True, False]]}
    for fid in ("is.sequence.truncate", "is.geometric.truncate"):
        r = evaluate(fid, inputs, {"c_min": 1.5, "c_max": 2})
        assert r["seq_ratio"][0] == 1 and r["seq_weight"][0] == mpf("1.5") and r["weight"][0] == [None, None]
    for fid in ("is.sequence.mask", "is.geometric.mask"):
        assert evaluate(fid, inputs)["seq_keep"][0] is True
        assert evaluate(fid, inputs, {"c_min": 1.5, "c_max": 3})["seq_keep"][0] is False
    r = evaluate("is.reject", inputs, {"level": "seq_max", "estimator": "k1", "lower": 0.5, "upper": None})
    assert r["seq_stat"][0] == 0 and r["seq_keep"][0] is False


def test_reject_directions_follow_verl_and_areal():
    # rho = 0.5, k3 with upper 0.25: verl (mu_old) keeps (0.1931...), AReaL (old_mu) masks (0.3068...)
    inputs = inputs_from_ratios(["0.5"])
    verl = evaluate("is.reject", inputs, {"estimator": "k3", "level": "token", "upper": 0.25})
    areal = evaluate("is.reject", inputs, {"estimator": "k3", "level": "token", "upper": 0.25, "direction": "old_mu"})
    with mp.workdps(60):
        assert close(verl["token_stat"][0][0], mpf("0.5") - 1 + mp.log(2), 55) and verl["keep"] == [[True]]
        assert close(areal["token_stat"][0][0], 2 - 1 - mp.log(2), 55) and areal["keep"] == [[False]]
    # verl k1 'L_U' = '0.5_4.0' bounds k1 = -log rho, so rho = 3 is rejected (verl#6377)
    three = inputs_from_ratios(["3"])
    with mp.workdps(60):
        p = {"estimator": "k1", "level": "token", "lower": mp.log(mpf("0.5")), "upper": mp.log(4)}
    assert evaluate("is.reject", three, p)["keep"] == [[False]]
    # k2 is symmetric in the direction
    a = evaluate("is.reject", BASE, {"estimator": "k2", "level": "seq_sum", "upper": 1})
    b = evaluate("is.reject", BASE, {"estimator": "k2", "level": "seq_sum", "upper": 1, "direction": "old_mu"})
    assert a == b


def test_reject_k1_seq_mean_equals_geometric_sequence_mask():
    """verl's geo_rs (k1, seq_mean, '0.999_1.001') keeps exactly the sequences whose geometric ratio
    lies in [1/1.001, 1/0.999], i.e. mask.geometric_sequence with those bounds."""
    rng = random.Random(5)
    seen = set()
    for _ in range(40):
        B, T = 3, rng.randint(1, 10)
        old = random_logprobs(rng, B, T)
        mu = [[x + rng.choice([0.0, 0.0, 2.0 ** -10, -(2.0 ** -10), 2.0 ** -8]) for x in row] for row in old]
        inputs = {"old_logprobs": old, "sampler_logprobs": mu, "mask": random_mask(rng, B, T)}
        with mp.workdps(60):
            lo, hi = mp.log(mpf("0.999")), mp.log(mpf("1.001"))
            glo, ghi = 1 / mpf("1.001"), 1 / mpf("0.999")
        rs = evaluate("is.reject", inputs, {"estimator": "k1", "level": "seq_mean", "lower": lo, "upper": hi})
        gm = evaluate("mask.geometric_sequence", inputs, {"lower": glo, "upper": ghi})
        assert rs["seq_keep"] == gm["seq_keep"] and rs["keep"] == gm["keep"]
        seen.update(rs["seq_keep"])
    assert seen == {True, False}


def test_nan_and_inf_at_masked_positions_never_reach_results():
    nan, inf = float("nan"), float("inf")
    dirty = {"old_logprobs": [[-1.0, nan, inf], [-0.5, -inf, 0.0]],
             "sampler_logprobs": [[-2.0, -inf, nan], [-0.25, inf, nan]],
             "mask": [[True, False, False], [True, False, False]]}
    clean = {"old_logprobs": [[-1.0, 0.0, 0.0], [-0.5, 0.0, 0.0]],
             "sampler_logprobs": [[-2.0, 0.0, 0.0], [-0.25, 0.0, 0.0]], "mask": dirty["mask"]}
    for fid in WEIGHT_IDS:
        assert evaluate(fid, dirty) == evaluate(fid, clean)
    for level in ("token", "seq_sum", "seq_mean", "seq_max"):
        p = {"level": level, "upper": 1}
        assert evaluate("is.reject", dirty, p) == evaluate("is.reject", clean, p)


def test_errors_name_the_argument():
    with pytest.raises(SpecError, match="'c_min' must be <= 'c_max'.*c_min=3.*c_max=2"):
        evaluate("is.token.truncate", BASE, {"c_min": 3, "c_max": 2})
    with pytest.raises(SpecError, match="at least one of the parameters 'c_min' and 'c_max'"):
        evaluate("is.sequence.mask", BASE, {"c_min": None, "c_max": None})
    with pytest.raises(SpecError, match="parameter 'c_max' must be real in \\(0, \\+inf\\) or null"):
        evaluate("is.geometric.truncate", BASE, {"c_max": 0})
    with pytest.raises(SpecError, match="parameter 'c_min'"):
        evaluate("is.token.mask", BASE, {"c_min": -0.5})
    with pytest.raises(SpecError, match="parameter 'log_ratio_clamp'"):
        evaluate("is.token.mask", BASE, {"log_ratio_clamp": -20})
    with pytest.raises(SpecError, match="parameter 'estimator' must be one of 'k1', 'k2', 'k3', got 'k4'"):
        evaluate("is.reject", BASE, {"estimator": "k4"})
    with pytest.raises(SpecError, match="parameter 'level'"):
        evaluate("is.reject", BASE, {"level": "seq_min"})
    with pytest.raises(SpecError, match="'lower' must be <= 'upper'"):
        evaluate("is.reject", BASE, {"lower": 1, "upper": 0.5})
    with pytest.raises(SpecError, match="input 'sampler_logprobs' must have shape \\[B,T\\]"):
        evaluate("is.token.truncate", {**BASE, "sampler_logprobs": [[-1.0, -2.0]]})
    with pytest.raises(SpecError, match="missing input 'sampler_logprobs'"):
        evaluate("is.sequence.truncate", {"old_logprobs": OLD, "mask": MASK})
    with pytest.raises(SpecError, match="sampler_logprobs\\[0\\]\\[1\\] must be finite"):
        evaluate("is.token.mask", {**BASE, "sampler_logprobs": [[-1.0, float("nan"), 0.0, 0.0], MU[1]]})
    with pytest.raises(SpecError, match="unknown input\\(s\\) \\['logprobs'\\]"):
        evaluate("is.token.mask", {**BASE, "logprobs": OLD})


# An independent float64 implementation, written from the spec text alone -------------------

def np_level(old, mu, m, level):
    """(log-weight, its float64 relative error bound) per token [B,T] or per sequence [B]."""
    x = np.where(m, old - mu, 0.0)  # exact: differences of bf16 values are float64-representable
    L = m.sum(1)
    if level == "token":
        return x, np.zeros_like(x)
    s = x.sum(1)  # exact: a short sum of bf16-grid numbers in [-12, 12]
    if level == "sequence":
        return s, np.zeros_like(s)
    return np.where(L > 0, s / np.maximum(L, 1), 0.0), np.full(s.shape, EPS / 2)


def test_weights_agree_with_independent_float64_numpy():
    rng = random.Random(2024)
    for _ in range(25):
        B, T = rng.randint(1, 4), rng.randint(1, 12)
        old, mu, mask = random_logprobs(rng, B, T), random_logprobs(rng, B, T), random_mask(rng, B, T)
        inputs = {"old_logprobs": old, "sampler_logprobs": mu, "mask": mask}
        o, u, m = np.asarray(old), np.asarray(mu), np.asarray(mask)
        for level in ("token", "sequence", "geometric"):
            lw, lw_rel = np_level(o, u, m, level)
            rho = np.exp(lw)
            # exp adds <= 1 ulp; a relative error e in the log-weight becomes |lw| * e in rho
            tol = 2 * EPS + np.abs(lw) * lw_rel
            c_min, c_max = rng.choice([None, 0.25, 0.5]), rng.choice([0.75, 2.0, 5.0])
            lo = 0.0 if c_min is None else c_min
            trunc = np.clip(rho, lo, c_max)
            band = (rho >= lo) & (rho <= c_max)
            masked = np.where(band, rho, 0.0)
            rt = evaluate(f"is.{level}.truncate", inputs, {"c_min": c_min, "c_max": c_max})
            rm = evaluate(f"is.{level}.mask", inputs, {"c_min": c_min, "c_max": c_max})
            for i in range(B):
                for t in range(T):
                    if not mask[i][t]:
                        continue
                    k = (i, t) if level == "token" else i
                    got_t, got_m = float(rt["weight"][i][t]), float(rm["weight"][i][t])
                    assert math.isclose(got_t, trunc[k], rel_tol=tol[k], abs_tol=0)
                    near = min(abs(rho[k] - lo), abs(rho[k] - c_max)) <= tol[k] * rho[k]
                    if not near:  # the band decision is only compared away from float64 ties
                        assert rm["keep"][i][t] == bool(band[k])
                        assert math.isclose(got_m, masked[k], rel_tol=tol[k], abs_tol=0)


def np_divergence(u, estimator):
    """(d, relative error bound): k3 = expm1(u) - u loses |expm1 u| / k3 ulps to cancellation."""
    if estimator == "k1":
        return -u, np.zeros_like(u)
    if estimator == "k2":
        return u * u / 2, np.full(u.shape, EPS)
    e = np.expm1(u)
    d = e - u
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(d > 0, EPS * (1 + np.abs(e) / np.where(d > 0, d, 1)), 0.0)
    return d, rel


def test_reject_agrees_with_independent_float64_numpy():
    rng = random.Random(99)
    for _ in range(25):
        B, T = rng.randint(1, 4), rng.randint(1, 12)
        old, mask = random_logprobs(rng, B, T), random_mask(rng, B, T)
        mu = [[x + rng.choice([-1, 1]) * rng.choice([0.0, 2.0 ** -7, 2.0 ** -4, 0.5, 1.5]) for x in row] for row in old]
        inputs = {"old_logprobs": old, "sampler_logprobs": mu, "mask": mask}
        m = np.asarray(mask)
        for estimator in ("k1", "k2", "k3"):
            for direction in ("mu_old", "old_mu"):
                s = 1.0 if direction == "mu_old" else -1.0
                u = np.where(m, s * (np.asarray(old) - np.asarray(mu)), 0.0)
                d, rel = np_divergence(u, estimator)
                for level in ("token", "seq_sum", "seq_mean", "seq_max"):
                    upper = rng.choice([0.01, 0.05, 0.2, 1.0])
                    lower = -upper if estimator == "k1" else None
                    r = evaluate("is.reject", inputs, {"estimator": estimator, "direction": direction,
                                                       "level": level, "lower": lower, "upper": upper})
                    for i in range(B):
                        ts = [t for t in range(T) if mask[i][t]]
                        for t in ts:
                            assert math.isclose(float(r["token_stat"][i][t]), d[i, t], rel_tol=rel[i, t], abs_tol=0)
                        if level == "token":
                            stats = {t: (d[i, t], abs(d[i, t]) * rel[i, t]) for t in ts}
                        else:
                            terms = d[i, ts]
                            # a float64 sum of n terms adds <= (n - 1) EPS/2 times the sum of |terms|
                            err = float(np.sum(np.abs(terms) * rel[i, ts])) + len(ts) * EPS * float(np.sum(np.abs(terms)))
                            if level == "seq_sum":
                                D = float(terms.sum())
                            elif level == "seq_mean":
                                D = float(terms.sum()) / len(ts) if ts else 0.0
                                err = err / max(len(ts), 1) + abs(D) * EPS
                            else:
                                D = float(terms.max()) if ts else 0.0
                                err = float(np.max(np.abs(terms) * rel[i, ts])) if ts else 0.0
                            assert abs(float(r["seq_stat"][i]) - D) <= err
                            stats = {t: (D, err) for t in ts}
                        for t, (D, err) in stats.items():
                            if min(abs(D - upper), abs(D - (lower if lower is not None else -1e300))) > err:
                                keep = D <= upper and (lower is None or D >= lower)
                                assert r["keep"][i][t] == keep


# The untruncated weight (both bounds null in the truncate mode; NeMo-RL PR #2269) -----------------

@pytest.mark.parametrize("fid", ["is.token.truncate", "is.sequence.truncate", "is.geometric.truncate"])
def test_untruncated_weight_is_the_raw_ratio(fid):
    out = evaluate(fid, BASE, {"c_min": None, "c_max": None})
    ratio = out["ratio"] if "ratio" in out else out["seq_ratio"]
    weight = out["weight"] if "ratio" in out else out["seq_weight"]
    assert weight == ratio
    # the documented equivalent: a lower bound of 0 cannot bind (rho > 0)
    zero = evaluate(fid, BASE, {"c_min": 0, "c_max": None})
    assert zero["weight"] == out["weight"]


def test_untruncated_sequence_weight_is_exp_of_the_sum():
    out = evaluate("is.sequence.truncate", BASE, {"c_min": None, "c_max": None})
    with mp.workdps(60):
        for i, row in enumerate(MASK):
            u = mp.fsum(mpf(OLD[i][t]) - mpf(MU[i][t]) for t in range(4) if row[t])
            assert abs(out["seq_weight"][i] - mp.exp(u)) <= mp.exp(u) * mpf(10) ** -55


@pytest.mark.parametrize("fid", ["is.token.mask", "is.sequence.mask", "is.geometric.mask"])
def test_a_mask_still_needs_a_bound(fid):
    with pytest.raises(SpecError, match="at least one of the parameters 'c_min' and 'c_max'.*truncate"):
        evaluate(fid, BASE, {"c_min": None, "c_max": None})


def test_geometric_weight_is_never_farther_from_one_than_the_product():
    """spec/is.md (is-length): |log w_geo| = |u_seq| / L_i <= |u_seq| = |log w_seq| for every sequence with
    L_i >= 1 (untruncated, no clamp), with equality only when L_i = 1 or u_seq = 0; and at L_i >= 2 with
    u_seq != 0 strictly closer (NeMo-RL #2269: exp(mean) stays near 1 where exp(sum) collapses)."""
    rng = random.Random(2269)
    params = {"c_min": None, "c_max": None}
    strict = 0
    for _ in range(40):
        B, T = 3, 7
        mask = random_mask(rng, B, T)
        old, sampler = random_logprobs(rng, B, T, lo=-4.0), random_logprobs(rng, B, T, lo=-4.0)
        inputs = {"old_logprobs": old, "sampler_logprobs": sampler, "mask": mask}
        seq = evaluate("is.sequence.truncate", inputs, params)["seq_weight"]
        geo = evaluate("is.geometric.truncate", inputs, params)["seq_weight"]
        with mp.workdps(60):
            for i in range(B):
                L = sum(mask[i])
                if L == 0:
                    assert seq[i] == geo[i] == 1
                    continue
                a, b = abs(mp.log(geo[i])), abs(mp.log(seq[i]))
                assert abs(a * L - b) <= mpf(10) ** -50 * (1 + b)
                if L >= 2 and b > mpf(10) ** -30:
                    assert a < b
                    strict += 1
    assert strict > 50
