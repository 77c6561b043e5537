"""Liger Triton GRPO loss: at importance_sampling_level="sequence" the KL bias correction weighs every token by the sequence ratio (as trl#6586)

Framework: liger-kernel 0.8.5, liger_kernel.transformers.grpo_loss.triton_grpo_loss (the Triton kernels of
liger_kernel/ops/grpo_loss.py; reduce=True); triton 3.9.0, torch 2.13.0. Checked on CPU under Triton's
interpreter (TRITON_INTERPRET=1, which the script sets when there is no GPU); on a GPU it runs the compiled
kernels.
Spec: kl.k3_unbiased, spec/kl.md#kl.k3_unbiased, inside loss.gspo, spec/loss.md#loss.gspo:
    L = (1/N) sum_i (1/L_i) sum_t m_{i,t} [ l^GSPO_i + beta kl_{i,t} ],  kl_{i,t} = w_{i,t} k3(l_ref - l),
    w_{i,t} = e^(l_{i,t} - l_old_{i,t})   (each token's own ratio, DeepSeek-V3.2 Eq. 7).
Input: the spec's worked example of kl.k3_unbiased as one sequence: l = (-1, -2), l_old = (-1.25, -2),
l_ref = (-1.5, -1), A = 0 (no policy term), beta = 1, loss_type="grpo", importance_sampling_level="sequence",
use_bias_correction_kl=True.
Expected: loss = mean_t w_t k3_t = (0.13678807 + 0.71828183) / 2 = 0.42753495.
Got: 0.46732: the kernel multiplies each token's k3 by the sequence ratio COEF_1_RAW = e^0.125.
Fix: weight the KL by the token's own exp(logp - old_logp) at sequence level too.
Source: https://github.com/linkedin/Liger-Kernel/blob/v0.8.5/src/liger_kernel/ops/grpo_loss.py#L319,
https://github.com/huggingface/trl/issues/6586

Run: python findings/liger-triton/kl-bias-correction-sequence-ratio.py
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
    lp = [[-1.0, -2.0]]
    old = [[-1.25, -2.0]]
    ref = [[-1.5, -1.0]]
    got = grpo_loss(logits_for(lp), old, torch.tensor([[1, 1]]), [0.0], ref=ref, beta=1.0, eps_low=3e-4,
                    eps_high=4e-4, loss_type="grpo", importance_sampling_level="sequence",
                    use_bias_correction_kl=True).item()
    # the spec in plain float64: each token's k3 weighted by its own ratio, token mean of the sequence
    l, lo, lr = (torch.tensor(v, dtype=torch.float64) for v in (lp, old, ref))
    x = lr - l
    expected = (torch.exp(l - lo) * (torch.exp(x) - x - 1)).mean().item()  # 0.42753495
    ok = abs(got - expected) <= 1e-6 * abs(expected)
    return (not ok, "GSPO loss with beta=1, use_bias_correction_kl=True", f"{expected:.8g}", f"{got:.8g}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
