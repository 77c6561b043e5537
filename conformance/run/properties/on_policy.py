"""prop.on_policy: ratio = 1 => GSPO = GRPO sample-mean PG (value and gradient); clips inactive"""

from __future__ import annotations

from mpmath import mp, mpf

from pgspec.reference import REGISTRY, evaluate

from ._common import (Property, _assert_same, _batch, _need, _pylist, _s, call, compare, compare_to_ref, input_fields,
                      ref)


# formula -> (partner, how the partner is reduced to compare, whether values agree (else gradients only))
ON_POLICY = {
    "surrogate.ppo_clip": ("surrogate.pg", "token", True),
    "surrogate.dual_clip": ("surrogate.pg", "token", True),
    "surrogate.trl_delta": ("surrogate.pg", "token", True),
    "surrogate.cispo": ("surrogate.pg", "token", False),
    "surrogate.sapo": ("surrogate.pg", "token", False),
    "surrogate.gspo": ("surrogate.pg", "sequence", True),
    "surrogate.gmpo": ("surrogate.pg", "sequence", True),
    "loss.gspo": ("loss.grpo", "loss", True),
    "loss.gmpo": ("loss.grpo", "loss", True),
    "loss.sapo": ("loss.grpo", "loss", False),
}


def _on_policy_formulas():
    return tuple(f for f in ON_POLICY if f in REGISTRY and ON_POLICY[f][0] in REGISTRY)


def _on_policy_params(fid, src):
    p = {}
    if fid in ("surrogate.ppo_clip", "surrogate.dual_clip"):
        p = {"eps_low": src.choice((0.0, 0.2, 0.28)), "eps_high": src.choice((0.0, 0.2, 0.28))}
    if fid.startswith("loss."):
        p = {}
    return p


def _on_policy_build(src, fid):
    partner = ON_POLICY[fid][0]
    fields = tuple(dict.fromkeys(input_fields(fid) + input_fields(partner)))
    ex = _batch(src, fid, tuple(f for f in fields if f not in ("ref_logprobs",)))
    ex["inputs"]["old_logprobs"] = [list(row) for row in ex["inputs"]["logprobs"]]   # ratio = 1
    ex["params"] = _on_policy_params(fid, src)
    ex["partner_params"] = {"beta": 0.0} if partner == "loss.grpo" else {}
    return ex


def _partner_inputs(fid, ex):
    partner = ON_POLICY[fid][0]
    return {k: v for k, v in ex["inputs"].items() if k in input_fields(partner) or k == "old_logprobs"}


def _reduce_partner(fid, ex, p):
    """The partner's reference value (and gradient) in the shape of ``fid``'s result."""
    kind = ON_POLICY[fid][1]
    mask = ex["inputs"]["mask"]
    with mp.workdps(60):
        if kind == "sequence":
            vals = []
            for i, row in enumerate(mask):
                ts = [t for t, m in enumerate(row) if m]
                vals.append(mp.fsum(p["loss"][i][t] for t in ts) / len(ts) if ts else mpf(0))
            grad = [[(g / sum(row)) if row[t] else mpf(0) for t, g in enumerate(grow)]
                    for grow, row in zip(p["grad"]["logprobs"], mask)]
            return vals, grad
        return p["loss"], p["grad"]["logprobs"]


def _on_policy_reference(fid, ex):
    partner, _, values = ON_POLICY[fid]
    a = ref(fid, ex["inputs"], ex["params"])
    p = evaluate(partner, _partner_inputs(fid, ex), ex["partner_params"])
    value, grad = _reduce_partner(fid, ex, p)
    if values:
        _assert_same(f"{fid} at ratio 1 vs {partner}", a["loss"], value)
    _assert_same(f"{fid} gradient at ratio 1 vs {partner}", a["grad"]["logprobs"], grad)


def _on_policy_adapter(ctx, fid, ex):
    partner, _, values = ON_POLICY[fid]
    _need(ctx, fid)
    a = ref(fid, ex["inputs"], ex["params"])
    out, grads, _ = call(ctx, fid, ex["inputs"], ex["params"])
    label = f"{fid} at ratio 1 (logprobs = old_logprobs)"
    compare_to_ref(ctx, fid, label, out, grads, a)
    if partner in ctx.adapter.capabilities():
        pin = _partner_inputs(fid, ex)
        p = ref(partner, pin, ex["partner_params"])
        pout, pgrads, _ = call(ctx, partner, pin, ex["partner_params"])
        compare_to_ref(ctx, partner, f"{partner} at ratio 1 (the on-policy partner of {fid})", pout, pgrads, p)
        if ON_POLICY[fid][1] == "loss":
            if values:
                compare(ctx, f"{fid} vs the adapter's {partner} at ratio 1", _pylist(out["loss"]), p["loss"],
                        _s(p, "loss"), "loss")
            compare(ctx, f"{fid} gradient vs the adapter's {partner} at ratio 1", _pylist(grads["logprobs"]),
                    p["grad"]["logprobs"], _s(p, "grad.logprobs"), "loss")
    return ctx.worst



PROPERTY = Property("prop.on_policy", "On-policy (ratio = 1): GSPO = GRPO sample-mean PG, clips inactive",
                   _on_policy_formulas, _on_policy_build, _on_policy_reference, _on_policy_adapter)
