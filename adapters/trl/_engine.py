"""Calling TRL 1.16.0's own GRPO loss on plain tensors.

``GRPOTrainer._compute_loss(self, model, inputs)`` is called unbound on a stub ``self`` (an instance made
with ``object.__new__`` so no ``__init__``, model or dataset is needed) whose
``_get_per_token_logps_and_entropies`` returns the log-probs (and entropies) under test.  Everything else,
the ratio, the clip, ``delta``, the KL and its bias correction, OPSM, the entropy mask, the vLLM IS
multiply and the aggregation for each ``loss_type``, is TRL's code.

Per-token read-outs.  ``_compute_loss`` returns a scalar.  Per-token quantities are read from it with
autograd, never recomputed:

* with a ``dapo``-normalized loss type (``dapo``, ``cispo``, ``vespo``) and ``num_items_in_batch = 1``
  the loss is ``sum(per_token_loss * mask)``; with a float ``mask`` that requires grad,
  ``d loss / d mask[i, t] = per_token_loss[i, t]`` exactly (valid while the mask enters nothing else
  differentiably: token-level ratio);
* ``d loss / d importance_sampling_ratio[i, t]`` is the policy term before the IS multiply (used for
  sequence-level losses and for ``sapo``).

Masked positions reach TRL as the case gives them (NaN/inf included): TRL multiplies by the completion
mask rather than selecting, so whether a masked position can contaminate the result is part of what is
tested (spec/verdicts.md: always a bug).  Only the log-prob kernel selects the unmasked positions, as TRL's
fused LM head scores only positions with a label.
"""

from __future__ import annotations

import types
from collections import defaultdict


from pgspec.adapters.base import Unsupported


class UnsupportedParameter(Unsupported, NotImplementedError):
    """A spec parameter value (or input form) that TRL 1.16.0 has no configuration for.  The declared
    capabilities (deviations.toml) keep golden cases outside them from reaching the adapter; a property
    example outside them raises this, which the property runner reports as ``unsupported``."""


def _accelerator(device):
    def identity(x, *a, **k):
        return x

    return types.SimpleNamespace(
        num_processes=1, process_index=0, device=device, sync_gradients=True,
        gather=identity, reduce=identity, gather_for_metrics=identity, pad_across_processes=identity,
    )


def make_stub(*, loss_type, level="token", eps_low=0.2, eps_high=0.2, delta=None, beta=0.0, bias_correction_kl=False,
              opsm_threshold=None, top_entropy_quantile=1.0, use_is=False, sapo_tau_pos=1.0, sapo_tau_neg=1.05,
              vespo=(2.0, 3.0, 3.0, 2.0), max_completion_length=512, device="cpu", trainer_cls=None):
    """A GRPOTrainer (or subclass, e.g. the experimental GMPOTrainer) instance without __init__, carrying exactly
    the attributes _compute_loss reads."""
    import torch
    from trl import GRPOTrainer

    self = object.__new__(trainer_cls or GRPOTrainer)
    k_pos, lambda_pos, k_neg, lambda_neg = vespo
    self.args = types.SimpleNamespace(
        delta=delta, use_bias_correction_kl=bias_correction_kl,
        sapo_temperature_pos=sapo_tau_pos, sapo_temperature_neg=sapo_tau_neg,
        vespo_k_pos=k_pos, vespo_lambda_pos=lambda_pos, vespo_k_neg=k_neg, vespo_lambda_neg=lambda_neg,
        steps_per_generation=1,
    )
    self.loss_type = loss_type
    self.importance_sampling_level = level
    self.epsilon_low = eps_low
    self.epsilon_high = eps_high
    self.beta = beta
    self.off_policy_mask_threshold = opsm_threshold
    self.top_entropy_quantile = top_entropy_quantile
    self.use_vllm = use_is
    self.vllm_importance_sampling_correction = use_is
    self.max_completion_length = max_completion_length
    self.aux_loss_enabled = False
    self._entropy_bonus_enabled = False
    self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    self.current_gradient_accumulation_steps = 1
    self.model = types.SimpleNamespace(training=True)
    self.accelerator = _accelerator(torch.device(device))
    return self


def compute_loss(stub, *, logprobs, mask, advantages, old_logprobs=None, ref_logprobs=None, sampler_logprobs=None,
                 is_ratio=None, entropy=None, num_items_in_batch=None, float_mask=None):
    """Run TRL's _compute_loss on these tensors.  ``mask`` is the canonical bool mask; ``float_mask`` (a
    float tensor, possibly requiring grad) replaces TRL's integer completion mask when given."""
    import torch

    B, T = mask.shape
    ent = entropy if entropy is not None else torch.zeros_like(logprobs)
    stub._get_per_token_logps_and_entropies = lambda *a, **k: (logprobs, ent, None)
    completion_mask = float_mask if float_mask is not None else mask.long()
    inputs = {
        "prompt_ids": torch.zeros((B, 1), dtype=torch.long, device=mask.device),
        "prompt_mask": torch.ones((B, 1), dtype=torch.long, device=mask.device),
        "completion_ids": torch.zeros((B, T), dtype=torch.long, device=mask.device),
        "completion_mask": completion_mask,
        "advantages": advantages,
        "num_items_in_batch": torch.tensor(
            float(mask.sum().item() if num_items_in_batch is None else num_items_in_batch), device=mask.device),
    }
    if old_logprobs is not None:
        inputs["old_per_token_logps"] = old_logprobs
    if ref_logprobs is not None:
        inputs["ref_per_token_logps"] = ref_logprobs
    if sampler_logprobs is not None:
        inputs["sampling_per_token_logps"] = sampler_logprobs
    if is_ratio is not None:
        inputs["importance_sampling_ratio"] = is_ratio
    return stub._compute_loss(None, inputs)
