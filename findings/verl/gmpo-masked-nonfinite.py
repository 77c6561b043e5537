"""verl GMPO (geo_mean): a NaN/inf log-prob at a padded (masked) position makes the loss NaN

Framework: verl 0.9.1, core_algos.compute_policy_loss_geo_mean (actor.policy_loss.loss_mode="geo_mean");
torch 2.13.0.
Spec: surrogate.gmpo, spec/surrogate.md#surrogate.gmpo, with the masking rule of spec/conventions.md:
    l_i = -A_i exp( (1/L_i) sum_t m_{i,t} clip_A(l_{i,t} - l_old_{i,t}, -eps_low, eps_high) ),
    clip_A = min(x, clip(x)) for A > 0, max(x, clip(x)) for A < 0.
Input: one sequence of two tokens, the second padded: log_prob = (-1, NaN), old_log_prob = (-1.5, -inf),
response_mask = (1, 0), A = 1, clip_ratio 0.4 (GMPO's e^±0.4).
Expected: -e^0.4 = -1.4918247 (the log-ratio 0.5 is clipped at 0.4).
Got: NaN: the geometric mean sums (negative_approx_kl_min * response_mask), and NaN * 0 is NaN.
Fix: sum with verl_F.masked_sum(negative_approx_kl_min, response_mask, axis=-1) (a where, not a product).
Source: https://github.com/verl-project/verl/blob/v0.9.1/verl/trainer/ppo/core_algos.py#L1984

Run: python findings/verl/gmpo-masked-nonfinite.py
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
    fn = core_algos.get_policy_loss_fn("geo_mean")
    loss, _ = fn(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask, loss_agg_mode="token-mean",
                 config=actor_config(clip_ratio_low=0.4, clip_ratio_high=0.4))
    # the spec in plain float64: only token 0 is read; A > 0 takes min(x, clip(x))
    x = torch.tensor(-1.0 - -1.5, dtype=f64)
    expected = (-1.0 * torch.exp(torch.minimum(x, x.clamp(-0.4, 0.4)))).item()  # -1.4918247
    got = loss.item()
    ok = abs(got - expected) <= 1e-12
    return (not ok, "GMPO (geo_mean) loss with NaN/-inf at a masked position", f"{expected:.8g}", f"{got:.8g}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
