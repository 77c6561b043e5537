"""Liger Triton GRPO loss: the bias-corrected KL is 0 * inf = NaN when the log-ratio overflows exp (float32)

Framework: liger-kernel 0.8.5, liger_kernel.transformers.grpo_loss.triton_grpo_loss (the Triton kernels of
liger_kernel/ops/grpo_loss.py; reduce=True) with beta > 0 and use_bias_correction_kl=True; triton 3.9.0,
torch 2.13.0. Checked on CPU under Triton's interpreter (TRITON_INTERPRET=1, which the script sets when there
is no GPU); on a GPU it runs the compiled kernels.
Spec: kl.k3_unbiased, spec/kl.md#kl.k3_unbiased, inside loss.grpo, spec/loss.md#loss.grpo:
    L = (1/N) sum_i (1/L_i) sum_t m_{i,t} [ l^PPO_{i,t} + beta kl_{i,t} ],  kl_{i,t} = w_{i,t} k3(l_ref - l),
    w_{i,t} = e^(l_{i,t} - l_old_{i,t}),  k3(x) = e^x - 1 - x,  so kl = w * 0 = 0 where l_ref = l, for any w.
Input: one token, l = -1, l_old = -201 (log-ratio l - l_old = 200), l_ref = l = -1, A = 1, beta = 1,
eps 0.2 / 0.2, loss_type="grpo", use_bias_correction_kl=True (token level).
Expected: -1.2: the policy term is clipped (-(1 + eps_high) A) and the KL is e^200 * k3(0) = 0 (plain float64).
Got: NaN: the kernel computes kl = (exp(ref - logp) - (ref - logp) - 1) * exp(logp - old_logp) in float32,
where exp(200) = inf and inf * 0 = NaN (the same loss with beta = 0 is -1.2; with A = 0 it is 0 at beta = 0
and NaN at beta = 1, so the KL term alone makes it NaN).
Fix: form the product in log space, so that it is inf only where the exact value
overflows and 0 where k3 is 0: kl = tl.where(k3 > 0, tl.exp(tl.log(k3) + (logp - old_logp)), 0.0).
Source: https://github.com/linkedin/Liger-Kernel/blob/v0.8.5/src/liger_kernel/ops/grpo_loss.py#L218-L221

Run: python findings/liger-triton/kl-exp-overflow.py
Exit status: 0 and "REPRODUCED: ..." while the bug is there; 1 and "FIXED: ..." once Liger agrees with the
spec; 2 when it cannot run (findings/README.md).
"""
import os
import sys

try:
    import torch
    if not torch.cuda.is_available():
        # no GPU: run the Triton kernels on CPU in Triton's interpreter (must be set before triton is imported)
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from liger_kernel.transformers.grpo_loss import triton_grpo_loss
except Exception as e:  # noqa: BLE001
    print(f"ERROR: cannot import liger_kernel's Triton GRPO loss/torch: {type(e).__name__}: {e}")
    sys.exit(2)

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def logits_for(logps):
    """(B, T+1, 2) float32 logits whose log-softmax at target 0 is `logps`: z = (l, log(1 - e^l)); the kernel
    ignores the last row."""
    l = torch.as_tensor(logps, dtype=torch.float64)
    z = torch.stack([l, torch.log(-torch.expm1(l))], dim=-1)
    z = torch.cat([z, torch.zeros(l.shape[0], 1, 2, dtype=torch.float64)], dim=1)
    return z.float().to(DEV).contiguous().requires_grad_(True)


def grpo_loss(logits, old, mask, advantages, ref=None, **cfg):
    """triton_grpo_loss with reduce=True (Liger's own aggregation), temperature 1, target token 0."""
    B, T = mask.shape
    f32 = lambda x: None if x is None else torch.as_tensor(x).float().to(DEV).contiguous()  # noqa: E731
    out = triton_grpo_loss(logits, f32(old), f32(ref), torch.zeros(B, T, dtype=torch.long, device=DEV),
                           f32(advantages), mask.to(torch.int32).to(DEV).contiguous(), temperature=1.0,
                           inplace=False, reduce=True, **cfg)
    return out[0] if isinstance(out, tuple) else out


def check():
    lp, old, ref, adv, eps = [[-1.0]], [[-201.0]], [[-1.0]], [1.0], 0.2
    cfg = dict(eps_low=eps, eps_high=eps, loss_type="grpo", use_bias_correction_kl=True)
    got = grpo_loss(logits_for(lp), old, torch.tensor([[1]]), adv, ref=ref, beta=1.0, **cfg).item()
    no_kl = grpo_loss(logits_for(lp), old, torch.tensor([[1]]), adv, ref=ref, beta=0.0, **cfg).item()
    # the spec in plain float64 (e^200 is finite there): clipped PPO term + beta * w * k3(l_ref - l)
    l, lo, lr, a = (torch.tensor(v, dtype=torch.float64) for v in (lp, old, ref, [adv]))
    r, x = torch.exp(l - lo), lr - l
    ppo = -torch.min(r * a, r.clamp(1 - eps, 1 + eps) * a)
    expected = (ppo + 1.0 * r * (torch.exp(x) - x - 1)).mean().item()  # -1.2
    ok = abs(got - expected) <= 1e-6 * abs(expected)
    return (not ok, f"GRPO loss with beta=1, use_bias_correction_kl=True, l - l_old = {lp[0][0] - old[0][0]:g}, "
            f"l_ref = l (beta=0 gives {no_kl:.8g})", f"{expected:.8g}", f"{got:.8g}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
