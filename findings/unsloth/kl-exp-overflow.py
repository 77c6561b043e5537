"""Unsloth grpo_compute_loss: the bias-corrected KL is NaN at a log-ratio of 200 with l_ref = l (float32)

Framework: unsloth-zoo 2026.10.9, unsloth_zoo.rl_replacements.grpo_compute_loss with beta > 0 and
use_bias_correction_kl=True (DeepSeek-V3.2's unbiased KL); torch 2.13.0.
Spec: kl.k3_unbiased, spec/kl.md#kl.k3_unbiased (here through loss.bnpo, spec/loss.md#loss.bnpo):
    kl = w k3(x),  w = e^(l - l_old),  x = l_ref - l,  k3(0) = 0, so kl = 0 at l_ref = l for every w.
Input: one token in float32, l = 0, l_old = -200, l_ref = 0, A = 0, beta = 0.04, loss_type="bnpo".
Expected: loss 0 (A = 0 and the KL is 0).
Got: NaN. coef_1 = torch.exp(log_importance_weights) is inf in float32 and kl_i * coef_1 = 0 * inf = NaN;
the value clamp to [-10, 10] that follows keeps the NaN. (Found by pgspec fuzz; the corpus case is
kl.k3_unbiased/ratio-200-on-reference.)
Fix: select the zero instead of multiplying, e.g. kl_i = torch.where(kl_i == 0, kl_i, kl_i * coef_1), or clamp
the log-ratio before exp.
Source: https://github.com/unslothai/unsloth-zoo/blob/2026.10.9/unsloth_zoo/rl_replacements.py#L1133

Run: python findings/unsloth/kl-exp-overflow.py
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
    logps = torch.tensor([[0.0]], dtype=f32, requires_grad=True)
    old = torch.tensor([[-200.0]], dtype=f32)
    ref = torch.tensor([[0.0]], dtype=f32)
    A = torch.tensor([0.0], dtype=f32)
    loss = unsloth_loss("bnpo", logps, old, torch.tensor([[1]]), A, beta=0.04, ref_logps=ref,
                        bias_correction_kl=True)
    # the spec: A = 0 and k3(l_ref - l) = k3(0) = 0, so the loss is exactly 0 whatever w = e^200 is
    expected = 0.0
    got = loss.item()
    return (not got == expected, "float32 bias-corrected KL at log-ratio 200 with l_ref = l",
            f"loss {expected:g}", f"loss {got}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
