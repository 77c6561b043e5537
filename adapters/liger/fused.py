"""``LigerFusedLinearGRPOLoss`` end to end (hidden states and LM head in), eager (``compiled=False``,
``make_fused_adapter``) or with Liger's default ``compiled=True`` (``make_compiled_adapter``: the loss
math ``_compute_loss_from_logps`` under ``torch.compile``, as a user's module runs it).

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


def loss_impl(formula_id, compiled=False):
    def impl(inputs, params):
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

        cfg, kw = prepare(formula_id, inputs, params)
        lp, m = inputs["logprobs"], inputs["mask"]
        B, T = m.shape
        dtype = lp.dtype if lp.dtype != torch.bfloat16 else torch.bfloat16
        hidden = logits_for(lp, m, dtype).requires_grad_(True)
        weight = torch.eye(2, dtype=dtype, device=lp.device)
        module = LigerFusedLinearGRPOLoss(compiled=compiled, use_ref_model="ref" in kw, chunk_size=1,
                                          temperature=1.0, **{k: v for k, v in cfg.items()})
        loss, _ = module(hidden, weight, torch.zeros((B, T), dtype=torch.long, device=lp.device), kw["mask"], kw["advantages"],
                         ref_per_token_logps=kw.get("ref"), old_per_token_logps=kw["old"],
                         vllm_is_ratio=kw.get("vllm_is_ratio"))
        (gh,) = torch.autograd.grad(loss, hidden)
        return {"loss": loss, "grad": {"logprobs": grad_from_z1(gh[..., 1], lp, m)}}

    return impl


FORMULAS = ("loss.grpo", "loss.dapo", "loss.bnpo", "loss.dr_grpo", "loss.gspo", "loss.cispo", "loss.sapo", "loss.luspo",
            "loss.vespo")
IMPLEMENTATIONS = {fid: loss_impl(fid) for fid in FORMULAS}
# Liger's default: compiled=True.  See README "torch.compile": in torch 2.13 on CPU this path can return the
# result of an earlier call's epsilon; the variant exists to test that default, never as the eager reference.
COMPILED_IMPLEMENTATIONS = {fid: loss_impl(fid, compiled=True) for fid in FORMULAS}
