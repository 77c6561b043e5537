"""kl.* in PyTorch (spec/kl.md).

Every estimator is a function of the reference log-ratio x = l_ref - l, taken at unmasked positions
only (masked ones are selected away with torch.where, so NaN/inf there cannot leak).  Clamps are
torch.clamp (derivative 1 on the closed interval, 0 outside), with either bound optional; a token
that the output clamp holds at a bound takes the bound as a constant, so an estimate that
overflowed there cannot turn its zero gradient into NaN (``clamped_estimate``).

k3 = e^x - 1 - x is computed as expm1(x) - x, as spec/kl.md recommends (exp(x) - 1 - x cancels
for small |x|).  kl.k3_unbiased needs one more step: differentiated term by term, the gradient of
w k3(x) (w = e^(l - l_old)) is w k3(x) - w (e^x - 1), two numbers of size w e^x whose difference is
-w x, so autograd would lose every digit at x = 20.  Its backward is therefore written in closed
form (a small autograd.Function), as the reference does.
"""

from __future__ import annotations

import torch

from pgspec.reference import REGISTRY


def _param(params, fid, name):
    """A parameter by its spec name, defaulting to the reference registry's default."""
    if name in params:
        value = params[name]
    else:
        value = next(p.default for p in REGISTRY[fid].params if p.name == name)
    if value is None or isinstance(value, bool):
        return value
    return float(value)


def log_ratio(inputs):
    """x = l_ref - l at unmasked positions, 0 elsewhere."""
    x = inputs["ref_logprobs"] - inputs["logprobs"]
    return torch.where(inputs["mask"], x, torch.zeros_like(x))


def _clamp(y, lo, hi):
    if lo is None and hi is None:
        return y
    return torch.clamp(y, min=lo, max=hi)


def k1(x):
    return -x


def k2(x):
    return 0.5 * x * x


def k3(x):
    """e^x - 1 - x as expm1(x) - x."""
    return torch.expm1(x) - x


def k_abs(x):
    return torch.abs(x)


ESTIMATORS = {"kl.k1": k1, "kl.k2": k2, "kl.k3": k3, "kl.abs": k_abs}


def _bounds(fid, params):
    return tuple(_param(params, fid, n) for n in ("log_ratio_min", "log_ratio_max", "output_min", "output_max"))


def _held(y, c, d):
    """Where the output clamp holds y at a bound: where it changes y (outside [c, d]; the bounds
    themselves are inside, as torch.clamp has them)."""
    return _clamp(y, c, d) != y


def clamped_estimate(k, x, a, b, c, d):
    """clip(k(clip(x, a, b)), c, d).

    A token the output clamp holds at a bound has gradient 0, but its estimate may have overflowed
    (k3 at x > 88.7 in float32, x > 11 in float16), and 0 times the infinite derivative of the
    exponential is NaN.  So the held tokens' estimate is evaluated again at x = 0, where it is
    finite, and their value is the bound, a constant (the values are those of torch.clamp)."""
    xc = _clamp(x, a, b)
    if c is None and d is None:
        return k(xc)
    with torch.no_grad():
        # held is decided on the estimate formed in float64 from the dtype's x: in bfloat16, k3 = expm1(x) - x
        # at x = 0.859 is 0.5 (1.3594 - 0.8594) where it is 0.50245, beyond an output bound of 0.5
        y = k(xc.double())
        held, bound = _held(y, c, d), _clamp(y, c, d).to(xc.dtype)
    return torch.where(held, bound, k(torch.where(held, torch.zeros_like(xc), xc)))


def _estimator(fid):
    def run(inputs, params):
        a, b, c, d = _bounds(fid, params)
        return {"kl": clamped_estimate(ESTIMATORS[fid], log_ratio(inputs), a, b, c, d)}

    run.__name__ = fid.replace(".", "_")
    return run


def k3_straight_through(inputs, params):
    """sg[clip(k3(clip(x, a, b)), c, d)] + k2(x) - sg[k2(x)] (verl's k3+).

    The k2 score's straight-through term, of value 0 and gradient x, is formed as sg[x] (x - sg[x]),
    not as k2(x) - sg[k2(x)]: x^2 / 2 overflows float16 at |x| > 362 (inf - inf = NaN)."""
    a, b, c, d = _bounds("kl.k3_straight_through", params)
    x = log_ratio(inputs)
    value = clamped_estimate(k3, x, a, b, c, d)
    return {"kl": value.detach() + x.detach() * (x - x.detach())}


class _ImportanceWeightedK3(torch.autograd.Function):
    """y = w k3(clip(x, a, b)), w = exp(l - l_old), x = l_ref - l; dy/dl = -w x inside [a, b], and
    outside it 0 (w stopped, sg_ratio_where_clamped) or y (w live).  Where the output clamp [c, d]
    then holds y at a bound, dy/dl is stored as 0: the clamp's zero times an overflowed w would
    be NaN.  For the same reason a k3 or an x of exactly 0 gives y or dy/dl = 0 by selection, not
    as w * 0 (an on-reference token at l - l_old = 200 in float32)."""

    @staticmethod
    def forward(ctx, logprobs, old_logprobs, ref_logprobs, a, b, c, d, sg_ratio_where_clamped):
        w = torch.exp(logprobs - old_logprobs)
        x = ref_logprobs - logprobs
        xc = _clamp(x, a, b)
        zero = torch.zeros_like(x)
        k = k3(xc)
        # w overflows in float32 at l - l_old > 88.7: where k3 or x is exactly 0 the spec's product
        # is 0, so that 0 is selected, never formed as inf * 0 = NaN; where w or k3 alone leaves the
        # dtype's range (w = e^-768 = 0 next to k3(768) = inf in float64) the product is formed in log
        # space, e^(l - l_old + log k3(x)), with log k3(x) = x + log1p(-(1 + x) e^-x) for large x
        y = torch.where(k == 0, zero, w * k)
        apart = (k != 0) & (~torch.isfinite(w) | ~torch.isfinite(k) | (w == 0))
        if bool(apart.any()):
            xs = torch.where(apart, xc, zero)
            big = xs > 1
            log_k = torch.where(big, xs + torch.log1p(-(1 + xs) * torch.exp(-torch.where(big, xs, zero))),
                                torch.log(torch.where(big, torch.ones_like(xs), k3(xs))))
            y = torch.where(apart, torch.exp(logprobs - old_logprobs + log_k), y)
        inside = xc == x
        grad = torch.where(inside, torch.where(x == 0, zero, -(w * x)), zero if sg_ratio_where_clamped else y)
        grad = torch.where(_held(y, c, d), torch.zeros_like(grad), grad)
        ctx.save_for_backward(grad)
        return y

    @staticmethod
    def backward(ctx, g):
        (grad,) = ctx.saved_tensors
        return g * grad, None, None, None, None, None, None, None


def k3_unbiased(inputs, params):
    """clip(w k3(clip(x, a, b)), c, d) with w = exp(l - l_old) differentiated (DeepSeek-V3.2 Eq. 7)."""
    fid = "kl.k3_unbiased"
    a, b, c, d = _bounds(fid, params)
    m = inputs["mask"]
    lp = inputs["logprobs"]
    zero = torch.zeros_like(lp)
    lp = torch.where(m, lp, zero)
    old = torch.where(m, inputs["old_logprobs"], zero)
    ref = torch.where(m, inputs["ref_logprobs"], zero)
    y = _ImportanceWeightedK3.apply(lp, old, ref, a, b, c, d, bool(_param(params, fid, "sg_ratio_where_clamped")))
    return {"kl": _clamp(y, c, d)}


IMPLEMENTATIONS = {
    "kl.k1": _estimator("kl.k1"),
    "kl.k2": _estimator("kl.k2"),
    "kl.k3": _estimator("kl.k3"),
    "kl.abs": _estimator("kl.abs"),
    "kl.k3_straight_through": k3_straight_through,
    "kl.k3_unbiased": k3_unbiased,
}
