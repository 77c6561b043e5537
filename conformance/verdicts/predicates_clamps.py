"""Input predicates about where a framework's always-on clamp binds (spec/verdicts.md): a bound the
framework always applies and the case leaves open.  They are predicates of :mod:`.predicates` (its
``predicates()`` lists them); like predicates_precision they read a case without importing that module."""

from __future__ import annotations

import math


def _k3_case(case: dict):
    """(x input clamp (lo, hi)) of a case computing k3 of x = ref_logprobs - logprobs: kl.k3, or a loss.*
    KL term with beta > 0 and kl_estimator k3; None otherwise."""
    from .predicates_precision import _params, _real

    f, p = str(case.get("formula", "")), _params(case)
    if f == "kl.k3":
        return p.get("log_ratio_min"), p.get("log_ratio_max")
    if f.startswith("loss.") and p.get("kl_estimator") == "k3" and _real(p.get("beta") or 0) > 0:
        return p.get("kl_log_ratio_min"), p.get("kl_log_ratio_max")
    return None


def _clamped_kl_log_ratios(case: dict, lo, hi) -> list:
    """x = ref_logprobs - logprobs at each unmasked position (NaN left out), clamped to the case's input
    clamp [lo, hi] (either side None: open); shared with predicates.kl_estimate_beyond_10_unclamped."""
    from .predicates_precision import _inputs, _real, _rows

    ins = _inputs(case)
    lp, ref, mask = ins.get("logprobs"), ins.get("ref_logprobs"), ins.get("mask")
    if not isinstance(lp, list) or not isinstance(ref, list) or not isinstance(mask, list):
        return []
    out = []
    for r1, r2, mrow in zip(lp, ref, mask):
        for a, b, m in zip(_rows(r1), _rows(r2), _rows(mrow)):
            x = _real(b) - _real(a)
            if m and not math.isnan(x):
                x = max(x, _real(lo)) if lo is not None else x
                out.append(min(x, _real(hi)) if hi is not None else x)
    return out


def k3_log_ratio_beyond_40_unclamped(case: dict) -> bool:
    """The case computes k3 of x = ref_logprobs - logprobs (kl.k3, or a loss.* KL term with beta > 0 and
    ``kl_estimator`` k3), and at some unmasked position x lies beyond 40 in magnitude on a side the case's
    own input clamp leaves open (or sets beyond 40): where a framework's always-on clamp of x to
    [-40, 40] binds."""
    bounds = _k3_case(case)
    return bounds is not None and any(abs(x) > 40 for x in _clamped_kl_log_ratios(case, *bounds))


def geometric_token_log_ratio_beyond_20(case: dict) -> bool:
    """An is.geometric.* case (or a loss.* recipe with ``is_level`` geometric) where some unmasked token's
    rollout log-ratio old_logprobs - sampler_logprobs lies beyond 20 in magnitude: a framework clamping each
    token to [-20, 20] before the geometric mean (a safety bound) differs there from the spec, which clamps
    the level's mean (``log_ratio_clamp``, ``is_log_ratio_clamp``) or nothing."""
    from .predicates_precision import _inputs, _params, _real, _rows

    f, p = str(case.get("formula", "")), _params(case)
    if not (f.startswith("is.geometric.") or f.startswith("loss.") and p.get("is_level") == "geometric"):
        return False
    ins = _inputs(case)
    old, mu, mask = ins.get("old_logprobs"), ins.get("sampler_logprobs"), ins.get("mask")
    if not isinstance(old, list) or not isinstance(mu, list) or not isinstance(mask, list):
        return False
    return any(m and abs(_real(a) - _real(b)) > 20
               for r1, r2, mrow in zip(old, mu, mask) for a, b, m in zip(_rows(r1), _rows(r2), _rows(mrow)))
