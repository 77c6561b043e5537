"""Which branches a `pgspec check` judges: each decision of the formula, and how many of the check's
tokens or rows take each side of it.

A check judges only the branches its inputs reach.  The draw (draws.py) puts every token or row off
the kinks and spreads them over the sides of each, but a small batch may still leave a side empty:
with 8 rows, OPSM may drop none of them, and then a kernel that never drops a row passes.  So a
check reports, with its outcome, the count on each side of each decision, and names the sides no
token or row takes ("not judged").

``branches(formula, arrays, params)`` counts them on the check's float64 inputs, which the draw puts
at least 0.05 (mostly 0.15) from every kink: every dtype takes the same sides.  The decisions are
the reference's (spec/), as the oracle reads them (terms.py, scales.py):

- a PPO loss's ratio r = exp(l - l_old) against [1 - eps_low, 1 + eps_high] (tokens; GSPO's and
  sequence-level LUSPO's mean log-ratio per row, with GSPO's cap on it), and whether the term takes
  the clipped constant (r above the range with A > 0, below it with A < 0) or the -A r branch;
- CISPO's truncation of its weight, GMPO's clip of each log-ratio, MiniRL's decoupled-PPO mask and
  the cap of its weight, VESPO's clip of each row's log-weight, and the advantage's sign where it
  picks SAPO's temperature or VESPO's (k, lambda);
- a log-ratio clamp (log_ratio_clamp): tokens within +-c or clamped;
- the IS weight's level log-weight (tokens, or rows) against its clamp and bounds;
- OPSM over the rows of negative advantage (dropped or kept); the entropy mask (kept or dropped);
- the KL term's input and output clamps (tokens).

The aggregators make no decision: they report none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from pgspec.reference import REGISTRY


@dataclass
class Branch:
    """One decision: its ``name``, what it counts (``unit``: tokens or rows), the count on each side, and
    (``where``, not reported) each side's elements as a bool array ([B, T] for tokens, [B] for rows)."""
    name: str
    unit: str
    counts: dict = field(default_factory=dict)
    where: dict = field(default_factory=dict, repr=False, compare=False)

    def unreached(self) -> list:
        return [side for side, n in self.counts.items() if n == 0]

    def to_json(self) -> dict:
        return {"name": self.name, "unit": self.unit, "counts": dict(self.counts)}


def describe(found: list) -> list:
    """A line of counts per decision: 'ratio against the clip range (tokens): below 12, inside 10, above
    11' (``found``: Branch objects or their JSON form)."""
    found = [b if isinstance(b, Branch) else Branch(b["name"], b["unit"], b["counts"]) for b in found]
    return [f"{b.name} ({b.unit}): " + ", ".join(f"{side} {n}" for side, n in b.counts.items()) for b in found]


def unreached(found: list) -> list:
    """'decision: side' for each side that no token or row takes."""
    return [f"{b.name}: {side}" for b in found for side in b.unreached()]


def branches(formula: str, arrays: dict, params: dict) -> list[Branch]:
    """The decisions of ``formula`` under ``params`` (with the formula's defaults) on a check's float64
    ``arrays`` (check.check_inputs), with the count of tokens or rows on each side."""
    from .draws import sequence_level as _sequence_level

    if not formula.startswith("loss."):
        return []
    p = {q.name: q.default for q in REGISTRY[formula].params} | dict(params)
    mask = np.asarray(arrays["mask"], dtype=bool)
    l, old = np.asarray(arrays["logprobs"], dtype=np.float64), np.asarray(arrays["old_logprobs"], dtype=np.float64)
    adv = np.asarray(arrays["advantages"], dtype=np.float64)
    a = adv if adv.ndim == 2 else np.broadcast_to(adv[:, None], l.shape)
    d = np.where(mask, l - old, 0.0)
    rows = mask.any(-1)
    found = []
    clamp = p.get("log_ratio_clamp")
    if clamp is not None:
        found.append(_sides("log-ratio clamp", "tokens", mask, within=np.abs(d) <= float(clamp),
                            clamped=np.abs(d) > float(clamp)))
        d = np.clip(d, -float(clamp), float(clamp))
    if _sequence_level(formula, p):
        found += _sequence_clip(d, mask, adv, rows, p)
    elif formula in ("loss.grpo", "loss.bnpo", "loss.dr_grpo", "loss.dapo", "loss.luspo"):
        found += _token_clip(d, mask, a, float(p["eps_low"]), float(p["eps_high"]))
    elif formula == "loss.cispo":
        found.append(_cispo(d, mask, p))
    elif formula == "loss.gmpo":
        lo, hi = -float(p["eps_low"]), float(p["eps_high"])
        found.append(_sides("log-ratio against [-eps_low, eps_high]", "tokens", mask, below=d < lo,
                            inside=(d >= lo) & (d <= hi), above=d > hi))
    elif formula == "loss.minirl":
        r = np.exp(d)
        dropped = ((a > 0) & (r > 1 + float(p["eps_high"]))) | ((a < 0) & (r < 1 - float(p["eps_low"])))
        found.append(_sides("decoupled-PPO mask", "tokens", mask, kept=~dropped, dropped=dropped))
        if p["is_cap"] is not None:
            v = l - np.asarray(arrays["sampler_logprobs"], dtype=np.float64)
            capped = np.exp(v) > float(p["is_cap"])
            found.append(_sides("weight against its cap is_cap", "tokens", mask & ~dropped, below=~capped,
                                capped=capped))
    elif formula == "loss.sapo":
        found.append(_sides("advantage's sign (tau_pos for A > 0, else tau_neg)", "tokens", mask, **{
            "A > 0": a > 0, "A <= 0": a <= 0}))
    elif formula == "loss.vespo":
        folded = arrays.get("sampler_logprobs")
        x = None if folded is None else np.where(mask, old - np.asarray(folded, dtype=np.float64), 0.0)
        found += _vespo(d, x, mask, adv, rows, p)
    if p.get("is_level", "none") != "none" and formula not in ("loss.vespo", "loss.minirl"):
        found.append(_is(old, np.asarray(arrays["sampler_logprobs"], dtype=np.float64), mask, rows, p))
    if p.get("opsm_delta") is not None:
        found.append(_opsm(l, np.asarray(arrays["sampler_logprobs"], dtype=np.float64), mask, adv, p))
    if p.get("entropy_quantile") is not None:
        found.append(_entropy(np.asarray(arrays["entropy"], dtype=np.float64), mask, p["entropy_quantile"]))
    if float(p.get("beta") or 0) and any(p.get(k) is not None for k in
                                         ("kl_log_ratio_min", "kl_log_ratio_max", "kl_output_min", "kl_output_max")):
        found.append(_kl(l, old, np.asarray(arrays["ref_logprobs"], dtype=np.float64), mask, p))
    return found


def _sides(name: str, unit: str, where: np.ndarray, **sides) -> Branch:
    """A Branch counting, for each side, the elements where both ``where`` and the side's condition hold."""
    at = {side: where & np.broadcast_to(cond, where.shape) for side, cond in sides.items()}
    return Branch(name, unit, {side: int(m.sum()) for side, m in at.items()}, at)


def _token_clip(d, mask, a, eps_low, eps_high) -> list:
    lo = math.log1p(-eps_low) if eps_low < 1 else -math.inf
    hi = math.log1p(eps_high)
    below, above = d < lo, d > hi
    sides = {"below": below} if eps_low < 1 else {}
    ratio = _sides("ratio against the clip range", "tokens", mask, **sides, inside=~below & ~above, above=above)
    clipped = (above & (a > 0)) | (below & (a < 0))
    term = _sides("PPO term", "tokens", mask & (a != 0), **{"-A r": ~clipped, "clipped constant": clipped})
    return [ratio, term]


def _sequence_clip(d, mask, adv, rows, p) -> list:
    L = np.maximum(mask.sum(-1), 1)
    s = np.where(mask, d, 0.0).sum(-1) / L
    eps_low, eps_high = float(p["eps_low"]), float(p["eps_high"])
    lo = math.log1p(-eps_low) if eps_low < 1 else -math.inf
    hi = math.log1p(eps_high)
    cap = p.get("log_ratio_max")
    capped = s > float(cap) if cap is not None else np.zeros_like(rows)
    below, above = (s < lo) & ~capped, (s > hi) & ~capped
    sides = {"below": below} if eps_low < 1 else {}
    sides.update(inside=~below & ~above & ~capped, above=above)
    if cap is not None:
        sides["capped (log_ratio_max)"] = capped
    a = adv if adv.ndim == 1 else np.where(mask, adv, 0.0).sum(-1) / L
    clipped = (above & (a > 0)) | (below & (a < 0)) | capped
    return [_sides("mean log-ratio against the clip range", "rows", rows, **sides),
            _sides("sequence term", "rows", rows & (a != 0), **{"-A s": ~clipped, "clipped constant": clipped})]


def _cispo(d, mask, p) -> Branch:
    r = np.exp(d)
    if p["cap_form"] == "absolute":
        return _sides("weight against its cap eps_high", "tokens", mask, below=r <= float(p["eps_high"]),
                      truncated=r > float(p["eps_high"]))
    hi = 1 + float(p["eps_high"])
    if p.get("eps_low") is None:
        return _sides("weight against its cap 1 + eps_high", "tokens", mask, below=r <= hi, truncated=r > hi)
    lo = 1 - float(p["eps_low"])
    return _sides("weight against [1 - eps_low, 1 + eps_high]", "tokens", mask, **{
        "truncated below": r < lo, "inside": (r >= lo) & (r <= hi), "truncated above": r > hi})


def _vespo(d, x, mask, adv, rows, p) -> list:
    """VESPO's clip of each folded sampler log-ratio x = l_old - l_sampler (None: no sampler log-probs),
    of the row's log-weight (from the clamped log-ratios d), and its (k, lambda) pair by the advantage's
    sign."""
    found = []
    s = np.where(mask, d, 0.0).sum(-1)
    lo, hi = math.log(float(p["min_weight"])), p["max_log_weight"]
    if x is not None:
        top = math.inf if hi is None else float(hi)
        found.append(_sides("sampler log-ratio clip", "tokens", mask, **{
            "below log min_weight": x < lo, "inside": (x >= lo) & (x <= top), "above max_log_weight": x > top}))
        s = s + np.where(mask, np.clip(x, lo, top), 0.0).sum(-1)
    sides = {"below log min_weight": s < lo}
    sides["inside"] = (s >= lo) & (s <= (math.inf if hi is None else float(hi)))
    if hi is not None:
        sides["above max_log_weight"] = s > float(hi)
    a = adv if adv.ndim == 1 else adv.sum(-1)
    found.append(_sides("row log-weight", "rows", rows, **sides))
    found.append(_sides("advantage's sign ((k, lambda) pair)", "rows", rows, **{"A >= 0": a >= 0, "A < 0": a < 0}))
    return found


_IS_SIDE = ("clamped at -c", "clamped at +c", "below is_c_min", "above is_c_max")


def _is(old, sampler, mask, rows, p) -> Branch:
    from .draws import is_branch as _is_branch

    u = np.where(mask, old - sampler, 0.0)
    where = mask
    if p["is_level"] != "token":
        u = u.sum(-1) / (np.maximum(mask.sum(-1), 1) if p["is_level"] == "geometric" else 1)
        where = rows
    code = _is_branch(u, p)
    c = p["is_log_ratio_clamp"]
    present = [c is not None, c is not None, p["is_c_min"] is not None and float(p["is_c_min"]) > 0,
               p["is_c_max"] is not None]
    how = "masked" if p["is_mode"] == "mask" else "truncated"
    sides = {"inside": code == 0}
    for k, label in enumerate(_IS_SIDE):
        if present[k]:
            sides[label + ("" if k < 2 else f" ({how})")] = ((code >> k) & 1).astype(bool)
    return _sides(f"IS log-weight, {p['is_level']} level", "tokens" if p["is_level"] == "token" else "rows", where,
                  **sides)


def _opsm(l, sampler, mask, adv, p) -> Branch:
    import torch

    from .terms import opsm_keep

    t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in (("l", l), ("s", sampler), ("m", mask), ("a", adv))}
    keep = opsm_keep(t["l"], t["s"], t["a"], t["m"], p).numpy()
    L = np.maximum(mask.sum(-1), 1)
    a = adv if adv.ndim == 1 else np.where(mask, adv, 0.0).sum(-1) / L
    if p["opsm_advantage_gate"] == "token" and adv.ndim == 2:
        return _sides("OPSM, tokens of negative advantage", "tokens", mask & (adv < 0), dropped=~keep, kept=keep)
    negative = mask.any(-1) & (a < 0)
    return _sides("OPSM, rows of negative advantage", "rows", negative, dropped=~keep.all(-1), kept=keep.all(-1))


def _entropy(entropy, mask, rho) -> Branch:
    import torch

    from .terms import entropy_keep

    keep = entropy_keep(torch.from_numpy(entropy), torch.from_numpy(mask), rho).numpy()
    return _sides("entropy mask", "tokens", mask, kept=keep, dropped=~keep)


_KL_SIDE = ("x below kl_log_ratio_min", "x above kl_log_ratio_max", "estimate below kl_output_min",
            "estimate above kl_output_max")


def _kl(l, old, ref, mask, p) -> Branch:
    from .draws import kl_branch as _kl_branch

    w = np.exp(l - old) if p["kl_estimator"] == "k3_unbiased" else 1.0
    code = _kl_branch(np.where(mask, ref - l, 0.0), w, p)
    sides = {"no clamp active": code == 0}
    for k, (name, label) in enumerate(zip(("kl_log_ratio_min", "kl_log_ratio_max", "kl_output_min", "kl_output_max"),
                                          _KL_SIDE)):
        if p[name] is not None:
            sides[label] = ((code >> k) & 1).astype(bool)
    return _sides(f"KL clamps ({p['kl_estimator']})", "tokens", mask, **sides)
