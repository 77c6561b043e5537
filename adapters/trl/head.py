"""TRL's fused LM head for `pgspec check --formula logprob.token --vocab V` (conformance/check/logprob.py).

TRL 1.16.0 scores training log-probs without materializing the logits: its patched model forward
(`trl/trainer/utils.py`, `_fused_forward`) selects the positions with a label and calls
``_ChunkedLogProbFunction.apply(hidden[mask], weight, bias, labels[mask], temperature,
_CHUNKED_LOGPROB_CHUNK_SIZE, final_logit_softcapping, logit_scale, outputs)`` (on devices with
Triton; elsewhere it scores every position), then scatters the result back with zeros.  This entry
point does exactly that with the check's hidden states and head, on their device and in their dtype,
and differentiates the sum of the unmasked log-probs with respect to the hidden states.
"""

from __future__ import annotations


def head_logprob(hidden, weight, targets, mask, params):
    import torch
    from trl.trainer import utils as trl_utils

    leaf = hidden.detach().requires_grad_(True)
    with torch.enable_grad():
        per_token = trl_utils._ChunkedLogProbFunction.apply(
            leaf[mask], weight.detach(), None, targets[mask], params.get("temperature", 1),
            trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE, params.get("softcap"), params.get("logit_scale", 1), ())
        lp = per_token[0]
        out = lp.new_zeros(mask.shape).masked_scatter(mask, lp)
        (grad,) = torch.autograd.grad(lp.sum(), [leaf])
    return {"logprobs": out.detach(), "grad": {"hidden": grad}}


HEADS = {"logprob.token": head_logprob}
