"""Tests of the adv family: published anchors, invariances, degenerate groups, precision and an
independent float64 check."""

from __future__ import annotations

import random

import numpy as np
import pytest
from mpmath import mp, mpf

from helpers import bf16_round, check_precision
from pgspec.reference import REGISTRY, SpecError, evaluate

IDS = ["adv.group_normalized", "adv.group_centered", "adv.batch_normalized"]
ANCHOR = {"rewards": [1.0, 1.0, 1.0, 0.0], "group_ids": [0, 0, 0, 0]}
MIXED = {
    "rewards": [1.0, 0.0, 0.5, 0.75, 1.0, 0.25, 0.25, -2.0, 3.5, 0.125],
    "group_ids": [4, 4, 9, 9, 4, -1, -1, 9, 12, 4],
}
TIGHT = 10 ** -55


def adv(fid, inputs, params=None, dps=60):
    return evaluate(fid, inputs, params, dps=dps)["advantages"]


def close(a, b, tol=TIGHT):
    with mp.workdps(60):
        return abs(mpf(a) - mpf(b)) <= tol * max(1, abs(mpf(b)))


# Published anchors (anchors_conformance_papers.md, GRPO secondary example) ------------------------

def test_anchor_population_std():
    a = adv("adv.group_normalized", ANCHOR)
    with mp.workdps(60):
        assert all(close(x, 1 / mp.sqrt(3)) for x in a[:3]) and close(a[3], -mp.sqrt(3))
    assert [mp.nstr(x, 10) for x in a] == ["0.5773502692"] * 3 + ["-1.732050808"]


def test_anchor_bessel_std():
    assert adv("adv.group_normalized", ANCHOR, {"std": "bessel"}) == [mpf("0.5")] * 3 + [mpf("-1.5")]


def test_eps_placement_differs_and_agrees_at_zero_eps():
    with mp.workdps(60):
        sigma, e = mp.sqrt(mpf("0.1875")), mpf("1e-4")
        on_std = adv("adv.group_normalized", ANCHOR, {"eps": "1e-4"})
        on_var = adv("adv.group_normalized", ANCHOR, {"eps": "1e-4", "eps_placement": "variance"})
        assert close(on_std[0], mpf("0.25") / (sigma + e)) and close(on_std[3], mpf("-0.75") / (sigma + e))
        assert close(on_var[0], mpf("0.25") / mp.sqrt(sigma ** 2 + e))
        assert abs(on_std[0] - on_var[0]) > mpf("1e-5")
    assert adv("adv.group_normalized", MIXED, {"eps_placement": "variance"}) == adv("adv.group_normalized", MIXED)


def test_framework_eps_values():
    # TRL: Bessel + 1e-4; verl: Bessel + 1e-6
    trl = adv("adv.group_normalized", ANCHOR, {"std": "bessel", "eps": "1e-4"})
    verl = adv("adv.group_normalized", ANCHOR, {"std": "bessel", "eps": "1e-6"})
    with mp.workdps(60):
        assert close(trl[0], mpf("0.25") / mpf("0.5001")) and close(verl[3], mpf("-0.75") / mpf("0.500001"))


# Degenerate groups ----------------------------------------------------------------------------

def test_singleton_groups():
    inputs = {"rewards": [2.5, 1.0, 0.0], "group_ids": [5, 6, 6]}
    for std in ("population", "bessel"):
        a = adv("adv.group_normalized", inputs, {"std": std})
        assert a[0] == 0
        v = adv("adv.group_normalized", inputs, {"std": std, "eps": "1e-6", "singleton": "mean0_std1"})
        with mp.workdps(60):
            assert close(v[0], mpf("2.5") / mpf("1.000001"))  # verl/SkyRL: R / (1 + eps)
        w = adv("adv.group_normalized", inputs, {"std": std, "eps": "1e-6", "singleton": "mean0_std1",
                                                 "eps_placement": "variance"})
        with mp.workdps(60):
            assert close(w[0], mpf("2.5") / mp.sqrt(mpf("1.000001")))
    assert adv("adv.group_centered", inputs) == [0, mpf("0.5"), mpf("-0.5")]
    assert adv("adv.group_centered", inputs, {"singleton": "mean0_std1"}) == [mpf("2.5"), mpf("0.5"), mpf("-0.5")]


@pytest.mark.parametrize("fid", IDS)
@pytest.mark.parametrize("std", ["population", "bessel"])
@pytest.mark.parametrize("eps", [0, "1e-6"])
def test_identical_reward_groups_get_zero(fid, std, eps):
    # decimal 0.1 at 60 digits: (x + x + x) / 3 != x after rounding, so a rounded mean would leak
    # a numerator of ~1e-62 (and, with eps = 0, a std of ~1e-62: advantages of order 1)
    for r in (0.1, "0.1"):
        inputs = {"rewards": [r, r, r, 1.0, 0.0, 0.7, 0.7], "group_ids": [1, 1, 1, 2, 2, 3, 3]}
        params = {} if fid == "adv.group_centered" else {"std": std, "eps": eps}
        a = adv(fid, inputs, params)
        assert a[:3] == [0, 0, 0] and a[5:] == [0, 0]
        assert a[3] > 0 > a[4]


@pytest.mark.parametrize("fid", ["adv.group_normalized", "adv.batch_normalized"])
def test_all_identical_batch_with_zero_eps_is_zero_not_nan(fid):
    for placement in ("std", "variance"):
        a = adv(fid, {"rewards": [3.0, 3.0, 3.0, 3.0], "group_ids": [0, 0, 1, 1]}, {"eps_placement": placement})
        assert a == [0, 0, 0, 0]


def test_batch_normalized_degenerate_batches():
    one = {"rewards": [2.0], "group_ids": [0]}
    assert adv("adv.batch_normalized", one, {"std": "bessel", "singleton": "mean0_std1"}) == [0]
    assert adv("adv.batch_normalized", one, {"singleton": "mean0_std1"}) == [0]  # sigma 0, eps 0
    assert adv("adv.batch_normalized", one, {"singleton": "mean0_std1", "eps": "0.5"}) == [4]
    for fid in IDS:
        assert adv(fid, {"rewards": [], "group_ids": []}) == []


# Identities -------------------------------------------------------------------------------------

@pytest.mark.parametrize("std", ["population", "bessel"])
def test_group_moments_at_zero_eps(std):
    a = adv("adv.group_normalized", MIXED, {"std": std})
    with mp.workdps(60):
        for g in set(MIXED["group_ids"]):
            members = [i for i, x in enumerate(MIXED["group_ids"]) if x == g]
            assert abs(mp.fsum(a[i] for i in members)) < mpf(10) ** -55
            if len({MIXED["rewards"][i] for i in members}) < 2:
                assert all(a[i] == 0 for i in members)  # a singleton, or identical rewards
                continue
            want = len(members) - (1 if std == "bessel" else 0)
            assert close(mp.fsum(a[i] ** 2 for i in members), want)


def test_group_centered_sums_to_zero_and_relates_to_normalized():
    c = adv("adv.group_centered", MIXED)
    n = adv("adv.group_normalized", MIXED, {"eps": "0.01"})
    with mp.workdps(60):
        for g in set(MIXED["group_ids"]):
            members = [i for i, x in enumerate(MIXED["group_ids"]) if x == g]
            assert abs(mp.fsum(c[i] for i in members)) < mpf(10) ** -55
            rs = [mpf(MIXED["rewards"][i]) for i in members]
            if len(rs) > 1:
                mu = mp.fsum(rs) / len(rs)
                sigma = mp.sqrt(mp.fsum((r - mu) ** 2 for r in rs) / len(rs))
                for i in members:
                    assert close(n[i] * (sigma + mpf("0.01")), c[i])


def test_affine_invariance_of_normalized_advantages():
    scaled = {"rewards": [3 * r - 7 for r in MIXED["rewards"]], "group_ids": MIXED["group_ids"]}
    for fid in ("adv.group_normalized", "adv.batch_normalized"):
        for std in ("population", "bessel"):
            a, b = adv(fid, MIXED, {"std": std}), adv(fid, scaled, {"std": std})
            assert all(close(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("fid", IDS)
def test_permutation_and_relabelling_invariance(fid):
    rng = random.Random(7)
    base = adv(fid, MIXED)
    for _ in range(5):
        perm = list(range(len(MIXED["rewards"])))
        rng.shuffle(perm)
        labels = {g: rng.randint(-10 ** 12, 10 ** 12) for g in set(MIXED["group_ids"])}
        shuffled = {
            "rewards": [MIXED["rewards"][k] for k in perm],
            "group_ids": [labels[MIXED["group_ids"][k]] for k in perm],
        }
        got = adv(fid, shuffled, {} if fid == "adv.group_centered" else {"std": "bessel", "eps": "1e-4"})
        want = adv(fid, MIXED, {} if fid == "adv.group_centered" else {"std": "bessel", "eps": "1e-4"})
        assert got == [want[k] for k in perm]
    assert base == adv(fid, MIXED)


def test_batch_normalized_single_group_equals_group_normalized_and_scalerl_definition():
    inputs = {"rewards": MIXED["rewards"], "group_ids": [0] * len(MIXED["rewards"])}
    for std in ("population", "bessel"):
        for eps in (0, "1e-3"):
            p = {"std": std, "eps": eps}
            assert all(close(x, y) for x, y in zip(adv("adv.batch_normalized", inputs, p),
                                                   adv("adv.group_normalized", inputs, p)))
    # ScaleRL: A = C / std(all C); with several groups, the batch mean of C is 0
    c = adv("adv.group_centered", MIXED)
    a = adv("adv.batch_normalized", MIXED)
    with mp.workdps(60):
        rms = mp.sqrt(mp.fsum(x ** 2 for x in c) / len(c))
        assert all(close(x, y / rms) for x, y in zip(a, c))


def test_batch_normalized_trl_variant_uses_the_reward_std():
    a = adv("adv.batch_normalized", MIXED, {"std_of": "rewards", "std": "bessel", "eps": "1e-4"})
    c = adv("adv.group_centered", MIXED)
    with mp.workdps(60):
        rs = [mpf(r) for r in MIXED["rewards"]]
        mu = mp.fsum(rs) / len(rs)
        sigma = mp.sqrt(mp.fsum((r - mu) ** 2 for r in rs) / (len(rs) - 1))
        assert all(close(x, y / (sigma + mpf("1e-4"))) for x, y in zip(a, c))


def test_no_differentiable_inputs_are_declared():
    for fid in IDS:
        assert REGISTRY[fid].differentiable == () and REGISTRY[fid].grad_of is None
        assert evaluate(fid, MIXED)["grad"] == {}


# Precision ------------------------------------------------------------------------------------

EXTREME = {
    "rewards": [1.0, 1.0 + 2.0 ** -20, 1.0 - 2.0 ** -20, 200.0, -200.0, 0.5, 1e-30, -1e-30, 1e30],
    "group_ids": [0, 0, 0, 1, 1, 1, 2, 2, 3],
}


@pytest.mark.parametrize("fid", IDS)
def test_precision_60_vs_100_digits(fid):
    params_list = [None] if fid == "adv.group_centered" else [
        None, {"std": "bessel", "eps": "1e-4"}, {"eps": "1e-6", "eps_placement": "variance", "singleton": "mean0_std1"},
    ]
    if fid == "adv.batch_normalized":
        params_list.append({"std_of": "rewards", "std": "bessel"})
    for params in params_list:
        check_precision(fid, MIXED, params)
        check_precision(fid, EXTREME, params)


def test_tiny_differences_are_resolved_exactly():
    # rewards 1 and 1 + 2^-40: advantages are exactly +-1 (population), however small the spread
    a = adv("adv.group_normalized", {"rewards": [1.0, 1.0 + 2.0 ** -40], "group_ids": [3, 3]})
    assert a == [-1, 1]


# Errors -----------------------------------------------------------------------------------------

def test_errors_name_the_argument():
    with pytest.raises(SpecError, match="'std'"):
        evaluate("adv.group_normalized", ANCHOR, {"std": "sample"})
    with pytest.raises(SpecError, match="'eps'"):
        evaluate("adv.group_normalized", ANCHOR, {"eps": -1e-6})
    with pytest.raises(SpecError, match="'eps_placement'"):
        evaluate("adv.batch_normalized", ANCHOR, {"eps_placement": "inside"})
    with pytest.raises(SpecError, match="'singleton'"):
        evaluate("adv.group_centered", ANCHOR, {"singleton": "one"})
    with pytest.raises(SpecError, match="'std_of'"):
        evaluate("adv.batch_normalized", ANCHOR, {"std_of": "logits"})
    with pytest.raises(SpecError, match="unknown parameter"):
        evaluate("adv.group_centered", ANCHOR, {"std": "bessel"})
    with pytest.raises(SpecError, match="'group_ids' must have shape"):
        evaluate("adv.group_normalized", {"rewards": [1.0, 0.0], "group_ids": [0, 0, 1]})
    with pytest.raises(SpecError, match=r"group_ids\[1\] must be an integer"):
        evaluate("adv.group_normalized", {"rewards": [1.0, 0.0], "group_ids": [0, 0.5]})
    with pytest.raises(SpecError, match=r"group_ids\[0\] must be an integer"):
        evaluate("adv.group_normalized", {"rewards": [1.0, 0.0], "group_ids": [True, 0]})
    with pytest.raises(SpecError, match=r"rewards\[1\] must be finite"):
        evaluate("adv.group_normalized", {"rewards": [1.0, float("nan")], "group_ids": [0, 0]})
    with pytest.raises(SpecError, match="missing input 'group_ids'"):
        evaluate("adv.batch_normalized", {"rewards": [1.0]})


# An independent float64 implementation, written from the spec text alone -------------------
def np_advantages(rewards, group_ids, ddof, eps, placement, singleton, std_of):
    """(group-normalized, group-centered, batch-normalized, per-row group sigma, batch sigma)."""
    r = np.asarray(rewards, dtype=np.float64)
    g = np.asarray(group_ids)
    centered = np.zeros_like(r)
    sigma = np.zeros_like(r)
    for label in np.unique(g):
        sel = g == label
        if sel.sum() == 1:
            centered[sel], sigma[sel] = (0.0, 0.0) if singleton == "zero" else (r[sel], 1.0)
        else:
            centered[sel] = r[sel] - r[sel].mean()
            sigma[sel] = r[sel].std(ddof=ddof)

    def divide(x, s):
        den = s + eps if placement == "std" else np.sqrt(s * s + eps)
        return np.where(den == 0, 0.0, x / np.where(den == 0, 1.0, den))

    normalized = divide(centered, sigma)
    pooled = centered if std_of == "centered" else r
    if len(r) <= ddof:
        return normalized, centered, np.zeros_like(r), sigma, np.nan
    sb = pooled.std(ddof=ddof)
    return normalized, centered, divide(centered, sb), sigma, sb


def test_agrees_with_independent_float64_numpy():
    rng = random.Random(99)
    u = 2.0 ** -53
    for case in range(24):
        n_groups = rng.randint(1, 5)
        rewards, gids = [], []
        for k in range(n_groups):
            size = rng.choice([1, 2, 3, 4, 8])
            kind = rng.random()
            for _ in range(size):
                # bf16 rewards: binary, identical, or continuous
                rewards.append(float(rng.randint(0, 1)) if kind < 0.3 else 0.5 if kind < 0.4
                               else bf16_round(rng.uniform(-3.0, 3.0)))
                gids.append(k * 17 - 5)
        std = ["population", "bessel"][case % 2]
        eps = [0.0, 1e-4, 1e-6][case % 3]
        placement = ["std", "variance"][(case // 2) % 2]
        singleton = ["zero", "mean0_std1"][(case // 4) % 2]
        std_of = ["centered", "rewards"][(case // 3) % 2]
        normalized, centered, batch, sigma, sb = np_advantages(
            rewards, gids, 1 if std == "bessel" else 0, eps, placement, singleton, std_of)
        inputs = {"rewards": rewards, "group_ids": gids}
        rn = adv("adv.group_normalized", inputs,
                 {"std": std, "eps": eps, "eps_placement": placement, "singleton": singleton})
        rc = adv("adv.group_centered", inputs, {"singleton": singleton})
        rb = adv("adv.batch_normalized", inputs, {"std": std, "eps": eps, "eps_placement": placement,
                                                   "singleton": singleton, "std_of": std_of})
        rmax = max(abs(x) for x in rewards)
        n = len(rewards)
        for i in range(n):
            # centered: the float64 mean of <= 8 bf16 values has one rounding (the sums are exact),
            # the subtraction another: |error| <= 2 u |R|max.
            assert abs(float(rc[i]) - centered[i]) <= 2 * u * rmax
            # normalized: the numerator's absolute error 2 u |R|max over the divisor, plus the divisor's
            # relative error (sum of <= 8 squares, division, sqrt, eps add: <= 12 u) times |A|.
            den = sigma[i] + eps if placement == "std" else np.sqrt(sigma[i] ** 2 + eps)
            if den > 0:
                tol = 2 * u * rmax / den + 12 * u * abs(normalized[i])
                assert abs(float(rn[i]) - normalized[i]) <= tol, (case, i)
            else:
                assert rn[i] == 0
            # batch: the same with n terms in the batch std: <= (n + 6) u relative.
            bden = sb + eps if placement == "std" else np.sqrt(sb ** 2 + eps)
            if np.isfinite(bden) and bden > 0:
                tol = 2 * u * rmax / bden + (n + 6) * u * abs(batch[i])
                assert abs(float(rb[i]) - batch[i]) <= tol, (case, i)
            else:
                assert rb[i] == 0
