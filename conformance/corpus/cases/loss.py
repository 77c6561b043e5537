"""Golden cases of the loss family (spec/loss.md): the composite recipes.

Every recipe gets hand-checkable examples, the edge cases (empty sequence, all-masked batch,
NaN/inf at masked positions, on-policy, log-ratios of +-20 and +-200, clamps, parameter extremes),
one case per common option (IS weight at each level and mode, OPSM, entropy mask, every KL
estimator with beta > 0), random and scale cases.  Each case carries exactly the inputs its
parameters need (spec/loss.md, Inputs: an input no enabled option reads is an error).
"""

from __future__ import annotations

from pgspec.reference import REGISTRY

from .case import Case, Generated, random_inputs

IDS = ("loss.grpo", "loss.dapo", "loss.dr_grpo", "loss.bnpo", "loss.gspo", "loss.cispo", "loss.sapo", "loss.gmpo",
       "loss.luspo", "loss.vespo", "loss.minirl")
TOKEN_ADV = ("loss.grpo", "loss.dapo", "loss.dr_grpo", "loss.bnpo", "loss.cispo", "loss.sapo", "loss.minirl")
PPO = ("loss.grpo", "loss.dapo", "loss.dr_grpo", "loss.bnpo")
GROUPED = ("loss.dapo", "loss.cispo")

# the option batch (as tests/test_loss.py): lengths 3, 2 and 4
LP = [[-1.0, -2.5, -0.375, -4.0], [-0.5, -3.0, -1.25, -2.0], [-0.75, -1.5, -2.25, -0.25]]
OLD = [[-1.25, -2.0, -0.5, -3.5], [-0.5, -2.75, -1.0, -2.5], [-0.875, -1.5, -2.0, -0.5]]
MASK = [[True, True, True, False], [True, True, False, False], [True, True, True, True]]
A_SEQ = [0.75, -1.25, 0.5]
A_TOK = [[0.75, -0.5, 1.5, 9.0], [-2.0, 1.0, 7.0, 7.0], [0.5, 0.25, -1.0, 0.75]]  # row 1: mean -0.5 < 0
REF = [[-1.125, -2.25, -0.5, 0.0], [-0.75, -2.5, -1.0, 0.0], [-0.5, -1.75, -2.0, -0.375]]
# l_old - l_mu = (0.25, 0.125, 0.125), (-0.125, -0.125), (0, 0.0625, 0, 0.0625): sequence sums 0.5, -0.25, 0.125
SAMPLER = [[-1.5, -2.125, -0.625, -3.5], [-0.375, -2.625, -1.0, -2.5], [-0.875, -1.5625, -2.0, -0.5625]]
ENTROPY = [[0.5, 1.25, 2.0, 0.0], [0.25, 3.0, 1.0, 0.0], [1.5, 0.75, 2.5, 0.125]]
GROUPS = [0, 0, 1]
BATCH = {"logprobs": LP, "old_logprobs": OLD, "mask": MASK, "advantages": A_SEQ, "sampler_logprobs": SAMPLER,
         "ref_logprobs": REF, "group_ids": GROUPS, "entropy": ENTROPY}

NONE = [[False] * 4] * 3
EMPTY_ROW = [MASK[0], [False] * 4, MASK[2]]

# NaN / inf at masked positions of every input
DIRTY = {"logprobs": [[-1.0, -0.5, "nan"], [-0.25, "inf", "-inf"]],
         "old_logprobs": [[-1.25, -0.5, "-inf"], [-0.5, "nan", "inf"]],
         "mask": [[True, True, False], [True, False, False]],
         "advantages": [1.0, -0.5],
         "sampler_logprobs": [[-1.0, -0.75, "inf"], [-0.5, "-inf", "nan"]],
         "ref_logprobs": [[-1.5, -0.5, "nan"], [-0.25, "inf", "-inf"]],
         "group_ids": [0, 1],
         "entropy": [[1.0, 0.5, "nan"], [2.0, "inf", "nan"]]}


def extreme(c):
    """Four sequences of two tokens, log-ratios +c (rows 0, 1) and -c (rows 2, 3), A = +1, -1, +1, -1."""
    return {"logprobs": [[0.0, -1.0], [0.0, -1.0], [-c, -c - 1.0], [-c, -c - 1.0]],
            "old_logprobs": [[-c, -c - 1.0], [-c, -c - 1.0], [0.0, -1.0], [0.0, -1.0]],
            "mask": [[True, True]] * 4, "advantages": [1.0, -1.0, 1.0, -1.0],
            "group_ids": [0, 0, 1, 1]}


def default(fid, name):
    return next(p.default for p in REGISTRY[fid].params if p.name == name)


def get(fid, params, name):
    return params[name] if name in params else default(fid, name)


def needed(fid, params):
    """The optional inputs a recipe reads with these parameters."""
    out = set()
    if float(get(fid, params, "beta")) > 0:
        out.add("ref_logprobs")
    if fid in GROUPED and get(fid, params, "aggregation") == "prompt_mean":
        out.add("group_ids")
    if fid == "loss.minirl" or get(fid, params, "is_level") != "none" or get(fid, params, "opsm_delta") is not None:
        out.add("sampler_logprobs")
    if get(fid, params, "entropy_quantile") is not None:
        out.add("entropy")
    return out


def make(fid, params, arrays, fold_sampler=False):
    """The case inputs: the four core inputs plus exactly the optional ones the parameters need."""
    names = {"logprobs", "old_logprobs", "mask", "advantages"} | needed(fid, params)
    if fold_sampler:
        names.add("sampler_logprobs")
    missing = names - set(arrays)
    if missing:
        raise ValueError(f"{fid}: case inputs lack {sorted(missing)}")
    return {k: arrays[k] for k in arrays if k in names}


def case(fid, slug, category, description, arrays, params=None, links=(), fold_sampler=False):
    params = dict(params or {})
    return Case(f"{fid}/{slug}", fid, category, description, make(fid, params, arrays, fold_sampler), params, links)


def no_kl(fid):
    """loss.grpo's default beta = 0.04 switched off (the other recipes have beta = 0)."""
    return {"beta": 0} if fid == "loss.grpo" else {}


# examples --------------------------------------------------------------------------------------

def two(lp, old, adv, mask=None, **extra):
    return {"logprobs": lp, "old_logprobs": old, "mask": mask or [[True] * len(row) for row in lp],
            "advantages": adv, **extra}


PAIR = two([[-1.0, -2.0], [-0.5, -1.0]], [[-1.0, -2.0], [-0.5, -1.0]], [1.0, -0.5], [[True, True], [True, False]],
           group_ids=[0, 1])
PAIR_CLIP = two([[-1.0, -2.0], [-0.5, -1.0]], [[-1.25, -2.0], [-0.5, -1.0]], [1.0, -1.0], [[True, True], [True, False]],
                group_ids=[0, 1])


def examples():
    out = []
    g = "loss.grpo"
    out += [
        case(g, "worked-example", "example",
             "spec worked example: on-policy, A = 1, x = l_ref - l = (-0.5, 0): k3 = (e^-0.5 - 0.5, 0); terms "
             "-1 + 0.04 * 0.10653 = -0.99574 and -1; loss -0.99787; gradient (1/2)(-1 + 0.04 (1 - e^-0.5)) = -0.49213 "
             "and -0.5",
             two([[-1.0, -2.0]], [[-1.0, -2.0]], [1.0], ref_logprobs=[[-1.5, -2.0]])),
        case(g, "on-policy-pair", "example",
             "beta = 0, on-policy, A = (1, -0.5), lengths 2 and 1: loss -mean A = -0.25; gradient -A_i/(N L_i) = "
             "(-0.25, -0.25) and 0.25", PAIR, {"beta": 0}),
        case(g, "clipped-high", "example",
             "beta = 0, l - l_old = (0.25, 0), A = 1: r_1 = e^0.25 = 1.2840 > 1.2 is clipped (term -1.2, gradient 0), "
             "r_2 = 1 (term -1); sequence 2 on-policy with A = -1 (term 1); loss ((-1.2 - 1)/2 + 1)/2 = -0.05, "
             "gradients (0, -1/4) and 1/2", PAIR_CLIP, {"beta": 0}),
        case(g, "clipped-low", "example",
             "beta = 0, l - l_old = (-0.25, 0), A = -1: r_1 = e^-0.25 = 0.7788 < 0.8, max(0.7788, 0.8) = 0.8 is the "
             "clipped branch (gradient 0); token 2 term 1, gradient 1/2; loss 0.9",
             two([[-1.25, -2.0]], [[-1.0, -2.0]], [-1.0]), {"beta": 0}),
    ]
    d = "loss.dapo"
    out += [
        case(d, "worked-example-prompt-mean", "example",
             "spec worked example: r_1 = e^0.25 = 1.2840 > 1.28 clipped (-1.28, gradient 0), r_2 = 1 (-1); group 1: "
             "one token with A = -1 (1); prompt mean ((-1.28 - 1)/2 + 1)/2 = -0.07, gradients (0, -1/4) and 1/2",
             PAIR_CLIP),
        case(d, "worked-example-token-mean", "example",
             "the same batch pooled: (-1.28 - 1 + 1)/3 = -0.42667, gradients (0, -1/3) and 1/3", PAIR_CLIP,
             {"aggregation": "token_mean"}),
        case(d, "one-group", "example",
             "one prompt group: prompt_mean = token_mean; on-policy A = (1, -0.5), 3 tokens: (-1 - 1 + 0.5)/3 = -0.5, "
             "gradient -A/3", {**PAIR, "group_ids": [5, 5]}),
        case(d, "unclipped-high", "example",
             "l - l_old = 0.25 with eps_high = 0.3: r = e^0.25 = 1.2840 < 1.3 is not clipped; term -A r = -1.2840, "
             "gradient -r = -1.2840 (one token, one group)",
             two([[-1.0]], [[-1.25]], [1.0], group_ids=[0]), {"eps_high": "0.3"}),
    ]
    r = "loss.dr_grpo"
    out += [
        case(r, "worked-example", "example",
             "spec worked example: on-policy, A = (1, -0.5), lengths 2, 1, K = 4: loss (-1 - 1 + 0.5)/(4 * 2) = "
             "-0.1875; gradient -A_i/8 = -0.125, 0.0625", PAIR, {"divisor": 4}),
        case(r, "divide-by-K", "example",
             "divide_by = 'K', K = 4: the token sum over K alone: -1.5/4 = -0.375, gradient -A_i/4 = -0.25, 0.125",
             PAIR, {"divisor": 4, "divide_by": "K"}),
        case(r, "default-K-3000", "example",
             "K = 3000 (the paper's budget), one on-policy sequence of 2 tokens with A = 1: loss -2/3000 = "
             "-6.6667e-4, gradient -1/3000 per token", two([[-1.0, -2.0]], [[-1.0, -2.0]], [1.0])),
    ]
    b = "loss.bnpo"
    out += [
        case(b, "worked-example", "example",
             "spec worked example: r_1 = e^0.25 > 1.2 clipped (-1.2), -1 and 1: loss (-1.2 - 1 + 1)/3 = -0.4, "
             "gradients (0, -1/3), 1/3", PAIR_CLIP),
        case(b, "on-policy-pair", "example",
             "on-policy A = (1, -0.5), 3 tokens: loss (-1 - 1 + 0.5)/3 = -0.5, gradient -A_i/3", PAIR),
        case(b, "clipped-low", "example",
             "l - l_old = (-0.25, 0), A = -1: r_1 = 0.7788 < 0.8 clipped to 0.8 (gradient 0), token 2 term 1 "
             "(gradient 1/2): loss 0.9", two([[-1.25, -2.0]], [[-1.0, -2.0]], [-1.0])),
    ]
    s = "loss.gspo"
    out += [
        case(s, "worked-example", "example",
             "spec worked example: s_1 = e^0.125 = 1.1331 > 1.0004 with A = 1: clipped, -1.0004, gradient 0; sequence 2 "
             "on-policy A = -1: 1, gradient 1/(2 * 2) = 0.25 per token; loss (-1.0004 + 1)/2 = -0.0002",
             two([[-1.0, -2.0], [-0.5, -1.0]], [[-1.25, -2.0], [-0.5, -1.0]], [1.0, -1.0])),
        case(s, "on-policy-pair", "example",
             "on-policy A = (1, -0.5), lengths 2, 1: loss -mean A = -0.25, gradient -A_i/(N L_i) = -0.25, 0.25", PAIR),
        case(s, "unclipped-eps-0.2", "example",
             "eps 0.2: s = e^0.125 = 1.1331 < 1.2, A = 1: loss -1.1331, gradient -s/L = -0.56657 per token",
             two([[-1.0, -2.0]], [[-1.25, -2.0]], [1.0]), {"eps_low": "0.2", "eps_high": "0.2"}),
    ]
    c = "loss.cispo"
    out += [
        case(c, "worked-example", "example",
             "spec worked example: w = (min(e^0.25, 1.2), 1) = (1.2, 1), A = 2, l = (-1, -2): terms 2.4, 4; loss "
             "3.2; gradient -w A/2 = (-1.2, -1)", two([[-1.0, -2.0]], [[-1.25, -2.0]], [2.0], group_ids=[0])),
        case(c, "absolute-cap-token-mean", "example",
             "cap_form absolute, cap 5: w = (min(e^2, 5), 1) = (5, 1), A = 1, l = (-1, -2): terms 5, 2; token mean 3.5; "
             "gradient -w A/2 = (-2.5, -0.5)", two([[-1.0, -2.0]], [[-3.0, -2.0]], [1.0]),
             {"cap_form": "absolute", "eps_high": 5, "aggregation": "token_mean"}),
        case(c, "relative-floor", "example",
             "eps_low 0.2: r = e^-0.5 = 0.6065 floored to w = 0.8, A = 1, l = (-1, -2): terms 0.8, 2; loss 1.4; "
             "gradient (-0.4, -0.5)", two([[-1.0, -2.0]], [[-0.5, -2.0]], [1.0], group_ids=[3]), {"eps_low": "0.2"}),
    ]
    p = "loss.sapo"
    out += [
        case(p, "worked-example", "example",
             "spec worked example: on-policy, A = (1, -1) per token: terms -4/2 = -2 and 4/(2 * 1.05) = 1.90476; loss "
             "-0.047619; gradient -A/2 = (-0.5, 0.5)", two([[-1.0, -2.0]], [[-1.0, -2.0]], [[1.0, -1.0]])),
        case(p, "off-policy-gate", "example",
             "d = 0.5, A = 1, tau 1: x = e^0.5 - 1 = 0.64872, term -4 sigma(x) = -2.62689; gradient "
             "-4 sigma(x) sigma(-x) e^0.5 = -1.48673", two([[-1.0]], [[-1.5]], [1.0])),
        case(p, "zero-advantage", "example",
             "A = (0, 1) per token, on-policy: the A = 0 token contributes 0 (tau_neg) and no gradient; loss "
             "(0 - 2)/2 = -1, gradient (0, -0.5)", two([[-1.0, -2.0]], [[-1.0, -2.0]], [[0.0, 1.0]])),
    ]
    m = "loss.gmpo"
    out += [
        case(m, "worked-example", "example",
             "spec worked example: d = (0.5, 0), A = 1: d~ = (0.4, 0), g = e^0.2 = 1.22140, loss -1.22140; gradient "
             "(0, -g/2) = (0, -0.61070)", two([[-1.0, -2.0]], [[-1.5, -2.0]], [1.0])),
        case(m, "on-policy-pair", "example",
             "on-policy A = (1, -1), lengths 2, 1: loss (-1 + 1)/2 = 0; gradient -A_i/(N L_i) = -0.25, 0.5",
             two([[-1.0, -2.0], [-0.5, -1.0]], [[-1.0, -2.0], [-0.5, -1.0]], [1.0, -1.0],
                 [[True, True], [True, False]])),
        case(m, "negative-advantage-clip", "example",
             "d = (-0.5, 0), A = -1: d~ = max(d, clip(d, -0.4, 0.4)) = (-0.4, 0), g = e^-0.2 = 0.81873, loss 0.81873; "
             "gradient (0, g/2) = (0, 0.40937)", two([[-1.5, -2.0]], [[-1.0, -2.0]], [-1.0])),
    ]
    u = "loss.luspo"
    out += [
        case(u, "worked-example", "example",
             "spec worked example: on-policy, A = (1, -1), lengths 2, 1: loss (2 (-1) + 1)/2 = -0.5; gradient -A_i/N: "
             "(-0.5, -0.5), 0.5", two([[-1.0, -2.0], [-0.5, -1.0]], [[-1.0, -2.0], [-0.5, -1.0]], [1.0, -1.0],
                                      [[True, True], [True, False]])),
        case(u, "clipped", "example",
             "s = e^0.125 > 1.0004, A = 1: l^GSPO = -1.0004 at both tokens; loss 2 (-1.0004)/1 = -2.0008, gradient 0",
             two([[-1.0, -2.0]], [[-1.25, -2.0]], [1.0])),
        case(u, "token-level", "example",
             "ratio_level token, eps 0.2: r = (e^0.25, 1), A = 1: terms -1.2 (clipped) and -1; loss -2.2, gradient "
             "(0, -1)", two([[-1.0, -2.0]], [[-1.25, -2.0]], [1.0]),
             {"ratio_level": "token", "eps_low": "0.2", "eps_high": "0.2"}),
    ]
    v = "loss.vespo"
    out += [
        case(v, "worked-example", "example",
             "spec worked example: log w = 0.25, phi = e^(3 + 0.5 - 3 e^0.25) = 0.70323; terms phi, 2 phi; loss 1.5 phi "
             "= 1.05484; gradient -phi/2 = -0.35161", two([[-1.0, -2.0]], [[-1.25, -2.0]], [1.0])),
        case(v, "on-policy-worked", "example",
             "on-policy: w = 1, phi = e^(lambda - lambda) = 1; A = 1, l = (-1, -2): loss -mean A l = 1.5, gradient "
             "-1/2 per token", two([[-1.0, -2.0]], [[-1.0, -2.0]], [1.0])),
        case(v, "negative-advantage", "example",
             "A = -1 (k 3, lambda 2), log w = 0.25: phi = e^(2 + 0.75 - 2 e^0.25) = 1.19955; terms -phi, -2 phi; loss "
             "-1.5 phi = -1.79933; gradient phi/2 = 0.59978", two([[-1.0, -2.0]], [[-1.25, -2.0]], [-1.0])),
    ]
    n = "loss.minirl"
    out += [
        case(n, "worked-example", "example",
             "spec worked example: token 1 r = e^0.5 > 1.27 with A > 0: dropped; token 2 weight min(e^0.5, 5) = 1.64872, "
             "term 3.29744, gradient -1.64872; token 3 weight min(e^2, 5) = 5, term 2.5, gradient -5; loss 5.79744",
             two([[-1.0, -2.0, -0.5]], [[-1.5, -2.0, -0.5]], [1.0], sampler_logprobs=[[-1.0, -2.5, -2.5]])),
        case(n, "on-policy-worked", "example",
             "l = l_old = l_mu: weight 1; A = 1, l = (-1, -2): loss -sum A l / N = 3, gradient -1 per token",
             two([[-1.0, -2.0]], [[-1.0, -2.0]], [1.0], sampler_logprobs=[[-1.0, -2.0]])),
        case(n, "negative-advantage-drop", "example",
             "A = -1: token 1 r = e^-0.5 = 0.6065 < 0.8 dropped; token 2 on-policy with l_mu = l: term -(1)(-1)(-2) = -2, "
             "gradient 1; loss -2", two([[-1.5, -2.0]], [[-1.0, -2.0]], [-1.0], sampler_logprobs=[[-1.5, -2.0]])),
    ]
    return out


# edge cases ------------------------------------------------------------------------------------

CLAMP_NAME = {fid: "log_ratio_clamp" for fid in PPO + ("loss.cispo", "loss.sapo", "loss.vespo")}
CLAMP_NAME["loss.gspo"] = "log_ratio_max"


def edges(fid):
    p0 = no_kl(fid)
    base = dict(BATCH, advantages=A_SEQ)
    ext20, ext200 = extreme(20.0), extreme(200.0)
    if fid == "loss.grpo":   # x = l_ref - l: (-0.5, 0) on rows 0, 1 and (19.5, 20) on rows 2, 3
        ext20["ref_logprobs"] = [[-0.5, -1.0]] * 4
        ext200["ref_logprobs"] = ext200["logprobs"]   # KL 0: the policy term alone at +-200
    if fid == "loss.minirl":
        ext20["sampler_logprobs"] = ext20["old_logprobs"]
        ext200["sampler_logprobs"] = ext200["old_logprobs"]
    out = [
        case(fid, "empty-sequence", "edge", "the middle sequence has no unmasked token: not counted, gradient 0",
             dict(base, mask=EMPTY_ROW)),
        case(fid, "all-masked", "edge", "no token counts anywhere: loss 0, gradient 0", dict(base, mask=NONE)),
        case(fid, "masked-nan-inf", "edge",
             "NaN and infinities at masked positions of every input must not reach the loss or the gradient",
             DIRTY),
        case(fid, "masked-overflowing-log-ratio", "edge",
             "a masked token with finite log-probs whose log-ratios l - l_old = 1000 and l_ref - l = 1000 overflow "
             "exp in every dtype: it must reach neither the loss nor the gradient (the unmasked token has d = 0.5, "
             "A = 1)",
             {"logprobs": [[-1.0, 0.0]], "old_logprobs": [[-1.5, -1000.0]], "mask": [[True, False]], "advantages": [1.0],
              "ref_logprobs": [[-1.25, 1000.0]], "sampler_logprobs": [[-1.5, -1000.0]], "group_ids": [0],
              "entropy": [[1.0, 1.0]]}),
        case(fid, "on-policy", "edge", "l = l_old: every ratio is exactly 1", dict(base, old_logprobs=LP)),
        case(fid, "log-ratio-20", "edge",
             "log-ratios +20 (rows 0, 1) and -20 (rows 2, 3) with A = +1, -1, +1, -1 (e^20 = 4.85e8)"
             + ("; KL at x = l_ref - l up to 20" if fid == "loss.grpo" else ""), ext20, p0 if fid != "loss.grpo" else {}),
        case(fid, "log-ratio-200", "edge",
             "log-ratios +200 and -200 with A = +-1: e^200 = 7.2e86 overflows float32 where the unclipped branch or "
             "the ratio is live" + ("; l_ref = l (KL 0)" if fid == "loss.grpo" else ""), ext200,
             p0 if fid != "loss.grpo" else {}),
        case(fid, "log-ratio-200-zero-advantage", "edge",
             "log-ratios +200 and -200 with A = 0 everywhere: loss and gradient exactly 0 (a ratio e^200 = inf in "
             "float32 times a zero advantage would be NaN)", dict(ext200, advantages=[0.0] * 4), p0),
        case(fid, "log-ratio-200-kl-k3_unbiased-on-reference", "edge",
             "log-ratios +200 (A = 1) and -200 (A = -1), each on its clipped side where the recipe clips, with "
             "beta 0.25 and kl.k3_unbiased at l_ref = l: the KL terms w k3(0) and their gradients are exactly 0 "
             "although w = e^200 overflows float32",
             dict(ext200, ref_logprobs=ext200["logprobs"], advantages=[1.0, 1.0, -1.0, -1.0]),
             {"beta": 0.25, "kl_estimator": "k3_unbiased"}),
    ]
    if fid != "loss.vespo":     # VESPO folds its IS weight in itself (no is_level)
        out += [
            case(fid, "all-masked-is-token", "edge",
                 "no token counts anywhere, with token IS truncation (is_level token): loss 0, gradient 0 (the IS "
                 "correction has no token to weigh)", dict(base, mask=NONE), {**p0, "is_level": "token"}),
            case(fid, "is-token-mask-rejects-all", "edge",
                 "token IS masking (IcePop) with the band [1.5, 2]: every rho = e^(l_old - l_mu) <= e^0.25 = 1.28 is "
                 "rejected, so every policy term is 0 (the tokens stay in the denominator): loss 0, gradient 0",
                 base, {**p0, "is_level": "token", "is_mode": "mask", "is_c_min": 1.5, "is_c_max": 2.0}),
        ]
    if fid in CLAMP_NAME:
        name = CLAMP_NAME[fid]
        value = 10.0 if fid in ("loss.gspo", "loss.vespo") else 20.0
        out.append(case(fid, "log-ratio-200-clamped", "edge",
                        f"log-ratios +-200 with {name} = {value:g}", extreme(200.0), {**p0, name: value}))
    if fid in PPO:
        out.append(case(fid, "eps-zero", "edge",
                        "eps_low = eps_high = 0, on-policy: both branches tie at r = 1 (half the cotangent each, clip "
                        "passes it on its closed interval): gradient as unclipped", dict(base, old_logprobs=LP),
                        {**p0, "eps_low": 0, "eps_high": 0}))
    if fid in GROUPED:
        out += [
            # the batch-pooled token mean is the aggregation TRL, Liger and verl run for DAPO and CISPO
            case(fid, "masked-nan-inf-token-mean", "edge",
                 "NaN and infinities at masked positions, with the batch-pooled token mean (aggregation = token_mean)",
                 DIRTY, {"aggregation": "token_mean"}),
            case(fid, "masked-nan-inf-token-mean-kl", "edge",
                 "NaN and infinities at masked positions of every input, the KL term's reference log-probs too "
                 "(beta = 0.04, k3), with the batch-pooled token mean",
                 DIRTY, {"aggregation": "token_mean", "beta": "0.04"}),
            case(fid, "singleton-group", "edge",
                 "groups (0, 1, 1): group 0 holds one sequence (its own token mean)", dict(base, group_ids=[0, 1, 1])),
            case(fid, "empty-group", "edge",
                 "group 1 holds only the empty sequence: it is not counted in N_grp",
                 dict(base, mask=EMPTY_ROW, group_ids=[0, 1, 0])),
        ]
    if fid in TOKEN_ADV:
        out.append(case(fid, "token-advantages", "edge", "per-token advantages [B, T]",
                        dict(base, advantages=A_TOK), p0))
        out.append(case(fid, "masked-nan-advantage", "edge",
                        "per-token advantages with NaN at the masked positions (finite log-probs there): it must "
                        "reach neither the loss nor the gradient",
                        dict(base, advantages=[[a if m else "nan" for a, m in zip(ra, rm)]
                                               for ra, rm in zip(A_TOK, MASK)]), p0))
    return out


def extras():
    """Recipe-specific parameter extremes."""
    base = dict(BATCH, advantages=A_SEQ)
    return [
        case("loss.gspo", "log-ratio-max", "edge", "log_ratio_max = 0.0625 caps log s_i from above (verl 10)",
             dict(base, old_logprobs=[[-1.5, -2.75, -0.5, -3.5], [-0.5, -2.75, -1.0, -2.5],
                                      [-1.0, -1.5, -2.5, -0.5]]), {"log_ratio_max": "0.0625"}),
        case("loss.cispo", "absolute-prompt-mean", "edge", "cap_form absolute (cap 1.125) with the prompt mean",
             base, {"cap_form": "absolute", "eps_high": 1.125}),
        case("loss.sapo", "temperatures", "edge", "tau_pos 0.25, tau_neg 4: a flat and a steep gate",
             dict(base, advantages=A_TOK), {"tau_pos": 0.25, "tau_neg": 4}),
        case("loss.gmpo", "eps-zero", "edge", "eps_low = eps_high = 0: every d~ is clipped to 0 on its side",
             base, {"eps_low": 0, "eps_high": 0}),
        case("loss.luspo", "token-level-padded", "edge", "ratio_level token on the padded batch (trl#6654's fix masks "
             "elementwise)", base, {"ratio_level": "token", "eps_low": "0.2", "eps_high": "0.28"}),
        case("loss.vespo", "shape-extremes", "edge", "k_pos 0, lambda_pos 0 (floored to lambda_min), k_neg 8, "
             "lambda_neg 0.5", base, {"k_pos": 0, "lambda_pos": 0, "k_neg": 8, "lambda_neg": 0.5}),
        case("loss.vespo", "sampler-folded", "edge",
             "sampler_logprobs given: folded into phi_i (sum of clamped l_old - l_mu added to log w), never as w^IS",
             base, fold_sampler=True),
        case("loss.minirl", "no-cap", "edge", "is_cap null: the weight e^(l - l_mu) untruncated",
             dict(base, advantages=A_TOK), {"is_cap": None}),
        case("loss.minirl", "is-cap-small", "edge", "is_cap 1: every weight above 1 truncated",
             dict(base, advantages=A_TOK), {"is_cap": 1}),
        case("loss.dr_grpo", "divide-by-K-empty-row", "edge", "divide_by 'K': the empty sequence changes nothing",
             dict(base, mask=EMPTY_ROW), {"divisor": 8, "divide_by": "K"}),
    ]


# one case per common option --------------------------------------------------------------------

IS_BOUNDS = {"token": {"is_c_min": 0.875, "is_c_max": 1.125},
             "sequence": {"is_c_min": 0.75, "is_c_max": 1.5},
             "geometric": {"is_c_min": 0.875, "is_c_max": 1.125}}
IS_NOTE = {"token": "token rho = e^(l_old - l_mu) in {e^0.25, e^0.125, e^-0.125, 1, e^0.0625}, band [0.875, 1.125]",
           "sequence": "sequence rho = (e^0.5, e^-0.25, e^0.125) = (1.649, 0.779, 1.133), band [0.75, 1.5]",
           "geometric": "geometric rho = (e^(1/6), e^-0.125, e^(1/32)) = (1.181, 0.882, 1.032), band [0.875, 1.125]"}
KL_ESTIMATORS = ("k1", "k2", "k3", "abs", "k3_straight_through", "k3_unbiased")
# kl.k3_unbiased at small log-ratios x = l_ref - l: (-1/64, 1/64) and (-2^-9, 2^-20), every input bfloat16-exact
K3U_SMALL = {"logprobs": [[-0.5, -0.5], [-0.25, -2.0 ** -20]],
             "old_logprobs": [[-0.75, -0.25], [-0.125, -0.5]],
             "ref_logprobs": [[-0.515625, -0.484375], [-0.251953125, 0.0]],
             "sampler_logprobs": [[-0.75, -0.25], [-0.125, -0.5]],
             "mask": [[True, True], [True, True]], "advantages": [0.0, 0.0], "group_ids": [0, 0]}


def options(fid):
    out = []
    p0 = no_kl(fid)
    adv = A_TOK if fid in TOKEN_ADV else A_SEQ
    base = dict(BATCH, advantages=adv)
    if fid != "loss.vespo":
        for level, bounds in IS_BOUNDS.items():
            for mode in ("truncate", "mask"):
                params = {**p0, "is_level": level, "is_mode": mode, **bounds}
                what = ("clip(rho, c_min, c_max)" if mode == "truncate"
                        else "rho 1[c_min <= rho <= c_max] (0: dropped, kept in the denominator)")
                out.append(case(fid, f"is-{level}-{mode}", "edge", f"w^IS = {what}; {IS_NOTE[level]}", base, params))
        out.append(case(fid, "is-sequence-log-clamp", "edge",
                        "is_level sequence, truncate at c_max 2 with is_log_ratio_clamp 0.25: log rho = 0.5 is clamped "
                        "to 0.25", base, {**p0, "is_level": "sequence", "is_log_ratio_clamp": 0.25}))
    out.append(case(fid, "opsm", "edge",
                    "opsm_delta 0.125: kappa = mean (l_mu - l) = (-0.125, 0.25, -0.0625); sequence 1 has A < 0 "
                    + ("(token advantages (-2, 1): mean -0.5) " if fid in TOKEN_ADV else "")
                    + "and kappa > delta: every token's policy term is 0, the KL stays", base,
                    {**p0, "opsm_delta": 0.125}, fold_sampler=fid == "loss.vespo"))
    out.append(case(fid, "entropy-mask", "edge",
                    "entropy_quantile 0.5: the median of the 9 unmasked entropies is 1.25; 4 tokens below it are "
                    "dropped (kept in the denominator)", base, {**p0, "entropy_quantile": "0.5"}))
    for est in KL_ESTIMATORS:
        params = {"beta": 0.25, "kl_estimator": est}
        out.append(case(fid, f"kl-{est}", "edge",
                        f"beta 0.25 with kl.{est} of x = l_ref - l, added after the factors, aggregated with the policy "
                        "term", base, params))
    for sg in (True, False):
        out.append(case(fid, f"kl-k3_unbiased-input-clamp-{'sg' if sg else 'live'}-ratio", "edge",
                        "beta 0.25, kl.k3_unbiased with the input clamp [-0.125, 0.25] binding on both sides "
                        "(x = l_ref - l = 0.5 and -0.25 in sequence 1, -0.25 in sequence 2) and "
                        f"kl_sg_ratio_where_clamped {str(sg).lower()}: where the clamp is active the KL gradient is "
                        + ("0 (the ratio's gradient stopped)" if sg else "w k3(clip(x)) (the ratio's gradient live)"),
                        base, {"beta": 0.25, "kl_estimator": "k3_unbiased", "kl_log_ratio_min": -0.125,
                               "kl_log_ratio_max": 0.25, "kl_sg_ratio_where_clamped": sg}))
    out.append(case(fid, "kl-k3_unbiased-small-log-ratio", "edge",
                    "beta 0.25, kl.k3_unbiased at small x = l_ref - l = (-1/64, 1/64), (-2^-9, 2^-20) with w = e^(l - "
                    "l_old) = (e^0.25, e^-0.25), (e^-0.125, e^(0.5 - 2^-20)), A = 0 (one prompt group): the loss is the "
                    "KL term alone, whose gradient -w x / N is small next to w e^x (an autograd sum w k3(x) - "
                    "w (e^x - 1) cancels where e^x / |x| is large)", K3U_SMALL,
                    {"beta": 0.25, "kl_estimator": "k3_unbiased"}))
    ext = extreme(200.0)
    ext["ref_logprobs"] = [[-200.0, -201.0], [0.0, -1.0], [0.0, -1.0], [-200.0, -201.0]]
    if fid == "loss.minirl":
        ext["sampler_logprobs"] = ext["old_logprobs"]
    out.append(case(fid, "kl-k3-verl-clamps-200", "edge",
                    "beta 0.5, k3 with verl's clamps (x in [-20, 20], output in [-10, 10]) at x = l_ref - l = +-200",
                    ext, {**({CLAMP_NAME[fid]: 20.0} if fid in PPO + ("loss.cispo", "loss.sapo") else {}),
                          "beta": 0.5, "kl_estimator": "k3", "kl_log_ratio_min": -20, "kl_log_ratio_max": 20,
                          "kl_output_min": -10, "kl_output_max": 10}))
    out.append(case(fid, "all-options", "edge",
                    "token IS truncation, OPSM, entropy mask and the DeepSeek-V3.2 unbiased KL together", base,
                    {**({} if fid == "loss.vespo" else {"is_level": "token", "is_c_min": 0.5}),
                     "opsm_delta": 0.125, "entropy_quantile": "0.75", "beta": 0.125, "kl_estimator": "k3_unbiased"},
                    fold_sampler=fid == "loss.vespo"))
    return out


# regression ------------------------------------------------------------------------------------

SLIME_1917 = ("https://github.com/THUDM/slime/issues/1917",)
VERL_593 = ("https://github.com/volcengine/verl/issues/593",)
TRL_3823 = ("https://github.com/huggingface/trl/issues/3823",)
TRL_6654 = ("https://github.com/huggingface/trl/pull/6654",)
# verl#593: arange(20) as [2, 10] with 5 and 1 valid tokens: token-mean 20/6 = 3.3333, sample-mean (2 + 10)/2 = 6
V593 = [[float(10 * i + t) for t in range(10)] for i in range(2)]
M593 = [[t < 5 for t in range(10)], [t < 1 for t in range(10)]]
NEG593 = [[-v for v in row] for row in V593]


def regressions():
    slime = {"logprobs": [[0.0, 0.0, 0.0]], "old_logprobs": [[0.0, 0.0, 0.0]], "sampler_logprobs": [[1.0, 1.0, 1.0]],
             "mask": [[True, True, True]], "advantages": [[-0.5, 0.25, -0.25]]}
    slime2 = {"logprobs": [[0.0, 0.0, 0.0], [-1.0, -1.0, -1.0]], "old_logprobs": [[0.0, 0.0, 0.0], [-1.0, -1.0, -1.0]],
              "sampler_logprobs": [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], "mask": [[True, True, True], [True, True, False]],
              "advantages": [[-0.5, 0.25, -0.25], [1.0, -0.5, 0.0]]}
    pairs593 = {"logprobs": NEG593, "old_logprobs": NEG593, "mask": M593}
    return [
        case("loss.grpo", "slime-1917", "regression",
             "slime#1917's tensors: l = l_old = (0, 0, 0), l_mu = (1, 1, 1), A = (-0.5, 0.25, -0.25), opsm_delta 0.1: "
             "kappa = 1 > 0.1 and the sequence-mean advantage -1/6 < 0, so the WHOLE sequence is dropped: loss 0, "
             "gradient 0 (the per-token gate kept the middle token)", slime, {"beta": 0, "opsm_delta": "0.1"},
             SLIME_1917),
        case("loss.grpo", "slime-1917-with-kept-sequence", "regression",
             "slime#1917's sequence dropped beside a kept one (A = (1, -0.5), mean 0.25 > 0): loss -0.25/2 = -0.125, "
             "gradient -A_t/(2 * 2) on the kept row, 0 on the dropped one", slime2,
             {"beta": 0, "opsm_delta": "0.1"}, SLIME_1917),
        case("loss.cispo", "verl-593-token-mean", "regression",
             "verl#593 via CISPO on-policy (w = 1), A = 1, l = -arange(20) as [2, 10], lengths 5 and 1: term -A l = "
             "value; token mean 20/6 = 3.3333, gradient -1/6 per token", {**pairs593, "advantages": [1.0, 1.0]},
             {"aggregation": "token_mean"}, VERL_593),
        case("loss.cispo", "verl-593-prompt-mean", "regression",
             "the same with one prompt per sequence: prompt mean (10/5 + 10/1)/2 = 6.0 (verl's fixed seq-mean), "
             "gradients -1/10 and -1/2", {**pairs593, "advantages": [1.0, 1.0], "group_ids": [0, 1]}, {}, VERL_593),
        case("loss.grpo", "verl-593-sample-mean", "regression",
             "verl#593 via GRPO on-policy with per-token advantages A = -arange(20): term -A r = value; sample mean "
             "(2 + 10)/2 = 6.0, gradient -A/(2 L_i)", {**pairs593, "advantages": NEG593}, {"beta": 0}, VERL_593),
        case("loss.bnpo", "verl-593-token-mean", "regression",
             "verl#593 via BNPO (token mean): 20/6 = 3.3333, gradient -A/6", {**pairs593, "advantages": NEG593}, {},
             VERL_593),
        case("loss.gspo", "trl-3823-sample-mean", "regression",
             "trl#3823: GSPO must average sequences, not tokens: on-policy A = (1, -1) with lengths 4 and 1 gives "
             "-(1 - 1)/2 = 0 (a token sum would give (-4 + 1)/5 = -0.6)",
             two([[-1.0, -2.0, -0.5, -1.5], [-0.5, -1.0, -1.0, -1.0]], [[-1.0, -2.0, -0.5, -1.5], [-0.5, -1.0, -1.0, -1.0]],
                 [1.0, -1.0], [[True] * 4, [True, False, False, False]]), {}, TRL_3823),
        case("loss.luspo", "trl-6654-masked", "regression",
             "trl#6654: LUSPO masks elementwise: on-policy A = (1, -1), lengths 4 and 1 in a width-4 batch: "
             "(4 (-1) + 1 (1))/2 = -1.5 (the unmasked (l L_i).mean() weighted by L_i^2/T and leaked padding)",
             two([[-1.0, -2.0, -0.5, -1.5], [-0.5, -1.0, -1.0, -1.0]], [[-1.0, -2.0, -0.5, -1.5], [-0.5, -1.0, -1.0, -1.0]],
                 [1.0, -1.0], [[True] * 4, [True, False, False, False]]), {}, TRL_6654),
    ]


# random and scale ------------------------------------------------------------------------------

def fields_for(fid, params=None):
    return ("logprobs", "old_logprobs", "mask", "advantages") + tuple(sorted(needed(fid, params or {})))


def randoms(fid, k):
    out = []
    for j, (B, T, lengths) in enumerate(((3, 16, (16, 9, 1)), (4, 7, None))):
        seed = 1000 + 10 * k + j
        inputs = random_inputs(seed, B, T, fields_for(fid), lengths)
        out.append(Case(f"{fid}/random-{j + 1}", fid, "random",
                        f"generator inputs (seed {seed}), {B} sequences of {T} positions"
                        + (f", lengths {lengths}" if lengths else ""), inputs, {}))
    opts = {"is_level": "geometric", "opsm_delta": 0.0078125, "beta": 0.0625, "kl_estimator": "k2"}
    if fid == "loss.vespo":
        opts.pop("is_level")
    seed = 1000 + 10 * k + 5
    inputs = random_inputs(seed, 3, 12, fields_for(fid, opts), (12, 5, 8))
    out.append(Case(f"{fid}/random-options", fid, "random",
                    f"generator inputs (seed {seed}) with geometric IS truncation, OPSM (delta 2^-7) and a k2 KL",
                    inputs, opts))
    return out


def scales(fid, k):
    groups = 2 if "group_ids" in needed(fid, {}) else None
    return [
        Case(f"{fid}/scale-8192", fid, "scale",
             "two sequences of 8192 positions (lengths 8192 and 1024) from the generator, the recipe's defaults",
             Generated(seed=8192 + k, B=2, T=8192, fields=fields_for(fid), lengths=(8192, 1024), groups=groups)),
        Case(f"{fid}/scale-32768", fid, "scale",
             "one sequence of 32768 tokens from the generator, the recipe's defaults",
             Generated(seed=32768 + k, B=1, T=32768, fields=fields_for(fid), groups=groups)),
    ]


# framework presets (conformance/presets/*.toml, the name map) ------------------------------------

def presets():
    """Two cases at every distinct preset: the option batch, and a random batch of four sequences in
    two prompt groups with ragged lengths.  The first preset of a group of identical (recipe,
    parameters) names the cases; the description lists every configuration that maps to them."""
    from ..generator import generate_inputs
    from ..namemap import distinct, load_all

    out = []
    for k, (first, same) in enumerate(distinct(load_all())):
        fid, params = first.recipe, first.params_dict()
        configs = "; ".join(f"{p.framework} {p.version}: {p.config}" for p in same)
        slug = f"preset-{first.framework}-{first.slug}"
        out.append(case(fid, f"{slug}-batch", "example",
                        f"framework preset ({configs}) on the option batch (lengths 3, 2, 4)", BATCH, params,
                        links=tuple(sorted({p.link for p in same}))))
        seed = 5000 + k
        fields = fields_for(fid, params)
        inputs = generate_inputs(Generated(seed, 4, 12, fields, (12, 5, 8, 1),
                                           groups=2 if "group_ids" in fields else None).to_json())
        out.append(Case(f"{fid}/{slug}-random", fid, "random",
                        f"framework preset ({configs}); generator inputs (seed {seed}), 4 sequences of 12 positions, "
                        "lengths 12, 5, 8, 1" + (", 2 prompt groups" if "group_ids" in fields else ""),
                        inputs, params, tuple(sorted({p.link for p in same}))))
    return out


def binding():
    """Recipe parameters taking effect on the option batch (pgspec golden coverage): the IS lower
    truncation and the IS log-ratio clamp (l_old - l_mu = (0.25, 0.125, 0.125 | -0.125, -0.125 |
    0, 0.0625, 0, 0.0625)), and the KL input clamp on both sides and the KL output floor
    (x = l_ref - l = (-0.125, 0.25, -0.125 | -0.25, 0.5 | 0.25, -0.25, 0.25, -0.125))."""
    g = "loss.grpo"
    on_policy = {**BATCH, "old_logprobs": LP}
    return [
        case("loss.minirl", "zero-band-on-policy", "edge",
             "eps_low = eps_high = 0 on policy: every r = 1 lies on both edges of the closed band [1, 1], so no "
             "token is masked (a strict comparison written as >= would drop them all)",
             on_policy, {"eps_low": 0, "eps_high": 0}),
        case(g, "is-token-floor", "edge",
             "token-level TIS with is_c_min = 0.9375: the weights e^-0.125 = 0.8825 are raised to 0.9375",
             BATCH, {"beta": 0, "is_level": "token", "is_mode": "truncate", "is_c_min": 0.9375}),
        case(g, "is-log-ratio-clamp-both-sides", "edge",
             "token-level TIS with is_log_ratio_clamp = 0.0625: mismatch log-ratios 0.25, 0.125 and -0.125 are "
             "clamped to +-0.0625",
             BATCH, {"beta": 0, "is_level": "token", "is_mode": "truncate", "is_log_ratio_clamp": 0.0625}),
        case(g, "kl-clamps-bind", "edge",
             "k3 with the input clamp [-0.1875, 0.125] (x = 0.25, 0.5 above, -0.25 below) and the output floor "
             "0.015625 (k3(-0.125) = 0.0075 is raised)",
             BATCH, {"beta": 0.25, "kl_log_ratio_min": -0.1875, "kl_log_ratio_max": 0.125,
                     "kl_output_min": 0.015625}),
    ]


# the source pull requests (issue 9) ------------------------------------------------------------

SLIME_2060 = ("https://github.com/THUDM/slime/pull/2060",)
SLIME_2090 = ("https://github.com/THUDM/slime/pull/2090",)
NEMO_2269 = ("https://github.com/NVIDIA-NeMo/RL/pull/2269",)


def seeds():
    base_tok = dict(BATCH, advantages=A_TOK)
    base_seq = dict(BATCH, advantages=A_SEQ)
    d30 = two([[0.0, -1.0]], [[-30.0, -1.0]], [-1.0])
    out = [
        case("loss.gspo", "per-token-clamp-30-0", "example",
             "Liger-Kernel fork PR #4: d = (30, 0), A = -1, log_ratio_clamp 20 clamps each token before the mean: "
             "s = e^10, loss e^10 = 22026.465794806718, gradient (0, e^10/2)", d30, {"log_ratio_clamp": 20}),
        case("loss.gspo", "mean-cap-20-30-0", "example",
             "the cap on the mean instead: d = (30, 0), A = -1, log_ratio_max 20 (not reached): loss e^15 = "
             "3269017.3724721107, gradient e^15/2 per token", d30, {"log_ratio_max": 20}),
        case("loss.gspo", "per-token-clamp-20", "edge", "log_ratio_clamp 20 on the +-20 batch: nothing is clamped",
             extreme(20.0), {"log_ratio_clamp": 20}),
    ]
    # KL aggregated apart from the policy term (slime: --loss-aggregation changes only pg_loss)
    out += [
        case("loss.dr_grpo", "slime-constant-kl-sample-mean", "regression",
             "slime --loss-aggregation constant (divisor 8): pg sum / (8 N) plus beta 0.5 times the KL's sample mean "
             "(k3), not the KL sum / (8 N)", base_tok,
             {"divisor": 8, "beta": 0.5, "kl_aggregation": "sample_mean"}, SLIME_2090),
        case("loss.dapo", "token-mean-kl-sample-mean", "edge",
             "aggregation token_mean with kl_aggregation sample_mean: the policy term's token mean plus beta 0.5 "
             "times the KL's sample mean (slime's token_mean mode instead keeps both per token: kl_aggregation "
             "policy, since --calculate-per-token-loss also switches the KL's reducer)", base_tok,
             {"aggregation": "token_mean", "beta": 0.5, "kl_aggregation": "sample_mean"}),
        case("loss.dapo", "slime-prompt-mean-kl-sample-mean", "regression",
             "slime --loss-aggregation prompt_mean: the policy term's prompt mean plus beta 0.5 times the KL's sample "
             "mean", base_tok, {"beta": 0.5, "kl_aggregation": "sample_mean"}, SLIME_2090),
        case("loss.grpo", "kl-token-mean", "edge",
             "kl_aggregation token_mean: the policy term's sample mean plus beta 0.25 times the KL's token mean",
             base_tok, {"beta": 0.25, "kl_aggregation": "token_mean"}),
        case("loss.gspo", "kl-sample-mean-explicit", "edge",
             "kl_aggregation sample_mean on a sample-mean recipe equals the default 'policy' (the same value)",
             base_seq, {"beta": 0.25, "kl_aggregation": "sample_mean"}),
        case("loss.grpo", "kl-aggregation-beta-0", "edge",
             "kl_aggregation has no effect when beta = 0 (no KL term)", base_tok, {"beta": 0, "kl_aggregation": "token_mean"}),
    ]
    # NeMo-RL #2269: the untruncated IS weight at each is_correction_level, with the GSPO ratio
    for level, name in (("sequence", "sequence"), ("geometric", "sequence_mean"), ("token", "token")):
        out.append(case("loss.gspo", f"nemo-rl-2269-{name}", "regression",
                        f"NeMo-RL #2269 is_correction_level='{name}': the untruncated {level} IS weight (is_mode "
                        f"truncate with both bounds null) times GSPO's policy term; {IS_NOTE[level]}",
                        base_seq, {"is_level": level, "is_c_min": None, "is_c_max": None}, NEMO_2269))
    # mask.opsm's advantage_gate inside the recipes (opsm_advantage_gate)
    slime = {"logprobs": [[0.0, 0.0, 0.0]], "old_logprobs": [[0.0, 0.0, 0.0]], "sampler_logprobs": [[1.0, 1.0, 1.0]],
             "mask": [[True, True, True]], "advantages": [[-0.5, 0.25, -0.25]]}
    out.append(case("loss.grpo", "slime-1917-token-gate", "regression",
                    "slime#1917's tensors with opsm_advantage_gate 'token' (the literal DeepSeek-V3.2 Eq. 9, slime "
                    "624b824a): only the tokens with A < 0 are dropped; the middle token (A = 0.25, r = 1) keeps -0.25: "
                    "loss -0.25/3 = -0.083333333333, gradient -0.25/3 there", slime,
                    {"beta": 0, "opsm_delta": "0.1", "opsm_advantage_gate": "token"}, SLIME_1917))
    for fid in ("loss.dapo", "loss.cispo", "loss.sapo"):
        out.append(case(fid, "opsm-token-gate", "edge",
                        "opsm_delta 0.125 with opsm_advantage_gate 'token': in sequence 1 (kappa 0.25 > delta) only the "
                        "token with A = -2 is dropped, the one with A = 1 is kept", base_tok,
                        {"opsm_delta": 0.125, "opsm_advantage_gate": "token"}))
    out.append(case("loss.grpo", "is-token-untruncated", "edge",
                    "is_level token, both bounds null: the raw weight e^(l_old - l_mu)", base_tok,
                    {"beta": 0, "is_level": "token", "is_c_min": None, "is_c_max": None}))
    return out


# regimes the fuzzer found (issue 42, docs/fuzz.md "Measured") ---------------------------------

# 1.765625 * 2^127 = 3.004e38: bfloat16-exact, finite in float32; 1.2 times it overflows float32 and bfloat16
BIG = 1.765625 * 2.0 ** 127


def fuzz_found(fid):
    out = []
    base = dict(BATCH, advantages=A_SEQ)
    if fid in GROUPED:
        out.append(case(fid, "masked-nan-inf-token-mean-kl-k2", "edge",
                        "NaN and infinities at masked positions of every input, the KL term's reference log-probs too "
                        "(beta = 0.04, k2: the score (l - l_ref)^2 / 2 of a masked junk log-prob is NaN or inf), with "
                        "the batch-pooled token mean",
                        DIRTY, {"aggregation": "token_mean", "beta": "0.04", "kl_estimator": "k2"}))
    if fid in TOKEN_ADV:
        out.append(case(fid, "masked-overflowing-advantage", "edge",
                        "per-token advantages with a finite 3.004e38 (bfloat16-exact) at the masked positions, "
                        "where the log-ratio l - l_old is -0.5, -0.25 and 0.5: at the last, r A = 1.65 A (and a "
                        "clipped 1.2 A) overflows float32 and bfloat16; masked, it must reach neither the loss nor the gradient",
                        dict(base, advantages=[[a if m else BIG for a, m in zip(ra, rm)]
                                               for ra, rm in zip(A_TOK, MASK)]), no_kl(fid)))
    if fid in GROUPED:
        out.append(case(fid, "log-ratio-200-token-mean", "edge",
                        "log-ratios +200 and -200 with A = +-1 and the batch-pooled token mean (the DAPO/CISPO aggregation "
                        "OpenRLHF, TRL, Liger and verl run): e^200 = 7.2e86 overflows float32 where the unclipped branch or "
                        "the ratio is live, e^-200 = 1.4e-87 is no clamp's e^-20 (pgspec fuzz, OpenRLHF)",
                        extreme(200.0), {"aggregation": "token_mean"}))
        out.append(case(fid, "masked-nan-advantage-token-mean", "edge",
                        "per-token advantages with NaN at the masked positions (finite log-probs there), with the "
                        "batch-pooled token mean (the DAPO/CISPO aggregation TRL, Liger and verl run): it must reach "
                        "neither the loss nor the gradient",
                        dict(base, advantages=[[a if m else "nan" for a, m in zip(ra, rm)]
                                               for ra, rm in zip(A_TOK, MASK)]), {"aggregation": "token_mean"}))
    junk = {k: [[v if m else BIG for v, m in zip(row, mrow)] for row, mrow in zip(BATCH[k], MASK)]
            for k in ("logprobs", "old_logprobs", "sampler_logprobs")}
    if fid in ("loss.cispo", "loss.vespo", "loss.minirl"):
        out.append(case(fid, "masked-overflowing-logprob", "edge",
                        "a finite 3.004e38 (bfloat16-exact) log-prob at the masked positions (current, old and sampler "
                        "alike, so every ratio there is 1), no KL: the REINFORCE form -w A l has the log-prob as a factor, "
                        "so the masked per-token loss overflows float32 and bfloat16; masked, it must reach neither the "
                        "loss nor the gradient (pgspec fuzz, SkyRL's CISPO)",
                        dict(BATCH, **junk), {"aggregation": "token_mean"} if fid in GROUPED else {}))
    out.append(case(fid, "masked-overflowing-kl-k2", "edge",
                    "a finite 3.004e38 (bfloat16-exact) log-prob at the masked positions (current, old and sampler "
                    "alike, so every ratio there is 1; the reference's is finite), beta = 0.25, k2, KL token mean: the "
                    "masked k2 score (l - l_ref)^2 / 2 = 4.5e76 overflows float32 and bfloat16; masked, it must reach "
                    "neither the loss nor the gradient",
                    dict(BATCH, **junk), {"beta": 0.25, "kl_estimator": "k2", "kl_aggregation": "token_mean"}))
    out.append(case(fid, "kl-k3-on-reference-token", "edge",
                    "beta = 0.04, k3: token 1 has l = l_old = l_ref = -1/64, so x = 0 and its KL gradient e^x - 1 is "
                    "exactly 0, and its gradient is the policy term's alone (token 0: l - l_old = 2, x = -2); "
                    "formed as the two paths -beta e^x and +beta, a small policy gradient added to one of them "
                    "before the other cancels it keeps only its digits above beta's rounding",
                    {"logprobs": [[0.0, -0.015625]], "old_logprobs": [[-2.0, -0.015625]], "mask": [[True, True]],
                     "advantages": [0.125], "ref_logprobs": [[-2.0, -0.015625]], "group_ids": [0],
                     "sampler_logprobs": [[-2.0, -0.015625]]},
                    {"beta": "0.04", "kl_estimator": "k3"}))
    if fid != "loss.vespo":     # VESPO folds its IS weight in itself (no is_level)
        far = {k: [list(r) for r in BATCH[k]] for k in ("logprobs", "old_logprobs", "sampler_logprobs")}
        far["logprobs"][0][0] = far["old_logprobs"][0][0] = -201.0
        far["sampler_logprobs"][0][0] = -1.0
        out.append(case(fid, "is-token-rollout-log-ratio-200", "edge",
                        "token IS truncation (c_max 2) where the first token's rollout log-ratio l_old - l_mu = -200 "
                        "(l = l_old = -201, l_mu = -1; its policy ratio is 1): w^IS = e^-200 = 1.4e-87 nearly removes "
                        "that token's policy term, with no IS log-ratio clamp (a framework clamping it to -20 always "
                        "gives e^-20 = 2.1e-9)",
                        dict(base, **far, advantages=A_TOK if fid in TOKEN_ADV else A_SEQ),
                        {**no_kl(fid), "is_level": "token"}))
    if fid != "loss.vespo":     # VESPO folds its IS weight in itself (no is_level)
        out.append(case(fid, "masked-nan-inf-is-token", "edge",
                        "NaN and infinities at masked positions of every input, the sampler's log-probs included, with "
                        "token IS truncation (is_level token, c_max 2): a masked junk IS weight must reach neither the "
                        "loss nor the gradient", DIRTY, {**no_kl(fid), "is_level": "token"}))
    if fid == "loss.minirl":
        out.append(case(fid, "uncapped-sampler-ratio-200-zero-advantage", "edge",
                        "no TIS cap (is_cap null) and l - l_mu = 200 and 0 (l - l_old = 200 and 20) with A = 0: "
                        "loss and gradient exactly 0 (w = e^200 overflows float32 and bfloat16, and 0 * w would be NaN; "
                        "pgspec fuzz found it in the built-in backend)",
                        {"logprobs": [[-1.0, -1.0]], "old_logprobs": [[-201.0, -21.0]], "mask": [[True, True]],
                         "advantages": [[0.0, 0.0]], "sampler_logprobs": [[-201.0, -1.0]]}, {"is_cap": None}))
    ext768 = dict(extreme(768.0), logprobs=[[0.0, -4.0]] * 2 + [[-768.0, -772.0]] * 2,   # bfloat16-exact
                  old_logprobs=[[-768.0, -772.0]] * 2 + [[0.0, -4.0]] * 2)
    if fid == "loss.grpo":
        ext768["ref_logprobs"] = ext768["logprobs"]
    if fid == "loss.minirl":
        ext768["sampler_logprobs"] = ext768["old_logprobs"]
    out.append(case(fid, "log-ratio-768-zero-advantage", "edge",
                    "log-ratios +768 and -768 with A = 0 everywhere: loss and gradient exactly 0 (e^768 overflows "
                    "float64 too, past 709.78: a ratio of inf times a zero advantage, or its zero cotangent times the "
                    "ratio's derivative, would be NaN in every dtype)", dict(ext768, advantages=[0.0] * 4), no_kl(fid)))
    if fid != "loss.vespo":     # VESPO folds its IS weight in itself (no is_level)
        out.append(case(fid, "kl-with-token-is", "edge",
                        "token IS truncation (is_level token, c_max 2) with beta 0.25 and kl.k3: the IS weight "
                        "multiplies the policy term only, never the KL term; token rho = e^(l_old - l_mu) in {e^0.25, "
                        "e^0.125, e^-0.125, 1, e^0.0625}, none truncated, and x = l_ref - l nonzero",
                        dict(base, advantages=A_TOK if fid in TOKEN_ADV else A_SEQ),
                        {"is_level": "token", "beta": 0.25, "kl_estimator": "k3"}))
    return out


def cases():
    out = examples() + regressions() + extras() + presets() + binding() + seeds()
    for k, fid in enumerate(IDS):
        out += edges(fid) + options(fid) + randoms(fid, k) + scales(fid, k)
        out += fuzz_found(fid)
    return out
