"""The tolerance model of spec/tolerance.md: bound = K * u(dtype) * S + floor(dtype)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from mpmath import mp, mpf

UNIT_ROUNDOFF = {
    "float64": mpf(2) ** -53,
    "float32": mpf(2) ** -24,
    "float16": mpf(2) ** -11,
    "bfloat16": mpf(2) ** -8,
}
FLOOR = {
    "float64": mpf(2) ** -1022,
    "float32": mpf(2) ** -126,
    "float16": mpf(2) ** -14,
    "bfloat16": mpf(2) ** -126,
}
LARGEST = {
    "float64": mpf(2) ** 1024 * (1 - mpf(2) ** -53),
    "float32": mpf(2) ** 128 * (1 - mpf(2) ** -24),
    "float16": mpf(65504),
    "bfloat16": mpf(2) ** 128 * (1 - mpf(2) ** -8),
}
# Per-family constants, justified in spec/tolerance.md.
K = {
    "logprob": 8, "ratio": 4, "surrogate": 4, "is": 4, "mask": 4, "kl": 4,
    "agg": 4, "adv": 4, "dist": 4, "loss": 8,
}
DTYPES = tuple(UNIT_ROUNDOFF)
# Short names accepted wherever a dtype is taken (``--dtype``, ``--pgspec-dtype``).  Only the
# unambiguous ones: ``float`` is float32 in torch but float64 in Python and numpy, so it is refused.
DTYPE_ALIASES = {"fp64": "float64", "double": "float64", "fp32": "float32", "fp16": "float16", "half": "float16",
                 "bf16": "bfloat16"}
DTYPES_HELP = "float64 (fp64), float32 (fp32), bfloat16 (bf16), float16 (fp16, half)"
COMPARE_DPS = 50   # the working precision of ``compare``


@dataclass(frozen=True)
class Comparison:
    passed: bool
    error: float      # |got - ref| (inf when got is non-finite and ref is not)
    bound: float
    ratio: float      # error / bound
    note: str = ""


def parse_dtypes(text: str, option: str = "--dtype") -> list[str]:
    """The ``--dtype`` option of ``pgspec run`` and ``pgspec check`` (and the plugin's
    ``--pgspec-dtype``): comma-separated dtypes or their aliases (DTYPE_ALIASES),
    in the order given, each once, as canonical names; ValueError (naming the option, the choices
    and the closest name) for none or an unknown one."""
    from ..base.suggest import did_you_mean

    names = [d.strip() for d in text.split(",") if d.strip()]
    if not names:
        raise ValueError(f"{option}: no dtype given (got {text!r}); choose from {DTYPES_HELP}")
    bad = [d for d in names if d not in DTYPES and d not in DTYPE_ALIASES]
    if bad:
        hint = ("; 'float' is ambiguous (float32 in torch, float64 in Python and numpy): give float32 or float64"
                if bad[0] == "float" else did_you_mean(bad[0], [*DTYPES, *DTYPE_ALIASES]))
        raise ValueError(f"{option}: unknown dtype(s) {bad}; choose from {DTYPES_HELP}{hint}")
    return list(dict.fromkeys(d if d in DTYPES else DTYPE_ALIASES[d] for d in names))


def bound(family: str, dtype: str, scale) -> mpf:
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return K[family] * UNIT_ROUNDOFF[dtype] * mpf(scale) + FLOOR[dtype]


def compare(got, ref, scale, family: str, dtype: str) -> Comparison:
    """Compare one element. ``got`` is a float (or bool), ``ref`` and ``scale`` mpf or decimal strings."""
    with mp.workdps(COMPARE_DPS):
        if isinstance(ref, bool) or isinstance(got, bool):
            ok = bool(got) == bool(ref)
            return Comparison(ok, 0.0 if ok else math.inf, 0.0, 0.0 if ok else math.inf, "boolean")
        ref = mpf(ref)
        b = bound(family, dtype, scale if scale is not None else abs(ref))
        g = float(got)
        if mp.isnan(ref):
            ok = math.isnan(g)
            return Comparison(ok, 0.0 if ok else math.inf, float(b), 0.0 if ok else math.inf, "reference is NaN")
        if mp.isinf(ref):
            ok = math.isinf(g) and (g > 0) == (ref > 0)
            return Comparison(ok, 0.0 if ok else math.inf, float(b), 0.0 if ok else math.inf, "reference is infinite")
        if math.isnan(g):
            return Comparison(False, math.inf, float(b), math.inf, "got NaN")
        if math.isinf(g):
            if abs(ref) > LARGEST[dtype] and (g > 0) == (ref > 0):
                return Comparison(True, 0.0, float(b), 0.0, f"overflow: |ref| exceeds the largest {dtype}")
            return Comparison(False, math.inf, float(b), math.inf, "got an infinity")
        err = abs(mpf(g) - ref)
        ratio = err / b
        return Comparison(bool(err <= b), float(err), float(b), float(ratio))
