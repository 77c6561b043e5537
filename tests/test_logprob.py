"""Tests of the logprob family: identities, gradients, precision and an independent float64 check."""

from __future__ import annotations

import random

import numpy as np
import pytest
from mpmath import mp, mpf

from helpers import bf16_round, check_gradient_fd, check_precision, random_mask
from pgspec.reference import SpecError, evaluate

LOGITS = [
    [[1.5, -0.25, 0.75, -2.0], [0.5, 0.5, -1.0, 3.0], [2.0, 1.0, 0.0, -1.0]],
    [[-0.5, 4.0, 1.25, 0.0], [-3.0, -1.5, 2.5, 0.125], [9.0, 9.0, 9.0, 9.0]],
]
TARGETS = [[0, 3, 2], [1, 2, -100]]
MASK = [[True, True, True], [True, True, False]]
TOKEN = {"logits": LOGITS, "targets": TARGETS, "mask": MASK}
ENTROPY = {"logits": LOGITS, "mask": MASK}
IDS = ["logprob.token", "logprob.entropy"]
BASE = {"logprob.token": TOKEN, "logprob.entropy": ENTROPY}
PARAM_SETS = [
    None,
    {"temperature": "0.7"},
    {"temperature": "1.3", "logit_scale": "0.5", "softcap": "2.5"},
    {"logit_scale": 3, "softcap": 4},
]


def _with_logits(fid, logits, targets=None, mask=None):
    mask = mask or [[True] * len(logits[0]) for _ in logits]
    inputs = {"logits": logits, "mask": mask}
    if fid == "logprob.token":
        inputs["targets"] = targets
    return inputs


# Gradients ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("params", PARAM_SETS)
@pytest.mark.parametrize("fid", IDS)
def test_gradient_matches_finite_difference(fid, params):
    # 5 unmasked positions x V = 4 logits each
    assert check_gradient_fd(fid, BASE[fid], params) == 20


def _closed_form(row, target, T, s, c):
    """p, l, H and both gradients from the spec's closed forms (mpmath, written independently)."""
    zs = [mpf(z) * s for z in row]
    capd = [zs_ if c is None else c * mp.tanh(zs_ / c) for zs_ in zs]
    dcap = [1 if c is None else 1 / mp.cosh(zs_ / c) ** 2 for zs_ in zs]
    zp = [x / T for x in capd]
    lse = mp.log(mp.fsum(mp.exp(x) for x in zp))
    logp = [x - lse for x in zp]
    p = [mp.exp(x) for x in logp]
    H = -mp.fsum(pv * lv for pv, lv in zip(p, logp))
    g_tok = [((1 if v == target else 0) - p[v]) * s / T * dcap[v] for v in range(len(row))]
    g_ent = [-p[v] * (logp[v] + H) * s / T * dcap[v] for v in range(len(row))]
    return logp[target], H, g_tok, g_ent


@pytest.mark.parametrize("params", PARAM_SETS)
def test_values_and_gradients_match_closed_forms(params):
    p = {"temperature": 1, "logit_scale": 1, "softcap": None, **(params or {})}
    tok = evaluate("logprob.token", TOKEN, params)
    ent = evaluate("logprob.entropy", ENTROPY, params)
    with mp.workdps(60):
        T, s = mpf(p["temperature"]), mpf(p["logit_scale"])  # decimal strings: convert at 60 digits
        c = None if p["softcap"] is None else mpf(p["softcap"])
        for i, row in enumerate(MASK):
            for t, m in enumerate(row):
                if not m:
                    continue
                l, H, g_tok, g_ent = _closed_form(LOGITS[i][t], TARGETS[i][t], T, s, c)
                tol = mpf(10) ** -55
                assert abs(tok["logprobs"][i][t] - l) <= tol * max(1, abs(l))
                assert abs(ent["entropy"][i][t] - H) <= tol * max(1, abs(H))
                for v in range(4):
                    assert abs(tok["grad"]["logits"][i][t][v] - g_tok[v]) <= tol
                    assert abs(ent["grad"]["logits"][i][t][v] - g_ent[v]) <= tol


# Identities and anchors ------------------------------------------------------------------------

@pytest.mark.parametrize("params", PARAM_SETS)
def test_uniform_logits_give_log_one_over_v_and_entropy_log_v(params):
    V = 5
    logits = [[[0.375] * V, [-7.0] * V]]
    tok = evaluate("logprob.token", _with_logits("logprob.token", logits, [[0, 4]]), params)
    ent = evaluate("logprob.entropy", _with_logits("logprob.entropy", logits), params)
    with mp.workdps(60):
        for t in range(2):
            assert abs(tok["logprobs"][0][t] + mp.log(V)) < mpf(10) ** -58
            assert abs(ent["entropy"][0][t] - mp.log(V)) < mpf(10) ** -58
            # entropy is maximal at uniform logits: zero gradient
            assert all(abs(g) < mpf(10) ** -58 for g in ent["grad"]["logits"][0][t])


def test_gradients_sum_to_zero_over_the_vocabulary_without_transform():
    tok = evaluate("logprob.token", TOKEN)
    ent = evaluate("logprob.entropy", ENTROPY)
    with mp.workdps(60):
        for r in (tok, ent):
            for i, row in enumerate(MASK):
                for t, m in enumerate(row):
                    g = r["grad"]["logits"][i][t]
                    assert abs(mp.fsum(g)) < mpf(10) ** -55
                    if not m:
                        assert g == [0, 0, 0, 0]
    # the token gradient is onehot - softmax: its target entry is 1 - p_y = 1 - exp(l)
    with mp.workdps(60):
        assert abs(tok["grad"]["logits"][0][0][0] - (1 - mp.exp(tok["logprobs"][0][0]))) < mpf(10) ** -55


def test_probabilities_sum_to_one_over_targets():
    row = LOGITS[1][0]
    for params in PARAM_SETS:
        ls = [
            evaluate("logprob.token", _with_logits("logprob.token", [[row]], [[y]]), params)["logprobs"][0][0]
            for y in range(4)
        ]
        with mp.workdps(60):
            assert abs(mp.fsum(mp.exp(l) for l in ls) - 1) < mpf(10) ** -55


def test_large_temperature_flattens_the_distribution():
    logits = [[[3.0, -1.0, 0.5, 2.0]]]
    gaps, ents = [], []
    for T in ("1", "10", "1000", "1e8"):
        lp = evaluate("logprob.token", _with_logits("logprob.token", logits, [[0]]), {"temperature": T})
        h = evaluate("logprob.entropy", _with_logits("logprob.entropy", logits), {"temperature": T})
        with mp.workdps(60):
            gaps.append(abs(lp["logprobs"][0][0] + mp.log(4)))
            ents.append(mp.log(4) - h["entropy"][0][0])
    assert gaps == sorted(gaps, reverse=True) and ents == sorted(ents, reverse=True)
    # at T = 1e8 the logits differ by at most 4e-8 after the division
    assert gaps[-1] < mpf(10) ** -7 and 0 <= ents[-1] < mpf(10) ** -14


def test_shift_invariance_without_softcap_and_temperature_equals_inverse_scale():
    logits = [[[1.0, -0.5, 2.25]]]
    shifted = [[[101.0, 99.5, 102.25]]]
    a = evaluate("logprob.token", _with_logits("logprob.token", logits, [[1]]), {"temperature": "0.5"})
    b = evaluate("logprob.token", _with_logits("logprob.token", shifted, [[1]]), {"temperature": "0.5"})
    c = evaluate("logprob.token", _with_logits("logprob.token", logits, [[1]]), {"logit_scale": 2})
    with mp.workdps(60):
        assert abs(a["logprobs"][0][0] - b["logprobs"][0][0]) < mpf(10) ** -55
        assert abs(a["logprobs"][0][0] - c["logprobs"][0][0]) < mpf(10) ** -55


def test_softcap_is_applied_after_the_scale_and_before_the_temperature():
    row, s, c, T = [6.0, -2.0, 1.0], mpf(2), mpf(3), mpf("0.5")
    r = evaluate("logprob.token", _with_logits("logprob.token", [[row]], [[0]]),
                 {"logit_scale": 2, "softcap": 3, "temperature": "0.5"})
    with mp.workdps(60):
        def lsm(zp):
            return zp[0] - mp.log(mp.fsum(mp.exp(x) for x in zp))
        spec_order = lsm([c * mp.tanh(s * z / c) / T for z in row])
        temperature_first = lsm([c * mp.tanh(s * z / T / c) for z in row])
        assert abs(r["logprobs"][0][0] - spec_order) < mpf(10) ** -55
        assert abs(spec_order - temperature_first) > mpf("0.1")


def test_ties_at_the_maximum():
    logits = [[[3.0, 3.0, 0.0]]]
    for y in (0, 1):
        r = evaluate("logprob.token", _with_logits("logprob.token", logits, [[y]]))
        with mp.workdps(60):
            want = 3 - mp.log(2 * mp.exp(3) + 1)
            assert abs(r["logprobs"][0][0] - want) < mpf(10) ** -55
            p = mp.exp(3) / (2 * mp.exp(3) + 1)
            assert abs(r["grad"]["logits"][0][0][y] - (1 - p)) < mpf(10) ** -55
            assert abs(r["grad"]["logits"][0][0][1 - y] + p) < mpf(10) ** -55


def test_single_entry_vocabulary():
    tok = evaluate("logprob.token", _with_logits("logprob.token", [[[5.0]]], [[0]]))
    ent = evaluate("logprob.entropy", _with_logits("logprob.entropy", [[[5.0]]]))
    assert tok["logprobs"] == [[0]] and ent["entropy"] == [[0]]
    assert tok["grad"]["logits"] == [[[0]]] and ent["grad"]["logits"] == [[[0]]]


def test_nearly_deterministic_entropy_is_exact():
    # H = log1p(e^-200) + 200 e^-200 / (1 + e^-200): no cancellation in the reference
    r = evaluate("logprob.entropy", _with_logits("logprob.entropy", [[[0.0, -200.0]]]))
    with mp.workdps(100):
        e = mp.exp(-200)
        want = mp.log1p(e) + 200 * e / (1 + e)
        assert abs(r["entropy"][0][0] / want - 1) < mpf(10) ** -55


# Precision ------------------------------------------------------------------------------------

EXTREME = [
    [[200.0, -200.0, 0.0, 20.0], [1.0, 1.0 + 2.0 ** -20, 1.0 - 2.0 ** -20, 1.0]],
    [[-1e4, 1e4, 0.0, -20.0], [30.0, -30.0, 1000.0, -1000.0]],
]


@pytest.mark.parametrize("params", PARAM_SETS + [{"softcap": 5}, {"temperature": "1e-3"}])
@pytest.mark.parametrize("fid", IDS)
def test_precision_60_vs_100_digits(fid, params):
    check_precision(fid, BASE[fid], params)
    extreme = {"logits": EXTREME, "mask": [[True, True], [True, True]]}
    if fid == "logprob.token":
        extreme["targets"] = [[1, 0], [0, 3]]
    check_precision(fid, extreme, params)


def test_softcap_gradient_at_saturation_has_no_cancellation():
    # d/dz 5 tanh(z/5) at z = 1000 is sech^2(200) ~ 4 e^-400; 1 - tanh^2 would give 0 at 60 digits
    r = evaluate("logprob.token", _with_logits("logprob.token", [[[1000.0, 0.0]]], [[1]]), {"softcap": 5})
    with mp.workdps(100):
        p0 = mp.exp(5 * mp.tanh(200)) / (mp.exp(5 * mp.tanh(200)) + 1)
        want = -p0 / mp.cosh(200) ** 2
        assert want != 0 and abs(r["grad"]["logits"][0][0][0] / want - 1) < mpf(10) ** -55


# Masks and errors -------------------------------------------------------------------------------

def test_nan_and_inf_at_masked_positions_never_reach_results():
    bad = [[[1.0, 2.0, 0.5], [float("nan"), float("inf"), float("-inf")]]]
    clean = [[[1.0, 2.0, 0.5], [0.0, 0.0, 0.0]]]
    mask = [[True, False]]
    for params in PARAM_SETS:
        for fid in IDS:
            a = evaluate(fid, _with_logits(fid, bad, [[1, 12345]], mask), params)
            b = evaluate(fid, _with_logits(fid, clean, [[1, -100]], mask), params)
            assert a == b
            assert a[next(k for k in a if k != "grad")][0][1] is None


def test_all_masked_batch():
    for fid in IDS:
        r = evaluate(fid, _with_logits(fid, [[[1.0, 2.0]]], [[7]], [[False]]))
        assert r["grad"]["logits"] == [[[0, 0]]]


def test_errors_name_the_argument():
    for bad in (0, -1, "-0.5"):
        with pytest.raises(SpecError, match="'temperature'"):
            evaluate("logprob.token", TOKEN, {"temperature": bad})
    with pytest.raises(SpecError, match="'logit_scale'"):
        evaluate("logprob.entropy", ENTROPY, {"logit_scale": 0})
    with pytest.raises(SpecError, match="'softcap'"):
        evaluate("logprob.entropy", ENTROPY, {"softcap": -2})
    with pytest.raises(SpecError, match=r"targets\[0\]\[1\] must be a token id in \[0, V\) = \[0, 4\).*got 4"):
        evaluate("logprob.token", {**TOKEN, "targets": [[0, 4, 2], [1, 2, 0]]})
    with pytest.raises(SpecError, match=r"targets\[1\]\[0\].*got -1"):
        evaluate("logprob.token", {**TOKEN, "targets": [[0, 3, 2], [-1, 2, 0]]})
    with pytest.raises(SpecError, match=r"targets\[0\]\[0\] must be an integer"):
        evaluate("logprob.token", {**TOKEN, "targets": [[1.0, 3, 2], [1, 2, 0]]})
    with pytest.raises(SpecError, match="'mask' must have shape"):
        evaluate("logprob.entropy", {"logits": LOGITS, "mask": [[True, True], [True, True]]})
    with pytest.raises(SpecError, match="V >= 1"):
        evaluate("logprob.entropy", {"logits": [[[]]], "mask": [[True]]})
    with pytest.raises(SpecError, match=r"logits\[0\]\[0\]\[1\] must be finite"):
        evaluate("logprob.token", {"logits": [[[0.0, float("inf")]]], "targets": [[0]], "mask": [[True]]})
    with pytest.raises(SpecError, match="missing input 'targets'"):
        evaluate("logprob.token", ENTROPY)
    with pytest.raises(SpecError, match="unknown parameter"):
        evaluate("logprob.token", TOKEN, {"tau": 1})


# An independent float64 implementation, written from the spec text alone -------------------
def np_transform(z, T, s, c):
    x = z * s
    if c is not None:
        x = c * np.tanh(x / c)
    return x / T


def np_logprob_entropy(logits, targets, T, s, c):
    zp = np_transform(np.asarray(logits, dtype=np.float64), T, s, c)
    mx = zp.max(axis=-1, keepdims=True)
    lse = mx[..., 0] + np.log(np.exp(zp - mx).sum(axis=-1))
    logp = zp - lse[..., None]
    p = np.exp(logp)
    H = -(p * logp).sum(axis=-1)
    lp = np.take_along_axis(logp, np.asarray(targets)[..., None], axis=-1)[..., 0]
    return lp, H, np.abs(zp).max(axis=-1)


def test_agrees_with_independent_float64_numpy():
    rng = random.Random(4321)
    for case in range(16):
        B, T, V = rng.randint(1, 3), rng.randint(1, 5), rng.randint(2, 9)
        logits = [[[bf16_round(rng.uniform(-8.0, 8.0)) for _ in range(V)] for _ in range(T)] for _ in range(B)]
        targets = [[rng.randrange(V) for _ in range(T)] for _ in range(B)]
        mask = random_mask(rng, B, T)
        temp = [1.0, 0.75, 1.25][case % 3]
        scale = [1.0, 0.5, 2.0][case % 3]
        cap = [None, 10.0, 3.0][case % 3]
        params = {"temperature": temp, "logit_scale": scale, "softcap": cap}
        lp, H, zmax = np_logprob_entropy(logits, targets, temp, scale, cap)
        tok = evaluate("logprob.token", {"logits": logits, "targets": targets, "mask": mask}, params)
        ent = evaluate("logprob.entropy", {"logits": logits, "mask": mask}, params)
        for i in range(B):
            for t in range(T):
                if not mask[i][t]:
                    assert tok["logprobs"][i][t] is None and ent["entropy"][i][t] is None
                    continue
                # Each z' carries <= 4 roundings (scale, tanh, cap multiply, division), i.e. an absolute
                # error <= 4 u |z'|; shifting by the max doubles it; the sum of V exponentials and the
                # log add <= (V + 2) u relative to log's argument (>= 1), i.e. absolute. The entropy sums
                # V products p_v * log p_v with |log p_v| <= 2 zmax + log V. Bound: 16 (zmax + V) u.
                u = 2.0 ** -53
                tol = 16 * (zmax[i, t] + V) * u
                assert abs(float(tok["logprobs"][i][t]) - lp[i, t]) <= tol
                assert abs(float(ent["entropy"][i][t]) - H[i, t]) <= tol * (1 + 2 * V)
