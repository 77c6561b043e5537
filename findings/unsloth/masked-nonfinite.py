"""Unsloth grpo_compute_loss: padding changes the loss when per-token advantages hold NaN at a padded position (the corpus cases)

The corpus cases loss.*/masked-nan-advantage (NaN per-token advantages at masked positions), found by
pgspec fuzz; the same rule covers the property rows (prop.padding, prop.permutation, prop.gradient_fd).

Framework: unsloth-zoo 2026.10.9, unsloth_zoo.rl_replacements.grpo_compute_loss with [B, T] (per-token)
advantages, which it accepts (only [B] advantages are unsqueezed); every loss_type; torch 2.13.0.
Spec: the padding property (spec/properties.md, prop.padding) of loss.grpo, spec/loss.md#loss.grpo, with the
masking rule of spec/conventions.md (a masked position is never read):
    L = (1/N) sum_i (1/L_i) sum_{t: m_{i,t} = 1} max(-A_{i,t} r_{i,t}, -A_{i,t} clip(r_{i,t}, 1 - eps, 1 + eps));
    appending masked positions, whatever they hold, leaves L and the gradient unchanged.
Input: one on-policy token l = l_old = -1 with the per-token advantage A = [[1]], loss_type="grpo", beta = 0;
the same sequence padded with one masked token (completion mask [[1, 0]]) whose advantage is NaN (what a
per-token advantage computed over a padded tensor, e.g. a process reward normalized with the padding, holds).
Expected: the same loss for both, -A r = -1, and gradient -1 at the real token, 0 at the padding.
Got: NaN for the padded batch. grpo_compute_loss replaces the new, old and reference log-probs by 0 at masked
positions (torch.where(_keep, ...)) but not the advantages, and aggregates (loss_i * mask).sum(...): NaN * 0 = NaN
(the property rows prop.padding / prop.permutation / prop.gradient_fd of loss.* fail this way).
Fix: select, not multiply, also for the advantages: advantages = torch.where(_keep, advantages, 0.0) next to the
log-probs (when advantages.dim() == 2), or loss_i = torch.where(mask.bool(), loss_i, 0.0) before aggregating.
Source: https://github.com/unslothai/unsloth-zoo/blob/2026.10.9/unsloth_zoo/rl_replacements.py#L995-L1004

Run: python findings/unsloth/masked-nonfinite.py
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
    f64 = torch.float64
    nan = float("nan")
    plain_l = torch.tensor([[-1.0]], dtype=f64, requires_grad=True)
    plain = unsloth_loss("grpo", plain_l, torch.tensor([[-1.0]], dtype=f64), torch.tensor([[1]]),
                         torch.tensor([[1.0]], dtype=f64))
    plain.backward()
    padded_l = torch.tensor([[-1.0, -1.0]], dtype=f64, requires_grad=True)
    padded = unsloth_loss("grpo", padded_l, torch.tensor([[-1.0, -1.0]], dtype=f64), torch.tensor([[1, 0]]),
                          torch.tensor([[1.0, nan]], dtype=f64))
    padded.backward()
    # the spec in plain float64: on policy r = 1 inside the clip range, term = -A r, gradient -A r
    A, r = torch.tensor(1.0, dtype=f64), torch.exp(torch.tensor(-1.0 - -1.0, dtype=f64))
    expected = torch.max(-A * r, -A * r.clamp(0.8, 1.2)).item()  # -1
    exp_grad = (-A * r).item()
    got = (plain.item(), padded.item(), plain_l.grad[0].tolist(), padded_l.grad[0].tolist())
    ok = (abs(got[0] - expected) <= 1e-12 and abs(got[1] - expected) <= 1e-12 and got[2] == [exp_grad]
          and got[3] == [exp_grad, 0.0])
    return (not ok, "grpo loss with per-token advantages after padding with a masked token whose advantage is NaN",
            f"loss {expected:.6g}, grad [{exp_grad:g}] unpadded and [{exp_grad:g}, 0] padded",
            f"unpadded: loss {got[0]:.6g}, grad {got[2]}; padded: loss {got[1]:.6g}, grad {got[3]}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
