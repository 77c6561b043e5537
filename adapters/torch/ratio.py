"""ratio.* in PyTorch (spec/ratio.md)."""

from __future__ import annotations

import torch


def masked_log_ratio(inputs, dtype=None):
    """l - l_old at unmasked positions, 0 elsewhere (selected, so NaN/inf there cannot leak); with ``dtype``,
    formed in that dtype (float64: exactly, from 16-bit inputs)."""
    m = inputs["mask"]
    lp, old = inputs["logprobs"], inputs["old_logprobs"]
    if dtype is not None:
        lp, old = lp.to(dtype), old.to(dtype)
    d = lp - old
    return torch.where(m, d, torch.zeros_like(d))


def _clamp(x, c, exact=None):
    """clip(x, -c, c); with ``exact`` (x formed in float64), the clamp holds where the exact value is
    outside [-c, c] (its gradient 0 there) although x, formed in a 16-bit dtype, may have rounded onto c."""
    if c is None:
        return x
    if exact is None:
        return torch.clamp(x, -c, c)
    held = exact.abs() > c
    return torch.where(held, torch.clamp(exact, -c, c).to(x.dtype), torch.clamp(x, -c, c))


def token(inputs, params):
    d = masked_log_ratio(inputs)
    return {"ratio": torch.exp(_clamp(d, params.get("log_ratio_clamp"), masked_log_ratio(inputs, torch.float64)))}


def sequence_product(inputs, params):
    exact = masked_log_ratio(inputs, torch.float64).sum(-1)
    return {"ratio": torch.exp(_clamp(masked_log_ratio(inputs).sum(-1), params.get("log_ratio_clamp"), exact))}


def mean_log_ratio(inputs, clamp=None):
    """(1/L_i) sum_t m clip(l - l_old, -k, k), 0 for an empty sequence (no clip when k is None)."""
    lengths = inputs["mask"].sum(-1)
    return _clamp(masked_log_ratio(inputs), clamp).sum(-1) / lengths.clamp(min=1)


def sequence_geometric(inputs, params):
    cap = params.get("log_ratio_max")
    log_s = mean_log_ratio(inputs, params.get("log_ratio_clamp"))
    if cap is not None:
        log_s = torch.clamp(log_s, max=cap)
    return {"ratio": torch.exp(log_s)}


def gspo_token(inputs, params):
    cap = params.get("log_ratio_max")
    lp = inputs["logprobs"]
    lp = torch.where(inputs["mask"], lp, torch.zeros_like(lp))
    log_s = mean_log_ratio(inputs).detach().unsqueeze(-1) + (lp - lp.detach())
    if cap is not None:
        log_s = torch.clamp(log_s, max=cap)
    return {"ratio": torch.exp(log_s)}


IMPLEMENTATIONS = {
    "ratio.token": token,
    "ratio.sequence_product": sequence_product,
    "ratio.sequence_geometric": sequence_geometric,
    "ratio.gspo_token": gspo_token,
}
