"""verl GSPO: a NaN/inf log-prob at a padded (masked) position makes the sequence's loss NaN

Framework: verl 0.9.1, core_algos.compute_policy_loss_gspo (actor.policy_loss.loss_mode="gspo"); torch 2.13.0.
Spec: surrogate.gspo, spec/surrogate.md#surrogate.gspo, with the masking rule of spec/conventions.md (a masked
position's inputs are never read; its gradient is exactly 0):
    l_i = max(-A_i s_i, -A_i clip(s_i, 1 - eps_low, 1 + eps_high)),  s_i = exp( (1/L_i) sum_t m_{i,t} (l_{i,t} - l_old_{i,t}) ).
Input: one sequence of two tokens, the second padded: log_prob = (-1, NaN), old_log_prob = (-1.5, -inf),
response_mask = (1, 0), A = 1, clip_ratio_low/high = 3e-4 / 4e-4 (the GSPO paper's), loss_agg_mode
"seq-mean-token-mean".
Expected: -1.0004 (s = e^0.5 is clipped at 1 + 4e-4).
Got: NaN. The sequence log-ratio is torch.sum(negative_approx_kl * response_mask, dim=-1), and NaN * 0
(or inf * 0) is NaN. agg_loss's token modes already guard against this with masked_sum.
Fix: negative_approx_kl_seq = verl_F.masked_sum(negative_approx_kl, response_mask, axis=-1) / seq_lengths.
Source: https://github.com/verl-project/verl/blob/v0.9.1/verl/trainer/ppo/core_algos.py#L1584

Run: python findings/verl/gspo-masked-nonfinite.py
Exit status: 0 and "REPRODUCED: ..." while the bug is there; 1 and "FIXED: ..." once verl agrees with the
spec; 2 when it cannot run (findings/README.md).
"""
import sys

try:
    import torch
    from verl.trainer.ppo import core_algos
    from verl.workers.config import ActorConfig
except Exception as e:  # noqa: BLE001
    print(f"ERROR: cannot import verl/torch: {type(e).__name__}: {e}")
    sys.exit(2)


def actor_config(**kw):
    """The smallest ActorConfig verl's policy losses accept."""
    return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, **kw)


def check():
    f64 = torch.float64
    logp = torch.tensor([[-1.0, float("nan")]], dtype=f64, requires_grad=True)
    old = torch.tensor([[-1.5, float("-inf")]], dtype=f64)
    mask = torch.tensor([[True, False]])
    adv = torch.ones(1, 2, dtype=f64)
    fn = core_algos.get_policy_loss_fn("gspo")
    loss, _ = fn(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask,
                 loss_agg_mode="seq-mean-token-mean", config=actor_config(clip_ratio_low=3e-4, clip_ratio_high=4e-4))
    # the spec in plain float64: only token 0 is read
    s = torch.exp(torch.tensor(-1.0 - -1.5, dtype=f64))
    expected = torch.max(-s, -s.clamp(1 - 3e-4, 1 + 4e-4)).item()  # -1.0004
    got = loss.item()
    ok = abs(got - expected) <= 1e-12
    return (not ok, "GSPO loss with NaN/-inf at a masked position", f"{expected:.6g}", f"{got:.6g}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
