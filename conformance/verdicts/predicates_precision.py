"""Input predicates about the rounding and range of a framework's own floating point (spec/verdicts.md):
the entropy quantile's float32 position, masked logits that overflow float32 once transformed, a
log-normalizer whose float32 rounding an unshifted log-softmax carries, and log-ratios whose exp
overflows float64.  They
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


def _entropy_quantile_setup(case: dict):
    """(rho as given, rho exact, the finite unmasked entropies) of a case taking an entropy top-quantile
    (mask.entropy_quantile's ``top_entropy_quantile``, a loss.* recipe's ``entropy_quantile``); None
    where it takes none, or an entropy is not finite."""
    f = str(case.get("formula", ""))
    p = _params(case)
    name = "top_entropy_quantile" if f == "mask.entropy_quantile" else "entropy_quantile" if f.startswith("loss.") else None
    if name is None or p.get(name) is None:
        return None
    rho = _exact(p[name])
    ins = _inputs(case)
    ent, mask = ins.get("entropy"), ins.get("mask")
    if rho is None or not 0 <= rho <= 1 or not isinstance(ent, list) or not isinstance(mask, list):
        return None
    xs = [_real(v) for row, mrow in zip(ent, mask) for v, m in zip(_rows(row), _rows(mrow)) if m]
    if not xs or not all(math.isfinite(v) for v in xs):
        return None
    return p[name], rho, xs


def _spec_quantile(rho, xs):
    """(sorted xs as fractions, h, j = floor(h), q): the spec's h = (1 - rho)(n - 1), exact, taken as the
    integer it lies within 2^-44 (n - 1) of, and its linear quantile q = x_j + (h - j)(x_{j+1} - x_j)."""
    from fractions import Fraction

    n = len(xs)
    s = sorted(Fraction(v) for v in xs)
    h = (1 - rho) * (n - 1)
    if abs(h - round(h)) <= Fraction(n - 1, 2 ** 44):
        h = Fraction(round(h))
    j = math.floor(h)
    return s, h, j, (s[j] if h == j else s[j] + (h - j) * (s[j + 1] - s[j]))


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
    setup = _entropy_quantile_setup(case)
    if setup is None:
        return False
    given, rho, xs = setup
    from fractions import Fraction

    import torch

    q = _spec_quantile(rho, xs)[3]
    x32 = torch.tensor(xs, dtype=torch.float32)
    q32 = torch.quantile(x32, 1.0 - float(given)).item()
    return any((Fraction(v) >= q) != (float(v32) >= q32) for v, v32 in zip(xs, x32.tolist()))


def entropy_quantile_float32_differs(case: dict) -> bool:
    """``entropy_quantile_float32_keep_differs``, or the case is mask.entropy_quantile and the threshold's
    shift by the position ``torch.quantile`` forms in float32, h32 = fl32(fl32(1 - rho) (n - 1)), is more
    than four float32 roundings of the spec's q: |h32 - h| times the larger step next to x_j (j =
    floor(h)) exceeds 2^-22 |q|.  The position's rounding, about 2^-24 h, then moves q = x_j + (h - j)
    (x_{j+1} - x_j) by more than the float32 tolerance allows the interpolation's few roundings: where h
    is large against its fraction h - j and x_j is small against the step (rho = 0.1 over seven tokens,
    six of entropy 0 and one of 1/32: h = 5.4, h32 = 5.39999962, q = 1/80 off by 16 float32 ulps)."""
    if entropy_quantile_float32_keep_differs(case):
        return True
    setup = _entropy_quantile_setup(case)
    if setup is None or case.get("formula") != "mask.entropy_quantile":
        return False
    given, rho, xs = setup
    from fractions import Fraction

    import torch

    n = len(xs)
    s, h, j, q = _spec_quantile(rho, xs)
    step = max(s[min(j + 1, n - 1)] - s[j], s[j] - s[max(j - 1, 0)])
    h32 = (torch.tensor(1.0 - float(given), dtype=torch.float32) * (n - 1)).item()
    return abs(Fraction(h32) - h) * step > abs(q) / 2 ** 22


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


_FLOAT64_EXP_MAX = math.log(1.7976931348623157e308)     # 709.78: e^x overflows float64 past it


def _largest_unmasked_log_ratio(case: dict) -> float:
    """The largest |logprobs - old_logprobs| or |ref_logprobs - logprobs| at an unmasked position (for the
    inputs the case gives; 0 when none): predicates.large_log_ratio and log_ratio_overflows_float64."""
    ins = _inputs(case)
    mask, lp = ins.get("mask"), ins.get("logprobs")
    if not isinstance(mask, list) or not isinstance(lp, list):
        return 0.0
    diffs = [abs(_real(a) - _real(b)) for other in ("old_logprobs", "ref_logprobs") if isinstance(ins.get(other), list)
             for r1, r2, mrow in zip(lp, ins[other], mask) for a, b, m in zip(_rows(r1), _rows(r2), _rows(mrow)) if m]
    return max((d for d in diffs if not math.isnan(d)), default=0.0)


def log_ratio_overflows_float64(case: dict) -> bool:
    """At some unmasked position |logprobs - old_logprobs| or |ref_logprobs - logprobs| (for the inputs the
    case gives) exceeds 709.78, where e^ of it overflows float64 as well (float32 overflows past 88.72, so
    this is ``large_log_ratio``'s regime for a framework computing in float64)."""
    return _largest_unmasked_log_ratio(case) > _FLOAT64_EXP_MAX


def log_normalizer_above_8(case: dict) -> bool:
    """At some unmasked position of a logprob.* case the log-normalizer log Z = log sum_v e^(z'_v) of the
    transformed logits z' (``logit_scale``, ``softcap``, then ``temperature``) exceeds 8 in magnitude: a
    log-probability formed as z'_v - log Z from the unshifted logits carries the rounding of log Z, about
    2^-24 |log Z| in float32, into every p_v = e^(log p_v) as a relative error, more than the K = 8
    units the logprob family's tolerance grants (spec/tolerance.md) where |log Z| > 8; the spec's
    max-shifted form z'_v - z'_* - log1p(...) does not."""
    ins, p = _inputs(case), _params(case)
    logits, mask = ins.get("logits"), ins.get("mask")
    s, tau, c = _real(p.get("logit_scale", 1)), _real(p.get("temperature", 1)), p.get("softcap")
    c = None if c is None else _real(c)
    if not isinstance(logits, list) or not isinstance(mask, list) or not (tau > 0 and math.isfinite(s)) \
            or (c is not None and not c > 0):
        return False     # no logits, or parameters the spec rejects (an expected-error case)
    rows = [z for row, mrow in zip(logits, mask) for z, m in zip(_rows(row), _rows(mrow))
            if m and isinstance(z, list) and z]
    for raw in rows:
        z = [(c * math.tanh(s * _real(v) / c) if c is not None else s * _real(v)) / tau for v in raw]
        if not all(math.isfinite(v) for v in z):
            continue
        top = max(z)
        if abs(top + math.log(sum(math.exp(v - top) for v in z))) > 8:
            return True
    return False


def _recipe_k3_log_ratios(case: dict):
    """x = l_ref - l at each unmasked token of a loss.* recipe with a k3 or k3_unbiased KL term (beta > 0);
    empty for any other case."""
    f, p = str(case.get("formula", "")), _params(case)
    if not f.startswith("loss.") or p.get("kl_estimator") not in ("k3", "k3_unbiased") \
            or not _real(p.get("beta") or 0) > 0:
        return []
    ins = _inputs(case)
    lp, ref, mask = ins.get("logprobs"), ins.get("ref_logprobs"), ins.get("mask")
    if not isinstance(lp, list) or not isinstance(ref, list) or not isinstance(mask, list):
        return []
    return [_real(b) - _real(a) for r1, r2, mrow in zip(lp, ref, mask)
            for a, b, m in zip(_rows(r1), _rows(r2), _rows(mrow)) if m and math.isfinite(_real(a))]


def kl_gradient_paths_cancel_at_zero_log_ratio(case: dict) -> bool:
    """A loss.* recipe with a k3 or k3_unbiased KL term (beta > 0), and at some unmasked token the
    reference log-prob equals the current one exactly (x = l_ref - l = 0): there the KL term's
    gradient, beta (1 - e^x) (times the token's weight), is exactly 0 and the token's gradient is the
    policy term's alone; an autograd graph forms it as two paths, -beta e^x and +beta, each of size beta,
    and a policy gradient added to one of them before the other cancels it keeps only its digits above
    beta's rounding."""
    return any(x == 0 for x in _recipe_k3_log_ratios(case))


def kl_term_small_log_ratio(case: dict) -> bool:
    """A loss.* recipe with a k3 or k3_unbiased KL term (beta > 0), and at some unmasked token |x| = |l_ref -
    l| < 1/16, zero included: the KL gradient there, about beta w |x| (0 at x = 0), is small next to one
    float32 rounding of a log-prob, beta w 2^-24 |l|, which a framework re-forming log p from float32
    logits carries into it."""
    return any(abs(x) < 1 / 16 for x in _recipe_k3_log_ratios(case))
