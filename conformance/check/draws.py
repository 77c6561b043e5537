"""The check's inputs: seeded draws of shape [B, T] (``pgspec-splitmix64/1``) and the log-ratios,
reference, sampler and entropy inputs drawn off every kink of the formula (a clip's log-bounds, a KL
clamp, an IS bound, OPSM's delta, the entropy quantile), so that no decision is left to rounding."""

from __future__ import annotations

import math

import numpy as np

from pgspec.reference import REGISTRY

from ..judge import compare
from ..corpus.generator import generate_arrays
from .common import CheckError, TOKEN_LOSSES


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
    return _bfloat16_at(mask, l - draw_log_ratios(l.shape, seed, *clip_kinks(params)))


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


def kl_branch(x, w, p: dict):
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
        here = kl_branch(xr, w, p)
        near = mask & ((kl_branch(xr - INSIDE, w, p) != here) | (kl_branch(xr + INSIDE, w, p) != here))
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


def is_branch(u, p: dict):
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
        here = is_branch(actual, p)
        near = (is_branch(actual - INSIDE, p) != here) | (is_branch(actual + INSIDE, p) != here)
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
        here = is_branch(u, p)
        return (is_branch(u - INSIDE, p) != here) | (is_branch(u + INSIDE, p) != here)

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


def sequence_level(formula: str, p: dict) -> bool:
    """Whether the loss clips a sequence ratio (GSPO's term; LUSPO's at ratio_level 'sequence')."""
    return formula == "loss.gspo" or formula == "loss.luspo" and p["ratio_level"] == "sequence"


def clip_kinks(params: dict) -> tuple:
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
    if sequence_level(formula, p):
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
