"""Liger Triton GRPO loss: LUSPO weighs each sequence by L_i^2 / T instead of L_i

Framework: liger-kernel 0.8.5, liger_kernel.transformers.grpo_loss.triton_grpo_loss (the Triton kernels of
liger_kernel/ops/grpo_loss.py; reduce=True); triton 3.9.0, torch 2.13.0. Checked on CPU under Triton's
interpreter (TRITON_INTERPRET=1, which the script sets when there is no GPU); on a GPU it runs the compiled
kernels.
Spec: loss.luspo, spec/loss.md#loss.luspo (sequence level, beta = 0):
    L = (1/N) sum_i L_i l^GSPO_i   (GSPO's loss with each sequence weighted by its length; TRL:
    (per_token_loss * mask).sum(-1).mean()).
Input: the spec's worked example: on policy, A = (1, -1), lengths 2 and 1 (T = 2), loss_type="luspo",
importance_sampling_level="sequence", eps 3e-4 / 4e-4.
Expected: (2 * (-1) + 1 * 1) / 2 = -0.5.
Got: -0.75: the reduction is (per_token_loss * mask * L_i).mean() over all B x T positions, i.e.
sum_i L_i^2 l_i / (B T): a sequence weighs L_i^2 / T (equal to the spec only when every row is full).
(Liger's chunked path has its own, different LUSPO error: findings/liger/luspo-unmasked-padding.py.)
Fix: in _reduce_grpo_loss for luspo, loss = (per_token_loss * mask).sum() / B (the per-token loss already
carries L_i through the sum over t).
Source: https://github.com/linkedin/Liger-Kernel/blob/v0.8.5/src/liger_kernel/ops/grpo_loss.py#L597

Run: python findings/liger-triton/luspo-length-squared.py
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
    mask = torch.tensor([[1, 1], [1, 0]])
    A = [1.0, -1.0]
    got = grpo_loss(logits_for(lp), lp, mask, A, beta=0.0, eps_low=3e-4, eps_high=4e-4, loss_type="luspo",
                    importance_sampling_level="sequence").item()
    # the spec in plain float64: on policy s_i = 1, l^GSPO_i = -A_i; L = (1/N) sum_i L_i l^GSPO_i
    m, a = mask.double(), torch.tensor(A, dtype=torch.float64)
    lengths = m.sum(-1)
    expected = ((lengths * -a).sum() / (lengths > 0).sum()).item()  # -0.5
    ok = abs(got - expected) <= 1e-6
    return (not ok, "sequence-level LUSPO on the spec's worked example (lengths 2 and 1)", f"{expected:g}",
            f"{got:g}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
