"""Golden cases of the kl family (spec/kl.md).

Every estimator is a function of the reference log-ratio x = l_ref - l; the descriptions give x and
the hand-checkable values.  Clamp parameters use pgspec's orientation (a framework bound
lambda = l - l_ref >= -10 is log_ratio_max = 10 here).
"""

from __future__ import annotations

from .case import Case, random_inputs

IDS = ("kl.k1", "kl.k2", "kl.k3", "kl.abs", "kl.k3_straight_through", "kl.k3_unbiased")

VERL_K3 = {"log_ratio_min": -20, "log_ratio_max": 20, "output_min": -10, "output_max": 10}   # verl / SkyRL k3
NEMO = {"log_ratio_min": -20, "log_ratio_max": 20, "output_min": -10, "output_max": 10}      # NeMo-RL 20 / 10
ORLHF_VALUE = {"output_min": -10, "output_max": 10}                                          # OpenRLHF k1, k2
ORLHF_K3 = {"log_ratio_max": 10, "output_min": -10, "output_max": 10}                        # OpenRLHF 0.11.2 k3

TWO = {"logprobs": [[-1.0, -2.0]], "ref_logprobs": [[-1.5, -1.0]], "mask": [[True, True]]}
# research conformance vector 6 (verl_openrlhf_areal_skyrl.md): x = (-0.5, 1, 29.5, -40)
V6 = {"logprobs": [[-1.0, -2.0, -30.0, 0.0]], "ref_logprobs": [[-1.5, -1.0, -0.5, -40.0]], "mask": [[True] * 4]}
LP = [[-1.0, -2.5, -0.375, -4.0], [-0.5, -3.0, -1.25, -2.0]]
REF = [[-1.25, -2.0, -0.5, -3.5], [-0.75, -2.5, -1.0, -2.5]]
MASK = [[True, True, True, False], [True, True, False, False]]
PADDED = {"logprobs": LP, "ref_logprobs": REF, "mask": MASK}
# x = +-20 and +-200 (l_ref - l)
X20 = {"logprobs": [[-20.0, 0.0]], "ref_logprobs": [[0.0, -20.0]], "mask": [[True, True]]}
X200 = {"logprobs": [[-200.0, 0.0]], "ref_logprobs": [[0.0, -200.0]], "mask": [[True, True]]}
# x = 2^-20, -2^-20, 2^-30, -2^-30: k3 = x^2/2 + x^3/6 + ..., where exp(x) - 1 - x cancels
TINY = {"logprobs": [[-2.0 ** -20, 0.0, -2.0 ** -30, 0.0]], "ref_logprobs": [[0.0, -2.0 ** -20, 0.0, -2.0 ** -30]],
        "mask": [[True] * 4]}
# x = 88 (e^88 = 1.65e38 fits float32) and x = 89 (e^89 = 4.49e38 does not)
X88 = {"logprobs": [[-88.0, -89.0]], "ref_logprobs": [[0.0, 0.0]], "mask": [[True, True]]}
# 1.765625 * 2^127 = 3.004e38: bfloat16-exact, finite in float32, its square overflows float32 and bfloat16
BIG = 1.765625 * 2.0 ** 127
DIRTY = {"logprobs": [[-1.0, "nan", "inf", -2.0]], "ref_logprobs": [[-1.5, "-inf", "nan", "inf"]],
         "mask": [[True, False, False, False]]}

ISSUES = {
    "trl3015": "https://github.com/huggingface/trl/issues/3015",
    "verl2928": "https://github.com/verl-project/verl/issues/2928",
    "verl2953": "https://github.com/verl-project/verl/pull/2953",
    "nemo876": "https://github.com/NVIDIA-NeMo/RL/pull/876",
    "nemo2506": "https://github.com/NVIDIA-NeMo/RL/pull/2506",
    "nemo2958": "https://github.com/NVIDIA-NeMo/RL/pull/2958",
    "skyrl1340": "https://github.com/NovaSky-AI/SkyRL/issues/1340",
    "orlhf0112": "https://pypi.org/project/openrlhf/0.11.2/",
    "dsv32": "https://arxiv.org/abs/2512.02556",
}


def with_old(inputs, old=None):
    """The inputs of kl.k3_unbiased: ``old`` log-probs (default: on-policy, l_old = l)."""
    return {"logprobs": inputs["logprobs"], "old_logprobs": old if old is not None else inputs["logprobs"],
            "ref_logprobs": inputs["ref_logprobs"], "mask": inputs["mask"]}


def _shared(fid, inputs_for):
    """Edge and random cases every estimator has (same inputs, estimator-specific expectations)."""
    fields = ("logprobs", "ref_logprobs", "mask") if fid != "kl.k3_unbiased" else (
        "logprobs", "old_logprobs", "ref_logprobs", "mask")
    clamps = VERL_K3
    return [
        Case(f"{fid}/on-reference", fid, "edge",
             "l = l_ref: x = 0 at every token, every estimator is 0 (kl.abs sits on its kink, gradient 0)",
             inputs_for({"logprobs": LP, "ref_logprobs": LP, "mask": MASK})),
        Case(f"{fid}/empty-sequence", fid, "edge",
             "the second sequence has no unmasked token: its outputs are null, its gradients 0",
             inputs_for({"logprobs": LP, "ref_logprobs": REF, "mask": [MASK[0], [False] * 4]})),
        Case(f"{fid}/all-masked", fid, "edge", "no token counts anywhere: all outputs null, all gradients 0",
             inputs_for({"logprobs": LP, "ref_logprobs": REF, "mask": [[False] * 4, [False] * 4]})),
        Case(f"{fid}/masked-nan-inf", fid, "edge",
             "NaN and infinities at masked positions must not reach any output or gradient "
             "(the one unmasked token has x = -0.5)",
             inputs_for(DIRTY, [[-1.25, "inf", "-inf", "nan"]])),
        Case(f"{fid}/masked-overflowing-log-ratio", fid, "edge",
             "a masked token with finite log-probs whose x = 1000 overflows exp in every dtype: it must reach no "
             "output or gradient (the unmasked token has x = -0.5)",
             inputs_for({"logprobs": [[-1.0, -1000.0]], "ref_logprobs": [[-1.5, 0.0]], "mask": [[True, False]]})),
        Case(f"{fid}/log-ratio-20", fid, "edge",
             "x = +20 and -20: k1 = (-20, 20), k2 = (200, 200), k3 = (e^20 - 21 = 485165174.41, 19 + e^-20), "
             "abs = (20, 20)", inputs_for(X20)),
        Case(f"{fid}/log-ratio-200", fid, "edge",
             "x = +200 and -200 unclamped: k3(200) = e^200 - 201 = 7.2e86 overflows float32 (an infinity there "
             "passes by overflow), k3(-200) = 199 + e^-200", inputs_for(X200)),
        Case(f"{fid}/log-ratio-200-clamped", fid, "edge",
             "x = +-200 with verl's k3 clamps (x to [-20, 20], value to [-10, 10]): x is clamped to +-20 and "
             "every value then to 10 or -10 (k1: -10, 10); gradients 0 (kl.k3_straight_through: -x = (-200, 200))", inputs_for(X200), dict(clamps)),
        Case(f"{fid}/log-ratio-200-output-clamp-only", fid, "edge",
             "x = 200, 768 and -200 with the value clamped to [-10, 10] and x left unclamped (AReaL's apply_clamp, "
             "OpenRLHF's k1/k2 value clamp): every estimate beyond 10 is held at 10 or -10 with gradient 0 (kl.k3_straight_through: "
             "its k2 score's gradient -x); k3(200) overflows float32 and k3(768) float64, and the held token's zero "
             "gradient must not meet that infinite derivative as 0 * inf = NaN (pgspec fuzz, AReaL)",
             inputs_for({"logprobs": [[-201.0, -768.0, 0.0]], "ref_logprobs": [[-1.0, 0.0, -200.0]],
                         "mask": [[True] * 3]}), dict(ORLHF_VALUE)),
        Case(f"{fid}/tiny-log-ratio", fid, "edge",
             "x = 2^-20, -2^-20, 2^-30, -2^-30: k3 = x^2/2 + x^3/6 (2^-41 + 2^-61/3, ...); "
             "float64 exp(x) - 1 - x is exactly 0 at 2^-30", inputs_for(TINY)),
        Case(f"{fid}/bounds-inclusive", fid, "edge",
             "x = (-20, 20, -0.5): the input clamp [-20, 20] has derivative 1 on its closed interval, so tokens "
             "exactly on a bound keep their gradient",
             inputs_for({"logprobs": [[0.0, -20.0, -1.0]], "ref_logprobs": [[-20.0, 0.0, -1.5]], "mask": [[True] * 3]}),
             {"log_ratio_min": -20, "log_ratio_max": 20}),
        Case(f"{fid}/one-sided-output-clamp", fid, "edge",
             "only output_max = 0.5 (output_min null): x = (-0.5, 1, 29.5, -40) on research vector 6",
             inputs_for(V6), {"output_max": 0.5}),
        Case(f"{fid}/random-1", fid, "random",
             "generator inputs (seed 601), 3 sequences of lengths 16, 9 and 1",
             random_inputs(601, 3, 16, fields, (16, 9, 1))),
        Case(f"{fid}/random-2", fid, "random", "generator inputs (seed 602), 4 sequences of 7, verl's k3 clamps",
             random_inputs(602, 4, 7, fields), dict(clamps)),
    ]


# x = l_ref - l = (-3, 2.5, 0.5, 0.125): beyond both sides of a [-2, 1.5] input clamp, and two small values
CLAMP_BOTH = {"logprobs": [[0.0, -2.5, -1.0, -0.125]], "ref_logprobs": [[-3.0, 0.0, -0.5, 0.0]], "mask": [[True] * 4]}


def _binding(fid, inputs_for):
    """Cases in which each side of the input clamp and the output floor takes effect on an unmasked
    token while the other parameters stay off (pgspec golden coverage)."""
    return [
        Case(f"{fid}/input-clamp-both-sides", fid, "edge",
             "x = (-3, 2.5, 0.5, 0.125) with the input clamp [-2, 1.5] and no output clamp: the first two tokens "
             "are clamped (one per side, no gradient), the others are not",
             inputs_for(CLAMP_BOTH), {"log_ratio_min": -2, "log_ratio_max": 1.5}),
        Case(f"{fid}/output-floor", fid, "edge",
             "x = (-3, 2.5, 0.5, 0.125) with output_min = 0.25 > 0 (so a floor binds even for the non-negative "
             "estimators): values below 0.25 are raised to it and lose their gradient",
             inputs_for(CLAMP_BOTH), {"output_min": 0.25}),
    ]


def _estimator_cases(fid):
    no_old = lambda inputs, old=None: inputs  # noqa: E731 - the estimators take no old_logprobs
    out = _shared(fid, no_old) + _binding(fid, no_old)
    name = fid.split(".")[1]
    two = {"kl.k1": "k1 = -x = (0.5, -1), gradient 1",
           "kl.k2": "k2 = x^2/2 = (0.125, 0.5), gradient -x = (0.5, -1)",
           "kl.k3": "k3 = e^x - 1 - x = (e^-0.5 - 0.5, e - 2) = (0.10653065971, 0.71828182846), "
                    "gradient 1 - e^x = (0.39346934029, -1.7182818285)",
           "kl.abs": "abs = |x| = (0.5, 1), gradient sign(l - l_ref) = (1, -1)",
           "kl.k3_straight_through": "value k3 = (0.10653065971, 0.71828182846), gradient -x = (0.5, -1)"}[fid]
    out += [
        Case(f"{fid}/two-tokens", fid, "example", f"l = (-1, -2), l_ref = (-1.5, -1), x = (-0.5, 1): {two}", TWO),
        Case(f"{fid}/padded-batch", fid, "example",
             "two right-padded sequences of lengths 3 and 2, x = (-0.25, 0.5, -0.125 | -0.25, 0.5)", PADDED),
        Case(f"{fid}/vector-6-unclamped", fid, "example",
             "research conformance vector 6 without clamps: x = (-0.5, 1, 29.5, -40); k1 = (0.5, -1, -29.5, 40), "
             "k2 = (0.125, 0.5, 435.125, 800), k3 = (0.10653, 0.71828, e^29.5 - 30.5, 39 + e^-40)", V6),
    ]
    if fid in ("kl.k1", "kl.k2"):
        out.append(Case(f"{fid}/vector-6-openrlhf", fid, "example",
                        f"vector 6 with OpenRLHF's value clamp [-10, 10]: {name} = "
                        + ("(0.5, -1, -10, 10), gradient (1, 1, 0, 0)" if fid == "kl.k1"
                           else "(0.125, 0.5, 10, 10), gradient (0.5, -1, 0, 0)"), V6, dict(ORLHF_VALUE)))
        out.append(Case(f"{fid}/nemo-rl-clamps", fid, "example",
                        "NeMo-RL's kl_input_clamp_value = 20, kl_output_clamp_value = 10 on vector 6: x = 29.5 and -40 "
                        "are clamped to 20 and -20 first", V6, dict(NEMO)))
    else:
        out.append(Case(f"{fid}/vector-6-verl", fid, "example",
                        f"vector 6 with verl's k3 clamps (x to [-20, 20], value to [-10, 10]): "
                        + {"kl.k3": "k3 = (0.10653065971, 0.71828182846, 10, 10), gradient "
                                    "(0.39346934029, -1.7182818285, 0, 0)",
                           "kl.abs": "abs = (0.5, 1, 10, 10), gradient (1, -1, 0, 0)",
                           "kl.k3_straight_through": "value (0.10653065971, 0.71828182846, 10, 10), "
                                                     "gradient -x = (0.5, -1, -29.5, 40)"}[fid],
                        V6, dict(VERL_K3)))
    if fid == "kl.k2":
        out.append(Case("kl.k2/nemo-rl-2506-score-term", fid, "regression",
                        "the k2 gradient is l - l_ref = -x = (0.5, -1), not the k1 gradient 1 (NeMo-RL PR #2506: before the "
                        "fix the KL gradient omitted the score-function term and k2 behaved like k1)",
                        TWO, links=(ISSUES["nemo2506"],)))
        out.append(Case("kl.k2/masked-overflowing-square", fid, "edge",
                        "masked tokens with finite log-probs whose square overflows the low-precision dtypes: "
                        "x = +-3.004e38 (bfloat16-exact and finite in float32 and bfloat16, where "
                        "x^2 overflows to inf, while float64's x^2/2 = 4.5e76 is finite): masked, they must reach no "
                        "output or gradient (the unmasked token has x = -0.5: k2 = 0.125, gradient 0.5)",
                        {"logprobs": [[-1.0, -BIG, 0.0]], "ref_logprobs": [[-1.5, 0.0, -BIG]],
                         "mask": [[True, False, False]]}))
    if fid == "kl.k3":
        out += [
            Case("kl.k3/trl-3015-float32-overflow", fid, "regression",
                 "unclamped x = 88 and 89: k3(88) = e^88 - 89 = 1.65e38 is finite in float32, k3(89) = e^89 - 90 = "
                 "4.49e38 exceeds the float32 maximum 3.40e38 (an infinity passes by overflow there); gradients "
                 "1 - e^x (trl#3015: exp(ref - logp) overflows without a clamp)",
                 X88, links=(ISSUES["trl3015"],)),
            Case("kl.k3/verl-2928-output-clamp", fid, "regression",
                 "verl's k3 clamps on vector 6: x = 29.5 is clamped to 20 and k3(20) = e^20 - 21 = 4.85e8 to 10; "
                 "x = -40 to -20 and k3(-20) = 19 + e^-20 to 10; both gradients 0 (verl#2928 explains the value clamp)",
                 V6, dict(VERL_K3), links=(ISSUES["verl2928"],)),
            Case("kl.k3/openrlhf-one-sided-input-clamp", fid, "regression",
                 "OpenRLHF 0.11.2 bounds only lambda = -x >= -10 (log_ratio_max = 10, no log_ratio_min), value to "
                 "[-10, 10]: x = -10.5 keeps k3 = 9.5 + e^-10.5 = 9.5000275364 and gradient 1 - e^-10.5; "
                 "x = 10.5 is clamped to 10, k3(10) = e^10 - 11 = 22015.47 then to 10, gradient 0; a symmetric "
                 "bound would clamp -10.5 too",
                 {"logprobs": [[0.0, -10.5]], "ref_logprobs": [[-10.5, 0.0]], "mask": [[True, True]]},
                 dict(ORLHF_K3), links=(ISSUES["orlhf0112"],)),
            Case("kl.k3/vector-6-openrlhf", fid, "example",
                 "vector 6 with OpenRLHF's k3 clamps (x <= 10, value to [-10, 10]): k3 = (0.10653065971, "
                 "0.71828182846, 10, 10); x = -40 is not input-clamped, k3(-40) = 39 + e^-40 is value-clamped, "
                 "gradient (0.39346934029, -1.7182818285, 0, 0)", V6, dict(ORLHF_K3)),
            Case("kl.k3/skyrl-1340-has-gradient", fid, "regression",
                 "the k3 penalty must carry its gradient 1 - e^x = (0.39346934029, -1.7182818285) (SkyRL 0.3.1 "
                 "computed the KL loss under torch.no_grad, SkyRL#1340)", TWO, links=(ISSUES["skyrl1340"],)),
        ]
    if fid == "kl.k3_straight_through":
        out.append(Case("kl.k3_straight_through/verl-2953-clamped-gradient", fid, "regression",
                        "verl's k3+ with its clamps at x = 29.5 and -40: values clamped to 10, gradients still "
                        "-x = (-29.5, 40) (the clamps bound the value only; verl PR #2953)",
                        {"logprobs": [[-30.0, 0.0]], "ref_logprobs": [[-0.5, -40.0]], "mask": [[True, True]]},
                        dict(VERL_K3), links=(ISSUES["verl2953"],)))
    return out


def _unbiased_cases():
    fid = "kl.k3_unbiased"
    out = _shared(fid, with_old) + _binding(fid, with_old)
    old_two = [[-1.25, -2.0]]
    out += [
        Case(f"{fid}/deepseek-v32-two-tokens", fid, "example",
             "l = (-1, -2), l_old = (-1.25, -2), l_ref = (-1.5, -1): w = (e^0.25, 1), x = (-0.5, 1), "
             "y = w k3(x) = (e^0.25 (e^-0.5 - 0.5), e - 2) = (0.13678807473, 0.71828182846), gradient "
             "w (l - l_ref) = (0.5 e^0.25, -1) = (0.64201270834, -1) (DeepSeek-V3.2 Eq. 7)",
             with_old(TWO, old_two), links=(ISSUES["dsv32"],)),
        Case(f"{fid}/on-policy", fid, "example",
             "l_old = l: w = 1, the value is k3 = (0.10653065971, 0.71828182846) and the gradient is k2's, "
             "l - l_ref = (0.5, -1) (NeMo-RL's default e^(l - sg[l]) weight)", with_old(TWO)),
        Case(f"{fid}/deepseek-v32-padded-batch", fid, "example",
             "two right-padded sequences of lengths 3 and 2 sampled from pi_old = pi_theta perturbed by -0.25 .. 0.5 "
             "in log space: each value is e^(l - l_old) (e^x - 1 - x), each gradient e^(l - l_old) (l - l_ref)",
             with_old(PADDED, [[-1.5, -2.25, -0.5, -4.0], [-0.25, -3.5, -1.25, -2.0]]), links=(ISSUES["dsv32"],)),
        Case(f"{fid}/nemo-rl-clamps", fid, "example",
             "NeMo-RL's clamps (x to [-20, 20], product to [-10, 10]) on vector 6, on-policy: values "
             "(0.10653065971, 0.71828182846, 10, 10), gradients (0.5, -1, 0, 0)", with_old(V6), dict(NEMO)),
        Case(f"{fid}/ratio-20", fid, "edge",
             "importance log-ratios l - l_old = +20 and -20 with x = -0.5 and 1: y = (e^20 (e^-0.5 - 0.5), "
             "e^-20 (e - 2)) = (51684968.337, 1.4804891927e-9), gradient e^(l - l_old) (l - l_ref) = "
             "(0.5 e^20, -e^-20) = (242582597.7, -2.0611536224e-9)",
             {"logprobs": [[-1.0, -21.0]], "old_logprobs": [[-21.0, -1.0]], "ref_logprobs": [[-1.5, -20.0]],
              "mask": [[True, True]]}),
        Case(f"{fid}/ratio-200", fid, "edge",
             "importance log-ratios +200 and -200 with x = -0.5 and 1: w = e^200 = 7.2e86 overflows float32 "
             "(value and gradient pass by overflow there), e^-200 (e - 2) = 9.94e-88 underflows float32 to 0",
             {"logprobs": [[0.0, -200.0]], "old_logprobs": [[-200.0, 0.0]], "ref_logprobs": [[-0.5, -199.0]],
              "mask": [[True, True]]}),
        Case(f"{fid}/ratio-200-on-reference", fid, "edge",
             "importance log-ratios +200 and -200 with l_ref = l (x = 0): y = w k3(0) = 0 and gradient w (l - l_ref) = 0 "
             "exactly, although w = e^200 overflows float32 (inf * 0 would be NaN)",
             {"logprobs": [[0.0, -200.0]], "old_logprobs": [[-200.0, 0.0]], "ref_logprobs": [[0.0, -200.0]],
              "mask": [[True, True]]}),
        Case(f"{fid}/ratio-768-on-reference", fid, "edge",
             "l - l_old = 768 with l_ref = l (x = 0): y = w k3(0) = 0 and gradient w (l - l_ref) = 0 exactly, although "
             "w = e^768 overflows float64 as well as float32 (inf * 0 would be NaN: pgspec fuzz, Unsloth in float64)",
             {"logprobs": [[0.0]], "old_logprobs": [[-768.0]], "ref_logprobs": [[0.0]], "mask": [[True]]}),
        Case(f"{fid}/ratio-768-on-far-reference", fid, "edge",
             "l - l_old = -768 and x = l_ref - l = 768 (l_ref = l_old): w = e^-768 underflows float64 to 0 and k3(768) = "
             "e^768 - 769 overflows it, but y = w k3(x) = 1 - 769 e^-768 = 1 (to 330 digits), gradient w (l - l_ref) = "
             "-768 e^-768, 0 in every format (a product 0 * inf would be NaN: found by pgspec fuzz, TRL in float64)",
             {"logprobs": [[-768.0]], "old_logprobs": [[0.0]], "ref_logprobs": [[0.0]], "mask": [[True]]}),
        Case(f"{fid}/nemo-rl-2958-ratio-stopped-where-clamped", fid, "regression",
             "input clamp [-20, 20], l - l_old = 0.5: x = 29.5 is clamped, y = e^0.5 (e^20 - 21) = 799902142.85, gradient 0 "
             "(w detached where the clamp is active, NeMo-RL PR #2958); x = -0.5 is inside: y = e^0.5 (e^-0.5 - 0.5) "
             "= 1 - 0.5 e^0.5 = 0.17563936465, gradient 0.5 e^0.5 = 0.82436063535",
             {"logprobs": [[-30.0, -1.0]], "old_logprobs": [[-30.5, -1.5]], "ref_logprobs": [[-0.5, -1.5]],
              "mask": [[True, True]]}, {"log_ratio_min": -20, "log_ratio_max": 20}, links=(ISSUES["nemo2958"],)),
        Case(f"{fid}/nemo-rl-pre-2958-live-ratio", fid, "regression",
             "as nemo-rl-2958-ratio-stopped-where-clamped with sg_ratio_where_clamped = false (NeMo-RL before PR #2958): "
             "the clamped token's gradient is w k3(20) = e^0.5 (e^20 - 21) = 799902142.85",
             {"logprobs": [[-30.0, -1.0]], "old_logprobs": [[-30.5, -1.5]], "ref_logprobs": [[-0.5, -1.5]],
              "mask": [[True, True]]}, {"log_ratio_min": -20, "log_ratio_max": 20, "sg_ratio_where_clamped": False},
             links=(ISSUES["nemo2958"],)),
        Case(f"{fid}/nemo-rl-876-input-clamp", fid, "regression",
             "x = +-200 with NeMo-RL's input clamp 20 and no output clamp, l - l_old = -1: values "
             "e^-1 (e^20 - 21) = 178482293.24 and e^-1 (19 + e^-20) = 6.9897 are finite in float32, gradients 0 (NeMo-RL PR #876 "
             "added the clamp after NaN KL at large log-ratios)",
             {"logprobs": [[-200.0, -1.0]], "old_logprobs": [[-199.0, 0.0]], "ref_logprobs": [[0.0, -201.0]],
              "mask": [[True, True]]}, {"log_ratio_min": -20, "log_ratio_max": 20},
             links=(ISSUES["nemo876"],)),
        Case(f"{fid}/trl-3015-float32-overflow", fid, "regression",
             "on-policy, unclamped x = 88 and 89 (TRL 1.16.0's use_bias_correction_kl, no clamp): k3(88) = 1.65e38 "
             "is finite in float32, k3(89) = 4.49e38 overflows; gradients l - l_ref = (-88, -89)",
             with_old(X88), links=(ISSUES["trl3015"],)),
    ]
    return out


def _near_bound_bf16():
    """A value beyond its clamp bound by less than bfloat16 resolves (pgspec fuzz found the built-in backend
    deciding the clamp on the bfloat16 value)."""
    fid = "kl.k3"
    return [Case(f"{fid}/near-output-bound-bf16", fid, "edge",
                 "x = 0.859375 with output_max = 0.5: k3 = e^x - 1 - x = 0.50245 lies above the bound, so the value "
                 "is 0.5 and the gradient 0; formed in bfloat16, expm1(x) = 1.3594 and 1.3594 - 0.8594 = 0.5 lands on "
                 "the bound, inside the closed clamp, so a clamp decided on that value passes the gradient "
                 "1 - e^x = -1.36 (the built-in backend decides on the estimate formed in float64)",
                 {"logprobs": [[-0.859375]], "ref_logprobs": [[0.0]], "mask": [[True]]}, {"output_max": 0.5})]


def cases():
    out = []
    for fid in IDS[:-1]:
        out += _estimator_cases(fid)
    out += _unbiased_cases() + _near_bound_bf16()
    return out
