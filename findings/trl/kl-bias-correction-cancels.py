"""TRL GRPOTrainer: the gradient of the bias-corrected KL (use_bias_correction_kl) cancels catastrophically

Framework: trl 1.16.0, GRPOTrainer._compute_loss with beta > 0 and use_bias_correction_kl=True (the default
since trl#6503); torch 2.13.0.
Spec: kl.k3_unbiased, spec/kl.md#kl.k3_unbiased:
    y = w k3(x),  w = e^(l - l_old),  x = l_ref - l,  k3(x) = e^x - x - 1,
    dy/dl = w k3(x) - w (e^x - 1) = -w x = w (l - l_ref).
Input: one token, float32 (the training dtype), l = l_old = 0, l_ref = 20, A = 0 (no policy term), beta = 1,
loss_type="bnpo".
Expected: gradient -w x = -20 (its size is that of x, nothing near overflow).
Got: -32 (float32; 0 or NaN once x reaches ~88). `per_token_kl = per_token_kl * coef_1` lets autograd form
w k3(x) and -w (e^x - 1) separately: two numbers of size e^20 = 4.9e8, whose float32 difference keeps only
the ulp of 4.9e8 (32).
Fix (token level): write the product so that no term of size e^x is differentiated, e.g.
    per_token_kl = torch.exp(ref_per_token_logps - old_per_token_logps) - coef_1 * (ref_per_token_logps - per_token_logps + 1)
(the same value w k3(x); autograd now forms w (x + 1) - w = -w x from terms of size w |x|).
Source: https://github.com/huggingface/trl/blob/v1.16.0/trl/trainer/grpo_trainer.py#L3105

Run: python findings/trl/kl-bias-correction-cancels.py
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
    f32 = torch.float32
    logps = torch.tensor([[0.0]], dtype=f32, requires_grad=True)
    old = torch.tensor([[0.0]], dtype=f32)
    ref = torch.tensor([[20.0]], dtype=f32)
    loss = grpo_loss("bnpo", logps, old, torch.tensor([[1]]), torch.tensor([0.0], dtype=f32), beta=1.0, ref_logps=ref)
    loss.backward()
    # the spec's gradient in plain float64: w (l - l_ref)
    w = torch.exp(torch.tensor(0.0 - 0.0, dtype=torch.float64))
    expected = (w * (0.0 - 20.0)).item()  # -20
    got = logps.grad.item()
    ok = abs(got - expected) <= 1e-4 * abs(expected)  # float32: a few ulps of 20
    return (not ok, "float32 gradient of beta * exp(l - l_old) * k3 at l_ref - l = 20", f"{expected:.6g}",
            f"{got:.6g}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
