"""OpenRLHF: GSPO exponentiates the unclamped mean log-ratio; in float32 the clipped side's gradient is NaN.

Framework: OpenRLHF 0.11.2 (PyPI), openrlhf/models/loss.py `PolicyLoss.forward`, policy_loss_type="gspo":
Source: https://github.com/OpenRLHF/OpenRLHF/blob/v0.11.2/openrlhf/models/loss.py#L195-L196
(the "ppo" branch clamps the log-ratio to [-20, 20] at L187; the "gspo" branch does not).
Spec: `surrogate.gspo` (pgspec spec/surrogate.md#surrogate.gspo):
L_i = -min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i), gradient 0 on the clipped side
(A_i > 0 and s_i > 1 + eps_high).
Input (float32): logprobs = [[0]], old_logprobs = [[-200]], advantages = [[1]], action_mask = [[1]],
default clip_eps_low = clip_eps_high = 0.2: the mean log-ratio is 200, s = e^200 (inf in float32).
Expected: loss -1.2, gradient 0 (the clipped branch is active).
Got: loss -1.2, gradient NaN: the backward of torch.min sends a zero cotangent into the inf branch
(0 * inf = NaN), and in training the NaN reaches every parameter while the loss looks finite.
Fix: clamp the sequence log-ratio before exp, as the ppo branch does (OpenRLHF PR #1293):
`ratio = ratio.clamp(max=20.0).exp().unsqueeze(-1) * action_mask` (any cap above log(1 + eps_high) keeps the value).
pgspec rule: adapters/openrlhf/deviations.toml, cause exp-overflow (surrogate.gspo/log-ratio-200-clipped-side).

Run: python findings/openrlhf/gspo-exp-overflow.py  (OpenRLHF and torch installed). Exit 0: the bug reproduces; 1: fixed;
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
    lp = torch.tensor([[0.0]], requires_grad=True)
    old = torch.tensor([[-200.0]])
    adv = torch.tensor([[1.0]])
    mask = torch.tensor([[1.0]])
    eps = 0.2
    # expected, from the spec in float64 (e^200 is finite there)
    lp64 = lp.detach().double().requires_grad_(True)
    s = torch.exp((lp64 - old.double()).mean())
    expected = -torch.min(s * 1.0, s.clamp(1 - eps, 1 + eps) * 1.0)
    expected.backward()
    exp_grad = lp64.grad[0, 0].item()
    loss, *_ = loss_mod.PolicyLoss(clip_eps_low=eps, clip_eps_high=eps, policy_loss_type="gspo")(
        lp, old, adv, action_mask=mask)
    loss.backward()
    got, got_grad = loss.item(), lp.grad[0, 0].item()
    what = (f"float32 GSPO at a mean log-ratio of 200 on the clipped side (expected loss {expected.item():g}, "
            f"got {got:g}; expected gradient {exp_grad:g}, got {got_grad:g})")
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
