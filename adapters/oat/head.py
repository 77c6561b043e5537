"""OAT's fused LM head for `pgspec check --formula logprob.token --vocab V` (conformance/check/logprob.py).

OAT's default (`use_fused_lm_head=True` in oat/args.py) scores training log-probs without
materializing the logits: ``PPOLearner.get_batch_logps`` calls
``FusedLinear(compute_entropy=...)(hidden_states, lm_head.weight, input_ids[:, 1:], temperature=...)``
(``oat/utils/lm_head.py``, a chunked autograd function adapted from verl) and casts the result to
float32.  This entry point makes the same call with the check's hidden states, head and targets, in
their dtype, and differentiates the sum of the unmasked log-probs with respect to the hidden states.
"""

from __future__ import annotations


def head_logprob(hidden, weight, targets, mask, params):
    import torch

    from . import loader
    from .errors import UnsupportedParameter

    for name, neutral in (("logit_scale", 1), ("softcap", None)):
        if params.get(name, neutral) != neutral:
            raise UnsupportedParameter(f"oat-llm 0.2.4's FusedLinear has no {name}")
    loader.load()
    import oat.utils.lm_head as lm_head

    leaf = hidden.detach().requires_grad_(True)
    with torch.enable_grad():
        lp, _ = lm_head.FusedLinear(compute_entropy=False)(leaf, weight.detach(), targets,
                                                           temperature=params.get("temperature", 1.0))
        lp = lp.to(torch.float32)   # as get_batch_logps does
        (grad,) = torch.autograd.grad(lp[mask].sum(), [leaf])
    return {"logprobs": lp.detach().masked_fill(~mask, 0.0), "grad": {"hidden": grad}}


HEADS = {"logprob.token": head_logprob}
