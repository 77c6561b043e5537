"""is.* in PyTorch (spec/is.md): train/inference mismatch IS weights, keep flags, rejection.

Nothing here is differentiable (the inputs are sampling-time log-probs); outputs are weights,
boolean keep flags and statistics.  Everything works in the inputs' dtype and on their device.
Bounds compare the tensor with a Python number, which PyTorch rounds to the tensor's dtype, as a
framework's config value would be.
"""

from __future__ import annotations

import math

import torch

from pgspec.reference import REGISTRY


def param(formula_id, params, name):
    """The parameter as given (a number, a decimal string or None), else its spec default; as float."""
    if name in params:
        value = params[name]
    else:
        value = next(p.default for p in REGISTRY[formula_id].params if p.name == name)
    return None if value is None else float(value)


def choice(formula_id, params, name):
    return params.get(name, next(p.default for p in REGISTRY[formula_id].params if p.name == name))


def mismatch_log_ratio(inputs):
    """x = l^old - l^mu at unmasked positions, 0 elsewhere (selected, so NaN/inf there cannot leak)."""
    m = inputs["mask"]
    x = inputs["old_logprobs"] - inputs["sampler_logprobs"]
    return torch.where(m, x, torch.zeros_like(x))


def clamp_log_weight(u, c):
    return u if c is None else torch.clamp(u, -c, c)


def sequence_log_weight(inputs):
    """u_i = sum_t m x (0 for an empty sequence)."""
    return mismatch_log_ratio(inputs).sum(-1)


def geometric_log_weight(inputs):
    """u_i = (1/L_i) sum_t m x (0 for an empty sequence)."""
    lengths = inputs["mask"].sum(-1)
    return sequence_log_weight(inputs) / lengths.clamp(min=1)


def in_band(value, lo, hi):
    """1[lo <= value <= hi] with a None bound open."""
    keep = torch.ones_like(value, dtype=torch.bool)
    if lo is not None:
        keep = keep & (value >= lo)
    if hi is not None:
        keep = keep & (value <= hi)
    return keep


def truncate_weight(rho, lo, hi):
    return rho if lo is None and hi is None else torch.clamp(rho, min=lo, max=hi)


def mask_weight(rho, keep):
    return torch.where(keep, rho, torch.zeros_like(rho))


def _check_bounds(fid, lo_name, lo, hi_name, hi):
    if lo is None and hi is None and not fid.endswith(".truncate"):  # truncate: the untruncated weight
        raise ValueError(f"{fid}: at least one of {lo_name!r} and {hi_name!r} must be set")
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"{fid}: {lo_name!r} must be <= {hi_name!r}, got {lo} and {hi}")


def _bounds(fid, params):
    lo, hi = param(fid, params, "c_min"), param(fid, params, "c_max")
    _check_bounds(fid, "c_min", lo, "c_max", hi)
    return lo, hi, param(fid, params, "log_ratio_clamp")


def _broadcast(seq_values, mask):
    """A per-sequence value at every position of its row (masked positions are not compared)."""
    return seq_values.unsqueeze(-1).expand(mask.shape)


# token level -----------------------------------------------------------------------------------

def token_truncate(inputs, params):
    lo, hi, c = _bounds("is.token.truncate", params)
    rho = torch.exp(clamp_log_weight(mismatch_log_ratio(inputs), c))
    return {"weight": truncate_weight(rho, lo, hi), "ratio": rho}


def token_mask(inputs, params):
    lo, hi, c = _bounds("is.token.mask", params)
    rho = torch.exp(clamp_log_weight(mismatch_log_ratio(inputs), c))
    keep = in_band(rho, lo, hi)
    return {"weight": mask_weight(rho, keep), "keep": keep, "ratio": rho}


# sequence and geometric levels -----------------------------------------------------------------

def _level_truncate(fid, level_log_weight):
    def run(inputs, params):
        lo, hi, c = _bounds(fid, params)
        rho = torch.exp(clamp_log_weight(level_log_weight(inputs), c))
        w = truncate_weight(rho, lo, hi)
        return {"weight": _broadcast(w, inputs["mask"]), "seq_weight": w, "seq_ratio": rho}
    run.__name__ = fid.replace(".", "_")
    return run


def _level_mask(fid, level_log_weight):
    def run(inputs, params):
        lo, hi, c = _bounds(fid, params)
        rho = torch.exp(clamp_log_weight(level_log_weight(inputs), c))
        keep = in_band(rho, lo, hi)
        w = mask_weight(rho, keep)
        m = inputs["mask"]
        return {"weight": _broadcast(w, m), "keep": _broadcast(keep, m), "seq_weight": w, "seq_keep": keep,
                "seq_ratio": rho}
    run.__name__ = fid.replace(".", "_")
    return run


# rejection -------------------------------------------------------------------------------------

# 1/(k+2)! for k = 0..26: e^u - 1 - u = u^2 sum_k u^k / (k+2)!; 27 terms reach float64 rounding at |u| = 2
_SERIES = [1.0 / math.factorial(k + 2) for k in range(27)]


def expm1_minus_x(u):
    """e^u - 1 - u without cancellation, in u's dtype.

    Written as such it cancels catastrophically for small |u| (k3 ~ u^2/2 is lost entirely in float32
    at |u| = 2^-20).  Here: the Taylor series u^2 sum_k u^k/(k+2)! (Horner) for -1 <= u <= 2, where
    every form using exp loses digits; e^u - (1 + u) below -1 (1 + u is exact there for the log-prob
    differences this is used on, and e^u is small against the result); expm1(u) - u above 2.
    Within 3 units of roundoff of the exact value in float64, float32 and bfloat16 (measured on a
    dense grid of [-30, 30] and at powers of two down to 2^-40).
    """
    series = torch.full_like(u, _SERIES[-1])
    for coeff in reversed(_SERIES[:-1]):
        series = series * u + coeff
    small = u * u * series
    below = torch.exp(u) - (1 + u)
    above = torch.expm1(u) - u
    mid = (u >= -1) & (u <= 2)
    safe = torch.where(mid, small, torch.zeros_like(u))  # the series overflows to inf for |u| large: select
    return torch.where(mid, safe, torch.where(u < -1, below, above))


def divergence(estimator, u):
    if estimator == "k1":
        return -u
    if estimator == "k2":
        return u * u / 2
    if estimator == "k3":
        return expm1_minus_x(u)
    raise ValueError(f"is.reject: estimator must be k1, k2 or k3, got {estimator!r}")


def reject(inputs, params):
    fid = "is.reject"
    estimator, direction, level = (choice(fid, params, n) for n in ("estimator", "direction", "level"))
    lo, hi, c = param(fid, params, "lower"), param(fid, params, "upper"), param(fid, params, "log_ratio_clamp")
    _check_bounds(fid, "lower", lo, "upper", hi)
    m = inputs["mask"]
    x = mismatch_log_ratio(inputs)
    u = clamp_log_weight(x if direction == "mu_old" else -x, c)
    d = divergence(estimator, u)
    B = m.shape[0]
    if level == "token":
        nan = torch.full((B,), float("nan"), dtype=d.dtype, device=d.device)
        return {"keep": in_band(d, lo, hi) & m, "token_stat": d, "seq_stat": nan,
                "seq_keep": torch.zeros(B, dtype=torch.bool, device=d.device)}
    zero = torch.zeros_like(d)
    lengths = m.sum(-1)
    if level == "seq_sum":
        D = torch.where(m, d, zero).sum(-1)
    elif level == "seq_mean":
        D = torch.where(m, d, zero).sum(-1) / lengths.clamp(min=1)
    elif level == "seq_max":
        D = torch.where(m, d, torch.full_like(d, float("-inf"))).amax(-1)
        D = torch.where(lengths > 0, D, torch.zeros_like(D))
    else:
        raise ValueError(f"is.reject: level must be token, seq_sum, seq_mean or seq_max, got {level!r}")
    keep = in_band(D, lo, hi)
    return {"keep": _broadcast(keep, m), "token_stat": d, "seq_stat": D, "seq_keep": keep}


IMPLEMENTATIONS = {
    "is.token.truncate": token_truncate,
    "is.token.mask": token_mask,
    "is.sequence.truncate": _level_truncate("is.sequence.truncate", sequence_log_weight),
    "is.sequence.mask": _level_mask("is.sequence.mask", sequence_log_weight),
    "is.geometric.truncate": _level_truncate("is.geometric.truncate", geometric_log_weight),
    "is.geometric.mask": _level_mask("is.geometric.mask", geometric_log_weight),
    "is.reject": reject,
}
