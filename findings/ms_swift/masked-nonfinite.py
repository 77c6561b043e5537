"""ms-swift GRPOTrainer: a NaN at a padded (masked) position makes the GRPO loss NaN

Framework: ms-swift 4.6.0, swift.rlhf_trainers.grpo_trainer.GRPOTrainer._compute_loss_and_metrics (every
loss_type; also the KL term, importance_sampling_level="sequence" and the rollout IS correction's sequence
modes); torch 2.13.0. The trainer is built without __init__ (a stub self with the attributes the method reads),
the method and ms-swift's GRPOBatch are ms-swift's own.
Spec: loss.bnpo, spec/loss.md#loss.bnpo, with the masking rule of spec/conventions.md ("Masks: excluded, not
multiplied by zero": a masked position's inputs are never read and its gradient is exactly 0):
    L = sum_{i,t} m_{i,t} term_{i,t} / sum_{i,t} m_{i,t},   term = max(-A r, -A clip(r, 1 - eps, 1 + eps)),  r = e^(l - l_old)
Input: one completion of two tokens, l = (-1, -1), the second padded (completion_mask False) with a NaN old
log-prob (what a sampler reports for a position it did not score), l_old = (-1.25, NaN), A = 1 (expanded per
token), loss_type="bnpo", epsilon 0.2, beta = 0.
Expected: loss -1.2 (the valid token's r = e^0.25 = 1.284 is clipped at 1.2), gradient 0 at both tokens.
Got: loss NaN and a NaN gradient at the padded token. _compute_loss_and_metrics forms the ratio and the
per-token loss at every position and multiplies by the completion mask ((per_token_loss * completion_mask).sum(...)),
and NaN * 0 = NaN. The same product is in the sequence-level log-ratio ((log_ratio * completion_mask).sum(-1)),
the KL term and _compute_sequence_level_ratios of the rollout IS correction.
Fix: select instead of multiplying, e.g. per_token_loss = per_token_loss.masked_fill(~completion_mask, 0.0) (and
log_ratio.masked_fill(~completion_mask, 0.0) before the sequence mean and the exponential) before the aggregation.
Source: https://github.com/modelscope/ms-swift/blob/v4.6.0/swift/rlhf_trainers/grpo_trainer.py#L1084,
https://github.com/modelscope/ms-swift/blob/v4.6.0/swift/rlhf_trainers/grpo_trainer.py#L2340

Run: python findings/ms_swift/masked-nonfinite.py
Exit status: 0 and "REPRODUCED: ..." while the bug is there; 1 and "FIXED: ..." once ms-swift agrees with the
spec; 2 when it cannot run (findings/README.md).
"""
import sys
import types
from collections import defaultdict

try:
    import torch
    from swift.rl_core.data import GRPOBatch
    from swift.rlhf_trainers.grpo_trainer import GRPOTrainer
except Exception as e:  # noqa: BLE001
    print(f"ERROR: cannot import swift/torch: {type(e).__name__}: {e}")
    sys.exit(2)


def swift_loss(loss_type, logps, old_logps, mask, advantages, beta=0.0, ref_logps=None, level="token", eps=0.2):
    """GRPOTrainer._compute_loss_and_metrics (ms-swift's own code) on given log-probs: the trainer object is made
    without __init__ (no model, dataset or accelerator) and carries the attributes _prepare_algorithm_params sets
    from GRPOConfig's defaults; _get_per_token_logps_and_entropies returns `logps`.  `advantages` is [B, T], as
    ms-swift's batch construction expands them (expand_advantage_to_per_token).  Returns the loss."""
    t = object.__new__(GRPOTrainer)
    t.args = types.SimpleNamespace(delta=None, log_entropy=False, top_entropy_quantile=1.0,
                                   gradient_accumulation_steps=1)
    t.model = types.SimpleNamespace(training=True)
    t.loss_type, t.importance_sampling_level, t.epsilon_low, t.epsilon_high, t.beta = loss_type, level, eps, eps, beta
    t.kl_in_reward, t.tau_pos, t.tau_neg, t.top_entropy_quantile, t.compute_entropy = False, 1.0, 1.05, 1.0, False
    t.overlong_filter, t.rollout_importance_sampling_mode, t.rollout_importance_sampling_threshold = False, None, 2.0
    t.disable_rollout_importance_sampling, t.log_rollout_offpolicy_metrics = False, False
    t.off_policy_sequence_mask_delta, t._has_teacher, t.max_completion_length = None, False, 512
    t.sdar_loss_coef, t.chord_sft_iterator, t.model_accepts_loss_kwargs, t.compute_loss_func = 0.0, None, False, None
    t.current_gradient_accumulation_steps = 1
    t._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    same = lambda x, *a, **k: x  # noqa: E731
    t.accelerator = types.SimpleNamespace(num_processes=1, process_index=0, device=torch.device("cpu"),
                                          gather=same, gather_for_metrics=same)
    t._get_per_token_logps_and_entropies = lambda *a, **k: (logps, torch.zeros_like(logps))
    B, T = mask.shape
    batch = GRPOBatch(completion_mask=mask, truncated_mask=torch.zeros(B, dtype=torch.bool),
                      seq_lengths=torch.full((B,), T), old_per_token_logps=old_logps, ref_per_token_logps=ref_logps,
                      rollout_per_token_logps=None, advantages=advantages,
                      num_items_in_batch=torch.tensor(float(mask.sum()), dtype=logps.dtype))
    return t._compute_loss_and_metrics(None, {}, batch)[0]


def check():
    f64 = torch.float64
    logps = torch.tensor([[-1.0, -1.0]], dtype=f64, requires_grad=True)
    old = torch.tensor([[-1.25, float("nan")]], dtype=f64)
    mask = torch.tensor([[True, False]])
    loss = swift_loss("bnpo", logps, old, mask, torch.tensor([[1.0, 1.0]], dtype=f64))
    loss.backward()
    # the spec in plain float64: only token 0 is read
    A = 1.0
    r = torch.exp(torch.tensor(-1.0 - -1.25, dtype=f64))
    expected = torch.max(-A * r, -A * r.clamp(0.8, 1.2)).item()  # -1.2
    got, grad = loss.item(), logps.grad[0].tolist()
    ok = abs(got - expected) <= 1e-12 and grad == [0.0, 0.0]
    return (not ok, "NaN old log-prob at a masked position reaches the bnpo loss",
            f"loss {expected:.6g}, grad [0, 0]", f"loss {got:.6g}, grad {grad}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
