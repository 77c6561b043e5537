"""Liger GRPO loss: padding a batch changes the loss (an infinite reference log-prob at a padded position gives NaN)

Framework: liger-kernel 0.8.5, LigerFusedLinearGRPOFunction.ppo_loss_fn with beta > 0 (k3_loss_fn, every
loss_type); torch 2.13.0.
Spec: the padding property (spec/properties.md, prop.padding) of loss.grpo, spec/loss.md#loss.grpo, with
kl.k3, spec/kl.md#kl.k3, and the masking rule of spec/conventions.md (a masked position is never read):
    L = (1/N) sum_i (1/L_i) sum_t m_{i,t} [ -A_i r_{i,t} (clipped) + beta k3(l_ref - l) ],  k3(x) = e^x - x - 1;
    appending masked positions, whatever they hold, leaves L and the gradient unchanged.
Input: one on-policy token l = l_old = -1, l_ref = -1.5, A = 1, beta = 0.04, loss_type="grpo"; the same
sequence padded with one masked token whose reference log-prob is -inf.
Expected: the same loss for both, -1 + 0.04 (e^-0.5 + 0.5 - 1) = -0.99573877.
Got: NaN for the padded batch: k3_loss_fn at the padded position is e^(-inf) + inf - 1 = inf, and the mask
product inf * 0 is NaN (the same root cause as findings/liger/masked-nonfinite.py, here through the KL, as
the property rows prop.padding / prop.permutation / prop.on_policy / prop.gradient_fd show).
Fix: select, not multiply: per_token_loss = per_token_loss.masked_fill(attention_mask == 0, 0.0) after the KL
is added.
Source: https://github.com/linkedin/Liger-Kernel/blob/v0.8.5/src/liger_kernel/chunked_loss/grpo_loss.py#L224

Run: python findings/liger/masked-nonfinite-props.py
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
    f64 = torch.float64
    A = torch.tensor([1.0], dtype=f64)
    cfg = dict(loss_type="grpo", beta=0.04, epsilon_low=0.2, epsilon_high=0.2)
    plain = ppo_loss(torch.tensor([[-1.0]], dtype=f64), torch.tensor([[1]]), A, torch.tensor([[-1.0]], dtype=f64),
                     ref_per_token_logps=torch.tensor([[-1.5]], dtype=f64), **cfg).item()
    padded = ppo_loss(torch.tensor([[-1.0, -1.0]], dtype=f64), torch.tensor([[1, 0]]), A,
                      torch.tensor([[-1.0, -1.0]], dtype=f64),
                      ref_per_token_logps=torch.tensor([[-1.5, float("-inf")]], dtype=f64), **cfg).item()
    # the spec in plain float64: on policy r = 1; term = -A + beta k3(l_ref - l)
    x = torch.tensor(-1.5 - -1.0, dtype=f64)
    expected = (-1.0 + 0.04 * (torch.exp(x) - x - 1)).item()  # -0.99573877
    ok = abs(plain - expected) <= 1e-12 and abs(padded - expected) <= 1e-12
    return (not ok, "grpo loss with beta=0.04 after padding with a masked token whose ref log-prob is -inf",
            f"{expected:.8g} padded and unpadded", f"unpadded {plain:.8g}, padded {padded:.8g}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
