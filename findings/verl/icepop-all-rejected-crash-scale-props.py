"""verl rollout correction: IcePop crashes with ZeroDivisionError when it rejects every token (the scale case and the clamp property row)

The generated scale case is.sequence.mask/scale-32768 and the property row prop.clamp/is.sequence.mask,
where every sequence is rejected: the same crash as findings/verl/icepop-all-rejected-crash.py.

Framework: verl 0.9.1, rollout_corr_helper.compute_rollout_correction_weights with a "lower_upper"
threshold (IcePop: algorithm.rollout_correction.rollout_is_threshold="0.5_1.001"), rollout_is="token" or
"sequence"; torch 2.13.0.
Spec: is.token.mask, spec/is.md#is.token.mask (and is.sequence.mask):
    w_t = rho_t 1[C_min <= rho_t <= C_max],  rho_t = e^(l_old_t - l_sampler_t):  a rejected token has weight 0.
Input: one token with log_ratio = l_old - l_sampler = 0.001953125 (rho = 1.001955, a bfloat16 rounding of
the sampler's log-prob), threshold "0.5_1.001".
Expected: weight 0 (rho > 1.001: the token is rejected), and training goes on with the token dropped.
Got: ZeroDivisionError: float division by zero. The effective-sample-size metric is
1.0 / masked_mean(is_weights_normalized.square(), response_mask).item(), and every weight is 0.
Fix: guard the metric, e.g. ess_den = verl_F.masked_mean(...).item(); metrics["rollout_is_eff_sample_size"] =
1.0 / ess_den if ess_den > 0 else 0.0.
Source: https://github.com/verl-project/verl/blob/v0.9.1/verl/trainer/ppo/rollout_corr_helper.py#L758

Run: python findings/verl/icepop-all-rejected-crash-scale-props.py
Exit status: 0 and "REPRODUCED: ..." while the bug is there; 1 and "FIXED: ..." once verl agrees with the
spec; 2 when it cannot run (findings/README.md).
"""
import sys

try:
    import torch
    from verl.trainer.ppo import rollout_corr_helper
except Exception as e:  # noqa: BLE001
    print(f"ERROR: cannot import verl/torch: {type(e).__name__}: {e}")
    sys.exit(2)


def check():
    f64 = torch.float64
    log_ratio = torch.tensor([[0.001953125]], dtype=f64)
    mask = torch.tensor([[True]])
    # the spec in plain float64: rho outside [C_min, C_max] = [0.5, 1.001] has weight 0
    rho = torch.exp(log_ratio[0, 0])
    expected = (rho * ((rho >= 0.5) & (rho <= 1.001))).item()  # 0
    try:
        weights, _ = rollout_corr_helper.compute_rollout_correction_weights(
            log_ratio, mask, rollout_is="token", rollout_is_threshold="0.5_1.001")
    except ZeroDivisionError as e:
        return True, "IcePop (threshold 0.5_1.001) rejecting the only token", f"weight {expected:g}", \
            f"ZeroDivisionError: {e}"
    got = weights[0, 0].item()
    return (got != expected, "IcePop (threshold 0.5_1.001) rejecting the only token", f"weight {expected:g}",
            f"weight {got:g}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
