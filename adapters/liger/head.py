"""Liger's LM-head log-prob step for `pgspec check --formula logprob.token --vocab V` (conformance/check/logprob.py).

``LigerFusedLinearGRPOLoss`` (Liger-Kernel 0.8.5, ``chunked_loss/fused_linear_ppo.py``) turns the hidden
states and the LM head into per-token log-probs with ``LigerFusedLinearPPOBase.chunk_forward(input_chunk,
weight, selected_token_ids, bias, temperature)``: ``_ChunkedSelectiveLogProbFunction``, an online
log-sum-exp over vocabulary chunks of 4,096 (sequence chunks of 2,048 rows, float32 whatever the hidden
dtype) whose backward recomputes each chunk's logits.  The loss math then runs on those log-probs
(``_compute_loss_from_logps``, checked by the loss rows), and the gradient with respect to the hidden
states comes back through this function's backward (``torch.autograd.grad`` in ``fused_fwd_bwd``).

This entry point calls ``chunk_forward`` exactly so, on the check's hidden states and head, in their dtype
and on their device, with every position's target (Liger scores padding too and multiplies by the
mask), and differentiates the sum of the log-probs times the mask, as Liger's loss multiplies by it.  So
at V = 151,936 it checks the vocabulary half of the fused linear GRPO loss at the size it runs at; the
loss half is the vocabulary-of-two construction (construct.py) at the same token count.
"""

from __future__ import annotations

from pgspec.adapters.base import HEAD_LOSS_FORMULAS as HEAD_LOSSES   # the token losses a head computes

from .chunked import no_logit_transform, prepare


def head_logprob(hidden, weight, targets, mask, params):
    import torch
    from liger_kernel.chunked_loss.fused_linear_ppo import LigerFusedLinearPPOBase

    no_logit_transform(params)
    leaf = hidden.detach().requires_grad_(True)
    with torch.enable_grad():
        lp = LigerFusedLinearPPOBase.chunk_forward(leaf, weight.detach(), targets, bias=None,
                                                   temperature=params.get("temperature", 1))
        (grad,) = torch.autograd.grad((lp * mask).sum(), [leaf])
    out = torch.where(mask, lp.detach(), torch.zeros((), dtype=lp.dtype, device=lp.device))
    return {"logprobs": out, "grad": {"hidden": grad}}


def head_loss(fid):
    """``LigerFusedLinearGRPOLoss`` whole for the token loss ``fid`` (``compiled=False``, one sequence per chunk,
    as the fused adapter runs it; its ``loss_type`` and the rest of its configuration from the formula's
    parameters, as for the loss rows): hidden states and LM head in, its loss and the gradient w.r.t. the
    hidden states out (`pgspec check --formula fid --vocab V`, conformance/check/head_loss.py).  With beta > 0
    the reference model's log-probs come as ``ref_per_token_logps`` (``use_ref_model=True``), as TRL passes
    them; VESPO's sampler log-probs (``--sampler``) as ``vllm_is_ratio`` = exp(l_old - l_sampler), as TRL
    computes its importance_sampling_ratio (chunked.vespo_is_ratio)."""
    def head(hidden, weight, targets, mask, old_logprobs, advantages, params, ref_logprobs=None,
             sampler_logprobs=None):
        import torch
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

        inputs = {"mask": mask, "old_logprobs": old_logprobs, "advantages": advantages}
        if ref_logprobs is not None:
            inputs["ref_logprobs"] = ref_logprobs
        if sampler_logprobs is not None:
            inputs["sampler_logprobs"] = sampler_logprobs
        cfg, kw = prepare(fid, inputs, params)
        leaf = hidden.detach().requires_grad_(True)
        module = LigerFusedLinearGRPOLoss(compiled=False, use_ref_model="ref" in kw, chunk_size=1, temperature=1.0,
                                          **cfg)
        with torch.enable_grad():
            loss, _ = module(leaf, weight.detach(), targets, kw["mask"], kw["advantages"],
                             ref_per_token_logps=kw.get("ref"), old_per_token_logps=kw["old"],
                             vllm_is_ratio=kw.get("vllm_is_ratio"))
            (grad,) = torch.autograd.grad(loss, [leaf])
        return {"loss": loss.detach(), "grad": {"hidden": grad}}

    return head


HEADS = {"logprob.token": head_logprob}
FUSED_HEADS = {"logprob.token": head_logprob, **{fid: head_loss(fid) for fid in HEAD_LOSSES}}
