"""Golden cases of the adv family (spec/adv.md).

Rewards are per-sequence scalars with prompt-group labels; nothing is differentiated.  Every reward
is exactly representable in bfloat16 (0, 1, 0.5, -1, 0.25, 2^-20, ...).
"""

from __future__ import annotations

from .case import Case, Generated
from ..generator import SplitMix64, generate_inputs

GRPO_LINK = "https://arxiv.org/abs/2402.03300"
DR_GRPO_LINK = "https://arxiv.org/abs/2503.20783"
SCALERL_LINK = "https://arxiv.org/abs/2510.13786"
ANCHOR_SOURCE = ("GRPO (DeepSeekMath, arXiv:2402.03300, Sec. 4.1.2) defines A = (r - mean r) / std r without "
                 "naming the std; this numeric anchor is the secondary-source example of the jiahuanglin "
                 "Dr.GRPO lesson (research: anchors_conformance_papers.md), not an issue thread")

ANCHOR = {"rewards": [1.0, 1.0, 1.0, 0.0], "group_ids": [0, 0, 0, 0]}
WORKED = {"rewards": [1.0, 1.0, 1.0, 0.0, 0.5, 0.25, 0.25], "group_ids": [7, 7, 7, 7, 3, 9, 9]}
TWO_GROUPS = {"rewards": [1.0, 0.0, 0.5, -1.0, 0.5, 0.0], "group_ids": [0, 0, 1, 1, 1, 1]}
INTERLEAVED = {"rewards": [1.0, 0.0, 0.5, 0.75, 1.0, 0.25, 0.25, -2.0, 3.5, 0.125],
               "group_ids": [4, 4, 9, 9, 4, -1, -1, 9, 12, 4]}
SINGLETONS = {"rewards": [2.5, 1.0, 0.0, -0.5], "group_ids": [5, 6, 6, 8]}
IDENTICAL = {"rewards": [0.5, 0.5, 0.5, 1.0, 0.0, -1.0, -1.0], "group_ids": [1, 1, 1, 2, 2, 3, 3]}
ALL_IDENTICAL = {"rewards": [1.0, 1.0, 1.0, 1.0], "group_ids": [0, 0, 1, 1]}
EMPTY = {"rewards": [], "group_ids": []}
TINY = {"rewards": [2.0 ** -20, 0.0, 0.0, 0.0, 1.0, 1.0 + 2.0 ** -7], "group_ids": [0, 0, 0, 0, 1, 1]}
LARGE = {"rewards": [1024.0, -1024.0, 0.5, 65536.0, 0.0], "group_ids": [0, 0, 0, 1, 1]}

NORMALIZED = ("adv.group_normalized", "adv.batch_normalized")


def generated_groups(seed: int, B: int, groups: int) -> dict:
    """0/1 rewards from the generator (pgspec-splitmix64/1, T = 1), group_ids = b mod groups."""
    return generate_inputs(Generated(seed, B, 1, ("rewards", "group_ids"), None, groups).to_json())


def graded_rewards(seed: int, B: int, groups: int) -> dict:
    """Graded rewards (below(9) - 4) / 4 in {-1, -0.75, ..., 1} and group ids below(groups), both from
    SplitMix64(seed) in that order per sequence (non-contiguous groups of varying size)."""
    rng = SplitMix64(seed)
    rewards, ids = [], []
    for _ in range(B):
        rewards.append((rng.below(9) - 4) / 4)
        ids.append(rng.below(groups))
    return {"rewards": rewards, "group_ids": ids}


def _common_edges(fid):
    """Edge cases shared by the three formulas (params only where the formula has them)."""
    norm = fid in NORMALIZED
    out = [
        Case(f"{fid}/empty-batch", fid, "edge", "no sequence at all: the advantages are an empty vector", EMPTY),
        Case(f"{fid}/singleton-zero", fid, "edge",
             "groups 5 and 8 hold one sequence each; singleton='zero' (AReaL, TRL's NaN std -> 0) takes the "
             "mean of a singleton to be its own reward, so its advantage is 0",
             SINGLETONS),
        Case(f"{fid}/singleton-mean0_std1", fid, "edge",
             "singleton='mean0_std1' (verl, SkyRL): a singleton has mean 0 and std 1"
             + (", so A = R / (1 + eps) = 2.5 / 1.000001 and -0.5 / 1.000001" if norm else ", so A = R"),
             SINGLETONS, {"singleton": "mean0_std1", "eps": "1e-6"} if norm else {"singleton": "mean0_std1"}),
        Case(f"{fid}/identical-rewards", fid, "edge",
             "groups 1 (0.5, 0.5, 0.5) and 3 (-1, -1) have identical rewards: A = 0 there whatever eps is",
             IDENTICAL),
        Case(f"{fid}/tiny-differences", fid, "edge",
             "a reward of 2^-20 among zeros and the pair (1, 1 + 2^-7): differences far below the rewards' size",
             TINY),
        Case(f"{fid}/large-rewards", fid, "edge", "rewards of +-1024 and 65536 next to 0.5 and 0", LARGE),
        Case(f"{fid}/random-generator", fid, "random",
             "generator rewards in {0, 1} (seed 301), 24 sequences in 6 interleaved groups of 4 (b mod 6)",
             generated_groups(301, 24, 6)),
        Case(f"{fid}/random-graded", fid, "random",
             "graded rewards (below(9) - 4) / 4 and group ids below(5) from SplitMix64(302), 32 sequences",
             graded_rewards(302, 32, 5)),
    ]
    if norm:
        out += [
            Case(f"{fid}/identical-rewards-eps0", fid, "edge",
                 "identical-reward groups with eps = 0 and Bessel std: 0/0 is defined as A = 0, never NaN",
                 IDENTICAL, {"std": "bessel", "eps": 0}),
            Case(f"{fid}/all-identical-eps0", fid, "edge",
                 "every reward in the batch is 1 and eps = 0: every denominator is 0, A = 0 everywhere",
                 ALL_IDENTICAL),
            Case(f"{fid}/all-identical-eps0-variance", fid, "edge",
                 "every reward is 1, eps = 0, eps_placement='variance': sqrt(0 + 0) = 0, A = 0 everywhere",
                 ALL_IDENTICAL, {"eps_placement": "variance"}),
            Case(f"{fid}/singleton-mean0_std1-variance", fid, "edge",
                 "singleton='mean0_std1' with eps_placement='variance': a singleton gets R / sqrt(1 + eps)",
                 SINGLETONS, {"singleton": "mean0_std1", "eps": "1e-6", "eps_placement": "variance"}),
            Case(f"{fid}/random-graded-trl", fid, "random",
                 "graded rewards of SplitMix64(303), 40 sequences in 8 groups, TRL settings (Bessel, eps 1e-4)",
                 graded_rewards(303, 40, 8), {"std": "bessel", "eps": "1e-4"}),
            Case(f"{fid}/eps-large", fid, "edge",
                 "eps = 0.5 (a parameter extreme) dominates the std of the (1, 1, 1, 0) group",
                 ANCHOR, {"eps": "0.5"}),
        ]
    return out


def _group_normalized():
    fid = "adv.group_normalized"
    return [
        Case(f"{fid}/singletons-bessel", fid, "edge",
             "every group holds one sequence (a group size of 1) with the Bessel std and eps 1e-8: the std of one "
             "sample (n - 1 = 0) is undefined, and singleton = 'zero' gives A = 0 for both",
             {"rewards": [2.5, -0.5], "group_ids": [0, 1]}, {"std": "bessel", "eps": "1e-8"}),
        Case(f"{fid}/two-groups", fid, "example",
             "group 0 (1, 0): mu 0.5, population sigma 0.5, A = +-1; group 1 (0.5, -1, 0.5, 0): mu 0, "
             "sigma = sqrt(1.5/4) = 0.6123724357, A = 0.8164965809, -1.6329931619, 0.8164965809, 0",
             TWO_GROUPS),
        Case(f"{fid}/worked-example", fid, "example",
             "spec worked example: (1, 1, 1, 0) in group 7 gives 1/sqrt(3) = 0.5773502692 and "
             "-sqrt(3) = -1.7320508076; the singleton 0.5 and the identical pair (0.25, 0.25) get 0",
             WORKED),
        Case(f"{fid}/worked-example-verl", fid, "example",
             "verl settings (Bessel, eps 1e-6, singleton mean0_std1): sigma_7 = 0.5, A = 0.25/0.500001 = "
             "0.499999, -0.75/0.500001 = -1.499997; the singleton gets 0.5/1.000001; the pair 0",
             WORKED, {"std": "bessel", "eps": "1e-6", "singleton": "mean0_std1"}),
        Case(f"{fid}/eps-trl", fid, "example",
             "TRL settings (Bessel, eps 1e-4) on (1, 1, 1, 0): A = 0.25/0.5001 = 0.49990002 and "
             "-0.75/0.5001 = -1.49970006",
             ANCHOR, {"std": "bessel", "eps": "1e-4"}),
        Case(f"{fid}/eps-megatron", fid, "example",
             "Megatron-LM calculate_grpo_advantages settings (population std, eps 1e-4 added to it, singleton "
             "0, one group size) on (1, 1, 1, 0): sigma = sqrt(0.1875) = 0.4330127019, A = 0.25/0.4331127019 = "
             "0.5772169666 three times and -1.7316508999",
             ANCHOR, {"std": "population", "eps": "1e-4"}),
        Case(f"{fid}/eps-nemo-rl", fid, "example",
             "NeMo-RL GRPOAdvantageEstimator settings (Bessel std + 1e-6, singleton 0) on (1, 1, 1, 0): "
             "sigma = 0.5, A = 0.25/0.500001 = 0.4999990000 three times and -0.75/0.500001 = -1.4999970000",
             ANCHOR, {"std": "bessel", "eps": "1e-6"}),
        Case(f"{fid}/eps-variance", fid, "example",
             "eps_placement='variance', eps 1e-4 on (1, 1, 1, 0): divide by sqrt(0.1875 + 0.0001) = "
             "0.4331281566, A = 0.5771963707 and -1.7315891120",
             ANCHOR, {"eps": "1e-4", "eps_placement": "variance"}),
        Case(f"{fid}/interleaved-groups", fid, "example",
             "non-contiguous groups with labels 4, 9, -1, 12 (the labels carry no meaning), Bessel std",
             INTERLEAVED, {"std": "bessel"}),
        Case(f"{fid}/anchor-population", fid, "regression",
             "(1, 1, 1, 0) with the population std (n): mu 0.75, sigma = sqrt(0.1875), A = 1/sqrt(3) = "
             "0.5773502692 three times and -sqrt(3) = -1.7320508076. " + ANCHOR_SOURCE,
             ANCHOR, {"std": "population"}, links=(GRPO_LINK,)),
        Case(f"{fid}/anchor-bessel", fid, "regression",
             "(1, 1, 1, 0) with the Bessel std (n - 1, torch.std default): sigma = sqrt(0.75/3) = 0.5, "
             "A = 0.5 three times and -1.5. " + ANCHOR_SOURCE,
             ANCHOR, {"std": "bessel"}, links=(GRPO_LINK,)),
    ] + _common_edges(fid)


def _group_centered():
    fid = "adv.group_centered"
    return [
        Case(f"{fid}/two-groups", fid, "example",
             "group 0 (1, 0): mu 0.5, A = 0.5, -0.5; group 1 (0.5, -1, 0.5, 0): mu 0, A = the rewards",
             TWO_GROUPS),
        Case(f"{fid}/worked-example", fid, "example",
             "(1, 1, 1, 0) in group 7: mu 0.75, A = 0.25 three times and -0.75; the singleton 0.5 and the "
             "identical pair (0.25, 0.25) get 0",
             WORKED),
        Case(f"{fid}/interleaved-groups", fid, "example",
             "non-contiguous groups: group 4 (1, 0, 1, 0.125) has mu 0.53125, A = 0.46875, -0.53125, "
             "0.46875, -0.40625; group 9 (0.5, 0.75, -2) mu -0.25; group -1 identical; group 12 singleton",
             INTERLEAVED),
        Case(f"{fid}/anchor-dr-grpo", fid, "regression",
             "(1, 1, 1, 0): Dr.GRPO (arXiv:2503.20783) drops the std, A = 0.25 three times and -0.75. "
             + ANCHOR_SOURCE,
             ANCHOR, links=(DR_GRPO_LINK, GRPO_LINK)),
    ] + _common_edges(fid)


def _batch_normalized():
    fid = "adv.batch_normalized"
    batch = {"rewards": [1.0, 1.0, 1.0, 0.0, 1.0, 0.0], "group_ids": [0, 0, 0, 0, 1, 1]}
    return [
        Case(f"{fid}/worked-example", fid, "example",
             "(1, 1, 1, 0) in group 0 and (1, 0) in group 1: C = (0.25, 0.25, 0.25, -0.75, 0.5, -0.5), "
             "sigma_B = sqrt(5/24) = 0.4564354646, A = C sqrt(24/5): 0.5477225575 x3, -1.6431676725, "
             "+-1.0954451150",
             batch),
        Case(f"{fid}/std-of-rewards-trl", fid, "example",
             "TRL scale_rewards='batch' (std_of='rewards', Bessel, eps 1e-4): the rewards (1,1,1,0,1,0) have "
             "Bessel std sqrt(4/15) = 0.5163977795, A_1 = 0.25/(0.5163977795 + 0.0001) = 0.4840291864",
             batch, {"std_of": "rewards", "std": "bessel", "eps": "1e-4"}),
        Case(f"{fid}/std-of-centered-bessel", fid, "example",
             "std_of='centered' with Bessel: sigma_B = sqrt(1.25/5) = 0.5, A = 2 C: 0.5 x3, -1.5, 1, -1",
             batch, {"std_of": "centered", "std": "bessel"}),
        Case(f"{fid}/std-of-rewards-population", fid, "example",
             "std_of='rewards', population: the rewards (1,1,1,0,1,0) have std sqrt(2/9) = 0.4714045208, "
             "A = C / 0.4714045208: 0.5303300859 x3, -1.5909902577, +-1.0606601718",
             batch, {"std_of": "rewards"}),
        Case(f"{fid}/single-group", fid, "example",
             "one group (1, 1, 1, 0): the batch std of C equals the group std, A = 1/sqrt(3) x3 and -sqrt(3) "
             "as adv.group_normalized",
             ANCHOR),
        Case(f"{fid}/interleaved-groups", fid, "example",
             "non-contiguous groups with labels 4, 9, -1, 12; TRL-style std of the rewards", INTERLEAVED,
             {"std_of": "rewards", "std": "bessel"}),
        Case(f"{fid}/one-sequence-bessel", fid, "edge",
             "one sequence, Bessel: the batch std over one value is undefined, A = 0 (TRL's NaN -> 0)",
             {"rewards": [2.0], "group_ids": [0]}, {"std": "bessel", "singleton": "mean0_std1"}),
        Case(f"{fid}/one-sequence-eps", fid, "edge",
             "one sequence, singleton mean0_std1, population, eps 0.5: C = 2, sigma_B = 0, A = 2/0.5 = 4",
             {"rewards": [2.0], "group_ids": [0]}, {"singleton": "mean0_std1", "eps": "0.5"}),
        Case(f"{fid}/identical-centered-not-rewards", fid, "edge",
             "groups (1, 1) and (0, 0): every C is 0 so std_of='centered' gives A = 0 (0/0 with eps 0), while "
             "std_of='rewards' has sigma_B = 0.5 and still A = C / 0.5 = 0",
             {"rewards": [1.0, 1.0, 0.0, 0.0], "group_ids": [0, 0, 1, 1]}, {"std_of": "rewards"}),
        Case(f"{fid}/anchor-population", fid, "regression",
             "(1, 1, 1, 0) as one group, population batch std: A = 1/sqrt(3) x3, -sqrt(3). ScaleRL "
             "(arXiv:2510.13786) batch normalization reduces to GRPO's for one group. " + ANCHOR_SOURCE,
             ANCHOR, {"std": "population"}, links=(GRPO_LINK, SCALERL_LINK)),
        Case(f"{fid}/anchor-bessel", fid, "regression",
             "(1, 1, 1, 0) as one group, Bessel batch std: A = 0.5 x3, -1.5. " + ANCHOR_SOURCE,
             ANCHOR, {"std": "bessel"}, links=(GRPO_LINK, SCALERL_LINK)),
    ] + _common_edges(fid)


def _small_batches():
    """The small-size guards at their edge (mutation testing found them untested)."""
    fid = "adv.batch_normalized"
    return [
        Case(f"{fid}/bessel-two-sequences", fid, "edge",
             "exactly two sequences, rewards (1, 0), Bessel std: the guard for fewer than two sequences does not "
             "apply; C = (0.5, -0.5), sigma = sqrt(0.5) = 0.7071067812, A = (0.7071067812, -0.7071067812)",
             {"rewards": [1.0, 0.0], "group_ids": [0, 0]}, {"std": "bessel"}),
    ]


def cases():
    return _group_normalized() + _group_centered() + _batch_normalized() + _small_batches()
