"""Production-scale checks against a float64 oracle (`pgspec check`).

The golden corpus stops at 32k tokens with sampled positions, and the mpmath reference cannot
follow a 64 x 32k batch.  A check evaluates one formula on seeded inputs of a given shape
(``pgspec-splitmix64/1``, spec/golden-format.md) with

- the adapter under test, in its dtype, and
- the **oracle**: the built-in torch backend in float64, together with the tolerance scale S of
  every output and gradient element computed as tensor operations: the running error bound of
  spec/tolerance.md (forward E, then the gradient scale pass), node for node as the reference
  states it for this formula (``pgspec.reference._ad``), so that S is the reference's S
  evaluated in float64 instead of mpmath.

Every element of the adapter's result must lie within ``K u(dtype) S + floor(dtype)`` of the
oracle's value, widened by the oracle's own float64 error bound ``K u(float64) S``.  The oracle's
values and scales are tested against the mpmath reference on the corpus's scale cases
(tests/test_check.py).  Formulas with an oracle scale: ``ORACLE_FORMULAS``.

Memory: the oracle's scale pass works on [B, T] float64 tensors, ``chunk`` sequences at a time
(row-local quantities per chunk, the batch-level sums accumulated across chunks); each token's term,
its error and its derivative (24 bytes) are kept from the first pass to the second.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from fractions import Fraction

import numpy as np

from pgspec.reference import REGISTRY

from . import branches as cb
from ..judge import compare, tolerance
from pgspec.adapters.base import HEAD_LOSS_FORMULAS as _HEAD_LOSS_FORMULAS
from ..corpus.generator import generate_arrays

U64 = 2.0 ** -53
ORACLE_FORMULAS = ("agg.token_mean", "agg.sample_mean", "agg.seq_mean_token_sum", "agg.constant", "agg.prompt_mean",
                   "agg.document_mean",
                   "loss.grpo", "loss.bnpo", "loss.dr_grpo", "loss.dapo", "loss.cispo", "loss.gspo", "loss.sapo",
                   "loss.luspo", "loss.vespo", "loss.gmpo", "loss.minirl", "logprob.token")
VOCAB_FORMULAS = ("logprob.token",)      # need --vocab (check_logprob.py: a linear head of exact logits)
# with --vocab: from hidden states and an LM head (check_head_loss.py)
HEAD_LOSS_FORMULAS = _HEAD_LOSS_FORMULAS
# the token losses with a clip or a truncation: old log-probs off its kinks, per token (check_inputs)
TOKEN_LOSSES = ("loss.grpo", "loss.bnpo", "loss.dr_grpo", "loss.dapo", "loss.cispo", "loss.minirl")
# Each token loss's aggregator (pgspec.reference.loss): loss.dapo's and loss.cispo's are their parameter `aggregation`
LOSS_AGGREGATION = {"loss.grpo": "agg.sample_mean", "loss.bnpo": "agg.token_mean", "loss.dr_grpo": "agg.constant",
                    "loss.gspo": "agg.sample_mean", "loss.sapo": "agg.sample_mean",
                    "loss.luspo": "agg.seq_mean_token_sum", "loss.vespo": "agg.token_mean",
                    "loss.gmpo": "agg.sample_mean", "loss.minirl": "agg.seq_mean_token_sum"}
# The parameters an aggregator's oracle takes at any value; the others at their defaults only
AGG_FREE_PARAMS = {"agg.token_mean": ("num_tokens", "eps"),
                   "agg.sample_mean": ("num_sequences", "sequence_token_counts", "count_empty_sequences", "eps_length",
                                       "eps_count"),
                   "agg.seq_mean_token_sum": ("num_sequences", "count_empty_sequences"),
                   "agg.constant": ("divisor", "divide_by", "num_sequences", "count_empty_sequences"),
                   "agg.prompt_mean": ("num_groups", "group_token_counts", "count_empty_groups", "step_divisor",
                                       "num_sequences"),
                   "agg.document_mean": ("num_documents", "document_token_counts")}


class CheckError(Exception):
    """A usage error of `pgspec check` (unknown formula, no oracle scale, bad shape): exit code 2."""


@dataclass
class OutputCheck:
    output: str
    compared: int
    failures: int
    worst_ratio: float
    worst_index: list | None = None
    first_failure: dict | None = None


@dataclass
class CheckResult:
    adapter: str
    formula: str
    dtype: str
    device: str
    shape: list
    seed: int
    outcome: str                      # pass | fail | error | unsupported | bug | convention (a declared fail)
    outputs: list = field(default_factory=list)
    adapter_seconds: float = 0.0
    oracle_seconds: float = 0.0
    message: str = ""
    vocab: int | None = None
    hidden: int | None = None
    path: str = ""                    # how the adapter was called (log-prob checks: "head" or "logits")
    declaration: dict | None = None   # the adapter's rule that matches the check (Declaration.summary())
    # the formula's decisions and the count of tokens or rows on each side (check_branches.py), and
    # the sides none takes: not judged by this check
    branches: list = field(default_factory=list)
    unreached: list = field(default_factory=list)

    def to_json(self):
        d = asdict(self)
        for o in d["outputs"]:
            if not math.isfinite(o["worst_ratio"]):
                o["worst_ratio"] = str(o["worst_ratio"])
        return d


def parse_shape(text: str) -> tuple[int, int]:
    try:
        b, t = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise CheckError(f"--shape must be BxT (e.g. 64x32768), got {text!r}") from None
    if b < 1 or t < 1:
        raise CheckError(f"--shape must be positive, got {text!r}")
    return b, t


# ------------------------------------------------------------------------------------------------
# Seeded inputs
# ------------------------------------------------------------------------------------------------
DOCUMENTS = 4       # the documents packed in each row of a check with document ids (contiguous spans)


def seeded_inputs(formula: str, B: int, T: int, seed: int = 0, ragged: bool = True, optional=()) -> dict:
    """numpy inputs for ``formula`` from pgspec-splitmix64/1: its real inputs drawn as the corpus's
    scale cases draw them, a right-padded mask (row b keeps T - (b * 7919 mod (T // 4 + 1)) tokens
    when ``ragged``), group ids b mod 4, document ids cutting each row into DOCUMENTS contiguous
    spans (the last ones of a short row may hold no unmasked token).  The formula's required inputs,
    and the optional ones named in ``optional``."""
    f = REGISTRY[formula]
    names = [i.name for i in f.inputs if not i.optional or i.name in optional]
    fields = [n for n in names if n in ("logprobs", "old_logprobs", "ref_logprobs", "sampler_logprobs", "values",
                                        "advantages", "mask", "group_ids", "document_ids")]
    if len(fields) != len(names):
        raise CheckError(f"{formula}: no seeded input generator for {sorted(set(names) - set(fields))}")
    lengths = [T - (b * 7919) % (T // 4 + 1) for b in range(B)] if ragged else None
    spec = {"generator": "pgspec-splitmix64/1", "seed": seed, "B": B, "T": T, "fields": fields,
            "lengths": lengths, "groups": 4, "documents": DOCUMENTS if "document_ids" in fields else None}
    return generate_arrays(spec)


# ------------------------------------------------------------------------------------------------
# Log-ratios off the kinks (the PPO losses)
# ------------------------------------------------------------------------------------------------
# A PPO loss has kinks where its gradient jumps: the clip's log-bounds lo = log(1 - eps_low) and
# hi = log(1 + eps_high) of the log-ratio d = l - old, and +-c with a log-ratio clamp c.  A token whose
# d lies within rounding of a kink may take either branch in a low precision, and no tolerance can
# judge that.  So the old log-probs of a loss check are drawn as old = l - rho, rho from bands that
# stay away from every kink and exercise every branch: with equal chance, BAND wide at GAP beyond lo
# (clipped below; none when eps_low = 1), around the middle of [lo, hi] (narrowed to keep INSIDE from
# either end, or its midpoint when the range is narrower; none when the midpoint is within NEAREST of
# an end, as with eps = 0; up to INSIDE below hi when lo = -inf), and BAND wide at GAP beyond hi
# (clipped above).  With a clamp c, each outer band moves outwards past the zone within INSIDE of
# +-c that it would overlap (its tokens then lie beyond the clamp), and the zones are cut out of the
# inner band (dropped if less than NEAREST is left).  numpy's PCG64 seeded with the check's seed
# draws each token's band, then a uniform u placing it in its band.
BAND = 0.1             # width of each band of log-ratios
GAP = 0.25             # distance of the outer bands from the clip's log-bounds
INSIDE = 0.15          # the least distance of the inner band from them, and of any band from +-c
NEAREST = 0.05         # no band nearer than this to a kink


def _clip_bands(eps_low: float, eps_high: float, clamp=None) -> list:
    """The bands of log-ratios, each a list of pieces (start, width): u in [0, 1) is placed along their
    total length from the first piece's start (the outer bands run away from the clip range)."""
    lo = math.log1p(-eps_low) if eps_low < 1 else -math.inf
    hi = math.log1p(eps_high)
    c = None if clamp is None else float(clamp)
    zones = [] if c is None else [(-c - INSIDE, -c + INSIDE), (c - INSIDE, c + INSIDE)]
    bands = []
    if lo > -math.inf:          # clipped below: moved down past a clamp's zone it would overlap
        start = lo - GAP
        for za, zb in sorted(zones, reverse=True):
            if start > za and start - BAND < zb:
                start = za
        bands.append([(start, -BAND)])
    if lo == -math.inf:
        inner = (hi - INSIDE - BAND, BAND)
    elif (hi - lo) / 2 >= NEAREST:
        mid = (lo + hi) / 2
        half = max(0.0, min(BAND / 2, (hi - lo) / 2 - INSIDE))
        inner = (mid - half, 2 * half)
    else:
        inner = None            # a clip range too narrow for a token inside it away from both ends
    if inner is not None and inner[1] == 0:     # the midpoint, kept when it is clear of a clamp's zone
        if not any(za < inner[0] < zb for za, zb in zones):
            bands.append([inner])
    elif inner is not None:
        start, width = inner
        pieces = [(start, start + width)]
        for za, zb in zones:    # what lies within a clamp's zone is cut out
            pieces = [q for pa, pb in pieces for q in ((pa, min(pb, za)), (max(pa, zb), pb)) if q[1] > q[0]]
        if pieces == [(start, start + width)]:
            bands.append([inner])           # untouched: start + width u, as written
        elif sum(pb - pa for pa, pb in pieces) >= NEAREST:
            bands.append([(pa, pb - pa) for pa, pb in pieces])
    start = hi + GAP            # clipped above: moved up past a clamp's zone it would overlap
    for za, zb in sorted(zones):
        if start < zb and start + BAND > za:
            start = zb
    bands.append([(start, BAND)])
    return bands


def pcg64(seed: int) -> np.random.Generator:
    """numpy's PCG64 seeded with ``seed mod 2^64``: a check's seed is taken mod 2^64 throughout, as
    pgspec-splitmix64/1 takes it (PCG64 itself rejects a negative seed and reads a larger one whole)."""
    return np.random.Generator(np.random.PCG64(int(seed) % 2 ** 64))


def draw_log_ratios(shape, seed: int, eps_low: float, eps_high: float, clamp=None) -> np.ndarray:
    """rho for every token (float64, ``shape``): the bands of ``_clip_bands`` with equal chance."""
    bands = _clip_bands(eps_low, eps_high, clamp)
    rng = pcg64(seed)
    band = rng.integers(0, len(bands), size=shape)
    u = rng.uniform(0.0, 1.0, size=shape)
    return np.choose(band, [_place(pieces, u) for pieces in bands])


def _draw_from_bands(rng, bands, shape):
    """Values of ``shape`` from ``bands`` with equal chance: each element's band, then for each band a
    uniform u placing its elements in it (``_place``)."""
    band = rng.integers(0, len(bands), size=shape)
    return np.choose(band, [_place(pieces, rng.uniform(0.0, 1.0, size=shape)) for pieces in bands])


def _place(pieces, u):
    if len(pieces) == 1:
        start, width = pieces[0]
        return start + width * u        # one piece: start + width u, as written
    total = sum(abs(w) for _, w in pieces)
    t = u * total
    out = np.empty_like(u)
    before = 0.0
    for k, (start, width) in enumerate(pieces):
        here = (t >= before) if k else np.ones(u.shape, dtype=bool)
        out = np.where(here, start + np.sign(width) * (t - before), out)
        before += abs(width)
    return out


def old_logprobs_off_the_kinks(l: np.ndarray, mask: np.ndarray, seed: int, params: dict) -> np.ndarray:
    """old = l - rho where the mask holds (0 elsewhere), rho from ``draw_log_ratios`` for the loss's
    eps_low, eps_high and log_ratio_clamp, rounded to the nearest bfloat16 (and to 0 below 2^-14), so
    that every dtype holds it exactly: float64 array."""
    return _bfloat16_at(mask, l - draw_log_ratios(l.shape, seed, *_kinks(params)))


def _bfloat16_at(mask: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``values`` where the mask holds (0 elsewhere) rounded to the nearest bfloat16, and to 0 below
    2^-14 (float16's smallest normal): exact in every dtype.  A float64 array."""
    import torch

    out = torch.from_numpy(np.where(mask, values, 0.0)).to(torch.bfloat16).double().numpy()
    return np.where(np.abs(out) < 2.0 ** -14, 0.0, out)


def _zero_mean_spread(rng, mask: np.ndarray) -> np.ndarray:
    """z uniform in [-BAND, BAND] at the unmasked tokens less its row's mean (0 where masked): tokens
    spread around their row's value, which their mean leaves as it is."""
    z = np.where(mask, rng.uniform(-BAND, BAND, size=mask.shape), 0.0)
    return np.where(mask, z - z.sum(-1, keepdims=True) / np.maximum(mask.sum(-1, keepdims=True), 1), 0.0)


def _stream(seed: int, k: int) -> np.random.Generator:
    """The k-th numpy PCG64 stream of a check's seed (mod 2^64), independent of ``pcg64(seed)``'s."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed) % 2 ** 64, k])))


SPREAD = (-2.0, 3.0)    # the log-ratios of a smooth loss's check (SAPO: its gate from r = 0.14 to saturation at 20)


def old_logprobs_spread(l: np.ndarray, mask: np.ndarray, seed: int, clamp=None) -> np.ndarray:
    """A smooth loss (SAPO's gate has no clip) is judged over a wide range of ratios: old = l - rho
    with rho uniform in SPREAD, moved out of the zone within INSIDE of +-c (a log-ratio clamp c, where
    the gradient stops), and rounded to bfloat16 as ``old_logprobs_off_the_kinks`` rounds them."""
    rho = pcg64(seed).uniform(*SPREAD, size=l.shape)
    for k in ([] if clamp is None else [-float(clamp), float(clamp)]):
        rho = np.where(np.abs(rho - k) < INSIDE, k + np.where(rho >= k, INSIDE, -INSIDE), rho)
    return _bfloat16_at(mask, l - rho)


KL_SPREAD = (-1.0, 1.0)     # x = l_ref - l of a check with the KL term (k3 from 0.0003 to 0.7)
REACH = 1.0                 # the width of the band on either side of a kink (a KL clamp's, an IS bound's, OPSM's delta...)
ROUNDS = 32                 # redraws of a token (or row) within INSIDE of a kink before the check gives up


def _kl_estimate(est, x, w=1.0):
    """The KL estimator ``est`` of x = l_ref - l in float64 (reference.kl; k3_unbiased: w k3(x))."""
    if est == "k1":
        return -x
    if est == "k2":
        return x * x / 2
    if est == "abs":
        return np.abs(x)
    return w * (np.expm1(x) - x)        # k3, k3_straight_through (its value), k3_unbiased


def _kl_kinks(p: dict) -> list:
    """The x = l_ref - l where the KL term changes branch (with w = 1 for k3_unbiased): the input
    clamp's bounds, and where the estimator of the clamped x crosses an output clamp's bound (found
    by bisection on each side of 0, where k2, k3 and abs are monotone, within |x| <= 60)."""
    lo, hi = p["kl_log_ratio_min"], p["kl_log_ratio_max"]
    kinks = [float(b) for b in (lo, hi) if b is not None]
    a, c = (-60.0 if lo is None else max(-60.0, float(lo))), (60.0 if hi is None else min(60.0, float(hi)))
    pieces = [(a, c)] if p["kl_estimator"] == "k1" else [(a, min(c, 0.0)), (max(a, 0.0), c)]
    for bound in (p["kl_output_min"], p["kl_output_max"]):
        if bound is None:
            continue

        def f(x, bound=float(bound)):
            return float(_kl_estimate(p["kl_estimator"], np.float64(x))) - bound

        for s, e in pieces:
            if s >= e or f(s) * f(e) > 0 or f(s) == f(e):
                continue
            for _ in range(200):
                m = (s + e) / 2
                s, e = (m, e) if f(s) * f(m) > 0 else (s, m)
            kinks.append((s + e) / 2)
    return sorted(set(kinks))


def _bands_around(kinks: list, core: tuple = KL_SPREAD) -> list:
    """The bands of x for a term with kinks (a KL term's, an IS weight's): ``core``, and REACH wide
    on either side of each kink, with every zone within INSIDE of a kink cut out (a band with less
    than NEAREST left is dropped).  Each a list of pieces (start, width)."""
    zones = [(k - INSIDE, k + INSIDE) for k in kinks]
    raw = [core] + [q for k in kinks for q in ((k - REACH, k - INSIDE), (k + INSIDE, k + REACH))]
    bands = []
    for a, b in raw:
        pieces = [(a, b)]
        for za, zb in zones:
            pieces = [q for pa, pb in pieces for q in ((pa, min(pb, za)), (max(pa, zb), pb)) if q[1] > q[0]]
        if sum(pb - pa for pa, pb in pieces) >= NEAREST:
            bands.append([(pa, pb - pa) for pa, pb in pieces])
    return bands


def _kl_branch(x, w, p: dict):
    """Which side of each KL clamp x lies on (a code per token; w: k3_unbiased's ratio)."""
    lo, hi = p["kl_log_ratio_min"], p["kl_log_ratio_max"]
    xc = np.clip(x, -np.inf if lo is None else float(lo), np.inf if hi is None else float(hi))
    y = _kl_estimate(p["kl_estimator"], xc, w)
    code = np.zeros(x.shape, dtype=np.int64)
    for k, (v, b, sign) in enumerate(((x, lo, -1), (x, hi, 1), (y, p["kl_output_min"], -1),
                                      (y, p["kl_output_max"], 1))):
        if b is not None:
            code |= ((sign * (v - float(b))) > 0).astype(np.int64) << k
    return code


def ref_logprobs_spread(l: np.ndarray, mask: np.ndarray, seed: int, params: dict | None = None,
                        old: np.ndarray | None = None) -> np.ndarray:
    """The KL term's reference log-probs l_ref = l + x, rounded to bfloat16 as the old log-probs are
    (0 where masked).  Without KL clamps x is uniform in KL_SPREAD (the corpus's generator keeps l_ref
    within 1/32 of l).  With them (``params``' kl_log_ratio_min/max, kl_output_min/max), x is drawn
    from the bands of ``_bands_around`` with equal chance (a uniform u placing it in its band), so that
    every side of every clamp is reached; a token whose rounded x lies within INSIDE of a kink (a
    clamp's side differs at x +- INSIDE; k3_unbiased's output kinks move with its ratio
    w = exp(l - old)) is drawn again, up to ROUNDS times."""
    p = {**{q.name: q.default for q in REGISTRY["loss.grpo"].params if q.name.startswith("kl_")}, **(params or {})}
    rng = _stream(seed, 2)
    kinks = _kl_kinks(p)
    if not kinks:
        return _bfloat16_at(mask, l + rng.uniform(*KL_SPREAD, size=l.shape))
    bands = _bands_around(kinks)
    w = np.exp(l - old) if p["kl_estimator"] == "k3_unbiased" and old is not None else 1.0

    def draw():
        return _draw_from_bands(rng, bands, l.shape)

    x = draw()
    for _ in range(ROUNDS):
        ref = _bfloat16_at(mask, l + x)
        xr = ref - l
        here = _kl_branch(xr, w, p)
        near = mask & ((_kl_branch(xr - INSIDE, w, p) != here) | (_kl_branch(xr + INSIDE, w, p) != here))
        if not near.any():
            return ref
        x = np.where(near, draw(), x)
    raise CheckError(f"the KL clamps {_kl_clamps(p)} leave no room for the check's reference log-probs off their "
                     f"kinks (x = l_ref - l within {INSIDE} of a kink after {ROUNDS} draws)")


def _kl_clamps(p: dict) -> str:
    return ", ".join(f"{k}={p[k]}" for k in ("kl_log_ratio_min", "kl_log_ratio_max", "kl_output_min", "kl_output_max")
                     if p.get(k) is not None)


IS_SPREAD = (-1.0, 1.0)     # the IS log-weight u of a check with an IS weight (rho from 0.37 to 2.7)


def _is_kinks(p: dict) -> list:
    """The log-weights u where the IS weight changes branch: +-c (is_log_ratio_clamp) and the log of
    each bound (is_c_min > 0, is_c_max) within them."""
    c = p["is_log_ratio_clamp"]
    kinks = [] if c is None else [-float(c), float(c)]
    for b in (p["is_c_min"], p["is_c_max"]):
        if b is not None and float(b) > 0 and (c is None or abs(math.log(float(b))) < float(c)):
            kinks.append(math.log(float(b)))
    return sorted(set(kinks))


def _is_branch(u, p: dict):
    """Which side of the IS weight's clamp and bounds each log-weight u lies on (a code per element)."""
    c = p["is_log_ratio_clamp"]
    uc = u if c is None else np.clip(u, -float(c), float(c))
    rho = np.exp(uc)
    code = np.zeros(np.shape(u), dtype=np.int64)
    for k, (v, b, sign) in enumerate(((u, None if c is None else -c, -1), (u, c, 1), (rho, p["is_c_min"], -1),
                                      (rho, p["is_c_max"], 1))):
        if b is not None:
            code |= ((sign * (v - float(b))) > 0).astype(np.int64) << k
    return code


def sampler_logprobs_off_the_kinks(old: np.ndarray, mask: np.ndarray, seed: int, params: dict) -> np.ndarray:
    """The sampler's log-probs of a check with an IS weight: l_sampler = l_old - u, rounded to bfloat16
    as the old log-probs are (0 where masked), u drawn so that the level's log-weight (a token's u, a
    row's sum or mean) lies in IS_SPREAD or within REACH either side of each kink of ``_is_kinks``
    (the bands of ``_bands_around``, equal chance), at least INSIDE from every kink after rounding (a
    token, or a row, that falls nearer is drawn again, up to ROUNDS times).  At the sequence and
    geometric levels each row's log-weight U_i is drawn so and its tokens spread around it:
    u_t = U_i / L_i (sequence; U_i geometric) + z_t - mean z, z uniform in [-BAND, BAND]."""
    p = {**{q.name: q.default for q in REGISTRY["loss.grpo"].params if q.name.startswith("is_")}, **params}
    rng = _stream(seed, 3)
    bands = _bands_around(_is_kinks(p), IS_SPREAD)
    level = p["is_level"]
    L = np.maximum(mask.sum(-1, keepdims=True), 1)

    def draw(shape):
        return _draw_from_bands(rng, bands, shape)

    def tokens():
        if level == "token":
            return draw(old.shape)
        U = draw((old.shape[0], 1))
        return (U / L if level == "sequence" else U) + _zero_mean_spread(rng, mask)

    u = tokens()
    for _ in range(ROUNDS):
        sampler = _bfloat16_at(mask, old - u)
        actual = np.where(mask, old - sampler, 0.0)
        if level != "token":
            actual = actual.sum(-1, keepdims=True) / (L if level == "geometric" else 1)
        here = _is_branch(actual, p)
        near = (_is_branch(actual - INSIDE, p) != here) | (_is_branch(actual + INSIDE, p) != here)
        near = mask & near if level == "token" else np.broadcast_to(near, old.shape) & mask.any(-1, keepdims=True)
        if not near.any():
            return sampler
        u = np.where(near, tokens(), u)
    raise CheckError(f"the IS weight's bounds (is_c_min={p['is_c_min']}, is_c_max={p['is_c_max']}, is_log_ratio_clamp="
                     f"{p['is_log_ratio_clamp']}) leave no room for the check's sampler log-probs off their kinks "
                     f"(a {level} log-weight within {INSIDE} of a kink after {ROUNDS} draws)")


def old_logprobs_per_sequence(l: np.ndarray, mask: np.ndarray, adv: np.ndarray, seed: int, params: dict) -> np.ndarray:
    """GSPO clips the sequence ratio exp(mean_t (l - old)): old = l - rho with each row's mean log-ratio
    mu_i in one of the bands of ``_clip_bands`` (below the clip range, inside it where it is wide
    enough, above it), the tokens spread around it: rho_{i,t} = mu_i + z_t - mean z (z uniform in
    [-BAND, BAND] over the row's unmasked tokens); rounded to bfloat16 as ``old_logprobs_off_the_kinks``
    rounds them (which moves a row's mean by at most half a bfloat16 step of its largest |old|, far
    less than GAP).  Even rows take a band where the loss has a gradient for their advantage (the
    unclipped branch: inside, below for A > 0, above for A < 0), odd rows one where it has none (the
    clipped constant), so a check of one sequence judges a gradient and a larger one judges both.

    With GSPO's per-token clamp c (log_ratio_clamp: each l - old clamped to [-c, c] before the mean),
    ``_clamped_outliers`` sets pairs of each row's tokens beyond +-c instead; the other tokens carry
    the row's mean."""
    bands = _clip_bands(float(params["eps_low"]), float(params["eps_high"]))
    below = float(params["eps_low"]) < 1                # a band below the clip range (first), above it (last)
    kinds = ["below"] * below + ["inside"] * (len(bands) - 1 - below) + ["above"]
    cap = params.get("log_ratio_max")
    if cap is not None:     # GSPO's cap on the mean: bands on either side of it, none within INSIDE of it
        bands, kinds = _with_cap_bands(bands, float(params["eps_low"]), float(params["eps_high"]), float(cap))
    rng = _stream(seed, 1)
    pick, u = rng.uniform(size=l.shape[0]), rng.uniform(size=l.shape[0])
    mu = np.empty(l.shape[0])
    for i, a in enumerate(adv):
        live = {"below": a > 0, "inside": True, "above": a < 0, "capped": False}
        want = [k for k, kind in enumerate(kinds) if live[kind] == (i % 2 == 0)] or list(range(len(kinds)))
        mu[i] = _place(bands[want[int(pick[i] * len(want))]], u[i:i + 1])[0]
    clamp = params.get("log_ratio_clamp")
    if clamp is not None:
        return _clamped_outliers(l, mask, mu, rng, float(clamp))
    return _bfloat16_at(mask, l - (mu[:, None] + _zero_mean_spread(rng, mask)))


OUTLIERS = 16       # a pair of clamped tokens for every OUTLIERS of a row's tokens (at least one pair in a row of 4)


def _clamped_outliers(l: np.ndarray, mask: np.ndarray, mu: np.ndarray, rng, c: float) -> np.ndarray:
    """Old log-probs for GSPO with its per-token clamp c whose rows' clamped mean log-ratios are ``mu``:
    in a row of L >= 4 tokens, K = 2 max(1, L // OUTLIERS) tokens (at random) get log-ratios
    +-(c + GAP + U(0, BAND)), half on either side, so they are clamped to +-c and their clamped values
    cancel exactly; the other L - K carry the mean, rho = mu L / (L - K) + z - mean z (z uniform in
    [-BAND, BAND]).  Rounded to bfloat16 (``_bfloat16_at``); every token must then lie at least INSIDE
    from +-c, else the clamp leaves the rows' means no room (CheckError naming it)."""
    rho = np.zeros(l.shape)
    out = np.zeros(l.shape, dtype=bool)
    for i in range(l.shape[0]):
        ts = np.flatnonzero(mask[i])
        L = len(ts)
        K = 2 * max(1, L // OUTLIERS) if L >= 4 else 0
        pick = rng.permutation(ts)[:K]
        side = np.where(np.arange(K) % 2 == 0, 1.0, -1.0)
        rho[i, pick] = side * (c + GAP + rng.uniform(0, BAND, size=K))
        out[i, pick] = True
        live = np.setdiff1d(ts, pick)
        z = rng.uniform(-BAND, BAND, size=len(live))
        rho[i, live] = mu[i] * L / max(len(live), 1) + z - (z.mean() if len(live) else 0.0)
    old = _bfloat16_at(mask, l - rho)
    rho = np.where(mask, l - old, 0.0)
    near = mask & (np.abs(np.abs(rho) - c) < INSIDE)
    if near.any() or (mask & ~out & (np.abs(rho) > c)).any():
        raise CheckError(f"log_ratio_clamp={c} leaves no room for the check's sequence log-ratios: a row's mean "
                         f"(up to {float(np.abs(mu).max()):.3g}) must be carried by tokens at least {INSIDE} inside "
                         f"+-{c}; give a larger clamp (or null)")
    return old


OPSM_SPREAD = (-1.0, 1.0)   # kappa_i = mean_t (l_sampler - l) of an OPSM check, besides the bands around its delta
ENTROPY_SPREAD = (1.0, 5.0)  # the token entropies of an entropy-mask check
TIE = (2, 3)                 # the ranks j - 2 .. j + 2 about the quantile's that share one entropy


def sampler_logprobs_for_opsm(l: np.ndarray, mask: np.ndarray, seed: int, params: dict) -> np.ndarray:
    """The sampler's log-probs of an OPSM check: each row's kappa_i = mean_t (l_sampler - l) in
    OPSM_SPREAD or within REACH either side of opsm_delta (the bands of ``_bands_around``, equal
    chance), its tokens spread around it (l_sampler - l = kappa_i + z_t - mean z, z uniform in
    [-BAND, BAND]), rounded to bfloat16 as the old log-probs are; a row whose kappa then lies within
    INSIDE of delta is drawn again, up to ROUNDS times."""
    delta = float(params["opsm_delta"])
    rng = _stream(seed, 5)
    bands = _bands_around([delta], OPSM_SPREAD)
    L = np.maximum(mask.sum(-1, keepdims=True), 1)

    def rows():
        kappa = _draw_from_bands(rng, bands, (l.shape[0], 1))
        return kappa + _zero_mean_spread(rng, mask)

    x = rows()
    for _ in range(ROUNDS):
        sampler = _bfloat16_at(mask, l + x)
        kappa = np.where(mask, sampler - l, 0.0).sum(-1, keepdims=True) / L
        near = (np.abs(kappa - delta) < INSIDE) & mask.any(-1, keepdims=True)
        if not near.any():
            return sampler
        x = np.where(near, rows(), x)
    raise CheckError(f"opsm_delta={delta} leaves no room for the check's sampler log-probs off its kink "
                     f"(a row's mean log-ratio within {INSIDE} of it after {ROUNDS} draws)")


SHORT_ROW = 8     # a row of at most this many tokens is drawn again whole when a token lies near a kink


def sampler_logprobs_for_opsm_and_is(l: np.ndarray, old: np.ndarray, mask: np.ndarray, seed: int,
                                     params: dict) -> np.ndarray:
    """The sampler's log-probs of a check with OPSM and an IS weight (token or geometric level), which
    both read them: each row's kappa_i = mean_t (l_sampler - l) off opsm_delta as
    ``sampler_logprobs_for_opsm`` puts it, and the IS log-weight (a token's u_t = l_old - l_sampler,
    or a row's mean) off its kinks as ``sampler_logprobs_off_the_kinks`` puts it.  The two are tied:
    kappa_i = c_i - mean_t u_t, c_i = mean_t (l_old - l) (fixed by the old log-probs).  So each row's
    target is drawn first and the tokens spread around it, u_t = c_i - kappa_i + z_t - mean z:

    - token level: kappa_i from the bands of OPSM (``_bands_around`` delta, OPSM_SPREAD), z_t from the
      IS weight's (IS_SPREAD and REACH either side of each kink), so the tokens reach the IS weight's
      branches around the row's mean;
    - geometric level (the row's log-weight U_i = mean_t u_t): even rows draw U_i from the IS weight's
      bands (kappa_i = c_i - U_i), odd rows kappa_i from OPSM's (U_i = c_i - kappa_i), z uniform in
      [-BAND, BAND], so the rows reach both sides of delta and of each IS kink.

    Rounded to bfloat16 as the old log-probs are; then a row whose kappa_i, or geometric log-weight,
    lies within INSIDE of its kink is drawn again, and a token whose u_t does has its z_t drawn again
    (the row's other tokens stay, its mean moves by the change / L_i and is checked again; a row of
    at most SHORT_ROW tokens is drawn again whole), up to ROUNDS times.  At the sequence level the
    row's log-weight is a sum, within REACH of a kink for a row of any length, which leaves
    kappa_i = c_i - U_i / L_i to the old log-probs (``oracle_params`` refuses it)."""
    p = {**{q.name: q.default for q in REGISTRY["loss.grpo"].params if q.name.startswith("is_")}, **params}
    level, delta = p["is_level"], float(p["opsm_delta"])
    if level not in ("token", "geometric"):
        raise ValueError(f"is_level={level!r}: OPSM with an IS weight is drawn at the token or geometric level")
    rng = _stream(seed, 8)
    is_bands, opsm_bands = _bands_around(_is_kinks(p), IS_SPREAD), _bands_around([delta], OPSM_SPREAD)
    L = np.maximum(mask.sum(-1, keepdims=True), 1)
    live = mask.any(-1, keepdims=True)
    short = live & (L <= SHORT_ROW)
    even = (np.arange(l.shape[0]) % 2 == 0)[:, None]

    def mean(x):
        return np.where(mask, x, 0.0).sum(-1, keepdims=True) / L

    c = mean(old - l)

    def kappas():
        kappa = _draw_from_bands(rng, opsm_bands, c.shape)
        return kappa if level == "token" else np.where(even, c - _draw_from_bands(rng, is_bands, c.shape), kappa)

    def spread():
        return _draw_from_bands(rng, is_bands, l.shape) if level == "token" else rng.uniform(-BAND, BAND, l.shape)

    def near_is(u):
        here = _is_branch(u, p)
        return (_is_branch(u - INSIDE, p) != here) | (_is_branch(u + INSIDE, p) != here)

    z = spread()
    shift = c - kappas() - mean(z)      # u = z + shift: the row's mean c - kappa
    for _ in range(ROUNDS):
        sampler = _bfloat16_at(mask, old - (z + shift))
        u = np.where(mask, old - sampler, 0.0)
        rows = live & (np.abs(mean(sampler - l) - delta) < INSIDE)
        tokens = mask & near_is(u) if level == "token" else np.zeros_like(mask)
        if level == "geometric":
            rows |= live & near_is(mean(u))
        if not rows.any() and not tokens.any():
            return sampler
        rows |= short & tokens.any(-1, keepdims=True)
        # a token drawn again moves its row's mean by its change / L, checked again with the rest
        # (the row's shift kept, so that the other tokens' values, and their rounding, stay)
        z = np.where(rows | tokens, spread(), z)
        shift = np.where(rows, c - kappas() - mean(z), shift)
    raise CheckError(f"opsm_delta={delta} with the IS weight's bounds (is_c_min={p['is_c_min']}, is_c_max="
                     f"{p['is_c_max']}, is_log_ratio_clamp={p['is_log_ratio_clamp']}) leaves no room for the check's "
                     f"sampler log-probs off their kinks (a row's mean log-ratio or a {level} log-weight within "
                     f"{INSIDE} of a kink after {ROUNDS} draws)")


def entropy_off_the_quantile(mask: np.ndarray, seed: int, rho) -> np.ndarray:
    """Token entropies for an entropy-mask check: uniform in ENTROPY_SPREAD, rounded to bfloat16 (0
    where masked), with the quantile at 1 - rho made unambiguous: the unmasked tokens of ranks
    j - 2 .. j + 2 about the quantile's position h = (1 - rho)(n - 1), j = floor(h), share one entropy
    E0 (so the quantile is E0 in any precision, whatever the interpolation, and those tokens are kept),
    the lower ranks at most E0 - INSIDE and the higher at least E0 + INSIDE."""
    import torch

    e = _stream(seed, 6).uniform(*ENTROPY_SPREAD, size=mask.shape)
    e = torch.from_numpy(np.where(mask, e, 0.0)).to(torch.bfloat16).double().numpy()
    flat = np.flatnonzero(mask)
    n = flat.size
    if n == 0:
        return e
    order = flat[np.argsort(e.flat[flat], kind="stable")]
    j = int(math.floor((1 - float(rho)) * (n - 1) + 1e-9))
    lo, hi = max(0, j - TIE[0]), min(n, j + TIE[1])
    e0 = e.flat[order[j]]

    def bf16(v):
        return torch.from_numpy(np.asarray(v, dtype=np.float64)).to(torch.bfloat16).double().numpy()

    out = e.copy()
    out.flat[order[lo:hi]] = e0
    out.flat[order[:lo]] = np.minimum(out.flat[order[:lo]], bf16(e0 - INSIDE - 0.01))
    out.flat[order[hi:]] = np.maximum(out.flat[order[hi:]], bf16(e0 + INSIDE + 0.01))
    return out


def sampler_logprobs_for_minirl(l: np.ndarray, mask: np.ndarray, seed: int, params: dict) -> np.ndarray:
    """MiniRL's weight min(exp(l - l_sampler), C) carries no gradient and is continuous in its inputs:
    l - l_sampler is drawn from IS_SPREAD and, with a cap C, from REACH either side of log C (the
    bands of ``_bands_around``, equal chance), so that both sides of the cap are reached; rounded to
    bfloat16 as the old log-probs are."""
    cap = params["is_cap"]
    rng = _stream(seed, 7)
    bands = _bands_around([] if cap is None else [math.log(float(cap))], IS_SPREAD)
    v = _draw_from_bands(rng, bands, l.shape)
    return _bfloat16_at(mask, l - v)


VESPO_SPREAD = (-2.0, 2.0)  # each row's summed log-ratio of a VESPO check (its weight w from 0.14 to 7.4)


def old_logprobs_row_sums(l: np.ndarray, mask: np.ndarray, seed: int) -> np.ndarray:
    """VESPO weighs each sequence by phi(w), w = exp(sum_t (l - old)), which carries no gradient and
    has no kink: old = l - d with each row's sum U_i uniform in VESPO_SPREAD (phi from its small-w
    tail, through phi(1) = 1, to its decay) and its tokens spread around it, d_t = U_i / L_i + z_t -
    mean z (z uniform in [-BAND, BAND]); rounded to bfloat16 as ``old_logprobs_off_the_kinks`` rounds
    them (which moves a long row's sum by a few tenths)."""
    rng = _stream(seed, 4)
    L = np.maximum(mask.sum(-1, keepdims=True), 1)
    U = rng.uniform(*VESPO_SPREAD, size=(l.shape[0], 1))
    return _bfloat16_at(mask, l - (U / L + _zero_mean_spread(rng, mask)))


def sampler_logprobs_for_vespo(l: np.ndarray, old: np.ndarray, mask: np.ndarray, seed: int) -> np.ndarray:
    """VESPO folds the sampler's log-ratio into its row's log-weight: log w = sum_t (l - l_old) +
    sum_t (l_old - l_sampler) (each term clamped, far beyond these values), phi from w, no kink.  So
    each row's total sum_t (l - l_sampler) is drawn uniform in VESPO_SPREAD, as the old log-probs
    alone draw theirs: x_t = l_old - l_sampler = (total - sum_t (l - l_old)) / L + z_t - mean z (z
    uniform in [-BAND, BAND]), rounded to bfloat16 as the old log-probs are (0 where masked)."""
    rng = _stream(seed, 9)
    L = np.maximum(mask.sum(-1, keepdims=True), 1)
    total = rng.uniform(*VESPO_SPREAD, size=(l.shape[0], 1))
    V = total - np.where(mask, l - old, 0.0).sum(-1, keepdims=True)
    return _bfloat16_at(mask, old - (V / L + _zero_mean_spread(rng, mask)))


def _with_cap_bands(bands: list, eps_low: float, eps_high: float, cap: float) -> tuple:
    """GSPO's bands of the mean log-ratio with its cap c (log_ratio_max): the clip's bands with the zone
    within INSIDE of c cut out, and REACH wide on either side of c (the clip's zones cut out too),
    each piece left a band of its own, of the kind where it lies: above c capped (no path to l), else
    below, inside or above the clip range.  (bands, kinds); a piece narrower than NEAREST is dropped."""
    lo = math.log1p(-eps_low) if eps_low < 1 else -math.inf
    hi = math.log1p(eps_high)
    zones = [(cap - INSIDE, cap + INSIDE)] + [(k - INSIDE, k + INSIDE) for k in (lo, hi) if math.isfinite(k)]
    raw = [[(min(a, a + w), max(a, a + w)) for a, w in band] for band in bands]
    raw += [[(cap - REACH, cap - INSIDE)], [(cap + INSIDE, cap + REACH)]]
    out, kinds = [], []
    for k, band in enumerate(raw):
        pieces = band
        for za, zb in zones[:1] if k < len(bands) else zones:
            pieces = [q for pa, pb in pieces for q in ((pa, min(pb, za)), (max(pa, zb), pb)) if q[1] > q[0]]
        for pa, pb in pieces:       # no piece straddles a kink: their zones are cut out
            if pb - pa >= NEAREST:
                mid = (pa + pb) / 2
                out.append([(pa, pb - pa)])
                kinds.append("capped" if mid > cap else "below" if mid < lo else "above" if mid > hi else "inside")
    return out, kinds


def _sequence_level(formula: str, p: dict) -> bool:
    """Whether the loss clips a sequence ratio (GSPO's term; LUSPO's at ratio_level 'sequence')."""
    return formula == "loss.gspo" or formula == "loss.luspo" and p["ratio_level"] == "sequence"


def _kinks(params: dict) -> tuple:
    """(eps_low, eps_high, clamp) of ``draw_log_ratios`` for a token loss's parameters: the clip range
    [1 - eps_low, 1 + eps_high] of the PPO losses, or where CISPO truncates its weight w (relative form:
    the same, no lower bound when eps_low is null; absolute form: w = min(r, eps_high), a cap at
    1 + (eps_high - 1)), and the log-ratio clamp."""
    clamp = params.get("log_ratio_clamp")
    if params.get("cap_form") == "absolute":
        return 1.0, float(params["eps_high"]) - 1, clamp
    if "cap_form" in params and params.get("eps_low") is None:
        return 1.0, float(params["eps_high"]), clamp
    return float(params["eps_low"]), float(params["eps_high"]), clamp


def check_inputs(formula: str, B: int, T: int, seed: int, params: dict, sampler: bool = False) -> dict:
    """The inputs of a check: ``seeded_inputs``, with (under the formula's parameters and defaults)
    the old log-probs of a loss drawn to judge every branch: off the kinks per token
    (``old_logprobs_off_the_kinks``; GMPO's clip of the log-ratio taken as the ratio's), per sequence
    for a sequence-level loss
    (``old_logprobs_per_sequence``), spread for SAPO's smooth gate (``old_logprobs_spread``); with an
    IS weight, the sampler's log-probs off its kinks (``sampler_logprobs_off_the_kinks``), or off
    OPSM's (``sampler_logprobs_for_opsm``), or off both (``sampler_logprobs_for_opsm_and_is``); with
    the entropy mask, entropies off its quantile
    (``entropy_off_the_quantile``); for VESPO,
    each row's summed log-ratio spread (``old_logprobs_row_sums``), and with ``sampler`` the sampler's
    log-probs it folds into phi (``sampler_logprobs_for_vespo``); and with the KL term, spread
    reference log-probs, off its clamps' kinks (``ref_logprobs_spread``)."""
    p = {q.name: q.default for q in REGISTRY[formula].params}
    p.update(params)
    # loss.dapo's and loss.cispo's prompt_mean aggregation takes the prompt groups (an optional input,
    # refused otherwise)
    groups = ("group_ids",) if formula in ("loss.dapo", "loss.cispo") and p.get("aggregation") == "prompt_mean" else ()
    ref = ("ref_logprobs",) if p.get("beta") else ()
    reads = ("sampler_logprobs",) if p.get("is_level", "none") != "none" or p.get("opsm_delta") is not None \
        or sampler else ()
    arrays = seeded_inputs(formula, B, T, seed, optional=groups + ref + reads)
    if p.get("entropy_quantile") is not None:
        arrays["entropy"] = entropy_off_the_quantile(arrays["mask"], seed, p["entropy_quantile"])
    old = old_logprobs_for(formula, arrays.get("logprobs"), arrays["mask"], arrays.get("advantages"), seed, p)
    if old is not None:
        arrays["old_logprobs"] = old
    if formula == "loss.minirl":
        arrays["sampler_logprobs"] = sampler_logprobs_for_minirl(arrays["logprobs"], arrays["mask"], seed, p)
    elif formula == "loss.vespo" and sampler:
        arrays["sampler_logprobs"] = sampler_logprobs_for_vespo(arrays["logprobs"], arrays["old_logprobs"],
                                                                arrays["mask"], seed)
    elif p.get("opsm_delta") is not None and p.get("is_level", "none") != "none":
        arrays["sampler_logprobs"] = sampler_logprobs_for_opsm_and_is(arrays["logprobs"], arrays["old_logprobs"],
                                                                      arrays["mask"], seed, p)
    elif p.get("opsm_delta") is not None:
        arrays["sampler_logprobs"] = sampler_logprobs_for_opsm(arrays["logprobs"], arrays["mask"], seed, p)
    elif reads:
        arrays["sampler_logprobs"] = sampler_logprobs_off_the_kinks(arrays["old_logprobs"], arrays["mask"], seed, p)
    if ref:                         # after the old log-probs: k3_unbiased's kinks move with exp(l - old)
        arrays["ref_logprobs"] = ref_logprobs_spread(arrays["logprobs"], arrays["mask"], seed, p,
                                                     arrays.get("old_logprobs"))
    return arrays


def old_logprobs_for(formula: str, l, mask, adv, seed: int, p: dict, per_token=old_logprobs_off_the_kinks):
    """The old log-probs of a check of ``formula`` (parameters ``p``) around the log-probs ``l``, or None
    for a formula without them: spread for SAPO's smooth gate (``old_logprobs_spread``), per sequence
    for a sequence-level loss (``old_logprobs_per_sequence``), VESPO's row sums spread
    (``old_logprobs_row_sums``), else per token about the kinks, ``per_token(l, mask, seed, p)``
    (``old_logprobs_off_the_kinks``; for GMPO, whose clip acts on the log-ratio, about the ratios
    e^-eps_low and e^eps_high)."""
    if formula == "loss.sapo":
        return old_logprobs_spread(l, mask, seed, p.get("log_ratio_clamp"))
    if _sequence_level(formula, p):
        return old_logprobs_per_sequence(l, mask, adv, seed, p)
    if formula in TOKEN_LOSSES or formula == "loss.luspo":
        return per_token(l, mask, seed, p)
    if formula == "loss.vespo":
        return old_logprobs_row_sums(l, mask, seed)
    if formula == "loss.gmpo":
        ratio_eps = {"eps_low": -math.expm1(-float(p["eps_low"])), "eps_high": math.expm1(float(p["eps_high"]))}
        return per_token(l, mask, seed, ratio_eps)
    return None


def to_tensors(formula: str, arrays: dict, dtype: str, device: str):
    import torch

    f = REGISTRY[formula]
    tdtype = getattr(torch, compare.TORCH_DTYPES[dtype])
    out = {}
    for name, a in arrays.items():
        kind = f.input(name).kind
        if kind == "bool":
            out[name] = torch.as_tensor(a, dtype=torch.bool, device=device)
        elif kind == "int":
            out[name] = torch.as_tensor(a, dtype=torch.long, device=device)
        else:
            t = torch.as_tensor(a, dtype=torch.float64, device=device).to(tdtype)
            if name in f.differentiable:
                t.requires_grad_(True)
            out[name] = t
    return out


# ------------------------------------------------------------------------------------------------
# The oracle's scales: the reference's running error bound as tensor operations
# ------------------------------------------------------------------------------------------------
def _sum_rounding(k, abs_sum):
    """max(1, ceil(log2 k)) * sum |terms| (reference _ad._rounding for a "sum" node of k terms)."""
    return _depth(k) * abs_sum


def _rel(value, err):
    """1 + E/|v| (1 + E where v = 0), the relative-error factor of the scale pass."""
    import torch

    a = value.abs()
    return 1 + torch.where(a != 0, err / torch.where(a != 0, a, torch.ones_like(a)), err)


def _to_l(dx, x, Ex, A, C):
    """The cotangent (A_l, C_l) that terms ``x`` (errors ``Ex``) with cotangent (A, C) pass on to l: by
    their own pass where ``dx`` is one (it returns that pair), else along the one edge dx/dl of each
    term node (A |dx|, (C + A rel(x)) |dx|).  S(grad l) = A_l + C_l; A_l alone (the sum over paths of
    |local derivatives|) is what a composite carries on below l (check_head_loss.py)."""
    if callable(dx):
        return dx(A, C)
    return A * dx.abs(), (C + A * _rel(x, Ex)) * dx.abs()


def _pick(cond, yes, no):
    """The float64 ``yes`` where ``cond`` holds, else ``no`` (parameters as binary64: torch.where of two
    Python numbers would round them to float32, the default dtype)."""
    import torch

    def f64(v):
        return torch.tensor(float(v), dtype=torch.float64, device=cond.device)

    return torch.where(cond, f64(yes), f64(no))


def _ppo_terms(l, old, adv, mask, eps_low, eps_high, clamp):
    """The reference's fused ppo_clip_term node at every token: (value x, its rounding E(x), the
    derivative dx/dl (0 for a constant node))."""
    import torch

    a = adv if adv.dim() == 2 else adv.unsqueeze(-1).expand_as(l)
    d = l - old
    lo, hi = 1 - eps_low, 1 + eps_high
    r = torch.exp(d)
    unclipped = -a * r
    clipped = -a * torch.clamp(r, lo, hi)
    x = torch.maximum(unclipped, clipped)
    inside = (r >= lo) & (r <= hi)
    x = torch.where(inside, unclipped, x)
    live = inside | ((a > 0) & (r < lo)) | ((a < 0) & (r > hi))      # the -A r branch carries l
    E = torch.where(live, x.abs() * (2 + d.abs()), 2 * x.abs())
    dx = torch.where(live & (a != 0), x, torch.zeros_like(x))
    if clamp is not None:
        c = float(clamp)
        out = d.abs() > c
        rc = torch.exp(torch.clamp(d, -c, c))
        xc = torch.maximum(-a * rc, -a * torch.clamp(rc, lo, hi))
        x = torch.where(out, xc, x)
        E = torch.where(out, 3 * xc.abs(), E)
        dx = torch.where(out, torch.zeros_like(dx), dx)
    zero = torch.zeros_like(x)
    return torch.where(mask, x, zero), torch.where(mask, E, zero), torch.where(mask, dx, zero)


def _cispo_terms(l, old, adv, mask, cap_form, eps_low, eps_high, clamp):
    """The reference's CISPO nodes at every token (reference.surrogate.cispo_loss, x = l (-sg[w] A)):
    (value x, its error E(x), the derivative dx/dl = -w A).  Every input is exact (E = 0); each node
    rounds once (E = |value| + the operands' errors times the local derivatives): d = l - l_old (l's
    value: w carries no error of l, as in the reference), its clamp to [-c, c] (a clamped d is the
    bound, which carries |c|), r = exp(d), w = r truncated (a truncated w is the bound, which carries
    |w|), sg[w] (w's error), -sg[w], m = -sg[w] A, x = l m."""
    import torch

    a = adv if adv.dim() == 2 else adv.unsqueeze(-1).expand_as(l)
    d = l - old
    if clamp is not None:
        d = torch.clamp(d, -float(clamp), float(clamp))
    r = torch.exp(d)
    Er = r * (1 + d.abs())                  # |r| + r E(d), E(d) = |d| (or |c| where clamped)
    hi = float(eps_high) if cap_form == "absolute" else 1 + float(eps_high)
    lo = 1 - float(eps_low) if cap_form == "relative" and eps_low is not None else None
    w = torch.clamp(r, min=lo, max=hi)
    truncated = (r > hi) | (r < lo) if lo is not None else r > hi
    Ew = torch.where(truncated, w, Er)
    m = -w * a
    Em = m.abs() + a.abs() * (w + Ew)       # E(-sg[w]) = |w| + E(w)
    x = l * m
    Ex = x.abs() + l.abs() * Em
    zero = torch.zeros_like(x)
    return torch.where(mask, x, zero), torch.where(mask, Ex, zero), torch.where(mask, m, zero)


def _vespo_terms(l, old, adv, mask, p, inexact_l=False, sampler=None):
    """The reference's VESPO nodes (reference.loss.vespo, reference.surrogate.vespo_log_weight and
    vespo_phi): per row, s = a sum node over sg[clip(d_t, -c, c)] (d_t = l_t -
    l_old, E = |d|; a clamped d is the bound, E = c; its short exact terms leave no residue), log w =
    clip(s, log min_weight, max_log_weight) (a clipped s is the bound, E = |bound|), phi = the fused
    node vespo_phi (its stated rounding |phi| (1 + |k z| + |lam + k z| + |lam + k z - lam w| + 2 |lam w|
    + |k|), z = log w, and the slope phi (k - lam w) carrying E(log w)), (k, lam) by the sign of A
    (A >= 0: the positive pair), lam at least lambda_min; then at every token CISPO's nodes
    m = -sg[phi] A (E = |m| + |A| (phi + E(phi))), x = l m (E = |x| + |l| E(m), dx/dl = m).
    ``inexact_l``: l is an inner node of a composite (check_head_loss.py), whose value has all the
    working precision's bits, so a row's sum s with an unclamped term of two or more leaves a residue.
    ``sampler``: the sampler's log-probs, folded into s (TRL): the sum node has a second term per
    token, sg[clip(x_t, log min_weight, max_log_weight)], x_t = l_old - l_sampler (E = |x|; a clipped
    x is the bound, E = |bound|)."""
    import torch

    zero = torch.zeros_like(l)
    d = torch.where(mask, l - old, zero)
    c = p["log_ratio_clamp"]
    d, Ed, unclamped = _clip_node(d, d.abs(), None if c is None else -float(c), c)
    d, Ed = torch.where(mask, d, zero), torch.where(mask, Ed, zero)
    absd = d.abs().sum(-1)
    k = mask.sum(-1)
    if inexact_l:
        k = k + ((k >= 2) & (mask & unclamped).any(-1)).long()
    s, Es = d.sum(-1), Ed.sum(-1)
    if sampler is not None:
        x = torch.where(mask, old - sampler, zero)
        x, Ex, _ = _clip_node(x, x.abs(), math.log(float(p["min_weight"])), p["max_log_weight"])
        x, Ex = torch.where(mask, x, zero), torch.where(mask, Ex, zero)
        s, Es, absd, k = s + x.sum(-1), Es + Ex.sum(-1), absd + x.abs().sum(-1), k + mask.sum(-1)
    Es = _depth(k) * absd + Es
    z, Ez, _ = _clip_node(s, Es, math.log(float(p["min_weight"])), p["max_log_weight"])
    pos = adv >= 0
    k = _pick(pos, p["k_pos"], p["k_neg"])
    lam = torch.clamp(_pick(pos, p["lambda_pos"], p["lambda_neg"]), min=float(p["lambda_min"]))
    w = torch.exp(z)
    phi = torch.exp(k * z - lam * torch.expm1(z))
    slope = phi * (k - lam * w)
    arg1 = lam + k * z
    Ephi = phi * (1 + (k * z).abs() + arg1.abs() + (arg1 - lam * w).abs() + 2 * (lam * w).abs() + k.abs()) \
        + slope.abs() * Ez
    a, phi, Ephi = (t.unsqueeze(-1).expand_as(l) for t in (adv, phi, Ephi))
    m = -phi * a
    Em = m.abs() + a.abs() * (phi + Ephi)
    x = l * m
    Ex = x.abs() + l.abs() * Em
    return torch.where(mask, x, zero), torch.where(mask, Ex, zero), torch.where(mask, m, zero)


def _minirl_terms(l, old, sampler, adv, mask, p):
    """The reference's MiniRL nodes (reference.loss.minirl): the decoupled-PPO mask drops a token (its
    term the constant 0, no operand of the row's sum) where A > 0 and r > 1 + eps_high or A < 0 and
    r < 1 - eps_low (r = exp(l - l_old), a decision); elsewhere CISPO's x = l (-sg[w] A) with
    w = min(exp(l - l_sampler), C): l - l_sampler a node of the sampler's log-prob (l's value, a
    constant; E = |v|), exp (E = w + w |v|), a capped weight the bound C (E = C).
    Returns (x, E(x), dx/dl, inexact, which terms are nodes)."""
    import torch

    zero = torch.zeros_like(l)
    a = adv if adv.dim() == 2 else adv.unsqueeze(-1).expand_as(l)
    r = torch.exp(l - old)
    dropped = ((a > 0) & (r > 1 + float(p["eps_high"]))) | ((a < 0) & (r < 1 - float(p["eps_low"])))
    v = l - sampler
    rw = torch.exp(v)
    w, Ew, _ = _clip_node(rw, rw + rw * v.abs(), None, p["is_cap"])
    m = -w * a
    Em = m.abs() + a.abs() * (w + Ew)
    x = l * m
    Ex = x.abs() + l.abs() * Em
    node = mask & ~dropped
    return (torch.where(node, x, zero), torch.where(node, Ex, zero), torch.where(node, m, zero),
            node & (x != 0), node)


def _sapo_terms(l, old, adv, mask, tau_pos, tau_neg, clamp, El=None):
    """The reference's SAPO nodes at every token (reference.loss.sapo): d = l - l_old (E = |d|, and
    E(l) by its edge of +1 where l is an inner node with errors ``El``; a clamped d is the bound,
    which carries |c|, with no path to l), the fused gate node
    G = 4 sigma(tau (e^d - 1)) / tau (its slope 4 sigma(x) sigma(-x) e^d and its stated dscale,
    reference.surrogate.sapo_gate), -A (E = |A|), x = G (-A): (x, E(x), the gradient pass from x)."""
    import torch

    a = adv if adv.dim() == 2 else adv.unsqueeze(-1).expand_as(l)
    d = l - old
    clamped = torch.zeros_like(mask) if clamp is None else d.abs() > float(clamp)
    if clamp is not None:
        d = torch.clamp(d, -float(clamp), float(clamp))
    tau = _pick(a > 0, tau_pos, tau_neg)
    xg = tau * torch.expm1(d)
    p, q = torch.sigmoid(xg), torch.sigmoid(-xg)
    r = torch.exp(d)
    G = 4 * p / tau
    slope = 4 * p * q * r
    dscale = 4 * r * p * (1 + q * (tau * (r + (r - 1).abs()) + xg.abs() + 4))
    Ed = d.abs() if El is None else torch.where(clamped, d.abs(), d.abs() + El)
    EG = G + slope * Ed
    x = -a * G
    Ex = x.abs() + a.abs() * EG + G * a.abs()
    zero = torch.zeros_like(x)

    def backward(A_x, C_x):
        # G is a fused node that states its derivative's error (dscale)
        A_G, C_G = A_x * a.abs(), (C_x + A_x * _rel(x, Ex)) * a.abs()
        live = mask & ~clamped
        return torch.where(live, A_G * slope, zero), torch.where(live, C_G * slope + A_G * dscale, zero)

    return torch.where(mask, x, zero), torch.where(mask, Ex, zero), backward


def _clip_node(v, E, lo, hi):
    """The reference's clip node (reference._ad.clip) on values ``v`` with errors ``E``: inside the
    closed interval [lo, hi] v itself; outside, the bound, a node with no path back whose error is
    |bound|.  (value, E, inside); either bound may be None."""
    import torch

    inside = torch.ones_like(v, dtype=torch.bool)
    if lo is not None:
        inside &= v >= float(lo)
    if hi is not None:
        inside &= v <= float(hi)
    if lo is None and hi is None:
        return v, E, inside
    c = torch.clamp(v, min=None if lo is None else float(lo), max=None if hi is None else float(hi))
    return c, torch.where(inside, E, c.abs()), inside


def _k2_nodes(x, Ex):
    """k2 = x x / 2 (reference.kl.k2): the product node m = x x (two edges of |x| to x) and m / 2:
    (k2, E(k2), the pass from k2 back to x)."""
    m = x * x
    Em = m.abs() + 2 * x.abs() * Ex
    y = m / 2
    Ey = y.abs() + Em / 2

    def back(A, C):
        A_m, C_m = A / 2, (C + A * _rel(y, Ey)) / 2
        return 2 * x.abs() * A_m, 2 * x.abs() * (C_m + A_m * _rel(m, Em))

    return y, Ey, back


def _estimator_nodes(est, x, Ex):
    """kl.k1, kl.k2, kl.k3 or kl.abs of ``x`` (error Ex) as the reference's nodes: (value, E, the pass
    from the value back to x)."""
    import torch

    if est == "k1":                             # -x: an edge of -1, exact
        y = -x
        return y, y.abs() + Ex, lambda A, C: (A, C)
    if est == "k2":
        return _k2_nodes(x, Ex)
    if est == "k3":                             # expm1_minus_x: its rounding as usually written
        e1 = torch.expm1(x)
        y = e1 - x
        Ey = torch.exp(x) + e1.abs() + y.abs() + e1.abs() * Ex
        return y, Ey, lambda A, C: (A * e1.abs(), (C + A * _rel(y, Ey)) * e1.abs())
    if est == "abs":                            # |x|: the edge sign(x), 0 at x = 0
        y, s = x.abs(), torch.sign(x).abs()
        Ey = y + s * Ex
        return y, Ey, lambda A, C: (A * s, (C + A * _rel(y, Ey)) * s)
    raise ValueError(est)


def _kl_terms(l, old, ref, mask, p, El=None):
    """The reference's KL term at every token (reference.loss._kl_term with reference.kl): x = l_ref - l
    (an edge of -1 to l, E = |x|), the input clamp clip(x, kl_log_ratio_min, kl_log_ratio_max), the
    estimator ``kl_estimator`` (``_estimator_nodes``; k3_straight_through: sg[the clamped k3] +
    k2(x) - sg[k2(x)], unclamped x, value the clamped k3's, error |y| + E(k3) + 2 E(k2);
    k3_unbiased: the fused node w k3(clip(x)), w = exp(l - l_old), with the rounding of the formula
    as usually written and the derivative -w x, none where the input clamp is active and
    kl_sg_ratio_where_clamped, else w k3), then the output clamp clip(y, kl_output_min,
    kl_output_max).  Returns (y, E(y), the pass from y to l, whether y is exact at 64 bits), masked
    positions zero: y is exact where it is a clamp's bound, or k1 or abs (of x = l_ref - l, exact:
    the check's inputs are short), or k2 of an x of at most 32 significant bits (``_float_bits``);
    elsewhere (an exp) only where it is 0.

    ``El``: the forward errors of l where l is an inner node of a composite (check_head_loss.py; None:
    an exact input).  Then l's error reaches x by its edge of -1 (E(x) = |x| + E(l)), and the fused
    k3_unbiased node by its one edge to l (E(l) times its slope, none where the stop-gradient makes
    it a constant); and every value but 0 and a clamp's bound is inexact (l has all the working
    precision's bits)."""
    import torch

    est = p["kl_estimator"]
    lo, hi = p["kl_log_ratio_min"], p["kl_log_ratio_max"]
    x = ref - l
    Ex = x.abs() if El is None else x.abs() + El
    xc, Exc, inside = _clip_node(x, Ex, lo, hi)
    zero = torch.zeros_like(l)
    if est == "k3_unbiased":
        d = l - old
        w = torch.exp(d)
        e1 = torch.expm1(xc)
        k = e1 - xc
        y = w * k
        Ey = y.abs() + k.abs() * w * (1 + d.abs()) + w * (torch.exp(xc) + e1.abs() + k.abs() + e1.abs() * xc.abs())
        slope = torch.where(inside, (w * x).abs(), zero if p["kl_sg_ratio_where_clamped"] else y.abs())
        if El is not None:
            Ey = Ey + slope * El

        def to_l(A, C):
            return A * slope, (C + A * _rel(y, Ey)) * slope
    elif est == "k3_straight_through":
        v, Ev, _ = _estimator_nodes("k3", xc, Exc)
        v, Ev, v_kept = _clip_node(v, Ev, p["kl_output_min"], p["kl_output_max"])
        g, Eg, back_g = _k2_nodes(x, Ex)
        y, Ey = v, v.abs() + Ev + 2 * Eg

        def to_l(A, C):             # the edges of +1 (y to k2(x) - sg[k2(x)], to k2(x)) and -1 (x to l) pass (A, C) on
            return back_g(A, C)
    else:
        y, Ey, back = _estimator_nodes(est, xc, Exc)

        def to_l(A, C):             # x = l_ref - l: an edge of -1 passes (A, C) on
            A_x, C_x = back(A, C)
            return torch.where(inside, A_x, zero), torch.where(inside, C_x, zero)
    if El is not None:
        exact = y == 0
    elif est in ("k1", "abs"):
        exact = torch.ones_like(mask)
    elif est == "k2":
        exact = _float_bits(xc) <= 32
    else:
        exact = y == 0
    if est != "k3_straight_through":            # its clamps act on the value only (v above)
        y, Ey, kept = _clip_node(y, Ey, p["kl_output_min"], p["kl_output_max"])
        exact = exact | ~kept
    else:
        kept, exact = torch.ones_like(mask), exact | ~v_kept

    def backward(A, C):
        A_l, C_l = to_l(A, C)
        return torch.where(mask & kept, A_l, zero), torch.where(mask & kept, C_l, zero)

    return torch.where(mask, y, zero), torch.where(mask, Ey, zero), backward, exact


def _float_bits(x):
    """The significant bits of each float64 in ``x`` (0 for 0): 53 less the trailing zeros of its
    53-bit significand."""
    import torch

    m, _ = torch.frexp(x.abs())
    sig = (m * 2.0 ** 53).long()
    low = sig & -sig                                  # its lowest set bit, a power of two
    return torch.where(sig != 0, 53 - torch.log2(low.double()).long(), torch.zeros_like(sig))


def _with_kl(policy, kl, mask, beta):
    """A token loss's terms with the reference's KL term inside its aggregation (kl_aggregation
    'policy'; reference.loss.compose): term = pg + kl beta (kl beta: E = |kl beta| + beta E(kl), the
    edge beta; the sum: edges of +1).  ``policy``: the policy part's (x, E(x), dx/dl or its own
    pass[, inexact]); ``kl``: ``_kl_terms``.  Returns the terms' (x, E(x), their pass, inexact)."""
    import torch

    xp, Ep, dp = policy[:3]
    y, Ey, kl_back = kl[:3]
    kb = y * beta
    Ekb = kb.abs() + beta * Ey
    zero = torch.zeros_like(y)
    x = torch.where(mask, xp + kb, zero)
    Ex = torch.where(mask, x.abs() + Ep + Ekb, zero)

    def backward(A, C):
        # the term's edges of +1 pass (A, C) on to pg and to kl beta
        A_p, C_p = _to_l(dp, xp, Ep, A, C)
        A_k, C_k = kl_back(A * beta, (C + A * _rel(kb, Ekb)) * beta)
        return torch.where(mask, A_p + A_k, zero), torch.where(mask, C_p + C_k, zero)

    return x, Ex, backward, mask & ((x != 0) | (kb != 0))


def is_weights(old, sampler, mask, p):
    """The IS weight w^IS of every token as the reference's nodes compute it (reference.loss._is_weights,
    reference.is_): d = l_old - l_sampler per token (E = |d|), the level's log-weight u (token: d;
    sequence: a sum node over the row, E = depth(L) sum|d| + sum|d|, its exact short terms leave no
    residue; geometric: that sum / L), clamped to [-c, c] (is_log_ratio_clamp; a clamped u is the
    bound, E = c), rho = e^u (E = rho + rho E(u)), then truncated to [is_c_min, is_c_max] (is_mode
    'truncate': a truncated weight is the bound, E = |bound|) or kept where it lies in that closed
    band and the constant 0 elsewhere ('mask'); a missing bound is open.  Returns (w, E(w), whether
    w is a node (not the constant 0), whether it is a truncation bound), float64 [B, T], masked 0.
    The weight carries no gradient (sg[w])."""
    import torch

    zero = torch.zeros_like(old)
    d = torch.where(mask, old - sampler, zero)
    if p["is_level"] == "token":
        u, Eu = d, d.abs()
    else:
        L = mask.sum(-1, keepdim=True)
        absd = d.abs().sum(-1, keepdim=True)
        u, Eu = d.sum(-1, keepdim=True), _depth(L) * absd + absd
        if p["is_level"] == "geometric":
            Ld = torch.clamp(L, min=1).double()
            u = u / Ld
            Eu = u.abs() + Eu / Ld
        u, Eu = u.expand_as(old), Eu.expand_as(old)
    c = p["is_log_ratio_clamp"]
    u, Eu, _ = _clip_node(u, Eu, None if c is None else -float(c), c)
    rho = torch.exp(u)
    Erho = rho + rho * Eu
    lo, hi = p["is_c_min"], p["is_c_max"]
    w, Ew, inside = _clip_node(rho, Erho, lo, hi)
    if p["is_mode"] == "truncate":
        node, bound = mask.clone(), mask & ~inside
    else:
        node, bound = mask & inside, torch.zeros_like(mask)
        w = rho
    return torch.where(node, w, zero), torch.where(node, Ew, zero), node, bound


def _weighted(policy, weights, keep, mask):
    """The policy terms with the recipe's factor (reference.loss.compose): the constant 0 where OPSM
    or the entropy mask drops the token (``keep`` false) or a masking IS weight is 0 (not an operand
    of the row's sum; its token stays in the denominators); elsewhere the term p itself without an
    IS weight, or the product node p w with one (``is_weights``: E = |p w| + w E(p) + |p| E(w), the
    edge w to p, none to l through w).  ``policy``: (x, E(x), dx/dl or its own pass[, inexact]).
    Returns (x, E(x), the pass, inexact, which terms are nodes)."""
    import torch

    x, Ex, dp = policy[:3]
    inexact = policy[3] if len(policy) > 3 else x != 0
    node = mask & keep & (policy[4] if len(policy) > 4 else True)      # a policy term that is the constant 0 stays so
    if weights is None:
        xw, Exw, w, bound = x, Ex, None, torch.zeros_like(mask)
    else:
        w, Ew, w_node, bound = weights
        node = node & w_node
        w = torch.where(node, w, torch.zeros_like(w))
        xw = x * w
        Exw = xw.abs() + w * Ex + x.abs() * Ew
    zero = torch.zeros_like(x)

    def backward(A, C):
        # a term that is the constant 0 passes nothing on; a sequence loss's pass (GSPO's) still
        # reaches such a token through its row's other terms
        if w is None:
            A_p, C_p = torch.where(node, A, zero), torch.where(node, C, zero)
        else:
            A_p, C_p = A * w, (C + A * _rel(xw, Exw)) * w
        return _to_l(dp, x, Ex, A_p, C_p)

    if w is not None:           # a product with an IS weight is inexact unless the weight is a bound
        inexact = inexact | (~bound & (xw != 0))
    inexact = node & inexact
    return torch.where(node, xw, zero), torch.where(node, Exw, zero), backward, inexact, node


def opsm_keep(l, sampler, adv, mask, p):
    """M^opsm of every token (reference.loss._opsm_keep, reference.mask.opsm_*): row i is dropped iff
    its advantage is negative and kappa_i = mean_t (l_sampler - l) > opsm_delta; the advantage is
    the sequence's (a per-token one averaged over the row), or with opsm_advantage_gate 'token' each
    token's own.  A bool [B, T] (true where masked too)."""
    import torch

    L = torch.clamp(mask.sum(-1, keepdim=True), min=1).double()
    kappa = torch.where(mask, sampler - l, torch.zeros_like(l)).sum(-1, keepdim=True) / L
    if adv.dim() == 1:
        a_seq = a_tok = adv.unsqueeze(-1)
    else:
        a_seq, a_tok = torch.where(mask, adv, torch.zeros_like(adv)).sum(-1, keepdim=True) / L, adv
    a = a_tok if p["opsm_advantage_gate"] == "token" else a_seq
    return (~((a < 0) & (kappa > float(p["opsm_delta"])))).expand_as(mask)


def entropy_keep(entropy, mask, rho):
    """M^ent of every token (reference.loss._entropy_keep): entropy >= q, q the linear-interpolation
    quantile at 1 - rho of the batch's unmasked entropies (reference.mask.linear_quantile, its
    position h = (1 - rho)(n - 1) taken as the nearest integer within 2^-44 (n - 1)); nothing is kept
    of an empty batch."""
    import torch

    values = torch.sort(entropy[mask]).values
    n = values.numel()
    if n == 0:
        return torch.zeros_like(mask)
    h = (1 - float(rho)) * (n - 1)
    if abs(h - round(h)) <= 2.0 ** -44 * max(n - 1, 1):
        h = float(round(h))
    j = int(math.floor(h))
    q = values[j] if h == j else values[j] + (h - j) * (values[j + 1] - values[j])
    return entropy >= q


def _gspo_terms(l, old, adv, mask, eps_low, eps_high, log_ratio_max=None, El=None, clamp=None):
    """The reference's GSPO nodes of each sequence (reference.loss._gspo_seq), its
    loss x_i repeated at each unmasked token: (x [rows, T], E(x), the gradient pass from the term
    nodes, whether each term is inexact).

    The nodes: mu = mean_log_ratio (one node: rounding (depth(L) sum|d| + sum|d|)/L + |mu|,
    derivative 1/L to each l_t, so where l is an inner node with errors ``El`` E(mu) also has
    sum_t E(l_t) / L); with the per-token clamp c (``clamp``, reference.ratio.clamped_mean_log_ratio)
    instead d_t = l_t - l_old (E = |d|, and E(l) by its edge of +1), clip(d_t, -c, c) (a clamped d the
    bound, E = |c|, no path to l), a sum node over the row (its L terms, one more where its exact value
    has more than 64 bits: ``_exact_row_sums``, or l inexact) and its division by L (an edge of 1/L):
    the same E(mu) but for that residue; then its cap clip(mu, None, log_ratio_max) (a capped mean is
    the bound: E = |bound|, no path to l), s = exp(mu), -A (a node of the input A: E = |A|), p1 = s (-A),
    clip(s, lo, hi) (s itself inside; else the bound, which carries |bound|), p2 = clip(s) (-A),
    x = max(p1, p2): a tie inside the clip range (half the cotangent to each), p1 where the
    unclipped branch is the larger, p2 (no path to l) where the clipped one is."""
    import torch

    L = mask.sum(-1)
    Ld = torch.clamp(L, min=1).double()
    a = adv
    zero = torch.zeros_like(l)
    d = torch.where(mask, l - old, zero)
    Ed = d.abs() if El is None else d.abs() + torch.where(mask, El, zero)
    k, live = L, mask
    if clamp is not None:
        c = float(clamp)
        raw = d
        d, Ed, inside = _clip_node(d, Ed, -c, c)
        live = mask & inside
        d, Ed = torch.where(mask, d, zero), torch.where(mask, Ed, zero)
        signed = torch.where(mask & ~inside, torch.sign(raw), zero).long()
        if El is None:
            residue = _exact_row_sums(raw, live, signed, torch.full_like(Ld, c)) > 64
        else:           # l has all the working precision's bits
            residue = live.any(-1)
        k = L + ((L >= 2) & residue).long()
    absd = d.abs().sum(-1)
    mu = d.sum(-1) / Ld
    Emu = (_depth(k) * absd + Ed.sum(-1)) / Ld + mu.abs()
    mu, Emu, uncapped = _clip_node(mu, Emu, None, log_ratio_max)
    sv = torch.exp(mu)
    Es = sv + sv * Emu
    lo, hi = 1 - float(eps_low), 1 + float(eps_high)
    p1 = -a * sv
    Ep1 = p1.abs() + a.abs() * Es + sv * a.abs()
    inside = (sv >= lo) & (sv <= hi)
    b = torch.clamp(sv, lo, hi)
    p2 = -a * b
    Ep2 = torch.where(inside, Ep1, p2.abs() + 2 * a.abs() * b)
    tie = inside | (p1 == p2)
    first = ~tie & (p1 > p2)
    x = torch.where(first | tie, p1, p2)
    Ex = torch.where(tie, x.abs() + (Ep1 + Ep2) / 2, torch.where(first, Ep1, Ep2))

    def backward(A_tok, C_tok):
        # the row's sum reaches x by its L tokens' edges of +1
        A_x, C_x = torch.where(mask, A_tok, 0.0).sum(-1), torch.where(mask, C_tok, 0.0).sum(-1)
        rel_x, rel_p1 = _rel(x, Ex), _rel(p1, Ep1)
        # tie: half to p1 and to p2, each then -A to s (p2 too where it is s (-A), inside)
        A_p = torch.where(tie, A_x / 2, A_x)
        C_p = torch.where(tie, (C_x + A_x * rel_x) / 2, C_x)
        paths = torch.where(tie & inside, 2.0, torch.where(tie | first, 1.0, 0.0))
        A_s = paths * A_p * a.abs()
        C_s = paths * (C_p + A_p * rel_p1) * a.abs()
        A_mu, C_mu = A_s * sv, (C_s + A_s * _rel(sv, Es)) * sv
        A_mu, C_mu = torch.where(uncapped, A_mu, 0.0), torch.where(uncapped, C_mu, 0.0)
        A_l, C_l = (A_mu / Ld).unsqueeze(-1), ((C_mu + A_mu * _rel(mu, Emu)) / Ld).unsqueeze(-1)
        return torch.where(live, A_l, zero), torch.where(live, C_l, zero)

    xt = torch.where(mask, x.unsqueeze(-1).expand_as(l), zero)
    Ext = torch.where(mask, Ex.unsqueeze(-1).expand_as(l), zero)
    # x is inexact (all the working precision's bits) where it comes from exp; where the clipped branch
    # wins it is -A times the bound, exact, and so is the row's sum L x, which then leaves a residue
    # in the reference's sum node only if it has more than 64 significant bits (check._phantom)
    clipped = ~tie & ~first & (a != 0)
    inexact = (x != 0) & ~clipped
    for i in torch.nonzero(clipped & (L > 0)).flatten().tolist():
        bound = 1 - Fraction(float(eps_low)) if float(sv[i]) < lo else 1 + Fraction(float(eps_high))
        inexact[i] = _significant_bits(int(L[i]), float(a[i]), bound) > 64
    return xt, Ext, backward, mask & inexact.unsqueeze(-1)


def _gmpo_terms(l, old, adv, mask, eps_low, eps_high):
    """The reference's GMPO nodes of each sequence (reference.loss.gmpo, surrogate.gmpo_clipped_log_ratio),
    its loss x_i repeated at each unmasked token: (x [rows, T], E(x), the gradient pass from the term
    nodes, whether each term is inexact).

    Per token, d = l - l_old (E = |d|) and its sign-aware clip z: inside [-eps_low, eps_high] the
    tie min(d, d) (or max) of torch.minimum, a node of value d with two edges of 1/2 to d (E = 2|d|);
    outside, d itself where it is the smaller (A > 0, below) or the larger (A <= 0, above), else the
    bound (E = |bound|, no path to l).  Then S = a sum node over the row's z (a residue counted where
    its exact value has more than 64 bits, decided exactly: ``_exact_row_sums``), q = S / L,
    e = exp(q), x = e (-A) (-A: E = |A|)."""
    import torch

    zero = torch.zeros_like(l)
    a = adv.unsqueeze(-1).expand_as(l)
    d = torch.where(mask, l - old, zero)
    lo, hi = -float(eps_low), float(eps_high)
    inside = (d >= lo) & (d <= hi)
    live = inside | torch.where(a > 0, d < lo, d > hi)
    bound = torch.where(a > 0, torch.full_like(d, hi), torch.full_like(d, lo))     # float64, as the parameters are
    z = torch.where(live, d, bound)
    Ez = torch.where(inside, 2 * d.abs(), z.abs())
    rel_z = _rel(z, Ez)
    z, Ez = torch.where(mask, z, zero), torch.where(mask, Ez, zero)
    L = mask.sum(-1)
    Ld = torch.clamp(L, min=1).double()
    S = z.sum(-1)
    residue = _exact_row_sums(d, mask & live, mask & ~live, bound[:, :1].squeeze(-1)) > 64
    ES = _sum_rounding(L + ((L >= 2) & residue).long(), z.abs().sum(-1)) + Ez.sum(-1)
    q = S / Ld
    Eq = q.abs() + ES / Ld
    e = torch.exp(q)
    Ee = e + e * Eq
    x = -adv * e
    Ex = x.abs() + adv.abs() * Ee + e * adv.abs()

    def backward(A_tok, C_tok):
        # the row's sum reaches x by its L tokens' edges of +1
        A_x, C_x = torch.where(mask, A_tok, 0.0).sum(-1), torch.where(mask, C_tok, 0.0).sum(-1)
        A_e, C_e = A_x * adv.abs(), (C_x + A_x * _rel(x, Ex)) * adv.abs()
        A_q, C_q = A_e * e, (C_e + A_e * _rel(e, Ee)) * e
        A_S, C_S = A_q / Ld, (C_q + A_q * _rel(q, Eq)) / Ld
        A_S, C_S = A_S.unsqueeze(-1), C_S.unsqueeze(-1)
        C_d = torch.where(inside, C_S + A_S * rel_z, C_S)      # the tie's edges of 1/2
        return torch.where(mask & live, A_S, zero), torch.where(mask & live, C_d, zero)

    xt = torch.where(mask, x.unsqueeze(-1).expand_as(l), zero)
    Ext = torch.where(mask, Ex.unsqueeze(-1).expand_as(l), zero)
    # x is inexact where it comes from exp of q != 0; at q = 0 it is -A, and the row's sum L x is
    # exact unless it has more than 64 significant bits
    inexact = (x != 0) & (q != 0)
    for i in torch.nonzero((q == 0) & (x != 0) & (L > 0)).flatten().tolist():
        inexact[i] = _significant_bits(int(L[i]), float(adv[i])) > 64
    return xt, Ext, backward, mask & inexact.unsqueeze(-1)


def _exact_row_sums(d, live, bounded, bound):
    """The significant bits of each row's exact sum of d over ``live`` plus ``bound`` (a float64 per row)
    times the count of ``bounded`` tokens (a bool mask, or +-1 per token for bounds of either sign):
    the live d, multiples of 2^-40 below 2^22 (the check's inputs: differences of bfloat16-exact
    log-probs), summed exactly as integers; any other row exactly by fractions."""
    import torch

    scaled = torch.where(live, d, torch.zeros_like(d)) * 2.0 ** 40
    fits = (scaled == torch.round(scaled)).all(-1) & (scaled.abs() < 2.0 ** 62 / max(d.shape[-1], 1)).all(-1)
    ints = torch.round(scaled).long().sum(-1)
    counts = bounded.sum(-1)
    bits = torch.zeros(d.shape[0], dtype=torch.long, device=d.device)
    for i in range(d.shape[0]):
        if bool(fits[i]):
            total = Fraction(int(ints[i]), 2 ** 40)
        else:
            total = sum((Fraction(float(v)) for v in d[i][live[i]].tolist()), Fraction(0))
        total += int(counts[i]) * Fraction(float(bound[i]))
        bits[i] = _significant_bits(total)
    return bits


def _significant_bits(*factors) -> int:
    """The significant bits of the exact product of ``factors`` (ints, floats, dyadic Fractions)."""
    odd = 1
    for f in factors:
        n = abs(Fraction(f).numerator)
        odd *= n >> ((n & -n).bit_length() - 1) if n else 0
    return odd.bit_length()


def _depth(k):
    """max(1, ceil(log2 k)): the depth of a pairwise sum of k terms (reference _ad._rounding)."""
    import torch

    return torch.clamp(torch.ceil(torch.log2(torch.clamp(k.double(), min=1.0))), min=1.0)


def _phantom(k, inexact):
    """1 where the reference counts one more term in a "sum" node of k >= 2 terms.  It infers the
    node's constant as value - fsum(terms) with fsum at the scale pass's 64 bits (reference
    ``_ad._rounding`` under ``mp.workprec(64)``), so a sum whose value has more than 64 significant
    bits leaves a residue, counted as a term.  ``inexact``: whether a term's value is inexact (it
    came from exp: all the working precision's bits), which makes the sum's value so.

    Where every term is exact, the oracle counts a residue for a term that is a product with a
    clip bound (``x != 0``: PPO's clipped branch, CISPO's truncated weight), none for the inputs
    themselves (an aggregator's values) and for a KL term aggregated separately whose value is
    exact (``_kl_terms``: k1, abs, a short k2, a clamp's bound); a GSPO row's terms, one value
    repeated, are decided exactly (``_gspo_terms``).  It differs from the reference only for a sum of k = 2^j terms,
    all exact, whose value has at most 64 bits (products: a short row whose every token is
    clipped; the check's rows have hundreds of tokens and a third unclipped), where the depth of
    that node's rounding is one more than the reference's (S larger); or more than 64 bits
    (inputs, or exact KL terms, of widely spread exponents), where it is one less."""
    return ((k >= 2) & inexact).long()


def _document_mean_scales(x, mask, doc_ids, p):
    """(S(value), S(grad.values) [B, T]) of agg.document_mean on exact inputs ``x``, as the reference's
    nodes are (reference.agg.document_mean): per document d, a sum node G_d over its unmasked tokens
    (wherever they lie in the batch; depth(k_d) sum |x|, its exact short terms leave no residue),
    q_d = G_d / N_d (N_d: document_token_counts at its tokens, or its token count; an edge 1/N_d),
    the sum node P over the documents (a residue where some q_d is inexact: N_d not a power of two),
    and P / N_doc (num_documents or the count of documents; 0 gives the constant 0)."""
    import torch

    ids = doc_ids[mask]
    docs, unit = torch.unique(ids, return_inverse=True)
    n_docs = docs.numel()
    zero = torch.zeros(n_docs, dtype=torch.float64, device=x.device)
    xs = x[mask]
    G = zero.clone().index_add_(0, unit, xs)
    absG = zero.clone().index_add_(0, unit, xs.abs())
    k = zero.clone().index_add_(0, unit, torch.ones_like(xs))
    given = p["document_token_counts"]
    if given is None:
        N = k
    else:
        counts = torch.as_tensor([[0 if c is None else c for c in row] for row in given], dtype=torch.float64,
                                 device=x.device)[mask]
        N = zero.clone().index_copy_(0, unit, counts)
    EG = _depth(k) * absG
    q = G / N
    Eq = q.abs() + EG / N
    n = float(n_docs if p["num_documents"] is None else p["num_documents"])
    inexact = (torch.frexp(N)[0] != 0.5).any()
    P = q.sum()
    EP = _sum_rounding(torch.tensor(n_docs) + _phantom(torch.tensor(n_docs), inexact), q.abs().sum()) + Eq.sum()
    if n == 0:
        return P * 0, torch.zeros_like(x)
    v = P / n
    Ev = v.abs() + EP / n
    A_P, C_P = 1 / n, _rel(v, Ev) / n
    A_G, C_G = A_P / N, (C_P + A_P * _rel(q, Eq)) / N
    g = torch.zeros_like(x)
    g[mask] = (A_G + C_G)[unit]
    return Ev, g


def _aggregate_scales(kind, terms, mask, chunk, split=False, *, divisor=None, groups=None, root=None, counts=None,
                      eps_length=0.0, n=None):
    """(value, S(value), S(grad) [B, T]) of an aggregator over per-token terms, following the
    reference's nodes (pgspec.reference.agg): row sums (one "sum" node each), then the aggregator's
    divisions and sums, then the scale pass backwards.  ``kind``, at its default parameters:

    - agg.token_mean, agg.seq_mean_token_sum, agg.constant: the sum over rows, divided by the token
      count, the count of non-empty rows, or ``divisor`` (K or K N, agg.constant's constant);
    - agg.sample_mean: the mean over non-empty rows of each row's sum / L_i;
    - agg.prompt_mean: the mean over groups with a token of each group's sum (a sum node over its
      rows' sums) / D_g, the group's token count; ``groups``: the group id of each row [B].

    ``split``: also the A part of S(grad) [B, T] (the sum over paths of |local derivatives|;
    S(grad) - A is the C part), for a composite that carries the pass on from the differentiated
    input (check_head_loss.py).

    ``terms(rows)`` gives, for a slice of rows, (x, E(x), dx/dinput or None when the terms are the
    differentiable input itself, inexact[, which terms are nodes: the others are the constant 0,
    not operands of the row's sum; default the mask]) with masked positions zero; it is called once per chunk
    of ``chunk`` rows, whose temporaries stay within a chunk, and its x, E(x) and dx are kept for
    the gradient pass (24 bytes a token: evaluating the terms again would cost the oracle about a
    sixth of its time).

    ``root(v, E(v))``: the cotangent (A, C) the aggregate receives, (1, 0) when it is the loss itself
    (a KL term aggregated separately reaches it through beta).

    The denominators (``_aggregation_args``): ``divisor``, the N of the first three kinds (default: the
    token count, or the count of non-empty rows); for the units, ``counts`` [B] (each row's D_i, or
    its group's D_g at each of its rows; default the local token counts), ``eps_length`` added to
    each, and ``n`` (default: the units with D_u > 0).  A zero denominator gives the constant 0."""
    import torch

    B = mask.shape[0]
    L = mask.sum(-1)
    s = torch.zeros(B, dtype=torch.float64, device=mask.device)
    Es, absum = torch.zeros_like(s), torch.zeros_like(s)
    any_inexact = torch.zeros(B, dtype=torch.bool, device=mask.device)
    Lv = torch.zeros_like(L)
    kept = {}
    for start in range(0, B, chunk):
        sl = slice(start, start + chunk)
        got = terms(sl)
        x, Ex, dx, inexact = got[:4]
        kept[start] = (x, Ex, dx)
        s[sl] = x.sum(-1)
        absum[sl] = x.abs().sum(-1)
        any_inexact[sl] = inexact.any(-1)
        Lv[sl] = (got[4] if len(got) > 4 else mask[sl]).sum(-1)
        Es[sl] = _sum_rounding(Lv[sl] + _phantom(Lv[sl], any_inexact[sl]), absum[sl]) + Ex.sum(-1)
    rows = L > 0
    k = rows.sum()
    # a row whose every term is the constant 0 (an IS weight of 0) sums to a constant: no term of the
    # sums above it, though its tokens stay in the denominators
    vrows = Lv > 0
    if kind in ("agg.token_mean", "agg.seq_mean_token_sum", "agg.constant"):
        # v = (sum over the rows' sums) / N: one sum node (an empty row's sum is a constant 0, no term)
        if divisor is not None:
            N = torch.tensor(float(divisor), dtype=torch.float64, device=mask.device)
        elif kind == "agg.token_mean":
            N = L.sum().double()
        else:
            N = k.double()
        num = s[rows].sum()
        kv = vrows.sum()
        Enum = _sum_rounding(kv + _phantom(kv, any_inexact.any()), s[rows].abs().sum()) + Es[rows].sum()
        v = num / N if N > 0 else num * 0
        Ev = v.abs() + Enum / N if N > 0 else v * 0
        A0, C0 = (1.0, 0.0) if root is None else root(v, Ev)
        A_s = torch.full_like(s, 1.0) * A0 / N
        C_s = torch.full_like(s, 1.0) * (C0 + A0 * _rel(v, Ev)) / N
    else:
        # v = (1/n) sum over units u with D_u > 0 of G_u / D_u: the units are the rows (sample_mean:
        # G = the row's sum, D = L_i) or the prompt groups (prompt_mean: G = a sum node over the
        # group's non-empty rows' sums, D = the group's token count)
        if kind == "agg.sample_mean":
            unit = None
            G, EG, G_inexact, G_var = s, Es, any_inexact, vrows
            D = L.double() if counts is None else counts.double()
        else:  # agg.prompt_mean
            _, unit = torch.unique(groups, return_inverse=True)
            n_units = int(unit.max()) + 1 if B else 0

            def per_unit(x):
                return torch.zeros(n_units, dtype=x.dtype, device=x.device).index_add_(0, unit, x)

            kg = per_unit(vrows.long())
            G_var = kg > 0
            G = per_unit(torch.where(rows, s, torch.zeros_like(s)))
            G_inexact = per_unit((rows & any_inexact).long()) > 0
            D = per_unit(L.long()).double() if counts is None else \
                torch.zeros(n_units, dtype=torch.float64, device=mask.device).index_copy_(0, unit, counts.double())
            EG = (_sum_rounding(kg + _phantom(kg, G_inexact), per_unit(torch.where(rows, s.abs(), torch.zeros_like(s))))
                  + per_unit(torch.where(rows, Es, torch.zeros_like(s))))
        den = D + float(eps_length)
        units = den != 0
        Dd = torch.where(units, den, torch.ones_like(G))
        q = torch.where(units, G / Dd, torch.zeros_like(G))
        Eq = torch.where(units, q.abs() + EG / Dd, torch.zeros_like(G))
        n = (D > 0).sum().double() if n is None else torch.tensor(float(n), dtype=torch.float64, device=mask.device)
        P = q[units].sum()
        # the terms of the sum over units (a constant G_u, hence q_u, is none); q_u is inexact when
        # some D_u is not a power of two, or its terms are inexact
        live = units & G_var
        ku = live.sum()
        q_inexact = (torch.frexp(Dd[live])[0] != 0.5).any() | G_inexact[live].any()
        EP = _sum_rounding(ku + _phantom(ku, q_inexact), q[units].abs().sum()) + Eq[units].sum()
        v = P / n if n > 0 else P * 0
        Ev = v.abs() + EP / n if n > 0 else v * 0
        A0, C0 = (1.0, 0.0) if root is None else root(v, Ev)
        A_q, C_q = A0 / n, (C0 + A0 * _rel(v, Ev)) / n
        step_q = C_q + A_q * _rel(q, Eq)
        A_s, C_s = A_q / Dd, step_q / Dd
        if unit is not None:        # a group's sum passes its cotangent to each of its rows' sums (+1)
            A_s, C_s = A_s[unit], C_s[unit]
    g = torch.zeros(mask.shape, dtype=torch.float64, device=mask.device)
    gA = torch.zeros_like(g) if split else None
    for start in range(0, B, chunk):
        sl = slice(start, start + chunk)
        x, Ex, dx = kept.pop(start)
        A_x, C_x = A_s[sl].unsqueeze(-1), C_s[sl].unsqueeze(-1)
        if dx is None:          # the terms are the differentiable input itself
            gs = (A_x + C_x).expand_as(x)
            As = A_x.expand_as(x)
        else:                   # a pass of its own (``_gspo_terms``, ``_sapo_terms``, ``_with_kl``) or dx/dl
            As, Cs = _to_l(dx, x, Ex, A_x.expand_as(x), C_x.expand_as(x))
            gs = As + Cs
        g[sl] = torch.where(mask[sl], gs, torch.zeros_like(gs))
        if split:
            gA[sl] = torch.where(mask[sl], As, torch.zeros_like(As))
    return (v, Ev, g, gA) if split else (v, Ev, g)


# The options the fused-head composite (check_head_loss.py) has none of, each with the value that turns it off
# (the sampler's log-probs and the token entropies are no inputs of a head)
_HEAD_OFF = (("is_level", ("none",)), ("opsm_delta", (None,)), ("entropy_quantile", (None,)))


def _param_off(name: str, off: tuple) -> str:
    """The --param that turns a recipe option off, as a user types it (``beta=0``, ``opsm_delta=null``)."""
    value = off[0]
    return f"--param {name}={'null' if value is None else value if isinstance(value, str) else json.dumps(value)}"


def describe_formulas() -> str:
    """`pgspec check --list`: each formula with an oracle, its title, and what a check of it needs."""
    width = max(len(fid) for fid in ORACLE_FORMULAS)
    return "\n".join(f"{fid:<{width}} {REGISTRY[fid].title}\n{'':<{width}} needs {oracle_needs(fid)}"
                     for fid in ORACLE_FORMULAS)


def oracle_needs(fid: str) -> str:
    """What a check of formula ``fid`` (one of ORACLE_FORMULAS) needs: its arguments and the parameters
    the oracle covers (`pgspec check --list`, and the formula's section of the docs)."""
    f = REGISTRY[fid]
    if fid in VOCAB_FORMULAS:
        return ("--vocab V [--hidden H]: through a linear head of exact logits; parameters temperature > 0, "
                "logit_scale > 0, softcap null")
    if fid.startswith("agg."):
        divisor = " and --param divisor=K (K > 0; divide_by K or K*N)" if fid == "agg.constant" else ""
        return ("--shape BxT" + divisor + "; any of its parameters (global counts, which must cover the batch's, "
                "and epsilons)" + ("; prompt groups b mod 4" if fid == "agg.prompt_mean" else "")
                + (f"; {DOCUMENTS} documents a row" if fid == "agg.document_mean" else ""))
    defaults = {p.name: p.default for p in f.params}
    return ("--shape BxT; "
            + ("is_level none and opsm_delta null (VESPO folds the sampler's ratio into phi, with --sampler: each "
               "row's total log-ratio to the sampler spread as without); " if fid == "loss.vespo" else
               "is_level none and opsm_delta null (the check draws the sampler's log-probs for MiniRL's own weight, "
               "both sides of its cap); " if fid == "loss.minirl" else
               "its IS weight any (level, mode, bounds, clamp); its OPSM any, with an IS weight at the token or "
               "geometric level (a sequence-level weight, a sum over the row, leaves OPSM's row mean no room); ")
            + "its entropy mask any"
            + f"; its KL term (beta, default {defaults['beta']}) any: estimator, clamps, aggregation"
            + ("; aggregation prompt_mean (prompt groups b mod 4) or token_mean"
               if fid in ("loss.dapo", "loss.cispo") else "")
            + ("; ratio_level sequence or token" if fid == "loss.luspo" else "")
            + ("; its cap log_ratio_max any; its per-token clamp log_ratio_clamp any that leaves the rows' mean "
               "log-ratios room (about 1 or more: pairs of each row's tokens are drawn beyond it)"
               if fid == "loss.gspo" else "")
            + ("; with --vocab V [--hidden H] (and its IS weight, OPSM and entropy mask off"
               + (", aggregation token_mean" if fid in ("loss.dapo", "loss.cispo") else "")
               + ") it is checked from hidden states through the adapter's fused head"
               if fid in HEAD_LOSS_FORMULAS else ""))


def oracle_params(formula: str, params: dict, head: bool = False) -> dict:
    """The formula's parameters with defaults, or CheckError where the oracle has no scale for them:
    aggregators at their default parameters (and the global counts and epsilons of AGG_FREE_PARAMS);
    recipes with any IS weight, OPSM (with an IS weight, at the token or geometric level), entropy
    mask and KL term (estimator, clamps, aggregation), VESPO and MiniRL without an IS weight or OPSM;
    with ``head`` (the fused-head composite of check_head_loss.py) no IS weight, OPSM or entropy mask
    (any KL term) and the batch-pooled token mean."""
    if formula not in ORACLE_FORMULAS:
        raise CheckError(f"{formula}: no oracle scale; formulas with one: {', '.join(ORACLE_FORMULAS)}")
    f = REGISTRY[formula]
    p = {q.name: q.default for q in f.params}
    p.update(params)
    if formula.startswith("agg."):
        free = AGG_FREE_PARAMS.get(formula, ())
        for q in f.params:
            if q.name not in free and p[q.name] != q.default:
                raise CheckError(f"{formula}: the oracle scale covers the default parameters only"
                                 f"{' (and any ' + ', '.join(free) + ')' if free else ''} ({q.name}={p[q.name]!r}); "
                                 f"leave {q.name} out")
        return p
    for k, off in _HEAD_OFF if head else ():
        if p.get(k) not in off:
            raise CheckError(f"{formula}: the oracle scale covers the recipe with its options off ({k}={p.get(k)!r}) "
                             f"from hidden states (--vocab); give {_param_off(k, off)}")
    if head and p.get("aggregation", "token_mean") != "token_mean":
        raise CheckError(f"{formula}: from hidden states (--vocab) the oracle scale covers the batch-pooled token mean "
                         f"(the head protocol has no prompt groups; aggregation={p['aggregation']!r}); give "
                         f"--param aggregation=token_mean")
    if formula == "loss.minirl" and (p.get("is_level") != "none" or p.get("opsm_delta") is not None):
        raise CheckError(f"{formula}: the check draws MiniRL's sampler log-probs for its own weight, not off the kinks of "
                         f"an IS weight or OPSM (is_level={p['is_level']!r}, opsm_delta={p['opsm_delta']!r}); give "
                         f"--param is_level=none --param opsm_delta=null")
    if p.get("opsm_delta") is not None and formula == "loss.vespo":
        raise CheckError(f"{formula}: OPSM and VESPO would both read the sampler's log-probs, and OPSM's row means "
                         f"off its delta leave VESPO's folded log-weights at their clips (opsm_delta="
                         f"{p['opsm_delta']!r}); give --param opsm_delta=null (--sampler gives VESPO the sampler's "
                         f"log-probs)")
    if p.get("opsm_delta") is not None and p.get("is_level") == "sequence":
        raise CheckError(f"{formula}: with OPSM the check draws the sampler's log-probs off the kinks of an IS weight at "
                         f"the token or geometric level, not the sequence level, whose log-weight, a sum over the row "
                         f"within reach of its kinks, leaves OPSM's row mean to the old log-probs (opsm_delta="
                         f"{p['opsm_delta']!r}, is_level='sequence'); give --param is_level=token or geometric, or "
                         f"--param opsm_delta=null")
    return p


def oracle_scales(formula: str, tensors: dict, params: dict, chunk: int = 8, El=None, split: bool = False) -> dict:
    """S of every output and gradient element of ``formula`` on float64 ``tensors``: {"value" or
    "loss": scalar tensor, "grad.<input>": [B, T]}.

    For a composite that computes a loss's log-probs l (check_head_loss.py): ``El`` [B, T], the forward
    errors of l (None: l is an exact input), for the token losses of HEAD_LOSS_FORMULAS; ``split``: also
    "A.logprobs", the A part of S(grad.logprobs) (``_aggregate_scales``)."""
    import torch

    p = oracle_params(formula, params)
    with torch.no_grad():
        mask = tensors["mask"]
        if formula == "agg.document_mean":
            Ev, g = _document_mean_scales(tensors["values"].detach(), mask, tensors["document_ids"], p)
            return {"value": Ev, "grad.values": g}
        if formula.startswith("agg."):
            x = tensors["values"].detach()

            def terms(sl):
                xs = torch.where(mask[sl], x[sl], torch.zeros((), dtype=x.dtype, device=x.device))
                return xs, torch.zeros_like(xs), None, torch.zeros_like(mask[sl])   # inputs are exact

            _, Ev, g = _aggregate_scales(formula, terms, mask, chunk, **_aggregation_args(formula, p, tensors))
            return {"value": Ev, "grad.values": g}
        l, old, adv = (tensors[k].detach() for k in ("logprobs", "old_logprobs", "advantages"))
        clamp = p.get("log_ratio_clamp")
        if El is not None and formula not in HEAD_LOSS_FORMULAS:
            raise ValueError(f"{formula}: the oracle takes l as an inner node for {HEAD_LOSS_FORMULAS} only")

        def El_of(sl):
            return None if El is None else El[sl]

        if formula == "loss.sapo":
            def token_terms(sl):
                return _sapo_terms(l[sl], old[sl], adv[sl], mask[sl], p["tau_pos"], p["tau_neg"], clamp, El_of(sl))
        elif formula == "loss.vespo":
            folded = tensors["sampler_logprobs"].detach() if "sampler_logprobs" in tensors else None

            def token_terms(sl):
                return _vespo_terms(l[sl], old[sl], adv[sl], mask[sl], p, El is not None,
                                    None if folded is None else folded[sl])
        elif formula == "loss.gmpo":
            def token_terms(sl):
                return _gmpo_terms(l[sl], old[sl], adv[sl], mask[sl], p["eps_low"], p["eps_high"])
        elif formula == "loss.minirl":
            sampler_l = tensors["sampler_logprobs"].detach()

            def token_terms(sl):
                return _minirl_terms(l[sl], old[sl], sampler_l[sl], adv[sl], mask[sl], p)
        elif _sequence_level(formula, p):
            def token_terms(sl):
                return _gspo_terms(l[sl], old[sl], adv[sl], mask[sl], p["eps_low"], p["eps_high"], p.get("log_ratio_max"),
                                   El_of(sl), p.get("log_ratio_clamp"))
        elif formula == "loss.cispo":
            def token_terms(sl):
                return _cispo_terms(l[sl], old[sl], adv[sl], mask[sl], p["cap_form"], p["eps_low"], p["eps_high"],
                                    clamp)
        else:
            eps_low, eps_high = float(p["eps_low"]), float(p["eps_high"])

            def token_terms(sl):
                return _ppo_terms(l[sl], old[sl], adv[sl], mask[sl], eps_low, eps_high, clamp)
        if El is not None and formula != "loss.sapo" and not _sequence_level(formula, p):
            exact_l = token_terms

            def token_terms(sl):        # l enters each term node (PPO's, CISPO's and VESPO's x) by its one edge dx/dl
                x, Ex, dx = exact_l(sl)
                return x, Ex + dx.abs() * El[sl], dx

        # the recipe's factor: OPSM's and the entropy mask's 0, else sg[w^IS]
        sampler = tensors["sampler_logprobs"].detach() if "sampler_logprobs" in tensors else None
        weights = is_weights(old, sampler, mask, p) if p["is_level"] != "none" else None
        keep = torch.ones_like(mask)
        if p["opsm_delta"] is not None:
            keep &= opsm_keep(l, sampler, adv, mask, p)
        if p["entropy_quantile"] is not None:
            keep &= entropy_keep(tensors["entropy"].detach(), mask, p["entropy_quantile"])
        if weights is not None or not keep.all():
            unweighted = token_terms

            def token_terms(sl):
                return _weighted(unweighted(sl), None if weights is None else tuple(t[sl] for t in weights),
                                 keep[sl], mask[sl])

        beta = float(p["beta"])
        ref = tensors["ref_logprobs"].detach() if beta else None
        kind = LOSS_AGGREGATION.get(formula) or f"agg.{p['aggregation']}"
        args = _aggregation_args(kind, p, tensors)

        def policy(sl):
            got = token_terms(sl)
            return got if len(got) >= 4 else (*got, got[0] != 0)

        def kl(sl):
            return _kl_terms(l[sl], old[sl], ref[sl], mask[sl], p, El_of(sl))

        def scales(Ev, g, gA=None):
            return {"loss": Ev, "grad.logprobs": g, **({"A.logprobs": gA} if split else {})}

        if not beta:
            return scales(*_aggregate_scales(kind, policy, mask, chunk, split, **args)[1:])
        if p["kl_aggregation"] == "policy":         # term = pg + kl beta, with the recipe's aggregator
            def terms(sl):
                return _with_kl(token_terms(sl), kl(sl), mask[sl], beta)

            return scales(*_aggregate_scales(kind, terms, mask, chunk, split, **args)[1:])
        # separately: loss = Agg(pg) + agg.<kl_aggregation>(kl) beta, a product node (the edge beta) and
        # a sum (edges of +1): the policy's aggregate receives (1, 0), the KL's (beta, rel(kl beta) beta)
        vp, Ep, gp, *Ap = _aggregate_scales(kind, policy, mask, chunk, split, **args)
        product = {}

        def root(v, Ev):
            kb = v * beta
            product.update(value=kb, error=kb.abs() + beta * Ev)
            return beta, _rel(kb, product["error"]) * beta

        def kl_terms(sl):
            y, Ey, back, exact = kl(sl)
            return y, Ey, back, ~exact

        _, _, gk, *Ak = _aggregate_scales(f"agg.{p['kl_aggregation']}", kl_terms, mask, chunk, split, root=root)
        return scales((vp + product["value"]).abs() + Ep + product["error"], gp + gk, Ap[0] + Ak[0] if split else None)


def _aggregation_args(kind: str, p: dict, tensors: dict) -> dict:
    """What ``_aggregate_scales`` needs beyond the terms for aggregator ``kind`` under parameters ``p``
    (an agg.* formula's, or the loss's that aggregates with it, whose aggregator takes its defaults),
    as reference.agg computes its denominators (a loss's parameters share no name with its aggregator's
    but divisor and divide_by, so p.get gives the aggregator's defaults): agg.token_mean's N_tok (num_tokens or the token count)
    + eps; agg.seq_mean_token_sum's N and agg.constant's K or K N (N: num_sequences, or B when
    count_empty_sequences, true in the recipes, else the non-empty rows); agg.sample_mean's D_i
    (sequence_token_counts or L_i), eps_length and N (num_sequences or the rows with D_i > 0, B when
    count_empty_sequences) + eps_count; agg.prompt_mean's group ids, D_g (group_token_counts or the
    group's tokens) and its divisor (num_groups or the groups with D_g > 0, all of them when
    count_empty_groups; with step_divisor 'sequences', num_sequences or B)."""
    import torch

    mask = tensors["mask"]
    B = mask.shape[0]
    L = mask.sum(-1)

    def sequences(count_empty):
        given = p.get("num_sequences")
        return given if given is not None else B if count_empty else int((L > 0).sum())

    if kind == "agg.token_mean":
        n_tok = p.get("num_tokens")
        return {"divisor": (int(L.sum()) if n_tok is None else n_tok) + float(p.get("eps", 0))}
    if kind == "agg.seq_mean_token_sum":
        return {"divisor": sequences(p.get("count_empty_sequences", False))}
    if kind == "agg.constant":
        k = float(p["divisor"])
        return {"divisor": k * sequences(p.get("count_empty_sequences", True)) if p["divide_by"] == "K*N" else k}
    if kind == "agg.sample_mean":
        given = p.get("sequence_token_counts")
        D = L.double() if given is None else torch.as_tensor(given, dtype=torch.float64, device=mask.device)
        n = p.get("num_sequences")
        if n is None:
            n = B if p.get("count_empty_sequences", False) else int((D > 0).sum())
        return {"counts": D, "eps_length": float(p.get("eps_length", 0)), "n": n + float(p.get("eps_count", 0))}
    if kind == "agg.prompt_mean":
        if "group_ids" not in tensors:
            raise CheckError("the prompt_mean aggregation needs the input 'group_ids' (the prompt group of each "
                             "sequence, [B])")
        groups = tensors["group_ids"]
        _, unit = torch.unique(groups, return_inverse=True)
        n_units = int(unit.max()) + 1 if B else 0
        local = torch.zeros(n_units, dtype=torch.float64, device=mask.device).index_add_(0, unit, L.double())
        given = p.get("group_token_counts")
        D_row = local[unit] if given is None else torch.as_tensor(given, dtype=torch.float64, device=mask.device)
        D = torch.zeros(n_units, dtype=torch.float64, device=mask.device).index_copy_(0, unit, D_row)
        if p.get("step_divisor", "groups") == "sequences":
            n = p.get("num_sequences")
            n = B if n is None else n
        else:
            n = p.get("num_groups")
            if n is None:
                n = n_units if p.get("count_empty_groups", False) else int((D > 0).sum())
        return {"groups": groups, "counts": D_row, "n": n}
    return {}


def oracle(formula: str, arrays: dict, params: dict, device: str = "cpu", chunk: int = 8):
    """(outputs, gradients, scales) of the float64 oracle on numpy ``arrays``."""
    from ..run import runner

    from pgspec.reference import SpecError

    torch_adapter = runner.load_adapter("torch")
    tensors = to_tensors(formula, arrays, "float64", device)
    try:
        out, grads = compare.call(torch_adapter, formula, tensors, params)
    except SpecError as e:          # a parameter the batch contradicts (a global count below the batch's)
        raise CheckError(f"--param: {e}") from None
    return out, grads, oracle_scales(formula, tensors, params, chunk)


# ------------------------------------------------------------------------------------------------
# The check
# ------------------------------------------------------------------------------------------------
def _judge(name, got, ref, scale, mask, family, dtype) -> OutputCheck:
    """Every element (unmasked ones for per-token results) of ``got`` against the oracle's value
    with bound K u(dtype) S + floor(dtype) + K u(float64) S (the oracle's own error)."""
    g = got.detach().to("cpu").double().numpy().reshape(-1) if hasattr(got, "detach") else np.asarray(got, float).reshape(-1)
    r = ref.detach().to("cpu").double().numpy().reshape(-1)
    s = scale.detach().to("cpu").double().numpy().reshape(-1)
    sel = np.ones(r.shape, dtype=bool) if mask is None or r.size != mask.size else mask.reshape(-1)
    if g.shape != r.shape:
        return OutputCheck(name, int(sel.sum()), int(sel.sum()), math.inf, None,
                           {"message": f"shape {tuple(got.shape)}, oracle {tuple(ref.shape)}"})
    K = tolerance.K[family]
    bound = K * float(tolerance.UNIT_ROUNDOFF[dtype]) * s + float(tolerance.FLOOR[dtype]) + K * U64 * s
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(g - r)
        err = np.where(np.isnan(g) | np.isinf(g), np.inf, err)
        ratio = np.where(sel, err / bound, 0.0)
    bad = np.flatnonzero(sel & ~(err <= bound))
    worst = int(np.argmax(ratio)) if ratio.size else 0
    out = OutputCheck(name, int(sel.sum()), int(bad.size), float(ratio[worst]) if ratio.size else 0.0,
                      _unravel(worst, got))
    if bad.size:
        k = int(bad[0])
        out.first_failure = {"index": _unravel(k, got), "got": float(g[k]), "oracle": float(r[k]),
                             "error": float(err[k]), "bound": float(bound[k])}
    return out


def _unravel(k, t):
    shape = tuple(t.shape) if hasattr(t, "shape") else ()
    return [int(i) for i in np.unravel_index(k, shape)] if shape else []


def _count(name: str, value, least: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise CheckError(f"{name} must be an integer >= {least}, got {value!r}")


def check_arguments(formula: str, B: int, T: int, dtypes=("float32",), device: str = "cpu", seed: int = 0,
                    params: dict | None = None, chunk: int = 8, vocab: int | None = None,
                    hidden: int | None = None, sampler: bool = False) -> None:
    """CheckError naming the argument, before any work, for every argument of ``run_checks`` that
    is out of its range: the shape, the dtypes, the device, the seed, the chunk, the formula and its
    parameters (the reference's own rules, then what the oracle's scale covers), --vocab, --hidden
    and --sampler."""
    _count("--shape B", B)
    _count("--shape T", T)
    if isinstance(dtypes, str) or not dtypes or any(d not in tolerance.DTYPES for d in dtypes):
        raise CheckError(f"dtypes: a non-empty list, each one of {', '.join(tolerance.DTYPES)}; got {dtypes!r}")
    if device not in ("cpu", "cuda"):
        raise CheckError(f"--device must be cpu or cuda, got {device!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise CheckError(f"--seed must be an integer (taken mod 2^64), got {seed!r}")
    _count("--chunk", chunk)
    if formula not in REGISTRY:
        from ..base.suggest import did_you_mean

        raise CheckError(f"unknown formula {formula!r}; formulas with an oracle: {', '.join(ORACLE_FORMULAS)} "
                         f"(`pgspec check --list`){did_you_mean(str(formula), ORACLE_FORMULAS)}")
    if formula not in ORACLE_FORMULAS:
        raise CheckError(f"{formula}: no oracle scale; formulas with one: {', '.join(ORACLE_FORMULAS)}")
    if params is not None and not isinstance(params, dict):
        raise CheckError(f"params must be a dict of parameter name -> value, got {type(params).__name__}")
    if sampler and formula != "loss.vespo":
        raise CheckError(f"--sampler applies to loss.vespo only, which folds the sampler's log-probs into phi; a check "
                         f"of {formula} gets them where its options read them (an IS weight, OPSM)")
    if formula in VOCAB_FORMULAS:
        if vocab is None:
            raise CheckError(f"{formula} needs --vocab V (the vocabulary size of the linear head)")
        from . import logprob as lp

        lp.check_params(dict(params or {}))
    else:
        from pgspec.adapters.torch._validate import check_parameters   # the oracle's: names, ranges, order
        from pgspec.reference import SpecError

        try:
            check_parameters(formula, dict(params or {}))
        except SpecError as e:
            raise CheckError(f"--param: {e}") from None
        if hidden is not None and vocab is None:
            raise CheckError(f"--hidden is the width of the linear head of a check with --vocab; {formula} "
                             f"without --vocab takes no head" if formula in HEAD_LOSS_FORMULAS else
                             f"--hidden applies to {', '.join(VOCAB_FORMULAS + HEAD_LOSS_FORMULAS)} (with --vocab) "
                             f"only, not to {formula}")
        if vocab is not None and formula not in HEAD_LOSS_FORMULAS:
            raise CheckError(f"--vocab applies to {', '.join(VOCAB_FORMULAS + HEAD_LOSS_FORMULAS)} only, "
                             f"not to {formula}")
        oracle_params(formula, dict(params or {}), head=vocab is not None)
        if formula.startswith("loss."):     # the recipe's own rules across its options (IS bounds, ...)
            from pgspec.reference import evaluate

            try:
                tiny = check_inputs(formula, 1, 2, 0, dict(params or {}), sampler)
                evaluate(formula, {k: v.tolist() for k, v in tiny.items()}, dict(params or {}))
            except SpecError as e:
                raise CheckError(f"--param: {e}") from None
    if vocab is not None:
        _count("--vocab", vocab, 2)
        if hidden is not None:
            _count("--hidden", hidden)


def run_check(adapter, formula: str, B: int, T: int, dtype: str = "float32", device: str = "cpu", seed: int = 0,
              params: dict | None = None, chunk: int = 8, vocab: int | None = None,
              hidden: int | None = None, sampler: bool = False) -> CheckResult:
    """The check of ``formula`` at [B, T] for ``adapter`` in ``dtype`` (``run_checks`` for one dtype)."""
    return run_checks(adapter, formula, B, T, [dtype], device, seed, params, chunk, vocab, hidden, sampler)[0]


def run_checks(adapter, formula: str, B: int, T: int, dtypes=("float32",), device: str = "cpu", seed: int = 0,
               params: dict | None = None, chunk: int = 8, vocab: int | None = None,
               hidden: int | None = None, sampler: bool = False) -> list[CheckResult]:
    """One CheckResult per dtype of ``dtypes``, in order.  The oracle does not depend on the
    adapter's dtype (float64 on the same seeded inputs): it is evaluated once for all of them, and
    each result's ``oracle_seconds`` is that one evaluation's time.  ``sampler``: give loss.vespo the
    sampler's log-probs, which it folds into phi (``check_inputs``)."""
    import torch

    check_arguments(formula, B, T, dtypes, device, seed, params, chunk, vocab, hidden, sampler)
    from ..run.runner import ADAPTER_ATTRIBUTES

    lacking = [a for a in ADAPTER_ATTRIBUTES if not hasattr(adapter, a)]
    if lacking:
        raise CheckError(f"adapter: an adapter (pgspec.adapters.base.Adapter, e.g. runner.load_adapter('torch')), "
                         f"got {type(adapter).__name__}, which lacks {', '.join(lacking)}")
    ok, why = adapter.available()
    if not ok:
        raise CheckError(f"adapter {adapter.name!r} is not available here: {why}")
    if formula in VOCAB_FORMULAS:
        return run_logprob_checks(adapter, B, T, vocab, hidden, list(dtypes), device, seed, dict(params or {}))
    if formula in HEAD_LOSS_FORMULAS and vocab is not None:
        return run_head_loss_checks(adapter, formula, B, T, vocab, hidden, list(dtypes), device, seed,
                                    dict(params or {}), chunk, sampler)
    if device == "cuda" and not torch.cuda.is_available():
        raise CheckError("--device cuda: no CUDA device is available")
    params = dict(params or {})
    results = [CheckResult(adapter.name, formula, dtype, device, [B, T], seed, "pass") for dtype in dtypes]
    todo = []
    for res in results:
        if formula not in adapter.capabilities() or res.dtype not in adapter.dtypes:
            res.outcome, res.message = "unsupported", f"{adapter.name} does not implement {formula} in {res.dtype}"
        else:
            todo.append(res)
    if not todo:
        return results
    arrays = check_inputs(formula, B, T, seed, params, sampler)
    t = time.perf_counter()
    ref_out, ref_grads, scales = oracle(formula, arrays, params, device, chunk)
    seconds = time.perf_counter() - t
    found = cb.branches(formula, arrays, params)
    for res in todo:
        res.branches, res.unreached = [b.to_json() for b in found], cb.unreached(found)
        res.oracle_seconds = seconds
        _check_one(adapter, res, formula, arrays, params, ref_out, ref_grads, scales)
        _classify(adapter, res, formula, params, arrays, seed)
    return results


def _classify(adapter, res, formula, params, arrays, seed) -> None:
    """The adapter's declarations applied to a check as ``pgspec run`` applies them to a case
    (runner.classify, spec/verdicts.md): the first rule whose IDs match the formula, whose dtypes
    hold the check's and whose conditions hold for its parameters and inputs turns a ``fail`` (or an
    ``error``, for a rule that expects one) into the rule's kind, a known bug or a convention, with
    the rule's reason and link; a check that passes records the rule it did not show."""
    from ..run.runner import classify, declarations_of

    decl = declarations_of(adapter)
    case_id = f"{formula}/check-{res.shape[0]}x{res.shape[1]}-seed{seed}-" + json.dumps(params, sort_keys=True)
    rules = [d for d in decl.rules if d.matches_id(case_id, formula) and (not d.dtypes or res.dtype in d.dtypes)]
    if not rules or res.outcome not in ("pass", "fail", "error"):
        return
    case = {"id": case_id, "formula": formula, "params": params, "category": "check"}
    if any(d.inputs for d in rules):
        # the predicates read the formula's inputs as a golden case's (nested lists), decoded already (a
        # check through a head has the head's arrays instead: hidden states and weights are no input)
        names = {i.name for i in REGISTRY[formula].inputs}
        case["$input_values"] = {k: np.asarray(v).tolist() for k, v in arrays.items() if k in names}
    found = decl.rules_for(case_id, formula, res.dtype, case)
    if found:
        classify(res, found)        # a CheckResult has what it sets: outcome, message, declaration


def _check_one(adapter, res, formula, arrays, params, ref_out, ref_grads, scales) -> None:
    """The adapter's call in ``res.dtype`` judged against the oracle's outputs, into ``res``."""
    dtype, device = res.dtype, res.device
    try:
        tensors = to_tensors(formula, arrays, dtype, device)
    except Exception as e:  # noqa: BLE001 - the adapter's dtype or device cannot hold the inputs
        res.outcome, res.message = "error", f"{type(e).__name__}: {e}"
        return
    got = _timed_adapter_call(res, device, lambda: compare.call(adapter, formula, tensors, params))
    if got is None:
        return
    out, grads = got
    f = REGISTRY[formula]
    mask = arrays.get("mask")
    for name in [o.name for o in f.outputs]:
        if f"{name}" not in scales or name not in out:
            continue
        res.outputs.append(_judge(name, out[name], ref_out[name], scales[name], None, f.family, dtype))
    for name, g in ref_grads.items():
        if name not in grads:
            res.outcome, res.message = "error", f"the adapter returned no gradient for {name!r}"
            return
        res.outputs.append(_judge(f"grad.{name}", grads[name], g, scales[f"grad.{name}"], mask, f.family, dtype))
    _conclude(res)


def _conclude(res) -> None:
    if any(o.failures for o in res.outputs):
        res.outcome = "fail"
        o = next(o for o in res.outputs if o.failures)
        res.message = f"{o.output}: {o.failures} of {o.compared} elements out of bound; {_first(o.first_failure)}"


def _first(f: dict | None) -> str:
    """The first element out of bound, to read: where, the adapter's value, the oracle's, the error
    against its bound (the JSON result has the same fields as numbers)."""
    if not f:
        return "no element compared"
    if "message" in f:
        return f["message"]
    where = "[" + ", ".join(map(str, f["index"])) + "]"
    ratio = f["error"] / f["bound"] if f["bound"] > 0 else math.inf
    return (f"first at {where}: got {f['got']!r}, oracle {f['oracle']!r}, error {f['error']:.3g} > bound "
            f"{f['bound']:.3g} ({ratio:.3g} x)")


# ------------------------------------------------------------------------------------------------
# Log-probs at production vocabulary size (check_logprob.py)
# ------------------------------------------------------------------------------------------------
class _Judge:
    """An OutputCheck accumulated chunk by chunk (tensors on any device)."""

    def __init__(self, name, family, dtype, shape):
        self.out = OutputCheck(name, 0, 0, 0.0)
        self.K = tolerance.K[family]
        self.u = float(tolerance.UNIT_ROUNDOFF[dtype])
        self.floor = float(tolerance.FLOOR[dtype])
        self.shape = shape

    def add(self, offset, got, ref, scale, sel):
        import torch

        g = got.double().reshape(ref.shape)
        bound = self.K * self.u * scale + self.floor + self.K * U64 * scale
        err = (g - ref).abs()
        err = torch.where(torch.isfinite(g), err, torch.full_like(err, math.inf))
        sel = sel.reshape(ref.shape[:1] + (1,) * (ref.dim() - 1)).expand_as(ref)
        ratio = torch.where(sel, err / bound, torch.zeros_like(err))
        bad = sel & ~(err <= bound)
        self.out.compared += int(sel.sum())
        nbad = int(bad.sum())
        flat = ratio.reshape(-1)
        if flat.numel():
            k = int(torch.argmax(flat))
            if float(flat[k]) > self.out.worst_ratio or self.out.worst_index is None:
                self.out.worst_ratio = float(flat[k])
                self.out.worst_index = self._index(offset, k, ref.shape)
        if nbad and self.out.first_failure is None:
            k = int(torch.nonzero(bad.reshape(-1))[0])
            self.out.first_failure = {"index": self._index(offset, k, ref.shape), "got": float(g.reshape(-1)[k]),
                                      "oracle": float(ref.reshape(-1)[k]), "error": float(err.reshape(-1)[k]),
                                      "bound": float(bound.reshape(-1)[k])}
        self.out.failures += nbad

    def _index(self, offset, k, chunk_shape):
        inner = int(np.prod(chunk_shape[1:])) if len(chunk_shape) > 1 else 1
        pos, rest = offset + k // inner, k % inner
        idx = [pos // self.shape[1], pos % self.shape[1]]
        return idx + ([rest] if len(chunk_shape) > 1 else [])


def _timed_adapter_call(res, device, work):
    """work()'s result, its wall time (the device synchronized) in res.adapter_seconds; None, with
    res an "unsupported" outcome when the adapter declines (properties.Unsupported), an "error" outcome when
    it raises anything else (its crash is an outcome, not a pgspec error)."""
    import torch

    from pgspec.adapters.base import Unsupported

    try:
        t = time.perf_counter()
        got = work()
        if device == "cuda":
            torch.cuda.synchronize()
        res.adapter_seconds = time.perf_counter() - t
        return got
    except Unsupported as e:      # the adapter declines these parameters (a head with no logit_scale, say)
        res.outcome, res.message = "unsupported", f"{res.adapter} does not support this: {e}"
        return None
    except Exception as e:  # noqa: BLE001 - the adapter's crash is an outcome
        res.outcome, res.message = "error", f"{type(e).__name__}: {e}"
        return None


def _seeded_head(B, T, V, H, device, seed):
    """(H, check_logprob.seeded_head's arrays) for a check through a linear head (H None: the default
    width), or CheckError for a bad size or a CUDA device that is not there."""
    import torch

    from . import logprob as lp

    H = lp.DEFAULT_HIDDEN if H is None else H
    if device == "cuda" and not torch.cuda.is_available():
        raise CheckError("--device cuda: no CUDA device is available")
    try:
        return H, lp.seeded_head(B, T, V, H, seed)
    except ValueError as e:
        raise CheckError(str(e)) from None


def run_logprob_checks(adapter, B, T, V, H, dtypes, device, seed, params) -> list[CheckResult]:
    """``logprob.token`` at [B, T] positions over a vocabulary of V through a linear head of width H,
    one CheckResult per dtype: the adapter's results in every dtype are kept (on their device), then
    judged together in one pass of the oracle over the positions."""
    import torch

    from . import logprob as lp

    p = lp.check_params(params)
    H, arrays = _seeded_head(B, T, V, H, device, seed)
    head = getattr(adapter, "heads", {}).get(lp.FORMULA)
    y = torch.as_tensor(arrays["targets"], device=device)
    m = torch.as_tensor(arrays["mask"], device=device)
    results, judged = [], []
    for dtype in dtypes:
        res = CheckResult(adapter.name, lp.FORMULA, dtype, device, [B, T], seed, "pass", vocab=V, hidden=H)
        results.append(res)
        if dtype not in adapter.dtypes or (head is None and lp.FORMULA not in adapter.capabilities()):
            res.outcome, res.message = "unsupported", f"{adapter.name} does not implement {lp.FORMULA} in {dtype}"
            continue
        res.path = "head" if head is not None else "logits"
        got = _timed_adapter_call(res, device, _logprob_work(adapter, head, arrays, y, m, p, dtype, device))
        if got is None:
            continue
        got_lp, got_gx = got
        if tuple(got_lp.shape) != (B, T) or tuple(got_gx.shape) != (B, T, H):
            res.outcome = "error"
            res.message = f"shapes: logprobs {tuple(got_lp.shape)} (expected {(B, T)}), grad.hidden " \
                          f"{tuple(got_gx.shape)} (expected {(B, T, H)})"
            continue
        judged.append((res, got_lp.detach().reshape(-1), got_gx.detach().reshape(B * T, H),
                       _Judge("logprobs", "logprob", dtype, (B, T)), _Judge("grad.hidden", "logprob", dtype, (B, T))))
        del got, got_lp, got_gx
    if not judged:
        return results
    mflat = m.reshape(-1)
    t = time.perf_counter()
    for sl, ref_lp, El, ref_gx, SX in lp.oracle_chunks(arrays, p, device):
        for _, got_lp, got_gx, j_lp, j_gx in judged:
            j_lp.add(sl.start, got_lp[sl], ref_lp, El, mflat[sl])
            # the gradient is compared at every position: 0 (exactly) where the mask is false
            j_gx.add(sl.start, got_gx[sl], ref_gx, SX, torch.ones_like(mflat[sl]))
    seconds = time.perf_counter() - t
    for res, _, _, j_lp, j_gx in judged:
        res.oracle_seconds = seconds
        res.outputs = [j_lp.out, j_gx.out]
        _conclude(res)
        _classify(adapter, res, lp.FORMULA, params, arrays, seed)
    return results


def run_head_loss_checks(adapter, formula, B, T, V, H, dtypes, device, seed, params, chunk=8,
                         sampler: bool = False) -> list[CheckResult]:
    """A token loss (check_head_loss.FORMULAS) from hidden states [B, T, H] and an LM head [V, H]
    (check_head_loss.py), one CheckResult per dtype: the float64 oracle first (the old log-probs are
    drawn around its log-probs), then the adapter's head (``adapter.heads[formula]``) in each dtype,
    judged on the loss and on every element of the gradient with respect to the hidden states."""
    import torch

    from . import head_loss as hl

    p = oracle_params(formula, params, head=True)
    H, arrays = _seeded_head(B, T, V, H, device, seed)
    head = getattr(adapter, "heads", {}).get(formula)
    kl = bool(float(p["beta"]))
    results = []
    for dtype in dtypes:
        res = CheckResult(adapter.name, formula, dtype, device, [B, T], seed, "pass", vocab=V, hidden=H, path="head")
        results.append(res)
        lacks = [k for k, wanted in (("ref_logprobs", kl), ("sampler_logprobs", sampler))
                 if wanted and head is not None and not hl.takes_keyword(head, k)]
        if head is None or dtype not in adapter.dtypes or lacks:
            res.outcome = "unsupported"
            res.message = (f"{adapter.name} has no fused head for {formula} (adapter.heads[{formula!r}], "
                           f"conformance/check/head_loss.py HEAD_PROTOCOL)" if head is None else
                           f"{adapter.name} does not run in {dtype}" if dtype not in adapter.dtypes else
                           f"{adapter.name}'s fused head for {formula} takes no ref_logprobs: it has no KL term "
                           f"(beta={p['beta']}; conformance/check/head_loss.py HEAD_PROTOCOL)" if lacks[0] == "ref_logprobs"
                           else f"{adapter.name}'s fused head for {formula} takes no sampler_logprobs: it folds none "
                           f"into phi (--sampler; conformance/check/head_loss.py HEAD_PROTOCOL)")
    if not any(r.outcome == "pass" for r in results):
        return results
    adv = seeded_inputs(formula, B, T, seed)["advantages"]
    t = time.perf_counter()
    ref = hl.oracle(arrays, adv, p, device, seed, chunk=chunk, formula=formula, sampler=True if sampler else None)
    seconds = time.perf_counter() - t
    y = torch.as_tensor(arrays["targets"], device=device)
    m = torch.as_tensor(arrays["mask"], device=device)
    N = B * T
    family = REGISTRY[formula].family
    found = cb.branches(formula, {"mask": arrays["mask"], **{k: ref[k].cpu().numpy() for k in (
        "logprobs", "old_logprobs", "advantages", "ref_logprobs", "sampler_logprobs") if k in ref}}, p)
    for res in results:
        if res.outcome != "pass":
            continue
        res.oracle_seconds = seconds
        res.branches, res.unreached = [b.to_json() for b in found], cb.unreached(found)
        tdtype = getattr(torch, compare.TORCH_DTYPES[res.dtype])
        X = torch.as_tensor(arrays["hidden"], device=device).to(tdtype)
        W = torch.as_tensor(arrays["weight"], device=device).to(tdtype)
        side = getattr(torch, compare.TORCH_DTYPES[hl.side_dtype(res.dtype)])
        old, adv_t = ref["old_logprobs"].to(side), ref["advantages"].to(side)        # exact (float32 values)
        extra = {k: ref[k].to(side) for k in ("ref_logprobs", "sampler_logprobs") if k in ref}  # exact (bfloat16 values)

        def work():
            out = head(X, W, y, m, old, adv_t, dict(p), **extra)
            return out["loss"], out["grad"]["hidden"]

        got = _timed_adapter_call(res, device, work)
        if got is None:
            continue
        loss, gx = got
        if loss.numel() != 1 or tuple(gx.shape) != (B, T, H):
            res.outcome = "error"
            res.message = f"shapes: loss {tuple(loss.shape)} (expected a scalar), grad.hidden {tuple(gx.shape)} " \
                          f"(expected {(B, T, H)})"
            continue
        j_loss, j_gx = _Judge("loss", family, res.dtype, (B, T)), _Judge("grad.hidden", family, res.dtype, (B, T))
        one = torch.ones(1, dtype=torch.bool, device=device)
        j_loss.add(0, loss.detach().reshape(1), ref["loss"].reshape(1), ref["E(loss)"].reshape(1), one)
        gx = gx.detach().reshape(N, H)
        rows = max(1, (1 << 24) // H)            # the judge's float64 temporaries: a slice of rows at a time
        for start in range(0, N, rows):
            sl = slice(start, min(N, start + rows))
            # the gradient is compared at every position: 0 (exactly) where the mask is false
            j_gx.add(start, gx[sl], ref["grad.hidden"][sl], ref["S(grad.hidden)"][sl],
                     torch.ones(sl.stop - sl.start, dtype=torch.bool, device=device))
        res.outputs = [j_loss.out, j_gx.out]
        _conclude(res)
        _classify(adapter, res, formula, params, arrays, seed)
    return results


def _logprob_work(adapter, head, arrays, y, m, p, dtype, device):
    """The adapter's call in ``dtype``: (log-probs [B, T], gradient wrt the hidden states [B, T, H])."""
    import torch

    from . import logprob as lp

    tdtype = getattr(torch, compare.TORCH_DTYPES[dtype])
    X = torch.as_tensor(arrays["hidden"], device=device).to(tdtype)
    W = torch.as_tensor(arrays["weight"], device=device).to(tdtype)

    def work():
        if head is not None:
            out = head(X, W, y, m, dict(p))
            return out["logprobs"], out["grad"]["hidden"]
        Xg = X.detach().requires_grad_(True)
        with torch.enable_grad():
            o = adapter.call(lp.FORMULA, {"logits": Xg @ W.T, "targets": y, "mask": m}, dict(p))
            (gx,) = torch.autograd.grad(compare.objective(o["logprobs"], m), [Xg])
        return o["logprobs"], gx

    return work
