"""Golden cases of the ratio family (spec/ratio.md)."""

from __future__ import annotations

from . import Case, Generated, random_inputs

LP = [[-1.0, -2.5, -0.375, -4.0], [-0.5, -3.0, -1.25, -2.0]]
OLD = [[-1.25, -2.0, -0.5, -3.5], [-0.5, -2.75, -1.0, -2.5]]
MASK = [[True, True, True, False], [True, True, False, False]]
IDS = ("ratio.token", "ratio.sequence_product", "ratio.sequence_geometric", "ratio.gspo_token")


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
    return out
