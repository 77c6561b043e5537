"""The regime catalogue of ``regimes.py`` (``pgspec golden coverage``), as data: for each formula its
regimes, each with its kind, the spec section it comes from, the predicate in words and the
predicate itself, a function of a ``regimes.View`` of one case.  Kinds and rules: regimes.py's
docstring and spec/golden-format.md, "Regime coverage"."""

from __future__ import annotations

import math
import struct

from mpmath import mp, mpf

from dataclasses import dataclass, field
from typing import Callable


def _rows_of(tokens):
    rows: dict = {}
    for k in tokens:
        rows.setdefault(k.i, []).append(k.d)
    return rows


def _any(items, pred):
    return any(pred(x) for x in items)


# Regimes -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Regime:
    formula: str
    name: str
    kind: str                      # equality | branch | order | option | float64
    where: str                     # spec section
    text: str                      # the predicate in words
    test: Callable = field(compare=False, repr=False)
    recipe: bool = True            # False: immaterial in a recipe (text says why)

    @property
    def key(self):
        return f"{self.formula}: {self.name}"



def _sec(page, fid):
    return f"spec/{page}.md, {fid}"


def _ppo_regimes(fid, page="surrogate", clamp=True, lo_name="eps_low", hi_name="eps_high"):
    """The PPO clip's regimes on tokens (r, A): each side at equality with the sign that makes the
    clipped branch the one chosen beyond it, each side beyond with each sign, and the log-ratio clamp
    composed with the clip in both orders and with both signs."""
    w = _sec(page, fid)

    def lo(v):
        return 1 - v.num(lo_name)

    def hi(v):
        return 1 + v.num(hi_name)

    out = [
        Regime(fid, "r = 1 - eps_low, A < 0", "equality", w,
               "an unmasked token with r = 1 - eps_low exactly and A < 0 (the clip's lower bound at equality, "
               "where below it the clipped branch is chosen)",
               lambda v: _any(v.tokens, lambda k: k.a < 0 and k.r == lo(v))),
        Regime(fid, "r = 1 + eps_high, A > 0", "equality", w,
               "an unmasked token with r = 1 + eps_high exactly and A > 0",
               lambda v: _any(v.tokens, lambda k: k.a > 0 and k.r == hi(v))),
        Regime(fid, "r > 1 + eps_high, A > 0 (clipped)", "branch", w, "a token clipped above",
               lambda v: _any(v.tokens, lambda k: k.a > 0 and k.r > hi(v))),
        Regime(fid, "r > 1 + eps_high, A < 0 (unclipped)", "branch", w, "beyond the upper bound, the unclipped branch",
               lambda v: _any(v.tokens, lambda k: k.a < 0 and k.r > hi(v))),
        Regime(fid, "r < 1 - eps_low, A < 0 (clipped)", "branch", w, "a token clipped below",
               lambda v: _any(v.tokens, lambda k: k.a < 0 and k.r < lo(v))),
        Regime(fid, "r < 1 - eps_low, A > 0 (unclipped)", "branch", w, "below the lower bound, the unclipped branch",
               lambda v: _any(v.tokens, lambda k: k.a > 0 and k.r < lo(v))),
    ]
    if clamp:
        for sign, sname in ((1, "A > 0"), (-1, "A < 0")):
            out += [
                Regime(fid, f"d > c, e^c < 1 + eps_high, {sname}", "order", w,
                       f"the log-ratio clamp binds above, inside the clip band ({sname})",
                       lambda v, s=sign: v.num("log_ratio_clamp") is not None and _any(
                           v.tokens, lambda k: k.a * s > 0 and k.d > k.dc and k.r < hi(v))),
                Regime(fid, f"d > c, e^c > 1 + eps_high, {sname}", "order", w,
                       f"the log-ratio clamp binds above, beyond the clip band ({sname})",
                       lambda v, s=sign: v.num("log_ratio_clamp") is not None and _any(
                           v.tokens, lambda k: k.a * s > 0 and k.d > k.dc and k.r > hi(v))),
                Regime(fid, f"d < -c, e^-c > 1 - eps_low, {sname}", "order", w,
                       f"the log-ratio clamp binds below, inside the clip band ({sname})",
                       lambda v, s=sign: v.num("log_ratio_clamp") is not None and _any(
                           v.tokens, lambda k: k.a * s > 0 and k.d < k.dc and k.r > lo(v))),
                Regime(fid, f"d < -c, e^-c < 1 - eps_low, {sname}", "order", w,
                       f"the log-ratio clamp binds below, beyond the clip band ({sname})",
                       lambda v, s=sign: v.num("log_ratio_clamp") is not None and _any(
                           v.tokens, lambda k: k.a * s > 0 and k.d < k.dc and k.r < lo(v))),
            ]
    return out


def _clamp_equality(fid, page, tokens="tokens", name="log_ratio_clamp", gated=True):
    w = _sec(page, fid)
    nz = (lambda k: k.a is not None and k.a != 0) if gated else (lambda k: True)
    extra = ", A != 0" if gated else ""
    return [
        Regime(fid, f"d = c{extra}", "equality", w, f"a token log-ratio exactly at the clamp {name} (derivative 1 there)",
               lambda v: v.num(name) is not None and _any(getattr(v, tokens), lambda k: nz(k) and k.d == v.num(name))),
        Regime(fid, f"d = -c{extra}", "equality", w, f"a token log-ratio exactly at -{name}",
               lambda v: v.num(name) is not None and _any(getattr(v, tokens), lambda k: nz(k) and k.d == -v.num(name))),
    ]


def _surrogate():
    out = []
    out += _clamp_equality("surrogate.pg", "surrogate")
    out += _ppo_regimes("surrogate.ppo_clip") + _clamp_equality("surrogate.ppo_clip", "surrogate")
    fid = "surrogate.dual_clip"
    w = _sec("surrogate", fid)
    out += _ppo_regimes(fid)
    out += [
        Regime(fid, "A < 0, r > c > 1 + eps_high", "order", w, "the dual cap binds beyond the clip band",
               lambda v: v.num("c") > 1 + v.num("eps_high") and _any(v.tokens, lambda k: k.a < 0 and k.r > v.num("c"))),
        Regime(fid, "A < 0, c < r <= 1 + eps_high", "order", w,
               "the dual cap binds inside the clip band (c < 1 + eps_high)",
               lambda v: _any(v.tokens, lambda k: k.a < 0 and v.num("c") < k.r <= 1 + v.num("eps_high"))),
        Regime(fid, "A > 0, r > c", "branch", w, "a positive advantage beyond c: no cap",
               lambda v: _any(v.tokens, lambda k: k.a > 0 and k.r > v.num("c"))),
    ]
    fid = "surrogate.trl_delta"
    w = _sec("surrogate", fid)
    out += _ppo_regimes(fid, clamp=False)
    for sign, sname in ((1, "A > 0"), (-1, "A < 0")):
        out += [
            Regime(fid, f"r > delta > 1 + eps_high, {sname}", "order", w, f"the cap beyond the clip band ({sname})",
                   lambda v, s=sign: v.num("delta") > 1 + v.num("eps_high") and _any(
                       v.tokens, lambda k: k.a * s > 0 and k.r > v.num("delta"))),
            Regime(fid, f"r > delta, delta < 1 + eps_high, {sname}", "order", w,
                   f"the cap inside the clip band ({sname})",
                   lambda v, s=sign: v.num("delta") < 1 + v.num("eps_high") and _any(
                       v.tokens, lambda k: k.a * s > 0 and k.r > v.num("delta"))),
        ]
    out.append(Regime(fid, "r = delta, A != 0", "equality", w, "a ratio exactly at the cap (derivative 1 there)",
                      lambda v: _any(v.tokens, lambda k: k.a != 0 and k.r == v.num("delta"))))
    fid = "surrogate.cispo"
    w = _sec("surrogate", fid)

    def rel(v):
        return v.p.get("cap_form") != "absolute"

    out += [
        # relative: r = 1 + eps_high at equality is unreachable: eps_high > 0 and r = e^d is irrational for a
        # rational d != 0 (the registry's eps_high range), so only the lower bound has an equality regime
        Regime(fid, "relative: r = 1 - eps_low, A != 0", "equality", w, "the weight's lower bound at equality",
               lambda v: rel(v) and v.num("eps_low") is not None and _any(
                   v.tokens, lambda k: k.a != 0 and k.r == 1 - v.num("eps_low"))),
        Regime(fid, "relative: r > 1 + eps_high, A != 0", "branch", w, "the weight truncated above",
               lambda v: rel(v) and _any(v.tokens, lambda k: k.a != 0 and k.r > 1 + v.num("eps_high"))),
        Regime(fid, "relative: r < 1 - eps_low, A != 0", "branch", w, "the weight truncated below",
               lambda v: rel(v) and v.num("eps_low") is not None and _any(
                   v.tokens, lambda k: k.a != 0 and k.r < 1 - v.num("eps_low"))),
        Regime(fid, "relative, eps_low null: r < 1, A != 0", "branch", w, "no lower bound: a ratio below 1 passes",
               lambda v: rel(v) and v.num("eps_low") is None and _any(v.tokens, lambda k: k.a != 0 and k.r < 1)),
        Regime(fid, "absolute: r = eps_high, A != 0", "equality", w, "the absolute cap at equality",
               lambda v: not rel(v) and _any(v.tokens, lambda k: k.a != 0 and k.r == v.num("eps_high"))),
        Regime(fid, "absolute: r > eps_high, A != 0", "branch", w, "the absolute cap binds",
               lambda v: not rel(v) and _any(v.tokens, lambda k: k.a != 0 and k.r > v.num("eps_high"))),
    ] + _clamp_equality(fid, "surrogate")
    fid = "surrogate.sapo"
    w = _sec("surrogate", fid)
    out += [
        Regime(fid, "r = 1, A > 0", "equality", w, "the gate's centre, tau_pos (f = 2/tau_pos)",
               lambda v: _any(v.tokens, lambda k: k.a > 0 and k.r == 1)),
        Regime(fid, "r = 1, A < 0", "equality", w, "the gate's centre, tau_neg (f = 2/tau_neg)",
               lambda v: _any(v.tokens, lambda k: k.a < 0 and k.r == 1)),
        Regime(fid, "r != 1, A > 0 and A < 0, tau_pos != tau_neg", "branch", w,
               "both temperatures in one case where they differ",
               lambda v: v.num("tau_pos") != v.num("tau_neg") and _any(v.tokens, lambda k: k.a > 0 and k.r != 1)
               and _any(v.tokens, lambda k: k.a < 0 and k.r != 1)),
    ] + _clamp_equality(fid, "surrogate")
    fid = "surrogate.gmpo"
    w = _sec("surrogate", fid)
    out += [
        Regime(fid, "d = eps_high, A > 0", "equality", w, "the log-space clip's upper bound at equality (min branch)",
               lambda v: _any(v.tokens, lambda k: k.a > 0 and k.d == v.num("eps_high"))),
        Regime(fid, "d = -eps_low, A < 0", "equality", w, "the lower bound at equality (max branch)",
               lambda v: _any(v.tokens, lambda k: k.a < 0 and k.d == -v.num("eps_low"))),
        Regime(fid, "d > eps_high, A > 0 (clipped)", "branch", w, "a token log-ratio clipped above (A > 0)",
               lambda v: _any(v.tokens, lambda k: k.a > 0 and k.d > v.num("eps_high"))),
        Regime(fid, "d > eps_high, A < 0 (unclipped)", "branch", w, "above the bound, A < 0 keeps d",
               lambda v: _any(v.tokens, lambda k: k.a < 0 and k.d > v.num("eps_high"))),
        Regime(fid, "d < -eps_low, A < 0 (clipped)", "branch", w, "a token log-ratio clipped below (A < 0)",
               lambda v: _any(v.tokens, lambda k: k.a < 0 and k.d < -v.num("eps_low"))),
        Regime(fid, "d < -eps_low, A > 0 (unclipped)", "branch", w, "below the bound, A > 0 keeps d",
               lambda v: _any(v.tokens, lambda k: k.a > 0 and k.d < -v.num("eps_low"))),
    ]
    fid = "surrogate.gspo"
    w = _sec("surrogate", fid)

    def s_of(v, q):
        m = q.mean if v.num("log_ratio_max") is None else min(q.mean, v.num("log_ratio_max"))
        return mp.exp(m)

    out += [
        Regime(fid, "s = 1 - eps_low, A < 0", "equality", w, "the sequence ratio at the lower bound",
               lambda v: _any(v.seqs, lambda q: q.a < 0 and s_of(v, q) == 1 - v.num("eps_low"))),
        Regime(fid, "s = 1 + eps_high, A > 0", "equality", w, "the sequence ratio at the upper bound",
               lambda v: _any(v.seqs, lambda q: q.a > 0 and s_of(v, q) == 1 + v.num("eps_high"))),
        Regime(fid, "s > 1 + eps_high, A > 0 (clipped)", "branch", w, "a sequence ratio clipped above (A > 0)",
               lambda v: _any(v.seqs, lambda q: q.a > 0 and s_of(v, q) > 1 + v.num("eps_high"))),
        Regime(fid, "s > 1 + eps_high, A < 0 (unclipped)", "branch", w, "above the band, the unclipped branch",
               lambda v: _any(v.seqs, lambda q: q.a < 0 and s_of(v, q) > 1 + v.num("eps_high"))),
        Regime(fid, "s < 1 - eps_low, A < 0 (clipped)", "branch", w, "a sequence ratio clipped below (A < 0)",
               lambda v: _any(v.seqs, lambda q: q.a < 0 and s_of(v, q) < 1 - v.num("eps_low"))),
        Regime(fid, "s < 1 - eps_low, A > 0 (unclipped)", "branch", w, "below the band, the unclipped branch",
               lambda v: _any(v.seqs, lambda q: q.a > 0 and s_of(v, q) < 1 - v.num("eps_low"))),
    ]
    for sign, sname in ((1, "A > 0"), (-1, "A < 0")):
        out += [
            Regime(fid, f"mean > log_ratio_max, e^max < 1 + eps_high, {sname}", "order", w,
                   f"the log-ratio cap binds inside the clip band ({sname})",
                   lambda v, s=sign: v.num("log_ratio_max") is not None and _any(
                       v.seqs, lambda q: q.a * s > 0 and q.mean > v.num("log_ratio_max")
                       and mp.exp(v.num("log_ratio_max")) < 1 + v.num("eps_high"))),
            Regime(fid, f"mean > log_ratio_max, e^max > 1 + eps_high, {sname}", "order", w,
                   f"the log-ratio cap binds beyond the clip band ({sname})",
                   lambda v, s=sign: v.num("log_ratio_max") is not None and _any(
                       v.seqs, lambda q: q.a * s > 0 and q.mean > v.num("log_ratio_max")
                       and mp.exp(v.num("log_ratio_max")) > 1 + v.num("eps_high"))),
        ]
    fid = "surrogate.vespo"
    w = _sec("surrogate", fid)
    out += [
        Regime(fid, "A > 0 and A < 0", "branch", w, "both (k, lambda) branches in one case",
               lambda v: _any(v.seqs, lambda q: q.a > 0) and _any(v.seqs, lambda q: q.a < 0)),
    ]   # its clamps act on sg[...] (a constant weight): equality there is immaterial
    return out




def _ratio():
    out = []
    out += _clamp_equality("ratio.token", "ratio", gated=False)
    fid = "ratio.sequence_product"
    w = _sec("ratio", fid)
    out += [
        Regime(fid, "sum d = c", "equality", w, "a sequence's log-ratio sum exactly at the clamp",
               lambda v: v.num("log_ratio_clamp") is not None and _any(
                   v.seqs_raw, lambda q: q.total == v.num("log_ratio_clamp"))),
        Regime(fid, "sum d = -c", "equality", w, "at minus the clamp",
               lambda v: v.num("log_ratio_clamp") is not None and _any(
                   v.seqs_raw, lambda q: q.total == -v.num("log_ratio_clamp"))),
    ]
    for fid in ("ratio.sequence_geometric", "ratio.gspo_token"):
        w = _sec("ratio", fid)
        out.append(Regime(fid, "mean d = log_ratio_max", "equality", w, "the sequence log-ratio exactly at the cap",
                          lambda v: v.num("log_ratio_max") is not None and _any(
                              v.seqs, lambda q: q.mean == v.num("log_ratio_max"))))
    fid = "ratio.sequence_geometric"
    w = _sec("ratio", fid)
    out += [
        Regime(fid, "token clamp and cap both bind, c < k", "order", w,
               "a token clamped (k = log_ratio_clamp) in a sequence whose clamped mean is capped (c = log_ratio_max < k)",
               lambda v: v.num("log_ratio_max") is not None and v.num("log_ratio_clamp") is not None
               and v.num("log_ratio_max") < v.num("log_ratio_clamp") and _any(
                   v.seqs, lambda q: q.mean > v.num("log_ratio_max") and any(
                       k.i == q.i and k.d != k.dc for k in v.tokens))),
        Regime(fid, "token clamp binds, cap does not", "order", w,
               "a token clamped in a sequence whose clamped mean is below the cap",
               lambda v: v.num("log_ratio_max") is not None and v.num("log_ratio_clamp") is not None and _any(
                   v.seqs, lambda q: q.mean < v.num("log_ratio_max") and any(
                       k.i == q.i and k.d != k.dc for k in v.tokens))),
    ]
    return out


def _kl():
    out = []
    est = {"kl.k1": lambda x: -x, "kl.k2": lambda x: x * x / 2, "kl.k3": lambda x: mp.expm1(x) - x,
           "kl.abs": abs, "kl.k3_straight_through": lambda x: mp.expm1(x) - x}
    for fid, k in est.items():
        w = _sec("kl", fid)

        def xc(v, x):
            a, b = v.num("log_ratio_min"), v.num("log_ratio_max")
            return min(max(x, a if a is not None else x), b if b is not None else x)

        out += [
            Regime(fid, "x = log_ratio_min", "equality", w, "the input clamp's lower bound at equality",
                   lambda v: v.num("log_ratio_min") is not None and _any(
                       v.kl_tokens, lambda t: t.d == v.num("log_ratio_min"))),
            Regime(fid, "x = log_ratio_max", "equality", w, "the input clamp's upper bound at equality",
                   lambda v: v.num("log_ratio_max") is not None and _any(
                       v.kl_tokens, lambda t: t.d == v.num("log_ratio_max"))),
            Regime(fid, "input clamp binds, output clamp then binds", "order", w,
                   "x beyond an input bound and the estimate of the clamped x beyond an output bound "
                   "(the output clamp hides the input clamp)",
                   lambda v, k=k, xc=xc: v.num("log_ratio_min") is not None and _any(
                       v.kl_tokens, lambda t: xc(v, t.d) != t.d and _outside(v, k(xc(v, t.d))))),
            Regime(fid, "input clamp binds, output clamp does not", "order", w,
                   "x beyond an input bound, the estimate of the clamped x within the output bounds, which are set",
                   lambda v, k=k, xc=xc: v.num("log_ratio_min") is not None and v.num("output_max") is not None
                   and _any(v.kl_tokens, lambda t: xc(v, t.d) != t.d and not _outside(v, k(xc(v, t.d))))),
        ]
    return out


def _outside(v, y):
    lo, hi = v.num("output_min"), v.num("output_max")
    return (lo is not None and y < lo) or (hi is not None and y > hi)


def _is():
    out = []
    for level in ("token", "sequence", "geometric"):
        for mode in ("truncate", "mask"):
            fid = f"is.{level}.{mode}"
            w = _sec("is", fid)
            key = "ratio" if level == "token" else "seq_ratio"

            def rhos(v, key=key):
                vals = v.out[key]
                if key == "ratio":
                    return [x for row in vals for x in row if x is not None]
                return [x for x in vals if x is not None]

            def base_rhos(v, level=level):
                toks = v.tokens_of("old_logprobs", "sampler_logprobs")
                if level == "token":
                    return [k.d for k in toks]
                rows = _rows_of(toks)
                return [mp.fsum(r) if level == "sequence" else mp.fsum(r) / len(r) for r in rows.values()]

            if mode == "mask":   # truncation at equality gives the bound either way (a constant weight)
                out += [
                    Regime(fid, "rho = c_min", "equality", w, "a weight exactly at the band's lower bound (kept)",
                           lambda v, rhos=rhos: v.num("c_min") is not None and _any(
                               rhos(v), lambda x: x == v.num("c_min"))),
                    Regime(fid, "rho = c_max", "equality", w, "a weight exactly at the band's upper bound (kept)",
                           lambda v, rhos=rhos: v.num("c_max") is not None and _any(
                               rhos(v), lambda x: x == v.num("c_max"))),
                ]
            out += [
                Regime(fid, "u > c, e^c <= c_max", "order", w,
                       "the log-weight clamp binds above inside the band (the clamped weight is kept / not truncated)",
                       lambda v, b=base_rhos: v.num("log_ratio_clamp") is not None and v.num("c_max") is not None
                       and mp.exp(v.num("log_ratio_clamp")) <= v.num("c_max")
                       and _any(b(v), lambda u: u > v.num("log_ratio_clamp"))),
                Regime(fid, "u > c, e^c > c_max", "order", w,
                       "the log-weight clamp binds above beyond the band",
                       lambda v, b=base_rhos: v.num("log_ratio_clamp") is not None and v.num("c_max") is not None
                       and mp.exp(v.num("log_ratio_clamp")) > v.num("c_max")
                       and _any(b(v), lambda u: u > v.num("log_ratio_clamp"))),
            ]
    fid = "is.reject"
    w = _sec("is", fid)

    def stats(v):
        key = "token_stat" if v.p.get("level") == "token" else "seq_stat"
        vals = v.out[key]
        flat = [x for row in vals for x in row] if key == "token_stat" else list(vals)
        return [x for x in flat if x is not None]

    out += [
        Regime(fid, "stat = upper", "equality", w, "the statistic exactly at the upper bound (kept)",
               lambda v: v.num("upper") is not None and _any(stats(v), lambda x: x == v.num("upper"))),
        Regime(fid, "stat = lower", "equality", w, "the statistic exactly at the lower bound (kept)",
               lambda v: v.num("lower") is not None and _any(stats(v), lambda x: x == v.num("lower"))),
    ]
    return out


def _mask():
    out = []
    fid = "mask.geometric_sequence"
    w = _sec("mask", fid)

    def g(v):
        return [x for x in v.out["seq_ratio"] if x is not None]

    out += [
        Regime(fid, "g = lower", "equality", w, "the statistic exactly at the lower bound (kept)",
               lambda v: _any(g(v), lambda x: x == v.num("lower"))),
        Regime(fid, "g = upper", "equality", w, "the statistic exactly at the upper bound (kept)",
               lambda v: _any(g(v), lambda x: x == v.num("upper"))),
    ]
    fid = "mask.opsm"
    w = _sec("mask", fid)

    def seqs(v):
        return [(mpf(a), mpf(k)) for a, k in zip(v.out["seq_advantage"], v.out["seq_stat"])
                if a is not None and k is not None]

    def tok_gate(v):
        if v.p.get("advantage_gate") != "token":
            return []
        kap = v.out["seq_stat"]
        return [(v.adv(i, t), kap[i]) for i, t in v._positions() if kap[i] is not None]

    out += [
        Regime(fid, "kappa = delta, A < 0", "equality", w, "the statistic exactly at delta with a negative advantage (kept)",
               lambda v: _any(seqs(v), lambda q: q[0] < 0 and q[1] == v.num("delta"))),
        Regime(fid, "A = 0, kappa > delta", "equality", w,
               "the advantage gate at equality (A_i = 0, kept) while the statistic exceeds delta",
               lambda v: v.p.get("advantage_gate") != "token" and _any(
                   seqs(v), lambda q: q[0] == 0 and q[1] > v.num("delta"))),
        Regime(fid, "token gate: A_t = 0, kappa > delta", "equality", w,
               "advantage_gate 'token': a token with A_{i,t} = 0 in a sequence whose statistic exceeds delta "
               "(not in a recipe: there the gated term -A r is 0 at A_t = 0, kept or dropped)",
               lambda v: _any(tok_gate(v), lambda q: q[0] == 0 and q[1] > v.num("delta")), recipe=False),
        Regime(fid, "token gate: A_t < 0 and A_t > 0, kappa > delta", "branch", w,
               "advantage_gate 'token': both signs in sequences over delta",
               lambda v: _any(tok_gate(v), lambda q: q[0] < 0 and q[1] > v.num("delta"))
               and _any(tok_gate(v), lambda q: q[0] > 0 and q[1] > v.num("delta"))),
    ]
    fid = "mask.entropy_quantile"
    w = _sec("mask", fid)
    out.append(Regime(fid, "entropy = threshold", "equality", w, "a token's entropy exactly at the quantile (kept)",
                      lambda v: v.out["threshold"] is not None and _any(
                          v._positions(), lambda p: mpf(v.inputs["entropy"][p[0]][p[1]]) == v.out["threshold"])))
    return out


# float64-only effects ------------------------------------------------------------------------------

U32, U64 = mpf(2) ** -24, mpf(2) ** -53


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _float32_sum_visible(values) -> bool:
    """The float32 accumulation of ``values`` (each rounded to float32, then summed left to right in
    float32) differs from the exact sum by more than a float64 bound could allow (n u64 sum |v|)."""
    vals = [float(x) for x in values]
    if len(vals) < 2 or not all(math.isfinite(x) for x in vals):
        return False
    acc = 0.0
    for x in vals:
        acc = _f32(acc + _f32(x))
    exact = mp.fsum(mpf(x) for x in vals)
    bound = len(vals) * U64 * mp.fsum(abs(mpf(x)) for x in vals)
    return abs(mpf(acc) - exact) > 4 * bound


def _masked_values(v):
    return [v.inputs["values"][i][t] for i, t in v._positions()]


def _eps_only_float64(v, names):
    """Removing the epsilon(s) changes some output element by a relative amount a float64 comparison
    sees and a float32 one does not: in (2^-44, 2^-24)."""
    from pgspec.reference import evaluate

    base = v.out
    zero = dict(v.p)
    if all(zero.get(n) in (None, 0) for n in names):
        return False
    for n in names:
        zero[n] = 0
    other = evaluate(v.formula, v.inputs, {k: x for k, x in zero.items() if k in v._declared}, dps=30)
    for key, val in base.items():
        if key == "grad":
            continue
        for a, b in zip(_flat(val), _flat(other[key])):
            if a is None or b is None or isinstance(a, (bool, int)):
                continue
            a, b = mpf(a), mpf(b)
            if a == b or not mp.isfinite(a) or not mp.isfinite(b):
                continue
            rel = abs(a - b) / max(abs(a), abs(b))
            if mpf(2) ** -44 < rel < U32:
                return True
    return False


def _flat(x):
    if isinstance(x, list):
        for y in x:
            yield from _flat(y)
    else:
        yield x


def _float64():
    out = []
    for fid in ("agg.token_mean", "agg.sample_mean", "agg.seq_mean_token_sum", "agg.constant", "agg.prompt_mean",
                "agg.document_mean"):
        out.append(Regime(fid, "float32 accumulation visible", "float64", _sec("agg", fid),
                          "the float32 accumulation of the unmasked values is off by more than a float64 sum may be "
                          "(inputs not float32-exact, or a sum float32 rounds)",
                          lambda v: _float32_sum_visible(_masked_values(v))))
    for fid in ("adv.group_normalized", "adv.batch_normalized"):
        for place in ("std", "variance"):
            out.append(Regime(fid, f"eps_placement {place}, eps visible in float64 only", "float64",
                              _sec("adv", fid), "eps > 0 changes some advantage by a relative 2^-44 .. 2^-24 "
                              f"with eps_placement = '{place}' (eps small against the spread: it matters to float64 only)",
                              lambda v, place=place: v.p.get("eps_placement", "std") == place
                              and _eps_only_float64(v, ("eps",))))
    out.append(Regime("agg.token_mean", "eps visible in float64 only", "float64", _sec("agg", "agg.token_mean"),
                      "eps > 0 changes the mean by a relative 2^-44 .. 2^-24", lambda v: _eps_only_float64(v, ("eps",))))
    return out


# Options (choice parameters) -----------------------------------------------------------------------

def _options():
    """Every value of every choice parameter: of each formula in its own cases; of the options every
    recipe shares (reference/loss.py OPTION_NAMES) in some ``loss.*`` case (formula ``loss.*``)."""
    from pgspec.reference import REGISTRY
    from pgspec.reference.loss import OPTION_NAMES

    out = []
    shared = {}
    for fid in sorted(REGISTRY):
        f = REGISTRY[fid]
        for p in f.params:
            if p.kind != "choice":
                continue
            if fid.startswith("loss.") and p.name in OPTION_NAMES:
                shared[p.name] = p.choices
                continue
            for c in p.choices:
                out.append(Regime(fid, f"{p.name} = {c}", "option", _sec(f.family, fid), f"a case with {p.name} = {c!r}",
                                  lambda v, n=p.name, c=c: v.p.get(n) == c))
    for name, choices in shared.items():
        for c in choices:
            out.append(Regime("loss.*", f"{name} = {c}", "option", "spec/loss.md, options",
                              f"a loss.* case with {name} = {c!r}", lambda v, n=name, c=c: v.p.get(n) == c))
    return out


def catalogue() -> list[Regime]:
    regs = _surrogate() + _ratio() + _kl() + _is() + _mask() + _float64() + _options()
    keys = [r.key for r in regs]
    dup = {k for k in keys if keys.count(k) > 1}
    if dup:
        raise RuntimeError(f"duplicate regimes in the catalogue: {sorted(dup)}")
    return regs


