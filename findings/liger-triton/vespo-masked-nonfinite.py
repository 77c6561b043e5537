"""Liger VESPO: a NaN old log-prob at a padded position silently drops the whole sequence from the loss

Framework: liger-kernel 0.8.5, liger_kernel.transformers.grpo_loss.triton_grpo_loss (the Triton kernels of
liger_kernel/ops/grpo_loss.py; reduce=True); triton 3.9.0, torch 2.13.0. Checked on CPU under Triton's
interpreter (TRITON_INTERPRET=1, which the script sets when there is no GPU); on a GPU it runs the compiled
kernels. (VESPO's phi comes from liger_kernel.chunked_loss.grpo_loss.get_gamma_weights, which the Triton path calls.)
Spec: loss.vespo, spec/loss.md#loss.vespo, with the masking rule of spec/conventions.md:
    L = sum_{i,t} m_{i,t} (-sg[phi_i] A_i l_{i,t}) / sum_{i,t} m_{i,t},
    phi_i = exp(lambda + k log w_i - lambda w_i),  log w_i = sum_t m_{i,t} (l_{i,t} - l_old_{i,t});  on policy phi = 1.
Input: two on-policy sequences, l = ((-1, -2), (-0.5, -1)), A = (1, -1); row 1's second token is padded
and its old log-prob is NaN (old_logp = ((-1, -2), (-0.5, NaN))); loss_type="vespo", default k and lambda.
Expected: phi = 1 for both rows; loss = (1 + 2 - 0.5) / 3 = 0.8333.
Got: 1.0, no NaN in sight: get_gamma_weights sums clamp(log_ratio) * mask, row 1's phi is NaN, and
nan_to_num(nan=0) turns it into 0, so row 1 silently contributes nothing.
Fix: in get_gamma_weights, seq_log_ratio = torch.where(mask.bool(), log_ratio_clamped, 0).sum(-1, keepdim=True).
Source: https://github.com/linkedin/Liger-Kernel/blob/v0.8.5/src/liger_kernel/chunked_loss/grpo_loss.py#L36

Run: python findings/liger-triton/vespo-masked-nonfinite.py
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
    lp = [[-1.0, -2.0], [-0.5, -1.0]]
    old = [[-1.0, -2.0], [-0.5, float("nan")]]
    mask = torch.tensor([[1, 1], [1, 0]])
    A = [1.0, -1.0]
    got = grpo_loss(logits_for(lp), old, mask, A, beta=0.0, loss_type="vespo").item()
    # the spec in plain float64: on policy (log w = 0) phi = exp(lambda - lambda) = 1 for both rows
    l, m, a = torch.tensor(lp, dtype=torch.float64), mask.double(), torch.tensor(A, dtype=torch.float64)
    phi = torch.ones(2, 1, dtype=torch.float64)
    expected = ((-phi * a[:, None] * l * m).sum() / m.sum()).item()  # 0.8333
    ok = abs(got - expected) <= 1e-6
    return (not ok, "VESPO loss with a NaN old log-prob at a masked position of row 1", f"{expected:.6g}",
            f"{got:.6g}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
