"""TRL GRPOTrainer: at importance_sampling_level="sequence" the KL bias correction weighs every token by the sequence ratio (trl#6586)

Framework: trl 1.16.0, GRPOTrainer._compute_loss with importance_sampling_level="sequence" (GSPO, LUSPO),
beta > 0 and use_bias_correction_kl=True (the default); torch 2.13.0. Open upstream: trl#6586 (fix PRs
#6594 closed, #7188 open).
Spec: kl.k3_unbiased, spec/kl.md#kl.k3_unbiased, inside loss.gspo, spec/loss.md#loss.gspo:
    L = (1/N) sum_i (1/L_i) sum_t m_{i,t} [ l^GSPO_i + beta kl_{i,t} ],  kl_{i,t} = w_{i,t} k3(l_ref - l),
    w_{i,t} = e^(l_{i,t} - l_old_{i,t})   (each token's own ratio, DeepSeek-V3.2 Eq. 7).
Input: the spec's worked example of kl.k3_unbiased as one sequence: l = (-1, -2), l_old = (-1.25, -2),
l_ref = (-1.5, -1), A = 0 (no policy term), beta = 1, loss_type="grpo", importance_sampling_level="sequence".
Expected: loss = mean_t w_t k3_t = (0.13678807 + 0.71828183) / 2 = 0.42753495.
Got: 0.46732: `per_token_kl = per_token_kl * coef_1` with coef_1 the (B, 1) geometric-mean sequence ratio
e^0.125, so both tokens are weighted by it (and the gradient gains a (sum_t k3_t) d(mean_t l_t) term).
Fix: weight the KL by the token ratio: per_token_kl = per_token_kl * torch.exp(log_ratio) (log_ratio =
per_token_logps - old_per_token_logps, computed just above) instead of coef_1.
Source: https://github.com/huggingface/trl/blob/v1.16.0/trl/trainer/grpo_trainer.py#L3105,
https://github.com/huggingface/trl/issues/6586

Run: python findings/trl/kl-bias-correction-sequence-ratio.py
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
    logps = torch.tensor([[-1.0, -2.0]], dtype=f64, requires_grad=True)
    old = torch.tensor([[-1.25, -2.0]], dtype=f64)
    ref = torch.tensor([[-1.5, -1.0]], dtype=f64)
    loss = grpo_loss("grpo", logps, old, torch.tensor([[1, 1]]), torch.tensor([0.0], dtype=f64), beta=1.0,
                     ref_logps=ref, level="sequence")
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
