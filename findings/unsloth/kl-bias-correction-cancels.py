"""Unsloth grpo_compute_loss: the bias-corrected KL's gradient cancels (w*k3' + w*k3), losing every digit at a small log-ratio

Framework: unsloth-zoo 2026.10.9, unsloth_zoo.rl_replacements.grpo_compute_loss with beta > 0 and
use_bias_correction_kl=True (TRL's formula, copied); torch 2.13.0.
Spec: kl.k3_unbiased, spec/kl.md#kl.k3_unbiased:
    y = w k3(x),  w = e^(l - l_old),  x = l_ref - l,  k3(x) = e^x - x - 1,
    dy/dl = w k3(x) - w (e^x - 1) = -w x.
Input: one token, float32 (the training dtype), l = l_old = -2^-30 (w = 1), l_ref = 0, A = 0 (no policy
term), beta = 1, loss_type="bnpo", importance_sampling_level="token" (the corpus case kl.k3_unbiased/tiny-log-ratio).
Expected: gradient -w x = -2^-30 = -9.313225746e-10.
Got: 0: `per_token_kl = torch.exp(ref - new) - (ref - new) - 1` is differentiated by autograd as
e^x - 1 (times -w) plus w k3: at x = 2^-30, float32's e^x rounds to 1 and e^x - 1 to 0, every digit lost
(at x near 20 the two terms of size w e^x cancel instead; spec/verdicts.md class `cancellation`).
Fix: give autograd a form without the cancellation, e.g. the closed-form derivative through a custom
autograd Function, or per_token_kl = torch.expm1(x) - x with the ratio applied as w * (expm1(x) - x).
Source: https://github.com/unslothai/unsloth-zoo/blob/2026.10.9/unsloth_zoo/rl_replacements.py#L1141-L1142

Run: python findings/unsloth/kl-bias-correction-cancels.py
(no GPU needed: on a machine without one the script sets unsloth-zoo's own UNSLOTH_ZOO_DISABLE_GPU_INIT=1.)
Exit status: 0 and "REPRODUCED: ..." while the bug is there; 1 and "FIXED: ..." once Unsloth agrees with the
spec; 2 when it cannot run (findings/README.md).
"""
import os
import sys

try:
    import torch

    if not torch.cuda.is_available():
        # unsloth-zoo refuses a machine without an accelerator at import unless this, its own switch for CPU use
        os.environ.setdefault("UNSLOTH_ZOO_DISABLE_GPU_INIT", "1")
    from unsloth_zoo.rl_replacements import grpo_compute_loss
except Exception as e:  # noqa: BLE001
    print(f"ERROR: cannot import unsloth_zoo/torch: {type(e).__name__}: {e}")
    sys.exit(2)


def unsloth_loss(loss_type, logps, old_logps, mask, advantages, beta=0.0, ref_logps=None, level="token", eps=0.2,
                 bias_correction_kl=False):
    """grpo_compute_loss (unsloth-zoo's own code) with the keyword arguments Unsloth's grpo_accumulated_loss
    forwards to it: one process, one accumulation step, no vLLM importance sampling.  Returns the loss."""
    ids = torch.zeros(mask.shape, dtype=torch.long)
    out = grpo_compute_loss(ref_logps, logps, old_logps, None, ids, mask, beta, advantages, loss_type=loss_type,
                            importance_sampling_level=level, epsilon_low=eps, epsilon_high=eps, delta=None,
                            use_bias_correction_kl=bias_correction_kl, max_completion_length=512,
                            current_gradient_accumulation_steps=1, num_processes=1)
    return out[0]


def check():
    f32 = torch.float32
    x = 2.0 ** -30
    logps = torch.tensor([[-x]], dtype=f32, requires_grad=True)
    old = torch.tensor([[-x]], dtype=f32)
    ref = torch.tensor([[0.0]], dtype=f32)
    loss = unsloth_loss("bnpo", logps, old, torch.tensor([[1]]), torch.tensor([0.0], dtype=f32), beta=1.0,
                        ref_logps=ref, level="token", bias_correction_kl=True)
    (grad,) = torch.autograd.grad(loss, [logps])
    # the spec in plain float64: d/dl [w k3(l_ref - l)] = -w x
    l, lo, lr = logps.detach().double(), old.double(), ref.double()
    expected = (-torch.exp(l - lo) * (lr - l)).item()  # -2^-30
    got = grad.item()
    ok = abs(got - expected) <= 1e-3 * abs(expected)
    return (not ok, "float32 gradient of the bias-corrected KL at a log-ratio of 2^-30", f"{expected:.10g}", f"{got:.10g}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
