"""prop.gradient_fd: the gradient equals a high-precision finite difference (no stop-gradient).

Gradients are VJPs with the example's cotangent (``example_cotangent``, spec/golden-format.md
"Cotangent"), and the finite differences are of the same objective, sum_i c_i y_i over the unmasked
elements of the grad_of output."""

from __future__ import annotations

import math
from functools import lru_cache

from mpmath import mp, mpf

from pgspec.reference import REGISTRY, evaluate

from ...judge import compare as core
from ...judge import tolerance
from pgspec.reference._ad import _nest

from ._common import (EXCLUDED, Falsified, Property, Unsupported, _at, _flat, _fmt, _key, _need, _parts, _pylist, _s,
                      _torch, call, example_cotangent, formula_example, ref)


def _constant_sg():
    """Stop-gradients that sit on non-differentiable inputs only (the recipes' IS weight and OPSM
    decision): with those options off, the recipe's gradient is the plain derivative."""
    try:
        from pgspec.reference.loss import STOP_GRADIENTS
    except ImportError:
        return ()
    return tuple(STOP_GRADIENTS)


def _fd_formulas():
    const = set(_constant_sg())
    return tuple(fid for fid, f in sorted(REGISTRY.items())
                 if f.differentiable and not (set(f.stop_gradients) - const) and fid not in EXCLUDED)


def _fd_build(src, fid):
    ex = formula_example(src, fid, max_B=3, max_T=4, junk=True, options=True)
    return ex


def _cotangent(fid, ex):
    """The example's cotangent, shaped like the reference's grad_of output on it."""
    f = REGISTRY[fid]
    return example_cotangent("prop.gradient_fd", fid, ex, _nest(ref(fid, ex["inputs"], ex["params"])[f.grad_of]))


def _objective_value(fid, inputs, params, dps, cotangent):
    f = REGISTRY[fid]
    out = evaluate(fid, inputs, params, dps=dps)[f.grad_of]
    cs = dict(_flat(cotangent))
    with mp.workdps(dps):
        return mp.fsum(cs[p] * v for p, v in _flat(out) if v is not None and not isinstance(v, bool))


def _replace(x, path, value):
    if not path:
        return value
    x = list(x)
    x[path[0]] = _replace(x[path[0]], path[1:], value)
    return x


def _fd_reference(fid, ex):
    f = REGISTRY[fid]
    c = _cotangent(fid, ex)
    r = ref(fid, ex["inputs"], ex["params"], cotangent=c)
    dps = 110
    for name in f.differentiable:
        if name not in ex["inputs"]:
            continue
        for path, g in _flat(r["grad"][name]):
            with mp.workdps(dps):
                x0 = mpf(_at(ex["inputs"][name], path)) if mp.isfinite(mpf(_at(ex["inputs"][name], path))) else None
                mask = ex["inputs"].get("mask")
                if x0 is None or (mask is not None and not mask[path[0]][path[1]]):
                    if g != 0:
                        raise Falsified(f"{fid} grad.{name}{list(path)} = {_fmt(g)} at a masked position")
                    continue
                h = mpf(10) ** -25
                vals = {}
                for s in (-1, 0, 1):
                    inp = dict(ex["inputs"], **{name: _replace(ex["inputs"][name], path, mp.nstr(x0 + s * h, 100))})
                    vals[s] = _objective_value(fid, inp, ex["params"], dps, c)
                right, left = (vals[1] - vals[0]) / h, (vals[0] - vals[-1]) / h
                if abs(right - left) > mpf(10) ** -15 * (1 + abs(right) + abs(left)):
                    continue   # a kink (clip bound, tie, |x| at 0): the derivative is the spec's convention
                fd = (vals[1] - vals[-1]) / (2 * h)
                if abs(fd - g) > mpf(10) ** -20 * max(1, abs(fd)):
                    raise Falsified(f"{fid} grad.{name}{list(path)} = {_fmt(g)}, finite difference {_fmt(fd)}")


@lru_cache(maxsize=4096)
def _adapter_fd(adapter_key, fid, key):
    """Central differences of the adapter's float64 objective (cached per adapter and example)."""
    ctx, ex = _FD_CTX[adapter_key], _parts(key)[0]
    torch = _torch()
    f = REGISTRY[fid]
    c = _cotangent(fid, ex)

    def objective(inputs):
        tensors = core.to_tensors(fid, inputs, "float64", ctx.device)
        with torch.no_grad():
            out = ctx.adapter.call(fid, tensors, dict(ex["params"]))
            return float(core.objective(out[f.grad_of], tensors.get("mask"), c))

    res = {}
    f0 = objective(ex["inputs"])
    for name in f.differentiable:
        if name not in ex["inputs"]:
            continue
        mask = ex["inputs"].get("mask")
        for path, x in _flat(ex["inputs"][name]):
            if mask is not None and not mask[path[0]][path[1]]:
                continue
            h = 2.0 ** -20 * max(1.0, abs(x))
            fp = objective(dict(ex["inputs"], **{name: _replace(ex["inputs"][name], path, x + h)}))
            fm = objective(dict(ex["inputs"], **{name: _replace(ex["inputs"][name], path, x - h)}))
            right, left = (fp - f0) / h, (f0 - fm) / h
            err = 16 * 2.0 ** -53 * (abs(fp) + abs(fm) + abs(f0)) / h
            if abs(right - left) > 1e-3 * (1 + abs(right) + abs(left)):
                continue   # a kink: not comparable
            res[(name, path)] = ((fp - fm) / (2 * h), err + abs(right - left))
    return res


_FD_CTX: dict = {}


def _fd_adapter(ctx, fid, ex):
    _need(ctx, fid)
    if "float64" not in ctx.adapter.dtypes:
        raise Unsupported(f"{ctx.adapter.name} has no float64: no finite difference to compare with")
    c = _cotangent(fid, ex)
    r = ref(fid, ex["inputs"], ex["params"], cotangent=c)
    out, grads, _ = call(ctx, fid, ex["inputs"], ex["params"], cotangent=c)
    akey = f"{ctx.adapter.name}:{id(ctx.adapter)}"
    _FD_CTX[akey] = ctx
    fds = _adapter_fd(akey, fid, _key(ex))
    family = REGISTRY[fid].family
    worst = 0.0
    for (name, path), (fd, err) in fds.items():
        got = _at(_pylist(grads[name]), path)
        scale = _s(r, f"grad.{name}", *path)
        if scale is None:
            scale = abs(_at(r["grad"][name], path))
        bound = float(tolerance.bound(family, ctx.dtype, scale)) + err
        ratio = abs(got - fd) / bound if bound else (0.0 if got == fd else math.inf)
        worst = max(worst, ratio)
        if not abs(got - fd) <= bound:
            raise Falsified(f"{fid} grad.{name}{list(path)}: autograd {got!r}, central finite difference of the "
                            f"adapter's float64 value {fd!r} (bound {bound:.3g}): a wrong backward or a misplaced "
                            f"detach?")
    ctx.note(worst)
    return ctx.worst



PROPERTY = Property("prop.gradient_fd", "Gradient = high-precision finite difference where no stop-gradient applies",
                   _fd_formulas, _fd_build, _fd_reference, _fd_adapter)
