"""``LigerFusedLinearGRPOLoss(compiled=False)`` end to end (hidden states and LM head in).

The case's log-probs become hidden states of width 2 and the LM head the 2 x 2 identity (see
construct.py); Liger computes the log-probs (fp32, ``_ChunkedSelectiveLogProbFunction``), the
loss and, eagerly inside its forward, the gradient w.r.t. the hidden states, from which the
gradient w.r.t. the log-probs is recovered exactly by the chain rule.  Everything Liger computes
here is float32 (the log-probs are float32 whatever the hidden dtype).
"""

from __future__ import annotations

import torch

from .chunked import prepare
from .construct import grad_from_z1, logits_for


def loss_impl(formula_id):
    def impl(inputs, params):
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

        cfg, kw = prepare(formula_id, inputs, params)
        lp, m = inputs["logprobs"], inputs["mask"]
        B, T = m.shape
        dtype = lp.dtype if lp.dtype != torch.bfloat16 else torch.bfloat16
        hidden = logits_for(lp, m, dtype).requires_grad_(True)
        weight = torch.eye(2, dtype=dtype, device=lp.device)
        module = LigerFusedLinearGRPOLoss(compiled=False, use_ref_model="ref" in kw, chunk_size=1,
                                          temperature=1.0, **{k: v for k, v in cfg.items()})
        loss, _ = module(hidden, weight, torch.zeros((B, T), dtype=torch.long, device=lp.device), kw["mask"], kw["advantages"],
                         ref_per_token_logps=kw.get("ref"), old_per_token_logps=kw["old"],
                         vllm_is_ratio=kw.get("vllm_is_ratio"))
        (gh,) = torch.autograd.grad(loss, hidden)
        return {"loss": loss, "grad": {"logprobs": grad_from_z1(gh[..., 1], lp, m)}}

    return impl


IMPLEMENTATIONS = {fid: loss_impl(fid) for fid in (
    "loss.grpo", "loss.dapo", "loss.bnpo", "loss.dr_grpo", "loss.gspo", "loss.cispo", "loss.sapo", "loss.luspo",
    "loss.vespo")}
