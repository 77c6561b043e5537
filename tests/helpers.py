"""Shared checks for the reference's own tests: finite differences, precision, random inputs.

Each check recomputes with the public ``evaluate`` only, so it tests the reference as a user
calls it.
"""

from __future__ import annotations

import functools
import random

from mpmath import mp, mpf

from pgspec.reference import REGISTRY, evaluate


def _flat(x, path=()):
    if isinstance(x, list):
        for k, item in enumerate(x):
            yield from _flat(item, path + (k,))
    else:
        yield path, x


def _get(x, path):
    for k in path:
        x = x[k]
    return x


def _set(x, path, value):
    for k in path[:-1]:
        x = x[k]
    x[path[-1]] = value


def _deepcopy(x):
    return [_deepcopy(i) for i in x] if isinstance(x, list) else x


def objective_sum(formula_id, inputs, params, dps):
    """Sum of all elements of the formula's grad_of output (None at masked positions skipped)."""
    f = REGISTRY[formula_id]
    out = evaluate(formula_id, inputs, params, dps=dps)[f.grad_of]
    with mp.workdps(dps):
        return mp.fsum(v for _, v in _flat(out) if v is not None and not isinstance(v, bool))


def check_gradient_fd(formula_id, inputs, params=None, *, h="1e-25", dps=110, digits=25, skip=()):
    """Every reported gradient element equals a central finite difference to ``digits`` digits.

    Masked positions must have an exact zero gradient.  ``skip`` lists input names not to check.
    Returns the number of elements checked.
    """
    f = REGISTRY[formula_id]
    ref = evaluate(formula_id, inputs, params)
    mask = inputs.get("mask")
    checked = 0
    for name in f.differentiable:
        if name in skip or name not in inputs:
            continue
        for path, g in _flat(ref["grad"][name]):
            if mask is not None and len(path) >= 2 and not mask[path[0]][path[1]]:
                assert g == 0, f"{formula_id}: grad {name}{list(path)} at a masked position is {g}, not 0"
                continue
            with mp.workdps(dps):
                step = mpf(h)
                x0 = mpf(_get(inputs[name], path))
                plus = _deepcopy(inputs[name]); _set(plus, path, x0 + step)
                minus = _deepcopy(inputs[name]); _set(minus, path, x0 - step)
                fp = objective_sum(formula_id, {**inputs, name: plus}, params, dps)
                fm = objective_sum(formula_id, {**inputs, name: minus}, params, dps)
                fd = (fp - fm) / (2 * step)
                tol = mpf(10) ** (-digits) * max(abs(fd), mpf(1))
                assert abs(fd - g) <= tol, (
                    f"{formula_id}: d/d{name}{list(path)}: reference gradient {mp.nstr(g, 30)} "
                    f"!= finite difference {mp.nstr(fd, 30)} (params {params})"
                )
            checked += 1
    return checked


def _agree(a, b, digits):
    if a is None or b is None or isinstance(a, (bool, int)) and not isinstance(a, mpf):
        return a == b
    if a == b:
        return True
    scale = max(abs(a), abs(b))
    return abs(a - b) <= scale * mpf(10) ** (-digits)


def check_precision(formula_id, inputs, params=None, *, digits=35):
    """Outputs and gradients at dps=60 agree with dps=100 to ``digits`` significant digits."""
    lo = evaluate(formula_id, inputs, params, dps=60)
    hi = evaluate(formula_id, inputs, params, dps=100)
    with mp.workdps(100):
        for key in lo:
            if key == "grad":
                pairs = [(f"grad.{n}", lo["grad"][n], hi["grad"][n]) for n in lo["grad"]]
            else:
                pairs = [(key, lo[key], hi[key])]
            for label, a, b in pairs:
                for (path, x), (_, y) in zip(_flat(a), _flat(b)):
                    assert _agree(x, y, digits), (
                        f"{formula_id}: {label}{list(path)} differs between dps=60 and dps=100: "
                        f"{mp.nstr(x, 50)} vs {mp.nstr(y, 50)}"
                    )


def bf16_round(x: float) -> float:
    """Round a float to the nearest bfloat16 value (round half to even), as a Python float."""
    import struct

    bits = struct.unpack(">I", struct.pack(">f", x))[0]
    lsb = (bits >> 16) & 1
    bits = (bits + 0x7FFF + lsb) & 0xFFFF0000
    return struct.unpack(">f", struct.pack(">I", bits))[0]


def random_logprobs(rng: random.Random, B: int, T: int, lo=-6.0, hi=-0.01):
    return [[bf16_round(rng.uniform(lo, hi)) for _ in range(T)] for _ in range(B)]


def random_mask(rng: random.Random, B: int, T: int, p=0.8, min_len=1):
    """Right-padded masks: each row has a length in [min_len, T]."""
    rows = []
    for _ in range(B):
        n = rng.randint(min_len, T) if rng.random() < p else T
        rows.append([t < n for t in range(T)])
    return rows


def torch_adapter_with(**overrides):
    """The built-in torch adapter with some implementations replaced: ``family__name=fn`` replaces
    formula ``family.name`` (the deliberately broken variants of the torch tests)."""
    from pgspec.adapters.base import Adapter
    from pgspec.conformance.run import runner

    base = runner.load_adapter("torch")
    impls = dict(base.implementations)
    impls.update({fid.replace("__", "."): fn for fid, fn in overrides.items()})
    return Adapter(name="torch-broken", framework="test", version="0", implementations=impls)


@functools.lru_cache(maxsize=16)
def family_cases(glob: str, errors: bool = False) -> tuple:
    """The golden cases whose formula or case ID matches ``glob`` (loaded once per glob); the
    expected-error cases only with ``errors`` (tests/test_verdicts.py runs them all)."""
    from pgspec.conformance.run import runner

    return tuple(c for c in runner.select_cases(glob) if errors or c["category"] != "error")


def golden_case(case_id: str) -> dict:
    """One golden case by its ID."""
    for c in family_cases(case_id.split("/", 1)[0].split(".", 1)[0] + ".*", errors=True):
        if c["id"] == case_id:
            return c
    raise KeyError(case_id)
