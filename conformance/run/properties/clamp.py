"""prop.clamp: clamp bounds hold at any input; clamped tokens have zero gradient on the clamped side"""

from __future__ import annotations

import zlib

from mpmath import mp, mpf

from pgspec.reference import REGISTRY

from ...corpus import strategies as pst
from ...judge import tolerance
from ._common import (Falsified, Property, REF_DIGITS, _batch, _fmt, _need, _pylist, call, compare_to_ref,
                      formula_example, input_fields, ref)


def _kl_estimate(fid, x):
    return {"kl.k1": -x, "kl.k2": x * x / 2, "kl.k3": mp.expm1(x) - x, "kl.abs": abs(x)}[fid]


def _memo(f):
    """``f`` (a pure function of one hashable argument) evaluated once per distinct argument."""
    seen: dict = {}

    def g(x):
        try:
            return seen[x]
        except KeyError:
            v = seen[x] = f(x)
            return v
        except TypeError:       # not hashable
            return f(x)

    return g


def _clamp_checks(fid, ex, out, grad, tol, closed_form=True, largest=None):
    """Violations of the clamp spec of ``fid`` in (out, grad) (nested lists of floats or mpf).
    ``tol(value)`` is the slack allowed in a bound comparison (0 on the reference); ``largest`` the
    largest finite value of the adapter's dtype (None on the reference)."""
    with mp.workdps(60):
        return _apply(_plan(fid, ex), out, grad, _memo(tol), closed_form, largest)


def _overflowed(v, lo, hi, largest) -> bool:
    """An infinity that a value within [lo, hi] may round to: the bound on its side lies beyond the
    dtype's largest finite value (e^20 in float16), as the tolerance model's overflow clause has it
    (spec/tolerance.md); whether the value itself should overflow, the comparison with the
    reference judges."""
    if largest is None or not mp.isinf(v):
        return False
    side = hi if v > 0 else lo
    return side is not None and abs(side) > largest


def _apply(plan, out, grad, tol, closed_form, largest=None):
    """The checks of ``plan`` (``_plan``) on one result, in the plan's order."""
    bad = []

    def within(label, v, lo, hi):
        if v is None:
            return
        v = mpf(v)
        if _overflowed(v, lo, hi, largest):
            return
        if not mp.isfinite(v) or (lo is not None and v < lo - tol(lo)) or (hi is not None and v > hi + tol(hi)):
            bad.append(f"{label} = {_fmt(v)} outside [{_fmt(lo)}, {_fmt(hi)}]")

    for op, label, *args in plan:
        key = _reads(op, args)
        if (grad is None) if key is None else (key not in out):
            continue                            # an output the adapter does not give (as in its golden cases)
        if op == "within":                      # out[key][i][t] (t None: out[key][i]) within [lo, hi]
            key, i, t, lo, hi = args
            within(label, out[key][i][t] if t is not None else out[key][i], lo, hi)
        elif op == "row":                       # every value of out[key][i] (a row or one value) <= hi
            key, i, hi = args
            row = out[key][i]
            for v in (row if isinstance(row, list) else [row]):
                within(label, v, None, hi)
        elif op == "kept":                      # a weight kept (not 0) at an unmasked token within [lo, hi]
            i, t, m, lo, hi = args
            w = out["weight"][i][t]
            if m and w is not None and mpf(w) != 0:
                within(label, w, lo, hi)
        elif op == "kl":                        # the clamped estimate, in closed form (the reference only)
            i, t, want, text = args
            v = out["kl"][i][t]
            if closed_form and (v is None or not mp.isfinite(mpf(v))
                                or abs(mpf(v) - want) > tol(want) + mpf(10) ** -REF_DIGITS * (1 + abs(want))):
                bad.append(f"kl[{i}][{t}] = {_fmt(v)} {text}")
        else:                                   # "zero": the gradient at a clamped token
            i, t = args
            g = grad[i][t]
            if g != 0:
                bad.append(f"{label}: gradient {_fmt(g)} on the clamped side (must be exactly 0)")
    return bad


def _reads(op, args):
    """The output a check of the plan reads (None: the gradient, given apart)."""
    return {"within": lambda: args[0], "row": lambda: args[0], "kept": lambda: "weight",
            "kl": lambda: "kl"}.get(op, lambda: None)()


_PLANS: dict = {}


def _plan(fid, ex) -> list:
    """The checks of the clamp spec of ``fid`` on example ``ex``, in order: what they read of a
    result and the bounds they hold it to.  They depend on the example only (the log-ratios, which
    tokens are clamped): made once per example and used for every dtype (at 60 digits)."""
    key = (fid, id(ex))
    hit = _PLANS.get(key)
    if hit is not None and hit[0] is ex:
        return hit[1]
    plan = _make_plan(fid, ex)
    if len(_PLANS) > 4096:
        _PLANS.clear()
    _PLANS[key] = (ex, plan)
    return plan


def _kl_log_ratios(p, rows, mask, d):
    """(i, t, x, x clamped to [log_ratio_min, log_ratio_max]) at every unmasked token, x = l_ref - l."""
    a, b = p.get("log_ratio_min"), p.get("log_ratio_max")
    for i in rows:
        for t, m in enumerate(mask[i]):
            if m:
                x = d(i, t, "ref_logprobs", "logprobs")
                yield i, t, x, (min(max(x, mpf(a)), mpf(b)) if a is not None else x)


def _make_plan(fid, ex) -> list:
    p, inputs = ex["params"], ex["inputs"]
    mask = inputs["mask"]
    plan = []
    exp = _memo(lambda x: mp.exp(mpf(x)))
    rows = range(len(mask))

    def d(i, t, a="logprobs", b="old_logprobs"):
        return mpf(inputs[a][i][t]) - mpf(inputs[b][i][t])

    if fid == "ratio.token":
        c = mpf(p["log_ratio_clamp"])
        for i in rows:
            for t, m in enumerate(mask[i]):
                if m:
                    plan.append(("within", f"ratio[{i}][{t}]", "ratio", i, t, exp(-c), exp(c)))
                    if abs(d(i, t)) > c:
                        plan.append(("zero", f"ratio[{i}][{t}]", i, t))
    elif fid == "ratio.sequence_product":
        c = mpf(p["log_ratio_clamp"])
        for i in rows:
            plan.append(("within", f"ratio[{i}]", "ratio", i, None, exp(-c), exp(c)))
            if abs(mp.fsum(d(i, t) for t, m in enumerate(mask[i]) if m)) > c:
                for t, m in enumerate(mask[i]):
                    if m:
                        plan.append(("zero", f"ratio[{i}] token {t}", i, t))
    elif fid in ("ratio.sequence_geometric", "ratio.gspo_token"):
        c = mpf(p["log_ratio_max"])
        for i in rows:
            plan.append(("row", f"ratio[{i}]", "ratio", i, exp(c)))
            ts = [t for t, m in enumerate(mask[i]) if m]
            if fid == "ratio.sequence_geometric" and ts and mp.fsum(d(i, t) for t in ts) / len(ts) > c:
                for t in ts:
                    plan.append(("zero", f"ratio[{i}] token {t}", i, t))
    elif fid.startswith("is.") and fid.endswith(".truncate"):
        lo = mpf(p["c_min"]) if p.get("c_min") is not None else None
        hi = mpf(p["c_max"]) if p.get("c_max") is not None else None
        for i in rows:
            for t, m in enumerate(mask[i]):
                if m:
                    plan.append(("within", f"weight[{i}][{t}]", "weight", i, t, lo, hi))
    elif fid.startswith("is.") and fid.endswith(".mask"):
        lo, hi = mpf(p["c_min"]), mpf(p["c_max"])
        for i in rows:
            for t, m in enumerate(mask[i]):
                plan.append(("kept", f"weight[{i}][{t}] (kept)", i, t, m, lo, hi))
    elif fid in ("kl.k1", "kl.k2", "kl.k3", "kl.abs"):
        a, b = p.get("log_ratio_min"), p.get("log_ratio_max")
        lo, hi = p.get("output_min"), p.get("output_max")
        for i, t, x, xc in _kl_log_ratios(p, rows, mask, d):
            want = _kl_estimate(fid, xc)
            if lo is not None:
                want = min(max(want, mpf(lo)), mpf(hi))
            text = (f"at x = {_fmt(x)}, but the clamp of x to [{a}, {b}] comes first: {fid} of the clamped x"
                    f"{' then clamped to the output bounds' if lo is not None else ''} is {_fmt(want)}")
            plan.append(("kl", None, i, t, want, text))
            if (a is not None and (x < mpf(a) or x > mpf(b))) or (lo is not None and not (mpf(lo) < want < mpf(hi))):
                plan.append(("zero", f"kl[{i}][{t}]", i, t))
    elif fid == "surrogate.ppo_clip":
        el, eh = mpf(p["eps_low"]), mpf(p["eps_high"])
        for i in rows:
            for t, m in enumerate(mask[i]):
                if not m:
                    continue
                A = mpf(inputs["advantages"][i]) if not isinstance(inputs["advantages"][i], list) else mpf(inputs["advantages"][i][t])
                r = exp(d(i, t))
                if (A > 0 and r > 1 + eh) or (A < 0 and r < 1 - el):
                    plan.append(("zero", f"loss[{i}][{t}] (A = {_fmt(A)}, r = {_fmt(r)})", i, t))
    elif fid in ("surrogate.pg", "surrogate.sapo", "surrogate.dual_clip"):
        # the clamped log-ratio makes r (so the loss) a constant: zero gradient where |d| > c; the dual
        # clip also where the PPO clip or its cap -c A takes effect
        c = mpf(p["log_ratio_clamp"]) if p.get("log_ratio_clamp") is not None else None
        for i in rows:
            for t, m in enumerate(mask[i]):
                if not m:
                    continue
                x = d(i, t)
                if c is not None and abs(x) > c:
                    plan.append(("zero", f"loss[{i}][{t}] (d = {_fmt(x)} clamped)", i, t))
                elif fid == "surrogate.dual_clip":
                    adv = inputs["advantages"][i]
                    A = mpf(adv[t] if isinstance(adv, list) else adv)
                    r = exp(x)
                    el, eh, cap = mpf(p.get("eps_low", 0.2)), mpf(p.get("eps_high", 0.2)), mpf(p.get("c", 3.0))
                    if (A > 0 and r > 1 + eh) or (A < 0 and (r < 1 - el or r > cap)):
                        plan.append(("zero", f"loss[{i}][{t}] (A = {_fmt(A)}, r = {_fmt(r)})", i, t))
    elif fid == "surrogate.gspo":
        # s = exp(min(mean_t clip(d, -k, k), c)): a token clamped by k has no derivative, nor does any
        # token of a sequence whose clamped mean is capped by c
        k = mpf(p["log_ratio_clamp"]) if p.get("log_ratio_clamp") is not None else None
        cap = mpf(p["log_ratio_max"]) if p.get("log_ratio_max") is not None else None
        for i in rows:
            ts = [t for t, m in enumerate(mask[i]) if m]
            xs = {t: d(i, t) for t in ts}
            clamped = {t: (min(max(x, -k), k) if k is not None else x) for t, x in xs.items()}
            capped = bool(ts) and cap is not None and mp.fsum(clamped.values()) / len(ts) > cap
            for t in ts:
                if capped or clamped[t] != xs[t]:
                    plan.append(("zero", f"loss[{i}] token {t}", i, t))
    elif fid in ("kl.k3_straight_through", "kl.k3_unbiased"):
        a, b = p.get("log_ratio_min"), p.get("log_ratio_max")
        lo, hi = p.get("output_min"), p.get("output_max")
        for i, t, x, xc in _kl_log_ratios(p, rows, mask, d):
            if fid == "kl.k3_straight_through":   # value k3 of the clamped x, gradient k2' (never 0 by clamping)
                want = _kl_estimate("kl.k3", xc)
                if lo is not None:
                    want = min(max(want, mpf(lo)), mpf(hi))
                plan.append(("kl", None, i, t, want, f"at x = {_fmt(x)}: k3 of the clamped x "
                             f"(clamped to [{a}, {b}], then to [{lo}, {hi}]) is {_fmt(want)}"))
                continue
            if lo is not None or hi is not None:   # unbounded: w = e^200 may overflow, as the reference's value
                plan.append(("within", f"kl[{i}][{t}]", "kl", i, t, mpf(lo) if lo is not None else None,
                             mpf(hi) if hi is not None else None))
            w = exp(d(i, t))
            y = w * _kl_estimate("kl.k3", xc)
            if (xc != x and p.get("sg_ratio_where_clamped", True)) or \
                    (lo is not None and not (mpf(lo) < y < mpf(hi))):
                plan.append(("zero", f"kl[{i}][{t}]", i, t))
    elif fid == "surrogate.cispo":
        if p.get("cap_form") == "absolute":
            lo, hi = None, mpf(p["eps_high"])
        else:
            lo, hi = 1 - mpf(p["eps_low"]), 1 + mpf(p["eps_high"])
        for i in rows:
            for t, m in enumerate(mask[i]):
                if m:
                    plan.append(("within", f"weight[{i}][{t}]", "weight", i, t, lo, hi))
    return plan


CLAMP_PARAMS = {
    "ratio.token": ({"log_ratio_clamp": 20.0}, {"log_ratio_clamp": 0.125}),
    "ratio.sequence_product": ({"log_ratio_clamp": 20.0}, {"log_ratio_clamp": 1.0}),
    "ratio.sequence_geometric": ({"log_ratio_max": 10.0}, {"log_ratio_max": 0.0625}),
    "ratio.gspo_token": ({"log_ratio_max": 10.0}, {"log_ratio_max": 0.0625}),
    "is.token.truncate": ({"c_min": 0.5, "c_max": 2.0},),
    "is.sequence.truncate": ({"c_min": 0.5, "c_max": 2.0, "log_ratio_clamp": 20.0},),
    "is.geometric.truncate": ({"c_min": 0.5, "c_max": 2.0},),
    "is.token.mask": ({"c_min": 0.5, "c_max": 5.0},),
    "is.sequence.mask": ({"c_min": 0.5, "c_max": 5.0, "log_ratio_clamp": 20.0},),
    "is.geometric.mask": ({"c_min": 0.5, "c_max": 5.0},),
    "kl.k1": ({"log_ratio_min": -20.0, "log_ratio_max": 20.0, "output_min": -10.0, "output_max": 10.0},
              {"log_ratio_min": -1.0, "log_ratio_max": 1.0}),
    "kl.k2": ({"log_ratio_min": -20.0, "log_ratio_max": 20.0, "output_min": -10.0, "output_max": 10.0},
              {"log_ratio_min": -1.0, "log_ratio_max": 1.0}),
    "kl.k3": ({"log_ratio_min": -20.0, "log_ratio_max": 20.0, "output_min": -10.0, "output_max": 10.0},
              {"log_ratio_min": -20.0, "log_ratio_max": 20.0}, {"log_ratio_min": -1.0, "log_ratio_max": 1.0}),
    "kl.abs": ({"log_ratio_min": -20.0, "log_ratio_max": 20.0, "output_min": -10.0, "output_max": 10.0},),
    "surrogate.ppo_clip": ({"eps_low": 0.2, "eps_high": 0.28, "log_ratio_clamp": 20.0}, {"eps_low": 0.2, "eps_high": 0.2}),
    "surrogate.pg": ({"log_ratio_clamp": 20.0}, {"log_ratio_clamp": 0.125}),
    "surrogate.sapo": ({"log_ratio_clamp": 20.0}, {"log_ratio_clamp": 0.125}),
    "surrogate.dual_clip": ({"log_ratio_clamp": 20.0}, {"c": 1.5, "eps_high": 1.0}),
    "surrogate.gspo": ({"log_ratio_clamp": 20.0, "log_ratio_max": 10.0}, {"log_ratio_clamp": 0.125, "log_ratio_max": 0.0625}),
    "kl.k3_straight_through": ({"log_ratio_min": -20.0, "log_ratio_max": 20.0, "output_min": -10.0, "output_max": 10.0},
                               {"log_ratio_min": -1.0, "log_ratio_max": 1.0}),
    "kl.k3_unbiased": ({"log_ratio_min": -20.0, "log_ratio_max": 20.0, "output_min": -10.0, "output_max": 10.0},
                       {"log_ratio_min": -1.0, "log_ratio_max": 1.0, "sg_ratio_where_clamped": True}),
    "surrogate.cispo": ({"cap_form": "relative", "eps_low": 0.2, "eps_high": 0.28},
                        {"cap_form": "absolute", "eps_high": 5.0}),
}


# Clamped formulas the clamp property does not check, and why (strategy_coverage.option_coverage requires every
# other formula with a clamp parameter in CLAMP_PARAMS)
NOT_CLAMP_CHECKED = {
    "surrogate.vespo": "its clamps act on sg[phi], a weight without gradient whose value the golden cases pin; "
                       "no output bound or zero gradient follows from them",
    "is.reject": "its log-weight clamp only feeds a keep decision (flags compared exactly by the golden cases); "
                 "no output bound or gradient",
}


def _clamp_formulas():
    return tuple(f for f in CLAMP_PARAMS if f in REGISTRY)


def _example(src, fid, **kw):
    """formula_example, with old_logprobs for surrogate.pg (optional there: without it d = 0, no clamp)."""
    if fid == "surrogate.pg":
        return _batch(src, fid, input_fields(fid) + ("old_logprobs",), **kw)
    return formula_example(src, fid, **kw)


def _clamp_build(src, fid):
    ex = _example(src, fid, extreme=True, mismatch=48)
    ex["params"] = dict(src.choice(CLAMP_PARAMS[fid]))
    return ex


def _clamp_extra(fid):
    """Every parameter set of the formula on one batch with log-ratios of +-20 and +-200."""
    out = []
    for k, params in enumerate(CLAMP_PARAMS[fid]):
        ex = _example(pst.SeededSource(zlib.crc32(f"clamp/{fid}/{k}".encode())), fid, extreme=True, B=4, T=6,
                             empty=False)
        ex["params"] = dict(params)
        out.append(ex)
    return out


def _clamp_reference(fid, ex):
    r = ref(fid, ex["inputs"], ex["params"])
    bad = _clamp_checks(fid, ex, r, r["grad"].get("logprobs"), lambda v: 0)
    if bad:
        raise Falsified(f"{fid} {ex['params']}: " + "; ".join(bad[:3]))


def _clamp_adapter(ctx, fid, ex):
    _need(ctx, fid)
    r = ref(fid, ex["inputs"], ex["params"])
    out, grads, _ = call(ctx, fid, ex["inputs"], ex["params"])
    family = REGISTRY[fid].family
    got = {k: _pylist(v) for k, v in out.items() if k != "grad"}
    g = _pylist(grads["logprobs"]) if "logprobs" in grads else None
    bad = _clamp_checks(fid, ex, got, g, lambda v: tolerance.bound(family, ctx.dtype, abs(mpf(v))) if v is not None else 0,
                        closed_form=False,   # values: compared with the reference below, with its scales
                        largest=tolerance.LARGEST[ctx.dtype])
    if bad:
        raise Falsified(f"{fid} {ex['params']}: " + "; ".join(bad[:3]))
    compare_to_ref(ctx, fid, f"{fid} {ex['params']} at log-ratios up to +-200", out, grads, r)
    return ctx.worst



PROPERTY = Property("prop.clamp", "Clamp bounds hold at any input; zero gradient on the clamped side",
                   _clamp_formulas, _clamp_build, _clamp_reference, _clamp_adapter, _clamp_extra)
