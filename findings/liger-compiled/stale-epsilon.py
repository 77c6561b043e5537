"""Liger's default compiled=True GRPO loss returns the previous call's result after epsilon changes (torch.compile, CPU)

Framework: liger-kernel 0.8.5, LigerFusedLinearGRPOLoss with its default compiled=True (torch.compile of
_compute_loss_from_logps, with epsilon_low/epsilon_high bound as Python floats); torch 2.13.0 (CPU build,
Inductor). The root cause is torch's (pytorch #194976, closed, and its open residual #197889), reached
through Liger's default; CPU only was checked.
Spec: loss.grpo, spec/loss.md#loss.grpo:
    L = (1/N) sum_i (1/L_i) sum_t m_{i,t} max(-A_i r_{i,t}, -A_i clip(r_{i,t}, 1 - eps_low, 1 + eps_high)),  r = e^(l - l_old).
Input: B = 2, T = 4, no padding, A = (1, -1), fixed log-probs (given to the loss as 2-wide hidden states
with an identity LM head, so Liger's log-softmax returns them); three calls in one process, each with a new
LigerFusedLinearGRPOLoss(compiled=True, loss_type="grpo", beta=0), changing only (epsilon_low,
epsilon_high): (0.2, 0.2), (0.1, 0.28), (0.05, 0.05).
Expected: each call's loss is the formula at its own epsilon (the third: eps 0.05 / 0.05).
Got: the third call returns the second call's loss (the value for eps 0.1 / 0.28); compiled=False gives the
right value. After dynamo turns the float arguments into dynamic symbols, the compiled graph is reused with
the earlier floats.
Who is exposed: a process that calls compiled Liger losses with several epsilon values (sweeps, tests,
several loss modules); one training run with fixed hyperparameters compiles once per configuration.
Fix (Liger side, until torch's is released): pass epsilon/beta as 0-dim tensors to the compiled function, or
compile with torch._dynamo.config.specialize_float = True (the floats then stay constants of the graph and a
change recompiles).
Source: https://github.com/linkedin/Liger-Kernel/blob/v0.8.5/src/liger_kernel/chunked_loss/fused_linear_ppo.py#L281

Run: python findings/liger-compiled/stale-epsilon.py   (a fresh process; about a minute on a CPU: three compiles)
Exit status: 0 and "REPRODUCED: ..." while the bug is there; 1 and "FIXED: ..." once Liger agrees with the
spec; 2 when it cannot run (findings/README.md).
"""
import sys

try:
    import torch
    from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss
except Exception as e:  # noqa: BLE001
    print(f"ERROR: cannot import liger_kernel/torch: {type(e).__name__}: {e}")
    sys.exit(2)


LOGPS = [[-1.0, -0.5, -1.5, -0.3], [-0.8, -1.2, -0.4, -2.0]]
OLD = [[-1.3, -0.1, -2.0, -0.1], [-0.5, -1.6, -0.3, -2.6]]
A = [1.0, -1.0]


def liger_loss(eps_low, eps_high, compiled):
    l = torch.tensor(LOGPS, dtype=torch.float64)
    # 2-wide hidden states whose log-softmax at token 0 is l: (l, log(1 - e^l)), against an identity LM head
    hidden = torch.stack([l, torch.log(-torch.expm1(l))], dim=-1).float().requires_grad_(True)
    module = LigerFusedLinearGRPOLoss(compiled=compiled, loss_type="grpo", beta=0.0, epsilon_low=eps_low,
                                      epsilon_high=eps_high, use_ref_model=False, chunk_size=1, temperature=1.0)
    loss, _ = module(hidden, torch.eye(2), torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.long),
                     torch.tensor(A), old_per_token_logps=torch.tensor(OLD))
    return loss.item()


def spec_loss(eps_low, eps_high):
    """loss.grpo in plain float64: per-sequence token mean of the PPO clip term, then the mean over sequences."""
    l, lo = torch.tensor(LOGPS, dtype=torch.float64), torch.tensor(OLD, dtype=torch.float64)
    a = torch.tensor(A, dtype=torch.float64)[:, None]
    r = torch.exp(l - lo)
    term = torch.maximum(-a * r, -a * r.clamp(1 - eps_low, 1 + eps_high))
    return term.mean(-1).mean().item()


def check():
    calls = [(0.2, 0.2), (0.1, 0.28), (0.05, 0.05)]
    got = [liger_loss(lo, hi, compiled=True) for lo, hi in calls]
    expected = [spec_loss(lo, hi) for lo, hi in calls]
    bad = [k for k in range(3) if abs(got[k] - expected[k]) > 1e-5 * max(1.0, abs(expected[k]))]
    where = ", ".join(f"call {k + 1} (eps {calls[k][0]}/{calls[k][1]})" for k in bad) or "no call"
    return (bool(bad), f"compiled=True GRPO loss over three epsilon settings: wrong at {where}",
            ", ".join(f"{v:.6f}" for v in expected), ", ".join(f"{v:.6f}" for v in got))


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
