"""Golden cases of the surrogate family (spec/surrogate.md).

Notation of the descriptions: d = l - l_old (the token log-ratio), r = e^d, A the advantage.
Every loss is the negated objective; the clip parameters default as the reference registry says
(PPO eps 0.2, GSPO 3e-4 / 4e-4, GMPO 0.4, SAPO tau 1 / 1.05, VESPO k, lambda = 2, 3 / 3, 2).
"""

from __future__ import annotations

from .case import Case, Generated, random_inputs

TOKEN_IDS = ("surrogate.pg", "surrogate.ppo_clip", "surrogate.dual_clip", "surrogate.trl_delta",
             "surrogate.cispo", "surrogate.sapo")
SEQ_IDS = ("surrogate.gspo", "surrogate.gmpo", "surrogate.vespo")

LINKS = {
    "sapo": "https://arxiv.org/abs/2511.20347",
    "gmpo": "https://arxiv.org/abs/2507.20673",
    "intellect2": "https://arxiv.org/abs/2505.07291",
    "trl3434": "https://github.com/huggingface/trl/pull/3434",
    "skyrl1928": "https://github.com/NovaSky-AI/SkyRL/pull/1928",
    "gspo": "https://arxiv.org/abs/2507.18071",
    "dual": "https://arxiv.org/abs/1912.09729",
}

T2 = [[True, True]]
TWO = {"logprobs": [[-1.0, -2.0]], "old_logprobs": [[-1.5, -2.0]], "mask": T2}   # d = (0.5, 0)
LP = [[-1.0, -2.5, -0.375, -4.0], [-0.5, -3.0, -1.25, -2.0]]
OLD = [[-1.25, -2.0, -0.5, -3.5], [-0.5, -2.75, -1.0, -2.5]]   # d = (0.25, -0.5, 0.125 | 0, -0.25)
MASK = [[True, True, True, False], [True, True, False, False]]
A_SEQ = [1.0, -0.5]
A_TOK = [[1.0, -1.0, 0.5, 2.0], [-0.75, 1.5, 1.0, -1.0]]
# d = +20, -20 and +200, -200
X20 = {"logprobs": [[0.0, -20.0]], "old_logprobs": [[-20.0, 0.0]], "mask": T2}
X200 = {"logprobs": [[0.0, -200.0]], "old_logprobs": [[-200.0, 0.0]], "mask": T2}
DIRTY = {"logprobs": [[-1.0, "nan", "inf", -2.0]], "old_logprobs": [[-1.5, "-inf", "nan", "inf"]],
         "mask": [[True, False, False, False]]}


# expected values of the shared extreme cases, per formula: (d = +-20 unclipped side, clipped side,
# d = +-200 unclipped side, clipped side); e^20 = 485165195.41, e^-20 = 2.0611536224e-9,
# e^200 = 7.2259737681e86 (over the float32 maximum 3.4e38), e^-200 = 1.3838965267e-87
PG_20 = ("loss = gradient = -A r = (e^20, -e^-20)", "loss = gradient = (-e^20, e^-20)",
         "loss = gradient = (e^200, -e^-200): float32 overflows to inf (a pass by overflow), e^-200 underflows",
         "loss = gradient = (-e^200, e^-200): -inf passes by overflow in float32")
PPO_CLIPPED = ("loss -1.2 and 0.8, gradient 0", "loss -1.2 and 0.8, gradient exactly 0 (float32 e^200 = inf must not "
               "turn the zero cotangent of the clipped branch into 0 * inf = NaN)")
EXTREMES = {
    "surrogate.pg": PG_20,
    "surrogate.ppo_clip": (PG_20[0] + " (both unclipped)", PPO_CLIPPED[0], PG_20[2] + " (both unclipped)",
                           PPO_CLIPPED[1]),
    "surrogate.dual_clip": ("loss (3 = c |A|, -e^-20), gradient (0, -e^-20): the dual clip bounds e^20",
                            PPO_CLIPPED[0], "loss (3, -e^-200), gradient (0, -e^-200): the bound removes the overflow",
                            PPO_CLIPPED[1]),
    "surrogate.trl_delta": ("loss (4 = delta |A|, -e^-20), gradient (0, -e^-20): the cap delta binds",
                            PPO_CLIPPED[0], "loss (4, -e^-200), gradient (0, -e^-200)", PPO_CLIPPED[1]),
    "surrogate.cispo": ("w = (1.2, e^-20), gradient -w A = (1.2, -e^-20); loss -w A l = (0, -20 e^-20)",
                        "w = (1.2, e^-20), gradient (-1.2, e^-20)",
                        "w = (1.2, e^-200), gradient (1.2, -e^-200); r = e^200 overflows float32 but only w is used",
                        "w = (1.2, e^-200), gradient (-1.2, e^-200)"),
    "surrogate.sapo": ("loss (4/1.05 = 3.8095238095, -4 sigma(e^-20 - 1) = -1.0757656871), gradient (4 sigma(x) sigma(-x) r "
                       "= e^(-5.1e8) = 0 in every format, -1.6209895952e-9)",
                       "loss (-4, 4 sigma(1.05 (e^-20 - 1))/1.05 = 0.98752419517), gradient (0 in every format, "
                       "1.5831922812e-9)",
                       "loss (3.8095238095, -1.0757656855), gradient (about e^(-7.6e86): exactly 0 in every format, and "
                       "no NaN where float32 e^200 = inf, -1.0883622861e-87)",
                       "loss (-4, 0.98752419359), gradient (about -e^(-7.2e86), 1.0629844729e-87)"),
}


def tok(inputs, advantages):
    return {**inputs, "advantages": advantages}


def _token_edges(fid):
    """Edge and random cases of the token-ratio formulas (advantages [B] or [B, T])."""
    clamp = "log_ratio_clamp" if fid != "surrogate.trl_delta" else None
    x20, x20c, x200, x200c = EXTREMES[fid]
    out = [
        Case(f"{fid}/padded-batch", fid, "example",
             "two right-padded sequences of lengths 3 and 2, d = (0.25, -0.5, 0.125 | 0, -0.25), per-token "
             "advantages (1, -1, 0.5 | -0.75, 1.5)", tok({"logprobs": LP, "old_logprobs": OLD, "mask": MASK}, A_TOK)),
        Case(f"{fid}/sequence-advantages", fid, "example",
             "the padded batch with one advantage per sequence, A = (1, -0.5), broadcast to the tokens",
             tok({"logprobs": LP, "old_logprobs": OLD, "mask": MASK}, A_SEQ)),
        Case(f"{fid}/zero-advantage", fid, "edge", "A = 0 at every token: loss 0 and gradient 0 (SAPO: tau_neg)",
             tok({"logprobs": LP, "old_logprobs": OLD, "mask": MASK}, [0.0, 0.0])),
        Case(f"{fid}/empty-sequence", fid, "edge",
             "the second sequence has no unmasked token: its outputs are null and its gradients 0",
             tok({"logprobs": LP, "old_logprobs": OLD, "mask": [MASK[0], [False] * 4]}, A_SEQ)),
        Case(f"{fid}/all-masked", fid, "edge", "no token counts anywhere: every output null, every gradient 0",
             tok({"logprobs": LP, "old_logprobs": OLD, "mask": [[False] * 4, [False] * 4]}, A_SEQ)),
        Case(f"{fid}/masked-nan-inf", fid, "edge",
             "NaN and infinities in logprobs, old_logprobs and the advantages at masked positions must reach no "
             "output or gradient (the one unmasked token has d = 0.5, A = 1)",
             tok(DIRTY, [[1.0, "nan", "inf", "-inf"]])),
        Case(f"{fid}/masked-nan-advantage", fid, "edge",
             "a NaN advantage at a masked position whose log-probs are finite (d = 0 there): it must reach neither "
             "the loss nor the gradient (the unmasked token has d = 0.5, A = 1)",
             tok({"logprobs": [[-1.0, -2.0]], "old_logprobs": [[-1.5, -2.0]], "mask": [[True, False]]},
                 [[1.0, "nan"]])),
        Case(f"{fid}/masked-overflowing-log-ratio", fid, "edge",
             "a masked token with finite log-probs whose log-ratio d = 1000 overflows exp in every dtype (A = 0 "
             "there): it must reach neither the loss nor the gradient (the unmasked token has d = 0.5, A = 1)",
             tok({"logprobs": [[-1.0, 0.0]], "old_logprobs": [[-1.5, -1000.0]], "mask": [[True, False]]},
                 [[1.0, 0.0]])),
        Case(f"{fid}/log-ratio-20", fid, "edge",
             f"d = +20 with A = -1 and d = -20 with A = 1 (the unclipped side of each sign for PPO): {x20}",
             tok(X20, [[-1.0, 1.0]])),
        Case(f"{fid}/log-ratio-20-clipped-side", fid, "edge",
             f"d = +20 with A = 1 and d = -20 with A = -1 (the clipped side of each sign for PPO): {x20c}",
             tok(X20, [[1.0, -1.0]])),
        Case(f"{fid}/log-ratio-200", fid, "edge",
             f"d = +200 with A = -1 and d = -200 with A = 1: {x200}",
             tok(X200, [[-1.0, 1.0]])),
        Case(f"{fid}/log-ratio-200-clipped-side", fid, "edge",
             f"d = +200 with A = 1 and d = -200 with A = -1: {x200c}",
             tok(X200, [[1.0, -1.0]])),
        Case(f"{fid}/log-ratio-200-zero-advantage", fid, "edge",
             "d = +200 and -200 with A = 0: loss and gradient exactly 0 (-A r = 0 however large r is; in float32 "
             "e^200 = inf and a zero advantage multiplied by it would be NaN)",
             tok(X200, [[0.0, 0.0]])),
        Case(f"{fid}/random-1", fid, "random",
             "generator inputs (seed 301), 3 sequences of lengths 16, 9 and 1, sequence advantages",
             random_inputs(301, 3, 16, ("logprobs", "old_logprobs", "mask", "advantages"), (16, 9, 1))),
        Case(f"{fid}/random-2", fid, "random", "generator inputs (seed 302), 4 sequences of 7, sequence advantages",
             random_inputs(302, 4, 7, ("logprobs", "old_logprobs", "mask", "advantages"))),
    ]
    if clamp:
        effect = ("w = (1.2, e^-20) from the clamped ratios, gradient -w A = (1.2, -e^-20): CISPO's gradient never "
                  "flows through the ratio" if fid == "surrogate.cispo" else
                  "the values of log-ratio-20, with gradient 0 through the clamp")
        out.append(Case(f"{fid}/log-ratio-200-clamped", fid, "edge",
                        f"d = +-200 (A = -1, 1) with log_ratio_clamp = 20 (verl, OpenRLHF, skyrl-train): {effect}",
                        tok(X200, [[-1.0, 1.0]]), {clamp: 20}))
    return out


def _pg():
    fid = "surrogate.pg"
    return _token_edges(fid) + [
        Case(f"{fid}/ratio-form", fid, "example",
             "d = (0.5, 0), A = (1, -0.5): loss -A r = (-e^0.5, 0.5) = (-1.6487212707, 0.5), gradient -A r, the same",
             tok(TWO, [[1.0, -0.5]])),
        Case(f"{fid}/logprob-form", fid, "example",
             "form = logprob (REINFORCE): l = (-1, -2), A = (1, -0.5): loss -A l = (1, -1), gradient -A = (-1, 0.5)",
             tok({"logprobs": TWO["logprobs"], "mask": T2}, [[1.0, -0.5]]), {"form": "logprob"}),
        Case(f"{fid}/on-policy-no-old", fid, "example",
             "old_logprobs omitted: r = exp(l - sg[l]) = 1, loss -A = (-1, 0.5), gradient -A (as REINFORCE)",
             tok({"logprobs": TWO["logprobs"], "mask": T2}, [[1.0, -0.5]])),
        Case(f"{fid}/clamped", fid, "example",
             "log_ratio_clamp = 0.25 caps d = 0.5: loss -e^0.25 = -1.2840254167 with gradient 0; d = 0 keeps "
             "loss 0.5 and gradient 0.5", tok(TWO, [[1.0, -0.5]]), {"log_ratio_clamp": 0.25}),
    ]


def _ppo():
    fid = "surrogate.ppo_clip"
    four = {"logprobs": [[-1.0, -2.0, -2.5, -1.0]], "old_logprobs": [[-1.5, -2.0, -2.0, -1.5]], "mask": [[True] * 4]}
    return _token_edges(fid) + [
        Case(f"{fid}/four-regions", fid, "example",
             "d = (0.5, 0, -0.5, 0.5), A = (1, -0.5, -1, -1), eps 0.2: r = (1.6487, 1, 0.6065, 1.6487); token 1 "
             "clipped (A > 0, r > 1.2): loss -1.2, gradient 0; token 2: loss 0.5 = gradient; token 3 clipped "
             "(A < 0, r < 0.8): loss 0.8, gradient 0; token 4 unclipped: loss = gradient = e^0.5 = 1.6487212707",
             tok(four, [[1.0, -0.5, -1.0, -1.0]])),
        Case(f"{fid}/dapo-clip-higher", fid, "example",
             "eps_high = 0.28 (DAPO): d = 0.5, r = e^0.5 = 1.6487 > 1.28 with A = 1 -> clipped, loss -1.28, "
             "gradient 0; d = 0.125, r = e^0.125 = 1.1331484531 < 1.28 -> loss = gradient = -1.1331484531",
             tok({"logprobs": [[-1.0, -2.0]], "old_logprobs": [[-1.5, -2.125]], "mask": T2}, [1.0]),
             {"eps_low": 0.2, "eps_high": "0.28"}),
        Case(f"{fid}/on-policy", fid, "example",
             "l = l_old: r = 1 inside the clip range, loss -A and gradient -A (each operand of the max gets half "
             "the cotangent): loss (-1, 1 | 0.75, -1.5)", tok({"logprobs": LP, "old_logprobs": LP, "mask": MASK}, A_TOK)),
        Case(f"{fid}/unclipped-sides", fid, "example",
             "d = (-0.5, 0.5) with A = (1, -1): A > 0 with a falling ratio and A < 0 with a rising ratio are never "
             "clipped: loss (-e^-0.5, e^0.5) = (-0.60653065971, 1.6487212707), gradient the same",
             tok({"logprobs": [[-2.0, -1.0]], "old_logprobs": [[-1.5, -1.5]], "mask": T2}, [[1.0, -1.0]])),
        Case(f"{fid}/scale-8192", fid, "scale",
             "two sequences of 8192 positions (lengths 8192 and 5000) from the generator, sequence advantages",
             Generated(seed=8193, B=2, T=8192, fields=("logprobs", "old_logprobs", "mask", "advantages"),
                       lengths=(8192, 5000))),
    ]


def _dual():
    fid = "surrogate.dual_clip"
    e = {"logprobs": [[0.0, 0.0, -1.0]], "old_logprobs": [[-1.0, -1.0, 0.0]], "mask": [[True] * 3]}
    return _token_edges(fid) + [
        Case(f"{fid}/bound-binds", fid, "example",
             "d = (2, 0.5), A = (-1, -1), c = 3: r_1 = e^2 = 7.389, PPO loss 7.389 > 3 -> loss 3, gradient 0; "
             "r_2 = e^0.5: loss = gradient = 1.6487212707 < 3, kept",
             tok({"logprobs": [[0.0, -1.0]], "old_logprobs": [[-2.0, -1.5]], "mask": T2}, [[-1.0, -1.0]])),
        Case(f"{fid}/slime-like-vector", fid, "example",
             "slime's test pattern with r = (e, e, e^-1) (ln 2 is not bfloat16-exact), A = (2, -2, 2), eps 0.2, "
             "c = 1.5: (-2.4 clipped; min(2e, 3) = 3 bound; -2 e^-1 = -0.73575888234 unclipped), gradients "
             "(0, 0, -0.73575888234)", tok(e, [[2.0, -2.0, 2.0]]), {"c": 1.5}),
        Case(f"{fid}/positive-advantage-untouched", fid, "example",
             "A >= 0 is never bounded: d = (2, -1) with A = (1, 0.5): loss (-1.2, -0.5 e^-1 = -0.18393972059), "
             "gradient (0, -0.18393972059), as surrogate.ppo_clip",
             tok({"logprobs": [[0.0, -1.0]], "old_logprobs": [[-2.0, 0.0]], "mask": T2}, [[1.0, 0.5]])),
        Case(f"{fid}/large-c", fid, "example",
             "c = 10 does not bind at r = e^2 = 7.3890560989 with A = -1: loss = gradient = 7.3890560989",
             tok({"logprobs": [[0.0]], "old_logprobs": [[-2.0]], "mask": [[True]]}, [-1.0]), {"c": 10}),
    ]


def _trl_delta():
    fid = "surrogate.trl_delta"
    return _token_edges(fid) + [
        Case(f"{fid}/three-regions", fid, "example",
             "d = (2, 1, 1), A = (-1, -1, 1), delta 4: r_1 = e^2 = 7.389 > 4: loss max(4, 1.2) = 4, gradient 0; "
             "r_2 = e = 2.7182818285 in (1.2, 4): loss = gradient = e; r_3 = e with A = 1: clipped, loss -1.2, "
             "gradient 0",
             tok({"logprobs": [[0.0, -1.0, -1.0]], "old_logprobs": [[-2.0, -2.0, -2.0]], "mask": [[True] * 3]},
                 [[-1.0, -1.0, 1.0]])),
        Case(f"{fid}/delta-below-clip", fid, "example",
             "delta = 1.125 < 1 + eps_high = 1.2: d = 0.125, r = 1.1331484531, A = 1: -A min(r, delta) = -1.125 "
             "wins over -A clip(r) = -1.1331: loss -1.125, gradient 0 (the cap binds, not the clip)",
             tok({"logprobs": [[-2.0]], "old_logprobs": [[-2.125]], "mask": [[True]]}, [1.0]), {"delta": 1.125}),
        Case(f"{fid}/cap-at-half-advantage", fid, "example",
             "d = 1.5, r = e^1.5 = 4.4817 > delta = 4, A = -0.5: loss 0.5 * 4 = 2, gradient 0; d = 1.25, "
             "r = e^1.25 = 3.4903429575 < 4: loss = gradient = 0.5 r = 1.7451714787",
             tok({"logprobs": [[0.0, 0.0]], "old_logprobs": [[-1.5, -1.25]], "mask": T2}, [-0.5])),
        Case(f"{fid}/intellect2-delta-4", fid, "regression",
             "INTELLECT-2's two-sided clipping (delta = 4, arXiv:2505.07291 section 4.1; TRL PR #3434): a "
             "negative-advantage token with r = e^3 = 20.09 contributes 4 |A| = 4, not 20.09, gradient 0; "
             "without the cap (surrogate.ppo_clip) it would be e^3 = 20.085536923",
             tok({"logprobs": [[0.0]], "old_logprobs": [[-3.0]], "mask": [[True]]}, [-1.0]),
             links=(LINKS["intellect2"], LINKS["trl3434"])),
    ]


def _cispo():
    fid = "surrogate.cispo"
    big = {"logprobs": [[0.0, -1.0]], "old_logprobs": [[-2.0, -0.5]], "mask": T2}   # d = (2, -0.5)
    return _token_edges(fid) + [
        Case(f"{fid}/relative", fid, "example",
             "relative, eps_high 0.2, no lower bound: d = (0.5, 0), A = 1: r = (1.6487, 1), w = (1.2, 1), loss "
             "-w A l = (1.2, 2), gradient -w A = (-1.2, -1)", tok(TWO, [1.0])),
        Case(f"{fid}/absolute", fid, "example",
             "absolute cap eps_high = 1.5 (ScaleRL, TRL): w = min(r, 1.5) = (1.5, 1), loss (1.5, 2), gradient "
             "(-1.5, -1)", tok(TWO, [1.0]), {"cap_form": "absolute", "eps_high": 1.5}),
        Case(f"{fid}/relative-lower-bound", fid, "example",
             "relative with eps_low = eps_high = 0.2 (verl, NeMo-RL, slime): d = (2, -0.5), r = (7.389, 0.6065), "
             "w = (1.2, 0.8), A = -1: gradient -w A = (1.2, 0.8), loss (0, -0.8)",
             tok(big, [-1.0]), {"eps_low": 0.2}),
        Case(f"{fid}/skyrl-031-cap-trap", fid, "regression",
             "skyrl-train 0.3.1's CISPO bounds eps_low = 0, eps_high = 5 give [1, 6]: d = (2, -0.5), r = (7.389, "
             "0.6065) -> w = (6, 1), A = 1: gradient (-6, -1) (SkyRL PR #1928 corrected the bounds to [0, 5])",
             tok(big, [1.0]), {"eps_low": 0, "eps_high": 5}, links=(LINKS["skyrl1928"],)),
        Case(f"{fid}/skyrl-1928-fixed-bounds", fid, "regression",
             "the corrected SkyRL bounds eps_low = 1, eps_high = 4 give [0, 5]: w = (5, e^-0.5 = 0.60653065971), "
             "A = 1: gradient (-5, -0.60653065971); the absolute form with eps_high = 5 gives the same w",
             tok(big, [1.0]), {"eps_low": 1, "eps_high": 4}, links=(LINKS["skyrl1928"],)),
        Case(f"{fid}/absolute-5", fid, "example",
             "absolute cap 5 (TRL's recommendation): w = (5, 0.60653065971), A = 1: gradient (-5, -0.60653065971)",
             tok(big, [1.0]), {"cap_form": "absolute", "eps_high": 5}),
    ]


def _sapo():
    fid = "surrogate.sapo"
    on = {"logprobs": TWO["logprobs"], "old_logprobs": TWO["logprobs"], "mask": T2}
    return _token_edges(fid) + [
        Case(f"{fid}/two-tokens", fid, "example",
             "d = (0.5, 0), A = (1, -1): token 1 x = e^0.5 - 1 = 0.6487, p = sigma(x) = 0.65672, loss -4p = "
             "-2.6268889845, gradient -4p(1 - p) r = -1.4867386106; token 2 on-policy with tau_neg = 1.05: loss "
             "2/1.05 = 1.9047619048, gradient 1", tok(TWO, [[1.0, -1.0]])),
        Case(f"{fid}/anchor-f1-default-tau", fid, "regression",
             "the SAPO gate's anchor f(1) = 2/tau, f'(1) = 1 (arXiv:2511.20347 section 3): on-policy with A = (1, "
             "-1): loss (-2, 2/1.05 = 1.9047619048), gradient -A = (-1, 1)", tok(on, [[1.0, -1.0]]),
             links=(LINKS["sapo"],)),
        Case(f"{fid}/anchor-f1-other-tau", fid, "regression",
             "f(1) = 2/tau with tau_pos = 0.5, tau_neg = 3: on-policy, A = (2, -0.5): loss (-2 * 4 = -8, "
             "0.5 * 2/3 = 0.33333333333), gradient -A = (-2, 0.5)", tok(on, [[2.0, -0.5]]),
             {"tau_pos": 0.5, "tau_neg": 3}, links=(LINKS["sapo"],)),
        Case(f"{fid}/saturating-gate", fid, "example",
             "d = (1.5, 2.5), A = 1: x = e^1.5 - 1 = 3.4816891 and e^2.5 - 1 = 11.182494; 1 - p = sigma(-x) = "
             "0.029837747 and 1.3915491e-5: loss -4p = (-3.8806490133, -3.999944338), gradient -4 p (1 - p) r = "
             "(-0.51893398045, -6.7809210528e-4); 1 - sigmoid(x) in float32 loses about 1 and 4.5 of 1 - p's 7 digits",
             tok({"logprobs": [[0.0, 0.0]], "old_logprobs": [[-1.5, -2.5]], "mask": T2}, [1.0])),
        Case(f"{fid}/negative-advantage-falling-ratio", fid, "example",
             "d = (-1.5, -0.5), A = -1, tau_neg 1.05: x = 1.05 (e^d - 1) = (-0.81571, -0.41314); loss 4 sigma(x)"
             "/1.05 = (1.1682832664, 1.5167953329), gradient 4 sigma(x) sigma(-x) r = (0.18977237608, 0.58136780091)",
             tok({"logprobs": [[-1.5, -0.5]], "old_logprobs": [[0.0, 0.0]], "mask": T2}, [-1.0])),
    ]


SEQ_PADDED = {
    "surrogate.gspo": "s = (e^(-0.125/3) = 0.95918945711, e^-0.125 = 0.88249690258); s_1 with A = 1 is on the "
                      "unclipped side (loss -s_1, gradient -s_1/3 = -0.31972981904), s_2 with A = -0.5 is below "
                      "1 - 3e-4: clipped, loss 0.5 * 0.9997 = 0.49985, gradient 0",
    "surrogate.gmpo": "no token reaches the bounds +-0.4: g = (0.95918945711, 0.88249690258), loss -A g = "
                      "(-0.95918945711, 0.44124845129), gradient -A g / L",
    "surrogate.vespo": "sampler log-probs give IS log-ratios (0, 0.75, 0 | 0.25, 0): log w = (0.625, 0); phi_1 with "
                       "(k, lambda) = (2, 3) is e^(3 + 1.25 - 3 e^0.625) = 0.25801491845, phi_2 = 1",
}


def _seq_edges(fid, fields=("logprobs", "old_logprobs", "mask", "advantages")):
    extra = {}
    if "sampler_logprobs" in fields:
        extra = {"sampler_logprobs": [[-1.25, -2.75, -0.5, "nan"], [-0.75, -2.75, "inf", "-inf"]]}
    dirty = {**DIRTY, "advantages": [1.0]}
    if "sampler_logprobs" in fields:
        dirty["sampler_logprobs"] = [[-1.5, "inf", "-inf", "nan"]]
    return [
        Case(f"{fid}/padded-batch", fid, "example",
             "two right-padded sequences of lengths 3 and 2, d = (0.25, -0.5, 0.125 | 0, -0.25), A = (1, -0.5): "
             + SEQ_PADDED[fid],
             {"logprobs": LP, "old_logprobs": OLD, "mask": MASK, "advantages": A_SEQ, **extra}),
        Case(f"{fid}/zero-advantage", fid, "edge", "A = 0 for both sequences: loss 0 (VESPO: its value -0 l), gradient 0",
             {"logprobs": LP, "old_logprobs": OLD, "mask": MASK, "advantages": [0.0, 0.0], **extra}),
        Case(f"{fid}/empty-sequence", fid, "edge",
             "the second sequence (A = -0.5) has no unmasked token: loss 0 (VESPO: phi = 1, no token), no "
             "gradient; its masked positions hold the usual values",
             {"logprobs": LP, "old_logprobs": OLD, "mask": [MASK[0], [False] * 4], "advantages": A_SEQ, **extra}),
        Case(f"{fid}/all-masked", fid, "edge", "no token counts anywhere: every sequence empty",
             {"logprobs": LP, "old_logprobs": OLD, "mask": [[False] * 4, [False] * 4], "advantages": A_SEQ, **extra}),
        Case(f"{fid}/masked-nan-inf", fid, "edge",
             "NaN and infinities at masked positions must reach no output or gradient (the one unmasked token "
             "has d = 0.5, A = 1)", dirty),
        Case(f"{fid}/random-1", fid, "random",
             "generator inputs (seed 311), 3 sequences of lengths 16, 9 and 1",
             random_inputs(311, 3, 16, fields, (16, 9, 1))),
        Case(f"{fid}/random-2", fid, "random", "generator inputs (seed 312), 4 sequences of 7",
             random_inputs(312, 4, 7, fields)),
    ]


def _gspo():
    fid = "surrogate.gspo"
    pair = {"logprobs": [[-1.0, -2.0], [-1.0, -2.0]], "old_logprobs": [[-1.5, -2.0], [-1.5, -2.0]], "mask": [[True] * 2] * 2}
    return _seq_edges(fid) + [
        Case(f"{fid}/two-sequences", fid, "example",
             "d = (0.5, 0) in both: s = e^0.25 = 1.2840254167; A_1 = -1: unclipped, loss s, gradient -A s/2 = "
             "0.64201270834 per token; A_2 = 1: clipped at 1 + 4e-4, loss -1.0004, gradient 0",
             {**pair, "advantages": [-1.0, 1.0]}),
        Case(f"{fid}/on-policy", fid, "example",
             "l = l_old: s = 1, loss -A = (-1, 0.5), gradient -A/L = (-1/3, 1/4) per token (sample-mean PG)",
             {"logprobs": LP, "old_logprobs": LP, "mask": MASK, "advantages": A_SEQ}),
        Case(f"{fid}/inside-paper-clip-range", fid, "example",
             "d = (2^-10, 0, 0, 0): log s = 2^-12, s = e^(2^-12) = 1.0002441704 < 1 + 4e-4, A = 1: unclipped, "
             "loss -s, gradient -s/4 = -0.25006104261 per token",
             {"logprobs": [[-2.0 ** -10, -2.0, -0.5, -0.25]], "old_logprobs": [[-2.0 ** -9, -2.0, -0.5, -0.25]],
              "mask": [[True] * 4], "advantages": [1.0]}),
        Case(f"{fid}/framework-eps", fid, "example",
             "eps 0.2 (verl, TRL, Liger defaults) on the padded batch: log s = (-0.125/3 | -0.125), s = (0.95918, "
             "0.88250) inside [0.8, 1.2]: loss -A s, gradient -A s / L",
             {"logprobs": LP, "old_logprobs": OLD, "mask": MASK, "advantages": A_SEQ}, {"eps_low": 0.2, "eps_high": 0.2}),
        Case(f"{fid}/verl-cap-10", fid, "example",
             "log_ratio_max = 10 (verl): d = (12, 12), A = -1: log s = 12 capped at 10, loss e^10 = "
             "22026.465794806718, gradient 0",
             {"logprobs": [[0.0, 0.0]], "old_logprobs": [[-12.0, -12.0]], "mask": T2, "advantages": [-1.0]},
             {"log_ratio_max": 10}),
        Case(f"{fid}/log-ratio-20", fid, "edge",
             "sequence 1 d = (20, 20), A = -1: s = e^20, loss e^20 = 485165195.41, gradient e^20/2 per token; "
             "sequence 2 d = (-20, -20), A = 1: loss -e^-20 = -2.0611536224e-9, gradient -e^-20/2",
             {"logprobs": [[0.0, 0.0], [-20.0, -20.0]], "old_logprobs": [[-20.0, -20.0], [0.0, 0.0]],
              "mask": [[True] * 2] * 2, "advantages": [-1.0, 1.0]}),
        Case(f"{fid}/log-ratio-200", fid, "edge",
             "sequence 1 d = (200, 200), A = -1: s = e^200 = 7.2e86, loss and gradients overflow float32 (an "
             "infinity passes by overflow); sequence 2 d = (200, -200), A = 1: s = 1, loss -1, gradient -1/2",
             {"logprobs": [[0.0, 0.0], [0.0, -200.0]], "old_logprobs": [[-200.0, -200.0], [-200.0, 0.0]],
              "mask": [[True] * 2] * 2, "advantages": [-1.0, 1.0]}),
        Case(f"{fid}/log-ratio-200-zero-advantage", fid, "edge",
             "d = (200, 200) and (-200, -200) with A = 0: s = e^200 and e^-200, loss and gradient exactly 0 (in "
             "float32 s = inf, and a zero advantage multiplied by it would be NaN)",
             {"logprobs": [[0.0, 0.0], [-200.0, -200.0]], "old_logprobs": [[-200.0, -200.0], [0.0, 0.0]],
              "mask": [[True] * 2] * 2, "advantages": [0.0, 0.0]}),
        Case(f"{fid}/log-ratio-200-clipped-side", fid, "edge",
             "d = (200, 200) with A = 1 and (-200, -200) with A = -1: both clipped, loss (-1.0004, 0.9997), "
             "gradient exactly 0 (no 0 * inf = NaN where e^200 overflows float32)",
             {"logprobs": [[0.0, 0.0], [-200.0, -200.0]], "old_logprobs": [[-200.0, -200.0], [0.0, 0.0]],
              "mask": [[True] * 2] * 2, "advantages": [1.0, -1.0]}),
        Case(f"{fid}/scale-8192", fid, "scale",
             "two sequences of 8192 positions (lengths 8192 and 3000) from the generator: one loss per sequence, "
             "gradient -A s / L per token where unclipped",
             Generated(seed=8194, B=2, T=8192, fields=("logprobs", "old_logprobs", "mask", "advantages"),
                       lengths=(8192, 3000))),
    ]


def _gmpo():
    fid = "surrogate.gmpo"
    one = {"mask": [[True]]}
    return _seq_edges(fid) + [
        Case(f"{fid}/two-tokens", fid, "example",
             "d = (0.5, 0), A = 1: 0.5 is capped at 0.4, g = e^((0.4 + 0)/2) = e^0.2 = 1.2214027582, loss -g, "
             "gradient (0, -g/2 = -0.61070137908)", {**TWO, "advantages": [1.0]}),
        Case(f"{fid}/negative-advantage", fid, "example",
             "d = (0.5, -1), A = -1: the floor -0.4 binds on -1, g = e^((0.5 - 0.4)/2) = e^0.05 = 1.0512710964, "
             "loss g, gradient (g/2 = 0.52563554819, 0)",
             {"logprobs": [[-1.0, -2.0]], "old_logprobs": [[-1.5, -1.0]], "mask": T2, "advantages": [-1.0]}),
        Case(f"{fid}/on-policy", fid, "example",
             "l = l_old: g = 1, loss -A = (-1, 0.5), gradient -A/L = (-1/3, 1/4)",
             {"logprobs": LP, "old_logprobs": LP, "mask": MASK, "advantages": A_SEQ}),
        Case(f"{fid}/delta-0.4-upper-bound", fid, "regression",
             "GMPO's default clip delta = 0.4 (arXiv:2507.20673 Algorithm 1): d = 1 with A = 1 is capped at 0.4, "
             "loss -e^0.4 = -1.4918246976, gradient 0",
             {**one, "logprobs": [[0.0]], "old_logprobs": [[-1.0]], "advantages": [1.0]}, links=(LINKS["gmpo"],)),
        Case(f"{fid}/delta-0.4-lower-bound", fid, "regression",
             "d = -1 with A = -1 is floored at -0.4 (arXiv:2507.20673): loss e^-0.4 = 0.67032004604, gradient 0",
             {**one, "logprobs": [[-1.0]], "old_logprobs": [[0.0]], "advantages": [-1.0]}, links=(LINKS["gmpo"],)),
        Case(f"{fid}/unclipped-sides", fid, "example",
             "d = -1 with A = 1 and d = 1 with A = -1 pass through: loss (-e^-1 = -0.36787944117, e = "
             "2.7182818285), gradient the same",
             {"logprobs": [[-1.0], [0.0]], "old_logprobs": [[0.0], [-1.0]], "mask": [[True], [True]],
              "advantages": [1.0, -1.0]}),
        Case(f"{fid}/log-ratio-20", fid, "edge",
             "d = (20, -20): A = 1 caps 20 at 0.4, g = e^((0.4 - 20)/2) = e^-9.8, loss -5.5451599432e-5; A = -1 "
             "floors -20 at -0.4, g = e^9.8 = 18033.744928, loss g",
             {"logprobs": [[0.0, -20.0], [0.0, -20.0]], "old_logprobs": [[-20.0, 0.0], [-20.0, 0.0]],
              "mask": [[True] * 2] * 2, "advantages": [1.0, -1.0]}),
        Case(f"{fid}/log-ratio-200", fid, "edge",
             "d = (200, -200): A = 1 gives g = e^((0.4 - 200)/2) = e^-99.8 (underflows float32), A = -1 gives "
             "g = e^99.8 (overflows float32: an infinity passes by overflow)",
             {"logprobs": [[0.0, -200.0], [0.0, -200.0]], "old_logprobs": [[-200.0, 0.0], [-200.0, 0.0]],
              "mask": [[True] * 2] * 2, "advantages": [1.0, -1.0]}),
        Case(f"{fid}/log-ratio-200-zero-advantage", fid, "edge",
             "d = (200, 200) and (-200, -200) with A = 0 (sgn(0) = -1: the clip floors, so 200 passes): g = e^200 "
             "and e^-200, loss and gradient exactly 0 (in float32 g = inf, times A = 0 would be NaN)",
             {"logprobs": [[0.0, 0.0], [-200.0, -200.0]], "old_logprobs": [[-200.0, -200.0], [0.0, 0.0]],
              "mask": [[True] * 2] * 2, "advantages": [0.0, 0.0]}),
        Case(f"{fid}/asymmetric-bounds", fid, "example",
             "eps_low = 0.25, eps_high = 0.5 on d = (0.75, -0.75): A = 1: (0.5, -0.75), g = e^-0.125 = "
             "0.88249690258; A = -1: (0.75, -0.25), g = e^0.25 = 1.2840254167",
             {"logprobs": [[0.0, -0.75], [0.0, -0.75]], "old_logprobs": [[-0.75, 0.0], [-0.75, 0.0]],
              "mask": [[True] * 2] * 2, "advantages": [1.0, -1.0]}, {"eps_low": 0.25, "eps_high": 0.5}),
    ]


def _vespo():
    fid = "surrogate.vespo"
    fields = ("logprobs", "old_logprobs", "sampler_logprobs", "mask", "advantages")
    out = _seq_edges(fid, fields)
    out += [
        Case(f"{fid}/random-no-sampler-1", fid, "random",
             "generator inputs (seed 313), 3 sequences of lengths 16, 9 and 1, no sampler_logprobs",
             random_inputs(313, 3, 16, ("logprobs", "old_logprobs", "mask", "advantages"), (16, 9, 1))),
        Case(f"{fid}/random-no-sampler-2", fid, "random",
             "generator inputs (seed 314), 4 sequences of 7, no sampler_logprobs",
             random_inputs(314, 4, 7, ("logprobs", "old_logprobs", "mask", "advantages"))),
    ]
    out += [
        Case(f"{fid}/positive-advantage", fid, "example",
             "d = (0.5, 0), A = 1, (k, lambda) = (2, 3): log w = 0.5, phi = e^(3 + 2 * 0.5 - 3 e^0.5) = "
             "0.38822748404; gradient -phi A = -0.38822748404 per token", {**TWO, "advantages": [1.0]}),
        Case(f"{fid}/with-sampler", fid, "example",
             "l_mu = (-1.25, -2.25): IS log-ratios (-0.25, 0.25) cancel, log w = 0.5; A = -1, (k, lambda) = (3, 2): "
             "phi = e^(2 + 1.5 - 2 e^0.5) = 1.2245304429, gradient phi = 1.2245304429 per token",
             {**TWO, "sampler_logprobs": [[-1.25, -2.25]], "advantages": [-1.0]}),
        Case(f"{fid}/on-policy", fid, "example",
             "l = l_old: w = 1, phi = 1 (on-policy VESPO is REINFORCE): gradient -A = (-1 | 0.5) per token",
             {"logprobs": LP, "old_logprobs": LP, "mask": MASK, "advantages": A_SEQ}),
        Case(f"{fid}/weight-floor", fid, "example",
             "d = (-12, -12): log w = -24 is floored at log(1e-8) = -18.420680744, A = 1: phi = 1e-16 "
             "e^(3 (1 - 1e-8)) = 2.0085536321e-15, loss -phi A l = 12 phi = 2.4102643585e-14 per token",
             {"logprobs": [[-12.0, -12.0]], "old_logprobs": [[0.0, 0.0]], "mask": T2, "advantages": [1.0]}),
        Case(f"{fid}/token-clamp-and-cap", fid, "edge",
             "d = (30, -5): the token clamp 20 gives log w = 20 - 5 = 15, phi = e^(3 + 30 - 3 e^15) (about "
             "e^-9.8e6, 0 in every format)",
             {"logprobs": [[0.0, -5.0]], "old_logprobs": [[-30.0, 0.0]], "mask": T2, "advantages": [1.0]}),
        Case(f"{fid}/no-token-clamp", fid, "edge",
             "d = (30, -15) with log_ratio_clamp null: log w = 15 (with the default token clamp 20 it would be "
             "20 - 15 = 5); A = -1, (k, lambda) = (3, 2): phi = e^(2 + 45 - 2 e^15) (0 in every format)",
             {"logprobs": [[0.0, -15.0]], "old_logprobs": [[-30.0, 0.0]], "mask": T2, "advantages": [-1.0]},
             {"log_ratio_clamp": None}),
        Case(f"{fid}/log-ratio-20", fid, "edge",
             "d = (20, -20) in one sequence: log w = 0, phi = 1; d = (-20) alone, A = -1: log w = -18.42 (floor), "
             "phi = 1e-24 e^(2 (1 - 1e-8)) = 7.3890559511e-24",
             {"logprobs": [[0.0, -20.0], [-20.0, 0.0]], "old_logprobs": [[-20.0, 0.0], [0.0, 0.0]],
              "mask": [[True, True], [True, False]], "advantages": [1.0, -1.0]}),
        Case(f"{fid}/log-ratio-200", fid, "edge",
             "d = 200 clamped to 20 (log w = 20, phi = e^(3 + 40 - 3 e^20), 0 in every format) and d = -200 "
             "clamped to -20 then floored at log(1e-8) (phi = 2.0085536321e-15)",
             {"logprobs": [[0.0], [-200.0]], "old_logprobs": [[-200.0], [0.0]], "mask": [[True], [True]],
              "advantages": [1.0, 1.0]}),
        Case(f"{fid}/is-ratio-clamps", fid, "edge",
             "sampler log-ratios l_old - l_mu = (25, -25) are clamped to 20 and log(1e-8) each before summing: "
             "log w = 0.5 + 20 - 18.420680744 = 2.079319256, A = 1: phi = e^(3 + 2 log w - 3 w)",
             {**TWO, "sampler_logprobs": [[-26.5, 23.0]], "advantages": [1.0]}),
        Case(f"{fid}/lambda-floor", fid, "example",
             "lambda_pos = 0 is floored at lambda_min = 1e-4, k_pos = 1: phi = w e^(1e-4 (1 - w)) at w = e^0.5: "
             "1.6486143181", {**TWO, "advantages": [1.0]}, {"k_pos": 1, "lambda_pos": 0}),
    ]
    return out


def _gspo_clamp_placement():
    """Liger-Kernel fork PR #4: the per-token clamp before the sequence mean vs the cap on the mean."""
    fid = "surrogate.gspo"
    d30 = {"logprobs": [[0.0, -1.0]], "old_logprobs": [[-30.0, -1.0]], "mask": [[True, True]], "advantages": [-1.0]}
    return [
        Case(f"{fid}/per-token-clamp-30-0", fid, "example",
             "d = (30, 0), A = -1, log_ratio_clamp 20 (Liger-Kernel fork PR #4): s = e^10 above 1 + eps_high, "
             "unclipped branch -A s = e^10 = 22026.465794806718; gradient (0, e^10/2)", d30, {"log_ratio_clamp": 20}),
        Case(f"{fid}/mean-cap-20-30-0", fid, "example",
             "d = (30, 0), A = -1, log_ratio_max 20 (cap on the mean, not reached): loss e^15 = 3269017.3724721107, "
             "gradient e^15/2 per token", d30, {"log_ratio_max": 20}),
        Case(f"{fid}/per-token-clamp-negative", fid, "edge",
             "the clamp's lower side: d = (-30, 0), A = 1, log_ratio_clamp 20, eps 0.2: s = e^-10 below 0.8 is the "
             "unclipped branch for A > 0: loss -e^-10 = -4.539992976e-5, gradient (0, -e^-10/2)",
             {"logprobs": [[-30.0, -1.0]], "old_logprobs": [[0.0, -1.0]], "mask": [[True, True]], "advantages": [1.0]},
             {"log_ratio_clamp": 20, "eps_low": 0.2, "eps_high": 0.2}),
        Case(f"{fid}/per-token-clamp-positive-advantage", fid, "edge",
             "d = (30, 0), A = 1, log_ratio_clamp 20: s = e^10 is clipped at 1 + 4e-4: loss -1.0004, gradient 0",
             {**d30, "advantages": [1.0]}, {"log_ratio_clamp": 20}),
    ]


FASTLLM_502 = ("https://github.com/ServiceNow/Fast-LLM/pull/502",)


def _gspo_document():
    """Fast-LLM PR #502: GSPO over packed documents (document ids global across rows)."""
    fid = "surrogate.gspo_document"
    lp = [[-1.0, -2.0, -0.5], [-1.0, -3.0, -2.0]]
    old = [[-1.5, -2.0, -0.5], [-1.0, -2.5, -2.0]]
    mask = [[True, True, True], [True, True, False]]
    docs = [[0, 0, 1], [1, 2, 2]]
    adv = [[-1.0, -1.0, 2.0], [2.0, 0.5, 0.5]]
    base = {"logprobs": lp, "old_logprobs": old, "mask": mask, "advantages": adv, "document_ids": docs}
    gen = random_inputs(321, 3, 12, ("logprobs", "old_logprobs", "mask", "advantages"), (12, 7, 10))
    gen_docs = [[t // 4 for t in range(12)], [3] * 3 + [4] * 9, [4] * 2 + [5] * 10]
    gen_tok = [[gen["advantages"][i] * (1 + 0.25 * (t % 3)) for t in range(12)] for i in range(3)]
    return [
        Case(f"{fid}/three-documents", fid, "example",
             "documents 0 = row 0 tokens 0-1 (d = 0.5, 0; A = -1, -1), 1 = row 0 token 2 + row 1 token 0 (d = 0, 0; "
             "A = 2, 2), 2 = row 1 token 1 (d = -0.5; A = 0.5): R = (e^0.25, 1, e^-0.5), A_s = (-1, 2, 0.5); losses "
             "(1.2840254167, -2, -0.30326532986) (all unclipped), weighted by N_s = (2, 2, 1); gradient -A_s R_s at "
             "every token of s: (1.2840254167, 1.2840254167, -2 | -2, -0.30326532986)", base, links=FASTLLM_502),
        Case(f"{fid}/on-policy", fid, "example",
             "on-policy (old_logprobs = logprobs): every R_s = 1 (never clipped), so L_s = -A_s, the document mean "
             "of surrogate.pg's token loss -A_{i,t}: L = (1, -2, -0.5), weighted_loss = -(sum of A over s) = "
             "(2, -4, -0.5), gradient -A_s at every token of s: (1, 1, -2 | -2, -0.5)",
             {**base, "old_logprobs": lp}, links=FASTLLM_502),
        Case(f"{fid}/clipped-document", fid, "example",
             "one document of two tokens, d = (0.5, 0.5), A = 1: R = e^0.5 = 1.6487 > 1.2 clipped: loss -1.2, "
             "weighted -2.4, gradient 0",
             {"logprobs": [[-1.0, -1.0]], "old_logprobs": [[-1.5, -1.5]], "mask": [[True, True]], "advantages": [1.0],
              "document_ids": [[7, 7]]}, links=FASTLLM_502),
        Case(f"{fid}/sequence-advantages", fid, "example",
             "[B] advantages broadcast to the tokens: document 1 spans both rows (A = 0.75 and -1.25): A_1 = -0.25",
             {**base, "advantages": [0.75, -1.25]}),
        Case(f"{fid}/paper-eps", fid, "edge", "GSPO v2's 3e-4 / 4e-4 instead of Fast-LLM's 0.2",
             base, {"eps_low": 3e-4, "eps_high": 4e-4}),
        Case(f"{fid}/log-ratio-20", fid, "edge",
             "two one-token documents with d = +20 and -20, A = -1 and 1: R = e^20 (loss e^20), e^-20",
             {"logprobs": [[0.0, -20.0]], "old_logprobs": [[-20.0, 0.0]], "mask": [[True, True]],
              "advantages": [[-1.0, 1.0]], "document_ids": [[0, 1]]}),
        Case(f"{fid}/all-masked", fid, "edge", "no unmasked token: no document, every output empty",
             {**base, "mask": [[False] * 3, [False] * 3]}),
        Case(f"{fid}/masked-nan-inf", fid, "edge",
             "NaN and infinities (and stray document ids) at masked positions must reach no output or gradient",
             {"logprobs": [[-1.0, "nan", -0.5]], "old_logprobs": [[-1.5, "inf", -0.5]], "mask": [[True, False, True]],
              "advantages": [[1.0, "nan", -1.0]], "document_ids": [[0, 9, 1]]}),
        Case(f"{fid}/random-packed", fid, "random",
             "generator inputs (seed 321), 3 rows of 12 (lengths 12, 7, 10), 6 documents (4 and 5 span rows), "
             "per-token advantages",
             {**gen, "advantages": gen_tok, "document_ids": gen_docs}),
        Case(f"{fid}/scale-8192", fid, "scale",
             "two rows of 8192 positions (lengths 8192 and 5000), 4 documents per row, from the generator",
             Generated(seed=8193, B=2, T=8192, fields=("logprobs", "old_logprobs", "mask", "advantages", "document_ids"),
                       lengths=(8192, 5000), documents=4)),
    ]


def _binding():
    """Clamps set where they take no effect, and the VESPO token clamp's lower side taking effect above
    the weight floor (pgspec golden coverage)."""
    padded = {"logprobs": LP, "old_logprobs": OLD, "mask": MASK}
    out = [Case(f"{fid}/log-ratio-clamp-inactive", fid, "edge",
                "log_ratio_clamp = 20 on the padded batch (log-ratios within +-0.5): the clamp changes nothing",
                tok(padded, A_TOK), {"log_ratio_clamp": 20})
           for fid in ("surrogate.pg", "surrogate.ppo_clip", "surrogate.dual_clip", "surrogate.cispo",
                       "surrogate.sapo")]
    out.append(Case("surrogate.gspo/log-ratio-max-inactive", "surrogate.gspo", "edge",
                    "log_ratio_max = 20 on the padded batch (mean log-ratios -0.042 and -0.125): no effect",
                    {**padded, "advantages": A_SEQ}, {"log_ratio_max": 20}))
    out.append(Case("surrogate.vespo/token-clamp-lower", "surrogate.vespo", "edge",
                    "d = (-3, 1) with log_ratio_clamp = 2: log w = -2 + 1 = -1 (unclamped -2), above the floor "
                    "log(1e-8), so the lower clamp shows; A = 1, (k, lambda) = (2, 3): phi = e^(3 - 2 - 3 e^-1) = "
                    "0.90155, gradient -phi per token",
                    {"logprobs": [[-3.0, 0.0]], "old_logprobs": [[0.0, -1.0]], "mask": T2, "advantages": [1.0]},
                    {"log_ratio_clamp": 2}))
    return out


def _at_768(value):
    """value with every +-200 of its inputs' nested lists made +-768."""
    if isinstance(value, dict):
        return {k: _at_768(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_at_768(v) for v in value]
    if isinstance(value, float) and abs(value) == 200.0:
        return value / 200.0 * 768.0
    return value


def _float64_overflow(cases):
    """The log-ratio-200 cases with A = 0, and those on the clipped side of a bounded surrogate, again with
    log-ratios of +-768: e^768 overflows float64 too (past 709.78), where e^200 overflows float32 only.  pgspec
    fuzz found the float64 regime (Unsloth: NaN at 768 in surrogate.gspo, ppo_clip and trl_delta)."""
    out = []
    for c in cases:
        slug = c.id.split("/", 1)[1]
        if slug == "log-ratio-200-zero-advantage":
            what = "A = 0: loss and gradient exactly 0 (a ratio of inf times a zero advantage would be NaN)"
        elif slug == "log-ratio-200-clipped-side" and c.formula != "surrogate.pg":
            what = ("each on its clipped side: a bounded loss and gradient 0 on the clipped tokens (the clipped "
                    "branch's zero cotangent times the ratio's derivative e^768 = inf would be NaN)")
        else:
            continue
        out.append(Case(c.id.replace("200", "768"), c.formula, "edge",
                        f"the inputs of {slug} with log-ratios +-768 for +-200, {what}; e^768 overflows float64 as "
                        "well as float32 (past 709.78)", _at_768(c.inputs), c.params))
    return out


def cases():
    out = (_pg() + _ppo() + _dual() + _trl_delta() + _gspo() + _gmpo() + _cispo() + _sapo() + _vespo()
           + _binding() + _gspo_clamp_placement() + _gspo_document())
    return out + _float64_overflow(out)
