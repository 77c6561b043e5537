"""skyrl-train: CISPO forms its weight at padded positions; a NaN log-prob there gives a NaN gradient.

Framework: skyrl-train 0.3.1 (PyPI; byte-identical to NovaSky-AI/SkyRL ce6def0e), skyrl_train/utils/ppo_utils.py
`compute_policy_loss_cispo` (PolicyLossRegistry "cispo"):
Source: https://github.com/NovaSky-AI/SkyRL/blob/ce6def0e8f996eb823de4f10d1c0d1528c9a2f6b/skyrl-train/skyrl_train/utils/ppo_utils.py#L743-L745
Spec: `surrogate.cispo` (pgspec spec/surrogate.md#surrogate.cispo): L_{i,t} = -sg[w_{i,t}] A_{i,t} l_{i,t},
w = clip(r, 1 - eps_low, 1 + eps_high) (relative form), dL/dl = -w A; a masked position is not read, so its
gradient is exactly 0.
Input: logprobs = [[-1, NaN]], old_logprobs = [[-1.1, -1]], advantages = [[1, 1]], loss_mask = [[1, 0]],
SkyRL's default CISPO bounds (cispo_eps_clip_low = 0, cispo_eps_clip_high = 5: w in [1, 6]), token_mean.
Expected: gradient (-1.10517, 0) (w = e^0.1 at the real token).
Got: (-1.10517, NaN), and the loss NaN: `loss = -advantages * clamped_ratio.detach() * log_probs` is formed
at every position; at the padded one the weight is exp(NaN) = NaN, and the zero cotangent of reduce_loss
times that weight is NaN. Unlike GSPO, fixing masked_mean does not remove this gradient.
Fix: select the padding out before the product, e.g. `log_probs = torch.where(loss_mask.bool(), log_probs, 0)`
and `ratio = torch.where(loss_mask.bool(), ratio, 1)` at the top of compute_policy_loss_cispo.
pgspec rule: adapters/skyrl/deviations.toml, cause masked-nonfinite (surrogate.cispo/masked-nan-inf).

Run: python findings/skyrl/cispo-masked-nonfinite.py  (skyrl-train and torch installed). Exit 0: the bug reproduces; 1: fixed;
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
    cfg.policy_loss_type, cfg.loss_reduction = "cispo", "token_mean"
    low, high = float(cfg.cispo.cispo_eps_clip_low), float(cfg.cispo.cispo_eps_clip_high)
    lp = torch.tensor([[-1.0, float("nan")]], requires_grad=True)
    old = torch.tensor([[-1.1, -1.0]])
    adv = torch.tensor([[1.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0]])
    # expected, from the spec in float64: -sg(w) A l over the unmasked token, token mean
    lp64 = lp.detach().double().requires_grad_(True)
    m = mask.bool()
    w = torch.exp(lp64[m] - old.double()[m]).clamp(1 - low, 1 + high).detach()
    (-(w * adv.double()[m] * lp64[m])).mean().backward()
    expected = lp64.grad[0].tolist()
    loss, _ = ppo.PolicyLossRegistry.get("cispo")(lp, old, adv, cfg, loss_mask=mask)
    loss.backward()
    got = lp.grad[0].tolist()
    what = (f"skyrl-train {version()} CISPO gradient with a NaN log-prob at a padded position (expected "
            f"{[round(v, 6) for v in expected]}, got {[round(v, 6) for v in got]}; loss {loss.item():g})")
    if all(abs(a - b) <= 1e-6 for a, b in zip(got, expected)):
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
