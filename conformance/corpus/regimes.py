"""Regime coverage of the golden corpus: is every branch of every gate, every comparison at equality,
every ordering of two composed bounds and every float64-only effect witnessed by some case, at the
formula level and in a ``loss.*`` recipe?

``coverage.py`` asks whether each bound *binds* somewhere.  A bug can hide in a regime that binding
does not single out: the equality boundary of a gate (``<`` written for ``<=``), the other ordering
of two bounds that compose (a log-ratio clamp inside or outside the clip band), the advantage sign
that selects the other branch, or a regime a recipe reaches but no formula case does (or the
reverse).  The catalogue (``regime_catalogue.catalogue()``) is data: for each formula, its regimes, each with

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

``conformance/run/properties/strategy_coverage.py`` checks the property strategies: every option
they should draw (``DRAWN_OPTIONS``) is drawn on both sides of its binding region (a clamp that
binds and one that does not; each choice), and the clamp property covers every clamped formula.

``pgspec golden coverage`` prints the tables after the binding table and fails naming every gap;
``tests/test_regimes.py`` removes a regime's cases and sees the gap named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from mpmath import mp, mpf

from .regime_catalogue import Regime, _any, _rows_of, catalogue  # noqa: F401 - the catalogue's names

DPS = 40
MIN_FLOAT64 = 3          # cases per float64-only regime


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
    def seqs_raw(self):
        """Sequences of unclamped log-ratios l - l_old (for a clamp applied to the sum)."""
        return [Seq(i, len(v), mp.fsum(v) / len(v), mp.fsum(v), None)
                for i, v in sorted(_rows_of(self.tokens_of("logprobs", "old_logprobs")).items())]

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
