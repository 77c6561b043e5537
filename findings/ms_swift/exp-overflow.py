"""ms-swift GRPOTrainer: NaN gradient when the log-ratio overflows exp on the clipped side (float32)

Framework: ms-swift 4.6.0, swift.rlhf_trainers.grpo_trainer.GRPOTrainer._compute_loss_and_metrics (loss_type
grpo, bnpo, dr_grpo, dapo, sapo; also at importance_sampling_level="sequence"); torch 2.13.0. The trainer is
built without __init__ (a stub self with the attributes the method reads), the method and ms-swift's GRPOBatch
are ms-swift's own.
Spec: surrogate.ppo_clip, spec/surrogate.md#surrogate.ppo_clip (here through loss.bnpo, spec/loss.md#loss.bnpo):
    term = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)),  r = e^(l - l_old);
    d term / d l = -A r where the unclipped branch is active, else 0.
Input: one token in float32, l = 0, l_old = -200 (a stale or mis-scored old log-prob), A = 1, epsilon 0.2,
loss_type="bnpo", beta = 0.
Expected: loss -1.2 (r is far beyond 1 + eps: the clipped branch is active) and gradient 0.
Got: loss -1.2 but gradient NaN. coef_1 = torch.exp(log_importance_weights) is inf in float32, and autograd
multiplies the inactive branch's zero cotangent by exp's derivative inf: 0 * inf = NaN, which then reaches every
parameter. (The rollout IS correction clamps its log-ratio to SAFETY_BOUND = 20; the policy ratio has no bound.)
Fix: clamp the log-ratio before exp, e.g. coef_1 = torch.exp(log_importance_weights.clamp(max=20.0)) (any bound
below log(float32 max) = 88.7 keeps the clipped branch exact).
Source: https://github.com/modelscope/ms-swift/blob/v4.6.0/swift/rlhf_trainers/grpo_trainer.py#L1025

Run: python findings/ms_swift/exp-overflow.py
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
    f32 = torch.float32
    logps = torch.tensor([[0.0]], dtype=f32, requires_grad=True)
    old = torch.tensor([[-200.0]], dtype=f32)
    loss = swift_loss("bnpo", logps, old, torch.tensor([[True]]), torch.tensor([[1.0]], dtype=f32))
    loss.backward()
    # the spec in plain float64: r = e^200 > 1.2 with A > 0, so the clipped branch -A (1 + eps) is active
    r = torch.exp(torch.tensor(200.0, dtype=torch.float64))
    expected = torch.max(-1.0 * r, -1.0 * r.clamp(0.8, 1.2)).item()  # -1.2, gradient 0
    got, grad = loss.item(), logps.grad.item()
    ok = abs(got - expected) <= 1e-6 and grad == 0.0
    return (not ok, "float32 ppo-clip gradient at log-ratio 200 (clipped side)", f"loss {expected:.6g}, grad 0",
            f"loss {got:.6g}, grad {grad}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
