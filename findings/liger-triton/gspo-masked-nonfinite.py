"""Liger Triton GRPO loss: a NaN old log-prob at a padded position makes the sequence-level (GSPO, LUSPO) loss NaN

Framework: liger-kernel 0.8.5, liger_kernel.transformers.grpo_loss.triton_grpo_loss (the Triton kernels of
liger_kernel/ops/grpo_loss.py; reduce=True); triton 3.9.0, torch 2.13.0. Checked on CPU under Triton's
interpreter (TRITON_INTERPRET=1, which the script sets when there is no GPU); on a GPU it runs the compiled
kernels.
Spec: surrogate.gspo / loss.gspo, spec/loss.md#loss.gspo, with the masking rule of spec/conventions.md (a
masked position's inputs are never read):
    l_i = max(-A_i s_i, -A_i clip(s_i, 1 - eps_low, 1 + eps_high)),  s_i = exp( (1/L_i) sum_t m_{i,t} (l_{i,t} - l_old_{i,t}) ).
Input: one sequence of two tokens, the second padded (completion_mask 0) with a NaN old log-prob:
l = (-1, -1), old_logp = (-1.5, NaN), A = 1, eps 3e-4 / 4e-4, loss_type="grpo",
importance_sampling_level="sequence".
Expected: -1.0004 (s = e^0.5 is clipped at 1 + 4e-4).
Got: NaN: the sequence log-ratio is (log_ratio * mask).sum(-1), and NaN * 0 is NaN. (The token-level
kernels return early at masked positions and are not affected.)
Fix: log_ratio = torch.where(mask.bool(), log_ratio, 0) before the sum.
Source: https://github.com/linkedin/Liger-Kernel/blob/v0.8.5/src/liger_kernel/ops/grpo_loss.py#L719

Run: python findings/liger-triton/gspo-masked-nonfinite.py
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
    lp = [[-1.0, -1.0]]
    old = [[-1.5, float("nan")]]
    mask = torch.tensor([[1, 0]])
    loss = grpo_loss(logits_for(lp), old, mask, [1.0], beta=0.0, eps_low=3e-4, eps_high=4e-4, loss_type="grpo",
                     importance_sampling_level="sequence")
    # the spec in plain float64: only token 0 is read
    s = torch.exp(torch.tensor(-1.0 - -1.5, dtype=torch.float64))
    expected = torch.max(-s, -s.clamp(1 - 3e-4, 1 + 4e-4)).item()  # -1.0004
    got = loss.item()
    ok = abs(got - expected) <= 1e-6
    return (not ok, "sequence-level (GSPO) loss with a NaN old log-prob at a masked position", f"{expected:.6g}",
            f"{got:.6g}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
