"""TRL GRPOTrainer: NaN gradient when the log-ratio overflows exp on the clipped side (float32)

Framework: trl 1.16.0, GRPOTrainer._compute_loss (loss_type grpo, bnpo, dr_grpo, dapo, luspo, sapo; also at
importance_sampling_level="sequence"); torch 2.13.0.
Spec: surrogate.ppo_clip, spec/surrogate.md#surrogate.ppo_clip (here through loss.bnpo, spec/loss.md#loss.bnpo):
    term = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)),  r = e^(l - l_old);
    d term / d l = -A r where the unclipped branch is active, else 0.
Input: one token in float32, l = 0, l_old = -200 (a stale or mis-scored old log-prob), A = 1, epsilon 0.2,
loss_type="bnpo".
Expected: loss -1.2 (r is far beyond 1 + eps: the clipped branch is active) and gradient 0.
Got: loss -1.2 but gradient NaN. coef_1 = exp(200) is inf in float32, and autograd multiplies the inactive
branch's zero cotangent by exp's derivative inf: 0 * inf = NaN, which then reaches every parameter.
Fix: clamp the log-ratio before exp, as verl and OpenRLHF do: coef_1 = torch.exp(log_importance_weights.clamp(max=20.0))
(any bound below log(float32 max) = 88.7 keeps the clipped branch exact).
Source: https://github.com/huggingface/trl/blob/v1.16.0/trl/trainer/grpo_trainer.py#L3095

Run: python findings/trl/exp-overflow.py
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
    old = torch.tensor([[-200.0]], dtype=f32)
    A = torch.tensor([1.0], dtype=f32)
    loss = grpo_loss("bnpo", logps, old, torch.tensor([[1]]), A)
    loss.backward()
    # the spec in plain float64: r = e^200 > 1.2 with A > 0, so the clipped branch -A (1 + eps) is active
    r = torch.exp(torch.tensor(200.0, dtype=torch.float64))
    expected = torch.max(-1.0 * r, -1.0 * r.clamp(0.8, 1.2)).item()  # -1.2, gradient 0
    got, grad = loss.item(), logps.grad.item()
    ok = abs(got - expected) <= 1e-6 and grad == 0.0
    return (not ok, "float32 ppo-clip gradient at log-ratio 200 (clipped side)", f"loss {expected:.6g}, grad 0",
            f"loss {got:.6g}, grad {grad}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
