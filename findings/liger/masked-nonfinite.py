"""Liger GRPO loss: a NaN at a padded (masked) position makes the loss NaN

Framework: liger-kernel 0.8.5, LigerFusedLinearGRPOLoss / LigerFusedLinearGRPOFunction.ppo_loss_fn (every
loss_type; and k3_loss_fn); torch 2.13.0.
Spec: loss.bnpo, spec/loss.md#loss.bnpo, with the masking rule of spec/conventions.md ("Masks: excluded, not
multiplied by zero": a masked position's inputs are never read and its gradient is exactly 0):
    L = sum_{i,t} m_{i,t} term_{i,t} / sum_{i,t} m_{i,t},   term = max(-A r, -A clip(r, 1 - eps, 1 + eps)),  r = e^(l - l_old)
Input: one completion of two tokens, the second padded (attention_mask 0) with a NaN old log-prob, A = 1,
loss_type="bnpo", epsilon 0.2.
Expected: loss -1.2 (the valid token's r = e^0.25 = 1.284 is clipped at 1.2), gradient 0 at both tokens.
Got: loss NaN: ppo_loss_fn computes the per-token loss at every position and multiplies by the attention
mask ((per_token_loss * attention_mask).sum()), and NaN * 0 = NaN.
Fix: select instead of multiplying: per_token_loss = per_token_loss.masked_fill(attention_mask == 0, 0.0)
before the aggregation (and the same for the sequence-level log-ratio).
Source: https://github.com/linkedin/Liger-Kernel/blob/v0.8.5/src/liger_kernel/chunked_loss/grpo_loss.py#L224

Run: python findings/liger/masked-nonfinite.py
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
    logps = torch.tensor([[-1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[-1.25, float("nan")]], dtype=torch.float64)
    mask = torch.tensor([[1, 0]])
    A = torch.tensor([1.0], dtype=torch.float64)
    loss = ppo_loss(logps, mask, A, old, loss_type="bnpo", epsilon_low=0.2, epsilon_high=0.2)
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
