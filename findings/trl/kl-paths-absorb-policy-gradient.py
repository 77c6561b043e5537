"""TRL GRPOTrainer VESPO: at l = l_ref the KL gradient's two paths swallow the policy gradient's digits

Framework: trl 1.16.0, GRPOTrainer._compute_loss with loss_type="vespo" and beta > 0 (the other arguments
GRPOConfig's defaults, use_bias_correction_kl=True); torch 2.13.0.
Spec: loss.vespo, spec/loss.md#loss.vespo (phi: surrogate.vespo, spec/surrogate.md#surrogate.vespo):
    L = sum_{i,t} m_{i,t} (-sg[phi_i] A_i l_{i,t} + beta kl_{i,t}) / sum m,
    phi_i = exp(lambda + k log w_i - lambda w_i),  log w_i = sum_t m_{i,t} (l_{i,t} - l_old_{i,t}),
    kl = e^(l - l_old) k3(x),  x = l_ref - l,  d kl / dl = -e^(l - l_old) x = 0 at x = 0,
    dL/dl_{i,t} = (-phi_i A_i + beta d kl_{i,t} / dl_{i,t}) / sum m.
Input: one sequence of two tokens, float32 (the training dtype): l = (0, -0.015625), l_old = l_ref =
(-2, -0.015625), mask all true, A = 0.125, beta = 0.04, loss_type="vespo" (k = 2, lambda = 3 for A >= 0).
Expected: at token 2 (where l = l_old = l_ref, x = 0) log w = 2, phi = e^(7 - 3 e^2) = 2.5881e-7, and the
gradient -phi A / 2 = -1.6175679e-8 (TRL's own float32 result with beta = 0 is -1.6175690e-8, within 1e-6).
Got: -1.6763806e-8 = -9 * 2^-29, a relative error of 3.6e-2 (3.3e5 float32 ulps). The KL term
exp(ref - logp) - (ref - logp) - 1 writes ref - logp twice, so autograd reaches per_token_logps along two
paths, -beta e^x / 2 = -0.02 and +beta / 2 = +0.02 (exactly 0 together at x = 0); the policy term's gradient
-phi A / 2 = -1.6e-8 (`-phi_seq * advantages * per_token_logps`) is accumulated into the same leaf gradient,
summed with one path first (float32 ulp of 0.02: 2^-29 = 1.9e-9), so it keeps only whole multiples of 2^-29
when the other path cancels the 0.02. (float64 shows the same at its own precision: -1.61756790011e-8 instead
of -1.61756790008e-8.)
Fix: let the two KL paths meet before they reach the log-probs, by forming the log-ratio once:
    x = ref_per_token_logps - per_token_logps
    per_token_kl = torch.exp(x) - x - 1
(autograd then adds beta e^x and -beta at x, where they cancel exactly to 0 at x = 0, and sends one small
gradient beta (1 - e^x) to per_token_logps; on the input above the gradient becomes -1.6175690e-8, TRL's own
beta = 0 value; checked on a plain-torch copy of the loss).
Source: https://github.com/huggingface/trl/blob/v1.16.0/trl/trainer/grpo_trainer.py#L3100-L3101

Run: python findings/trl/kl-paths-absorb-policy-gradient.py
Exit status: 0 and "REPRODUCED: ..." while the bug is there; 1 and "FIXED: ..." once TRL agrees with the
spec; 2 when it cannot run (findings/README.md).
"""
import math
import sys
import types
from collections import defaultdict

try:
    import torch
    from trl import GRPOTrainer
except Exception as e:  # noqa: BLE001
    print(f"ERROR: cannot import trl/torch: {type(e).__name__}: {e}")
    sys.exit(2)


def grpo_loss(loss_type, logps, old_logps, mask, advantages, beta=0.0, ref_logps=None, level="token", eps=0.2,
              trainer=GRPOTrainer):
    """GRPOTrainer._compute_loss (TRL's own code) on given log-probs: the trainer object is made without
    __init__ (no model, dataset or accelerator); _get_per_token_logps_and_entropies returns `logps`."""
    t = object.__new__(trainer)
    t.args = types.SimpleNamespace(delta=None, use_bias_correction_kl=True, steps_per_generation=1,
                                   sapo_temperature_pos=1.0, sapo_temperature_neg=1.05,
                                   vespo_k_pos=2.0, vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0)  # GRPOConfig defaults
    t.loss_type, t.importance_sampling_level, t.epsilon_low, t.epsilon_high, t.beta = loss_type, level, eps, eps, beta
    t.off_policy_mask_threshold, t.top_entropy_quantile, t.use_vllm = None, 1.0, False
    t.vllm_importance_sampling_correction, t.max_completion_length, t.aux_loss_enabled = False, 512, False
    t._entropy_bonus_enabled, t.current_gradient_accumulation_steps = False, 1
    t._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    t.model = types.SimpleNamespace(training=True)
    same = lambda x, *a, **k: x  # noqa: E731
    t.accelerator = types.SimpleNamespace(num_processes=1, gather=same, gather_for_metrics=same, reduce=same)
    t._get_per_token_logps_and_entropies = lambda *a, **k: (logps, torch.zeros_like(logps), None)
    B, T = mask.shape
    inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1, dtype=torch.long),
              "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask,
              "advantages": advantages, "old_per_token_logps": old_logps,
              "num_items_in_batch": mask.sum().float()}
    if ref_logps is not None:
        inputs["ref_per_token_logps"] = ref_logps
    return t._compute_loss(None, inputs)


def check():
    f32 = torch.float32
    logps = torch.tensor([[0.0, -0.015625]], dtype=f32, requires_grad=True)
    old = torch.tensor([[-2.0, -0.015625]], dtype=f32)
    ref = torch.tensor([[-2.0, -0.015625]], dtype=f32)
    advantage, beta = 0.125, 0.04
    loss = grpo_loss("vespo", logps, old, torch.tensor([[1, 1]]), torch.tensor([advantage], dtype=f32),
                     beta=beta, ref_logps=ref)
    loss.backward()
    got = logps.grad[0, 1].item()
    # the spec in plain float64: phi of the sequence log-ratio (k = 2, lambda = 3 for A >= 0), the KL's
    # gradient -e^(l - l_old) (l_ref - l) at token 2, normalized by the two tokens
    lp, lo, lr = (t.detach().double() for t in (logps, old, ref))
    log_w = (lp - lo).clamp(-20, 20).sum().clamp(math.log(1e-8), 20)
    phi = torch.exp(3.0 + 2.0 * log_w - 3.0 * torch.exp(log_w))
    kl_grad = -torch.exp(lp[0, 1] - lo[0, 1]) * (lr[0, 1] - lp[0, 1])  # 0: x = 0 at token 2
    expected = ((-phi * advantage + beta * kl_grad) / 2).item()  # -1.6175679e-8
    ok = abs(got - expected) <= 8 * torch.finfo(f32).eps * abs(expected)  # float32: a few ulps
    return (not ok, "float32 VESPO gradient at the token with l = l_old = l_ref, beta 0.04",
            f"{expected:.8g}", f"{got:.8g}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
