"""Calling ms-swift 4.6.0's own GRPO loss on plain tensors.

``swift.rlhf_trainers.grpo_trainer.GRPOTrainer._compute_loss_and_metrics(self, model, model_inputs, grpo_batch)``
is called unbound on a stub ``self`` (``object.__new__``: no ``__init__``, model or dataset) carrying the
attributes ``_prepare_algorithm_params`` would set from the ``GRPOConfig`` and a ``_get_per_token_logps_and_entropies``
that returns the log-probs (and entropies) under test; ``grpo_batch`` is ms-swift's own ``GRPOBatch``.
Everything else (the ratio at each ``importance_sampling_level``, the clip, ``delta``, cispo/sapo, the KL with
its clamps, the rollout IS correction ``_apply_rollout_importance_sampling``, the off-policy sequence mask, the
entropy mask and the aggregation of each ``loss_type``) is ms-swift's code.
"""

from __future__ import annotations

import types
from collections import defaultdict

from pgspec.adapters.base import Unsupported


class UnsupportedParameter(Unsupported, NotImplementedError):
    """A spec parameter value (or input form) ms-swift 4.6.0 has no configuration for."""


def trainer_class():
    from swift.rlhf_trainers.grpo_trainer import GRPOTrainer

    return GRPOTrainer


def _accelerator(device):
    def identity(x, *a, **k):
        return x

    return types.SimpleNamespace(num_processes=1, process_index=0, device=device, gather_for_metrics=identity,
                                 gather=identity)


def make_stub(*, loss_type, level="token", eps_low=0.2, eps_high=0.2, delta=None, beta=0.0, tau_pos=1.0,
              tau_neg=1.05, top_entropy_quantile=1.0, is_mode=None, is_threshold=2.0, opsm_delta=None,
              max_completion_length=512, device="cpu"):
    """A GRPOTrainer instance without __init__, with the attributes _compute_loss_and_metrics reads (names and
    meanings as _prepare_algorithm_params sets them, grpo_trainer.py#L2127-L2189)."""
    import torch

    self = object.__new__(trainer_class())
    self.args = types.SimpleNamespace(delta=delta, log_entropy=False, top_entropy_quantile=top_entropy_quantile,
                                      gradient_accumulation_steps=1)
    self.model = types.SimpleNamespace(training=True)
    self.loss_type = loss_type
    self.importance_sampling_level = level
    self.epsilon_low = eps_low
    self.epsilon_high = eps_high
    self.beta = beta
    self.kl_in_reward = False
    self.tau_pos, self.tau_neg = tau_pos, tau_neg
    self.top_entropy_quantile = top_entropy_quantile
    self.compute_entropy = top_entropy_quantile < 1.0
    self.overlong_filter = False
    self.rollout_importance_sampling_mode = is_mode
    self.rollout_importance_sampling_threshold = is_threshold
    self.disable_rollout_importance_sampling = False
    self.log_rollout_offpolicy_metrics = False
    self.off_policy_sequence_mask_delta = opsm_delta
    self._has_teacher = False
    self.max_completion_length = max_completion_length
    self.sdar_loss_coef = 0.0
    self.chord_sft_iterator = None
    self.model_accepts_loss_kwargs = False
    self.compute_loss_func = None
    self.current_gradient_accumulation_steps = 1
    self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    self.accelerator = _accelerator(torch.device(device))
    return self


def compute_loss(stub, *, logprobs, mask, advantages, old_logprobs=None, ref_logprobs=None, sampler_logprobs=None,
                 entropy=None, num_items_in_batch=None, completion_mask=None):
    """Run ms-swift's _compute_loss_and_metrics on these tensors: (loss, metrics_data).  ``mask`` is the
    canonical bool mask; ``completion_mask`` (a float tensor, possibly requiring grad) replaces it in the
    GRPOBatch when given.  Per-sequence advantages are expanded to [B, T] as ms-swift's batch construction does
    (expand_advantage_to_per_token)."""
    import torch

    from swift.rl_core.advantage import expand_advantage_to_per_token
    from swift.rl_core.data import GRPOBatch

    B, T = mask.shape
    ent = entropy if entropy is not None else torch.zeros_like(logprobs)
    stub._get_per_token_logps_and_entropies = lambda *a, **k: (logprobs, ent)
    cm = completion_mask if completion_mask is not None else mask
    adv = advantages if advantages.dim() == 2 else expand_advantage_to_per_token(advantages, mask)
    n = float(mask.sum().item() if num_items_in_batch is None else num_items_in_batch)
    batch = GRPOBatch(completion_mask=cm, truncated_mask=torch.zeros(B, dtype=torch.bool),
                      seq_lengths=torch.full((B,), T), old_per_token_logps=old_logprobs,
                      ref_per_token_logps=ref_logprobs, rollout_per_token_logps=sampler_logprobs, advantages=adv,
                      num_items_in_batch=torch.tensor(n, dtype=logprobs.dtype))
    return stub._compute_loss_and_metrics(None, {}, batch)
