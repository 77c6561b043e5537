"""Golden cases of the mask family (spec/mask.md).

Keep flags are compared exactly, so every bound below sits far (many bfloat16 roundings) from the
statistic it is compared with, except in the cases whose slug says ``boundary`` (the statistic
equals the bound exactly, in every dtype) or ``near-bound-bf16`` (the statistic lies within one
bfloat16 rounding of the bound: float64 and float32 decide as the reference does, bfloat16 cannot).
"""

from __future__ import annotations

from .case import Case, random_inputs
from .is_ import _coarse_random

GEO = "mask.geometric_sequence"
OPSM = "mask.opsm"
ENT = "mask.entropy_quantile"

MASK = [[True, True, True, False], [True, True, False, False]]
# x = l - l^mu: row 1 (0, -0.25, 0.125 | -), mean -1/24; row 2 (-0.25, 0 | -, -), mean -0.125
LP = [[-1.0, -2.5, -0.375, -4.0], [-0.5, -3.0, -1.25, -2.0]]
MU = [[-1.0, -2.25, -0.5, -3.0], [-0.25, -3.0, -1.0, -2.0]]
# x = l^old - l^mu: row 1 (0.5, 0, -0.25), mean 1/12; row 2 (1, 1 | -), mean 1
SEQ = {"old_logprobs": [[-1.0, -2.0, -0.5], [0.0, 0.0, -3.0]],
       "sampler_logprobs": [[-1.5, -2.0, -0.25], [-1.0, -1.0, -3.0]],
       "mask": [[True, True, True], [True, True, False]]}
SPEC_GEO = {"old_logprobs": [[-1.0, -2.0], [-1.0, -2.0]], "sampler_logprobs": [[-1.0, -2.015625], [-1.25, -2.0]],
            "mask": [[True, True], [True, True]]}


def _pair(num, a, b):
    """x = (a - b, 0) for sequence 1 and (b - a, 0) for sequence 2."""
    return {num: [[a, -1.0], [b, -1.0]], "sampler_logprobs": [[b, -1.0], [a, -1.0]],
            "mask": [[True, True], [True, True]]}


def _geometric_cases():
    fid = GEO
    old = {"old_logprobs": LP, "sampler_logprobs": MU, "mask": MASK}
    return [
        Case(f"{fid}/spec-inputs", fid, "example",
             "the spec's inputs, x = (0, 0.015625) and (0.25, 0): g = e^0.0078125 = 1.0078431 and e^0.125 = 1.1331485; "
             "band [0.95, 1.05]: the first kept, the second dropped", SPEC_GEO, {"lower": "0.95", "upper": "1.05"}),
        Case(f"{fid}/current-over-sampler", fid, "example",
             "numerator = logprobs: x = (0, -0.25, 0.125 | -) and (-0.25, 0 | -, -), means -1/24 and -1/8: "
             "g = 0.95918 and 0.88250; band [0.92, 1.1] keeps the first only",
             {"logprobs": LP, "sampler_logprobs": MU, "mask": MASK},
             {"numerator": "logprobs", "lower": "0.92", "upper": "1.1"}),
        Case(f"{fid}/upper-only", fid, "example",
             "x = (0.5, 0, -0.25) and (1, 1 | -): g = e^(1/12) = 1.0869040 and e = 2.7182818; lower null, upper 2: "
             "the first kept, the second dropped", SEQ, {"lower": None, "upper": 2}),
        Case(f"{fid}/on-policy", fid, "edge", "l^old = l^mu: g = 1 exactly, inside the default band [0.99, 1.01]",
             {"old_logprobs": LP, "sampler_logprobs": LP, "mask": MASK}),
        Case(f"{fid}/boundary-band-of-one", fid, "edge",
             "boundary: l^old = l^mu gives g = 1 exactly, on both bounds of [1, 1]: kept in every dtype",
             {"old_logprobs": LP, "sampler_logprobs": LP, "mask": MASK}, {"lower": 1, "upper": 1}),
        Case(f"{fid}/empty-sequence", fid, "edge",
             "the second sequence has no unmasked token: g = 1, kept by [0.9, 1.1]; the first has g = 0.95918",
             {**old, "mask": [MASK[0], [False] * 4]}, {"lower": "0.9", "upper": "1.1"}),
        Case(f"{fid}/all-masked", fid, "edge", "no token counts: g = 1 for both sequences (kept by the default band)",
             {**old, "mask": [[False] * 4, [False] * 4]}),
        Case(f"{fid}/masked-nan-inf", fid, "edge",
             "NaN and infinities at masked positions must not reach any output; unmasked x = (1, -0.25), mean 0.375, "
             "g = 1.4550; band [0.5, 2]",
             {"old_logprobs": [[-1.0, "nan", "inf", -0.5]], "sampler_logprobs": [[-2.0, "-inf", "nan", -0.25]],
              "mask": [[True, False, False, True]]}, {"lower": 0.5, "upper": 2}),
        Case(f"{fid}/log-ratio-20", fid, "edge",
             "x = (20, 0) and (-20, 0): g = e^10 = 22026 and e^-10 = 4.54e-5, both dropped by the default band",
             _pair("old_logprobs", 0.0, -20.0)),
        Case(f"{fid}/log-ratio-200", fid, "edge",
             "x = (200, 0) and (-200, 0): g = e^100 (an infinity is the right float32 answer) and e^-100 (a float32 "
             "subnormal); lower null, upper 1e30: the first dropped, the second kept",
             _pair("old_logprobs", 0.0, -200.0), {"lower": None, "upper": "1e30"}),
        Case(f"{fid}/near-bound-bf16", fid, "edge",
             "near the boundary: x = 2^-9, g = 1.0019550 > upper = 1.001: dropped. Both round to 1 in bfloat16, "
             "which therefore keeps it (float32 and float64 drop it)",
             {"old_logprobs": [[-0.25]], "sampler_logprobs": [[-0.251953125]], "mask": [[True]]},
             {"lower": "0.99", "upper": "1.001"}),
        Case(f"{fid}/random-generator", fid, "random",
             "generator inputs (seed 301), 3 sequences of lengths 16, 9 and 1; g within 1% of 1, band [0.95, 1.05]",
             random_inputs(301, 3, 16, ("old_logprobs", "sampler_logprobs", "mask"), (16, 9, 1)),
             {"lower": "0.95", "upper": "1.05"}),
        Case(f"{fid}/random-coarse", fid, "random",
             "generator-drawn coarse inputs (x = k/8, seed 302), 5 sequences of lengths 6, 5, 4, 2, 1; band "
             "[0.7, 1.25] far from every g (0.607, 1.025, 0.804, 0.646, 4.48)",
             _coarse_random(302, 5, 6, (6, 5, 4, 2, 1)), {"lower": "0.7", "upper": "1.25"}),
    ]


SLIME_1917 = {"logprobs": [[0.0, 0.0, 0.0], [-1.0, -1.0, -1.0]], "sampler_logprobs": [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]],
              "advantages": [[-0.5, 0.25, -0.25], [0.5, 0.5, 0.5]], "mask": [[True, True, True], [True, True, True]]}


def _opsm_cases():
    fid = OPSM
    base = {"logprobs": LP, "sampler_logprobs": MU, "mask": MASK}
    return [
        Case(f"{fid}/sequence-advantages", fid, "example",
             "kappa = mean(l^mu - l) = (0 + 0.25 - 0.125)/3 = 0.041667 and (0.25 + 0)/2 = 0.125; A = (0.5, -1), "
             "delta 0.1: the second has A < 0 and kappa > delta: dropped; the first has A >= 0: kept",
             {**base, "advantages": [0.5, -1.0]}, {"delta": "0.1"}),
        Case(f"{fid}/token-advantages", fid, "example",
             "per-token advantages: A_1 = mean(-1, 0.5, 0.25 | -) = -1/12, A_2 = mean(1, -0.5 | -, -) = 0.25; "
             "kappa = 0.041667, 0.125; delta 0.02: the first dropped (A_1 < 0, kappa > 0.02), the second kept",
             {**base, "advantages": [[-1.0, 0.5, 0.25, 9.0], [1.0, -0.5, -9.0, -9.0]]}, {"delta": "0.02"}),
        Case(f"{fid}/default-delta", fid, "example",
             "delta = 0.5 (default): kappa = 0.041667 and 0.125 are both below it: every sequence kept although both "
             "advantages are negative", {**base, "advantages": [-1.0, -0.25]}),
        Case(f"{fid}/slime-1917", fid, "regression",
             "slime#1917's tensors: l = (0, 0, 0), l^mu = (1, 1, 1), per-token advantages (-0.5, 0.25, -0.25), "
             "delta 0.1: kappa = 1, A = -1/6 < 0: the whole sequence is masked, including the positive-advantage "
             "middle token the per-token gate kept; sequence 2 (kappa 1, A = 0.5) is kept",
             SLIME_1917, {"delta": "0.1"}, links=("https://github.com/THUDM/slime/issues/1917",)),
        Case(f"{fid}/zero-advantage", fid, "edge",
             "A = 0 with kappa = 1 > delta: kept (only A < 0 is masked; the sign is exact in every dtype)",
             {"logprobs": [[0.0, 0.0]], "sampler_logprobs": [[1.0, 1.0]], "advantages": [0.0], "mask": [[True, True]]},
             {"delta": "0.1"}),
        Case(f"{fid}/boundary-kappa-equals-delta", fid, "edge",
             "boundary: kappa = (0.5 + 0.5)/2 = 0.5 = delta exactly (exact in every dtype): kept",
             {"logprobs": [[-1.0, -2.0]], "sampler_logprobs": [[-0.5, -1.5]], "advantages": [-1.0],
              "mask": [[True, True]]}, {"delta": 0.5}),
        Case(f"{fid}/empty-sequence", fid, "edge",
             "the second sequence has no unmasked token: kappa = 0 and (per-token advantages) A = 0: kept",
             {**base, "advantages": [[-1.0, -1.0, -1.0, -1.0], [-1.0, -1.0, -1.0, -1.0]],
              "mask": [MASK[0], [False] * 4]}, {"delta": "0.02"}),
        Case(f"{fid}/all-masked", fid, "edge", "no token counts: kappa = 0 everywhere (below the default delta 0.5), "
             "every sequence kept", {**base, "advantages": [-1.0, -1.0], "mask": [[False] * 4, [False] * 4]}),
        Case(f"{fid}/empty-sequence-nan", fid, "edge",
             "the second sequence has no unmasked token and NaN at all its positions: its kappa is 0 and the NaN "
             "reaches no output; the first has l^mu - l = (1, 0.25), kappa = 0.625 > 0.5 with A = -1: dropped",
             {"logprobs": [[-2.0, -0.5], ["nan", "nan"]], "sampler_logprobs": [[-1.0, -0.25], ["nan", "nan"]],
              "advantages": [-1.0, 0.0], "mask": [[True, True], [False, False]]}),
        Case(f"{fid}/masked-nan-inf", fid, "edge",
             "NaN and infinities at masked positions (log-probs and per-token advantages) must not reach any "
             "output; unmasked l^mu - l = (1, 0.25), kappa = 0.625 > 0.5, A = mean(-1, 0.5) = -0.25: dropped",
             {"logprobs": [[-2.0, "nan", "inf", -0.5]], "sampler_logprobs": [[-1.0, "-inf", "nan", -0.25]],
              "advantages": [[-1.0, "nan", "inf", 0.5]], "mask": [[True, False, False, True]]}),
        Case(f"{fid}/log-ratio-200", fid, "edge",
             "l^mu - l = (200, 0) and (-200, 0): kappa = 100 and -100; A = -1 for both: the first dropped, the "
             "second kept", {**_pair("logprobs", -200.0, 0.0), "advantages": [-1.0, -1.0]}),
        Case(f"{fid}/log-ratio-20", fid, "edge",
             "l^mu - l = (20, 0) and (-20, 0): kappa = 10 and -10, delta 9.5; A = -0.5: the first dropped",
             {**_pair("logprobs", -20.0, 0.0), "advantages": [-0.5, -0.5]}, {"delta": "9.5"}),
        Case(f"{fid}/random-generator", fid, "random",
             "generator inputs (seed 311), 6 sequences of 16 (lengths 16, 12, 9, 5, 2, 1) with generator advantages; "
             "delta 0: a negative-advantage sequence is dropped iff kappa > 0 (rounding never changes a sign)",
             random_inputs(311, 6, 16, ("logprobs", "sampler_logprobs", "advantages", "mask"), (16, 12, 9, 5, 2, 1)),
             {"delta": 0}),
        Case(f"{fid}/random-coarse", fid, "random",
             "generator-drawn coarse inputs (l^mu - l = k/8, seed 312), advantages -1 and 1 alternating; delta 0.3 "
             "far from every kappa",
             {**_opsm_coarse(312, 6, 6, (6, 5, 4, 3, 2, 1)), "advantages": [-1.0, 1.0, -1.0, 1.0, -1.0, -1.0]},
             {"delta": "0.3"}),
    ]


def _opsm_coarse(seed, B, T, lengths):
    c = _coarse_random(seed, B, T, lengths)
    # kappa = mean(l^mu - l): take l = the coarse l^mu and l^mu = the coarse l^old, so l^mu - l = x
    return {"logprobs": c["sampler_logprobs"], "sampler_logprobs": c["old_logprobs"], "mask": c["mask"]}


def _entropy_from_generator(seed, B, T, lengths):
    g = random_inputs(seed, B, T, ("logprobs", "mask"), lengths)
    return {"entropy": [[-x for x in row] for row in g["logprobs"]], "mask": g["mask"]}


def _entropy_cases():
    fid = ENT
    spec = {"entropy": [[0.5, 1.0, 2.0, 3.0], [0.25, 1.5, 7.0, 0.0]], "mask": MASK}
    six = {"entropy": [[0.125, 0.5, 1.0, 2.0, 4.0, 0.25]], "mask": [[True] * 6]}
    eleven = {"entropy": [[0.0625, 0.125, 0.25, 0.375, 0.5, 0.75], [1.0, 1.5, 2.0, 2.5, 3.0, 8.0]],
              "mask": [[True] * 6, [True] * 5 + [False]]}
    return [
        Case(f"{fid}/spec-inputs-rho-0.3", fid, "example",
             "the spec's entropies sorted (0.25, 0.5, 1, 1.5, 2, 3); rho = 0.3: h = 0.7 * 5 = 3.5, q = 1.5 + "
             "0.5 (2 - 1.5) = 1.75: the tokens with H = 2 and 3 are kept", spec, {"top_entropy_quantile": "0.3"}),
        Case(f"{fid}/median", fid, "example",
             "six entropies sorted (0.125, 0.25, 0.5, 1, 2, 4); rho = 0.5: h = 2.5, q = 0.5 + 0.5 (1 - 0.5) = 0.75: "
             "1, 2 and 4 kept", six, {"top_entropy_quantile": 0.5}),
        Case(f"{fid}/two-rows", fid, "example",
             "eleven unmasked entropies over two rows (the 8.0 is masked); rho = 0.25: h = 0.75 * 10 = 7.5, "
             "q = 1.5 + 0.5 (2 - 1.5) = 1.75: 2, 2.5 and 3 kept", eleven, {"top_entropy_quantile": "0.25"}),
        Case(f"{fid}/boundary-spec-example", fid, "edge",
             "boundary (the spec's worked example): rho = 0.2 (default), h = 0.8 * 5 = 4 exactly, q = x_4 = 2 "
             "and the token with H = 2 ties with q: kept, exact in every dtype", spec),
        Case(f"{fid}/boundary-binary-rho", fid, "edge",
             "boundary: rho = 0.3 given as a binary double (0.29999999999999998890): h = 0.7 * 10 = "
             "7.000000000000000111, within 2^-44 * 10 of 7, taken as 7: q = x_7 = 1.5 exactly, and H = 1.5 is "
             "kept", eleven, {"top_entropy_quantile": 0.3}),
        Case(f"{fid}/boundary-binary-rho-0.7", fid, "edge",
             "boundary: rho = 0.7 given as a binary double (0.69999999999999995559): h = (1 - rho) 10 = "
             "3.0000000000000004441, within 2^-44 * 10 of 3, taken as 3: q = x_3 = 0.375 exactly, and H = 0.375 "
             "is kept. Used unrounded (torch.quantile in float64; in float32, 0.3f * 10 = 3.0000001), h puts q "
             "just above 0.375 and drops that token", eleven,
             {"top_entropy_quantile": 0.7}),
        Case(f"{fid}/ties", fid, "edge",
             "boundary: entropies (1, 1, 1, 1, 2, 0.5): sorted (0.5, 1, 1, 1, 1, 2), rho = 0.5: h = 2.5 between "
             "two tied values, q = 1 exactly: all four tied tokens are kept (5 of 6 tokens for rho = 0.5)",
             {"entropy": [[1.0, 1.0, 1.0, 1.0, 2.0, 0.5]], "mask": [[True] * 6]}, {"top_entropy_quantile": 0.5}),
        Case(f"{fid}/keep-all", fid, "edge", "rho = 1 (TRL's default): q = min H = 0.25, every unmasked token kept",
             spec, {"top_entropy_quantile": 1}),
        Case(f"{fid}/keep-max-only", fid, "edge", "rho = 0: q = max H = 3, only that token kept", spec,
             {"top_entropy_quantile": 0}),
        Case(f"{fid}/single-token", fid, "edge", "a single unmasked token: h = 0, q = its entropy 1.5, kept",
             {"entropy": [[1.5, 0.25]], "mask": [[True, False]]}),
        Case(f"{fid}/zero-entropies", fid, "edge", "entropies all 0 (deterministic tokens): q = 0, all kept",
             {"entropy": [[0.0, 0.0, 0.0]], "mask": [[True, True, True]]}),
        Case(f"{fid}/all-masked", fid, "edge", "no unmasked token: no threshold (null), nothing kept",
             {"entropy": [[0.5, 1.0], [2.0, 3.0]], "mask": [[False, False], [False, False]]}),
        Case(f"{fid}/masked-nan-inf", fid, "edge",
             "NaN and infinity at masked positions must not enter the quantile: unmasked (0.5, 1, 2), rho 0.5: "
             "h = 1, q = 1", {"entropy": [[0.5, "nan", 1.0, "inf", 2.0]], "mask": [[True, False, True, False, True]]},
             {"top_entropy_quantile": 0.5}),
        Case(f"{fid}/random-generator", fid, "random",
             "generator log-probs (seed 321) negated into entropies in (0, 2), 3 rows of lengths 16, 9, 1: n = 26, "
             "rho = 0.2: h = 0.8 * 25 = 20, q = x_20 (one of the entropies: the tie is exact in every dtype, and kept)",
             _entropy_from_generator(321, 3, 16, (16, 9, 1))),
        Case(f"{fid}/random-generator-interpolated", fid, "random",
             "the same entropies with rho = 0.37: h = 0.63 * 25 = 15.75, q = x_15 + 0.75 (x_16 - x_15)",
             _entropy_from_generator(321, 3, 16, (16, 9, 1)), {"top_entropy_quantile": "0.37"}),
        Case(f"{fid}/random-557-tokens", fid, "random",
             "generator log-probs (seed 322) negated, 4 rows of 256 (lengths 256, 200, 100, 1): n = 557, rho 0.2: "
             "h = 0.8 * 556 = 444.8; many ties (the generator has 1408 distinct values): x_444 = x_445, so q is that "
             "entropy exactly (in every dtype) and its tokens are kept",
             _entropy_from_generator(322, 4, 256, (256, 200, 100, 1))),
    ]


def _window_edges():
    """The entropy quantile's tie window at its edges (spec: h within 2^-44 (n - 1) of an integer is that
    integer).  n = 5 unmasked tokens, so the window is 2^-42; rho = 0.25 - 1.5 * 2^-45 (a binary double)
    gives h = (1 - rho) 4 = 3 + 1.5 * 2^-43, inside the window but outside half of it, and
    rho = 0.25 - 3 * 2^-45 gives h = 3 + 1.5 * 2^-42, just outside it."""
    fid = ENT
    # the largest entropy is 2^20, so that outside the window q moves above 2 by 1.5 * 2^-42 (2^20 - 2), about
    # 3.6e-7: more than float32's spacing at 2 (bfloat16's spacing there, 2^-6, cannot show it)
    five = {"entropy": [[0.5, 1.0, 1.5, 2.0, 1048576.0]], "mask": [[True] * 5]}
    inside = 0.25 - 1.5 * 2.0 ** -45
    outside = 0.25 - 3 * 2.0 ** -45
    return [
        Case(f"{fid}/tie-window-inside-edge", fid, "edge",
             f"rho = {inside!r} = 0.25 - 1.5 * 2^-45: h = 3 + 1.5 * 2^-43, within the tie window 2^-44 * 4 = 2^-42: "
             "h is taken as 3, q = x_3 = 2 and the token with H = 2 is kept", five, {"top_entropy_quantile": inside}),
        Case(f"{fid}/tie-window-on-edge", fid, "edge",
             f"rho = {0.25 - 2.0 ** -44!r} = 0.25 - 2^-44: h = 3 + 2^-42, exactly on the edge of the tie window "
             "2^-44 * 4 (the window is closed): h is taken as 3, q = x_3 = 2 and the token with H = 2 is kept", five,
             {"top_entropy_quantile": 0.25 - 2.0 ** -44}),
        Case(f"{fid}/tie-window-two-tokens", fid, "edge",
             "n = 2 unmasked tokens (0 and 2^20), rho = 1.5 * 2^-44: h = 1 - 1.5 * 2^-44 is outside the window 2^-44 "
             "(n - 1 = 1 is not raised), so q = 2^20 (1 - 1.5 * 2^-44) = 2^20 - 1.5 * 2^-24, just below the larger "
             "entropy (kept either way; the threshold output tells)",
             {"entropy": [[0.0, 1048576.0]], "mask": [[True, True]]}, {"top_entropy_quantile": 1.5 * 2.0 ** -44}),
        Case(f"{fid}/tie-window-outside-edge", fid, "edge",
             f"rho = {outside!r} = 0.25 - 3 * 2^-45: h = 3 + 1.5 * 2^-42, outside the tie window 2^-42: q = 2 + "
             "1.5 * 2^-42 (2^20 - 2) = 2 + 3.6e-7 is just above 2, so the token with H = 2 is dropped", five,
             {"top_entropy_quantile": outside}),
    ]


def _float32_positions():
    """h = (1 - rho)(n - 1) just outside the tie window, by less than float32's rounding of the position:
    rho = 1/7 - 6.5e-14 (n = 8) and 1/6 - 6.6e-14 (n = 7), binary doubles.  A quantile formed in float32
    (torch.quantile over float32 entropies: fl32(1 - rho) (n - 1) rounded to float32) lands on the integer
    position, from above (6.00000006) and from below (4.99999988); the spec's q lies above the entropy
    there, 0, by about 1e-14, a difference float32 and bfloat16 hold (above an entropy other than 0 they
    could not: q would round onto it).  And a position h large against its fraction h - j (rho = 0.1 over seven
    tokens, h = 5.4): float32's rounding of h, about 2^-24 h, moves q by 16 float32 ulps of itself."""
    fid = ENT
    r8, r7 = 1 / 7 - 6.5e-14, 1 / 6 - 6.6e-14
    return [
        Case(f"{fid}/float32-rounds-position-8-tokens", fid, "edge",
             f"eight entropies, seven of 0 and one of 1/32; rho = {r8!r} = 1/7 - 6.5e-14: h = 6 + 4.55e-13, "
             "outside the tie window 2^-44 * 7 = 3.98e-13, so q = 0 + 4.55e-13 (1/32 - 0) = 1.42e-14 and only "
             "the token with H = 1/32 is kept (in float32, fl32(1 - rho) * 7 = 6.00000006 rounds to 6: q = 0 "
             "would keep all eight)",
             {"entropy": [[0.0, 0.0, 0.0, 0.0], [0.0, 0.03125, 0.0, 0.0]], "mask": [[True] * 4, [True] * 4]},
             {"top_entropy_quantile": r8}),
        Case(f"{fid}/float32-rounds-position-7-tokens", fid, "edge",
             f"seven entropies, six of 0 and one of 1/32; rho = {r7!r} = 1/6 - 6.6e-14: h = 5 + 3.96e-13, "
             "outside the tie window 2^-44 * 6 = 3.41e-13, so q = 0 + 3.96e-13 (1/32 - 0) = 1.24e-14 and only "
             "the token with H = 1/32 is kept (in float32, fl32(1 - rho) * 6 = 4.99999988 rounds up to 5: q = 0 "
             "would keep all seven)",
             {"entropy": [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.03125, 0.5]],
              "mask": [[True] * 4, [True, True, True, False]]},
             {"top_entropy_quantile": r7}),
        Case(f"{fid}/float32-position-off-its-fraction", fid, "edge",
             "seven entropies, six of 0 and one of 1/32; rho = 0.1: h = 0.9 * 6 = 5.4, q = 0 + 0.4 (1/32 - 0) = "
             "1/80 (rho's binary double moves it by 1e-18): only the token with H = 1/32 is kept (in float32, fl32(0.9) "
             "* 6 = 5.39999962, so q = 0.39999962 / 32 = 0.0124999881: 16 float32 ulps of q off, where h is "
             "large against its fraction 0.4; no keep decision changes)",
             {"entropy": [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.03125, 0.5]],
              "mask": [[True] * 4, [True, True, True, False]]},
             {"top_entropy_quantile": 0.1}),
    ]


def _opsm_gate_cases():
    """advantage_gate 'token': DeepSeek-V3.2 Eq. 9 read literally, each token gated by its own A_{i,t}."""
    fid = OPSM
    base = {"logprobs": LP, "sampler_logprobs": MU, "mask": MASK}
    eq9 = ("https://arxiv.org/abs/2512.02556",)
    return [
        Case(f"{fid}/token-gate-slime-1917", fid, "regression",
             "slime#1917's tensors with advantage_gate 'token' (the literal Eq. 9): kappa = 1 > 0.1; tokens with "
             "A = -0.5 and -0.25 dropped, the middle token (A = 0.25) kept; seq_keep 0 for sequence 1 (a token "
             "dropped); sequence 2 (A >= 0 everywhere) kept",
             SLIME_1917, {"delta": "0.1", "advantage_gate": "token"}, links=eq9),
        Case(f"{fid}/token-gate-token-advantages", fid, "example",
             "the token-advantages example with advantage_gate 'token', delta 0.02: kappa = (0.041667, 0.125) both "
             "above delta; every token with A < 0 is dropped (row 1: the first; row 2: the second), the others kept",
             {**base, "advantages": [[-1.0, 0.5, 0.25, 9.0], [1.0, -0.5, -9.0, -9.0]]},
             {"delta": "0.02", "advantage_gate": "token"}, links=eq9),
        Case(f"{fid}/token-gate-sequence-advantages", fid, "edge",
             "[B] advantages: advantage_gate 'token' equals the default (A_{i,t} = A_i): the second sequence dropped",
             {**base, "advantages": [0.5, -1.0]}, {"delta": "0.1", "advantage_gate": "token"}),
        Case(f"{fid}/token-gate-masked-nan-inf", fid, "edge",
             "advantage_gate 'token': NaN and infinities at masked positions must not reach any output; kappa = "
             "0.625 > 0.5: the token with A = -1 dropped, the one with A = 0.5 kept",
             {"logprobs": [[-2.0, "nan", "inf", -0.5]], "sampler_logprobs": [[-1.0, "-inf", "nan", -0.25]],
              "advantages": [[-1.0, "nan", "inf", 0.5]], "mask": [[True, False, False, True]]},
             {"advantage_gate": "token"}),
    ]


def cases():
    return (_geometric_cases() + _opsm_cases() + _entropy_cases() + _window_edges() + _opsm_gate_cases()
            + _float32_positions())
