"""TRL GMPOTrainer: an empty completion adds -A_i to the loss

Framework: trl 1.16.0, trl.experimental.gmpo.GMPOTrainer._compute_loss; torch 2.13.0.
Spec: surrogate.gmpo and loss.gmpo, spec/surrogate.md#surrogate.gmpo, spec/loss.md#loss.gmpo:
    l^GMPO_i = -A_i exp( (1/L_i) sum_t m_{i,t} clip_A(l_{i,t} - l_old_{i,t}) ),   L = (1/N) sum_{i: L_i > 0} l^GMPO_i;
    a sequence with no unmasked token (L_i = 0) has no loss and is not counted (spec/conventions.md,
    "Empty sequences and empty batches").
Input: two completions, on policy: row 0 one token with A = 1; row 1 empty (every token masked, as
mask_truncated_completions produces) with A = -0.5; epsilon 0.4.
Expected: -1 (the spec's N counts non-empty sequences), or -0.5 if the empty row is only counted in the
mean (TRL's .mean() over B: the convention TRL's GRPO loss types also follow).
Got: -0.25. The empty row's geometric mean is exp(0 / clamp(0, min=1)) = exp(0) = 1, so it contributes
-A = 0.5 to the sum.
Fix: zero the empty rows: per_sequence_loss = per_sequence_loss * (seq_mask.sum(-1) > 0) (and divide by
their count if the mean should skip them).
Source: https://github.com/huggingface/trl/blob/v1.16.0/trl/experimental/gmpo/gmpo_trainer.py#L102

Run: python findings/trl/gmpo-empty-completion.py
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
    try:
        from trl.experimental.gmpo import GMPOTrainer
    except Exception as e:  # noqa: BLE001
        raise RuntimeError(f"cannot import trl.experimental.gmpo: {e}") from e
    f64 = torch.float64
    logps = torch.tensor([[-1.0], [-1.0]], dtype=f64)
    A = torch.tensor([1.0, -0.5], dtype=f64)
    mask = torch.tensor([[1], [0]])
    got = grpo_loss("grpo", logps, logps.clone(), mask, A, eps=0.4, trainer=GMPOTrainer).item()
    # the spec in plain float64: row 0 on policy (ratio 1): -A_0; row 1 empty: no loss
    expected = (-A[0] * torch.exp(torch.tensor(0.0, dtype=f64))).item()  # -1
    expected_b = expected / 2  # the same with the empty row counted in the mean (TRL's count of rows)
    ok = abs(got - expected) <= 1e-12 or abs(got - expected_b) <= 1e-12
    return (not ok, "GMPO loss with one empty completion (A = -0.5)",
            f"{expected:.6g} (or {expected_b:.6g} counting the empty row)", f"{got:.6g}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
