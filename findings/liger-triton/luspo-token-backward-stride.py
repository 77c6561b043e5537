"""Liger Triton GRPO loss: token-level LUSPO backward reads a (B, 1) buffer as (B, T)

Framework: liger-kernel 0.8.5, liger_kernel.transformers.grpo_loss.triton_grpo_loss (the Triton kernels of
liger_kernel/ops/grpo_loss.py; reduce=True); triton 3.9.0, torch 2.13.0. Checked on CPU under Triton's
interpreter (TRITON_INTERPRET=1, which the script sets when there is no GPU); on a GPU it runs the compiled
kernels.
Spec: loss.luspo, spec/loss.md#loss.luspo (ratio_level = token); whatever the reduction, a backward must be
the derivative of its forward.
Input: B = 2, T = 2, lengths 2 and 1, on policy, l = ((-1, -2), (-0.5, -1)), A = (1, -1), epsilon 0.2,
loss_type="luspo", importance_sampling_level="token" (the logits are the 2-entry rows whose log-softmax at the
target is l).
Expected: the kernel's gradient w.r.t. the logit of token (0, 1) equals the derivative of its own forward
loss (a central difference of triton_grpo_loss's value, h = 1e-2).
Got: half of it. For luspo, GrpoLossFunction.backward builds dloss = dloss_input * seq_lens / (B * L) with
seq_lens = mask.sum(-1, keepdim=True), shape (B, 1), strides (1, 1), and passes those strides to the
per-token kernel, which reads DLOSS + b * stride0 + t * stride1 = DLOSS[b + t]: token (0, 1) gets row 1's
length (1 instead of 2), and a token with b + t >= B reads past the buffer.
Fix: expand the buffer before passing it, e.g. dloss = (dloss_input * seq_lens_bwd / (B * L)).expand(B, L).contiguous()
(as the sequence level does by multiplying by the (B, T) mask).
Source: https://github.com/linkedin/Liger-Kernel/blob/v0.8.5/src/liger_kernel/ops/grpo_loss.py#L925-L928,
#L997 (the strides passed), #L469 (the (B, T) read)

Run: python findings/liger-triton/luspo-token-backward-stride.py
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
    cfg = dict(beta=0.0, eps_low=0.2, eps_high=0.2, loss_type="luspo", importance_sampling_level="token")
    logits = logits_for(lp)
    loss = grpo_loss(logits, lp, mask, A, **cfg)
    (grad,) = torch.autograd.grad(loss, logits)
    got = grad[0, 1, 1].item()  # token (0, 1), its second logit
    # the derivative of the kernel's own forward, by a central difference (float64 arithmetic on its values)
    h = 1e-2
    values = []
    for s in (1, -1):
        z = logits.detach().clone()
        z[0, 1, 1] += s * h
        values.append(grpo_loss(z, lp, mask, A, **cfg).double().item())
    expected = (values[0] - values[1]) / (2 * h)
    ok = abs(got - expected) <= 1e-2 * abs(expected)
    return (not ok, "token-level luspo: backward vs its own forward at token (0, 1)",
            f"d loss / d z = {expected:.5g} (central difference of the forward)", f"{got:.5g} from the backward")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
