"""Unsloth grpo_compute_loss: NaN gradient when the log-ratio overflows exp on the clipped side (float32)

Framework: unsloth-zoo 2026.10.9, unsloth_zoo.rl_replacements.grpo_compute_loss (the loss Unsloth's patched
GRPOTrainer runs, eagerly and inside UnslothEfficientGRPO; loss_type grpo, bnpo, dr_grpo, dapo, luspo, sapo,
also at importance_sampling_level="sequence"); torch 2.13.0.
Spec: surrogate.ppo_clip, spec/surrogate.md#surrogate.ppo_clip (here through loss.bnpo, spec/loss.md#loss.bnpo):
    term = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)),  r = e^(l - l_old);
    d term / d l = -A r where the unclipped branch is active, else 0.
Input: one token in float32, l = 0, l_old = -200 (a stale or mis-scored old log-prob), A = 1, epsilon 0.2,
loss_type="bnpo", beta = 0.
Expected: loss -1.2 (r is far beyond 1 + eps: the clipped branch is active) and gradient 0.
Got: loss -1.2 but gradient NaN. coef_1 = torch.exp(log_importance_weights) is inf in float32, and autograd
multiplies the inactive branch's zero cotangent by exp's derivative inf: 0 * inf = NaN, which then reaches every
parameter. grpo_compute_loss clamps the log-ratio to [-20, 20] only on its rollout_logps_as_old path.
Fix: clamp the log-ratio before exp on every path, e.g. coef_1 = torch.exp(log_importance_weights.clamp(max=20.0))
(any bound below log(float32 max) = 88.7 keeps the clipped branch exact).
Source: https://github.com/unslothai/unsloth-zoo/blob/2026.10.9/unsloth_zoo/rl_replacements.py#L1133

Run: python findings/unsloth/exp-overflow.py
(no GPU needed: on a machine without one the script sets unsloth-zoo's own UNSLOTH_ZOO_DISABLE_GPU_INIT=1.)
Exit status: 0 and "REPRODUCED: ..." while the bug is there; 1 and "FIXED: ..." once Unsloth agrees with the
spec; 2 when it cannot run (findings/README.md).
"""
import os
import sys

try:
    import torch

    if not torch.cuda.is_available():
        # unsloth-zoo refuses a machine without an accelerator at import unless this, its own switch for CPU use
        os.environ.setdefault("UNSLOTH_ZOO_DISABLE_GPU_INIT", "1")
    from unsloth_zoo.rl_replacements import grpo_compute_loss
except Exception as e:  # noqa: BLE001
    print(f"ERROR: cannot import unsloth_zoo/torch: {type(e).__name__}: {e}")
    sys.exit(2)


def unsloth_loss(loss_type, logps, old_logps, mask, advantages, beta=0.0, ref_logps=None, level="token", eps=0.2,
                 bias_correction_kl=False):
    """grpo_compute_loss (unsloth-zoo's own code) with the keyword arguments Unsloth's grpo_accumulated_loss
    forwards to it: one process, one accumulation step, no vLLM importance sampling.  Returns the loss."""
    ids = torch.zeros(mask.shape, dtype=torch.long)
    out = grpo_compute_loss(ref_logps, logps, old_logps, None, ids, mask, beta, advantages, loss_type=loss_type,
                            importance_sampling_level=level, epsilon_low=eps, epsilon_high=eps, delta=None,
                            use_bias_correction_kl=bias_correction_kl, max_completion_length=512,
                            current_gradient_accumulation_steps=1, num_processes=1)
    return out[0]


def check():
    f32 = torch.float32
    logps = torch.tensor([[0.0]], dtype=f32, requires_grad=True)
    old = torch.tensor([[-200.0]], dtype=f32)
    A = torch.tensor([1.0], dtype=f32)
    loss = unsloth_loss("bnpo", logps, old, torch.tensor([[1]]), A)
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
