"""TRL GRPOTrainer: padding a batch changes the loss (an infinite reference log-prob at a padded position gives NaN)

Framework: trl 1.16.0, GRPOTrainer._compute_loss with beta > 0 (every loss_type); torch 2.13.0.
Spec: the padding property (spec/properties.md, prop.padding) of loss.grpo, spec/loss.md#loss.grpo, with
kl.k3_unbiased, spec/kl.md#kl.k3_unbiased, and the masking rule of spec/conventions.md (a masked position is
never read):
    L = (1/N) sum_i (1/L_i) sum_t m_{i,t} [ -A_i r_{i,t} (clipped) + beta w_{i,t} k3(l_ref - l) ];
    appending masked positions, whatever they hold, leaves L and the gradient unchanged.
Input: one on-policy token l = l_old = -1, l_ref = -1.5, A = 1, beta = 0.04, loss_type="grpo"; the same
sequence padded with one masked token whose reference log-prob is -inf (a padded position of a reference
model's output, e.g. under a vocabulary mask).
Expected: the same loss for both, -1 + 0.04 (e^-0.5 + 0.5 - 1) = -0.99573877.
Got: NaN for the padded batch: k3 at the padded position is e^(-inf) + inf - 1 = inf, and the mask product
inf * 0 is NaN (the same root cause as findings/trl/masked-nonfinite.py, here through the KL term, as the
property rows prop.padding / prop.permutation / prop.on_policy / prop.gradient_fd / prop.clamp show).
Fix: select, not multiply: per_token_loss = per_token_loss.masked_fill(mask == 0, 0.0) before aggregating
(after the KL is added).
Source: https://github.com/huggingface/trl/blob/v1.16.0/trl/trainer/grpo_trainer.py#L3154

Run: python findings/trl/masked-nonfinite-props.py
Exit status: 0 and "REPRODUCED: ..." while the bug is there; 1 and "FIXED: ..." once TRL agrees with the
spec; 2 when it cannot run (findings/README.md).
"""
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
                                   sapo_temperature_pos=1.0, sapo_temperature_neg=1.05)  # GRPOConfig defaults
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
    f64 = torch.float64
    A = torch.tensor([1.0], dtype=f64)
    plain = grpo_loss("grpo", torch.tensor([[-1.0]], dtype=f64), torch.tensor([[-1.0]], dtype=f64),
                      torch.tensor([[1]]), A, beta=0.04, ref_logps=torch.tensor([[-1.5]], dtype=f64)).item()
    padded = grpo_loss("grpo", torch.tensor([[-1.0, -1.0]], dtype=f64), torch.tensor([[-1.0, -1.0]], dtype=f64),
                       torch.tensor([[1, 0]]), A, beta=0.04,
                       ref_logps=torch.tensor([[-1.5, float("-inf")]], dtype=f64)).item()
    # the spec in plain float64: on policy r = w = 1; term = -A + beta k3(l_ref - l)
    x = torch.tensor(-1.5 - -1.0, dtype=f64)
    expected = (-1.0 + 0.04 * (torch.exp(x) - x - 1)).item()  # -0.99573877
    ok = abs(plain - expected) <= 1e-12 and abs(padded - expected) <= 1e-12
    return (not ok, "grpo loss with beta=0.04 after padding with a masked token whose ref log-prob is -inf",
            f"{expected:.8g} padded and unpadded", f"unpadded {plain:.8g}, padded {padded:.8g}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
