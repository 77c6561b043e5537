"""logprob.* in PyTorch (spec/logprob.md).

The logits are transformed as the spec writes it, z' = softcap_c(s z) / tau (scale, then softcap,
then temperature), and the log-softmax and the entropy are evaluated around the row maximum z'_*:

    log p_y = (z'_y - z'_*) - log1p(S),     S = sum_{v != *} exp(z'_v - z'_*),
    H       = log1p(S) + sum_{v != *} d_v exp(-d_v) / (1 + S),     d_v = z'_* - z'_v >= 0.

``torch.log_softmax`` computes log(1 + S) from the rounded 1 + S: an absolute error of one ulp of
1, which is a huge relative error in log p_* ~ -S for a nearly certain token (logit gaps of 20 or
more), and ``-(p * log p).sum()`` inherits the same for the entropy.  The log1p form has neither
problem and costs the same.  The softcap's derivative is sech^2(x/c), computed directly: autograd
through ``torch.tanh`` uses 1 - tanh^2, which cancels (to exactly 0) once the cap saturates.

Masked positions: their logits are replaced by 0 and their targets by 0 with ``torch.where``
before anything else, so NaN/inf logits and ignore-index targets (-100) can neither index out of
range nor reach a gradient.
"""

from __future__ import annotations

import torch

from pgspec.reference import REGISTRY


def _param(formula_id, params, name):
    """The case's parameter, or the spec default from the reference registry."""
    if name in params:
        return params[name]
    return next(p.default for p in REGISTRY[formula_id].params if p.name == name)


class _Softcap(torch.autograd.Function):
    """c * tanh(x / c) with derivative sech^2(x / c) (no cancellation when |x / c| is large)."""

    @staticmethod
    def forward(ctx, x, c):
        ctx.save_for_backward(x)
        ctx.c = c
        return c * torch.tanh(x / c)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        sech = 1 / torch.cosh(x / ctx.c)   # cosh overflows to inf where sech^2 underflows anyway
        return grad * (sech * sech), None


def softcap(x, c):
    return x if c is None else _Softcap.apply(x, float(c))


def transform_logits(logits, mask, formula_id, params):
    """z' = softcap_c(s z) / tau over the last axis; masked rows replaced by 0 first."""
    z = torch.where(mask.unsqueeze(-1), logits, torch.zeros((), dtype=logits.dtype, device=logits.device))
    scale = _param(formula_id, params, "logit_scale")
    if float(scale) != 1:
        z = z * float(scale)
    z = softcap(z, _param(formula_id, params, "softcap"))
    temperature = _param(formula_id, params, "temperature")
    if float(temperature) != 1:
        z = z / float(temperature)
    return z


def _around_max(z):
    """(d, e, s, is_max): d = z - z_* (<= 0), e = exp(d) with the maximum's own entry removed,
    s = sum of e.  * is the first index of the row maximum (a branch decision: z_* keeps its
    gradient, as in the spec's shifted form)."""
    star = z.argmax(dim=-1, keepdim=True)
    z_star = torch.gather(z, -1, star)
    d = z - z_star
    idx = torch.arange(z.shape[-1], device=z.device)
    is_max = idx == star
    e = torch.where(is_max, torch.zeros((), dtype=z.dtype, device=z.device), torch.exp(d))
    return d, e, e.sum(-1), is_max


def token(inputs, params):
    fid = "logprob.token"
    mask = inputs["mask"]
    z = transform_logits(inputs["logits"], mask, fid, params)
    d, _, s, _ = _around_max(z)
    y = torch.where(mask, inputs["targets"], torch.zeros_like(inputs["targets"]))
    return {"logprobs": torch.gather(d, -1, y.unsqueeze(-1)).squeeze(-1) - torch.log1p(s)}


def entropy(inputs, params):
    fid = "logprob.entropy"
    z = transform_logits(inputs["logits"], inputs["mask"], fid, params)
    d, e, s, _ = _around_max(z)
    # d_v exp(-d_v) with d_v = z_* - z_v = -d; the maximum's term is 0 (e = 0 there)
    return {"entropy": torch.log1p(s) + (-d * e).sum(-1) / (1 + s)}


IMPLEMENTATIONS = {
    "logprob.token": token,
    "logprob.entropy": entropy,
}
