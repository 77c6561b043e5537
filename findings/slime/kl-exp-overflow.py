"""slime: the clamped low_var_kl gives a NaN gradient when exp(ref - logp) overflows float32.

Framework: slime main 624b824a (2026-08-21), slime/utils/ppo_utils.py `compute_approx_kl` with
kl_loss_type "low_var_kl" (--kl-loss-type low_var_kl): the log-probs are cast to float32 (`.float()`) whatever
their dtype, kl = exp(x) - 1 - x with x = ref - logp unclamped, then `torch.clamp(kl, min=-10, max=10)`.
Source: https://github.com/THUDM/slime/blob/624b824a898ab0ec1fcb4d373004c7f3852bf515/slime/utils/ppo_utils.py#L28-L49
Spec: `kl.k3` (pgspec spec/kl.md#kl.k3): y = clip(e^x - 1 - x, c, d), x = l_ref - l (here no input clamp,
[c, d] = [-10, 10]); dy/dl = -(e^x - 1) where y is inside [c, d], else 0 (the value is held, so is the gradient).
Input: one token, log_probs = [-201], log_probs_base = [-1] (x = 200), float64 (slime computes in float32
whatever the input dtype, so float32 and bfloat16 inputs fail the same way).
Expected: value 10 (clamped), gradient 0 (computed in plain float64 torch, where e^200 is finite).
Got: value 10 and gradient NaN: exp(200) is inf in float32, and the clamp's zero gradient reaches exp's backward
as 0 * inf = NaN. Because the value is finite, nothing flags the step; the KL loss's gradient poisons the
parameters. Any x past log(float32 max) = 88.7 does it. (kl_loss_type "k3" has no clamp: its value is inf there.)
Fix: clamp x before the exponential (`log_ratio = log_ratio.clamp(-20, 20)` before `.exp()`, as verl does):
every |x| > 20 is held at 10 by the value clamp anyway, so values and gradients stay the spec's; or evaluate the
held tokens at 0 (select x = 0 where the value would be held, before exp, then put back the bound).
pgspec rule: adapters/slime/deviations.toml, name kl-exp-overflow, cause exp-overflow (kl.k3 at a large
log-ratio with the output clamp, every dtype).

Run: python findings/slime/kl-exp-overflow.py /path/to/slime  (or FINDINGS_SOURCE=/path/to/slime). Exit 0: the bug
reproduces; 1: fixed; 2: could not run. slime is not pip-installable (PyPI's "slime" is an unrelated package), so
the script executes slime/utils/ppo_utils.py from the checkout (it imports torch only). Stand-ins (inline below):
package shells for slime and slime.utils (their __init__ is not run). The @torch.compile(dynamic=True) function
runs eagerly (torch._dynamo.config.disable): compiling it on CPU reuses stale float arguments (pytorch #194976,
#197889); compiled by inductor it gives the same NaN.
"""
import importlib
import importlib.machinery
import os
import subprocess
import sys
import types
from pathlib import Path


def checkout():
    src = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("FINDINGS_SOURCE")
    if not src:
        raise RuntimeError("give the slime checkout as the first argument or in FINDINGS_SOURCE")
    if not (Path(src) / "slime/utils/ppo_utils.py").is_file():
        raise RuntimeError(f"{src} is not a slime checkout (no slime/utils/ppo_utils.py)")
    return Path(src)


def commit(src):
    try:
        out = subprocess.run(["git", "-C", str(src), "rev-parse", "--short=8", "HEAD"], capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def _package(name, path):
    mod = types.ModuleType(name)
    mod.__path__ = [str(path)]
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    mod.__spec__.submodule_search_locations = [str(path)]
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], child, mod)
    return mod


def load_ppo_utils(src):
    """slime/utils/ppo_utils.py executed from the checkout, its compiled functions eager."""
    import torch

    torch._dynamo.config.disable = True  # the @torch.compile functions run as the Python they are written as
    _package("slime", src / "slime")
    _package("slime.utils", src / "slime" / "utils")
    return importlib.import_module("slime.utils.ppo_utils")


def main():
    import torch

    src = checkout()
    ppo = load_ppo_utils(src)
    lp_value, ref_value = -201.0, -1.0  # x = ref - logp = 200
    # expected, from the spec in plain float64 torch (e^200 ~ 7e86 is finite there)
    lp64 = torch.tensor([lp_value], dtype=torch.float64, requires_grad=True)
    x = torch.tensor([ref_value], dtype=torch.float64) - lp64
    y = (torch.exp(x) - 1 - x).clamp(-10, 10)
    y.sum().backward()
    exp_value, exp_grad = y.item(), lp64.grad[0].item() + 0.0  # + 0.0: no -0

    lp = torch.tensor([lp_value], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([ref_value], dtype=torch.float64)
    kl = ppo.compute_approx_kl(lp, ref, kl_loss_type="low_var_kl")
    kl.sum().backward()
    got_value, got_grad = kl.item(), lp.grad[0].item() + 0.0
    what = (f"slime {commit(src)} compute_approx_kl low_var_kl at x = ref - logp = {ref_value - lp_value:g}, float64 "
            f"input (expected value {exp_value:g}, gradient {exp_grad:g}; got value {got_value:g}, gradient {got_grad:g})")
    # float32 accuracy: a few ulps of the value, the gradient exactly the spec's (0 where held)
    ok = abs(got_value - exp_value) <= 1e-6 * max(1.0, abs(exp_value)) and abs(got_grad - exp_grad) <= 1e-6 * max(
        1.0, abs(exp_grad))
    if ok:
        print(f"FIXED: {what}")
        return 1
    print(f"REPRODUCED: {what}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 - any failure to run is exit 2, on one line
        print(f"ERROR: {type(e).__name__}: {e}".replace("\n", " "))
        sys.exit(2)
