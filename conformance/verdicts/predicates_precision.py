"""Input predicates about float32 rounding in a framework's own computation (spec/verdicts.md): the
entropy quantile's float32 position, and masked logits that overflow float32 once transformed.  They
are predicates of :mod:`.predicates` (its ``predicates()`` lists them)."""

from __future__ import annotations

import math


def _inputs(case: dict) -> dict:
    """The case's inputs, as predicates.inputs_of reads them (that module imports this one)."""
    values = case.get("$input_values")
    if values is not None:
        return values
    from ..corpus.inputs import case_inputs

    return case_inputs(case)


def _params(case: dict) -> dict:
    from ..corpus.inputs import resolved_params

    return resolved_params(case)


def _real(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def _rows(x):
    return x if isinstance(x, list) else []


def _exact(x):
    """A real parameter or input as an exact fraction: a decimal string by its decimal value, a
    float as the binary double it is; None where it is not a finite real."""
    from fractions import Fraction

    try:
        v = Fraction(x) if isinstance(x, str) else Fraction(float(x))
    except (TypeError, ValueError, OverflowError, ZeroDivisionError):
        return None
    return v


def entropy_quantile_float32_keep_differs(case: dict) -> bool:
    """The case takes an entropy top-quantile (mask.entropy_quantile's ``top_entropy_quantile``, or a
    loss.* recipe's ``entropy_quantile``) rho over the finite entropies of its unmasked tokens, and some
    unmasked token's keep decision H >= q differs between the spec's threshold q (spec/mask.md: h =
    (1 - rho)(n - 1) exactly, taken as the integer it lies within 2^-44 (n - 1) of) and the one
    ``torch.quantile`` forms in float32 over the entropies cast to float32, with the quantile 1 - rho
    formed in float64 and cast to float32: the position q32 (n - 1) rounded to float32 (so a level h
    that lies outside the tie window but within float32's rounding of an integer, or of a window's
    edge, becomes that integer), and the interpolation in float32.  That is where a framework taking
    the threshold from a float32 quantile keeps a token the spec drops, or drops one it keeps."""
    f = str(case.get("formula", ""))
    p = _params(case)
    name = "top_entropy_quantile" if f == "mask.entropy_quantile" else "entropy_quantile" if f.startswith("loss.") else None
    if name is None or p.get(name) is None:
        return False
    rho = _exact(p[name])
    ins = _inputs(case)
    ent, mask = ins.get("entropy"), ins.get("mask")
    if rho is None or not 0 <= rho <= 1 or not isinstance(ent, list) or not isinstance(mask, list):
        return False
    xs = [_real(v) for row, mrow in zip(ent, mask) for v, m in zip(_rows(row), _rows(mrow)) if m]
    if not xs or not all(math.isfinite(v) for v in xs):
        return False
    from fractions import Fraction

    import torch

    n = len(xs)
    s = sorted(Fraction(v) for v in xs)
    h = (1 - rho) * (n - 1)
    if abs(h - round(h)) <= Fraction(n - 1, 2 ** 44):
        h = Fraction(round(h))
    j = math.floor(h)
    q = s[j] if h == j else s[j] + (h - j) * (s[j + 1] - s[j])
    x32 = torch.tensor(xs, dtype=torch.float32)
    q32 = torch.quantile(x32, 1.0 - float(p[name])).item()
    return any((Fraction(v) >= q) != (float(v32) >= q32) for v, v32 in zip(xs, x32.tolist()))


_FLOAT32_MAX = 3.4028234663852886e38


def masked_logits_overflow_float32(case: dict) -> bool:
    """At some position whose mask is false, a finite logit z of ``logits`` [B,T,V] overflows float32
    (magnitude above its largest value, 3.4028e38) once scaled (s z, ``logit_scale`` s) or once
    transformed as logprob.* has it, z' = softcap_c(s z) / tau (``softcap`` c, ``temperature`` tau): a
    framework casting the logits to float32 and dividing by the temperature at every position gets an
    infinite logit there, and inf - inf = NaN in its log-sum-exp."""
    ins = _inputs(case)
    logits, mask = ins.get("logits"), ins.get("mask")
    if not isinstance(logits, list) or not isinstance(mask, list):
        return False
    p = _params(case)
    s, tau, c = _real(p.get("logit_scale", 1)), _real(p.get("temperature", 1)), p.get("softcap")
    c = None if c is None else _real(c)
    if not (tau > 0 and math.isfinite(tau) and math.isfinite(s)) or (c is not None and not c > 0):
        return False     # parameters the spec rejects (an expected-error case)
    for row, mrow in zip(logits, mask):
        for z, m in zip(_rows(row), _rows(mrow)):
            if m or not isinstance(z, list):
                continue
            for v in z:
                v = _real(v)
                if not math.isfinite(v):
                    continue
                scaled = s * v
                t = (c * math.tanh(scaled / c) if c is not None and math.isfinite(scaled) else scaled) / tau
                if abs(scaled) > _FLOAT32_MAX or abs(t) > _FLOAT32_MAX:
                    return True
    return False
