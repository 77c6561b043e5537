"""Tests of the kl family: Schulman's moments, the DeepSeek-V3.2 gradient identity, clamps,
gradients, precision, and an independent float64 implementation."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from mpmath import mp, mpf

from helpers import check_gradient_fd, check_precision, random_logprobs, random_mask
from pgspec.reference import SpecError, evaluate

LP = [[-1.0, -2.5, -0.375, -4.0], [-0.5, -3.0, -1.25, -2.0]]
REF = [[-1.25, -0.5, -0.625, -3.5], [-3.0, -0.75, -1.0, -2.5]]
OLD = [[-1.5, -2.25, -0.5, -3.0], [-0.25, -3.5, -1.0, -2.25]]
MASK = [[True, True, True, False], [True, True, False, False]]
# x = REF - LP = [[-0.25, 2.0, -0.25, .], [-2.5, 2.25, ., .]]: no x at 0 (the kink of abs)
BASE = {"logprobs": LP, "ref_logprobs": REF, "mask": MASK}
BASE_OLD = {**BASE, "old_logprobs": OLD}
PLAIN = ["kl.k1", "kl.k2", "kl.k3", "kl.abs"]
IDS = PLAIN + ["kl.k3_straight_through", "kl.k3_unbiased"]
# clamps that bind at some tokens of BASE (x = 2.0, 2.25, -2.5 are outside [-2, 1.5]) but are not
# hit exactly, and output bounds that bind for some estimators
CLAMPS = {"log_ratio_min": -2, "log_ratio_max": 1.5, "output_min": -0.2, "output_max": 0.5}
VERL_K3 = {"log_ratio_min": -20, "log_ratio_max": 20, "output_min": -10, "output_max": 10}


def inputs_for(fid, base=None):
    base = base or BASE_OLD
    if fid == "kl.k3_unbiased":
        return dict(base)
    return {k: v for k, v in base.items() if k != "old_logprobs"}


def x_of(lp, ref):
    with mp.workdps(60):
        return mpf(ref) - mpf(lp)


# gradients ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fid", PLAIN + ["kl.k3_unbiased"])
@pytest.mark.parametrize("params", [None, CLAMPS], ids=["no-clamp", "clamped"])
def test_gradient_matches_finite_difference(fid, params):
    p = dict(params or {})
    if fid == "kl.k3_unbiased" and params:
        p["sg_ratio_where_clamped"] = False  # no stop-gradient anywhere: FD applies everywhere
    assert check_gradient_fd(fid, inputs_for(fid), p) == 5


def test_unbiased_gradient_closed_form_with_stopped_ratio():
    """Where the input clamp binds and sg_ratio_where_clamped is true the gradient is exactly 0;
    elsewhere it is d/dl [w k3(x)] = w (k3(x) - (e^x - 1)) = w (l - l_ref) (no output clamp)."""
    params = {"log_ratio_min": -2, "log_ratio_max": 1.5}
    r = evaluate("kl.k3_unbiased", BASE_OLD, params)
    with mp.workdps(60):
        for i, row in enumerate(MASK):
            for t, m in enumerate(row):
                g = r["grad"]["logprobs"][i][t]
                if not m:
                    assert g == 0 and r["kl"][i][t] is None
                    continue
                x = x_of(LP[i][t], REF[i][t])
                w = mp.exp(mpf(LP[i][t]) - mpf(OLD[i][t]))
                if -2 <= x <= 1.5:
                    assert abs(g - w * (mpf(LP[i][t]) - mpf(REF[i][t]))) <= mpf(10) ** -55 * abs(g)
                else:
                    assert g == 0
                    xc = min(max(x, mpf(-2)), mpf(1.5))
                    assert abs(r["kl"][i][t] - w * (mp.exp(xc) - 1 - xc)) <= mpf(10) ** -55 * r["kl"][i][t]


@pytest.mark.parametrize("params", [None, CLAMPS, VERL_K3])
def test_straight_through_value_is_k3_and_gradient_is_k2(params):
    st = evaluate("kl.k3_straight_through", BASE, params)
    v3 = evaluate("kl.k3", BASE, params)
    v2 = evaluate("kl.k2", BASE)  # the gradient is that of the unclamped k2
    assert st["kl"] == v3["kl"]
    assert st["grad"]["logprobs"] == v2["grad"]["logprobs"]
    for i, row in enumerate(MASK):
        for t, m in enumerate(row):
            if m:
                assert st["grad"]["logprobs"][i][t] == mpf(LP[i][t]) - mpf(REF[i][t])


def test_on_policy_unbiased_is_k3_value_with_k2_gradient():
    """l_old = l (NeMo-RL's exp(l - sg l), TRL's first iteration): value k3, gradient l - l_ref."""
    r = evaluate("kl.k3_unbiased", {**BASE, "old_logprobs": LP})
    assert r["kl"] == evaluate("kl.k3", BASE)["kl"]
    assert r["grad"]["logprobs"] == evaluate("kl.k3_straight_through", BASE)["grad"]["logprobs"]


# precision --------------------------------------------------------------------------------------
EXTREME_LP = [[0.0, -200.0, -1.0, -1.0, 0.0, -20.0, -3.0]]
EXTREME_REF = [[-200.0, 0.0, -1.0 + 2.0 ** -20, -1.0 - 2.0 ** -30, -20.0, 0.0, -3.0 + 2.0 ** -30]]
EXTREME_OLD = [[-200.0, 0.0, -1.0, -1.0 + 2.0 ** -20, 20.0, -20.0 - 2.0 ** -30, 0.0]]
EXTREME = {"logprobs": EXTREME_LP, "ref_logprobs": EXTREME_REF, "old_logprobs": EXTREME_OLD,
           "mask": [[True] * 7]}


@pytest.mark.parametrize("fid", IDS)
def test_precision_60_vs_100_digits(fid):
    for base in (BASE_OLD, EXTREME):
        for params in (None, CLAMPS, VERL_K3):
            check_precision(fid, inputs_for(fid, base), params)


def test_k3_at_tiny_log_ratio_is_exact():
    """x = 2^-30: k3 = x^2/2 + x^3/6 + ..., every digit right at 60 and at 100 digits."""
    x = 2.0 ** -30
    inputs = {"logprobs": [[-1.0, -1.0]], "ref_logprobs": [[-1.0 + x, -1.0 - x]], "mask": [[True, True]]}
    check_precision("kl.k3", inputs)
    check_precision("kl.k3_unbiased", {**inputs, "old_logprobs": [[-1.0 - x, -1.0 + x]]})
    for dps in (60, 100):
        r = evaluate("kl.k3", inputs, dps=dps)
        with mp.workdps(dps + 20):
            for k, s in enumerate((1, -1)):
                xs = s * mpf(2) ** -30
                series = mp.fsum(xs ** n / mp.factorial(n) for n in range(2, 12))
                assert abs(r["kl"][0][k] - series) <= series * mpf(10) ** -(dps - 2)
                assert abs(r["grad"]["logprobs"][0][k] + mp.expm1(xs)) <= abs(xs) * mpf(10) ** -(dps - 2)
    assert r["kl"][0][0] > 0 and r["kl"][0][1] > 0


# k3 >= 0 and clamps ----------------------------------------------------------------------------------
def test_k3_is_nonnegative_for_all_inputs():
    from pgspec.reference.kl import k3

    xs = [mpf(s) * mpf(2) ** e for s in (1, -1) for e in range(-200, 9)] + [mpf(0)]
    rng = random.Random(7)
    xs += [mpf(rng.uniform(-300, 300)) for _ in range(200)]
    with mp.workdps(60):
        assert all(k3(x) >= 0 for x in xs)
        assert k3(mpf(0)) == 0
    rng = random.Random(8)
    lp, ref, old = (random_logprobs(rng, 4, 16, lo=-30.0, hi=0.0) for _ in range(3))
    mask = [[True] * 16] * 4
    for fid in ("kl.k3", "kl.k3_straight_through", "kl.k3_unbiased"):
        for params in (None, VERL_K3):
            r = evaluate(fid, {"logprobs": lp, "ref_logprobs": ref, "old_logprobs": old, "mask": mask}
                         if fid == "kl.k3_unbiased" else {"logprobs": lp, "ref_logprobs": ref, "mask": mask}, params)
            assert all(v >= 0 for row in r["kl"] for v in row)


@pytest.mark.parametrize("fid", IDS)
def test_clamps_are_respected(fid):
    rng = random.Random(sum(map(ord, fid)))
    lp, ref, old = (random_logprobs(rng, 3, 12, lo=-12.0, hi=0.0) for _ in range(3))
    mask = [[True] * 12] * 3
    inputs = inputs_for(fid, {"logprobs": lp, "ref_logprobs": ref, "old_logprobs": old, "mask": mask})
    a, b, c, d = -2, 1.5, -0.75, 0.875
    r = evaluate(fid, inputs, {"log_ratio_min": a, "log_ratio_max": b, "output_min": c, "output_max": d})
    free = evaluate(fid, inputs)
    pre = evaluate(fid, inputs, {"log_ratio_min": a, "log_ratio_max": b})  # before the output clamp
    bound_hits = 0
    for i in range(3):
        for t in range(12):
            y, g = r["kl"][i][t], r["grad"]["logprobs"][i][t]
            assert c <= y <= d
            x = x_of(lp[i][t], ref[i][t])
            outside = not (a <= x <= b) or not (c <= pre["kl"][i][t] <= d)
            if fid == "kl.k3_straight_through":
                assert g == mpf(lp[i][t]) - mpf(ref[i][t])  # clamps never touch the k2 gradient
            elif outside:
                assert g == 0
                bound_hits += 1
            if a <= x <= b and c < free["kl"][i][t] < d:
                assert y == free["kl"][i][t]  # inside every bound the clamps change nothing
    assert fid == "kl.k3_straight_through" or bound_hits > 0


def test_openrlhf_one_sided_input_clamp_and_verl_conformance_vector():
    """Research conformance vector 6 and OpenRLHF's k3 input bound x <= 10 (lambda >= -10) only."""
    inputs = {"logprobs": [[-1.0, -2.0, -30.0, 0.0]], "ref_logprobs": [[-1.5, -1.0, -0.5, -40.0]], "mask": [[True] * 4]}
    expect = {
        ("kl.k1", None): ["0.5", "-1", "-29.5", "40"],
        ("kl.k1", "orlhf"): ["0.5", "-1", "-10", "10"],
        ("kl.k2", None): ["0.125", "0.5", "435.125", "800"],
        ("kl.k2", "orlhf"): ["0.125", "0.5", "10", "10"],
        ("kl.k3", "verl"): ["0.10653065971", "0.71828182846", "10", "10"],
        ("kl.k3", "orlhf"): ["0.10653065971", "0.71828182846", "10", "10"],
    }
    orlhf = {"output_min": -10, "output_max": 10}
    for (fid, which), want in expect.items():
        params = {"verl": VERL_K3, "orlhf": dict(orlhf, **({"log_ratio_max": 10} if fid == "kl.k3" else {})),
                  None: None}[which]
        got = evaluate(fid, inputs, params)["kl"][0]
        assert [mp.nstr(v, 11) for v in got] == [mp.nstr(mpf(w), 11) for w in want], (fid, which)
    # x = -10.5 is below OpenRLHF's pre-exp bound's reach: k3(-10.5) = 9.5 + e^-10.5, kept (< 10)
    r = evaluate("kl.k3", {"logprobs": [[0.0]], "ref_logprobs": [[-10.5]], "mask": [[True]]},
                 dict(orlhf, log_ratio_max=10))
    with mp.workdps(60):
        assert abs(r["kl"][0][0] - (mpf("9.5") + mp.exp(mpf("-10.5")))) < mpf(10) ** -55
        assert abs(r["grad"]["logprobs"][0][0] - (1 - mp.exp(mpf("-10.5")))) < mpf(10) ** -55
    # a symmetric bound of 10 would give k3(-10) = 9 + e^-10 instead
    s = evaluate("kl.k3", {"logprobs": [[0.0]], "ref_logprobs": [[-10.5]], "mask": [[True]]},
                 dict(orlhf, log_ratio_min=-10, log_ratio_max=10))
    assert s["kl"][0][0] < r["kl"][0][0] and s["grad"]["logprobs"][0][0] == 0


# Schulman's Gaussian example ------------------------------------------------------------------------
@pytest.mark.parametrize("mu", ["0.1", "1"])
def test_schulman_gaussian_bias_and_sd_closed_forms(mu):
    """q = N(0,1), p = N(mu,1), z ~ q, log r = mu z - mu^2/2, true KL(q||p) = mu^2/2.

    Moments by quadrature of the reference's own per-element estimators against the closed forms,
    then the normalized table of anchors_conformance_papers.md."""
    from pgspec.reference.kl import k1, k2, k3

    with mp.workdps(40):
        m = mpf(mu)
        kl = m ** 2 / 2

        def moments(k):
            def pdf_times(f):
                return lambda z: f(k(m * z - m ** 2 / 2)) * mp.exp(-z * z / 2) / mp.sqrt(2 * mp.pi)
            mean = mp.quad(pdf_times(lambda v: v), [-mp.inf, 0, mp.inf])
            second = mp.quad(pdf_times(lambda v: v * v), [-mp.inf, 0, mp.inf])
            return mean - kl, mp.sqrt(second - mean ** 2)

        tol = mpf(10) ** -28
        b1, s1 = moments(k1)
        b2, s2 = moments(k2)
        b3, s3 = moments(k3)
        assert abs(b1) < tol and abs(s1 - m) < tol
        assert abs(b2 - m ** 4 / 8) < tol
        assert abs(s2 ** 2 - (m ** 6 / 4 + m ** 4 / 2)) < tol
        assert abs(b3) < tol
        assert abs(s3 ** 2 - (mp.exp(m ** 2) - 1 - m ** 2)) < tol
        table = {"0.1": ("0", "20.000", "0.0025", "1.4177", "0", "1.4166"),
                 "1": ("0", "2.000", "0.25", "1.7321", "0", "1.6950")}[mu]
        got = (b1 / kl, s1 / kl, b2 / kl, s2 / kl, b3 / kl, s3 / kl)
        for g, want in zip(got, table):
            decimals = len(want.split(".")[1]) if "." in want else 0
            assert abs(g - mpf(want)) <= mpf(10) ** -decimals / 2, (mu, mp.nstr(g, 10), want)


# DeepSeek-V3.2 unbiased-KL identity ------------------------------------------------------------------
def _categorical(logits):
    lse = mp.log(mp.fsum(mp.exp(v) for v in logits))
    return [v - lse for v in logits]


def test_deepseek_unbiased_kl_gradient_identity():
    """6 outcomes, y ~ pi_old, exact sums.  With the ratio differentiated:
    E_old[(pi/pi_old) k3] = KL(pi||ref) and E_old[grad] = grad KL(pi||ref); with the ratio
    stopped, E_old[grad] = grad KL(ref||pi).  On-policy, E_pi[grad k3] = grad KL(ref||pi) and
    E_pi[grad k3+] = grad KL(pi||ref).  Gradients are taken w.r.t. the logits theta of pi via
    d l_y / d theta_j = [y = j] - pi_j."""
    with mp.workdps(60):
        l = _categorical([mpf(v) for v in ("0.3", "-1.2", "0.9", "0.0", "-0.4", "1.5")])
        l_old = _categorical([mpf(v) for v in ("0.1", "-0.8", "1.1", "-0.3", "-0.2", "1.0")])
        l_ref = _categorical([mpf(v) for v in ("-0.5", "0.4", "0.2", "0.7", "-1.0", "0.6")])
        pi, pi_old, pi_ref = ([mp.exp(v) for v in ls] for ls in (l, l_old, l_ref))
        kl_fwd = mp.fsum(p * (a - b) for p, a, b in zip(pi, l, l_ref))        # KL(pi || ref)
        grad_fwd = [pi[j] * (l[j] - l_ref[j] - kl_fwd) for j in range(6)]      # d/d theta_j
        grad_rev = [pi[j] - pi_ref[j] for j in range(6)]                       # d KL(ref||pi) / d theta_j

    def expected_theta_grad(weights, g):
        return [mp.fsum(weights[y] * g[y] * ((1 if y == j else 0) - pi[j]) for y in range(6)) for j in range(6)]

    inputs = {"logprobs": [l], "ref_logprobs": [l_ref], "old_logprobs": [l_old], "mask": [[True] * 6]}
    unb = evaluate("kl.k3_unbiased", inputs)
    k3 = evaluate("kl.k3", {k: v for k, v in inputs.items() if k != "old_logprobs"})
    st = evaluate("kl.k3_straight_through", {k: v for k, v in inputs.items() if k != "old_logprobs"})
    tol = mpf(10) ** -50
    with mp.workdps(60):
        assert abs(mp.fsum(p * v for p, v in zip(pi_old, unb["kl"][0])) - kl_fwd) < tol
        live = expected_theta_grad(pi_old, unb["grad"]["logprobs"][0])
        assert all(abs(a - b) < tol for a, b in zip(live, grad_fwd))
        w = [mp.exp(a - b) for a, b in zip(l, l_old)]
        detached = expected_theta_grad(pi_old, [w[y] * k3["grad"]["logprobs"][0][y] for y in range(6)])
        assert all(abs(a - b) < tol for a, b in zip(detached, grad_rev))
        assert max(abs(a - b) for a, b in zip(detached, grad_fwd)) > mpf("0.01")  # really different
        on_policy_k3 = expected_theta_grad(pi, k3["grad"]["logprobs"][0])
        assert all(abs(a - b) < tol for a, b in zip(on_policy_k3, grad_rev))
        on_policy_st = expected_theta_grad(pi, st["grad"]["logprobs"][0])
        assert all(abs(a - b) < tol for a, b in zip(on_policy_st, grad_fwd))


# masks and errors ---------------------------------------------------------------------------------
def test_nan_and_inf_at_masked_positions_never_reach_results():
    mask = [[True, False, False]]
    dirty = {"logprobs": [[-1.0, float("nan"), float("inf")]], "ref_logprobs": [[-2.0, float("-inf"), float("nan")]],
             "old_logprobs": [[-1.5, float("inf"), float("-inf")]], "mask": mask}
    clean = {"logprobs": [[-1.0, 0.0, 0.0]], "ref_logprobs": [[-2.0, 0.0, 0.0]],
             "old_logprobs": [[-1.5, 0.0, 0.0]], "mask": mask}
    for fid in IDS:
        for params in (None, VERL_K3):
            r = evaluate(fid, inputs_for(fid, dirty), params)
            assert r == evaluate(fid, inputs_for(fid, clean), params)
            assert r["kl"][0][1:] == [None, None] and r["grad"]["logprobs"][0][1:] == [0, 0]


def test_all_masked_batch_gives_nulls_and_zero_gradient():
    for fid in IDS:
        r = evaluate(fid, inputs_for(fid, {**BASE_OLD, "mask": [[False] * 4] * 2}))
        assert r["kl"] == [[None] * 4] * 2 and r["grad"]["logprobs"] == [[0] * 4] * 2


def test_errors_name_the_argument():
    with pytest.raises(SpecError, match="'log_ratio_min' must be less than 'log_ratio_max'.*got log_ratio_min=1"):
        evaluate("kl.k3", BASE, {"log_ratio_min": 1, "log_ratio_max": -1})
    with pytest.raises(SpecError, match="'output_min' must be less than 'output_max'"):
        evaluate("kl.k1", BASE, {"output_min": 10, "output_max": 10})
    with pytest.raises(SpecError, match="kl.k3_unbiased: parameter 'sg_ratio_where_clamped' must be true or false"):
        evaluate("kl.k3_unbiased", BASE_OLD, {"sg_ratio_where_clamped": 1})
    with pytest.raises(SpecError, match="parameter 'output_max' must be real"):
        evaluate("kl.k2", BASE, {"output_max": "ten"})
    with pytest.raises(SpecError, match="parameter 'log_ratio_max' must be real.*finite"):
        evaluate("kl.k3", BASE, {"log_ratio_max": float("inf")})
    with pytest.raises(SpecError, match="missing input 'old_logprobs'"):
        evaluate("kl.k3_unbiased", BASE)
    with pytest.raises(SpecError, match="unknown input\\(s\\) \\['old_logprobs'\\]"):
        evaluate("kl.k3", BASE_OLD)
    with pytest.raises(SpecError, match="ref_logprobs.*shape"):
        evaluate("kl.abs", {**BASE, "ref_logprobs": [[-1.0]]})
    with pytest.raises(SpecError, match="ref_logprobs\\[0\\]\\[1\\] must be finite"):
        evaluate("kl.k3_straight_through", {**BASE, "ref_logprobs": [[-1.0, float("inf"), -1.0, -1.0], REF[1]]})
    with pytest.raises(SpecError, match="unknown parameter\\(s\\) \\['clamp'\\]"):
        evaluate("kl.k3", BASE, {"clamp": 20})


# An independent float64 implementation, written from the spec text alone ---------------------------
U = 2.0 ** -53
_INV_FACT = [1.0 / math.factorial(n) for n in range(21)]


def np_k3(x):
    """e^x - 1 - x: Horner on the Taylor series (n = 2..20) for |x| < 1, expm1(x) - x otherwise."""
    x = np.asarray(x, dtype=np.float64)
    series = np.zeros_like(x)
    for n in range(20, 1, -1):
        series = series * x + _INV_FACT[n]
    series = series * x * x
    return np.where(np.abs(x) < 1, series, np.expm1(x) - x)


def np_clip(v, lo, hi):
    """(clipped value, 1 where the derivative passes: inside the closed interval)."""
    lo_ = -np.inf if lo is None else lo
    hi_ = np.inf if hi is None else hi
    return np.clip(v, lo_, hi_), ((v >= lo_) & (v <= hi_)).astype(np.float64)


def np_kl(fid, lp, ref, old, a=None, b=None, c=None, d=None, sg_clamped=True):
    """(value, d value / d logprobs) of every kl formula in float64."""
    lp, ref = np.asarray(lp, np.float64), np.asarray(ref, np.float64)
    x = ref - lp
    xc, pass_in = np_clip(x, a, b)
    if fid == "kl.k1":
        k, dk = -xc, -np.ones_like(x)
    elif fid == "kl.k2":
        k, dk = xc * xc / 2, xc
    elif fid == "kl.abs":
        k, dk = np.abs(xc), np.sign(xc)
    else:
        k, dk = np_k3(xc), np.expm1(xc)
    if fid == "kl.k3_straight_through":
        return np_clip(k, c, d)[0], -x
    if fid == "kl.k3_unbiased":
        w = np.exp(lp - np.asarray(old, np.float64))
        y, pass_out = np_clip(w * k, c, d)
        dw = np.where((pass_in == 0) & sg_clamped, 0.0, w * k)
        return y, pass_out * (dw - w * dk * pass_in)
    y, pass_out = np_clip(k, c, d)
    return y, -pass_out * pass_in * dk


# relative tolerances, from the operation counts (inputs are bfloat16, so x = l_ref - l is exact):
#  k1, k2, abs, and every straight-through gradient -x: exact (x has at most 17 significant bits,
#      x*x at most 34, halving is exact);
#  k3: Horner over 19 coefficients (each rounded) on |x| < 1, the alternating sum cancelling at most
#      a factor 2: <= 64 u; expm1(x) - x for |x| >= 1 cancels at most a factor 4.4 (x = -1): <= 16 u;
#  d k3 / d l = -expm1(x): libm expm1 within 2 u;
#  k3_unbiased: exp (2 u) times k3 (64 u) plus one product: <= 128 u; its gradient
#      w k3 - w expm1(x) = -w x in exact arithmetic, computed as a difference of two rounded terms
#      of size up to |w expm1(x)|: bounded relative to |w| * (|k3| + |expm1 x|) * 128 u.
TOL = {"value": {"kl.k1": 0, "kl.k2": 0, "kl.abs": 0, "kl.k3": 64 * U, "kl.k3_straight_through": 64 * U,
                 "kl.k3_unbiased": 128 * U},
       "grad": {"kl.k1": 0, "kl.k2": 0, "kl.abs": 0, "kl.k3": 2 * U, "kl.k3_straight_through": 0}}


@pytest.mark.parametrize("fid", IDS)
def test_agrees_with_independent_float64_numpy(fid):
    rng = random.Random(4321)
    for case in range(24):
        B, T = rng.randint(1, 4), rng.randint(1, 12)
        lp, ref, old = random_logprobs(rng, B, T), random_logprobs(rng, B, T), random_logprobs(rng, B, T)
        mask = random_mask(rng, B, T)
        params = [{}, {"log_ratio_min": -2.5, "log_ratio_max": 3.0},
                  {"output_min": -1.5, "output_max": 2.0},
                  {"log_ratio_min": -2.5, "log_ratio_max": 3.0, "output_min": -1.5, "output_max": 2.0}][case % 4]
        if fid == "kl.k3_unbiased" and case % 8 >= 4:
            params = dict(params, sg_ratio_where_clamped=False)
        r = evaluate(fid, inputs_for(fid, {"logprobs": lp, "ref_logprobs": ref, "old_logprobs": old, "mask": mask}),
                     params)
        sg_clamped = params.get("sg_ratio_where_clamped", True)
        bounds = {k: v for k, v in params.items() if k != "sg_ratio_where_clamped"}
        y, g = np_kl(fid, lp, ref, old, bounds.get("log_ratio_min"), bounds.get("log_ratio_max"),
                     bounds.get("output_min"), bounds.get("output_max"), sg_clamped)
        for i in range(B):
            for t in range(T):
                if not mask[i][t]:
                    assert r["kl"][i][t] is None and r["grad"]["logprobs"][i][t] == 0
                    continue
                ref_y, ref_g = float(r["kl"][i][t]), float(r["grad"]["logprobs"][i][t])
                tv = TOL["value"][fid]
                assert ref_y == y[i, t] if tv == 0 else math.isclose(ref_y, y[i, t], rel_tol=tv), (fid, case, i, t)
                if fid == "kl.k3_unbiased":
                    x = ref[i][t] - lp[i][t]
                    w = math.exp(lp[i][t] - old[i][t])
                    scale = w * (abs(float(np_k3(x))) + abs(math.expm1(x))) * 128 * U
                    assert abs(ref_g - g[i, t]) <= scale, (fid, case, i, t, ref_g, g[i, t])
                else:
                    tg = TOL["grad"][fid]
                    assert ref_g == g[i, t] if tg == 0 else math.isclose(ref_g, g[i, t], rel_tol=tg), (fid, case, i, t)
