"""AReaL: the clamped k3 KL gives a NaN gradient when exp(ref - logp) overflows float32.

Framework: AReaL 1.0.4 (PyPI; byte-identical to commit a0f3dca2), areal/utils/data.py `KLEstimator`
(`_compute_approx_kl`, kl_estimator "k3", apply_clamp=True, the default): the log-probs are cast to float32
(`.float()`) whatever their dtype, k3 = exp(x) - 1 - x with x = ref - logp unclamped, then the value is clamped
to [-10, 10].
Source: https://github.com/areal-project/AReaL/blob/a0f3dca200074f920195e1ec34558538d9c7642d/areal/utils/data.py#L1648-L1655
Spec: `kl.k3` (pgspec spec/kl.md#kl.k3): y = clip(e^x - 1 - x, c, d), x = l_ref - l (here no input clamp,
[c, d] = [-10, 10]); dy/dl = -(e^x - 1) where y is inside [c, d], else 0 (the value is held, so is the gradient).
Input: one token, logprobs = [[-201]], ref = [[-1]] (x = 200), float64 (AReaL computes in float32 whatever the
input dtype, so float32 and bfloat16 inputs fail the same way).
Expected: value 10 (clamped), gradient 0 (computed in plain float64 torch, where e^200 is finite).
Got: value 10 and gradient NaN: exp(200) is inf in float32, and the clamp's zero gradient reaches exp's backward
as 0 * inf = NaN. Because the value is finite, nothing flags the step; the KL loss's gradient poisons the
parameters. Any x past log(float32 max) = 88.7 does it (a token the policy gives ~e^-89 that the reference likes).
Fix: clamp x before the exponential, as verl does (`log_ratio = log_ratio.clamp(-20, 20)` before `.exp()`):
every |x| > 20 is held at 10 by the value clamp anyway, so values and gradients stay the spec's; or evaluate the
held tokens at 0 (select x = 0 where the value would be held, before exp, then put back the bound).
pgspec rule: adapters/areal/deviations.toml, name kl-exp-overflow, cause exp-overflow (kl.k3 with
apply_clamp at a large log-ratio, every dtype).

Run: python findings/areal/kl-exp-overflow.py  (AReaL and torch installed; importing areal takes 5-40 s, its __init__
imports areal.infra). Exit 0: the bug reproduces; 1: fixed; 2: could not run. No stand-in: KLEstimator is imported
from areal as installed.
"""
import sys


def version():
    from importlib import metadata

    return metadata.version("areal")


def main():
    import torch
    from areal.utils.data import KLEstimator

    lp_value, ref_value = -201.0, -1.0  # x = ref - logp = 200
    # expected, from the spec in plain float64 torch (e^200 ~ 7e86 is finite there)
    lp64 = torch.tensor([[lp_value]], dtype=torch.float64, requires_grad=True)
    x = torch.tensor([[ref_value]], dtype=torch.float64) - lp64
    y = (torch.exp(x) - 1 - x).clamp(-10, 10)
    y.sum().backward()
    exp_value, exp_grad = y.item(), lp64.grad[0, 0].item() + 0.0  # + 0.0: no -0

    lp = torch.tensor([[lp_value]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[ref_value]], dtype=torch.float64)
    kl = KLEstimator(kl_estimator="k3", apply_clamp=True)(lp, ref)
    kl.sum().backward()
    got_value, got_grad = kl.item(), lp.grad[0, 0].item() + 0.0
    what = (f"AReaL {version()} KLEstimator k3 with apply_clamp at x = ref - logp = {ref_value - lp_value:g}, float64 input (expected value "
            f"{exp_value:g}, gradient {exp_grad:g}; got value {got_value:g}, gradient {got_grad:g})")
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
