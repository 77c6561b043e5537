"""Logits whose log-softmax at the target equals given log-probs (for the fused and Triton paths).

Liger's fused and Triton GRPO losses take hidden states and an LM head (or logits), not log-probs.
For a case's log-prob l < 0 the two-entry vocabulary

    z = (l, log(1 - e^l)),   target 0,   temperature 1

gives log-softmax(z)_0 = l - log(e^l + 1 - e^l) = l exactly in real arithmetic; the second logit is
computed in float64 as log(-expm1(l)), then rounded to the run's dtype.  The fused path takes
hidden = z and the LM head W = I (2 x 2), so logits = hidden exactly.

The gradient w.r.t. the log-prob comes back through the chain rule: dl/dz_1 = -p_1 with
p_1 = 1 - e^l, and Liger writes grad_z1 = -g p_1 with no cancellation (one product), so
g = -grad_z1 / p_1 with p_1 = -expm1(l) in float64.  It is undefined where l = 0 (p_1 = 0: a
log-softmax has zero derivative at a certain token); those positions come back NaN.  Masked
positions get z = (0, 0) (their log-prob is unused by the spec; Liger still scores them).
"""

from __future__ import annotations

import torch


def logits_for(logprobs, mask, dtype):
    l = logprobs.detach().double()
    m = mask
    z0 = torch.where(m, l, torch.zeros_like(l))
    z1 = torch.where(m, torch.log(-torch.expm1(l)), torch.zeros_like(l))
    return torch.stack([z0, z1], dim=-1).to(dtype)


def grad_from_z1(grad_z1, logprobs, mask):
    p1 = -torch.expm1(logprobs.detach().double())
    g = -grad_z1.double() / p1
    return torch.where(mask, g, torch.zeros_like(g)).to(logprobs.dtype)
