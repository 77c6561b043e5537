"""torchtune GRPOLoss: a NaN at a padded (masked) position makes the GRPO loss NaN

Framework: torchtune main 19bb8e68 (2025-04-06, the day v0.6.1 was tagged; the 0.6.1 wheel has no
torchtune/dev), torchtune.dev.grpo.loss.GRPOLoss, GRPOSimpleLoss and torchtune.rlhf.masked_mean; torch 2.13.0.
Spec: loss.bnpo, spec/loss.md#loss.bnpo (GRPOLoss's token mean), with the masking rule of
spec/conventions.md ("Masks: excluded, not multiplied by zero": a masked position's inputs are never read and
its gradient is exactly 0):
    L = sum_{i,t} m_{i,t} term_{i,t} / sum_{i,t} m_{i,t},   term = max(-A r, -A clip(r, 1 - eps, 1 + eps)),  r = e^(l - l_old)
Input: one completion of two tokens, the second padded (padding_masks False) with a NaN old log-prob (what a
sampler reports for a position it did not score); l = (-1, -1), l_old = (-1.1, NaN), ref = l, A = 1,
GRPOLoss(epsilon=0.2, kl_coeff=0.0).
Expected: loss -e^0.1 = -1.1051709 (the valid token's r = e^0.1 is inside the clip range), gradient
(-e^0.1, 0).
Got: loss NaN, and gradient NaN at the padded position. GRPOLoss forms the ratio and the per-token losses at
every position and rlhf.masked_mean multiplies by the mask ((x * mask).sum(dim) / (mask.sum(dim) + 1e-8)):
NaN * 0 = NaN. GRPOSimpleLoss aggregates with the same masked_mean; GRPOCompletionLoss sums the log-probs with
rlhf.masked_sum, which multiplies by the mask likewise. (torchtune's own GRPO recipe writes 1.0 into the
padded positions of the three log-prob tensors before calling the loss,
recipes/dev/grpo_full_finetune_distributed.py#L806-L807 and #L891, so the recipe itself does not meet the NaN;
the loss classes and masked_mean called directly do.)
Fix: select instead of multiplying: torch.where(mask, x, 0).sum(dim) in masked_mean and masked_sum (the value), and in the
losses the log-ratio selected before the exponential, torch.where(padding_masks, pi_logprobs - pi_old_logprobs, 0)
(the gradient: the masked position's zero cotangent still meets exp(NaN)).
Source: https://github.com/pytorch/torchtune/blob/19bb8e680ef90dfb527bfc8c8545a6b87c9eb895/torchtune/rlhf/rewards.py#L112
(and torchtune/dev/grpo/loss.py#L65-L90 at the same commit).

Run: python findings/torchtune/masked-nonfinite.py /path/to/torchtune  (or FINDINGS_SOURCE=/path/to/torchtune): a
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
    f64 = torch.float64
    logps = torch.tensor([[-1.0, -1.0]], dtype=f64, requires_grad=True)
    old = torch.tensor([[-1.1, float("nan")]], dtype=f64)
    mask = torch.tensor([[True, False]])
    loss, *_ = loss_mod.GRPOLoss(epsilon=0.2, kl_coeff=0.0)(old, logps, logps.detach(), torch.tensor([1.0], dtype=f64), mask)
    loss.backward()
    got, grad = loss.item(), logps.grad[0].tolist()
    # the spec in plain float64: only token 0 is read
    lv = torch.tensor(-1.0, dtype=f64, requires_grad=True)
    r = torch.exp(lv - -1.1)
    spec = torch.max(-1.0 * r, -1.0 * r.clamp(0.8, 1.2))                # A = 1, one valid token
    spec.backward()
    expected, exp_grad = spec.item(), [lv.grad.item(), 0.0]
    ok = abs(got - expected) <= 1e-7 and all(abs(a - b) <= 1e-7 for a, b in zip(grad, exp_grad))
    return (not ok, f"torchtune {commit(src)} GRPOLoss: NaN old log-prob at a masked position",
            f"loss {expected:.8g}, grad [{exp_grad[0]:.8g}, 0]", f"loss {got:.8g}, grad [{grad[0]:.8g}, {grad[1]:.8g}]")


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
