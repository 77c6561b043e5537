"""Golden cases of the logprob family (spec/logprob.md).

Logits are [B, T, V] with V <= 64, except one V = 1024 edge case with logit gaps of 400.  Every
logit is exactly representable in bfloat16; targets at masked positions are arbitrary integers
(-100, 12345) that an implementation must not index with.
"""

from __future__ import annotations

from .case import Case
from ..generator import SplitMix64

IDS = ("logprob.token", "logprob.entropy")
GEMMA2_LINK = "https://arxiv.org/abs/2408.00118"

LOGITS = [
    [[1.5, -0.25, 0.75, -2.0], [0.5, 0.5, -1.0, 3.0], [2.0, 1.0, 0.0, -1.0]],
    [[-0.5, 4.0, 1.25, 0.0], [-3.0, -1.5, 2.5, 0.125], [9.0, 9.0, 9.0, 9.0]],
]
TARGETS = [[0, 3, 2], [1, 2, -100]]
MASK = [[True, True, True], [True, True, False]]
EXTREME = [
    [[200.0, -200.0, 0.0, 20.0], [1.0, 1.0 + 2.0 ** -7, 1.0 - 2.0 ** -8, 1.0]],
    [[-9984.0, 9984.0, 0.0, -20.0], [30.0, -30.0, 1000.0, -1000.0]],
]
EXTREME_TARGETS = [[1, 0], [0, 3]]


def random_logits(seed: int, B: int, T: int, V: int, lengths) -> dict:
    """Logits (below(257) - 128) / 16 in [-8, 8] (multiples of 1/16, bfloat16-exact) for b, t, v in
    that order, then a target below(V) per (b, t), from SplitMix64(seed); mask[b][t] = t < lengths[b];
    targets at masked positions are -100."""
    rng = SplitMix64(seed)
    logits = [[[(rng.below(257) - 128) / 16 for _ in range(V)] for _ in range(T)] for _ in range(B)]
    mask = [[t < lengths[b] for t in range(T)] for b in range(B)]
    targets = [[rng.below(V) if mask[b][t] else -100 for t in range(T)] for b in range(B)]
    return {"logits": logits, "targets": targets, "mask": mask}


def wide_vocab(V: int = 1024) -> dict:
    """V = 1024 logits ((37 v) mod 256 - 128) / 4 in [-32, 31.75], with a spike of +200 at v = 5 and
    -200 at v = 900 in row 0 (logit gap 400), none in row 1."""
    base = [((37 * v) % 256 - 128) / 4 for v in range(V)]
    spiked = list(base)
    spiked[5], spiked[900] = 200.0, -200.0
    return {"logits": [[spiked, base]], "targets": [[900, 5]], "mask": [[True, True]]}


def _inputs(fid, data):
    """Drop the targets for logprob.entropy."""
    return {k: v for k, v in data.items() if fid == "logprob.token" or k != "targets"}


def _cases_for(fid):
    tok = fid == "logprob.token"
    what = "log p_y" if tok else "H"
    one = lambda logits, targets, mask=None: _inputs(fid, {  # noqa: E731
        "logits": logits, "targets": targets, "mask": mask or [[True] * len(logits[0]) for _ in logits]})
    return [
        Case(f"{fid}/uniform", fid, "example",
             "four equal logits 0.375: p = 1/4, log p_2 = -log 4 = -1.3862943611, H = log 4; the token "
             "gradient is onehot - 1/4 = (-0.25, -0.25, 0.75, -0.25), the entropy gradient 0",
             one([[[0.375] * 4]], [[2]])),
        Case(f"{fid}/two-way", fid, "example",
             "logits (1, 0): p_0 = 1/(1 + e^-1) = 0.7310585786, log p_0 = -log(1 + e^-1) = -0.3132616875, "
             "H = 0.3132616875 + e^-1/(1 + e^-1) = 0.3132616875 + 0.2689414214 = 0.5822031089",
             one([[[1.0, 0.0]]], [[0]])),
        Case(f"{fid}/padded-batch", fid, "example",
             "two sequences of 3 positions over V = 4, the last of the second masked (target -100, logits "
             "9 x 4 unused); position (0, 1) has logits (0.5, 0.5, -1, 3): log p_3 = 3 - log(2 e^0.5 + e^-1 + "
             "e^3) = -0.1676186943 and H = 0.5766617591",
             _inputs(fid, {"logits": LOGITS, "targets": TARGETS, "mask": MASK})),
        Case(f"{fid}/temperature", fid, "example",
             "logits (2, 0) at temperature 0.5 become (4, 0): log p_0 = -log(1 + e^-4) = -0.0181499279, "
             "H = 0.0181499279 + 4 e^-4/(1 + e^-4) = 0.0181499279 + 0.0719448398 = 0.0900947677",
             one([[[2.0, 0.0]]], [[0]]), {"temperature": "0.5"}),
        Case(f"{fid}/temperature-0.7", fid, "edge",
             "the padded batch at temperature 0.7, a parameter that is not a binary fraction: the reference "
             "divides by exactly 7/10, an implementation by the nearest float (within the tolerance)",
             _inputs(fid, {"logits": LOGITS, "targets": TARGETS, "mask": MASK}), {"temperature": "0.7"}),
        Case(f"{fid}/logit-scale", fid, "example",
             "logit_scale 0.5 turns (2, 0) into (1, 0): the same numbers as the two-way example",
             one([[[2.0, 0.0]]], [[0]]), {"logit_scale": "0.5"}),
        Case(f"{fid}/softcap", fid, "example",
             "logits (6, -2, 1), scale 2, softcap 3, temperature 0.5: z' = 3 tanh(2 z / 3) / 0.5 = "
             "(5.9959758, -5.2203700, 3.4966977)",
             one([[[6.0, -2.0, 1.0]]], [[0]]), {"logit_scale": 2, "softcap": 3, "temperature": "0.5"}),
        Case(f"{fid}/softcap-after-scale-before-temperature", fid, "regression",
             "the order of the transform is scale, softcap, temperature (TRL 1.16.0 ChunkedLogProbFunction; "
             "Gemma 2 final-logit soft-capping c tanh(z / c) with c = 30, arXiv:2408.00118): logits "
             "(40, -35, 10, 0) with softcap 30 and temperature 0.5; applying the temperature first gives "
             "a different " + what,
             one([[[40.0, -35.0, 10.0, 0.0]]], [[2]]), {"softcap": 30, "temperature": "0.5"},
             links=(GEMMA2_LINK,)),
        Case(f"{fid}/all-masked", fid, "edge", "no position counts (targets -100 and 7)",
             _inputs(fid, {"logits": LOGITS, "targets": [[-100, -100, 7], [-100, -100, -100]],
                           "mask": [[False] * 3, [False] * 3]})),
        Case(f"{fid}/empty-sequence", fid, "edge",
             "the second sequence has no unmasked position (its targets are -100)",
             _inputs(fid, {"logits": LOGITS, "targets": [[0, 3, 2], [-100, -100, -100]],
                           "mask": [MASK[0], [False] * 3]})),
        Case(f"{fid}/masked-nan-inf", fid, "edge",
             "NaN and infinite logits and out-of-range targets (12345, -100) at masked positions must not "
             "reach any output or gradient",
             _inputs(fid, {"logits": [[[1.0, 2.0, 0.5], ["nan", "inf", "-inf"], [0.25, "nan", 1.0]]],
                           "targets": [[1, 12345, -100]], "mask": [[True, False, False]]})),
        Case(f"{fid}/single-entry-vocab", fid, "edge", "V = 1: log p = 0 and H = 0, zero gradients",
             one([[[5.0], [-3.0]]], [[0, 0]])),
        Case(f"{fid}/ties-at-maximum", fid, "edge",
             "logits (3, 3, 0): two maxima; log p_y = 3 - log(2 e^3 + 1) whichever maximum is chosen",
             one([[[3.0, 3.0, 0.0], [3.0, 3.0, 0.0]]], [[0, 1]])),
        Case(f"{fid}/gap-20", fid, "edge",
             "logit gaps of 20: p_* = 1 - 2.06e-9; log p_* = -log1p(e^-20) needs log1p, not log(1 + S)",
             one([[[0.0, -20.0], [-20.0, 0.0], [20.0, 0.0]]], [[0, 0, 1]])),
        Case(f"{fid}/gap-200", fid, "edge",
             "logit gaps of 200 and 400: log p_* = -log1p(e^-200 + e^-400) = -1.3838965e-87, and the minimum of "
             "(0, -200, 0) has log p = -200 - log 2 = -200.6931472; exp(-200) underflows float32",
             one([[[200.0, 0.0, -200.0], [0.0, -200.0, 0.0]]], [[0, 1]])),
        Case(f"{fid}/extreme-logits", fid, "edge",
             "logits of +-200, +-9984, +-1000 and tiny differences 2^-7, 2^-8 next to 1",
             _inputs(fid, {"logits": EXTREME, "targets": EXTREME_TARGETS, "mask": [[True, True], [True, True]]})),
        Case(f"{fid}/vocab-1024", fid, "edge",
             "V = 1024: logits ((37 v) mod 256 - 128) / 4 with a spike of +200 at v = 5 and -200 at v = 900 "
             "in the first row (targets 900 and 5)",
             _inputs(fid, wide_vocab())),
        Case(f"{fid}/softcap-saturated", fid, "edge",
             "softcap 5 with logits 1000 and 20: the cap saturates (tanh(200) = 1 to 173 digits); the "
             "derivative sech^2(200) = 5.6e-174 must not be computed as 1 - tanh^2 (= 0)",
             one([[[1000.0, 0.0, -1.0], [20.0, 0.0, -30.0]]], [[1, 0]]), {"softcap": 5}),
        Case(f"{fid}/temperature-small", fid, "edge",
             "temperature 1e-3 (a parameter extreme) multiplies the logit gaps by 1000: gaps of 500 and 250",
             one([[[1.0, 0.5, 0.75, -0.25]]], [[2]]), {"temperature": "1e-3"}),
        Case(f"{fid}/temperature-large", fid, "edge",
             "temperature 1000 flattens the distribution: log p ~ -log 4 and H ~ log 4",
             one([[[3.0, -1.0, 0.5, 2.0]]], [[1]]), {"temperature": 1000}),
        Case(f"{fid}/random-small", fid, "random",
             "SplitMix64(201) logits in [-8, 8] (step 1/16), B = 3, T = 5, V = 16, lengths 5, 2, 0",
             _inputs(fid, random_logits(201, 3, 5, 16, (5, 2, 0)))),
        Case(f"{fid}/random-v64-transform", fid, "random",
             "SplitMix64(202) logits, B = 2, T = 4, V = 64, lengths 4 and 3, scale 2, softcap 5, temperature 0.7",
             _inputs(fid, random_logits(202, 2, 4, 64, (4, 3))),
             {"logit_scale": 2, "softcap": 5, "temperature": "0.7"}),
    ]


def _temperature_two(fid):
    """Temperature 2, a binary fraction other than 1: the division must happen (mutation testing
    found an implementation that skips it at 2 untested)."""
    return [Case(f"{fid}/temperature-2", fid, "edge",
                 "the padded batch at temperature 2: every logit halved before the log-softmax",
                 _inputs(fid, {"logits": LOGITS, "targets": TARGETS, "mask": MASK}), {"temperature": 2})]


# 1.765625 * 2^127 = 3.004e38: bfloat16-exact and finite in float32; divided by a temperature 0.1 it overflows float32
BIG = 1.765625 * 2.0 ** 127


def _masked_overflowing_logits():
    """Finite junk logits at a masked position that overflow float32 once divided by the temperature."""
    fid = "logprob.token"
    return [Case(f"{fid}/masked-overflowing-logits", fid, "edge",
                 "temperature 0.1 with finite logits (3.004e38, 1, -3.004e38) at a masked position (target 0): "
                 "bfloat16-exact and finite in float32, they overflow float32 once divided by the temperature "
                 "(3.0e39; float64 holds it): masked, they must reach no output or gradient (the unmasked "
                 "position has logits (1, 2, 0.5) / 0.1 = (10, 20, 5), target 1: log p = -log(1 + e^-10 + e^-15))",
                 {"logits": [[[1.0, 2.0, 0.5], [BIG, 1.0, -BIG]]], "targets": [[1, 0]], "mask": [[True, False]]},
                 {"temperature": "0.1"})]


def _large_normalizer():
    """Large transformed logits next to a probability near 1 (found by pgspec fuzz, TRL in float32)."""
    fid = "logprob.token"
    return [Case(f"{fid}/large-logits-near-one", fid, "edge",
                 "logits (0, 0, 2.625, 3.25) at logit scale 10 and temperature 0.5: z' = (0, 0, 52.5, 65), target 0: "
                 "log p_0 = -65 - 3.727e-6 and p_3 = 1 - 3.727e-6, gradient -(s / tau) p_v = -20 p_v at v != 0; log Z "
                 "= 65 + 3.727e-6 is 65 in float32 (its spacing there is 7.6e-6), so log p_v formed as z'_v - log Z "
                 "from the unshifted logits gives p_3 = 1, a gradient 3.7e-6 off relative (62 float32 units); the "
                 "max-shifted form keeps it",
                 {"logits": [[[0.0, 0.0, 2.625, 3.25]]], "targets": [[0]], "mask": [[True]]},
                 {"logit_scale": 10, "temperature": "0.5"})]


def cases():
    return ([c for fid in IDS for c in _cases_for(fid) + _temperature_two(fid)] + _masked_overflowing_logits()
            + _large_normalizer())
