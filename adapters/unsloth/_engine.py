"""Calling unsloth-zoo 2026.10.9's own GRPO loss on plain tensors.

Two entry points of ``unsloth_zoo.rl_replacements``, both Unsloth's code:

* ``grpo_compute_loss(ref, new, old, sampling, input_ids, mask, beta, advantages, **kwargs)``: the loss
  arithmetic (ratio, clip, delta, cispo/sapo, KL with its clamps and bias correction, vLLM IS, the
  aggregation of every ``loss_type``), called eagerly (the ``unsloth`` adapter);
* ``UnslothEfficientGRPO.apply(...)``: what the patched ``GRPOTrainer.compute_loss``
  (``grpo_accumulated_loss``) runs in training: ``torch.func.grad_and_value`` of that same function inside a
  ``torch.compile(fullgraph=True, dynamic=True)`` region (``torch_compile_with_fallback``), the gradient
  with respect to the log-probs formed in the forward pass and handed back by its ``backward`` (the
  ``unsloth-compiled`` adapter).

Import without an accelerator: unsloth_zoo's ``device_type.get_device_type`` raises "Unsloth cannot find any
torch accelerator? You need a GPU." on a CPU-only machine unless ``UNSLOTH_ZOO_DISABLE_GPU_INIT=1`` (its own
switch: ``device_type.py``, ``_cpu_fallback``).  The adapter sets that variable (only when torch sees no CUDA
device) before the first import; no module is replaced.
"""

from __future__ import annotations

import os

from pgspec.adapters.base import Unsupported


class UnsupportedParameter(Unsupported, NotImplementedError):
    """A spec parameter value (or input form) unsloth-zoo 2026.10.9 has no configuration for."""


def zoo():
    """``unsloth_zoo.rl_replacements``, imported on a CPU-only machine through unsloth_zoo's own switch."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("UNSLOTH_ZOO_DISABLE_GPU_INIT", "1")
    import unsloth_zoo.rl_replacements as rl

    return rl


def options(*, loss_type, level="token", eps_low=0.2, eps_high=0.2, delta=None, bias_correction_kl=False,
            max_completion_length=512, sapo_tau_pos=1.0, sapo_tau_neg=1.05, num_items_in_batch=None,
            is_mode=None, is_c_min=None, is_c_max=None, sample_weight=None):
    """The keyword arguments grpo_accumulated_loss forwards to grpo_compute_loss (its ``kwargs``), one process,
    one accumulation step."""
    kw = dict(loss_type=loss_type, importance_sampling_level=level, epsilon_low=eps_low, epsilon_high=eps_high,
              delta=delta, use_bias_correction_kl=bias_correction_kl, max_completion_length=max_completion_length,
              sapo_temperature_pos=sapo_tau_pos, sapo_temperature_neg=sapo_tau_neg,
              current_gradient_accumulation_steps=1, num_processes=1)
    if num_items_in_batch is not None:
        kw["num_items_in_batch"] = num_items_in_batch
    if is_mode is not None:
        kw.update(use_vllm=True, vllm_importance_sampling_correction=True, vllm_importance_sampling_mode=is_mode,
                  vllm_importance_sampling_clip_min=is_c_min, vllm_importance_sampling_clip_max=is_c_max)
    if sample_weight is not None:
        kw["sample_weight"] = sample_weight
    return kw


def _ids(mask):
    import torch

    return torch.zeros(mask.shape, dtype=torch.long, device=mask.device)


def eager(*, logprobs, mask, advantages, beta=0.0, old_logprobs=None, ref_logprobs=None, sampler_logprobs=None,
          **kw):
    """grpo_compute_loss, eagerly: its full return tuple (loss, completion_length, mean_kl, delta,
    flat_is_ratio, coef_1, mask)."""
    rl = zoo()
    return rl.grpo_compute_loss(ref_logprobs, logprobs, old_logprobs, sampler_logprobs, _ids(mask), mask, beta,
                                advantages, **kw)


def fused(*, logprobs, mask, advantages, beta=0.0, old_logprobs=None, ref_logprobs=None, sampler_logprobs=None,
          **kw):
    """UnslothEfficientGRPO.apply as grpo_accumulated_loss calls it (no grad scaler, n_chunks = 1, no upstream
    scale): (loss, completion_length, mean_kl, delta, flat_is_ratio, coef_1).  The loss is differentiable with
    respect to ``logprobs`` through Unsloth's own backward."""
    rl = zoo()
    return rl.UnslothEfficientGRPO.apply(logprobs, old_logprobs, ref_logprobs, sampler_logprobs, None, _ids(mask),
                                         mask, advantages, beta, None, 1, kw, None)
