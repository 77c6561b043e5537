"""Golden cases of the is family (spec/is.md).

Every weight here is built from x = l^old - l^mu.  Keep flags are compared exactly, so every
threshold below sits far (many bfloat16 roundings) from the statistic it is compared with, except
in the cases whose slug says ``boundary`` (the statistic equals the bound exactly, in every dtype)
or ``near-bound-bf16`` (the statistic lies within one bfloat16 rounding of the bound: float64 and
float32 decide as the reference does, bfloat16 rounds onto the bound and cannot).
"""

from __future__ import annotations

from .case import Case, Generated, random_inputs

FIELDS = ("old_logprobs", "sampler_logprobs", "mask")

# x = (0.5, 0): token ratios e^0.5 = 1.6487212707 and 1; product e^0.5; geometric mean e^0.25 = 1.2840254167
TWO = {"old_logprobs": [[-1.0, -2.0]], "sampler_logprobs": [[-1.5, -2.0]], "mask": [[True, True]]}
# x row 1 = (0.25, -0.5, 0.125 | masked), row 2 = (0, -0.25 | masked, masked)
OLD = [[-1.0, -2.5, -0.375, -4.0], [-0.5, -3.0, -1.25, -2.0]]
MU = [[-1.25, -2.0, -0.5, -3.5], [-0.5, -2.75, -1.0, -2.5]]
MASK = [[True, True, True, False], [True, True, False, False]]
PADDED = {"old_logprobs": OLD, "sampler_logprobs": MU, "mask": MASK}
# the spec's worked example of the sequence levels: x row 1 = (0.5, 0, -0.25), row 2 = (1, 1 | masked)
SPEC_SEQ = {"old_logprobs": [[-1.0, -2.0, -0.5], [0.0, 0.0, -3.0]],
            "sampler_logprobs": [[-1.5, -2.0, -0.25], [-1.0, -1.0, -3.0]],
            "mask": [[True, True, True], [True, True, False]]}
# the spec's worked example of the token level: x = (0.5, 0, -0.25 | masked)
SPEC_TOK = {"old_logprobs": [[-1.0, -2.0, -0.5, 0.0]], "sampler_logprobs": [[-1.5, -2.0, -0.25, 0.0]],
            "mask": [[True, True, True, False]]}
# one x per sequence, each sequence two tokens long (the second token has x = 0)
def _pair(a, b):
    return {"old_logprobs": [[a, -1.0], [b, -1.0]], "sampler_logprobs": [[b, -1.0], [a, -1.0]],
            "mask": [[True, True], [True, True]]}


X20 = _pair(0.0, -20.0)     # x = (20, 0) and (-20, 0)
X200 = _pair(0.0, -200.0)   # x = (200, 0) and (-200, 0)
ON_POLICY = {"old_logprobs": OLD, "sampler_logprobs": OLD, "mask": MASK}
EMPTY = {"old_logprobs": OLD, "sampler_logprobs": MU, "mask": [MASK[0], [False] * 4]}
ALL_MASKED = {"old_logprobs": OLD, "sampler_logprobs": MU, "mask": [[False] * 4, [False] * 4]}
DIRTY = {"old_logprobs": [[-1.0, "nan", "inf", -0.5]], "sampler_logprobs": [[-2.0, "-inf", "nan", -0.25]],
         "mask": [[True, False, False, True]]}   # unmasked x = (1, -0.25)
# x = 2^-9: rho = e^(2^-9) = 1.0019550 rounds to 1 in bfloat16, as does the bound 1.001
NEAR_BF16 = {"old_logprobs": [[-0.25]], "sampler_logprobs": [[-0.251953125]], "mask": [[True]]}
# x = -2^-20 and 2^-20: e^x - 1 - x = 2^-41 (1 -+ 2^-20 / 3): cancels catastrophically if written as such
TINY = {"old_logprobs": [[-(2.0 ** -20), 0.0, -1.0]], "sampler_logprobs": [[0.0, -(2.0 ** -20), -1.0]],
        "mask": [[True, True, True]]}


def _collapse():
    """Two sequences of 160 tokens with a constant x: -0.5625 (sum -90, e^-90 = 8.2e-40, a float32
    subnormal) and -0.84375 (sum -135, e^-135 = 2.3e-59, 0 in float32 and bfloat16)."""
    return {"old_logprobs": [[-1.0] * 160, [-1.0] * 160],
            "sampler_logprobs": [[-0.4375] * 160, [-0.15625] * 160],
            "mask": [[True] * 160, [True] * 160]}


def _coarse_random(seed, B, T, lengths):
    """Random inputs on a coarse grid (x a multiple of 1/8 in [-1.5, 1.5]) so that keep flags
    can be decided far from every bound: from the documented generator, l^mu = l - x with
    l = -(1 + m/128) 2^-e and x = (below(25) - 12) / 8."""
    from ..generator import SplitMix64, logprob_value

    rng = SplitMix64(seed)
    old, mu = [], []
    for _b in range(B):
        o_row, s_row = [], []
        for _t in range(T):
            lp = logprob_value(rng.below(3), rng.below(8) * 16)   # -(1 + k/8) 2^-e, e < 3
            x = (rng.below(25) - 12) / 8
            o_row.append(lp)
            s_row.append(lp - x)
        old.append(o_row)
        mu.append(s_row)
    return {"old_logprobs": old, "sampler_logprobs": mu, "mask": [[t < n for t in range(T)] for n in lengths]}


TOKEN_IDS = ("is.token.truncate", "is.token.mask")
TRUNC_IDS = ("is.token.truncate", "is.sequence.truncate", "is.geometric.truncate")
MASK_IDS = ("is.token.mask", "is.sequence.mask", "is.geometric.mask")


def _weight_cases(fid):
    level = fid.split(".")[1]
    mode = fid.split(".")[2]
    out = []
    # examples --------------------------------------------------------------------------------
    if level == "token":
        if mode == "truncate":
            out += [
                Case(f"{fid}/two-tokens", fid, "example",
                     "x = (0.5, 0): rho = (e^0.5, 1) = (1.6487212707, 1); the default C_max = 2 truncates nothing",
                     TWO),
                Case(f"{fid}/spec-example", fid, "example",
                     "x = (0.5, 0, -0.25), C_max = 1.5: w = (1.5, 1, e^-0.25 = 0.77880078307); the ratio below 1 "
                     "is not raised (one-sided TIS)", SPEC_TOK, {"c_max": 1.5}),
                Case(f"{fid}/two-sided", fid, "example",
                     "x = (0.25, -0.5, 0.125 | -), (0, -0.25): rho = (1.2840, 0.60653, 1.1331), (1, 0.77880); "
                     "C_min = 0.7, C_max = 1.2: w = (1.2, 0.7, 1.1331), (1, 0.77880)", PADDED,
                     {"c_min": "0.7", "c_max": "1.2"}),
            ]
        else:
            out += [
                Case(f"{fid}/two-tokens", fid, "example",
                     "x = (0.5, 0): rho = (1.6487212707, 1), both inside the IcePop band [0.5, 5]: kept with their "
                     "raw weights", TWO),
                Case(f"{fid}/spec-example", fid, "example",
                     "x = (0.5, 0, -0.25), band [0.5, 1.5]: rho = 1.6487 is dropped (weight 0), 1 and 0.77880 kept",
                     SPEC_TOK, {"c_min": 0.5, "c_max": 1.5}),
                Case(f"{fid}/padded-batch", fid, "example",
                     "rho = (1.2840, 0.60653, 1.1331), (1, 0.77880); band [0.7, 1.2]: 0.60653 and 1.2840 are dropped, "
                     "the others kept", PADDED, {"c_min": "0.7", "c_max": "1.2"}),
            ]
    else:
        geo = level == "geometric"
        r1 = "e^(1/12) = 1.0869040495" if geo else "e^0.25 = 1.2840254167"
        r2 = "e = 2.7182818285" if geo else "e^2 = 7.3890560989"
        u1 = "mean 0.25/3" if geo else "sum 0.25"
        u2 = "mean 1" if geo else "sum 2"
        two = "e^0.25 = 1.2840254167 (mean 0.25)" if geo else "e^0.5 = 1.6487212707 (sum 0.5)"
        pad = ("means -0.125/3 and -0.125: rho = 0.95918, 0.88250" if geo
               else "sums -0.125 and -0.25: rho = e^-0.125 = 0.88250, e^-0.25 = 0.77880")
        if mode == "truncate":
            cmax = 2.5 if geo else 1.2
            out += [
                Case(f"{fid}/two-tokens", fid, "example",
                     f"x = (0.5, 0): rho = {two}, below the default C_max = 2: w = rho at both tokens", TWO),
                Case(f"{fid}/spec-example", fid, "example",
                     f"x = (0.5, 0, -0.25) and (1, 1 | -): {u1}, {u2}: rho = {r1}, {r2}; C_max = {cmax} truncates "
                     f"{'the second' if geo else 'both'}", SPEC_SEQ, {"c_max": cmax}),
                Case(f"{fid}/two-sided", fid, "example",
                     f"x = (0.25, -0.5, 0.125 | -), (0, -0.25 | -, -): {pad}; C_min = 0.9 raises the values below 0.9 "
                     "to 0.9", PADDED, {"c_min": "0.9", "c_max": 2}),
            ]
        else:
            cmax = 2.5 if geo else 5
            cmin = "0.92" if geo else "0.83"
            out += [
                Case(f"{fid}/two-tokens", fid, "example",
                     f"x = (0.5, 0): rho = {two}, inside the IcePop band [0.5, 5]: kept with its raw weight", TWO),
                Case(f"{fid}/spec-example", fid, "example",
                     f"x = (0.5, 0, -0.25) and (1, 1 | -): rho = {r1}, {r2}; band [0.5, {cmax}]: the first kept, "
                     "the second dropped (weight 0 at its tokens)", SPEC_SEQ, {"c_max": cmax}),
                Case(f"{fid}/padded-batch", fid, "example",
                     f"{pad}; band [{cmin}, 2]: the first kept, the second dropped", PADDED,
                     {"c_min": cmin, "c_max": 2}),
            ]
    # edges -----------------------------------------------------------------------------------
    out += [
        Case(f"{fid}/on-policy", fid, "edge", "l^old = l^mu: every ratio is exactly 1 (kept, untruncated)",
             ON_POLICY),
        Case(f"{fid}/empty-sequence", fid, "edge",
             "the second sequence has no unmasked token (its sequence ratio is 1: sum and mean are 0)", EMPTY),
        Case(f"{fid}/all-masked", fid, "edge", "no token counts anywhere: sequence ratios are 1, no token output",
             ALL_MASKED),
        Case(f"{fid}/masked-nan-inf", fid, "edge",
             "NaN and infinities at masked positions must not reach any output; unmasked x = (1, -0.25)", DIRTY),
        Case(f"{fid}/log-ratio-20", fid, "edge",
             "x = (20, 0) and (-20, 0): e^20 = 4.85e8, e^-20 = 2.06e-9 (geometric: e^10, e^-10)", X20),
        Case(f"{fid}/log-ratio-200", fid, "edge",
             "x = (200, 0) and (-200, 0) without a clamp: e^200 = 7.2e86 overflows float32 (an infinity is then "
             "the right float32 answer), e^-200 underflows to 0 (geometric: e^100, e^-100)", X200),
        Case(f"{fid}/log-ratio-200-clamped", fid, "edge",
             "x = (200, 0) and (-200, 0) with log_ratio_clamp = 20: the level's log-weight is clipped to +-20", X200,
             {"log_ratio_clamp": 20}),
    ]
    if level != "token":
        out.append(Case(
            f"{fid}/product-collapse", fid, "edge",
            "two sequences of 160 tokens with x = -0.5625 and -0.84375 (NeMo-RL #2269: the product of many "
            "ratios below 1 collapses): sums -90 and -135, e^-90 = 8.2e-40 (a float32 subnormal) and "
            "e^-135 = 2.3e-59 (0 in float32); the geometric means e^-0.5625 = 0.56978 (kept by the default "
            "mask band [0.5, 5]) and e^-0.84375 = 0.43008 (dropped) do not depend on the length",
            _collapse(), links=("https://github.com/NVIDIA-NeMo/RL/pull/2269",)))
    if mode == "truncate":
        out += [
            Case(f"{fid}/c-min-equals-c-max", fid, "edge", "C_min = C_max = 1: every weight is exactly 1", PADDED,
                 {"c_min": 1, "c_max": 1}),
            Case(f"{fid}/lower-bound-only", fid, "edge",
                 "C_max null, C_min = 0.9: only values below 0.9 are raised; e^20 stays e^20", X20,
                 {"c_min": "0.9", "c_max": None}),
        ]
    else:
        out += [
            Case(f"{fid}/boundary-band-of-one", fid, "edge",
                 "boundary: l^old = l^mu gives rho = 1 exactly, on both bounds of the band [1, 1]: kept (the band is "
                 "closed) in every dtype", ON_POLICY, {"c_min": 1, "c_max": 1}),
            Case(f"{fid}/upper-bound-only", fid, "edge",
                 "C_min null, C_max = 1e30: nothing is dropped from below, e^-20 = 2.06e-9 is kept", X20,
                 {"c_min": None, "c_max": "1e30"}),
            Case(f"{fid}/near-bound-bf16", fid, "edge",
                 "near the boundary: x = 2^-9, rho = 1.0019550 > C_max = 1.001: dropped. Both round to 1 in "
                 "bfloat16, which therefore keeps it (float32 and float64 drop it)", NEAR_BF16,
                 {"c_min": 0.5, "c_max": "1.001"}),
        ]
    # random ----------------------------------------------------------------------------------
    out += [
        Case(f"{fid}/random-generator", fid, "random",
             "generator inputs (seed 201), 3 sequences of lengths 16, 9 and 1; token ratios within 2.4% of 1, "
             "inside the band (no decision near a bound)",
             random_inputs(201, 3, 16, FIELDS, (16, 9, 1))),
    ]
    coarse = _coarse_random(202, 4, 6, (6, 5, 3, 1))
    if level == "token":
        # rho = e^(k/8); bounds at e^(-5/16) ~ 0.73 and e^(7/16) ~ 1.55 lie halfway between grid ratios
        params = {"c_min": "0.73", "c_max": "1.55"}
    elif level == "sequence":
        # sequence log-weights are multiples of 1/8; bounds halfway in log space
        params = {"c_min": "0.45", "c_max": "2.2"}   # log 0.45 = -0.7985 (between -0.75 and -0.875), log 2.2 = 0.788
    else:
        params = {"c_min": "0.8", "c_max": "1.3"}     # checked against the means in the family's torch tests
    out.append(Case(f"{fid}/random-coarse", fid, "random",
                    "generator-drawn inputs on a coarse grid (x = k/8, |x| <= 1.5; seed 202), 4 sequences of lengths "
                    f"6, 5, 3, 1, with bounds {params['c_min']} and {params['c_max']} far from every ratio",
                    coarse, params))
    # scale -----------------------------------------------------------------------------------
    out += [
        Case(f"{fid}/scale-8192", fid, "scale",
             "2 sequences of 8192 positions (lengths 8192 and 3000) from the generator; sums -0.90494 and -0.010506 "
             "(products 0.40457 and 0.98955: the first is dropped by the default mask band [0.5, 5])",
             Generated(seed=8192, B=2, T=8192, fields=FIELDS, lengths=(8192, 3000))),
        Case(f"{fid}/scale-32768", fid, "scale",
             "one sequence of 32768 tokens from the generator; sum 2.3499 (product 10.485, truncated to the default "
             "C_max = 2 and dropped by the default mask band [0.5, 5]; geometric mean 1.0000717)",
             Generated(seed=32768, B=1, T=32768, fields=FIELDS)),
    ]
    return out


def _reject_cases():
    fid = "is.reject"
    verl_lo = "-0.69314718055994530941723212145817656807550013436026"   # log 0.5 to 50 digits
    verl_hi = "1.3862943611198906188344642429163531361510002687205"     # log 4 to 50 digits
    return [
        Case(f"{fid}/spec-example", fid, "example",
             "k3 at seq_mean, upper 0.01: sequence 1 x = (0.5, 0, -0.25), d = (e^0.5 - 1.5, 0, e^-0.25 - 0.75) = "
             "(0.14872, 0, 0.028801), mean 0.059174 > 0.01: rejected; sequence 2 x = (0.125, -0.125), mean of d "
             "0.0078227 <= 0.01: kept",
             {"old_logprobs": [[-1.0, -2.0, -0.5], [-1.0, -2.0, -3.0]],
              "sampler_logprobs": [[-1.5, -2.0, -0.25], [-1.125, -1.875, -3.0]],
              "mask": [[True, True, True], [True, True, False]]}),
        Case(f"{fid}/token-k1", fid, "example",
             "k1 at token level: d = -x = (-0.25, 0.5, -0.125 | -), (0, 0.25 | -, -); band [-0.2, 0.3] keeps "
             "-0.125, 0, 0.25 and drops -0.25 and 0.5", PADDED,
             {"estimator": "k1", "level": "token", "lower": "-0.2", "upper": "0.3"}),
        Case(f"{fid}/seq-sum-k2", fid, "example",
             "k2 = x^2/2 summed: sequence 1 (0.03125 + 0.125 + 0.0078125) = 0.1640625 > 0.1: rejected; sequence 2 "
             "(0 + 0.03125) = 0.03125: kept", PADDED, {"estimator": "k2", "level": "seq_sum", "upper": "0.1"}),
        Case(f"{fid}/seq-max-k3-old-mu", fid, "example",
             "k3 with direction old_mu (u = -x, AReaL): sequence 1 u = (-0.25, 0.5, -0.125), max d = e^0.5 - 1.5 = "
             "0.14872 > 0.1: rejected; sequence 2 u = (0, 0.25), max d = e^0.25 - 1.25 = 0.034025: kept", PADDED,
             {"estimator": "k3", "level": "seq_max", "direction": "old_mu", "upper": "0.1"}),
        Case(f"{fid}/verl-6377-k1-bounds", fid, "regression",
             "verl k1 'L_U' = '0.5_4.0' is lower = log 0.5, upper = log 4 on k1 = -log rho, so it keeps rho in "
             "[1/4, 2], not [0.5, 4]: x = 1.09375 (rho = 2.9856, about the issue's 3) gives k1 = -1.09375 < "
             "log 0.5 = -0.69315: rejected; x = -1.203125 (rho = 0.30024) gives 1.203125 <= log 4 = 1.3863: kept; "
             "x = 0.40625 (rho = 1.5012) kept",
             {"old_logprobs": [[-0.5, -2.0, -1.0]], "sampler_logprobs": [[-1.59375, -0.796875, -1.40625]],
              "mask": [[True, True, True]]},
             {"estimator": "k1", "level": "token", "lower": verl_lo, "upper": verl_hi},
             links=("https://github.com/volcengine/verl/issues/6377",)),
        Case(f"{fid}/on-policy", fid, "edge", "l^old = l^mu: every statistic is 0, kept by the default upper 0.01",
             ON_POLICY),
        Case(f"{fid}/empty-sequence", fid, "edge",
             "the second sequence has no unmasked token: D = 0 (kept by upper 0.01); seq_sum k3",
             EMPTY, {"level": "seq_sum"}),
        Case(f"{fid}/empty-sequence-seq-max", fid, "edge",
             "seq_max of an empty sequence is 0: with k1 and lower 0.1 it is rejected", EMPTY,
             {"estimator": "k1", "level": "seq_max", "lower": "0.1", "upper": None}),
        Case(f"{fid}/all-masked", fid, "edge", "no token counts anywhere: D = 0 for both sequences", ALL_MASKED),
        Case(f"{fid}/masked-nan-inf", fid, "edge",
             "NaN and infinities at masked positions must not reach any output; unmasked x = (1, -0.25), k3 "
             "seq_mean = ((e - 2) + (e^-0.25 - 0.75)) / 2 = 0.37354", DIRTY, {"upper": 1}),
        Case(f"{fid}/tiny-log-ratio", fid, "edge",
             "x = -2^-20, 2^-20, 0: k3 = 2^-41 (1 -+ 2^-20/3) must not cancel (e^x - 1 - x written as such gives "
             "0 or garbage in float32); token level, upper 1", TINY, {"level": "token", "upper": 1}),
        Case(f"{fid}/log-ratio-20", fid, "edge",
             "x = (20, 0) and (-20, 0): k3 = e^20 - 21 = 4.85e8 and e^-20 + 19; seq_max, upper 100: the first "
             "rejected, the second kept", X20, {"level": "seq_max", "upper": 100}),
        Case(f"{fid}/log-ratio-200", fid, "edge",
             "x = (200, 0) and (-200, 0), k3 at seq_mean: (e^200 - 201)/2 = 3.6e86 overflows float32 (an infinity "
             "is then the right float32 answer) and is rejected; e^-200 + 199 gives 99.5, rejected by 0.01", X200),
        Case(f"{fid}/log-ratio-200-clamped-old-mu", fid, "edge",
             "x = (200, 0) and (-200, 0), direction old_mu, log_ratio_clamp 20: u = -20 and 20, k3 = 19 + e^-20 and "
             "e^20 - 21; token level, upper 100", X200,
             {"direction": "old_mu", "log_ratio_clamp": 20, "level": "token", "upper": 100}),
        Case(f"{fid}/negative-upper", fid, "edge", "upper -0.01 with k3 (>= 0): every token is rejected",
             PADDED, {"level": "token", "upper": "-0.01"}),
        Case(f"{fid}/upper-zero", fid, "edge",
             "upper = 0 with k3 at token level (the equality boundary of a bound the statistic cannot go below): "
             "x = (0.25, -0.5, 0.125), (0, -0.25); only the on-policy token, k3 = 0 = upper, is kept (the band is "
             "closed)", PADDED, {"level": "token", "upper": 0}),
        Case(f"{fid}/boundary-k1", fid, "edge",
             "boundary: k1 = -x = (-0.25, 0.5, -0.125), (0, 0.25): 0.25 equals upper = 0.25 and -0.25 equals "
             "lower = -0.25, both kept (the band is closed), exact in every dtype; 0.5 is rejected", PADDED,
             {"estimator": "k1", "level": "token", "lower": "-0.25", "upper": "0.25"}),
        Case(f"{fid}/random-generator", fid, "random",
             "generator inputs (seed 211), 3 sequences of lengths 16, 9, 1; k3 at seq_mean ~ 3e-5, far below 0.01",
             random_inputs(211, 3, 16, FIELDS, (16, 9, 1))),
        Case(f"{fid}/random-coarse-token-k2", fid, "random",
             "generator-drawn coarse inputs (x = k/8, seed 212); k2 = x^2/2 in multiples of 1/128 at token level, "
             "band [0.01, 0.3] between grid values", _coarse_random(212, 3, 6, (6, 4, 2)),
             {"estimator": "k2", "level": "token", "lower": "0.01", "upper": "0.3"}),
        Case(f"{fid}/scale-8192", fid, "scale",
             "2 sequences of 8192 positions (lengths 8192 and 3000) from the generator, k3 at token level with "
             "upper 6e-4: x is k/128 2^-e with |k| <= 6, k3 in {3.0e-5, 1.2e-4, 2.7e-4, 4.9e-4, 7.5e-4, 1.1e-3, "
             "...}; the bound lies between 4.93e-4 and 7.53e-4",
             Generated(seed=8192, B=2, T=8192, fields=FIELDS, lengths=(8192, 3000)),
             {"level": "token", "upper": "6e-4"}),
        Case(f"{fid}/scale-32768", fid, "scale",
             "one sequence of 32768 tokens from the generator with verl's geo_rs preset (k1, seq_mean, lower "
             "log 0.999, upper log 1.001): the mean k1 is -7.17e-5, kept",
             Generated(seed=32768, B=1, T=32768, fields=FIELDS),
             {"estimator": "k1", "level": "seq_mean", "lower": "-0.0010005003335835335",
              "upper": "0.00099950033308353317"}),
    ]


def _binding():
    """Clamps and lower bounds set where they take no effect (pgspec golden coverage)."""
    out = [Case(f"{fid}/log-ratio-clamp-inactive", fid, "edge",
                "log_ratio_clamp = 20 on the padded batch (mismatch log-ratios within +-0.5): no effect",
                PADDED, {"log_ratio_clamp": 20})
           for fid in TRUNC_IDS + MASK_IDS + ("is.reject",)]
    out += [Case(f"{fid}/c-min-inactive", fid, "edge",
                 "c_min = 2^-10 on the padded batch (weights within e^+-0.5): the lower truncation changes nothing",
                 PADDED, {"c_min": 0.0009765625})
            for fid in TRUNC_IDS]
    return out


NEMO_2269 = ("https://github.com/NVIDIA-NeMo/RL/pull/2269",)


def _untruncated_cases():
    """Both bounds null in the truncate mode: the raw weight (NeMo-RL use_importance_sampling_correction,
    #2269's is_correction_level token / sequence / sequence_mean)."""
    none = {"c_min": None, "c_max": None}
    return [
        Case("is.token.truncate/untruncated", "is.token.truncate", "regression",
             "NeMo-RL #2269 is_correction_level='token': both bounds null, w = rho = (e^0.5, 1, e^-0.25) = "
             "(1.6487212707, 1, 0.77880078307), nothing truncated", SPEC_TOK, none, NEMO_2269),
        Case("is.sequence.truncate/untruncated", "is.sequence.truncate", "regression",
             "NeMo-RL #2269 is_correction_level='sequence': w = exp(sum x) = (e^0.25, e^2) = (1.2840254167, "
             "7.3890560989), nothing truncated", SPEC_SEQ, none, NEMO_2269),
        Case("is.geometric.truncate/untruncated", "is.geometric.truncate", "regression",
             "NeMo-RL #2269 is_correction_level='sequence_mean': w = exp(mean x) = (e^(1/12), e) = (1.0869040495, "
             "2.7182818285)", SPEC_SEQ, none, NEMO_2269),
        Case("is.sequence.truncate/untruncated-log-ratio-20", "is.sequence.truncate", "edge",
             "both bounds null at x = (20, 0) and (-20, 0): w = e^20 = 485165195.41 and e^-20 = 2.0611536224e-9",
             X20, none),
    ]


def cases():
    out = _binding()
    for fid in ("is.token.truncate", "is.token.mask", "is.sequence.truncate", "is.sequence.mask",
                "is.geometric.truncate", "is.geometric.mask"):
        out += _weight_cases(fid)
    out += _reject_cases()
    return out + _untruncated_cases()
