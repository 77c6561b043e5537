"""OpenRLHF: a NaN or inf log-prob at a padded position makes the GSPO loss NaN.

Framework: OpenRLHF 0.11.2 (PyPI), openrlhf/models/loss.py `PolicyLoss.forward`, policy_loss_type="gspo":
Source: https://github.com/OpenRLHF/OpenRLHF/blob/v0.11.2/openrlhf/models/loss.py#L195
Spec: `surrogate.gspo` (pgspec spec/surrogate.md#surrogate.gspo):
s_i = exp((1/L_i) sum_t m_{i,t} (l_{i,t} - l_old_{i,t})), L_i = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i);
masked positions are excluded from the sum, never multiplied by 0.
Input: logprobs = [[-1, NaN]], old_logprobs = [[-1.5, -1]], advantages = [[1, 1]], action_mask = [[1, 0]],
default clip_eps_low = clip_eps_high = 0.2 (the second position is padding; its log-prob is junk, as an
engine may produce).
Expected: s = e^0.5 = 1.6487, loss -min(1.6487, 1.2) = -1.2, gradient 0 (clipped side).
Got: loss NaN. `ratio = (log_ratio * action_mask).sum(dim=-1) / ...`: NaN * 0 = NaN, and the whole sequence's
ratio is NaN. This is not the aggregate_loss bug (the per-token loss at the padded position is finite here:
`ratio.exp().unsqueeze(-1) * action_mask` would be 0 there if the sequence ratio were finite).
Fix: `ratio = torch.where(action_mask.bool(), log_ratio, 0).sum(dim=-1) / action_mask.sum(dim=-1).clamp(min=1)`.
pgspec rule: adapters/openrlhf/deviations.toml, cause masked-nonfinite (surrogate.gspo/masked-nan-inf).

Run: python findings/openrlhf/gspo-masked-nonfinite.py  (OpenRLHF and torch installed). Exit 0: the bug reproduces; 1: fixed;
2: could not run. If `openrlhf.models` cannot be imported (its __init__ needs peft, deepspeed, transformers,
...), loss.py and utils.py are loaded from the installed package by path with two stand-ins: an empty
`openrlhf.models` package module and, when deepspeed is missing, an empty `deepspeed` module.
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
    lp = torch.tensor([[-1.0, float("nan")]], requires_grad=True)
    old = torch.tensor([[-1.5, -1.0]])
    adv = torch.tensor([[1.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0]])
    eps = 0.2
    # expected, from the spec in float64: the mean log-ratio over the unmasked tokens only
    lp64 = lp.detach().double().requires_grad_(True)
    m = mask.bool()
    s = torch.exp((lp64[m] - old.double()[m]).mean())
    a = adv.double()[0, 0]
    expected = -torch.min(s * a, s.clamp(1 - eps, 1 + eps) * a)
    expected.backward()
    exp_grad = lp64.grad[0, 0].item()
    loss, *_ = loss_mod.PolicyLoss(clip_eps_low=eps, clip_eps_high=eps, policy_loss_type="gspo")(
        lp, old, adv, action_mask=mask)
    loss.backward()
    got, got_grad = loss.item(), lp.grad[0, 0].item()
    what = (f"PolicyLoss(policy_loss_type='gspo') with a NaN log-prob at a padded position (expected loss "
            f"{expected.item():g}, got {got:g}; expected gradient at the real token {exp_grad:g}, got {got_grad:g})")
    if abs(got - expected.item()) <= 1e-6 and abs(got_grad - exp_grad) <= 1e-6:
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
