"""verl kl_penalty "k2" / "k3+": an infinite log-ratio at a padded (masked) position gives a NaN gradient

Framework: verl 0.9.1, core_algos.kl_penalty(..., "k2") (actor.kl_loss_type="mse"/"k2") and "k3+" (whose
straight-through gradient is k2's), aggregated by agg_loss as the actor does; torch 2.13.0.
Spec: kl.k2, spec/kl.md#kl.k2 (and kl.k3_straight_through), with the masking rule of spec/conventions.md:
    kl_t = (1/2) (l_t - l_ref_t)^2,  d kl_t / d l_t = l_t - l_ref_t;  a masked position's gradient is 0.
Input: log_prob = (-1, -1), ref_log_prob = (-1.5, -inf) (a padded position of the reference model's output),
response_mask = (1, 0), agg_loss "token-mean".
Expected: KL 0.125 and gradient (0.5, 0).
Got: KL 0.125 but gradient (0.5, NaN): k2 is computed at every position, agg_loss's where sends a zero
cotangent to the padded position, and 0 times k2's derivative inf is NaN.
Fix: mask the log-ratio before squaring, e.g. in kl_penalty_forward/kl_penalty use
torch.where(mask, logprob - ref_logprob, 0) (kl_penalty would need the mask; or the actor passes
ref_log_prob with padded positions set to log_prob).
Source: https://github.com/verl-project/verl/blob/v0.9.1/verl/trainer/ppo/core_algos.py#L2235,
https://github.com/verl-project/verl/blob/v0.9.1/verl/trainer/ppo/core_algos.py#L2211

Run: python findings/verl/kl-k2-masked-nonfinite.py
Exit status: 0 and "REPRODUCED: ..." while the bug is there; 1 and "FIXED: ..." once verl agrees with the
spec; 2 when it cannot run (findings/README.md).
"""
import sys

try:
    import torch
    from verl.trainer.ppo import core_algos
except Exception as e:  # noqa: BLE001
    print(f"ERROR: cannot import verl/torch: {type(e).__name__}: {e}")
    sys.exit(2)


def check():
    f64 = torch.float64
    logp = torch.tensor([[-1.0, -1.0]], dtype=f64, requires_grad=True)
    ref = torch.tensor([[-1.5, float("-inf")]], dtype=f64)
    mask = torch.tensor([[True, False]])
    kl = core_algos.agg_loss(core_algos.kl_penalty(logp, ref, "k2"), mask, "token-mean")
    kl.backward()
    # the spec in plain float64: only token 0 is read
    x = torch.tensor(-1.0 - -1.5, dtype=f64)
    expected_kl, expected_grad = (0.5 * x * x).item(), [x.item(), 0.0]  # 0.125, (0.5, 0)
    got_kl, got_grad = kl.item(), logp.grad[0].tolist()
    ok = abs(got_kl - expected_kl) <= 1e-12 and all(abs(g - e) <= 1e-12 for g, e in zip(got_grad, expected_grad))
    return (not ok, "k2 KL gradient with ref_log_prob -inf at a masked position",
            f"kl {expected_kl:.6g}, grad {expected_grad}", f"kl {got_kl:.6g}, grad {got_grad}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
