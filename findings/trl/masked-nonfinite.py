"""TRL GRPOTrainer: a NaN at a padded (masked) position makes the GRPO loss NaN

Framework: trl 1.16.0, GRPOTrainer._compute_loss (every loss_type); torch 2.13.0.
Spec: loss.bnpo, spec/loss.md#loss.bnpo, with the masking rule of spec/conventions.md ("Masks: excluded,
not multiplied by zero": a masked position's inputs are never read and its gradient is exactly 0):
    L = sum_{i,t} m_{i,t} term_{i,t} / sum_{i,t} m_{i,t},   term = max(-A r, -A clip(r, 1 - eps, 1 + eps)),  r = e^(l - l_old)
Input: one completion of two tokens, the second padded (completion_mask 0) with a NaN old log-prob (what a
sampler reports for a position it did not score), A = 1, loss_type="bnpo", epsilon 0.2.
Expected: loss -1.2 (the valid token's r = e^0.25 = 1.284 is clipped at 1.2), gradient 0 at both tokens.
Got: loss NaN. _compute_loss forms the ratio and the per-token loss at every position and multiplies by the
completion mask ((per_token_loss * mask).sum(...)), and NaN * 0 = NaN.
Fix: select instead of multiplying, e.g. per_token_loss = per_token_loss.masked_fill(mask == 0, 0.0) (and the
same for the sequence-level log-ratio and the KL) before the aggregation.
Source: https://github.com/huggingface/trl/blob/v1.16.0/trl/trainer/grpo_trainer.py#L3154

Run: python findings/trl/masked-nonfinite.py
Exit status: 0 and "REPRODUCED: ..." while the bug is there; 1 and "FIXED: ..." once TRL agrees with the
spec; 2 when it cannot run (findings/README.md).
"""
import sys
import types
from collections import defaultdict

try:
    import torch
    from trl import GRPOTrainer
except Exception as e:  # noqa: BLE001
    print(f"ERROR: cannot import trl/torch: {type(e).__name__}: {e}")
    sys.exit(2)


def grpo_loss(loss_type, logps, old_logps, mask, advantages, beta=0.0, ref_logps=None, level="token", eps=0.2,
              trainer=GRPOTrainer):
    """GRPOTrainer._compute_loss (TRL's own code) on given log-probs: the trainer object is made without
    __init__ (no model, dataset or accelerator); _get_per_token_logps_and_entropies returns `logps`."""
    t = object.__new__(trainer)
    t.args = types.SimpleNamespace(delta=None, use_bias_correction_kl=True, steps_per_generation=1,
                                   sapo_temperature_pos=1.0, sapo_temperature_neg=1.05)  # GRPOConfig defaults
    t.loss_type, t.importance_sampling_level, t.epsilon_low, t.epsilon_high, t.beta = loss_type, level, eps, eps, beta
    t.off_policy_mask_threshold, t.top_entropy_quantile, t.use_vllm = None, 1.0, False
    t.vllm_importance_sampling_correction, t.max_completion_length, t.aux_loss_enabled = False, 512, False
    t._entropy_bonus_enabled, t.current_gradient_accumulation_steps = False, 1
    t._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    t.model = types.SimpleNamespace(training=True)
    same = lambda x, *a, **k: x  # noqa: E731
    t.accelerator = types.SimpleNamespace(num_processes=1, gather=same, gather_for_metrics=same, reduce=same)
    t._get_per_token_logps_and_entropies = lambda *a, **k: (logps, torch.zeros_like(logps), None)
    B, T = mask.shape
    inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
              "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask,
              "advantages": advantages, "old_per_token_logps": old_logps,
              "num_items_in_batch": mask.sum().float()}
    if ref_logps is not None:
        inputs["ref_per_token_logps"] = ref_logps
    return t._compute_loss(None, inputs)


def check():
    logps = torch.tensor([[-1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.25, float("nan")]], dtype=torch.float64)
    mask = torch.tensor([[1, 0]])
    A = torch.tensor([1.0], dtype=torch.float64)
    loss = grpo_loss("bnpo", logps, old, mask, A)
    loss.backward()
    # the spec in plain float64: only token 0 is read
    r = torch.exp(torch.tensor(-1.0 - -1.25, dtype=torch.float64))
    expected = torch.max(-A[0] * r, -A[0] * r.clamp(0.8, 1.2)).item()  # -1.2
    got, grad = loss.item(), logps.grad[0].tolist()
    ok = abs(got - expected) <= 1e-12 and grad == [0.0, 0.0]
    return (not ok, "NaN old log-prob at a masked position reaches the bnpo loss",
            f"loss {expected:.6g}, grad [0, 0]", f"loss {got:.6g}, grad {grad}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
