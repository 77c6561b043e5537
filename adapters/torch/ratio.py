"""ratio.* in PyTorch (spec/ratio.md)."""

from __future__ import annotations

import torch


def masked_log_ratio(inputs):
    """l - l_old at unmasked positions, 0 elsewhere (selected, so NaN/inf there cannot leak)."""
    m = inputs["mask"]
    d = inputs["logprobs"] - inputs["old_logprobs"]
    return torch.where(m, d, torch.zeros_like(d))


def _clamp(x, c):
    return x if c is None else torch.clamp(x, -c, c)


def token(inputs, params):
    return {"ratio": torch.exp(_clamp(masked_log_ratio(inputs), params.get("log_ratio_clamp")))}


def sequence_product(inputs, params):
    return {"ratio": torch.exp(_clamp(masked_log_ratio(inputs).sum(-1), params.get("log_ratio_clamp")))}


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
