"""Liger GRPO loss: NaN gradient when the log-ratio overflows exp on the clipped side (float32)

Framework: liger-kernel 0.8.5, LigerFusedLinearGRPOFunction.ppo_loss_fn (loss_type grpo, bnpo, dr_grpo, dapo,
luspo, sapo; also at importance_sampling_level="sequence"); torch 2.13.0.
Spec: surrogate.ppo_clip, spec/surrogate.md#surrogate.ppo_clip (here through loss.bnpo, spec/loss.md#loss.bnpo):
    term = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)),  r = e^(l - l_old);
    d term / d l = -A r where the unclipped branch is active, else 0.
Input: one token in float32 (Liger's log-probs are float32), l = 0, l_old = -200, A = 1, epsilon 0.2,
loss_type="bnpo".
Expected: loss -1.2 (the clipped branch is active) and gradient 0.
Got: loss -1.2 but gradient NaN: coef_1 = exp(200) is inf in float32, and autograd multiplies the inactive
branch's zero cotangent by exp's derivative inf (0 * inf = NaN), which then reaches every parameter.
Fix: clamp the log-ratio before exp, as verl and OpenRLHF do: coef_1 = torch.exp(log_importance_weights.clamp(max=20.0)).
Source: https://github.com/linkedin/Liger-Kernel/blob/v0.8.5/src/liger_kernel/chunked_loss/grpo_loss.py#L155

Run: python findings/liger/exp-overflow.py
Exit status: 0 and "REPRODUCED: ..." while the bug is there; 1 and "FIXED: ..." once Liger agrees with the
spec; 2 when it cannot run (findings/README.md).
"""
import sys

try:
    import torch
    from liger_kernel.chunked_loss.grpo_loss import LigerFusedLinearGRPOFunction
except Exception as e:  # noqa: BLE001
    print(f"ERROR: cannot import liger_kernel/torch: {type(e).__name__}: {e}")
    sys.exit(2)


def ppo_loss(logps, mask, advantages, old_logps, **cfg):
    """Liger's GRPO loss math on given log-probs: LigerFusedLinearGRPOFunction.ppo_loss_fn, the function
    LigerFusedLinearGRPOLoss applies to the log-probs of its LM head (and torch.compile's unit)."""
    cfg.setdefault("beta", 0.0)
    loss, _ = LigerFusedLinearGRPOFunction.ppo_loss_fn(
        per_token_logps=logps, attention_mask=mask, advantages=advantages, full_attention_mask=mask,
        old_per_token_logps=old_logps, **cfg)
    return loss


def check():
    f32 = torch.float32
    logps = torch.tensor([[0.0]], dtype=f32, requires_grad=True)
    old = torch.tensor([[-200.0]], dtype=f32)
    A = torch.tensor([1.0], dtype=f32)
    loss = ppo_loss(logps, torch.tensor([[1]]), A, old, loss_type="bnpo", epsilon_low=0.2, epsilon_high=0.2)
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
