"""verl agg_loss: the sequence-mean modes let a NaN/inf at a padded position into the loss (the property rows)

The property rows (prop.padding, prop.permutation, prop.gradient_fd, prop.on_policy, prop.accumulation,
prop.cp_rank_sum) of verl's masked-position rules: their examples hold NaN/inf at masked positions, which
reach the result through the same mask products; this script reproduces them through agg_loss.

Framework: verl 0.9.1, core_algos.agg_loss with loss_agg_mode "seq-mean-token-mean", "seq-mean-token-sum"
or "seq-mean-token-sum-norm" (the actor's loss for GRPO's and Dr.GRPO's recommended settings); torch 2.13.0.
Spec: agg.sample_mean, spec/agg.md#agg.sample_mean (and agg.seq_mean_token_sum, agg.constant), with the
masking rule of spec/conventions.md:
    L = (1/N) sum_{i: L_i > 0} (1/L_i) sum_t m_{i,t} x_{i,t}   (masked x never read).
Input: one row, values (0.5, NaN), mask (1, 0), "seq-mean-token-mean".
Expected: 0.5.
Got: NaN: these modes compute torch.sum(loss_mat * loss_mask, dim=-1), and NaN * 0 is NaN. The token modes
("token-mean", "token-sum") use the NaN-safe verl_F.masked_sum and give 0.5.
Fix: seq_losses = verl_F.masked_sum(loss_mat, loss_mask, axis=-1) in both sequence branches.
Source: https://github.com/verl-project/verl/blob/v0.9.1/verl/trainer/ppo/core_algos.py#L1182,
https://github.com/verl-project/verl/blob/v0.9.1/verl/trainer/ppo/core_algos.py#L1196

Run: python findings/verl/masked-nonfinite-props.py
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
    values = torch.tensor([[0.5, float("nan")]], dtype=f64)
    mask = torch.tensor([[True, False]])
    got = {mode: core_algos.agg_loss(values, mask, mode).item()
           for mode in ("seq-mean-token-mean", "seq-mean-token-sum")}
    # the spec in plain float64: one sequence of one valid token
    expected = values[0, 0].item()  # 0.5 (token mean and token sum of one token)
    ok = all(abs(v - expected) <= 1e-12 for v in got.values())
    return (not ok, "agg_loss seq-mean-token-mean / seq-mean-token-sum over values (0.5, NaN), mask (1, 0)",
            f"{expected:g} for both", ", ".join(f"{k} {v:g}" for k, v in got.items()))


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
