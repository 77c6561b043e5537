"""torchtune GRPOSimpleLoss: padding a batch changes the loss (an infinite reference log-prob at a padded position gives NaN)

Framework: torchtune main 19bb8e68 (2025-04-06, the day v0.6.1 was tagged; the 0.6.1 wheel has no
torchtune/dev), torchtune.dev.grpo.loss.GRPOSimpleLoss (the loss of the GRPO recipe's config 3B_full_grpo.yaml)
with kl_coeff > 0, and GRPOLoss likewise; torch 2.13.0.
Spec: the padding property (spec/properties.md, prop.padding) of loss.grpo, spec/loss.md#loss.grpo, with the
KL kl.k3, spec/kl.md#kl.k3, and the masking rule of spec/conventions.md (a masked position is never read):
    L = (1/N) sum_i (1/L_i) sum_t m_{i,t} [ -A_i r_{i,t} (clipped) + beta k3(l_ref - l) ],  k3(x) = e^x - x - 1;
    appending masked positions, whatever they hold, leaves L and the gradient unchanged.
Input: one on-policy token l = -1, l_ref = -1.5, A = 1, GRPOSimpleLoss(epsilon=0.2, kl_coeff=0.01) (the
recipe config's values); the same completion padded with one masked token whose reference log-prob is -inf
(a padded position of a reference model's output, e.g. under a vocabulary mask).
Expected: the same loss for both, -1 + 0.01 (e^-0.5 + 0.5 - 1) = -0.99893469, and the same gradient
-1 + 0.01 (1 - e^-0.5) = -0.99606531 (0 at the padded position).
Got: loss NaN for the padded completion (the gradient stays right): k3 at the padded position is
e^(-inf) + inf - 1 = inf, and masked_mean's mask product inf * 0 is NaN (the same root cause as
findings/torchtune/masked-nonfinite.py, here through the KL term, as the property rows prop.padding /
prop.permutation / prop.gradient_fd of agg.* and loss.* show). (torchtune's own GRPO recipe writes 1.0 into
the padded positions of the log-prob tensors before calling the loss, so the recipe does not meet it.)
Fix: select, not multiply: torch.where(mask, x, 0).sum(dim) in rlhf.masked_mean.
Source: https://github.com/pytorch/torchtune/blob/19bb8e680ef90dfb527bfc8c8545a6b87c9eb895/torchtune/rlhf/rewards.py#L112
(and torchtune/dev/grpo/loss.py#L243-L257 at the same commit).

Run: python findings/torchtune/masked-nonfinite-props.py /path/to/torchtune  (or FINDINGS_SOURCE=/path/to/torchtune): a
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
    fn = loss_mod.GRPOSimpleLoss(epsilon=0.2, kl_coeff=0.01)
    A = torch.tensor([1.0], dtype=f64)
    got = {}
    for label, lp, ref, mask in (("unpadded", [[-1.0]], [[-1.5]], [[True]]),
                                 ("padded", [[-1.0, -1.0]], [[-1.5, float("-inf")]], [[True, False]])):
        logps = torch.tensor(lp, dtype=f64, requires_grad=True)
        loss, *_ = fn(logps.detach(), logps, torch.tensor(ref, dtype=f64), A, torch.tensor(mask))
        loss.backward()
        got[label] = (loss.item(), logps.grad[0].tolist())
    # the spec in plain float64: on policy r = 1; term = -A r + beta k3(l_ref - l)
    lv = torch.tensor(-1.0, dtype=f64, requires_grad=True)
    x = -1.5 - lv
    spec = -1.0 * torch.exp(lv - lv.detach()) + 0.01 * (torch.exp(x) - x - 1)
    spec.backward()
    expected, g = spec.item(), lv.grad.item()                         # -0.99893469, -0.99606531
    want = {"unpadded": [g], "padded": [g, 0.0]}
    ok = all(abs(v - expected) <= 1e-7 and all(abs(a - b) <= 1e-7 for a, b in zip(gr, want[k])) for k, (v, gr) in got.items())
    shown = "; ".join(f"{k}: loss {v:.8g}, grad [{', '.join(f'{x:.8g}' for x in gr)}]" for k, (v, gr) in got.items())
    return (not ok, f"torchtune {commit(src)} GRPOSimpleLoss (kl_coeff 0.01) padded with a masked token whose ref log-prob is -inf",
            f"loss {expected:.8g}, grad {g:.8g} (and 0 at the padding) padded and unpadded", shown)


if __name__ == "__main__":
    try:
        bug, what, expected, got = check()
    except Exception as e:  # noqa: BLE001
        print(f"ERROR: {type(e).__name__}: {e}")
        sys.exit(2)
    print(f"{'REPRODUCED' if bug else 'FIXED'}: {what} (expected {expected}, got {got})")
    sys.exit(0 if bug else 1)
