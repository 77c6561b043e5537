"""skyrl-train: the PPO loss is formed at padded positions; an inf advantage there gives a NaN gradient.

Framework: skyrl-train 0.3.1 (PyPI; byte-identical to NovaSky-AI/SkyRL ce6def0e), skyrl_train/utils/ppo_utils.py
`ppo_policy_loss` (PolicyLossRegistry "regular" and "dual_clip"):
Source: https://github.com/NovaSky-AI/SkyRL/blob/ce6def0e8f996eb823de4f10d1c0d1528c9a2f6b/skyrl-train/skyrl_train/utils/ppo_utils.py#L573-L593
Spec: `surrogate.ppo_clip` (pgspec spec/surrogate.md#surrogate.ppo_clip): L = -min(r A, clip(r, 1 - eps_low,
1 + eps_high) A), and `surrogate.dual_clip` (spec/surrogate.md#surrogate.dual_clip); a masked position is not
read, so its gradient is exactly 0 whatever junk it holds.
Input: logprobs = old_logprobs = [[-1, -1]] (ratio 1), advantages = [[1, inf]], loss_mask = [[1, 0]]
(token-level advantages; the padded position holds a junk inf), SkyRL's defaults, token_mean.
Expected: gradient (-1, 0) for "regular" and "dual_clip".
Got: (-1, NaN) for both: `surr1 = ratio * advantages` at the padded position is inf, and reduce_loss's zero
cotangent reaches it as 0 * inf = NaN.
Fix: zero the padding before use, e.g. `advantages = torch.where(loss_mask.bool(), advantages, 0)` at the top
of ppo_policy_loss (selecting in masked_mean alone fixes the value, not this gradient).
pgspec rule: adapters/skyrl/deviations.toml, cause masked-nonfinite (prop.padding/surrogate.ppo_clip,
prop.padding/surrogate.dual_clip, prop.on_policy/surrogate.dual_clip).

Run: python findings/skyrl/ppo-loss-masked-nonfinite.py  (skyrl-train and torch installed). Exit 0: the bug reproduces; 1: fixed;
2: could not run. No stand-in: the functions are imported from skyrl_train as installed; the config
holds ppo_base_config.yaml's defaults (SkyRL reads that file through hydra, which its CI environment lacks).
"""
import sys


def skyrl():
    """skyrl_train.utils.ppo_utils and a trainer.algorithm config holding the defaults of SkyRL's
    skyrl_train/config/ppo_base_config.yaml (0.3.1) for every field the policy losses read."""
    from skyrl_train.utils import ppo_utils

    algorithm = ppo_utils.DictConfig({  # the config type the losses take (omegaconf's, as ppo_utils imports it)
        "policy_loss_type": "regular", "loss_reduction": "token_mean", "eps_clip_low": 0.2, "eps_clip_high": 0.2,
        "clip_ratio_c": 3.0, "use_tis": False, "tis_imp_ratio_cap": -1.0, "kl_estimator_type": "k3",
        "cispo": {"cispo_eps_clip_low": 0, "cispo_eps_clip_high": 5}, "sapo": {"tau_pos": 1.0, "tau_neg": 1.05},
        "max_seq_len": None})
    return ppo_utils, algorithm


def version():
    from importlib import metadata

    return metadata.version("skyrl-train")


def main():
    import torch

    ppo, cfg = skyrl()
    cfg.loss_reduction = "token_mean"
    eps_low, eps_high = float(cfg.eps_clip_low), float(cfg.eps_clip_high)
    old = torch.tensor([[-1.0, -1.0]])
    adv = torch.tensor([[1.0, float("inf")]])
    mask = torch.tensor([[1.0, 0.0]])
    # expected, from the spec in float64: the clipped surrogate of the unmasked token only, token mean
    lp64 = torch.tensor([[-1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    m = mask.bool()
    r = torch.exp(lp64[m] - old.double()[m])
    a = adv.double()[m]
    (-torch.min(r * a, r.clamp(1 - eps_low, 1 + eps_high) * a)).mean().backward()
    expected = lp64.grad[0].tolist()
    got = {}
    for kind in ("regular", "dual_clip"):
        cfg.policy_loss_type = kind
        lp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
        loss, _ = ppo.PolicyLossRegistry.get(kind)(lp, old, adv, cfg, loss_mask=mask)
        loss.backward()
        got[kind] = lp.grad[0].tolist()
    shown = "; ".join(f"{k}: {[round(v, 6) for v in g]}" for k, g in got.items())
    what = (f"skyrl-train {version()} PPO gradient with an inf advantage at a padded position (expected "
            f"{[round(v, 6) for v in expected]}; got {shown})")
    if all(all(abs(a - b) <= 1e-6 for a, b in zip(g, expected)) for g in got.values()):
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
