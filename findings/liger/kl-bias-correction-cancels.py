"""Liger GRPO loss: the gradient of the bias-corrected KL (use_bias_correction_kl) cancels catastrophically

Framework: liger-kernel 0.8.5, LigerFusedLinearGRPOFunction.ppo_loss_fn with beta > 0 and
use_bias_correction_kl=True (TRL's formula, mirrored); torch 2.13.0.
Spec: kl.k3_unbiased, spec/kl.md#kl.k3_unbiased, the KL term of loss.bnpo, spec/loss.md#loss.bnpo:
    y = w k3(x),  w = e^(l - l_old),  x = l_ref - l,  k3(x) = e^x - x - 1,
    dy/dl = w k3(x) - w (e^x - 1) = -w x = w (l - l_ref).
Input: one token, float32 (the training dtype), l = l_old = 0, l_ref = 20, A = 0 (no policy term), beta = 1,
loss_type="bnpo".
Expected: gradient -w x = -20 (its size is that of x, nothing near overflow).
Got: -32 (float32). `kl_div = kl_div * torch.exp(log_importance_weights)` on k3_loss_fn's exp(x) - x - 1 lets
autograd form w k3(x) and -w (e^x - 1) separately: two numbers of size e^20 = 4.9e8, whose float32 difference
keeps only the ulp of 4.9e8 (32). At small |x| (x = -2^-9) e^x - 1 cancels the same way.
Fix (token level): write the product so that no term of size e^x is differentiated, e.g.
    kl_div = torch.exp(ref_per_token_logps - old_per_token_logps) - coef_1 * (ref_per_token_logps - per_token_logps + 1)
(the same value w k3(x); autograd now forms w (x + 1) - w = -w x from terms of size w |x|).
Source: https://github.com/linkedin/Liger-Kernel/blob/v0.8.5/src/liger_kernel/chunked_loss/grpo_loss.py#L210-L216

Run: python findings/liger/kl-bias-correction-cancels.py
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
    old = torch.tensor([[0.0]], dtype=f32)
    ref = torch.tensor([[20.0]], dtype=f32)
    loss = ppo_loss(logps, torch.tensor([[1]]), torch.tensor([0.0], dtype=f32), old, loss_type="bnpo", beta=1.0,
                    ref_per_token_logps=ref, use_bias_correction_kl=True)
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
