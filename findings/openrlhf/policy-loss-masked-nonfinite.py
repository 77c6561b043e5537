"""OpenRLHF: PolicyLoss computes the per-token loss at padded positions; an inf there gives a NaN gradient.

Framework: OpenRLHF 0.11.2 (PyPI), openrlhf/models/loss.py `PolicyLoss.forward` (policy_loss_type="ppo",
with or without dual_clip):
Source: https://github.com/OpenRLHF/OpenRLHF/blob/v0.11.2/openrlhf/models/loss.py#L200-L212
Spec: `surrogate.dual_clip` (pgspec spec/surrogate.md#surrogate.dual_clip): for A < 0,
L = min(L_clip, -c A), else L_clip = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A); a masked position is
not read, so its gradient is exactly 0 whatever junk it holds (pgspec spec/agg.md, "Masked positions").
Input: logprobs = old_logprobs = [[-1, -1]] (ratio 1), advantages = [[1, inf]], action_mask = [[1, 0]],
dual_clip = 3 (token-level advantages; the padded position holds a junk inf).
Expected: gradient w.r.t. logprobs (-1, 0) (token 0: -A r = -1; the padded token: 0).
Got: (-1, NaN). The loss is formed at every position and only multiplied by the mask in aggregate_loss;
the zero cotangent at the padded position reaches `surr1 = ratio * advantages`, whose backward is
0 * inf = NaN. (The loss value is NaN too, through aggregate_loss's `loss * loss_mask`: a separate finding;
this script checks the gradient, which stays NaN even with that one fixed.)
Fix: zero the padding before use, e.g. `advantages = advantages.masked_fill(~action_mask.bool(), 0)` at the
top of `PolicyLoss.forward`.
pgspec rule: adapters/openrlhf/deviations.toml, cause masked-nonfinite (prop.padding/surrogate.dual_clip,
prop.on_policy/surrogate.dual_clip).

Run: python findings/openrlhf/policy-loss-masked-nonfinite.py  (OpenRLHF and torch installed). Exit 0: the bug reproduces;
1: fixed; 2: could not run. If `openrlhf.models` cannot be imported (its __init__ needs peft, deepspeed,
transformers, ...), loss.py and utils.py are loaded from the installed package by path with two stand-ins:
an empty `openrlhf.models` package module and, when deepspeed is missing, an empty `deepspeed` module.
"""
import sys


def load_openrlhf():
    try:
        from openrlhf.models import loss, utils
        return loss, utils
    except ImportError:
        pass
    import importlib.util
    import types
    spec = importlib.util.find_spec("openrlhf")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("openrlhf is not installed")
    models = spec.submodule_search_locations[0] + "/models"
    pkg = types.ModuleType("openrlhf.models")
    pkg.__path__ = [models]
    sys.modules["openrlhf.models"] = pkg
    if importlib.util.find_spec("deepspeed") is None:
        sys.modules["deepspeed"] = types.ModuleType("deepspeed")
    loaded = {}
    for name in ("utils", "loss"):
        s = importlib.util.spec_from_file_location(f"openrlhf.models.{name}", f"{models}/{name}.py")
        m = importlib.util.module_from_spec(s)
        sys.modules[s.name] = m
        s.loader.exec_module(m)
        loaded[name] = m
    return loaded["loss"], loaded["utils"]


def version():
    from importlib import metadata

    return metadata.version("openrlhf")


def main():
    import torch

    loss_mod, _ = load_openrlhf()
    lp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    old = torch.tensor([[-1.0, -1.0]])
    adv = torch.tensor([[1.0, float("inf")]])
    mask = torch.tensor([[1.0, 0.0]])
    eps, c = 0.2, 3.0
    # expected, from the spec in float64: the dual-clip loss of the unmasked tokens only, token mean
    lp64 = lp.detach().double().requires_grad_(True)
    m = mask.bool()
    r = torch.exp(lp64[m] - old.double()[m])
    a = adv.double()[m]
    clip_loss = -torch.min(r * a, r.clamp(1 - eps, 1 + eps) * a)
    per_token = torch.where(a < 0, torch.min(clip_loss, -c * a), clip_loss)
    per_token.mean().backward()
    expected = lp64.grad[0].tolist()
    loss, *_ = loss_mod.PolicyLoss(clip_eps_low=eps, clip_eps_high=eps, dual_clip=c)(lp, old, adv, action_mask=mask)
    loss.backward()
    got = lp.grad[0].tolist()
    what = (f"PolicyLoss(dual_clip=3) gradient with an inf advantage at a padded position (expected "
            f"{[round(v, 6) for v in expected]}, got {[round(v, 6) for v in got]})")
    if all(abs(g - e) <= 1e-6 for g, e in zip(got, expected)):
        print(f"FIXED: OpenRLHF {version()} {what}")
        return 1
    print(f"REPRODUCED: OpenRLHF {version()} {what}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001 - any failure to run is exit 2, on one line
        print(f"ERROR: {type(e).__name__}: {e}".replace("\n", " "))
        sys.exit(2)
