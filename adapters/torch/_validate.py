"""Input and parameter validation of the torch backend: it rejects what the spec rejects.

Every implementation of the backend is wrapped by :func:`validated`, which raises
``pgspec.reference.SpecError`` naming the argument before any arithmetic:

* parameters: unknown names, values outside the registry's range (the spec's parameter tables),
  and bounds that must be ordered (``*_min < *_max`` for the KL clamps; ``<=`` for the others);
* inputs: a required input missing, an input whose shape does not fit the formula's declared shapes
  consistently (B, T and V the same across inputs), a mask that is not boolean, and NaN or an
  infinity at an unmasked position of a real [B,T] input.
"""

from __future__ import annotations

import functools

import torch

from pgspec.reference import REGISTRY, SpecError
from pgspec.reference._evaluate import check_params

# (lower, upper, strict): pairs of bounds the spec orders
ORDERED = (("log_ratio_min", "log_ratio_max", True), ("output_min", "output_max", True),
           ("kl_log_ratio_min", "kl_log_ratio_max", True), ("kl_output_min", "kl_output_max", True),
           ("c_min", "c_max", False), ("lower", "upper", False))


# A run calls a formula with the same parameters many times (each dtype, most cases of a family), and
# checking a set costs a conversion of every value to an exact number: a set that passed is
# remembered by its exact values (each value's type, a float by its bits), so it is checked once.
# A set that fails is never remembered: it is checked, and rejected, every time.
_PASSED: set = set()
_PASSED_MAX = 1 << 16


def _params_key(fid: str, params) -> tuple | None:
    """The exact identity of (fid, params), or None when a value is not a plain one (then no caching)."""
    if type(params) is not dict:
        return None
    items = []
    for name, value in params.items():
        kind = type(value)
        if kind is float:
            value = value.hex()             # -0.0 and 0.0 apart; NaN equal to itself (never passes)
        elif not (value is None or kind in (bool, int, str)):
            return None
        items.append((name, kind, value))
    return fid, tuple(items)


def check_parameters(fid: str, params: dict) -> None:
    key = _params_key(fid, params)
    if key is not None and key in _PASSED:
        return
    _check_parameters(fid, params)
    if key is not None:
        if len(_PASSED) >= _PASSED_MAX:
            _PASSED.clear()
        _PASSED.add(key)


def _check_parameters(fid: str, params: dict) -> None:
    check_params(REGISTRY[fid], params)   # unknown names and ranges, SpecError naming the parameter
    f = REGISTRY[fid]
    values = {p.name: params.get(p.name, p.default) for p in f.params}
    for lo, hi, strict in ORDERED:
        a, b = values.get(lo), values.get(hi)
        if a is None or b is None:
            continue
        if float(a) > float(b) or (strict and float(a) == float(b)):
            raise SpecError(f"{fid}: parameter {lo!r} must be {'less than' if strict else '<='} {hi!r}, "
                            f"got {lo}={a} and {hi}={b}")


def check_inputs(fid: str, inputs: dict) -> None:
    f = REGISTRY[fid]
    names = {i.name for i in f.inputs}
    unknown = sorted(set(inputs) - names)
    if unknown:
        raise SpecError(f"{fid}: unknown input(s) {unknown}; inputs are: {', '.join(sorted(names))}")
    dims: dict = {}
    for spec in f.inputs:
        if spec.name not in inputs or inputs[spec.name] is None:
            if not spec.optional:
                raise SpecError(f"{fid}: missing input {spec.name!r} (expected shape "
                                f"{' or '.join('[' + ','.join(map(str, s)) + ']' for s in spec.shapes)})")
            continue
        t = inputs[spec.name]
        shape = tuple(t.shape)
        fits = []
        for s in spec.shapes:
            if len(s) != len(shape):
                continue
            bound = dict(dims)
            ok = True
            for sym, n in zip(s, shape):
                if isinstance(sym, int):
                    ok = ok and sym == n
                elif bound.setdefault(sym, n) != n:
                    ok = False
            if ok:
                fits.append(bound)
        if not fits:
            want = " or ".join("[" + ",".join(map(str, s)) + "]" for s in spec.shapes)
            got = ", ".join(f"{k}={v}" for k, v in sorted(dims.items()))
            raise SpecError(f"{fid}: input {spec.name!r} must have shape {want}"
                            f"{' with ' + got if got else ''}, got {list(shape)}")
        dims = fits[0]
        if spec.kind == "bool" and t.dtype != torch.bool:
            raise SpecError(f"{fid}: input {spec.name!r} must be boolean, got {t.dtype}")
    mask = inputs.get("mask")
    if mask is None:
        return
    for spec in f.inputs:
        t = inputs.get(spec.name)
        if spec.kind != "real" or t is None or tuple(t.shape[:2]) != tuple(mask.shape) or not t.is_floating_point():
            continue
        finite = torch.isfinite(t.detach())
        if bool(finite.all()):
            continue        # one pass over the input: no position to look at (the usual case)
        m = mask.reshape(tuple(mask.shape) + (1,) * (t.dim() - 2)).expand_as(t)
        if not bool((finite | ~m).all()):
            raise SpecError(f"{fid}: input {spec.name!r} must be finite where mask is true "
                            "(NaN or an infinity at an unmasked position)")


def validated(fid: str, fn):
    """fn with the formula's inputs and parameters checked first."""

    @functools.wraps(fn)
    def run(inputs, params):
        check_parameters(fid, params)
        check_inputs(fid, inputs)
        return fn(inputs, params)

    return run
