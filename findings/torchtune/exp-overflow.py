"""torchtune GRPOLoss: NaN gradient when the log-ratio overflows exp on the clipped side (float32)

Framework: torchtune main 19bb8e68 (2025-04-06, the day v0.6.1 was tagged; the 0.6.1 wheel has no
torchtune/dev), torchtune.dev.grpo.loss.GRPOLoss; torch 2.13.0.
Spec: surrogate.ppo_clip, spec/surrogate.md#surrogate.ppo_clip (here through loss.bnpo, spec/loss.md#loss.bnpo):
    term = max(-A r, -A clip(r, 1 - eps, 1 + eps)),  r = e^(l - l_old);
    d term / d l = -A r where the unclipped branch is active, else 0.
Input: one token in float32, l = 0, l_old = -200 (a stale or mis-scored old log-prob), ref = l, A = 1,
GRPOLoss(epsilon=0.2, kl_coeff=0.0).
Expected: loss -1.2 (r is far beyond 1 + eps: the clipped branch is active) and gradient 0.
Got: loss -1.2 but gradient NaN. ratios = torch.exp(pi_logprobs - pi_old_logprobs) is inf in float32, and the
backward of torch.minimum multiplies the inactive (unclipped) branch's zero cotangent by exp's derivative
inf: 0 * inf = NaN, which then reaches every parameter. (GRPOSimpleLoss, the recipe config's default, has
no old log-probs and no ratio to overflow.)
Fix: clamp the log-ratio before exp, as verl and OpenRLHF do: ratios = torch.exp((pi_logprobs -
pi_old_logprobs).clamp(max=20.0)) (any bound below log(float32 max) = 88.7 keeps the clipped branch exact).
Source: https://github.com/pytorch/torchtune/blob/19bb8e680ef90dfb527bfc8c8545a6b87c9eb895/torchtune/dev/grpo/loss.py#L65-L83

Run: python findings/torchtune/exp-overflow.py /path/to/torchtune  (or FINDINGS_SOURCE=/path/to/torchtune): a
git checkout of pytorch/torchtune (git clone https://github.com/pytorch/torchtune && git -C torchtune checkout
19bb8e68), in an environment with torch.
Exit status: 0 and "REPRODUCED: ..." while the bug is there; 1 and "FIXED: ..." once torchtune agrees with the
spec; 2 when it cannot run (findings/README.md).
The script executes torchtune/rlhf/rewards.py and torchtune/dev/grpo/loss.py from the checkout. Stand-ins
(written inline below): package shells for torchtune, torchtune.rlhf, torchtune.dev and torchtune.dev.grpo
(their __init__ files import torchao and the model stack, which the losses do not use); torchtune.rlhf
re-exports masked_mean and masked_sum from the checkout's rewards.py, as the real torchtune/rlhf/__init__.py does.
"""
import importlib
import importlib.machinery
import os
import subprocess
import sys
import types
from pathlib import Path

try:
    import torch
except Exception as e:  # noqa: BLE001
    print(f"ERROR: cannot import torch: {type(e).__name__}: {e}")
    sys.exit(2)

LOSS = "torchtune/dev/grpo/loss.py"


def checkout():
    src = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("FINDINGS_SOURCE")
    if not src:
        raise RuntimeError("give the torchtune checkout as the first argument or in FINDINGS_SOURCE")
    if not (Path(src) / LOSS).is_file():
        raise RuntimeError(f"{src} has no {LOSS}: not a torchtune checkout with the GRPO losses (main 19bb8e68; "
                           "the 0.6.1 wheel and tag have no torchtune/dev)")
    return Path(src)


def commit(src):
    try:
        out = subprocess.run(["git", "-C", str(src), "rev-parse", "--short=8", "HEAD"], capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def _shell(name, path):
    mod = types.ModuleType(name)
    mod.__path__ = [str(path)]
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    mod.__spec__.submodule_search_locations = [str(path)]
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], child, mod)
    return mod


def load_torchtune(src):
    """torchtune.dev.grpo.loss executed from the checkout (package __init__ files are not run)."""
    root = src / "torchtune"
    _shell("torchtune", root)
    rlhf = _shell("torchtune.rlhf", root / "rlhf")
    rewards = importlib.import_module("torchtune.rlhf.rewards")
    rlhf.masked_mean, rlhf.masked_sum = rewards.masked_mean, rewards.masked_sum   # as rlhf/__init__.py re-exports
    _shell("torchtune.dev", root / "dev")
    _shell("torchtune.dev.grpo", root / "dev" / "grpo")
    return importlib.import_module("torchtune.dev.grpo.loss")


def check():
    src = checkout()
    loss_mod = load_torchtune(src)
    f32 = torch.float32
    logps = torch.tensor([[0.0]], dtype=f32, requires_grad=True)
    old = torch.tensor([[-200.0]], dtype=f32)
    loss, *_ = loss_mod.GRPOLoss(epsilon=0.2, kl_coeff=0.0)(old, logps, logps.detach(), torch.tensor([1.0], dtype=f32),
                                                           torch.tensor([[True]]))
    loss.backward()
    got, grad = loss.item(), logps.grad.item()
    # the spec in plain float64: r = e^200 > 1.2 with A > 0, so the clipped branch -A (1 + eps) is active
    lv = torch.tensor(0.0, dtype=torch.float64, requires_grad=True)
    r = torch.exp(lv - -200.0)
    spec = torch.max(-1.0 * r, -1.0 * r.clamp(0.8, 1.2))
    spec.backward()
    expected, exp_grad = spec.item(), lv.grad.item()                   # -1.2, 0
    ok = abs(got - expected) <= 1e-6 and abs(grad - exp_grad) <= 1e-6
    return (not ok, f"torchtune {commit(src)} GRPOLoss: float32 ppo-clip gradient at log-ratio 200 (clipped side)",
            f"loss {expected:.6g}, grad {exp_grad:g}", f"loss {got:.6g}, grad {grad}")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
