"""ms-swift GRPOTrainer: padding changes the loss on policy (a -inf log-prob at a padded position gives NaN)

Framework: ms-swift 4.6.0, swift.rlhf_trainers.grpo_trainer.GRPOTrainer._compute_loss_and_metrics on its
default on-policy path (num_iterations = 1: old_per_token_logps is None and the method uses
per_token_logps.detach()); every loss_type; torch 2.13.0. The trainer is built without __init__ (a stub self
with the attributes the method reads), the method and ms-swift's GRPOBatch are ms-swift's own.
Spec: the padding property (spec/properties.md, prop.padding) of loss.grpo, spec/loss.md#loss.grpo, with the
masking rule of spec/conventions.md (a masked position is never read):
    L = (1/N) sum_i (1/L_i) sum_{t: m_{i,t} = 1} max(-A_i r_{i,t}, -A_i clip(r_{i,t}, 1 - eps, 1 + eps)),  r = e^(l - l_old);
    appending masked positions, whatever they hold, leaves L and the gradient unchanged.
Input: one token l = -1 on policy (no old log-probs), A = 1, loss_type="grpo", beta = 0; the same sequence padded
with one masked token whose log-prob is -inf (a padded position of a log-softmax under a vocabulary mask).
Expected: the same loss for both, -A r = -1 (r = 1), and gradient -1 at the real token, 0 at the padding.
Got: NaN for the padded batch: the log-ratio at the padded position is -inf - (-inf) = NaN, and the mask product
NaN * 0 is NaN (the same root cause as findings/ms_swift/masked-nonfinite.py, seen as the property rows
prop.padding / prop.permutation / prop.on_policy / prop.clamp / prop.gradient_fd of surrogate.*, loss.*, kl.*, is.*
and mask.opsm fail it: every example of those properties holds NaN/inf in its padding).
Fix: select, not multiply: log_ratio = (per_token_logps - old_per_token_logps).masked_fill(~completion_mask, 0.0)
and per_token_loss.masked_fill(~completion_mask, 0.0) before aggregating.
Source: https://github.com/modelscope/ms-swift/blob/v4.6.0/swift/rlhf_trainers/grpo_trainer.py#L1084

Run: python findings/ms_swift/masked-nonfinite-props.py
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
    plain_l = torch.tensor([[-1.0]], dtype=f64, requires_grad=True)
    plain = swift_loss("grpo", plain_l, None, torch.tensor([[True]]), torch.tensor([[1.0]], dtype=f64))
    plain.backward()
    padded_l = torch.tensor([[-1.0, float("-inf")]], dtype=f64, requires_grad=True)
    padded = swift_loss("grpo", padded_l, None, torch.tensor([[True, False]]), torch.tensor([[1.0, 1.0]], dtype=f64))
    padded.backward()
    # the spec in plain float64: on policy r = e^0 = 1 (its gradient is r), term = -A r, gradient -A r
    A, r = torch.tensor(1.0, dtype=f64), torch.exp(torch.tensor(0.0, dtype=f64))
    expected = torch.max(-A * r, -A * r.clamp(0.8, 1.2)).item()  # -1
    exp_grad = (-A * r).item()
    got = (plain.item(), padded.item(), plain_l.grad[0].tolist(), padded_l.grad[0].tolist())
    ok = (abs(got[0] - expected) <= 1e-12 and abs(got[1] - expected) <= 1e-12 and got[2] == [exp_grad]
          and got[3] == [exp_grad, 0.0])
    return (not ok, "on-policy grpo loss after padding with a masked token whose log-prob is -inf",
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
