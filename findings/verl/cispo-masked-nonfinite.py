"""verl CISPO: a NaN old log-prob at a padded (masked) position gives a NaN gradient

Framework: verl 0.9.1, core_algos.compute_policy_loss_cispo (actor.policy_loss.loss_mode="cispo"); torch 2.13.0.
Spec: surrogate.cispo, spec/surrogate.md#surrogate.cispo, with the masking rule of spec/conventions.md (the
gradient at a masked position is exactly 0):
    term_t = -sg[clip(r_t, 1 - eps_low, 1 + eps_high)] A_t l_t,  r_t = e^(l_t - l_old_t);  d term_t / d l_t = -sg[clip(r_t)] A_t.
Input: one sequence of two tokens, the second padded: log_prob = (-1, -1), old_log_prob = (-1.5, NaN),
response_mask = (1, 0), A = 1, clip_ratio 0.2, loss_agg_mode "token-mean".
Expected: loss 1.2 * 1 * 1 = 1.2 (r = e^0.5 clipped at 1.2), gradient (-1.2, 0).
Got: loss 1.2 but gradient (-1.2, NaN). The per-token loss is built at every position; agg_loss's where
sends a zero cotangent to the padded position, and 0 times the local derivative -sg[clip(NaN)] A = NaN is
NaN, which lands in the model's gradient.
Fix: mask the per-token loss's inputs before use, e.g. clipped_ratio_sg = torch.where(response_mask.bool(),
clipped_ratio, 0).detach() (or build pg_losses with torch.where(response_mask.bool(), ..., 0)).
Source: https://github.com/verl-project/verl/blob/v0.9.1/verl/trainer/ppo/core_algos.py#L2084

Run: python findings/verl/cispo-masked-nonfinite.py
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
    old = torch.tensor([[-1.5, float("nan")]], dtype=f64)
    mask = torch.tensor([[True, False]])
    adv = torch.ones(1, 2, dtype=f64)
    fn = core_algos.get_policy_loss_fn("cispo")
    loss, _ = fn(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask, loss_agg_mode="token-mean",
                 config=actor_config(clip_ratio_low=0.2, clip_ratio_high=0.2))
    loss.backward()
    # the spec in plain float64: only token 0 is read
    w = torch.exp(torch.tensor(-1.0 - -1.5, dtype=f64)).clamp(0.8, 1.2)
    expected_loss, expected_grad = (-w * 1.0 * -1.0).item(), [(-w * 1.0).item(), 0.0]  # 1.2, (-1.2, 0)
    got_loss, got_grad = loss.item(), logp.grad[0].tolist()
    ok = abs(got_loss - expected_loss) <= 1e-12 and all(abs(g - e) <= 1e-12 for g, e in zip(got_grad, expected_grad))
    return (not ok, "CISPO gradient with a NaN old log-prob at a masked position",
            f"loss {expected_loss:.6g}, grad {expected_grad}", f"loss {got_loss:.6g}, grad {got_grad}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
