"""Regime coverage of the golden corpus: is every branch of every gate, every comparison at equality,
every ordering of two composed bounds and every float64-only effect witnessed by some case, at the
formula level and in a ``loss.*`` recipe?

``coverage.py`` asks whether each bound *binds* somewhere.  A bug can hide in a regime that binding
does not single out: the equality boundary of a gate (``<`` written for ``<=``), the other ordering
of two bounds that compose (a log-ratio clamp inside or outside the clip band), the advantage sign
that selects the other branch, or a regime a recipe reaches but no formula case does (or the
reverse).  The catalogue below (``CATALOGUE``) is data: for each formula, its regimes, each with

* ``kind``: ``equality`` (a comparison at equality with the gate's other conditions holding and the
  gated term non-zero, so the gate's own output shows it), ``branch`` (a side of a gate, with the
  advantage sign where the sign selects the branch), ``order`` (two composed bounds in one
  ordering, with one advantage sign), ``option`` (a value of a choice parameter) or ``float64`` (an
  effect only a float64 comparison can see, which needs ``MIN_FLOAT64`` cases);
* ``where``: the spec section it comes from;
* ``text``: the predicate in words, and ``test``: the predicate itself, a function of a ``View`` of
  one case (its unmasked tokens or sequences with the log-ratios, ratios and advantages the spec's
  equations name, computed exactly from the case's inputs and parameters).

Which cases witness which regime is computed from the cases, never listed by hand.  A recipe
(``RECIPES``) composes formulas: its case is viewed as a case of each component it enables (the
recipe's parameters renamed to the component's, e.g. ``is_c_max`` -> ``c_max``), and a component's
regime (other than a ``float64`` one) must then be witnessed by a recipe case too (where some recipe
composes that formula).  Recipe views do not remove tokens that another factor of the recipe zeroes
(an OPSM or entropy drop, an IS mask): a case author keeps those off in a regime case.

``option_coverage`` checks the property strategies (``conformance/run/properties``): every option
they should draw (``DRAWN_OPTIONS``) is drawn on both sides of its binding region (a clamp that
binds and one that does not; each choice), and the clamp property covers every clamped formula.

``pgspec golden coverage`` prints the tables after the binding table and fails naming every gap;
``tests/test_regimes.py`` removes a regime's cases and sees the gap named.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

from mpmath import mp, mpf

DPS = 40
MIN_FLOAT64 = 3          # cases per float64-only regime


def _n(x):
    return None if x is None else mpf(x)


# Views ---------------------------------------------------------------------------------------------

@dataclass
class Tok:
    """One unmasked token: d = l - l_old (unclamped), dc the log-ratio after the clamp c, r = e^dc,
    a its advantage (the sequence's for [B] advantages)."""
    i: int
    t: int
    d: object
    dc: object
    r: object
    a: object


@dataclass
class Seq:
    """One non-empty sequence: mean and sum of its (clamped) token log-ratios, its advantage."""
    i: int
    n: int
    mean: object
    total: object
    a: object


class View:
    """One case as one formula sees it: ``p`` its parameters (mpf or str or None), ``inputs`` its
    inputs (Python floats, bools, ints), and derived views computed on first use."""

    def __init__(self, formula, inputs, params, case_id):
        self.formula, self.inputs, self.p, self.case_id = formula, inputs, params, case_id

    def num(self, name):
        v = self.p.get(name)
        if v is None or isinstance(v, bool):
            return None
        try:
            return mpf(v)           # a number, or a decimal string ("1e-8")
        except (TypeError, ValueError):
            return None             # a choice

    def _positions(self):
        mask = self.inputs.get("mask")
        if mask is None:
            return []
        return [(i, t) for i, row in enumerate(mask) for t, m in enumerate(row) if m]

    def adv(self, i, t):
        a = self.inputs.get("advantages")
        if a is None:
            return None
        return mpf(a[i][t]) if isinstance(a[i], list) else mpf(a[i])

    def tokens_of(self, num, den, clamp=None):
        out = []
        for i, t in self._positions():
            d = mpf(self.inputs[num][i][t]) - mpf(self.inputs[den][i][t])
            dc = d if clamp is None else min(max(d, -clamp), clamp)
            out.append(Tok(i, t, d, dc, mp.exp(dc), self.adv(i, t)))
        return out

    @cached_property
    def tokens(self):
        """The policy log-ratio d = l - l_old with the formula's log_ratio_clamp."""
        if "logprobs" not in self.inputs or "old_logprobs" not in self.inputs:
            return []
        return self.tokens_of("logprobs", "old_logprobs", self.num("log_ratio_clamp"))

    @cached_property
    def kl_tokens(self):
        """x = l_ref - l (spec/kl.md)."""
        return self.tokens_of("ref_logprobs", "logprobs")

    @cached_property
    def seqs(self):
        rows: dict = {}
        for tok in self.tokens:
            rows.setdefault(tok.i, []).append(tok.dc)
        adv = self.inputs.get("advantages")
        return [Seq(i, len(v), mp.fsum(v) / len(v), mp.fsum(v),
                    mpf(adv[i]) if adv is not None and not isinstance(adv[i], list) else None)
                for i, v in sorted(rows.items())]

    @cached_property
    def out(self):
        """The reference's outputs for the case (for gates on a statistic the formula outputs)."""
        from pgspec.reference import evaluate

        return evaluate(self.formula, self.inputs, {k: v for k, v in self.p.items() if k in self._declared},
                        dps=30)

    @cached_property
    def _declared(self):
        from pgspec.reference import REGISTRY

        return {p.name for p in REGISTRY[self.formula].params}


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
               lambda v: _any(v.gmpo, lambda k: k.a > 0 and k.d == v.num("eps_high"))),
        Regime(fid, "d = -eps_low, A < 0", "equality", w, "the lower bound at equality (max branch)",
               lambda v: _any(v.gmpo, lambda k: k.a < 0 and k.d == -v.num("eps_low"))),
        Regime(fid, "d > eps_high, A > 0 (clipped)", "branch", w, "a token log-ratio clipped above (A > 0)",
               lambda v: _any(v.gmpo, lambda k: k.a > 0 and k.d > v.num("eps_high"))),
        Regime(fid, "d > eps_high, A < 0 (unclipped)", "branch", w, "above the bound, A < 0 keeps d",
               lambda v: _any(v.gmpo, lambda k: k.a < 0 and k.d > v.num("eps_high"))),
        Regime(fid, "d < -eps_low, A < 0 (clipped)", "branch", w, "a token log-ratio clipped below (A < 0)",
               lambda v: _any(v.gmpo, lambda k: k.a < 0 and k.d < -v.num("eps_low"))),
        Regime(fid, "d < -eps_low, A > 0 (unclipped)", "branch", w, "below the bound, A > 0 keeps d",
               lambda v: _any(v.gmpo, lambda k: k.a > 0 and k.d < -v.num("eps_low"))),
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


View.gmpo = property(lambda self: [Tok(k.i, k.t, k.d, k.d, k.r, self.seq_adv(k.i)) for k in self.tokens])
View.seq_adv = lambda self, i: (mpf(self.inputs["advantages"][i]) if not isinstance(self.inputs["advantages"][i], list)
                                else None)


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


View.seqs_raw = property(lambda self: [
    Seq(i, len(v), mp.fsum(v) / len(v), mp.fsum(v), None) for i, v in sorted(_rows_of(
        self.tokens_of("logprobs", "old_logprobs")).items())])


def _rows_of(tokens):
    rows: dict = {}
    for k in tokens:
        rows.setdefault(k.i, []).append(k.d)
    return rows


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


# Recipes -------------------------------------------------------------------------------------------

def _policy_component(fid, p):
    """The surrogate (or ratio) formula a recipe's policy term is, and its parameters."""
    pick = lambda *names: {n: p.get(n) for n in names if n in p}  # noqa: E731
    if fid in ("loss.grpo", "loss.dapo", "loss.dr_grpo", "loss.bnpo"):
        return "surrogate.ppo_clip", pick("eps_low", "eps_high", "log_ratio_clamp")
    if fid == "loss.gspo" or (fid == "loss.luspo" and p.get("ratio_level") == "sequence"):
        return "surrogate.gspo", pick("eps_low", "eps_high", "log_ratio_max", "log_ratio_clamp")
    if fid == "loss.cispo":
        return "surrogate.cispo", pick("cap_form", "eps_low", "eps_high", "log_ratio_clamp")
    if fid == "loss.sapo":
        return "surrogate.sapo", pick("tau_pos", "tau_neg", "log_ratio_clamp")
    if fid == "loss.gmpo":
        return "surrogate.gmpo", pick("eps_low", "eps_high")
    if fid == "loss.vespo":
        return "surrogate.vespo", pick("k_pos", "lambda_pos", "k_neg", "lambda_neg", "lambda_min", "log_ratio_clamp",
                                       "min_weight", "max_log_weight")
    return None, None


def components(case_formula, p) -> list[tuple[str, dict]]:
    """(component formula, its parameters) for every formula a recipe case composes."""
    out = []
    pol, pp = _policy_component(case_formula, p)
    if pol:
        out.append((pol, pp))
    if p.get("is_level", "none") != "none":
        out.append((f"is.{p['is_level']}.{p.get('is_mode', 'truncate')}",
                    {"c_min": p.get("is_c_min"), "c_max": p.get("is_c_max"), "log_ratio_clamp": p.get("is_log_ratio_clamp")}))
    if p.get("opsm_delta") is not None:
        out.append(("mask.opsm", {"delta": p["opsm_delta"], "advantage_gate": p.get("opsm_advantage_gate")}))
    if p.get("entropy_quantile") is not None:
        out.append(("mask.entropy_quantile", {"top_entropy_quantile": p["entropy_quantile"]}))
    if mpf(p.get("beta") or 0) > 0:
        est = p.get("kl_estimator", "k3")
        kp = {"log_ratio_min": p.get("kl_log_ratio_min"), "log_ratio_max": p.get("kl_log_ratio_max"),
              "output_min": p.get("kl_output_min"), "output_max": p.get("kl_output_max")}
        if est == "k3_unbiased":
            kp["sg_ratio_where_clamped"] = p.get("kl_sg_ratio_where_clamped", True)
        out.append(("kl." + ("abs" if est == "abs" else est), kp))
    return out


def _component_inputs(fid, inputs):
    from pgspec.reference import REGISTRY

    names = {i.name for i in REGISTRY[fid].inputs}
    return {k: v for k, v in inputs.items() if k in names}


RECIPE_COMPOSED = ("surrogate.", "is.", "mask.", "kl.")


# Coverage ------------------------------------------------------------------------------------------

@dataclass
class Row:
    regime: Regime
    formula_cases: list = field(default_factory=list)
    recipe_cases: list = field(default_factory=list)
    recipe_needed: bool = False

    @property
    def needed(self):
        return MIN_FLOAT64 if self.regime.kind == "float64" else 1


def _views(case):
    """(view, level) for a case: its own formula ("formula"), and each component of a recipe ("recipe")."""
    from .inputs import case_inputs, resolved_params

    inputs, params = case_inputs(case), resolved_params(case)
    fid = case["formula"]
    if not fid.startswith("loss."):
        return [(View(fid, inputs, params, case["id"]), "formula")]
    out = [(View(fid, inputs, params, case["id"]), "formula"), (View("loss.*", inputs, params, case["id"]), "formula")]
    for comp, cp in components(fid, params):
        from pgspec.reference import REGISTRY

        full = {p.name: p.default for p in REGISTRY[comp].params}
        full.update({k: v for k, v in cp.items()})
        out.append((View(comp, _component_inputs(comp, inputs), full, case["id"]), "recipe"))
    return out


def coverage(cases=None) -> dict[str, Row]:
    from . import golden

    cases = golden.load_all() if cases is None else cases
    regs = catalogue()
    by_formula: dict = {}
    for r in regs:
        by_formula.setdefault(r.formula, []).append(r)
    rows = {r.key: Row(r) for r in regs}
    recipe_formulas = set()
    from pgspec.reference import REGISTRY

    for fid in REGISTRY:
        if fid.startswith("loss."):
            for comp, _ in _recipe_component_universe(fid):
                recipe_formulas.add(comp)
    for row in rows.values():
        row.recipe_needed = (row.regime.formula in recipe_formulas and row.regime.recipe
                             and row.regime.kind not in ("float64", "option"))
    with mp.workdps(DPS):
        for c in cases:
            if c.get("expect_error"):
                continue
            scale = c["category"] == "scale"
            if scale and not any(r.kind == "float64" for r in by_formula.get(c["formula"], ())):
                continue
            for view, level in _views(c):
                for r in by_formula.get(view.formula, ()):
                    if (level == "recipe" and r.kind in ("float64", "option")) or (scale and r.kind != "float64"):
                        continue
                    try:
                        hit = r.test(view)
                    except (TypeError, KeyError, IndexError, ZeroDivisionError):
                        hit = False
                    if hit:
                        (rows[r.key].formula_cases if level == "formula" else rows[r.key].recipe_cases).append(c["id"])
    return rows


def _recipe_component_universe(fid):
    """Every formula a recipe can compose (its policy term under each of its choices, IS levels and
    modes, OPSM, the entropy mask, every KL estimator)."""
    from pgspec.reference import REGISTRY

    p = {q.name: q.default for q in REGISTRY[fid].params}
    out = []
    for level_choice in ({}, {"ratio_level": "sequence"}):
        pol, _ = _policy_component(fid, {**p, **level_choice})
        if pol:
            out.append((pol, None))
    if "is_level" in p:
        for lv in ("token", "sequence", "geometric"):
            for m in ("truncate", "mask"):
                out.append((f"is.{lv}.{m}", None))
        out += [("mask.opsm", None), ("mask.entropy_quantile", None)]
        out += [(f"kl.{e}", None) for e in ("k1", "k2", "k3", "abs", "k3_straight_through", "k3_unbiased")]
    return out


def problems(rows: dict[str, Row]) -> list[str]:
    out = []
    for row in rows.values():
        r = row.regime
        n = len(row.formula_cases)
        if n < row.needed:
            what = "no case" if n == 0 else f"{n} case(s), {row.needed} needed"
            out.append(f"{r.key} [{r.kind}] witnessed by {what} of {r.formula} ({r.where}: {r.text})")
        if row.recipe_needed and not row.recipe_cases:
            out.append(f"{r.key} [{r.kind}] witnessed by no loss.* recipe case ({r.where}: {r.text})")
    return out


def table(rows: dict[str, Row]) -> str:
    lines = [f"{'regime':70s} {'kind':8s} {'formula':>7s} {'recipe':>7s}"]
    for row in rows.values():
        rec = str(len(row.recipe_cases)) if row.recipe_needed else "-"
        flag = ""
        if len(row.formula_cases) < row.needed or (row.recipe_needed and not row.recipe_cases):
            flag = "  <- gap"
        lines.append(f"{row.regime.key[:70]:70s} {row.regime.kind:8s} {len(row.formula_cases):7d} {rec:>7s}{flag}")
    return "\n".join(lines)


# The property strategies: options drawn on both sides of their binding region --------------------

# option -> how "both sides" is decided: "clamp" (a log-ratio clamp that binds at an unmasked token in
# some example, and an example where it is null or does not bind), "choice" (every value drawn),
# "cp" (dist.cp_reduce's max_seq_len: null and a value longer than the padded width, in the bshd
# layout, in the cp_rank_sum examples).  Aggregated over every formula that has the option.
DRAWN_OPTIONS = {
    "log_ratio_clamp": "clamp",
    "kl_aggregation": "choice",
    "step_divisor": "choice",
    "advantage_gate": "choice",
    "is_level": "choice",
    "max_seq_len": "cp",
}


def _clamp_binds(fid, ex) -> bool:
    """Does the example's log_ratio_clamp c bind: |log-ratio| > c at an unmasked token (the policy
    log-ratio l - l_old, or l_old - l_mu for the is family)?"""
    c = ex["params"].get("log_ratio_clamp")
    ins = ex["inputs"]
    if c is None:
        return False
    num, den = ("old_logprobs", "sampler_logprobs") if fid.startswith("is.") else ("logprobs", "old_logprobs")
    if num not in ins or den not in ins:
        return False
    for a_row, b_row, m_row in zip(ins[num], ins[den], ins["mask"]):
        for a, b, m in zip(a_row, b_row, m_row):
            if m and math.isfinite(a) and math.isfinite(b) and abs(a - b) > c:
                return True
    return False


def option_coverage():
    """(table rows, problems) for the property examples (``fixed_examples`` of every property and
    formula): each option of DRAWN_OPTIONS on both sides, and every clamped formula in the clamp
    property (``CLAMP_PARAMS``; exclusions with their reason in ``NOT_CLAMP_CHECKED``)."""
    from pgspec.reference import REGISTRY

    from ..run import properties as P
    from ..run.properties.clamp import CLAMP_PARAMS, NOT_CLAMP_CHECKED
    from .coverage import BOUNDS, base_name

    seen: dict = {name: set() for name in DRAWN_OPTIONS}
    where: dict = {name: set() for name in DRAWN_OPTIONS}
    for pid, prop in P.PROPERTIES.items():
        for fid in prop.formulas:
            declared = {p.name: p for p in REGISTRY[fid].params}
            for ex in P.fixed_examples(pid, fid):
                for name, how in DRAWN_OPTIONS.items():
                    if how == "cp":
                        cp = ex.get("cp")
                        if cp and cp.get("layout") == "bshd":
                            where[name].add("dist.cp_reduce")
                            seen[name].add("set" if cp.get("max_seq_len") is not None else "null")
                        continue
                    if name not in declared:
                        continue
                    where[name].add(fid)
                    value = ex["params"].get(name, declared[name].default)
                    if how == "clamp":
                        seen[name].add("binds" if _clamp_binds(fid, ex) else "does not bind")
                    else:
                        seen[name].add(value)
    rows, bad = [], []
    for name, how in DRAWN_OPTIONS.items():
        if how == "clamp":
            need = {"binds", "does not bind"}
        elif how == "cp":
            need = {"null", "set"}
        else:
            need = set()
            for fid in where[name]:
                need |= set(next(p.choices for p in REGISTRY[fid].params if p.name == name))
        missing = sorted(map(str, need - seen[name]))
        rows.append((name, how, len(where[name]), sorted(map(str, seen[name])), missing))
        if missing:
            bad.append(f"property examples: option {name} ({len(where[name])} formula(s)) never drawn "
                       f"{'as' if how != 'clamp' else 'where it'} {', '.join(missing)}")
    clamped = sorted(fid for fid in REGISTRY if not fid.startswith(("loss.", "dist.")) and any(
        base_name(p.name) in ("log_ratio_clamp", "log_ratio_min", "log_ratio_max", "output_min", "output_max",
                              "c_min", "c_max") and BOUNDS[base_name(p.name)] for p in REGISTRY[fid].params
        if p.kind == "real"))
    for fid in clamped:
        if fid not in CLAMP_PARAMS and fid not in NOT_CLAMP_CHECKED:
            bad.append(f"prop.clamp: {fid} has a clamp parameter but no parameter set in CLAMP_PARAMS "
                       f"(conformance/run/properties/clamp.py)")
    rows.append(("prop.clamp", "formulas", len(clamped), [f for f in clamped if f in CLAMP_PARAMS],
                 [f for f in clamped if f not in CLAMP_PARAMS and f not in NOT_CLAMP_CHECKED]))
    return rows, bad


def option_table(rows) -> str:
    lines = [f"{'option':18s} {'kind':8s} {'formulas':>8s}  drawn / missing"]
    for name, how, n, seen, missing in rows:
        if name == "prop.clamp":
            lines.append(f"{name:18s} {how:8s} {n:8d}  {len(seen)} in CLAMP_PARAMS"
                         + (f"; missing {', '.join(missing)}" if missing else ""))
            continue
        lines.append(f"{name:18s} {how:8s} {n:8d}  {', '.join(seen)}" + (f"  <- missing {', '.join(missing)}"
                                                                        if missing else ""))
    return "\n".join(lines)
