"""mask.* in PyTorch (spec/mask.md): geometric sequence masking, OPSM, entropy top-quantile mask.

Nothing here is differentiable; outputs are boolean keep flags and the statistics they were
decided on, computed in the inputs' dtype and on their device.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

from pgspec.reference import SpecError

from .is_ import _broadcast, _check_bounds, choice, in_band, param


def mean_log_ratio(num, den, mask):
    """(1/L_i) sum_t m (num - den), 0 for an empty sequence (masked positions selected away)."""
    d = num - den
    d = torch.where(mask, d, torch.zeros_like(d))
    return d.sum(-1) / mask.sum(-1).clamp(min=1)


def geometric_sequence(inputs, params):
    fid = "mask.geometric_sequence"
    numerator = choice(fid, params, "numerator")
    lo, hi = param(fid, params, "lower"), param(fid, params, "upper")
    _check_bounds(fid, "lower", lo, "upper", hi)
    other = "logprobs" if numerator == "old_logprobs" else "old_logprobs"
    if inputs.get(numerator) is None:
        raise ValueError(f"{fid}: numerator={numerator!r} needs the input {numerator!r}")
    if inputs.get(other) is not None:
        raise ValueError(f"{fid}: input {other!r} given but numerator={numerator!r} does not use it")
    m = inputs["mask"]
    g = torch.exp(mean_log_ratio(inputs[numerator], inputs["sampler_logprobs"], m))
    keep = in_band(g, lo, hi)
    return {"seq_keep": keep, "keep": _broadcast(keep, m), "seq_ratio": g}


def sequence_advantage(advantages, mask):
    """A_i: the [B] advantage as given, or the mean of the [B,T] advantages over the unmasked tokens."""
    if advantages.dim() == 1:
        return advantages
    a = torch.where(mask, advantages, torch.zeros_like(advantages))
    return a.sum(-1) / mask.sum(-1).clamp(min=1)


def opsm(inputs, params):
    fid = "mask.opsm"
    delta = param(fid, params, "delta")
    m = inputs["mask"]
    kappa = mean_log_ratio(inputs["sampler_logprobs"], inputs["logprobs"], m)
    adv = sequence_advantage(inputs["advantages"], m)
    if choice(fid, params, "advantage_gate") == "token":   # DeepSeek-V3.2 Eq. 9: each token's own A_{i,t}
        a = inputs["advantages"]
        a = a.unsqueeze(-1).expand(m.shape) if a.dim() == 1 else a
        keep_tok = ~((a < 0) & (kappa > delta).unsqueeze(-1)) & m
        seq_keep = (keep_tok | ~m).all(-1)
        return {"seq_keep": seq_keep, "keep": keep_tok, "seq_stat": kappa, "seq_advantage": adv}
    keep = ~((adv < 0) & (kappa > delta))
    return {"seq_keep": keep, "keep": _broadcast(keep, m), "seq_stat": kappa, "seq_advantage": adv}


def quantile_position(level: Fraction, n: int):
    """(j, frac): h = level (n - 1) split into floor and fraction, exactly (host-side rationals).

    As the spec says, h within 2^-44 (n - 1) of an integer is that integer, so that a decimal rho
    given as a binary double selects the tokens its decimal value selects.  torch.quantile would
    compute h in the input's dtype (in float32, h = 0.7 * 10 = 6.9999999 for rho = 0.3, n = 11,
    moving q below x_7); the position is a host-side scalar, so it is computed exactly here.
    """
    h = level * (n - 1)
    k = round(h)
    if abs(h - k) <= Fraction(1, 2 ** 44) * max(n - 1, 1):
        return int(k), Fraction(0)
    j = math.floor(h)
    return j, h - j


def _exact(value):
    """A parameter value as an exact rational: decimal strings as decimals, floats as binary doubles."""
    return Fraction(value) if not isinstance(value, str) else Fraction(value.strip())


def entropy_quantile(inputs, params):
    fid = "mask.entropy_quantile"
    rho = choice(fid, params, "top_entropy_quantile")
    H, m = inputs["entropy"], inputs["mask"]
    if bool((H[m] < 0).any()):
        raise SpecError(f"{fid}: input 'entropy' must be >= 0 (an entropy) at every unmasked position")
    values = torch.sort(H[m]).values      # the unmasked entropies of the whole batch, ascending
    n = values.numel()
    if n == 0:
        return {"keep": torch.zeros_like(m), "threshold": torch.full((), float("nan"), dtype=H.dtype, device=H.device)}
    j, frac = quantile_position(1 - _exact(rho), n)
    # linear interpolation as torch.quantile does it (torch.lerp), at the exact position, and in float64
    # whatever the dtype: keep is boolean, and a threshold rounded to float32 or bfloat16 can land on the
    # entropy of a token that the spec's threshold lies just above (rho = 1/6 - 6.6e-14, seven tokens:
    # 0.03125 + 1.2e-14 is 0.03125 in float32)
    v = values.double()
    q = v[j] if frac == 0 else torch.lerp(v[j], v[j + 1], float(frac))
    keep = (H.double() >= q) & m
    return {"keep": keep, "threshold": q.to(H.dtype)}


IMPLEMENTATIONS = {
    "mask.geometric_sequence": geometric_sequence,
    "mask.opsm": opsm,
    "mask.entropy_quantile": entropy_quantile,
}
