"""Regime cases (conformance/corpus/regimes.py, issue 36 item 4): each witnesses regimes the rest of
the corpus left out, several at once where one case can.

* gates at equality with the gated term non-zero: r = 1 - eps_low = 1 + eps_high = 1 exactly (eps = 0
  at l = l_old) with A > 0 and A < 0, a log-ratio exactly at its clamp, a statistic exactly at its
  bound (a keep flag compared);
* composed bounds in both orders and with both advantage signs: a log-ratio clamp inside the clip
  band (c = 1/8: e^c = 1.133 < 1.2, e^-c = 0.882 > 0.8) and beyond it (c = 1), the dual-clip cap
  and TRL's delta inside the clip band, a KL input clamp whose estimate the output clamp then does
  or does not clamp, an IS log-weight clamp inside (e^c <= C_max) or beyond the band;
* the same regimes inside a loss.* recipe (which composes these formulas with its own parameter
  names: ``is_c_max``, ``kl_log_ratio_min``, ``opsm_delta``, ...);
* float64-only effects, three cases each: a float32 accumulation that loses a 2^-30 addend, an eps
  that moves an advantage or a mean by less than float32 resolves.

Every input is exactly representable in bfloat16; log-ratios are d = l - l_old with l_old = -4
(l between -6 and -2).  ``cases_for(module)`` gives the cases of one family module (the ``loss.*``
ones under "loss"); ``all_cases`` appends them to that module's cases.
"""

from __future__ import annotations

from .case import Case

BASE = -4.0


def _rows(d_rows, base=BASE):
    """(l, l_old) with l - l_old = d, l_old = base."""
    return [[base + d for d in row] for row in d_rows], [[base] * len(row) for row in d_rows]


def tokens(d_rows, adv, **extra):
    lp, old = _rows(d_rows)
    return {"logprobs": lp, "old_logprobs": old, "mask": [[True] * len(r) for r in d_rows], "advantages": adv,
            **extra}


# d = +-1/2 and +-1/8 with both advantage signs (per token): with c = 1/8 the clamp binds inside the
# PPO band [0.8, 1.2], and d = +-1/8 sits exactly on it
SMALL_D = [[0.5, -0.5, 0.125, -0.125], [0.5, -0.5, 0.125, -0.125]]
SMALL_A = [[1.0, 1.0, 1.0, -1.0], [-1.0, -1.0, -1.0, 1.0]]
# d = +-2 and +-1 with both signs: with c = 1 the clamp binds beyond the band, d = +-1 on it
LARGE_D = [[2.0, -2.0, 1.0, -1.0], [2.0, -2.0, 1.0, -1.0]]
# r = 1 exactly (d = 0) with both signs, and d = +-1/4 beside it
ZERO_D = [[0.0, 0.25], [0.0, -0.25]]
ZERO_A = [[1.0, -1.0], [-1.0, 1.0]]

SMALL = "log_ratio_clamp 1/8 inside the band: d = (1/2, -1/2, 1/8, -1/8) with A = (1, 1, 1, -1) and (-1, -1, -1, 1)"
LARGE = "log_ratio_clamp 1 beyond the band: d = (2, -2, 1, -1) with A = (1, 1, 1, -1) and (-1, -1, -1, 1)"
ZERO = "eps_low = eps_high = 0 and l = l_old at one token per row: r = 1 = 1 - eps_low = 1 + eps_high with A = 1 and -1"


def _surrogate():
    out = []
    for fid in ("surrogate.pg", "surrogate.ppo_clip", "surrogate.dual_clip", "surrogate.sapo"):
        out.append(Case(f"{fid}/regime-clamp-inside-band", fid, "edge",
                        SMALL + ": clamped tokens are constants (gradient 0), d = +-1/8 exactly on the clamp keeps "
                        "its derivative", tokens(SMALL_D, SMALL_A), {"log_ratio_clamp": 0.125}))
    for fid in ("surrogate.ppo_clip", "surrogate.dual_clip"):
        out.append(Case(f"{fid}/regime-clamp-beyond-band", fid, "edge",
                        LARGE + ": for A > 0 above (A < 0 below) the clip, not the clamp, sets the value",
                        tokens(LARGE_D, SMALL_A), {"log_ratio_clamp": 1.0}))
    for fid in ("surrogate.ppo_clip", "surrogate.dual_clip", "surrogate.trl_delta"):
        out.append(Case(f"{fid}/regime-eps-zero-at-one", fid, "edge",
                        ZERO + ": both branches tie, the derivative is -A r (the closed interval) on either sign",
                        tokens(ZERO_D, ZERO_A), {"eps_low": 0, "eps_high": 0}))
    fid = "surrogate.dual_clip"
    out.append(Case(f"{fid}/regime-cap-inside-band", fid, "edge",
                    "c = 2 < 1 + eps_high = 4: d = (1, 1/2), A = -1: r = e = 2.718 lies inside the clip band but "
                    "above c, so the dual cap -c A = 2 binds (gradient 0); r = e^0.5 = 1.649 is below it (loss r)",
                    tokens([[1.0, 0.5]], [[-1.0, -1.0]]), {"eps_high": 3.0, "c": 2.0}))
    fid = "surrogate.trl_delta"
    out.append(Case(f"{fid}/regime-delta-one", fid, "edge",
                    "delta = 1 < 1 + eps_high = 1.5: d = 0 (r = delta exactly, A = 1 and -1: derivative 1 on the cap) "
                    "and d = 1/4 (r = 1.284 > delta, A = -1: the capped branch min(r, 1) is the smaller, the clipped "
                    "branch's r is the loss)",
                    tokens([[0.0, 0.25], [0.0, 0.25]], [[1.0, -1.0], [-1.0, -1.0]]), {"eps_high": 0.5, "delta": 1.0}))
    fid = "surrogate.cispo"
    out.append(Case(f"{fid}/regime-relative-eps-low-zero", fid, "edge",
                    "cap_form relative, eps_low = 0, eps_high = 1/2, log_ratio_clamp 1/8: d = (0, 1/8, -1/8, 1/2), "
                    "A = (1, -1, 1, -1): w = r = 1 exactly at the lower bound, d = +-1/8 exactly on the clamp",
                    tokens([[0.0, 0.125, -0.125, 0.5]], [[1.0, -1.0, 1.0, -1.0]]),
                    {"eps_low": 0, "eps_high": 0.5, "log_ratio_clamp": 0.125}))
    out.append(Case(f"{fid}/regime-absolute-at-cap", fid, "edge",
                    "cap_form absolute, eps_high = 1: d = (0, 1/2, -1/2), A = (1, -1, 1): w = min(r, 1) = 1 = r "
                    "exactly at the cap, e^0.5 capped to 1, e^-0.5 uncapped",
                    tokens([[0.0, 0.5, -0.5]], [[1.0, -1.0, 1.0]]), {"cap_form": "absolute", "eps_high": 1.0}))
    fid = "surrogate.gmpo"
    out.append(Case(f"{fid}/regime-log-clip-at-bounds", fid, "edge",
                    "eps_low = eps_high = 1/4: sequence 1 (A = 1) d = (1/4, 1/2): d = eps_high exactly ties min(d, "
                    "clip d); sequence 2 (A = -1) d = (-1/4, -1/2): d = -eps_low exactly ties max(d, clip d)",
                    tokens([[0.25, 0.5], [-0.25, -0.5]], [1.0, -1.0]), {"eps_low": 0.25, "eps_high": 0.25}))
    fid = "surrogate.gspo"
    out.append(Case(f"{fid}/regime-eps-zero-at-one", fid, "edge",
                    "eps_low = eps_high = 0, log_ratio_max 1: sequences d = (1/4, -1/4), (0, 0) with A = 1, -1 "
                    "have s = 1 exactly at both bounds; d = (2, 2) with A = 1: the mean 2 is capped at 1, e^1 beyond "
                    "the band, so the clip sets the loss",
                    tokens([[0.25, -0.25], [0.0, 0.0], [2.0, 2.0]], [1.0, -1.0, 1.0]),
                    {"eps_low": 0, "eps_high": 0, "log_ratio_max": 1.0}))
    out.append(Case(f"{fid}/regime-cap-inside-band", fid, "edge",
                    "eps_high = 1/2, log_ratio_max 1/4 (e^0.25 = 1.284 < 1.5): d = (1/2, 1/2) with A = 1 and -1: "
                    "the cap binds inside the band (s = e^0.25, gradient 0 on both signs)",
                    tokens([[0.5, 0.5], [0.5, 0.5]], [1.0, -1.0]), {"eps_high": 0.5, "log_ratio_max": 0.25}))
    return out


def _ratio():
    def ratio_inputs(d_rows):
        lp, old = _rows(d_rows)
        return {"logprobs": lp, "old_logprobs": old, "mask": [[True] * len(r) for r in d_rows]}

    return [
        Case("ratio.token/regime-clamp-equality", "ratio.token", "edge",
             "log_ratio_clamp 1/8: d = (1/2, -1/2, 1/8, -1/8): the last two exactly on the clamp (derivative 1)",
             ratio_inputs(SMALL_D[:1]), {"log_ratio_clamp": 0.125}),
        Case("ratio.sequence_product/regime-clamp-equality", "ratio.sequence_product", "edge",
             "log_ratio_clamp 1/2: sequence sums 1/2 and -1/2 exactly on the clamp (derivative 1 per token)",
             ratio_inputs([[0.25, 0.25], [-0.25, -0.25]]), {"log_ratio_clamp": 0.5}),
        Case("ratio.sequence_geometric/regime-clamp-and-cap", "ratio.sequence_geometric", "edge",
             "log_ratio_clamp 1, log_ratio_max 1/2: d = (2, 0): clamped mean 1/2 exactly at the cap; (2, -3/2): "
             "clamped (1, -1), mean 0 below the cap; (3, 1): clamped (1, 1), mean 1 capped",
             ratio_inputs([[2.0, 0.0], [2.0, -1.5], [3.0, 1.0]]), {"log_ratio_clamp": 1.0, "log_ratio_max": 0.5}),
        Case("ratio.gspo_token/regime-cap-equality", "ratio.gspo_token", "edge",
             "log_ratio_max 1/2: d = (1/2, 1/2): the sequence log-ratio exactly at the cap (derivative kept)",
             ratio_inputs([[0.5, 0.5]]), {"log_ratio_max": 0.5}),
    ]


# KL: x = l_ref - l in {-1, 2 (on the input bounds), -2, 3 (beyond)}; bounds [-1, 2] on x, [-1/2, 3/2]
# on the estimate: beyond 2 the estimate of x = 2 exceeds an output bound (k1: -2, k2: 2, k3: 4.39,
# abs: 2), beyond -1 it does not (k1: 1, k2: 1/2, k3: 0.368, abs: 1)
KL_X = [[-1.0, 2.0, -2.0, 3.0]]
KL_PARAMS = {"log_ratio_min": -1.0, "log_ratio_max": 2.0, "output_min": -0.5, "output_max": 1.5}
KL_TEXT = ("x = l_ref - l = (-1, 2, -2, 3), input clamp [-1, 2], output clamp [-1/2, 3/2]: x = -1 and 2 exactly on "
           "the input bounds; x = 3 clamped to 2, whose estimate the output clamp then clamps; x = -2 clamped to -1, "
           "whose estimate lies inside the output bounds")
KL_IDS = ("kl.k1", "kl.k2", "kl.k3", "kl.abs", "kl.k3_straight_through")


def _kl():
    lp = [[BASE] * 4]
    ref = [[BASE + x for x in KL_X[0]]]
    out = [Case(f"{fid}/regime-input-and-output-clamps", fid, "edge", KL_TEXT,
                {"logprobs": lp, "ref_logprobs": ref, "mask": [[True] * 4]}, dict(KL_PARAMS)) for fid in KL_IDS]
    fid = "kl.k3_unbiased"
    out.append(Case(f"{fid}/regime-overflowed-weight-at-zero", fid, "edge",
                    "l - l_old = 200 (w = e^200, beyond float32) at x = l_ref - l = 0, and l - l_old = 1/2 at x = 1: "
                    "y = w k3(0) = 0 and dy/dl = -w x = 0 exactly (an implementation that forms w first must not "
                    "return inf x 0 = NaN); the second token y = e^0.5 (e - 2), dy/dl = -e^0.5",
                    {"logprobs": [[-1.0, -2.0]], "old_logprobs": [[-201.0, -2.5]], "ref_logprobs": [[-1.0, -1.0]],
                     "mask": [[True, True]]}, {"log_ratio_min": -1.0, "log_ratio_max": 1.0}))
    return out


# IS: u = l_old - l_mu per token (0, 0), (1/4, 1/4), (1/2, 1/2), (1, 1): per level (token, sum, mean)
# some weight is exactly 1, some log-weight exactly the clamp 1/2, some beyond it
IS_U = [[0.0, 0.0], [0.25, 0.25], [0.5, 0.5], [1.0, 1.0]]
IS_LEVELS = ("token", "sequence", "geometric")


def _is_inputs(extra=None):
    mu = [[-2.0] * 2 for _ in IS_U]
    old = [[-2.0 + u for u in row] for row in IS_U]
    return {"old_logprobs": old, "sampler_logprobs": mu, "mask": [[True, True] for _ in IS_U], **(extra or {})}


IS_INSIDE = ("u = l_old - l_mu = (0, 0), (1/4, 1/4), (1/2, 1/2), (1, 1); log_ratio_clamp 1/2 with C_max = 2 > e^0.5 "
             "= 1.649: a log-weight beyond the clamp gives the weight e^0.5, inside the band (kept, not truncated)")


def _is():
    out = []
    for level in IS_LEVELS:
        for mode in ("truncate", "mask"):
            fid = f"is.{level}.{mode}"
            out.append(Case(f"{fid}/regime-clamp-inside-band", fid, "edge", IS_INSIDE, _is_inputs(),
                            {"c_min": 0.5, "c_max": 2.0, "log_ratio_clamp": 0.5}))
    return out


def _mask():
    fid = "mask.opsm"
    # kappa = mean (l_mu - l) = 1 > delta = 1/2; A_t = (0, -1, 1)
    return [Case(f"{fid}/regime-token-gate-zero", fid, "edge",
                 "advantage_gate token, delta 1/2: l_mu - l = 1 per token (kappa = 1 > delta) and A_t = (0, -1, 1): "
                 "A_t = 0 is kept (the gate is A_t < 0), A_t = -1 dropped, A_t = 1 kept",
                 {"logprobs": [[-3.0, -3.0, -3.0]], "sampler_logprobs": [[-2.0, -2.0, -2.0]],
                  "advantages": [[0.0, -1.0, 1.0]], "mask": [[True, True, True]]},
                 {"delta": 0.5, "advantage_gate": "token"})]


# float64-only effects -------------------------------------------------------------------------------

TINY = 2.0 ** -30


def _agg():
    out = []
    v = [[1.0, TINY, TINY], [TINY, 1.0, TINY]]
    m = [[True, True, True], [True, True, False]]
    text = ("values 1 and 2^-30 (each exact in bfloat16): float32 accumulation 1 + 2^-30 = 1 drops the small "
            "addends, float64 keeps them (a float32 sum in a float64 path fails here)")
    extra = {"agg.prompt_mean": {"group_ids": [0, 1]}, "agg.document_mean": {"document_ids": [[0, 0, 1], [2, 2, 2]]}}
    params = {"agg.constant": {"divisor": 4}}
    for fid in ("agg.token_mean", "agg.sample_mean", "agg.seq_mean_token_sum", "agg.constant", "agg.prompt_mean",
                "agg.document_mean"):
        out.append(Case(f"{fid}/regime-float32-accumulation", fid, "edge", text,
                        {"values": v, "mask": m, **extra.get(fid, {})}, params.get(fid, {})))
    fid = "agg.token_mean"
    for eps in ("1e-12", "1e-10"):
        out.append(Case(f"{fid}/regime-eps-{eps}", fid, "edge",
                        f"eps = {eps}: (1 + 2 + 4) / (3 + {eps}) moves the mean by a relative {eps}/3, which float64 "
                        "resolves and float32 does not", {"values": [[1.0, 2.0, 4.0]], "mask": [[True] * 3]},
                        {"eps": eps}))
    return out


def _adv():
    out = []
    rewards = {"rewards": [1.0, 0.0, 2.0, 0.0, 0.5, 0.0], "group_ids": [0, 0, 1, 1, 2, 2]}
    for fid in ("adv.group_normalized", "adv.batch_normalized"):
        for place in ("std", "variance"):
            for std, eps in (("population", "1e-8"), ("bessel", "1e-9"), ("population", "1e-10")):
                out.append(Case(f"{fid}/regime-eps-{place}-{std}-{eps}", fid, "edge",
                                f"eps = {eps} added to the {place}, {std} std of groups with spreads 1/2, 1, 1/4: "
                                "eps moves each advantage by a relative 1e-8 or less, below float32's resolution "
                                "and far above float64's (where eps sits matters to float64 only)",
                                rewards, {"eps": eps, "eps_placement": place, "std": std}))
    return out


# recipes --------------------------------------------------------------------------------------------

def _loss():
    out = []

    def add(fid, slug, text, inputs, params):
        out.append(Case(f"{fid}/{slug}", fid, "edge", text, inputs, params))

    add("loss.grpo", "regime-clamp-inside-band", SMALL, tokens(SMALL_D, SMALL_A), {"beta": 0, "log_ratio_clamp": 0.125})
    add("loss.cispo", "regime-relative-eps-low-zero",
        "cap_form relative, eps_low = 0, eps_high = 1/2, log_ratio_clamp 1/8, token mean: d = (0, 1/8, -1/8, 1/2), "
        "A = (1, -1, 1, -1): w = 1 exactly at the lower bound, d = +-1/8 exactly on the clamp",
        tokens([[0.0, 0.125, -0.125, 0.5]], [[1.0, -1.0, 1.0, -1.0]]),
        {"aggregation": "token_mean", "eps_low": 0, "eps_high": 0.5, "log_ratio_clamp": 0.125})
    add("loss.cispo", "regime-absolute-at-cap",
        "cap_form absolute, eps_high = 1, token mean: d = (0, 1/2, -1/2), A = (1, -1, 1): w = 1 = r exactly at the cap",
        tokens([[0.0, 0.5, -0.5]], [[1.0, -1.0, 1.0]]),
        {"aggregation": "token_mean", "cap_form": "absolute", "eps_high": 1.0})
    add("loss.sapo", "regime-clamp-equality", SMALL, tokens(SMALL_D, SMALL_A), {"log_ratio_clamp": 0.125})
    add("loss.gspo", "regime-eps-zero-at-one",
        "eps_low = eps_high = 0: sequences d = (1/4, -1/4), (0, 0) with A = 1, -1: s = 1 exactly at both bounds",
        tokens([[0.25, -0.25], [0.0, 0.0]], [1.0, -1.0]), {"eps_low": 0, "eps_high": 0})
    add("loss.gspo", "regime-cap-inside-band",
        "eps_high = 1/2, log_ratio_max 1/4 (e^0.25 < 1.5): d = (1/2, 1/2) with A = 1 and -1: the cap binds inside "
        "the band", tokens([[0.5, 0.5], [0.5, 0.5]], [1.0, -1.0]), {"eps_high": 0.5, "log_ratio_max": 0.25})
    # KL inside the recipe: l = l_old (policy term -A), x as the kl cases
    kl_in = tokens([[0.0] * 4], [[1.0, -1.0, 1.0, -1.0]], ref_logprobs=[[BASE + x for x in KL_X[0]]])
    for fid in KL_IDS:
        est = fid.split(".", 1)[1]
        add("loss.grpo", f"regime-kl-{est.replace('_', '-')}-clamps", KL_TEXT + f" (kl_estimator {est}, beta 0.04)",
            kl_in, {"kl_estimator": est, **{f"kl_{k}": v for k, v in KL_PARAMS.items()}})
    # IS inside the recipe: l = l_old, A = 1 (policy term -1 per token, weighted)
    is_in = tokens([[0.0, 0.0] for _ in IS_U], [1.0] * len(IS_U), **{
        k: v for k, v in _is_inputs().items() if k == "sampler_logprobs"})
    is_in["old_logprobs"] = _is_inputs()["old_logprobs"]
    is_in["logprobs"] = [row[:] for row in is_in["old_logprobs"]]
    for level in IS_LEVELS:
        for mode in ("truncate", "mask"):
            add("loss.grpo", f"regime-is-{level}-{mode}-band-of-one",
                "is_c_min = is_c_max = 1, is_log_ratio_clamp 1/2 (e^0.5 > 1): " + IS_INSIDE.split(";")[0]
                + ": a weight exactly 1 is on both bounds (kept), a clamped log-weight still beyond the band",
                is_in, {"beta": 0, "is_level": level, "is_mode": mode, "is_c_min": 1.0, "is_c_max": 1.0,
                        "is_log_ratio_clamp": 0.5})
            add("loss.grpo", f"regime-is-{level}-{mode}-clamp-inside-band", IS_INSIDE, is_in,
                {"beta": 0, "is_level": level, "is_mode": mode, "is_c_min": 0.5, "is_c_max": 2.0,
                 "is_log_ratio_clamp": 0.5})
    # OPSM inside the recipe: sequence 1 kappa = 1/2 = delta with A = (-1, -1); sequence 2 kappa = 1 > delta
    # with A = (1, -1) (mean 0: kept); the policy term is non-zero at every token
    opsm_in = tokens([[0.0, 0.0], [0.0, 0.0]], [[-1.0, -1.0], [1.0, -1.0]],
                     sampler_logprobs=[[BASE + 0.5, BASE + 0.5], [BASE + 1.0, BASE + 1.0]])
    add("loss.grpo", "regime-opsm-gates-at-equality",
        "opsm_delta 1/2: sequence 1 kappa = mean (l_mu - l) = 1/2 = delta exactly with A = (-1, -1) (kept: the "
        "test is kappa > delta); sequence 2 kappa = 1 > delta with A = (1, -1), mean 0 (kept: the gate is A < 0)",
        opsm_in, {"beta": 0, "opsm_delta": 0.5})
    return out


_BY_MODULE = {"surrogate": _surrogate, "ratio": _ratio, "kl": _kl, "is_": _is, "mask": _mask, "agg": _agg,
              "adv": _adv, "loss": _loss}


def cases_for(module: str) -> list[Case]:
    fn = _BY_MODULE.get(module)
    return fn() if fn else []
