"""Unsloth grpo_compute_loss: at importance_sampling_level="sequence" the KL bias correction weighs every token by the sequence ratio (as trl#6586)

Framework: unsloth-zoo 2026.10.9, unsloth_zoo.rl_replacements.grpo_compute_loss with
importance_sampling_level="sequence" (GSPO, LUSPO), beta > 0 and use_bias_correction_kl=True; torch 2.13.0.
The code follows TRL's order (its comment: "TRL order"), so it has TRL's open bug trl#6586.
Spec: kl.k3_unbiased, spec/kl.md#kl.k3_unbiased, inside loss.gspo, spec/loss.md#loss.gspo:
    L = (1/N) sum_i (1/L_i) sum_t m_{i,t} [ l^GSPO_i + beta kl_{i,t} ],  kl_{i,t} = w_{i,t} k3(l_ref - l),
    w_{i,t} = e^(l_{i,t} - l_old_{i,t})   (each token's own ratio, DeepSeek-V3.2 Eq. 7).
Input: the spec's worked example of kl.k3_unbiased as one sequence: l = (-1, -2), l_old = (-1.25, -2),
l_ref = (-1.5, -1), A = 0 (no policy term), beta = 1, loss_type="grpo", importance_sampling_level="sequence",
use_bias_correction_kl=True (float64; the KL clamps to [-20, 20] and [-10, 10] do not bind).
Expected: loss = mean_t w_t k3_t = (0.13678807 + 0.71828183) / 2 = 0.42753495.
Got: 0.46732: `kl_i = kl_i * coef_1` with coef_1 the (B, 1) geometric-mean sequence ratio e^0.125 at sequence
level, so both tokens are weighted by it (and the gradient gains a (sum_t k3_t) d(mean_t l_t) term).
Fix: weight the KL by the token ratio: kl_i = kl_i * torch.exp(log_ratio) (log_ratio = new - old, computed just
above) instead of coef_1.
Source: https://github.com/unslothai/unsloth-zoo/blob/2026.10.9/unsloth_zoo/rl_replacements.py#L1141-L1142,
https://github.com/huggingface/trl/issues/6586

Run: python findings/unsloth/kl-bias-correction-sequence-ratio.py
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
    logps = torch.tensor([[-1.0, -2.0]], dtype=f64, requires_grad=True)
    old = torch.tensor([[-1.25, -2.0]], dtype=f64)
    ref = torch.tensor([[-1.5, -1.0]], dtype=f64)
    loss = unsloth_loss("grpo", logps, old, torch.tensor([[1, 1]]), torch.tensor([0.0], dtype=f64), beta=1.0,
                        ref_logps=ref, level="sequence", bias_correction_kl=True)
    # the spec in plain float64: each token's k3 weighted by its own ratio, token mean of the sequence
    l, lo, lr = logps.detach(), old, ref
    x = lr - l
    expected = (torch.exp(l - lo) * (torch.exp(x) - x - 1)).mean().item()  # 0.42753495
    got = loss.item()
    ok = abs(got - expected) <= 1e-12 * abs(expected)
    return (not ok, "GSPO loss with beta=1, use_bias_correction_kl=True", f"{expected:.10g}", f"{got:.10g}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
