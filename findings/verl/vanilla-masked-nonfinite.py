"""verl PPO/GRPO (vanilla, gpg): a NaN at a padded (masked) position gives a NaN gradient

Framework: verl 0.9.1, core_algos.compute_policy_loss_vanilla (the default actor.policy_loss.loss_mode,
dual clip on) and compute_policy_loss_gpg; torch 2.13.0.
Spec: surrogate.dual_clip, spec/surrogate.md#surrogate.dual_clip (and surrogate.pg, loss.bnpo, loss.grpo),
with the masking rule of spec/conventions.md (the gradient at a masked position is exactly 0); this is
what the padding property (spec/properties.md, prop.padding) checks:
    term_t = max(-A r_t, -A clip(r_t, 1 - eps, 1 + eps)) (and min(., -A c) for A < 0),  r_t = e^(l_t - l_old_t).
Input: one sequence of two tokens, the second padded with a NaN advantage (advantages of padded positions
are whatever the padding held): log_prob = old_log_prob = (-1, -1), A = (1, NaN), response_mask = (1, 0),
clip_ratio 0.2, loss_agg_mode "token-mean".
Expected: loss -1 (on policy: -A r = -1), gradient (-1, 0).
Got: loss -1 but gradient (-1, NaN). The per-token loss is built at every position; agg_loss's where sends
a zero cotangent to the padded position, and 0 times the local derivative -A r = NaN is NaN.
Fix: build the per-token loss from masked inputs, e.g. advantages = torch.where(response_mask.bool(),
advantages, 0) and the same for the log-ratio, before the clip.
Source: https://github.com/verl-project/verl/blob/v0.9.1/verl/trainer/ppo/core_algos.py#L1361

Run: python findings/verl/vanilla-masked-nonfinite.py
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
    logp = torch.tensor([[-1.0, -1.0]], dtype=f64, requires_grad=True)
    old = torch.tensor([[-1.0, -1.0]], dtype=f64)
    adv = torch.tensor([[1.0, float("nan")]], dtype=f64)
    mask = torch.tensor([[True, False]])
    fn = core_algos.get_policy_loss_fn("vanilla")
    loss, _ = fn(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask, loss_agg_mode="token-mean",
                 config=actor_config(clip_ratio=0.2))
    loss.backward()
    # the spec in plain float64: token 0 on policy, r = 1 inside the clip range: term -A r, gradient -A r
    r = torch.exp(torch.tensor(-1.0 - -1.0, dtype=f64))
    expected_loss, expected_grad = (-1.0 * r).item(), [(-1.0 * r).item(), 0.0]
    got_loss, got_grad = loss.item(), logp.grad[0].tolist()
    ok = abs(got_loss - expected_loss) <= 1e-12 and all(abs(g - e) <= 1e-12 for g, e in zip(got_grad, expected_grad))
    return (not ok, "vanilla (dual-clip PPO) gradient with a NaN advantage at a masked position",
            f"loss {expected_loss:.6g}, grad {expected_grad}", f"loss {got_loss:.6g}, grad {got_grad}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
