"""Golden cases of the ratio family (spec/ratio.md)."""

from __future__ import annotations

from .case import Case, Generated, random_inputs

LP = [[-1.0, -2.5, -0.375, -4.0], [-0.5, -3.0, -1.25, -2.0]]
OLD = [[-1.25, -2.0, -0.5, -3.5], [-0.5, -2.75, -1.0, -2.5]]
MASK = [[True, True, True, False], [True, True, False, False]]
IDS = ("ratio.token", "ratio.sequence_product", "ratio.sequence_geometric", "ratio.gspo_token")

# Liger-Kernel fork PR #4's probe: per-token log-ratios d = (30, 0)
D30 = {"logprobs": [[0.0, -1.0]], "old_logprobs": [[-30.0, -1.0]], "mask": [[True, True]]}


def clamp_placement_cases():
    """The two placements of a log-ratio bound on the GSPO sequence ratio (spec/ratio.md)."""
    fid = "ratio.sequence_geometric"
    return [
        Case(f"{fid}/per-token-clamp-30-0", fid, "example",
             "Liger-Kernel fork PR #4 placement: d = (30, 0), log_ratio_clamp 20 clamps each token BEFORE the mean: "
             "(20 + 0)/2 = 10, s = e^10 = 22026.465794806718; gradient (0, e^10/2 = 11013.232897403359): the "
             "clamped token carries none", D30, {"log_ratio_clamp": 20}),
        Case(f"{fid}/mean-cap-20-30-0", fid, "example",
             "cap on the mean instead: d = (30, 0), log_ratio_max 20: the mean 15 is below the cap, s = e^15 = "
             "3269017.3724721107, gradient e^15/2 per token", D30, {"log_ratio_max": 20}),
        Case(f"{fid}/mean-cap-10-30-0", fid, "example",
             "d = (30, 0), log_ratio_max 10: the mean 15 is capped, s = e^10 with zero gradient at both tokens "
             "(the same value as the per-token clamp, not the same gradient)", D30, {"log_ratio_max": 10}),
        Case(f"{fid}/per-token-clamp-negative", fid, "edge",
             "the clamp is two-sided: d = (-30, 0), log_ratio_clamp 20: s = e^-10 = 4.539992976e-5, gradient "
             "(0, e^-10/2)", {**D30, "logprobs": [[-30.0, -1.0]], "old_logprobs": [[0.0, -1.0]]},
             {"log_ratio_clamp": 20}),
        Case(f"{fid}/both-placements", fid, "edge",
             "both bounds: d = (30, 0), log_ratio_clamp 20 then log_ratio_max 5: mean 10 capped at 5, s = e^5, "
             "gradient 0", D30, {"log_ratio_clamp": 20, "log_ratio_max": 5}),
        Case(f"{fid}/per-token-clamp-inactive", fid, "edge",
             "log_ratio_clamp 20 with |d| <= 20 changes nothing: the padded batch of the default cases",
             {"logprobs": LP, "old_logprobs": OLD, "mask": MASK}, {"log_ratio_clamp": 20}),
    ]


def _binding(fid, clamp):
    """Each side of the log-ratio clamp taking effect, and the clamp set where it takes no effect
    (pgspec golden coverage)."""
    padded = {"logprobs": LP, "old_logprobs": OLD, "mask": MASK}
    out = [Case(f"{fid}/clamp-inactive", fid, "edge",
                f"{clamp} = 20 on the padded batch (log-ratios within +-0.5): the clamp changes nothing",
                padded, {clamp: 20})]
    if clamp == "log_ratio_clamp":
        out.append(Case(f"{fid}/clamp-both-sides", fid, "edge",
                        "log_ratio_clamp = 0.1875 on the padded batch, token log-ratios (0.25, -0.5, 0.125 | 0, "
                        "-0.25), sums -0.125 and -0.25: clamped above and below (token), below (sequence)",
                        padded, {clamp: 0.1875}))
    else:
        out.append(Case(f"{fid}/clamp-binds", fid, "edge",
                        "log_ratio_max = 0.125 below the mean log-ratio 0.25 of (0.5, 0): s = e^0.125, no gradient "
                        "through the mean", {"logprobs": [[-1.0, -2.0]], "old_logprobs": [[-1.5, -2.0]],
                                             "mask": [[True, True]]}, {clamp: 0.125}))
    return out


def _near_clamp_bf16():
    """A row sum beyond the clamp by less than bfloat16 resolves (pgspec fuzz found the built-in backend
    deciding the clamp on the bfloat16 sum)."""
    fid = "ratio.sequence_product"
    return [Case(f"{fid}/near-clamp-bf16", fid, "edge",
                 "log-ratios 768 and 1/64 with log_ratio_clamp = 768: the row sum 768.015625 lies above the clamp, so "
                 "s = e^768 (beyond every format: an infinity passes by overflow) and the gradient 0; summed in "
                 "bfloat16 (spacing 4 at 768) the sum is 768, on the bound, inside the closed clamp, so a clamp decided "
                 "on it passes the gradient e^768 = inf (the built-in backend decides on the sum formed in float64)",
                 {"logprobs": [[0.0, 0.0]], "old_logprobs": [[-768.0, -0.015625]], "mask": [[True, True]]},
                 {"log_ratio_clamp": 768})]


def cases():
    out = []
    for fid in IDS:
        out += _binding(fid, "log_ratio_max" if fid in ("ratio.sequence_geometric", "ratio.gspo_token")
                        else "log_ratio_clamp")
        clamp = "log_ratio_max" if fid in ("ratio.sequence_geometric", "ratio.gspo_token") else "log_ratio_clamp"
        out += [
            Case(f"{fid}/two-tokens", fid, "example",
                 "l = (-1, -2), l_old = (-1.5, -2): token log-ratios 0.5 and 0; the token ratios are "
                 "e^0.5 = 1.6487 and 1, their product e^0.5, their geometric mean e^0.25 = 1.2840",
                 {"logprobs": [[-1.0, -2.0]], "old_logprobs": [[-1.5, -2.0]], "mask": [[True, True]]}),
            Case(f"{fid}/padded-batch", fid, "example",
                 "two right-padded sequences of lengths 3 and 2 with mixed-sign log-ratios",
                 {"logprobs": LP, "old_logprobs": OLD, "mask": MASK}),
            Case(f"{fid}/clamped", fid, "example",
                 f"{clamp} = 0.25 caps the log-ratio 0.5 (e^0.25 = 1.2840, zero gradient on the clamped side)",
                 {"logprobs": [[-1.0, -2.0]], "old_logprobs": [[-1.5, -2.0]], "mask": [[True, True]]},
                 {clamp: 0.25}),
            Case(f"{fid}/on-policy", fid, "edge", "l = l_old: every ratio is exactly 1",
                 {"logprobs": LP, "old_logprobs": LP, "mask": MASK}),
            Case(f"{fid}/empty-sequence", fid, "edge",
                 "the second sequence has no unmasked token (sequence ratios are 1 there, gradients 0)",
                 {"logprobs": LP, "old_logprobs": OLD, "mask": [MASK[0], [False] * 4]}),
            Case(f"{fid}/all-masked", fid, "edge", "no token counts anywhere",
                 {"logprobs": LP, "old_logprobs": OLD, "mask": [[False] * 4, [False] * 4]}),
            Case(f"{fid}/masked-nan-inf", fid, "edge",
                 "NaN and infinities at masked positions must not reach any output or gradient",
                 {"logprobs": [[-1.0, "nan", "inf"]], "old_logprobs": [[-2.0, "-inf", "nan"]],
                  "mask": [[True, False, False]]}),
            Case(f"{fid}/log-ratio-20", fid, "edge", "log-ratios of +20 and -20 (e^20 = 4.85e8)",
                 {"logprobs": [[0.0, -20.0]], "old_logprobs": [[-20.0, 0.0]], "mask": [[True, True]]}),
            Case(f"{fid}/log-ratio-200", fid, "edge",
                 "log-ratios of +200 and -200: e^200 = 7.2e86 overflows float32 without a clamp",
                 {"logprobs": [[0.0, -200.0]], "old_logprobs": [[-200.0, 0.0]], "mask": [[True, True]]}),
            Case(f"{fid}/log-ratio-200-clamped", fid, "edge", f"log-ratios of +-200 with {clamp} = 20",
                 {"logprobs": [[0.0, -200.0]], "old_logprobs": [[-200.0, 0.0]], "mask": [[True, True]]},
                 {clamp: 20}),
            Case(f"{fid}/random-1", fid, "random",
                 "generator inputs (seed 101), 3 sequences of lengths 16, 9 and 1",
                 random_inputs(101, 3, 16, ("logprobs", "old_logprobs", "mask"), (16, 9, 1))),
            Case(f"{fid}/random-2", fid, "random", "generator inputs (seed 102), 4 sequences of 7",
                 random_inputs(102, 4, 7, ("logprobs", "old_logprobs", "mask"))),
        ]
        out.append(Case(f"{fid}/scale-8192", fid, "scale", "one sequence of 8192 tokens from the generator",
                        Generated(seed=8192, B=1, T=8192, fields=("logprobs", "old_logprobs", "mask"))))
        out.append(Case(f"{fid}/scale-32768", fid, "scale",
                        "two sequences of 32768 positions (lengths 32768 and 20000) from the generator",
                        Generated(seed=32768, B=2, T=32768, fields=("logprobs", "old_logprobs", "mask"),
                                  lengths=(32768, 20000))))
    out += _near_clamp_bf16()
    return out + clamp_placement_cases()
